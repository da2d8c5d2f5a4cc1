//! Elementwise ops on f32: binary ops with numpy broadcasting and unary ops, each one
//! vectorized pass, and `Fused` chains of them as one tiled loop. The planner may give
//! the output an input's buffer (same shape): unary ops and fused loops then run in
//! place; a binary op first copies that operand to scratch.
use crate::backend::cpu::isa;
use crate::backend::cpu::kernels::adam;
use crate::backend::cpu::kernels::binary::{self, BinOp, Broadcast, UnaryOp};
use crate::backend::cpu::kernels::fused::{FusedLoop, Operand, StepOp, MAX_BUFFERS, MAX_INPUTS};
use crate::backend::cpu::kernels::Act;
use crate::backend::cpu::program::{Cx, Kernel, Loc, Slot};
use crate::ir::ops::fused::{self, Arg};

use super::Build;

enum Elt {
    Binary {
        op: BinOp,
        a: Slot,
        b: Slot,
        copy: Option<(usize, Loc)>,
        plan: Broadcast,
    },
    Unary {
        op: UnaryOp,
        x: Slot,
    },
    Fused {
        lp: FusedLoop,
        ins: Vec<Slot>,
        /// Outputs 1, 2, …: the exported steps' results.
        extra: Vec<Slot>,
    },
    /// A `Fused` body that is Adam's update ([`adam::BODY`]): its own loop.
    Adam {
        ins: Vec<Slot>,
        /// m', v'.
        extra: Vec<Slot>,
    },
}

fn binary_op(name: &str, operands: usize) -> Option<BinOp> {
    Some(match name {
        "Add" => BinOp::Add,
        "Sub" => BinOp::Sub,
        "Mul" => BinOp::Mul,
        "Div" => BinOp::Div,
        "Pow" => BinOp::Pow,
        "Max" if operands == 2 => BinOp::Max,
        "Min" if operands == 2 => BinOp::Min,
        _ => return None,
    })
}

fn unary_op(name: &str) -> Option<UnaryOp> {
    Some(match name {
        "Neg" => UnaryOp::Neg,
        "Abs" => UnaryOp::Abs,
        "Sqrt" => UnaryOp::Sqrt,
        "Exp" => UnaryOp::Exp,
        "Log" => UnaryOp::Log,
        "Reciprocal" => UnaryOp::Reciprocal,
        "Relu" => UnaryOp::Relu,
        "Sigmoid" => UnaryOp::Sigmoid,
        "Tanh" => UnaryOp::Tanh,
        "Erf" => UnaryOp::Erf,
        _ => return None,
    })
}

/// A `Fused` node as a tiled loop; `None` when a step has no kernel here (or the
/// chain does not fit the loop), so that it runs through the fallback.
fn build_fused(b: &Build, y: &Slot) -> Result<Option<Elt>, String> {
    let Some(ins) = b.ins.iter().cloned().collect::<Option<Vec<Slot>>>() else {
        return Ok(None);
    };
    if ins.len() > MAX_INPUTS {
        return Ok(None);
    }
    if is_adam(b, &ins, y) {
        let extra = b.outs[1..].to_vec();
        return Ok(Some(Elt::Adam { ins, extra }));
    }
    let body = fused::body(&b.node.attrs, ins.len())?;
    // A constant scalar input's value (Clip's bounds).
    let scalar = |a: &Option<Arg>| -> Option<Option<f32>> {
        match a {
            None => Some(None),
            Some(Arg::Input(k)) => match b.constant(*k) {
                Some(t) if t.len() == 1 => Some(Some(t.to_f64_vec()[0] as f32)),
                _ => None,
            },
            Some(Arg::Step(_)) => None,
        }
    };
    let mut steps = vec![];
    for st in &body {
        let args: Vec<Option<Operand>> = st
            .args
            .iter()
            .map(|a| {
                a.map(|a| match a {
                    Arg::Input(k) => Operand::Input(k),
                    Arg::Step(k) => Operand::Step(k),
                })
            })
            .collect();
        let a = &st.attrs;
        let alpha = |default: f64| a.float_or("alpha", default).map(|v| v as f32);
        let op = if let Some(op) = binary_op(&st.op, args.len()) {
            StepOp::Binary(op)
        } else if let Some(op) = unary_op(&st.op) {
            StepOp::Unary(op)
        } else {
            let act = match st.op.as_str() {
                "LeakyRelu" => Act::LeakyRelu(alpha(0.01)?),
                "Elu" => Act::Elu(alpha(1.0)?),
                "HardSigmoid" => Act::HardSigmoid(alpha(0.2)?, a.float_or("beta", 0.5)? as f32),
                "Gelu" if a.string_or("approximate", "none")? == "tanh" => Act::GeluTanh,
                "Gelu" => Act::Gelu,
                "Clip" => {
                    let bound = |k: usize| st.args.get(k).map_or(Some(None), scalar);
                    let (Some(lo), Some(hi)) = (bound(1), bound(2)) else {
                        return Ok(None);
                    };
                    Act::Clip(lo.unwrap_or(f32::NEG_INFINITY), hi.unwrap_or(f32::INFINITY))
                }
                _ => return Ok(None),
            };
            steps.push((StepOp::Act(act), args.into_iter().take(1).collect()));
            continue;
        };
        steps.push((op, args));
    }
    let steps: Option<Vec<(StepOp, Vec<Operand>)>> = steps
        .into_iter()
        .map(|(op, args)| Some((op, args.into_iter().collect::<Option<Vec<_>>>()?)))
        .collect();
    let Some(steps) = steps else { return Ok(None) };
    let shapes: Vec<&[usize]> = ins.iter().map(|s| s.shape.as_slice()).collect();
    // Exported steps are written like the output: the loop needs them of its shape.
    if b.outs
        .iter()
        .any(|o| o.shape != y.shape || o.dtype != y.dtype)
    {
        return Ok(None);
    }
    let exported = fused::exported_steps(&b.node.attrs, body.len())?;
    let extra = b.outs[1..].to_vec();
    Ok(
        FusedLoop::new(&steps, &exported, &shapes, &y.shape).map(|lp| Elt::Fused {
            lp,
            ins,
            extra,
        }),
    )
}

/// Whether the `Fused` node is Adam's update, in the form [`adam::run`] takes: the
/// body [`adam::BODY`] exporting [`adam::EXPORTS`], its tensors of the output's shape,
/// scalars elsewhere, on a CPU that runs the loop.
fn is_adam(b: &Build, ins: &[Slot], y: &Slot) -> bool {
    let attrs = &b.node.attrs;
    attrs
        .strings("body")
        .ok()
        .flatten()
        .is_some_and(|body| body == adam::BODY)
        && attrs.ints("outputs").ok().flatten() == Some(&adam::EXPORTS[..])
        && ins.len() == 11
        && b.outs.len() == 3
        && b.outs.iter().all(|o| o.shape == y.shape)
        && ins.iter().enumerate().all(|(k, s)| {
            if adam::TENSOR_INPUTS.contains(&k) {
                s.shape == y.shape
            } else {
                s.elements() == 1
            }
        })
        && adam::available(isa::isa())
}

struct EltStep {
    what: Elt,
    y: Slot,
}

pub(crate) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    if !b.all_f32() || b.outs.is_empty() {
        return Ok(None);
    }
    let y = b.outs[0].clone();
    if b.node.op == "Fused" {
        return Ok(build_fused(b, &y)?.map(|what| Box::new(EltStep { what, y }) as Box<dyn Kernel>));
    }
    if b.outs.len() != 1 {
        return Ok(None);
    }
    if let Some(op) = binary_op(&b.node.op, b.ins.len()) {
        let (Some(a), Some(bb)) = (b.input(0), b.input(1)) else {
            return Ok(None);
        };
        // The operand whose buffer the output took over, if any, is read from a copy.
        let copy = [a, bb]
            .iter()
            .position(|s| s.loc == y.loc)
            .map(|k| (k, b.scratch(y.bytes())));
        let what = Elt::Binary {
            op,
            plan: Broadcast::new(&a.shape, &bb.shape, &y.shape),
            a: a.clone(),
            b: bb.clone(),
            copy,
        };
        return Ok(Some(Box::new(EltStep { what, y })));
    }
    let Some(unop) = unary_op(&b.node.op) else {
        return Ok(None);
    };
    let Some(x) = b.input(0) else { return Ok(None) };
    Ok(Some(Box::new(EltStep {
        what: Elt::Unary {
            op: unop,
            x: x.clone(),
        },
        y,
    })))
}

impl Kernel for EltStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: callers uphold this unsafe fn's contract: pointers valid for the lengths
        // used, and the CPU features it is compiled for.
        unsafe {
            let y = std::slice::from_raw_parts_mut(cx.f32_mut(&self.y), self.y.elements());
            match &self.what {
                Elt::Unary { op, x } if x.loc == self.y.loc => binary::unary_inplace(*op, y),
                Elt::Unary { op, x } => {
                    binary::unary(*op, std::slice::from_raw_parts(cx.f32(x), x.elements()), y)
                }
                Elt::Binary {
                    op,
                    a,
                    b,
                    copy,
                    plan,
                } => {
                    let mut ptrs = [cx.f32(a), cx.f32(b)];
                    if let Some((k, at)) = copy {
                        let dst = cx.ptr(*at) as *mut f32;
                        std::ptr::copy_nonoverlapping(ptrs[*k], dst, self.y.elements());
                        ptrs[*k] = dst;
                    }
                    let a_s = std::slice::from_raw_parts(ptrs[0], a.elements());
                    let b_s = std::slice::from_raw_parts(ptrs[1], b.elements());
                    binary::binary_planned(isa::isa(), *op, plan, a_s, b_s, y, cx.pool);
                }
                Elt::Adam { ins, extra } => {
                    let ptrs: [*const f32; 11] = std::array::from_fn(|k| cx.f32(&ins[k]));
                    let outs = [y.as_mut_ptr(), cx.f32_mut(&extra[0]), cx.f32_mut(&extra[1])];
                    adam::run(isa::isa(), &ptrs, &outs, y.len(), cx.pool);
                }
                Elt::Fused { lp, ins, extra } => {
                    let mut ptrs = [std::ptr::null::<f32>(); MAX_INPUTS];
                    for (p, s) in ptrs.iter_mut().zip(ins) {
                        *p = cx.f32(s);
                    }
                    // Every exported step holds a tile buffer, so there are few of them.
                    let mut outs = [y.as_mut_ptr(); MAX_BUFFERS + 1];
                    for (o, s) in outs[1..].iter_mut().zip(extra) {
                        *o = cx.f32_mut(s);
                    }
                    lp.run(
                        isa::isa(),
                        &ptrs[..ins.len()],
                        &outs[..lp.outputs()],
                        cx.pool,
                    );
                }
            }
            Ok(())
        }
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        match self.what {
            Elt::Binary { .. } => "binary",
            Elt::Unary { .. } => "unary",
            Elt::Fused { .. } => "fused-eltwise",
            Elt::Adam { .. } => "adam-update",
        }
    }
}
