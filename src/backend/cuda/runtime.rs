//! The CUDA backend and executable: a specialized, optimized graph lowered (see
//! [`super::lower`]) to a list of device steps over ONE device arena.
//!
//! Compiling runs the pass pipeline WITHOUT the CPU's layout blocking (convolutions
//! stay NCHW), per input-shape signature (static inputs: once, at compile). A run takes
//! a free (stream, cuBLAS handle, arena) set or makes one (a stream per concurrent run),
//! copies the inputs in, enqueues the steps, copies the outputs out and waits:
//! host↔device traffic happens only at that boundary.
//!
//! Not yet: graphs with variables (training) on CUDA, and f16/bf16/int GEMMs; both are
//! compile errors saying so.
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cudarc::driver::{result as drv, CudaContext, CudaSlice, CudaStream, DevicePtr, PushKernelArg};

use super::blas;
use super::kernels::KernelSource;
use super::lower::{lower, Target};
use super::probe;
use super::program::{Loc, Program, Slot, Step};
use crate::backend::inputs::{check_input_types, input_types};
use crate::backend::registered::RawTensor;
use crate::backend::specialize::{specialize_for_shapes, static_input_shapes, ProgramCache};
use crate::backend::{unknown_variable, Backend, Executable};
use crate::error::{Error, Result};
use crate::ir::ops::custom;
use crate::ir::{verify, Graph, TensorType};
use crate::passes::CompileOptions;
use crate::tensor::Tensor;

/// The CUDA backend for device `ordinal`.
pub struct CudaBackend {
    pub ordinal: u32,
    /// The pipeline's options; layout blocking is turned off whatever they say.
    pub passes: CompileOptions,
    pub kernels: Arc<dyn KernelSource>,
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn compile(&self, graph: &Graph) -> Result<Box<dyn Executable>> {
        Ok(Box::new(self.compile_cuda(graph)?))
    }
}

/// A device error as a Kiln error, naming the device.
fn dev_err(device: &str, what: &str, e: impl std::fmt::Display) -> Error {
    Error::Runtime(format!("{device}: {what}: {e}"))
}

impl CudaBackend {
    /// The executable, as its concrete type.
    pub(crate) fn compile_cuda(&self, graph: &Graph) -> Result<CudaExecutable> {
        verify(graph)?;
        let name = format!("cuda:{}", self.ordinal);
        probe::probe(self.ordinal)?;
        if let Some(id) = graph
            .node_ids()
            .find(|&id| matches!(graph.node(id).op.as_str(), "Variable" | "Assign"))
        {
            return Err(Error::Device(format!(
                "{name}: graphs with variables (training) are not supported on cuda yet ({})",
                graph.describe(id)
            )));
        }
        let ctx = probe::no_panic("the CUDA driver", || {
            CudaContext::new(self.ordinal as usize)
        })
        .map_err(|e| Error::Device(format!("{name}: {e}")))?
        .map_err(|e| Error::Device(format!("{name}: cannot create a context ({e})")))?;
        // Each run has its own stream and arena and constants are uploaded before any
        // run: cudarc's per-buffer event tracking would only add work.
        // SAFETY: no CudaSlice exists on this context yet.
        unsafe { ctx.disable_event_tracking() };
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| dev_err(&name, "compute capability", e))?;
        let mut passes = self.passes.clone();
        passes.layout_block = None;
        let exe = CudaExecutable {
            device: name,
            graph: graph.clone(),
            input_types: input_types(graph),
            passes,
            kernels: self.kernels.clone(),
            arch: format!("compute_{major}{minor}"),
            ctx,
            programs: ProgramCache::new(),
            idle: Mutex::new(vec![]),
        };
        if let Some(shapes) = static_input_shapes(graph) {
            exe.program(&shapes)?;
        }
        Ok(exe)
    }
}

/// What one run in flight owns: its stream, a cuBLAS handle bound to it, its arena.
/// (The handle is declared first so that it is destroyed before its stream.)
struct RunResources {
    blas: Option<blas::Handle>,
    stream: Arc<CudaStream>,
    arena: Option<CudaSlice<u8>>,
}

// SAFETY: a set is used by one run at a time (taken from and returned to the pool).
unsafe impl Send for RunResources {}

pub struct CudaExecutable {
    device: String,
    /// The verified, unoptimized graph (specialized per signature, then optimized).
    graph: Graph,
    input_types: Vec<(String, TensorType)>,
    passes: CompileOptions,
    kernels: Arc<dyn KernelSource>,
    /// NVRTC's `--gpu-architecture` for this device.
    arch: String,
    ctx: Arc<CudaContext>,
    programs: ProgramCache<Program>,
    idle: Mutex<Vec<RunResources>>,
}

impl CudaExecutable {
    /// The program for these input shapes, built on first sight.
    fn program(&self, shapes: &[Vec<usize>]) -> Result<Arc<Program>> {
        self.programs.get_or_build(shapes, || {
            let g = specialize_for_shapes(&self.graph, shapes, &self.passes)?;
            let target = Target {
                device: &self.device,
                ctx: &self.ctx,
                arch: &self.arch,
                kernels: &*self.kernels,
            };
            lower(&target, &g)
        })
    }

    /// A free run set, or a new one (a new stream forked from the context).
    fn take_resources(&self, p: &Program) -> Result<RunResources> {
        let free = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut r = match free {
            Some(r) => r,
            None => RunResources {
                blas: None,
                stream: self
                    .ctx
                    .new_stream()
                    .map_err(|e| dev_err(&self.device, "creating a stream", e))?,
                arena: None,
            },
        };
        if p.uses_blas && r.blas.is_none() {
            r.blas = Some(blas::Handle::on_stream(&r.stream, &self.device)?);
        }
        if r.arena.as_ref().is_none_or(|a| a.len() < p.arena_bytes) {
            r.arena = None; // free the small one first
                            // SAFETY: every byte a step reads was written by an earlier step or copy.
            let arena = unsafe { r.stream.alloc::<u8>(p.arena_bytes.max(1)) }
                .map_err(|e| dev_err(&self.device, "allocating the arena", e))?;
            r.arena = Some(arena);
        }
        Ok(r)
    }

    fn run_program(&self, p: &Program, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| dev_err(&self.device, "binding the context", e))?;
        let r = self.take_resources(p)?;
        let result = self.run_on(p, &r, inputs);
        if result.is_ok() {
            self.idle.lock().unwrap_or_else(|e| e.into_inner()).push(r);
        }
        // After a failure the set is dropped: its stream may hold an error.
        result
    }

    fn run_on(&self, p: &Program, r: &RunResources, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let stream = &r.stream;
        let cu_stream = stream.cu_stream();
        let arena = r.arena.as_ref().expect("taken with an arena");
        let (arena_ptr, _a) = arena.device_ptr(stream);
        let const_ptr = p.consts.as_ref().map(|c| c.device_ptr(stream));
        let ptr = |loc: Loc| -> u64 {
            match loc {
                Loc::Arena(off) => arena_ptr + off as u64,
                Loc::Const(off) => const_ptr.as_ref().expect("constants uploaded").0 + off as u64,
                Loc::Scratch(off) => arena_ptr + (p.scratch_at + off) as u64,
            }
        };
        let err = |what: &str, e: &dyn std::fmt::Display| dev_err(&self.device, what, e);
        let host: Vec<Vec<u8>> = inputs.iter().map(Tensor::to_le_bytes).collect();
        for (slot, bytes) in p.inputs.iter().zip(&host) {
            // SAFETY: the slot lies in the arena and has the input's byte size (checked);
            // the host bytes outlive the run (it waits below).
            unsafe { drv::memcpy_htod_async(ptr(slot.loc), bytes, cu_stream) }
                .map_err(|e| err("copying an input to the device", &e))?;
        }
        for step in &p.steps {
            match step {
                Step::Custom {
                    node,
                    op,
                    kernel,
                    attrs,
                    ins,
                    outs,
                } => {
                    let raw = |s: &Slot| RawTensor {
                        data: ptr(s.loc) as *mut u8,
                        dtype: s.dtype,
                        shape: s.shape.clone(),
                    };
                    let ins: Vec<Option<RawTensor>> =
                        ins.iter().map(|s| s.as_ref().map(raw)).collect();
                    let outs: Vec<RawTensor> = outs.iter().map(raw).collect();
                    custom::contain(op, || {
                        kernel.compute(&ins, &outs, attrs, cu_stream as *mut c_void)
                    })
                    .map_err(|e| Error::Runtime(format!("{node}: {e}")))?;
                }
                Step::Copy { from, to, bytes } => {
                    // SAFETY: both ranges lie in device buffers of the program.
                    unsafe { drv::memcpy_dtod_async(ptr(*to), ptr(*from), *bytes, cu_stream) }
                        .map_err(|e| err("a device copy", &e))?;
                }
                Step::Gemm(gm) => {
                    let h = r.blas.as_ref().expect("a handle for a program with GEMMs");
                    // SAFETY: the operands lie in device buffers sized by the plan.
                    unsafe { h.gemm(gm, ptr(gm.a), ptr(gm.b), ptr(gm.y)) }
                        .map_err(|e| err(&format!("{}: cuBLAS", gm.node), &e))?;
                }
                Step::Launch {
                    node,
                    func,
                    config,
                    args,
                    scratch,
                } => {
                    for &(off, bytes) in scratch {
                        // SAFETY: the scratch region lies at the arena's end.
                        unsafe {
                            drv::memset_d8_async(ptr(Loc::Scratch(off)), 0, bytes, cu_stream)
                        }
                        .map_err(|e| err("zeroing scratch", &e))?;
                    }
                    let ptrs: Vec<u64> = args.iter().map(|&l| ptr(l)).collect();
                    let mut launch = stream.launch_builder(func);
                    for p in &ptrs {
                        launch.arg(p);
                    }
                    // SAFETY: the kernel takes exactly these pointers (its params), to
                    // buffers of the sizes it was generated for.
                    unsafe { launch.launch(*config) }
                        .map_err(|e| err(&format!("{node}: launching its kernel"), &e))?;
                }
            }
        }
        let mut host_out: Vec<Vec<u8>> = p.outputs.iter().map(|s| vec![0u8; s.bytes()]).collect();
        for (slot, buf) in p.outputs.iter().zip(host_out.iter_mut()) {
            // SAFETY: the slot lies in a device buffer of its byte size; the run waits
            // for the copy before reading `buf`.
            unsafe { drv::memcpy_dtoh_async(buf, ptr(slot.loc), cu_stream) }
                .map_err(|e| err("copying an output to the host", &e))?;
        }
        stream
            .synchronize()
            .map_err(|e| err("running the program", &e))?;
        p.outputs
            .iter()
            .zip(&host_out)
            .map(|(s, b)| Tensor::from_le_bytes(s.dtype, &s.shape, b).map_err(Error::Runtime))
            .collect()
    }
}

impl Executable for CudaExecutable {
    fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        check_input_types(&self.input_types, inputs)?;
        let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
        let program = self.program(&shapes)?;
        self.run_program(&program, inputs)
    }

    fn variables(&self) -> Vec<(String, TensorType)> {
        vec![]
    }

    fn read_variable(&self, name: &str) -> Result<Tensor> {
        Err(unknown_variable(name, &[]))
    }

    fn read_variables(&self) -> Result<Vec<(String, Tensor)>> {
        Ok(vec![])
    }

    fn write_variables(&self, values: &[(&str, &Tensor)]) -> Result<()> {
        match values.first() {
            None => Ok(()),
            Some((name, _)) => Err(unknown_variable(name, &[])),
        }
    }
}
