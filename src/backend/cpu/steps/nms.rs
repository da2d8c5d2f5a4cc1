//! Steps whose output extent depends on the data (see `kernels::nms`): each declares an
//! upper bound for its output, which lowering places in the arena, and reports the
//! actual extent when it runs (see `cpu::tail`).
use super::Build;
use crate::backend::cpu::kernels::nms::{
    count_non_zero, non_max_suppression, non_zero, NmsLimits, NmsShape,
};
use crate::backend::cpu::program::{Cx, Loc, Slot, Source};
use crate::ir::ops::select::unique_key;
use crate::ir::shape::norm_axis;
use crate::ir::{Attrs, DType, Dim, TensorType};
use crate::tensor::Elem;
use crate::with_dtype;

/// The size that bounds the extent of a node this module has a step for (`None`
/// otherwise): its outputs' one dynamic axis each.
pub(crate) fn bound(
    op: &str,
    attrs: &Attrs,
    ins: &[Option<&TensorType>],
    consts: &[Option<i64>],
) -> Option<usize> {
    let dims = |k: usize| ins.get(k).copied().flatten()?.static_dims();
    match op {
        "NonMaxSuppression" => {
            let (b, s) = (dims(0)?, dims(1)?);
            let (batches, classes, boxes) = (*s.first()?, *s.get(1)?, *b.get(1)?);
            // Without a constant limit, every box of every class may be kept.
            let per_class = match consts.get(2).copied().flatten() {
                Some(m) => usize::try_from(m.max(0)).ok()?.min(boxes),
                None => boxes,
            };
            batches.checked_mul(classes)?.checked_mul(per_class)
        }
        "NonZero" => elements(&dims(0)?),
        // At most every element (or slice along the axis) is distinct.
        "Unique" => {
            let x = dims(0)?;
            match attrs.int("axis").ok()? {
                None => elements(&x),
                Some(a) => x.get(norm_axis(a, x.len()).ok()?).copied(),
            }
        }
        _ => None,
    }
}

/// The step for `b`'s node, whose output slot has the upper-bound shape; `None` when
/// its dtypes or shapes are not ones the kernels cover.
pub(crate) fn build(b: &Build) -> Result<Option<Box<dyn Source>>, String> {
    match b.node.op.as_str() {
        "NonMaxSuppression" => build_nms(b),
        "NonZero" => build_non_zero(b),
        "Unique" => build_unique(b),
        _ => Ok(None),
    }
}

fn elements(dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
}

struct Nms {
    boxes: Slot,
    scores: Slot,
    max_per_class: Option<Slot>,
    iou_threshold: Option<Slot>,
    score_threshold: Option<Slot>,
    shape: NmsShape,
    candidates: Loc,
    kept: Loc,
    kept_len: usize,
    out: Slot,
}

fn build_nms(b: &Build) -> Result<Option<Box<dyn Source>>, String> {
    let (Some(boxes), Some(scores)) = (b.input(0).cloned(), b.input(1).cloned()) else {
        return Ok(None);
    };
    let scalar = |k: usize, dtype: DType| match b.input(k) {
        // An empty operand means the default, as the reference reads it.
        Some(s) if s.elements() == 0 => Ok(None),
        Some(s) if s.dtype == dtype => Ok(Some(s.clone())),
        Some(_) => Err(()),
        None => Ok(None),
    };
    let (Ok(max_per_class), Ok(iou_threshold), Ok(score_threshold)) = (
        scalar(2, DType::I64),
        scalar(3, DType::F32),
        scalar(4, DType::F32),
    ) else {
        return Ok(None);
    };
    let fits = boxes.dtype.is_float()
        && scores.dtype == boxes.dtype
        && boxes.shape.len() == 3
        && scores.shape.len() == 3
        && boxes.shape[2] == 4
        && boxes.shape[0] == scores.shape[0]
        && boxes.shape[1] == scores.shape[2];
    if !fits {
        return Ok(None);
    }
    let shape = NmsShape {
        batches: scores.shape[0],
        classes: scores.shape[1],
        boxes: boxes.shape[1],
        center_point_box: b.node.attrs.int_or("center_point_box", 0)? == 1,
    };
    let out = b.outs[0].clone();
    let per_class_bound = shape
        .batches
        .checked_mul(shape.classes)
        .and_then(|bc| out.shape[0].checked_div(bc))
        .unwrap_or(0);
    let kept_len = per_class_bound.min(shape.boxes);
    // Candidates, then the kept boxes of one class, in the step's scratch.
    let cand_bytes = shape.boxes.checked_mul(4).ok_or("box count overflows")?;
    let cand_bytes = cand_bytes.next_multiple_of(crate::memory::ALIGN);
    let Loc::Arena(at) = b.scratch(cand_bytes + kept_len * 4) else {
        unreachable!("the scratch region is in the arena")
    };
    Ok(Some(Box::new(Nms {
        boxes,
        scores,
        max_per_class,
        iou_threshold,
        score_threshold,
        shape,
        candidates: Loc::Arena(at),
        kept: Loc::Arena(at + cand_bytes),
        kept_len,
        out,
    })))
}

impl Source for Nms {
    unsafe fn run(&self, cx: &Cx) -> Result<usize, String> {
        // SAFETY: a threshold slot is kept only when it holds at least one f32 (build's
        // `scalar`), of which this reads the first.
        let f32_at = |s: &Option<Slot>| s.as_ref().map(|s| f64::from(unsafe { *cx.f32(s) }));
        let max_per_class = match &self.max_per_class {
            Some(s) => {
                // SAFETY: max_output_boxes_per_class is kept only as a non-empty i64 slot.
                let m = unsafe { *(cx.ptr(s.loc) as *const i64) };
                usize::try_from(m.max(0)).unwrap_or(usize::MAX)
            }
            None => 0,
        };
        let limits = NmsLimits {
            max_per_class,
            iou_threshold: f32_at(&self.iou_threshold).unwrap_or(0.0),
            score_threshold: f32_at(&self.score_threshold),
        };
        // SAFETY: the boxes and scores slots hold boxes.dtype (build checked).
        Ok(unsafe { with_dtype!(self.boxes.dtype, suppress(self, cx, limits)) })
    }
    fn kind(&self) -> &'static str {
        "nms"
    }
}

/// The suppression on boxes and scores of `T`; the number of rows written.
///
/// # Safety
/// The Kernel::run contract, the boxes and scores slots holding `T`s.
unsafe fn suppress<T: Elem>(s: &Nms, cx: &Cx, limits: NmsLimits) -> usize {
    let n = s.shape.boxes;
    let boxes_p = cx.ptr(s.boxes.loc) as *const T;
    // SAFETY: the boxes slot, [batches, boxes, 4], live for the run.
    let boxes = unsafe { std::slice::from_raw_parts(boxes_p, s.boxes.elements()) };
    let scores_p = cx.ptr(s.scores.loc) as *const T;
    // SAFETY: the scores slot, [batches, classes, boxes], live for the run.
    let scores = unsafe { std::slice::from_raw_parts(scores_p, s.scores.elements()) };
    let cand_p = cx.ptr(s.candidates) as *mut u32;
    // SAFETY: the scratch's first region, boxes · 4 bytes (rounded up to ALIGN, so
    // the kept region after it does not overlap), reserved by `build_nms`.
    let candidates = unsafe { std::slice::from_raw_parts_mut(cand_p, n) };
    let kept_p = cx.ptr(s.kept) as *mut u32;
    // SAFETY: the scratch's second region, kept_len u32 after the candidates.
    let kept = unsafe { std::slice::from_raw_parts_mut(kept_p, s.kept_len) };
    let out_p = cx.ptr(s.out.loc) as *mut i64;
    // SAFETY: the i64 output slot (its largest shape) of out.elements(), apart from
    // the inputs and the scratch.
    let out = unsafe { std::slice::from_raw_parts_mut(out_p, s.out.elements()) };
    non_max_suppression(boxes, scores, s.shape, limits, candidates, kept, out)
}

struct NonZero {
    x: Slot,
    mask: u64,
    out: Slot,
}

fn build_non_zero(b: &Build) -> Result<Option<Box<dyn Source>>, String> {
    let Some(x) = b.input(0).cloned() else {
        return Ok(None);
    };
    // The bits that make an element non-zero: all but a float's sign.
    let mask = match x.dtype {
        DType::F16 | DType::BF16 => 0x7fff,
        DType::F32 => 0x7fff_ffff,
        DType::F64 => 0x7fff_ffff_ffff_ffff,
        d if d == DType::Bool || d.is_int() && !d.is_low_bit() => u64::MAX,
        _ => return Ok(None),
    };
    Ok(Some(Box::new(NonZero {
        x,
        mask,
        out: b.outs[0].clone(),
    })))
}

impl Source for NonZero {
    unsafe fn run(&self, cx: &Cx) -> Result<usize, String> {
        let width = self.x.dtype.size_in_bytes();
        // SAFETY: the input slot's x.bytes() bytes, live for the run.
        let x = unsafe { std::slice::from_raw_parts(cx.ptr(self.x.loc), self.x.bytes()) };
        let count = count_non_zero(x, width, self.mask);
        let out_p = cx.ptr(self.out.loc) as *mut i64;
        // SAFETY: the i64 output slot holds rank × elements entries, the most there can
        // be, in a buffer apart from the input.
        let out = unsafe { std::slice::from_raw_parts_mut(out_p, self.out.elements()) };
        non_zero(x, width, self.mask, &self.x.shape, count, out);
        Ok(count)
    }
    fn kind(&self) -> &'static str {
        "nonzero"
    }
}

/// `Unique` of X seen as `[outer, len, inner]` (`len` the slices compared: the axis, or
/// every element of the flattened X).
struct Unique {
    x: Slot,
    dims: [usize; 3],
    sorted: bool,
    /// Y, indices, inverse_indices, counts (Y and counts at the bound).
    outs: [Slot; 4],
    /// The slices' keys (len · outer · inner i128), then five tables of len usize.
    scratch: Loc,
}

fn build_unique(b: &Build) -> Result<Option<Box<dyn Source>>, String> {
    let (Some(x), [y, indices, inverse, counts]) = (b.input(0).cloned(), b.outs) else {
        return Ok(None);
    };
    if !(x.dtype.is_float() || x.dtype.is_int()) || x.dtype.is_low_bit() {
        return Ok(None);
    }
    let dims = match b.node.attrs.int("axis")? {
        None => [1, x.elements(), 1],
        Some(a) => {
            let a = norm_axis(a, x.shape.len())?;
            [
                x.shape[..a].iter().product(),
                x.shape[a],
                x.shape[a + 1..].iter().product(),
            ]
        }
    };
    Ok(Some(Box::new(Unique {
        x,
        dims,
        sorted: b.node.attrs.int_or("sorted", 1)? != 0,
        outs: [y, indices, inverse, counts].map(Slot::clone),
        scratch: b
            .scratch((dims[0] * dims[1] * dims[2] * 16).next_multiple_of(8) + 5 * dims[1] * 8),
    })))
}

impl Source for Unique {
    unsafe fn run(&self, cx: &Cx) -> Result<usize, String> {
        // SAFETY: the slots hold x.dtype and i64 (build checked), at the bound.
        unsafe { with_dtype!(self.x.dtype, unique(self, cx)) }
    }
    fn kind(&self) -> &'static str {
        "unique"
    }
}

/// [`Unique`] on X of `T`: the slices sorted by the reference's exact keys
/// ([`unique_key`]) and then by position, so each run of equal keys starts at its first
/// occurrence; written compactly for the extent it returns.
///
/// # Safety
/// The Source::run contract, X holding `T`s, the outputs their bound shapes.
unsafe fn unique<T: Elem>(s: &Unique, cx: &Cx) -> Result<usize, String> {
    let [outer, len, inner] = s.dims;
    let w = outer * inner;
    // SAFETY: X's elements, live for the run.
    let x = unsafe { std::slice::from_raw_parts(cx.ptr(s.x.loc) as *const T, s.x.elements()) };
    let keys_p = cx.ptr(s.scratch) as *mut i128;
    // SAFETY: the scratch's first region, len · w i128 (ALIGN-aligned), this step's.
    let keys = unsafe { std::slice::from_raw_parts_mut(keys_p, len * w) };
    let tables_p = cx.ptr(s.scratch).wrapping_add(len * w * 16) as *mut usize;
    // SAFETY: the five len-usize tables after the keys (8-aligned), this step's.
    let tables = unsafe { std::slice::from_raw_parts_mut(tables_p, 5 * len) };
    let (perm, rest) = tables.split_at_mut(len);
    let (group_of, rest) = rest.split_at_mut(len);
    let (firsts, rest) = rest.split_at_mut(len);
    let (order, rank) = rest.split_at_mut(len);
    for j in 0..len {
        for p in 0..w {
            keys[j * w + p] = unique_key(x[((p / inner) * len + j) * inner + p % inner]);
        }
    }
    let key = |j: usize| &keys[j * w..(j + 1) * w];
    for (t, p) in perm.iter_mut().enumerate() {
        *p = t;
    }
    perm.sort_unstable_by(|&a, &b| key(a).cmp(key(b)).then(a.cmp(&b)));
    let mut n = 0;
    for t in 0..len {
        let j = perm[t];
        if t == 0 || key(j) != key(perm[t - 1]) {
            firsts[n] = j;
            n += 1;
        }
        group_of[j] = n - 1;
    }
    let order = &mut order[..n];
    for (r, o) in order.iter_mut().enumerate() {
        *o = r;
    }
    if !s.sorted {
        order.sort_unstable_by_key(|&g| firsts[g]);
    }
    for (r, &g) in order.iter().enumerate() {
        rank[g] = r;
    }
    let [y, indices, inverse, counts] = &s.outs;
    // SAFETY: Y's bound buffer holds outer·len·inner `T`s (n ≤ len), the others len
    // i64s, apart from X, the scratch and each other.
    let (y, indices, inverse, counts) = unsafe {
        (
            std::slice::from_raw_parts_mut(cx.ptr(y.loc) as *mut T, y.elements()),
            std::slice::from_raw_parts_mut(cx.ptr(indices.loc) as *mut i64, indices.elements()),
            std::slice::from_raw_parts_mut(cx.ptr(inverse.loc) as *mut i64, inverse.elements()),
            std::slice::from_raw_parts_mut(cx.ptr(counts.loc) as *mut i64, counts.elements()),
        )
    };
    for (r, &g) in order.iter().enumerate() {
        let j = firsts[g];
        indices[r] = j as i64;
        counts[r] = 0;
        for p in 0..w {
            let (o, i) = (p / inner, p % inner);
            y[(o * n + r) * inner + i] = x[(o * len + j) * inner + i];
        }
    }
    for (j, &g) in group_of.iter().enumerate() {
        inverse[j] = rank[g] as i64;
        counts[rank[g]] += 1;
    }
    Ok(n)
}

/// The output's dims at run time: `ty`'s, its dynamic axis `axis` of size `extent`.
pub(crate) fn dims_at(ty: &TensorType, axis: usize, extent: usize) -> Option<Vec<usize>> {
    ty.shape
        .axes
        .iter()
        .enumerate()
        .map(|(k, a)| match &a.dim {
            _ if k == axis => Some(extent),
            Dim::Fixed(n) => Some(*n),
            Dim::Sym(_) => None,
        })
        .collect()
}
