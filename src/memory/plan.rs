//! [`plan`]: liveness, in-place grouping and arena placement put together.
use std::collections::HashMap;

use super::inplace::{self, Buffers, InPlace};
use super::liveness::{self, Liveness};
use super::planner::{self, Interval};
use crate::error::Result;
use crate::ir::{Graph, NodeId, Value};

/// One buffer of the arena: a chain of values sharing memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferPlan {
    /// The tensor bytes of each of its values.
    pub bytes: usize,
    /// `bytes` rounded up to [`super::ALIGN`]: what it reserves in the arena.
    pub size: usize,
    /// Its offset in the arena, a multiple of [`super::ALIGN`].
    pub offset: usize,
    /// The step its first value is made.
    pub first: usize,
    /// The step its last value is last read (the last step for a graph output).
    pub last: usize,
    /// Its values in schedule order; each after the first took over its predecessor's
    /// memory in place.
    pub values: Vec<Value>,
}

/// A buffer that lives in a variable's storage instead of the arena: the chain of
/// values ending in the value an `Assign` stores, computed straight into the memory the
/// variable will hold after the run (so storing costs no copy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBuffer {
    /// The `Variable` node.
    pub variable: NodeId,
    /// The tensor bytes of each of its values.
    pub bytes: usize,
    /// Its values in schedule order; the last is the stored one.
    pub values: Vec<Value>,
    /// Whether the first value may be computed over the variable's current value
    /// instead of a second buffer: its node is the last to read the variable, reads it
    /// as an operand the node's in-place rule lets that output overwrite, and the
    /// variable's value is not a graph output. Every read then sees the run's start
    /// value, but the store is no longer all or nothing: a backend that uses this must
    /// have no step after the write that can fail.
    pub in_place: bool,
}

/// One arena value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValuePlan {
    pub value: Value,
    /// Its tensor bytes.
    pub bytes: usize,
    /// The step that makes it and the last step that reads it.
    pub def: usize,
    pub last: usize,
    /// Its buffer (index into [`MemoryPlan::buffers`]).
    pub buffer: usize,
    /// The input whose buffer it took over in place, if any.
    pub reuses: Option<Value>,
}

/// One schedule step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepDetail {
    pub step: usize,
    pub node: NodeId,
    /// The node's name and op.
    pub name: String,
    pub op: String,
    /// The aligned bytes of the node's arena outputs (0 for a source or `Assign`).
    pub own_bytes: usize,
    /// The aligned bytes of every buffer live at this step (in-place merging applied).
    pub live_bytes: usize,
}

/// The memory plan of a scheduled graph. Byte counts other than the `bytes` fields are
/// in aligned sizes (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryPlan {
    /// Every arena value in its own buffer: the sum of their sizes.
    pub naive_bytes: usize,
    /// The arena size.
    pub planned_bytes: usize,
    /// The most bytes of buffers live at one step: no placement does better.
    pub lower_bound_bytes: usize,
    /// The same without in-place merging (every value its own buffer).
    pub lower_bound_without_inplace_bytes: usize,
    /// The placement heuristic that won.
    pub strategy: &'static str,
    /// Every heuristic tried and the arena it needed.
    pub strategies: Vec<(&'static str, usize)>,
    /// How many outputs took over an input's buffer.
    pub inplace_reuses: usize,
    /// The buffers in order of their first value.
    pub buffers: Vec<BufferPlan>,
    /// The arena values in schedule order.
    pub values: Vec<ValuePlan>,
    /// One per schedule step.
    pub steps: Vec<StepDetail>,
    /// The buffers in variables' storage (not counted in any arena number).
    pub stored: Vec<StoredBuffer>,
    index: HashMap<Value, usize>,
}

impl MemoryPlan {
    /// The value's plan, if it is an arena value.
    pub fn value(&self, v: Value) -> Option<&ValuePlan> {
        self.index.get(&v).map(|&i| &self.values[i])
    }

    /// The index of the value's buffer in [`MemoryPlan::buffers`].
    pub(crate) fn buffer_of(&self, v: Value) -> Option<usize> {
        self.value(v).map(|p| p.buffer)
    }

    /// The value's offset in the arena.
    pub(crate) fn offset_of(&self, v: Value) -> Option<usize> {
        self.buffer_of(v).map(|b| self.buffers[b].offset)
    }

    /// The variable whose storage holds `v`, when `v` is computed there (see
    /// [`StoredBuffer`]).
    pub fn variable_of(&self, v: Value) -> Option<NodeId> {
        self.stored_of(v).map(|b| b.variable)
    }

    /// The buffer in a variable's storage that holds `v`, if any.
    pub(crate) fn stored_of(&self, v: Value) -> Option<&StoredBuffer> {
        self.stored.iter().find(|b| b.values.contains(&v))
    }

    /// `planned_bytes / lower_bound_bytes` (1 when both are 0).
    pub fn ratio_to_lower_bound(&self) -> f64 {
        if self.lower_bound_bytes == 0 {
            1.0
        } else {
            self.planned_bytes as f64 / self.lower_bound_bytes as f64
        }
    }
}

/// Plans the arena of `g` run in the order `schedule` (usually `g.schedule()?`). Every
/// arena value must have a static type; the error names the node and output otherwise.
pub fn plan(g: &Graph, schedule: &[NodeId]) -> Result<MemoryPlan> {
    let lv = liveness::analyze(g, schedule)?;
    let mut merged = inplace::group(g, schedule, &lv, true);
    let mut separate = inplace::group(g, schedule, &lv, false);
    // The chains ending in a stored value move to their variable's storage (a value
    // stored to two variables goes to the first; the lowering copies it to the other).
    let mut stored = vec![];
    let mut stored_chain = vec![false; merged.chains.len()];
    let last_reads = variable_last_reads(g, schedule);
    for (var, v) in liveness::stored_values(g, schedule) {
        let Some(i) = lv.index_of(v) else { continue };
        let c = merged.chain_of[i];
        if !stored_chain[c] {
            stored_chain[c] = true;
            let chain = &merged.chains[c];
            let head = &lv.values[chain.values[0]];
            let in_place = last_reads.get(&var).copied().flatten() == Some(head.def)
                && overwrites(g, schedule[head.def], head, var.out(0));
            stored.push(StoredBuffer {
                variable: var,
                bytes: chain.bytes,
                values: chain.values.iter().map(|&j| lv.values[j].value).collect(),
                in_place,
            });
        }
    }
    let in_arena: Vec<bool> = (0..lv.values.len())
        .map(|i| !stored_chain[merged.chain_of[i]])
        .collect();
    merged.retain(&in_arena);
    separate.retain(&in_arena);
    let intervals = intervals(&merged);
    let placement = planner::place(&intervals);

    let buffers: Vec<BufferPlan> = merged
        .chains
        .iter()
        .zip(&placement.offsets)
        .map(|(c, &offset)| BufferPlan {
            bytes: c.bytes,
            size: c.size,
            offset,
            first: c.first,
            last: c.last,
            values: c.values.iter().map(|&i| lv.values[i].value).collect(),
        })
        .collect();
    let values: Vec<ValuePlan> = lv
        .values
        .iter()
        .enumerate()
        .filter(|&(i, _)| in_arena[i])
        .map(|(i, l)| ValuePlan {
            value: l.value,
            bytes: l.bytes,
            def: l.def,
            last: l.last,
            buffer: merged.chain_of[i],
            reuses: merged.took[i].map(|j| lv.values[j].value),
        })
        .collect();
    let index = values
        .iter()
        .enumerate()
        .map(|(i, v)| (v.value, i))
        .collect();

    let arena_values = || {
        lv.values
            .iter()
            .zip(&in_arena)
            .filter(|(_, &a)| a)
            .map(|(l, _)| l)
    };
    let live = live_per_step(&lv, &merged);
    let mut own = vec![0usize; schedule.len()];
    for l in arena_values() {
        own[l.def] += l.size;
    }
    let steps = schedule
        .iter()
        .enumerate()
        .map(|(s, &id)| {
            let n = g.node(id);
            StepDetail {
                step: s,
                node: id,
                name: n.name.clone(),
                op: n.op.clone(),
                own_bytes: own[s],
                live_bytes: live[s],
            }
        })
        .collect();

    let lower_bound_bytes = live.iter().copied().max().unwrap_or(0);
    debug_assert_eq!(lower_bound_bytes, planner::lower_bound(&intervals));
    let lower_bound_without_inplace_bytes =
        live_per_step(&lv, &separate).into_iter().max().unwrap_or(0);
    let naive_bytes = arena_values().map(|l| l.size).sum();
    debug_assert!(placement.arena_bytes >= lower_bound_bytes);
    Ok(MemoryPlan {
        naive_bytes,
        planned_bytes: placement.arena_bytes,
        lower_bound_bytes,
        lower_bound_without_inplace_bytes,
        strategy: placement.strategy.name(),
        strategies: placement
            .tried
            .iter()
            .map(|&(s, bytes)| (s.name(), bytes))
            .collect(),
        inplace_reuses: merged.reuses(),
        buffers,
        values,
        steps,
        stored,
        index,
    })
}

/// Per variable read in the schedule: the last step reading its value, or `None` when
/// the value is also a graph output (it must then survive the run). An `Assign`'s
/// target is not a read.
fn variable_last_reads(g: &Graph, schedule: &[NodeId]) -> HashMap<NodeId, Option<usize>> {
    let mut last = HashMap::new();
    for (s, &id) in schedule.iter().enumerate() {
        let node = g.node(id);
        let skip = usize::from(node.op == "Assign");
        for v in node.inputs.iter().skip(skip).flatten() {
            if g.node(v.node).op == "Variable" {
                last.insert(v.node, Some(s));
            }
        }
    }
    for out in g.outputs() {
        if g.node(out.value.node).op == "Variable" {
            last.insert(out.value.node, None);
        }
    }
    last
}

/// Whether node `id`'s output `out` may overwrite its operand `var` (a variable's
/// value, which dies there) under the node's in-place rule.
fn overwrites(g: &Graph, id: NodeId, out: &liveness::ValueLife, var: Value) -> bool {
    let node = g.node(id);
    let ty = &g.node(var.node).outputs[0];
    let bytes = out.dims.iter().product::<usize>() * ty.dtype.size_in_bytes();
    if ty.static_dims().as_deref() != Some(&out.dims[..]) || bytes != out.bytes {
        return false;
    }
    let reads_at = |p: usize| node.inputs.get(p).copied().flatten() == Some(var);
    match inplace::rule_in(g, &node.op) {
        InPlace::AnySameShape => (0..node.inputs.len()).any(reads_at),
        // The convolution's residual must not also be one of its other operands.
        InPlace::InputSameShape(p) => {
            reads_at(p) && node.inputs.iter().filter(|&&u| u == Some(var)).count() == 1
        }
        InPlace::View | InPlace::No => false,
    }
}

fn intervals(b: &Buffers) -> Vec<Interval> {
    b.chains
        .iter()
        .map(|c| Interval {
            size: c.size,
            first: c.first,
            last: c.last,
        })
        .collect()
}

/// The aligned bytes of the buffers live at each step.
fn live_per_step(lv: &Liveness, b: &Buffers) -> Vec<usize> {
    let mut delta = vec![0isize; lv.steps + 1];
    for c in &b.chains {
        delta[c.first] += c.size as isize;
        delta[c.last + 1] -= c.size as isize;
    }
    let mut live = 0isize;
    delta[..lv.steps]
        .iter()
        .map(|d| {
            live += d;
            live as usize
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ir::{Attrs, DType, Shape, TensorType};
    use crate::tensor::Tensor;

    pub(crate) fn f32s(dims: &[usize]) -> TensorType {
        TensorType::new(DType::F32, Shape::fixed(dims))
    }

    fn planned(g: &Graph) -> MemoryPlan {
        let p = plan(g, &g.schedule().unwrap()).unwrap();
        check_plan(&p);
        p
    }

    /// The invariants every plan keeps.
    pub(crate) fn check_plan(p: &MemoryPlan) {
        assert!(p.planned_bytes >= p.lower_bound_bytes);
        assert!(p.lower_bound_bytes <= p.lower_bound_without_inplace_bytes);
        assert!(p.lower_bound_without_inplace_bytes <= p.naive_bytes);
        assert_eq!(
            p.steps.iter().map(|s| s.live_bytes).max().unwrap_or(0),
            p.lower_bound_bytes
        );
        for (i, a) in p.buffers.iter().enumerate() {
            assert_eq!(a.offset % super::super::ALIGN, 0);
            assert!(a.offset + a.size <= p.planned_bytes);
            for b in &p.buffers[i + 1..] {
                if a.first <= b.last && b.first <= a.last && a.size > 0 && b.size > 0 {
                    assert!(a.offset + a.size <= b.offset || b.offset + b.size <= a.offset);
                }
            }
        }
        for v in &p.values {
            assert!(p.buffers[v.buffer].values.contains(&v.value));
        }
        // Within a buffer the values live one after another: each is made at the step
        // that last reads its predecessor, whose memory it took over.
        for b in &p.buffers {
            let vs: Vec<&ValuePlan> = b.values.iter().map(|&v| p.value(v).unwrap()).collect();
            assert_eq!(vs[0].def, b.first);
            assert_eq!(vs[0].reuses, None);
            assert_eq!(vs.last().unwrap().last, b.last);
            for w in vs.windows(2) {
                assert_eq!(w[1].def, w[0].last, "{:?} overlaps {:?}", w[1], w[0]);
                assert_eq!(w[1].reuses, Some(w[0].value));
                assert_eq!(w[1].bytes, w[0].bytes);
            }
        }
        assert_eq!(
            p.inplace_reuses,
            p.values.iter().filter(|v| v.reuses.is_some()).count()
        );
    }

    #[test]
    fn relu_chain_is_one_buffer() {
        let mut g = Graph::new("chain");
        let x = g.add_parameter("x", f32s(&[4, 16])).unwrap();
        let mut v = x;
        for i in 0..5 {
            v = g
                .op("Relu", &[v.into()], Attrs::new(), &format!("r{i}"))
                .unwrap();
        }
        g.add_output("y", v.into()).unwrap();
        let p = planned(&g);
        assert_eq!(p.buffers.len(), 1);
        assert_eq!(p.buffers[0].values.len(), 5);
        assert_eq!((p.buffers[0].first, p.buffers[0].last), (1, 5));
        assert_eq!(p.planned_bytes, 256);
        assert_eq!(p.lower_bound_bytes, 256);
        assert_eq!(p.lower_bound_without_inplace_bytes, 512);
        assert_eq!(p.naive_bytes, 5 * 256);
        assert_eq!(p.inplace_reuses, 4);
        assert_eq!(p.steps.len(), 6);
        assert_eq!(p.steps[0].own_bytes, 0, "the parameter is not in the arena");
        assert_eq!(p.steps[3].own_bytes, 256);
        assert_eq!(p.offset_of(v.into()), Some(0));
        assert_eq!(p.offset_of(x.into()), None);
        let r1 = g.find("r1").unwrap();
        assert_eq!(
            p.value(r1.into()).unwrap().reuses,
            Some(g.find("r0").unwrap().into())
        );
    }

    #[test]
    fn diamond_keeps_two_branches() {
        let mut g = Graph::new("diamond");
        let x = g.add_parameter("x", f32s(&[256])).unwrap();
        let a = g.op("Relu", &[x.into()], Attrs::new(), "a").unwrap();
        let b = g.op("Sigmoid", &[a.into()], Attrs::new(), "b").unwrap();
        let c = g.op("Tanh", &[a.into()], Attrs::new(), "c").unwrap();
        let d = g
            .op("Add", &[b.into(), c.into()], Attrs::new(), "d")
            .unwrap();
        g.add_output("d", d.into()).unwrap();
        let p = planned(&g);
        // b cannot take a (c still reads it); c takes a; d takes b.
        assert_eq!(p.buffer_of(c.into()), p.buffer_of(a.into()));
        assert_eq!(p.buffer_of(d.into()), p.buffer_of(b.into()));
        assert_ne!(p.buffer_of(a.into()), p.buffer_of(b.into()));
        assert_eq!(p.buffers.len(), 2);
        assert_eq!(p.inplace_reuses, 2);
        assert_eq!(p.lower_bound_bytes, 2048);
        assert_eq!(p.planned_bytes, 2048);
        assert_ne!(p.offset_of(b.into()), p.offset_of(a.into()));
        // Without in-place, a, b and c are live together at c's step.
        assert_eq!(p.lower_bound_without_inplace_bytes, 3072);
    }

    #[test]
    fn unused_output_lives_one_step() {
        let mut g = Graph::new("unused");
        let x = g.add_parameter("x", f32s(&[64])).unwrap();
        let a = g.op("Relu", &[x.into()], Attrs::new(), "a").unwrap();
        let dead = g.op("Exp", &[a.into()], Attrs::new(), "dead").unwrap();
        let b = g.op("Neg", &[a.into()], Attrs::new(), "b").unwrap();
        g.add_output("b", b.into()).unwrap();
        let p = planned(&g);
        let d = p.value(dead.into()).unwrap();
        assert_eq!((d.def, d.last), (2, 2));
        assert_eq!(p.buffers[d.buffer].values, vec![Value::from(dead)]);
        // The dead value cannot take a (b reads it later); b takes a afterwards and may
        // share memory with dead, which is already gone.
        assert_eq!(p.buffer_of(b.into()), p.buffer_of(a.into()));
        assert_eq!(p.lower_bound_bytes, 512);
        assert_eq!(p.planned_bytes, 512);
    }

    #[test]
    fn graph_output_lives_to_the_end_and_is_not_overwritten() {
        let mut g = Graph::new("out");
        let x = g.add_parameter("x", f32s(&[64])).unwrap();
        let a = g.op("Relu", &[x.into()], Attrs::new(), "a").unwrap();
        let b = g.op("Neg", &[a.into()], Attrs::new(), "b").unwrap();
        let c = g.op("Neg", &[b.into()], Attrs::new(), "c").unwrap();
        let d = g.op("Neg", &[c.into()], Attrs::new(), "d").unwrap();
        g.add_output("a", a.into()).unwrap();
        g.add_output("d", d.into()).unwrap();
        let p = planned(&g);
        let va = p.value(a.into()).unwrap();
        assert_eq!((va.def, va.last), (1, 4));
        assert_eq!(p.buffers[va.buffer].values, vec![Value::from(a)]);
        assert_eq!(p.buffer_of(d.into()), p.buffer_of(b.into()));
        assert_eq!(p.buffers.len(), 2);
        assert_eq!(p.planned_bytes, 512);
        assert_eq!(p.steps.last().unwrap().live_bytes, 512);
    }

    #[test]
    fn broadcasting_input_is_not_overwritten() {
        let mut g = Graph::new("bcast");
        let pb = g.add_parameter("pb", f32s(&[64])).unwrap();
        let pc = g.add_parameter("pc", f32s(&[1, 64])).unwrap();
        let px = g.add_parameter("px", f32s(&[4, 64])).unwrap();
        let b = g.op("Relu", &[pb.into()], Attrs::new(), "b").unwrap();
        // Same bytes as b, but b's shape [64] is not the output's [1, 64].
        let d = g
            .op("Add", &[b.into(), pc.into()], Attrs::new(), "d")
            .unwrap();
        // A true broadcast: d is read 4 times per element of e.
        let e = g
            .op("Mul", &[d.into(), px.into()], Attrs::new(), "e")
            .unwrap();
        g.add_output("e", e.into()).unwrap();
        let p = planned(&g);
        assert_eq!(p.inplace_reuses, 0);
        assert_eq!(p.buffers.len(), 3);
        assert_ne!(p.buffer_of(d.into()), p.buffer_of(b.into()));
        // b and d are live together at d's step; d and e at e's.
        assert_eq!(p.lower_bound_bytes, 256 + 1024);
        assert_eq!(p.planned_bytes, 256 + 1024);
    }

    #[test]
    fn reshape_aliases_its_input() {
        let mut g = Graph::new("reshape");
        let x = g.add_parameter("x", f32s(&[4, 16])).unwrap();
        let r = g.op("Relu", &[x.into()], Attrs::new(), "r").unwrap();
        let shape = g
            .add_constant_value(
                "shape",
                Tensor::from_i64s(DType::I64, &[2], &[16, 4]).unwrap(),
            )
            .unwrap();
        let y = g
            .op("Reshape", &[r.into(), shape.into()], Attrs::new(), "y")
            .unwrap();
        let z = g.op("Sigmoid", &[y.into()], Attrs::new(), "z").unwrap();
        g.add_output("z", z.into()).unwrap();
        let p = planned(&g);
        assert_eq!(p.buffers.len(), 1);
        assert_eq!(p.offset_of(y.into()), p.offset_of(r.into()));
        assert_eq!(p.value(y.into()).unwrap().reuses, Some(r.into()));
        assert_eq!(p.inplace_reuses, 2);
        assert_eq!(p.planned_bytes, 256);
        // A reshape of a value still needed later is a copy.
        let mut g = Graph::new("reshape2");
        let x = g.add_parameter("x", f32s(&[4, 16])).unwrap();
        let r = g.op("Relu", &[x.into()], Attrs::new(), "r").unwrap();
        let shape = g
            .add_constant_value("shape", Tensor::from_i64s(DType::I64, &[1], &[64]).unwrap())
            .unwrap();
        let y = g
            .op("Reshape", &[r.into(), shape.into()], Attrs::new(), "y")
            .unwrap();
        g.add_output("y", y.into()).unwrap();
        g.add_output("r", r.into()).unwrap();
        let p = planned(&g);
        assert_eq!(p.inplace_reuses, 0);
        assert_eq!(p.planned_bytes, 512);
    }

    #[test]
    fn one_input_buffer_serves_one_output() {
        let mut g = Graph::new("twice");
        let x = g.add_parameter("x", f32s(&[16])).unwrap();
        let a = g.op("Relu", &[x.into()], Attrs::new(), "a").unwrap();
        let s = g
            .op("Add", &[a.into(), a.into()], Attrs::new(), "s")
            .unwrap();
        g.add_output("s", s.into()).unwrap();
        let p = planned(&g);
        assert_eq!(p.inplace_reuses, 1);
        assert_eq!(p.buffers.len(), 1);
    }

    /// Random graphs of elementwise ops over a few shapes (some broadcasting), views
    /// and matmuls: every plan keeps the invariants.
    #[test]
    fn property_random_graphs() {
        use crate::memory::planner::tests::Rng;
        let mut rng = Rng::new(42);
        let mut worst = 1.0f64;
        let (mut reuses, mut views) = (0, 0);
        for case in 0..60 {
            let mut g = Graph::new("random");
            let mut pool: Vec<NodeId> = vec![];
            for (i, dims) in [[8usize, 16], [16, 8], [1, 16], [8, 8]].iter().enumerate() {
                pool.push(g.add_parameter(&format!("p{i}"), f32s(dims)).unwrap());
            }
            let flat = g
                .add_constant_value(
                    "flat",
                    Tensor::from_i64s(DType::I64, &[2], &[16, 8]).unwrap(),
                )
                .unwrap();
            let nodes = rng.range(5, 60);
            for i in 0..nodes {
                let a = pool[rng.range(0, pool.len() - 1)];
                let b = pool[rng.range(0, pool.len() - 1)];
                let name = format!("n{i}");
                let unary = ["Relu", "Neg", "Exp", "Sigmoid"][rng.range(0, 3)];
                let made = match rng.range(0, 9) {
                    0..=3 => g.op(unary, &[a.into()], Attrs::new(), &name),
                    4..=6 => g.op(
                        ["Add", "Mul"][rng.range(0, 1)],
                        &[a.into(), b.into()],
                        Attrs::new(),
                        &name,
                    ),
                    7 => g.op("Reshape", &[a.into(), flat.into()], Attrs::new(), &name),
                    _ => g.op("MatMul", &[a.into(), b.into()], Attrs::new(), &name),
                };
                // Shape mismatches are simply not added.
                if let Ok(id) = made {
                    pool.push(id);
                }
            }
            for k in 0..rng.range(1, 3) {
                let v = pool[rng.range(4, pool.len() - 1).min(pool.len() - 1)];
                let _ = g.add_output(&format!("out{k}"), v.into());
            }
            let p = plan(&g, &g.schedule().unwrap()).unwrap_or_else(|e| panic!("case {case}: {e}"));
            check_plan(&p);
            worst = worst.max(p.ratio_to_lower_bound());
            reuses += p.inplace_reuses;
            views += p
                .values
                .iter()
                .filter(|v| v.reuses.is_some() && g.node(v.value.node).op == "Reshape")
                .count();
        }
        assert!(reuses > 50 && views > 0, "{reuses} reuses, {views} views");
        eprintln!("random graphs: worst planned/lower-bound {worst:.4}, {reuses} reuses");
    }

    #[test]
    fn empty_and_source_only_graphs() {
        let g = Graph::new("empty");
        let p = planned(&g);
        assert_eq!(
            (p.naive_bytes, p.planned_bytes, p.lower_bound_bytes),
            (0, 0, 0)
        );
        let mut g = Graph::new("src");
        let x = g.add_parameter("x", f32s(&[16])).unwrap();
        g.add_output("x", x.into()).unwrap();
        let p = planned(&g);
        assert_eq!(p.planned_bytes, 0);
        assert_eq!(p.steps.len(), 1);
    }
}
