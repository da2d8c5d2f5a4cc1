//! CUDA C generated from the optimized, shape-specialized IR (issue 9): one kernel per
//! node for elementwise ops and `Fused` chains (with broadcasting and exported steps),
//! reductions, Softmax/LogSoftmax, LayerNormalization, global pools, 1-D/2-D
//! MaxPool/AveragePool, 1-D/2-D Conv and
//! FusedConv as implicit GEMMs (epilogue fused), and the epilogue (bias, residual,
//! activation) of FusedMatMul, whose GEMM cuBLAS does.
//!
//! The source is self-contained (NVRTC's built-in math functions, no headers), and
//! deterministic: the same graph gives byte-identical source, since it is cached by
//! hash. Shapes are constants in the code. Every elementwise op is written by one table
//! (`cexpr`), whichever kernel it lands in.
//!
//! What is covered and how other cases answer:
//! - f32 arithmetic; bool, i32 and i64 only where an op moves or compares them (Where's
//!   condition, comparisons' results, logic, Cast among f32/i32/i64/bool). A covered op
//!   on another dtype (f16, f64, integer arithmetic) is an `Err` naming the node.
//! - Ops the generator does not cover (GEMMs, convolutions, data movement, ...) answer
//!   `Ok(None)`: the caller uses cuBLAS, a view, or reports the op as unsupported.
//!
//! [`emulation`] compiles the same source for the host with g++, so the kernels'
//! arithmetic is tested against the reference interpreter without a GPU.
use std::fmt::Write;

use crate::error::{Error, Result};
use crate::ir::{DType, Graph, NodeId, TensorType};

pub mod cexpr;
mod conv;
mod eltwise;
pub mod emulation;
mod epilogue;
pub mod index;
mod layout;
mod pool;
mod reduce;
pub mod samples;

use cexpr::Ty;
use eltwise::{EltArg, EltInput, EltProgram, EltStep};

/// One generated CUDA C kernel for one node of an optimized, shape-specialized graph.
#[derive(Debug, Clone, PartialEq)]
pub struct GeneratedKernel {
    /// The `extern "C" __global__` function's name: a C identifier, unique within a
    /// graph and deterministic (`k12_fused`).
    pub entry: String,
    /// Complete CUDA C source: it needs no header but what NVRTC provides.
    pub source: String,
    /// Launch shape, fixed at generation (shapes are specialized).
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Dynamic shared memory in bytes (the generated kernels use static shared memory
    /// only, so this is 0 today).
    pub shared_bytes: u32,
    /// The kernel's parameters in order. Every buffer is a pointer to the tensor's
    /// first element, dense row-major, of the dtype's C type (`float`, `unsigned char`
    /// for bool, `int`, `long long`), and 16-byte aligned: elementwise kernels load
    /// float4 when the sizes allow. Buffers may alias only as the memory planner's
    /// in-place rules allow (an elementwise, Fused, softmax or layernorm output over a
    /// same-shaped input, FusedConv's output over Z): every kernel reads such an element
    /// before it writes it, in the same thread.
    pub params: Vec<KernelParam>,
}

/// A kernel parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelParam {
    /// The node's input `i` (its `Value` is `graph.node(n).inputs[i]`).
    Input(usize),
    /// The node's output `i`.
    Output(usize),
    /// Device scratch of this many bytes, private to the launch, contents undefined
    /// (no generated kernel asks for scratch today).
    Scratch(usize),
}

/// Builds a kernel's source text.
pub(crate) struct Source {
    pub text: String,
}

impl Source {
    pub(crate) fn new(entry: &str) -> Source {
        Source {
            text: format!("/* Kiln generated kernel {entry} */\n"),
        }
    }

    pub(crate) fn line(&mut self, l: &str) {
        let _ = writeln!(self.text, "{l}");
    }
}

/// The error for node `id` that the generator covers but not as it is.
fn unsupported(graph: &Graph, id: NodeId, why: &str) -> Error {
    Error::Graph(format!(
        "{}: the CUDA kernel generator cannot compile it: {why}",
        graph.describe(id)
    ))
}

/// A deterministic entry name: the node's index and op.
fn entry_name(id: NodeId, op: &str, suffix: &str) -> String {
    let op: String = op
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_lowercase())
        .collect();
    format!("k{}_{op}{suffix}", id.0)
}

/// A value's fixed dims, or why not.
fn fixed(t: &TensorType) -> std::result::Result<Vec<usize>, String> {
    t.shape
        .to_fixed()
        .ok_or_else(|| format!("{t} has symbolic dims: specialize the graph first"))
}

fn ty_of(dtype: DType, what: &str) -> std::result::Result<Ty, String> {
    Ty::of(dtype).ok_or_else(|| {
        format!("{what} is {dtype}; the CUDA generator supports f32 (and bool/i32/i64 data)")
    })
}

/// Reductions and the global pools, whose kernels `reduce` writes.
const REDUCTIONS: &[&str] = &[
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceSumSquare",
    "GlobalAveragePool",
    "GlobalMaxPool",
];

/// The kernel for node `node` of `graph` (optimized + specialized: all dims fixed), or
/// Ok(None) if the generator does not cover this op. Err for a covered op with
/// something unsupported (a dtype, a symbolic dim), naming the node.
pub fn kernel_for_node(graph: &Graph, node: NodeId) -> Result<Option<GeneratedKernel>> {
    let n = graph.node(node);
    let entry = entry_name(node, &n.op, "");
    let fail = |e: String| unsupported(graph, node, &e);
    let op = n.op.as_str();
    let kernel = if op == "Fused" {
        Some(fused_kernel(graph, node, &entry).map_err(fail)?)
    } else if REDUCTIONS.contains(&op) {
        Some(reduce::reduction(graph, node, &entry).map_err(fail)?)
    } else if op == "Softmax" || op == "LogSoftmax" {
        Some(reduce::softmax(graph, node, &entry).map_err(fail)?)
    } else if op == "Conv" || op == "FusedConv" {
        conv::conv(graph, node, &entry).map_err(fail)?
    } else if op == "MaxPool" || op == "AveragePool" {
        pool::pool(graph, node, &entry).map_err(fail)?
    } else if op == "Transpose" {
        Some(layout::transpose(graph, node, &entry).map_err(fail)?)
    } else if op == "LayerNormalization" {
        Some(reduce::layer_norm(graph, node, &entry).map_err(fail)?)
    } else if matches!(
        op,
        "Parameter" | "Constant" | "Variable" | "Assign" | "FusedMatMul"
    ) {
        None
    } else if cexpr::covers(op) {
        Some(plain_kernel(graph, node, &entry).map_err(fail)?)
    } else {
        None
    };
    Ok(kernel)
}

/// The inputs of node `id` as program operands (omitted ones as `None`).
fn node_inputs(graph: &Graph, id: NodeId) -> std::result::Result<Vec<Option<EltInput>>, String> {
    let n = graph.node(id);
    n.inputs
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.map(|v| -> std::result::Result<EltInput, String> {
                let t = graph.value_type(v).map_err(|e| e.to_string())?;
                Ok(EltInput {
                    param: KernelParam::Input(i),
                    ty: ty_of(t.dtype, &format!("input {i}"))?,
                    shape: fixed(t).map_err(|e| format!("input {i}: {e}"))?,
                })
            })
            .transpose()
        })
        .collect()
}

/// A program's inputs with omitted ones replaced by placeholders no step reads.
fn dense_inputs(ins: Vec<Option<EltInput>>) -> Vec<EltInput> {
    ins.into_iter()
        .enumerate()
        .map(|(i, v)| {
            v.unwrap_or(EltInput {
                param: KernelParam::Input(i),
                ty: Ty::F32,
                shape: vec![],
            })
        })
        .collect()
}

/// The output shape every output of node `id` must share.
fn common_output_shape(graph: &Graph, id: NodeId) -> std::result::Result<Vec<usize>, String> {
    let n = graph.node(id);
    let shape = fixed(&n.outputs[0]).map_err(|e| format!("output 0: {e}"))?;
    for (i, t) in n.outputs.iter().enumerate().skip(1) {
        if fixed(t).map_err(|e| format!("output {i}: {e}"))? != shape {
            return Err(format!(
                "output {i} ({t}) is not of output 0's shape ({})",
                n.outputs[0]
            ));
        }
    }
    Ok(shape)
}

fn plain_kernel(
    graph: &Graph,
    id: NodeId,
    entry: &str,
) -> std::result::Result<GeneratedKernel, String> {
    let n = graph.node(id);
    let ins = node_inputs(graph, id)?;
    let args = ins
        .iter()
        .enumerate()
        .map(|(i, v)| v.as_ref().map(|_| EltArg::Input(i)))
        .collect();
    let shape = common_output_shape(graph, id)?;
    if n.outputs.len() != 1 {
        return Err(format!("{} outputs, expected 1", n.outputs.len()));
    }
    let prog = EltProgram {
        inputs: dense_inputs(ins),
        steps: vec![EltStep {
            op: n.op.clone(),
            attrs: n.attrs.clone(),
            args,
        }],
        outputs: vec![(KernelParam::Output(0), 0)],
        shape,
        expect: output_tys(graph, id)?,
    };
    eltwise::generate(entry, &prog)
}

fn fused_kernel(
    graph: &Graph,
    id: NodeId,
    entry: &str,
) -> std::result::Result<GeneratedKernel, String> {
    use crate::ir::ops::fused::{body, exported_steps, Arg};
    let n = graph.node(id);
    let ins = node_inputs(graph, id)?;
    let steps = body(&n.attrs, ins.len())?;
    let exported = exported_steps(&n.attrs, steps.len())?;
    let shape = common_output_shape(graph, id)?;
    let steps: Vec<EltStep> = steps
        .into_iter()
        .map(|s| EltStep {
            op: s.op,
            attrs: s.attrs,
            args: s
                .args
                .into_iter()
                .map(|a| {
                    a.map(|a| match a {
                        Arg::Input(k) => EltArg::Input(k),
                        Arg::Step(k) => EltArg::Step(k),
                    })
                })
                .collect(),
        })
        .collect();
    let mut outputs = vec![(KernelParam::Output(0), steps.len() - 1)];
    outputs.extend(
        exported
            .iter()
            .enumerate()
            .map(|(o, &s)| (KernelParam::Output(o + 1), s)),
    );
    let prog = EltProgram {
        inputs: dense_inputs(ins),
        steps,
        outputs,
        shape,
        expect: output_tys(graph, id)?,
    };
    eltwise::generate(entry, &prog)
}

/// The node's output dtypes, which the program's outputs must have (the table and the
/// catalogue agree on what each op gives).
fn output_tys(graph: &Graph, id: NodeId) -> std::result::Result<Vec<Ty>, String> {
    let n = graph.node(id);
    n.outputs
        .iter()
        .enumerate()
        .map(|(o, t)| ty_of(t.dtype, &format!("output {o}")))
        .collect()
}

/// The epilogue (bias, residual, activation) of a FusedMatMul/FusedConv as an in-place
/// kernel over the GEMM's output: params = [Output(0) (read-modify-write), then the
/// bias / residual inputs as Input(i)]. Ok(None) when the node has no epilogue or is not
/// one of those ops.
pub(crate) fn epilogue_kernel(graph: &Graph, node: NodeId) -> Result<Option<GeneratedKernel>> {
    epilogue::epilogue(
        graph,
        node,
        &entry_name(node, &graph.node(node).op, "_epilogue"),
    )
    .map_err(|e| unsupported(graph, node, &e))
}

/// Every kernel the generator emits for a graph, in schedule order: per node its
/// [`kernel_for_node`], or when there is none its [`epilogue_kernel`] (a FusedMatMul's,
/// whose product cuBLAS computes).
pub fn kernels_for_graph(graph: &Graph) -> Result<Vec<(NodeId, GeneratedKernel)>> {
    let mut out = vec![];
    for id in graph.schedule()? {
        if let Some(k) = kernel_for_node(graph, id)? {
            out.push((id, k));
        } else if let Some(k) = epilogue_kernel(graph, id)? {
            out.push((id, k));
        }
    }
    Ok(out)
}

/// Every kernel template instantiated once on small representative shapes (for the
/// NVRTC/ptxas check of templates the test graphs might not reach).
pub fn template_samples() -> Vec<GeneratedKernel> {
    samples::all()
}
