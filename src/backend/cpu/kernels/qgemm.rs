//! The integer GEMM of the quantized ops: 8-bit activations (A, m × k) times 8-bit
//! weights (B, k × n) minus their zero points, exact in i32.
//!
//! B is packed (once at lowering when constant) into panels of [`NR`] columns, each
//! group of four consecutive K values of a column one 32-bit lane, as `vpdpbusd`
//! multiplies them, and stored signed: b' = b − sb (sb = 128 for u8, 0 for i8). A's rows
//! are unsigned: a' = a + sa (sa = 128 for i8, 0 for u8), K padded with zeros to a
//! multiple of four. With α = za + sa per row and β = zb − sb per column,
//!
//! Σ(a − za)(b − zb) = Σa'b' − β·(Σa' − K·α) − α·Σb',
//!
//! so the micro-kernel computes only Σa'b' (unsigned × signed, what VNNI multiplies),
//! and the epilogue subtracts the per-row (Σa' − K·α, α) and per-column (β, Σb') terms.
//! All i32 arithmetic wraps, as the interpreter's i64 sums wrapped to i32 do, so the
//! results are bit-exact. Paths: AVX512-VNNI, and one portable body (compiled for AVX2
//! and AVX-512 too) for hosts without it. A block of rows shares each B panel while it
//! is in L1; a tile is [`MR`] rows at most, fewer for the last (one for a GEMV).
//! With a [`Dequant`] the tile's epilogue goes on to floats — a per-row i32 bias, the
//! conversion, a scale, a residual and an activation — as a dequantized layer needs,
//! while the tile is still in L1.
use std::ops::Range;

use super::activation::Act;
use super::par::{for_ranges, SyncPtr};
use super::quant::Bytes;
use crate::aligned::AlignedBuf;
use crate::backend::cpu::host;
use crate::backend::cpu::isa::{self, Isa};
use crate::backend::cpu::pool::Pool;

/// Columns per packed panel: two AVX-512 vectors of i32.
pub(crate) const NR: usize = 32;
/// Rows per micro-tile at most.
pub(crate) const MR: usize = 8;

/// A micro-tile's raw products Σa'b'.
type Dot = [[i32; NR]; MR];

/// K rounded up to the 4-value groups a lane holds.
pub(crate) fn padded_k(k: usize) -> usize {
    k.next_multiple_of(4)
}

/// The code path of the integer GEMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    Portable,
    Avx2,
    Avx512,
    /// AVX-512 with VNNI: `vpdpbusd`.
    Vnni,
}

fn has_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

fn path_for(isa: Isa) -> Path {
    match isa {
        Isa::Avx512 if has_vnni() => Path::Vnni,
        Isa::Avx512 => Path::Avx512,
        Isa::Avx2 => Path::Avx2,
        Isa::Portable => Path::Portable,
    }
}

/// The path [`isa::isa`] allows.
pub(crate) fn path() -> Path {
    path_for(isa::isa())
}

/// Every path this host can run (for the tests).
#[cfg(test)]
pub(crate) fn paths() -> Vec<Path> {
    let mut out = vec![Path::Portable];
    let best = isa::detected();
    if best >= Isa::Avx2 {
        out.push(Path::Avx2);
    }
    if best >= Isa::Avx512 {
        out.push(Path::Avx512);
        if has_vnni() {
            out.push(Path::Vnni);
        }
    }
    out
}

/// An A prepared once (a constant): rows of a' and their terms.
pub(crate) struct PreparedA {
    data: Vec<u8>,
    terms: Vec<i32>,
    k: usize,
}

impl PreparedA {
    /// `m` rows of `k` bytes of type `kind`, row i's zero point `zero_point(i)`.
    pub(crate) fn new(
        src: &[u8],
        kind: Bytes,
        m: usize,
        k: usize,
        zero_point: &(dyn Fn(usize) -> i32 + Sync),
    ) -> Result<PreparedA, String> {
        if src.len() != m * k {
            return Err(format!("{} bytes are not {m}×{k}", src.len()));
        }
        let mut data = vec![0u8; m * padded_k(k)];
        let mut terms = vec![0i32; 2 * m];
        let (from, to, t) = (src.as_ptr(), data.as_mut_ptr(), terms.as_mut_ptr());
        // SAFETY: `src` holds m rows of k bytes (checked above), `data` m·padded_k(k)
        // bytes and `terms` 2m i32, what prepare_a reads and writes.
        unsafe { prepare_a(from, kind, m, k, k, zero_point, to, t, None) };
        Ok(PreparedA { data, terms, k })
    }

    pub(crate) fn view(&self) -> AView {
        AView {
            data: self.data.as_ptr(),
            ld: padded_k(self.k),
            terms: self.terms.as_ptr(),
        }
    }
}

/// Where A is: `m` rows of a' bytes `ld` apart (each padded with zeros to
/// [`padded_k`]), and per row the pair (Σa' − K·α, α) in `terms`.
#[derive(Clone, Copy)]
pub(crate) struct AView {
    pub data: *const u8,
    pub ld: usize,
    pub terms: *const i32,
}

/// A packed B: the panels, then Σb' and β per column (n rounded up to [`NR`]).
#[derive(Clone, Copy)]
pub(crate) struct BView {
    data: *const i8,
    sums: *const i32,
    betas: *const i32,
    k: usize,
    n: usize,
}

// SAFETY: a view is read by the GEMM's tasks; producers that fill one in parallel
// (`panel_mut`) each write their own panels.
unsafe impl Sync for BView {}

/// Byte offsets of a packed B's sums and betas, and its total size.
fn b_layout(k: usize, n: usize) -> (usize, usize, usize) {
    let np = n.next_multiple_of(NR);
    let panels = np * padded_k(k);
    let terms = np * 4;
    (panels, panels + terms, panels + 2 * terms)
}

/// Bytes [`pack_b`] writes.
pub(crate) fn packed_b_bytes(k: usize, n: usize) -> usize {
    b_layout(k, n).2
}

/// Packs the k × n matrix whose element (kk, j) is the byte at `src + kk·rs + j·cs`, of
/// type `kind`, with column j's zero point `zero_point(j)`, into `dst` (4-byte aligned,
/// [`packed_b_bytes`] long).
///
/// # Safety
/// `src` readable at every element's offset; `dst` writable for the packed bytes.
pub(crate) unsafe fn pack_b(
    src: *const u8,
    kind: Bytes,
    k: usize,
    n: usize,
    (rs, cs): (usize, usize),
    zero_point: &dyn Fn(usize) -> i32,
    dst: *mut u8,
) -> BView {
    let (sums_at, betas_at, total) = b_layout(k, n);
    let kp = padded_k(k);
    let (flip, shift) = match kind {
        Bytes::U8 => (0x80u8, 128),
        Bytes::I8 => (0, 0),
    };
    // SAFETY: `dst` is writable for the packed bytes, `total` of them (the contract).
    unsafe { std::ptr::write_bytes(dst, 0, total) };
    // SAFETY: `b_layout` puts the sums and the betas inside those `total` bytes, at
    // 4-byte multiples of the 4-byte-aligned `dst`.
    let (sums, betas) = unsafe { (dst.add(sums_at) as *mut i32, dst.add(betas_at) as *mut i32) };
    for j in 0..n {
        // SAFETY: `j < n`: panel j/32 starts inside the ⌈n/32⌉·32·kp panel bytes.
        let panel = unsafe { dst.add((j / NR) * kp * NR) as *mut i8 };
        let mut sum = 0i32;
        for kk in 0..k {
            // SAFETY: (kk, j) is an element of the k × n source, at kk·rs + j·cs.
            let v = (unsafe { *src.add(kk * rs + j * cs) } ^ flip) as i8;
            // SAFETY: group kk/4 < kp/4 of the panel's column j % 32, byte kk % 4:
            // inside the panel's kp·32 bytes.
            unsafe { *panel.add((kk / 4) * NR * 4 + (j % NR) * 4 + kk % 4) = v };
            sum += v as i32;
        }
        // SAFETY: `j < n <= np`: column j's Σb' and β slots, among np of each.
        unsafe {
            *sums.add(j) = sum;
            *betas.add(j) = zero_point(j).wrapping_sub(shift);
        }
    }
    BView {
        data: dst as *const i8,
        sums,
        betas,
        k,
        n,
    }
}

/// The view of a B packed in `buf` ([`packed_b_bytes`] long, 4-byte aligned), whose
/// panels, sums and betas the caller fills, as [`pack_b`] lays them out.
///
/// # Safety
/// `buf` holds the packed bytes.
pub(crate) unsafe fn b_view(buf: *mut u8, k: usize, n: usize) -> BView {
    let (sums_at, betas_at, _) = b_layout(k, n);
    // SAFETY: the offsets lie inside the buffer (the caller's contract).
    unsafe {
        BView {
            data: buf as *const i8,
            sums: buf.add(sums_at) as *const i32,
            betas: buf.add(betas_at) as *const i32,
            k,
            n,
        }
    }
}

impl BView {
    /// Panel `p`'s bytes, its columns' Σb' and β, to fill (for producers that write
    /// the packed layout directly): group g of column j at byte `g·4·NR + (j % NR)·4`.
    pub(crate) fn panel_mut(&self, p: usize) -> (*mut i8, *mut i32, *mut i32) {
        let kp = padded_k(self.k);
        (
            self.data.wrapping_add(p * kp * NR) as *mut i8,
            self.sums.wrapping_add(p * NR) as *mut i32,
            self.betas.wrapping_add(p * NR) as *mut i32,
        )
    }
}

/// A B packed once (a constant), owning its bytes.
pub(crate) struct PackedB8 {
    buf: AlignedBuf,
    k: usize,
    n: usize,
}

impl PackedB8 {
    /// Packs as [`pack_b`] does.
    ///
    /// # Safety
    /// As [`pack_b`] for `src`.
    pub(crate) unsafe fn new(
        src: *const u8,
        kind: Bytes,
        k: usize,
        n: usize,
        strides: (usize, usize),
        zero_point: &dyn Fn(usize) -> i32,
    ) -> Result<PackedB8, String> {
        let mut buf = AlignedBuf::try_zeroed(packed_b_bytes(k, n)).map_err(|e| e.to_string())?;
        // SAFETY: the caller's contract for src; buf holds the packed bytes.
        unsafe { pack_b(src, kind, k, n, strides, zero_point, buf.as_mut_ptr()) };
        Ok(PackedB8 { buf, k, n })
    }

    pub(crate) fn view(&self) -> BView {
        let (sums_at, betas_at, _) = b_layout(self.k, self.n);
        let p = self.buf.as_ptr();
        // SAFETY: the offsets lie inside the buffer, laid out by `pack_b`.
        unsafe {
            BView {
                data: p as *const i8,
                sums: p.add(sums_at) as *const i32,
                betas: p.add(betas_at) as *const i32,
                k: self.k,
                n: self.n,
            }
        }
    }
}

/// Σa' − K·α and α of one row of `k` a' bytes, into `terms[0..2]`.
///
/// # Safety
/// `row` readable for `k` bytes, `terms` writable for two i32.
#[inline(always)]
pub(crate) unsafe fn row_terms(row: *const u8, k: usize, alpha: i32, terms: *mut i32) {
    // SAFETY: `row` is readable for `k` bytes (the contract), not written meanwhile.
    let row = unsafe { std::slice::from_raw_parts(row, k) };
    let s: i32 = row.iter().map(|&v| v as i32).sum();
    // SAFETY: `terms` is writable for two i32 (the contract): indices 0 and 1.
    unsafe {
        *terms = s.wrapping_sub((k as i32).wrapping_mul(alpha));
        *terms.add(1) = alpha;
    }
}

/// Copies `m` rows of `k` bytes of type `kind` (`lda` apart) into `dst` as a' bytes
/// ([`padded_k`] apart, zero-padded), with each row's terms for zero point
/// `zero_point(i)`.
///
/// # Safety
/// `src` readable for the rows, `dst` writable for m · padded_k bytes, `terms` for 2m i32.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn prepare_a(
    src: *const u8,
    kind: Bytes,
    m: usize,
    k: usize,
    lda: usize,
    zero_point: &(dyn Fn(usize) -> i32 + Sync),
    dst: *mut u8,
    terms: *mut i32,
    pool: Option<&Pool>,
) -> AView {
    let kp = padded_k(k);
    let (flip, shift) = match kind {
        Bytes::U8 => (0u8, 0),
        Bytes::I8 => (0x80u8, 128),
    };
    let (s, d, t) = (SyncPtr(src as *mut u8), SyncPtr(dst), SyncPtr(terms));
    for_ranges(pool, m, kp, &|rows| {
        for i in rows {
            // SAFETY: `i < m`: row i of `src` (k bytes at i·lda) and of `dst` (kp bytes
            // at i·kp) lie in them by the contract; `for_ranges` gives each task its
            // own rows, so no other task touches this `dst` row.
            let (from, to) = unsafe {
                let from = std::slice::from_raw_parts(s.get().add(i * lda), k);
                (
                    from,
                    std::slice::from_raw_parts_mut(d.get().add(i * kp), kp),
                )
            };
            for (o, &v) in to.iter_mut().zip(from) {
                *o = v ^ flip;
            }
            to[k..].fill(0);
            let alpha = zero_point(i).wrapping_add(shift);
            // SAFETY: `to` holds k bytes and more; row i's two terms, 2·i < 2m, are
            // this task's alone.
            unsafe { row_terms(to.as_ptr(), k, alpha, t.get().add(2 * i)) };
        }
    });
    AView {
        data: dst,
        ld: kp,
        terms,
    }
}

/// C = (A − za)(B − zb) for `m` rows, C[i][j] written at `c + i·rs + j·cs`, on the path
/// the ISA allows.
///
/// # Safety
/// `a` holds m rows as [`AView`] says, `b` was packed by [`pack_b`] and is alive, `c`
/// writable at every element's offset.
pub(crate) unsafe fn qgemm(
    pool: Option<&Pool>,
    m: usize,
    a: &AView,
    b: &BView,
    c: *mut i32,
    strides: (usize, usize),
) {
    // SAFETY: the contract is `qgemm_on`'s, and `path()` is one this host has.
    unsafe { qgemm_on(path(), pool, m, a, b, c, strides) }
}

/// What follows the integer product when the caller wants floats (a dequantized
/// layer): row i's i32 results plus `bias[i · bias_step]` (wrapping), converted to f32,
/// times `scale`, plus Z (at C's offsets), then the activation — the unfused graph's
/// operations in its order, so the floats are the same bits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dequant {
    /// Null: no bias.
    pub bias: *const i32,
    /// 1: a bias per row; 0: one for all.
    pub bias_step: usize,
    pub scale: f32,
    /// Null: no residual.
    pub z: *const f32,
    pub act: Act,
}

/// The GEMM's work: shared by the tasks.
struct Job {
    m: usize,
    a: AView,
    b: BView,
    /// i32 elements, or f32 ones with `dequant`.
    c: SyncPtr<i32>,
    rs: usize,
    cs: usize,
    /// Rows per block.
    mc: usize,
    panels: usize,
    dequant: Option<Dequant>,
    /// The activation's path.
    isa: Isa,
}

// SAFETY: the views' and the epilogue's pointers are only read, and each task writes
// its own tiles of C.
unsafe impl Sync for Job {}

/// [`qgemm`] on `path` (which must be one the host has).
///
/// # Safety
/// As [`qgemm`]; `path`'s features present.
pub(crate) unsafe fn qgemm_on(
    path: Path,
    pool: Option<&Pool>,
    m: usize,
    a: &AView,
    b: &BView,
    c: *mut i32,
    strides: (usize, usize),
) {
    // SAFETY: `run_job` without a `Dequant` asks just `qgemm_on`'s contract.
    unsafe { run_job(path, pool, m, a, b, c, strides, None) }
}

/// [`qgemm`] followed by [`Dequant`]: C holds f32.
///
/// # Safety
/// As [`qgemm`]; `d.bias` readable for m rows at its step (unless null), `d.z` at every
/// element's offset (unless null; it may be C itself).
pub(crate) unsafe fn qgemm_dequant(
    pool: Option<&Pool>,
    m: usize,
    a: &AView,
    b: &BView,
    c: *mut f32,
    strides: (usize, usize),
    d: Dequant,
) {
    // SAFETY: `qgemm_dequant`'s contract is `qgemm_dequant_on`'s with `path()`, a
    // path this host has.
    unsafe { qgemm_dequant_on(path(), pool, m, a, b, c, strides, d) }
}

/// [`qgemm_dequant`] on `path` (which must be one the host has).
///
/// # Safety
/// As [`qgemm_dequant`]; `path`'s features present.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn qgemm_dequant_on(
    path: Path,
    pool: Option<&Pool>,
    m: usize,
    a: &AView,
    b: &BView,
    c: *mut f32,
    strides: (usize, usize),
    d: Dequant,
) {
    // SAFETY: forwarded contract; f32 and i32 have one size, and finish writes f32.
    unsafe { run_job(path, pool, m, a, b, c as *mut i32, strides, Some(d)) }
}

#[allow(clippy::too_many_arguments)]
unsafe fn run_job(
    path: Path,
    pool: Option<&Pool>,
    m: usize,
    a: &AView,
    b: &BView,
    c: *mut i32,
    (rs, cs): (usize, usize),
    dequant: Option<Dequant>,
) {
    if m == 0 || b.n == 0 {
        return;
    }
    let kp = padded_k(b.k);
    // A block of rows stays in a quarter of L2 while it sweeps the panels.
    let a_block = host::caches().l2 / 4;
    let mc = (a_block / kp.max(1) / MR * MR).max(MR);
    let blocks = m.div_ceil(mc);
    let panels = b.n.div_ceil(NR);
    let job = Job {
        m,
        a: *a,
        b: *b,
        c: SyncPtr(c),
        rs,
        cs,
        mc,
        panels,
        dequant,
        isa: isa::isa(),
    };
    let work = mc.min(m) * kp * NR / 16;
    // The operands lie where the contract says; each task writes its own tiles (a
    // (row block, panel) pair), and `path`'s features are the host's (the contract).
    for_ranges(pool, blocks * panels, work, &|tasks| match path {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as said above; `path` is Vnni only where `has_vnni()` held.
        Path::Vnni => unsafe { tasks_vnni(&job, tasks) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as said above; Avx512 only on a host with AVX-512F/BW.
        Path::Avx512 => unsafe { tasks_avx512(&job, tasks) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as said above; Avx2 only on a host with AVX2+FMA.
        Path::Avx2 => unsafe { tasks_avx2(&job, tasks) },
        // SAFETY: as said above; the portable body needs no CPU feature.
        _ => unsafe { run_tasks(&job, tasks, dot_portable) },
    });
}

/// Tasks are (row block, panel) pairs, blocks outer, so neighbouring tasks share A.
#[inline(always)]
unsafe fn run_tasks(
    job: &Job,
    tasks: Range<usize>,
    dot: impl Fn(usize, usize, *const u8, usize, *const i8, &mut Dot),
) {
    let kp = padded_k(job.b.k);
    let groups = kp / 4;
    let mut tile: Dot = [[0; NR]; MR];
    for t in tasks {
        let (block, panel) = (t / job.panels, t % job.panels);
        let (i_end, j0) = (((block + 1) * job.mc).min(job.m), panel * NR);
        let cols = NR.min(job.b.n - j0);
        // SAFETY: `panel < job.panels`: its kp·32 bytes lie in the packed B.
        let bp = unsafe { job.b.data.add(panel * kp * NR) };
        let mut i0 = block * job.mc;
        while i0 < i_end {
            let rows = MR.min(i_end - i0);
            // SAFETY: `i0 < i_end <= m`: row i0 of A, `ld` bytes apart.
            let ap = unsafe { job.a.data.add(i0 * job.a.ld) };
            dot(rows, groups, ap, job.a.ld, bp, &mut tile);
            // SAFETY: rows i0..i0 + rows (<= m) and columns j0..j0 + cols (<= n) of C,
            // this task's tile, with the operands' terms there.
            unsafe { finish(job, &tile, rows, cols, i0, j0) };
            i0 += rows;
        }
    }
}

/// Subtracts the zero points' terms from a tile's products and stores it.
#[inline(always)]
unsafe fn finish(job: &Job, tile: &Dot, rows: usize, cols: usize, i0: usize, j0: usize) {
    // SAFETY: j0 is a multiple of 32 below n, and the packed B's sums and betas run
    // to n rounded up to 32: 32 of each from j0.
    let (sums, betas) = unsafe {
        let sums = std::slice::from_raw_parts(job.b.sums.add(j0), NR);
        (sums, std::slice::from_raw_parts(job.b.betas.add(j0), NR))
    };
    for (r, dot) in tile.iter().enumerate().take(rows) {
        let i = i0 + r;
        // SAFETY: `i < m`: row i's two terms in A's 2m.
        let (ra, alpha) = unsafe { (*job.a.terms.add(2 * i), *job.a.terms.add(2 * i + 1)) };
        let mut v = [0i32; NR];
        for j in 0..NR {
            v[j] = dot[j]
                .wrapping_sub(betas[j].wrapping_mul(ra))
                .wrapping_sub(alpha.wrapping_mul(sums[j]));
        }
        // SAFETY: element (i, j0) of C, i < m and j0 < n.
        let out = unsafe { job.c.get().add(i * job.rs + j0 * job.cs) };
        if let Some(d) = &job.dequant {
            // SAFETY: row i, columns j0..j0 + cols of C (f32 with a `Dequant`), Z and
            // the bias, as the contract gives.
            unsafe { dequantize(d, job, &v, i, j0, cols, out as *mut f32) };
        } else if job.cs == 1 {
            // SAFETY: row i's `cols` contiguous i32 from `out` lie in C; `v` is local.
            unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), out, cols) };
        } else {
            for (j, &x) in v.iter().enumerate().take(cols) {
                // SAFETY: `j < cols`: element (i, j0 + j) of C, column stride cs.
                unsafe { *out.add(j * job.cs) = x };
            }
        }
    }
}

/// A finished row of a tile through [`Dequant`], stored as f32 at `out`.
///
/// # Safety
/// As [`finish`]: row `i`, columns `j0..j0 + cols` inside C, Z and the bias.
#[inline(always)]
unsafe fn dequantize(
    d: &Dequant,
    job: &Job,
    v: &[i32; NR],
    i: usize,
    j0: usize,
    cols: usize,
    out: *mut f32,
) {
    let bias = if d.bias.is_null() {
        0
    } else {
        // SAFETY: a non-null bias is readable for m rows at its step; row i < m.
        unsafe { *d.bias.add(i * d.bias_step) }
    };
    let mut f = [0f32; NR];
    for j in 0..NR {
        f[j] = v[j].wrapping_add(bias) as f32 * d.scale;
    }
    let f = &mut f[..cols];
    if !d.z.is_null() {
        // SAFETY: a non-null Z is readable at C's offsets: element (i, j0) of it.
        let z = unsafe { d.z.add(i * job.rs + j0 * job.cs) };
        for (j, x) in f.iter_mut().enumerate() {
            // SAFETY: `j < cols`: Z's element (i, j0 + j), read before `out` is written.
            *x += unsafe { *z.add(j * job.cs) };
        }
    }
    d.act.apply_isa(job.isa, f);
    if job.cs == 1 {
        // SAFETY: row i's `cols` contiguous f32 from `out` lie in C; `f` is local.
        unsafe { std::ptr::copy_nonoverlapping(f.as_ptr(), out, cols) };
    } else {
        for (j, &x) in f.iter().enumerate() {
            // SAFETY: `j < cols`: C's element (i, j0 + j) at column stride cs.
            unsafe { *out.add(j * job.cs) = x };
        }
    }
}

/// The portable micro-kernel: `rows` rows of Σa'b' over `groups` groups of four K.
#[inline(always)]
fn dot_portable(rows: usize, groups: usize, a: *const u8, lda: usize, b: *const i8, out: &mut Dot) {
    #[inline(always)]
    fn body<const R: usize>(groups: usize, a: *const u8, lda: usize, b: *const i8, out: &mut Dot) {
        let mut acc = [[0i32; NR]; R];
        for g in 0..groups {
            // SAFETY: group g of the panel and of each row (the tile's contract).
            let bg = unsafe { std::slice::from_raw_parts(b.add(g * NR * 4), NR * 4) };
            for (r, acc) in acc.iter_mut().enumerate() {
                // SAFETY: row r < R of the tile, bytes 4·g..4·g + 4 of its padded row.
                let av = unsafe { std::slice::from_raw_parts(a.add(r * lda + 4 * g), 4) };
                let av: [i32; 4] = std::array::from_fn(|t| av[t] as i32);
                for (j, x) in acc.iter_mut().enumerate() {
                    let bj = &bg[4 * j..4 * j + 4];
                    let s = av[0] * bj[0] as i32
                        + av[1] * bj[1] as i32
                        + av[2] * bj[2] as i32
                        + av[3] * bj[3] as i32;
                    *x = x.wrapping_add(s);
                }
            }
        }
        out[..R].copy_from_slice(&acc);
    }
    match rows {
        1 => body::<1>(groups, a, lda, b, out),
        2 => body::<2>(groups, a, lda, b, out),
        3 => body::<3>(groups, a, lda, b, out),
        4 => body::<4>(groups, a, lda, b, out),
        5 => body::<5>(groups, a, lda, b, out),
        6 => body::<6>(groups, a, lda, b, out),
        7 => body::<7>(groups, a, lda, b, out),
        _ => body::<8>(groups, a, lda, b, out),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tasks_avx2(job: &Job, tasks: Range<usize>) {
    // SAFETY: `run_tasks` asks of `job` and `tasks` just what this function's caller
    // gives; the AVX2 features only shape the code generated for it.
    unsafe { run_tasks(job, tasks, dot_portable) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn tasks_avx512(job: &Job, tasks: Range<usize>) {
    // SAFETY: the caller's `job` and `tasks` meet `run_tasks`'s contract; AVX-512 is
    // only what the portable body is compiled for here.
    unsafe { run_tasks(job, tasks, dot_portable) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tasks_vnni(job: &Job, tasks: Range<usize>) {
    // The closure has this function's VNNI features, under which `dot_vnni` is safe.
    let dot = |rows, groups, a, lda, b, out: &mut Dot| match rows {
        1 => dot_vnni::<1>(groups, a, lda, b, out),
        2 => dot_vnni::<2>(groups, a, lda, b, out),
        3 => dot_vnni::<3>(groups, a, lda, b, out),
        4 => dot_vnni::<4>(groups, a, lda, b, out),
        5 => dot_vnni::<5>(groups, a, lda, b, out),
        6 => dot_vnni::<6>(groups, a, lda, b, out),
        7 => dot_vnni::<7>(groups, a, lda, b, out),
        _ => dot_vnni::<8>(groups, a, lda, b, out),
    };
    // SAFETY: `job` and `tasks` as `run_tasks` asks (this function's contract); the
    // caller checked the VNNI features.
    unsafe { run_tasks(job, tasks, dot) }
}

/// The VNNI micro-kernel: per group of four K, each row's four a' bytes broadcast and
/// `vpdpbusd` against the panel's two vectors. One or two rows alternate two sets of
/// accumulators, so that a GEMV is not bound by one chain's latency.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
fn dot_vnni<const R: usize>(groups: usize, a: *const u8, lda: usize, b: *const i8, out: &mut Dot) {
    use std::arch::x86_64::*;
    let sets = if R <= 2 { 2 } else { 1 };
    let mut acc = [[[_mm512_setzero_si512(); 2]; R]; 2];
    let mut g = 0;
    while g < groups {
        for (s, acc) in acc.iter_mut().enumerate().take(sets) {
            let g = g + s;
            if g >= groups {
                break;
            }
            // SAFETY: `g < groups`: group g's 128 bytes of the panel (its two halves).
            let (b0, b1) = unsafe {
                let bg = b.add(g * NR * 4);
                (
                    _mm512_loadu_si512(bg as *const _),
                    _mm512_loadu_si512(bg.add(64) as *const _),
                )
            };
            for (r, acc) in acc.iter_mut().enumerate() {
                // SAFETY: `r < R` rows of the tile, group g < groups: row r's 4 bytes
                // at 4·g, inside its padded_k bytes.
                let x = unsafe { (a.add(r * lda + 4 * g) as *const i32).read_unaligned() };
                let av = _mm512_set1_epi32(x);
                acc[0] = _mm512_dpbusd_epi32(acc[0], av, b0);
                acc[1] = _mm512_dpbusd_epi32(acc[1], av, b1);
            }
        }
        g += sets;
    }
    for r in 0..R {
        let (lo, hi) = (
            _mm512_add_epi32(acc[0][r][0], acc[1][r][0]),
            _mm512_add_epi32(acc[0][r][1], acc[1][r][1]),
        );
        // SAFETY: a row of the tile holds NR = 32 i32.
        unsafe {
            _mm512_storeu_si512(out[r].as_mut_ptr() as *mut _, lo);
            _mm512_storeu_si512(out[r].as_mut_ptr().add(16) as *mut _, hi);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::pools;
    use super::*;

    /// Deterministic bytes with the extremes mixed in.
    fn bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                match i % 11 {
                    0 => 0,
                    1 => 255,
                    2 => 0x80,
                    3 => 0x7f,
                    _ => (s >> 24) as u8,
                }
            })
            .collect()
    }

    #[derive(Debug, Clone, Copy)]
    enum Zp {
        None,
        All,
        Each,
    }

    #[allow(clippy::too_many_arguments)]
    fn check(m: usize, k: usize, n: usize, ak: Bytes, bk: Bytes, za: Zp, zb: Zp, transposed: bool) {
        let seed = (m * 31 + k * 7 + n) as u64;
        let (a, b) = (bytes(m * k, seed), bytes(k * n, seed + 1));
        let zbytes = bytes(m.max(n), seed + 2);
        let zero = |z: Zp, kind: Bytes, i: usize| -> i32 {
            match z {
                Zp::None => 0,
                Zp::All => kind.value(zbytes[0]),
                Zp::Each => kind.value(zbytes[i]),
            }
        };
        let mut want = vec![0i32; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = 0i64;
                for kk in 0..k {
                    let av = ak.value(a[i * k + kk]) - zero(za, ak, i);
                    let bv = bk.value(b[kk * n + j]) - zero(zb, bk, j);
                    s += av as i64 * bv as i64;
                }
                want[i * n + j] = s as i32;
            }
        }
        // B as given (row-major) or its transpose read through strides.
        let (b_src, strides) = if transposed {
            let mut t = vec![0u8; k * n];
            for kk in 0..k {
                for j in 0..n {
                    t[j * k + kk] = b[kk * n + j];
                }
            }
            (t, (1, k))
        } else {
            (b.clone(), (n, 1))
        };
        // SAFETY: b_src holds the k × n elements the strides name.
        let packed = unsafe {
            PackedB8::new(b_src.as_ptr(), bk, k, n, strides, &|j| zero(zb, bk, j)).unwrap()
        };
        let kp = padded_k(k);
        for pool in pools() {
            for path in paths() {
                let mut a_buf = vec![0u8; m * kp];
                let mut terms = vec![0i32; 2 * m];
                let mut c = vec![0i32; m * n];
                // The dequantizing epilogue's operands and output, in C's layout.
                let bias: Vec<i32> = (0..m).map(|i| i as i32 * 977 - 3000).collect();
                let z: Vec<f32> = (0..m * n).map(|e| (e % 13) as f32 * 0.25 - 1.5).collect();
                let mut f = vec![0f32; m * n];
                let st = if transposed { (1, m) } else { (n, 1) };
                let d = Dequant {
                    bias: bias.as_ptr(),
                    bias_step: 1,
                    scale: 0.0371,
                    z: z.as_ptr(),
                    act: Act::Relu,
                };
                let (pl, b, zp) = (pool.as_ref(), packed.view(), |i| zero(za, ak, i));
                let (ap, tp) = (a_buf.as_mut_ptr(), terms.as_mut_ptr());
                // SAFETY: `a` holds m×k bytes, `a_buf` m·kp and `terms` 2m.
                let av = unsafe { prepare_a(a.as_ptr(), ak, m, k, k, &zp, ap, tp, pl) };
                // SAFETY: `c` and `f` hold m×n elements at the strides `st`, as do `z`
                // (read at C's offsets) and `bias` (m rows); `path` is from `paths()`.
                unsafe {
                    qgemm_on(path, pl, m, &av, &b, c.as_mut_ptr(), st);
                    qgemm_dequant_on(path, pl, m, &av, &b, f.as_mut_ptr(), st, d);
                }
                // The unfused operations, one at a time.
                for i in 0..m {
                    for j in 0..n {
                        let e = i * st.0 + j * st.1;
                        let v = want[i * n + j].wrapping_add(bias[i]) as f32 * 0.0371 + z[e];
                        assert_eq!(f[e].to_bits(), v.max(0.0).to_bits(), "{path:?} ({i}, {j})");
                    }
                }
                if transposed {
                    let mut t = vec![0i32; m * n];
                    for i in 0..m {
                        for j in 0..n {
                            t[i * n + j] = c[j * m + i];
                        }
                    }
                    c = t;
                }
                assert_eq!(
                    c,
                    want,
                    "m={m} k={k} n={n} {ak:?}×{bk:?} za={za:?} zb={zb:?} {path:?} pool={}",
                    pool.is_some()
                );
            }
        }
    }

    #[test]
    fn matches_the_naive_product_on_every_path() {
        let shapes = [
            (1, 1, 1),
            (1, 7, 33),
            (1, 64, 100),
            (2, 5, 17),
            (3, 13, 31),
            (8, 16, 32),
            (9, 30, 65),
            (17, 3, 40),
            (40, 67, 70),
        ];
        for (m, k, n) in shapes {
            for ak in [Bytes::U8, Bytes::I8] {
                for bk in [Bytes::U8, Bytes::I8] {
                    for (za, zb) in [
                        (Zp::None, Zp::None),
                        (Zp::All, Zp::All),
                        (Zp::Each, Zp::Each),
                        (Zp::All, Zp::Each),
                    ] {
                        check(m, k, n, ak, bk, za, zb, false);
                    }
                }
            }
            check(m, k, n, Bytes::U8, Bytes::I8, Zp::All, Zp::Each, true);
        }
    }

    #[test]
    fn extreme_values_saturate_nothing() {
        // Every a' = 255 and b' = −128 (or 127): vpmaddubsw would saturate, vpdpbusd not.
        for (av, bv, bk) in [
            (255u8, 0u8, Bytes::U8),
            (255, 0x80, Bytes::I8),
            (0, 0x7f, Bytes::I8),
        ] {
            let (m, k, n) = (3, 1031, 37);
            let a = vec![av; m * k];
            let b = vec![bv; k * n];
            // SAFETY: the buffers hold what the calls name.
            let packed = unsafe { PackedB8::new(b.as_ptr(), bk, k, n, (n, 1), &|_| 0).unwrap() };
            let want = (k as i64 * av as i64 * bk.value(bv) as i64) as i32;
            for path in paths() {
                let kp = padded_k(k);
                let (mut ab, mut terms, mut c) = (vec![0; m * kp], vec![0; 2 * m], vec![0; m * n]);
                let (ap, tp) = (ab.as_mut_ptr(), terms.as_mut_ptr());
                // SAFETY: `a` holds m×k bytes, `ab` m·kp, `terms` 2m i32, `c` m×n i32
                // row-major; `path` is one `paths()` found on this host.
                unsafe {
                    let view = prepare_a(a.as_ptr(), Bytes::U8, m, k, k, &|_| 0, ap, tp, None);
                    qgemm_on(path, None, m, &view, &packed.view(), c.as_mut_ptr(), (n, 1));
                }
                assert!(c.iter().all(|&v| v == want), "{path:?} {av} {bv}");
            }
        }
    }
}
