//! What a lowered CUDA program is made of: where each value lives on the device
//! ([`Loc`], [`Slot`]) and the steps a run enqueues on its stream ([`Step`]).
use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig};

use super::blas::Gemm;
use crate::ir::ops::custom::OpRef;
use crate::ir::{Attrs, DType};

/// Where a value lives on the device while a program runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Loc {
    /// At this byte offset of the run's arena.
    Arena(usize),
    /// At this byte offset of the program's constant buffer.
    Const(usize),
    /// At this byte offset of the arena's scratch region (after the inputs).
    Scratch(usize),
}

/// A value of a program: where it lives, its dtype and its static dims.
#[derive(Debug, Clone)]
pub(crate) struct Slot {
    pub(crate) loc: Loc,
    pub(crate) dtype: DType,
    pub(crate) shape: Vec<usize>,
}

impl Slot {
    pub(crate) fn bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size_in_bytes()
    }
}

/// One step of a program, in schedule order on the run's stream.
pub(crate) enum Step {
    /// A generated kernel; `args` in the kernel's parameter order.
    Launch {
        node: String,
        func: CudaFunction,
        config: LaunchConfig,
        args: Vec<Loc>,
        /// Zeroed before the launch (the launch's private scratch).
        scratch: Vec<(usize, usize)>,
    },
    /// Row-major `y[i] = alpha·op(a[i])·op(b[i]) + beta·y[i]` for each batch offset pair.
    Gemm(Box<Gemm>),
    /// An external op's `compute_cuda` callback, on device pointers and the run's stream.
    Custom {
        node: String,
        /// Held so the registration outlives the program; `contain` names it.
        op: OpRef,
        kernel: std::sync::Arc<dyn crate::backend::registered::CudaKernel>,
        attrs: Attrs,
        ins: Vec<Option<Slot>>,
        outs: Vec<Slot>,
    },
    /// A device-to-device copy (a view the plan did not alias, Gemm's C).
    Copy { from: Loc, to: Loc, bytes: usize },
}

/// A lowered graph for one input-shape signature.
pub(crate) struct Program {
    pub(crate) steps: Vec<Step>,
    pub(crate) arena_bytes: usize,
    /// Where the scratch region starts in the arena.
    pub(crate) scratch_at: usize,
    pub(crate) inputs: Vec<Slot>,
    pub(crate) outputs: Vec<Slot>,
    /// The constants, uploaded at compile (`Loc::Const` offsets into it).
    pub(crate) consts: Option<CudaSlice<u8>>,
    /// Whether any step calls cuBLAS (a run then needs a handle).
    pub(crate) uses_blas: bool,
}

// SAFETY: the functions and the constant buffer are only read after lowering; the
// driver's handles may be used from any thread once the context is bound.
unsafe impl Send for Program {}
// SAFETY: a shared `&Program` only reads its steps, slots and the device handles of its
// functions and constants, which the driver lets threads use concurrently.
unsafe impl Sync for Program {}
