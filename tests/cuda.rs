//! The CUDA backend's tests: codegen and CLI on any machine; NVRTC and the device suites
//! with `--features cuda` (the device ones skip without a GPU): `cargo test --features cuda --test cuda`.
mod common;

#[path = "cuda_cli.rs"]
mod cuda_cli;
#[path = "cuda_codegen.rs"]
mod cuda_codegen;
#[path = "cuda_device.rs"]
mod cuda_device;
#[path = "cuda_nvrtc.rs"]
mod cuda_nvrtc;
