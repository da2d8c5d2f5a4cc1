//! Reductions over axes known at compile time (an `axes` attribute, constant input or
//! `axis_names`): on f32 one vectorized kernel over the arena, on the other numeric
//! dtypes one loop computing as the interpreter does. Axes computed at run time go to
//! the fallback. TopK on f32 along an axis.
use crate::backend::cpu::isa;
use crate::backend::cpu::kernels::reduce::{self, ReducePlan};
use crate::backend::cpu::kernels::topk::TopK;
use crate::backend::cpu::pool::Pool;
use crate::backend::cpu::program::{Cx, Kernel, Loc, Slot};
use crate::ir::ops::reduce::reduce_axes;
use crate::ir::ops::reduce::ReduceKind;
use crate::ir::shape::norm_axis;
use crate::ir::DType;
use crate::tensor::Elem;
use crate::with_dtype;

use super::eltwise::ELEM_DTYPES;

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
    // bool folds as 0 / 1 through the float path (max is any, min is all); not over an
    // empty input, whose float identities (∓∞) would read as true.
    let bool_ok = x.dtype == DType::Bool
        && matches!(kind, ReduceKind::Max | ReduceKind::Min)
        && x.elements() > 0;
    if x.dtype == DType::Bool && y.dtype == DType::Bool && x.elements() == 0 {
        // Over nothing, any (Max) is false and all (Min) true.
        let byte = match kind {
            ReduceKind::Max => 0,
            ReduceKind::Min => 1,
            _ => return Ok(None),
        };
        return Ok(Some(Box::new(super::view::Fill {
            byte,
            to: y.clone(),
        })));
    }
    if x.dtype != y.dtype || !(x.dtype == DType::F32 || ELEM_DTYPES.contains(&x.dtype) || bool_ok) {
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
    let scratch =
        (kind == ReduceKind::LogSumExp && x.dtype == DType::F32).then(|| b.scratch(y.bytes()));
    Ok(Some(Box::new(ReduceStep {
        kind,
        plan,
        x: x.clone(),
        y: y.clone(),
        scratch,
    })))
}

/// [`reduce::reduce_elem`] on the step's buffers, as `T`.
///
/// # Safety
/// The step's slots hold `T`s of their shapes in `cx`.
unsafe fn run_elem<T: Elem>(cx: &Cx, s: &ReduceStep) -> Result<(), String> {
    // SAFETY: the caller's contract; x and y are distinct buffers (no in-place rule).
    unsafe {
        let x = std::slice::from_raw_parts(cx.ptr(s.x.loc) as *const T, s.x.elements());
        let y = std::slice::from_raw_parts_mut(cx.ptr(s.y.loc) as *mut T, s.y.elements());
        reduce::reduce_elem(s.kind, &s.plan, x, y, cx.pool);
    }
    Ok(())
}

impl Kernel for ReduceStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        if self.x.dtype != DType::F32 {
            // SAFETY: the Kernel::run contract: x and y hold `x.dtype` elements of their
            // shapes (lowering gave them one dtype), which is `run_elem`'s contract.
            return unsafe { with_dtype!(self.x.dtype, run_elem(cx, self)) };
        }
        // SAFETY: x's slot holds its shape's f32 (Kernel::run contract), only read here.
        let x = unsafe { std::slice::from_raw_parts(cx.f32(&self.x), self.x.elements()) };
        // SAFETY: y's slot holds its shape's f32, a buffer other than x's (a reduction is
        // never planned in place).
        let y = unsafe { std::slice::from_raw_parts_mut(cx.f32_mut(&self.y), self.y.elements()) };
        let scratch = match self.scratch {
            // SAFETY: build asked `y.bytes()` of scratch, `y.len()` floats, this step's own.
            Some(at) => unsafe { std::slice::from_raw_parts_mut(cx.ptr(at) as *mut f32, y.len()) },
            None => &mut [],
        };
        reduce::reduce(isa::isa(), self.kind, &self.plan, x, y, scratch, cx.pool);
        Ok(())
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "reduce"
    }
}

/// `TopK` on f32 along an axis, k read from the output's shape (static once lowered)
/// and checked against the K input at run time.
struct TopKStep {
    topk: TopK,
    x: Slot,
    k: Slot,
    values: Slot,
    indices: Slot,
    scratch: Loc,
}

pub(crate) fn build_topk(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    if b.node.op != "TopK" {
        return Ok(None);
    }
    let (Some(x), Some(k), [values, indices]) = (b.input(0), b.input(1), b.outs) else {
        return Ok(None);
    };
    let typed = x.dtype.is_float() || x.dtype.is_int();
    if !typed || values.dtype != x.dtype || k.dtype != DType::I64 || k.elements() != 1 {
        return Ok(None);
    }
    let axis = norm_axis(b.node.attrs.int_or("axis", -1)?, x.shape.len())?;
    let topk = TopK {
        dims: [
            x.shape[..axis].iter().product(),
            x.shape[axis],
            x.shape[axis + 1..].iter().product(),
        ],
        k: values.shape[axis],
        largest: b.node.attrs.int_or("largest", 1)? != 0,
    };
    let threads = b.pool.map_or(1, Pool::threads);
    let scratch = b.scratch(topk.scratch_len(threads) * std::mem::size_of::<u32>());
    Ok(Some(Box::new(TopKStep {
        topk,
        x: x.clone(),
        k: k.clone(),
        values: values.clone(),
        indices: indices.clone(),
        scratch,
    })))
}

/// [`TopK::run`] on `T` data.
///
/// # Safety
/// The Kernel::run contract, x and values holding `T`s.
unsafe fn topk_elem<T: Elem>(cx: &Cx, s: &TopKStep) -> Result<(), String> {
    let (x, values) = (cx.ptr(s.x.loc) as *const T, cx.ptr(s.values.loc) as *mut T);
    let (indices, scratch) = (cx.ptr(s.indices.loc) as *mut i64, cx.ptr(s.scratch));
    // SAFETY: x holds outer·len·inner `T`s, values and indices outer·k·inner `T` and i64,
    // the scratch the u32 build_topk asked for with this pool's threads.
    unsafe { s.topk.run(x, values, indices, scratch as *mut u32, cx.pool) };
    Ok(())
}

impl Kernel for TopKStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: K's slot holds one i64 (build_topk checked its dtype and element count).
        let k = unsafe { *(cx.ptr(self.k.loc) as *const i64) };
        if k != self.topk.k as i64 {
            return Err(format!(
                "K is {k} but the output was shaped for {}",
                self.topk.k
            ));
        }
        if self.x.dtype != DType::F32 {
            // SAFETY: the same contract as below, with x and values of `x.dtype`.
            return unsafe { with_dtype!(self.x.dtype, topk_elem(cx, self)) };
        }
        let (x, values) = (cx.f32(&self.x), cx.f32_mut(&self.values));
        let (indices, scratch) = (cx.ptr(self.indices.loc) as *mut i64, cx.ptr(self.scratch));
        // SAFETY: by the Kernel::run contract x holds outer·len·inner f32, values and
        // indices outer·k·inner f32 and i64 (k is their axis), and the scratch the
        // `scratch_len` u32 that build_topk asked for with this pool's threads.
        unsafe {
            self.topk
                .run(x, values, indices, scratch as *mut u32, cx.pool)
        };
        Ok(())
    }
    fn kind(&self) -> &'static str {
        "topk"
    }
}
