//! Winograd convolution F(m×m, 3×3) for 3×3 stride-1 convolutions on NCHW16c tensors.
//!
//! Layout: x, y and the residual z are NCHW16c, `[N][⌈C/16⌉][H][W][16]`. The pad lanes
//! (channels ≥ C of the last block) of x and z are unspecified (possibly NaN); y's pad
//! lanes come out finite.
//!
//! Algorithm (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks"): the
//! output is cut into m×m tiles (m = 2 or 4), each computed from an α×α input patch,
//! α = m + 2, as `Y = Aᵀ [ Σ_ic (G g Gᵀ) ⊙ (Bᵀ d B) ] A`. Per pair (oc, ic) the weights'
//! transform `U = G g Gᵀ` is done once at pack time (in f64) and stored as α² matrices
//! IC×16 per output block, `[ξ][OCB][IC][16]`, zero past OC. At run time, per batch of
//! tiles of one image:
//! 1. input transform: `V = Bᵀ d B` on whole 16-lane channel vectors, with zeros for
//!    the positions outside the image (pads, ragged bottom/right tiles), into
//!    `V[ξ][tile][IC rounded to 16]`;
//! 2. α² GEMMs `M[ξ] = V[ξ] (tiles×IC) · U[ξ] (IC×OC)` by a 6-tile × 16-channel
//!    register-blocked micro-kernel (the direct kernel's shape), which stops at the
//!    last real input channel, so x's unspecified pad lanes (transformed into V's pad
//!    lanes) are never read into a sum; it stores M as `[OCB][tile][ξ][16]`, so that
//! 3. the output transform `Y = Aᵀ M A` reads each tile's α²·16 floats contiguously,
//!    adds the bias and the masked residual, applies the activation and stores the
//!    valid part of the tile.
//!
//! A batch's V and M stay in L2 ([`L2_BUDGET`]), and the batches (times output-block
//! ranges when an image has few tiles) are claimed dynamically by one task per pool
//! thread, each with its own slice of the caller's scratch: no allocation and no lock
//! per call. Both the transforms and the micro-kernel have a portable path
//! ([`Isa::Portable`], plain Rust over 16-lane arrays), an AVX2+FMA one and an
//! AVX-512F one (the same transform code compiled with the ISA enabled, so a 16-lane
//! vector is two ymm or one zmm; the micro-kernels with intrinsics: 6 tiles × one
//! output block in 12 ymm, 12 tiles × two output blocks in 24 zmm).
use super::{ConvShape, BLOCK};
use crate::backend::cpu::host;
use crate::backend::cpu::isa::{self, Isa};
use crate::backend::cpu::kernels::{math, Act};
use crate::backend::cpu::pool::Pool;
use std::ops::{Add, Mul, Sub};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Bytes of one batch's V and M (per thread): most of the host's L2 (5/8 of it), leaving
/// room for the weights streaming through.
fn l2_budget() -> usize {
    host::caches().l2 / 8 * 5
}
/// Tiles per AVX2/portable micro-kernel call (2·6 accumulators + 2 weights + 1
/// broadcast ≤ 16 ymm).
pub(super) const UR: usize = 6;
/// Tiles per AVX-512 micro-kernel call, with two output blocks (2·12 accumulators + 2
/// weights + broadcasts ≤ 32 zmm). Batches are multiples of it (and so of [`UR`]).
pub(super) const UR512: usize = 12;
/// Fewest tiles in one batch (unless the image has fewer): each weight loaded from L3
/// serves this many tiles, which matters more than V and M leaving L2 (chosen by
/// measurement on the ResNet shapes, `bench/RESULTS.md`).
const MIN_BATCH: usize = 24;
/// Most tiles in one batch.
const MAX_BATCH: usize = 96;

/// Convolution weights and bias transformed and packed for [`conv_winograd`].
#[derive(Debug, Clone)]
pub struct PackedWinograd {
    shape: ConvShape,
    /// Output tile size (2 or 4).
    m: usize,
    icb: usize,
    ocb: usize,
    /// Tile rows and columns per image.
    th: usize,
    tw: usize,
    /// Tiles per batch.
    batch: usize,
    /// `[α²][OCB][IC][16]`.
    u: Vec<f32>,
    /// OCB·16 values, zero past OC.
    bias: Vec<f32>,
    /// Lanes of the last output block that hold channels (the residual's other lanes
    /// are unspecified).
    last_mask: [bool; BLOCK],
    /// The first call's thread count and [`schedule`] for it (a pool's count never
    /// changes, so later calls reuse it instead of searching again).
    cut: std::sync::OnceLock<(usize, (usize, usize))>,
}

/// Shapes Winograd handles: groups 1, a 3×3 kernel, strides and dilations 1, pads ≤ 2
/// on every side (a larger pad would make tiles of zeros only).
pub fn winograd_supported(s: &ConvShape) -> bool {
    // The bottom/right pads implied by the output size: o = i + p0 + p1 - 2.
    let pad_end = |o: usize, i: usize, p0: usize| (o + 2).checked_sub(i + p0);
    s.groups == 1
        && s.kh == 3
        && s.kw == 3
        && s.strides == [1, 1]
        && s.dilations == [1, 1]
        && s.pad_top <= 2
        && s.pad_left <= 2
        && pad_end(s.oh, s.ih, s.pad_top).is_some_and(|p| p <= 2)
        && pad_end(s.ow, s.iw, s.pad_left).is_some_and(|p| p <= 2)
}

/// The weight transform G (α×3) of F(m, 3), Lavin & Gray's interpolation points.
fn g_matrix(m: usize) -> Vec<[f64; 3]> {
    if m == 2 {
        vec![
            [1.0, 0.0, 0.0],
            [0.5, 0.5, 0.5],
            [0.5, -0.5, 0.5],
            [0.0, 0.0, 1.0],
        ]
    } else {
        let (s6, s12, s24) = (1.0 / 6.0, 1.0 / 12.0, 1.0 / 24.0);
        vec![
            [0.25, 0.0, 0.0],
            [-s6, -s6, -s6],
            [-s6, s6, -s6],
            [s24, s12, s6],
            [s24, -s12, s6],
            [0.0, 0.0, 1.0],
        ]
    }
}

impl PackedWinograd {
    /// Transforms and packs plain [OC, IC, 3, 3] weights and an optional [OC] bias for
    /// output tiles of m×m (2: F(2,3), 4: F(4,3)).
    pub fn new(
        shape: ConvShape,
        m: usize,
        w: &[f32],
        bias: Option<&[f32]>,
    ) -> Result<PackedWinograd, String> {
        let s = shape;
        if !winograd_supported(&s) {
            return Err(format!("Winograd does not handle the convolution {s:?}"));
        }
        if m != 2 && m != 4 {
            return Err(format!("Winograd tiles are 2×2 or 4×4, not {m}×{m}"));
        }
        s.check_weights(w, bias)?;
        let a = m + 2;
        let (icb, ocb) = (s.ic.div_ceil(BLOCK), s.oc.div_ceil(BLOCK));
        let g = g_matrix(m);
        let mut u = vec![0.0f32; a * a * ocb * s.ic * BLOCK];
        for o in 0..s.oc {
            let (ob, co) = (o / BLOCK, o % BLOCK);
            for i in 0..s.ic {
                let k = &w[(o * s.ic + i) * 9..][..9];
                // G·g (α×3), then (G·g)·Gᵀ (α×α).
                let mut gg = [[0.0f64; 3]; 6];
                for (r, row) in gg.iter_mut().enumerate().take(a) {
                    for (c, v) in row.iter_mut().enumerate() {
                        *v = (0..3).map(|t| g[r][t] * k[t * 3 + c] as f64).sum();
                    }
                }
                for (r, ggr) in gg.iter().enumerate().take(a) {
                    for (c, gc) in g.iter().enumerate() {
                        let v: f64 = (0..3).map(|t| ggr[t] * gc[t]).sum();
                        let xi = r * a + c;
                        u[((xi * ocb + ob) * s.ic + i) * BLOCK + co] = v as f32;
                    }
                }
            }
        }
        let mut pb = vec![0.0f32; ocb * BLOCK];
        if let Some(b) = bias {
            pb[..s.oc].copy_from_slice(b);
        }
        let mut last_mask = [false; BLOCK];
        last_mask[..s.oc - (ocb - 1) * BLOCK].fill(true);
        let (th, tw) = (s.oh.div_ceil(m), s.ow.div_ceil(m));
        // V and M of one tile: α² vectors of IC and of OC (rounded to blocks).
        let per_tile = a * a * (icb + ocb) * BLOCK * std::mem::size_of::<f32>();
        let batch = (l2_budget() / per_tile).clamp(MIN_BATCH, MAX_BATCH) / UR512 * UR512;
        let batch = batch.min(th * tw);
        Ok(PackedWinograd {
            shape,
            m,
            icb,
            ocb,
            th,
            tw,
            batch,
            u,
            bias: pb,
            last_mask,
            cut: std::sync::OnceLock::new(),
        })
    }

    /// The output tile size: 2 for F(2,3), 4 for F(4,3).
    pub(crate) fn m(&self) -> usize {
        self.m
    }

    /// f32 count of the NCHW16c input.
    #[cfg(test)]
    pub(crate) fn x_len(&self) -> usize {
        let s = &self.shape;
        s.n * self.icb * s.ih * s.iw * BLOCK
    }

    /// f32 count of the NCHW16c output (and residual).
    #[cfg(test)]
    pub(crate) fn y_len(&self) -> usize {
        let s = &self.shape;
        s.n * self.ocb * s.oh * s.ow * BLOCK
    }

    /// Floats of V, of M, for one thread (multiples of 16: slices stay 64-byte aligned).
    fn v_m_len(&self) -> (usize, usize) {
        let aa = (self.m + 2) * (self.m + 2);
        (
            aa * self.batch * self.icb * BLOCK,
            aa * self.batch * self.ocb * BLOCK,
        )
    }

    /// f32 scratch floats one call needs with a pool of `threads` threads.
    pub fn scratch_len(&self, threads: usize) -> usize {
        let (v, m) = self.v_m_len();
        threads.max(1) * (v + m)
    }
}

/// Raw pointers shared by the tasks of one call.
struct Ctx<'a> {
    p: &'a PackedWinograd,
    x: *const f32,
    /// Null without a residual.
    z: *const f32,
    y: *mut f32,
    relu: bool,
    /// Applied to finished tile rows when not done in registers.
    act: Act,
    isa: Isa,
    /// Batches per image and output-block ranges per batch.
    batches: usize,
    splits: usize,
    items: usize,
    next: AtomicUsize,
    scratch: *mut f32,
}

// SAFETY: work items write disjoint output tiles × output blocks and per-task scratch
// slices, and only read x, z and the weights.
unsafe impl Sync for Ctx<'_> {}

/// `y = act(conv(x) + bias + z)` with x, y, z in NCHW16c, using [`isa::isa`]'s path.
///
/// # Safety
/// `x` must hold [`PackedWinograd::x_len`] floats, `y` and `z`
/// [`PackedWinograd::y_len`]; `y` must not overlap `x`; it may be exactly `z`.
/// `scratch` must hold [`PackedWinograd::scratch_len`]`(threads)` floats, 64-byte
/// aligned, where `threads` is the pool's thread count (1 without a pool).
pub unsafe fn conv_winograd(
    pool: Option<&Pool>,
    p: &PackedWinograd,
    x: *const f32,
    z: Option<*const f32>,
    y: *mut f32,
    act: Act,
    scratch: *mut f32,
) {
    // SAFETY: `conv_winograd_isa` asks the same of x, z, y and scratch, and caps
    // `isa::isa()` by the detected instruction set.
    unsafe { conv_winograd_isa(isa::isa(), pool, p, x, z, y, act, scratch) }
}

/// [`conv_winograd`] with an explicit instruction set (capped by what the CPU has).
///
/// # Safety
/// As [`conv_winograd`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn conv_winograd_isa(
    isa: Isa,
    pool: Option<&Pool>,
    p: &PackedWinograd,
    x: *const f32,
    z: Option<*const f32>,
    y: *mut f32,
    act: Act,
    scratch: *mut f32,
) {
    let s = &p.shape;
    if s.n == 0 || s.oh == 0 || s.ow == 0 {
        return;
    }
    let threads = pool.map_or(1, Pool::threads).max(1);
    let search = || schedule(s.n, p.th * p.tw, p.batch, p.icb, p.ocb, threads);
    let (batches, splits) = match p.cut.get_or_init(|| (threads, search())) {
        &(t, cut) if t == threads => cut,
        _ => search(),
    };
    let isa = isa.min(isa::detected());
    let ctx = Ctx {
        p,
        x,
        z: z.unwrap_or(std::ptr::null()),
        y,
        relu: act == Act::Relu,
        act: if act == Act::Relu { Act::None } else { act },
        isa,
        batches,
        splits,
        items: s.n * batches * splits,
        next: AtomicUsize::new(0),
        scratch,
    };
    let tasks = threads.min(ctx.items);
    let body = |t: usize| {
        // SAFETY: task t owns scratch slice t (tasks ≤ threads); items are claimed
        // once each; the caller vouches for the buffers.
        unsafe { task(&ctx, t) }
    };
    match pool {
        Some(pool) if tasks > 1 => pool.run(tasks, &body),
        _ => body(0),
    }
}

/// How one call's work is cut: `(batches, splits)`, each image's tiles into `batches`
/// ranges (edges at multiples of [`UR512`], none over `batch`) times `splits` near-equal
/// output-block ranges, each split repeating its batch's input transform. With several
/// threads, the cut whose items, claimed in order by whichever thread is free, finish
/// first under a cost model (micro-kernel calls × blocks, plus the transforms); ties go
/// to fewer items. Neither "more tiles per thread" nor "more items than threads" is
/// right alone: 25 tiles of four 64-channel blocks split best by blocks, 169 tiles of
/// three by tiles.
pub(super) fn schedule(
    n: usize,
    tiles: usize,
    batch: usize,
    icb: usize,
    ocb: usize,
    threads: usize,
) -> (usize, usize) {
    let least = tiles.div_ceil(batch);
    if threads == 1 {
        return (least, 1);
    }
    // In units of one tile's product with one input and one output block.
    let cost = |tb: usize, nob: usize| {
        let product = tb.next_multiple_of(UR512) * icb * nob;
        // Input transform ≈ half a block product, output transform a quarter.
        product + tb * icb / 2 + tb * nob / 4 + icb
    };
    let makespan = |batches: usize, splits: usize| {
        // No allocation per run: at most 64 threads' finishing times (more share them).
        let mut free = [0usize; 64];
        let free = &mut free[..threads.min(64)];
        for _ in 0..n {
            for b in 0..batches {
                let (t0, t1) = tile_range(tiles, batches, b);
                for k in 0..splits {
                    let nob = (k + 1) * ocb / splits - k * ocb / splits;
                    if t1 > t0 && nob > 0 {
                        let first = free.iter_mut().min().expect("threads > 1");
                        *first += cost(t1 - t0, nob);
                    }
                }
            }
        }
        free.iter().copied().max().unwrap_or(0)
    };
    let mut best = (least, 1, makespan(least, 1));
    // A bounded search: at most 17 × 16 cuts, so a many-core host pays little for it.
    for batches in least..=(least + (2 * threads).min(16)).min(tiles) {
        for splits in 1..=ocb.min(2 * threads).min(16) {
            let m = makespan(batches, splits);
            if m < best.2 {
                best = (batches, splits, m);
            }
        }
    }
    (best.0, best.1)
}

/// Tiles `[t0, t1)` of batch `b` of `batches`: edges at multiples of [`UR512`], so a
/// range is at most `⌈tiles / batches⌉` rounded up to one.
pub(super) fn tile_range(tiles: usize, batches: usize, b: usize) -> (usize, usize) {
    let edge = |b: usize| {
        (b * tiles)
            .div_ceil(batches)
            .next_multiple_of(UR512)
            .min(tiles)
    };
    (edge(b), edge(b + 1))
}

/// One task: claims work items until none are left, using scratch slice `t`.
unsafe fn task(c: &Ctx, t: usize) {
    let p = c.p;
    let (vl, ml) = p.v_m_len();
    let v = c.scratch.wrapping_add(t * (vl + ml));
    let mm = v.wrapping_add(vl);
    loop {
        let i = c.next.fetch_add(1, Ordering::Relaxed);
        if i >= c.items {
            return;
        }
        let split = i % c.splits;
        let b = (i / c.splits) % c.batches;
        let n = i / (c.splits * c.batches);
        let (ob0, ob1) = (split * p.ocb / c.splits, (split + 1) * p.ocb / c.splits);
        if ob0 == ob1 {
            continue;
        }
        let (t0, t1) = tile_range(p.th * p.tw, c.batches, b);
        if t0 == t1 {
            continue;
        }
        let w = Item {
            n,
            t0,
            tb: t1 - t0,
            ob0,
            ob1,
            v,
            mm,
        };
        // Each arm runs item `w`, which this task claimed alone (`c.next`), so its
        // tiles × blocks of y and its scratch are this task's.
        match (c.isa, p.m) {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: c.isa is capped by `isa::detected()`, so Avx512 means the CPU has
            // AVX-512F; F(2,3) tiles are α = 4.
            (Isa::Avx512, 2) => unsafe { item_avx512::<4>(c, &w) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX-512F present (c.isa = Avx512 after the cap); F(4,3), α = 6.
            (Isa::Avx512, _) => unsafe { item_avx512::<6>(c, &w) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: c.isa = Avx2 after the detected cap: the CPU has AVX2 and FMA.
            (Isa::Avx2, 2) => unsafe { item_avx2::<4>(c, &w) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX2+FMA present (capped c.isa = Avx2), α = 6 tiles.
            (Isa::Avx2, _) => unsafe { item_avx2::<6>(c, &w) },
            // SAFETY: the portable path needs no CPU feature; α = 4.
            (_, 2) => unsafe { item_portable::<4>(c, &w) },
            // SAFETY: no CPU feature needed; α = 6 portable item.
            _ => unsafe { item_portable::<6>(c, &w) },
        }
    }
}

/// One work item: tiles [t0, t0+tb) of image n, output blocks [ob0, ob1).
struct Item {
    n: usize,
    t0: usize,
    tb: usize,
    ob0: usize,
    ob1: usize,
    /// This task's V and M scratch.
    v: *mut f32,
    mm: *mut f32,
}

/// The micro-kernel an [`item`] instance uses (const-generic parameter values).
pub(super) const K_PORTABLE: u8 = 0;
pub(super) const K_AVX2: u8 = 1;
pub(super) const K_AVX512: u8 = 2;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn item_avx512<const A: usize>(c: &Ctx, w: &Item) {
    // SAFETY: `item`'s contract is this fn's; this fn has AVX-512F, which `K_AVX512`
    // and the `Z` lanes need.
    unsafe { item::<A, K_AVX512, Z>(c, w) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn item_avx2<const A: usize>(c: &Ctx, w: &Item) {
    // SAFETY: as this fn's contract; AVX2+FMA is enabled here, as `K_AVX2` needs.
    unsafe { item::<A, K_AVX2, L>(c, w) }
}

unsafe fn item_portable<const A: usize>(c: &Ctx, w: &Item) {
    // SAFETY: this fn's contract is `item`'s; the portable kernel needs no feature.
    unsafe { item::<A, K_PORTABLE, L>(c, w) }
}

/// The three steps for one work item; `K` selects the micro-kernel (`K_AVX2` only
/// inside [`item_avx2`], `K_AVX512` only inside [`item_avx512`], which compile the
/// transforms for their ISA too).
#[inline(always)]
unsafe fn item<const A: usize, const K: u8, V: Lanes>(c: &Ctx, w: &Item) {
    let p = c.p;
    let s = &p.shape;
    let m = A - 2;
    let aa = A * A;
    let icp = p.icb * BLOCK;
    let plane_x = s.ih * s.iw * BLOCK;
    // 1. Input transform into V[ξ][tile][icp].
    for k in 0..w.tb {
        let tile = w.t0 + k;
        let (ty, tx) = (tile / p.tw, tile % p.tw);
        let iy0 = (ty * m) as isize - s.pad_top as isize;
        let ix0 = (tx * m) as isize - s.pad_left as isize;
        // The patch rows/columns inside the image.
        let r0 = (-iy0).clamp(0, A as isize) as usize;
        let r1 = (s.ih as isize - iy0).clamp(0, A as isize) as usize;
        let c0 = (-ix0).clamp(0, A as isize) as usize;
        let c1 = (s.iw as isize - ix0).clamp(0, A as isize) as usize;
        for ib in 0..p.icb {
            // The patch origin may lie outside the image: wrapping arithmetic, and
            // only in-image positions are dereferenced.
            let org =
                c.x.wrapping_add((w.n * p.icb + ib) * plane_x)
                    .wrapping_offset((iy0 * s.iw as isize + ix0) * BLOCK as isize);
            // SAFETY: positions (r0..r1, c0..c1) of the patch are inside plane (n, ib)
            // of x; V has room for tile k, block ib, every ξ.
            unsafe {
                input_tile::<V, A>(
                    org,
                    s.iw * BLOCK,
                    [r0, r1, c0, c1],
                    w.v.add(k * icp + ib * BLOCK),
                    p.batch * icp,
                )
            };
        }
    }
    // 2. M[ob][tile][ξ][16] = Σ_ic V[ξ][tile][ic] · U[ξ][ob][ic][16], AVX-512 two
    // output blocks at a time.
    let (ur, nb_max) = if K == K_AVX512 { (UR512, 2) } else { (UR, 1) };
    let ldb = s.ic * BLOCK;
    let obs = p.batch * aa * BLOCK;
    for xi in 0..aa {
        let mut ob = w.ob0;
        while ob < w.ob1 {
            let nb = nb_max.min(w.ob1 - ob);
            let u = p.u[(xi * p.ocb + ob) * ldb..].as_ptr();
            let mut k = 0;
            while k < w.tb {
                let r = ur.min(w.tb - k);
                let a = w.v.wrapping_add((xi * p.batch + k) * icp);
                let out =
                    w.mm.wrapping_add((((ob - w.ob0) * p.batch + k) * aa + xi) * BLOCK);
                let t = Tiles {
                    rows: r,
                    k: s.ic,
                    a,
                    lda: icp,
                    nb,
                    b: u,
                    ldb,
                    out,
                    ldo: aa * BLOCK,
                    obs,
                };
                // SAFETY: r tile rows of V[ξ] with IC valid columns, U[ξ][ob..ob+nb]
                // hold IC×16 floats each (ldb apart), M has room for r tiles of these
                // blocks at ξ.
                unsafe { gemm_tiles::<K>(&t) };
                k += r;
            }
            ob += nb;
        }
    }
    // 3. Output transform, bias, residual, activation.
    let plane_y = s.oh * s.ow * BLOCK;
    for ob in w.ob0..w.ob1 {
        let bias: &[f32; BLOCK] = p.bias[ob * BLOCK..][..BLOCK].try_into().expect("16 values");
        let mask = if ob + 1 == p.ocb {
            p.last_mask
        } else {
            [true; BLOCK]
        };
        let bits = (0..BLOCK).fold(0u16, |b, l| b | (u16::from(mask[l]) << l));
        let ybase = (w.n * p.ocb + ob) * plane_y;
        for k in 0..w.tb {
            let tile = w.t0 + k;
            let (ty, tx) = (tile / p.tw, tile % p.tw);
            let (oy, ox) = (ty * m, tx * m);
            let (hv, wv) = (m.min(s.oh - oy), m.min(s.ow - ox));
            let off = ybase + (oy * s.ow + ox) * BLOCK;
            let z = if c.z.is_null() {
                c.z
            } else {
                c.z.wrapping_add(off)
            };
            let src = w.mm.wrapping_add(((ob - w.ob0) * p.batch + k) * aa * BLOCK);
            let (yp, rs) = (c.y.wrapping_add(off), s.ow * BLOCK);
            // SAFETY: M holds this tile's α²·16 floats; the hv×wv valid pixels of the
            // tile are inside plane (n, ob) of y and z.
            unsafe { output_tile::<V, A>(src, bias, (&mask, bits), z, yp, rs, hv, wv, c.relu) };
            if c.act != Act::None {
                for r in 0..hv {
                    // SAFETY: this item owns the tile's pixels; row r holds wv·16
                    // finished floats.
                    let row = unsafe {
                        std::slice::from_raw_parts_mut(c.y.add(off + r * s.ow * BLOCK), wv * BLOCK)
                    };
                    c.act.apply_isa(c.isa, row);
                }
            }
        }
    }
}

/// 16 channel lanes as the transforms see them: [`L`] (portable, and AVX2 when compiled
/// with it) or [`Z`] (one zmm register). The transforms are written once over this trait
/// with plain loops over fixed-size arrays: after unrolling they stay in registers. (Built
/// with `std::array::from_fn` or closures instead, they ended in helpers compiled
/// without the caller's target features: SSE, four lanes at a time.)
trait Lanes: Copy + Add<Output = Self> + Sub<Output = Self> + Mul<f32, Output = Self> {
    fn zero() -> Self;
    /// # Safety
    /// `p` holds 16 readable floats.
    unsafe fn load(p: *const f32) -> Self;
    /// The lanes of `mask` from `p`, zero elsewhere (the others may be NaN in memory).
    /// # Safety
    /// `p` holds 16 readable floats.
    unsafe fn load_masked(p: *const f32, mask: &[bool; BLOCK], bits: u16) -> Self;
    /// # Safety
    /// `p` holds 16 writable floats.
    unsafe fn store(self, p: *mut f32);
    fn relu(self) -> Self;
}

/// 16 lanes as a plain array (two ymm with AVX2 enabled).
#[derive(Clone, Copy)]
struct L([f32; BLOCK]);

impl L {
    const ZERO: L = L([0.0; BLOCK]);

    #[inline(always)]
    unsafe fn load(p: *const f32) -> L {
        // SAFETY: the caller passes 16 readable floats.
        L(unsafe { p.cast::<[f32; BLOCK]>().read_unaligned() })
    }
}

impl Lanes for L {
    #[inline(always)]
    fn zero() -> L {
        L::ZERO
    }

    #[inline(always)]
    unsafe fn load(p: *const f32) -> L {
        // SAFETY: `Lanes::load` asks 16 readable floats at p, as `L::load` does.
        unsafe { L::load(p) }
    }

    #[inline(always)]
    unsafe fn load_masked(p: *const f32, mask: &[bool; BLOCK], _: u16) -> L {
        // SAFETY: `load_masked` too is given 16 readable floats at p (pad lanes
        // included), all `L::load` needs.
        let mut v = unsafe { L::load(p) };
        for (l, &keep) in v.0.iter_mut().zip(mask) {
            // A select, not a multiply: the masked lanes may be NaN.
            *l = if keep { *l } else { 0.0 };
        }
        v
    }

    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: the caller passes 16 writable floats.
        unsafe { p.cast::<[f32; BLOCK]>().write_unaligned(self.0) }
    }

    #[inline(always)]
    fn relu(mut self) -> L {
        for l in self.0.iter_mut() {
            *l = math::relu(*l);
        }
        self
    }
}

impl Add for L {
    type Output = L;
    #[inline(always)]
    fn add(mut self, o: L) -> L {
        for (a, b) in self.0.iter_mut().zip(o.0) {
            *a += b;
        }
        self
    }
}

impl Sub for L {
    type Output = L;
    #[inline(always)]
    fn sub(mut self, o: L) -> L {
        for (a, b) in self.0.iter_mut().zip(o.0) {
            *a -= b;
        }
        self
    }
}

impl Mul<f32> for L {
    type Output = L;
    #[inline(always)]
    fn mul(mut self, k: f32) -> L {
        for a in self.0.iter_mut() {
            *a *= k;
        }
        self
    }
}

/// 16 lanes in one zmm register; used only inside [`item_avx512`] (AVX-512F CPUs), where
/// these always-inlined methods' intrinsics inline too.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Z(std::arch::x86_64::__m512);

#[cfg(not(target_arch = "x86_64"))]
type Z = L;

#[cfg(target_arch = "x86_64")]
mod zmm {
    use super::{Lanes, BLOCK, Z};
    use std::arch::x86_64::*;
    use std::ops::{Add, Mul, Sub};

    // Every block below rests on `Z` being used only in code running on AVX-512F CPUs
    // (see `Z`): these trait methods cannot enable the feature themselves.
    impl Lanes for Z {
        #[inline(always)]
        fn zero() -> Z {
            // SAFETY: `_mm512_setzero_ps` needs only AVX-512F, which a CPU running `Z`
            // code has.
            Z(unsafe { _mm512_setzero_ps() })
        }

        #[inline(always)]
        unsafe fn load(p: *const f32) -> Z {
            // SAFETY: p holds 16 readable floats (`Lanes::load`), and `Z` code runs
            // with AVX-512F.
            Z(unsafe { _mm512_loadu_ps(p) })
        }

        #[inline(always)]
        unsafe fn load_masked(p: *const f32, _: &[bool; BLOCK], bits: u16) -> Z {
            // SAFETY: p holds 16 readable floats, of which the masked-off lanes are not
            // even loaded; AVX-512F as for all `Z` code.
            Z(unsafe { _mm512_maskz_loadu_ps(bits, p) })
        }

        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            // SAFETY: `Lanes::store` gives 16 writable floats at p; `Z` implies the CPU
            // has AVX-512F.
            unsafe { _mm512_storeu_ps(p, self.0) }
        }

        #[inline(always)]
        fn relu(self) -> Z {
            // SAFETY: register-only max and zero, AVX-512F (present wherever a `Z` is).
            Z(unsafe { _mm512_max_ps(self.0, _mm512_setzero_ps()) })
        }
    }

    impl Add for Z {
        type Output = Z;
        #[inline(always)]
        fn add(self, o: Z) -> Z {
            // SAFETY: a register add; `Z` values exist only on AVX-512F CPUs.
            Z(unsafe { _mm512_add_ps(self.0, o.0) })
        }
    }

    impl Sub for Z {
        type Output = Z;
        #[inline(always)]
        fn sub(self, o: Z) -> Z {
            // SAFETY: a register subtract, run only where `Z` is, on AVX-512F.
            Z(unsafe { _mm512_sub_ps(self.0, o.0) })
        }
    }

    impl Mul<f32> for Z {
        type Output = Z;
        #[inline(always)]
        fn mul(self, k: f32) -> Z {
            // SAFETY: broadcast and multiply in registers; the AVX-512F they need is there
            // for any `Z`.
            Z(unsafe { _mm512_mul_ps(self.0, _mm512_set1_ps(k)) })
        }
    }
}

/// `Bᵀ d` along one axis (α = 4: F(2,3); α = 6: F(4,3)).
#[inline(always)]
fn in_1d<V: Lanes, const A: usize>(d: [V; A]) -> [V; A] {
    let mut v = [V::zero(); A];
    if A == 4 {
        v[0] = d[0] - d[2];
        v[1] = d[1] + d[2];
        v[2] = d[2] - d[1];
        v[3] = d[1] - d[3];
    } else {
        let t = d[4] - d[2];
        let e = (d[3] - d[1]) * 2.0;
        v[0] = d[0] * 4.0 - d[2] * 5.0 + d[4];
        v[1] = (d[3] + d[4]) - (d[1] + d[2]) * 4.0;
        v[2] = (d[4] - d[3]) + (d[1] - d[2]) * 4.0;
        v[3] = t + e;
        v[4] = t - e;
        v[5] = d[1] * 4.0 - d[3] * 5.0 + d[5];
    }
    v
}

/// `Aᵀ m` along one axis: the first α−2 entries of the result are meaningful (an α-array
/// keeps one generic length for both passes; the rest stay zero).
#[inline(always)]
fn out_1d<V: Lanes, const A: usize>(m: [V; A]) -> [V; A] {
    let mut y = [V::zero(); A];
    if A == 4 {
        y[0] = m[0] + m[1] + m[2];
        y[1] = m[1] - m[2] - m[3];
    } else {
        let (a, b) = (m[1] + m[2], m[1] - m[2]);
        let (c, e) = (m[3] + m[4], m[3] - m[4]);
        y[0] = m[0] + a + c;
        y[1] = b + e * 2.0;
        y[2] = a + c * 4.0;
        y[3] = b + e * 8.0 + m[5];
    }
    y
}

/// `V = Bᵀ d B` for one tile and input block: `org` is the patch's (0, 0) (possibly
/// outside the image), `rs` the row stride; only rows r0..r1 × columns c0..c1 are read,
/// the rest is zero. Writes α² vectors at `v + ξ·vs`.
#[inline(always)]
unsafe fn input_tile<V: Lanes, const A: usize>(
    org: *const f32,
    rs: usize,
    [r0, r1, c0, c1]: [usize; 4],
    v: *mut f32,
    vs: usize,
) {
    let full = r0 == 0 && c0 == 0 && r1 == A && c1 == A;
    // Column pass: cols[j] = Bᵀ d[·][j].
    let mut cols = [[V::zero(); A]; A];
    for (j, col) in cols.iter_mut().enumerate() {
        let mut d = [V::zero(); A];
        for (i, di) in d.iter_mut().enumerate() {
            if full || (c0 <= j && j < c1 && r0 <= i && i < r1) {
                // SAFETY: (i, j) is inside the image (the caller's ranges).
                *di = unsafe { V::load(org.wrapping_add(i * rs + j * BLOCK)) };
            }
        }
        *col = in_1d(d);
    }
    // Row pass: V[i][·] = (Bᵀ d)[i][·] B, row i gathered across the columns.
    for i in 0..A {
        let mut row = [V::zero(); A];
        for (x, col) in row.iter_mut().zip(&cols) {
            *x = col[i];
        }
        for (j, x) in in_1d(row).iter().enumerate() {
            // SAFETY: V has α² slots of 16 floats, vs apart.
            unsafe { x.store(v.add((i * A + j) * vs)) };
        }
    }
}

/// `Y = Aᵀ M A + bias (+ z) (max 0)` for one tile of one output block, storing its
/// hv×wv valid pixels at `y` (row stride `rs`); reads each residual pixel before
/// storing it (y may be z). `bits` is `mask` as a bit mask.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn output_tile<V: Lanes, const A: usize>(
    src: *const f32,
    bias: &[f32; BLOCK],
    (mask, bits): (&[bool; BLOCK], u16),
    z: *const f32,
    y: *mut f32,
    rs: usize,
    hv: usize,
    wv: usize,
    relu: bool,
) {
    let m = A - 2;
    // Row pass on M's rows: t[i][·] = M[i][·] A.
    let mut t = [[V::zero(); A]; A];
    for (i, ti) in t.iter_mut().enumerate() {
        let mut row = [V::zero(); A];
        for (j, x) in row.iter_mut().enumerate() {
            // SAFETY: M holds α² vectors of 16.
            *x = unsafe { V::load(src.add((i * A + j) * BLOCK)) };
        }
        *ti = out_1d(row);
    }
    // SAFETY: 16 bias values.
    let b = unsafe { V::load(bias.as_ptr()) };
    // Column pass: Y[·][j] = Aᵀ t[·][j].
    for j in 0..wv.min(m) {
        let mut col = [V::zero(); A];
        for (x, ti) in col.iter_mut().zip(&t) {
            *x = ti[j];
        }
        for (i, yv) in out_1d(col).iter().enumerate().take(hv.min(m)) {
            let mut o = *yv + b;
            let at = i * rs + j * BLOCK;
            if !z.is_null() {
                // SAFETY: pixel (i, j) is inside z.
                o = o + unsafe { V::load_masked(z.add(at), mask, bits) };
            }
            if relu {
                o = o.relu();
            }
            // SAFETY: pixel (i, j) is inside y.
            unsafe { o.store(y.add(at)) };
        }
    }
}

/// One micro-kernel call: `out[j][r] = Σ_{p<k} a[r][p] · b[j][p][0..16]` for r < rows,
/// j < nb: rows of a `lda` apart, b's blocks k×16 contiguous and `ldb` apart, out rows
/// `ldo` apart and its blocks `obs` apart.
pub(super) struct Tiles {
    pub rows: usize,
    pub k: usize,
    pub a: *const f32,
    pub lda: usize,
    pub nb: usize,
    pub b: *const f32,
    pub ldb: usize,
    pub out: *mut f32,
    pub ldo: usize,
    pub obs: usize,
}

/// Runs [`Tiles`] on kernel `K`: rows ≤ [`UR512`] and nb ≤ 2 for `K_AVX512`, rows ≤
/// [`UR`] otherwise (the portable and AVX2 kernels do one block at a time).
///
/// # Safety
/// The pointers hold what [`Tiles`] describes; `K_AVX2` only on AVX2+FMA CPUs,
/// `K_AVX512` only on AVX-512F ones.
#[inline(always)]
pub(super) unsafe fn gemm_tiles<const K: u8>(t: &Tiles) {
    #[cfg(target_arch = "x86_64")]
    if K == K_AVX512 {
        macro_rules! go512 {
            ($($n:literal)*) => {
                match (t.rows, t.nb) {
                    $(
                        // SAFETY: K_AVX512 runs only on AVX-512F CPUs; t holds one block of
                        // t.rows = $n rows, as the kernel's R, NB.
                        ($n, 1) => unsafe { kernel_avx512::<$n, 1>(t) },
                        // SAFETY: AVX-512F (K_AVX512); t's two blocks (ldb, obs apart)
                        // of $n rows.
                        ($n, 2) => unsafe { kernel_avx512::<$n, 2>(t) },
                    )*
                    _ => unreachable!("at most {UR512} rows and 2 blocks"),
                }
            };
        }
        return go512!(1 2 3 4 5 6 7 8 9 10 11 12);
    }
    for j in 0..t.nb {
        let (b, out) = (t.b.wrapping_add(j * t.ldb), t.out.wrapping_add(j * t.obs));
        let (k, a, lda, ldo) = (t.k, t.a, t.lda, t.ldo);
        macro_rules! go {
            ($($n:literal)*) => {
                match t.rows {
                    $($n => {
                        #[cfg(target_arch = "x86_64")]
                        if K == K_AVX2 {
                            // SAFETY: K_AVX2 runs only on AVX2+FMA CPUs; block j's b and
                            // out, with a's $n rows, as `Tiles` describes.
                            unsafe { kernel_avx2::<$n>(k, a, lda, b, out, ldo) };
                            continue;
                        }
                        // SAFETY: block j's b (k×16) and out, a's $n rows of k, per
                        // `Tiles`; no CPU feature needed.
                        unsafe { kernel_portable::<$n>(k, a, lda, b, out, ldo) }
                    })*
                    _ => unreachable!("at most {UR} rows"),
                }
            };
        }
        go!(1 2 3 4 5 6)
    }
}

/// The micro-kernel in plain Rust (the compiler vectorizes the 16 output lanes).
#[inline(always)]
unsafe fn kernel_portable<const R: usize>(
    k: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    out: *mut f32,
    ldo: usize,
) {
    let mut acc = [L::ZERO; R];
    for p in 0..k {
        // SAFETY: b holds k×16 floats, a R rows of k.
        let w = unsafe { L::load(b.add(p * BLOCK)) };
        for (r, acc) in acc.iter_mut().enumerate() {
            // SAFETY: row r of a has k readable floats.
            let x = unsafe { *a.add(r * lda + p) };
            *acc = *acc + w * x;
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        // SAFETY: out has R rows of 16, ldo apart.
        unsafe { acc.store(out.add(r * ldo)) };
    }
}

/// The AVX2+FMA micro-kernel: 2·R ymm accumulators, two weight loads and R broadcasts
/// per input channel. Unaligned loads and stores throughout.
///
/// # Safety
/// The CPU has AVX2 and FMA; `b` holds k×16 floats, `a` R rows of k (`lda` apart),
/// `out` R rows of 16 (`ldo` apart) apart from both.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn kernel_avx2<const R: usize>(
    k: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    out: *mut f32,
    ldo: usize,
) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    // One pointer per row: the broadcasts' addresses do not chain through lda.
    // SAFETY: row r < R of a starts r·lda floats from a, inside the R rows it holds.
    let rows: [*const f32; R] = unsafe { std::array::from_fn(|r| a.add(r * lda)) };
    macro_rules! step {
        ($p:expr) => {{
            // SAFETY: channel `$p` < k's 16 weights at b + `$p`·16, of b's k×16.
            let w0 = unsafe { _mm256_loadu_ps(b.add($p * BLOCK)) };
            // SAFETY: the upper 8 of the same 16 weights.
            let w1 = unsafe { _mm256_loadu_ps(b.add($p * BLOCK + 8)) };
            for (row, acc) in rows.iter().zip(acc.iter_mut()) {
                // SAFETY: element `$p` < k of one of a's R rows of k floats.
                let x = unsafe { _mm256_broadcast_ss(&*row.add($p)) };
                acc[0] = _mm256_fmadd_ps(x, w0, acc[0]);
                acc[1] = _mm256_fmadd_ps(x, w1, acc[1]);
            }
        }};
    }
    // Unrolled by 4: IC is usually a multiple of 16.
    let mut p = 0;
    while p + 4 <= k {
        step!(p);
        step!(p + 1);
        step!(p + 2);
        step!(p + 3);
        p += 4;
    }
    while p < k {
        step!(p);
        p += 1;
    }
    for (r, acc) in acc.iter().enumerate() {
        // SAFETY: output row r < R's 16 floats at out + r·ldo.
        unsafe {
            _mm256_storeu_ps(out.add(r * ldo), acc[0]);
            _mm256_storeu_ps(out.add(r * ldo + 8), acc[1]);
        }
    }
}

/// The AVX-512F micro-kernel: R×NB zmm accumulators (R tiles × NB output blocks), NB
/// weight loads and R broadcasts per input channel. Unaligned loads and stores
/// throughout.
///
/// # Safety
/// The CPU has AVX-512F; `t` as [`Tiles`] with rows = R, nb = NB.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn kernel_avx512<const R: usize, const NB: usize>(t: &Tiles) {
    use std::arch::x86_64::*;
    let (k, a, b) = (t.k, t.a, t.b);
    let mut acc = [[_mm512_setzero_ps(); NB]; R];
    // One pointer per row: the broadcasts' addresses do not chain through lda.
    // SAFETY: a holds R = t.rows rows, t.lda apart: row r starts inside it.
    let rows: [*const f32; R] = unsafe { std::array::from_fn(|r| a.add(r * t.lda)) };
    // SAFETY: b holds NB = t.nb blocks of k×16, t.ldb apart: block j starts inside it.
    let bs: [*const f32; NB] = unsafe { std::array::from_fn(|j| b.add(j * t.ldb)) };
    macro_rules! step {
        ($p:expr) => {{
            let w: [__m512; NB] =
                // SAFETY: channel `$p` < k's 16 weights in each block j < NB of b.
                unsafe { std::array::from_fn(|j| _mm512_loadu_ps(bs[j].add($p * BLOCK))) };
            for (row, acc) in rows.iter().zip(acc.iter_mut()) {
                // SAFETY: element `$p` < k of one of a's R rows.
                let x = _mm512_set1_ps(unsafe { *row.add($p) });
                for (acc, w) in acc.iter_mut().zip(&w) {
                    *acc = _mm512_fmadd_ps(x, *w, *acc);
                }
            }
        }};
    }
    // Unrolled by 4: IC is usually a multiple of 4.
    let mut p = 0;
    while p + 4 <= k {
        step!(p);
        step!(p + 1);
        step!(p + 2);
        step!(p + 3);
        p += 4;
    }
    while p < k {
        step!(p);
        p += 1;
    }
    for (r, acc) in acc.iter().enumerate() {
        for (j, acc) in acc.iter().enumerate() {
            // SAFETY: row r < R of output block j < NB: 16 floats, t.ldo a row and
            // t.obs a block.
            unsafe { _mm512_storeu_ps(t.out.add(r * t.ldo + j * t.obs), *acc) };
        }
    }
}
