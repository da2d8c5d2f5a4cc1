//! Checking a run's inputs against the graph's parameters, the same way on every
//! backend: count, dtype, rank, fixed sizes, and one size per symbol.
use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::ir::{Dim, Graph, TensorType};
use crate::tensor::Tensor;

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
    if !ty.ranked {
        return Ok(());
    }
    if t.rank() != ty.rank() {
        return Err(mismatch());
    }
    for (axis, &size) in ty.shape.axes.iter().zip(t.shape()) {
        match &axis.dim {
            Dim::Fixed(n) if *n != size => return Err(mismatch()),
            Dim::Fixed(_) => {}
            Dim::Sym(s) if s == crate::ir::shape::ANY_DIM => {}
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
