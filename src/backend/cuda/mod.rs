//! The CUDA backend. The kernel generator (`codegen`) is pure Rust and always built, so
//! the default test suite checks the CUDA C it emits on the host; what talks to a device
//! lives behind the `cuda` feature: the device probe, NVRTC compilation with its cache,
//! the lowering to a program, cuBLAS GEMMs and the executable.
#[cfg(feature = "cuda")]
mod blas;
pub(crate) mod codegen;
#[cfg(feature = "cuda")]
pub(crate) mod kernels;
#[cfg(feature = "cuda")]
mod lower;
#[cfg(feature = "cuda")]
pub(crate) mod nvrtc;
#[cfg(feature = "cuda")]
pub(crate) mod probe;
#[cfg(feature = "cuda")]
mod program;
#[cfg(feature = "cuda")]
pub(crate) mod runtime;
