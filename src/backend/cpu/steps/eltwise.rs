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
use crate::ir::DType;
use crate::tensor::Elem;
use crate::with_dtype;

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
    /// A binary op on another numeric dtype (`dtype`, every operand's), element by
    /// element as the interpreter computes it.
    BinaryElem {
        op: BinOp,
        a: Slot,
        b: Slot,
        copy: Option<(usize, Loc)>,
        plan: Broadcast,
        dtype: DType,
    },
    /// An activation (HardSwish, Mish, …), in place on the output.
    Act {
        act: Act,
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

pub(super) fn binary_op(name: &str, operands: usize) -> Option<BinOp> {
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

pub(super) fn unary_op(name: &str) -> Option<UnaryOp> {
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
        "Floor" => UnaryOp::Floor,
        "Ceil" => UnaryOp::Ceil,
        "Round" => UnaryOp::Round,
        _ => return None,
    })
}

/// The activation a one-input op (other than [`unary_op`]'s) computes, Gelu included.
fn activation(op: &str, attrs: &crate::ir::Attrs) -> Result<Option<Act>, String> {
    if op == "Gelu" {
        return Ok(Some(match attrs.string_or("approximate", "none")? {
            "tanh" => Act::GeluTanh,
            _ => Act::Gelu,
        }));
    }
    Act::of_op(op, |k, d| attrs.float_or(k, d))
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
        let op = if let Some(op) = binary_op(&st.op, args.len()) {
            StepOp::Binary(op)
        } else if let Some(op) = unary_op(&st.op) {
            StepOp::Unary(op)
        } else {
            let act = match st.op.as_str() {
                "Clip" => {
                    let bound = |k: usize| st.args.get(k).map_or(Some(None), scalar);
                    let (Some(lo), Some(hi)) = (bound(1), bound(2)) else {
                        return Ok(None);
                    };
                    Act::Clip(lo.unwrap_or(f32::NEG_INFINITY), hi.unwrap_or(f32::INFINITY))
                }
                other => match activation(other, &st.attrs)? {
                    Some(act) => act,
                    None => return Ok(None),
                },
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

/// The dtypes other than f32 that binary ops and reductions run on here.
pub(super) const ELEM_DTYPES: &[DType] = &[
    DType::F64,
    DType::F16,
    DType::BF16,
    DType::I8,
    DType::U8,
    DType::I16,
    DType::U16,
    DType::I32,
    DType::U32,
    DType::I64,
    DType::U64,
];

/// A binary op whose operands and result are all of one of [`ELEM_DTYPES`].
fn build_binary_elem(b: &Build) -> Option<Elt> {
    let (Some(a), Some(bb), [y]) = (b.input(0), b.input(1), b.outs) else {
        return None;
    };
    let dtype = y.dtype;
    if b.ins.len() != 2 || !ELEM_DTYPES.contains(&dtype) || a.dtype != dtype || bb.dtype != dtype {
        return None;
    }
    let op = binary_op(&b.node.op, 2)?;
    if op == BinOp::Pow && dtype.is_int() {
        return None;
    }
    let copy = [a, bb]
        .iter()
        .position(|s| s.loc == y.loc)
        .map(|k| (k, b.scratch(y.bytes())));
    let plan = Broadcast::new(&[&a.shape, &bb.shape], &y.shape)?;
    Some(Elt::BinaryElem {
        op,
        a: a.clone(),
        b: bb.clone(),
        copy,
        plan,
        dtype,
    })
}

/// [`binary::binary_elem`] on the step's buffers, as `T`.
///
/// # Safety
/// The slots hold `T`s of their shapes in `cx`; `copy` is a scratch of the output's size.
unsafe fn run_binary_elem<T: Elem>(
    cx: &Cx,
    op: BinOp,
    plan: &Broadcast,
    [a, b]: [&Slot; 2],
    copy: Option<(usize, Loc)>,
    y: &Slot,
) -> Result<(), String> {
    let mut ptrs = [cx.ptr(a.loc) as *const T, cx.ptr(b.loc) as *const T];
    if let Some((k, at)) = copy {
        let dst = cx.ptr(at) as *mut T;
        // SAFETY: operand k is the output's buffer, `y.elements()` `T`s (contract), and
        // `at` the scratch lowering sized for the output: another buffer.
        unsafe { std::ptr::copy_nonoverlapping(ptrs[k], dst, y.elements()) };
        ptrs[k] = dst;
    }
    // SAFETY: each operand slot (or its copy) holds `T`s of its shape (contract), and
    // none is the output's buffer any more, so these do not alias `out`.
    let (a_s, b_s) = unsafe {
        (
            std::slice::from_raw_parts(ptrs[0], a.elements()),
            std::slice::from_raw_parts(ptrs[1], b.elements()),
        )
    };
    // SAFETY: the output slot holds `y.elements()` `T`s (contract), only written here.
    let out = unsafe { std::slice::from_raw_parts_mut(cx.ptr(y.loc) as *mut T, y.elements()) };
    binary::binary_elem(op, plan, a_s, b_s, out, cx.pool)
}

pub(crate) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    if b.outs.is_empty() {
        return Ok(None);
    }
    if !b.all_f32() {
        let y = b.outs[0].clone();
        return Ok(
            build_binary_elem(b).map(|what| Box::new(EltStep { what, y }) as Box<dyn Kernel>)
        );
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
        let Some(plan) = Broadcast::new(&[&a.shape, &bb.shape], &y.shape) else {
            return Ok(None);
        };
        let what = Elt::Binary {
            op,
            plan,
            a: a.clone(),
            b: bb.clone(),
            copy,
        };
        return Ok(Some(Box::new(EltStep { what, y })));
    }
    let Some(x) = b.input(0).cloned() else {
        return Ok(None);
    };
    let what = match unary_op(&b.node.op) {
        Some(op) => Elt::Unary { op, x },
        None => match activation(&b.node.op, &b.node.attrs)? {
            Some(act) if b.ins.len() == 1 => Elt::Act { act, x },
            _ => return Ok(None),
        },
    };
    Ok(Some(Box::new(EltStep { what, y })))
}

impl Kernel for EltStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        if let Elt::BinaryElem {
            op,
            a,
            b,
            copy,
            plan,
            dtype,
        } = &self.what
        {
            // SAFETY: the slots hold `dtype` elements of their shapes (checked at build).
            return unsafe {
                with_dtype!(
                    *dtype,
                    run_binary_elem(cx, *op, plan, [a, b], *copy, &self.y)
                )
            };
        }
        // SAFETY: the Kernel::run contract: y's slot holds its shape's f32; an input that
        // shares y's buffer is read through `y` or a copy below, not a second slice.
        let y = unsafe { std::slice::from_raw_parts_mut(cx.f32_mut(&self.y), self.y.elements()) };
        match &self.what {
            Elt::Unary { op, x } if x.loc == self.y.loc => binary::unary_inplace(*op, y),
            Elt::Unary { op, x } => {
                // SAFETY: x's slot holds its f32 (Kernel::run contract), in a buffer other
                // than y's (the locations differ and the planner shares whole buffers).
                let x = unsafe { std::slice::from_raw_parts(cx.f32(x), x.elements()) };
                binary::unary(*op, x, y)
            }
            // SAFETY: x has y's shape (an activation's), so `y.len()` readable floats, and is
            // y's own buffer or a distinct one (the planner shares whole buffers).
            Elt::Act { act, x } => unsafe { act.apply_from(cx.f32(x), y, cx.pool) },
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
                    // SAFETY: operand k shares y's buffer: `y.elements()` floats, copied to
                    // the scratch that build sized `y.bytes()` for, a distinct buffer.
                    unsafe { std::ptr::copy_nonoverlapping(ptrs[*k], dst, self.y.elements()) };
                    ptrs[*k] = dst;
                }
                // SAFETY: both operands' slots (or the copy) hold their shapes' f32, and
                // neither is y's buffer now, so they do not alias `y`.
                let (a_s, b_s) = unsafe {
                    (
                        std::slice::from_raw_parts(ptrs[0], a.elements()),
                        std::slice::from_raw_parts(ptrs[1], b.elements()),
                    )
                };
                binary::binary_planned(isa::isa(), *op, plan, a_s, b_s, y, cx.pool);
            }
            Elt::BinaryElem { .. } => unreachable!("run above"),
            Elt::Adam { ins, extra } => {
                let ptrs: [*const f32; 11] = std::array::from_fn(|k| cx.f32(&ins[k]));
                let outs = [y.as_mut_ptr(), cx.f32_mut(&extra[0]), cx.f32_mut(&extra[1])];
                // SAFETY: `is_adam` admitted this node only with `adam::available`, tensors
                // of y's shape at TENSOR_INPUTS, one-element scalars elsewhere, and three
                // outputs of y's shape (distinct slots), which is `adam::run`'s contract.
                unsafe { adam::run(isa::isa(), &ptrs, &outs, y.len(), cx.pool) };
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
                let (ins, outs) = (&ptrs[..ins.len()], &outs[..lp.outputs()]);
                // SAFETY: the slots hold their shapes' f32 (Kernel::run contract), the
                // loop's inputs and outputs; the planner lets an output take over only an
                // input buffer of its own shape, as `FusedLoop::run` allows.
                unsafe { lp.run(isa::isa(), ins, outs, cx.pool) };
            }
        }
        Ok(())
    }
    fn can_fail(&self) -> bool {
        matches!(self.what, Elt::BinaryElem { op: BinOp::Div, dtype, .. } if dtype.is_int())
    }
    fn kind(&self) -> &'static str {
        match self.what {
            Elt::Binary { .. } => "binary",
            Elt::BinaryElem { .. } => "binary-elem",
            Elt::Unary { .. } => "unary",
            Elt::Act { .. } => "activation",
            Elt::Fused { .. } => "fused-eltwise",
            Elt::Adam { .. } => "adam-update",
        }
    }
}
