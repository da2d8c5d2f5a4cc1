//! Comparisons and the fused `Where(a op b, x, y)`: the masks and one-hots of backward
//! graphs (Relu's gradient is the fused form), on the CPU's compare-select kernels.
use crate::backend::cpu::kernels::select::{compare, compare_select, CmpOp, Walk};
use crate::backend::cpu::program::{Cx, Kernel, Slot};
use crate::ir::ops::fused::{self, Arg};
use crate::ir::DType;

use super::super::Build;

/// Element types the comparisons and selects handle.
fn plain_dtype(d: DType) -> bool {
    matches!(d, DType::F32 | DType::I32 | DType::I64)
}

/// Runs `$body` with `$T` the Rust type of the dtype `$d` (f32, i32 or i64).
macro_rules! with_plain {
    ($d:expr, $T:ident => $body:expr) => {
        match $d {
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::I32 => {
                type $T = i32;
                $body
            }
            _ => {
                type $T = i64;
                $body
            }
        }
    };
}

pub(super) struct CompareStep {
    op: CmpOp,
    walk: Walk,
    a: Slot,
    b: Slot,
    y: Slot,
}

/// A comparison (`Less`, `Equal`, ...) of two f32, i32 or i64 operands into Bool.
pub(super) fn build_compare(b: &Build, cmp: CmpOp) -> Result<Option<Box<dyn Kernel>>, String> {
    let y = b.outs[0].clone();
    let (Some(a), Some(bb)) = (b.input(0), b.input(1)) else {
        return Ok(None);
    };
    if !plain_dtype(a.dtype) || bb.dtype != a.dtype || y.dtype != DType::Bool {
        return Ok(None);
    }
    let walk = Walk::new(&[&a.shape, &bb.shape], &y.shape).ok_or_else(|| {
        format!(
            "{:?} and {:?} do not broadcast to {:?}",
            a.shape, bb.shape, y.shape
        )
    })?;
    Ok(Some(Box::new(CompareStep {
        op: cmp,
        walk,
        a: a.clone(),
        b: bb.clone(),
        y,
    })))
}

impl Kernel for CompareStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let Self { op, walk, a, b, y } = self;
        // SAFETY: the Bool output slot, one byte per element, live for the run by
        // Kernel::run's contract; its dtype differs from the operands', so it is no
        // operand's buffer.
        let out = unsafe { std::slice::from_raw_parts_mut(cx.ptr(y.loc), y.elements()) };
        with_plain!(a.dtype, T => {
            // SAFETY: `a` holds a.elements() values of T, the Rust type of its dtype.
            let a = unsafe { std::slice::from_raw_parts(cx.ptr(a.loc) as *const T, a.elements()) };
            // SAFETY: `b` has a's dtype (checked at build), so b.elements() values of T.
            let b = unsafe { std::slice::from_raw_parts(cx.ptr(b.loc) as *const T, b.elements()) };
            compare(*op, walk, a, b, out, cx.pool)
        });
        Ok(())
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "compare"
    }
}

/// A `Fused` body `Where(a op b, x, y)`.
pub(super) struct CompareSelectStep {
    op: CmpOp,
    walk: Walk,
    operands: [Slot; 4],
    y: Slot,
}

/// A `Fused` node whose body is a comparison of two inputs and a `Where` choosing
/// between two inputs by it (the fused form of Relu's gradient); other bodies are not
/// this family's.
pub(super) fn build_compare_select(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let y = &b.outs[0];
    if !b.all_f32() || b.outs.len() != 1 {
        return Ok(None);
    }
    let Some(ins) = b.ins.iter().cloned().collect::<Option<Vec<Slot>>>() else {
        return Ok(None);
    };
    let body = fused::body(&b.node.attrs, ins.len())?;
    let [cmp, pick] = body.as_slice() else {
        return Ok(None);
    };
    let Some(op) = CmpOp::from_op(&cmp.op) else {
        return Ok(None);
    };
    let input = |a: &Option<Arg>| match a {
        Some(Arg::Input(k)) => ins.get(*k).cloned(),
        _ => None,
    };
    let (Some(a), Some(bb)) = (
        cmp.args.first().and_then(input),
        cmp.args.get(1).and_then(input),
    ) else {
        return Ok(None);
    };
    if pick.op != "Where" || pick.args.first() != Some(&Some(Arg::Step(0))) {
        return Ok(None);
    }
    let (Some(x), Some(yv)) = (
        pick.args.get(1).and_then(input),
        pick.args.get(2).and_then(input),
    ) else {
        return Ok(None);
    };
    let walk = Walk::new(&[&a.shape, &bb.shape, &x.shape, &yv.shape], &y.shape)
        .ok_or_else(|| format!("the fused operands do not broadcast to {:?}", y.shape))?;
    Ok(Some(Box::new(CompareSelectStep {
        op,
        walk,
        operands: [a, bb, x, yv],
        y: b.outs[0].clone(),
    })))
}

impl Kernel for CompareSelectStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let operands = self.operands.each_ref().map(|s| cx.f32(s));
        let out = cx.ptr(self.y.loc) as *mut f32;
        // SAFETY: the four f32 operand slots have the shapes the walk was built from and
        // the output slot the walk's total (y's shape), live for this run; the kernel
        // allows `out` to be an operand's buffer.
        unsafe { compare_select(self.op, &self.walk, operands, out, cx.pool) };
        Ok(())
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "compare-select"
    }
}
