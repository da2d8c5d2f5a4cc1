//! Kiln: an embeddable deep-learning graph compiler and runtime.
//!
//! The path of a graph: it is built through the API (or parsed from `.kir` text),
//! verified by [`ir::verify`], and run by a [`backend`]. Today the only backend is the
//! reference interpreter, the numerical oracle for every optimized kernel that follows.
//! See `ARCHITECTURE.md` for the code map and its invariants.

pub mod autodiff;
pub mod backend;
pub mod capi;
pub mod error;
pub mod frontend;
pub mod ir;
pub mod memory;
pub mod optim;
pub mod passes;
pub mod tensor;

pub use error::{Error, Result};
pub use ir::{DType, Dim, Graph, NodeId, Shape, TensorType, Value};
pub use tensor::Tensor;
