//! Backends: what turns a verified graph into something that runs.
//!
//! The reference interpreter (`interp`) is the oracle; the optimizing CPU backend
//! (`cpu`) lowers the optimized graph to kernels; the CUDA backend (`cuda`) lowers it to
//! generated kernels and cuBLAS, behind the same [`Backend`] trait. [`Device`] chooses.
//! What the compiling backends share sits here, beside them: per-shape specialization
//! and its program cache ([`specialize`]), the check of a run's inputs ([`inputs`]),
//! the geometry of a matrix product
//! ([`matmul_geometry`]) and the FLOP count of a graph ([`flops`]).
use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};
use crate::ir::{Graph, TensorType};
use crate::passes::CompileOptions;
use crate::tensor::{Tensor, TensorView};

pub(crate) mod broadcast;
pub mod cpu;
pub mod cuda;
pub mod flops;
pub(crate) mod inputs;
pub mod interp;
pub(crate) mod matmul_geometry;
pub mod registered;
pub(crate) mod specialize;

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

    /// [`run`](Executable::run) on borrowed inputs. The CPU backend reads them in place
    /// once a program for their shapes exists; the others copy them first.
    fn run_views(&self, inputs: &[TensorView<'_>]) -> Result<Vec<Tensor>> {
        let owned = (inputs.iter())
            .enumerate()
            .map(|(i, v)| {
                v.to_tensor()
                    .map_err(|e| Error::InvalidArgument(format!("input {i}: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        self.run(&owned)
    }

    /// The variables the executable owns (initialized from the graph's `Variable`
    /// nodes), by name and type, in graph order.
    fn variables(&self) -> Vec<(String, TensorType)>;

    /// A copy of variable `name`'s current value (between runs: never a half-done
    /// run's).
    fn read_variable(&self, name: &str) -> Result<Tensor>;

    /// Every variable's current value, in graph order, read at one moment (between
    /// runs that store), so a checkpoint is never half one step and half the next.
    fn read_variables(&self) -> Result<Vec<(String, Tensor)>>;

    /// Replaces the named variables' values, all or none: every name must be a variable
    /// and every value keep its dtype and shape, or nothing changes. Waits for a run
    /// that assigns to finish.
    fn write_variables(&self, values: &[(&str, &Tensor)]) -> Result<()>;

    /// The profile table of the runs since the last call, which it forgets (per step:
    /// time per run, share, GFLOP/s and share of the FMA peak measured now, sorted by
    /// time; every step when `all`, else the slowest), when the executable was compiled
    /// with the `profile` option on a backend that profiles (the CPU's); else None.
    fn take_profile(&self, all: bool) -> Option<String> {
        let _ = all;
        None
    }

    /// Forgets the profile table's sums so far (after warm-up runs, say); a trace keeps
    /// every event.
    fn restart_profile(&self) {}
}

/// The error for a name that is not one of `vars`.
pub(crate) fn unknown_variable(name: &str, vars: &[(String, TensorType)]) -> Error {
    let known: Vec<&str> = vars.iter().map(|(n, _)| n.as_str()).collect();
    Error::InvalidArgument(format!(
        "no variable '{name}' (the executable's variables: {})",
        if known.is_empty() {
            "none".to_string()
        } else {
            known.join(", ")
        }
    ))
}

/// Checks a write of `value` to the variable `name` of type `ty`.
pub(crate) fn check_variable_write(name: &str, ty: &TensorType, value: &Tensor) -> Result<()> {
    let fits = value.dtype() == ty.dtype && ty.static_dims().as_deref() == Some(value.shape());
    if fits {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "variable '{name}' is {ty}, the value given is {}{:?}",
            value.dtype(),
            value.shape()
        )))
    }
}

/// Lowers a graph for one device.
pub trait Backend {
    fn name(&self) -> &'static str;
    fn compile(&self, graph: &Graph) -> Result<Box<dyn Executable>>;
}

/// What the CPU backend asks of the pass pipeline unless told otherwise: convolutions
/// in blocks of 16 channels (NCHW16c), one AVX-512 vector of f32 per pixel.
pub fn cpu_pass_options(mut passes: CompileOptions) -> CompileOptions {
    passes.layout_block.get_or_insert(16);
    passes
}

/// Ok if graphs can be compiled for `device` in this build on this machine, else the
/// `Error::Device` saying why (built without CUDA, no driver, no such device, ...).
/// Never panics, whatever the machine lacks.
pub fn device_available(device: Device) -> Result<()> {
    match device {
        Device::Interp | Device::Cpu => Ok(()),
        #[cfg(feature = "cuda")]
        Device::Cuda(n) => cuda::probe::probe(n),
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(n) => Err(built_without_cuda(n)),
    }
}

#[cfg(not(feature = "cuda"))]
fn built_without_cuda(n: u32) -> Error {
    Error::Device(format!(
        "cuda:{n}: Kiln was built without CUDA (the `cuda` feature)"
    ))
}

/// The backend for `device` with the compile options of the environment (`KILN_*`),
/// or why there is none.
pub fn backend_for(device: Device) -> Result<Box<dyn Backend>> {
    backend_with(device, CompileOptions::from_env()?)
}

/// The backend for `device`, compiling and running as `options` say. The interpreter
/// runs the graph as given, on one thread: it is the oracle the optimized paths are
/// checked against.
pub fn backend_with(device: Device, options: CompileOptions) -> Result<Box<dyn Backend>> {
    match device {
        Device::Interp => Ok(Box::new(interp::Interpreter)),
        Device::Cpu => Ok(Box::new(cpu::CpuBackend::new(options))),
        #[cfg(feature = "cuda")]
        Device::Cuda(n) => {
            cuda::probe::probe(n)?;
            Ok(Box::new(cuda::runtime::CudaBackend {
                ordinal: n,
                passes: options,
                kernels: std::sync::Arc::new(cuda::kernels::Generated),
            }))
        }
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(n) => Err(built_without_cuda(n)),
    }
}
