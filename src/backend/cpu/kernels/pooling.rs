//! 2-D MaxPool and AveragePool (and their Global forms) over plain NCHW and blocked
//! NCHWxc (`[N, ceil(C/b), H, W, b]`) buffers, with ONNX's window geometry: pads
//! top/left/bottom/right, strides, dilations, ceil_mode, count_include_pad. MaxPool's
//! Indices output (flat index into the NCHW input, storage_order 0) is computed on the
//! plain layout when asked for. Work is split over (n, channel or channel block).
use super::math;
use super::par::{for_ranges, SyncPtr};
use crate::backend::cpu::isa::{self, Isa};
use crate::backend::cpu::pool::Pool;

/// Which reduction a pool takes over its window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolKind {
    /// The largest value; the first one wins ties, a NaN found first stays.
    Max,
    /// The mean (an all-padding window gives NaN, as in the interpreter).
    Average,
}

/// The window geometry of a 2-D pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool2d {
    pub kernel: [usize; 2],
    pub strides: [usize; 2],
    pub dilations: [usize; 2],
    /// top, left, bottom, right
    pub pads: [usize; 4],
    pub ceil_mode: bool,
    /// AveragePool only: taps on explicit padding count as zeros.
    pub count_include_pad: bool,
}

impl Pool2d {
    /// A `kh × kw` window with stride 1, no padding and no dilation.
    #[cfg(test)]
    pub(crate) fn new(kernel: [usize; 2]) -> Pool2d {
        Pool2d {
            kernel,
            strides: [1, 1],
            dilations: [1, 1],
            pads: [0; 4],
            ceil_mode: false,
            count_include_pad: false,
        }
    }

    /// The output size along axis `a` (0 = H, 1 = W) for an input of size `n`, or None
    /// when the window does not fit the padded input.
    pub(crate) fn out_len(&self, a: usize, n: usize) -> Option<usize> {
        let (pb, pe) = (self.pads[a], self.pads[a + 2]);
        let extent = (self.kernel[a] - 1) * self.dilations[a] + 1;
        let padded = n + pb + pe;
        let span = padded.checked_sub(extent)?;
        let s = self.strides[a];
        let mut o = if self.ceil_mode {
            span.div_ceil(s)
        } else {
            span / s
        } + 1;
        // A ceil-mode window must start inside the input or its leading padding.
        if self.ceil_mode && (o - 1) * s >= n + pb {
            o -= 1;
        }
        Some(o)
    }

    /// The output [OH, OW] for an input [H, W]; panics if the window does not fit.
    pub(crate) fn out_dims(&self, h: usize, w: usize) -> [usize; 2] {
        [
            self.out_len(0, h)
                .expect("pool window larger than padded height"),
            self.out_len(1, w)
                .expect("pool window larger than padded width"),
        ]
    }

    /// For axis `a`, output `o`, input size `n`: the taps (first, count) that fall inside
    /// the input, and the number that fall inside input or explicit padding.
    fn taps(&self, a: usize, o: usize, n: usize) -> (usize, usize, usize, usize) {
        let (k, s, d, pb, pe) = (
            self.kernel[a],
            self.strides[a],
            self.dilations[a],
            self.pads[a] as isize,
            self.pads[a + 2] as isize,
        );
        let start = (o * s) as isize - pb;
        let (mut first, mut count, mut padded) = (usize::MAX, 0, 0);
        for t in 0..k {
            let p = start + (t * d) as isize;
            if p >= 0 && p < n as isize {
                if first == usize::MAX {
                    first = t;
                }
                count += 1;
            }
            if p >= -pb && p < n as isize + pe {
                padded += 1;
            }
        }
        // Inside taps are consecutive in t: first..first+count.
        (first.min(k), count, padded, start.max(0) as usize)
    }
}

/// Precomputed per-output-position tap ranges along one axis.
struct AxisTaps {
    /// First inside tap index, number of inside taps, taps within padding.
    first: TapList,
    count: TapList,
    padded: TapList,
}

/// Outputs per axis whose taps are kept on the stack: every real image (a run
/// allocates nothing); longer axes use the heap.
const INLINE_TAPS: usize = 256;

/// A short array of tap counts, on the stack up to [`INLINE_TAPS`] (the large inline
/// variant is the point: it lives on a kernel call's stack, never in a collection).
#[allow(clippy::large_enum_variant)]
enum TapList {
    Inline([usize; INLINE_TAPS]),
    Heap(Vec<usize>),
}

impl TapList {
    fn new(len: usize) -> TapList {
        if len <= INLINE_TAPS {
            TapList::Inline([0; INLINE_TAPS])
        } else {
            TapList::Heap(vec![0; len])
        }
    }
}

impl std::ops::Deref for TapList {
    type Target = [usize];
    fn deref(&self) -> &[usize] {
        match self {
            TapList::Inline(a) => a,
            TapList::Heap(v) => v,
        }
    }
}

impl std::ops::DerefMut for TapList {
    fn deref_mut(&mut self) -> &mut [usize] {
        match self {
            TapList::Inline(a) => a,
            TapList::Heap(v) => v,
        }
    }
}

fn axis_taps(p: &Pool2d, a: usize, n: usize, out: usize) -> AxisTaps {
    let mut t = AxisTaps {
        first: TapList::new(out),
        count: TapList::new(out),
        padded: TapList::new(out),
    };
    for o in 0..out {
        let (f, c, pd, _) = p.taps(a, o, n);
        t.first[o] = f;
        t.count[o] = c;
        t.padded[o] = pd;
    }
    t
}

/// The input coordinate of tap `t` at output `o` on axis `a` (must be inside).
#[inline]
fn coord(p: &Pool2d, a: usize, o: usize, t: usize) -> usize {
    o * p.strides[a] + t * p.dilations[a] - p.pads[a]
}

/// 2-D pool over plain NCHW `x` ([n, c, h, w]) into `y` ([n, c, OH, OW], see
/// [`Pool2d::out_dims`]). For Max, `indices` (same size as `y`) receives ONNX's
/// flat input index of each maximum when given.
#[allow(clippy::too_many_arguments)]
pub(crate) fn pool2d_nchw(
    kind: PoolKind,
    p: &Pool2d,
    x: &[f32],
    dims: [usize; 4],
    y: &mut [f32],
    indices: Option<&mut [i64]>,
    pool: Option<&Pool>,
) {
    pool2d_nchw_isa(isa::isa(), kind, p, x, dims, y, indices, pool)
}

/// [`pool2d_nchw`] on the path `isa` asks for. The AVX2 paths (when no indices are
/// asked for) compute eight outputs of a row at once where the window has horizontal
/// stride 1 and lies inside the row, reducing the window's rows first where the
/// window is large or strided; the rest is scalar.
#[allow(clippy::too_many_arguments)]
pub(crate) fn pool2d_nchw_isa(
    isa: Isa,
    kind: PoolKind,
    p: &Pool2d,
    x: &[f32],
    dims: [usize; 4],
    y: &mut [f32],
    indices: Option<&mut [i64]>,
    pool: Option<&Pool>,
) {
    let [n, c, h, w] = dims;
    let [oh, ow] = p.out_dims(h, w);
    assert!(x.len() >= n * c * h * w && y.len() >= n * c * oh * ow);
    let idx = indices.map(|i| {
        assert!(kind == PoolKind::Max, "only MaxPool has indices");
        assert!(i.len() >= n * c * oh * ow);
        SyncPtr(i.as_mut_ptr())
    });
    let (th, tw) = (axis_taps(p, 0, h, oh), axis_taps(p, 1, w, ow));
    let yp = SyncPtr(y.as_mut_ptr());
    let work = oh * ow * p.kernel[0] * p.kernel[1];
    // Outputs vlo..vhi of each row: horizontal taps all inside, a multiple of 8.
    let extent = (p.kernel[1] - 1) * p.dilations[1];
    let vlo = p.pads[1].min(ow);
    let end = (w + p.pads[1]).saturating_sub(extent).clamp(vlo, ow);
    let vhi = vlo + (end - vlo) / 8 * 8;
    // Separable: each output row reduces its window's input rows into one row first,
    // then each output reduces its taps of that row: kh + kw operations per output
    // rather than kh·kw (large windows, e.g. the 5/9/13 max pools of SPP blocks), and
    // the only vector path when the horizontal stride is not 1.
    let separable = p.strides[1] > 1 || p.kernel[0] * p.kernel[1] >= 9;
    #[cfg(target_arch = "x86_64")]
    if math::use_avx2(isa) && idx.is_none() && separable && w <= STRIDED_ROW_MAX {
        // Stride 1, dilation 1: eight outputs at once over the reduced row.
        let row_vec = p.strides[1] == 1 && p.dilations[1] == 1 && vhi > vlo;
        for_ranges(pool, n * c, work, &|r| {
            let mut col = [0f32; STRIDED_ROW_MAX];
            for plane in r {
                let xs = &x[plane * h * w..(plane + 1) * h * w];
                // SAFETY: plane < n·c of y's oh·ow planes (the separable path's range); each task
                // writes only the planes of its own range.
                let ys = unsafe {
                    std::slice::from_raw_parts_mut(yp.get().add(plane * oh * ow), oh * ow)
                };
                for i in 0..oh {
                    let (fh, ch) = (th.first[i], th.count[i]);
                    let rows = (fh..fh + ch).map(|a| coord(p, 0, i, a) * w);
                    // SAFETY: AVX2 checked; every row start is inside the plane.
                    unsafe { reduce_rows_avx2(kind, xs, rows, &mut col[..w]) };
                    if row_vec {
                        let count = if p.count_include_pad {
                            th.padded[i] * p.kernel[1]
                        } else {
                            ch * p.kernel[1]
                        };
                        let out = &mut ys[i * ow + vlo..i * ow + vhi];
                        let (cols, c0) = (&col[..w], vlo - p.pads[1]);
                        // SAFETY: AVX2 checked; outputs vlo..vhi (a multiple of 8) have
                        // every tap inside the row (see vlo/vhi).
                        unsafe { plain_row_avx2(kind, cols, [0].into_iter(), c0, p, count, out) };
                    }
                    for j in 0..ow {
                        if row_vec && (vlo..vhi).contains(&j) {
                            continue;
                        }
                        let (fw, cw) = (tw.first[j], tw.count[j]);
                        let taps = (fw..fw + cw).map(|b| col[coord(p, 1, j, b)]);
                        ys[i * ow + j] = match kind {
                            PoolKind::Max => taps
                                .reduce(|best, v| if v > best { v } else { best })
                                .unwrap_or(f32::NEG_INFINITY),
                            PoolKind::Average => {
                                let count = if p.count_include_pad {
                                    th.padded[i] * tw.padded[j]
                                } else {
                                    ch * cw
                                };
                                if count == 0 {
                                    f32::NAN
                                } else {
                                    taps.sum::<f32>() / count as f32
                                }
                            }
                        };
                    }
                }
            }
        });
        return;
    }
    let vec_ok = math::use_avx2(isa) && p.strides[1] == 1 && idx.is_none();
    for_ranges(pool, n * c, work, &|r| {
        for plane in r {
            let xs = &x[plane * h * w..(plane + 1) * h * w];
            // SAFETY: y holds n·c output planes of oh·ow; this plane is in this task's range,
            // so no other task writes it.
            let ys =
                unsafe { std::slice::from_raw_parts_mut(yp.get().add(plane * oh * ow), oh * ow) };
            for i in 0..oh {
                let (fh, ch) = (th.first[i], th.count[i]);
                #[cfg(target_arch = "x86_64")]
                if vec_ok && vhi > vlo {
                    let count = if p.count_include_pad {
                        th.padded[i] * p.kernel[1]
                    } else {
                        ch * p.kernel[1]
                    };
                    let rows = (fh..fh + ch).map(|a| coord(p, 0, i, a) * w);
                    let out = &mut ys[i * ow + vlo..i * ow + vhi];
                    // SAFETY: AVX2 checked; for outputs vlo..vhi (a multiple of 8 of
                    // them) every tap column lies inside the row (see vlo/vhi).
                    unsafe { plain_row_avx2(kind, xs, rows, vlo - p.pads[1], p, count, out) };
                }
                for j in 0..ow {
                    if vec_ok && (vlo..vhi).contains(&j) {
                        continue;
                    }
                    let (fw, cw) = (tw.first[j], tw.count[j]);
                    let out = &mut ys[i * ow + j];
                    match kind {
                        PoolKind::Max => {
                            let (mut best, mut at) = (f32::NEG_INFINITY, None);
                            for a in fh..fh + ch {
                                let row = coord(p, 0, i, a) * w;
                                for b in fw..fw + cw {
                                    let k = row + coord(p, 1, j, b);
                                    let v = xs[k];
                                    if at.is_none() || v > best {
                                        best = v;
                                        at = Some(k);
                                    }
                                }
                            }
                            *out = best;
                            if let Some(ip) = idx {
                                let flat = at.map_or(0, |k| plane * h * w + k) as i64;
                                // SAFETY: inside this task's own output plane.
                                unsafe { *ip.get().add(plane * oh * ow + i * ow + j) = flat };
                            }
                        }
                        PoolKind::Average => {
                            let mut sum = 0.0f32;
                            for a in fh..fh + ch {
                                let row = coord(p, 0, i, a) * w;
                                let base = row + coord(p, 1, j, fw);
                                if p.dilations[1] == 1 {
                                    sum += xs[base..base + cw].iter().sum::<f32>();
                                } else {
                                    for b in 0..cw {
                                        sum += xs[base + b * p.dilations[1]];
                                    }
                                }
                            }
                            let count = if p.count_include_pad {
                                th.padded[i] * tw.padded[j]
                            } else {
                                ch * cw
                            };
                            *out = if count == 0 {
                                f32::NAN
                            } else {
                                sum / count as f32
                            };
                        }
                    }
                }
            }
        }
    });
}

/// The widest row the separable path reduces in a stack buffer (wider rows take the
/// general path).
const STRIDED_ROW_MAX: usize = 2048;

/// `col[c]` = the max or sum over `rows` (offsets of input rows in `xs`) of column `c`,
/// each column reduced top row first (so a NaN there stays, as in the scalar path).
/// With no rows, the identity (-inf or 0).
///
/// # Safety
/// AVX2; every row start plus `col.len()` is inside `xs`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn reduce_rows_avx2(
    kind: PoolKind,
    xs: &[f32],
    mut rows: impl Iterator<Item = usize>,
    col: &mut [f32],
) {
    use std::arch::x86_64::*;
    let w = col.len();
    let Some(first) = rows.next() else {
        col.fill(if kind == PoolKind::Max {
            f32::NEG_INFINITY
        } else {
            0.0
        });
        return;
    };
    col.copy_from_slice(&xs[first..first + w]);
    let (cp, xp) = (col.as_mut_ptr(), xs.as_ptr());
    let vw = w / 8 * 8;
    for r in rows {
        let src = &xs[r..r + w];
        for c in (0..vw).step_by(8) {
            // SAFETY: c + 8 <= vw <= w: lanes c..c + 8 of col, and of row r of xs, which
            // `src` has just checked holds w floats from r.
            let (a, v) = unsafe { (_mm256_loadu_ps(cp.add(c)), _mm256_loadu_ps(xp.add(r + c))) };
            let out = match kind {
                // max(v, a): a when either is NaN, i.e. "if v > a { a = v }".
                PoolKind::Max => _mm256_max_ps(v, a),
                PoolKind::Average => _mm256_add_ps(a, v),
            };
            // SAFETY: the same 8 lanes c..c + 8 < w of col, which `cp` points at.
            unsafe { _mm256_storeu_ps(cp.add(c), out) };
        }
        for c in vw..w {
            let v = src[c];
            match kind {
                PoolKind::Max if v > col[c] => col[c] = v,
                PoolKind::Max => {}
                PoolKind::Average => col[c] += v,
            }
        }
    }
}

/// Eight-at-a-time outputs of one plain row: `out[j]` reduces the taps at columns
/// `c0 + j + t·dilation` (t < kernel width) of each input row starting at `rows`.
///
/// # Safety
/// AVX2+FMA; `out.len()` is a multiple of 8 and every such tap is inside its row of `xs`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn plain_row_avx2(
    kind: PoolKind,
    xs: &[f32],
    rows: impl Iterator<Item = usize> + Clone,
    c0: usize,
    p: &Pool2d,
    count: usize,
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    let xp = xs.as_ptr();
    let (kw, dw) = (p.kernel[1], p.dilations[1]);
    let scale = _mm256_set1_ps(if count == 0 {
        f32::NAN
    } else {
        1.0 / count as f32
    });
    for j in (0..out.len()).step_by(8) {
        let mut acc = None;
        for r in rows.clone() {
            for t in 0..kw {
                // SAFETY: tap t < kw of outputs j..j + 8 on the row from r: inside that
                // row of xs for every output of `out` (the contract).
                let v = unsafe { _mm256_loadu_ps(xp.add(r + c0 + j + t * dw)) };
                acc = Some(match (acc, kind) {
                    (None, _) => v,
                    // max(v, a): a when either is NaN, i.e. "if v > a { a = v }".
                    (Some(a), PoolKind::Max) => _mm256_max_ps(v, a),
                    (Some(a), PoolKind::Average) => _mm256_add_ps(a, v),
                });
            }
        }
        let v = match (acc, kind) {
            (None, PoolKind::Max) => _mm256_set1_ps(f32::NEG_INFINITY),
            // All taps on padding: 0 (or NaN when nothing counts).
            (None, PoolKind::Average) => _mm256_mul_ps(_mm256_setzero_ps(), scale),
            (Some(a), PoolKind::Max) => a,
            (Some(a), PoolKind::Average) => _mm256_mul_ps(a, scale),
        };
        // SAFETY: out.len() is a multiple of 8 (the contract), so j + 8 <= out.len().
        unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(j), v) };
    }
}

/// 2-D pool over blocked `x` ([n, ceil(c/block), h, w, block]) into `y` ([n,
/// ceil(c/block), OH, OW, block]). Pad lanes of the output are written as 0.
#[allow(clippy::too_many_arguments)]
pub(crate) fn pool2d_blocked(
    kind: PoolKind,
    p: &Pool2d,
    x: &[f32],
    dims: [usize; 4],
    block: usize,
    y: &mut [f32],
    pool: Option<&Pool>,
) {
    pool2d_blocked_isa(isa::isa(), kind, p, x, dims, block, y, pool)
}

/// [`pool2d_blocked`] on the path `isa` asks for.
#[allow(clippy::too_many_arguments)]
pub(crate) fn pool2d_blocked_isa(
    isa: Isa,
    kind: PoolKind,
    p: &Pool2d,
    x: &[f32],
    dims: [usize; 4],
    block: usize,
    y: &mut [f32],
    pool: Option<&Pool>,
) {
    let [n, c, h, w] = dims;
    let [oh, ow] = p.out_dims(h, w);
    let cb = c.div_ceil(block);
    assert!(x.len() >= n * cb * h * w * block && y.len() >= n * cb * oh * ow * block);
    let (th, tw) = (axis_taps(p, 0, h, oh), axis_taps(p, 1, w, ow));
    let yp = SyncPtr(y.as_mut_ptr());
    let avx2 = math::use_avx2(isa) && block.is_multiple_of(8);
    let work = oh * ow * p.kernel[0] * p.kernel[1] * block;
    let (xplane, yplane) = (h * w * block, oh * ow * block);
    for_ranges(pool, n * cb, work, &|r| {
        for plane in r {
            let xs = &x[plane * xplane..(plane + 1) * xplane];
            // SAFETY: blocked output plane `plane` (yplane floats) of y, inside it and in this
            // task's range alone.
            let ys =
                unsafe { std::slice::from_raw_parts_mut(yp.get().add(plane * yplane), yplane) };
            #[cfg(target_arch = "x86_64")]
            if avx2 && block == 16 {
                // SAFETY: AVX2 checked; the plane holds h·w pixels of 16 lanes, ys
                // oh·ow of them.
                unsafe {
                    match kind {
                        PoolKind::Max => plane16_avx2::<true>(p, &th, &tw, xs, ys, [h, w]),
                        PoolKind::Average => plane16_avx2::<false>(p, &th, &tw, xs, ys, [h, w]),
                    }
                }
                if c % block != 0 && plane % cb == cb - 1 {
                    for px in ys.chunks_mut(block) {
                        px[c % block..].fill(0.0);
                    }
                }
                continue;
            }
            let mut acc_inline = [0f32; 64];
            let mut acc_heap = vec![];
            let acc: &mut [f32] = if block <= acc_inline.len() {
                &mut acc_inline[..block]
            } else {
                acc_heap.resize(block, 0.0);
                &mut acc_heap
            };
            for i in 0..oh {
                for j in 0..ow {
                    let (fh, ch) = (th.first[i], th.count[i]);
                    let (fw, cw) = (tw.first[j], tw.count[j]);
                    let taps = (fh..fh + ch).flat_map(|a| {
                        let row = coord(p, 0, i, a) * w;
                        (fw..fw + cw).map(move |b| (row + coord(p, 1, j, b)) * block)
                    });
                    let out = &mut ys[(i * ow + j) * block..(i * ow + j + 1) * block];
                    let count = match kind {
                        PoolKind::Max => 1,
                        PoolKind::Average if p.count_include_pad => th.padded[i] * tw.padded[j],
                        PoolKind::Average => ch * cw,
                    };
                    #[cfg(target_arch = "x86_64")]
                    if avx2 {
                        // The taps as a grid: the first, then steps along rows and columns.
                        let grid = Taps {
                            first: if ch * cw == 0 {
                                0
                            } else {
                                (coord(p, 0, i, fh) * w + coord(p, 1, j, fw)) * block
                            },
                            rows: ch,
                            cols: cw,
                            row_step: p.dilations[0] * w * block,
                            col_step: p.dilations[1] * block,
                        };
                        // SAFETY: AVX2 checked; every tap offset + block is inside xs
                        // and out holds block floats, block a multiple of 8.
                        unsafe { reduce_avx2(kind, xs, &grid, count, out) };
                        continue;
                    }
                    let _ = avx2;
                    let mut first = true;
                    for t in taps {
                        let v = &xs[t..t + block];
                        if first {
                            acc.copy_from_slice(v);
                            first = false;
                        } else {
                            for (a, &v) in acc.iter_mut().zip(v) {
                                match kind {
                                    PoolKind::Max => {
                                        if v > *a {
                                            *a = v
                                        }
                                    }
                                    PoolKind::Average => *a += v,
                                }
                            }
                        }
                    }
                    if first {
                        acc.fill(match kind {
                            PoolKind::Max => f32::NEG_INFINITY,
                            PoolKind::Average => 0.0,
                        });
                    }
                    for (o, a) in out.iter_mut().zip(acc.iter()) {
                        *o = match kind {
                            PoolKind::Max => *a,
                            PoolKind::Average if count == 0 => f32::NAN,
                            PoolKind::Average => a / count as f32,
                        };
                    }
                }
            }
            if c % block != 0 && plane % cb == cb - 1 {
                for px in ys.chunks_mut(block) {
                    px[c % block..].fill(0.0);
                }
            }
        }
    });
}

/// One NCHW16c plane of a blocked pool: each output pixel's 16 lanes in two registers
/// across its taps, the whole plane in one AVX2 function (no call per pixel). `MAX`:
/// MaxPool, else AveragePool.
///
/// # Safety
/// AVX2+FMA; `xs` holds h·w pixels of 16 floats, `ys` the output's oh·ow.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn plane16_avx2<const MAX: bool>(
    p: &Pool2d,
    th: &AxisTaps,
    tw: &AxisTaps,
    xs: &[f32],
    ys: &mut [f32],
    [h, w]: [usize; 2],
) {
    use std::arch::x86_64::*;
    let [oh, ow] = p.out_dims(h, w);
    let (row_step, col_step) = (p.dilations[0] * w * 16, p.dilations[1] * 16);
    for i in 0..oh {
        let (fh, ch) = (th.first[i], th.count[i]);
        for j in 0..ow {
            let (fw, cw) = (tw.first[j], tw.count[j]);
            // SAFETY: output pixel (i < oh, j < ow) of the oh·ow that ys holds.
            let out = unsafe { ys.as_mut_ptr().add((i * ow + j) * 16) };
            let count = if MAX {
                1
            } else if p.count_include_pad {
                th.padded[i] * tw.padded[j]
            } else {
                ch * cw
            };
            if ch * cw == 0 {
                let v = if MAX { f32::NEG_INFINITY } else { f32::NAN };
                let v = if !MAX && count > 0 { 0.0 } else { v };
                // SAFETY: `out` starts that pixel's 16 floats; ys is not used meanwhile.
                unsafe { std::slice::from_raw_parts_mut(out, 16) }.fill(v);
                continue;
            }
            // Offsets stay inside the plane: the taps are the window's inside ones.
            let first = (coord(p, 0, i, fh) * w + coord(p, 1, j, fw)) * 16;
            // SAFETY: (fh, fw) is the window's first inside tap, a pixel of the h·w
            // that xs holds.
            let x0 = unsafe { xs.as_ptr().add(first) };
            // SAFETY: that tap pixel's 16 floats.
            let (mut a0, mut a1) = unsafe { (_mm256_loadu_ps(x0), _mm256_loadu_ps(x0.add(8))) };
            for r in 0..ch {
                // SAFETY: inside window row r < ch, dilations[0] image rows a step.
                let xr = unsafe { x0.add(r * row_step) };
                for c in usize::from(r == 0)..cw {
                    // SAFETY: inside column c < cw of that row, a pixel of the plane.
                    let xt = unsafe { xr.add(c * col_step) };
                    // SAFETY: the tap pixel's 16 floats at xt.
                    let (v0, v1) = unsafe { (_mm256_loadu_ps(xt), _mm256_loadu_ps(xt.add(8))) };
                    if MAX {
                        // max(v, a): a when either is NaN, i.e. "if v > a { a = v }".
                        a0 = _mm256_max_ps(v0, a0);
                        a1 = _mm256_max_ps(v1, a1);
                    } else {
                        a0 = _mm256_add_ps(a0, v0);
                        a1 = _mm256_add_ps(a1, v1);
                    }
                }
            }
            if !MAX {
                let scale = _mm256_set1_ps(1.0 / count as f32);
                a0 = _mm256_mul_ps(a0, scale);
                a1 = _mm256_mul_ps(a1, scale);
            }
            // SAFETY: output pixel (i, j)'s 16 floats at `out`, inside ys.
            unsafe {
                _mm256_storeu_ps(out, a0);
                _mm256_storeu_ps(out.add(8), a1);
            }
        }
    }
}

/// The inside taps of one output pixel of a blocked pool, as offsets into its plane.
#[cfg(target_arch = "x86_64")]
struct Taps {
    first: usize,
    rows: usize,
    cols: usize,
    row_step: usize,
    col_step: usize,
}

/// One output pixel of a blocked pool: the reduction over `taps`. Lanes go in groups
/// of up to `LANES` held in registers across the taps, with no allocation or iterator
/// (this runs once per output pixel).
///
/// # Safety
/// AVX2+FMA; `block = out.len()` is a multiple of 8 and each tap + block ≤ xs.len().
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn reduce_avx2(kind: PoolKind, xs: &[f32], taps: &Taps, count: usize, out: &mut [f32]) {
    use std::arch::x86_64::*;
    const LANES: usize = 32;
    let block = out.len();
    let xp = xs.as_ptr();
    if taps.rows * taps.cols == 0 {
        let v = match kind {
            PoolKind::Max => f32::NEG_INFINITY,
            PoolKind::Average if count == 0 => f32::NAN,
            PoolKind::Average => 0.0,
        };
        out.fill(v);
        return;
    };
    let scale = _mm256_set1_ps(if count == 0 {
        f32::NAN
    } else {
        1.0 / count as f32
    });
    let mut l0 = 0;
    while l0 < block {
        let nv = (block - l0).min(LANES) / 8;
        // Loads and stores touch lanes l0..l0 + 8·nv of each tap and of out: in range
        // by the caller's contract.
        let mut a = [_mm256_setzero_ps(); LANES / 8];
        // SAFETY: lane l0 < block of the first tap, whose block lanes are inside xs.
        let x0 = unsafe { xp.add(taps.first + l0) };
        for (k, a) in a.iter_mut().enumerate().take(nv) {
            // SAFETY: lanes l0 + 8k..+8 of the first tap, 8·nv <= block - l0.
            *a = unsafe { _mm256_loadu_ps(x0.add(8 * k)) };
        }
        for r in 0..taps.rows {
            // SAFETY: tap row r < taps.rows, row_step floats a row, inside xs.
            let xr = unsafe { x0.add(r * taps.row_step) };
            // The first tap is already in.
            for c in usize::from(r == 0)..taps.cols {
                // SAFETY: tap column c < taps.cols of that row, col_step floats a tap.
                let xt = unsafe { xr.add(c * taps.col_step) };
                for (k, a) in a.iter_mut().enumerate().take(nv) {
                    // SAFETY: lanes l0 + 8k..+8 (k < nv) of that tap: tap + block <=
                    // xs.len() by the contract.
                    let v = unsafe { _mm256_loadu_ps(xt.add(8 * k)) };
                    *a = match kind {
                        // max(v, a): a when either is NaN, i.e. "if v > a { a = v }".
                        PoolKind::Max => _mm256_max_ps(v, *a),
                        PoolKind::Average => _mm256_add_ps(*a, v),
                    };
                }
            }
        }
        for (k, a) in a.iter().enumerate().take(nv) {
            let v = match kind {
                PoolKind::Max => *a,
                PoolKind::Average => _mm256_mul_ps(*a, scale),
            };
            // SAFETY: out lanes l0 + 8k..+8 with k < nv: l0 + 8·nv <= block = out.len().
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(l0 + 8 * k), v) };
        }
        l0 += 8 * nv;
    }
}

/// GlobalMaxPool / GlobalAveragePool over plain `x` ([n·c] rows of `hw`) into `y` ([n·c]).
pub(crate) fn global_pool_nchw(
    kind: PoolKind,
    x: &[f32],
    nc: usize,
    hw: usize,
    y: &mut [f32],
    pool: Option<&Pool>,
) {
    global_pool_nchw_isa(isa::isa(), kind, x, nc, hw, y, pool)
}

/// [`global_pool_nchw`] on the path `isa` asks for.
pub(crate) fn global_pool_nchw_isa(
    isa: Isa,
    kind: PoolKind,
    x: &[f32],
    nc: usize,
    hw: usize,
    y: &mut [f32],
    pool: Option<&Pool>,
) {
    assert!(x.len() >= nc * hw && y.len() >= nc);
    let yp = SyncPtr(y.as_mut_ptr());
    let avx2 = math::use_avx2(isa);
    for_ranges(pool, nc, hw, &|r| {
        for row in r {
            let xs = &x[row * hw..(row + 1) * hw];
            #[cfg(target_arch = "x86_64")]
            let v = if avx2 {
                // SAFETY: `avx2` is `math::use_avx2(isa)`: the CPU has AVX2 and FMA.
                unsafe { reduce_row_avx2(kind, xs) }
            } else {
                reduce_row(kind, xs)
            };
            #[cfg(not(target_arch = "x86_64"))]
            let v = {
                let _ = avx2;
                reduce_row(kind, xs)
            };
            // SAFETY: row < nc ≤ y.len(); rows are disjoint per task.
            unsafe { *yp.get().add(row) = v };
        }
    });
}

fn reduce_row(kind: PoolKind, xs: &[f32]) -> f32 {
    match kind {
        PoolKind::Max => xs.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v)),
        PoolKind::Average => xs.iter().sum::<f32>() / xs.len() as f32,
    }
}

/// [`reduce_row`] with AVX2: callers check the CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn reduce_row_avx2(kind: PoolKind, xs: &[f32]) -> f32 {
    use super::softmax::{hmax, hsum};
    use std::arch::x86_64::*;
    let body = xs.len() / 8 * 8;
    let p = xs.as_ptr();
    let mut a = match kind {
        PoolKind::Max => _mm256_set1_ps(f32::NEG_INFINITY),
        PoolKind::Average => _mm256_setzero_ps(),
    };
    let mut j = 0;
    while j < body {
        // SAFETY: j + 8 <= body <= xs.len(): eight floats of xs.
        let v = unsafe { _mm256_loadu_ps(p.add(j)) };
        a = match kind {
            PoolKind::Max => _mm256_max_ps(a, v),
            PoolKind::Average => _mm256_add_ps(a, v),
        };
        j += 8;
    }
    match kind {
        PoolKind::Max => xs[body..].iter().fold(hmax(a), |m, &v| m.max(v)),
        PoolKind::Average => (hsum(a) + xs[body..].iter().sum::<f32>()) / xs.len() as f32,
    }
}

/// GlobalMaxPool / GlobalAveragePool over blocked `x` ([n·ceil(c/block)] planes of
/// `hw × block`) into `y` ([n·ceil(c/block), block]); pad lanes come out 0.
#[allow(clippy::too_many_arguments)]
pub(crate) fn global_pool_blocked(
    kind: PoolKind,
    x: &[f32],
    n: usize,
    c: usize,
    hw: usize,
    block: usize,
    y: &mut [f32],
    pool: Option<&Pool>,
) {
    global_pool_blocked_isa(isa::isa(), kind, x, n, c, hw, block, y, pool)
}

/// [`global_pool_blocked`] on the path `isa` asks for.
#[allow(clippy::too_many_arguments)]
pub(crate) fn global_pool_blocked_isa(
    isa: Isa,
    kind: PoolKind,
    x: &[f32],
    n: usize,
    c: usize,
    hw: usize,
    block: usize,
    y: &mut [f32],
    pool: Option<&Pool>,
) {
    let cb = c.div_ceil(block);
    assert!(x.len() >= n * cb * hw * block && y.len() >= n * cb * block);
    let yp = SyncPtr(y.as_mut_ptr());
    let avx2 = math::use_avx2(isa);
    for_ranges(pool, n * cb, hw * block, &|r| {
        for plane in r {
            let xs = &x[plane * hw * block..(plane + 1) * hw * block];
            // SAFETY: each task writes only its own planes' block outputs.
            let out = unsafe { std::slice::from_raw_parts_mut(yp.get().add(plane * block), block) };
            #[cfg(target_arch = "x86_64")]
            if avx2 {
                // SAFETY: `math::use_avx2(isa)` said the CPU has AVX2 and FMA.
                unsafe { global_plane_avx2(kind, xs, hw, out) };
            } else {
                global_plane(kind, xs, hw, out);
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                let _ = avx2;
                global_plane(kind, xs, hw, out);
            }
            if !c.is_multiple_of(block) && plane % cb == cb - 1 {
                out[c % block..].fill(0.0);
            }
        }
    });
}

/// One plane of a blocked global pool: lane-wise over whole pixels, which the compiler
/// vectorizes (with AVX2 inside [`global_plane_avx2`]).
#[inline(always)]
fn global_plane(kind: PoolKind, xs: &[f32], hw: usize, out: &mut [f32]) {
    match kind {
        PoolKind::Max => out.fill(f32::NEG_INFINITY),
        PoolKind::Average => out.fill(0.0),
    }
    for px in xs.chunks_exact(out.len()) {
        match kind {
            PoolKind::Max => out.iter_mut().zip(px).for_each(|(a, &v)| *a = a.max(v)),
            PoolKind::Average => out.iter_mut().zip(px).for_each(|(a, &v)| *a += v),
        }
    }
    if kind == PoolKind::Average {
        let k = 1.0 / hw as f32;
        out.iter_mut().for_each(|a| *a *= k);
    }
}

/// [`global_plane`] compiled for AVX2: callers check the CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn global_plane_avx2(kind: PoolKind, xs: &[f32], hw: usize, out: &mut [f32]) {
    global_plane(kind, xs, hw, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::kernels::math::tests::isas;
    use crate::backend::cpu::kernels::reorder::{to_blocked, to_plain};
    use crate::backend::cpu::kernels::testutil::{lcg_data, pools};
    use crate::ir::ops::{self, EvalCtx};
    use crate::ir::{Attr, Attrs};
    use crate::tensor::Tensor;

    fn interp(op: &str, p: &Pool2d, x: &Tensor, kind: PoolKind) -> Vec<Tensor> {
        let mut a = Attrs::new();
        if !op.starts_with("Global") {
            let ints = |v: &[usize]| Attr::Ints(v.iter().map(|&v| v as i64).collect());
            a.set("kernel_shape", ints(&p.kernel));
            a.set("strides", ints(&p.strides));
            a.set("dilations", ints(&p.dilations));
            a.set("pads", ints(&[p.pads[0], p.pads[1], p.pads[2], p.pads[3]]));
            a.set("ceil_mode", Attr::Int(p.ceil_mode as i64));
            if kind == PoolKind::Average {
                a.set("count_include_pad", Attr::Int(p.count_include_pad as i64));
            }
        }
        let cx = EvalCtx {
            inputs: &[Some(x)],
            input_types: &[None],
            attrs: &a,
        };
        ops::lookup(op).unwrap().eval(&cx).unwrap()
    }

    fn close(got: &[f32], want: &[f64], what: &str) {
        assert_eq!(got.len(), want.len(), "{what}");
        for (k, (g, w)) in got.iter().zip(want).enumerate() {
            let ok = (g.is_nan() && w.is_nan()) || (*g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs());
            assert!(ok, "{what} at {k}: {g} vs {w}");
        }
    }

    fn geometries() -> Vec<Pool2d> {
        let mut v = vec![];
        for (k, s, d, pads, ceil, cip) in [
            ([3, 3], [1, 1], [1, 1], [1, 1, 1, 1], false, false),
            ([3, 3], [2, 2], [1, 1], [1, 1, 1, 1], true, true),
            ([2, 3], [2, 1], [1, 1], [0, 1, 1, 0], false, true),
            ([3, 2], [2, 3], [1, 1], [1, 0, 2, 1], true, false),
            ([2, 2], [2, 2], [1, 1], [0, 0, 0, 0], true, false),
            ([3, 3], [1, 2], [2, 2], [2, 1, 0, 2], true, false),
            ([1, 1], [1, 1], [1, 1], [0, 0, 0, 0], false, false),
            // SPP's stride-1 windows (separable, rows reduced first).
            ([5, 5], [1, 1], [1, 1], [2, 2, 2, 2], false, false),
            ([13, 13], [1, 1], [1, 1], [6, 6, 6, 6], false, true),
            ([9, 3], [1, 1], [1, 1], [4, 0, 4, 1], false, false),
        ] {
            v.push(Pool2d {
                kernel: k,
                strides: s,
                dilations: d,
                pads,
                ceil_mode: ceil,
                count_include_pad: cip,
            });
        }
        v
    }

    /// Against the interpreter's MaxPool/AveragePool: 1e-5 relative (+1e-5 absolute).
    #[test]
    fn pool2d_matches_interpreter() {
        for pool in pools() {
            for isa in isas() {
                for &[n, c, h, w] in &[
                    [1, 3, 7, 9],
                    [2, 20, 8, 5],
                    [1, 16, 11, 13],
                    [1, 5, 1, 1],
                    [1, 4, 6, 37],
                ] {
                    let x = lcg_data(n * c * h * w, 4.0, (c * h * w) as u64);
                    let xt = Tensor::from_vec(&[n, c, h, w], x.clone()).unwrap();
                    let block = 16;
                    let cb = c.div_ceil(block);
                    let mut xb = vec![f32::NAN; n * cb * h * w * block];
                    to_blocked(&x, &mut xb, n, c, h * w, block, pool.as_ref());
                    for p in geometries() {
                        if p.out_len(0, h).is_none() || p.out_len(1, w).is_none() {
                            continue;
                        }
                        // Dilated average pools are not in ONNX's AveragePool for all
                        // versions, but the interpreter takes them: test both kinds.
                        for (kind, op) in [
                            (PoolKind::Max, "MaxPool"),
                            (PoolKind::Average, "AveragePool"),
                        ] {
                            let outs = interp(op, &p, &xt, kind);
                            let [oh, ow] = p.out_dims(h, w);
                            assert_eq!(outs[0].shape(), &[n, c, oh, ow]);
                            let want = outs[0].to_f64_vec();
                            let mut y = vec![0.0; n * c * oh * ow];
                            let mut idx = vec![0i64; y.len()];
                            let ix = (kind == PoolKind::Max).then_some(&mut idx[..]);
                            pool2d_nchw_isa(
                                isa,
                                kind,
                                &p,
                                &x,
                                [n, c, h, w],
                                &mut y,
                                ix,
                                pool.as_ref(),
                            );
                            if kind == PoolKind::Max {
                                // Without indices (the AVX2 row path).
                                let mut y2 = vec![0.0; y.len()];
                                pool2d_nchw_isa(
                                    isa,
                                    kind,
                                    &p,
                                    &x,
                                    [n, c, h, w],
                                    &mut y2,
                                    None,
                                    pool.as_ref(),
                                );
                                close(&y2, &want, "MaxPool without indices");
                            }
                            let what = format!("{op} {p:?} {:?} {}", [n, c, h, w], isa.name());
                            close(&y, &want, &what);
                            if kind == PoolKind::Max {
                                assert_eq!(idx, outs[1].to_i64_vec(), "{what} indices");
                            }
                            let mut yb = vec![0.0; n * cb * oh * ow * block];
                            pool2d_blocked_isa(
                                isa,
                                kind,
                                &p,
                                &xb,
                                [n, c, h, w],
                                block,
                                &mut yb,
                                pool.as_ref(),
                            );
                            let mut yp = vec![0.0; n * c * oh * ow];
                            to_plain(&yb, &mut yp, n, c, oh * ow, block, pool.as_ref());
                            close(&yp, &want, &format!("{what} blocked"));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn global_pools_match_interpreter() {
        for pool in pools() {
            for isa in isas() {
                for &[n, c, h, w] in &[[1, 3, 7, 9], [2, 20, 8, 5], [1, 16, 1, 1], [3, 33, 30, 30]]
                {
                    let x = lcg_data(n * c * h * w, 4.0, (c * h) as u64);
                    let xt = Tensor::from_vec(&[n, c, h, w], x.clone()).unwrap();
                    for (kind, op) in [
                        (PoolKind::Max, "GlobalMaxPool"),
                        (PoolKind::Average, "GlobalAveragePool"),
                    ] {
                        let want = interp(op, &Pool2d::new([1, 1]), &xt, kind)[0].to_f64_vec();
                        let mut y = vec![0.0; n * c];
                        global_pool_nchw_isa(isa, kind, &x, n * c, h * w, &mut y, pool.as_ref());
                        close(&y, &want, op);
                        for block in [8, 16] {
                            let cb = c.div_ceil(block);
                            let mut xb = vec![0.0; n * cb * h * w * block];
                            to_blocked(&x, &mut xb, n, c, h * w, block, pool.as_ref());
                            let mut yb = vec![0.0; n * cb * block];
                            global_pool_blocked(
                                kind,
                                &xb,
                                n,
                                c,
                                h * w,
                                block,
                                &mut yb,
                                pool.as_ref(),
                            );
                            let mut yp = vec![0.0; n * c];
                            to_plain(&yb, &mut yp, n, c, 1, block, pool.as_ref());
                            close(&yp, &want, &format!("{op} blocked {block}"));
                        }
                    }
                }
            }
        }
    }
}
