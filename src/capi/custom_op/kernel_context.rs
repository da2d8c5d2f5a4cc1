//! The kernel context: the views of a node's buffers handed to a compute callback, and
//! the `kiln_kernel_context_*` calls it makes.
use std::ffi::{c_char, c_void};

use super::{context_attrs, context_num_inputs, context_set_error};
use super::{kiln_attrs, kiln_kernel_context, kiln_tensor_view};
use crate::aligned::{layout_for, AlignedBuf};
use crate::backend::registered::RawTensor;
use crate::capi::tensor::{dims_from_c, dtype_to_c, KILN_DTYPE_INVALID};
use crate::capi::{arg, arg_mut, arg_slice, guard, guard_or, out_ptr, CResult, Failure};
use crate::capi::{kiln_status, KILN_STATUS_RUN_FAILED};
use crate::ir::{DType, Dim, TensorType};

/// `len` zeroed bytes for a kernel's input or output: an error, not an abort, when they
/// cannot be had (the size comes from a user's kernel).
pub(super) fn zeroed_buf(len: usize) -> Result<AlignedBuf, String> {
    if layout_for(len).is_none() {
        return Err(format!("a buffer of {len} bytes is too large"));
    }
    AlignedBuf::try_zeroed(len).map_err(|_| format!("could not allocate a buffer of {len} bytes"))
}

/// A view's backing arrays, kept alive while the kernel may read them.
pub(super) struct View {
    data: *mut u8,
    dtype: DType,
    dims: Vec<i64>,
    strides: Vec<i64>,
}

impl View {
    pub(super) fn new(data: *mut u8, dtype: DType, shape: &[usize]) -> View {
        let mut strides = vec![0i64; shape.len()];
        let mut s = 1i64;
        for k in (0..shape.len()).rev() {
            strides[k] = s;
            s *= shape[k] as i64;
        }
        View {
            data,
            dtype,
            dims: shape.iter().map(|&d| d as i64).collect(),
            strides,
        }
    }
    fn to_c(&self) -> kiln_tensor_view {
        kiln_tensor_view {
            data: self.data.cast(),
            dtype: dtype_to_c(self.dtype),
            rank: self.dims.len() as u32,
            dims: self.dims.as_ptr(),
            strides: self.strides.as_ptr(),
        }
    }
}

/// Where a kernel's outputs go.
pub(super) enum Outputs {
    /// Buffers a CPU program planned (in the arena, possibly an input's when the op
    /// runs in place): the kernel's dims must be exactly the planned ones.
    Planned {
        slots: Vec<RawTensor>,
        given: Vec<bool>,
    },
    /// Allocated on request (the interpreter's `eval`), checked against the types
    /// inference gives for the run's input shapes.
    Allocated {
        expected: Vec<TensorType>,
        #[allow(clippy::type_complexity)]
        made: Vec<Option<(AlignedBuf, DType, Vec<usize>)>>,
    },
}

impl Outputs {
    pub(super) fn missing(&self) -> Option<usize> {
        match self {
            Outputs::Allocated { made, .. } => made.iter().position(Option::is_none),
            Outputs::Planned { given, .. } => given.iter().position(|g| !g),
        }
    }
}

/// How many inputs the node has (omitted optional ones included); 0 for NULL.
///
/// # Safety
/// `ctx` is NULL or the live context of the current callback.
#[no_mangle]
pub unsafe extern "C" fn kiln_kernel_context_num_inputs(ctx: *const kiln_kernel_context) -> usize {
    // SAFETY: `ctx` is NULL or the compute callback's context, live during the call.
    unsafe { context_num_inputs(ctx) }
}

/// How many outputs the op has; 0 for NULL.
///
/// # Safety
/// `ctx` is NULL or the live context of the current callback.
#[no_mangle]
pub unsafe extern "C" fn kiln_kernel_context_num_outputs(ctx: *const kiln_kernel_context) -> usize {
    guard_or(0, || {
        // SAFETY: the header makes `ctx` NULL or the kernel's live context, read only.
        unsafe { ctx.as_ref() }.map_or(0, |c| match &c.outputs {
            Outputs::Allocated { made, .. } => made.len(),
            Outputs::Planned { given, .. } => given.len(),
        })
    })
}

/// Input `index` as a view (read-only; an omitted optional input has `data == NULL`).
///
/// # Safety
/// `ctx` is the live context of the current callback; `view` is valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_kernel_context_input(
    ctx: *const kiln_kernel_context,
    index: usize,
    view: *mut kiln_tensor_view,
) -> kiln_status {
    guard(|| {
        // SAFETY: `ctx` is NULL or the live kernel context of the current callback.
        let ctx = unsafe { arg(ctx, "ctx") }?;
        let view = out_ptr(view, "view")?;
        let v = ctx.inputs.get(index).ok_or_else(|| {
            Failure::invalid(format!(
                "index {index}: the node has {} inputs",
                ctx.inputs.len()
            ))
        })?;
        let v = match v {
            Some(v) => v.to_c(),
            None => kiln_tensor_view {
                data: std::ptr::null_mut(),
                dtype: KILN_DTYPE_INVALID,
                rank: 0,
                dims: std::ptr::null(),
                strides: std::ptr::null(),
            },
        };
        // SAFETY: `view` is non-NULL (checked) and valid for a kiln_tensor_view.
        unsafe { *view = v };
        Ok(())
    })
}

/// Output `index`'s buffer, for an output of `rank` dims `dims` (what the kernel
/// computes): Kiln checks them against the op's inference for this run's inputs and
/// fails with `KILN_STATUS_RUN_FAILED` on a mismatch (the run then fails, naming the
/// node, whatever the callback returns). The buffer is writable until the callback
/// returns; call once per output.
///
/// # Safety
/// `ctx` is the live context; `dims` points to `rank` values; `view` is valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_kernel_context_output(
    ctx: *mut kiln_kernel_context,
    index: usize,
    dims: *const i64,
    rank: usize,
    view: *mut kiln_tensor_view,
) -> kiln_status {
    let mut failure = None;
    let status = guard(|| {
        // SAFETY: `ctx` is NULL or the live kernel context, used by this callback alone.
        let ctx = unsafe { arg_mut(ctx, "ctx") }?;
        let view = out_ptr(view, "view")?;
        // SAFETY: `dims` points to `rank` values (# Safety).
        let dims = unsafe { arg_slice(dims, rank, "dims") }?;
        let r = output_view(ctx, index, dims);
        if let Err(f) = &r {
            failure = Some(f.message.clone());
        }
        let v = r?;
        // SAFETY: the output's view goes to `view`, checked non-NULL, valid by contract.
        unsafe { *view = v };
        Ok(())
    });
    // SAFETY: `ctx` is NULL or the live context; the guard's borrow of it has ended.
    if let (Some(m), Some(ctx)) = (failure, unsafe { ctx.as_mut() }) {
        // Sticky: a kernel that ignores the status still fails the run.
        ctx.error.get_or_insert(m);
    }
    status
}

fn output_view(
    ctx: &mut kiln_kernel_context,
    index: usize,
    dims: &[i64],
) -> CResult<kiln_tensor_view> {
    let fail = |m: String| Failure::new(KILN_STATUS_RUN_FAILED, m);
    if let Outputs::Planned { slots, given } = &mut ctx.outputs {
        let slot = slots.get(index).ok_or_else(|| {
            fail(format!(
                "output index {index}: the op has {} outputs",
                slots.len()
            ))
        })?;
        if given[index] {
            return Err(fail(format!("output {index} was already requested")));
        }
        let planned: Vec<i64> = slot.shape.iter().map(|&d| d as i64).collect();
        if dims != planned.as_slice() {
            return Err(fail(format!(
                "the kernel asked for output {index} with dims {dims:?}, inconsistent with inference ({}{:?})",
                slot.dtype, slot.shape
            )));
        }
        given[index] = true;
        let view = View::new(slot.data, slot.dtype, &slot.shape);
        let c = view.to_c();
        ctx.kept.push(view);
        return Ok(c);
    }
    let Outputs::Allocated { expected, made } = &mut ctx.outputs else {
        return Err(fail("the kernel has no outputs to give".into()));
    };
    let ty = expected.get(index).ok_or_else(|| {
        fail(format!(
            "output index {index}: the op has {} outputs",
            expected.len()
        ))
    })?;
    if made[index].is_some() {
        return Err(fail(format!("output {index} was already requested")));
    }
    let consistent = dims.len() == ty.rank()
        && dims.iter().zip(&ty.shape.axes).all(|(&d, a)| match a.dim {
            Dim::Fixed(n) => d == n as i64,
            Dim::Sym(_) => d >= 0,
        });
    if !consistent {
        return Err(fail(format!(
            "the kernel asked for output {index} with dims {dims:?}, inconsistent with inference ({ty})"
        )));
    }
    // Fits in memory (or the call fails), so the byte count below cannot overflow.
    let shape = dims_from_c(dims, "dims")?;
    let n: usize = shape.iter().product();
    let mut buf = zeroed_buf(n * ty.dtype.size_in_bytes()).map_err(fail)?;
    let view = View::new(buf.as_mut_ptr(), ty.dtype, &shape);
    let c = view.to_c();
    made[index] = Some((buf, ty.dtype, shape));
    // The view's dims and strides must outlive the callback: keep them with the inputs'.
    ctx.kept.push(view);
    Ok(c)
}

/// `bytes` of scratch memory, 64-byte aligned, zeroed, valid until the callback returns
/// (Kiln frees it).
///
/// # Safety
/// `ctx` is the live context of the current callback; `out` is valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_kernel_context_scratch(
    ctx: *mut kiln_kernel_context,
    bytes: usize,
    out: *mut *mut c_void,
) -> kiln_status {
    guard(|| {
        // SAFETY: `ctx` is NULL or the compute callback's live, unshared context.
        let ctx = unsafe { arg_mut(ctx, "ctx") }?;
        let out = out_ptr(out, "out")?;
        if layout_for(bytes).is_none() {
            return Err(Failure::invalid(format!(
                "{bytes} bytes of scratch is too many"
            )));
        }
        let mut buf = AlignedBuf::try_zeroed(bytes).map_err(|_| {
            Failure::new(
                KILN_STATUS_RUN_FAILED,
                format!("could not allocate {bytes} bytes of scratch"),
            )
        })?;
        let p = buf.as_mut_ptr();
        // The context owns it, so it lives until the callback returns.
        ctx.scratch.push(buf);
        // SAFETY: `out` was checked non-NULL and is valid for a write (# Safety).
        unsafe { *out = p.cast() };
        Ok(())
    })
}

/// The node's attributes (borrowed from the context).
///
/// # Safety
/// `ctx` is NULL or the live context of the current callback.
#[no_mangle]
pub unsafe extern "C" fn kiln_kernel_context_attrs(
    ctx: *const kiln_kernel_context,
) -> *const kiln_attrs {
    // SAFETY: NULL or the kernel's live context, whose attrs outlive the callback's use.
    unsafe { context_attrs(ctx) }
}

/// Records why the kernel fails (copied); the callback then returns a non-OK status and
/// `kiln_executable_run` fails with `KILN_STATUS_RUN_FAILED`, naming the op and node and
/// quoting this.
///
/// # Safety
/// `ctx` is the live context; `msg` NULL or a string.
#[no_mangle]
pub unsafe extern "C" fn kiln_kernel_context_set_error(
    ctx: *mut kiln_kernel_context,
    msg: *const c_char,
) -> kiln_status {
    // SAFETY: `ctx` is the compute callback's context and `msg` NULL or NUL-terminated.
    unsafe { context_set_error(ctx, msg) }
}
