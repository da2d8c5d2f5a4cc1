//! Convolutions with a small output and a large run-time filter: Conv's filter
//! gradient, which autodiff writes as a convolution of the input (batch and channels
//! swapped) with the output gradient as the filter (likewise swapped), whose output is
//! the kernel's few taps. im2col + GEMM would run one GEMM per image with N = OH·OW (9
//! for a 3×3 kernel) and repack the whole filter each time; here the input windows of
//! every output position (a, b) and image are the rows of one matrix, times Wᵀ in one
//! GEMM: `Y[n, :, a, b] = X_ab[n] · Wᵀ`, where X_ab[n] is image n's window at (a, b)
//! (copied by contiguous row runs, zeros for padding) and W the filter [OC × IC·KH·KW].
use super::conv::ConvShape;
use super::gemm::{gemm_with_isa, Epilogue, Mat};
use super::par::{for_ranges, SyncPtr};
use crate::backend::cpu::isa::Isa;
use crate::backend::cpu::pool::Pool;

/// Whether [`conv_per_position`] suits `s`: group 1, few output positions, enough
/// images to fill the GEMM's rows, and a filter much larger than the output.
pub(crate) fn per_position_suits(s: &ConvShape) -> bool {
    s.groups == 1 && s.oh * s.ow <= 64 && s.n >= 8 && s.kh * s.kw >= 4 * s.oh * s.ow
}

/// Floats of scratch [`conv_per_position`] needs: the window matrix of every position
/// and image, and the product.
pub(crate) fn per_position_scratch_len(s: &ConvShape) -> usize {
    let rows = s.oh * s.ow * s.n;
    rows * s.ic * s.kh * s.kw + rows * s.oc
}

/// `y = conv(x, w) + bias` on NCHW tensors (group 1): the windows of every output
/// position and image stacked as rows, times Wᵀ in one GEMM (so the large filter is
/// packed once).
///
/// # Safety
/// `x` must hold N·IC·IH·IW floats, `w` OC·IC·KH·KW, `bias` OC, `y` N·OC·OH·OW and
/// `scratch` [`per_position_scratch_len`]; `y` and `scratch` must not overlap each other
/// or the inputs.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn conv_per_position(
    isa: Isa,
    pool: Option<&Pool>,
    s: &ConvShape,
    x: *const f32,
    w: *const f32,
    bias: Option<*const f32>,
    y: *mut f32,
    scratch: *mut f32,
) {
    debug_assert_eq!(s.groups, 1);
    let k = s.ic * s.kh * s.kw;
    let ohw = s.oh * s.ow;
    let rows = ohw * s.n;
    let (win, res) = (scratch, scratch.wrapping_add(rows * k));
    let (xp, wp) = (SyncPtr(x as *mut f32), SyncPtr(win));
    // Row p·N + n: image n's window at output position p.
    for_ranges(pool, rows, k, &|range| {
        for r in range {
            let (p, n) = (r / s.n, r % s.n);
            // SAFETY: row r of the window matrix belongs to this task.
            let row = unsafe { std::slice::from_raw_parts_mut(wp.get().add(r * k), k) };
            // SAFETY: image n of x per the contract.
            unsafe {
                window(
                    s,
                    xp.get().add(n * s.ic * s.ih * s.iw),
                    p / s.ow,
                    p % s.ow,
                    row,
                )
            };
        }
    });
    // SAFETY: the window matrix is rows×K, W is OC×K (read transposed), the result
    // rows×OC, all per the contract.
    unsafe {
        let xa = Mat::rows(win, k);
        let wt = Mat::rows(w, k).t();
        gemm_with_isa(isa, pool, rows, s.oc, k, xa, wt, res, s.oc, &Epilogue::NONE);
    }
    for p in 0..ohw {
        for n in 0..s.n {
            for oc in 0..s.oc {
                // SAFETY: in bounds of y, res and bias per the contract.
                unsafe {
                    let v = *res.add((p * s.n + n) * s.oc + oc) + bias.map_or(0.0, |b| *b.add(oc));
                    *y.add((n * s.oc + oc) * ohw + p) = v;
                }
            }
        }
    }
}

/// The input window of output position (a, b) of one image, as (channel, ky, kx) rows.
///
/// # Safety
/// `x` must address one image (IC·IH·IW floats).
unsafe fn window(s: &ConvShape, x: *const f32, a: usize, b: usize, dst: &mut [f32]) {
    let [sh, sw] = s.strides;
    let [dh, dw] = s.dilations;
    // Input row of tap ky: a·sh + ky·dh - pad_top; valid kx: 0 ≤ b·sw + kx·dw - left < IW.
    let col0 = b * sw;
    let kx0 = s.pad_left.saturating_sub(col0).div_ceil(dw).min(s.kw);
    let kx1 = if s.iw + s.pad_left <= col0 {
        0
    } else {
        ((s.iw + s.pad_left - col0 - 1) / dw + 1).min(s.kw)
    }
    .max(kx0);
    for c in 0..s.ic {
        // SAFETY: channel c of the image.
        let xc = unsafe { std::slice::from_raw_parts(x.add(c * s.ih * s.iw), s.ih * s.iw) };
        for ky in 0..s.kh {
            let d = &mut dst[(c * s.kh + ky) * s.kw..(c * s.kh + ky + 1) * s.kw];
            let iy = (a * sh + ky * dh) as isize - s.pad_top as isize;
            if iy < 0 || iy >= s.ih as isize {
                d.fill(0.0);
                continue;
            }
            let row = &xc[iy as usize * s.iw..(iy as usize + 1) * s.iw];
            d[..kx0].fill(0.0);
            let ix0 = col0 + kx0 * dw - s.pad_left;
            if dw == 1 {
                d[kx0..kx1].copy_from_slice(&row[ix0..ix0 + kx1 - kx0]);
            } else {
                for (j, v) in d[kx0..kx1].iter_mut().enumerate() {
                    *v = row[ix0 + j * dw];
                }
            }
            d[kx1..].fill(0.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::conv::conv_im2col;
    use super::super::testutil::{lcg_data, pools};
    use super::super::Act;
    use super::*;

    #[test]
    fn matches_im2col_on_filter_gradient_shapes() {
        // (n, ic, input, oc, kernel, stride, pads, dilation): filter gradients of 3×3
        // convolutions (pad 1, stride 1 and 2) and ragged variants.
        let cases = [
            (9, 5, [7, 7], 6, [7, 7], [1, 1], [1, 1, 1, 1], [1, 1]),
            (8, 3, [9, 8], 5, [5, 4], [1, 1], [1, 1, 1, 1], [2, 2]),
            (10, 4, [6, 7], 3, [6, 7], [1, 1], [0, 0, 0, 0], [1, 1]),
            (12, 7, [11, 10], 17, [8, 9], [1, 1], [2, 1, 0, 2], [1, 1]),
        ];
        for isa in [Isa::Portable, Isa::Avx2] {
            for pool in pools() {
                for (ci, &(n, ic, i, oc, kk, st, p, d)) in cases.iter().enumerate() {
                    let s = ConvShape::new(n, ic, i, oc, kk, st, p, d, 1).unwrap();
                    let x = lcg_data(n * ic * i[0] * i[1], 1.0, ci as u64);
                    let w = lcg_data(oc * ic * kk[0] * kk[1], 1.0, 10 + ci as u64);
                    let bias = lcg_data(oc, 1.0, 20 + ci as u64);
                    let len = n * oc * s.oh * s.ow;
                    let mut want = vec![0.0; len];
                    let mut scratch = vec![
                        0.0;
                        super::super::conv::conv_plain_scratch_len(&s)
                            .max(per_position_scratch_len(&s))
                    ];
                    let (xp, wp, bp) = (x.as_ptr(), w.as_ptr(), Some(bias.as_ptr()));
                    let (sp, none) = (scratch.as_mut_ptr(), Act::None);
                    // SAFETY: x, w, y and scratch are sized from `s` as conv_im2col requires.
                    unsafe { conv_im2col(None, &s, wp, bp, xp, None, want.as_mut_ptr(), none, sp) };
                    let mut got = vec![f32::NAN; len];
                    let (pool, yp) = (pool.as_ref(), got.as_mut_ptr());
                    // SAFETY: the same buffers, with scratch sized for the per-position kernel too.
                    unsafe { conv_per_position(isa, pool, &s, xp, wp, bp, yp, sp) };
                    for (j, (a, b)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                            "{s:?} at {j}: {a} vs {b}"
                        );
                    }
                }
            }
        }
    }
}
