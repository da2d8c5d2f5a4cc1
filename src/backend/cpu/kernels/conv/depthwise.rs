//! Direct depthwise convolution on NCHW16c tensors (groups = input channels = output
//! channels): one vector is 16 channels of one pixel, and each output pixel is the sum
//! over the KH×KW taps of input pixel × tap weights, lane by lane — no reduction
//! across lanes, so the work is vector FMAs with one weight vector per tap.
//!
//! Weights are packed once into [C/16][KH][KW][16] with zeros for pad channels and the
//! bias zero-extended. In a partial last block the input's pad lanes (unspecified,
//! possibly non-finite) are masked off at every load, as are the residual's, so the
//! output's pad lanes come out zero-based and finite.
//!
//! A task computes whole output rows of one block. Like [`super::blocked`], each row
//! visits only its valid kernel rows, runs the interior columns in groups of up to
//! [`UR_512`] (AVX-512) / [`UR_AVX2`] pixels register-blocked along the row, and each
//! border pixel alone with its own valid kernel columns. Short groups split their sums
//! over two accumulator chains (even and odd kernel rows) so a lone border pixel is not
//! bound by the FMA latency. ReLU, Clip and HardSwish are applied in registers; the
//! other activations to each finished row.
use super::{ConvShape, BLOCK};
use crate::backend::cpu::isa::{self, Isa};
use crate::backend::cpu::kernels::par::{for_ranges, SyncPtr};
use crate::backend::cpu::kernels::{math, Act};
use crate::backend::cpu::pool::Pool;

/// Pixels per AVX-512 group: 8 chains of FMAs cover 2 FMA ports × 4 cycles of latency.
const UR_512: usize = 8;
/// Pixels per AVX2 group: 2·6 accumulators + 2 weights + 1 input ≤ 16 ymm registers.
const UR_AVX2: usize = 6;
/// Groups of up to this many pixels split their sums over two chains (see the module
/// docs).
const PAIR_BELOW: usize = 5;

/// Depthwise weights and bias packed for [`conv_depthwise_blocked`].
#[derive(Debug, Clone)]
pub struct PackedDepthwise {
    shape: ConvShape,
    blocks: usize,
    /// [blocks][KH][KW][16], zero past C.
    w: Vec<f32>,
    /// blocks·16 values, zero past C.
    bias: Vec<f32>,
    /// Channels in the last block (16 when C fills it).
    tail: usize,
}

impl PackedDepthwise {
    /// Packs plain [C, 1, KH, KW] weights and an optional [C] bias of a convolution with
    /// C groups of one input and one output channel each.
    pub fn new(
        shape: ConvShape,
        w: &[f32],
        bias: Option<&[f32]>,
    ) -> Result<PackedDepthwise, String> {
        let s = shape;
        if s.groups != s.ic || s.oc != s.ic {
            return Err(format!(
                "a blocked depthwise conv has one channel per group, not {} in and {} out \
                 channels in {} groups",
                s.ic, s.oc, s.groups
            ));
        }
        s.check_weights(w, bias)?;
        let taps = s.kh * s.kw;
        let blocks = s.ic.div_ceil(BLOCK);
        let mut pw = vec![0.0f32; blocks * taps * BLOCK];
        for c in 0..s.ic {
            for t in 0..taps {
                pw[((c / BLOCK) * taps + t) * BLOCK + c % BLOCK] = w[c * taps + t];
            }
        }
        let mut pb = vec![0.0f32; blocks * BLOCK];
        if let Some(b) = bias {
            pb[..s.ic].copy_from_slice(b);
        }
        Ok(PackedDepthwise {
            shape,
            blocks,
            w: pw,
            bias: pb,
            tail: s.ic - (blocks - 1) * BLOCK,
        })
    }

    /// f32 count of the NCHW16c input.
    pub fn x_len(&self) -> usize {
        let s = &self.shape;
        s.n * self.blocks * s.ih * s.iw * BLOCK
    }

    /// f32 count of the NCHW16c output (and residual).
    pub fn y_len(&self) -> usize {
        let s = &self.shape;
        s.n * self.blocks * s.oh * s.ow * BLOCK
    }
}

/// The activations applied in registers; the others go to [`Act::apply_isa`] per row.
#[derive(Debug, Clone, Copy, PartialEq)]
enum InReg {
    None,
    Relu,
    Clip(f32, f32),
    HardSwish,
}

/// `y = act(depthwise_conv(x) + bias + z)` on NCHW16c tensors, using [`isa::isa`]'s
/// path.
///
/// # Safety
/// `x` must hold [`PackedDepthwise::x_len`] floats, `y` and `z`
/// [`PackedDepthwise::y_len`]; `y` must not overlap `x`; it may be exactly `z`.
pub unsafe fn conv_depthwise_blocked(
    pool: Option<&Pool>,
    p: &PackedDepthwise,
    x: *const f32,
    z: Option<*const f32>,
    y: *mut f32,
    act: Act,
) {
    // SAFETY: the `_isa` variant has the same contract on x, z and y, and caps
    // `isa::isa()` by what the CPU has.
    unsafe { conv_depthwise_blocked_isa(isa::isa(), pool, p, x, z, y, act) }
}

/// The paths a call may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    Portable,
    Avx2,
    Avx512,
}

/// Pointers and choices shared by the tasks of one call.
struct Ctx<'a> {
    p: &'a PackedDepthwise,
    x: *const f32,
    /// Null without a residual.
    z: *const f32,
    y: SyncPtr<f32>,
    path: Path,
    isa: Isa,
    in_reg: InReg,
    /// Applied to each finished row ([`Act::None`] when done in registers).
    per_row: Act,
}

// SAFETY: tasks write disjoint output rows and only read x, z and the weights.
unsafe impl Sync for Ctx<'_> {}

/// [`conv_depthwise_blocked`] with an explicit instruction set (capped by what the CPU
/// has).
///
/// # Safety
/// As [`conv_depthwise_blocked`].
pub unsafe fn conv_depthwise_blocked_isa(
    isa: Isa,
    pool: Option<&Pool>,
    p: &PackedDepthwise,
    x: *const f32,
    z: Option<*const f32>,
    y: *mut f32,
    act: Act,
) {
    let s = &p.shape;
    let rows = s.n * p.blocks * s.oh;
    if rows == 0 || s.ow == 0 {
        return;
    }
    let path = if math::use_avx512(isa) {
        Path::Avx512
    } else if math::use_avx2(isa) {
        Path::Avx2
    } else {
        Path::Portable
    };
    let (in_reg, per_row) = match (path, act) {
        (Path::Portable, a) => (InReg::None, a),
        (_, Act::Relu) => (InReg::Relu, Act::None),
        (_, Act::Clip(lo, hi)) => (InReg::Clip(lo, hi), Act::None),
        (_, Act::HardSwish) => (InReg::HardSwish, Act::None),
        (_, a) => (InReg::None, a),
    };
    let ctx = Ctx {
        p,
        x,
        z: z.unwrap_or(std::ptr::null()),
        y: SyncPtr(y),
        path,
        isa,
        in_reg,
        per_row,
    };
    let work = s.ow * BLOCK * s.kh * s.kw;
    for_ranges(pool, rows, work, &|range| {
        for r in range {
            // SAFETY: each row is written by one task; the caller vouches for buffers.
            unsafe { row(&ctx, r) }
        }
    });
}

/// Strides (floats) and the epilogue of one micro-kernel call.
struct Tile {
    nkh: usize,
    xs_kh: usize,
    xs_kw: usize,
    xs_px: usize,
    ws_kh: usize,
    bias: *const f32,
    /// Lanes holding channels (the last block's may be fewer than 16).
    lanes: usize,
    in_reg: InReg,
}

/// Flattened output row `r` of (image, block, oy).
unsafe fn row(c: &Ctx, r: usize) {
    let p = c.p;
    let s = &p.shape;
    let (plane, oy) = (r / s.oh, r % s.oh);
    let blk = plane % p.blocks;
    let (kh0, kh1, iy0) = s.kh_range(oy);
    let t = Tile {
        nkh: kh1 - kh0,
        xs_kh: s.dilations[0] * s.iw * BLOCK,
        xs_kw: s.dilations[1] * BLOCK,
        xs_px: s.strides[1] * BLOCK,
        ws_kh: s.kw * BLOCK,
        bias: p.bias[blk * BLOCK..].as_ptr(),
        lanes: if blk + 1 == p.blocks { p.tail } else { BLOCK },
        in_reg: c.in_reg,
    };
    let xrow = c.x.wrapping_add((plane * s.ih + iy0) * s.iw * BLOCK);
    let wrow = p.w.as_ptr().wrapping_add((blk * s.kh + kh0) * s.kw * BLOCK);
    let yoff = r * s.ow * BLOCK;
    let yrow = c.y.get().wrapping_add(yoff);
    let zrow = if c.z.is_null() {
        c.z
    } else {
        c.z.wrapping_add(yoff)
    };
    let zpx = |ox: usize| {
        if zrow.is_null() {
            zrow
        } else {
            zrow.wrapping_add(ox * BLOCK)
        }
    };
    let border = |ox: usize| {
        let (kw0, kw1, ix0) = s.kw_range(ox);
        let nkw = kw1 - kw0;
        let (xp, wp) = (
            xrow.wrapping_add(ix0 * BLOCK),
            wrow.wrapping_add(kw0 * BLOCK),
        );
        let yp = yrow.wrapping_add(ox * BLOCK);
        // SAFETY: border pixel ox's taps kw0..kw1 read inside the input row; its output
        // pixel is in this task's row.
        unsafe { tile(c.path, 1, &t, nkw, xp, wp, yp, zpx(ox)) }
    };
    let (lo, hi) = s.interior_cols();
    (0..lo).for_each(border);
    let ur = if c.path == Path::Avx2 {
        UR_AVX2
    } else {
        UR_512
    };
    // Equal groups (9 pixels as 5 + 4, not 8 + 1: a lone pixel is the slowest).
    let groups = (hi - lo).div_ceil(ur);
    let mut ox = lo;
    for g in 0..groups {
        let end = lo + (hi - lo) * (g + 1) / groups;
        let n = end - ox;
        let ix0 = ox * s.strides[1] - s.pad_left;
        let (xp, yp) = (
            xrow.wrapping_add(ix0 * BLOCK),
            yrow.wrapping_add(ox * BLOCK),
        );
        // SAFETY: the n interior pixels from ox (end <= hi) read all kernel columns inside
        // the input row and write this task's row.
        unsafe { tile(c.path, n, &t, s.kw, xp, wrow, yp, zpx(ox)) };
        ox = end;
    }
    (hi..s.ow).for_each(border);
    if c.per_row != Act::None {
        // SAFETY: this task owns the row, which holds ow·16 finished floats.
        let y = unsafe { std::slice::from_raw_parts_mut(yrow, s.ow * BLOCK) };
        c.per_row.apply_isa(c.isa, y);
    }
}

/// Runs the micro-kernel of `path` for `r` (1..=8) pixels `t.xs_px` apart, each over
/// `t.nkh` kernel rows × `nkw` kernel columns from `x` (input) and `w` (weights).
///
/// # Safety
/// `path` is one the CPU has; `x` addresses the first pixel's first tap, and every tap
/// (`t.xs_kh` a kernel row, `t.xs_kw` a column) of the `r` pixels (`t.xs_px` apart) is
/// 16 floats inside x; `w` the taps' weights (`t.ws_kh` a row, 16 a column); `y` the
/// `r` output pixels' 16 floats each, owned by the call; `z` null or laid out as `y`;
/// `t.bias` 16 floats.
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    path: Path,
    r: usize,
    t: &Tile,
    nkw: usize,
    x: *const f32,
    w: *const f32,
    y: *mut f32,
    z: *const f32,
) {
    let masked = t.lanes < BLOCK;
    macro_rules! go {
        ($($n:literal)*) => {
            match r {
                $($n => {
                    #[cfg(target_arch = "x86_64")]
                    match (path, masked, $n < PAIR_BELOW) {
                        (Path::Avx512, false, false) => {
                            // SAFETY: `path` is Avx512 only when the CPU has AVX-512F; full lanes, R = $n ≥ PAIR_BELOW.
                            return unsafe { tile_avx512::<$n, false, false>(t, nkw, x, w, y, z) }
                        }
                        (Path::Avx512, false, true) => {
                            // SAFETY: AVX-512F present (the Avx512 path); a short group of full lanes pairs its rows.
                            return unsafe { tile_avx512::<$n, false, true>(t, nkw, x, w, y, z) }
                        }
                        (Path::Avx512, true, false) => {
                            // SAFETY: the CPU has AVX-512F on this path; MASKED reads only `t.lanes` lanes.
                            return unsafe { tile_avx512::<$n, true, false>(t, nkw, x, w, y, z) }
                        }
                        (Path::Avx512, true, true) => {
                            // SAFETY: AVX-512F checked when the path was chosen; a short, partial-block group.
                            return unsafe { tile_avx512::<$n, true, true>(t, nkw, x, w, y, z) }
                        }
                        (Path::Avx2, false, _) => {
                            // SAFETY: `path` is Avx2 only when the CPU has AVX2 and FMA; the
                            // pointers are this fn's, for R = $n.
                            return unsafe { tile_avx2::<$n, false>(t, nkw, x, w, y, z) }
                        }
                        (Path::Avx2, true, _) => {
                            // SAFETY: AVX2+FMA present (the Avx2 path); MASKED zeroes the pad
                            // lanes it reads inside the block.
                            return unsafe { tile_avx2::<$n, true>(t, nkw, x, w, y, z) }
                        }
                        (Path::Portable, ..) => {}
                    }
                    // SAFETY: the portable kernel needs no CPU feature, only this fn's
                    // pointers for R = $n.
                    unsafe { tile_portable::<$n>(t, nkw, x, w, y, z) }
                })*
                _ => unreachable!("groups hold 1 to {UR_512} pixels"),
            }
        };
    }
    let _ = (path, masked);
    go!(1 2 3 4 5 6 7 8)
}

/// The micro-kernel in plain Rust over the first `t.lanes` lanes (the others are 0).
///
/// # Safety
/// As [`tile`] with `r` = R.
unsafe fn tile_portable<const R: usize>(
    t: &Tile,
    nkw: usize,
    x: *const f32,
    w: *const f32,
    y: *mut f32,
    z: *const f32,
) {
    let nc = t.lanes;
    let mut acc = [[0.0f32; BLOCK]; R];
    // SAFETY: `t.bias` points at the 16 bias floats of the row's block.
    let bias = unsafe { std::slice::from_raw_parts(t.bias, BLOCK) };
    for a in acc.iter_mut() {
        a.copy_from_slice(bias);
    }
    for kh in 0..t.nkh {
        for kw in 0..nkw {
            // SAFETY: tap (kh < t.nkh, kw < nkw)'s weights, of which the first nc lanes
            // are the block's channels.
            let wv = unsafe { std::slice::from_raw_parts(w.add(kh * t.ws_kh + kw * BLOCK), nc) };
            // SAFETY: the same tap of the first pixel, inside x by the `tile` contract.
            let xp = unsafe { x.add(kh * t.xs_kh + kw * t.xs_kw) };
            for (r, a) in acc.iter_mut().enumerate() {
                // SAFETY: pixel r < R's tap, xs_px floats on; its nc real lanes only.
                let xv = unsafe { std::slice::from_raw_parts(xp.add(r * t.xs_px), nc) };
                for ((av, &xv), &wv) in a.iter_mut().zip(xv).zip(wv) {
                    *av += xv * wv;
                }
            }
        }
    }
    for (r, a) in acc.iter_mut().enumerate() {
        if !z.is_null() {
            // SAFETY: a non-null z holds pixel r < R's residual at r·16 (nc real lanes),
            // read before y's same pixel is written just below.
            let zs = unsafe { std::slice::from_raw_parts(z.add(r * BLOCK), nc) };
            a.iter_mut().zip(zs).for_each(|(v, z)| *v += z);
        }
        // SAFETY: output pixel r < R's 16 floats at y + r·16 are this call's; the z view
        // above is dead.
        let out = unsafe { std::slice::from_raw_parts_mut(y.add(r * BLOCK), BLOCK) };
        out.copy_from_slice(a);
    }
}

/// The AVX-512 micro-kernel: one zmm accumulator per pixel (two, for even and odd
/// kernel rows, with `PAIR`); `MASKED` loads only the first `t.lanes` lanes of x and z.
/// Unaligned loads and stores throughout.
///
/// # Safety
/// The CPU has AVX-512F; the pointers as [`tile`] with `r` = R.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn tile_avx512<const R: usize, const MASKED: bool, const PAIR: bool>(
    t: &Tile,
    nkw: usize,
    x: *const f32,
    w: *const f32,
    y: *mut f32,
    z: *const f32,
) {
    use std::arch::x86_64::*;
    let m: __mmask16 = ((1u32 << t.lanes) - 1) as __mmask16;
    // The 16 lanes of a pixel at `p`, only the first `t.lanes` with MASKED. Only the
    // calls below use it, each on a pixel of x or z whose pointer step says why.
    let load = |p: *const f32| {
        // SAFETY: every call passes a tap or residual pixel of the `tile` contract: 16
        // readable floats (the first t.lanes read with MASKED); this closure runs only
        // inside this AVX-512F fn.
        unsafe {
            if MASKED {
                _mm512_maskz_loadu_ps(m, p)
            } else {
                _mm512_loadu_ps(p)
            }
        }
    };
    // SAFETY: `t.bias` is 16 floats of the packed bias (its block's).
    let mut acc = [unsafe { _mm512_loadu_ps(t.bias) }; R];
    let mut odd = [_mm512_setzero_ps(); R];
    // Kernel row kh into `a`.
    macro_rules! kernel_row {
        ($a:expr, $kh:expr) => {
            // SAFETY: kernel row `$kh` < t.nkh of the first pixel, inside x.
            let xr = unsafe { x.add($kh * t.xs_kh) };
            // SAFETY: that kernel row's weights, ws_kh floats a row.
            let wr = unsafe { w.add($kh * t.ws_kh) };
            for kw in 0..nkw {
                // SAFETY: tap kw < nkw's 16 weights (zero past the block's channels).
                let wv = unsafe { _mm512_loadu_ps(wr.add(kw * BLOCK)) };
                // SAFETY: the first pixel's tap kw of the row, xs_kw floats a column.
                let xp = unsafe { xr.add(kw * t.xs_kw) };
                for (r, a) in $a.iter_mut().enumerate() {
                    // SAFETY: pixel r < R at that tap (xs_px a pixel) is inside x; MASKED
                    // keeps a partial block's loads to its real lanes.
                    *a = _mm512_fmadd_ps(load(unsafe { xp.add(r * t.xs_px) }), wv, *a);
                }
            }
        };
    }
    if PAIR {
        let mut kh = 0;
        while kh + 1 < t.nkh {
            kernel_row!(acc, kh);
            kernel_row!(odd, kh + 1);
            kh += 2;
        }
        if kh < t.nkh {
            kernel_row!(acc, kh);
        }
        for (a, o) in acc.iter_mut().zip(&odd) {
            *a = _mm512_add_ps(*a, *o);
        }
    } else {
        for kh in 0..t.nkh {
            kernel_row!(acc, kh);
        }
    }
    if !z.is_null() {
        for (r, a) in acc.iter_mut().enumerate() {
            // SAFETY: z is not null: pixel r < R's residual at z + r·16 (its real lanes
            // with MASKED), read before the stores below (y may be z's buffer).
            *a = _mm512_add_ps(*a, load(unsafe { z.add(r * BLOCK) }));
        }
    }
    let zero = _mm512_setzero_ps();
    // max/min return the second operand when either is NaN: NaN stays NaN.
    match t.in_reg {
        InReg::None => {}
        InReg::Relu => acc.iter_mut().for_each(|a| *a = _mm512_max_ps(zero, *a)),
        InReg::Clip(lo, hi) => {
            let (lo, hi) = (_mm512_set1_ps(lo), _mm512_set1_ps(hi));
            acc.iter_mut()
                .for_each(|a| *a = _mm512_min_ps(hi, _mm512_max_ps(lo, *a)));
        }
        InReg::HardSwish => {
            let (sixth, half) = (_mm512_set1_ps(1.0 / 6.0), _mm512_set1_ps(0.5));
            let one = _mm512_set1_ps(1.0);
            for a in acc.iter_mut() {
                let h = _mm512_fmadd_ps(*a, sixth, half);
                *a = _mm512_mul_ps(*a, _mm512_min_ps(one, _mm512_max_ps(zero, h)));
            }
        }
    }
    for (r, a) in acc.iter().enumerate() {
        // SAFETY: the call owns output pixel r < R: 16 floats at y + r·16.
        unsafe { _mm512_storeu_ps(y.add(r * BLOCK), *a) };
    }
}

/// The AVX2+FMA micro-kernel: two ymm accumulators per pixel; `MASKED` zeroes the pad
/// lanes of x and z after loading them (the loads stay inside the block). Unaligned
/// loads and stores throughout.
///
/// # Safety
/// The CPU has AVX2 and FMA; the pointers as [`tile`] with `r` = R.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2<const R: usize, const MASKED: bool>(
    t: &Tile,
    nkw: usize,
    x: *const f32,
    w: *const f32,
    y: *mut f32,
    z: *const f32,
) {
    use std::arch::x86_64::*;
    let lane = |i: i32| if (i as usize) < t.lanes { -1 } else { 0 };
    let m0 = _mm256_castsi256_ps(_mm256_setr_epi32(
        lane(0),
        lane(1),
        lane(2),
        lane(3),
        lane(4),
        lane(5),
        lane(6),
        lane(7),
    ));
    let m1 = _mm256_castsi256_ps(_mm256_setr_epi32(
        lane(8),
        lane(9),
        lane(10),
        lane(11),
        lane(12),
        lane(13),
        lane(14),
        lane(15),
    ));
    // The 16 lanes of a pixel at `p` as two halves, pad lanes zeroed with MASKED. Only
    // the calls below use it, each on a pixel of x or z whose pointer step says why.
    let load = |p: *const f32| {
        // SAFETY: every call passes a tap or residual pixel of the `tile` contract, 16
        // readable floats (pad lanes inside the block); the closure runs only inside
        // this AVX2+FMA fn.
        unsafe {
            let (a, b) = (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)));
            if MASKED {
                (_mm256_and_ps(a, m0), _mm256_and_ps(b, m1))
            } else {
                (a, b)
            }
        }
    };
    // SAFETY: `t.bias` holds the 16 bias floats of the row's block.
    let (b0, b1) = unsafe { (_mm256_loadu_ps(t.bias), _mm256_loadu_ps(t.bias.add(8))) };
    let mut acc = [[b0, b1]; R];
    for kh in 0..t.nkh {
        // SAFETY: kernel row kh < t.nkh of the first pixel, inside x by the contract.
        let xr = unsafe { x.add(kh * t.xs_kh) };
        // SAFETY: kernel row kh's packed weights, ws_kh floats a row.
        let wr = unsafe { w.add(kh * t.ws_kh) };
        for kw in 0..nkw {
            // SAFETY: tap kw < nkw's 16 weights at wr + kw·16, as two halves.
            let (w0, w1) = unsafe {
                (
                    _mm256_loadu_ps(wr.add(kw * BLOCK)),
                    _mm256_loadu_ps(wr.add(kw * BLOCK + 8)),
                )
            };
            // SAFETY: column kw of the row for the first pixel (xs_kw a column).
            let xp = unsafe { xr.add(kw * t.xs_kw) };
            for (r, a) in acc.iter_mut().enumerate() {
                // SAFETY: pixel r < R's whole 16-float tap (xs_px a pixel) is inside x;
                // pad lanes are read, inside the block, and masked.
                let (x0, x1) = load(unsafe { xp.add(r * t.xs_px) });
                a[0] = _mm256_fmadd_ps(x0, w0, a[0]);
                a[1] = _mm256_fmadd_ps(x1, w1, a[1]);
            }
        }
    }
    if !z.is_null() {
        for (r, a) in acc.iter_mut().enumerate() {
            // SAFETY: a non-null z holds pixel r < R's 16 residual floats at z + r·16,
            // read before y's stores (y may be z's buffer).
            let (z0, z1) = load(unsafe { z.add(r * BLOCK) });
            a[0] = _mm256_add_ps(a[0], z0);
            a[1] = _mm256_add_ps(a[1], z1);
        }
    }
    let zero = _mm256_setzero_ps();
    // max/min return the second operand when either is NaN: NaN stays NaN.
    let f = |v: __m256| match t.in_reg {
        InReg::None => v,
        InReg::Relu => _mm256_max_ps(zero, v),
        InReg::Clip(lo, hi) => {
            _mm256_min_ps(_mm256_set1_ps(hi), _mm256_max_ps(_mm256_set1_ps(lo), v))
        }
        InReg::HardSwish => {
            let h = _mm256_fmadd_ps(v, _mm256_set1_ps(1.0 / 6.0), _mm256_set1_ps(0.5));
            let one = _mm256_set1_ps(1.0);
            _mm256_mul_ps(v, _mm256_min_ps(one, _mm256_max_ps(zero, h)))
        }
    };
    for (r, a) in acc.iter().enumerate() {
        // SAFETY: the call owns output pixel r < R's 16 floats at y + r·16.
        unsafe {
            _mm256_storeu_ps(y.add(r * BLOCK), f(a[0]));
            _mm256_storeu_ps(y.add(r * BLOCK + 8), f(a[1]));
        }
    }
}

#[cfg(test)]
mod tests {
    //! Against a naive f64 reference. Tolerance: |got − want| ≤ 1e-5·(1 + Σ|x·w| +
    //! |bias| + |z|) per output (at most 25 products per sum).
    use super::*;
    use crate::backend::cpu::kernels::conv::tests::{block, unblock};
    use crate::backend::cpu::kernels::math::tests::isas;
    use crate::backend::cpu::kernels::testutil::{lcg_data, pools};

    #[derive(Clone, Copy, Debug)]
    struct Case {
        n: usize,
        c: usize,
        hw: [usize; 2],
        k: [usize; 2],
        s: [usize; 2],
        /// [top, left, bottom, right]
        p: [usize; 4],
        d: [usize; 2],
        bias: bool,
        res: bool,
        act: Act,
    }

    /// Pre-activation outputs and their error scales, NCHW.
    fn reference(
        s: &ConvShape,
        x: &[f32],
        w: &[f32],
        b: Option<&[f32]>,
        z: Option<&[f32]>,
    ) -> (Vec<f64>, Vec<f64>) {
        let mut out = vec![0.0; s.n * s.oc * s.oh * s.ow];
        let mut scale = vec![0.0; out.len()];
        for n in 0..s.n {
            for c in 0..s.oc {
                for oy in 0..s.oh {
                    for ox in 0..s.ow {
                        let i = ((n * s.oc + c) * s.oh + oy) * s.ow + ox;
                        let mut acc = b.map_or(0.0, |b| f64::from(b[c]));
                        let mut mag = acc.abs();
                        for ky in 0..s.kh {
                            for kx in 0..s.kw {
                                let iy = (oy * s.strides[0] + ky * s.dilations[0])
                                    .checked_sub(s.pad_top)
                                    .filter(|&v| v < s.ih);
                                let ix = (ox * s.strides[1] + kx * s.dilations[1])
                                    .checked_sub(s.pad_left)
                                    .filter(|&v| v < s.iw);
                                let (Some(iy), Some(ix)) = (iy, ix) else {
                                    continue;
                                };
                                let xv = f64::from(x[((n * s.ic + c) * s.ih + iy) * s.iw + ix]);
                                let wv = f64::from(w[(c * s.kh + ky) * s.kw + kx]);
                                acc += xv * wv;
                                mag += (xv * wv).abs();
                            }
                        }
                        if let Some(z) = z {
                            acc += f64::from(z[i]);
                            mag += f64::from(z[i]).abs();
                        }
                        out[i] = acc;
                        scale[i] = 1.0 + mag;
                    }
                }
            }
        }
        (out, scale)
    }

    /// Runs `c` on every path and pool, out of place and (with a residual) in place
    /// on z's buffer, and checks each against the reference.
    fn run(c: &Case, seed: u64) {
        let s = ConvShape::new(c.n, c.c, c.hw, c.c, c.k, c.s, c.p, c.d, c.c).unwrap();
        let x = lcg_data(s.n * s.ic * s.ih * s.iw, 1.0, seed);
        let w = lcg_data(s.oc * s.kh * s.kw, 1.0, seed + 1);
        let b = c.bias.then(|| lcg_data(s.oc, 1.0, seed + 2));
        let z = c
            .res
            .then(|| lcg_data(s.n * s.oc * s.oh * s.ow, 1.0, seed + 3));
        let (want, scale) = reference(&s, &x, &w, b.as_deref(), z.as_deref());
        let p = PackedDepthwise::new(s, &w, b.as_deref()).unwrap();
        let (ihw, ohw) = (s.ih * s.iw, s.oh * s.ow);
        let xb = block(&x, s.n, s.ic, ihw);
        let zb = z.as_ref().map(|z| block(z, s.n, s.oc, ohw));
        assert_eq!(
            (xb.len(), p.y_len()),
            (p.x_len(), s.n * s.oc.div_ceil(16) * ohw * 16)
        );
        for isa in isas() {
            for pool in pools() {
                let in_place: &[bool] = if zb.is_some() {
                    &[false, true]
                } else {
                    &[false]
                };
                for &aliased in in_place {
                    let mut y = match (&zb, aliased) {
                        (Some(z), true) => z.clone(),
                        _ => vec![f32::NAN; p.y_len()],
                    };
                    let zp = match (&zb, aliased) {
                        (Some(_), true) => Some(y.as_ptr()),
                        (Some(z), false) => Some(z.as_ptr()),
                        (None, _) => None,
                    };
                    let (xp, yp) = (xb.as_ptr(), y.as_mut_ptr());
                    // SAFETY: xb holds x_len floats, y (and z) y_len, as the asserts
                    // above check; y may be z's buffer.
                    unsafe {
                        conv_depthwise_blocked_isa(isa, pool.as_ref(), &p, xp, zp, yp, c.act)
                    };
                    let got = unblock(&y, s.n, s.oc, ohw);
                    for i in 0..got.len() {
                        let a = c.act.scalar(want[i] as f32);
                        let err = (f64::from(got[i]) - f64::from(a)).abs();
                        assert!(
                            err <= 1e-5 * scale[i],
                            "{isa:?} pool={} in place={aliased} {c:?} at {i}: got {} want {a}",
                            pool.is_some(),
                            got[i]
                        );
                    }
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn case(
        c: usize,
        hw: [usize; 2],
        k: usize,
        s: usize,
        p: [usize; 4],
        d: usize,
        res: bool,
        act: Act,
    ) -> Case {
        Case {
            n: 1,
            c,
            hw,
            k: [k, k],
            s: [s, s],
            p,
            d: [d, d],
            bias: true,
            res,
            act,
        }
    }

    #[test]
    fn matches_reference() {
        let none = Act::None;
        let mut cases = vec![
            // MobileNet shapes: 3×3 and 5×5, stride 1 and 2, same padding.
            case(16, [14, 14], 3, 1, [1; 4], 1, false, Act::HardSwish),
            case(32, [15, 13], 3, 2, [1; 4], 1, false, Act::Relu),
            case(24, [9, 23], 5, 1, [2; 4], 1, true, none),
            case(40, [11, 10], 5, 2, [2; 4], 1, true, Act::HardSwish),
            // Ragged channel counts (pad lanes NaN in x and z), dilation, asymmetric pads.
            case(5, [7, 9], 3, 1, [0, 1, 2, 0], 1, true, Act::Clip(0.0, 6.0)),
            case(33, [10, 12], 3, 1, [2, 2, 2, 2], 2, true, Act::Relu),
            case(17, [12, 11], 3, 2, [1, 0, 0, 2], 2, false, Act::Sigmoid),
            case(
                20,
                [6, 19],
                5,
                1,
                [0, 3, 1, 4],
                1,
                true,
                Act::LeakyRelu(0.1),
            ),
            // A kernel wider than the image, rows with no valid tap, a single pixel.
            case(16, [2, 3], 5, 1, [2; 4], 1, true, Act::HardSwish),
            case(18, [1, 1], 3, 1, [1; 4], 1, false, none),
            case(16, [3, 4], 3, 1, [4, 0, 4, 0], 1, true, none),
            // Rows of many groups, no padding.
            case(48, [4, 37], 3, 1, [0; 4], 1, false, Act::Clip(-1.0, 1.0)),
        ];
        // Non-square kernels, strides and dilations; no bias; two images.
        cases.push(Case {
            n: 2,
            c: 21,
            hw: [9, 13],
            k: [1, 5],
            s: [2, 1],
            p: [0, 2, 1, 2],
            d: [1, 2],
            bias: false,
            res: true,
            act: Act::Tanh,
        });
        cases.push(Case {
            n: 2,
            c: 16,
            hw: [1, 30],
            k: [1, 3],
            s: [1, 3],
            p: [0, 1, 0, 1],
            d: [1, 1],
            bias: false,
            res: false,
            act: none,
        });
        for (i, c) in cases.iter().enumerate() {
            run(c, 100 + 7 * i as u64);
        }
    }

    #[test]
    fn rejects_other_groupings() {
        let s = ConvShape::new(1, 8, [4, 4], 16, [3, 3], [1, 1], [1; 4], [1, 1], 8).unwrap();
        let e = PackedDepthwise::new(s, &[0.0; 16 * 9], None).unwrap_err();
        assert!(e.contains("one channel per group"), "{e}");
        let s = ConvShape::new(1, 8, [4, 4], 8, [3, 3], [1, 1], [1; 4], [1, 1], 8).unwrap();
        let e = PackedDepthwise::new(s, &[0.0; 8 * 8], None).unwrap_err();
        assert!(e.contains("weights hold 64 values"), "{e}");
    }
}
