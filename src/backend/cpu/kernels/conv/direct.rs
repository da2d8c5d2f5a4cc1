//! Direct convolution on NCHW tensors for groups of few output channels, where im2col +
//! GEMM wastes most of the micro-kernel's rows (M = the group's 1 to 8 channels) and
//! writes an im2col matrix KH·KW times the input. It vectorizes along the output row:
//! for each input channel and kernel tap, one load of consecutive output pixels' inputs
//! times the tap's weight broadcast, into one accumulator per (output channel, vector),
//! up to 8 channels × up to 8 vectors held in registers.
//!
//! The input is first copied row by row into a scratch with the left and right padding
//! as zeros and each row split into its `stride` phases (phase p holds padded columns p,
//! p + s, p + 2s, …): every tap of every output vector is then one contiguous load
//! whatever the stride, dilation or padding, and each phase ends in zeros enough for a
//! whole vector past the last output pixel. Kernel rows outside the image are skipped.
//!
//! The bias starts the accumulators; the residual and the activation follow through
//! the GEMM's [`apply_epilogue`], per finished row segment.
use super::{valid_taps, ConvShape};
use crate::backend::cpu::isa::{self, Isa};
use crate::backend::cpu::kernels::gemm::{apply_epilogue, Bias, Epilogue};
use crate::backend::cpu::kernels::par::{for_ranges, SyncPtr};
use crate::backend::cpu::kernels::{math, Act};
use crate::backend::cpu::pool::Pool;

/// The most output channels per group the direct kernel is chosen for: its register
/// block. Above it the GEMM's 16-row (AVX-512) tiles are mostly full.
pub(crate) const DIRECT_MAX_GROUP_OC: usize = 8;

/// The widest vector (AVX-512's 16 lanes): phases are padded for it.
const MAX_LANES: usize = 16;

/// Output pixels of one task's row segment, a multiple of [`MAX_LANES`]: long rows (a
/// 1-D signal is one row) split across threads.
const SEGMENT: usize = 1024;

/// Whether the direct kernel computes `s` (any geometry with few channels per group).
pub fn direct_supported(s: &ConvShape) -> bool {
    s.oc / s.groups <= DIRECT_MAX_GROUP_OC
}

/// Floats of one padded, phase-split input row in the scratch: (phase length, row).
fn padded_row(s: &ConvShape) -> (usize, usize) {
    let sw = s.strides[1];
    let reach = (s.kw - 1) * s.dilations[1] / sw;
    let phase = s.ow.next_multiple_of(MAX_LANES) + reach;
    (phase, sw * phase)
}

/// The f32 count of the scratch [`conv_direct`] needs: the whole input, padded.
pub fn conv_direct_scratch_len(s: &ConvShape) -> usize {
    s.n * s.ic * s.ih * padded_row(s).1
}

/// Vectors of f32 lanes as the kernel sees them: [`P`] (portable), [`Y`] (AVX2+FMA)
/// or [`Z`] (AVX-512F). The kernel is written once over this trait; each ISA's entry
/// point inlines it under its target features.
trait Vector: Copy {
    const LANES: usize;
    fn splat(v: f32) -> Self;
    /// # Safety
    /// `p` holds `LANES` readable floats.
    unsafe fn load(p: *const f32) -> Self;
    /// # Safety
    /// `p` holds `LANES` writable floats.
    unsafe fn store(self, p: *mut f32);
    /// `self + a·b`.
    fn mul_add(self, a: Self, b: Self) -> Self;
}

/// Eight lanes in plain Rust (the compiler vectorizes the loops).
#[derive(Clone, Copy)]
struct P([f32; 8]);

impl Vector for P {
    const LANES: usize = 8;
    #[inline(always)]
    fn splat(v: f32) -> P {
        P([v; 8])
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> P {
        // SAFETY: the caller passes 8 readable floats.
        P(unsafe { p.cast::<[f32; 8]>().read_unaligned() })
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: the caller passes 8 writable floats.
        unsafe { p.cast::<[f32; 8]>().write_unaligned(self.0) }
    }
    #[inline(always)]
    fn mul_add(mut self, a: P, b: P) -> P {
        for ((s, a), b) in self.0.iter_mut().zip(a.0).zip(b.0) {
            *s += a * b;
        }
        self
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Vector;
    use std::arch::x86_64::*;

    /// One ymm register; used only by code running on CPUs with AVX2 and FMA.
    #[derive(Clone, Copy)]
    pub(super) struct Y(__m256);

    /// One zmm register; used only by code running on CPUs with AVX-512F.
    #[derive(Clone, Copy)]
    pub(super) struct Z(__m512);

    // Every block below rests on `Y` being used only where the CPU has AVX2 and FMA
    // (see `Y`): trait methods cannot enable the features themselves.
    impl Vector for Y {
        const LANES: usize = 8;
        #[inline(always)]
        fn splat(v: f32) -> Y {
            // SAFETY: AVX, which `Y` code has.
            Y(unsafe { _mm256_set1_ps(v) })
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Y {
            // SAFETY: p holds 8 readable floats (the caller); AVX as for all `Y` code.
            Y(unsafe { _mm256_loadu_ps(p) })
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            // SAFETY: p holds 8 writable floats (the caller); AVX as for all `Y` code.
            unsafe { _mm256_storeu_ps(p, self.0) }
        }
        #[inline(always)]
        fn mul_add(self, a: Y, b: Y) -> Y {
            // SAFETY: FMA, which `Y` code has.
            Y(unsafe { _mm256_fmadd_ps(a.0, b.0, self.0) })
        }
    }

    // As for `Y`, with AVX-512F: `Z` runs only on CPUs that have it.
    impl Vector for Z {
        const LANES: usize = 16;
        #[inline(always)]
        fn splat(v: f32) -> Z {
            // SAFETY: AVX-512F, which `Z` code has.
            Z(unsafe { _mm512_set1_ps(v) })
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Z {
            // SAFETY: p holds 16 readable floats (the caller); AVX-512F as for `Z`.
            Z(unsafe { _mm512_loadu_ps(p) })
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            // SAFETY: p holds 16 writable floats (the caller); AVX-512F as for `Z`.
            unsafe { _mm512_storeu_ps(p, self.0) }
        }
        #[inline(always)]
        fn mul_add(self, a: Z, b: Z) -> Z {
            // SAFETY: AVX-512F, which `Z` code has.
            Z(unsafe { _mm512_fmadd_ps(a.0, b.0, self.0) })
        }
    }
}

/// The paths a call may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    Portable,
    Avx2,
    Avx512,
}

/// Pointers and geometry shared by the tasks of one call.
struct Ctx<'a> {
    s: &'a ConvShape,
    /// The padded, phase-split input (the scratch).
    xpad: *const f32,
    w: *const f32,
    /// Null without a bias.
    bias: *const f32,
    y: SyncPtr<f32>,
    /// The residual and activation, applied per finished row segment.
    ep: Epilogue,
    /// Floats of one padded row (its phases).
    row: usize,
    /// Per kernel column: its first input's offset in a padded row from the output
    /// pixel's column (phase · phase length + whole strides).
    taps: Vec<usize>,
}

// SAFETY: tasks write disjoint output segments and only read the scratch, weights,
// bias and residual.
unsafe impl Sync for Ctx<'_> {}

/// `y = act(conv(x, w) + bias + z)` on NCHW tensors, weights [OC, IC/g, KH, KW], using
/// [`isa::isa`]'s path.
///
/// # Safety
/// `x` must hold N·IC·IH·IW floats, `w` OC·IC/g·KH·KW, `bias` OC, `y` and `z`
/// N·OC·OH·OW, `scratch` [`conv_direct_scratch_len`]; `y` and `scratch` must not overlap
/// each other or the inputs.
#[allow(clippy::too_many_arguments)]
pub unsafe fn conv_direct(
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
    // SAFETY: the `_isa` variant has the same contract and caps the ISA by the CPU's.
    unsafe { conv_direct_isa(isa::isa(), pool, s, w, bias, x, z, y, act, scratch) }
}

/// [`conv_direct`] with an explicit instruction set (capped by what the CPU has).
///
/// # Safety
/// As [`conv_direct`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn conv_direct_isa(
    isa: Isa,
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
    if s.n * s.oc * s.oh * s.ow == 0 {
        return;
    }
    let (phase, row) = padded_row(s);
    // SAFETY: x holds N·IC·IH·IW floats and scratch N·IC·IH padded rows (the contract).
    unsafe { pad_rows(pool, s, x, scratch, phase) };
    let (sw, dw) = (s.strides[1], s.dilations[1]);
    let taps = (0..s.kw)
        .map(|kx| (kx * dw % sw) * phase + kx * dw / sw)
        .collect();
    let ohw = s.oh * s.ow;
    let ctx = Ctx {
        s,
        xpad: scratch,
        w,
        bias: bias.unwrap_or(std::ptr::null()),
        y: SyncPtr(y),
        // The residual as a matrix of N·OC rows of OH·OW (the epilogue's row i, column j).
        ep: Epilogue {
            bias: Bias::None,
            residual: z.map(|z| (z, ohw)),
            act,
        },
        row,
        taps,
    };
    let path = if math::use_avx512(isa) {
        Path::Avx512
    } else if math::use_avx2(isa) {
        Path::Avx2
    } else {
        Path::Portable
    };
    let segments = s.ow.div_ceil(SEGMENT);
    let items = s.n * s.groups * s.oh * segments;
    let work = SEGMENT.min(s.ow) * s.oc / s.groups * s.ic / s.groups * s.kh * s.kw;
    for_ranges(pool, items, work, &|range| {
        // SAFETY: each item is one (image, group, output row, segment), written by one
        // task; the path's features are the CPU's (`use_avx512` / `use_avx2`); the
        // buffers are the caller's.
        unsafe {
            match path {
                #[cfg(target_arch = "x86_64")]
                Path::Avx512 => items_avx512(&ctx, range),
                #[cfg(target_arch = "x86_64")]
                Path::Avx2 => items_avx2(&ctx, range),
                _ => items_of::<P>(&ctx, range, 12),
            }
        }
    });
}

/// Copies each input row into its padded, phase-split form (see the module docs).
///
/// # Safety
/// `x` holds N·IC·IH rows of IW floats, `xpad` as many of [`padded_row`]'s, apart.
unsafe fn pad_rows(
    pool: Option<&Pool>,
    s: &ConvShape,
    x: *const f32,
    xpad: *mut f32,
    phase: usize,
) {
    let sw = s.strides[1];
    let rows = s.n * s.ic * s.ih;
    let dst = SyncPtr(xpad);
    // Only read through.
    let x = SyncPtr(x.cast_mut());
    for_ranges(pool, rows, sw * phase, &|range| {
        for r in range {
            // SAFETY: input row r < N·IC·IH, IW floats.
            let src = unsafe { std::slice::from_raw_parts(x.get().add(r * s.iw), s.iw) };
            // SAFETY: padded row r, this task's alone, sw·phase floats.
            let out = unsafe {
                std::slice::from_raw_parts_mut(dst.get().add(r * sw * phase), sw * phase)
            };
            for (p, ph) in out.chunks_exact_mut(phase).enumerate() {
                // Element j of phase p is input column p + j·sw - pad_left.
                let (j0, j1, ix0) = valid_taps(p, s.pad_left, phase, sw, s.iw);
                ph[..j0].fill(0.0);
                if sw == 1 {
                    ph[j0..j1].copy_from_slice(&src[ix0..ix0 + j1 - j0]);
                } else {
                    for (j, v) in ph[j0..j1].iter_mut().enumerate() {
                        *v = src[ix0 + j * sw];
                    }
                }
                ph[j1..].fill(0.0);
            }
        }
    });
}

/// [`items_of`] on AVX-512: 32 zmm registers, up to 24 accumulators.
///
/// # Safety
/// The CPU has AVX-512F; as [`items_of`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn items_avx512(c: &Ctx, items: std::ops::Range<usize>) {
    // SAFETY: `Z` needs AVX-512F, enabled here; the rest is the caller's contract.
    unsafe { items_of::<x86::Z>(c, items, 24) }
}

/// [`items_of`] on AVX2: 16 ymm registers, up to 12 accumulators.
///
/// # Safety
/// The CPU has AVX2 and FMA; as [`items_of`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn items_avx2(c: &Ctx, items: std::ops::Range<usize>) {
    // SAFETY: `Y` needs AVX2 and FMA, enabled here; the rest is the caller's contract.
    unsafe { items_of::<x86::Y>(c, items, 12) }
}

/// Work items `items` of (image, group, output row, segment), each over all the
/// group's output channels in register blocks of 8, 4, 3, 2 or 1, with at most
/// `budget` accumulators.
///
/// # Safety
/// The CPU runs `V`; each item is this task's alone; the buffers as [`conv_direct`].
#[inline(always)]
unsafe fn items_of<V: Vector>(c: &Ctx, items: std::ops::Range<usize>, budget: usize) {
    let s = c.s;
    let segments = s.ow.div_ceil(SEGMENT);
    let ocg = s.oc / s.groups;
    for item in items {
        let seg = item % segments;
        let oy = item / segments % s.oh;
        let g = item / segments / s.oh % s.groups;
        let n = item / segments / s.oh / s.groups;
        let (ox0, ox1) = (seg * SEGMENT, ((seg + 1) * SEGMENT).min(s.ow));
        let mut o = g * ocg;
        let end = (g + 1) * ocg;
        while o < end {
            let at = At { n, g, o, oy };
            // SAFETY: channels o..o+block of the group, row oy, columns ox0..ox1: this
            // task's item; the rest is this fn's contract.
            let block = unsafe {
                match end - o {
                    8.. => segment::<V, 8>(c, &at, ox0, ox1, budget),
                    4..=7 => segment::<V, 4>(c, &at, ox0, ox1, budget),
                    3 => segment::<V, 3>(c, &at, ox0, ox1, budget),
                    2 => segment::<V, 2>(c, &at, ox0, ox1, budget),
                    _ => segment::<V, 1>(c, &at, ox0, ox1, budget),
                }
            };
            for oc in o..o + block {
                let i = n * s.oc + oc;
                let j0 = oy * s.ow + ox0;
                // SAFETY: output row segment (n, oc, oy, ox0..ox1) of y, this task's and
                // finished; the residual (if any) covers it as row i of OH·OW.
                unsafe {
                    let seg = c.y.get().add(i * s.oh * s.ow + j0);
                    let seg = std::slice::from_raw_parts_mut(seg, ox1 - ox0);
                    apply_epilogue(&c.ep, i, j0, seg, s.oh * s.ow);
                }
            }
            o += block;
        }
    }
}

/// Where a register block's output goes: image, group, first output channel, row.
struct At {
    n: usize,
    g: usize,
    o: usize,
    oy: usize,
}

/// Output channels `at.o..at.o+OCB` of row `at.oy`, columns `ox0..ox1`, in tiles of 8,
/// 4, 2 or 1 vectors (the widest that fits `budget` accumulators and the row). Returns
/// OCB.
///
/// # Safety
/// As [`items_of`]; the block's channels are in its group.
#[inline(always)]
unsafe fn segment<V: Vector, const OCB: usize>(
    c: &Ctx,
    at: &At,
    ox0: usize,
    ox1: usize,
    budget: usize,
) -> usize {
    let nvec = (ox1 - ox0).div_ceil(V::LANES);
    let mut v = 0;
    while v < nvec {
        let ox = ox0 + v * V::LANES;
        let fits = |u: usize| u <= nvec - v && OCB * u <= budget;
        let u = [8, 4, 2].into_iter().find(|&u| fits(u)).unwrap_or(1);
        // SAFETY: vectors v.. of the segment, inside the padded rows (each phase holds
        // a whole vector past the row's last pixel); the rest is this fn's contract.
        v += unsafe {
            match u {
                8 => tile::<V, OCB, 8>(c, at, ox, ox1),
                4 => tile::<V, OCB, 4>(c, at, ox, ox1),
                2 => tile::<V, OCB, 2>(c, at, ox, ox1),
                _ => tile::<V, OCB, 1>(c, at, ox, ox1),
            }
        };
    }
    OCB
}

/// OCB output channels × U vectors of pixels from column `ox`, those before `end`
/// stored. Returns U.
///
/// # Safety
/// As [`segment`]; `ox` < `end` ≤ OW.
#[inline(always)]
unsafe fn tile<V: Vector, const OCB: usize, const U: usize>(
    c: &Ctx,
    at: &At,
    ox: usize,
    end: usize,
) -> usize {
    let s = c.s;
    let icg = s.ic / s.groups;
    let w_oc = icg * s.kh * s.kw;
    let mut acc = [[V::splat(0.0); U]; OCB];
    if !c.bias.is_null() {
        for (o, a) in acc.iter_mut().enumerate() {
            // SAFETY: the bias holds OC values; channel at.o + o < OC.
            *a = [V::splat(unsafe { *c.bias.add(at.o + o) }); U];
        }
    }
    let (ky0, ky1, iy0) = s.kh_range(at.oy);
    let dh = s.dilations[0];
    for ci in 0..icg {
        let plane = (at.n * s.ic + at.g * icg + ci) * s.ih;
        for ky in ky0..ky1 {
            let iy = iy0 + (ky - ky0) * dh;
            // SAFETY: padded row (n, channel, iy < IH) of the scratch, from column ox.
            let xr = unsafe { c.xpad.add((plane + iy) * c.row + ox) };
            // SAFETY: channel at.o's weights for (ci, ky): [OC][IC/g][KH][KW].
            let wr = unsafe { c.w.add((at.o * icg + ci) * s.kh * s.kw + ky * s.kw) };
            for (kx, &tap) in c.taps.iter().enumerate() {
                let mut xv = [V::splat(0.0); U];
                for (u, v) in xv.iter_mut().enumerate() {
                    // SAFETY: the tap's phase holds the U vectors from column ox: the
                    // phase length reaches a whole vector past the last pixel plus the
                    // tap's whole strides (`padded_row`).
                    *v = unsafe { V::load(xr.add(tap + u * V::LANES)) };
                }
                for (o, a) in acc.iter_mut().enumerate() {
                    // SAFETY: channel at.o + o (< OC) of the block, tap (ci, ky, kx).
                    let wv = V::splat(unsafe { *wr.add(o * w_oc + kx) });
                    for (a, &x) in a.iter_mut().zip(&xv) {
                        *a = a.mul_add(x, wv);
                    }
                }
            }
        }
    }
    for (o, a) in acc.iter().enumerate() {
        let yrow = ((at.n * s.oc + at.o + o) * s.oh + at.oy) * s.ow;
        for (u, v) in a.iter().enumerate() {
            let px = ox + u * V::LANES;
            if px >= end {
                break;
            }
            // SAFETY: pixels px.. of output row (n, o, oy), this task's, before `end`.
            unsafe {
                let dst = c.y.get().add(yrow + px);
                if px + V::LANES <= end {
                    v.store(dst);
                } else {
                    let mut tmp = [0.0f32; MAX_LANES];
                    v.store(tmp.as_mut_ptr());
                    std::ptr::copy_nonoverlapping(tmp.as_ptr(), dst, end - px);
                }
            }
        }
    }
    U
}
