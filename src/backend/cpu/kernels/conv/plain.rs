//! Plain-layout (NCHW) convolution with any groups: im2col + GEMM per (image, group),
//! `Y_g[OC/g × OH·OW] = W_g[OC/g × IC/g·KH·KW] · col[IC/g·KH·KW × OH·OW]`, with the bias
//! per row, the residual and the activation fused into the GEMM's epilogue. 1×1,
//! stride-1, unpadded convolutions multiply the input directly (no im2col). A 3-D
//! convolution's im2col matrix has a row per (channel, depth tap, row tap, column tap)
//! and a column per output voxel; each (row, output plane) is a 2-D im2col row.
use super::{valid_taps, ConvShape, Depth};
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
    conv_volume_scratch_len(s, &Depth::FLAT)
}

/// The f32 count of the scratch [`conv_im2col_volume`] needs, or 0: the im2col matrix
/// of one group's [`volume_chunk`] output planes.
pub fn conv_volume_scratch_len(s: &ConvShape, d: &Depth) -> usize {
    if reads_input_directly(s) && d.is_identity() {
        0
    } else {
        im2col_rows(s, d) * volume_chunk(s, d) * s.oh * s.ow
    }
}

/// Rows of one group's im2col matrix: (input channel, depth tap, row tap, column tap).
fn im2col_rows(s: &ConvShape, d: &Depth) -> usize {
    s.ic / s.groups * d.kernel * s.kh * s.kw
}

/// Floats of im2col matrix a chunk aims at: half a core's L2, so the GEMM reads its
/// right operand from cache rather than memory (a whole volume's matrix is the input
/// times the taps: tens of MB for a small 3-D layer).
const CHUNK_FLOATS: usize = 128 * 1024;

/// Output planes of a 3-D convolution gathered and multiplied at a time: as many as
/// fill [`CHUNK_FLOATS`], at least one (a 2-D convolution has one plane).
fn volume_chunk(s: &ConvShape, d: &Depth) -> usize {
    let per_plane = (im2col_rows(s, d) * s.oh * s.ow).max(1);
    (CHUNK_FLOATS / per_plane).clamp(1, d.output.max(1))
}

/// `y = act(conv(x, w) + bias + z)` on NCHW tensors, weights [OC, IC/g, KH, KW].
///
/// # Safety
/// `x` must hold N·IC·IH·IW floats, `w` OC·IC/g·KH·KW, `bias` OC, `y` and `z`
/// N·OC·OH·OW, `scratch` [`conv_plain_scratch_len`]; `y` and `scratch` must not overlap
/// each other or the inputs.
/// Depthwise-style convolutions (one input channel per group) run [`conv_depthwise`],
/// the others [`conv_im2col`].
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
    // SAFETY: the caller's contract covers both paths.
    unsafe {
        if s.groups > 1 && s.ic == s.groups {
            conv_depthwise(pool, s, w, bias, x, z, y, act)
        } else {
            conv_im2col(pool, s, w, bias, x, z, y, act, scratch)
        }
    }
}

/// [`conv_plain`] by im2col + GEMM whatever the groups.
///
/// # Safety
/// As [`conv_plain`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn conv_im2col(
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
    // SAFETY: the caller's contract, with the flat depth.
    unsafe { conv_im2col_volume(pool, s, &Depth::FLAT, w, bias, x, z, y, act, scratch) }
}

/// [`conv_im2col`] over volumes: x is [N, IC, D, IH, IW], w [OC, IC/g, KD, KH, KW] and
/// y [N, OC, OD, OH, OW], the depth axis described by `d`.
///
/// # Safety
/// As [`conv_plain`], with each plane count multiplied by its depth and `scratch`
/// holding [`conv_volume_scratch_len`] floats.
#[allow(clippy::too_many_arguments)]
pub unsafe fn conv_im2col_volume(
    pool: Option<&Pool>,
    s: &ConvShape,
    d: &Depth,
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
    let k = im2col_rows(s, d);
    let oplane = s.oh * s.ow;
    let (ivol, ovol) = (d.input * s.ih * s.iw, d.output * oplane);
    let direct = reads_input_directly(s) && d.is_identity();
    // The whole volume when the input is the operand, else chunks of output planes.
    let chunk = if direct { d.output } else { volume_chunk(s, d) };
    for n in 0..s.n {
        for gi in 0..g {
            // SAFETY: image n < N, group gi < g: its IC/g input channels start inside x.
            let xg = unsafe { x.add((n * s.ic + gi * icg) * ivol) };
            // SAFETY: the group's OC/g bias values start at gi·OC/g of the OC ones.
            let bias = bias.map_or(Bias::None, |b| Bias::PerRow(unsafe { b.add(gi * ocg) }));
            // SAFETY: the group's OC/g rows of k weights start at gi·OC/g·k in w.
            let a = Mat::rows(unsafe { w.add(gi * ocg * k) }, k);
            for oz0 in (0..d.output).step_by(chunk) {
                let planes = chunk.min(d.output - oz0);
                let cols = planes * oplane;
                let b = if direct {
                    Mat::rows(xg, ovol)
                } else {
                    // SAFETY: xg starts the group's IC/g input planes; scratch holds
                    // `conv_volume_scratch_len` floats: k rows of `chunk` planes.
                    unsafe { im2col(pool, s, d, xg, scratch, oz0..oz0 + planes) };
                    Mat::rows(scratch, cols)
                };
                let off = (n * s.oc + gi * ocg) * ovol + oz0 * oplane;
                // SAFETY: the chunk's columns of the group's OC/g output planes of image n
                // start at `off` in z, rows ovol apart.
                let residual = z.map(|z| (unsafe { z.add(off) }, ovol));
                let ep = Epilogue {
                    bias,
                    residual,
                    act,
                };
                // SAFETY: a is OC/g × k, b k × cols (x or scratch), and the chunk's
                // columns of the group's output planes at y + off take OC/g rows ovol
                // apart, apart from both.
                unsafe { gemm(pool, ocg, cols, k, a, b, y.add(off), ovol, &ep) };
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

/// Fills `col` [IC/g·KD·KH·KW × planes·OH·OW] from one group's channels at `xg` for the
/// output planes `planes`, zeros for padding.
unsafe fn im2col(
    pool: Option<&Pool>,
    s: &ConvShape,
    d: &Depth,
    xg: *const f32,
    col: *mut f32,
    planes: std::ops::Range<usize>,
) {
    let chunk = planes.len();
    let taps = d.kernel * s.kh * s.kw;
    let rows = s.ic / s.groups * taps;
    let (plane, oplane) = (s.ih * s.iw, s.oh * s.ow);
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
            let (c, tz, t2) = (r / taps, r % taps / (s.kh * s.kw), r % (s.kh * s.kw));
            for (i, oz) in planes.clone().enumerate() {
                // SAFETY: row r of col belongs to this task (its planes at i·OH·OW); x
                // per the caller's contract.
                unsafe {
                    let dst = sh.col.add((r * chunk + i) * oplane);
                    match d.input_plane(oz, tz) {
                        Some(iz) => im2col_row(s, sh.x.add((c * d.input + iz) * plane), t2, dst),
                        None => std::slice::from_raw_parts_mut(dst, oplane).fill(0.0),
                    }
                }
            }
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

/// Pointers the depthwise tasks share.
struct Dw {
    w: *const f32,
    bias: *const f32,
    x: *const f32,
    z: *const f32,
    y: *mut f32,
}
// SAFETY: tasks read w, bias, x, z and write disjoint output planes of y.
unsafe impl Sync for Dw {}

/// Direct convolution when every group has one input channel (depthwise, with any
/// channel multiplier OC/IC): per output plane, each kernel tap adds a scaled, shifted
/// input row to the output row (contiguous for stride 1, so it vectorizes).
///
/// # Safety
/// As [`conv_plain`] (no scratch); `s.ic` must equal `s.groups`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn conv_depthwise(
    pool: Option<&Pool>,
    s: &ConvShape,
    w: *const f32,
    bias: Option<*const f32>,
    x: *const f32,
    z: Option<*const f32>,
    y: *mut f32,
    act: Act,
) {
    let planes = s.n * s.oc;
    if planes == 0 || s.ic != s.groups {
        return;
    }
    let d = Dw {
        w,
        bias: bias.unwrap_or(std::ptr::null()),
        x,
        z: z.unwrap_or(std::ptr::null()),
        y,
    };
    let threads = pool.map_or(1, Pool::threads);
    let tasks = if threads <= 1 {
        1
    } else {
        (threads * 4).min(planes)
    };
    let body = |t: usize| {
        let d = &d;
        for plane in t * planes / tasks..(t + 1) * planes / tasks {
            // SAFETY: the plane belongs to this task; buffers per the caller's contract.
            unsafe { depthwise_plane(s, d, plane, act) };
        }
    };
    match pool {
        Some(pool) if tasks > 1 => pool.run(tasks, &body),
        _ => body(0),
    }
}

/// Output plane (n, o) of a depthwise convolution.
unsafe fn depthwise_plane(s: &ConvShape, d: &Dw, plane: usize, act: Act) {
    let (n, o) = (plane / s.oc, plane % s.oc);
    let c = o / (s.oc / s.groups);
    let sw = s.strides[1];
    let [dh, dw] = s.dilations;
    let ohw = s.oh * s.ow;
    // SAFETY: output plane `plane` < N·OC of y, OH·OW floats, this task's alone.
    let yp = unsafe { std::slice::from_raw_parts_mut(d.y.add(plane * ohw), ohw) };
    let xoff = (n * s.ic + c) * s.ih * s.iw;
    // SAFETY: input plane (n, c) of x, IH·IW floats; y does not overlap x.
    let xp = unsafe { std::slice::from_raw_parts(d.x.add(xoff), s.ih * s.iw) };
    // SAFETY: output channel o's KH·KW weights (one input channel per group).
    let wk = unsafe { std::slice::from_raw_parts(d.w.add(o * s.kh * s.kw), s.kh * s.kw) };
    let zp = if d.z.is_null() {
        None
    } else {
        // SAFETY: a non-null z holds N·OC·OH·OW floats: plane `plane` of it.
        Some(unsafe { std::slice::from_raw_parts(d.z.add(plane * ohw), ohw) })
    };
    let b = if d.bias.is_null() {
        0.0
    } else {
        // SAFETY: the bias holds OC values when present.
        unsafe { *d.bias.add(o) }
    };
    for (oy, yr) in yp.chunks_exact_mut(s.ow).enumerate() {
        yr.fill(b);
        let (ky0, ky1, iy0) = s.kh_range(oy);
        for ky in ky0..ky1 {
            let iy = iy0 + (ky - ky0) * dh;
            let xr = &xp[iy * s.iw..(iy + 1) * s.iw];
            for kx in 0..s.kw {
                let wv = wk[ky * s.kw + kx];
                let (ox0, ox1, ix0) = valid_taps(kx * dw, s.pad_left, s.ow, sw, s.iw);
                if ox0 >= ox1 {
                    continue;
                }
                let len = ox1 - ox0;
                let dst = &mut yr[ox0..ox1];
                if sw == 1 {
                    for (v, &xv) in dst.iter_mut().zip(&xr[ix0..ix0 + len]) {
                        *v += wv * xv;
                    }
                } else {
                    for (i, v) in dst.iter_mut().enumerate() {
                        *v += wv * xr[ix0 + i * sw];
                    }
                }
            }
        }
        if let Some(z) = zp {
            let zr = &z[oy * s.ow..(oy + 1) * s.ow];
            yr.iter_mut().zip(zr).for_each(|(v, r)| *v += r);
        }
        act.apply(yr);
    }
}
