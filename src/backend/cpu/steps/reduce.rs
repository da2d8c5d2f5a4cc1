//! Reductions on f32 over axes known at compile time (an `axes` attribute, constant
//! input or `axis_names`): one vectorized kernel over the arena. Axes computed at run
//! time go to the fallback.
use crate::backend::cpu::isa;
use crate::backend::cpu::kernels::reduce::{self, ReduceKind, ReducePlan};
use crate::backend::cpu::program::{Cx, Kernel, Loc, Slot};
use crate::ir::ops::reduce::reduce_axes;
use crate::ir::DType;

use super::Build;

struct ReduceStep {
    kind: ReduceKind,
    plan: ReducePlan,
    x: Slot,
    y: Slot,
    /// LogSumExp's per-output maxima.
    scratch: Option<Loc>,
}

pub(crate) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let Some(kind) = ReduceKind::from_op(&b.node.op) else {
        return Ok(None);
    };
    let (Some(x), [y]) = (b.input(0), b.outs) else {
        return Ok(None);
    };
    if x.dtype != DType::F32 || y.dtype != DType::F32 {
        return Ok(None);
    }
    let Some(xv) = b.node.inputs[0] else {
        return Ok(None);
    };
    let x_type = &b.g.node(xv.node).outputs[xv.output as usize];
    let axes_input = b.input(1).map(|_| b.constant(1).map(|t| t.to_i64_vec()));
    let Some(axes) = reduce_axes(&x_type.shape, axes_input, &b.node.attrs)? else {
        return Ok(None);
    };
    let plan = ReducePlan::new(&x.shape, &axes);
    if plan.out_len() != y.elements() {
        return Err(format!(
            "reducing {:?} over {axes:?} gives {} elements, the output has {}",
            x.shape,
            plan.out_len(),
            y.elements()
        ));
    }
    let scratch = (kind == ReduceKind::LogSumExp).then(|| b.scratch(y.bytes()));
    Ok(Some(Box::new(ReduceStep {
        kind,
        plan,
        x: x.clone(),
        y: y.clone(),
        scratch,
    })))
}

impl Kernel for ReduceStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: callers uphold this unsafe fn's contract: pointers valid for the lengths
        // used, and the CPU features it is compiled for.
        unsafe {
            let x = std::slice::from_raw_parts(cx.f32(&self.x), self.x.elements());
            let y = std::slice::from_raw_parts_mut(cx.f32_mut(&self.y), self.y.elements());
            let scratch = match self.scratch {
                Some(at) => std::slice::from_raw_parts_mut(cx.ptr(at) as *mut f32, y.len()),
                None => &mut [],
            };
            reduce::reduce(isa::isa(), self.kind, &self.plan, x, y, scratch, cx.pool);
            Ok(())
        }
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "reduce"
    }
}
