//! The verifier: everything a graph must satisfy before it is compiled or run. Every
//! error names the node (index, name and op) and the problem.
use std::collections::HashSet;

use super::graph::{check_data, Graph, NodeId};
use super::ops::control::MAX_NESTING;
use crate::error::{Error, Result};

/// Checks `g`: references, acyclicity, unique names, sources' data, attributes, and that
/// every node's recorded output types are what inference gives (which is where shape,
/// dtype and axis-name mismatches are found).
pub fn verify(g: &Graph) -> Result<()> {
    verify_located(g).map_err(|(_, e)| e)
}

/// `verify`, also saying which node an error is about (for the parser's line numbers).
pub(crate) fn verify_located(g: &Graph) -> std::result::Result<(), (Option<NodeId>, Error)> {
    verify_at(g, 0)
}

/// Verifies `g`, a body nested `depth` levels deep (0: the top graph). A body holds no
/// state (variables live in the top graph), and bodies nest at most `MAX_NESTING` deep.
fn verify_at(g: &Graph, depth: usize) -> std::result::Result<(), (Option<NodeId>, Error)> {
    let err =
        |id: NodeId, msg: String| (Some(id), Error::Graph(format!("{}: {msg}", g.describe(id))));
    let mut names = HashSet::new();
    for id in g.node_ids() {
        let node = g.node(id);
        if !names.insert(node.name.as_str()) {
            return Err(err(
                id,
                format!("the name '{}' is used by an earlier node", node.name),
            ));
        }
        for (i, v) in node.inputs.iter().enumerate() {
            if let Some(v) = v {
                if g.value_type(*v).is_err() {
                    return Err(err(
                        id,
                        format!(
                            "input {i} refers to %{}:{}, which does not exist",
                            v.node.0, v.output
                        ),
                    ));
                }
            }
        }
    }
    g.schedule().map_err(|e| (None, e))?;
    for id in g.node_ids() {
        let node = g.node(id);
        match node.op.as_str() {
            "Parameter" => {
                if !node.inputs.is_empty() || node.data.is_some() || node.outputs.len() != 1 {
                    return Err(err(
                        id,
                        "a Parameter has one declared output, no inputs and no data".into(),
                    ));
                }
            }
            "Variable" | "Assign" if depth > 0 => {
                return Err(err(
                    id,
                    "a body cannot hold state (Variable, Assign)".into(),
                ));
            }
            "Constant" | "Variable" => {
                let data = node
                    .data
                    .as_ref()
                    .ok_or_else(|| err(id, "has no data".into()))?;
                if !node.inputs.is_empty() || node.outputs.len() != 1 {
                    return Err(err(
                        id,
                        "a source has one declared output and no inputs".into(),
                    ));
                }
                check_data(&node.outputs[0], data).map_err(|e| err(id, e))?;
            }
            "Assign" => {
                if let Some(Some(target)) = node.inputs.first() {
                    let t = g.node(target.node);
                    if t.op != "Variable" {
                        return Err(err(
                            id,
                            format!(
                                "input 0 must be a Variable, got {}",
                                g.describe(target.node)
                            ),
                        ));
                    }
                }
            }
            _ => {
                if node.data.is_some() {
                    return Err(err(id, "only Constant and Variable carry data".into()));
                }
            }
        }
        for (attr, body) in node.attrs.graphs() {
            if depth + 1 > MAX_NESTING {
                return Err(err(
                    id,
                    format!("body '{attr}' nests deeper than {MAX_NESTING} levels"),
                ));
            }
            verify_at(body, depth + 1).map_err(|(_, e)| {
                let msg = match e {
                    Error::Graph(m) | Error::UnknownOp(m) => m,
                    e => e.to_string(),
                };
                err(id, format!("body '{attr}' ('{}'): {msg}", body.name))
            })?;
        }
        let inferred = g.infer_node(node).map_err(|e| match e {
            Error::UnknownOp(m) => (
                Some(id),
                Error::UnknownOp(format!("{}: {m}", g.describe(id))),
            ),
            e => err(id, e.to_string()),
        })?;
        if inferred != node.outputs {
            let show = |ts: &[super::TensorType]| {
                ts.iter()
                    .map(|t| t.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return Err(err(
                id,
                format!(
                    "declared output types ({}) differ from the inferred ({})",
                    show(&node.outputs),
                    show(&inferred)
                ),
            ));
        }
    }
    let mut out_names = HashSet::new();
    for o in g.outputs() {
        g.value_type(o.value).map_err(|_| {
            let msg = format!(
                "graph output '{}' refers to %{}:{}, which does not exist",
                o.name, o.value.node.0, o.value.output
            );
            (None, Error::Graph(msg))
        })?;
        if !out_names.insert(o.name.as_str()) {
            let msg = format!("two graph outputs are named '{}'", o.name);
            return Err((None, Error::Graph(msg)));
        }
    }
    Ok(())
}
