//! Backends: what turns a verified graph into something that runs.
//!
//! The reference interpreter (`interp`) is the oracle; the optimizing CPU backend
//! (`cpu`) lowers the optimized graph to kernels; the CUDA backend (issue 9) will plug in
//! behind the same [`Backend`] trait. [`Device`] chooses.
use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};
use crate::ir::Graph;
use crate::passes::PassOptions;
use crate::tensor::Tensor;

pub mod cpu;
pub mod interp;

/// Where a graph runs: `"interp"`, `"cpu"` or `"cuda:N"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// The reference interpreter, on the host.
    Interp,
    /// The optimizing CPU backend.
    Cpu,
    /// A CUDA device by ordinal.
    Cuda(u32),
}

impl FromStr for Device {
    type Err = Error;
    fn from_str(s: &str) -> Result<Device> {
        match s {
            "interp" => Ok(Device::Interp),
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "unknown device '{s}' (expected interp, cpu or cuda:N)"
                    ))
                }),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Interp => f.write_str("interp"),
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// A compiled graph. Runs may come from many threads at once; runs that assign
/// variables are serialized by the executable.
pub trait Executable: Send + Sync {
    /// Runs with the graph inputs in order; returns the graph outputs in order.
    fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>>;
}

/// Lowers a graph for one device.
pub trait Backend {
    fn name(&self) -> &'static str;
    fn compile(&self, graph: &Graph) -> Result<Box<dyn Executable>>;
}

/// What the CPU backend asks of the pass pipeline unless told otherwise: convolutions
/// in blocks of 16 channels (NCHW16c), one AVX-512 vector of f32 per pixel.
pub fn cpu_pass_options(mut passes: PassOptions) -> PassOptions {
    passes.layout_block.get_or_insert(16);
    passes
}

/// The backend for `device` with the pass options of the environment (`KILN_*`) and a
/// thread per core, or why there is none.
pub fn backend_for(device: Device) -> Result<Box<dyn Backend>> {
    backend_with(device, PassOptions::from_env()?, 0)
}

/// The backend for `device`, optimizing with `passes` and running on `threads` threads
/// (0 = one per core). The interpreter runs the graph as given, on one thread: it is the
/// oracle the optimized paths are checked against.
pub fn backend_with(
    device: Device,
    passes: PassOptions,
    threads: usize,
) -> Result<Box<dyn Backend>> {
    match device {
        Device::Interp => Ok(Box::new(interp::Interpreter::default())),
        Device::Cpu => Ok(Box::new(cpu::CpuBackend {
            passes: cpu_pass_options(passes),
            threads,
            tuning: cpu::tune::Tuning::from_env(),
        })),
        Device::Cuda(n) if cfg!(feature = "cuda") => Err(Error::Device(format!(
            "cuda:{n}: the CUDA backend is not built yet"
        ))),
        Device::Cuda(n) => Err(Error::Device(format!(
            "cuda:{n}: Kiln was built without CUDA (the `cuda` feature)"
        ))),
    }
}
