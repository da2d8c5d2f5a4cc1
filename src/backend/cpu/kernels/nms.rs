//! Ops whose output extent depends on the data: `NonMaxSuppression` and `NonZero`. Each
//! writes its rows compactly at the start of an upper-bound buffer and returns how many
//! it wrote; boxes are compared in f64 exactly as the reference `eval` does, so the
//! selection (and its order) is the interpreter's.
use crate::tensor::Elem;

/// The sizes of one `NonMaxSuppression`: boxes `[batches, boxes, 4]`, scores
/// `[batches, classes, boxes]`.
#[derive(Clone, Copy, Debug)]
pub struct NmsShape {
    pub batches: usize,
    pub classes: usize,
    pub boxes: usize,
    /// Boxes as (x center, y center, width, height) rather than two corners.
    pub center_point_box: bool,
}

/// One run's thresholds: at most `max_per_class` boxes per (batch, class); a box is
/// dropped when its IoU with a kept one exceeds `iou_threshold`; only scores above
/// `score_threshold` (when given) are candidates.
#[derive(Clone, Copy, Debug)]
pub struct NmsLimits {
    pub max_per_class: usize,
    pub iou_threshold: f64,
    pub score_threshold: Option<f64>,
}

/// Box `i` as (y1, x1, y2, x2) with y1 <= y2 and x1 <= x2.
fn corners<T: Elem>(b: &[T], center: bool) -> [f64; 4] {
    let [a, b, c, d] = [b[0], b[1], b[2], b[3]].map(T::to_f64);
    if center {
        let (xc, yc, w, h) = (a, b, c, d);
        [yc - h / 2.0, xc - w / 2.0, yc + h / 2.0, xc + w / 2.0]
    } else {
        [a.min(c), b.min(d), a.max(c), b.max(d)]
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

/// Greedy suppression per batch and class, best score first (equal scores in box
/// order); writes `(batch, class, box)` rows to `out` and returns how many. `candidates`
/// holds `boxes` entries, `kept` `min(max_per_class, boxes)`, `out` three per row of
/// the bound `batches * classes * min(max_per_class, boxes)`.
pub fn non_max_suppression<T: Elem>(
    boxes: &[T],
    scores: &[T],
    shape: NmsShape,
    limits: NmsLimits,
    candidates: &mut [u32],
    kept: &mut [u32],
    out: &mut [i64],
) -> usize {
    let n = shape.boxes;
    let max_kept = limits.max_per_class.min(n).min(kept.len());
    let mut rows = 0;
    for b in 0..shape.batches {
        let bx = &boxes[b * n * 4..(b + 1) * n * 4];
        let corner = |i: u32| {
            corners(
                &bx[i as usize * 4..i as usize * 4 + 4],
                shape.center_point_box,
            )
        };
        for c in 0..shape.classes {
            let s = &scores[(b * shape.classes + c) * n..][..n];
            let mut count = 0;
            for (i, &v) in s.iter().enumerate() {
                if limits.score_threshold.is_none_or(|t| v.to_f64() > t) {
                    candidates[count] = i as u32;
                    count += 1;
                }
            }
            let cand = &mut candidates[..count];
            // Descending score, then ascending box: the reference's stable sort. Adding
            // zero makes -0 equal to +0, as the reference compares them.
            cand.sort_unstable_by(|&i, &j| {
                let (si, sj) = (s[i as usize].to_f64() + 0.0, s[j as usize].to_f64() + 0.0);
                sj.total_cmp(&si).then(i.cmp(&j))
            });
            let mut nk = 0;
            for &i in cand.iter() {
                if nk >= max_kept {
                    break;
                }
                let ci = corner(i);
                if kept[..nk]
                    .iter()
                    .all(|&k| iou(corner(k), ci) <= limits.iou_threshold)
                {
                    kept[nk] = i;
                    nk += 1;
                    out[rows * 3..rows * 3 + 3].copy_from_slice(&[b as i64, c as i64, i as i64]);
                    rows += 1;
                }
            }
        }
    }
    rows
}

/// The number of elements of `x` (each `width` bytes, little-endian) whose bits under
/// `mask` are not all zero: a float's sign bit is masked off so that -0 counts as zero.
pub fn count_non_zero(x: &[u8], width: usize, mask: u64) -> usize {
    x.chunks_exact(width)
        .filter(|e| element_bits(e) & mask != 0)
        .count()
}

fn element_bits(e: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b[..e.len()].copy_from_slice(e);
    u64::from_le_bytes(b)
}

/// `NonZero`: the coordinates of the `count` non-zero elements of `x` (dims `dims`),
/// as `[rank, count]` in row-major order of the elements.
pub fn non_zero(x: &[u8], width: usize, mask: u64, dims: &[usize], count: usize, out: &mut [i64]) {
    let mut col = 0;
    for (j, e) in x.chunks_exact(width).enumerate() {
        if element_bits(e) & mask == 0 {
            continue;
        }
        let mut rest = j;
        for (d, &size) in dims.iter().enumerate().rev() {
            out[d * count + col] = (rest % size) as i64;
            rest /= size;
        }
        col += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_boxes_keep_the_best_and_distant_ones_stay() {
        // Three boxes, the second overlapping the first: it goes.
        let boxes = [0.0, 0.0, 1.0, 1.0, 0.0, 0.1, 1.0, 1.1, 0.0, 5.0, 1.0, 6.0];
        let scores = [0.9, 0.95, 0.3];
        let shape = NmsShape {
            batches: 1,
            classes: 1,
            boxes: 3,
            center_point_box: false,
        };
        let limits = NmsLimits {
            max_per_class: 3,
            iou_threshold: 0.5,
            score_threshold: None,
        };
        let (mut cand, mut kept, mut out) = ([0; 3], [0; 3], [0; 9]);
        let rows = non_max_suppression(
            &boxes, &scores, shape, limits, &mut cand, &mut kept, &mut out,
        );
        assert_eq!(rows, 2);
        assert_eq!(&out[..6], &[0, 0, 1, 0, 0, 2]);
    }

    #[test]
    fn non_zero_lists_coordinates_and_ignores_negative_zero() {
        let x: Vec<u8> = [0.0f32, -0.0, 2.0, 0.0, f32::NAN, 1.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let mask = 0x7fff_ffff;
        assert_eq!(count_non_zero(&x, 4, mask), 3);
        let mut out = [0; 6];
        non_zero(&x, 4, mask, &[2, 3], 3, &mut out);
        assert_eq!(out, [0, 1, 1, 2, 1, 2]);
    }
}
