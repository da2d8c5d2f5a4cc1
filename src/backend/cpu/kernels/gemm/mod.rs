//! GEMM with fused epilogues: `C = A·B (+ bias) (+ residual)`, then an activation.
//!
//! Kiln's own packed GEMM, BLIS-style:
//!
//! * loops `jc` over NC-column blocks of B, `pc` over KC-deep slices of K, `ic` over
//!   MC-row blocks of A; B's KC×NC block is packed into 16-column micro-panels (kept in
//!   L3/L2), A's MC×KC block into 6-row micro-panels (kept in L2), and the macro-kernel
//!   runs the micro-kernel over them with each B micro-panel (pair) resident in L1;
//! * a pre-packed B deeper than KC runs column by column instead: A's rows in blocks
//!   packed over all of K (half the L2 each), each column of B panels through every K
//!   slice, so C tiles stay in L1 and are written once;
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
//! The files: [`dispatch`] picks an ISA's routines, [`driver`] splits the work over
//! threads and runs the blocked loops, [`pack`] lays blocks out as micro-panels,
//! [`epilogue`] stores tiles with the epilogue, [`scratch`] holds the packing buffers.
//! Measurements against OpenBLAS are in `bench/RESULTS.md` (`cargo bench --bench gemm
//! --features openblas`).
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod dispatch;
mod driver;
mod epilogue;
mod pack;
mod portable;
mod scratch;
#[cfg(test)]
mod tests;

use super::Act;
use crate::backend::cpu::isa::{self, Isa};
use crate::backend::cpu::pool::Pool;
use dispatch::kernel_for;
use driver::{driver, BSrc};
pub use epilogue::apply_epilogue;
pub(crate) use epilogue::{store_tile_scalar, Tile};
use pack::pack_b;
use scratch::Scratch;

/// Micro-tile rows (A micro-panel height).
pub const MR: usize = 6;
/// Micro-tile columns (B micro-panel width, two ymm registers).
pub const NR: usize = 16;
/// Depth of a K slice: a 6×KC A panel (6 KiB) plus a KC×16 B panel (16 KiB) fit L1d.
pub const KC: usize = 256;
/// Rows of a packed A block: MC×KC floats = 144 KiB, a good part of the 512 KiB L2.
pub const MC: usize = 144;
/// Columns of a packed B block: KC×NC floats = 4 MiB, resident in L3 and streamed
/// panel by panel (each tile prefetches its share of the next panel). A block sized to
/// a quarter of L2 measured no faster on huge pages, and repacks A once per block.
pub const NC: usize = 4096;

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
// SAFETY: a shared `&Mat` yields only a copy of its read-only pointer and strides; the
// GEMM never writes through it, so threads may read A or B through it at once.
unsafe impl Sync for Mat {}
// SAFETY: as for `Mat`: the epilogue's pointers are read-only views kept alive for the call.
unsafe impl Send for Epilogue {}
// SAFETY: the bias and residual behind a shared `&Epilogue` are only ever read, by any
// number of threads, while the caller keeps them alive.
unsafe impl Sync for Epilogue {}

/// `C[m×n] (row stride ldc) = A[m×k]·B[k×n]`, then `ep`.
///
/// Runs Kiln's packed kernel (AVX-512F, AVX2+FMA or portable, by [`isa::isa`]), not
/// OpenBLAS (`blas::gemm_openblas`, with the `openblas` feature, keeps that path as the
/// baseline the kernel is measured against).
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
    // SAFETY: `gemm_with_isa` asks what `gemm` asks (any `isa` is capped by the CPU).
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
    let (kern, b) = (kernel_for(isa), BSrc::Mat(b));
    // SAFETY: A, B (k×n, so `b` covers k×n), C and the epilogue as `gemm` asks; `kern`
    // is what this CPU runs.
    unsafe { driver(kern, pool, PAR_MIN_WORK, m, n, k, a, b, c, ldc, ep) }
}

/// A constant B (k×n, e.g. a layer's weights) packed once in the layout the kernel
/// reads: for each K slice (all of K, or KC rows: see [`driver::packed_depth`]), the ⌈n/16⌉ micro-panels of that slice, each kc×16 floats
/// (zero-padded past column n), in one 64-byte-aligned buffer it owns.
pub struct PackedB {
    k: usize,
    n: usize,
    panels: usize,
    depth: usize,
    buf: Scratch,
}

// SAFETY: PackedB owns its buffer and is immutable after construction.
unsafe impl Send for PackedB {}
// SAFETY: no `&PackedB` method writes the buffer (only `src` reads its address), so
// concurrent GEMMs may read the packed panels together.
unsafe impl Sync for PackedB {}

impl PackedB {
    /// Packs the k×n matrix `b` for an A of `m` rows (the layout's choice: it serves
    /// any m).
    ///
    /// # Safety
    /// `b` must address a valid k×n matrix.
    pub unsafe fn new(m: usize, k: usize, n: usize, b: Mat) -> PackedB {
        let panels = n.div_ceil(NR);
        let depth = driver::packed_depth(m, k);
        let kern = kernel_for(isa::isa());
        let mut buf = Scratch::new();
        let dst = buf.get(k * panels * NR);
        let mut pc = 0;
        while pc < k {
            let kc = depth.min(k - pc);
            // SAFETY: the slice starts at row pc of a valid k×n matrix; the destination
            // holds k·panels·16 floats, of which this slice fills kc·panels·16 at
            // offset pc·panels·16.
            unsafe {
                let (src, out) = (b.ptr.add(pc * b.rs), dst.add(pc * panels * NR));
                pack_b(kern, kc, n, src, b.rs, b.cs, out)
            };
            pc += kc;
        }
        PackedB {
            k,
            n,
            panels,
            depth,
            buf,
        }
    }

    /// The driver's view of it.
    fn src(&self) -> BSrc {
        BSrc::Packed {
            ptr: self.buf.as_ptr(),
            panels: self.panels,
            depth: self.depth,
            p0: 0,
        }
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
    // SAFETY: `gemm_packed_with_isa` asks what `gemm_packed` asks, for any `isa`.
    unsafe { gemm_packed_with_isa(isa::isa(), pool, m, n, k, a, b, c, ldc, ep) }
}

/// [`gemm_packed`] with the micro-kernel chosen by `isa` (as in [`gemm_with_isa`]).
///
/// # Safety
/// As for [`gemm_packed`].
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_packed_with_isa(
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
    let src = b.src();
    let kern = kernel_for(isa);
    // SAFETY: A, C and the epilogue as `gemm` asks; `src` covers k×n (checked above);
    // `kern` is what this CPU runs.
    unsafe { driver(kern, pool, PAR_MIN_WORK, m, n, k, a, src, c, ldc, ep) }
}
