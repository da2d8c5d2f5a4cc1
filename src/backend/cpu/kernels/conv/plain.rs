//! Plain-layout (NCHW) convolution with any groups: im2col + GEMM per (image, group),
//! `Y_g[OC/g × OH·OW] = W_g[OC/g × IC/g·KH·KW] · col[IC/g·KH·KW × OH·OW]`, with the bias
//! per row, the residual and the activation fused into the GEMM's epilogue. 1×1,
//! stride-1, unpadded convolutions multiply the input directly (no im2col).
use super::{valid_taps, ConvShape};
use crate::backend::cpu::kernels::gemm::{gemm, Bias, Epilogue, Mat};
use crate::backend::cpu::kernels::Act;
use crate::backend::cpu::pool::Pool;

/// Whether the input already is the GEMM's right operand.
fn reads_input_directly(s: &ConvShape) -> bool {
    s.kh == 1
        && s.kw == 1
        && s.strides == [1, 1]
        && s.pad_top == 0
        && s.pad_left == 0
        && s.oh == s.ih
        && s.ow == s.iw
}

/// The f32 count of the scratch [`conv_plain`] needs: one group's im2col matrix, or 0.
pub fn conv_plain_scratch_len(s: &ConvShape) -> usize {
    if reads_input_directly(s) {
        0
    } else {
        s.ic / s.groups * s.kh * s.kw * s.oh * s.ow
    }
}

/// `y = act(conv(x, w) + bias + z)` on NCHW tensors, weights [OC, IC/g, KH, KW].
///
/// # Safety
/// `x` must hold N·IC·IH·IW floats, `w` OC·IC/g·KH·KW, `bias` OC, `y` and `z`
/// N·OC·OH·OW, `scratch` [`conv_plain_scratch_len`]; `y` and `scratch` must not overlap
/// each other or the inputs.
#[allow(clippy::too_many_arguments)]
pub unsafe fn conv_plain(
    pool: Option<&Pool>,
    s: &ConvShape,
    w: *const f32,
    bias: Option<*const f32>,
    x: *const f32,
    z: Option<*const f32>,
    y: *mut f32,
    act: Act,
    scratch: *mut f32,
) {
    let g = s.groups;
    let (icg, ocg) = (s.ic / g, s.oc / g);
    let k = icg * s.kh * s.kw;
    let (ihw, ohw) = (s.ih * s.iw, s.oh * s.ow);
    let direct = reads_input_directly(s);
    for n in 0..s.n {
        for gi in 0..g {
            // SAFETY: offsets stay inside the buffers the caller sized per the contract.
            unsafe {
                let xg = x.add((n * s.ic + gi * icg) * ihw);
                let b = if direct {
                    Mat::rows(xg, ohw)
                } else {
                    im2col(pool, s, xg, scratch);
                    Mat::rows(scratch, ohw)
                };
                let off = (n * s.oc + gi * ocg) * ohw;
                let ep = Epilogue {
                    bias: bias.map_or(Bias::None, |b| Bias::PerRow(b.add(gi * ocg))),
                    residual: z.map(|z| (z.add(off), ohw)),
                    act,
                };
                let a = Mat::rows(w.add(gi * ocg * k), k);
                gemm(pool, ocg, ohw, k, a, b, y.add(off), ohw, &ep);
            }
        }
    }
}

/// A pointer the im2col tasks share.
#[derive(Clone, Copy)]
struct Shared {
    x: *const f32,
    col: *mut f32,
}
// SAFETY: tasks read x and write disjoint rows of col.
unsafe impl Sync for Shared {}

/// Fills `col` [IC/g·KH·KW × OH·OW] from one group's channels at `xg`, zeros for padding.
unsafe fn im2col(pool: Option<&Pool>, s: &ConvShape, xg: *const f32, col: *mut f32) {
    let rows = s.ic / s.groups * s.kh * s.kw;
    let sh = Shared { x: xg, col };
    let threads = pool.map_or(1, Pool::threads);
    let tasks = if threads <= 1 {
        1
    } else {
        (threads * 4).min(rows)
    };
    let body = |t: usize| {
        let sh = &sh;
        for r in t * rows / tasks..(t + 1) * rows / tasks {
            // SAFETY: row r of col belongs to this task; x per the caller's contract.
            unsafe { im2col_row(s, sh.x, r, sh.col.add(r * s.oh * s.ow)) };
        }
    };
    match pool {
        Some(pool) if tasks > 1 => pool.run(tasks, &body),
        _ => body(0),
    }
}

/// Row r = (c, ky, kx) of the im2col matrix.
unsafe fn im2col_row(s: &ConvShape, xg: *const f32, r: usize, dst: *mut f32) {
    let taps = s.kh * s.kw;
    let (c, t) = (r / taps, r % taps);
    let (ky, kx) = (t / s.kw, t % s.kw);
    let [sh, sw] = s.strides;
    let [dh, dw] = s.dilations;
    // SAFETY: dst holds OH·OW floats; reads stay in channel c's IH×IW image.
    let dst = unsafe { std::slice::from_raw_parts_mut(dst, s.oh * s.ow) };
    let xc = xg.wrapping_add(c * s.ih * s.iw);
    let (oy0, oy1, iy0) = valid_taps(ky * dh, s.pad_top, s.oh, sh, s.ih);
    let (ox0, ox1, ix0) = valid_taps(kx * dw, s.pad_left, s.ow, sw, s.iw);
    for (oy, d) in dst.chunks_exact_mut(s.ow).enumerate() {
        if oy < oy0 || oy >= oy1 || ox0 >= ox1 {
            d.fill(0.0);
            continue;
        }
        let iy = iy0 + (oy - oy0) * sh;
        // SAFETY: columns ix0 + i·sw for i < ox1-ox0 are inside row iy.
        let xr = unsafe { std::slice::from_raw_parts(xc.add(iy * s.iw), s.iw) };
        d[..ox0].fill(0.0);
        let len = ox1 - ox0;
        if sw == 1 {
            d[ox0..ox1].copy_from_slice(&xr[ix0..ix0 + len]);
        } else {
            for (i, v) in d[ox0..ox1].iter_mut().enumerate() {
                *v = xr[ix0 + i * sw];
            }
        }
        d[ox1..].fill(0.0);
    }
}
