//! GEMM with fused epilogues: `C = A·B (+ bias) (+ residual)`, then an activation.
//!
//! This first version multiplies with OpenBLAS's `cblas_sgemm` and applies the epilogue
//! row by row afterwards; the API is what the backend and the convolutions program
//! against.
use super::blas;
use super::Act;
use crate::backend::cpu::pool::Pool;

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
unsafe impl Sync for Mat {}
unsafe impl Send for Epilogue {}
unsafe impl Sync for Epilogue {}

/// `C[m×n] (row stride ldc) = A[m×k]·B[k×n]`, then `ep`.
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
    let _ = pool;
    if m == 0 || n == 0 {
        return;
    }
    // OpenBLAS takes one unit-stride axis per operand.
    let (ta, lda) = blas_operand(a);
    let (tb, ldb) = blas_operand(b);
    blas::single_threaded();
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
    for i in 0..m {
        apply_epilogue(
            ep,
            i,
            0,
            std::slice::from_raw_parts_mut(c.add(i * ldc), n),
            ldc,
        );
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
            let v = *b.add(i);
            row.iter_mut().for_each(|x| *x += v);
        }
        Bias::PerCol(b) => {
            let b = std::slice::from_raw_parts(b.add(j0), row.len());
            row.iter_mut().zip(b).for_each(|(x, v)| *x += v);
        }
    }
    if let Some((r, ldr)) = ep.residual {
        let r = std::slice::from_raw_parts(r.add(i * ldr + j0), row.len());
        row.iter_mut().zip(r).for_each(|(x, v)| *x += v);
    }
    ep.act.apply(row);
}

fn blas_operand(m: Mat) -> (i32, usize) {
    if m.cs == 1 {
        (blas::CBLAS_NO_TRANS, m.rs.max(1))
    } else {
        assert_eq!(m.rs, 1, "a GEMM operand needs one unit-stride axis");
        (blas::CBLAS_TRANS, m.cs.max(1))
    }
}
