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
//! A block of one output channel has one weight per tap for U vectors: one broadcast and
//! U loads per U FMAs. Two tiles give its loads more reuse:
//! - where the kernel slides one input row per output row (vertical stride and dilation
//!   1), [`ROWS`] output rows at once: each input row loaded serves every kernel row
//!   that reads it, and each weight broadcast all U vectors of its row;
//! - where a phase holds more taps than a vector has lanes (a long 1-D filter),
//!   [`chain`]s of taps `LANES` apart: tap j for vector u + 1 reads what tap j + LANES
//!   reads for vector u, so T such taps over U vectors load U + T - 1 vectors.
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

/// Output rows of one tile (and work item) of a single-channel group where the kernel
/// slides by one input row per output row ([`multi_row`]).
const ROWS: usize = 4;

/// Output pixels of one task's row segment, a multiple of [`MAX_LANES`]: long rows (a
/// 1-D signal is one row) split across threads.
const SEGMENT: usize = 1024;

/// Whether the direct kernel computes `s` (any geometry with few channels per group).
pub fn direct_supported(s: &ConvShape) -> bool {
    s.oc / s.groups <= DIRECT_MAX_GROUP_OC
}

/// Whether `s`'s groups of one output channel run [`ROWS`] output rows per tile: the
/// vertical stride and dilation 1 make consecutive output rows read overlapping input
/// rows.
fn multi_row(s: &ConvShape) -> bool {
    s.oc == s.groups && s.strides[0] == 1 && s.dilations[0] == 1 && s.oh > 1
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
    /// Floats of one phase of a padded row.
    phase: usize,
    /// Output rows per work item: [`ROWS`] where [`multi_row`], else 1.
    rows: usize,
}

impl Ctx<'_> {
    /// Per kernel column: its first input's offset in a padded row from the output
    /// pixel's column (phase · phase length + whole strides of kx·dilation), stepped
    /// without a division (and made each call, as a list would be an allocation a run).
    fn taps(&self) -> impl Iterator<Item = usize> + '_ {
        let (sw, dw) = (self.s.strides[1], self.s.dilations[1]);
        let (whole, part) = (dw / sw, dw % sw);
        let mut at = (0, 0);
        (0..self.s.kw).map(move |_| {
            let (phase, strides) = at;
            at = (phase + part, strides + whole);
            if at.0 >= sw {
                at = (at.0 - sw, at.1 + 1);
            }
            phase * self.phase + strides
        })
    }
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
        phase,
        rows: if multi_row(s) { ROWS } else { 1 },
    };
    let path = if math::use_avx512(isa) {
        Path::Avx512
    } else if math::use_avx2(isa) {
        Path::Avx2
    } else {
        Path::Portable
    };
    let segments = s.ow.div_ceil(SEGMENT);
    let items = s.n * s.groups * s.oh.div_ceil(ctx.rows) * segments;
    let work = ctx.rows * SEGMENT.min(s.ow) * s.oc / s.groups * s.ic / s.groups * s.kh * s.kw;
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

/// The epilogue on `len` finished outputs of row `i` (image · OC + channel) of y from
/// column `j0` of its OH·OW (where the residual, if any, has them too).
///
/// # Safety
/// Those outputs lie in y, are written, and no other task touches them.
unsafe fn finish(c: &Ctx, i: usize, j0: usize, len: usize) {
    let ohw = c.s.oh * c.s.ow;
    // SAFETY: the caller's contract: y's row i holds columns j0..j0 + len.
    let seg = unsafe { std::slice::from_raw_parts_mut(c.y.get().add(i * ohw + j0), len) };
    // SAFETY: the residual, when there is one, is shaped like y (the step's contract).
    unsafe { apply_epilogue(&c.ep, i, j0, seg, ohw) };
}

/// Work items `items` of (image, group, output rows, segment), each over all the
/// group's output channels in register blocks of 8, 4, 3, 2 or 1 (one output row at a
/// time) or, for groups of one channel under [`multi_row`], [`ROWS`] rows at once, with
/// at most `budget` accumulators.
///
/// # Safety
/// The CPU runs `V`; each item is this task's alone; the buffers as [`conv_direct`].
#[inline(always)]
unsafe fn items_of<V: Vector>(c: &Ctx, items: std::ops::Range<usize>, budget: usize) {
    let s = c.s;
    let segments = s.ow.div_ceil(SEGMENT);
    let blocks = s.oh.div_ceil(c.rows);
    let ocg = s.oc / s.groups;
    for item in items {
        let seg = item % segments;
        let oy = item / segments % blocks * c.rows;
        let g = item / segments / blocks % s.groups;
        let n = item / segments / blocks / s.groups;
        let (ox0, ox1) = (seg * SEGMENT, ((seg + 1) * SEGMENT).min(s.ow));
        if c.rows > 1 {
            let (at, rows) = (At { n, g, o: g, oy }, c.rows.min(s.oh - oy));
            // SAFETY: channel g (the group's one) of rows oy..oy+rows, columns ox0..ox1:
            // this task's item; the rest is this fn's contract.
            unsafe { segment_rows::<V>(c, &at, rows, ox0, ox1, budget) };
            for oy in oy..oy + rows {
                // SAFETY: output row segment (n, g, oy, ox0..ox1): this task's, finished.
                unsafe { finish(c, n * s.oc + g, oy * s.ow + ox0, ox1 - ox0) };
            }
            continue;
        }
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
                // SAFETY: output row segment (n, oc, oy, ox0..ox1): this task's, finished.
                unsafe { finish(c, n * s.oc + oc, oy * s.ow + ox0, ox1 - ox0) };
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
    let s = c.s;
    // One channel, dilation 1 and more taps in a phase than lanes: chains of taps.
    let chained = OCB == 1 && s.dilations[1] == 1 && s.kw.div_ceil(s.strides[1]) > V::LANES;
    let mut v = 0;
    while v < nvec {
        let ox = ox0 + v * V::LANES;
        if chained {
            let u = [8, 4, 2].into_iter().find(|&u| u <= nvec - v).unwrap_or(1);
            // SAFETY: as below.
            v += unsafe {
                match (u, budget >= 24) {
                    // 8 accumulators, 15 loads and a weight: AVX-512's 32 registers.
                    (8, true) => tile_chained::<V, 8, 8>(c, at, ox, ox1),
                    (4 | 8, _) => tile_chained::<V, 4, 4>(c, at, ox, ox1),
                    (2, _) => tile_chained::<V, 2, 4>(c, at, ox, ox1),
                    _ => tile_chained::<V, 1, 4>(c, at, ox, ox1),
                }
            };
            continue;
        }
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
            for (kx, tap) in c.taps().enumerate() {
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
        // SAFETY: output row (n, at.o + o, oy) from column ox, this task's up to `end`.
        unsafe { store_row(c, a, yrow, ox, end) };
    }
    U
}

/// Stores the U vectors `a` of output pixels `ox..` of the output row starting at
/// `yrow`, those before `end`.
///
/// # Safety
/// Pixels ox..end of that row are this task's; `end` ≤ OW.
#[inline(always)]
unsafe fn store_row<V: Vector, const U: usize>(
    c: &Ctx,
    a: &[V; U],
    yrow: usize,
    ox: usize,
    end: usize,
) {
    for (u, v) in a.iter().enumerate() {
        let px = ox + u * V::LANES;
        if px >= end {
            break;
        }
        // SAFETY: pixels px.. of the output row, this task's, before `end`.
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

/// Channel `at.o` (its group's only one) of output rows `at.oy..at.oy+rows`, columns
/// `ox0..ox1`, in tiles of [`ROWS`] rows × 4, 2 or 1 vectors (the widest that fits the
/// row and two thirds of `budget`: the rest holds the U input vectors).
///
/// # Safety
/// As [`items_of`]; `rows` ≤ [`ROWS`] and the rows are inside the output.
#[inline(always)]
unsafe fn segment_rows<V: Vector>(
    c: &Ctx,
    at: &At,
    rows: usize,
    ox0: usize,
    ox1: usize,
    budget: usize,
) {
    let nvec = (ox1 - ox0).div_ceil(V::LANES);
    let mut v = 0;
    while v < nvec {
        let ox = ox0 + v * V::LANES;
        let fits = |u: usize| u <= nvec - v && ROWS * u * 3 <= budget * 2;
        let u = [4, 2].into_iter().find(|&u| fits(u)).unwrap_or(1);
        // SAFETY: vectors v.. of the segment, inside the padded rows (as for `tile`);
        // the rest is this fn's contract.
        v += unsafe {
            match u {
                4 => tile_rows::<V, 4>(c, at, rows, ox, ox1),
                2 => tile_rows::<V, 2>(c, at, rows, ox, ox1),
                _ => tile_rows::<V, 1>(c, at, rows, ox, ox1),
            }
        };
    }
}

/// One output channel × `rows` (≤ [`ROWS`]) output rows × U vectors from column `ox`,
/// those before `end` stored, under [`multi_row`]: output row oy + i reads input row
/// oy + r - pad_top at kernel row r - i, so each input row r is loaded once for every
/// kernel row that reads it. Returns U.
///
/// # Safety
/// As [`segment_rows`]; `ox` < `end` ≤ OW.
#[inline(always)]
unsafe fn tile_rows<V: Vector, const U: usize>(
    c: &Ctx,
    at: &At,
    rows: usize,
    ox: usize,
    end: usize,
) -> usize {
    let s = c.s;
    let icg = s.ic / s.groups;
    let b = if c.bias.is_null() {
        0.0
    } else {
        // SAFETY: the bias holds OC values; channel at.o < OC.
        unsafe { *c.bias.add(at.o) }
    };
    let mut acc = [[V::splat(b); U]; ROWS];
    let (kh, kw) = (s.kh, s.kw);
    for ci in 0..icg {
        let plane = (at.n * s.ic + at.g * icg + ci) * s.ih;
        // SAFETY: channel at.o's weights for input channel ci: [OC][IC/g][KH][KW].
        let wc = unsafe { c.w.add((at.o * icg + ci) * kh * kw) };
        for r in 0..rows + kh - 1 {
            // Input row oy + r - pad_top, skipped outside the image.
            let Some(iy) = (at.oy + r).checked_sub(s.pad_top).filter(|&iy| iy < s.ih) else {
                continue;
            };
            // The output rows i reading it: kernel row r - i in 0..KH, i < rows.
            let (i0, i1) = ((r + 1).saturating_sub(kh), (r + 1).min(rows));
            // SAFETY: padded row (n, channel, iy < IH) of the scratch, from column ox.
            let xr = unsafe { c.xpad.add((plane + iy) * c.row + ox) };
            for (kx, tap) in c.taps().enumerate() {
                let mut xv = [V::splat(0.0); U];
                for (u, v) in xv.iter_mut().enumerate() {
                    // SAFETY: as in `tile`: the tap's phase holds U vectors from ox.
                    *v = unsafe { V::load(xr.add(tap + u * V::LANES)) };
                }
                for (i, a) in acc.iter_mut().enumerate() {
                    if i < i0 || i >= i1 {
                        continue;
                    }
                    // SAFETY: kernel row r - i < KH (i ≥ i0), column kx < KW.
                    let wv = V::splat(unsafe { *wc.add((r - i) * kw + kx) });
                    for (a, &x) in a.iter_mut().zip(&xv) {
                        *a = a.mul_add(x, wv);
                    }
                }
            }
        }
    }
    for (i, a) in acc.iter().enumerate().take(rows) {
        let yrow = ((at.n * s.oc + at.o) * s.oh + at.oy + i) * s.ow;
        // SAFETY: output row (n, at.o, oy + i < OH), this task's, columns ox..end.
        unsafe { store_row(c, a, yrow, ox, end) };
    }
    U
}

/// One output channel × U vectors from column `ox`, those before `end` stored, its
/// taps in [`chain`]s of at most T (dilation 1: tap kx = p + sw·j reads phase p at
/// offset j). Returns U.
///
/// # Safety
/// As [`segment`]; `ox` < `end` ≤ OW.
#[inline(always)]
unsafe fn tile_chained<V: Vector, const U: usize, const T: usize>(
    c: &Ctx,
    at: &At,
    ox: usize,
    end: usize,
) -> usize {
    let s = c.s;
    let icg = s.ic / s.groups;
    let (kw, sw) = (s.kw, s.strides[1]);
    let b = if c.bias.is_null() {
        0.0
    } else {
        // SAFETY: the bias holds OC values; channel at.o < OC.
        unsafe { *c.bias.add(at.o) }
    };
    let mut acc = [V::splat(b); U];
    let (ky0, ky1, iy0) = s.kh_range(at.oy);
    let dh = s.dilations[0];
    for ci in 0..icg {
        let plane = (at.n * s.ic + at.g * icg + ci) * s.ih;
        for ky in ky0..ky1 {
            let iy = iy0 + (ky - ky0) * dh;
            // SAFETY: padded row (n, channel, iy < IH) of the scratch, from column ox.
            let xr = unsafe { c.xpad.add((plane + iy) * c.row + ox) };
            // SAFETY: channel at.o's weights for (ci, ky): [OC][IC/g][KH][KW].
            let wr = unsafe { c.w.add((at.o * icg + ci) * s.kh * kw + ky * kw) };
            for p in 0..sw.min(kw) {
                // Phase p's taps: kx = p + sw·j for j < np, at offset j.
                let np = (kw - p).div_ceil(sw);
                // SAFETY: phase p of the padded row, from column ox.
                let (xp, wp) = unsafe { (xr.add(p * c.phase), wr.add(p)) };
                for rho in 0..V::LANES.min(np) {
                    // The chain of taps j = rho + LANES·t, t < len.
                    let len = (np - rho).div_ceil(V::LANES);
                    let mut t = 0;
                    while t < len {
                        let j = rho + t * V::LANES;
                        // SAFETY: taps j + LANES·t' (t' < the chain's length ≤ len - t)
                        // are phase p's, their loads as in `tile`.
                        t += unsafe {
                            match len - t {
                                n if n >= T => chain::<V, U, T>(&mut acc, xp, wp, sw, j),
                                4.. => chain::<V, U, 4>(&mut acc, xp, wp, sw, j),
                                2 | 3 => chain::<V, U, 2>(&mut acc, xp, wp, sw, j),
                                _ => chain::<V, U, 1>(&mut acc, xp, wp, sw, j),
                            }
                        };
                    }
                }
            }
        }
    }
    let yrow = ((at.n * s.oc + at.o) * s.oh + at.oy) * s.ow;
    // SAFETY: output row (n, at.o, oy), this task's, columns ox..end.
    unsafe { store_row(c, &acc, yrow, ox, end) };
    U
}

/// Taps j, j + LANES, …, j + (N-1)·LANES of one phase into U vectors: vector u at tap
/// j + LANES·t reads the phase at j + LANES·(u + t), so each of the U + N - 1 vectors
/// loaded serves every (u, t) with that sum. Returns N.
///
/// # Safety
/// `xp` is a phase of a padded row at the tile's first column, whose loads at offsets
/// j + LANES·(t + u) + LANES are readable for each of these taps and u < U (as in
/// `tile`); `wp` the weights of the phase's tap 0, `sw` apart.
#[inline(always)]
unsafe fn chain<V: Vector, const U: usize, const N: usize>(
    acc: &mut [V; U],
    xp: *const f32,
    wp: *const f32,
    sw: usize,
    j: usize,
) -> usize {
    // Constant indices throughout (the loops unroll): every vector stays in a register.
    let mut xv = [V::splat(0.0); CHAIN_LOADS];
    for (m, x) in xv.iter_mut().enumerate().take(U + N - 1) {
        // SAFETY: offset j + LANES·m = tap j + LANES·t's load for vector u = m - t.
        *x = unsafe { V::load(xp.add(j + V::LANES * m)) };
    }
    for t in 0..N {
        // SAFETY: tap kx = p + sw·(j + LANES·t) < KW (the caller).
        let w = V::splat(unsafe { *wp.add(sw * (j + V::LANES * t)) });
        for (a, &x) in acc.iter_mut().zip(&xv[t..t + U]) {
            *a = a.mul_add(x, w);
        }
    }
    N
}

/// The most vectors one [`chain`] loads: U + N - 1 for U = N = 8.
const CHAIN_LOADS: usize = 15;
