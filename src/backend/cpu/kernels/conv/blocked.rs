//! Direct convolution on NCHW16c tensors (group 1).
//!
//! The input may also be plain NCHW ([`PackedConv::with_plain_x`]), for first layers
//! with a few input channels (an RGB or grey image), which blocking would pad to 16
//! lanes: the micro-kernel then steps by H·W floats from one input channel to the next
//! instead of 1, and by 1 instead of 16 from one pixel to the next (as oneDNN does).
//!
//! Weights are packed once into [OCB][ICB][KH][KW][16 ic][16 oc] with zeros for pad
//! channels, so the pad lanes of the output come out finite (zero weights, zero-extended
//! bias, masked residual). The kernel stops at the last real input channel, so the
//! unspecified (possibly non-finite) pad lanes of the input are never read into a sum.
//!
//! The micro-kernel computes R consecutive output pixels of one row × NB output blocks
//! of 16 channels, one vector accumulator per (pixel, 8 or 16 lanes): per input channel
//! it loads the NB blocks' weight vectors, broadcasts R input values and issues the
//! FMAs. AVX2 runs NB = 1, R ≤ [`UR`] (2·R ymm accumulators); AVX-512 runs NB = 2,
//! R ≤ [`UR512_2`] (each broadcast feeds two FMAs, the broadcasts are FMA memory
//! operands), and NB = 1, R ≤ [`UR512_1`] for an odd block count's last block.
//! Padding needs no padded copy: each output row visits only its valid kernel rows, the
//! interior columns run in groups of R, and each border pixel runs alone with its own
//! valid kernel columns. When the weights of one call's output blocks outgrow half of
//! the host's L1d ([`host::caches`]), input blocks are processed in chunks that
//! accumulate into y (bias and residual at the first, activation at the last).
//!
//! While a chunk runs, its calls ask L2 for the next chunk's weights, a share each
//! ([`NextWeights`]): a batch-1 layer of a late stage reads each weight a few dozen
//! times, so the first row of every chunk otherwise waited on memory. Each call also
//! asks L1 for the next input block's pixels before it needs them.
//!
//! Threads take output rows of (image, group of NB blocks); when there are fewer rows
//! than the threads want (a 1-D signal with few output blocks), each row is cut into
//! column spans.
use super::ConvShape;
use crate::aligned::AlignedBuf;
use crate::backend::cpu::host;
use crate::backend::cpu::isa::{self, Isa};
use crate::backend::cpu::kernels::par::{self, SyncPtr};
use crate::backend::cpu::kernels::{math, Act};
use crate::backend::cpu::pool::Pool;

/// Channels per block of the NCHW16c layout.
pub const BLOCK: usize = 16;
/// Output pixels per AVX2 micro-kernel call (2·UR accumulators + 2 weights + 1
/// broadcast ≤ 16 ymm registers).
const UR: usize = 6;
/// Output pixels per AVX-512 call with two output blocks (2·UR512_2 accumulators + 2
/// weights ≤ 32 zmm registers; broadcasts are memory operands).
const UR512_2: usize = 12;
/// Output pixels per AVX-512 call with one output block (an odd block count's last).
const UR512_1: usize = 24;
/// Accumulator sets of a one-pixel AVX-512 call (FMA latency × issue rate / 2 blocks).
const CHAINS: usize = 4;
/// Floats in a 64-byte cache line.
const LINE_FLOATS: usize = 16;
/// Floats from one output pixel to the next in a blocked x at stride 2.
const PX2: usize = 2 * BLOCK;
/// Floats of packed weights per (input block, kernel tap): 16 ic × 16 oc.
const TAP: usize = BLOCK * BLOCK;

/// Convolution weights and bias packed for [`conv_blocked`].
#[derive(Debug)]
pub struct PackedConv {
    shape: ConvShape,
    icb: usize,
    ocb: usize,
    /// 64-byte aligned, so that no zmm load of a weight row splits a cache line.
    w: AlignedBuf,
    /// OCB·16 values, zero past OC.
    bias: Vec<f32>,
    /// Input blocks per cache chunk.
    chunk: usize,
    /// Lanes of the last output block that hold channels (the others ignore the
    /// residual's unspecified pad lanes).
    last_mask: [u32; BLOCK],
    /// x is plain NCHW rather than NCHW16c.
    plain_x: bool,
}

const FULL_MASK: [u32; BLOCK] = [u32::MAX; BLOCK];

impl PackedConv {
    /// Packs plain [OC, IC, KH, KW] weights and an optional [OC] bias.
    pub fn new(shape: ConvShape, w: &[f32], bias: Option<&[f32]>) -> Result<PackedConv, String> {
        let s = shape;
        if s.groups != 1 {
            return Err(format!("a blocked conv has one group, not {}", s.groups));
        }
        let taps = s.kh * s.kw;
        s.check_weights(w, bias)?;
        let (icb, ocb) = (s.ic.div_ceil(BLOCK), s.oc.div_ceil(BLOCK));
        let mut pw = vec![0.0f32; ocb * icb * taps * TAP];
        for o in 0..s.oc {
            let (ob, co) = (o / BLOCK, o % BLOCK);
            for i in 0..s.ic {
                let (ib, ci) = (i / BLOCK, i % BLOCK);
                for t in 0..taps {
                    let dst = ((ob * icb + ib) * taps + t) * TAP + ci * BLOCK + co;
                    pw[dst] = w[(o * s.ic + i) * taps + t];
                }
            }
        }
        let mut pb = vec![0.0f32; ocb * BLOCK];
        if let Some(b) = bias {
            pb[..s.oc].copy_from_slice(b);
        }
        // The weights of one micro-kernel call's output blocks × one input chunk stay in
        // half of L1 across the tiles of a row, as a GEMM's KC slice of B does; each
        // further chunk re-reads the row's outputs, which share the other half.
        let per_block = taps * TAP * std::mem::size_of::<f32>() * oc_group(isa::isa());
        let chunk = (host::caches().l1d / 2 / per_block).clamp(1, icb);
        let chunks = icb.div_ceil(chunk);
        let chunk = icb.div_ceil(chunks);
        let mut last_mask = [0u32; BLOCK];
        let valid = s.oc - (ocb - 1) * BLOCK;
        last_mask[..valid].fill(u32::MAX);
        Ok(PackedConv {
            shape,
            icb,
            ocb,
            w: {
                let bytes: Vec<u8> = pw.iter().flat_map(|v| v.to_ne_bytes()).collect();
                AlignedBuf::try_from_bytes(&bytes).map_err(|e| e.to_string())?
            },
            bias: pb,
            chunk,
            last_mask,
            plain_x: false,
        })
    }

    /// The same convolution reading a plain NCHW input (y and z stay NCHW16c).
    pub(crate) fn with_plain_x(mut self, plain: bool) -> PackedConv {
        self.plain_x = plain;
        self
    }

    /// Whether x is plain NCHW.
    #[cfg(test)]
    pub(crate) fn plain_x(&self) -> bool {
        self.plain_x
    }

    /// f32 count of the input: NCHW16c, or NCHW with [`Self::with_plain_x`].
    pub fn x_len(&self) -> usize {
        let s = &self.shape;
        if self.plain_x {
            s.n * s.ic * s.ih * s.iw
        } else {
            s.n * self.icb * s.ih * s.iw * BLOCK
        }
    }

    /// f32 count of the NCHW16c output (and residual).
    pub fn y_len(&self) -> usize {
        let s = &self.shape;
        s.n * self.ocb * s.oh * s.ow * BLOCK
    }
}

/// `y = act(conv(x) + bias + z)` with y, z in NCHW16c and x in NCHW16c (or NCHW, see
/// [`PackedConv::with_plain_x`]), using [`isa::isa`]'s path.
///
/// # Safety
/// `x` must hold [`PackedConv::x_len`] floats, `y` and `z` [`PackedConv::y_len`]; `y`
/// must not overlap `x`; it may be exactly `z`.
pub unsafe fn conv_blocked(
    pool: Option<&Pool>,
    p: &PackedConv,
    x: *const f32,
    z: Option<*const f32>,
    y: *mut f32,
    act: Act,
) {
    // SAFETY: `conv_blocked_isa` asks the same of x, z and y; it caps `isa::isa()` by
    // the CPU's own instruction set.
    unsafe { conv_blocked_isa(isa::isa(), pool, p, x, z, y, act) }
}

/// Copies the input pixels of a strided 1×1 convolution `s` (see
/// [`ConvShape::subsampled`]) from the NCHW16c `x` to `dst`, compact:
/// [N, ⌈IC/16⌉, OH, OW, 16].
///
/// # Safety
/// `x` must hold the blocked input of `s`, `dst` n·⌈ic/16⌉·oh·ow·16 floats, apart.
pub unsafe fn subsample(pool: Option<&Pool>, s: &ConvShape, x: *const f32, dst: *mut f32) {
    let (x, dst) = (SyncPtr(x as *mut f32), SyncPtr(dst));
    let planes = s.n * s.ic.div_ceil(BLOCK);
    par::for_ranges(pool, planes, s.oh * s.ow * BLOCK, &|range| {
        for plane in range {
            for oy in 0..s.oh {
                let src_row = (plane * s.ih + oy * s.strides[0]) * s.iw;
                let dst_row = (plane * s.oh + oy) * s.ow;
                for ox in 0..s.ow {
                    // SAFETY: pixel (oy·sh, ox·sw) is inside the input (`subsampled`
                    // checked), pixel (oy, ox) inside dst; the ranges' planes are disjoint.
                    unsafe {
                        let from = x.get().add((src_row + ox * s.strides[1]) * BLOCK);
                        let to = dst.get().add((dst_row + ox) * BLOCK);
                        std::ptr::copy_nonoverlapping(from, to, BLOCK);
                    }
                }
            }
        }
    });
}

/// Raw pointers shared by the tasks of one call.
struct Ctx<'a> {
    p: &'a PackedConv,
    x: *const f32,
    /// Null without a residual.
    z: *const f32,
    y: *mut f32,
    relu: bool,
    /// Applied to finished rows when not done in registers.
    act: Act,
    /// The effective instruction set (capped by the CPU's).
    isa: Isa,
    /// Output blocks per micro-kernel call ([`oc_group`]) and groups of them per image.
    group: usize,
    groups: usize,
    /// Column spans per output row (more than one when rows are too few for the threads).
    splits: usize,
}

// SAFETY: tasks write disjoint output spans and only read x, z and the weights.
unsafe impl Sync for Ctx<'_> {}

/// Output blocks one micro-kernel call computes on `isa`: AVX-512's 32 registers hold
/// two blocks' accumulators, so each broadcast input value feeds two FMAs.
fn oc_group(isa: Isa) -> usize {
    if isa >= Isa::Avx512 {
        2
    } else {
        1
    }
}

/// Output pixels per interior micro-kernel call for `oc` output channels on this CPU
/// (the row length [`ConvShape::pointwise_rows`] fills).
pub fn micro_tile(oc: usize) -> usize {
    let isa = isa::isa().min(isa::detected());
    tile_width(isa, oc_group(isa).min(oc.div_ceil(BLOCK)))
}

/// Output pixels per interior micro-kernel call for `nb` output blocks on `isa`.
fn tile_width(isa: Isa, nb: usize) -> usize {
    match (isa >= Isa::Avx512, nb) {
        (true, 2) => UR512_2,
        (true, _) => UR512_1,
        _ => UR,
    }
}

/// [`conv_blocked`] with an explicit instruction set (capped by what the CPU has).
///
/// # Safety
/// As [`conv_blocked`].
pub unsafe fn conv_blocked_isa(
    isa: Isa,
    pool: Option<&Pool>,
    p: &PackedConv,
    x: *const f32,
    z: Option<*const f32>,
    y: *mut f32,
    act: Act,
) {
    let s = &p.shape;
    let isa = isa.min(isa::detected());
    let group = oc_group(isa);
    let groups = p.ocb.div_ceil(group);
    let rows = s.n * groups * s.oh;
    if rows == 0 || s.ow == 0 {
        return;
    }
    let threads = pool.map_or(1, Pool::threads);
    let want = if threads <= 1 { 1 } else { threads * 4 };
    // Too few rows for the threads (a 1-D conv with few output blocks): each row splits
    // into column spans of at least two tiles.
    let splits = if rows >= want {
        1
    } else {
        let most = (s.ow / (2 * tile_width(isa, group))).max(1);
        want.div_ceil(rows).min(most)
    };
    let ctx = Ctx {
        p,
        x,
        z: z.unwrap_or(std::ptr::null()),
        y,
        relu: act == Act::Relu,
        act: if act == Act::Relu { Act::None } else { act },
        isa,
        group,
        groups,
        splits,
    };
    let units = rows * splits;
    let tasks = want.min(units);
    let body = |t: usize| {
        let (u0, u1) = (t * units / tasks, (t + 1) * units / tasks);
        // SAFETY: tasks cover disjoint spans of y; the caller vouches for buffers.
        unsafe { run_units(&ctx, u0, u1) }
    };
    match pool {
        Some(pool) if tasks > 1 => pool.run(tasks, &body),
        _ => body(0),
    }
}

/// Computes units [u0, u1): flattened output rows of (n, output-block group, oy), each
/// cut into `c.splits` column spans.
unsafe fn run_units(c: &Ctx, u0: usize, u1: usize) {
    let p = c.p;
    let s = &p.shape;
    let mut u = u0;
    while u < u1 {
        let (r, part) = (u / c.splits, u % c.splits);
        let seg = r / s.oh;
        let (n, g) = (seg / c.groups, seg % c.groups);
        let oy0 = r % s.oh;
        // Whole rows run chunk by chunk over all of the range's rows of this segment, so
        // a chunk's weights serve every row; a span runs alone.
        let (oy1, cols, next) = if c.splits == 1 {
            let oy1 = s.oh.min(oy0 + (u1 - u));
            (oy1, (0, s.ow), u + (oy1 - oy0))
        } else {
            let span = (part * s.ow / c.splits, (part + 1) * s.ow / c.splits);
            (oy0 + 1, span, u + 1)
        };
        let mut ib0 = 0;
        while ib0 < p.icb {
            let ib1 = p.icb.min(ib0 + p.chunk);
            let mut pf = next_weights(c, g, ib1, oy1 - oy0, cols);
            for oy in oy0..oy1 {
                // SAFETY: indices are in range; buffers per the caller's contract.
                unsafe { row(c, n, g, oy, ib0, ib1, cols, &mut pf) };
            }
            ib0 = ib1;
        }
        u = next;
    }
}

/// The weights the calls of one chunk ask L2 for while they run: the next chunk's
/// (the next group's first after a group's last), whose first row would otherwise
/// wait on L3 or memory for a chunk of up to half the L1d. Each interior call takes
/// the next `per_call` of the `lines` cache lines (per output block) from `ptr`.
struct NextWeights {
    ptr: *const f32,
    lines: usize,
    per_call: usize,
    done: usize,
}

/// The weights after chunk [.., ib1) of group `g`, shared over `rows` output rows of
/// columns `cols`.
fn next_weights(c: &Ctx, g: usize, ib1: usize, rows: usize, cols: (usize, usize)) -> NextWeights {
    let p = c.p;
    let s = &p.shape;
    let (g, ib0) = if ib1 < p.icb { (g, ib1) } else { (g + 1, 0) };
    let ob = g * c.group;
    if ob >= p.ocb {
        return NextWeights {
            ptr: std::ptr::null(),
            lines: 0,
            per_call: 0,
            done: 0,
        };
    }
    let tap_floats = s.kh * s.kw * TAP;
    let floats = (p.icb.min(ib0 + p.chunk) - ib0) * tap_floats;
    let calls = rows * (cols.1 - cols.0).div_ceil(tile_width(c.isa, c.group));
    let lines = floats / LINE_FLOATS;
    NextWeights {
        ptr: (p.w.as_ptr() as *const f32).wrapping_add((ob * p.icb + ib0) * tap_floats),
        lines,
        per_call: lines.div_ceil(calls.max(1)),
        done: 0,
    }
}

/// Strides and flags of one micro-kernel call (floats).
#[derive(Clone, Copy)]
struct Tile {
    nicb: usize,
    /// Channels of the last input block of this range (16 unless it ends IC).
    ic_tail: usize,
    nkh: usize,
    /// From one input channel to the next within a block: 1 blocked, H·W plain.
    xs_c: usize,
    xs_icb: usize,
    xs_kh: usize,
    xs_kw: usize,
    xs_px: usize,
    ws_icb: usize,
    ws_kh: usize,
    /// From one output block to the next: in the weights and in y (and z).
    ws_ob: usize,
    ys_ob: usize,
    first: bool,
    last: bool,
    relu: bool,
    /// The bias of the call's output blocks (contiguous).
    bias: *const f32,
    /// The first output block's valid lanes (the AVX2 and portable paths run one block).
    mask: *const u32,
    /// Each output block's valid lanes as a bit mask (AVX-512).
    kmask: [u16; 2],
    /// Weight lines to ask L2 for during the call (per output block, the second
    /// `ws_ob` on), see [`NextWeights`]; AVX-512 only.
    wnext: *const f32,
    wnext_lines: usize,
}

/// Output row `oy` of group `g`'s blocks over input blocks [ib0, ib1), columns
/// [cols.0, cols.1).
#[allow(clippy::too_many_arguments)]
unsafe fn row(
    c: &Ctx,
    n: usize,
    g: usize,
    oy: usize,
    ib0: usize,
    ib1: usize,
    (c0, c1): (usize, usize),
    pf: &mut NextWeights,
) {
    let p = c.p;
    let s = &p.shape;
    let ob = g * c.group;
    let nb = c.group.min(p.ocb - ob);
    let (kh0, kh1, iy0) = s.kh_range(oy);
    let first = ib0 == 0;
    let last = ib1 == p.icb;
    // Floats from one input channel to the next (xs_c) and one column to the next (col).
    let (xs_c, col) = if p.plain_x {
        (s.ih * s.iw, 1)
    } else {
        (1, BLOCK)
    };
    let mask_of = |b: usize| {
        if b + 1 == p.ocb {
            &p.last_mask
        } else {
            &FULL_MASK
        }
    };
    let kmask_of = |b: usize| {
        (mask_of(b).iter().enumerate())
            .filter(|(_, &m)| m != 0)
            .fold(0u16, |k, (i, _)| k | 1 << i)
    };
    let t = Tile {
        nicb: ib1 - ib0,
        ic_tail: if last {
            s.ic - (p.icb - 1) * BLOCK
        } else {
            BLOCK
        },
        nkh: kh1 - kh0,
        xs_c,
        // A block of 16 channels spans ih·iw·16 floats in both layouts.
        xs_icb: s.ih * s.iw * BLOCK,
        xs_kh: s.dilations[0] * s.iw * col,
        xs_kw: s.dilations[1] * col,
        xs_px: s.strides[1] * col,
        ws_icb: s.kh * s.kw * TAP,
        ws_kh: s.kw * TAP,
        ws_ob: p.icb * s.kh * s.kw * TAP,
        ys_ob: s.oh * s.ow * BLOCK,
        first,
        last,
        relu: c.relu,
        bias: p.bias[ob * BLOCK..].as_ptr(),
        mask: mask_of(ob).as_ptr(),
        kmask: [kmask_of(ob), kmask_of(ob + nb - 1)],
        wnext: std::ptr::null(),
        wnext_lines: 0,
    };
    let xrow = if p.plain_x {
        c.x.wrapping_add(((n * s.ic + ib0 * BLOCK) * s.ih + iy0) * s.iw)
    } else {
        c.x.wrapping_add(((n * p.icb + ib0) * s.ih + iy0) * s.iw * BLOCK)
    };
    let wrow =
        (p.w.as_ptr() as *const f32).wrapping_add(((ob * p.icb + ib0) * s.kh + kh0) * s.kw * TAP);
    let yoff = ((n * p.ocb + ob) * s.oh + oy) * s.ow * BLOCK;
    let yrow = c.y.wrapping_add(yoff);
    // The residual joins at the first chunk: each tile reads its residual pixels before
    // it first stores them, so y may be z's buffer (the planner's in-place residual).
    let zrow = if c.z.is_null() || !first {
        std::ptr::null()
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
    // Border pixels alone, with their own valid kernel columns.
    let border = |ox: usize| {
        let (kw0, kw1, ix0) = s.kw_range(ox);
        let (xp, wp, yp) = (
            xrow.wrapping_add(ix0 * col),
            wrow.wrapping_add(kw0 * TAP),
            yrow.wrapping_add(ox * BLOCK),
        );
        // SAFETY: taps kw0..kw1 of border pixel ox read inside the input row; its y
        // (and z) pixel is in this task's span.
        unsafe { tile(c.isa, nb, 1, &t, kw1 - kw0, xp, wp, yp, zpx(ox)) }
    };
    let (lo, hi) = s.interior_cols();
    let (lo, hi) = (lo.clamp(c0, c1), hi.clamp(c0, c1));
    (c0..lo).for_each(border);
    let width = tile_width(c.isa, nb);
    let mut ox = lo;
    while ox < hi {
        let r = width.min(hi - ox);
        let ix0 = ox * s.strides[1] - s.pad_left;
        let take = pf.per_call.min(pf.lines - pf.done);
        let ti = Tile {
            wnext: pf.ptr.wrapping_add(pf.done * LINE_FLOATS),
            wnext_lines: take,
            ..t
        };
        pf.done += take;
        let (xp, yp) = (xrow.wrapping_add(ix0 * col), yrow.wrapping_add(ox * BLOCK));
        // SAFETY: the r interior pixels from ox read all kernel columns inside the input
        // row; ox + r <= hi keeps their outputs in this task's span.
        unsafe { tile(c.isa, nb, r, &ti, s.kw, xp, wrow, yp, zpx(ox)) };
        ox += r;
    }
    (hi..c1).for_each(border);
    if last && c.act != Act::None {
        for b in 0..nb {
            let span = yrow.wrapping_add(b * t.ys_ob + c0 * BLOCK);
            // SAFETY: this task owns the span, which holds (c1-c0)·16 finished floats.
            c.act
                .apply(unsafe { std::slice::from_raw_parts_mut(span, (c1 - c0) * BLOCK) });
        }
    }
}

/// Runs the micro-kernel for `r` pixels × `nb` output blocks (2 only on AVX-512).
///
/// # Safety
/// `t` is built by [`row`] for these blocks; `x` addresses the first of the `r` pixels'
/// taps (`t.nicb` input blocks × `t.nkh` kernel rows × `nkw` columns by the strides of
/// `t`, all inside x, their channels past `t.ic_tail` in the last block unread); `w`
/// those taps' packed weights of `nb` output blocks `t.ws_ob` apart; `y` the `r` pixels'
/// 16 floats in each of the `nb` output blocks (`t.ys_ob` apart), owned by this call;
/// `z` null or laid out as `y`; `t.bias` nb·16 floats and `t.mask` 16 lanes.
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    isa: Isa,
    nb: usize,
    r: usize,
    t: &Tile,
    nkw: usize,
    x: *const f32,
    w: *const f32,
    y: *mut f32,
    z: *const f32,
) {
    // A channel stride of 1 (blocked x) is a constant in its own instances, so the
    // blocked path pays nothing for the plain one.
    let strided = t.xs_c != 1;
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 {
        // The pixel stride of a blocked x at stride 1 or 2 is a constant in its own
        // instances: the broadcasts then load at fixed offsets from one register, where
        // a run-time stride cost an address computation each (with the L1 prefetch
        // below, a 1×1 layer at 14² ran 7 % slower without it).
        macro_rules! go512 {
            ($nb:literal: $($n:literal)*) => {
                match (r, strided, t.xs_px) {
                    $(($n, false, BLOCK) => {
                        // SAFETY: `isa` >= Avx512 is capped by `isa::detected()`, so the
                        // CPU has AVX-512F; PX = BLOCK is `t.xs_px` (matched).
                        return unsafe { tile_avx512::<$nb, $n, false, BLOCK>(t, nkw, x, w, y, z) };
                    }
                    ($n, false, PX2) => {
                        // SAFETY: the CPU has AVX-512F (`isa` is capped by the detected
                        // set); PX = PX2 is `t.xs_px` (matched).
                        return unsafe { tile_avx512::<$nb, $n, false, PX2>(t, nkw, x, w, y, z) };
                    }
                    ($n, false, _) => {
                        // SAFETY: AVX-512F is present (the detected cap on `isa`); PX 0
                        // makes the kernel read `t.xs_px` itself.
                        return unsafe { tile_avx512::<$nb, $n, false, 0>(t, nkw, x, w, y, z) };
                    }
                    ($n, true, _) => {
                        // SAFETY: on this `isa` the CPU has AVX-512F; a plain x runs with
                        // PX 0 and its channels `t.xs_c` apart.
                        return unsafe { tile_avx512::<$nb, $n, true, 0>(t, nkw, x, w, y, z) };
                    })*
                    _ => {
                        for i in 0..r {
                            // SAFETY: pixel i < r alone: its taps, output and residual
                            // are those this call was given for it.
                            unsafe {
                                tile(isa, nb, 1, t, nkw, x.wrapping_add(i * t.xs_px), w,
                                    y.wrapping_add(i * BLOCK),
                                    if z.is_null() { z } else { z.wrapping_add(i * BLOCK) })
                            }
                        }
                        return;
                    }
                }
            };
        }
        if nb == 2 {
            go512!(2: 1 2 3 4 5 6 7 8 9 10 11 12);
        } else {
            go512!(1: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24);
        }
    }
    macro_rules! go {
        ($($n:literal)*) => {
            match (r, strided) {
                $(($n, false) => {
                    #[cfg(target_arch = "x86_64")]
                    if isa >= Isa::Avx2 {
                        // SAFETY: `isa` >= Avx2 is capped by the CPU's, which then has AVX2
                        // and FMA; the call's pointers as this fn's, with R = r.
                        return unsafe { tile_avx2::<$n, false>(t, nkw, x, w, y, z) };
                    }
                    // SAFETY: the portable kernel needs this fn's pointers for R = r only.
                    unsafe { tile_portable::<$n, false>(t, nkw, x, w, y, z) }
                }
                ($n, true) => {
                    #[cfg(target_arch = "x86_64")]
                    if isa >= Isa::Avx2 {
                        // SAFETY: AVX2+FMA present (`isa` >= Avx2, capped by the CPU's); a
                        // plain x's channels lie `t.xs_c` apart, as STRIDED reads them.
                        return unsafe { tile_avx2::<$n, true>(t, nkw, x, w, y, z) };
                    }
                    // SAFETY: this fn's pointers for R = r, a plain x read STRIDED.
                    unsafe { tile_portable::<$n, true>(t, nkw, x, w, y, z) }
                })*
                _ => {
                    for i in 0..r {
                        // SAFETY: pixel i < r of this call, run alone with its own part
                        // of x, y and z.
                        unsafe {
                            tile(isa, nb, 1, t, nkw, x.wrapping_add(i * t.xs_px), w,
                                y.wrapping_add(i * BLOCK),
                                if z.is_null() { z } else { z.wrapping_add(i * BLOCK) })
                        }
                    }
                }
            }
        };
    }
    // Two output blocks per call only on AVX-512 (see `oc_group`).
    debug_assert_eq!(nb, 1);
    go!(1 2 3 4 5 6)
}

/// The micro-kernel in plain Rust (the compiler vectorizes the 16 output lanes).
/// `STRIDED`: input channels `t.xs_c` floats apart (plain x), else adjacent.
///
/// # Safety
/// As [`tile`] with `r` = R and one output block.
unsafe fn tile_portable<const R: usize, const STRIDED: bool>(
    t: &Tile,
    nkw: usize,
    x: *const f32,
    w: *const f32,
    y: *mut f32,
    z: *const f32,
) {
    let mut acc = [[0.0f32; BLOCK]; R];
    let xc = if STRIDED { t.xs_c } else { 1 };
    for (r, a) in acc.iter_mut().enumerate() {
        // A first chunk starts from the bias, a later one from the partial sums.
        let src = if t.first {
            t.bias
        } else {
            // SAFETY: pixel r < R's 16 floats of `y` start at r·16, the call's own.
            unsafe { y.add(r * BLOCK) }
        };
        // SAFETY: `src` starts 16 readable floats (`t.bias` is the block's 16 bias
        // values) that no one writes meanwhile.
        a.copy_from_slice(unsafe { std::slice::from_raw_parts(src, BLOCK) });
    }
    for ib in 0..t.nicb {
        // Only the channels of a partial last block: its pad lanes may hold anything.
        let nc = if ib + 1 == t.nicb { t.ic_tail } else { BLOCK };
        for kh in 0..t.nkh {
            // SAFETY: input block ib < t.nicb at kernel row kh < t.nkh: a tap row of the
            // call's pixels in x, and its weights, both inside what `tile` is given.
            let xr = unsafe { x.add(ib * t.xs_icb + kh * t.xs_kh) };
            // SAFETY: the packed weights of that block and kernel row (ws_icb, ws_kh).
            let wr = unsafe { w.add(ib * t.ws_icb + kh * t.ws_kh) };
            for kw in 0..nkw {
                // SAFETY: kernel column kw < nkw of the row in x, valid for every pixel.
                let xp = unsafe { xr.add(kw * t.xs_kw) };
                // SAFETY: tap kw's 16 ic × 16 oc weights, TAP floats from kw·TAP.
                let wp = unsafe { std::slice::from_raw_parts(wr.add(kw * TAP), TAP) };
                for (r, a) in acc.iter_mut().enumerate() {
                    // SAFETY: output pixel r < R reads the tap `t.xs_px` floats on.
                    let xr = unsafe { xp.add(r * t.xs_px) };
                    for ci in 0..nc {
                        // SAFETY: channel ci < nc of the block, xc floats a channel
                        // (1 blocked, H·W plain), a real channel of x.
                        let xv = unsafe { *xr.add(ci * xc) };
                        let wv = &wp[ci * BLOCK..ci * BLOCK + BLOCK];
                        for (o, av) in a.iter_mut().enumerate() {
                            *av += xv * wv[o];
                        }
                    }
                }
            }
        }
    }
    // z is given only with the first chunk (see `row`).
    if !z.is_null() {
        // SAFETY: `t.mask` points at a 16-lane mask array of the PackedConv.
        let mask = unsafe { std::slice::from_raw_parts(t.mask, BLOCK) };
        for (r, a) in acc.iter_mut().enumerate() {
            // SAFETY: z is not null, so it holds the residual of pixel r < R at r·16,
            // read before this call stores to y (which may be the same buffer).
            let zs = unsafe { std::slice::from_raw_parts(z.add(r * BLOCK), BLOCK) };
            for o in 0..BLOCK {
                if mask[o] != 0 {
                    a[o] += zs[o];
                }
            }
        }
    }
    if t.last && t.relu {
        for a in acc.iter_mut() {
            a.iter_mut().for_each(|v| *v = math::relu(*v));
        }
    }
    for (r, a) in acc.iter().enumerate() {
        // SAFETY: output pixel r < R owns the 16 floats of `y` at r·16; no slice of z is
        // alive any more.
        let out = unsafe { std::slice::from_raw_parts_mut(y.add(r * BLOCK), BLOCK) };
        out.copy_from_slice(a);
    }
}

/// Asks L1 for the `r` pixels' lines of the next input block at the tap `xp` (blocked
/// x: one line a pixel), so its first broadcasts do not wait on L2. Without it the
/// twelve broadcasts of each block's first channel missed L1 together (the
/// hardware prefetchers do not follow twelve lines 12 KiB from the last): 1×1
/// convolutions ran 3–10 % slower. Past the last block it touches nothing it needs.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_next_block(xp: *const f32, xs_icb: usize, xs_px: usize, r: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    for i in 0..r {
        let line = xp.wrapping_add(xs_icb + i * xs_px);
        // SAFETY: a prefetch does not fault, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(line as *const i8) };
    }
}

/// The AVX2+FMA micro-kernel: 2·R accumulators; `STRIDED` as in [`tile_portable`].
/// Unaligned loads and stores throughout.
///
/// # Safety
/// The CPU has AVX2 and FMA; the pointers as [`tile`] with `r` = R and one block.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2<const R: usize, const STRIDED: bool>(
    t: &Tile,
    nkw: usize,
    x: *const f32,
    w: *const f32,
    y: *mut f32,
    z: *const f32,
) {
    use std::arch::x86_64::*;
    let xc = if STRIDED { t.xs_c } else { 1 };
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    if t.first {
        // SAFETY: `t.bias` holds the 16 bias floats of the call's output block.
        let b0 = unsafe { _mm256_loadu_ps(t.bias) };
        // SAFETY: lanes 8..16 of those 16.
        let b1 = unsafe { _mm256_loadu_ps(t.bias.add(8)) };
        for a in acc.iter_mut() {
            *a = [b0, b1];
        }
    } else {
        for (r, a) in acc.iter_mut().enumerate() {
            // SAFETY: a later chunk resumes pixel r < R's 16 partial sums at y + r·16.
            *a = unsafe {
                [
                    _mm256_loadu_ps(y.add(r * BLOCK)),
                    _mm256_loadu_ps(y.add(r * BLOCK + 8)),
                ]
            };
        }
    }
    // Input block ib over its first nc channels.
    macro_rules! block {
        ($ib:expr, $nc:expr) => {
            for kh in 0..t.nkh {
                // SAFETY: block `$ib` < t.nicb at kernel row kh < t.nkh starts a tap row
                // of the call's pixels in x (xs_icb, xs_kh) inside what `tile` is given.
                let xr = unsafe { x.add($ib * t.xs_icb + kh * t.xs_kh) };
                // SAFETY: that block and row's packed weights (ws_icb, ws_kh) in `w`.
                let wr = unsafe { w.add($ib * t.ws_icb + kh * t.ws_kh) };
                for kw in 0..nkw {
                    // SAFETY: column kw < nkw of that row is a valid tap of every pixel.
                    let xp = unsafe { xr.add(kw * t.xs_kw) };
                    // SAFETY: tap kw's 16×16 weights, TAP floats from wr + kw·TAP.
                    let wp = unsafe { wr.add(kw * TAP) };
                    if !STRIDED {
                        prefetch_next_block(xp, t.xs_icb, t.xs_px, R);
                    }
                    for ci in 0..$nc {
                        // SAFETY: input channel ci < 16's row of 16 output weights in
                        // the tap, wp + ci·16 .. + 16.
                        let w0 = unsafe { _mm256_loadu_ps(wp.add(ci * BLOCK)) };
                        // SAFETY: the upper 8 of the same 16 weights.
                        let w1 = unsafe { _mm256_loadu_ps(wp.add(ci * BLOCK + 8)) };
                        for (r, a) in acc.iter_mut().enumerate() {
                            // SAFETY: channel ci < `$nc` (a real one) of pixel r < R at
                            // this tap: xs_px a pixel, xc a channel, inside x.
                            let b = unsafe { _mm256_broadcast_ss(&*xp.add(r * t.xs_px + ci * xc)) };
                            a[0] = _mm256_fmadd_ps(b, w0, a[0]);
                            a[1] = _mm256_fmadd_ps(b, w1, a[1]);
                        }
                    }
                }
            }
        };
    }
    let full = t.nicb - usize::from(t.ic_tail < BLOCK && t.nicb > 0);
    for ib in 0..full {
        block!(ib, BLOCK);
    }
    if full < t.nicb {
        block!(full, t.ic_tail);
    }
    // z is given only with the first chunk (see `row`).
    if !z.is_null() {
        // SAFETY: `t.mask` is a [u32; 16] of the PackedConv: 64 readable bytes.
        let m0 = unsafe { _mm256_loadu_si256(t.mask as *const __m256i) };
        // SAFETY: its lanes 8..16, the second 32 bytes.
        let m1 = unsafe { _mm256_loadu_si256(t.mask.add(8) as *const __m256i) };
        let (m0, m1) = (_mm256_castsi256_ps(m0), _mm256_castsi256_ps(m1));
        for (r, a) in acc.iter_mut().enumerate() {
            // SAFETY: z is not null: pixel r < R's 16 residual floats at z + r·16, read
            // before the stores below (y may be z's buffer).
            let (z0, z1) = unsafe {
                let z0 = _mm256_and_ps(_mm256_loadu_ps(z.add(r * BLOCK)), m0);
                let z1 = _mm256_and_ps(_mm256_loadu_ps(z.add(r * BLOCK + 8)), m1);
                (z0, z1)
            };
            a[0] = _mm256_add_ps(a[0], z0);
            a[1] = _mm256_add_ps(a[1], z1);
        }
    }
    if t.last && t.relu {
        let zero = _mm256_setzero_ps();
        for a in acc.iter_mut() {
            a[0] = _mm256_max_ps(zero, a[0]);
            a[1] = _mm256_max_ps(zero, a[1]);
        }
    }
    for (r, a) in acc.iter().enumerate() {
        // SAFETY: this call owns output pixel r < R's 16 floats at y + r·16.
        unsafe {
            _mm256_storeu_ps(y.add(r * BLOCK), a[0]);
            _mm256_storeu_ps(y.add(r * BLOCK + 8), a[1]);
        }
    }
}

/// The AVX-512F micro-kernel: R pixels × NB (1 or 2) output blocks, one zmm accumulator
/// each; per input channel NB weight loads and R broadcasts (folded into the FMAs as
/// `{1to16}` memory operands) feed R·NB FMAs. `STRIDED` as in [`tile_portable`].
/// Unaligned loads and stores throughout; the residual's masked loads never touch its
/// pad lanes.
///
/// # Safety
/// The CPU has AVX-512F; the pointers as [`tile`] with `r` = R and `nb` = NB; PX is 0 or
/// `t.xs_px`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn tile_avx512<const NB: usize, const R: usize, const STRIDED: bool, const PX: usize>(
    t: &Tile,
    nkw: usize,
    x: *const f32,
    w: *const f32,
    y: *mut f32,
    z: *const f32,
) {
    use std::arch::x86_64::*;
    let xc = if STRIDED { t.xs_c } else { 1 };
    let px = if PX != 0 { PX } else { t.xs_px };
    let mut acc = [[_mm512_setzero_ps(); NB]; R];
    if t.first {
        let mut b = [_mm512_setzero_ps(); NB];
        for (j, v) in b.iter_mut().enumerate() {
            // SAFETY: `t.bias` holds NB·16 floats (the bias from block ob on); j < NB.
            *v = unsafe { _mm512_loadu_ps(t.bias.add(j * BLOCK)) };
        }
        acc.iter_mut().for_each(|a| *a = b);
    } else {
        for (r, a) in acc.iter_mut().enumerate() {
            for (j, v) in a.iter_mut().enumerate() {
                // SAFETY: a later chunk resumes pixel r < R of output block j < NB: 16
                // floats of y at j·ys_ob + r·16.
                *v = unsafe { _mm512_loadu_ps(y.add(j * t.ys_ob + r * BLOCK)) };
            }
        }
    }
    // A single pixel (a border pixel, or a row's last) would leave each FMA waiting
    // on the one before it, into the same NB accumulators: its channels rotate
    // through CHAINS sets instead, summed at the end.
    let mut chains = [[_mm512_setzero_ps(); NB]; CHAINS - 1];
    // The call's share of the next chunk's weights, spread over its taps.
    let (mut wnext, mut wleft) = (t.wnext, t.wnext_lines);
    let per_tap = wleft.div_ceil((t.nicb * t.nkh * nkw).max(1));
    // Input block ib over its first nc channels.
    macro_rules! block {
        ($ib:expr, $nc:expr) => {
            for kh in 0..t.nkh {
                // SAFETY: block `$ib` < t.nicb, kernel row kh < t.nkh: the first tap of
                // the call's pixels in that x row, inside what `tile` is given.
                let xr = unsafe { x.add($ib * t.xs_icb + kh * t.xs_kh) };
                // SAFETY: the first output block's weights of that input block and row.
                let wr = unsafe { w.add($ib * t.ws_icb + kh * t.ws_kh) };
                for kw in 0..nkw {
                    // SAFETY: column kw < nkw of the row, a valid tap of all R pixels.
                    let xp = unsafe { xr.add(kw * t.xs_kw) };
                    // SAFETY: that tap's weights of block 0, TAP floats at wr + kw·TAP.
                    let wp = unsafe { wr.add(kw * TAP) };
                    if !STRIDED {
                        prefetch_next_block(xp, t.xs_icb, px, R);
                    }
                    for _ in 0..per_tap.min(wleft) {
                        _mm_prefetch::<_MM_HINT_T1>(wnext as *const i8);
                        if NB == 2 {
                            _mm_prefetch::<_MM_HINT_T1>(wnext.wrapping_add(t.ws_ob) as *const i8);
                        }
                        wnext = wnext.wrapping_add(LINE_FLOATS);
                        wleft -= 1;
                    }
                    let mut ci = 0;
                    // One pixel: four chains of accumulators, channel by channel.
                    while R == 1 && ci + CHAINS <= $nc {
                        for k in 0..CHAINS {
                            let c = ci + k;
                            // SAFETY: channel c < `$nc` (the loop bound) of the one pixel
                            // at this tap, xc floats a channel.
                            let b = _mm512_set1_ps(unsafe { *xp.add(c * xc) });
                            let a = if k == 0 {
                                &mut acc[0]
                            } else {
                                &mut chains[k - 1]
                            };
                            for (j, v) in a.iter_mut().enumerate() {
                                let at = j * t.ws_ob + c * BLOCK;
                                // SAFETY: output block j < NB's 16 weights of input
                                // channel c, ws_ob a block apart.
                                let wj = unsafe { _mm512_loadu_ps(wp.add(at)) };
                                *v = _mm512_fmadd_ps(b, wj, *v);
                            }
                        }
                        ci += CHAINS;
                    }
                    for ci in ci..$nc {
                        let mut wv = [_mm512_setzero_ps(); NB];
                        for (j, v) in wv.iter_mut().enumerate() {
                            // SAFETY: channel ci < 16's weights of output block j < NB.
                            *v = unsafe { _mm512_loadu_ps(wp.add(j * t.ws_ob + ci * BLOCK)) };
                        }
                        for (r, a) in acc.iter_mut().enumerate() {
                            // SAFETY: channel ci < `$nc` of pixel r < R, px floats a pixel.
                            let b = _mm512_set1_ps(unsafe { *xp.add(r * px + ci * xc) });
                            for (v, wj) in a.iter_mut().zip(&wv) {
                                *v = _mm512_fmadd_ps(b, *wj, *v);
                            }
                        }
                    }
                }
            }
        };
    }
    let full = t.nicb - usize::from(t.ic_tail < BLOCK && t.nicb > 0);
    for ib in 0..full {
        block!(ib, BLOCK);
    }
    if full < t.nicb {
        block!(full, t.ic_tail);
    }
    if R == 1 {
        for chain in &chains {
            for (v, c) in acc[0].iter_mut().zip(chain) {
                *v = _mm512_add_ps(*v, *c);
            }
        }
    }
    // z is given only with the first chunk (see `row`).
    if !z.is_null() {
        for (r, a) in acc.iter_mut().enumerate() {
            for (j, v) in a.iter_mut().enumerate() {
                let at = j * t.ys_ob + r * BLOCK;
                // SAFETY: z is not null: the valid lanes (`t.kmask[j]`) of pixel r < R in
                // block j < NB, read before the stores below (y may be z's buffer).
                let zv = unsafe { _mm512_maskz_loadu_ps(t.kmask[j], z.add(at)) };
                *v = _mm512_add_ps(*v, zv);
            }
        }
    }
    if t.last && t.relu {
        let zero = _mm512_setzero_ps();
        for a in acc.iter_mut() {
            a.iter_mut().for_each(|v| *v = _mm512_max_ps(zero, *v));
        }
    }
    for (r, a) in acc.iter().enumerate() {
        for (j, v) in a.iter().enumerate() {
            // SAFETY: the call owns pixel r < R of output block j < NB, 16 floats of y.
            unsafe { _mm512_storeu_ps(y.add(j * t.ys_ob + r * BLOCK), *v) };
        }
    }
}
