//! Pooling, layout reorders, softmax and the normalizations (layer norm over any trailing
//! axes, instance norm, Lp norm along any axis; RMS norm, batch norm, LRN and the other
//! dtypes' softmaxes in [`super::norm_elem`]): the memory-bound ops
//! around the convolutions and products, each one vectorized kernel over the arena.
//! Pools with `block` > 0 (the layout pass's) run the NCHWxc kernels on blocked buffers,
//! every lane (pad lanes too) pooled as a channel.
use crate::backend::cpu::kernels::pooling::{Pool2d, PoolKind};
use crate::backend::cpu::kernels::{norm, pooling, reorder, softmax};
use crate::backend::cpu::program::{Cx, Kernel, Loc, Slot};
use crate::ir::shape::norm_axis;

use super::Build;

/// The f32 elements of `s`, read-only.
///
/// # Safety
/// `s` must be an f32 slot live under `cx` for `'a` and not written meanwhile.
unsafe fn read<'a>(cx: &Cx, s: &Slot) -> &'a [f32] {
    // SAFETY: `s` addresses s.elements() f32 under `cx`, unwritten for 'a (the contract).
    unsafe { std::slice::from_raw_parts(cx.f32(s), s.elements()) }
}

/// The f32 elements of `s`, to write; `s` must not overlap what is read alongside.
///
/// # Safety
/// `s` must be an f32 slot live under `cx` for `'a`, touched by nothing else meanwhile.
#[allow(clippy::mut_from_ref)]
unsafe fn write<'a>(cx: &Cx, s: &Slot) -> &'a mut [f32] {
    // SAFETY: `s` addresses s.elements() f32 under `cx`, which nothing else reads or
    // writes for 'a (the contract), so the one &mut is unique.
    unsafe { std::slice::from_raw_parts_mut(cx.f32_mut(s), s.elements()) }
}

enum Nn {
    Pool {
        kind: PoolKind,
        p: Pool2d,
        /// [N, C, H, W]; blocked, C counts every lane of the blocks.
        dims: [usize; 4],
        indices: Option<Slot>,
        /// 0: plain NCHW; else the channel block of x and y.
        block: usize,
    },
    GlobalPool {
        kind: PoolKind,
        n: usize,
        /// Every lane of the blocks when blocked.
        c: usize,
        hw: usize,
        block: usize,
    },
    Block {
        n: usize,
        c: usize,
        spatial: usize,
        block: usize,
    },
    Unblock {
        n: usize,
        c: usize,
        spatial: usize,
        block: usize,
    },
    /// Along the middle axis of `[rows, n, inner]` (`inner` 1: the last axis).
    Softmax {
        rows: usize,
        n: usize,
        inner: usize,
        log: bool,
    },
    LayerNorm {
        rows: usize,
        n: usize,
        eps: f32,
        scale: Slot,
        bias: Option<Slot>,
        stats: Option<(Slot, Slot)>,
    },
    /// `rows` planes of `n`, channel `row % C` (C = the scale's length).
    InstanceNorm {
        rows: usize,
        n: usize,
        eps: f64,
        scale: Slot,
        bias: Slot,
    },
    /// Along the middle axis of `[outer, len, inner]`; `norms`: outer · inner f32.
    LpNorm {
        dims: [usize; 3],
        p: u32,
        norms: Loc,
    },
}

struct NnStep {
    what: Nn,
    x: Slot,
    y: Slot,
}

/// Whether anything reads output `k` of the node (a graph output counts).
pub(super) fn used(b: &Build, k: u32) -> bool {
    let v = b.id.out(k);
    b.g.outputs().iter().any(|o| o.value == v)
        || b.g.nodes().iter().any(|n| n.inputs.contains(&Some(v)))
}

pub(crate) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let op = b.node.op.as_str();
    let attrs = &b.node.attrs;
    let Some(x) = b.input(0) else { return Ok(None) };
    let f32 = x.dtype == crate::ir::DType::F32;
    if matches!(op, "RMSNormalization" | "BatchNormalization" | "LRN")
        || (!f32
            && matches!(
                op,
                "Softmax"
                    | "LogSoftmax"
                    | "LayerNormalization"
                    | "InstanceNormalization"
                    | "LpNormalization"
            ))
    {
        return super::norm_elem::build(b);
    }
    if op == "GlobalLpPool" || (!f32 && matches!(op, "GlobalAveragePool" | "GlobalMaxPool")) {
        return super::pool_nd::build_global(b);
    }
    if x.dtype != crate::ir::DType::F32 || b.outs[0].dtype != crate::ir::DType::F32 {
        return Ok(None);
    }
    let y = &b.outs[0];
    let last_axis = |default: i64| -> Result<bool, String> {
        let axis = attrs.int_or("axis", default)?;
        Ok(axis == -1 || axis == x.shape.len() as i64 - 1)
    };
    let row_split = || {
        let n = *x.shape.last().unwrap_or(&1);
        (x.elements() / n.max(1), n)
    };
    let block = match op {
        "MaxPool" | "AveragePool" | "GlobalAveragePool" | "GlobalMaxPool" => {
            attrs.int_or("block", 0)? as usize
        }
        _ => 0,
    };
    // A blocked [N, CB, spatial..., b] as [N, CB·b, spatial...] (its last axis dropped).
    let (xs, ys) = if block > 0 {
        let drop = |s: &[usize]| s[..s.len().saturating_sub(1)].to_vec();
        let mut xs = drop(&x.shape);
        if xs.len() < 3 || x.shape.last() != Some(&block) {
            return Ok(None);
        }
        xs[1] *= block;
        (xs, drop(&y.shape))
    } else {
        (x.shape.clone(), y.shape.clone())
    };
    let what = match op {
        "MaxPool" | "AveragePool" => {
            if xs.len() != 4 || attrs.string_or("auto_pad", "NOTSET")? != "NOTSET" {
                return Ok(None);
            }
            let two = |name: &str, d: usize| -> Result<Option<[usize; 2]>, String> {
                Ok(match attrs.ints(name)? {
                    Some(&[a, b]) => Some([a as usize, b as usize]),
                    Some(_) => None,
                    None => Some([d; 2]),
                })
            };
            let (Some(kernel), Some(strides), Some(dilations)) = (
                two("kernel_shape", 1)?,
                two("strides", 1)?,
                two("dilations", 1)?,
            ) else {
                return Ok(None);
            };
            let pads = match attrs.ints("pads")? {
                Some(&[t, l, bo, r]) => [t as usize, l as usize, bo as usize, r as usize],
                Some(_) => return Ok(None),
                None => [0; 4],
            };
            let kind = if op == "MaxPool" {
                PoolKind::Max
            } else {
                PoolKind::Average
            };
            if kind == PoolKind::Max && attrs.int_or("storage_order", 0)? != 0 {
                return Ok(None);
            }
            if kernel.contains(&0) || strides.contains(&0) || dilations.contains(&0) {
                return Ok(None);
            }
            let p = Pool2d {
                kernel,
                strides,
                dilations,
                pads,
                ceil_mode: attrs.int_or("ceil_mode", 0)? != 0,
                count_include_pad: attrs.int_or("count_include_pad", 0)? != 0,
            };
            if p.out_len(0, xs[2]).is_none() || p.out_len(1, xs[3]).is_none() {
                return Ok(None);
            }
            let [oh, ow] = p.out_dims(xs[2], xs[3]);
            if ys[2..] != [oh, ow] {
                return Err(format!("output {:?} is not {oh}×{ow}", y.shape));
            }
            let indices = (b.outs.len() > 1 && used(b, 1)).then(|| b.outs[1].clone());
            if block > 0 && indices.is_some() {
                // The blocked kernel has no Indices: the layout pass never asks for them.
                return Ok(None);
            }
            let dims = [xs[0], xs[1], xs[2], xs[3]];
            Nn::Pool {
                kind,
                p,
                dims,
                indices,
                block,
            }
        }
        "GlobalAveragePool" | "GlobalMaxPool" if xs.len() >= 3 => Nn::GlobalPool {
            kind: if op == "GlobalMaxPool" {
                PoolKind::Max
            } else {
                PoolKind::Average
            },
            n: xs[0],
            c: xs[1],
            hw: xs[2..].iter().product(),
            block,
        },
        "Reorder" => {
            let block = attrs.int_or("block", 16)? as usize;
            match attrs.string_or("to", "blocked")? {
                "blocked" => Nn::Block {
                    n: x.shape[0],
                    c: x.shape[1],
                    spatial: x.shape[2..].iter().product(),
                    block,
                },
                _ => Nn::Unblock {
                    n: y.shape[0],
                    c: y.shape[1],
                    spatial: y.shape[2..].iter().product(),
                    block,
                },
            }
        }
        "Softmax" | "LogSoftmax" if last_axis(-1)? => {
            let (rows, n) = row_split();
            Nn::Softmax {
                rows,
                n,
                inner: 1,
                log: op == "LogSoftmax",
            }
        }
        "Softmax" | "LogSoftmax" => {
            // Along an inner axis: [outer, n, inner] with inner > 1.
            let rank = x.shape.len() as i64;
            let axis = attrs.int_or("axis", -1)?;
            let axis = if axis < 0 { axis + rank } else { axis };
            if !(0..rank).contains(&axis) {
                return Ok(None);
            }
            let axis = axis as usize;
            Nn::Softmax {
                rows: x.shape[..axis].iter().product(),
                n: x.shape[axis],
                inner: x.shape[axis + 1..].iter().product(),
                log: op == "LogSoftmax",
            }
        }
        "LayerNormalization" => {
            // Normalized over the axes from `axis` on: rows of their product.
            let rank = x.shape.len() as i64;
            let axis = attrs.int_or("axis", -1)?;
            let axis = if axis < 0 { axis + rank } else { axis };
            if !(0..rank).contains(&axis) {
                return Ok(None);
            }
            let n: usize = x.shape[axis as usize..].iter().product();
            let rows = x.elements() / n.max(1);
            let Some(scale) = b.input(1).filter(|s| s.elements() == n) else {
                return Ok(None);
            };
            let bias = b.input(2).cloned();
            if bias.as_ref().is_some_and(|s| s.elements() != n) {
                return Ok(None);
            }
            let stats = (b.outs.len() == 3 && (used(b, 1) || used(b, 2)))
                .then(|| (b.outs[1].clone(), b.outs[2].clone()));
            if stats
                .as_ref()
                .is_some_and(|(m, s)| m.dtype != x.dtype || s.dtype != x.dtype)
            {
                return Ok(None);
            }
            Nn::LayerNorm {
                rows,
                n,
                eps: attrs.float_or("epsilon", 1e-5)? as f32,
                scale: scale.clone(),
                bias,
                stats,
            }
        }
        "InstanceNormalization" => {
            let (Some(scale), Some(bias)) = (b.input(1), b.input(2)) else {
                return Ok(None);
            };
            let c = x.shape.get(1).copied().unwrap_or(0);
            let f32s = [scale, bias].iter().all(|t| t.dtype == x.dtype);
            if x.shape.len() < 3 || c == 0 || scale.elements() != c || bias.elements() != c || !f32s
            {
                return Ok(None);
            }
            let n: usize = x.shape[2..].iter().product();
            Nn::InstanceNorm {
                rows: x.shape[0] * c,
                n,
                eps: attrs.float_or("epsilon", 1e-5)?,
                scale: scale.clone(),
                bias: bias.clone(),
            }
        }
        "LpNormalization" => {
            let axis = norm_axis(attrs.int_or("axis", -1)?, x.shape.len())?;
            let p = match attrs.int_or("p", 2)? {
                1 => 1,
                2 => 2,
                _ => return Ok(None),
            };
            let outer: usize = x.shape[..axis].iter().product();
            let inner: usize = x.shape[axis + 1..].iter().product();
            Nn::LpNorm {
                dims: [outer, x.shape[axis], inner],
                p,
                norms: b.scratch(outer * inner * std::mem::size_of::<f32>()),
            }
        }
        _ => return Ok(None),
    };
    Ok(Some(Box::new(NnStep {
        what,
        x: x.clone(),
        y: y.clone(),
    })))
}

impl Kernel for NnStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: the step's f32 input slot, live for the run and written by no one.
        let x = unsafe { read(cx, &self.x) };
        // SAFETY: the f32 output slot; none of these ops may run in place, so the plan
        // gives it a buffer apart from every input read here.
        let y = unsafe { write(cx, &self.y) };
        let pool = cx.pool;
        match &self.what {
            Nn::Pool {
                kind,
                p,
                dims,
                indices,
                block: 0,
            } => {
                let idx = indices.as_ref().map(|s| {
                    // SAFETY: MaxPool's i64 Indices output, s.elements() of them, in a
                    // slot of its own.
                    unsafe {
                        std::slice::from_raw_parts_mut(cx.ptr(s.loc) as *mut i64, s.elements())
                    }
                });
                pooling::pool2d_nchw(*kind, p, x, *dims, y, idx, pool)
            }
            Nn::Pool {
                kind,
                p,
                dims,
                block,
                ..
            } => pooling::pool2d_blocked(*kind, p, x, *dims, *block, y, pool),
            Nn::GlobalPool {
                kind,
                n,
                c,
                hw,
                block: 0,
            } => pooling::global_pool_nchw(*kind, x, n * c, *hw, y, pool),
            Nn::GlobalPool {
                kind,
                n,
                c,
                hw,
                block,
            } => pooling::global_pool_blocked(*kind, x, *n, *c, *hw, *block, y, pool),
            Nn::Block {
                n,
                c,
                spatial,
                block,
            } => reorder::to_blocked(x, y, *n, *c, *spatial, *block, pool),
            Nn::Unblock {
                n,
                c,
                spatial,
                block,
            } => reorder::to_plain(x, y, *n, *c, *spatial, *block, pool),
            Nn::Softmax {
                rows,
                n,
                inner: 1,
                log: false,
            } => softmax::softmax(x, y, *rows, *n, pool),
            Nn::Softmax {
                rows,
                n,
                inner: 1,
                log: true,
            } => softmax::log_softmax(x, y, *rows, *n, pool),
            Nn::Softmax {
                rows,
                n,
                inner,
                log,
            } => softmax::softmax_strided(x, y, [*rows, *n, *inner], *log, pool),
            Nn::LayerNorm {
                rows,
                n,
                eps,
                scale,
                bias,
                stats,
            } => {
                let stats = stats.as_ref().map(|(m, s)| {
                    // SAFETY: the Mean and InvStdDev f32 outputs, two slots of their own.
                    let (mean, inv_std) = unsafe { (write(cx, m), write(cx, s)) };
                    norm::NormStats { mean, inv_std }
                });
                // SAFETY: the f32 Scale and (optional) B inputs, only read.
                let (scale, bias) =
                    unsafe { (read(cx, scale), bias.as_ref().map(|s| read(cx, s))) };
                norm::layer_norm(x, y, *rows, *n, scale, bias, *eps, stats, pool)
            }
            Nn::InstanceNorm {
                rows,
                n,
                eps,
                scale,
                bias,
            } => {
                // SAFETY: InstanceNormalization's f32 scale and B inputs, only read.
                let (scale, bias) = unsafe { (read(cx, scale), read(cx, bias)) };
                norm::instance_norm(x, y, *rows, *n, scale, bias, *eps, pool)
            }
            Nn::LpNorm { dims, p, norms } => {
                let norms = cx.ptr(*norms) as *mut f32;
                // SAFETY: the norms scratch, taken at build with outer · inner f32 (dims[0]
                // · dims[2]), apart from x and y.
                let norms = unsafe { std::slice::from_raw_parts_mut(norms, dims[0] * dims[2]) };
                norm::lp_norm(x, y, *dims, *p, norms, pool)
            }
        }
        Ok(())
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        match self.what {
            Nn::Pool { block: 0, .. } => "pool",
            Nn::Pool { .. } => "pool-blocked",
            Nn::GlobalPool { block: 0, .. } => "global-pool",
            Nn::GlobalPool { .. } => "global-pool-blocked",
            Nn::Block { .. } | Nn::Unblock { .. } => "reorder",
            Nn::Softmax { .. } => "softmax",
            Nn::LayerNorm { .. } => "layernorm",
            Nn::InstanceNorm { .. } => "instancenorm",
            Nn::LpNorm { .. } => "lpnorm",
        }
    }
}
