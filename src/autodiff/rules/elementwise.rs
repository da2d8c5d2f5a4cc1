//! Gradient rules of elementwise ops whose gradient is more than a line of the table:
//! Gelu (exact and tanh).
use super::Cx;
use crate::error::{Error, Result};
use crate::ir::{Attrs, Value};

/// Gelu: exact, Φ(x) + x·φ(x); with the tanh approximation, the derivative of
/// ½x(1 + tanh u), u = √(2/π)(x + 0.044715x³).
pub(super) fn gelu(cx: &mut Cx, xv: Value, gy: Value, attrs: &Attrs) -> Result<Value> {
    let none = Attrs::new();
    let dt = cx.ty(xv).dtype;
    let approx = attrs
        .string_or("approximate", "none")
        .map_err(Error::Graph)?
        == "tanh";
    let half = cx.scalar(dt, 0.5)?;
    let one = cx.scalar(dt, 1.0)?;
    let d = if approx {
        let k = (2.0 / std::f64::consts::PI).sqrt();
        let (kc, c3) = (cx.scalar(dt, k)?, cx.scalar(dt, 3.0 * 0.044715)?);
        let c = cx.scalar(dt, 0.044715)?;
        let xx = cx.op("Mul", &[xv, xv], none.clone())?;
        let x3 = cx.op("Mul", &[xx, xv], none.clone())?;
        let cx3 = cx.op("Mul", &[c, x3], none.clone())?;
        let inner = cx.op("Add", &[xv, cx3], none.clone())?;
        let u = cx.op("Mul", &[kc, inner], none.clone())?;
        let t = cx.op("Tanh", &[u], none.clone())?;
        // d = ½(1 + t) + ½x(1 - t²)·k(1 + 3c·x²)
        let a = cx.op("Add", &[one, t], none.clone())?;
        let a = cx.op("Mul", &[half, a], none.clone())?;
        let tt = cx.op("Mul", &[t, t], none.clone())?;
        let sech2 = cx.op("Sub", &[one, tt], none.clone())?;
        let du = cx.op("Mul", &[c3, xx], none.clone())?;
        let du = cx.op("Add", &[one, du], none.clone())?;
        let du = cx.op("Mul", &[kc, du], none.clone())?;
        let b = cx.op("Mul", &[half, xv], none.clone())?;
        let b = cx.op("Mul", &[b, sech2], none.clone())?;
        let b = cx.op("Mul", &[b, du], none.clone())?;
        cx.op("Add", &[a, b], none.clone())?
    } else {
        // Φ(x) = ½(1 + erf(x/√2)), φ(x) = e^(-x²/2)/√(2π)
        let r2 = cx.scalar(dt, std::f64::consts::FRAC_1_SQRT_2)?;
        let z = cx.op("Mul", &[xv, r2], none.clone())?;
        let e = cx.op("Erf", &[z], none.clone())?;
        let cdf = cx.op("Add", &[one, e], none.clone())?;
        let cdf = cx.op("Mul", &[half, cdf], none.clone())?;
        let xx = cx.op("Mul", &[xv, xv], none.clone())?;
        let h = cx.op("Mul", &[xx, half], none.clone())?;
        let h = cx.op("Neg", &[h], none.clone())?;
        let pdf = cx.op("Exp", &[h], none.clone())?;
        let k = cx.scalar(dt, 1.0 / (2.0 * std::f64::consts::PI).sqrt())?;
        let pdf = cx.op("Mul", &[pdf, k], none.clone())?;
        let xp = cx.op("Mul", &[xv, pdf], none.clone())?;
        cx.op("Add", &[cdf, xp], none.clone())?
    };
    cx.op("Mul", &[gy, d], none)
}
