//! Programs with data-dependent shapes. A specialized graph whose only dynamic types come
//! from ops whose output extent depends on the data (`NonMaxSuppression`, `NonZero`,
//! `Unique`: the "sources") is split in three: the static head, lowered as usual; the
//! sources, each writing its outputs into upper-bound buffers after the head's arena and
//! reporting their actual extent (one per source, shared by its dynamic outputs); and the dynamic tail (everything that reads a source's result, usually a few
//! shape-light ops before the graph outputs), a graph of its own whose parameters are
//! the values it reads. The tail is specialized and lowered per actual extent on first
//! sight and cached like the signatures, and reads its inputs in place in the head's
//! arena, so a run with extents seen before neither compiles nor interprets anything.
use std::cell::Cell;
use std::collections::HashMap;

use super::lower::{lower, Program};
use super::pool::Pool;
use super::program::{Loc, Slot, Source, StepNode};
use super::state::Variables;
use super::steps::{nms, Build};
use super::Compiled;
use crate::backend::specialize::ProgramCache;
use crate::error::Result;
use crate::ir::{Graph, NodeId, TensorType, Value};
use crate::memory::ALIGN;
use crate::passes::CompileOptions;

/// The most sources and tail inputs a split program has (their run-time extents and
/// pointers live on the stack).
pub(crate) const MAX_SOURCES: usize = 8;
pub(crate) const MAX_TAIL_INPUTS: usize = 16;

/// A program split at its data-dependent shapes (see the module comment).
pub struct Split {
    pub(crate) head: Program,
    pub(crate) sources: Vec<SourceStep>,
    /// The dynamic tail, unspecialized: one parameter per `tail_inputs` entry.
    pub(crate) tail: Graph,
    pub(crate) tail_inputs: Vec<TailInput>,
    /// Where each graph output comes from.
    pub(crate) outputs: Vec<Output>,
    /// The tail's programs by the shapes of its inputs.
    pub(crate) tails: ProgramCache<Compiled>,
    /// The head's arena, then the sources' bound buffers and scratch.
    pub(crate) arena_bytes: usize,
}

/// A source's step, the bound of its extent, and its outputs.
pub(crate) struct SourceStep {
    pub(crate) node: StepNode,
    pub(crate) kernel: Box<dyn Source>,
    pub(crate) bound: usize,
    pub(crate) outs: Vec<SourceOut>,
}

/// A source's output: its buffer (of the bound shape), its IR type, and the one axis
/// whose size is the extent (`None`: a static output).
pub(crate) struct SourceOut {
    pub(crate) slot: Slot,
    pub(crate) ty: TensorType,
    pub(crate) axis: Option<usize>,
}

/// Where a tail parameter's bytes are: a head value, or output `k` of source `j`
/// (`Source(j, k)`).
pub(crate) enum TailInput {
    Head(Slot),
    Source(usize, usize),
}

/// Where a graph output is: a head value, or the tail's output `k`.
pub(crate) enum Output {
    Head(Slot),
    Tail(usize),
}

impl Split {
    /// Tail input `k`'s dims at run time, given the sources' `extents`.
    pub(crate) fn tail_dims(&self, k: usize, extents: &[usize]) -> Vec<usize> {
        match &self.tail_inputs[k] {
            TailInput::Head(s) => s.shape.clone(),
            TailInput::Source(j, k) => {
                let o = &self.sources[*j].outs[*k];
                match o.axis {
                    Some(a) => nms::dims_at(&o.ty, a, extents[*j]).expect("one dynamic axis"),
                    None => o.slot.shape.clone(),
                }
            }
        }
    }

    /// Whether `shape` is tail input `k`'s at run time (without allocating).
    pub(crate) fn tail_input_is(&self, k: usize, shape: &[usize], extents: &[usize]) -> bool {
        match &self.tail_inputs[k] {
            TailInput::Head(s) => s.shape == shape,
            TailInput::Source(j, k) => {
                let o = &self.sources[*j].outs[*k];
                shape.len() == o.slot.shape.len()
                    && shape.iter().enumerate().all(|(a, &d)| {
                        d == if Some(a) == o.axis {
                            extents[*j]
                        } else {
                            o.slot.shape[a]
                        }
                    })
            }
        }
    }

    /// The sources' bounds: the tail's largest signature (what reports show).
    pub(crate) fn bound_extents(&self) -> Vec<usize> {
        self.sources.iter().map(|s| s.bound).collect()
    }
}

/// What a node of the specialized graph is to the split.
#[derive(Clone, Copy, PartialEq)]
enum Part {
    Head,
    Source,
    Tail,
}

/// `g` split at its sources, or `None` when some dynamic type does not come from a
/// source this backend has a step for (or the graph holds state or host objects).
pub(crate) fn split(
    g: &Graph,
    pool: Option<&Pool>,
    passes: &CompileOptions,
) -> Result<Option<Split>> {
    if super::has_host_bodies(g) {
        return Ok(None);
    }
    let schedule = g.schedule()?;
    let mut part = vec![Part::Head; g.len()];
    let mut bounds = HashMap::new();
    for &id in &schedule {
        let node = g.node(id);
        if matches!(node.op.as_str(), "Variable" | "Assign")
            || node.outputs.iter().any(|t| t.is_host_object())
        {
            return Ok(None);
        }
        let reads_dynamic = node
            .inputs
            .iter()
            .flatten()
            .any(|v| part[v.node.index()] != Part::Head);
        if reads_dynamic {
            part[id.index()] = Part::Tail;
        } else if node.outputs.iter().any(|t| !t.is_static()) {
            let ins: Vec<Option<&TensorType>> = node
                .inputs
                .iter()
                .map(|v| v.and_then(|v| g.value_type(v).ok()))
                .collect();
            let consts: Vec<Option<i64>> = node.inputs.iter().map(|v| const_int(g, *v)).collect();
            let Some(bound) = nms::bound(&node.op, &node.attrs, &ins, &consts) else {
                return Ok(None);
            };
            part[id.index()] = Part::Source;
            bounds.insert(id, bound);
        }
    }
    if bounds.is_empty() || bounds.len() > MAX_SOURCES {
        return Ok(None);
    }
    let is = |v: Value, p: Part| part[v.node.index()] == p;

    // The head: every node that is neither a source nor in the tail; its outputs are
    // what the sources and the tail read and the graph outputs it computes.
    let mut head = Graph::new(&g.name);
    let mut to_head: HashMap<Value, Value> = HashMap::new();
    for id in g.inputs() {
        let n = g.node(id);
        to_head.insert(
            id.out(0),
            head.add_parameter(&n.name, n.outputs[0].clone())?.out(0),
        );
    }
    for &id in &schedule {
        if part[id.index()] == Part::Head && !to_head.contains_key(&id.out(0)) {
            copy_node(g, id, &mut head, &mut to_head)?;
        }
    }
    let mut head_outs: Vec<Value> = vec![];
    let mut head_out = |v: Value, head: &mut Graph| -> Result<usize> {
        if let Some(k) = head_outs.iter().position(|&o| o == v) {
            return Ok(k);
        }
        head.add_output(&head_outs.len().to_string(), to_head[&v])?;
        head_outs.push(v);
        Ok(head_outs.len() - 1)
    };
    let mut source_ins: Vec<Vec<Option<usize>>> = vec![];
    let mut tail_reads: Vec<Value> = vec![];
    for &id in &schedule {
        let node = g.node(id);
        match part[id.index()] {
            Part::Source => source_ins.push(
                node.inputs
                    .iter()
                    .map(|v| v.map(|v| head_out(v, &mut head)).transpose())
                    .collect::<Result<_>>()?,
            ),
            Part::Tail => {
                for &v in node.inputs.iter().flatten() {
                    if !is(v, Part::Tail) && !tail_reads.contains(&v) {
                        tail_reads.push(v);
                    }
                }
            }
            Part::Head => {}
        }
    }
    for o in g.outputs() {
        if !is(o.value, Part::Tail) && !tail_reads.contains(&o.value) && is(o.value, Part::Source) {
            tail_reads.push(o.value);
        }
    }
    // Constants the tail reads are copied into it; other head values are parameters.
    let tail_params: Vec<Value> = tail_reads
        .iter()
        .copied()
        .filter(|v| g.node(v.node).op != "Constant")
        .collect();
    if tail_params.len() > MAX_TAIL_INPUTS {
        return Ok(None);
    }
    let mut head_index = HashMap::new();
    for &v in tail_params
        .iter()
        .chain(g.outputs().iter().map(|o| &o.value))
    {
        if is(v, Part::Head) {
            head_index.insert(v, head_out(v, &mut head)?);
        }
    }
    let head_program = lower(&head, pool, &Variables::new(&head)?, passes)?;

    // The sources: bound buffers after the head's arena, then their shared scratch.
    let source_ids: Vec<NodeId> = schedule
        .iter()
        .copied()
        .filter(|id| part[id.index()] == Part::Source)
        .collect();
    let mut at = head_program.arena_bytes.next_multiple_of(ALIGN);
    let mut source_outs = vec![];
    for &id in &source_ids {
        let bound = bounds[&id];
        let mut outs = vec![];
        for ty in &g.node(id).outputs {
            let axis = dynamic_axis(ty);
            let shape = match axis {
                Some(a) => nms::dims_at(ty, a, bound),
                None => ty.static_dims(),
            };
            let shape = shape.ok_or_else(|| {
                crate::error::Error::Graph(format!(
                    "{}: more than one dynamic axis",
                    g.describe(id)
                ))
            })?;
            let slot = Slot {
                loc: Loc::Arena(at),
                dtype: ty.dtype,
                shape,
            };
            at = slot
                .bytes()
                .checked_next_multiple_of(ALIGN)
                .and_then(|b| at.checked_add(b))
                .ok_or_else(|| crate::error::Error::Graph("a source's bound overflows".into()))?;
            outs.push(SourceOut {
                slot,
                ty: ty.clone(),
                axis,
            });
        }
        source_outs.push(outs);
    }
    let scratch_bytes = Cell::new(0);
    let mut sources = vec![];
    for ((&id, ins), outs) in source_ids.iter().zip(&source_ins).zip(source_outs) {
        let node = g.node(id);
        let ins: Vec<Option<Slot>> = ins
            .iter()
            .map(|k| k.map(|k| head_program.outputs[k].clone()))
            .collect();
        let in_data: Vec<_> = node
            .inputs
            .iter()
            .map(|v| {
                v.map(|v| g.node(v.node))
                    .filter(|n| n.op == "Constant")
                    .and_then(|n| n.data.as_deref())
            })
            .collect();
        let slots: Vec<Slot> = outs.iter().map(|o| o.slot.clone()).collect();
        let b = Build {
            g,
            id,
            node,
            ins: &ins,
            in_data: &in_data,
            outs: &slots,
            scratch_at: at,
            scratch_bytes: &scratch_bytes,
            pool,
            tuning: &passes.tuning,
            passes,
        };
        let Some(kernel) = nms::build(&b)
            .map_err(|e| crate::error::Error::Graph(format!("{}: {e}", g.describe(id))))?
        else {
            return Ok(None);
        };
        sources.push(SourceStep {
            node: StepNode::of(g, id),
            kernel,
            bound: bounds[&id],
            outs,
        });
    }

    // The tail: parameters for what it reads, its nodes, the graph outputs it makes.
    let mut tail = Graph::new(&format!("{}.tail", g.name));
    let mut to_tail: HashMap<Value, Value> = HashMap::new();
    let mut tail_inputs = vec![];
    for &v in &tail_params {
        let name = tail.fresh_name(&g.node(v.node).name);
        let p = tail.add_parameter(&name, g.value_type(v)?.clone())?;
        to_tail.insert(v, p.out(0));
        tail_inputs.push(if is(v, Part::Source) {
            TailInput::Source(
                source_ids
                    .iter()
                    .position(|&s| s == v.node)
                    .expect("a source"),
                v.output as usize,
            )
        } else {
            TailInput::Head(head_program.outputs[head_index[&v]].clone())
        });
    }
    for &v in &tail_reads {
        if !to_tail.contains_key(&v) {
            copy_node(g, v.node, &mut tail, &mut to_tail)?;
        }
    }
    for &id in &schedule {
        if part[id.index()] == Part::Tail {
            copy_node(g, id, &mut tail, &mut to_tail)?;
        }
    }
    let mut outputs = vec![];
    for o in g.outputs() {
        outputs.push(if is(o.value, Part::Head) {
            Output::Head(head_program.outputs[head_index[&o.value]].clone())
        } else {
            tail.add_output(&o.name, to_tail[&o.value])?;
            Output::Tail(tail.outputs().len() - 1)
        });
    }
    Ok(Some(Split {
        head: head_program,
        sources,
        tail,
        tail_inputs,
        outputs,
        tails: ProgramCache::new(),
        arena_bytes: at + scratch_bytes.get(),
    }))
}

/// Node `id` of `g` copied into `to` (its inputs through `map`), its outputs recorded
/// in `map`.
fn copy_node(g: &Graph, id: NodeId, to: &mut Graph, map: &mut HashMap<Value, Value>) -> Result<()> {
    let n = g.node(id);
    let copy = match n.op.as_str() {
        "Constant" => {
            let data = n.data.as_deref().expect("verified: a constant has data");
            to.add_constant(&n.name, n.outputs[0].clone(), data.clone())?
        }
        _ => {
            let inputs: Vec<Option<Value>> = n.inputs.iter().map(|v| v.map(|v| map[&v])).collect();
            to.add_op(&n.op, &inputs, n.attrs.clone(), &n.name)?
        }
    };
    for k in 0..n.outputs.len() {
        map.insert(id.out(k as u32), copy.out(k as u32));
    }
    Ok(())
}

/// The axis of `ty` whose size is not known (`None` when every one is).
fn dynamic_axis(ty: &TensorType) -> Option<usize> {
    ty.shape
        .axes
        .iter()
        .position(|a| !matches!(a.dim, crate::ir::Dim::Fixed(_)))
}

/// The first element of `v` when it is an integer constant.
fn const_int(g: &Graph, v: Option<Value>) -> Option<i64> {
    let n = g.node(v?.node);
    if n.op != "Constant" {
        return None;
    }
    n.data.as_deref()?.to_f64_vec().first().map(|&x| x as i64)
}
