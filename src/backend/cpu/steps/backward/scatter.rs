//! `ScatterElements` (MaxPool's gradient scatters into zeros) on f32 data with i32 or
//! i64 indices; an index out of range is a run-time error.
use crate::backend::cpu::kernels::scatter::{scatter_elements, ScatterPlan, ScatterReduce};
use crate::backend::cpu::program::{Cx, Kernel, Slot};
use crate::ir::shape::norm_axis;
use crate::ir::DType;

use super::super::Build;

pub(super) struct ScatterStep {
    plan: ScatterPlan,
    reduce: ScatterReduce,
    data: Slot,
    /// The data is a constant of zeros (MaxPool's gradient): fill, do not copy.
    zeros: bool,
    indices: Slot,
    updates: Slot,
    y: Slot,
}

pub(super) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let (Some(data), Some(indices), Some(updates)) = (b.input(0), b.input(1), b.input(2)) else {
        return Ok(None);
    };
    if data.dtype != DType::F32
        || updates.dtype != DType::F32
        || !matches!(indices.dtype, DType::I64 | DType::I32)
    {
        return Ok(None);
    }
    let Some(reduce) = ScatterReduce::from_attr(b.node.attrs.string_or("reduction", "none")?)
    else {
        return Ok(None);
    };
    let axis = norm_axis(b.node.attrs.int_or("axis", 0)?, data.shape.len())?;
    if updates.shape != indices.shape {
        return Err(format!(
            "updates {:?} and indices {:?} differ",
            updates.shape, indices.shape
        ));
    }
    let plan = ScatterPlan::new(&data.shape, &indices.shape, axis)?;
    let zeros = b
        .constant(0)
        .is_some_and(|t| t.to_f64_vec().iter().all(|&v| v == 0.0));
    Ok(Some(Box::new(ScatterStep {
        plan,
        reduce,
        data: data.clone(),
        zeros,
        indices: indices.clone(),
        updates: updates.clone(),
        y: b.outs[0].clone(),
    })))
}

impl Kernel for ScatterStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let Self {
            plan,
            reduce,
            data,
            zeros,
            indices,
            updates,
            y,
        } = self;
        let out_ptr = cx.ptr(y.loc) as *mut f32;
        // SAFETY: the f32 output slot (y.elements() floats, live for the run by
        // Kernel::run's contract); the inputs read below are other slots, or `data`
        // aliasing it in place, which is then never read.
        let out = unsafe { std::slice::from_raw_parts_mut(out_ptr, y.elements()) };
        if *zeros {
            out.fill(0.0);
        } else if cx.ptr(data.loc) != cx.ptr(y.loc) {
            // SAFETY: data has the output's shape and dtype (ScatterElements' rule) and
            // a buffer of its own (the addresses differ), so out.len() floats copy over.
            unsafe { std::ptr::copy_nonoverlapping(cx.f32(data), out.as_mut_ptr(), out.len()) };
        }
        // SAFETY: the f32 updates slot, updates.elements() floats (checked F32 at build).
        let upd = unsafe { std::slice::from_raw_parts(cx.f32(updates), updates.elements()) };
        let ip = cx.ptr(indices.loc);
        let n = indices.elements();
        match indices.dtype {
            DType::I32 => {
                // SAFETY: the indices slot holds n i32 (its dtype, matched here).
                let idx = unsafe { std::slice::from_raw_parts(ip as *const i32, n) };
                scatter_elements(plan, *reduce, idx, upd, out)?
            }
            _ => {
                // SAFETY: the indices slot holds n i64 (build admits only I32 and I64).
                let idx = unsafe { std::slice::from_raw_parts(ip as *const i64, n) };
                scatter_elements(plan, *reduce, idx, upd, out)?
            }
        }
        Ok(())
    }
    fn kind(&self) -> &'static str {
        "scatter"
    }
}
