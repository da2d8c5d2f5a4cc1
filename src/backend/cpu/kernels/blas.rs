//! The OpenBLAS entry points Kiln uses (Debian's `libopenblas-dev`, linked by build.rs).
use std::os::raw::c_int;

pub const CBLAS_ROW_MAJOR: c_int = 101;
pub const CBLAS_NO_TRANS: c_int = 111;
pub const CBLAS_TRANS: c_int = 112;

extern "C" {
    #[allow(clippy::too_many_arguments)]
    pub fn cblas_sgemm(
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
