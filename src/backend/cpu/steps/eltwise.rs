//! Elementwise ops on f32: binary ops with numpy broadcasting and unary ops, each one
//! vectorized pass. The planner may give the output an input's buffer (same shape):
//! unary ops then run in place; a binary op first copies that operand to scratch.
use crate::backend::cpu::isa;
use crate::backend::cpu::kernels::binary::{self, BinOp, Broadcast, UnaryOp};
use crate::backend::cpu::program::{Cx, Kernel, Loc, Slot};

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
}

struct EltStep {
    what: Elt,
    y: Slot,
}

pub fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    if !b.all_f32() || b.outs.len() != 1 {
        return Ok(None);
    }
    let y = b.outs[0].clone();
    let binop = match b.node.op.as_str() {
        "Add" => Some(BinOp::Add),
        "Sub" => Some(BinOp::Sub),
        "Mul" => Some(BinOp::Mul),
        "Div" => Some(BinOp::Div),
        "Pow" => Some(BinOp::Pow),
        "Max" if b.ins.len() == 2 => Some(BinOp::Max),
        "Min" if b.ins.len() == 2 => Some(BinOp::Min),
        _ => None,
    };
    if let Some(op) = binop {
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
    let unop = match b.node.op.as_str() {
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
        _ => return Ok(None),
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
        }
        Ok(())
    }
    fn kind(&self) -> &'static str {
        match self.what {
            Elt::Binary { .. } => "binary",
            Elt::Unary { .. } => "unary",
        }
    }
}
