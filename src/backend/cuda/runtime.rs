//! The CUDA executable: a specialized, optimized graph lowered to a list of device
//! steps over ONE device arena.
//!
//! Compiling: the pass pipeline WITHOUT the CPU's layout blocking (convolutions stay
//! NCHW); per input-shape signature (static inputs: once, at compile) the memory plan
//! laid onto the arena, then one step per node: views that the plan aliased do nothing
//! (else a device copy), `MatMul`/`Gemm`/`FusedMatMul` run cuBLAS (row-major through the
//! transpose trick: `Cᵀ = Bᵀ·Aᵀ` in cuBLAS's column-major) followed by the generator's
//! epilogue kernel, everything else is the generator's kernel, compiled by NVRTC for the
//! device's architecture and loaded once. An op with no kernel is a compile error
//! naming the op and the node. An external op runs its `compute_cuda` callback on
//! device pointers and the run's stream.
//!
//! The arena holds the plan's values, then the graph inputs, then the largest scratch
//! any launch asks for. Constants are uploaded once, at compile, into one device buffer.
//! A run takes a free (stream, cuBLAS handle, arena) set or makes one (a stream per
//! concurrent run), copies the inputs in, enqueues the steps, copies the outputs out
//! and waits: host↔device traffic happens only at that boundary.
//!
//! Not yet: graphs with variables (training) on CUDA, and f16/bf16/int GEMMs; both are
//! compile errors saying so.
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, RwLock};

use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::{
    result as drv, CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig,
    PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use super::kernels::{DeviceKernel, DeviceParam, KernelSource};
use super::{nvrtc, probe};
use crate::backend::cpu::lower::static_output;
use crate::backend::cpu::static_input_shapes;
use crate::backend::cpu::steps::matmul::{geometry, Geometry};
use crate::backend::{interp, unknown_variable, Backend, Executable};
use crate::error::{Error, Result};
use crate::ir::ops::custom::{self, OpRef, RawTensor};
use crate::ir::{verify, Attrs, DType, Dim, Graph, NodeId, TensorType, Value};
use crate::memory;
use crate::passes::{run_pipeline, PassOptions};
use crate::tensor::Tensor;

/// The CUDA backend for device `ordinal`.
pub struct CudaBackend {
    pub ordinal: u32,
    /// The pipeline's options; layout blocking is turned off whatever they say.
    pub passes: PassOptions,
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
    pub fn compile_cuda(&self, graph: &Graph) -> Result<CudaExecutable> {
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
            input_types: interp::input_types(graph),
            passes,
            kernels: self.kernels.clone(),
            arch: format!("compute_{major}{minor}"),
            ctx,
            programs: RwLock::new(HashMap::new()),
            idle: Mutex::new(vec![]),
        };
        if let Some(shapes) = static_input_shapes(graph) {
            exe.program(&shapes)?;
        }
        Ok(exe)
    }
}

/// Where a value lives on the device while a program runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loc {
    /// At this byte offset of the run's arena.
    Arena(usize),
    /// At this byte offset of the program's constant buffer.
    Const(usize),
    /// At this byte offset of the arena's scratch region (after the inputs).
    Scratch(usize),
}

#[derive(Debug, Clone)]
struct Slot {
    loc: Loc,
    dtype: DType,
    shape: Vec<usize>,
}

impl Slot {
    fn bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size_in_bytes()
    }
}

/// One step of a program, in schedule order on the run's stream.
enum Step {
    /// A generated kernel; `args` in the kernel's parameter order.
    Launch {
        node: String,
        func: CudaFunction,
        config: LaunchConfig,
        args: Vec<Loc>,
        /// Zeroed before the launch (the launch's private scratch).
        scratch: Vec<(usize, usize)>,
    },
    /// Row-major `y[i] = alpha·op(a[i])·op(b[i]) + beta·y[i]` for each batch offset pair.
    Gemm(Box<Gemm>),
    /// An external op's `compute_cuda` callback, on device pointers and the run's stream.
    Custom {
        node: String,
        op: OpRef,
        attrs: Attrs,
        ins: Vec<Option<Slot>>,
        outs: Vec<Slot>,
    },
    /// A device-to-device copy (a view the plan did not alias, Gemm's C).
    Copy { from: Loc, to: Loc, bytes: usize },
}

struct Gemm {
    node: String,
    a: Loc,
    b: Loc,
    y: Loc,
    m: usize,
    n: usize,
    k: usize,
    trans_a: bool,
    trans_b: bool,
    alpha: f32,
    beta: f32,
    /// Per product: the element offsets of its A and B (Y's are `i·m·n`).
    batches: Vec<(usize, usize)>,
}

/// A lowered graph for one input-shape signature.
pub struct Program {
    steps: Vec<Step>,
    arena_bytes: usize,
    /// Where the scratch region starts in the arena.
    scratch_at: usize,
    inputs: Vec<Slot>,
    outputs: Vec<Slot>,
    /// The constants, uploaded at compile (`Loc::Const` offsets into it).
    consts: Option<CudaSlice<u8>>,
    /// Whether any step calls cuBLAS (a run then needs a handle).
    uses_blas: bool,
}

// SAFETY: the functions and the constant buffer are only read after lowering; the
// driver's handles may be used from any thread once the context is bound.
unsafe impl Send for Program {}
// SAFETY: as for `Send` above.
unsafe impl Sync for Program {}

/// What one run in flight owns: its stream, a cuBLAS handle bound to it, its arena.
struct RunResources {
    stream: Arc<CudaStream>,
    blas: Option<blas_sys::cublasHandle_t>,
    arena: Option<CudaSlice<u8>>,
}

// SAFETY: a set is used by one run at a time (taken from and returned to the pool).
unsafe impl Send for RunResources {}

impl Drop for RunResources {
    fn drop(&mut self) {
        if let Some(h) = self.blas.take() {
            // SAFETY: the handle was created by this set and is not used any more.
            let _ = unsafe { blas::destroy_handle(h) };
        }
    }
}

pub struct CudaExecutable {
    device: String,
    /// The verified, unoptimized graph (specialized per signature, then optimized).
    graph: Graph,
    input_types: Vec<(String, TensorType)>,
    passes: PassOptions,
    kernels: Arc<dyn KernelSource>,
    /// NVRTC's `--gpu-architecture` for this device.
    arch: String,
    ctx: Arc<CudaContext>,
    programs: RwLock<HashMap<Vec<Vec<usize>>, Arc<Program>>>,
    idle: Mutex<Vec<RunResources>>,
}

impl CudaExecutable {
    /// The program for these input shapes, built on first sight.
    fn program(&self, shapes: &[Vec<usize>]) -> Result<Arc<Program>> {
        if let Some(p) = self
            .programs
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(shapes)
        {
            return Ok(p.clone());
        }
        let mut g = self.graph.clone();
        let mut bindings = HashMap::new();
        for (&id, shape) in g.inputs().iter().zip(shapes) {
            for (axis, &size) in g.node(id).outputs[0].shape.axes.iter().zip(shape) {
                if let Dim::Sym(s) = &axis.dim {
                    bindings.insert(s.clone(), size);
                }
            }
        }
        g.specialize(&bindings)?;
        run_pipeline(&mut g, &self.passes)?;
        let program = Arc::new(self.lower(&g)?);
        let mut map = self.programs.write().unwrap_or_else(|e| e.into_inner());
        Ok(map.entry(shapes.to_vec()).or_insert(program).clone())
    }

    /// A generated kernel compiled (NVRTC, cached), loaded, and its launch shape.
    fn load(&self, k: &DeviceKernel) -> Result<(CudaFunction, LaunchConfig)> {
        let ptx = nvrtc::compile_ptx(&k.entry, &k.source, &self.arch, &[])?;
        let module = self
            .ctx
            .load_module(Ptx::from_src(ptx.to_string()))
            .map_err(|e| Error::Compile(format!("kernel {}: loading its PTX: {e}", k.entry)))?;
        let func = module
            .load_function(&k.entry)
            .map_err(|e| Error::Compile(format!("kernel {}: {e}", k.entry)))?;
        let config = LaunchConfig {
            grid_dim: (k.grid[0], k.grid[1], k.grid[2]),
            block_dim: (k.block[0], k.block[1], k.block[2]),
            shared_mem_bytes: k.shared_bytes,
        };
        Ok((func, config))
    }

    fn lower(&self, g: &Graph) -> Result<Program> {
        let schedule = g.schedule()?;
        let plan = memory::plan(g, &schedule)?;
        let align = |n: usize| n.next_multiple_of(memory::ALIGN);
        let mut arena_end = align(plan.planned_bytes);
        let params = g.inputs();
        let mut slots: HashMap<Value, Slot> = HashMap::new();
        let mut const_bytes: Vec<u8> = vec![];
        let mut scratch_bytes = 0usize;
        let mut steps = vec![];
        let mut inputs = vec![None; params.len()];
        let static_type = |id, k| static_output(g, id, k);
        for &id in &schedule {
            let node = g.node(id);
            let what = g.describe(id);
            match node.op.as_str() {
                "Parameter" => {
                    let (dtype, shape) = static_type(id, 0)?;
                    let slot = Slot {
                        loc: Loc::Arena(arena_end),
                        dtype,
                        shape,
                    };
                    arena_end = align(arena_end + slot.bytes());
                    let k = params.iter().position(|&p| p == id).expect("a graph input");
                    inputs[k] = Some(slot.clone());
                    slots.insert(id.out(0), slot);
                }
                "Constant" => {
                    let (dtype, shape) = static_type(id, 0)?;
                    let t = node.data.as_deref().expect("verified");
                    let at = align(const_bytes.len());
                    const_bytes.resize(at, 0);
                    const_bytes.extend(t.to_le_bytes());
                    slots.insert(
                        id.out(0),
                        Slot {
                            loc: Loc::Const(at),
                            dtype,
                            shape,
                        },
                    );
                }
                _ => {
                    let mut outs = vec![];
                    for k in 0..node.outputs.len() {
                        let (dtype, shape) = static_type(id, k)?;
                        let v = id.out(k as u32);
                        let off = plan.offset_of(v).ok_or_else(|| {
                            Error::Graph(format!("{what}: output {k} has no place in the plan"))
                        })?;
                        outs.push(Slot {
                            loc: Loc::Arena(off),
                            dtype,
                            shape,
                        });
                    }
                    let ins: Vec<Option<Slot>> = node
                        .inputs
                        .iter()
                        .map(|v| v.map(|v| slots[&v].clone()))
                        .collect();
                    let mut launch = |k: DeviceKernel, steps: &mut Vec<Step>| -> Result<()> {
                        let (func, config) = self.load(&k)?;
                        let mut args = vec![];
                        let mut scratch = vec![];
                        let mut scratch_at = 0;
                        for p in &k.params {
                            let slot = match *p {
                                DeviceParam::Input(i) => ins.get(i).cloned().flatten(),
                                DeviceParam::Output(i) => outs.get(i).cloned(),
                                DeviceParam::Scratch(bytes) => {
                                    // Placed after the inputs once their end is known.
                                    let off = scratch_at;
                                    scratch_at = align(scratch_at + bytes);
                                    scratch.push((off, bytes));
                                    args.push(Loc::Scratch(off));
                                    continue;
                                }
                            };
                            let slot = slot.ok_or_else(|| {
                                Error::Compile(format!(
                                    "kernel {} of {what}: parameter {p:?} names no buffer of the node",
                                    k.entry
                                ))
                            })?;
                            args.push(slot.loc);
                        }
                        scratch_bytes = scratch_bytes.max(scratch_at);
                        steps.push(Step::Launch {
                            node: what.clone(),
                            func,
                            config,
                            args,
                            scratch,
                        });
                        Ok(())
                    };
                    match node.op.as_str() {
                        "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" | "Identity" => {
                            let from = ins[0]
                                .clone()
                                .ok_or_else(|| Error::Graph(format!("{what}: missing input 0")))?;
                            if from.loc != outs[0].loc {
                                steps.push(Step::Copy {
                                    from: from.loc,
                                    to: outs[0].loc,
                                    bytes: outs[0].bytes(),
                                });
                            }
                        }
                        "MatMul" | "Gemm" | "FusedMatMul" => {
                            let gemm = gemm_step(g, id, &ins, &outs[0]).map_err(|e| {
                                Error::Compile(format!("{}: {what}: {e}", self.device))
                            })?;
                            if let (Some(c), "Gemm") =
                                (ins.get(2).cloned().flatten(), node.op.as_str())
                            {
                                // Gemm's C of Y's shape: copied into Y, then beta·Y is added.
                                if c.loc != outs[0].loc {
                                    steps.push(Step::Copy {
                                        from: c.loc,
                                        to: outs[0].loc,
                                        bytes: outs[0].bytes(),
                                    });
                                }
                            }
                            steps.push(Step::Gemm(Box::new(gemm)));
                            if node.op == "FusedMatMul" {
                                match self.kernels.epilogue_kernel(g, id)? {
                                    Some(k) => launch(k, &mut steps)?,
                                    // Without it the bias / Z / activation would be lost.
                                    None if has_epilogue(g, id) => {
                                        return Err(Error::Compile(format!(
                                            "{}: no CUDA epilogue kernel for the FusedMatMul at node {what}",
                                            self.device
                                        )))
                                    }
                                    None => {}
                                }
                            }
                        }
                        op if op.contains("::") => {
                            let ext = g.op_impl(op).filter(|o| o.has_cuda_kernel()).ok_or_else(|| {
                                Error::Compile(format!(
                                    "{}: external op {op} at node {what} has no compute_cuda callback (no CUDA kernel)",
                                    self.device
                                ))
                            })?;
                            steps.push(Step::Custom {
                                node: what.clone(),
                                op: ext,
                                attrs: node.attrs.clone(),
                                ins: ins.clone(),
                                outs: outs.clone(),
                            });
                        }
                        op => match self.kernels.kernel_for_node(g, id)? {
                            Some(k) => launch(k, &mut steps)?,
                            None => {
                                return Err(Error::Compile(format!(
                                    "{}: no CUDA kernel for op {op} at node {what}",
                                    self.device
                                )))
                            }
                        },
                    }
                    for (k, s) in outs.into_iter().enumerate() {
                        slots.insert(id.out(k as u32), s);
                    }
                }
            }
        }
        // Scratch lives after the inputs.
        let scratch_at = arena_end;
        let outputs = g
            .outputs()
            .iter()
            .map(|o| slots[&o.value].clone())
            .collect();
        let uses_blas = steps.iter().any(|s| matches!(s, Step::Gemm(_)));
        if uses_blas {
            // SAFETY: only tries to dlopen cuBLAS's library names.
            if !unsafe { blas_sys::is_culib_present() } {
                return Err(Error::Device(format!(
                    "{}: cuBLAS not found (libcublas.so.12 is not on the loader's path)",
                    self.device
                )));
            }
        }
        let consts = if const_bytes.is_empty() {
            None
        } else {
            let stream = self.ctx.default_stream();
            let buf = stream
                .clone_htod(&const_bytes)
                .map_err(|e| dev_err(&self.device, "uploading the constants", e))?;
            stream
                .synchronize()
                .map_err(|e| dev_err(&self.device, "uploading the constants", e))?;
            Some(buf)
        };
        Ok(Program {
            steps,
            arena_bytes: scratch_at + scratch_bytes,
            scratch_at,
            inputs: inputs
                .into_iter()
                .map(|s| s.expect("every input scheduled"))
                .collect(),
            outputs,
            consts,
            uses_blas,
        })
    }

    /// A free run set, or a new one (a new stream forked from the context).
    fn take_resources(&self, p: &Program) -> Result<RunResources> {
        let free = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut r = match free {
            Some(r) => r,
            None => RunResources {
                stream: self
                    .ctx
                    .new_stream()
                    .map_err(|e| dev_err(&self.device, "creating a stream", e))?,
                blas: None,
                arena: None,
            },
        };
        if p.uses_blas && r.blas.is_none() {
            let h = probe::no_panic("cuBLAS", blas::create_handle)
                .map_err(|e| Error::Device(format!("{}: {e}", self.device)))?
                .map_err(|e| dev_err(&self.device, "creating a cuBLAS handle", e))?;
            // SAFETY: a live handle and this set's live stream.
            unsafe { blas::set_stream(h, r.stream.cu_stream() as _) }
                .map_err(|e| dev_err(&self.device, "cuBLAS stream", e))?;
            r.blas = Some(h);
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
                        op.compute_cuda_buffers(&ins, &outs, attrs, cu_stream as *mut c_void)
                    })
                    .map_err(|e| Error::Runtime(format!("{node}: {e}")))?;
                }
                Step::Copy { from, to, bytes } => {
                    // SAFETY: both ranges lie in device buffers of the program.
                    unsafe { drv::memcpy_dtod_async(ptr(*to), ptr(*from), *bytes, cu_stream) }
                        .map_err(|e| err("a device copy", &e))?;
                }
                Step::Gemm(gm) => {
                    let h = r.blas.expect("a handle for a program with GEMMs");
                    // SAFETY: the operands lie in device buffers sized by the plan.
                    unsafe { run_gemm(h, gm, ptr(gm.a), ptr(gm.b), ptr(gm.y)) }
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

/// The cuBLAS products of one GEMM step (row-major through column-major: the row-major
/// `Y (m×n) = op(A)·op(B)` is the column-major `Yᵀ (n×m) = op(B)ᵀ·op(A)ᵀ`, and a
/// row-major matrix is its transpose in column-major, so B goes first, untransposed
/// when it was not transposed, and the leading dimensions are the row lengths).
///
/// # Safety
/// `a`, `b`, `y` are device pointers to the step's operands; `h` a live handle.
unsafe fn run_gemm(
    h: blas_sys::cublasHandle_t,
    g: &Gemm,
    a: u64,
    b: u64,
    y: u64,
) -> std::result::Result<(), blas::CublasError> {
    use blas_sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
    let (m, n, k) = (g.m as i32, g.n as i32, g.k as i32);
    let (op_b, ldb) = if g.trans_b {
        (CUBLAS_OP_T, k)
    } else {
        (CUBLAS_OP_N, n)
    };
    let (op_a, lda) = if g.trans_a {
        (CUBLAS_OP_T, m)
    } else {
        (CUBLAS_OP_N, k)
    };
    let f = |p: u64, elems: usize| (p + 4 * elems as u64) as *const f32;
    let (alpha, beta) = (&g.alpha as *const f32, &g.beta as *const f32);
    // Evenly strided batches (the usual case): one strided-batched call.
    let stride = |i: usize| {
        (
            g.batches[i].0 as i64 - g.batches[0].0 as i64,
            g.batches[i].1 as i64 - g.batches[0].1 as i64,
        )
    };
    let even = g.batches.len() > 1 && {
        let (sa, sb) = stride(1);
        sa >= 0
            && sb >= 0
            && (1..g.batches.len()).all(|i| stride(i) == (sa * i as i64, sb * i as i64))
    };
    if even {
        let (sa, sb) = stride(1);
        let (oa, ob) = g.batches[0];
        // SAFETY: the device pointers cover every batch's operands (this fn's contract),
        // the strides and leading dimensions are the step's geometry.
        return unsafe {
            blas::sgemm_strided_batched(
                h,
                op_b,
                op_a,
                n,
                m,
                k,
                alpha,
                f(b, ob),
                ldb,
                sb,
                f(a, oa),
                lda,
                sa,
                beta,
                f(y, 0) as *mut f32,
                n,
                (g.m * g.n) as i64,
                g.batches.len() as i32,
            )
        };
    }
    for (i, &(oa, ob)) in g.batches.iter().enumerate() {
        // SAFETY: as above, for batch i's operands and output.
        unsafe {
            blas::sgemm(
                h,
                op_b,
                op_a,
                n,
                m,
                k,
                alpha,
                f(b, ob),
                ldb,
                f(a, oa),
                lda,
                beta,
                f(y, i * g.m * g.n) as *mut f32,
                n,
            )
        }?;
    }
    Ok(())
}

/// The GEMM of a `MatMul`, `Gemm` or `FusedMatMul` node (f32; batched and broadcast
/// like numpy's matmul; vectors as one-row / one-column matrices).
fn gemm_step(
    g: &Graph,
    id: NodeId,
    ins: &[Option<Slot>],
    y: &Slot,
) -> std::result::Result<Gemm, String> {
    let node = g.node(id);
    let attrs = &node.attrs;
    let (a, b) = match (
        ins.first().cloned().flatten(),
        ins.get(1).cloned().flatten(),
    ) {
        (Some(a), Some(b)) => (a, b),
        _ => return Err("missing A or B".into()),
    };
    if [a.dtype, b.dtype, y.dtype].iter().any(|&d| d != DType::F32) {
        return Err(format!(
            "cuBLAS GEMMs are f32 only here (A is {}, B is {})",
            a.dtype, b.dtype
        ));
    }
    let trans_a = attrs.int_or("transA", 0)? != 0;
    let trans_b = attrs.int_or("transB", 0)? != 0;
    let Geometry { m, n, k, batches } = geometry(
        &a.shape,
        &b.shape,
        y.shape.iter().product(),
        trans_a,
        trans_b,
    )?;
    let (mut alpha, mut beta) = (1.0, 0.0);
    if node.op == "Gemm" {
        alpha = attrs.float_or("alpha", 1.0)? as f32;
        if let Some(c) = ins.get(2).cloned().flatten() {
            if c.shape != y.shape {
                return Err(format!(
                    "a Gemm C of shape {:?} broadcast to Y {:?} (the fuse-epilogue pass makes it a FusedMatMul bias)",
                    c.shape, y.shape
                ));
            }
            beta = attrs.float_or("beta", 1.0)? as f32;
        }
    }
    Ok(Gemm {
        node: g.describe(id),
        a: a.loc,
        b: b.loc,
        y: y.loc,
        m,
        n,
        k,
        trans_a,
        trans_b,
        alpha,
        beta,
        batches,
    })
}

/// Whether a `FusedMatMul` adds anything after its product (bias, Z, activation).
fn has_epilogue(g: &Graph, id: NodeId) -> bool {
    let node = g.node(id);
    let activation = node.attrs.string_or("activation", "none").unwrap_or("?");
    node.inputs.iter().skip(2).any(Option::is_some) || !activation.eq_ignore_ascii_case("none")
}

impl Executable for CudaExecutable {
    fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        interp::check_input_types(&self.input_types, inputs)?;
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
