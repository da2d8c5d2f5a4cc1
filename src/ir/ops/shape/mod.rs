//! Data movement and shape ops: Reshape, Flatten, Squeeze, Unsqueeze, Identity,
//! Transpose, Expand (`reshape.rs`); Slice, Pad, Tile, CenterCropPad (`slice.rs`); Concat, Split
//! (`join.rs`); Shape, Size, ConstantOfShape, Range (`gen.rs`).
//!
//! They are generic over the element type (every dtype). Shape operands (Reshape's
//! shape, Slice's starts, ...) give exact output dims when they are constants; otherwise
//! the unknown dims are fresh symbols named after the node.
use super::{InferCtx, Op};
use crate::ir::{DType, Dim};

mod gen;
mod join;
mod reshape;
pub(crate) mod slice;

/// The integer values of input `i` when it is a constant; errors unless it is an
/// integer tensor of rank <= 1.
fn const_ints(cx: &InferCtx<'_>, i: usize, what: &str) -> Result<Option<Vec<i64>>, String> {
    let Some(t) = cx.opt_input(i) else {
        return Ok(None);
    };
    if !matches!(t.dtype, DType::I64 | DType::I32) || t.rank() > 1 {
        return Err(format!(
            "input {i} ({what}) must be a 1-D i64 tensor, got {t}"
        ));
    }
    Ok(cx.const_input(i).map(|c| c.to_i64_vec()))
}

/// The static length of 1-D input `i`, if known.
fn static_len(cx: &InferCtx<'_>, i: usize) -> Option<usize> {
    cx.opt_input(i)
        .filter(|t| t.rank() == 1)
        .and_then(|t| t.shape.dim(0).fixed())
}

/// Every dim of `shape` a fresh symbol: what inference knows when a shape operand is not
/// a constant.
fn fresh_all(shape: &mut crate::ir::Shape, cx: &InferCtx<'_>) {
    for (i, a) in shape.axes.iter_mut().enumerate() {
        a.dim = cx.fresh_dim(0, i);
    }
}

/// The product of `dims`, or `None` if any is symbolic.
fn product(dims: &[Dim]) -> Option<usize> {
    // Symbolic or too large to count: unknown either way.
    dims.iter()
        .try_fold(1usize, |n, d| n.checked_mul(d.fixed()?))
}

pub(crate) fn ops() -> Vec<&'static dyn Op> {
    let mut v = reshape::ops();
    v.extend(slice::ops());
    v.extend(join::ops());
    v.extend(gen::ops());
    v
}
