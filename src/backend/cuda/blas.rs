//! cuBLAS: the GEMM step of a matrix-product node, its calls, and the handle a run
//! binds to its stream.
//!
//! Row-major through column-major: the row-major `Y (m×n) = op(A)·op(B)` is the
//! column-major `Yᵀ (n×m) = op(B)ᵀ·op(A)ᵀ`, and a row-major matrix is its transpose in
//! column-major, so B goes first and the leading dimensions are the row lengths.
use std::sync::Arc;

use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::CudaStream;

use super::probe;
use super::program::{Loc, Slot};
use crate::backend::matmul_geometry::{geometry, Geometry};
use crate::error::{Error, Result};
use crate::ir::{DType, Graph, NodeId};

/// The products of one `MatMul`, `Gemm` or `FusedMatMul` node.
pub(crate) struct Gemm {
    /// The node, for errors.
    pub(crate) node: String,
    pub(crate) a: Loc,
    pub(crate) b: Loc,
    pub(crate) y: Loc,
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) trans_a: bool,
    pub(crate) trans_b: bool,
    pub(crate) alpha: f32,
    pub(crate) beta: f32,
    /// Per product: the element offsets of its A and B (Y's are `i·m·n`).
    pub(crate) batches: Vec<(usize, usize)>,
}

/// A cuBLAS handle bound to one run's stream; destroyed when dropped.
pub(crate) struct Handle(blas_sys::cublasHandle_t);

impl Handle {
    /// A new handle whose calls go on `stream`; `device` names the device in errors.
    pub(crate) fn on_stream(stream: &Arc<CudaStream>, device: &str) -> Result<Handle> {
        let h = probe::no_panic("cuBLAS", blas::create_handle)
            .map_err(|e| Error::Device(format!("{device}: {e}")))?
            .map_err(|e| Error::Runtime(format!("{device}: creating a cuBLAS handle: {e}")))?;
        let handle = Handle(h);
        // SAFETY: a live handle and a live stream.
        unsafe { blas::set_stream(handle.0, stream.cu_stream() as _) }
            .map_err(|e| Error::Runtime(format!("{device}: cuBLAS stream: {e}")))?;
        Ok(handle)
    }

    /// Runs the products of `g` on the operands at these device addresses: B first,
    /// untransposed when it was not transposed (see the module doc), one strided-batched
    /// call when the batches are evenly strided, else one call per product.
    ///
    /// # Safety
    /// `a`, `b`, `y` are device pointers to the step's operands, of the sizes it was
    /// planned for.
    pub(crate) unsafe fn gemm(
        &self,
        g: &Gemm,
        a: u64,
        b: u64,
        y: u64,
    ) -> std::result::Result<(), blas::CublasError> {
        use blas_sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
        let h = self.0;
        let (m, n, k) = (g.m as i32, g.n as i32, g.k as i32);
        let (op_b, ldb) = if g.trans_b {
            (CUBLAS_OP_T, k)
        } else {
            (CUBLAS_OP_N, n)
        };
        let (op_a, lda) = if g.trans_a {
            (CUBLAS_OP_T, m)
        } else {
            (CUBLAS_OP_N, k)
        };
        let f = |p: u64, elems: usize| (p + 4 * elems as u64) as *const f32;
        let (alpha, beta) = (&g.alpha as *const f32, &g.beta as *const f32);
        // Evenly strided batches (the usual case): one strided-batched call.
        let stride = |i: usize| {
            (
                g.batches[i].0 as i64 - g.batches[0].0 as i64,
                g.batches[i].1 as i64 - g.batches[0].1 as i64,
            )
        };
        let even = g.batches.len() > 1 && {
            let (sa, sb) = stride(1);
            sa >= 0
                && sb >= 0
                && (1..g.batches.len()).all(|i| stride(i) == (sa * i as i64, sb * i as i64))
        };
        if even {
            let (sa, sb) = stride(1);
            let (oa, ob) = g.batches[0];
            let (b0, a0, y0) = (f(b, ob), f(a, oa), f(y, 0) as *mut f32);
            let (mn, count) = ((g.m * g.n) as i64, g.batches.len() as i32);
            // SAFETY: a live handle; the caller vouches for the device operands: the
            // batches are B at `b0` + i·sb, A at `a0` + i·sa and Y at `y0` + i·m·n floats.
            return unsafe {
                blas::sgemm_strided_batched(
                    h, op_b, op_a, n, m, k, alpha, b0, ldb, sb, a0, lda, sa, beta, y0, n, mn, count,
                )
            };
        }
        for (i, &(oa, ob)) in g.batches.iter().enumerate() {
            let (bi, ai, yi) = (f(b, ob), f(a, oa), f(y, i * g.m * g.n) as *mut f32);
            // SAFETY: the live handle; product i's B, A and Y at their planned device
            // offsets, which the caller vouches for.
            unsafe { blas::sgemm(h, op_b, op_a, n, m, k, alpha, bi, ldb, ai, lda, beta, yi, n) }?;
        }
        Ok(())
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: the handle was created by `on_stream` and is not used any more.
        let _ = unsafe { blas::destroy_handle(self.0) };
    }
}

/// Ok if cuBLAS's library can be loaded, else an error naming the device.
pub(crate) fn check_present(device: &str) -> Result<()> {
    // SAFETY: only tries to dlopen cuBLAS's library names.
    if unsafe { blas_sys::is_culib_present() } {
        Ok(())
    } else {
        Err(Error::Device(format!(
            "{device}: cuBLAS not found (libcublas.so.12 is not on the loader's path)"
        )))
    }
}

/// The GEMM of a `MatMul`, `Gemm` or `FusedMatMul` node (f32; batched and broadcast
/// like numpy's matmul; vectors as one-row / one-column matrices).
pub(crate) fn gemm_step(
    g: &Graph,
    id: NodeId,
    ins: &[Option<Slot>],
    y: &Slot,
) -> std::result::Result<Gemm, String> {
    let node = g.node(id);
    let attrs = &node.attrs;
    let (a, b) = match (
        ins.first().cloned().flatten(),
        ins.get(1).cloned().flatten(),
    ) {
        (Some(a), Some(b)) => (a, b),
        _ => return Err("missing A or B".into()),
    };
    if [a.dtype, b.dtype, y.dtype].iter().any(|&d| d != DType::F32) {
        return Err(format!(
            "cuBLAS GEMMs are f32 only here (A is {}, B is {})",
            a.dtype, b.dtype
        ));
    }
    let trans_a = attrs.int_or("transA", 0)? != 0;
    let trans_b = attrs.int_or("transB", 0)? != 0;
    let Geometry { m, n, k, batches } = geometry(
        &a.shape,
        &b.shape,
        y.shape.iter().product(),
        trans_a,
        trans_b,
    )?;
    let (mut alpha, mut beta) = (1.0, 0.0);
    if node.op == "Gemm" {
        alpha = attrs.float_or("alpha", 1.0)? as f32;
        if let Some(c) = ins.get(2).cloned().flatten() {
            if c.shape != y.shape {
                return Err(format!(
                    "a Gemm C of shape {:?} broadcast to Y {:?} (the fuse-epilogue pass makes it a FusedMatMul bias)",
                    c.shape, y.shape
                ));
            }
            beta = attrs.float_or("beta", 1.0)? as f32;
        }
    }
    Ok(Gemm {
        node: g.describe(id),
        a: a.loc,
        b: b.loc,
        y: y.loc,
        m,
        n,
        k,
        trans_a,
        trans_b,
        alpha,
        beta,
        batches,
    })
}
