//! What a registered op brings the backends besides its `eval`: kernels that compute on
//! buffers the backend planned (the CPU arena, CUDA device memory). The core holds them
//! as an opaque `Any` (`Op::backend_kernels`), so that the IR carries no raw pointer,
//! arena or stream; only the backends, which own those, open them.
use std::any::Any;
use std::ffi::c_void;
use std::sync::Arc;

use crate::ir::ops::Op;
use crate::ir::{Attrs, DType};

/// A row-major tensor in memory someone else owns (a CPU program's arena, a device
/// buffer): what a registered op's kernel computes on without copies.
#[derive(Debug, Clone)]
pub struct RawTensor {
    pub data: *mut u8,
    pub dtype: DType,
    pub shape: Vec<usize>,
}

/// Computes on host buffers the caller planned: inputs (`None`: omitted) and outputs as
/// row-major tensors of the node's concrete types. An output may be an input's buffer
/// when the op allows in-place runs (`Op::may_run_in_place`).
pub trait BufferKernel: Send + Sync {
    fn compute(
        &self,
        inputs: &[Option<RawTensor>],
        outputs: &[RawTensor],
        attrs: &Attrs,
    ) -> Result<(), String>;
}

/// As [`BufferKernel`], on CUDA device buffers (the pointers are device addresses),
/// enqueuing the work on `stream` (a `CUstream`).
pub trait CudaKernel: Send + Sync {
    fn compute(
        &self,
        inputs: &[Option<RawTensor>],
        outputs: &[RawTensor],
        attrs: &Attrs,
        stream: *mut c_void,
    ) -> Result<(), String>;
}

/// The kernels of one registered op; what `Op::backend_kernels` holds.
#[derive(Clone, Default)]
pub struct Kernels {
    pub buffers: Option<Arc<dyn BufferKernel>>,
    pub cuda: Option<Arc<dyn CudaKernel>>,
}

impl Kernels {
    /// The kernels `op` brings, if any.
    pub fn of(op: &dyn Op) -> Option<&Kernels> {
        op.backend_kernels()?.downcast_ref::<Kernels>()
    }

    /// As `Op::backend_kernels` returns them.
    pub fn as_any(&self) -> &(dyn Any + Send + Sync) {
        self
    }
}
