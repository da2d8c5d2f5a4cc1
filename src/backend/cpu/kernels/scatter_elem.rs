//! Typed loops for OneHot, CenterCropPad, ScatterElements and ScatterND on any dtype:
//! safe code over slices (the step turns slots into slices). Reductions combine as the
//! reference does: floats in f64, integers in i64 wrapping like C (u64 compared
//! unsigned), each element rounded back to its dtype once, after all updates.
use crate::tensor::Elem;

/// How an update combines with the value it lands on (`None` is a plain write).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reduce {
    Add,
    Mul,
    Max,
    Min,
}

impl Reduce {
    pub(crate) fn parse(s: &str) -> Result<Option<Reduce>, String> {
        Ok(Some(match s {
            "none" => return Ok(None),
            "add" => Reduce::Add,
            "mul" => Reduce::Mul,
            "max" => Reduce::Max,
            "min" => Reduce::Min,
            r => {
                return Err(format!(
                    "reduction '{r}' is not one of none, add, mul, max, min"
                ))
            }
        }))
    }
    fn f64(self, a: f64, b: f64) -> f64 {
        match self {
            Reduce::Add => a + b,
            Reduce::Mul => a * b,
            Reduce::Max => a.max(b),
            Reduce::Min => a.min(b),
        }
    }
    fn i64(self, a: i64, b: i64, unsigned: bool) -> i64 {
        match (self, unsigned) {
            (Reduce::Add, _) => a.wrapping_add(b),
            (Reduce::Mul, _) => a.wrapping_mul(b),
            (Reduce::Max, false) => a.max(b),
            (Reduce::Min, false) => a.min(b),
            (Reduce::Max, true) => (a as u64).max(b as u64) as i64,
            (Reduce::Min, true) => (a as u64).min(b as u64) as i64,
        }
    }
}

/// The f64 or i64 working copy of the output a reduction accumulates in.
pub(crate) enum Acc<'a> {
    F(&'a mut [f64]),
    I(&'a mut [i64]),
}

/// `y` (already holding data) with update `u[k]` combined into element `at(k)`.
pub(crate) fn scatter<T: Elem>(
    y: &mut [T],
    u: &[T],
    f: Option<(Reduce, Acc)>,
    mut at: impl FnMut(usize) -> Result<usize, String>,
) -> Result<(), String> {
    match f {
        None => {
            for (k, &v) in u.iter().enumerate() {
                y[at(k)?] = v;
            }
        }
        Some((r, Acc::F(acc))) => {
            for (a, v) in acc.iter_mut().zip(y.iter()) {
                *a = v.to_f64();
            }
            for (k, &v) in u.iter().enumerate() {
                let p = at(k)?;
                acc[p] = r.f64(acc[p], v.to_f64());
            }
            for (o, &a) in y.iter_mut().zip(acc.iter()) {
                *o = T::from_f64(a);
            }
        }
        Some((r, Acc::I(acc))) => {
            let unsigned = T::DTYPE == crate::ir::DType::U64;
            for (a, v) in acc.iter_mut().zip(y.iter()) {
                *a = v.to_i64();
            }
            for (k, &v) in u.iter().enumerate() {
                let p = at(k)?;
                acc[p] = r.i64(acc[p], v.to_i64(), unsigned);
            }
            for (o, &a) in y.iter_mut().zip(acc.iter()) {
                *o = T::from_i64(a);
            }
        }
    }
    Ok(())
}

/// An index `i` on an axis of size `d`, negative counting from the end.
pub(crate) fn resolve(i: i64, d: usize, axis: usize) -> Result<usize, String> {
    let di = d as i64;
    if i < -di || i >= di {
        return Err(format!(
            "index {i} is out of range for axis {axis} of size {d}"
        ));
    }
    Ok(if i < 0 { i + di } else { i } as usize)
}

/// ScatterElements' target of update `k`: `k` unravelled over `ishape`, its `axis`
/// coordinate replaced by `index`, ravelled over `xshape` (each coordinate checked).
pub(crate) fn element_target(
    mut k: usize,
    ishape: &[usize],
    xshape: &[usize],
    axis: usize,
    index: i64,
) -> Result<usize, String> {
    let (mut p, mut stride) = (0usize, 1usize);
    for a in (0..ishape.len()).rev() {
        let c = k % ishape[a].max(1);
        k /= ishape[a].max(1);
        let c = if a == axis {
            resolve(index, xshape[a], a)?
        } else if c >= xshape[a] {
            return Err(format!(
                "indices reach {c} on axis {a} of size {}",
                xshape[a]
            ));
        } else {
            c
        };
        p += c * stride;
        stride *= xshape[a];
    }
    Ok(p)
}

/// ScatterND's flat offset of the slice `tuple` (the first `tuple.len()` axes) names.
pub(crate) fn nd_offset(tuple: &[i64], xshape: &[usize], tail: usize) -> Result<usize, String> {
    let mut off = 0usize;
    for (a, &i) in tuple.iter().enumerate() {
        off = off * xshape[a] + resolve(i, xshape[a], a)?;
    }
    Ok(off * tail)
}

/// CenterCropPad as a byte copy: output element `e` is input element `src[e]`, or zero
/// bytes where `src[e]` is `usize::MAX` (padding).
pub(crate) fn remap_bytes(x: &[u8], y: &mut [u8], src: &[usize], size: usize) {
    for (o, &s) in y.chunks_mut(size).zip(src) {
        if s == usize::MAX {
            o.fill(0);
        } else {
            o.copy_from_slice(&x[s * size..(s + 1) * size]);
        }
    }
}
