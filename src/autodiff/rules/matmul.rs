//! Gradient rules of the contractions: MatMul and Gemm (batch axes broadcast and summed
//! back).
use super::Cx;
use crate::error::{Error, Result};
use crate::ir::{Attr, Attrs, Value};

/// `a` with its last two axes swapped.
pub(super) fn swap_last(cx: &mut Cx, a: Value) -> Result<Value> {
    let r = cx.ty(a).rank();
    let mut perm: Vec<i64> = (0..r as i64).collect();
    perm.swap(r - 2, r - 1);
    cx.op(
        "Transpose",
        &[a],
        Attrs::new().with("perm", Attr::Ints(perm)),
    )
}

/// Gradients of `alpha · op(a) · op(b)` (`op` transposes the last two axes when asked);
/// batch axes broadcast and are summed back.
pub(super) fn matmul(
    cx: &mut Cx,
    a: Value,
    b: Value,
    gy: Value,
    ta: bool,
    tb: bool,
    alpha: f64,
) -> Result<Vec<Option<Value>>> {
    if cx.ty(a).rank() < 2 || cx.ty(b).rank() < 2 {
        return Err(Error::Graph(
            "the rule covers operands of rank 2 and more (vectors are not yet covered)".into(),
        ));
    }
    let none = Attrs::new();
    let gy = if alpha == 1.0 {
        gy
    } else {
        let s = cx.scalar(cx.ty(gy).dtype, alpha)?;
        cx.op("Mul", &[gy, s], none.clone())?
    };
    // With A' = op(a), B' = op(b): dA' = gy·B'ᵀ, dB' = A'ᵀ·gy; op(b)ᵀ is b itself when
    // tb, and dA = dA'ᵀ when ta.
    let bt = if tb { b } else { swap_last(cx, b)? };
    let at = if ta { a } else { swap_last(cx, a)? };
    let ga = if ta {
        // dA = (gy·B'ᵀ)ᵀ = B'·gyᵀ
        let bp = if tb { swap_last(cx, b)? } else { b };
        let gyt = swap_last(cx, gy)?;
        cx.op("MatMul", &[bp, gyt], none.clone())?
    } else {
        cx.op("MatMul", &[gy, bt], none.clone())?
    };
    let gb = if tb {
        // dB = (A'ᵀ·gy)ᵀ = gyᵀ·A'
        let ap = if ta { swap_last(cx, a)? } else { a };
        let gyt = swap_last(cx, gy)?;
        cx.op("MatMul", &[gyt, ap], none)?
    } else {
        cx.op("MatMul", &[at, gy], none)?
    };
    Ok(vec![
        Some(cx.unbroadcast(ga, a)?),
        Some(cx.unbroadcast(gb, b)?),
    ])
}
