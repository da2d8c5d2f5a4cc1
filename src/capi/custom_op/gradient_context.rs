//! The gradient context: what a gradient callback reads of the node and the gradients
//! it sets.
use std::ffi::c_char;

use super::{context_attrs, context_num_inputs, context_set_error};
use super::{kiln_attrs, kiln_gradient_context};
use crate::capi::graph::{kiln_value, KILN_VALUE_NONE_NODE};
use crate::capi::{arg, arg_mut, guard, guard_or, kiln_status, out_ptr, CResult, Failure};
use crate::ir::{NodeId, Value};

const NONE_VALUE: kiln_value = kiln_value {
    node: KILN_VALUE_NONE_NODE,
    output: 0,
};

fn value_at(list: &[Option<Value>], index: usize, what: &str) -> CResult<kiln_value> {
    let v = list.get(index).ok_or_else(|| {
        Failure::invalid(format!("index {index}: the node has {} {what}", list.len()))
    })?;
    Ok(v.map_or(NONE_VALUE, kiln_value::from))
}

/// How many inputs the node has; 0 for NULL.
///
/// # Safety
/// `ctx` is NULL or the live context of the current callback.
#[no_mangle]
pub unsafe extern "C" fn kiln_gradient_context_num_inputs(
    ctx: *const kiln_gradient_context,
) -> usize {
    // SAFETY: `ctx` is NULL or the gradient callback's context, live for the call.
    unsafe { context_num_inputs(ctx) }
}

/// How many outputs the node has; 0 for NULL.
///
/// # Safety
/// `ctx` is NULL or the live context of the current callback.
#[no_mangle]
pub unsafe extern "C" fn kiln_gradient_context_num_outputs(
    ctx: *const kiln_gradient_context,
) -> usize {
    guard_or(0, || {
        // SAFETY: NULL or the live gradient context (# Safety), only read.
        unsafe { ctx.as_ref() }.map_or(0, |c| c.outputs.len())
    })
}

/// The node's input `index` as a value of the graph (`node == KILN_VALUE_NONE_NODE` if
/// omitted), to use in the backward computation.
///
/// # Safety
/// `ctx` is the live context; `out` is valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_gradient_context_input(
    ctx: *const kiln_gradient_context,
    index: usize,
    out: *mut kiln_value,
) -> kiln_status {
    guard(|| {
        // SAFETY: `ctx` is NULL or the current gradient callback's live context.
        let ctx = unsafe { arg(ctx, "ctx") }?;
        let out = out_ptr(out, "out")?;
        let v = value_at(&ctx.inputs, index, "inputs")?;
        // SAFETY: the input's value goes to `out`, non-NULL (checked) and writable.
        unsafe { *out = v };
        Ok(())
    })
}

/// The node's output `index` (the forward result) as a value of the graph.
///
/// # Safety
/// `ctx` is the live context; `out` is valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_gradient_context_output(
    ctx: *const kiln_gradient_context,
    index: usize,
    out: *mut kiln_value,
) -> kiln_status {
    guard(|| {
        // SAFETY: the header makes `ctx` NULL or the live gradient context.
        let ctx = unsafe { arg(ctx, "ctx") }?;
        let out = out_ptr(out, "out")?;
        let outs: Vec<Option<Value>> = ctx.outputs.iter().copied().map(Some).collect();
        let v = value_at(&outs, index, "outputs")?;
        // SAFETY: `out` is a valid kiln_value slot, checked non-NULL.
        unsafe { *out = v };
        Ok(())
    })
}

/// The gradient of the loss with respect to output `index` (same type as the output), or
/// `node == KILN_VALUE_NONE_NODE` when the loss does not depend on that output.
///
/// # Safety
/// `ctx` is the live context; `out` is valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_gradient_context_output_grad(
    ctx: *const kiln_gradient_context,
    index: usize,
    out: *mut kiln_value,
) -> kiln_status {
    guard(|| {
        // SAFETY: `ctx` is NULL or the gradient callback's context, read only.
        let ctx = unsafe { arg(ctx, "ctx") }?;
        let out = out_ptr(out, "out")?;
        let v = value_at(&ctx.output_grads, index, "outputs")?;
        // SAFETY: the output's gradient goes to `out`, valid by contract and non-NULL.
        unsafe { *out = v };
        Ok(())
    })
}

/// Sets the gradient of the loss with respect to input `index`: a value the callback
/// built in the graph, of the input's dtype and rank.
///
/// # Safety
/// `ctx` is the live context of the current callback.
#[no_mangle]
pub unsafe extern "C" fn kiln_gradient_context_set_input_grad(
    ctx: *mut kiln_gradient_context,
    index: usize,
    grad: kiln_value,
) -> kiln_status {
    guard(|| {
        // SAFETY: `ctx` is NULL or the live gradient context, unshared during the call.
        let ctx = unsafe { arg_mut(ctx, "ctx") }?;
        let n = ctx.input_grads.len();
        let slot = ctx
            .input_grads
            .get_mut(index)
            .ok_or_else(|| Failure::invalid(format!("index {index}: the node has {n} inputs")))?;
        *slot = (grad.node != KILN_VALUE_NONE_NODE).then_some(Value {
            node: NodeId(grad.node),
            output: grad.output,
        });
        Ok(())
    })
}

/// The node's attributes (borrowed from the context).
///
/// # Safety
/// `ctx` is NULL or the live context of the current callback.
#[no_mangle]
pub unsafe extern "C" fn kiln_gradient_context_attrs(
    ctx: *const kiln_gradient_context,
) -> *const kiln_attrs {
    // SAFETY: `ctx` is NULL or the gradient callback's context, which lends its attrs.
    unsafe { context_attrs(ctx) }
}

/// Records why the gradient cannot be built (copied); the callback then returns a
/// non-OK status and `kiln_graph_add_gradients` fails naming the node.
///
/// # Safety
/// `ctx` is the live context; `msg` NULL or a string.
#[no_mangle]
pub unsafe extern "C" fn kiln_gradient_context_set_error(
    ctx: *mut kiln_gradient_context,
    msg: *const c_char,
) -> kiln_status {
    // SAFETY: the gradient callback's own context, and `msg` NULL or a C string.
    unsafe { context_set_error(ctx, msg) }
}
