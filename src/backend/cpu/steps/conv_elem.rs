//! `Conv` on the float dtypes the f32 kernels of [`super::conv`] do not take (f64, f16,
//! bf16): a direct loop in f64 as the reference computes it, over a table (built at
//! lowering) of each output position's taps that land inside the input.
use crate::backend::cpu::program::{Cx, Kernel, Slot};
use crate::ir::ops::conv::windows;
use crate::ir::DType;
use crate::tensor::Elem;
use crate::with_dtype;

use super::matmul_elem::{elems, elems_mut};
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
    if !matches!(dtype, DType::F64 | DType::F16 | DType::BF16)
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
