//! GEMM with fused epilogues: `C = A·B (+ bias) (+ residual)`, then an activation.
//!
//! Kiln's own packed GEMM, BLIS-style:
//!
//! * loops `jc` over NC-column blocks of B, `pc` over KC-deep slices of K, `ic` over
//!   MC-row blocks of A; B's KC×NC block is packed into 16-column micro-panels (kept in
//!   L3/L2), A's MC×KC block into 6-row micro-panels (kept in L2), and the macro-kernel
//!   runs the micro-kernel over them with each B micro-panel (pair) resident in L1;
//! * packing buffers are 64-byte aligned, thread-local, and grow once (no allocation per
//!   call in steady state); ragged edges are zero-padded in the panels and stored
//!   through a scratch tile, so any m, n, k (k = 0 gives `C = epilogue(0)`) is handled;
//! * the epilogue is fused into the tile store after the last KC slice: bias, residual
//!   and ReLU in registers, other activations on each finished 16-wide row segment;
//! * [`PackedB`] packs a constant B (weights) once, in the layout the loops read;
//! * with a pool, the work is split over N (or over M when N is narrow) into one
//!   balanced, micro-panel-aligned part per thread.
//!
//! Micro-kernels, all over the same packing (so a [`PackedB`] serves every ISA):
//! AVX-512F ([`avx512`], 12×32 tiles from two A and two B micro-panels, 24 zmm
//! accumulators, masked edge stores), AVX2+FMA ([`avx2`], 6×16, 12 ymm accumulators)
//! and portable Rust ([`portable`], 6×16); chosen by [`isa::isa`] (so `KILN_CPU_ISA`
//! caps it) or explicitly with [`gemm_with_isa`] / [`gemm_packed_with_isa`].
//!
//! [`gemm`] uses this kernel rather than OpenBLAS; see its doc comment for the numbers.
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod portable;

use super::blas;
use super::Act;
use crate::backend::cpu::isa::{self, Isa};
use crate::backend::cpu::pool::Pool;
use std::alloc::{alloc, dealloc, handle_alloc_error, Layout};
use std::cell::RefCell;

/// Micro-tile rows (A micro-panel height).
pub const MR: usize = 6;
/// Micro-tile columns (B micro-panel width, two ymm registers).
pub const NR: usize = 16;
/// Depth of a K slice: a 6×KC A panel (6 KiB) plus a KC×16 B panel (16 KiB) fit L1d.
pub const KC: usize = 256;
/// Rows of a packed A block: MC×KC floats = 144 KiB, a good part of the 512 KiB L2.
pub const MC: usize = 144;
/// Columns of a packed B block: KC×NC floats ≈ 4 MiB, resident in L3.
pub const NC: usize = 4080;

/// Multiply-accumulates (m·n·k) below which a pool is not worth waking.
const PAR_MIN_WORK: usize = 1 << 20;

/// A strided f32 matrix: element (i, j) at `ptr + i*rs + j*cs`.
#[derive(Debug, Clone, Copy)]
pub struct Mat {
    pub ptr: *const f32,
    pub rs: usize,
    pub cs: usize,
}

impl Mat {
    /// A row-major matrix with `cols` columns (leading dimension `cols`).
    pub fn rows(ptr: *const f32, cols: usize) -> Mat {
        Mat {
            ptr,
            rs: cols,
            cs: 1,
        }
    }
    /// The transpose view.
    pub fn t(self) -> Mat {
        Mat {
            ptr: self.ptr,
            rs: self.cs,
            cs: self.rs,
        }
    }
}

/// A bias added before the residual and the activation.
#[derive(Debug, Clone, Copy)]
pub enum Bias {
    None,
    /// One value per row of C (`m` values): a convolution's output channels.
    PerRow(*const f32),
    /// One value per column of C (`n` values): a dense layer's outputs.
    PerCol(*const f32),
}

/// What is applied to each element of C after the product, in this order.
#[derive(Debug, Clone, Copy)]
pub struct Epilogue {
    pub bias: Bias,
    /// A matrix shaped like C (row stride given) added after the bias.
    pub residual: Option<(*const f32, usize)>,
    pub act: Act,
}

impl Epilogue {
    pub const NONE: Epilogue = Epilogue {
        bias: Bias::None,
        residual: None,
        act: Act::None,
    };
}

// SAFETY: the pointers are read-only views of buffers the caller keeps alive for the call.
unsafe impl Send for Mat {}
// SAFETY: as for `Send` above.
unsafe impl Sync for Mat {}
// SAFETY: as for `Mat`: the epilogue's pointers are read-only views kept alive for the call.
unsafe impl Send for Epilogue {}
// SAFETY: as for `Send` above.
unsafe impl Sync for Epilogue {}

/// `C[m×n] (row stride ldc) = A[m×k]·B[k×n]`, then `ep`.
///
/// Runs Kiln's packed kernel (AVX-512F, AVX2+FMA or portable, by [`isa::isa`]), not
/// OpenBLAS ([`gemm_openblas`] keeps that path). Measured with `cargo bench --bench
/// gemm -- gemm/` and `-- gemm_mlp_train` (criterion medians, GFLOP/s, one thread
/// unless noted; Intel Xeon VM with AVX-512 and 2 cores, otherwise idle, at bff114d;
/// an earlier run under load measured the FMA peaks at 93.6 (ymm) and 166.9 (zmm)
/// GFLOP/s; OpenBLAS here runs far below its usual speed, probably not recognising
/// the CPU, and is listed only as measured):
///
/// | shape (M×N×K)    | AVX-512 | AVX2 | OpenBLAS | AVX-512, B pre-packed | 2 threads |
/// |------------------|---------|------|----------|-----------------------|-----------|
/// | 1024×1024×1024   | 136.6   | 83.0 | 32.4     |                       |           |
/// | 64×3136×256      | 101.9   | 69.1 | 31.2     |                       |           |
/// | 256×3136×64      | 83.1    | 79.1 | 29.7     |                       |           |
/// | 128×784×512      | 136.5   | 81.9 | 32.5     |                       |           |
/// | 256×196×1024     | 133.3   | 78.0 | 32.2     |                       |           |
/// | 2048×49×512      | 91.9    | 58.1 | 26.5     |                       |           |
/// | 128×768×768      | 133.2   | 77.3 | 32.4     | 150.3                 | 239.2     |
/// | 128×3072×768     | 121.0   | 72.2 | 31.6     | 138.3                 | 232.5     |
/// | 128×768×3072     | 120.8   | 73.8 | 31.7     | 147.0                 | 224.6     |
/// | 64×512×784       | 126.1   | 73.2 | 31.2     | 150.2                 | 215.8     |
///
/// The MLP 784-512-512-10 training step at batch 64 (ᵀ: that operand is transposed, as
/// the matmul step passes it; B packed per call):
///
/// | shape (M×N×K)      | AVX-512 | AVX2 | OpenBLAS | 2 threads |
/// |--------------------|---------|------|----------|-----------|
/// | 64×512×784, Bᵀ     | 118.4   | 72.7 | 29.9     | 190.3     |
/// | 64×512×512, Bᵀ     | 125.5   | 75.3 | 30.8     | 197.0     |
/// | 64×10×512, Bᵀ      | 41.4    | 29.0 | 20.0     | 41.5      |
/// | 64×512×512         | 131.1   | 78.0 | 31.6     | 206.6     |
/// | 64×512×10          | 42.9    | 44.8 | 20.6     | 42.7      |
/// | 512×784×64, Aᵀ     | 134.3   | 80.2 | 29.9     | 231.4     |
/// | 512×512×64, Aᵀ     | 110.0   | 80.1 | 30.0     | 154.2     |
/// | 10×512×64, Aᵀ      | 64.3    | 46.1 | 23.3     | 64.8      |
///
/// AVX-512 over AVX2 (same packing code): 1.4–1.7× on every shape with N ≥ 49 and
/// K ≥ 64 except 256×3136×64 (1.05×); on par for N = 10 or K = 10, where the stores
/// dominate. Two threads give 1.4–1.8× on the large shapes; the small ones stay on one.
///
/// # Safety
/// `a`, `b` must address valid m×k and k×n matrices, `c` an m×n one with row stride
/// `ldc` not overlapping them, and the epilogue's pointers their stated extents.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm(
    pool: Option<&Pool>,
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: Mat,
    c: *mut f32,
    ldc: usize,
    ep: &Epilogue,
) {
    // SAFETY: the caller's contract is this function's.
    unsafe { gemm_with_isa(isa::isa(), pool, m, n, k, a, b, c, ldc, ep) }
}

/// [`gemm`] with the micro-kernel chosen by `isa`, capped by what the CPU has: `Avx512`
/// the AVX-512F kernel, `Avx2` the AVX2+FMA one, `Portable` (or a CPU without AVX2+FMA)
/// the portable one.
///
/// # Safety
/// As for [`gemm`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_with_isa(
    isa: Isa,
    pool: Option<&Pool>,
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: Mat,
    c: *mut f32,
    ldc: usize,
    ep: &Epilogue,
) {
    // SAFETY: the caller's contract is this function's.
    unsafe {
        driver(
            kernel_for(isa),
            pool,
            PAR_MIN_WORK,
            m,
            n,
            k,
            a,
            BSrc::Mat(b),
            c,
            ldc,
            ep,
        )
    }
}

/// The same product through OpenBLAS `cblas_sgemm` (single-threaded), with the epilogue
/// applied row by row afterwards: the baseline the kernel is measured against.
///
/// # Safety
/// As for [`gemm`]; additionally each operand needs one unit-stride axis (`cs == 1` or
/// `rs == 1`), else it falls back to Kiln's kernel.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_openblas(
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: Mat,
    c: *mut f32,
    ldc: usize,
    ep: &Epilogue,
) {
    if m == 0 || n == 0 {
        return;
    }
    let (Some((ta, lda)), Some((tb, ldb))) = (blas_operand(a), blas_operand(b)) else {
        // SAFETY: the caller's contract is gemm's.
        return unsafe { gemm(None, m, n, k, a, b, c, ldc, ep) };
    };
    blas::single_threaded();
    // SAFETY: operands and C are valid (the caller's contract); the leading dimensions
    // describe them as OpenBLAS expects.
    unsafe {
        blas::cblas_sgemm(
            blas::CBLAS_ROW_MAJOR,
            ta,
            tb,
            m as i32,
            n as i32,
            k as i32,
            1.0,
            a.ptr,
            lda as i32,
            b.ptr,
            ldb as i32,
            0.0,
            c,
            ldc as i32,
        );
    }
    for i in 0..m {
        // SAFETY: row i of C has n elements at c + i·ldc.
        unsafe {
            apply_epilogue(
                ep,
                i,
                0,
                std::slice::from_raw_parts_mut(c.add(i * ldc), n),
                ldc,
            )
        };
    }
}

/// Applies `ep` to `row[..]`, the elements (i, j0..j0+len) of C.
///
/// # Safety
/// The epilogue's pointers must cover row i and columns j0..j0+len.
pub unsafe fn apply_epilogue(ep: &Epilogue, i: usize, j0: usize, row: &mut [f32], _ldc: usize) {
    match ep.bias {
        Bias::None => {}
        Bias::PerRow(b) => {
            // SAFETY: the bias has m values (the caller's contract).
            let v = unsafe { *b.add(i) };
            row.iter_mut().for_each(|x| *x += v);
        }
        Bias::PerCol(b) => {
            // SAFETY: the bias covers columns j0..j0+len (the caller's contract).
            let b = unsafe { std::slice::from_raw_parts(b.add(j0), row.len()) };
            row.iter_mut().zip(b).for_each(|(x, v)| *x += v);
        }
    }
    if let Some((r, ldr)) = ep.residual {
        // SAFETY: the residual covers row i, columns j0..j0+len (the caller's contract).
        let r = unsafe { std::slice::from_raw_parts(r.add(i * ldr + j0), row.len()) };
        row.iter_mut().zip(r).for_each(|(x, v)| *x += v);
    }
    ep.act.apply(row);
}

fn blas_operand(m: Mat) -> Option<(i32, usize)> {
    if m.cs == 1 {
        Some((blas::CBLAS_NO_TRANS, m.rs.max(1)))
    } else if m.rs == 1 {
        Some((blas::CBLAS_TRANS, m.cs.max(1)))
    } else {
        None
    }
}

/// A constant B (k×n, e.g. a layer's weights) packed once in the layout the kernel
/// reads: for each KC slice of K, the ⌈n/16⌉ micro-panels of that slice, each kc×16
/// floats (zero-padded past column n), in one 64-byte-aligned buffer it owns.
pub struct PackedB {
    k: usize,
    n: usize,
    panels: usize,
    buf: AlignedBuf,
}

// SAFETY: PackedB owns its buffer and is immutable after construction.
unsafe impl Send for PackedB {}
// SAFETY: as for `Send` above.
unsafe impl Sync for PackedB {}

impl PackedB {
    /// Packs the k×n matrix `b`.
    ///
    /// # Safety
    /// `b` must address a valid k×n matrix.
    pub unsafe fn new(k: usize, n: usize, b: Mat) -> PackedB {
        let panels = n.div_ceil(NR);
        let kern = kernel_for(isa::isa());
        let mut buf = AlignedBuf::new();
        let dst = buf.get(k * panels * NR);
        let mut pc = 0;
        while pc < k {
            let kc = KC.min(k - pc);
            // SAFETY: the slice starts at row pc of a valid k×n matrix; the destination
            // holds k·panels·16 floats, of which this slice fills kc·panels·16 at
            // offset pc·panels·16.
            unsafe {
                pack_b(
                    kern,
                    kc,
                    n,
                    b.ptr.add(pc * b.rs),
                    b.rs,
                    b.cs,
                    dst.add(pc * panels * NR),
                )
            };
            pc += kc;
        }
        PackedB { k, n, panels, buf }
    }

    /// Rows (K) of the packed matrix.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Columns (N) of the packed matrix.
    pub fn n(&self) -> usize {
        self.n
    }
}

/// `C[m×n] = A[m×k]·B`, then `ep`, with B packed beforehand.
///
/// # Safety
/// As for [`gemm`]; `b` must have been packed with the same k and n (checked: a
/// mismatch panics).
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_packed(
    pool: Option<&Pool>,
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: &PackedB,
    c: *mut f32,
    ldc: usize,
    ep: &Epilogue,
) {
    // SAFETY: the caller's contract is this function's.
    unsafe { gemm_packed_with_isa(isa::isa(), pool, m, n, k, a, b, c, ldc, ep) }
}

/// [`gemm_packed`] with the micro-kernel chosen by `isa` (as in [`gemm_with_isa`]).
///
/// # Safety
/// As for [`gemm_packed`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_packed_with_isa(
    isa: Isa,
    pool: Option<&Pool>,
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: &PackedB,
    c: *mut f32,
    ldc: usize,
    ep: &Epilogue,
) {
    assert!(
        b.k == k && b.n == n,
        "gemm_packed: B was packed as {}×{}, called with k={k} n={n}",
        b.k,
        b.n
    );
    let src = BSrc::Packed {
        ptr: b.buf.ptr,
        panels: b.panels,
        p0: 0,
    };
    // SAFETY: the caller's contract is this function's; `src` covers k×n.
    unsafe {
        driver(
            kernel_for(isa),
            pool,
            PAR_MIN_WORK,
            m,
            n,
            k,
            a,
            src,
            c,
            ldc,
            ep,
        )
    }
}

/// Where the macro-kernel's B panels come from.
#[derive(Clone, Copy)]
enum BSrc {
    /// Packed per block into thread-local scratch.
    Mat(Mat),
    /// Pre-packed (see [`PackedB`]): `panels` micro-panels per KC slice; this
    /// (sub)problem's column 0 is panel `p0`.
    Packed {
        ptr: *const f32,
        panels: usize,
        p0: usize,
    },
}

// SAFETY: read-only views of buffers kept alive for the call.
unsafe impl Send for BSrc {}
// SAFETY: as for `Send` above.
unsafe impl Sync for BSrc {}

/// One micro-tile's store: where it goes and what the epilogue adds.
pub(crate) struct Tile {
    /// C at the tile's (0, 0), row stride `ldc`; `mr`×`nr` of it are stored.
    c: *mut f32,
    ldc: usize,
    mr: usize,
    nr: usize,
    /// Add to C (a later KC slice) rather than overwrite it.
    accumulate: bool,
    /// The last KC slice: apply the epilogue.
    last: bool,
    /// Per-row bias at the tile's row 0, or null.
    bias_row: *const f32,
    /// Per-column bias at the tile's column 0, or null.
    bias_col: *const f32,
    /// Residual at the tile's (0, 0) with row stride `ldr`, or null.
    res: *const f32,
    ldr: usize,
    relu: bool,
    /// An activation other than None/ReLU, applied to each stored row segment.
    act: Option<Act>,
}

/// Stores a computed tile `acc` by the rules of `t` (the edge-tile and portable path).
///
/// # Safety
/// `t` must describe a valid `mr`×`nr` tile of C and matching epilogue extents.
pub(crate) unsafe fn store_tile_scalar(acc: &[[f32; NR]; MR], t: &Tile) {
    for (r, acc_row) in acc.iter().enumerate().take(t.mr) {
        // SAFETY: row r < mr of the tile has nr elements (the caller's contract).
        let row = unsafe { std::slice::from_raw_parts_mut(t.c.add(r * t.ldc), t.nr) };
        for (j, (o, &v)) in row.iter_mut().zip(acc_row).enumerate() {
            let mut v = v;
            if t.accumulate {
                v += *o;
            }
            if t.last {
                if !t.bias_row.is_null() {
                    // SAFETY: the per-row bias covers the tile's rows.
                    v += unsafe { *t.bias_row.add(r) };
                }
                if !t.bias_col.is_null() {
                    // SAFETY: the per-column bias covers the tile's columns.
                    v += unsafe { *t.bias_col.add(j) };
                }
                if !t.res.is_null() {
                    // SAFETY: the residual covers the tile.
                    v += unsafe { *t.res.add(r * t.ldr + j) };
                }
                if t.relu {
                    v = super::math::relu(v);
                }
            }
            *o = v;
        }
        if t.last {
            if let Some(act) = t.act {
                act.apply(row);
            }
        }
    }
}

/// An ISA's routines: the micro-kernel (`kc`, packed A micro-panels, packed B
/// micro-panels, the tile of at most `mr`×`nr`), the packer of a full 6-row panel of
/// row-major A (`kc`, A, row stride, destination with 2 floats of slack) and of
/// column-major A (`kc`, A, column stride, destination), and the packers of a full
/// 16-column panel of row-major and of column-major B (`kc`, B, row or column stride,
/// 64-byte-aligned destination).
#[derive(Clone, Copy)]
struct Kernel {
    micro: unsafe fn(usize, *const f32, *const f32, &Tile),
    /// The largest tile `micro` takes: a multiple of MR rows × a multiple of NR columns
    /// (it reads ⌈mr/MR⌉ adjacent A panels and ⌈nr/NR⌉ adjacent B panels).
    mr: usize,
    nr: usize,
    pack_a_rows: unsafe fn(usize, *const f32, usize, *mut f32),
    pack_a_cols: unsafe fn(usize, *const f32, usize, *mut f32),
    pack_b_rows: unsafe fn(usize, *const f32, usize, *mut f32),
    pack_b_cols: unsafe fn(usize, *const f32, usize, *mut f32),
}

/// The routines `isa` asks for, if this CPU can run them.
fn kernel_for(isa: Isa) -> Kernel {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 && isa::detected() >= Isa::Avx2 {
        let simd = Kernel {
            micro: avx2_kernel,
            mr: MR,
            nr: NR,
            pack_a_rows: avx2_pack_a_rows,
            pack_a_cols: avx2_pack_a_cols,
            pack_b_rows: avx2_pack_b_rows,
            pack_b_cols: avx2_pack_b_cols,
        };
        if isa >= Isa::Avx512 && isa::detected() >= Isa::Avx512 {
            return Kernel {
                micro: avx512_kernel,
                mr: avx512::MR2,
                nr: avx512::NR2,
                pack_b_rows: avx512_pack_b_rows,
                pack_b_cols: avx512_pack_b_cols,
                ..simd
            };
        }
        return simd;
    }
    let _ = isa;
    Kernel {
        micro: portable::kernel,
        mr: MR,
        nr: NR,
        pack_a_rows: portable_pack_a_rows,
        pack_a_cols: portable_pack_a_cols,
        pack_b_rows: portable_pack_b_rows,
        pack_b_cols: portable_pack_b_cols,
    }
}

/// # Safety
/// As for [`avx2::pack_a_rows`]; only returned by [`kernel_for`] with AVX2+FMA.
#[cfg(target_arch = "x86_64")]
unsafe fn avx2_pack_a_rows(kc: usize, a: *const f32, rs: usize, dst: *mut f32) {
    // SAFETY: kernel_for checked AVX2+FMA; the rest is the caller's contract.
    unsafe { avx2::pack_a_rows(kc, a, rs, dst) }
}

/// # Safety
/// As for [`avx2::pack_a_cols`]; only returned by [`kernel_for`] with AVX2+FMA.
#[cfg(target_arch = "x86_64")]
unsafe fn avx2_pack_a_cols(kc: usize, a: *const f32, cs: usize, dst: *mut f32) {
    // SAFETY: kernel_for checked AVX2+FMA; the rest is the caller's contract.
    unsafe { avx2::pack_a_cols(kc, a, cs, dst) }
}

/// # Safety
/// As for [`avx2::pack_b_cols`]; only returned by [`kernel_for`] with AVX2+FMA.
#[cfg(target_arch = "x86_64")]
unsafe fn avx2_pack_b_cols(kc: usize, b: *const f32, cs: usize, dst: *mut f32) {
    // SAFETY: kernel_for checked AVX2+FMA; the rest is the caller's contract.
    unsafe { avx2::pack_b_cols(kc, b, cs, dst) }
}

/// # Safety
/// As for [`avx2::pack_b_rows`]; only returned by [`kernel_for`] with AVX2+FMA.
#[cfg(target_arch = "x86_64")]
unsafe fn avx2_pack_b_rows(kc: usize, b: *const f32, rs: usize, dst: *mut f32) {
    // SAFETY: kernel_for checked AVX2+FMA; the rest is the caller's contract.
    unsafe { avx2::pack_b_rows(kc, b, rs, dst) }
}

/// # Safety
/// As for [`avx512::pack_b_rows`]; only returned by [`kernel_for`] with AVX-512F.
#[cfg(target_arch = "x86_64")]
unsafe fn avx512_pack_b_rows(kc: usize, b: *const f32, rs: usize, dst: *mut f32) {
    // SAFETY: kernel_for checked AVX-512F; the rest is the caller's contract.
    unsafe { avx512::pack_b_rows(kc, b, rs, dst) }
}

/// # Safety
/// As for [`avx512::pack_b_cols`]; only returned by [`kernel_for`] with AVX-512F.
#[cfg(target_arch = "x86_64")]
unsafe fn avx512_pack_b_cols(kc: usize, b: *const f32, cs: usize, dst: *mut f32) {
    // SAFETY: kernel_for checked AVX-512F; the rest is the caller's contract.
    unsafe { avx512::pack_b_cols(kc, b, cs, dst) }
}

/// # Safety
/// As for [`avx512::kernel`]; only returned by [`kernel_for`] when the CPU has
/// AVX-512F.
#[cfg(target_arch = "x86_64")]
unsafe fn avx512_kernel(kc: usize, ap: *const f32, bp: *const f32, t: &Tile) {
    // SAFETY: kernel_for checked AVX-512F; the rest is the caller's contract.
    unsafe { avx512::kernel(kc, ap, bp, t) }
}

/// The portable packer of a full 6-row panel of row-major A.
///
/// # Safety
/// `a` addresses 6 rows of `kc` floats (row stride `rs`); `dst` holds `kc·6` floats.
unsafe fn portable_pack_a_rows(kc: usize, a: *const f32, rs: usize, dst: *mut f32) {
    // SAFETY: the destination's extent (the caller's contract).
    let panel = unsafe { std::slice::from_raw_parts_mut(dst, kc * MR) };
    for r in 0..MR {
        // SAFETY: row r has kc contiguous elements.
        let src = unsafe { std::slice::from_raw_parts(a.add(r * rs), kc) };
        for (p, &v) in src.iter().enumerate() {
            panel[p * MR + r] = v;
        }
    }
}

/// The portable packer of a full 6-row panel of column-major A.
///
/// # Safety
/// `a` addresses `kc` columns of 6 floats (column stride `cs`); `dst` holds `kc·6`.
unsafe fn portable_pack_a_cols(kc: usize, a: *const f32, cs: usize, dst: *mut f32) {
    // SAFETY: the destination's extent (the caller's contract).
    let panel = unsafe { std::slice::from_raw_parts_mut(dst, kc * MR) };
    for (p, col) in panel.chunks_exact_mut(MR).enumerate() {
        // SAFETY: column p has 6 contiguous elements.
        col.copy_from_slice(unsafe { std::slice::from_raw_parts(a.add(p * cs), MR) });
    }
}

/// The portable packer of a full 16-column panel of row-major B.
///
/// # Safety
/// `b` addresses `kc` rows of 16 floats (row stride `rs`); `dst` holds `kc·16`.
unsafe fn portable_pack_b_rows(kc: usize, b: *const f32, rs: usize, dst: *mut f32) {
    // SAFETY: the destination's extent (the caller's contract).
    let panel = unsafe { std::slice::from_raw_parts_mut(dst, kc * NR) };
    for (p, row) in panel.chunks_exact_mut(NR).enumerate() {
        // SAFETY: row p has 16 contiguous elements (a fixed-size copy, which compiles to
        // vector moves rather than a memcpy call).
        row.copy_from_slice(unsafe { &*(b.add(p * rs) as *const [f32; NR]) });
    }
}

/// The portable packer of a full 16-column panel of column-major B.
///
/// # Safety
/// `b` addresses 16 columns of `kc` floats (column stride `cs`); `dst` holds `kc·16`.
unsafe fn portable_pack_b_cols(kc: usize, b: *const f32, cs: usize, dst: *mut f32) {
    // SAFETY: the destination's extent (the caller's contract).
    let panel = unsafe { std::slice::from_raw_parts_mut(dst, kc * NR) };
    for j in 0..NR {
        // SAFETY: column j has kc contiguous elements.
        let src = unsafe { std::slice::from_raw_parts(b.add(j * cs), kc) };
        for (p, &v) in src.iter().enumerate() {
            panel[p * NR + j] = v;
        }
    }
}

/// # Safety
/// As for [`avx2::kernel`]; only returned by [`kernel_for`] when the CPU has AVX2+FMA.
#[cfg(target_arch = "x86_64")]
unsafe fn avx2_kernel(kc: usize, ap: *const f32, bp: *const f32, t: &Tile) {
    // SAFETY: kernel_for checked AVX2+FMA; the rest is the caller's contract.
    unsafe { avx2::kernel(kc, ap, bp, t) }
}

/// The epilogue with its pointers at C's (0, 0) and the activation split.
#[derive(Clone, Copy)]
struct Ep {
    bias_row: *const f32,
    bias_col: *const f32,
    res: *const f32,
    ldr: usize,
    relu: bool,
    act: Option<Act>,
}

// SAFETY: read-only views of buffers kept alive for the call.
unsafe impl Send for Ep {}
// SAFETY: as for `Send` above.
unsafe impl Sync for Ep {}

impl Ep {
    fn new(ep: &Epilogue) -> Ep {
        let (bias_row, bias_col) = match ep.bias {
            Bias::None => (std::ptr::null(), std::ptr::null()),
            Bias::PerRow(p) => (p, std::ptr::null()),
            Bias::PerCol(p) => (std::ptr::null(), p),
        };
        let (res, ldr) = ep.residual.unwrap_or((std::ptr::null(), 0));
        let (relu, act) = match ep.act {
            Act::None => (false, None),
            Act::Relu => (true, None),
            a => (false, Some(a)),
        };
        Ep {
            bias_row,
            bias_col,
            res,
            ldr,
            relu,
            act,
        }
    }

    /// This epilogue for the sub-matrix of C starting at (i, j).
    ///
    /// # Safety
    /// (i, j) must lie within C (so the offsets stay within the epilogue's extents).
    unsafe fn at(&self, i: usize, j: usize) -> Ep {
        // SAFETY: the caller's contract; null pointers are left null.
        unsafe {
            Ep {
                bias_row: offset(self.bias_row, i),
                bias_col: offset(self.bias_col, j),
                res: offset(self.res, i * self.ldr + j),
                ..*self
            }
        }
    }
}

/// `p + n`, keeping null as null.
///
/// # Safety
/// A non-null `p + n` must stay within `p`'s allocation.
unsafe fn offset(p: *const f32, n: usize) -> *const f32 {
    if p.is_null() {
        p
    } else {
        // SAFETY: the caller's contract.
        unsafe { p.add(n) }
    }
}

#[derive(Clone, Copy)]
struct SendMut(*mut f32);
// SAFETY: tasks write disjoint sub-matrices of C.
unsafe impl Send for SendMut {}
// SAFETY: as for `Send` above.
unsafe impl Sync for SendMut {}

/// Splits the problem across `pool` (when worth it) and runs each part serially.
///
/// # Safety
/// As for [`gemm`], with `b` covering k×n.
#[allow(clippy::too_many_arguments)]
unsafe fn driver(
    kern: Kernel,
    pool: Option<&Pool>,
    par_min_work: usize,
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: BSrc,
    c: *mut f32,
    ldc: usize,
    ep: &Epilogue,
) {
    if m == 0 || n == 0 {
        return;
    }
    let ep = Ep::new(ep);
    let threads = pool.map_or(1, |p| p.threads());
    let (tm, tn) = split(threads, m, n, k, par_min_work);
    let pool = match pool {
        Some(p) if tm * tn > 1 => p,
        // SAFETY: the caller's contract.
        _ => return unsafe { serial(kern, m, n, k, a, b, c, ldc, &ep) },
    };
    let (mp, np) = (m.div_ceil(MR), n.div_ceil(NR));
    let cm = SendMut(c);
    pool.run(tm * tn, &|t| {
        // Capture the whole (Sync) views, not their raw-pointer fields.
        let (a, b, ep, cm) = (a, b, ep, cm);
        let (ti, tj) = (t / tn, t % tn);
        let (i0, i1) = ((ti * mp / tm * MR).min(m), ((ti + 1) * mp / tm * MR).min(m));
        let (j0, j1) = ((tj * np / tn * NR).min(n), ((tj + 1) * np / tn * NR).min(n));
        if i0 >= i1 || j0 >= j1 {
            return;
        }
        // SAFETY: (i0, j0) lies inside A's rows, B's columns and C; the parts are
        // disjoint, so the writes to C do not overlap; j0 is a multiple of NR, so a
        // pre-packed B's part starts at panel j0/NR.
        unsafe {
            let a = Mat {
                ptr: a.ptr.add(i0 * a.rs),
                ..a
            };
            let b = match b {
                BSrc::Mat(b) => BSrc::Mat(Mat {
                    ptr: b.ptr.add(j0 * b.cs),
                    ..b
                }),
                BSrc::Packed { ptr, panels, p0 } => BSrc::Packed {
                    ptr,
                    panels,
                    p0: p0 + j0 / NR,
                },
            };
            let c = cm.0.add(i0 * ldc + j0);
            serial(kern, i1 - i0, j1 - j0, k, a, b, c, ldc, &ep.at(i0, j0));
        }
    });
}

/// How many parts to cut M and N into for `threads` threads: one balanced,
/// micro-panel-aligned part per thread along the axis that balances better (N on a
/// tie: each part then packs only its own columns of B).
fn split(threads: usize, m: usize, n: usize, k: usize, par_min_work: usize) -> (usize, usize) {
    if threads <= 1 || m.saturating_mul(n).saturating_mul(k.max(1)) < par_min_work {
        return (1, 1);
    }
    let (mp, np) = (m.div_ceil(MR), n.div_ceil(NR));
    let (tm, tn) = (threads.min(mp), threads.min(np));
    // The largest part's element count for each choice (ragged last panels included).
    let cost_n = largest_part(n, NR, tn) * m;
    let cost_m = largest_part(m, MR, tm) * n;
    if cost_n <= cost_m {
        (1, tn)
    } else {
        (tm, 1)
    }
}

/// The widest of `parts` parts of `len` cut at multiples of `unit` as `driver` cuts it.
fn largest_part(len: usize, unit: usize, parts: usize) -> usize {
    let units = len.div_ceil(unit);
    (0..parts)
        .map(|t| ((t + 1) * units / parts * unit).min(len) - (t * units / parts * unit).min(len))
        .max()
        .unwrap_or(len)
}

/// The blocked loops over one (sub)problem on this thread.
///
/// # Safety
/// As for [`gemm`], with `b` covering k×n and `ep` positioned at C's (0, 0).
#[allow(clippy::too_many_arguments)]
unsafe fn serial(
    kern: Kernel,
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: BSrc,
    c: *mut f32,
    ldc: usize,
    ep: &Ep,
) {
    if k == 0 {
        // SAFETY: C and the epilogue cover m×n.
        return unsafe { epilogue_only(m, n, c, ldc, ep) };
    }
    with_scratch(|abuf, bbuf| {
        let mut jc = 0;
        while jc < n {
            let nc = NC.min(n - jc);
            let mut pc = 0;
            while pc < k {
                let kc = KC.min(k - pc);
                if let (true, BSrc::Mat(bm)) = (m <= MC, b) {
                    // One A block: pack it once, then pack each B micro-panel just before
                    // its tiles run, so it goes from memory to L1 and is used there
                    // (instead of a kc×nc block round-tripping through L3).
                    let ap = abuf.get(kc * m.div_ceil(MR) * MR + 8);
                    let dst = bbuf.get(kc * kern.nr);
                    // SAFETY: (0, pc) lies inside A, (pc, jc + jb) inside B; `ap` and
                    // `dst` hold the rounded-up blocks; every tile lies inside C.
                    unsafe {
                        pack_a(kern, m, kc, a.ptr.add(pc * a.cs), a.rs, a.cs, ap);
                        let mut jb = 0;
                        while jb < nc {
                            let w = kern.nr.min(nc - jb);
                            let col = jc + jb;
                            pack_b(
                                kern,
                                kc,
                                w,
                                bm.ptr.add(pc * bm.rs + col * bm.cs),
                                bm.rs,
                                bm.cs,
                                dst,
                            );
                            // The next panel's columns are read while this one's
                            // tiles run (a run-time B comes from L3: the forward GEMMs
                            // of the MLP training step run ~8% faster this way).
                            if jb + w < nc {
                                prefetch_block(
                                    bm.ptr.add(pc * bm.rs + (col + w) * bm.cs),
                                    kc,
                                    kern.nr.min(nc - jb - w),
                                    bm.rs,
                                    bm.cs,
                                );
                            }
                            macro_kernel(
                                kern,
                                m,
                                w,
                                kc,
                                ap,
                                dst,
                                c.add(col),
                                ldc,
                                pc > 0,
                                pc + kc == k,
                                &ep.at(0, col),
                            );
                            jb += w;
                        }
                    }
                    pc += kc;
                    continue;
                }
                // SAFETY: (pc, jc) lies inside B; the scratch holds the kc×nc block
                // rounded up to whole micro-panels; a pre-packed B holds
                // `panels` panels of kc×16 for this slice.
                let bp: *const f32 = unsafe {
                    match b {
                        BSrc::Mat(b) => {
                            let dst = bbuf.get(kc * nc.div_ceil(NR) * NR);
                            let src = b.ptr.add(pc * b.rs + jc * b.cs);
                            pack_b(kern, kc, nc, src, b.rs, b.cs, dst);
                            dst
                        }
                        BSrc::Packed { ptr, panels, p0 } => {
                            ptr.add(pc * panels * NR + (p0 + jc / NR) * kc * NR)
                        }
                    }
                };
                let mut ic = 0;
                while ic < m {
                    let mc = MC.min(m - ic);
                    let ap = abuf.get(kc * mc.div_ceil(MR) * MR + 8);
                    // SAFETY: (ic, pc) lies inside A; `ap` holds the mc×kc block rounded
                    // up to whole micro-panels; every tile lies inside C.
                    unsafe {
                        pack_a(
                            kern,
                            mc,
                            kc,
                            a.ptr.add(ic * a.rs + pc * a.cs),
                            a.rs,
                            a.cs,
                            ap,
                        );
                        let tile_ep = ep.at(ic, jc);
                        macro_kernel(
                            kern,
                            mc,
                            nc,
                            kc,
                            ap,
                            bp,
                            c.add(ic * ldc + jc),
                            ldc,
                            pc > 0,
                            pc + kc == k,
                            &tile_ep,
                        );
                    }
                    ic += mc;
                }
                pc += kc;
            }
            jc += nc;
        }
    });
}

/// Asks for the kc×w block of B at `b` (strides rs, cs) to be brought into L2, one
/// request per cache line of its contiguous runs.
///
/// # Safety
/// `b` addresses a kc×w matrix.
unsafe fn prefetch_block(b: *const f32, kc: usize, w: usize, rs: usize, cs: usize) {
    // SAFETY: callers uphold this unsafe fn's contract: pointers valid for the lengths
    // used, and the CPU features it is compiled for.
    unsafe {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
            let (runs, len, step) = if cs == 1 { (kc, w, rs) } else { (w, kc, cs) };
            for r in 0..runs {
                let row = b.add(r * step);
                let mut e = 0;
                while e < len {
                    _mm_prefetch::<_MM_HINT_T1>(row.add(e) as *const i8);
                    e += 16;
                }
            }
        }
    }
}

/// Runs the micro-kernel over packed mc×kc A and kc×nc B blocks.
///
/// # Safety
/// The panels hold the rounded-up blocks; C and `ep` (positioned at the block's (0, 0))
/// cover mc×nc.
#[allow(clippy::too_many_arguments)]
unsafe fn macro_kernel(
    kern: Kernel,
    mc: usize,
    nc: usize,
    kc: usize,
    ap: *const f32,
    bp: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    last: bool,
    ep: &Ep,
) {
    let mut jr = 0;
    while jr < nc {
        let nr = kern.nr.min(nc - jr);
        // SAFETY: panel jr/NR of the packed B block.
        let bpanel = unsafe { bp.add(jr * kc) };
        let mut ir = 0;
        while ir < mc {
            let mr = kern.mr.min(mc - ir);
            // SAFETY: panels ir/MR.. of the packed A block; the tile (ir, jr) lies in C.
            unsafe {
                let e = ep.at(ir, jr);
                let t = Tile {
                    c: c.add(ir * ldc + jr),
                    ldc,
                    mr,
                    nr,
                    accumulate,
                    last,
                    bias_row: e.bias_row,
                    bias_col: e.bias_col,
                    res: e.res,
                    ldr: e.ldr,
                    relu: e.relu,
                    act: e.act,
                };
                (kern.micro)(kc, ap.add(ir * kc), bpanel, &t);
            }
            ir += kern.mr;
        }
        jr += kern.nr;
    }
}

/// `C = epilogue(0)` (the k = 0 product).
///
/// # Safety
/// C and `ep` cover m×n.
unsafe fn epilogue_only(m: usize, n: usize, c: *mut f32, ldc: usize, ep: &Ep) {
    let zero = [[0f32; NR]; MR];
    let mut i = 0;
    while i < m {
        let mut j = 0;
        while j < n {
            // SAFETY: the tile (i, j) lies inside C.
            unsafe {
                let e = ep.at(i, j);
                let t = Tile {
                    c: c.add(i * ldc + j),
                    ldc,
                    mr: MR.min(m - i),
                    nr: NR.min(n - j),
                    accumulate: false,
                    last: true,
                    bias_row: e.bias_row,
                    bias_col: e.bias_col,
                    res: e.res,
                    ldr: e.ldr,
                    relu: e.relu,
                    act: e.act,
                };
                store_tile_scalar(&zero, &t);
            }
            j += NR;
        }
        i += MR;
    }
}

/// Packs the mc×kc block of A at `a` (strides rs, cs) into 6-row micro-panels, each
/// kc×6 floats k-major, zero-padding the last panel's missing rows.
///
/// # Safety
/// `a` addresses an mc×kc matrix; `dst` holds ⌈mc/6⌉·6·kc floats plus 8 of slack.
unsafe fn pack_a(
    kern: Kernel,
    mc: usize,
    kc: usize,
    a: *const f32,
    rs: usize,
    cs: usize,
    dst: *mut f32,
) {
    let panels = mc.div_ceil(MR);
    for q in 0..panels {
        let rows = MR.min(mc - q * MR);
        // SAFETY: rows q·6 .. q·6+rows of A exist; panel q of the destination holds
        // kc·6 floats, followed by the next panel or the slack.
        unsafe {
            let base = a.add(q * MR * rs);
            let pdst = dst.add(q * MR * kc);
            if cs == 1 && rows == MR {
                // Row-major A: rows read contiguously and transposed.
                (kern.pack_a_rows)(kc, base, rs, pdst);
                continue;
            }
            if rs == 1 && rows == MR {
                // Column-major A (a transposed gradient): six contiguous floats a column.
                (kern.pack_a_cols)(kc, base, cs, pdst);
                continue;
            }
            let panel = std::slice::from_raw_parts_mut(pdst, kc * MR);
            if rows < MR {
                panel.fill(0.0);
            }
            for (p, col) in panel.chunks_exact_mut(MR).enumerate() {
                for (r, o) in col.iter_mut().enumerate().take(rows) {
                    *o = *base.add(r * rs + p * cs);
                }
            }
        }
    }
}

/// Packs the kc×nc block of B at `b` (strides rs, cs) into 16-column micro-panels,
/// each kc×16 floats k-major, zero-padding the last panel's missing columns.
///
/// # Safety
/// `b` addresses a kc×nc matrix; `dst` holds ⌈nc/16⌉·16·kc floats.
unsafe fn pack_b(
    kern: Kernel,
    kc: usize,
    nc: usize,
    b: *const f32,
    rs: usize,
    cs: usize,
    dst: *mut f32,
) {
    let panels = nc.div_ceil(NR);
    // SAFETY: the destination's extent (the caller's contract).
    let out = unsafe { std::slice::from_raw_parts_mut(dst, panels * NR * kc) };
    for (q, panel) in out.chunks_exact_mut(NR * kc).enumerate() {
        let cols = NR.min(nc - q * NR);
        // SAFETY: columns q·16 .. q·16+cols of B exist.
        let base = unsafe { b.add(q * NR * cs) };
        if cols < NR {
            panel.fill(0.0);
        }
        if cs == 1 && cols == NR {
            // SAFETY: the panel holds kc·16 floats; rows 0..kc of the 16 columns exist.
            unsafe { (kern.pack_b_rows)(kc, base, rs, panel.as_mut_ptr()) };
        } else if cs == 1 {
            for (p, row) in panel.chunks_exact_mut(NR).enumerate() {
                // SAFETY: row p of the panel has `cols` contiguous elements.
                let src = unsafe { std::slice::from_raw_parts(base.add(p * rs), cols) };
                row[..cols].copy_from_slice(src);
            }
        } else if rs == 1 && cols == NR {
            // Column-major B (a transposed weight matrix): columns read contiguously and
            // transposed.
            // SAFETY: the panel holds kc·16 floats; columns q·16 .. q·16+16 exist.
            unsafe { (kern.pack_b_cols)(kc, base, cs, panel.as_mut_ptr()) };
        } else if rs == 1 {
            for j in 0..cols {
                // SAFETY: column j of the panel has kc contiguous elements.
                let src = unsafe { std::slice::from_raw_parts(base.add(j * cs), kc) };
                for (p, &v) in src.iter().enumerate() {
                    panel[p * NR + j] = v;
                }
            }
        } else {
            for (p, row) in panel.chunks_exact_mut(NR).enumerate() {
                for (j, o) in row.iter_mut().enumerate().take(cols) {
                    // SAFETY: element (p, j) of the block.
                    *o = unsafe { *base.add(p * rs + j * cs) };
                }
            }
        }
    }
}

/// A 64-byte-aligned f32 buffer that grows (never shrinks) on demand.
struct AlignedBuf {
    ptr: *mut f32,
    cap: usize,
}

impl AlignedBuf {
    const fn new() -> AlignedBuf {
        AlignedBuf {
            ptr: std::ptr::null_mut(),
            cap: 0,
        }
    }

    fn layout(cap: usize) -> Layout {
        match Layout::from_size_align(cap * 4, 64) {
            Ok(l) => l,
            Err(_) => panic!("GEMM scratch of {cap} floats exceeds the address space"),
        }
    }

    /// A pointer to at least `len` floats (contents unspecified).
    fn get(&mut self, len: usize) -> *mut f32 {
        if len > self.cap || self.ptr.is_null() {
            let cap = len.max(self.cap * 2).max(64);
            let layout = Self::layout(cap);
            // SAFETY: the layout has non-zero size.
            let p = unsafe { alloc(layout) } as *mut f32;
            if p.is_null() {
                handle_alloc_error(layout);
            }
            self.free();
            self.ptr = p;
            self.cap = cap;
        }
        self.ptr
    }

    fn free(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: allocated by `get` with this layout.
            unsafe { dealloc(self.ptr as *mut u8, Self::layout(self.cap)) };
            self.ptr = std::ptr::null_mut();
            self.cap = 0;
        }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        self.free();
    }
}

thread_local! {
    /// This thread's A and B packing buffers.
    static SCRATCH: RefCell<(AlignedBuf, AlignedBuf)> =
        const { RefCell::new((AlignedBuf::new(), AlignedBuf::new())) };
}

/// Runs `f` with this thread's packing buffers (fresh ones if they are in use, e.g. a
/// re-entrant call from an activation; or if the thread is being torn down).
fn with_scratch<R>(f: impl FnOnce(&mut AlignedBuf, &mut AlignedBuf) -> R) -> R {
    let mut f = Some(f);
    let r = SCRATCH.try_with(|s| {
        s.try_borrow_mut().ok().map(|mut g| {
            let (a, b) = &mut *g;
            (f.take().expect("called once"))(a, b)
        })
    });
    match r {
        Ok(Some(r)) => r,
        _ => {
            let (mut a, mut b) = (AlignedBuf::new(), AlignedBuf::new());
            (f.take().expect("not yet called"))(&mut a, &mut b)
        }
    }
}

#[cfg(test)]
mod tests {
    //! Checked against a naive f64 product. Tolerance: each element of C may differ
    //! from the reference by 1e-5·(1 + Σ_p |a_ip·b_pj| + |bias| + |residual|), i.e. a
    //! relative 1e-5 of the magnitudes summed (f32 accumulation over k terms).
    use super::*;

    struct Rng(u64);
    impl Rng {
        fn f(&mut self) -> f32 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
        fn vec(&mut self, n: usize) -> Vec<f32> {
            (0..n).map(|_| self.f()).collect()
        }
    }

    #[derive(Clone, Copy, Debug)]
    enum Layout {
        RowMajor,
        Transposed,
        Strided,
    }

    /// A `rows`×`cols` matrix in `layout`: its buffer and view.
    fn operand(rng: &mut Rng, rows: usize, cols: usize, layout: Layout) -> (Vec<f32>, Mat) {
        let (len, rs, cs) = match layout {
            Layout::RowMajor => (rows * cols, cols, 1),
            Layout::Transposed => (rows * cols, 1, rows),
            Layout::Strided => (rows * (2 * cols + 3), 2 * cols + 3, 2),
        };
        let buf = rng.vec(len.max(1));
        let mat = Mat {
            ptr: buf.as_ptr(),
            rs,
            cs,
        };
        (buf, mat)
    }

    #[derive(Clone, Copy, Debug)]
    enum BiasKind {
        None,
        Row,
        Col,
    }

    #[derive(Clone, Copy, Debug)]
    struct Case {
        m: usize,
        n: usize,
        k: usize,
        la: Layout,
        lb: Layout,
        ldc_pad: usize,
        bias: BiasKind,
        residual: bool,
        act: Act,
    }

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Path {
        Plain,
        Packed,
    }

    fn at(mat: Mat, i: usize, j: usize) -> f32 {
        // SAFETY: tests index inside the operand buffers built by `operand`.
        unsafe { *mat.ptr.add(i * mat.rs + j * mat.cs) }
    }

    fn check(case: Case, isa: Isa, pool: Option<&Pool>, path: Path, seed: u64) {
        let Case { m, n, k, .. } = case;
        let mut rng = Rng(seed);
        let (_abuf, a) = operand(&mut rng, m, k, case.la);
        let (_bbuf, b) = operand(&mut rng, k, n, case.lb);
        let bias_v = rng.vec(m.max(n).max(1));
        let bias = match case.bias {
            BiasKind::None => Bias::None,
            BiasKind::Row => Bias::PerRow(bias_v.as_ptr()),
            BiasKind::Col => Bias::PerCol(bias_v.as_ptr()),
        };
        let ldr = n + 3;
        let res_v = rng.vec((m * ldr).max(1));
        let ep = Epilogue {
            bias,
            residual: case.residual.then_some((res_v.as_ptr(), ldr)),
            act: case.act,
        };
        let ldc = n + case.ldc_pad;
        const SENTINEL: f32 = 12345.0;
        let mut c = vec![SENTINEL; (m * ldc).max(1)];
        // SAFETY: all buffers cover their stated extents.
        unsafe {
            match path {
                Path::Plain => driver(
                    kernel_for(isa),
                    pool,
                    0,
                    m,
                    n,
                    k,
                    a,
                    BSrc::Mat(b),
                    c.as_mut_ptr(),
                    ldc,
                    &ep,
                ),
                Path::Packed => {
                    let pb = PackedB::new(k, n, b);
                    let src = BSrc::Packed {
                        ptr: pb.buf.ptr,
                        panels: pb.panels,
                        p0: 0,
                    };
                    driver(
                        kernel_for(isa),
                        pool,
                        0,
                        m,
                        n,
                        k,
                        a,
                        src,
                        c.as_mut_ptr(),
                        ldc,
                        &ep,
                    )
                }
            }
        }
        for i in 0..m {
            let mut pre = vec![0f32; n];
            let mut tol = vec![0f64; n];
            for j in 0..n {
                let (mut s, mut mag) = (0f64, 1f64);
                for p in 0..k {
                    let t = at(a, i, p) as f64 * at(b, p, j) as f64;
                    s += t;
                    mag += t.abs();
                }
                let bv = match case.bias {
                    BiasKind::None => 0.0,
                    BiasKind::Row => bias_v[i] as f64,
                    BiasKind::Col => bias_v[j] as f64,
                };
                let rv = if case.residual {
                    res_v[i * ldr + j] as f64
                } else {
                    0.0
                };
                pre[j] = (s + bv + rv) as f32;
                tol[j] = 1e-5 * (mag + bv.abs() + rv.abs());
            }
            case.act.apply(&mut pre);
            for j in 0..n {
                let got = c[i * ldc + j];
                assert!(
                    (got as f64 - pre[j] as f64).abs() <= tol[j],
                    "{case:?} {isa:?} pool={} {path:?}: C[{i}][{j}] = {got}, want {}",
                    pool.is_some(),
                    pre[j]
                );
            }
            for j in n..ldc {
                assert_eq!(c[i * ldc + j], SENTINEL, "{case:?}: wrote past n");
            }
        }
    }

    const DIMS: [usize; 14] = [0, 1, 2, 5, 6, 7, 13, 16, 17, 31, 33, 64, 100, 257];
    const ACTS: [Act; 7] = [
        Act::None,
        Act::Relu,
        Act::LeakyRelu(0.1),
        Act::Sigmoid,
        Act::Gelu,
        Act::Clip(-0.5, 0.5),
        Act::Tanh,
    ];
    const LAYOUTS: [Layout; 3] = [Layout::RowMajor, Layout::Transposed, Layout::Strided];
    const BIASES: [BiasKind; 3] = [BiasKind::None, BiasKind::Row, BiasKind::Col];

    /// A deterministic spread of (m, n, k) triples over DIMS, every k = 0 edge included.
    fn cases() -> Vec<Case> {
        let mut rng = Rng(7);
        let mut triples = vec![(7, 13, 0), (0, 5, 3), (5, 0, 3), (1, 1, 0), (64, 33, 0)];
        for _ in 0..70 {
            let mut pick = || DIMS[((rng.f() + 1.0) * 0.5 * DIMS.len() as f32) as usize % 14];
            triples.push((pick(), pick(), pick()));
        }
        // Crossing every block size: m > MC, k > KC, n > NC.
        triples.extend([
            (257, 257, 257),
            (150, 40, 300),
            (7, NC + 20, 5),
            (6, 16, 256),
        ]);
        triples
            .into_iter()
            .enumerate()
            .map(|(x, (m, n, k))| Case {
                m,
                n,
                k,
                la: LAYOUTS[x % 3],
                lb: LAYOUTS[(x / 3) % 3],
                ldc_pad: [0, 1, 5][(x / 2) % 3],
                bias: BIASES[(x / 5) % 3],
                residual: x % 4 >= 2,
                act: ACTS[x % ACTS.len()],
            })
            .collect()
    }

    #[test]
    fn matches_reference_every_path() {
        let pool = Pool::new(2);
        for (x, case) in cases().into_iter().enumerate() {
            for isa in [Isa::Portable, Isa::Avx2, Isa::Avx512] {
                for pool in [None, Some(&pool)] {
                    for path in [Path::Plain, Path::Packed] {
                        check(case, isa, pool, path, 100 + x as u64);
                    }
                }
            }
        }
    }

    #[test]
    fn every_epilogue_combination() {
        let pool = Pool::new(2);
        let mut x = 0;
        for bias in BIASES {
            for residual in [false, true] {
                for act in ACTS {
                    let case = Case {
                        m: 17,
                        n: 33,
                        k: 31,
                        la: Layout::RowMajor,
                        lb: Layout::RowMajor,
                        ldc_pad: 2,
                        bias,
                        residual,
                        act,
                    };
                    for isa in [Isa::Portable, Isa::Avx2, Isa::Avx512] {
                        check(case, isa, Some(&pool), Path::Plain, x);
                        check(case, isa, None, Path::Packed, x);
                        x += 1;
                    }
                }
            }
        }
    }

    /// Every tile shape the wide (12×32) kernels produce: each row count up to two
    /// 12-row tiles and one more, column counts around each 16/32 boundary, depths
    /// within one KC slice and across two (accumulating), with column-major operands
    /// (the packers' transposed paths) and with pre-packed B.
    #[test]
    fn wide_tile_edges() {
        // On an AVX-512 machine (and compiler) the wide kernel is the one under test.
        #[cfg(target_arch = "x86_64")]
        if isa::detected() == Isa::Avx512 {
            assert_eq!(
                (kernel_for(Isa::Avx512).mr, kernel_for(Isa::Avx512).nr),
                (12, 32)
            );
        }
        let mut x = 0;
        for m in 1..=25 {
            for n in [1, 15, 16, 17, 31, 32, 33, 47, 48, 49] {
                for (k, la, lb) in [
                    (1, Layout::RowMajor, Layout::RowMajor),
                    (9, Layout::Transposed, Layout::Transposed),
                    (KC + 11, Layout::Transposed, Layout::RowMajor),
                    (KC + 37, Layout::RowMajor, Layout::Transposed),
                ] {
                    let case = Case {
                        m,
                        n,
                        k,
                        la,
                        lb,
                        ldc_pad: x % 3,
                        bias: BIASES[x % 3],
                        residual: x % 2 == 0,
                        act: ACTS[x % ACTS.len()],
                    };
                    for isa in [Isa::Avx2, Isa::Avx512] {
                        let path = [Path::Plain, Path::Packed][x % 2];
                        check(case, isa, None, path, x as u64);
                    }
                    x += 1;
                }
            }
        }
    }

    /// The public entry points (default dispatch and size threshold) against OpenBLAS.
    #[test]
    fn public_entry_points_agree_with_openblas() {
        let pool = Pool::new(2);
        let mut rng = Rng(3);
        for (m, n, k) in [(64, 512, 784), (128, 96, 100), (3, 5, 7), (2048, 49, 64)] {
            let a = rng.vec(m * k);
            let b = rng.vec(k * n);
            let bias = rng.vec(n);
            let ep = Epilogue {
                bias: Bias::PerCol(bias.as_ptr()),
                residual: None,
                act: Act::Relu,
            };
            let (am, bm) = (Mat::rows(a.as_ptr(), k), Mat::rows(b.as_ptr(), n));
            let mut want = vec![0f32; m * n];
            let mut got = vec![0f32; m * n];
            let mut got_packed = vec![0f32; m * n];
            // SAFETY: all buffers cover their extents.
            unsafe {
                gemm_openblas(m, n, k, am, bm, want.as_mut_ptr(), n, &ep);
                gemm(Some(&pool), m, n, k, am, bm, got.as_mut_ptr(), n, &ep);
                let pb = PackedB::new(k, n, bm);
                gemm_packed(None, m, n, k, am, &pb, got_packed.as_mut_ptr(), n, &ep);
            }
            for ((w, g), gp) in want.iter().zip(&got).zip(&got_packed) {
                let tol = 1e-5 * (1.0 + k as f32);
                assert!(
                    (w - g).abs() <= tol && (w - gp).abs() <= tol,
                    "{w} {g} {gp}"
                );
            }
        }
    }

    #[test]
    fn split_balances_two_threads() {
        // Small M: split N into equal halves.
        assert_eq!(split(2, 64, 512, 784, PAR_MIN_WORK), (1, 2));
        assert_eq!(split(2, 128, 768, 768, PAR_MIN_WORK), (1, 2));
        // Narrow N: split M.
        assert_eq!(split(2, 2048, 49, 512, PAR_MIN_WORK), (2, 1));
        // Tiny problems stay serial.
        assert_eq!(split(2, 8, 8, 8, PAR_MIN_WORK), (1, 1));
        assert_eq!(split(1, 1024, 1024, 1024, PAR_MIN_WORK), (1, 1));
    }
}
