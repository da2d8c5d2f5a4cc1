//! The CUDA backend (issue 9). The kernel generator (`codegen`) is pure Rust and always
//! built, so the default test suite checks the CUDA C it emits on the host; what talks
//! to a device lives behind the `cuda` feature.
pub mod codegen;
