//! Liveness: for every value the arena holds, its size and the schedule steps it lives.
use std::collections::HashMap;

use super::planner::align_up;
use crate::error::{Error, Result};
use crate::ir::{Graph, NodeId, Value};

/// Whether the node's outputs live in the arena: everything but the sources
/// (`Parameter`, `Constant`, `Variable`), which hold graph inputs, weights and state.
pub(crate) fn in_arena(op: &str) -> bool {
    !matches!(op, "Parameter" | "Constant" | "Variable")
}

/// One arena value's size and live range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueLife {
    pub value: Value,
    /// The tensor's bytes (elements × element size).
    pub bytes: usize,
    /// `bytes` rounded up to [`super::ALIGN`]: what the arena reserves for it.
    pub size: usize,
    /// The static dims (in-place rules compare them).
    pub dims: Vec<usize>,
    /// The schedule step of its node.
    pub def: usize,
    /// The last step that reads it: the end of the schedule for a graph output, `def`
    /// for a value nobody reads.
    pub last: usize,
    /// Whether it is a graph output.
    pub graph_output: bool,
}

/// The arena values of a scheduled graph, in schedule order (then output order).
#[derive(Debug, Clone, Default)]
pub struct Liveness {
    pub values: Vec<ValueLife>,
    /// The number of schedule steps.
    pub steps: usize,
    index: HashMap<Value, usize>,
}

impl Liveness {
    /// The position of `v` in `values`, if it is an arena value.
    pub(crate) fn index_of(&self, v: Value) -> Option<usize> {
        self.index.get(&v).copied()
    }

    pub fn get(&self, v: Value) -> Option<&ValueLife> {
        self.index_of(v).map(|i| &self.values[i])
    }
}

/// Computes the liveness of every arena value of `g` run in the order `schedule`.
/// Nodes missing from the schedule are ignored unless a scheduled node or a graph output
/// needs them. Errors on a non-static arena value, a node scheduled twice or before one
/// of its inputs.
pub(crate) fn analyze(g: &Graph, schedule: &[NodeId]) -> Result<Liveness> {
    let mut step_of: Vec<Option<usize>> = vec![None; g.len()];
    for (s, &id) in schedule.iter().enumerate() {
        let slot = step_of.get_mut(id.index()).ok_or_else(|| {
            Error::Graph(format!(
                "memory plan: schedule step {s} names node #{}, which does not exist",
                id.0
            ))
        })?;
        if let Some(prev) = slot {
            return Err(Error::Graph(format!(
                "memory plan: {} is scheduled twice (steps {prev} and {s})",
                g.describe(id)
            )));
        }
        *slot = Some(s);
    }

    let mut lv = Liveness {
        steps: schedule.len(),
        ..Liveness::default()
    };
    // The planner adds and subtracts sizes (live bytes per step, offsets) as `isize`-safe
    // sums; keeping their total under `isize::MAX`, the most any allocation may be, makes
    // every such sum fit.
    let mut total = 0usize;
    for (s, &id) in schedule.iter().enumerate() {
        let node = g.node(id);
        if !in_arena(&node.op) {
            continue;
        }
        for (k, ty) in node.outputs.iter().enumerate() {
            // Host objects (strings, sequences, optionals) have no bytes to place.
            if ty.is_host_object() {
                continue;
            }
            let dims = ty.static_dims().ok_or_else(|| {
                Error::Graph(format!(
                    "memory plan: output {k} of {} has type {ty}, which is not static \
                     (specialize symbolic dims first)",
                    g.describe(id)
                ))
            })?;
            let bytes = dims
                .iter()
                .try_fold(ty.dtype.size_in_bytes(), |n, &d| n.checked_mul(d))
                .and_then(|b| align_up(b).map(|a| (b, a)));
            let total_ok = bytes.is_some_and(|(_, size)| {
                total = total.saturating_add(size);
                total <= isize::MAX as usize
            });
            let (Some((bytes, size)), true) = (bytes, total_ok) else {
                return Err(Error::Graph(format!(
                    "memory plan: output {k} of {} ({ty}) is too large to address",
                    g.describe(id)
                )));
            };

            let value = id.out(k as u32);
            lv.index.insert(value, lv.values.len());
            lv.values.push(ValueLife {
                value,
                bytes,
                size,
                dims,
                def: s,
                last: s,
                graph_output: false,
            });
        }
    }

    for (s, &id) in schedule.iter().enumerate() {
        for (k, v) in g.node(id).inputs.iter().enumerate() {
            let Some(v) = *v else { continue };
            let i = arena_value(g, &lv, &step_of, v, || {
                format!("input {k} of {}", g.describe(id))
            })?;
            let Some(i) = i else { continue };
            let life = &mut lv.values[i];
            if life.def >= s {
                return Err(Error::Graph(format!(
                    "memory plan: {} runs at step {s}, before its input {k} ({}) at step {}",
                    g.describe(id),
                    g.describe(v.node),
                    life.def
                )));
            }
            life.last = life.last.max(s);
        }
    }

    let end = schedule.len().saturating_sub(1);
    for out in g.outputs() {
        let what = || format!("graph output '{}'", out.name);
        if let Some(i) = arena_value(g, &lv, &step_of, out.value, what)? {
            lv.values[i].last = end;
            lv.values[i].graph_output = true;
        }
    }
    // A value an `Assign` stores must survive the run (the store commits when the run
    // succeeds), so it lives to the end like an output and is never overwritten.
    for v in stored_values(g, schedule).into_values() {
        if let Some(i) = lv.index_of(v) {
            lv.values[i].last = end;
            lv.values[i].graph_output = true;
        }
    }
    Ok(lv)
}

/// The value each variable ends a run holding, by the variable's node: what the last
/// `Assign` to it in the schedule stores (an earlier store to the same variable is
/// overwritten before anything can see it, since reads see the run's start value).
pub(crate) fn stored_values(
    g: &Graph,
    schedule: &[NodeId],
) -> std::collections::BTreeMap<NodeId, Value> {
    let mut stored = std::collections::BTreeMap::new();
    for &id in schedule {
        let node = g.node(id);
        if node.op == "Assign" {
            if let (Some(Some(var)), Some(Some(v))) = (node.inputs.first(), node.inputs.get(1)) {
                stored.insert(var.node, *v);
            }
        }
    }
    stored
}

/// The index of `v` among the arena values; `None` for a source's value; an error if
/// `v` does not exist or its node is not scheduled.
fn arena_value(
    g: &Graph,
    lv: &Liveness,
    step_of: &[Option<usize>],
    v: Value,
    what: impl Fn() -> String,
) -> Result<Option<usize>> {
    let Some(node) = g.nodes().get(v.node.index()) else {
        return Err(Error::Graph(format!(
            "memory plan: {} refers to node #{}, which does not exist",
            what(),
            v.node.0
        )));
    };
    if v.output as usize >= node.outputs.len() {
        return Err(Error::Graph(format!(
            "memory plan: {} refers to output {} of {}, which has {}",
            what(),
            v.output,
            g.describe(v.node),
            node.outputs.len()
        )));
    }
    if !in_arena(&node.op) || node.outputs[v.output as usize].is_host_object() {
        return Ok(None);
    }
    if step_of[v.node.index()].is_none() {
        return Err(Error::Graph(format!(
            "memory plan: {} is {}, which is not in the schedule",
            what(),
            g.describe(v.node)
        )));
    }
    Ok(lv.index_of(v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Attrs, DType, Dim, Shape, TensorType};

    fn f32s(dims: &[usize]) -> TensorType {
        TensorType::new(DType::F32, Shape::fixed(dims))
    }

    #[test]
    fn def_and_last_use() {
        let mut g = Graph::new("t");
        let x = g.add_parameter("x", f32s(&[2, 3])).unwrap();
        let a = g.op("Relu", &[x.into()], Attrs::new(), "a").unwrap();
        let b = g.op("Relu", &[a.into()], Attrs::new(), "b").unwrap();
        let _unused = g.op("Relu", &[a.into()], Attrs::new(), "unused").unwrap();
        let c = g.op("Relu", &[b.into()], Attrs::new(), "c").unwrap();
        let d = g.op("Relu", &[x.into()], Attrs::new(), "d").unwrap();
        g.add_output("c", c.into()).unwrap();
        g.add_output("x", x.into()).unwrap();
        let _ = d;
        let lv = analyze(&g, &g.schedule().unwrap()).unwrap();
        assert_eq!(lv.steps, 6);
        assert_eq!(lv.values.len(), 5, "x is a source");
        let l = |n: &str| lv.get(g.find(n).unwrap().into()).unwrap().clone();
        assert_eq!((l("a").def, l("a").last), (1, 3));
        assert_eq!((l("unused").def, l("unused").last), (3, 3));
        assert_eq!((l("c").def, l("c").last), (4, 5));
        assert!(l("c").graph_output);
        assert_eq!((l("b").bytes, l("b").size), (24, 64));
        assert!(lv.get(x.into()).is_none());
    }

    #[test]
    fn errors_name_the_node() {
        let mut g = Graph::new("t");
        let ty = TensorType::new(DType::F32, Shape::new([Dim::Sym("N".into()), 4.into()]));
        let x = g.add_parameter("x", ty).unwrap();
        let r = g.op("Relu", &[x.into()], Attrs::new(), "r").unwrap();
        let e = analyze(&g, &[x, r]).unwrap_err().to_string();
        assert!(
            e.contains("output 0 of node #1 'r' (Relu)") && e.contains("f32[N, 4]"),
            "{e}"
        );

        let mut g = Graph::new("t");
        let x = g.add_parameter("x", f32s(&[4])).unwrap();
        let a = g.op("Relu", &[x.into()], Attrs::new(), "a").unwrap();
        let b = g.op("Relu", &[a.into()], Attrs::new(), "b").unwrap();
        let e = analyze(&g, &[x, b, a]).unwrap_err().to_string();
        assert!(e.contains("'b'") && e.contains("before its input 0"), "{e}");
        let e = analyze(&g, &[x, b]).unwrap_err().to_string();
        assert!(
            e.contains("not in the schedule") && e.contains("'a'"),
            "{e}"
        );
        let e = analyze(&g, &[x, a, a]).unwrap_err().to_string();
        assert!(e.contains("scheduled twice"), "{e}");

        // Each value addressable, but together past isize::MAX: the planner's sums
        // would overflow, so the plan is refused naming the node that tips it over.
        let huge = (isize::MAX as usize / 4) / 3 + 1;
        let mut g = Graph::new("t");
        let x = g.add_parameter("x", f32s(&[huge])).unwrap();
        let a = g.op("Relu", &[x.into()], Attrs::new(), "a").unwrap();
        let b = g.op("Relu", &[a.into()], Attrs::new(), "b").unwrap();
        let c = g.op("Relu", &[b.into()], Attrs::new(), "c").unwrap();
        assert!(analyze(&g, &[x, a, b]).is_ok());
        let e = analyze(&g, &[x, a, b, c]).unwrap_err().to_string();
        assert!(e.contains("'c'") && e.contains("too large"), "{e}");

        // A node left out that nobody needs is fine.
        assert_eq!(analyze(&g, &[x, a]).unwrap().values.len(), 1);
    }
}
