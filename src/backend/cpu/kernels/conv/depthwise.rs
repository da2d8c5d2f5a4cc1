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
    // SAFETY: the caller's contract is this function's.
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
        // SAFETY: taps kw0..kw1 of pixel ox read inside the input row.
        unsafe {
            tile(
                c.path,
                1,
                &t,
                kw1 - kw0,
                xrow.wrapping_add(ix0 * BLOCK),
                wrow.wrapping_add(kw0 * BLOCK),
                yrow.wrapping_add(ox * BLOCK),
                zpx(ox),
            )
        }
    };
    let (lo, hi) = s.interior_cols();
    (0..lo).for_each(border);
    let ur = if c.path == Path::Avx2 { UR_AVX2 } else { UR_512 };
    // Equal groups (9 pixels as 5 + 4, not 8 + 1: a lone pixel is the slowest).
    let groups = (hi - lo).div_ceil(ur);
    let mut ox = lo;
    for g in 0..groups {
        let end = lo + (hi - lo) * (g + 1) / groups;
        let n = end - ox;
        let ix0 = ox * s.strides[1] - s.pad_left;
        // SAFETY: interior pixels read all kernel columns inside the input row.
        unsafe {
            tile(
                c.path,
                n,
                &t,
                s.kw,
                xrow.wrapping_add(ix0 * BLOCK),
                wrow,
                yrow.wrapping_add(ox * BLOCK),
                zpx(ox),
            )
        };
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
                        // SAFETY (each): the path is chosen only when the CPU has it;
                        // the pointers per the caller's contract.
                        (Path::Avx512, false, false) => {
                            return unsafe { tile_avx512::<$n, false, false>(t, nkw, x, w, y, z) }
                        }
                        (Path::Avx512, false, true) => {
                            return unsafe { tile_avx512::<$n, false, true>(t, nkw, x, w, y, z) }
                        }
                        (Path::Avx512, true, false) => {
                            return unsafe { tile_avx512::<$n, true, false>(t, nkw, x, w, y, z) }
                        }
                        (Path::Avx512, true, true) => {
                            return unsafe { tile_avx512::<$n, true, true>(t, nkw, x, w, y, z) }
                        }
                        (Path::Avx2, false, _) => {
                            return unsafe { tile_avx2::<$n, false>(t, nkw, x, w, y, z) }
                        }
                        (Path::Avx2, true, _) => {
                            return unsafe { tile_avx2::<$n, true>(t, nkw, x, w, y, z) }
                        }
                        (Path::Portable, ..) => {}
                    }
                    // SAFETY: forwarded contract.
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
    // SAFETY: (whole body) the pointers address R output pixels, their taps and the
    // weights of the caller's ranges; only the first nc lanes of x and z are read.
    unsafe {
        let bias = std::slice::from_raw_parts(t.bias, BLOCK);
        for a in acc.iter_mut() {
            a.copy_from_slice(bias);
        }
        for kh in 0..t.nkh {
            for kw in 0..nkw {
                let wv = std::slice::from_raw_parts(w.add(kh * t.ws_kh + kw * BLOCK), nc);
                let xp = x.add(kh * t.xs_kh + kw * t.xs_kw);
                for (r, a) in acc.iter_mut().enumerate() {
                    let xv = std::slice::from_raw_parts(xp.add(r * t.xs_px), nc);
                    for ((av, &xv), &wv) in a.iter_mut().zip(xv).zip(wv) {
                        *av += xv * wv;
                    }
                }
            }
        }
        for (r, a) in acc.iter_mut().enumerate() {
            if !z.is_null() {
                let zs = std::slice::from_raw_parts(z.add(r * BLOCK), nc);
                a.iter_mut().zip(zs).for_each(|(v, z)| *v += z);
            }
            std::slice::from_raw_parts_mut(y.add(r * BLOCK), BLOCK).copy_from_slice(a);
        }
    }
}

/// The AVX-512 micro-kernel: one zmm accumulator per pixel (two, for even and odd
/// kernel rows, with `PAIR`); `MASKED` loads only the first `t.lanes` lanes of x and z.
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
    // SAFETY: (whole body) the pointers address R output pixels, their taps and the
    // weights of the caller's ranges; unaligned loads and stores throughout, and masked
    // lanes are never read.
    unsafe {
        let load = |p: *const f32| {
            if MASKED {
                _mm512_maskz_loadu_ps(m, p)
            } else {
                _mm512_loadu_ps(p)
            }
        };
        let mut acc = [_mm512_loadu_ps(t.bias); R];
        let mut odd = [_mm512_setzero_ps(); R];
        // Kernel row kh into `a`.
        macro_rules! kernel_row {
            ($a:expr, $kh:expr) => {
                let xr = x.add($kh * t.xs_kh);
                let wr = w.add($kh * t.ws_kh);
                for kw in 0..nkw {
                    let wv = _mm512_loadu_ps(wr.add(kw * BLOCK));
                    let xp = xr.add(kw * t.xs_kw);
                    for (r, a) in $a.iter_mut().enumerate() {
                        *a = _mm512_fmadd_ps(load(xp.add(r * t.xs_px)), wv, *a);
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
                *a = _mm512_add_ps(*a, load(z.add(r * BLOCK)));
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
            _mm512_storeu_ps(y.add(r * BLOCK), *a);
        }
    }
}

/// The AVX2+FMA micro-kernel: two ymm accumulators per pixel; `MASKED` zeroes the pad
/// lanes of x and z after loading them (the loads stay inside the block).
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
    // SAFETY: (whole body) the pointers address R output pixels, their taps and the
    // weights of the caller's ranges; unaligned loads and stores throughout.
    unsafe {
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
        let load = |p: *const f32| {
            let (a, b) = (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)));
            if MASKED {
                (_mm256_and_ps(a, m0), _mm256_and_ps(b, m1))
            } else {
                (a, b)
            }
        };
        let (b0, b1) = (_mm256_loadu_ps(t.bias), _mm256_loadu_ps(t.bias.add(8)));
        let mut acc = [[b0, b1]; R];
        for kh in 0..t.nkh {
            let xr = x.add(kh * t.xs_kh);
            let wr = w.add(kh * t.ws_kh);
            for kw in 0..nkw {
                let w0 = _mm256_loadu_ps(wr.add(kw * BLOCK));
                let w1 = _mm256_loadu_ps(wr.add(kw * BLOCK + 8));
                let xp = xr.add(kw * t.xs_kw);
                for (r, a) in acc.iter_mut().enumerate() {
                    let (x0, x1) = load(xp.add(r * t.xs_px));
                    a[0] = _mm256_fmadd_ps(x0, w0, a[0]);
                    a[1] = _mm256_fmadd_ps(x1, w1, a[1]);
                }
            }
        }
        if !z.is_null() {
            for (r, a) in acc.iter_mut().enumerate() {
                let (z0, z1) = load(z.add(r * BLOCK));
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
            _mm256_storeu_ps(y.add(r * BLOCK), f(a[0]));
            _mm256_storeu_ps(y.add(r * BLOCK + 8), f(a[1]));
        }
    }
}
