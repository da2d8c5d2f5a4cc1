//! AffineGrid (ONNX 20), the sampling grid of an affine transform, and GridSample: samples X [N, C, D1, ...] at the normalized coordinates of
//! grid [N, O1, ..., r] (x first, the last spatial axis), by nearest, linear or cubic
//! interpolation, with zeros, border or reflection padding. The reference follows the
//! ONNX reference implementation point by point, in f64.
use crate::ir::ops::{InPlace, Origin};
use ndarray::{ArrayD, Dimension, IxDyn};

use super::resize::{cubic_weights, interpolation_mode, Mode};
use super::{leak, AttrSpec, EvalCtx, InferCtx, Op, OpSchema};
use crate::ir::{AttrKind, Attrs, Dim, Shape, TensorType};
use crate::tensor::Tensor;

struct GridSample;

const GRID_SAMPLE: OpSchema = OpSchema {
    name: "GridSample",
    family: "resize",
    inputs: &["X", "grid"],
    outputs: &["Y"],
    attrs: &[
        AttrSpec::opt("align_corners", AttrKind::Int, "0"),
        AttrSpec::opt("mode", AttrKind::String, "linear"),
        AttrSpec::opt("padding_mode", AttrKind::String, "zeros"),
    ],
    doc: "Y[n, c, o...] = X[n, c] sampled at grid[n, o...] (coordinates in [-1, 1], the \
          last spatial axis first; align_corners maps -1 and 1 to the corner pixels' \
          centres). mode nearest | linear | cubic (Keys, a = -0.75); padding_mode zeros \
          | border | reflection for points outside.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

#[derive(Clone, Copy, PartialEq)]
enum Padding {
    Zeros,
    Border,
    Reflection,
}

fn settings(attrs: &Attrs) -> Result<(Mode, Padding, bool), String> {
    let mode = interpolation_mode(attrs, "linear")?;
    let padding = match attrs.string_or("padding_mode", "zeros")? {
        "zeros" => Padding::Zeros,
        "border" => Padding::Border,
        "reflection" => Padding::Reflection,
        p => {
            return Err(format!(
                "padding_mode must be zeros, border or reflection, got '{p}'"
            ))
        }
    };
    Ok((mode, padding, attrs.int_or("align_corners", 0)? != 0))
}

/// `x` reflected into `[lo, hi]` as often as it takes (the CPU backend's GridSample
/// kernel calls it too).
pub(crate) fn reflect(x: f64, lo: f64, hi: f64) -> f64 {
    let range = hi - lo;
    if x < lo {
        let d = lo - x;
        let n = (d / range).trunc();
        let r = d - n * range;
        if n as i64 % 2 == 0 {
            lo + r
        } else {
            hi - r
        }
    } else if x > hi {
        let d = x - hi;
        let n = (d / range).trunc();
        let r = d - n * range;
        if n as i64 % 2 == 0 {
            hi - r
        } else {
            lo + r
        }
    } else {
        x
    }
}

impl Op for GridSample {
    fn schema(&self) -> &OpSchema {
        &GRID_SAMPLE
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (x, grid) = (cx.input(0)?, cx.input(1)?);
        settings(cx.attrs)?;
        if !x.dtype.is_float() || !grid.dtype.is_float() {
            return Err(format!(
                "X and grid must be float, got {} and {}",
                x.dtype, grid.dtype
            ));
        }
        let spatial = x.rank().saturating_sub(2);
        if spatial < 1 || grid.rank() != x.rank() {
            return Err(format!("X must be [N, C, D1, ...] and grid [N, O1, ..., r] of its rank, got {x} and {grid}"));
        }
        if let Some(r) = grid.shape.dim(grid.rank() - 1).fixed() {
            if r != spatial {
                return Err(format!(
                    "grid's last axis has {r} coordinates for {spatial} spatial axes"
                ));
            }
        }
        let mut dims: Vec<Dim> = vec![x.shape.dim(0).clone(), x.shape.dim(1).clone()];
        dims.extend(grid.shape.dims()[1..grid.rank() - 1].iter().cloned());
        Ok(vec![TensorType::new(x.dtype, Shape::new(dims))])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let (xt, gt) = (cx.input(0)?, cx.input(1)?);
        let (mode, padding, align) = settings(cx.attrs)?;
        let (x, grid) = (xt.to_f64_array(), gt.to_f64_array());
        let dims: Vec<usize> = x.shape()[2..].to_vec();
        let r = dims.len();
        let gs = grid.shape().to_vec();
        if gs[0] != x.shape()[0] || gs[gs.len() - 1] != r {
            return Err(format!("grid {gs:?} does not fit X {:?}", x.shape()));
        }
        let (n_batch, channels) = (x.shape()[0], x.shape()[1]);
        let mut shape = vec![n_batch, channels];
        shape.extend_from_slice(&gs[1..gs.len() - 1]);
        super::util::check_size(&shape)?;
        // The range a coordinate may take before padding applies.
        let bounds: Vec<(f64, f64)> = dims
            .iter()
            .map(|&d| {
                if align {
                    (0.0, d as f64 - 1.0)
                } else {
                    (-0.5, d as f64 - 0.5)
                }
            })
            .collect();
        let mut y = ArrayD::<f64>::zeros(IxDyn(&shape));
        let out_points: Vec<usize> = gs[1..gs.len() - 1].to_vec();
        for n in 0..n_batch {
            for o in ndarray::indices(IxDyn(&out_points)) {
                let o = o.slice();
                // Pixel coordinates, in X's axis order.
                let mut p: Vec<f64> = (0..r)
                    .map(|i| {
                        let mut at = vec![n];
                        at.extend_from_slice(o);
                        at.push(r - 1 - i);
                        let v = grid[IxDyn(&at)];
                        let len = dims[i] as f64;
                        if align {
                            (v + 1.0) / 2.0 * (len - 1.0)
                        } else {
                            ((v + 1.0) * len - 1.0) / 2.0
                        }
                    })
                    .collect();
                if mode == Mode::Nearest {
                    p.iter_mut().for_each(|v| *v = v.round_ties_even());
                }
                for (i, v) in p.iter_mut().enumerate() {
                    let (lo, hi) = bounds[i];
                    if *v < lo || *v > hi {
                        match padding {
                            Padding::Border => *v = v.clamp(0.0, dims[i] as f64 - 1.0),
                            Padding::Reflection => *v = reflect(*v, lo, hi),
                            Padding::Zeros => {}
                        }
                    }
                }
                // Each axis's taps: (pixel index, weight).
                let taps: Vec<Vec<(i64, f64)>> = p
                    .iter()
                    .map(|&v| {
                        let base = v.floor();
                        let t = v - base;
                        let b = base as i64;
                        match mode {
                            Mode::Nearest => vec![(v as i64, 1.0)],
                            Mode::Linear => vec![(b, 1.0 - t), (b + 1, t)],
                            Mode::Cubic => {
                                let w = cubic_weights(t, -0.75);
                                (0..4).map(|k| (b - 1 + k as i64, w[k as usize])).collect()
                            }
                        }
                    })
                    .collect();
                let counts: Vec<usize> = taps.iter().map(|t| t.len()).collect();
                for c in 0..channels {
                    let mut sum = 0.0;
                    'tap: for combo in ndarray::indices(IxDyn(&counts)) {
                        let combo = combo.slice();
                        let mut at = vec![n, c];
                        let mut weight = 1.0;
                        for (i, &k) in combo.iter().enumerate() {
                            let (idx, w) = taps[i][k];
                            weight *= w;
                            let d = dims[i] as i64;
                            let idx = match padding {
                                Padding::Zeros if idx < 0 || idx >= d => continue 'tap,
                                Padding::Zeros => idx,
                                Padding::Border => idx.clamp(0, d - 1),
                                Padding::Reflection => {
                                    let (lo, hi) = bounds[i];
                                    (reflect(idx as f64, lo, hi) as i64).clamp(0, d - 1)
                                }
                            };
                            at.push(idx as usize);
                        }
                        sum += weight * x[IxDyn(&at)];
                    }
                    let mut out = vec![n, c];
                    out.extend_from_slice(o);
                    y[IxDyn(&out)] = sum;
                }
            }
        }
        Ok(vec![Tensor::from_f64_array(xt.dtype(), y)])
    }
}

// ---------------------------------------------------------------- AffineGrid

struct AffineGrid;

const AFFINE_GRID: OpSchema = OpSchema {
    name: "AffineGrid",
    family: "resize",
    inputs: &["theta", "size"],
    outputs: &["grid"],
    attrs: &[AttrSpec::opt("align_corners", AttrKind::Int, "0")],
    doc: "The normalized coordinates, theta [N, 2, 3] (or [N, 3, 4]) times (x, y[, z], 1), \
          of every pixel of an output of size [N, C, H, W] (or [N, C, D, H, W]): grid \
          [N, H, W, 2] (or [N, D, H, W, 3]) for GridSample.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

impl Op for AffineGrid {
    fn schema(&self) -> &OpSchema {
        &AFFINE_GRID
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (theta, size) = (cx.input(0)?, cx.input(1)?);
        if !theta.dtype.is_float() || theta.rank() != 3 {
            return Err(format!(
                "theta must be float [N, 2, 3] or [N, 3, 4], got {theta}"
            ));
        }
        let spatial = match size.shape.dim(0).fixed() {
            Some(n @ (4 | 5)) if size.rank() == 1 => n - 2,
            _ => return Err(format!("size must be an i64 vector of 4 or 5, got {size}")),
        };
        let mut dims = vec![theta.shape.dim(0).clone()];
        match cx.const_input(1).map(|t| t.to_i64_vec()) {
            Some(v) => {
                for &d in &v[2..] {
                    dims.push(Dim::Fixed(
                        usize::try_from(d).map_err(|_| format!("size has {d}"))?,
                    ));
                }
            }
            None => dims.extend((0..spatial).map(|a| cx.fresh_dim(0, a + 1))),
        }
        dims.push(Dim::Fixed(spatial));
        Ok(vec![TensorType::new(theta.dtype, Shape::new(dims))])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let tt = cx.input(0)?;
        let theta = tt.to_f64_array();
        let size = cx.input(1)?.to_i64_vec();
        let r = size.len() - 2;
        let n = theta.shape()[0];
        if theta.shape()[1..] != [r, r + 1] || size[0] as usize != n || size.iter().any(|&d| d < 0)
        {
            return Err(format!(
                "theta {:?} does not fit size {size:?}",
                theta.shape()
            ));
        }
        let align = cx.attrs.int_or("align_corners", 0)? != 0;
        let dims: Vec<usize> = size[2..].iter().map(|&d| d as usize).collect();
        // The normalized coordinate of index i along an axis of length len.
        let coord = |i: usize, len: usize| -> f64 {
            if align {
                if len == 1 {
                    -1.0
                } else {
                    -1.0 + 2.0 * i as f64 / (len - 1) as f64
                }
            } else {
                -1.0 + (2 * i + 1) as f64 / len as f64
            }
        };
        let mut shape = vec![n];
        shape.extend_from_slice(&dims);
        shape.push(r);
        super::util::check_size(&shape)?;
        let mut grid = ArrayD::<f64>::zeros(IxDyn(&shape));
        for b in 0..n {
            for p in ndarray::indices(IxDyn(&dims)) {
                let p = p.slice();
                // (x, y[, z], 1): x runs along the last axis.
                let mut h: Vec<f64> = (0..r)
                    .map(|k| coord(p[r - 1 - k], dims[r - 1 - k]))
                    .collect();
                h.push(1.0);
                for row in 0..r {
                    let v: f64 = (0..=r).map(|c| theta[[b, row, c]] * h[c]).sum();
                    let mut at = vec![b];
                    at.extend_from_slice(p);
                    at.push(row);
                    grid[IxDyn(&at)] = v;
                }
            }
        }
        Ok(vec![Tensor::from_f64_array(tt.dtype(), grid)])
    }
}

pub(crate) fn ops() -> Vec<&'static dyn Op> {
    vec![leak(GridSample), leak(AffineGrid)]
}
