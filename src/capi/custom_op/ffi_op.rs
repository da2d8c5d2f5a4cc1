//! [`FfiOp`]: the [`Op`] behind a registration, whose `infer`, `eval` and `gradient` call
//! the user's callbacks, and the [`FfiCore`] it shares with the backends' kernels.
use std::ffi::{c_void, CString};
use std::sync::Arc;

use super::kernel_context::{zeroed_buf, Outputs, View};
use super::{kiln_attrs, kiln_custom_cuda_compute_fn, kiln_custom_destroy_fn};
use super::{kiln_custom_gradient_fn, kiln_gradient_context, kiln_infer_context};
use super::{kiln_kernel_context, KILN_CUSTOM_OP_MAY_RUN_IN_PLACE, KILN_CUSTOM_OP_PURE};
use crate::backend::registered::{BufferKernel, CudaKernel, Kernels, RawTensor};
use crate::capi::graph::kiln_graph;
use crate::capi::{kiln_status, status_name, KILN_STATUS_OK};
use crate::ir::ops::{EvalCtx, InferCtx, Op, OpSchema};
use crate::ir::{Attrs, Dim, Graph, NodeId, Shape, TensorType, Value};
use crate::tensor::Tensor;

/// The op behind a registration: its callbacks, shared with the kernels it hands the
/// backends (`Kernels`), so that the registration's destructor runs after the last.
pub(super) struct FfiOp {
    pub(super) core: Arc<FfiCore>,
    pub(super) kernels: Kernels,
}

impl std::ops::Deref for FfiOp {
    type Target = FfiCore;
    fn deref(&self) -> &FfiCore {
        &self.core
    }
}

impl FfiOp {
    pub(super) fn new(core: FfiCore) -> FfiOp {
        let core = Arc::new(core);
        let cuda = core.compute_cuda.is_some();
        let kernels = Kernels {
            buffers: Some(core.clone()),
            cuda: cuda.then(|| core.clone() as Arc<dyn CudaKernel>),
        };
        FfiOp { core, kernels }
    }
}

/// A registration's callbacks and the user data they take.
pub(super) struct FfiCore {
    pub(super) schema: OpSchema,
    pub(super) num_outputs: usize,
    pub(super) flags: u32,
    pub(super) infer: unsafe extern "C" fn(*mut kiln_infer_context, *mut c_void) -> kiln_status,
    pub(super) compute: unsafe extern "C" fn(*mut kiln_kernel_context, *mut c_void) -> kiln_status,
    pub(super) compute_cuda: kiln_custom_cuda_compute_fn,
    pub(super) gradient: kiln_custom_gradient_fn,
    pub(super) user_data: *mut c_void,
    pub(super) destroy: kiln_custom_destroy_fn,
}

// SAFETY: the header requires the callbacks (and what they do with `user_data`) to be
// callable from any thread, concurrently.
unsafe impl Send for FfiCore {}
// SAFETY: shared, the core is read only (schema, flags, function pointers), and the
// header requires the callbacks to accept concurrent calls with the same `user_data`.
unsafe impl Sync for FfiCore {}

impl Drop for FfiCore {
    fn drop(&mut self) {
        if let Some(destroy) = self.destroy {
            // SAFETY: the registration's destructor, called once with its user_data.
            unsafe { destroy(self.user_data) }
        }
    }
}

/// The failure a callback reported: its status's name and the message it set.
fn callback_failure(what: &str, status: kiln_status, message: Option<String>) -> String {
    let name = status_name(status);
    match message {
        Some(m) => format!("{what} failed ({name}): {m}"),
        None => format!("{what} failed ({name}) without a message"),
    }
}

impl Op for FfiOp {
    fn schema(&self) -> &OpSchema {
        &self.schema
    }

    fn validate_attrs(&self, _attrs: &Attrs) -> Result<(), String> {
        // Any attribute: the op's infer callback reads (and checks) what it needs.
        Ok(())
    }

    fn pure(&self) -> bool {
        self.flags & KILN_CUSTOM_OP_PURE != 0
    }

    fn may_run_in_place(&self) -> bool {
        self.flags & KILN_CUSTOM_OP_MAY_RUN_IN_PLACE != 0
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        self.infer_types(cx.node_name, cx.inputs, cx.attrs)
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        // The run's concrete types: what inference says of the actual input shapes.
        let concrete: Vec<Option<TensorType>> = cx
            .inputs
            .iter()
            .zip(cx.input_types)
            .map(|(t, ty)| {
                t.map(|t| {
                    let names = ty.map(|ty| ty.shape.axes.iter().map(|a| a.name.clone()).collect());
                    let dims = t.shape().iter().map(|&d| Dim::Fixed(d)).collect();
                    let shape = match names {
                        Some(names) => Shape::named(dims, names),
                        None => Shape::new(dims),
                    };
                    TensorType::new(t.dtype(), shape)
                })
            })
            .collect();
        let expected = self.infer_types("", &concrete, cx.attrs)?;
        // Inputs copied to aligned row-major buffers: the interpreter's tensors may be
        // strided views, and a C kernel reads plain memory.
        let mut in_bufs = Vec::with_capacity(cx.inputs.len());
        let mut inputs = Vec::with_capacity(cx.inputs.len());
        for t in cx.inputs {
            match t {
                None => inputs.push(None),
                Some(t) => {
                    let mut buf = zeroed_buf(t.len() * t.dtype().size_in_bytes())?;
                    buf.as_mut_bytes().copy_from_slice(&t.to_le_bytes());
                    inputs.push(Some(View::new(buf.as_mut_ptr(), t.dtype(), t.shape())));
                    in_bufs.push(buf);
                }
            }
        }
        let outputs = Outputs::Allocated {
            expected,
            made: (0..self.num_outputs).map(|_| None).collect(),
        };
        let outputs = self.run_kernel(inputs, outputs, cx.attrs, None)?;
        drop(in_bufs);
        let Outputs::Allocated { made, .. } = outputs else {
            return Err("the kernel's outputs went astray".into());
        };
        made.into_iter()
            .enumerate()
            .map(|(k, m)| {
                let (buf, dtype, dims) = m.ok_or_else(|| format!("output {k} was not made"))?;
                Tensor::from_le_bytes(dtype, &dims, buf.as_bytes())
            })
            .collect()
    }

    fn backend_kernels(&self) -> Option<&(dyn std::any::Any + Send + Sync)> {
        Some(self.kernels.as_any())
    }

    fn gradient(
        &self,
        g: &mut Graph,
        node: NodeId,
        gys: &[Option<Value>],
    ) -> Option<Result<Vec<Option<Value>>, String>> {
        let gradient = self.gradient?;
        let n = g.node(node).clone();
        let mut ctx = kiln_gradient_context {
            inputs: n.inputs.clone(),
            outputs: (0..n.outputs.len() as u32).map(|i| node.out(i)).collect(),
            output_grads: gys.to_vec(),
            input_grads: vec![None; n.inputs.len()],
            attrs: kiln_attrs {
                attrs: n.attrs.clone(),
            },
            error: None,
        };
        // The callback builds on the graph through the ordinary C API, so the graph is
        // lent to it as a `kiln_graph` handle for the call.
        let mut handle = kiln_graph {
            graph: std::mem::take(g),
        };
        // SAFETY: the registration's callback with live context and graph handles.
        let status = unsafe { gradient(&mut ctx, &mut handle, self.user_data) };
        *g = handle.graph;
        if status != KILN_STATUS_OK || ctx.error.is_some() {
            return Some(Err(callback_failure(
                "the gradient callback",
                status,
                ctx.error,
            )));
        }
        for (k, gx) in ctx.input_grads.iter().enumerate() {
            let (Some(gx), Some(x)) = (gx, n.inputs[k]) else {
                continue;
            };
            let (Ok(gt), Ok(xt)) = (g.value_type(*gx), g.value_type(x)) else {
                return Some(Err(format!(
                    "the gradient callback set input {k}'s gradient to %{}:{}, which does not exist",
                    gx.node.0, gx.output
                )));
            };
            if gt.dtype != xt.dtype || gt.rank() != xt.rank() {
                return Some(Err(format!(
                    "the gradient callback gave input {k} a gradient of type {gt}; the input is {xt}"
                )));
            }
        }
        Some(Ok(ctx.input_grads))
    }
}

impl BufferKernel for FfiCore {
    fn compute(
        &self,
        inputs: &[Option<RawTensor>],
        outputs: &[RawTensor],
        attrs: &Attrs,
    ) -> Result<(), String> {
        self.compute_planned(inputs, outputs, attrs, None)
    }
}

impl CudaKernel for FfiCore {
    fn compute(
        &self,
        inputs: &[Option<RawTensor>],
        outputs: &[RawTensor],
        attrs: &Attrs,
        stream: *mut c_void,
    ) -> Result<(), String> {
        self.compute_planned(inputs, outputs, attrs, Some(stream))
    }
}

impl FfiCore {
    /// The kernel on buffers the backend planned (`compute_cuda` when given a stream).
    fn compute_planned(
        &self,
        inputs: &[Option<RawTensor>],
        outputs: &[RawTensor],
        attrs: &Attrs,
        stream: Option<*mut c_void>,
    ) -> Result<(), String> {
        let inputs = inputs
            .iter()
            .map(|t| t.as_ref().map(|t| View::new(t.data, t.dtype, &t.shape)))
            .collect();
        let outputs = Outputs::Planned {
            slots: outputs.to_vec(),
            given: vec![false; outputs.len()],
        };
        self.run_kernel(inputs, outputs, attrs, stream).map(drop)
    }

    fn infer_types(
        &self,
        node_name: &str,
        inputs: &[Option<TensorType>],
        attrs: &Attrs,
    ) -> Result<Vec<TensorType>, String> {
        let symbols = inputs
            .iter()
            .map(|t| match t {
                None => vec![],
                Some(t) => t
                    .shape
                    .axes
                    .iter()
                    .map(|a| match &a.dim {
                        Dim::Sym(s) => CString::new(s.as_str()).ok(),
                        Dim::Fixed(_) => None,
                    })
                    .collect(),
            })
            .collect();
        let mut ctx = kiln_infer_context {
            inputs: inputs.to_vec(),
            symbols,
            attrs: kiln_attrs {
                attrs: attrs.clone(),
            },
            outputs: vec![None; self.num_outputs],
            node_name: node_name.to_string(),
            error: None,
        };
        // SAFETY: the registration's callback with a live context.
        let status = unsafe { (self.infer)(&mut ctx, self.user_data) };
        if status != KILN_STATUS_OK || ctx.error.is_some() {
            return Err(callback_failure("the infer callback", status, ctx.error));
        }
        ctx.outputs
            .into_iter()
            .enumerate()
            .map(|(k, t)| t.ok_or_else(|| format!("the infer callback did not set output {k}")))
            .collect()
    }

    /// Calls the compute callback; checks that it made every output.
    /// Calls the compute callback, or with `stream` the CUDA one (on device buffers).
    fn run_kernel(
        &self,
        inputs: Vec<Option<View>>,
        outputs: Outputs,
        attrs: &Attrs,
        stream: Option<*mut c_void>,
    ) -> Result<Outputs, String> {
        let mut ctx = kiln_kernel_context {
            inputs,
            outputs,
            attrs: kiln_attrs {
                attrs: attrs.clone(),
            },
            scratch: vec![],
            kept: vec![],
            error: None,
        };
        let (status, what) = match (stream, self.compute_cuda) {
            (None, _) => (
                // SAFETY: the registration's callback with a live context.
                unsafe { (self.compute)(&mut ctx, self.user_data) },
                "the compute callback",
            ),
            (Some(stream), Some(cuda)) => (
                // SAFETY: the registration's callback with a live context and stream.
                unsafe { cuda(&mut ctx, stream, self.user_data) },
                "the compute_cuda callback",
            ),
            (Some(_), None) => return Err("the op has no compute_cuda callback".into()),
        };
        if status != KILN_STATUS_OK || ctx.error.is_some() {
            return Err(callback_failure(what, status, ctx.error.take()));
        }
        if let Some(k) = ctx.outputs.missing() {
            return Err(format!(
                "the compute callback returned without producing output {k} (kiln_kernel_context_output)"
            ));
        }
        Ok(std::mem::replace(
            &mut ctx.outputs,
            Outputs::Allocated {
                expected: vec![],
                made: vec![],
            },
        ))
    }
}
