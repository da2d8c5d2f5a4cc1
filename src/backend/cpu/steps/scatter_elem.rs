//! OneHot, CenterCropPad, and ScatterElements / ScatterND with every reduction, on the
//! dtypes the other families decline: typed loops of `kernels::scatter_elem`. Shapes and
//! attributes are read here (CenterCropPad's source table is built here); index
//! operands (i32 or i64, OneHot's of any numeric dtype) are read from their slot per run.
use crate::backend::cpu::kernels::scatter_elem::{self as k, Acc, Reduce};
use crate::backend::cpu::program::{Cx, Kernel, Loc, Slot};
use crate::ir::shape::norm_axis;
use crate::ir::DType;
use crate::tensor::Elem;
use crate::with_dtype;

use super::Build;

enum What {
    OneHot {
        dims: [usize; 3],
        values: Slot,
    },
    Crop {
        src: Vec<usize>,
    },
    Elements {
        axis: usize,
        upd: Slot,
        reduce: Option<Reduce>,
        acc: Loc,
    },
    Nd {
        upd: Slot,
        reduce: Option<Reduce>,
        acc: Loc,
    },
}

struct ScatterStep {
    what: What,
    /// data (OneHot: the indices).
    x: Slot,
    /// The index operand of the scatters.
    idx: Option<Slot>,
    y: Slot,
    kind: &'static str,
}

fn int_index(d: DType) -> bool {
    matches!(d, DType::I32 | DType::I64)
}

pub(crate) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let (Some(x), [y]) = (b.input(0), b.outs) else {
        return Ok(None);
    };
    let attrs = &b.node.attrs;
    let (what, idx, kind) = match b.node.op.as_str() {
        "OneHot" => {
            let Some(values) = b.input(2) else {
                return Ok(None);
            };
            let numeric = |d: DType| d.is_float() || d.is_int();
            if !numeric(x.dtype) || values.elements() != 2 || values.dtype != y.dtype {
                return Ok(None);
            }
            let axis = norm_axis(attrs.int_or("axis", -1)?, y.shape.len())?;
            let outer = y.shape[..axis].iter().product();
            let inner = y.shape[axis + 1..].iter().product();
            let what = What::OneHot {
                dims: [outer, y.shape[axis], inner],
                values: values.clone(),
            };
            (what, None, "one-hot")
        }
        "CenterCropPad" => {
            if x.dtype != y.dtype || x.shape.len() != y.shape.len() {
                return Ok(None);
            }
            let offset: Vec<i64> = x
                .shape
                .iter()
                .zip(&y.shape)
                .map(|(&d, &n)| {
                    let (d, n) = (d as i64, n as i64);
                    if n <= d {
                        (d - n) / 2
                    } else {
                        -((n - d) / 2)
                    }
                })
                .collect();
            let mut src = Vec::with_capacity(y.elements());
            let r = y.shape.len();
            for mut e in 0..y.elements() {
                let (mut p, mut stride, mut inside) = (0usize, 1usize, true);
                for a in (0..r).rev() {
                    let c = (e % y.shape[a]) as i64 + offset[a];
                    e /= y.shape[a];
                    if c < 0 || c >= x.shape[a] as i64 {
                        inside = false;
                    } else {
                        p += c as usize * stride;
                    }
                    stride *= x.shape[a];
                }
                src.push(if inside { p } else { usize::MAX });
            }
            (What::Crop { src }, None, "center-crop-pad")
        }
        op @ ("ScatterElements" | "ScatterND") => {
            let (Some(idx), Some(upd)) = (b.input(1), b.input(2)) else {
                return Ok(None);
            };
            let reduce = Reduce::parse(attrs.string_or("reduction", "none")?)?;
            if !int_index(idx.dtype)
                || upd.dtype != x.dtype
                || y.dtype != x.dtype
                || y.shape != x.shape
                || y.loc == upd.loc
                || y.loc == idx.loc
                || (reduce.is_some() && !(x.dtype.is_float() || x.dtype.is_int()))
            {
                return Ok(None);
            }
            let acc = if reduce.is_some() {
                b.scratch(8 * y.elements())
            } else {
                Loc::Arena(0)
            };
            let upd = upd.clone();
            if op == "ScatterElements" {
                if idx.shape != upd.shape || idx.shape.len() != x.shape.len() || x.shape.is_empty()
                {
                    return Ok(None);
                }
                let axis = norm_axis(attrs.int_or("axis", 0)?, x.shape.len())?;
                let what = What::Elements {
                    axis,
                    upd,
                    reduce,
                    acc,
                };
                (what, Some(idx.clone()), "scatter-elements")
            } else {
                let Some(&q) = idx.shape.last() else {
                    return Ok(None);
                };
                let mut want = idx.shape[..idx.shape.len() - 1].to_vec();
                if q > x.shape.len() {
                    return Ok(None);
                }
                want.extend_from_slice(&x.shape[q..]);
                if upd.shape != want {
                    return Ok(None);
                }
                (
                    What::Nd { upd, reduce, acc },
                    Some(idx.clone()),
                    "scatter-nd",
                )
            }
        }
        _ => return Ok(None),
    };
    Ok(Some(Box::new(ScatterStep {
        what,
        x: x.clone(),
        idx,
        y: y.clone(),
        kind,
    })))
}

/// `len` `T`s at `loc`, read-only.
///
/// # Safety
/// `loc` must hold `len` `T`s under `cx`, not written while the slice lives.
unsafe fn view<'a, T>(cx: &Cx, loc: Loc, len: usize) -> &'a [T] {
    // SAFETY: the caller's promise: `len` live `T`s at `loc`, left unwritten meanwhile.
    unsafe { std::slice::from_raw_parts(cx.ptr(loc) as *const T, len) }
}

/// `len` `T`s at `loc`, to write.
///
/// # Safety
/// `loc` must hold `len` `T`s under `cx` that nothing else touches while the slice lives.
#[allow(clippy::mut_from_ref)]
unsafe fn view_mut<'a, T>(cx: &Cx, loc: Loc, len: usize) -> &'a mut [T] {
    // SAFETY: the caller's promise: `len` live `T`s at `loc`, this slice's only.
    unsafe { std::slice::from_raw_parts_mut(cx.ptr(loc) as *mut T, len) }
}

/// OneHot's indices of dtype `I` (truncated toward zero, as the reference's f64 path).
///
/// # Safety
/// The Kernel::run contract; `values` holds 2 `T`s.
unsafe fn one_hot_typed<I: Elem>(cx: &Cx, s: &ScatterStep, dims: [usize; 3]) -> Result<(), String> {
    // SAFETY: the indices slot holds its elements of `I` (its dtype), only read here.
    let ix: &[I] = unsafe { view(cx, s.x.loc, s.x.elements()) };
    let trunc = |e: usize| {
        let v = ix[e].to_f64().trunc();
        if v.is_nan() {
            i64::MIN
        } else {
            v as i64
        }
    };
    let size = s.y.dtype.size_in_bytes();
    let What::OneHot { values, .. } = &s.what else {
        return Ok(());
    };
    // SAFETY: values holds 2 elements of the output's dtype (build checked), read only.
    let v: &[u8] = unsafe { view(cx, values.loc, 2 * size) };
    // SAFETY: the output slot is `y.bytes()`, a buffer no operand shares (no in-place rule).
    let yb: &mut [u8] = unsafe { view_mut(cx, s.y.loc, s.y.bytes()) };
    let (off, on) = (&v[..size], &v[size..]);
    let [_, depth, inner] = dims;
    for (e, o) in yb.chunks_mut(size).enumerate() {
        let (c, i, lane) = (
            (e / inner.max(1)) % depth.max(1),
            e % inner.max(1),
            e / (depth * inner).max(1),
        );
        let mut x = trunc(lane * inner + i);
        if x < 0 {
            x = x.saturating_add(depth as i64);
        }
        o.copy_from_slice(if x == c as i64 { on } else { off });
    }
    Ok(())
}

/// The scatters on data of dtype `T`.
///
/// # Safety
/// The Kernel::run contract.
unsafe fn scatter_typed<T: Elem>(cx: &Cx, s: &ScatterStep) -> Result<(), String> {
    let (Some(idx), ny) = (&s.idx, s.y.elements()) else {
        return Ok(());
    };
    let (upd, reduce, acc) = match &s.what {
        What::Elements {
            upd, reduce, acc, ..
        }
        | What::Nd { upd, reduce, acc } => (upd, *reduce, *acc),
        _ => return Ok(()),
    };
    if s.y.loc != s.x.loc {
        // SAFETY: data and the output are distinct buffers of `y.bytes()` each.
        unsafe { std::ptr::copy_nonoverlapping(cx.ptr(s.x.loc), cx.ptr(s.y.loc), s.y.bytes()) };
    }
    // SAFETY: the output holds `ny` `T`s; build declined it sharing updates or indices.
    let y: &mut [T] = unsafe { view_mut(cx, s.y.loc, ny) };
    // SAFETY: updates holds its elements of the data's dtype, only read here.
    let u: &[T] = unsafe { view(cx, upd.loc, upd.elements()) };
    let f = match reduce {
        None => None,
        // SAFETY: build asked 8 bytes per output element of scratch, this step's alone.
        Some(r) if T::DTYPE.is_float() => Some((r, Acc::F(unsafe { view_mut(cx, acc, ny) }))),
        // SAFETY: the same scratch, as i64 for an integer dtype.
        Some(r) => Some((r, Acc::I(unsafe { view_mut(cx, acc, ny) }))),
    };
    let n = idx.elements();
    let (i32s, i64s): (&[i32], &[i64]) = if idx.dtype == DType::I32 {
        // SAFETY: the indices slot holds `n` i32 (its dtype), only read.
        (unsafe { view(cx, idx.loc, n) }, &[])
    } else {
        // SAFETY: the indices slot holds `n` i64 (the other dtype build admits), only read.
        (&[], unsafe { view(cx, idx.loc, n) })
    };
    let get = |e: usize| {
        if i32s.is_empty() {
            i64s[e]
        } else {
            i32s[e] as i64
        }
    };
    let xs = &s.x.shape;
    match &s.what {
        What::Elements { axis, .. } => k::scatter(y, u, f, |e| {
            k::element_target(e, &idx.shape, xs, *axis, get(e))
        }),
        _ => {
            let q = idx.shape[idx.shape.len() - 1];
            let tail: usize = xs[q..].iter().product();
            let mut tuple = [0i64; 16];
            if q > tuple.len() {
                return Err(format!(
                    "ScatterND indices address {q} axes (at most 16 here)"
                ));
            }
            k::scatter(y, u, f, |e| {
                let (slice, within) = (e / tail.max(1), e % tail.max(1));
                for (a, t) in tuple.iter_mut().enumerate().take(q) {
                    *t = get(slice * q + a);
                }
                Ok(k::nd_offset(&tuple[..q], xs, tail)? + within)
            })
        }
    }
}

impl Kernel for ScatterStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        match &self.what {
            // SAFETY: the Kernel::run contract, the indices of `x.dtype` (build checked).
            What::OneHot { dims, .. } => unsafe {
                with_dtype!(self.x.dtype, one_hot_typed(cx, self, *dims))
            },
            What::Crop { src } => {
                let size = self.x.dtype.size_in_bytes();
                // SAFETY: the input is `x.bytes()`, the output `y.bytes()`, distinct buffers
                // (CenterCropPad has no in-place rule), the input only read.
                let (xb, yb): (&[u8], &mut [u8]) = unsafe {
                    (
                        view(cx, self.x.loc, self.x.bytes()),
                        view_mut(cx, self.y.loc, self.y.bytes()),
                    )
                };
                k::remap_bytes(xb, yb, src, size);
                Ok(())
            }
            // SAFETY: the Kernel::run contract, data of `x.dtype` (build checked).
            _ => unsafe { with_dtype!(self.x.dtype, scatter_typed(cx, self)) },
        }
    }
    fn can_fail(&self) -> bool {
        !matches!(self.what, What::Crop { .. })
    }
    fn kind(&self) -> &'static str {
        self.kind
    }
}
