//! The infer context: input types for an infer callback, and the output types it sets.
use std::ffi::c_char;

use super::{context_attrs, context_num_inputs, context_set_error};
use super::{kiln_attrs, kiln_infer_context};
use crate::capi::tensor::{dtype_from_c, dtype_to_c, kiln_dtype, KILN_DTYPE_INVALID};
use crate::capi::{
    arg, arg_mut, arg_slice, arg_str, guard, kiln_status, out_ptr, CResult, Failure,
};
use crate::ir::{Dim, Shape, TensorType};

/// How many inputs the node has (omitted optional ones included); 0 for NULL.
///
/// # Safety
/// `ctx` is NULL or the live context of the current callback.
#[no_mangle]
pub unsafe extern "C" fn kiln_infer_context_num_inputs(ctx: *const kiln_infer_context) -> usize {
    // SAFETY: the infer callback passes its own context (or NULL), live for the call.
    unsafe { context_num_inputs(ctx) }
}

/// Input `index`'s dtype and rank. An omitted optional input gives `KILN_DTYPE_INVALID`
/// and rank 0 (and `KILN_STATUS_OK`); an index past the inputs is
/// `KILN_STATUS_INVALID_ARGUMENT`.
///
/// # Safety
/// `ctx` is the live context of the current callback; `dtype` and `rank` are valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_infer_context_input(
    ctx: *const kiln_infer_context,
    index: usize,
    dtype: *mut kiln_dtype,
    rank: *mut usize,
) -> kiln_status {
    guard(|| {
        // SAFETY: `ctx` is NULL or the live infer context of the current callback.
        let ctx = unsafe { arg(ctx, "ctx") }?;
        let dtype = out_ptr(dtype, "dtype")?;
        let rank = out_ptr(rank, "rank")?;
        let t = infer_input(ctx, index)?;
        let (d, r) = (
            t.map_or(KILN_DTYPE_INVALID, |t| dtype_to_c(t.dtype)),
            t.map_or(0, |t| t.rank()),
        );
        // SAFETY: `dtype` and `rank` are non-NULL (checked) and valid (# Safety).
        unsafe { (*dtype, *rank) = (d, r) };
        Ok(())
    })
}

fn infer_input(ctx: &kiln_infer_context, index: usize) -> CResult<Option<&TensorType>> {
    ctx.inputs.get(index).map(Option::as_ref).ok_or_else(|| {
        Failure::invalid(format!(
            "index {index}: the node has {} inputs",
            ctx.inputs.len()
        ))
    })
}

/// Dim `axis` of input `index`: a fixed size (`*symbol` NULL), or `*size == -1` and
/// `*symbol` the symbol's name (borrowed, valid during the callback), which
/// `kiln_infer_context_set_output` accepts to say "the same size".
///
/// # Safety
/// `ctx` is the live context of the current callback; `size` and `symbol` are valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_infer_context_input_dim(
    ctx: *const kiln_infer_context,
    index: usize,
    axis: usize,
    size: *mut i64,
    symbol: *mut *const c_char,
) -> kiln_status {
    guard(|| {
        // SAFETY: the header makes `ctx` NULL or the current callback's live context.
        let ctx = unsafe { arg(ctx, "ctx") }?;
        let size = out_ptr(size, "size")?;
        let symbol = out_ptr(symbol, "symbol")?;
        let t = infer_input(ctx, index)?
            .ok_or_else(|| Failure::invalid(format!("input {index} is omitted")))?;
        let a = t.shape.axes.get(axis).ok_or_else(|| {
            Failure::invalid(format!("axis {axis}: input {index} has rank {}", t.rank()))
        })?;
        let (n, s) = match &a.dim {
            Dim::Fixed(n) => (*n as i64, std::ptr::null()),
            Dim::Sym(_) => (
                -1,
                ctx.symbols[index][axis]
                    .as_ref()
                    .map_or(std::ptr::null(), |s| s.as_ptr()),
            ),
        };
        // SAFETY: `size` and `symbol` were checked non-NULL and are valid by contract.
        unsafe { (*size, *symbol) = (n, s) };
        Ok(())
    })
}

/// The node's attributes (borrowed from the context).
///
/// # Safety
/// `ctx` is NULL or the live context of the current callback.
#[no_mangle]
pub unsafe extern "C" fn kiln_infer_context_attrs(
    ctx: *const kiln_infer_context,
) -> *const kiln_attrs {
    // SAFETY: `ctx` is NULL or the infer callback's context; the attrs live as long.
    unsafe { context_attrs(ctx) }
}

/// Sets output `index`'s type: `dtype` and `rank` dims, where `dims[k] >= 0` is a fixed
/// size and `dims[k] == -1` a symbolic one named `symbols[k]` (e.g. an input's symbol
/// from `kiln_infer_context_input_dim`, so the sizes are known equal), or a fresh symbol
/// when `symbols` or `symbols[k]` is NULL.
///
/// # Safety
/// `ctx` is the live context; `dims` (and `symbols` unless NULL) point to `rank` entries.
#[no_mangle]
pub unsafe extern "C" fn kiln_infer_context_set_output(
    ctx: *mut kiln_infer_context,
    index: usize,
    dtype: kiln_dtype,
    dims: *const i64,
    symbols: *const *const c_char,
    rank: usize,
) -> kiln_status {
    guard(|| {
        // SAFETY: `ctx` is NULL or the live infer context, which only this callback uses.
        let ctx = unsafe { arg_mut(ctx, "ctx") }?;
        let dtype = dtype_from_c(dtype, "dtype")?;
        // SAFETY: `dims` points to `rank` values, as the header requires.
        let dims = unsafe { arg_slice(dims, rank, "dims") }?;
        let syms = if symbols.is_null() {
            None
        } else {
            // SAFETY: a non-NULL `symbols` has `rank` entries too (# Safety).
            Some(unsafe { arg_slice(symbols, rank, "symbols") }?)
        };
        check_output_index(index, ctx.outputs.len())?;
        let mut shape = Vec::with_capacity(rank);
        for (k, &d) in dims.iter().enumerate() {
            shape.push(match d {
                -1 => match syms.map_or(std::ptr::null(), |s| s[k]) {
                    p if p.is_null() => Dim::Sym(format!("{}.{index}.{k}", ctx.node_name)),
                    // SAFETY: a non-NULL symbol is a NUL-terminated string.
                    p => Dim::Sym(unsafe { arg_str(p, &format!("symbols[{k}]")) }?.to_string()),
                },
                d if d >= 0 => Dim::Fixed(d as usize),
                d => {
                    return Err(Failure::invalid(format!(
                        "dims[{k}] is {d}: a dim is >= 0, or -1 for symbolic"
                    )))
                }
            });
        }
        ctx.outputs[index] = Some(TensorType::new(dtype, Shape::new(shape)));
        Ok(())
    })
}

fn check_output_index(index: usize, n: usize) -> CResult<()> {
    if index >= n {
        return Err(Failure::invalid(format!(
            "output index {index}: the op has {n} outputs"
        )));
    }
    Ok(())
}

/// Sets output `index`'s type to input `input`'s (dtype, dims, symbols and axis names):
/// the common case of an elementwise op.
///
/// # Safety
/// `ctx` is the live context of the current callback.
#[no_mangle]
pub unsafe extern "C" fn kiln_infer_context_set_output_like(
    ctx: *mut kiln_infer_context,
    index: usize,
    input: usize,
) -> kiln_status {
    guard(|| {
        // SAFETY: `ctx` is NULL or the current infer callback's context, unshared.
        let ctx = unsafe { arg_mut(ctx, "ctx") }?;
        check_output_index(index, ctx.outputs.len())?;
        let t = infer_input(ctx, input)?
            .ok_or_else(|| Failure::invalid(format!("input {input} is omitted")))?
            .clone();
        ctx.outputs[index] = Some(t);
        Ok(())
    })
}

/// Records why inference fails (copied); the callback then returns a non-OK status, and
/// adding the node fails with `KILN_STATUS_INVALID_GRAPH` naming it and quoting this.
///
/// # Safety
/// `ctx` is the live context; `msg` NULL or a string.
#[no_mangle]
pub unsafe extern "C" fn kiln_infer_context_set_error(
    ctx: *mut kiln_infer_context,
    msg: *const c_char,
) -> kiln_status {
    // SAFETY: the infer callback's live context; `msg` NULL or a string (# Safety).
    unsafe { context_set_error(ctx, msg) }
}
