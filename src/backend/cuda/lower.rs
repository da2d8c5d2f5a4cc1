//! Lowering: a specialized, optimized graph (every type static) to a CUDA [`Program`].
//!
//! The memory plan is laid onto one device arena: the plan's values, then the graph
//! inputs, then the largest scratch any launch asks for. Constants go into one buffer,
//! uploaded once. Each node becomes steps through one builder per kind, as the CPU
//! backend's `steps` families do: views the plan aliased do nothing (else a device
//! copy); `MatMul`/`Gemm`/`FusedMatMul` run cuBLAS followed by the generator's epilogue
//! kernel; an external op runs its `compute_cuda` callback; everything else is the
//! kernel source's kernel, compiled by NVRTC and loaded once. An op with no kernel is a
//! compile error naming the op and the node.
use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, LaunchConfig};
use cudarc::nvrtc::Ptx;

use super::blas::{self, gemm_step};
use super::kernels::{DeviceKernel, DeviceParam, KernelSource};
use super::nvrtc;
use super::program::{Loc, Program, Slot, Step};
use crate::backend::specialize::static_output;
use crate::error::{Error, Result};
use crate::ir::{Graph, NodeId, Value};
use crate::memory::{self, MemoryPlan};

/// The device a program is lowered for.
pub(crate) struct Target<'a> {
    /// `cuda:N`, for errors.
    pub(crate) device: &'a str,
    /// Where kernels are loaded and constants uploaded.
    pub(crate) ctx: &'a Arc<CudaContext>,
    /// NVRTC's `--gpu-architecture` for this device.
    pub(crate) arch: &'a str,
    pub(crate) kernels: &'a dyn KernelSource,
}

fn align(n: usize) -> usize {
    n.next_multiple_of(memory::ALIGN)
}

/// Lowers `g`, whose types must all be static, for `target`.
pub(crate) fn lower(target: &Target, g: &Graph) -> Result<Program> {
    let schedule = g.schedule()?;
    let plan = memory::plan(g, &schedule)?;
    let mut l = Lowering {
        target,
        g,
        arena_end: align(plan.planned_bytes),
        plan,
        params: g.inputs(),
        inputs: vec![None; g.inputs().len()],
        slots: HashMap::new(),
        const_bytes: vec![],
        scratch_bytes: 0,
        steps: vec![],
    };
    for &id in &schedule {
        match g.node(id).op.as_str() {
            "Parameter" => l.parameter(id)?,
            "Constant" => l.constant(id)?,
            _ => l.operation(id)?,
        }
    }
    l.finish()
}

/// The state of one lowering: where values are, and the steps so far.
struct Lowering<'a> {
    target: &'a Target<'a>,
    g: &'a Graph,
    plan: MemoryPlan,
    /// The end of the arena so far: the plan's values, then the inputs placed yet.
    arena_end: usize,
    params: Vec<NodeId>,
    inputs: Vec<Option<Slot>>,
    slots: HashMap<Value, Slot>,
    const_bytes: Vec<u8>,
    /// The largest scratch a launch asks for (placed after the inputs).
    scratch_bytes: usize,
    steps: Vec<Step>,
}

/// What an operation's builders see of its node.
struct Operands {
    id: NodeId,
    /// The node, described for errors.
    what: String,
    ins: Vec<Option<Slot>>,
    outs: Vec<Slot>,
}

impl Lowering<'_> {
    /// A graph input: placed in the arena after the plan's values.
    fn parameter(&mut self, id: NodeId) -> Result<()> {
        let (dtype, shape) = static_output(self.g, id, 0)?;
        let slot = Slot {
            loc: Loc::Arena(self.arena_end),
            dtype,
            shape,
        };
        self.arena_end = align(self.arena_end + slot.bytes());
        let k = self
            .params
            .iter()
            .position(|&p| p == id)
            .expect("a graph input");
        self.inputs[k] = Some(slot.clone());
        self.slots.insert(id.out(0), slot);
        Ok(())
    }

    /// A constant: appended to the constant buffer.
    fn constant(&mut self, id: NodeId) -> Result<()> {
        let (dtype, shape) = static_output(self.g, id, 0)?;
        let t = self.g.node(id).data.as_deref().expect("verified");
        let at = align(self.const_bytes.len());
        self.const_bytes.resize(at, 0);
        self.const_bytes.extend(t.to_le_bytes());
        self.slots.insert(
            id.out(0),
            Slot {
                loc: Loc::Const(at),
                dtype,
                shape,
            },
        );
        Ok(())
    }

    /// Any other node: its outputs where the plan put them, then its op's builder.
    fn operation(&mut self, id: NodeId) -> Result<()> {
        let node = self.g.node(id);
        let what = self.g.describe(id);
        let mut outs = vec![];
        for k in 0..node.outputs.len() {
            let (dtype, shape) = static_output(self.g, id, k)?;
            let off = self.plan.offset_of(id.out(k as u32)).ok_or_else(|| {
                Error::Graph(format!("{what}: output {k} has no place in the plan"))
            })?;
            outs.push(Slot {
                loc: Loc::Arena(off),
                dtype,
                shape,
            });
        }
        let ins = node
            .inputs
            .iter()
            .map(|v| v.map(|v| self.slots[&v].clone()))
            .collect();
        let ops = Operands {
            id,
            what,
            ins,
            outs,
        };
        match node.op.as_str() {
            "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" | "Identity" => self.view(&ops)?,
            "MatMul" | "Gemm" | "FusedMatMul" => self.matmul(&ops)?,
            op if op.contains("::") => self.external(&ops)?,
            _ => self.generated(&ops)?,
        }
        for (k, s) in ops.outs.into_iter().enumerate() {
            self.slots.insert(id.out(k as u32), s);
        }
        Ok(())
    }

    /// A view: nothing when the plan aliased it to its input, else a device copy.
    fn view(&mut self, ops: &Operands) -> Result<()> {
        let from = ops.ins[0]
            .clone()
            .ok_or_else(|| Error::Graph(format!("{}: missing input 0", ops.what)))?;
        self.copy(from.loc, &ops.outs[0]);
        Ok(())
    }

    /// A copy of `to`'s bytes from `from` into `to`, unless they are one place.
    fn copy(&mut self, from: Loc, to: &Slot) {
        if from != to.loc {
            self.steps.push(Step::Copy {
                from,
                to: to.loc,
                bytes: to.bytes(),
            });
        }
    }

    /// A matrix product: cuBLAS, then (`FusedMatMul`) the epilogue kernel.
    fn matmul(&mut self, ops: &Operands) -> Result<()> {
        let device = self.target.device;
        let op = self.g.node(ops.id).op.as_str();
        let gemm = gemm_step(self.g, ops.id, &ops.ins, &ops.outs[0])
            .map_err(|e| Error::Compile(format!("{device}: {}: {e}", ops.what)))?;
        if let (Some(c), "Gemm") = (ops.ins.get(2).cloned().flatten(), op) {
            // Gemm's C of Y's shape: copied into Y, then beta·Y is added.
            self.copy(c.loc, &ops.outs[0]);
        }
        self.steps.push(Step::Gemm(Box::new(gemm)));
        if op == "FusedMatMul" {
            match self.target.kernels.epilogue_kernel(self.g, ops.id)? {
                Some(k) => self.launch(k, ops)?,
                // Without it the bias / Z / activation would be lost.
                None if has_epilogue(self.g, ops.id) => {
                    return Err(Error::Compile(format!(
                        "{device}: no CUDA epilogue kernel for the FusedMatMul at node {}",
                        ops.what
                    )))
                }
                None => {}
            }
        }
        Ok(())
    }

    /// An external op: its `compute_cuda` callback.
    fn external(&mut self, ops: &Operands) -> Result<()> {
        let op = self.g.node(ops.id).op.as_str();
        let ext = self.g.op_impl(op);
        let kernel = ext
            .as_ref()
            .and_then(|o| crate::backend::registered::Kernels::of(&**o)?.cuda.clone());
        let (Some(ext), Some(kernel)) = (ext, kernel) else {
            return Err(Error::Compile(format!(
                "{}: external op {op} at node {} has no compute_cuda callback (no CUDA kernel)",
                self.target.device, ops.what
            )));
        };
        self.steps.push(Step::Custom {
            node: ops.what.clone(),
            op: ext,
            kernel,
            attrs: self.g.node(ops.id).attrs.clone(),
            ins: ops.ins.clone(),
            outs: ops.outs.clone(),
        });
        Ok(())
    }

    /// Any other op: the kernel source's kernel for the node.
    fn generated(&mut self, ops: &Operands) -> Result<()> {
        match self.target.kernels.kernel_for_node(self.g, ops.id)? {
            Some(k) => self.launch(k, ops),
            None => Err(Error::Compile(format!(
                "{}: no CUDA kernel for op {} at node {}",
                self.target.device,
                self.g.node(ops.id).op,
                ops.what
            ))),
        }
    }

    /// A launch of kernel `k` over the node's buffers and its private scratch.
    fn launch(&mut self, k: DeviceKernel, ops: &Operands) -> Result<()> {
        let (func, config) = load(self.target, &k)?;
        let mut args = vec![];
        let mut scratch = vec![];
        let mut scratch_at = 0;
        for p in &k.params {
            let slot = match *p {
                DeviceParam::Input(i) => ops.ins.get(i).cloned().flatten(),
                DeviceParam::Output(i) => ops.outs.get(i).cloned(),
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
                    "kernel {} of {}: parameter {p:?} names no buffer of the node",
                    k.entry, ops.what
                ))
            })?;
            args.push(slot.loc);
        }
        self.scratch_bytes = self.scratch_bytes.max(scratch_at);
        self.steps.push(Step::Launch {
            node: ops.what.clone(),
            func,
            config,
            args,
            scratch,
        });
        Ok(())
    }

    /// The program: scratch after the inputs, the constants uploaded.
    fn finish(self) -> Result<Program> {
        let device = self.target.device;
        let scratch_at = self.arena_end;
        let outputs = self
            .g
            .outputs()
            .iter()
            .map(|o| self.slots[&o.value].clone())
            .collect();
        let uses_blas = self.steps.iter().any(|s| matches!(s, Step::Gemm(_)));
        if uses_blas {
            blas::check_present(device)?;
        }
        let upload_error = |e: &dyn std::fmt::Display| {
            Error::Runtime(format!("{device}: uploading the constants: {e}"))
        };
        let consts = if self.const_bytes.is_empty() {
            None
        } else {
            let stream = self.target.ctx.default_stream();
            let buf = stream
                .clone_htod(&self.const_bytes)
                .map_err(|e| upload_error(&e))?;
            stream.synchronize().map_err(|e| upload_error(&e))?;
            Some(buf)
        };
        Ok(Program {
            steps: self.steps,
            arena_bytes: scratch_at + self.scratch_bytes,
            scratch_at,
            inputs: self
                .inputs
                .into_iter()
                .map(|s| s.expect("every input scheduled"))
                .collect(),
            outputs,
            consts,
            uses_blas,
        })
    }
}

/// A generated kernel compiled (NVRTC, cached), loaded, and its launch shape.
fn load(target: &Target, k: &DeviceKernel) -> Result<(CudaFunction, LaunchConfig)> {
    let ptx = nvrtc::compile_ptx(&k.entry, &k.source, target.arch, &[])?;
    let module = target
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

/// Whether a `FusedMatMul` adds anything after its product (bias, Z, activation).
fn has_epilogue(g: &Graph, id: NodeId) -> bool {
    let node = g.node(id);
    let activation = node.attrs.string_or("activation", "none").unwrap_or("?");
    node.inputs.iter().skip(2).any(Option::is_some) || !activation.eq_ignore_ascii_case("none")
}
