//! What the runtime launches: generated kernels as the runtime sees them, and where
//! they come from ([`KernelSource`]).
//!
//! The generator (`codegen`, issue 9's other half) emits `GeneratedKernel`s; the
//! executable asks a [`KernelSource`] for a node's kernel, so the lowering here does not
//! depend on the generator's internals and a test can supply its own kernels.
use crate::error::Result;
use crate::ir::{Graph, NodeId};

/// One CUDA C kernel for one node of a specialized graph (the fields of the generator's
/// `GeneratedKernel`).
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceKernel {
    /// The `extern "C" __global__` function's name.
    pub entry: String,
    /// Self-contained CUDA C source (NVRTC's built-ins only).
    pub source: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Dynamic shared memory in bytes.
    pub shared_bytes: u32,
    /// The kernel's parameters in order, each a pointer to a dense row-major buffer.
    pub params: Vec<DeviceParam>,
}

/// A kernel parameter: which buffer the pointer points to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceParam {
    /// The node's input `i`.
    Input(usize),
    /// The node's output `i`.
    Output(usize),
    /// Device scratch of this many bytes, private to the launch, zeroed before it.
    Scratch(usize),
}

/// Where the executable gets kernels.
pub trait KernelSource: Send + Sync {
    /// The kernel computing node `node` of `graph` (optimized, all dims static), or
    /// `Ok(None)` when there is none for its op (GEMMs and views are the runtime's own).
    fn kernel_for_node(&self, graph: &Graph, node: NodeId) -> Result<Option<DeviceKernel>>;

    /// The in-place epilogue (bias, residual, activation) of a `FusedMatMul` after its
    /// cuBLAS GEMM: params `[Output(0), then Input(i)…]`; `Ok(None)` without one.
    fn epilogue_kernel(&self, graph: &Graph, node: NodeId) -> Result<Option<DeviceKernel>>;
}

/// The generator's kernels (`codegen`): what the CUDA backend launches.
pub struct Generated;

impl From<super::codegen::GeneratedKernel> for DeviceKernel {
    fn from(k: super::codegen::GeneratedKernel) -> DeviceKernel {
        use super::codegen::KernelParam;
        DeviceKernel {
            entry: k.entry,
            source: k.source,
            grid: k.grid,
            block: k.block,
            shared_bytes: k.shared_bytes,
            params: k
                .params
                .into_iter()
                .map(|p| match p {
                    KernelParam::Input(i) => DeviceParam::Input(i),
                    KernelParam::Output(i) => DeviceParam::Output(i),
                    KernelParam::Scratch(n) => DeviceParam::Scratch(n),
                })
                .collect(),
        }
    }
}

impl KernelSource for Generated {
    fn kernel_for_node(&self, graph: &Graph, node: NodeId) -> Result<Option<DeviceKernel>> {
        Ok(super::codegen::kernel_for_node(graph, node)?.map(DeviceKernel::from))
    }

    fn epilogue_kernel(&self, graph: &Graph, node: NodeId) -> Result<Option<DeviceKernel>> {
        Ok(super::codegen::epilogue_kernel(graph, node)?.map(DeviceKernel::from))
    }
}
