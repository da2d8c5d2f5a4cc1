//! Kiln: an embeddable deep-learning graph compiler and runtime.
//!
//! The path of a graph: it is built through the API (or parsed from `.kir` text, or
//! imported from ONNX), verified by [`ir::verify`], optionally differentiated
//! ([`autodiff`]) and given an optimizer ([`optim`]), optimized by the [`passes`],
//! memory-planned ([`memory`]) and run by a [`backend`]: the CPU backend's kernels, or
//! the reference interpreter, the numerical oracle every kernel is tested against.
//! See `ARCHITECTURE.md` for the code map and its invariants.

pub(crate) mod aligned;
pub mod autodiff;
pub mod backend;
pub mod capi;
pub mod checkpoint;
pub mod error;
pub mod frontend;
#[doc(hidden)]
pub mod internals;
pub mod interop;
pub mod ir;
pub mod memory;
pub mod optim;
pub mod passes;
pub mod tensor;
pub mod train;

pub use error::{Error, Result};
pub use ir::{DType, Dim, Graph, NodeId, Shape, TensorType, Value};
pub use tensor::Tensor;
