//! Selecting elements by value or position: TopK (the k largest or smallest along an
//! axis), Unique, NonZero (the coordinates of non-zero elements), NonMaxSuppression
//! (boxes kept after overlap suppression) and Trilu (the upper or lower triangle).
use crate::ir::ops::{InPlace, Origin};
use ndarray::{ArrayD, Axis, Dimension, IxDyn};

use super::util::{out, remap};
use super::{leak, AttrSpec, EvalCtx, InferCtx, Op, OpSchema};
use crate::ir::shape::norm_axis;
use crate::ir::{AttrKind, DType, Dim, Shape, TensorType};
use crate::match_tensor;
use crate::tensor::{Elem, Tensor};

// ---------------------------------------------------------------- TopK

/// The order TopK ranks values by: numbers as usual (-0 equal to 0), NaN above every
/// number, as the ONNX reference's sort has it. A total order, so any sort agrees.
fn topk_order(a: f64, b: f64) -> std::cmp::Ordering {
    a.partial_cmp(&b)
        .unwrap_or_else(|| a.is_nan().cmp(&b.is_nan()))
}

/// TopK's order on `T`: floats by [`topk_order`], integers exactly (not through f64,
/// which would tie 64-bit values above 2^53).
pub(crate) fn topk_cmp<T: Elem>(a: T, b: T) -> std::cmp::Ordering {
    if T::DTYPE.is_float() {
        topk_order(a.to_f64(), b.to_f64())
    } else {
        unique_key(a).cmp(&unique_key(b))
    }
}

/// The indices of the `k` best of each lane of `a` along `axis`, best first.
fn topk_indices<T: Elem>(a: &ArrayD<T>, axis: usize, k: usize, largest: bool) -> ArrayD<i64> {
    let mut shape = a.shape().to_vec();
    shape[axis] = k;
    let mut idxs = ArrayD::<i64>::zeros(IxDyn(&shape));
    for (lane, mut il) in a
        .lanes(Axis(axis))
        .into_iter()
        .zip(idxs.lanes_mut(Axis(axis)))
    {
        let mut order: Vec<usize> = (0..lane.len()).collect();
        // A stable sort keeps equal values in index order.
        order.sort_by(|&i, &j| {
            let c = topk_cmp(lane[i], lane[j]);
            if largest {
                c.reverse()
            } else {
                c
            }
        });
        for (slot, &i) in order.iter().take(k).enumerate() {
            il[slot] = i as i64;
        }
    }
    idxs
}

struct TopK;

const TOP_K: OpSchema = OpSchema {
    name: "TopK",
    family: "gather",
    inputs: &["X", "K"],
    outputs: &["Values", "Indices"],
    attrs: &[
        AttrSpec::opt("axis", AttrKind::Int, "-1"),
        AttrSpec::opt("largest", AttrKind::Int, "1"),
        AttrSpec::opt("sorted", AttrKind::Int, "1"),
    ],
    doc: "The K largest (or smallest) values along `axis` and their i64 indices, best \
          first; equal values keep index order. Always sorted (sorted = 0 allows any order).",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

impl Op for TopK {
    fn schema(&self) -> &OpSchema {
        &TOP_K
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (x, k) = (cx.input(0)?, cx.input(1)?);
        if !x.dtype.is_numeric() {
            return Err(format!("X must be numeric, got {}", x.dtype));
        }
        if k.dtype != DType::I64 || k.num_elements().is_some_and(|n| n != 1) {
            return Err(format!("K must be a one-element i64 tensor, got {k}"));
        }
        let axis = x.shape.norm_axis(cx.attrs.int_or("axis", -1)?)?;
        let mut shape = x.shape.clone();
        shape.axes[axis].dim = match cx.const_input(1) {
            Some(c) => {
                let k = c.to_i64_vec()[0];
                if k < 0 || x.shape.dim(axis).fixed().is_some_and(|d| k as usize > d) {
                    return Err(format!(
                        "K = {k} is out of range for axis size {}",
                        x.shape.dim(axis)
                    ));
                }
                Dim::Fixed(k as usize)
            }
            None => cx.fresh_dim(0, axis),
        };
        Ok(vec![
            TensorType::new(x.dtype, shape.clone()),
            TensorType::new(DType::I64, shape),
        ])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let k = cx.input(1)?.to_i64_vec()[0];
        let axis = norm_axis(cx.attrs.int_or("axis", -1)?, x.rank())?;
        let d = x.shape()[axis];
        if k < 0 || k as usize > d {
            return Err(format!("K = {k} is out of range for axis size {d}"));
        }
        let k = k as usize;
        let largest = cx.attrs.int_or("largest", 1)? != 0;
        let mut shape = x.shape().to_vec();
        shape[axis] = k;
        let idxs = match_tensor!(x, a => topk_indices(a, axis, k, largest));
        // The values gathered from X: u64 above 2^63 stays exact.
        let values = match_tensor!(x, a => remap(a, &shape, Elem::from_i64(0), |o, src| {
            src.extend(o);
            src[axis] = idxs[IxDyn(o)] as usize;
            true
        }));
        Ok(vec![values, Tensor::I64(idxs)])
    }
}

// ---------------------------------------------------------------- Unique

struct Unique;

const UNIQUE: OpSchema = OpSchema {
    name: "Unique",
    family: "gather",
    inputs: &["X"],
    outputs: &["Y", "indices", "inverse_indices", "counts"],
    attrs: &[
        AttrSpec::opt("axis", AttrKind::Int, "none: the flattened input"),
        AttrSpec::opt("sorted", AttrKind::Int, "1"),
    ],
    doc: "The distinct elements of X (or its distinct slices along `axis`), ascending \
          when sorted, else in order of first occurrence; indices (i64) of each one's \
          first occurrence, inverse_indices mapping every element (slice) of X to its \
          entry of Y, and counts. Always has all four outputs.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

/// An element's exact, totally ordered integer key: a float by its bits (with -0 as
/// 0), a 64-bit integer unwrapped.
pub(crate) fn unique_key<T: Elem>(v: T) -> i128 {
    if T::DTYPE.is_float() {
        let v = v.to_f64();
        let b = (if v == 0.0 { 0.0 } else { v }).to_bits() as i64;
        (if b < 0 { b ^ i64::MAX } else { b }) as i128
    } else if T::DTYPE == DType::U64 {
        v.to_i64() as u64 as i128
    } else {
        v.to_i64() as i128
    }
}

/// X's elements (or slices along `axis`), each as a list of [`unique_key`]s.
fn unique_keys(x: &Tensor, axis: Option<usize>) -> Result<Vec<Vec<i128>>, String> {
    let keys: ArrayD<i128> = match_tensor!(x, a => a.mapv(unique_key));
    Ok(match axis {
        None => keys.iter().map(|&v| vec![v]).collect(),
        Some(ax) => keys
            .axis_iter(Axis(ax))
            .map(|s| s.iter().copied().collect())
            .collect(),
    })
}

impl Op for Unique {
    fn schema(&self) -> &OpSchema {
        &UNIQUE
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        if !x.dtype.is_numeric() {
            return Err(format!("X must be numeric, got {}", x.dtype));
        }
        let u = cx.fresh_dim(0, 0);
        let (y, inverse) = match cx.attrs.int("axis")? {
            None => (
                Shape::new([u.clone()]),
                Shape::new([x
                    .shape
                    .num_elements()
                    .map_or(cx.fresh_dim(2, 0), Dim::Fixed)]),
            ),
            Some(a) => {
                let ax = x.shape.norm_axis(a)?;
                let mut y = x.shape.clone();
                y.axes[ax].dim = cx.fresh_dim(0, ax);
                y.axes[ax].name = None;
                let u = y.axes[ax].dim.clone();
                return Ok(vec![
                    TensorType::new(x.dtype, y),
                    TensorType::new(DType::I64, Shape::new([u.clone()])),
                    TensorType::new(DType::I64, Shape::new([x.shape.dim(ax).clone()])),
                    TensorType::new(DType::I64, Shape::new([u])),
                ]);
            }
        };
        Ok(vec![
            TensorType::new(x.dtype, y),
            TensorType::new(DType::I64, Shape::new([u.clone()])),
            TensorType::new(DType::I64, inverse),
            TensorType::new(DType::I64, Shape::new([u])),
        ])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let axis = cx
            .attrs
            .int("axis")?
            .map(|a| norm_axis(a, x.rank()))
            .transpose()?;
        let sorted = cx.attrs.int_or("sorted", 1)? != 0;
        let keys = unique_keys(x, axis)?;
        // First occurrences, in order of appearance.
        let mut first: Vec<usize> = vec![];
        let mut slot: Vec<usize> = Vec::with_capacity(keys.len());
        for (i, k) in keys.iter().enumerate() {
            match first.iter().position(|&f| keys[f] == *k) {
                Some(j) => slot.push(j),
                None => {
                    slot.push(first.len());
                    first.push(i);
                }
            }
        }
        // Output order of the distinct entries.
        let mut order: Vec<usize> = (0..first.len()).collect();
        if sorted {
            order.sort_by(|&a, &b| keys[first[a]].cmp(&keys[first[b]]));
        }
        let mut rank_of = vec![0; order.len()];
        for (r, &j) in order.iter().enumerate() {
            rank_of[j] = r;
        }
        let picks: Vec<usize> = order.iter().map(|&j| first[j]).collect();
        let mut counts = vec![0i64; order.len()];
        for &j in &slot {
            counts[rank_of[j]] += 1;
        }
        let inverse: Vec<i64> = slot.iter().map(|&j| rank_of[j] as i64).collect();
        let n = picks.len();
        let mut shape = x.shape().to_vec();
        let ax = match axis {
            Some(ax) => ax,
            None => {
                shape = vec![x.len()];
                0
            }
        };
        shape[ax] = n;
        let flat;
        let x = match axis {
            Some(_) => x,
            None => {
                flat = crate::map_tensor!(x.clone(), a => a
                    .as_standard_layout()
                    .into_owned()
                    .into_shape_with_order(IxDyn(&[x.len()]))
                    .map_err(|e| e.to_string())?);
                &flat
            }
        };
        let src = |o: &[usize], p: &mut Vec<usize>| {
            p.extend_from_slice(o);
            p[ax] = picks[o[ax]];
            true
        };
        let y = match_tensor!(x, a => remap(a, &shape, Default::default(), src));
        let ints = |v: Vec<i64>| Tensor::from_vec(&[v.len()], v);
        Ok(vec![
            y,
            ints(picks.iter().map(|&i| i as i64).collect())?,
            ints(inverse)?,
            ints(counts)?,
        ])
    }
}

// ---------------------------------------------------------------- NonZero

struct NonZero;

const NON_ZERO: OpSchema = OpSchema {
    name: "NonZero",
    family: "gather",
    inputs: &["X"],
    outputs: &["Y"],
    attrs: &[],
    doc: "The indices of the non-zero elements, as i64 [rank, count] in row-major order.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

impl Op for NonZero {
    fn schema(&self) -> &OpSchema {
        &NON_ZERO
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        let shape = Shape::new([Dim::Fixed(x.rank()), cx.fresh_dim(0, 1)]);
        Ok(out(DType::I64, shape))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let a = x.to_f64_array();
        let hits: Vec<Vec<usize>> = a
            .indexed_iter()
            .filter(|(_, &v)| v != 0.0)
            .map(|(i, _)| i.slice().to_vec())
            .collect();
        let (r, n) = (x.rank(), hits.len());
        let mut v = vec![0i64; r * n];
        for (col, idx) in hits.iter().enumerate() {
            for (row, &i) in idx.iter().enumerate() {
                v[row * n + col] = i as i64;
            }
        }
        Ok(vec![Tensor::from_vec(&[r, n], v)?])
    }
}

// ---------------------------------------------------------------- NonMaxSuppression

struct Nms;

const NMS: OpSchema = OpSchema {
    name: "NonMaxSuppression",
    family: "gather",
    inputs: &[
        "boxes",
        "scores",
        "max_output_boxes_per_class?",
        "iou_threshold?",
        "score_threshold?",
    ],
    outputs: &["selected_indices"],
    attrs: &[AttrSpec::opt("center_point_box", AttrKind::Int, "0")],
    doc: "Greedy non-maximum suppression per batch and class: boxes [B, N, 4], scores \\
          [B, C, N]; returns i64 [selected, 3] rows (batch, class, box), best score first.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

/// A box as (y1, x1, y2, x2) with y1 <= y2 and x1 <= x2.
fn corners(b: &[f64], center: bool) -> [f64; 4] {
    if center {
        let (xc, yc, w, h) = (b[0], b[1], b[2], b[3]);
        [yc - h / 2.0, xc - w / 2.0, yc + h / 2.0, xc + w / 2.0]
    } else {
        [
            b[0].min(b[2]),
            b[1].min(b[3]),
            b[0].max(b[2]),
            b[1].max(b[3]),
        ]
    }
}

fn iou(a: [f64; 4], b: [f64; 4]) -> f64 {
    let h = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
    let w = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
    let inter = h * w;
    let union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter;
    if union <= 0.0 {
        0.0
    } else {
        inter / union
    }
}

impl Op for Nms {
    fn schema(&self) -> &OpSchema {
        &NMS
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (boxes, scores) = (cx.input(0)?, cx.input(1)?);
        if boxes.rank() != 3 || scores.rank() != 3 || !boxes.dtype.is_float() {
            return Err(format!(
                "boxes must be float [B, N, 4] and scores [B, C, N], got {boxes} and {scores}"
            ));
        }
        Ok(out(
            DType::I64,
            Shape::new([cx.fresh_dim(0, 0), Dim::Fixed(3)]),
        ))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let boxes = cx.input(0)?.to_f64_array();
        let scores = cx.input(1)?.to_f64_array();
        let scalar = |i: usize, default: f64| {
            cx.opt_input(i)
                .and_then(|t| t.to_f64_vec().first().copied())
                .unwrap_or(default)
        };
        let max_out = scalar(2, 0.0).max(0.0) as usize;
        let iou_threshold = scalar(3, 0.0);
        let score_threshold = cx
            .opt_input(4)
            .and_then(|t| t.to_f64_vec().first().copied());
        let center = cx.attrs.int_or("center_point_box", 0)? == 1;
        let (nb, n) = (boxes.shape()[0], boxes.shape()[1]);
        let (sb, nc, sn) = (scores.shape()[0], scores.shape()[1], scores.shape()[2]);
        if boxes.shape()[2] != 4 || sb != nb || sn != n {
            return Err(format!(
                "boxes {:?} and scores {:?} do not match",
                boxes.shape(),
                scores.shape()
            ));
        }
        let mut rows: Vec<i64> = vec![];
        for b in 0..nb {
            let bx: Vec<[f64; 4]> = (0..n)
                .map(|i| {
                    corners(
                        &[
                            boxes[[b, i, 0]],
                            boxes[[b, i, 1]],
                            boxes[[b, i, 2]],
                            boxes[[b, i, 3]],
                        ],
                        center,
                    )
                })
                .collect();
            for c in 0..nc {
                let mut cand: Vec<usize> = (0..n)
                    .filter(|&i| score_threshold.is_none_or(|t| scores[[b, c, i]] > t))
                    .collect();
                // Stable: equal scores keep box order.
                cand.sort_by(|&i, &j| {
                    scores[[b, c, j]]
                        .partial_cmp(&scores[[b, c, i]])
                        .unwrap_or(std::cmp::Ordering::Equal)
                });
                let mut kept: Vec<usize> = vec![];
                for i in cand {
                    if kept.len() >= max_out {
                        break;
                    }
                    if kept.iter().all(|&k| iou(bx[k], bx[i]) <= iou_threshold) {
                        kept.push(i);
                        rows.extend([b as i64, c as i64, i as i64]);
                    }
                }
            }
        }
        Ok(vec![Tensor::from_vec(&[rows.len() / 3, 3], rows)?])
    }
}

// ---------------------------------------------------------------- Trilu

struct Trilu;

const TRILU: OpSchema = OpSchema {
    name: "Trilu",
    family: "gather",
    inputs: &["input", "k?"],
    outputs: &["output"],
    attrs: &[AttrSpec::opt("upper", AttrKind::Int, "1")],
    doc: "Keeps the upper (or lower) triangle of the last two axes, from diagonal k (a \
          scalar, default 0); zeros elsewhere.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

impl Op for Trilu {
    fn schema(&self) -> &OpSchema {
        &TRILU
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        if x.rank() < 2 {
            return Err(format!("input must have rank >= 2, got {x}"));
        }
        if let Some(k) = cx.opt_input(1) {
            if k.dtype != DType::I64 || k.num_elements().is_some_and(|n| n != 1) {
                return Err(format!("k must be one i64 value, got {k}"));
            }
        }
        Ok(vec![x.clone()])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let k = cx
            .opt_input(1)
            .map_or(0, |t| t.to_i64_vec().first().copied().unwrap_or(0));
        let upper = cx.attrs.int_or("upper", 1)? != 0;
        let r = x.rank();
        let shape = x.shape().to_vec();
        let keep = move |o: &[usize]| {
            let (i, j) = (o[r - 2] as i64, o[r - 1] as i64);
            if upper {
                j - i >= k
            } else {
                j - i <= k
            }
        };
        let y = match_tensor!(x, a => remap(a, &shape, Elem::from_i64(0), |o, src| {
            src.extend(o);
            keep(o)
        }));
        Ok(vec![y])
    }
}

pub fn ops() -> Vec<&'static dyn Op> {
    vec![
        leak(Nms),
        leak(Trilu),
        leak(NonZero),
        leak(Unique),
        leak(TopK),
    ]
}
