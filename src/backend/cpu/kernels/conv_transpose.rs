//! Transposed convolution (`ConvTranspose`, the data gradient of `Conv`) on NCHW
//! tensors by GEMM + col2im: per image and group, `col[M/g·KH·KW × H·W] = W_gᵀ · X_g`
//! (W is [C, M/g, KH, KW], so W_gᵀ is a transposed view the GEMM packs), then each
//! column row (m, ky, kx) is added into output channel m shifted by the tap. The
//! col2im is split over output channels, the GEMM over the pool as usual. A 1-D one is
//! a 2-D one of one row; a 3-D one has a depth axis ([`Depth`]) over such planes: its
//! column rows are (m, kz, ky, kx), each holding every input plane.
use super::conv::Depth;
use super::gemm::{gemm_with_isa, Epilogue, Mat};
use super::par::{for_ranges, SyncPtr};
use crate::backend::cpu::isa::Isa;
use crate::backend::cpu::pool::Pool;

/// The geometry of a transposed convolution of [N, C, H, W] into [N, M, OH, OW] (or
/// of [N, C, D, H, W] into [N, M, OD, OH, OW] with a depth).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvTransposeShape {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub m: usize,
    pub kh: usize,
    pub kw: usize,
    pub oh: usize,
    pub ow: usize,
    /// [vertical, horizontal]
    pub strides: [usize; 2],
    /// The top and left pads: output (oy, ox) is position (oy + top, ox + left) of
    /// the full, unpadded result.
    pub pad_top: usize,
    pub pad_left: usize,
    pub dilations: [usize; 2],
    pub groups: usize,
    /// The depth axis: input planes D, output planes OD (whose front pad drops the
    /// first planes of the full result, like `pad_top`); [`Depth::FLAT`] in 2-D.
    pub depth: Depth,
}

impl ConvTransposeShape {
    /// Checks the channels against the groups.
    pub(crate) fn check(&self) -> Result<(), String> {
        let g = self.groups;
        if g == 0 || !self.c.is_multiple_of(g) || !self.m.is_multiple_of(g) {
            return Err(format!(
                "conv transpose: {} input and {} output channels do not split into {g} groups",
                self.c, self.m
            ));
        }
        let d = &self.depth;
        if self.strides.contains(&0)
            || self.dilations.contains(&0)
            || d.stride == 0
            || d.dilation == 0
        {
            return Err("conv transpose: strides and dilations must be positive".into());
        }
        Ok(())
    }

    /// Floats of scratch [`conv_transpose`] needs: one group's column matrix.
    pub(crate) fn scratch_len(&self) -> usize {
        let d = &self.depth;
        self.m / self.groups * d.kernel * self.kh * self.kw * d.input * self.h * self.w
    }
}

/// The input positions `i` in `0..len` whose output `i·stride + tap - pad` lies in
/// `0..out`, as a range.
fn valid(len: usize, stride: usize, tap: usize, pad: usize, out: usize) -> (usize, usize) {
    // i·stride ≥ pad - tap  and  i·stride + tap - pad ≤ out - 1.
    let lo = pad.saturating_sub(tap).div_ceil(stride);
    let hi = if out + pad < tap + 1 {
        0
    } else {
        ((out + pad - tap - 1) / stride + 1).min(len)
    };
    (lo.min(hi), hi)
}

/// `y = conv_transpose(x, w) + bias`.
///
/// # Safety
/// `x` must hold N·C·D·H·W floats, `w` C·M/g·KD·KH·KW, `bias` M, `y` N·M·OD·OH·OW and
/// `scratch` [`ConvTransposeShape::scratch_len`]; `y` and `scratch` must not overlap
/// each other or the inputs.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn conv_transpose(
    isa: Isa,
    pool: Option<&Pool>,
    s: &ConvTransposeShape,
    x: *const f32,
    w: *const f32,
    bias: Option<*const f32>,
    y: *mut f32,
    scratch: *mut f32,
) {
    let g = s.groups;
    let d = &s.depth;
    let (cg, mg) = (s.c / g, s.m / g);
    let taps = s.kh * s.kw;
    let rows = mg * d.kernel * taps;
    let (hw, ohw) = (s.h * s.w, s.oh * s.ow);
    let (vol, ovol) = (d.input * hw, d.output * ohw);
    let (yp, col) = (SyncPtr(y), SyncPtr(scratch));
    let bias = bias.map(|b| SyncPtr(b as *mut f32));
    for n in 0..s.n {
        for gi in 0..g {
            // A[r, c] = W[g·Cg + c, r]: W's rows for this group, transposed.
            let a = Mat {
                // SAFETY: group gi's Cg input channels of w start gi·Cg·rows floats in.
                ptr: unsafe { w.add(gi * cg * rows) },
                rs: 1,
                cs: rows,
            };
            // SAFETY: image n, group gi's Cg channel volumes start inside x.
            let b = Mat::rows(unsafe { x.add((n * s.c + gi * cg) * vol) }, vol);
            let none = &Epilogue::NONE;
            // SAFETY: a is rows × Cg, b Cg × vol, and scratch (`scratch_len` floats)
            // takes the rows × vol column matrix, apart from both.
            unsafe { gemm_with_isa(isa, pool, rows, vol, cg, a, b, scratch, vol, none) };
            let y0 = (n * s.m + gi * mg) * ovol;
            for_ranges(pool, mg, rows / mg * vol, &|range| {
                for m in range {
                    // SAFETY: channel m's volume belongs to this task; col is read-only now.
                    let out = unsafe {
                        std::slice::from_raw_parts_mut(yp.get().add(y0 + m * ovol), ovol)
                    };
                    // SAFETY: the bias has M values.
                    let b = bias.map_or(0.0, |b| unsafe { *b.get().add(gi * mg + m) });
                    out.fill(b);
                    for tz in 0..d.kernel {
                        for iz in 0..d.input {
                            // The output plane input plane iz reaches through depth tap tz.
                            let Some(oz) = (iz * d.stride + tz * d.dilation)
                                .checked_sub(d.pad)
                                .filter(|&oz| oz < d.output)
                            else {
                                continue;
                            };
                            let plane = &mut out[oz * ohw..(oz + 1) * ohw];
                            for t in 0..taps {
                                let r = (m * d.kernel + tz) * taps + t;
                                // SAFETY: row r of the column matrix has D·H·W floats.
                                let src = unsafe {
                                    std::slice::from_raw_parts(col.get().add(r * vol + iz * hw), hw)
                                };
                                add_tap(s, t / s.kw, t % s.kw, src, plane);
                            }
                        }
                    }
                }
            });
        }
    }
}

/// Adds one tap's column row (an H×W image) into an output plane, shifted and strided.
fn add_tap(s: &ConvTransposeShape, ky: usize, kx: usize, src: &[f32], plane: &mut [f32]) {
    let [sh, sw] = s.strides;
    let [dh, dw] = s.dilations;
    let (iy0, iy1) = valid(s.h, sh, ky * dh, s.pad_top, s.oh);
    let (ix0, ix1) = valid(s.w, sw, kx * dw, s.pad_left, s.ow);
    if ix0 >= ix1 {
        return;
    }
    let len = ix1 - ix0;
    for iy in iy0..iy1 {
        let oy = iy * sh + ky * dh - s.pad_top;
        let ox0 = ix0 * sw + kx * dw - s.pad_left;
        let row = &src[iy * s.w + ix0..iy * s.w + ix1];
        let out = &mut plane[oy * s.ow..(oy + 1) * s.ow];
        if sw == 1 {
            out[ox0..ox0 + len]
                .iter_mut()
                .zip(row)
                .for_each(|(o, v)| *o += v);
        } else {
            for (i, v) in row.iter().enumerate() {
                out[ox0 + i * sw] += v;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{lcg_data, pools};
    use super::*;

    /// The definition: every input element times every tap, added where it lands.
    fn reference(s: &ConvTransposeShape, x: &[f32], w: &[f32], bias: &[f32]) -> Vec<f32> {
        let (cg, mg) = (s.c / s.groups, s.m / s.groups);
        let mut y = vec![0.0f64; s.n * s.m * s.oh * s.ow];
        for (i, v) in y.iter_mut().enumerate() {
            *v = bias[(i / (s.oh * s.ow)) % s.m] as f64;
        }
        for n in 0..s.n {
            for c in 0..s.c {
                let gi = c / cg;
                for iy in 0..s.h {
                    for ix in 0..s.w {
                        let xv = x[((n * s.c + c) * s.h + iy) * s.w + ix] as f64;
                        for mi in 0..mg {
                            for ky in 0..s.kh {
                                for kx in 0..s.kw {
                                    let oy = (iy * s.strides[0] + ky * s.dilations[0]) as i64
                                        - s.pad_top as i64;
                                    let ox = (ix * s.strides[1] + kx * s.dilations[1]) as i64
                                        - s.pad_left as i64;
                                    if oy < 0 || ox < 0 || oy >= s.oh as i64 || ox >= s.ow as i64 {
                                        continue;
                                    }
                                    let wv = w[((c * mg + mi) * s.kh + ky) * s.kw + kx] as f64;
                                    let m = gi * mg + mi;
                                    y[((n * s.m + m) * s.oh + oy as usize) * s.ow + ox as usize] +=
                                        xv * wv;
                                }
                            }
                        }
                    }
                }
            }
        }
        y.iter().map(|&v| v as f32).collect()
    }

    #[test]
    fn matches_the_definition_on_ragged_shapes() {
        // (n, c, h, w, m, k, stride, pad, dilation, output_padding, groups)
        let cases = [
            (
                2,
                3,
                5,
                7,
                4,
                [3, 3],
                [1, 1],
                [1, 1, 1, 1],
                [1, 1],
                [0, 0],
                1,
            ),
            (
                1,
                4,
                6,
                5,
                6,
                [3, 2],
                [2, 2],
                [1, 0, 1, 1],
                [1, 1],
                [1, 1],
                2,
            ),
            (
                2,
                5,
                4,
                4,
                3,
                [2, 3],
                [2, 3],
                [0, 2, 1, 0],
                [2, 1],
                [1, 2],
                1,
            ),
            (1, 17, 9, 11, 19, [1, 1], [1, 1], [0; 4], [1, 1], [0, 0], 1),
            (
                3,
                8,
                7,
                7,
                8,
                [5, 5],
                [3, 1],
                [2, 2, 2, 2],
                [1, 2],
                [2, 0],
                4,
            ),
        ];
        for isa in [Isa::Portable, Isa::Avx2] {
            for pool in pools() {
                for (ci, &(n, c, h, w, m, k, st, p, d, op, g)) in cases.iter().enumerate() {
                    let full = |i: usize, a: usize| st[a] * (i - 1) + op[a] + d[a] * (k[a] - 1) + 1;
                    let s = ConvTransposeShape {
                        n,
                        c,
                        h,
                        w,
                        m,
                        kh: k[0],
                        kw: k[1],
                        oh: full(h, 0) - p[0] - p[2],
                        ow: full(w, 1) - p[1] - p[3],
                        strides: st,
                        pad_top: p[0],
                        pad_left: p[1],
                        dilations: d,
                        groups: g,
                        depth: Depth::FLAT,
                    };
                    s.check().unwrap();
                    let x = lcg_data(n * c * h * w, 1.0, ci as u64);
                    let wt = lcg_data(c * m / g * k[0] * k[1], 1.0, 10 + ci as u64);
                    let bias = lcg_data(m, 1.0, 20 + ci as u64);
                    let want = reference(&s, &x, &wt, &bias);
                    let mut y = vec![f32::NAN; want.len()];
                    let mut scratch = vec![0.0; s.scratch_len()];
                    let (xp, wp, bp) = (x.as_ptr(), wt.as_ptr(), Some(bias.as_ptr()));
                    let (yp, sp) = (y.as_mut_ptr(), scratch.as_mut_ptr());
                    // SAFETY: x, w, bias, y and scratch are sized from `s`; isa is one this CPU has.
                    unsafe { conv_transpose(isa, pool.as_ref(), &s, xp, wp, bp, yp, sp) };
                    for (i, (a, b)) in y.iter().zip(&want).enumerate() {
                        assert!(
                            (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                            "{s:?} at {i}: {a} vs {b}"
                        );
                    }
                }
            }
        }
    }
}
