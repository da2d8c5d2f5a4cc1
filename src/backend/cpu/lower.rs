//! Lowering: a specialized, optimized graph (every type static) to a [`Program`].
//!
//! The memory planner places every intermediate value in one arena; graph inputs are
//! read where the caller's tensors are, constants are copied once into aligned buffers
//! (and weights repacked by the kernels that want them so). Each node becomes one step:
//! the kernel its op and attributes call for (`steps::build`), or the generic fallback
//! that runs the interpreter's op on copies.
use std::collections::HashMap;

use super::pool::Pool;
use super::program::{Loc, Slot, Step, StepNode};
use super::state::Variables;
use super::steps::{self, view, Build};
use crate::aligned::AlignedBuf;
use crate::backend::specialize::static_output;
use crate::error::{Error, Result};
use crate::ir::{Graph, NodeId, Value};
use crate::memory::{self, MemoryPlan};
use crate::passes::CompileOptions;

/// A lowered graph for one set of input shapes.
pub struct Program {
    pub steps: Vec<Step>,
    pub arena_bytes: usize,
    /// The graph inputs' static types, in order.
    pub inputs: Vec<Slot>,
    pub outputs: Vec<Slot>,
    pub memory: MemoryPlan,
    /// The variables (by number) a run stores to.
    pub stores: Vec<usize>,
    /// Those whose next value is computed into their second buffer, which becomes
    /// current when the run succeeds. The others are updated in place (see
    /// [`memory::MemoryPlan::stored`]), and no step after the first such update can
    /// fail, so a failed run still leaves every variable as it was.
    pub swaps: Vec<usize>,
    /// Keeps the constants that `Loc::Const` points into alive.
    _consts: Vec<AlignedBuf>,
}

/// Lowers `g`, whose types must all be static, for runs on `pool` with the executable's
/// variables `vars` (those of `g` are found by name).
pub(crate) fn lower(
    g: &Graph,
    pool: Option<&Pool>,
    vars: &Variables,
    passes: &CompileOptions,
) -> Result<Program> {
    let p = lower_with(g, pool, vars, passes, true)?;
    let first_update = p.steps.iter().position(|s| s.updates_variable);
    match first_update {
        Some(i) if p.steps[i..].iter().any(|s| s.kernel.can_fail()) => {
            lower_with(g, pool, vars, passes, false)
        }
        _ => Ok(p),
    }
}

/// [`lower`], updating variables in place where the plan allows it if `in_place`.
fn lower_with(
    g: &Graph,
    pool: Option<&Pool>,
    vars: &Variables,
    passes: &CompileOptions,
    in_place: bool,
) -> Result<Program> {
    let schedule = g.schedule()?;
    let plan = memory::plan(g, &schedule)?;
    let stored = memory::liveness::stored_values(g, &schedule);
    let mut stores = vec![];
    let mut swaps = vec![];
    let params = g.inputs();
    let mut slots: HashMap<Value, Slot> = HashMap::new();
    let mut consts = vec![];
    let mut steps = vec![];
    let scratch_at = plan.planned_bytes.next_multiple_of(memory::ALIGN);
    let scratch_bytes = std::cell::Cell::new(0);
    let static_shape = |id, k| static_output(g, id, k);
    // The arena bytes live at each node's step, for traces.
    let live_bytes: HashMap<NodeId, usize> =
        plan.steps.iter().map(|s| (s.node, s.live_bytes)).collect();
    for &id in &schedule {
        let node = g.node(id);
        match node.op.as_str() {
            "Parameter" => {
                let (dtype, shape) = static_shape(id, 0)?;
                let k = params.iter().position(|&p| p == id).expect("a graph input");
                slots.insert(
                    id.out(0),
                    Slot {
                        loc: Loc::Input(k),
                        dtype,
                        shape,
                    },
                );
            }
            "Constant" => {
                let (dtype, shape) = static_shape(id, 0)?;
                let t = node.data.as_deref().expect("verified");
                let buf = AlignedBuf::try_from_bytes(&t.to_le_bytes())?;
                slots.insert(
                    id.out(0),
                    Slot {
                        loc: Loc::Const(buf.as_ptr()),
                        dtype,
                        shape,
                    },
                );
                consts.push(buf);
            }
            "Variable" => {
                let (dtype, shape) = static_shape(id, 0)?;
                let k = vars.index(&node.name)?;
                slots.insert(
                    id.out(0),
                    Slot {
                        loc: vars.current(k),
                        dtype,
                        shape,
                    },
                );
            }
            "Assign" => {
                let (Some(target), Some(value)) = (node.inputs[0], node.inputs[1]) else {
                    unreachable!("verified: Assign has both operands")
                };
                // Only the last store to a variable counts; it is usually computed in
                // place (the plan put it in the variable's next buffer), else copied.
                let k = vars.index(&g.node(target.node).name)?;
                if stored.get(&target.node) != Some(&value) || stores.contains(&k) {
                    continue;
                }
                stores.push(k);
                let stored = plan.stored_of(value).filter(|b| b.variable == target.node);
                if !stored.is_some_and(|b| in_place && b.in_place) {
                    swaps.push(k);
                }
                if stored.is_none() {
                    let from = slots[&value].clone();
                    let to = Slot {
                        loc: vars.next(k),
                        ..from.clone()
                    };
                    steps.push(Step {
                        node: StepNode::of(g, id),
                        shapes: shapes_of(&[Some(from.clone())], std::slice::from_ref(&to)),
                        bytes: 2 * from.bytes(),
                        live_bytes: live_bytes.get(&id).copied().unwrap_or(0),
                        kernel: Box::new(view::Copy::new(from, to)),
                        updates_variable: false,
                        flops: 0.0,
                    });
                }
            }
            _ => {
                let ins: Vec<Option<Slot>> = node
                    .inputs
                    .iter()
                    .map(|v| v.map(|v| slots[&v].clone()))
                    .collect();
                // Only constants may be packed at compile time: variables change.
                let in_data = node
                    .inputs
                    .iter()
                    .map(|v| {
                        v.map(|v| g.node(v.node))
                            .filter(|n| n.op == "Constant")
                            .and_then(|n| n.data.as_deref())
                    })
                    .collect::<Vec<_>>();
                let mut outs = vec![];
                let mut updates_variable = false;
                for k in 0..node.outputs.len() {
                    let (dtype, shape) = static_shape(id, k)?;
                    let v = id.out(k as u32);
                    let loc = match plan.stored_of(v) {
                        Some(b) => {
                            let var = vars.index(&g.node(b.variable).name)?;
                            if in_place && b.in_place {
                                updates_variable = true;
                                vars.current(var)
                            } else {
                                vars.next(var)
                            }
                        }
                        None => Loc::Arena(
                            plan.offset_of(v)
                                .expect("every op output is in the arena or a variable"),
                        ),
                    };
                    outs.push(Slot { loc, dtype, shape });
                }
                let b = Build {
                    g,
                    id,
                    node,
                    ins: &ins,
                    in_data: &in_data,
                    outs: &outs,
                    scratch_at,
                    scratch_bytes: &scratch_bytes,
                    pool,
                    tuning: &passes.tuning,
                    passes,
                };
                let kernel = steps::build(&b)
                    .map_err(|e| Error::Graph(format!("{}: {e}", g.describe(id))))?;
                let bytes = ins.iter().flatten().chain(&outs).map(Slot::bytes).sum();
                steps.push(Step {
                    node: StepNode::of(g, id),
                    kernel,
                    updates_variable,
                    flops: crate::backend::flops::node_flops(g, id),
                    shapes: shapes_of(&ins, &outs),
                    bytes,
                    live_bytes: live_bytes.get(&id).copied().unwrap_or(0),
                });
                for (k, s) in outs.into_iter().enumerate() {
                    slots.insert(id.out(k as u32), s);
                }
            }
        }
    }
    let inputs = params.iter().map(|&p| slots[&p.out(0)].clone()).collect();
    let outputs = g
        .outputs()
        .iter()
        .map(|o| slots[&o.value].clone())
        .collect();
    Ok(Program {
        steps,
        arena_bytes: scratch_at + scratch_bytes.get(),
        inputs,
        outputs,
        memory: plan,
        stores,
        swaps,
        _consts: consts,
    })
}

/// `1×64×56×56, 256×64×1×1 → 1×256×56×56`: a step's operands and results, absent
/// optional inputs left out.
pub(crate) fn shapes_of(ins: &[Option<Slot>], outs: &[Slot]) -> String {
    let dims = |s: &Slot| {
        let d: Vec<String> = s.shape.iter().map(|d| d.to_string()).collect();
        if d.is_empty() {
            "scalar".to_string()
        } else {
            d.join("×")
        }
    };
    let ins: Vec<String> = ins.iter().flatten().map(dims).collect();
    let outs: Vec<String> = outs.iter().map(dims).collect();
    format!("{} → {}", ins.join(", "), outs.join(", "))
}
