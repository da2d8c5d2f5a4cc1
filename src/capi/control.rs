//! Control flow from C: ops with graph attributes (`If`'s branches, `Loop`'s and
//! `Scan`'s bodies), each body an ordinary `kiln_graph` that Kiln copies.
use std::ffi::c_char;
use std::sync::Arc;

use super::graph::{add_op_with, kiln_attr, kiln_graph, kiln_value, OpArgs};
use super::{arg, arg_slice, arg_str, guard, kiln_status, CResult, Failure};
use crate::ir::{Attr, Attrs};

/// A graph attribute of an op: its name and the graph. Kiln copies the graph during the
/// call, so the caller still owns it (and frees it with `kiln_graph_free`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kiln_graph_attr {
    pub name: *const c_char,
    pub graph: *const kiln_graph,
}

/// The graph attributes as IR attributes (each graph copied).
///
/// # Safety
/// `graphs` points to `n_graphs` entries whose pointers are valid as documented.
unsafe fn graph_attrs(graphs: *const kiln_graph_attr, n_graphs: usize) -> CResult<Attrs> {
    let mut attrs = Attrs::new();
    // SAFETY: `graphs` points to `n_graphs` entries, as this function's contract says.
    let entries = unsafe { arg_slice(graphs, n_graphs, "graphs") }?;
    for (i, a) in entries.iter().enumerate() {
        // SAFETY: each entry's `name` is NULL or a NUL-terminated string.
        let name = unsafe { arg_str(a.name, &format!("graphs[{i}].name")) }?;
        // SAFETY: each entry's `graph` is NULL or a live graph, only read (copied).
        let body = unsafe { arg(a.graph, &format!("graphs[{i}] ('{name}').graph")) }?;
        if attrs.get(name).is_some() {
            return Err(Failure::invalid(format!(
                "graphs[{i}]: graph attribute '{name}' is given twice"
            )));
        }
        attrs.set(name, Attr::Graph(Arc::new(body.graph.clone())));
    }
    Ok(attrs)
}

/// `kiln_graph_add_op` for ops with graph attributes as well as ordinary ones: `If`
/// (`then_branch`, `else_branch`), `Loop` and `Scan` (`body`). A body is a closed graph:
/// its parameters, in the order they were added, are its inputs and its outputs are its
/// results. A value of the outer graph that a body uses is passed as a trailing operand
/// (a capture) with a matching trailing parameter in every body, and the int attribute
/// `captures` counts them. `If(cond, captures...)`: each branch takes the captures and
/// returns the op's outputs. `Loop(M, cond, carried..., captures...)` (either of `M`,
/// `cond` may be `KILN_VALUE_NONE_NODE`): the body takes the iteration number (i64
/// scalar), the condition (bool scalar), the carried values and the captures, and
/// returns the condition, the carried values and the scan outputs. `Scan(state...,
/// scan_inputs..., captures...)` with `num_scan_inputs`, as in ONNX. Each graph is
/// copied during the call (the caller still owns and frees it); a body that does not fit
/// the operands fails here, naming the node. Outputs and statuses as for
/// `kiln_graph_add_op`; a graph attribute given twice is `KILN_STATUS_INVALID_ARGUMENT`.
///
/// # Safety
/// As for `kiln_graph_add_op`; `graphs` points to `n_graphs` entries, each with a string
/// `name` and a live `graph` (which may be `g` itself: it is copied first).
#[no_mangle]
pub unsafe extern "C" fn kiln_graph_add_op_with_graphs(
    g: *mut kiln_graph,
    op_type: *const c_char,
    inputs: *const kiln_value,
    n_inputs: usize,
    attrs: *const kiln_attr,
    n_attrs: usize,
    graphs: *const kiln_graph_attr,
    n_graphs: usize,
    outputs: *mut kiln_value,
    outputs_capacity: usize,
    n_outputs: *mut usize,
) -> kiln_status {
    let args = OpArgs {
        op_type,
        inputs,
        n_inputs,
        attrs,
        n_attrs,
        outputs,
        outputs_capacity,
        n_outputs,
    };
    guard(|| {
        // Copied before `g` is borrowed mutably: a body may be `g` itself.
        // SAFETY: the header promises `graphs` has `n_graphs` valid entries.
        let bodies = unsafe { graph_attrs(graphs, n_graphs) }?;
        // SAFETY: the other arguments follow kiln_graph_add_op's contract, add_op_with's.
        unsafe { add_op_with(g, args, bodies) }
    })
}
