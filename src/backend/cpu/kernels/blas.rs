//! OpenBLAS, the baseline Kiln's GEMM is measured and tested against: its entry points
//! (Debian's `libopenblas-dev`, linked by build.rs) and [`gemm_openblas`]. Only with the
//! `openblas` feature (the GEMM bench and the comparing unit test); no library code path
//! calls it, so the shipped library does not link it.
use super::gemm::{apply_epilogue, gemm, Epilogue, Mat};
use std::os::raw::c_int;

pub const CBLAS_ROW_MAJOR: c_int = 101;
pub const CBLAS_NO_TRANS: c_int = 111;
pub const CBLAS_TRANS: c_int = 112;

extern "C" {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn cblas_sgemm(
        layout: c_int,
        trans_a: c_int,
        trans_b: c_int,
        m: c_int,
        n: c_int,
        k: c_int,
        alpha: f32,
        a: *const f32,
        lda: c_int,
        b: *const f32,
        ldb: c_int,
        beta: f32,
        c: *mut f32,
        ldc: c_int,
    );
    fn openblas_set_num_threads(n: c_int);
}

/// OpenBLAS runs single-threaded inside Kiln: parallelism comes from Kiln's own pool,
/// and two pools on two cores would fight. Process-wide, set once.
pub fn single_threaded() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    // SAFETY: a plain setter in OpenBLAS.
    ONCE.call_once(|| unsafe { openblas_set_num_threads(1) });
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
        // SAFETY: `gemm` asks the same of the operands, C and `ep` as this function.
        return unsafe { gemm(None, m, n, k, a, b, c, ldc, ep) };
    };
    single_threaded();
    {
        // cblas's i32 sizes, named short so the call fits on one line.
        let (o, m, n, k, ldc) = (CBLAS_ROW_MAJOR, m as i32, n as i32, k as i32, ldc as i32);
        let (ap, lda, bp, ldb) = (a.ptr, lda as i32, b.ptr, ldb as i32);
        // SAFETY: operands and C are valid (the caller's contract); the leading
        // dimensions describe them as OpenBLAS expects.
        unsafe { cblas_sgemm(o, ta, tb, m, n, k, 1.0, ap, lda, bp, ldb, 0.0, c, ldc) };
    }
    for i in 0..m {
        // SAFETY: row i < m of C has n elements at c + i·ldc, not otherwise borrowed.
        let row = unsafe { std::slice::from_raw_parts_mut(c.add(i * ldc), n) };
        // SAFETY: the epilogue's bias and residual cover C (the caller's contract).
        unsafe { apply_epilogue(ep, i, 0, row, ldc) };
    }
}

fn blas_operand(m: Mat) -> Option<(i32, usize)> {
    if m.cs == 1 {
        Some((CBLAS_NO_TRANS, m.rs.max(1)))
    } else if m.rs == 1 {
        Some((CBLAS_TRANS, m.cs.max(1)))
    } else {
        None
    }
}
