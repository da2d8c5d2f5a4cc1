//! Pools: MaxPool (with its Indices output), AveragePool, LpPool and their Global
//! forms, over any number of spatial axes, sharing Conv's window geometry.
//!
//! MaxPool, AveragePool, GlobalMaxPool and GlobalAveragePool also take a Kiln-only
//! `block` (made by the layout pass, never imported: the ONNX importer rejects it):
//! with b > 0, X and the outputs are in the blocked layout `[N, ceil(C/b), spatial...,
//! b]` (see `layout.rs`). A pool acts on each channel alone, so the reference is
//! unblock (every lane, pad lanes included, as a channel), plain pool, block: the
//! pad lanes of the output are the pool of the input's (unspecified) pad lanes.
use crate::ir::ops::{InPlace, Origin};
use ndarray::{ArrayD, Dimension, IxDyn};

use super::conv::{windows, Window};
use super::layout;
use super::util::require_dtype;
use super::{leak, AttrSpec, EvalCtx, InferCtx, Op, OpSchema};
use crate::ir::{AttrKind, DType, Dim, Shape, TensorType};
use crate::tensor::Tensor;

fn is_float(d: DType) -> bool {
    d.is_float()
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Max,
    Average,
    /// The p-norm of the window, `(sum |x|^p)^(1/p)`; padding adds nothing.
    Lp,
}

/// LpPool's `p` (default 2).
fn norm_order(attrs: &crate::ir::Attrs) -> Result<f64, String> {
    let p = attrs.int_or("p", 2)?;
    if p < 1 {
        return Err(format!("p must be 1 or more, got {p}"));
    }
    Ok(p as f64)
}

struct Pool {
    schema: OpSchema,
    kind: Kind,
}

/// The pools' blocked form (see the module docs).
const BLOCK_ATTR: AttrSpec = AttrSpec::opt(
    "block",
    AttrKind::Int,
    "0: plain; b > 0 (Kiln-only, the layout pass): X and the outputs blocked by b channels",
);

const MAX_POOL_ATTRS: &[AttrSpec] = &[
    AttrSpec::opt("auto_pad", AttrKind::String, "NOTSET"),
    BLOCK_ATTR,
    AttrSpec::opt("ceil_mode", AttrKind::Int, "0"),
    AttrSpec::opt("dilations", AttrKind::Ints, "1 per axis"),
    AttrSpec::req("kernel_shape", AttrKind::Ints),
    AttrSpec::opt("pads", AttrKind::Ints, "0 per side"),
    AttrSpec::opt("storage_order", AttrKind::Int, "0"),
    AttrSpec::opt("strides", AttrKind::Ints, "1 per axis"),
];

const AVERAGE_POOL_ATTRS: &[AttrSpec] = &[
    AttrSpec::opt("auto_pad", AttrKind::String, "NOTSET"),
    BLOCK_ATTR,
    AttrSpec::opt("ceil_mode", AttrKind::Int, "0"),
    AttrSpec::opt("count_include_pad", AttrKind::Int, "0"),
    AttrSpec::opt("dilations", AttrKind::Ints, "1 per axis"),
    AttrSpec::req("kernel_shape", AttrKind::Ints),
    AttrSpec::opt("pads", AttrKind::Ints, "0 per side"),
    AttrSpec::opt("strides", AttrKind::Ints, "1 per axis"),
];

const LP_POOL_ATTRS: &[AttrSpec] = &[
    AttrSpec::opt("auto_pad", AttrKind::String, "NOTSET"),
    AttrSpec::opt("ceil_mode", AttrKind::Int, "0"),
    AttrSpec::opt("dilations", AttrKind::Ints, "1 per axis"),
    AttrSpec::req("kernel_shape", AttrKind::Ints),
    AttrSpec::opt("p", AttrKind::Int, "2"),
    AttrSpec::opt("pads", AttrKind::Ints, "0 per side"),
    AttrSpec::opt("strides", AttrKind::Ints, "1 per axis"),
];

const GLOBAL_LP_POOL_ATTRS: &[AttrSpec] = &[AttrSpec::opt("p", AttrKind::Int, "2")];

/// A pool's `block` (0 = plain).
fn pool_block(attrs: &crate::ir::Attrs) -> Result<usize, String> {
    match attrs.int_or("block", 0)? {
        b if (0..=1024).contains(&b) => Ok(b as usize),
        b => Err(format!("block must be 0 to 1024, got {b}")),
    }
}

/// `plain`'s inference, on the plain view of a blocked X when `block` > 0 (every lane a
/// channel), with the outputs blocked again.
fn infer_blocked(
    cx: &InferCtx<'_>,
    plain: impl Fn(&InferCtx<'_>) -> Result<Vec<TensorType>, String>,
) -> Result<Vec<TensorType>, String> {
    let b = pool_block(cx.attrs)?;
    if b == 0 {
        return plain(cx);
    }
    let x = cx.input(0)?;
    let cb = x
        .shape
        .dim(1)
        .fixed()
        .filter(|_| x.rank() >= 4)
        .ok_or_else(|| format!("a blocked X must be [N, CB, spatial..., {b}], got {x}"))?;
    let ins = [Some(
        layout::plain_type(x, b, cb * b).map_err(|e| format!("X: {e}"))?,
    )];
    let pcx = InferCtx {
        node_name: cx.node_name,
        inputs: &ins,
        consts: &[],
        attrs: cx.attrs,
    };
    plain(&pcx)?
        .iter()
        .map(|t| layout::blocked_type(t, b))
        .collect()
}

/// `plain`'s evaluation through unblock and block when `block` > 0.
fn eval_blocked(
    cx: &EvalCtx<'_>,
    plain: impl Fn(&EvalCtx<'_>) -> Result<Vec<Tensor>, String>,
) -> Result<Vec<Tensor>, String> {
    let b = pool_block(cx.attrs)?;
    if b == 0 {
        return plain(cx);
    }
    let x = cx.input(0)?;
    let cb = x.shape().get(1).copied().ok_or("X needs rank >= 4")?;
    let px = layout::unblock(x, b, cb * b)?;
    let pcx = EvalCtx {
        inputs: &[Some(&px)],
        input_types: &[None],
        attrs: cx.attrs,
    };
    plain(&pcx)?.iter().map(|t| layout::block(t, b)).collect()
}

/// The kernel from `kernel_shape`, one entry per spatial axis of `x`.
fn kernel(cx_attrs: &crate::ir::Attrs, spatial: usize) -> Result<Vec<usize>, String> {
    let k = cx_attrs
        .ints("kernel_shape")?
        .ok_or("kernel_shape is required")?;
    if k.len() != spatial {
        return Err(format!(
            "kernel_shape has {} values, the input has {spatial} spatial axes",
            k.len()
        ));
    }
    k.iter()
        .map(|&v| {
            usize::try_from(v)
                .ok()
                .filter(|&v| v >= 1)
                .ok_or_else(|| format!("kernel_shape has {v}"))
        })
        .collect()
}

impl Op for Pool {
    fn schema(&self) -> &OpSchema {
        &self.schema
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        infer_blocked(cx, |cx| self.infer_plain(cx))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        eval_blocked(cx, |cx| self.eval_plain(cx))
    }
}

impl Pool {
    fn infer_plain(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        if self.kind == Kind::Max {
            // MaxPool also takes 8-bit integers, as ONNX does.
            require_dtype(
                x,
                0,
                |d| d.is_float() || matches!(d, DType::I8 | DType::U8),
                "a float type, i8 or u8",
            )?;
        } else {
            require_dtype(x, 0, is_float, "a float type")?;
        }
        if x.rank() < 3 {
            return Err(format!("X must be [N, C, D1, ...], got {x}"));
        }
        let kernel = kernel(cx.attrs, x.rank() - 2)?;
        if self.kind == Kind::Lp {
            norm_order(cx.attrs)?;
        }
        let input: Vec<Option<usize>> = x.shape.axes[2..].iter().map(|a| a.dim.fixed()).collect();
        let wins = windows(cx.attrs, &kernel, &input)?;
        let ceil = cx.attrs.int_or("ceil_mode", 0)? != 0;
        let order = cx.attrs.int_or("storage_order", 0)?;
        if !(0..=1).contains(&order) {
            return Err(format!("storage_order must be 0 or 1, got {order}"));
        }
        let mut shape = x.shape.clone();
        for (i, a) in shape.axes[2..].iter_mut().enumerate() {
            a.dim = match input[i] {
                Some(n) => Dim::Fixed(wins[i].outputs(n, ceil)?),
                None => cx.fresh_dim(0, i + 2),
            };
            a.name = None;
        }
        let y = TensorType::new(x.dtype, shape.clone());
        Ok(match self.kind {
            Kind::Max => vec![y, TensorType::new(DType::I64, shape)],
            Kind::Average | Kind::Lp => vec![y],
        })
    }

    fn eval_plain(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let xt = cx.input(0)?;
        let x = xt.to_f64_array();
        let input: Vec<usize> = x.shape()[2..].to_vec();
        let kernel = kernel(cx.attrs, input.len())?;
        let wins = windows(
            cx.attrs,
            &kernel,
            &input.iter().map(|&v| Some(v)).collect::<Vec<_>>(),
        )?;
        let ceil = cx.attrs.int_or("ceil_mode", 0)? != 0;
        let mut shape = x.shape()[..2].to_vec();
        for (w, &n) in wins.iter().zip(&input) {
            shape.push(w.outputs(n, ceil)?);
        }
        let include_pad = cx.attrs.int_or("count_include_pad", 0)? != 0;
        let col_major = cx.attrs.int_or("storage_order", 0)? != 0;
        let p = if self.kind == Kind::Lp {
            norm_order(cx.attrs)?
        } else {
            1.0
        };
        let mut y = ArrayD::<f64>::zeros(IxDyn(&shape));
        let mut at = ArrayD::<i64>::zeros(IxDyn(&shape));
        let mut xi = vec![0; x.ndim()];
        for (o, v) in y.indexed_iter_mut() {
            let o = o.slice();
            xi[0] = o[0];
            xi[1] = o[1];
            let (mut best, mut best_at, mut sum, mut count) =
                (f64::NEG_INFINITY, None, 0.0, 0usize);
            for tap in ndarray::indices(IxDyn(&kernel)) {
                let (mut inside, mut in_pad) = (true, true);
                for d in 0..kernel.len() {
                    match wins[d].source(o[2 + d], tap[d], input[d]) {
                        Some(p) => xi[2 + d] = p,
                        None => {
                            inside = false;
                            in_pad &= within_padding(&wins[d], o[2 + d], tap[d], input[d]);
                        }
                    }
                }
                if inside {
                    let val = x[IxDyn(&xi)];
                    count += 1;
                    sum += if self.kind == Kind::Lp {
                        val.abs().powf(p)
                    } else {
                        val
                    };
                    if val > best || best_at.is_none() {
                        best = val;
                        best_at = Some(xi.clone());
                    }
                } else if include_pad && in_pad {
                    // A tap on explicit padding counts as a zero.
                    count += 1;
                }
            }
            match self.kind {
                Kind::Average => {
                    *v = if count == 0 {
                        f64::NAN
                    } else {
                        sum / count as f64
                    }
                }
                Kind::Lp => *v = sum.powf(1.0 / p),
                Kind::Max => {
                    *v = best;
                    if let Some(p) = best_at {
                        at[IxDyn(o)] = flat_index(&p, x.shape(), col_major);
                    }
                }
            }
        }
        let y = Tensor::from_f64_array(xt.dtype(), y);
        Ok(match self.kind {
            Kind::Max => vec![y, Tensor::I64(at)],
            Kind::Average | Kind::Lp => vec![y],
        })
    }
}

/// Whether tap `k` at output `o` falls within the input or its explicit padding (not
/// past it, where a ceil-mode window may reach).
fn within_padding(w: &Window, o: usize, k: usize, n: usize) -> bool {
    let p = (o * w.stride + k * w.dilation) as i64 - w.pad_begin as i64;
    p >= -(w.pad_begin as i64) && p < (n + w.pad_end) as i64
}

/// ONNX's Indices: the flat index into X, row-major (or with the spatial axes
/// column-major for storage_order 1).
fn flat_index(p: &[usize], shape: &[usize], col_major: bool) -> i64 {
    let spatial: usize = shape[2..].iter().product();
    let mut idx = (p[0] * shape[1] + p[1]) * spatial;
    let k = shape.len() - 2;
    let (mut off, mut stride) = (0, 1);
    for j in 0..k {
        let d = if col_major {
            2 + j
        } else {
            shape.len() - 1 - j
        };
        off += p[d] * stride;
        stride *= shape[d];
    }
    idx += off;
    idx as i64
}

// ---------------------------------------------------------------- Global pools

struct GlobalPool {
    schema: OpSchema,
    kind: Kind,
}

impl Op for GlobalPool {
    fn schema(&self) -> &OpSchema {
        &self.schema
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        infer_blocked(cx, |cx| self.infer_plain(cx))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        eval_blocked(cx, |cx| self.eval_plain(cx))
    }
}

impl GlobalPool {
    fn infer_plain(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        require_dtype(x, 0, is_float, "a float type")?;
        if x.rank() < 3 {
            return Err(format!("X must be [N, C, D1, ...], got {x}"));
        }
        if self.kind == Kind::Lp {
            norm_order(cx.attrs)?;
        }
        let mut shape: Shape = x.shape.clone();
        for a in &mut shape.axes[2..] {
            a.dim = Dim::Fixed(1);
        }
        Ok(vec![TensorType::new(x.dtype, shape)])
    }

    fn eval_plain(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let xt = cx.input(0)?;
        let x = xt.to_f64_array();
        let s = x.shape();
        let spatial: usize = s[2..].iter().product();
        let std = x.as_standard_layout().into_owned();
        let flat = std.as_slice().expect("standard layout");
        let p = if self.kind == Kind::Lp {
            norm_order(cx.attrs)?
        } else {
            1.0
        };
        let v: Vec<f64> = flat
            .chunks(spatial.max(1))
            .take(s[0] * s[1])
            .map(|plane| match self.kind {
                Kind::Max => plane.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                Kind::Average => plane.iter().sum::<f64>() / spatial as f64,
                Kind::Lp => plane
                    .iter()
                    .map(|v| v.abs().powf(p))
                    .sum::<f64>()
                    .powf(1.0 / p),
            })
            .collect();
        let mut shape = s[..2].to_vec();
        shape.resize(s.len(), 1);
        // Zero-sized planes: `chunks` yields nothing, so fill by reduction identity.
        let v = if v.len() == s[0] * s[1] {
            v
        } else {
            vec![
                match self.kind {
                    Kind::Max => f64::NEG_INFINITY,
                    Kind::Average => f64::NAN,
                    Kind::Lp => 0.0,
                };
                s[0] * s[1]
            ]
        };
        Ok(vec![Tensor::from_f64s(xt.dtype(), &shape, &v)?])
    }
}

pub(crate) fn ops() -> Vec<&'static dyn Op> {
    vec![
        leak(Pool {
            schema: OpSchema {
                name: "MaxPool",
                family: "pool",
                inputs: &["X"],
                outputs: &["Y", "Indices"],
                attrs: MAX_POOL_ATTRS,
                doc: "Maximum over each window; padding never wins. Always has the Indices \
                      output (i64 flat indices into X, as ONNX defines them).",
                in_place: InPlace::No,
                origin: Origin::Onnx,
            },
            kind: Kind::Max,
        }),
        leak(Pool {
            schema: OpSchema {
                name: "AveragePool",
                family: "pool",
                inputs: &["X"],
                outputs: &["Y"],
                attrs: AVERAGE_POOL_ATTRS,
                doc: "Mean over each window: of the input elements only, or with \
                      count_include_pad of the explicit padding too.",
                in_place: InPlace::No,
                origin: Origin::Onnx,
            },
            kind: Kind::Average,
        }),
        leak(Pool {
            schema: OpSchema {
                name: "LpPool",
                family: "pool",
                inputs: &["X"],
                outputs: &["Y"],
                attrs: LP_POOL_ATTRS,
                doc: "The p-norm of each window, (sum |x|^p)^(1/p); padding adds nothing.",
                in_place: InPlace::No,
                origin: Origin::Onnx,
            },
            kind: Kind::Lp,
        }),
        leak(GlobalPool {
            schema: OpSchema {
                name: "GlobalLpPool",
                family: "pool",
                inputs: &["X"],
                outputs: &["Y"],
                attrs: GLOBAL_LP_POOL_ATTRS,
                doc: "The p-norm over all spatial axes, kept as size 1.",
                in_place: InPlace::No,
                origin: Origin::Onnx,
            },
            kind: Kind::Lp,
        }),
        leak(GlobalPool {
            schema: OpSchema {
                name: "GlobalAveragePool",
                family: "pool",
                inputs: &["X"],
                outputs: &["Y"],
                attrs: &[BLOCK_ATTR],
                doc: "Mean over all spatial axes, kept as size 1.",
                in_place: InPlace::No,
                origin: Origin::Onnx,
            },
            kind: Kind::Average,
        }),
        leak(GlobalPool {
            schema: OpSchema {
                name: "GlobalMaxPool",
                family: "pool",
                inputs: &["X"],
                outputs: &["Y"],
                attrs: &[BLOCK_ATTR],
                doc: "Maximum over all spatial axes, kept as size 1.",
                in_place: InPlace::No,
                origin: Origin::Onnx,
            },
            kind: Kind::Max,
        }),
    ]
}
