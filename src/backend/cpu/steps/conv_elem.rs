//! `Conv` and `ConvTranspose` on the float dtypes the f32 kernels of [`super::conv`]
//! and [`super::backward`] do not take (f64, f16, bf16): direct loops in f64 as the
//! reference computes them. Conv runs over a table (built at lowering) of each output
//! position's taps that land inside the input; ConvTranspose scatters each input
//! element through its taps into an f64 accumulator (the f32 step's geometry).
use crate::backend::cpu::kernels::conv_transpose::ConvTransposeShape;
use crate::backend::cpu::program::{Cx, Kernel, Loc, Slot};
use crate::ir::ops::conv::windows;
use crate::ir::DType;
use crate::tensor::Elem;
use crate::with_dtype;

use super::matmul_elem::{elems, elems_mut, scratch_f64};
use super::Build;

struct ConvElem {
    n: usize,
    c: usize,
    m: usize,
    cg: usize,
    taps: usize,
    in_size: usize,
    out_size: usize,
    /// Output position p's taps: `inside[starts[p]..starts[p + 1]]`, (input offset, tap).
    starts: Vec<usize>,
    inside: Vec<(usize, usize)>,
    x: Slot,
    w: Slot,
    b: Option<Slot>,
    y: Slot,
}

pub(super) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    if b.node.op != "Conv" {
        return Ok(None);
    }
    let (Some(x), Some(w), [y]) = (b.input(0), b.input(1), b.outs) else {
        return Ok(None);
    };
    let dtype = x.dtype;
    if !is_elem_float(dtype)
        || w.dtype != dtype
        || y.dtype != dtype
        || b.input(2).is_some_and(|s| s.dtype != dtype)
        || x.shape.len() < 3
        || w.shape.len() != x.shape.len()
    {
        return Ok(None);
    }
    let group = b.node.attrs.int_or("group", 1)?;
    if group < 1 {
        return Ok(None);
    }
    let group = group as usize;
    let (n, c) = (x.shape[0], x.shape[1]);
    let (m, cg) = (w.shape[0], w.shape[1]);
    if c != cg * group || m % group != 0 {
        return Err(format!(
            "channels: X {:?}, W {:?}, group {group}",
            x.shape, w.shape
        ));
    }
    let kernel = w.shape[2..].to_vec();
    let input = x.shape[2..].to_vec();
    let known: Vec<Option<usize>> = input.iter().map(|&v| Some(v)).collect();
    let wins = windows(&b.node.attrs, &kernel, &known)?;
    let outs: Vec<usize> = input
        .iter()
        .zip(&wins)
        .map(|(&i, w)| w.outputs(i, false))
        .collect::<Result<_, _>>()?;
    if y.shape[..2] != [n, m] || y.shape[2..] != outs[..] {
        return Ok(None);
    }
    if b.input(2).is_some_and(|s| s.elements() != m) {
        return Err(format!("B must have {m} values"));
    }
    let r = kernel.len();
    let taps: usize = kernel.iter().product();
    let out_size: usize = outs.iter().product();
    let (mut starts, mut inside) = (vec![0], vec![]);
    let mut position = vec![0usize; r];
    for _ in 0..out_size {
        let mut tap = vec![0usize; r];
        for t in 0..taps {
            let mut offset = Some(0);
            for d in 0..r {
                let src = wins[d].source(position[d], tap[d], input[d]);
                offset = offset.zip(src).map(|(o, s)| o * input[d] + s);
            }
            if let Some(o) = offset {
                inside.push((o, t));
            }
            next_index(&mut tap, &kernel);
        }
        starts.push(inside.len());
        next_index(&mut position, &outs);
    }
    Ok(Some(Box::new(ConvElem {
        n,
        c,
        m,
        cg,
        taps,
        in_size: input.iter().product(),
        out_size,
        starts,
        inside,
        x: x.clone(),
        w: w.clone(),
        b: b.input(2).cloned(),
        y: y.clone(),
    })))
}

/// The next row-major index below `dims` (wrapping to zeros).
fn next_index(idx: &mut [usize], dims: &[usize]) {
    for d in (0..idx.len()).rev() {
        idx[d] += 1;
        if idx[d] < dims[d] {
            return;
        }
        idx[d] = 0;
    }
}

/// The convolution on `T`.
///
/// # Safety
/// The Kernel::run contract: X, W, B and Y hold `T`s of their shapes, Y its own buffer.
unsafe fn run_conv<T: Elem>(cx: &Cx, s: &ConvElem) -> Result<(), String> {
    // SAFETY: Conv's X, `T`s of its shape, only read.
    let x = unsafe { elems::<T>(cx, &s.x) };
    // SAFETY: Conv's W, `T`s of its shape, only read.
    let w = unsafe { elems::<T>(cx, &s.w) };
    // SAFETY: Conv's B, `T`s of M values, only read.
    let bias = s.b.as_ref().map(|b| unsafe { elems::<T>(cx, b) });
    // SAFETY: Conv's Y, never planned in place, so not X's buffer.
    let y = unsafe { elems_mut::<T>(cx, &s.y) };
    let mg = s.m / (s.c / s.cg);
    for p in 0..s.out_size {
        let inside = &s.inside[s.starts[p]..s.starts[p + 1]];
        for ni in 0..s.n {
            for mi in 0..s.m {
                let g = mi / mg;
                let mut acc = bias.map_or(0.0, |b| b[mi].to_f64());
                for ci in 0..s.cg {
                    let xc = (ni * s.c + g * s.cg + ci) * s.in_size;
                    let wc = (mi * s.cg + ci) * s.taps;
                    for &(o, t) in inside {
                        acc += x[xc + o].to_f64() * w[wc + t].to_f64();
                    }
                }
                y[(ni * s.m + mi) * s.out_size + p] = T::from_f64(acc);
            }
        }
    }
    Ok(())
}

impl Kernel for ConvElem {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: the Kernel::run contract; Conv's operands hold x.dtype (build checked).
        unsafe { with_dtype!(self.x.dtype, run_conv(cx, self)) }
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "conv-elem"
    }
}

/// The dtypes these loops take.
pub(crate) fn is_elem_float(d: DType) -> bool {
    matches!(d, DType::F64 | DType::F16 | DType::BF16)
}

/// A `ConvTranspose` of `shape` on f64, f16 or bf16.
pub(crate) struct ConvTransposeElem {
    shape: ConvTransposeShape,
    x: Slot,
    w: Slot,
    b: Option<Slot>,
    /// Y's elements as f64.
    acc: Loc,
    y: Slot,
}

impl ConvTransposeElem {
    pub(crate) fn build(
        b: &Build,
        shape: ConvTransposeShape,
        x: &Slot,
        w: &Slot,
        y: &Slot,
    ) -> Box<dyn Kernel> {
        Box::new(ConvTransposeElem {
            shape,
            x: x.clone(),
            w: w.clone(),
            b: b.input(2).cloned(),
            acc: b.scratch(y.elements() * 8),
            y: y.clone(),
        })
    }
}

/// Output index `i · stride + k · dilation - pad` when inside `0..out`.
fn landing(
    i: usize,
    k: usize,
    stride: usize,
    dilation: usize,
    pad: usize,
    out: usize,
) -> Option<usize> {
    (i * stride + k * dilation)
        .checked_sub(pad)
        .filter(|&o| o < out)
}

/// The transposed convolution on `T`.
///
/// # Safety
/// The Kernel::run contract: X, W, B and Y hold `T`s of `s.shape`, the scratch Y's
/// elements of f64.
unsafe fn run_conv_transpose<T: Elem>(cx: &Cx, s: &ConvTransposeElem) {
    let sh = &s.shape;
    let d = &sh.depth;
    // SAFETY: ConvTranspose's X, W and B, `T`s of their shapes, only read.
    let (x, w) = unsafe { (elems::<T>(cx, &s.x), elems::<T>(cx, &s.w)) };
    // SAFETY: as above.
    let bias = s.b.as_ref().map(|b| unsafe { elems::<T>(cx, b) });
    // SAFETY: the step's scratch of Y's elements as f64, its alone while it runs.
    let acc = unsafe { scratch_f64(cx, s.acc, s.y.elements()) };
    let (cg, mg) = (sh.c / sh.groups, sh.m / sh.groups);
    let in_plane = d.input * sh.h * sh.w;
    let out_plane = d.output * sh.oh * sh.ow;
    let taps = d.kernel * sh.kh * sh.kw;
    for n in 0..sh.n {
        for m in 0..sh.m {
            let bias = bias.map_or(0.0, |b| b[m].to_f64());
            acc[(n * sh.m + m) * out_plane..][..out_plane].fill(bias);
        }
        for c in 0..sh.c {
            let xc = &x[(n * sh.c + c) * in_plane..][..in_plane];
            let g = c / cg;
            for mi in 0..mg {
                let wm = &w[(c * mg + mi) * taps..][..taps];
                let ym = &mut acc[(n * sh.m + g * mg + mi) * out_plane..][..out_plane];
                for (i, xv) in xc.iter().enumerate() {
                    let xv = xv.to_f64();
                    let (iz, iy, ix) = (i / (sh.h * sh.w), i / sh.w % sh.h, i % sh.w);
                    for (t, wv) in wm.iter().enumerate() {
                        let (kz, ky, kx) = (t / (sh.kh * sh.kw), t / sh.kw % sh.kh, t % sh.kw);
                        let (Some(oz), Some(oy), Some(ox)) = (
                            landing(iz, kz, d.stride, d.dilation, d.pad, d.output),
                            landing(iy, ky, sh.strides[0], sh.dilations[0], sh.pad_top, sh.oh),
                            landing(ix, kx, sh.strides[1], sh.dilations[1], sh.pad_left, sh.ow),
                        ) else {
                            continue;
                        };
                        ym[(oz * sh.oh + oy) * sh.ow + ox] += xv * wv.to_f64();
                    }
                }
            }
        }
    }
    // SAFETY: ConvTranspose's Y, never planned in place, so not X's buffer.
    let y = unsafe { elems_mut::<T>(cx, &s.y) };
    for (d, &v) in y.iter_mut().zip(acc.iter()) {
        *d = T::from_f64(v);
    }
}

impl Kernel for ConvTransposeElem {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: the Kernel::run contract; the operands hold x.dtype (build checked).
        unsafe { with_dtype!(self.x.dtype, run_conv_transpose(cx, self)) };
        Ok(())
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "conv-transpose-elem"
    }
}
