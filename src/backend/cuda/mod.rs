//! The CUDA backend (issue 9): generated kernels (`codegen`, pure Rust, always built)
//! and, behind the `cuda` feature, what talks to the driver through cudarc: the device
//! probe, NVRTC compilation with its cache, cuBLAS GEMMs and the executable.
#[cfg(feature = "cuda")]
pub mod kernels;
#[cfg(feature = "cuda")]
pub mod nvrtc;
#[cfg(feature = "cuda")]
pub mod probe;
#[cfg(feature = "cuda")]
pub mod runtime;
