//! The ops backward graphs are built from that the other families do not cover, one
//! step type per kernel, by op kind: `ConvTranspose` (Conv's data gradient,
//! [`conv_transpose`]), `ScatterElements` (MaxPool's gradient, [`scatter`]), MaxPool
//! with Indices ([`pool`]), comparisons and their fused form with `Where` (masks and
//! one-hots, [`select`]), `ConstantOfShape` (zeros to scatter into, [`shape`]) and `SoftmaxCrossEntropyLoss` ([`loss`]).
use crate::backend::cpu::kernels::select::CmpOp;
use crate::backend::cpu::program::Kernel;

use super::Build;

mod conv_transpose;
mod loss;
mod pool;
mod scatter;
mod select;
mod shape;

pub fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    match b.node.op.as_str() {
        "ConvTranspose" => conv_transpose::build(b),
        "ScatterElements" => scatter::build(b),
        "SoftmaxCrossEntropyLoss" => loss::build(b),
        "Fused" => select::build_compare_select(b),
        "ConstantOfShape" => shape::build_fill(b),
        op => match CmpOp::from_op(op) {
            Some(cmp) => select::build_compare(b, cmp),
            None => Ok(None),
        },
    }
}

/// MaxPool with Indices over tiling windows; tried before the pooling family, whose
/// general kernel also writes Indices but walks each window tap by tap.
pub fn build_max_pool_indices(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    if b.node.op != "MaxPool" {
        return Ok(None);
    }
    pool::build(b)
}
