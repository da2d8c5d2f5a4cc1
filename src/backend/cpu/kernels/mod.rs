//! The CPU backend's kernels. Each works on raw f32 buffers (arena slices) and is tested
//! against the reference interpreter; the vector paths are chosen by [`super::isa`].
pub mod activation;
pub mod blas;
pub mod gemm;
pub mod math;

pub use activation::Act;
