//! `SoftmaxCrossEntropyLoss` over [N, C] f32 scores without weights; a label out of
//! range is a run-time error.
use crate::backend::cpu::isa;
use crate::backend::cpu::kernels::loss::{softmax_cross_entropy, LossReduction};
use crate::backend::cpu::program::{Cx, Kernel, Loc, Slot};
use crate::ir::DType;

use super::super::Build;

pub(super) struct SoftmaxCrossEntropyStep {
    classes: usize,
    reduction: LossReduction,
    ignore_index: Option<i64>,
    scores: Slot,
    labels: Slot,
    /// The log_prob output, or scratch when nothing reads it.
    log_prob: Loc,
    y: Slot,
}

pub(super) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let (Some(scores), Some(labels)) = (b.input(0), b.input(1)) else {
        return Ok(None);
    };
    // Weights and [N, C, d...] scores (classes not innermost) run on the fallback.
    if b.input(2).is_some()
        || scores.dtype != DType::F32
        || scores.shape.len() != 2
        || !matches!(labels.dtype, DType::I64 | DType::I32)
        || b.outs.iter().any(|s| s.dtype != DType::F32)
    {
        return Ok(None);
    }
    let attrs = &b.node.attrs;
    let Some(reduction) = LossReduction::from_attr(attrs.string_or("reduction", "mean")?) else {
        return Ok(None);
    };
    let log_prob = match b.outs.get(1) {
        Some(s) => s.loc,
        None => b.scratch(scores.bytes()),
    };
    Ok(Some(Box::new(SoftmaxCrossEntropyStep {
        classes: scores.shape[1],
        reduction,
        ignore_index: attrs.int("ignore_index")?,
        scores: scores.clone(),
        labels: labels.clone(),
        log_prob,
        y: b.outs[0].clone(),
    })))
}

impl Kernel for SoftmaxCrossEntropyStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let Self {
            classes,
            reduction,
            ignore_index,
            scores,
            labels,
            log_prob,
            y,
        } = self;
        let pool = cx.pool;
        // SAFETY: the [N, C] f32 scores slot, live for the run (Kernel::run's contract).
        let s = unsafe { std::slice::from_raw_parts(cx.f32(scores), scores.elements()) };
        let lp_ptr = cx.ptr(*log_prob) as *mut f32;
        // SAFETY: log_prob is the [N, C] f32 output or a scratch of the scores' bytes
        // (see `build`), apart from the inputs.
        let lp = unsafe { std::slice::from_raw_parts_mut(lp_ptr, s.len()) };
        let loss_ptr = cx.ptr(y.loc) as *mut f32;
        // SAFETY: the loss output slot, y.elements() f32 (checked F32 at build), distinct
        // from log_prob and the inputs by the plan.
        let loss = unsafe { std::slice::from_raw_parts_mut(loss_ptr, y.elements()) };
        let n = labels.elements();
        let isa = isa::isa();
        match labels.dtype {
            DType::I32 => {
                // SAFETY: the labels slot holds n i32 (its dtype, matched here).
                let l = unsafe { std::slice::from_raw_parts(cx.ptr(labels.loc) as *const i32, n) };
                softmax_cross_entropy(
                    isa,
                    s,
                    l,
                    *classes,
                    *reduction,
                    *ignore_index,
                    lp,
                    loss,
                    pool,
                )?
            }
            _ => {
                // SAFETY: the labels slot holds n i64 (build admits only I32 and I64).
                let l = unsafe { std::slice::from_raw_parts(cx.ptr(labels.loc) as *const i64, n) };
                softmax_cross_entropy(
                    isa,
                    s,
                    l,
                    *classes,
                    *reduction,
                    *ignore_index,
                    lp,
                    loss,
                    pool,
                )?
            }
        }
        Ok(())
    }
    fn kind(&self) -> &'static str {
        "softmax-xent"
    }
}
