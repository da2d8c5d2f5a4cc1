//! Evaluating a graph on tensors: each node's reference `eval` in schedule order,
//! checking at run time what the IR only promised (inputs match their parameters, each
//! symbol is bound to one size, every result has its inferred type). The interpreter
//! backend runs whole graphs through it and control-flow ops run their bodies through it.
use std::collections::HashMap;

use super::ops::{self, EvalCtx};
use super::{Dim, Graph, NodeId, TensorType};
use crate::error::{Error, Result};
use crate::tensor::{Tensor, TensorView};

/// The variables' new values by node, from a run's `Assign`s.
pub type Updates = HashMap<NodeId, Tensor>;

/// The graph's parameters' names and types, in order (what [`check_input_types`] needs,
/// worked out once by executables that check every run).
pub(crate) fn input_types(graph: &Graph) -> Vec<(String, TensorType)> {
    graph
        .inputs()
        .into_iter()
        .map(|id| {
            let node = graph.node(id);
            (node.name.clone(), node.outputs[0].clone())
        })
        .collect()
}

/// Checks `inputs` against [`input_types`]' list (count, dtype, rank, fixed sizes, one
/// size per symbol); returns the symbols' sizes.
pub(crate) fn check_input_types(
    params: &[(String, TensorType)],
    inputs: &[Tensor],
) -> Result<HashMap<String, usize>> {
    if inputs.len() != params.len() {
        return Err(Error::InvalidArgument(format!(
            "the graph takes {} inputs, {} given",
            params.len(),
            inputs.len()
        )));
    }
    let mut symbols: HashMap<String, usize> = HashMap::new();
    for ((name, ty), t) in params.iter().zip(inputs) {
        bind(ty, t, &mut symbols)
            .map_err(|e| Error::InvalidArgument(format!("input '{name}': {e}")))?;
    }
    Ok(symbols)
}

/// Checks `t` against `ty`, binding `ty`'s symbols to sizes on first sight.
pub(crate) fn bind(
    ty: &TensorType,
    t: &Tensor,
    symbols: &mut HashMap<String, usize>,
) -> std::result::Result<(), String> {
    let mismatch = || format!("expected {ty}, got {}{:?}", t.kind_name(), t.shape());
    if t.dtype() != ty.dtype || t.containers() != ty.containers {
        return Err(mismatch());
    }
    match t {
        // An element's symbols promise nothing; its fixed sizes and rank are checked.
        Tensor::Sequence(s) => {
            let element = ty.unwrapped();
            return s.items.iter().enumerate().try_for_each(|(i, item)| {
                bind(&element, item, &mut HashMap::new())
                    .map_err(|e| format!("sequence item {i}: {e}"))
            });
        }
        Tensor::Optional(o) => {
            let inner = ty.unwrapped();
            return match &o.value {
                Some(v) => bind(&inner, v, symbols),
                None => Ok(()),
            };
        }
        _ => {}
    }
    bind_shape(ty, t.shape(), &mismatch, symbols)
}

/// Checks `views` (dense tensors in someone else's memory) against `params` as
/// [`check_input_types`] checks tensors, without copying them.
pub(crate) fn check_view_types(
    params: &[(String, TensorType)],
    views: &[TensorView<'_>],
) -> Result<()> {
    if views.len() != params.len() {
        return Err(Error::InvalidArgument(format!(
            "the graph takes {} inputs, {} given",
            params.len(),
            views.len()
        )));
    }
    let mut symbols: HashMap<String, usize> = HashMap::new();
    for ((name, ty), v) in params.iter().zip(views) {
        let mismatch = || format!("expected {ty}, got {}{:?}", v.dtype().name(), v.shape());
        let checked = if v.dtype() != ty.dtype || !ty.containers.is_empty() {
            Err(mismatch())
        } else {
            bind_shape(ty, v.shape(), &mismatch, &mut symbols)
        };
        checked.map_err(|e| Error::InvalidArgument(format!("input '{name}': {e}")))?;
    }
    Ok(())
}

/// Checks a dense tensor's `shape` against `ty`'s rank, fixed sizes and symbols.
fn bind_shape(
    ty: &TensorType,
    shape: &[usize],
    mismatch: &dyn Fn() -> String,
    symbols: &mut HashMap<String, usize>,
) -> std::result::Result<(), String> {
    if !ty.ranked {
        return Ok(());
    }
    if shape.len() != ty.rank() {
        return Err(mismatch());
    }
    for (axis, &size) in ty.shape.axes.iter().zip(shape) {
        match &axis.dim {
            Dim::Fixed(n) if *n != size => return Err(mismatch()),
            Dim::Fixed(_) => {}
            Dim::Sym(s) if s == super::shape::ANY_DIM => {}
            Dim::Sym(s) => match symbols.get(s) {
                Some(&bound) if bound != size => {
                    return Err(format!(
                        "{}: symbol {s} is {bound} elsewhere, {size} here",
                        mismatch()
                    ))
                }
                Some(_) => {}
                None => {
                    symbols.insert(s.clone(), size);
                }
            },
        }
    }
    Ok(())
}

/// Runs a control-flow body (verified with its parent; it holds no state) on `inputs`,
/// in the order `schedule` gives (the body's own, computed once per op evaluation).
pub(crate) fn run_body(
    body: &Graph,
    schedule: &[NodeId],
    inputs: &[Tensor],
) -> std::result::Result<Vec<Tensor>, String> {
    run_graph(body, schedule, inputs, &HashMap::new())
        .map(|(outs, _)| outs)
        .map_err(|e| format!("body '{}': {e}", body.name))
}

/// Runs `graph` once (it must be verified) over the variable values `vars`; returns the
/// outputs and what its `Assign`s stored. A Variable node reads before any `Assign` to it
/// (the `Assign` consumes it), so every read in a run sees the value the run started
/// with; when several `Assign`s store to one variable, the last in the schedule wins.
pub(crate) fn run_graph(
    graph: &Graph,
    schedule: &[NodeId],
    inputs: &[Tensor],
    vars: &HashMap<NodeId, Tensor>,
) -> Result<(Vec<Tensor>, Updates)> {
    let mut symbols = check_input_types(&input_types(graph), inputs)?;
    let params = graph.inputs();
    let mut inputs_by_node: HashMap<NodeId, &Tensor> = params.iter().copied().zip(inputs).collect();
    let mut values: HashMap<NodeId, Vec<Tensor>> = HashMap::new();
    let mut updates = Updates::new();
    let missing = |id: NodeId| Error::Runtime(format!("{}: has no value", graph.describe(id)));
    for &id in schedule {
        let node = graph.node(id);
        let outs = match node.op.as_str() {
            "Parameter" => vec![(*inputs_by_node.remove(&id).ok_or_else(|| missing(id))?).clone()],
            "Constant" => vec![node.data.as_deref().ok_or_else(|| missing(id))?.clone()],
            "Variable" => vec![vars.get(&id).ok_or_else(|| missing(id))?.clone()],
            "Assign" => {
                let target = node.inputs[0].expect("verified").node;
                let v = node.inputs[1].expect("verified");
                updates.insert(target, values[&v.node][v.output as usize].clone());
                vec![]
            }
            _ => {
                let op = graph
                    .op_impl(&node.op)
                    .ok_or_else(|| Error::Runtime(format!("{}: unknown op", graph.describe(id))))?;
                let args: Vec<Option<&Tensor>> = node
                    .inputs
                    .iter()
                    .map(|v| v.map(|v| &values[&v.node][v.output as usize]))
                    .collect();
                let types: Vec<Option<&TensorType>> = node
                    .inputs
                    .iter()
                    .map(|v| v.map(|v| &graph.node(v.node).outputs[v.output as usize]))
                    .collect();
                let cx = EvalCtx {
                    inputs: &args,
                    input_types: &types,
                    attrs: &node.attrs,
                };
                let outs = ops::custom::contain(&op, || ops::evaluate(&*op, &cx))
                    .map_err(|e| Error::Runtime(format!("{}: {e}", graph.describe(id))))?;
                if outs.len() != node.outputs.len() {
                    return Err(Error::Runtime(format!(
                        "{}: produced {} outputs, its type says {}",
                        graph.describe(id),
                        outs.len(),
                        node.outputs.len()
                    )));
                }
                for (i, (t, ty)) in outs.iter().zip(&node.outputs).enumerate() {
                    bind(ty, t, &mut symbols).map_err(|e| {
                        Error::Runtime(format!("{}: output {i}: {e}", graph.describe(id)))
                    })?;
                }
                outs
            }
        };
        values.insert(id, outs);
    }
    let outs = graph
        .outputs()
        .iter()
        .map(|o| values[&o.value.node][o.value.output as usize].clone())
        .collect();
    Ok((outs, updates))
}
