//! External ops: user kernels registered from C and C++ (`kiln_register_op`), used in
//! graphs built through the API or imported from ONNX (a node in the op's domain),
//! differentiated through the user's gradient callback, planned and run like catalogue
//! ops.
//!
//! A registration is copied into an [`FfiOp`], an ordinary [`Op`] of the run-time
//! registry (`ir::ops::custom`) whose `infer`, `eval` and `gradient` call the user's
//! callbacks through the context handles below. The registry and every graph that uses
//! the op hold it by `Arc`; its `Drop` calls the user's `destroy(user_data)`.
//!
//! Versioning: `kiln_custom_op` begins with `struct_size` (the caller's
//! `sizeof(kiln_custom_op)`) and `version` (the major version of this interface). Kiln
//! reads only the first `struct_size` bytes: fields past them (a library built against an
//! older, shorter header) take their defaults, NULL; bytes past Kiln's own struct (a
//! newer, longer header) must be zero, meaning "not used", else the registration is
//! refused, since it asks for something this library cannot do. Fields are only ever
//! appended within a major version; the required ones come first
//! (`KILN_CUSTOM_OP_MIN_SIZE` bytes, through `destroy`).
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ffi::{c_char, c_void, CString};
use std::sync::Arc;

use super::graph::{kiln_graph, kiln_value, KILN_VALUE_NONE_NODE};
use super::tensor::{dims_from_c, dtype_from_c, dtype_to_c, kiln_dtype, KILN_DTYPE_INVALID};
use super::{arg, arg_mut, arg_slice, arg_str, guard, guard_or, out_ptr, CResult, Failure};
use super::{kiln_status, status_name, KILN_STATUS_OK, KILN_STATUS_RUN_FAILED};
use super::{KILN_STATUS_UNKNOWN_OP, KILN_STATUS_UNSUPPORTED_VERSION};
use crate::backend::registered::{BufferKernel, CudaKernel, Kernels, RawTensor};
use crate::ir::ops::custom;
use crate::ir::ops::{EvalCtx, InferCtx, Op, OpSchema};
use crate::ir::{Attr, Attrs, DType, Dim, Graph, NodeId, Shape, TensorType, Value};
use crate::tensor::Tensor;

/// The major version of the external-op interface this header describes; a
/// registration's `version` must equal it.
pub const KILN_CUSTOM_OP_VERSION: u32 = 1;
/// `max_inputs` of an op whose last input repeats (zero or more after `min_inputs`).
pub const KILN_CUSTOM_OP_VARIADIC: u32 = u32::MAX;
/// `flags`: the op computes the same outputs from the same inputs and has no side
/// effects, so a node whose inputs are all constants may be computed at compile time.
pub const KILN_CUSTOM_OP_PURE: u32 = 1;
/// `flags`: the CPU kernel may be given an output buffer that is also one of its
/// same-shaped inputs (it reads every element before writing that element), so the
/// memory planner may reuse the input's buffer.
pub const KILN_CUSTOM_OP_MAY_RUN_IN_PLACE: u32 = 2;
const KNOWN_FLAGS: u32 = KILN_CUSTOM_OP_PURE | KILN_CUSTOM_OP_MAY_RUN_IN_PLACE;

/// Type/shape inference handed to an infer callback (valid during the call only).
pub struct kiln_infer_context {
    inputs: Vec<Option<TensorType>>,
    /// Each input's symbolic dims as C strings (NULL for fixed ones).
    symbols: Vec<Vec<Option<CString>>>,
    attrs: kiln_attrs,
    outputs: Vec<Option<TensorType>>,
    /// For fresh symbols: `<node>.<output>.<axis>`.
    node_name: String,
    error: Option<String>,
}

/// A kernel invocation handed to a compute callback (valid during the call only).
pub struct kiln_kernel_context {
    inputs: Vec<Option<View>>,
    outputs: Outputs,
    attrs: kiln_attrs,
    scratch: Vec<(*mut u8, Layout)>,
    /// The output views' dims and strides, alive until the callback returns.
    kept: Vec<View>,
    error: Option<String>,
}

/// A gradient request handed to a gradient callback (valid during the call only).
pub struct kiln_gradient_context {
    inputs: Vec<Option<Value>>,
    outputs: Vec<Value>,
    output_grads: Vec<Option<Value>>,
    input_grads: Vec<Option<Value>>,
    attrs: kiln_attrs,
    error: Option<String>,
}

/// What the three callback contexts share, so that their `num_inputs`, `attrs` and
/// `set_error` entry points have one body each.
trait CallbackContext {
    fn num_inputs(&self) -> usize;
    fn attrs(&self) -> &kiln_attrs;
    fn error_mut(&mut self) -> &mut Option<String>;
}

macro_rules! callback_context {
    ($($t:ty),*) => {$(
        impl CallbackContext for $t {
            fn num_inputs(&self) -> usize {
                self.inputs.len()
            }
            fn attrs(&self) -> &kiln_attrs {
                &self.attrs
            }
            fn error_mut(&mut self) -> &mut Option<String> {
                &mut self.error
            }
        }
    )*};
}
callback_context!(
    kiln_infer_context,
    kiln_kernel_context,
    kiln_gradient_context
);

/// # Safety
/// `ctx` is NULL or a live context.
unsafe fn context_num_inputs<C: CallbackContext>(ctx: *const C) -> usize {
    // SAFETY: NULL or live, as the caller guarantees.
    guard_or(0, || unsafe { ctx.as_ref() }.map_or(0, C::num_inputs))
}

/// # Safety
/// `ctx` is NULL or a live context.
unsafe fn context_attrs<C: CallbackContext>(ctx: *const C) -> *const kiln_attrs {
    guard_or(std::ptr::null(), || {
        // SAFETY: NULL or live, as the caller guarantees.
        unsafe { ctx.as_ref() }.map_or(std::ptr::null(), |c| c.attrs() as *const kiln_attrs)
    })
}

/// # Safety
/// `ctx` is the live context; `msg` NULL or a NUL-terminated string.
unsafe fn context_set_error<C: CallbackContext>(ctx: *mut C, msg: *const c_char) -> kiln_status {
    guard(|| {
        // SAFETY: as the caller guarantees.
        let (ctx, msg) = unsafe { (arg_mut(ctx, "ctx")?, message(msg)) };
        *ctx.error_mut() = Some(msg);
        Ok(())
    })
}

/// A node's attributes, read through `kiln_attrs_get_*` (borrowed from a context).
pub struct kiln_attrs {
    attrs: Attrs,
}

/// A tensor handed to a kernel: `data` (for inputs read-only; for outputs writable, and
/// possibly the same buffer as an input when the op is `KILN_CUSTOM_OP_MAY_RUN_IN_PLACE`),
/// its element type, `rank` dims and strides (in elements, row-major today). An omitted
/// optional input has `data == NULL`, `rank == 0` and dtype `KILN_DTYPE_INVALID`. The
/// pointers are valid until the callback returns. Kiln may append fields (never reorder).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kiln_tensor_view {
    pub data: *mut c_void,
    pub dtype: kiln_dtype,
    pub rank: u32,
    pub dims: *const i64,
    pub strides: *const i64,
}

/// Infers the op's output types from its input types and attributes: reads them with
/// `kiln_infer_context_*`, sets every output with `kiln_infer_context_set_output` (or
/// `_set_output_like`), returns `KILN_STATUS_OK` or another status after
/// `kiln_infer_context_set_error`. Called whenever a node of the op is added or its
/// graph re-inferred (passes, specialization), with symbolic or concrete dims.
pub type kiln_custom_infer_fn = Option<
    unsafe extern "C" fn(ctx: *mut kiln_infer_context, user_data: *mut c_void) -> kiln_status,
>;
/// The CPU kernel: reads inputs with `kiln_kernel_context_input`, obtains each output
/// buffer with `kiln_kernel_context_output` (giving the dims it computes, checked against
/// inference), fills it, returns `KILN_STATUS_OK` or another status after
/// `kiln_kernel_context_set_error` (the run then fails with `KILN_STATUS_RUN_FAILED`
/// naming the node). May be called from several threads at once (one executable runs
/// from many threads): it must not mutate `user_data` without its own locking.
pub type kiln_custom_compute_fn = Option<
    unsafe extern "C" fn(ctx: *mut kiln_kernel_context, user_data: *mut c_void) -> kiln_status,
>;
/// The CUDA kernel: as the CPU one, with device pointers in the views (inputs and the
/// planned outputs) and the run's stream (a `CUstream`) to enqueue on; it must not
/// synchronize the device. The CUDA backend calls it for the op's nodes (without it,
/// compiling such a graph for `"cuda:N"` fails naming the op). Memory from
/// `kiln_kernel_context_scratch` is host memory.
pub type kiln_custom_cuda_compute_fn = Option<
    unsafe extern "C" fn(
        ctx: *mut kiln_kernel_context,
        stream: *mut c_void,
        user_data: *mut c_void,
    ) -> kiln_status,
>;
/// The gradient: appends to `graph` (with the ordinary `kiln_graph_add_op` & co.; the
/// handle is borrowed, never freed) the nodes computing the gradients of the node's
/// inputs from its outputs' gradients (`kiln_gradient_context_output_grad`), and sets
/// each with `kiln_gradient_context_set_input_grad`. Inputs left unset are not
/// differentiable (an error if the loss needs them).
pub type kiln_custom_gradient_fn = Option<
    unsafe extern "C" fn(
        ctx: *mut kiln_gradient_context,
        graph: *mut kiln_graph,
        user_data: *mut c_void,
    ) -> kiln_status,
>;
/// Called once with `user_data` when the registration is dropped: after
/// `kiln_unregister_op`, once no graph or executable uses the op any more.
pub type kiln_custom_destroy_fn = Option<unsafe extern "C" fn(user_data: *mut c_void)>;

/// An external op's registration, copied by `kiln_register_op`.
///
/// Versioning within a major version (`version == KILN_CUSTOM_OP_VERSION`): set
/// `struct_size = sizeof(kiln_custom_op)` as your header defines it. Kiln reads only
/// `struct_size` bytes, so a library built against an older, shorter header works with a
/// newer Kiln (fields it does not have are NULL/0; at least `KILN_CUSTOM_OP_MIN_SIZE`
/// bytes, through `destroy`, are required). A library built against a newer, longer
/// header works with an older Kiln as long as the fields this Kiln does not know are zero
/// (unused); a nonzero one is refused with `KILN_STATUS_UNSUPPORTED_VERSION`, as is any
/// other `version`. New fields are only ever appended.
///
/// Callbacks must not unwind into Kiln (catch C++ exceptions; `kiln.hpp`'s
/// `kiln::register_op` does) and must be callable from any thread.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kiln_custom_op {
    /// `sizeof(kiln_custom_op)` of the header the caller was compiled with.
    pub struct_size: u32,
    /// `KILN_CUSTOM_OP_VERSION`.
    pub version: u32,
    /// The op's domain (`"com.example"`, matched against ONNX nodes' domain) and name;
    /// each `[A-Za-z_][A-Za-z0-9_.]*`. Graphs name the op `domain::name`. Copied.
    pub domain: *const c_char,
    pub name: *const c_char,
    /// Inputs `0..min_inputs` are required; `min_inputs..max_inputs` optional (may be
    /// omitted with `KILN_VALUE_NONE_NODE`); `max_inputs == KILN_CUSTOM_OP_VARIADIC`
    /// takes any number from `min_inputs` on.
    pub min_inputs: u32,
    pub max_inputs: u32,
    /// At least 1.
    pub num_outputs: u32,
    /// `KILN_CUSTOM_OP_PURE | KILN_CUSTOM_OP_MAY_RUN_IN_PLACE`; other bits are refused.
    pub flags: u32,
    /// Required.
    pub infer: kiln_custom_infer_fn,
    /// Required (the CPU backend and the interpreter call it).
    pub compute: kiln_custom_compute_fn,
    /// Passed to every callback.
    pub user_data: *mut c_void,
    /// Optional.
    pub destroy: kiln_custom_destroy_fn,
    /// Optional: the CUDA backend's kernel.
    pub compute_cuda: kiln_custom_cuda_compute_fn,
    /// Optional: without it, differentiating through the op is an error naming the node.
    pub gradient: kiln_custom_gradient_fn,
}

/// Bytes of `kiln_custom_op` every registration must provide (through `destroy`).
const MIN_SIZE: usize = std::mem::offset_of!(kiln_custom_op, compute_cuda);

/// The op behind a registration: its callbacks, shared with the kernels it hands the
/// backends (`Kernels`), so that the registration's destructor runs after the last.
struct FfiOp {
    core: Arc<FfiCore>,
    kernels: Kernels,
}

impl std::ops::Deref for FfiOp {
    type Target = FfiCore;
    fn deref(&self) -> &FfiCore {
        &self.core
    }
}

impl FfiOp {
    fn new(core: FfiCore) -> FfiOp {
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
struct FfiCore {
    schema: OpSchema,
    num_outputs: usize,
    flags: u32,
    infer: unsafe extern "C" fn(*mut kiln_infer_context, *mut c_void) -> kiln_status,
    compute: unsafe extern "C" fn(*mut kiln_kernel_context, *mut c_void) -> kiln_status,
    compute_cuda: kiln_custom_cuda_compute_fn,
    gradient: kiln_custom_gradient_fn,
    user_data: *mut c_void,
    destroy: kiln_custom_destroy_fn,
}

// SAFETY: the header requires the callbacks (and what they do with `user_data`) to be
// callable from any thread, concurrently.
unsafe impl Send for FfiCore {}
// SAFETY: as for `Send` above.
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
                    let mut buf = AlignedBuf::new(t.len() * t.dtype().size_in_bytes())?;
                    buf.bytes_mut().copy_from_slice(&t.to_le_bytes());
                    inputs.push(Some(View::new(buf.ptr, t.dtype(), t.shape())));
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
                Tensor::from_le_bytes(dtype, &dims, buf.bytes())
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

impl Drop for kiln_kernel_context {
    fn drop(&mut self) {
        for &(p, layout) in &self.scratch {
            // SAFETY: allocated with this layout by kiln_kernel_context_scratch.
            unsafe { dealloc(p, layout) }
        }
    }
}

/// A 64-byte-aligned, zeroed byte buffer (at least one byte, so never dangling).
struct AlignedBuf {
    ptr: *mut u8,
    layout: Layout,
    len: usize,
}

impl AlignedBuf {
    /// An error, not an abort, when `len` bytes cannot be had: the size comes from a
    /// user's kernel.
    fn new(len: usize) -> Result<AlignedBuf, String> {
        let layout = Layout::from_size_align(len.max(1), 64)
            .map_err(|_| format!("a buffer of {len} bytes is too large"))?;
        // SAFETY: the layout has a nonzero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(format!("could not allocate a buffer of {len} bytes"));
        }
        Ok(AlignedBuf { ptr, layout, len })
    }
    fn bytes(&self) -> &[u8] {
        // SAFETY: `len` initialized bytes at `ptr`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `bytes`, uniquely owned.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `new`.
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

/// A view's backing arrays, kept alive while the kernel may read them.
struct View {
    data: *mut u8,
    dtype: DType,
    dims: Vec<i64>,
    strides: Vec<i64>,
}

impl View {
    fn new(data: *mut u8, dtype: DType, shape: &[usize]) -> View {
        let mut strides = vec![0i64; shape.len()];
        let mut s = 1i64;
        for k in (0..shape.len()).rev() {
            strides[k] = s;
            s *= shape[k] as i64;
        }
        View {
            data,
            dtype,
            dims: shape.iter().map(|&d| d as i64).collect(),
            strides,
        }
    }
    fn to_c(&self) -> kiln_tensor_view {
        kiln_tensor_view {
            data: self.data.cast(),
            dtype: dtype_to_c(self.dtype),
            rank: self.dims.len() as u32,
            dims: self.dims.as_ptr(),
            strides: self.strides.as_ptr(),
        }
    }
}

/// Where a kernel's outputs go.
enum Outputs {
    /// Buffers a CPU program planned (in the arena, possibly an input's when the op
    /// runs in place): the kernel's dims must be exactly the planned ones.
    Planned {
        slots: Vec<RawTensor>,
        given: Vec<bool>,
    },
    /// Allocated on request (the interpreter's `eval`), checked against the types
    /// inference gives for the run's input shapes.
    Allocated {
        expected: Vec<TensorType>,
        #[allow(clippy::type_complexity)]
        made: Vec<Option<(AlignedBuf, DType, Vec<usize>)>>,
    },
}

impl Outputs {
    fn missing(&self) -> Option<usize> {
        match self {
            Outputs::Allocated { made, .. } => made.iter().position(Option::is_none),
            Outputs::Planned { given, .. } => given.iter().position(|g| !g),
        }
    }
}

// ---- registration -----------------------------------------------------------------

/// Reads a registration by the versioning rules (see `kiln_custom_op`).
///
/// # Safety
/// `def` points to at least `def->struct_size` readable bytes.
unsafe fn read_def(def: *const kiln_custom_op) -> CResult<kiln_custom_op> {
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe {
        if def.is_null() {
            return Err(Failure::null("def"));
        }
        let size = std::ptr::read_unaligned(def.cast::<u32>()) as usize;
        let ours = std::mem::size_of::<kiln_custom_op>();
        if size < MIN_SIZE {
            return Err(Failure::new(
            KILN_STATUS_UNSUPPORTED_VERSION,
            format!(
                "def->struct_size is {size}: a kiln_custom_op has at least {MIN_SIZE} bytes (KILN_CUSTOM_OP_MIN_SIZE; set struct_size = sizeof(kiln_custom_op))"
            ),
        ));
        }
        // SAFETY: all-zero is a valid kiln_custom_op (NULL pointers, no callbacks).
        let mut d: kiln_custom_op = std::mem::zeroed();
        std::ptr::copy_nonoverlapping(
            def.cast::<u8>(),
            (&mut d as *mut kiln_custom_op).cast::<u8>(),
            size.min(ours),
        );
        if size > ours {
            let tail = std::slice::from_raw_parts(def.cast::<u8>().add(ours), size - ours);
            if let Some(k) = tail.iter().position(|&b| b != 0) {
                return Err(Failure::new(
                KILN_STATUS_UNSUPPORTED_VERSION,
                format!(
                    "def sets a field this Kiln ({}) does not know: struct_size is {size}, this library's kiln_custom_op has {ours} bytes and byte {} is nonzero (built against a newer kiln.h; use a newer Kiln or leave the new fields zero)",
                    env!("CARGO_PKG_VERSION"),
                    ours + k
                ),
            ));
            }
        }
        if d.version != KILN_CUSTOM_OP_VERSION {
            return Err(Failure::new(
            KILN_STATUS_UNSUPPORTED_VERSION,
            format!(
                "def->version is {}: this Kiln implements external-op interface version {KILN_CUSTOM_OP_VERSION} (KILN_CUSTOM_OP_VERSION)",
                d.version
            ),
        ));
        }
        Ok(d)
    }
}

fn build_op(d: &kiln_custom_op) -> CResult<FfiOp> {
    // SAFETY: the header requires NUL-terminated strings.
    let domain = unsafe { arg_str(d.domain, "def->domain") }?;
    // SAFETY: as for the domain.
    let name = unsafe { arg_str(d.name, "def->name") }?;
    for (what, s) in [("def->domain", domain), ("def->name", name)] {
        if !custom::valid_part(s) {
            return Err(Failure::invalid(format!(
                "{what} '{s}' must match [A-Za-z_][A-Za-z0-9_.]*"
            )));
        }
    }
    let qualified = custom::qualified(domain, name);
    let bad = |m: String| Failure::invalid(format!("registering {qualified}: {m}"));
    let Some(infer) = d.infer else {
        return Err(bad(
            "def->infer is NULL (an op needs an infer callback)".into()
        ));
    };
    let Some(compute) = d.compute else {
        return Err(bad(
            "def->compute is NULL (an op needs a CPU compute callback)".into(),
        ));
    };
    if d.num_outputs == 0 {
        return Err(bad(
            "def->num_outputs is 0 (an op has at least one output)".into()
        ));
    }
    let max_inputs = (d.max_inputs != KILN_CUSTOM_OP_VARIADIC).then_some(d.max_inputs as usize);
    if max_inputs.is_some_and(|m| m < d.min_inputs as usize) {
        return Err(bad(format!(
            "def->max_inputs ({}) is less than def->min_inputs ({})",
            d.max_inputs, d.min_inputs
        )));
    }
    if max_inputs.is_some_and(|m| m > 1 << 16) || d.min_inputs > 1 << 16 || d.num_outputs > 1 << 16
    {
        return Err(bad("more than 65536 inputs or outputs".into()));
    }
    if d.flags & !KNOWN_FLAGS != 0 {
        return Err(Failure::new(
            KILN_STATUS_UNSUPPORTED_VERSION,
            format!(
                "registering {qualified}: def->flags has bits this Kiln does not know: {:#x}",
                d.flags & !KNOWN_FLAGS
            ),
        ));
    }
    let min = d.min_inputs as usize;
    let mut inputs: Vec<String> = (0..min).map(|i| format!("input{i}")).collect();
    match max_inputs {
        Some(max) => inputs.extend((min..max).map(|i| format!("input{i}?"))),
        None => inputs.push(format!("input{min}...")),
    }
    let outputs: Vec<String> = (0..d.num_outputs).map(|i| format!("output{i}")).collect();
    let schema = custom::registered_schema(
        &qualified,
        &inputs,
        &outputs,
        "an external op registered through kiln_register_op",
    );
    Ok(FfiOp::new(FfiCore {
        schema,
        num_outputs: d.num_outputs as usize,
        flags: d.flags,
        infer,
        compute,
        compute_cuda: d.compute_cuda,
        gradient: d.gradient,
        user_data: d.user_data,
        destroy: d.destroy,
    }))
}

/// Registers an external op (see `kiln_custom_op`; the struct and its strings are
/// copied). From then on `kiln_graph_add_op(g, "domain::name", ...)` and ONNX nodes of
/// that domain and op type use it. Fails with `KILN_STATUS_NULL_ARGUMENT` for a NULL
/// `def`, `KILN_STATUS_INVALID_ARGUMENT` for a missing or malformed field (named in the
/// message) or an already registered `(domain, name)`, `KILN_STATUS_UNSUPPORTED_VERSION`
/// for a `version`, `struct_size` or field this Kiln does not know. On failure nothing is
/// registered and `destroy` is not called: `user_data` stays the caller's. Thread-safe.
///
/// # Safety
/// `def` is NULL or points to `def->struct_size` readable bytes laid out as
/// `kiln_custom_op`; its callbacks are valid for as long as the registration lives.
#[no_mangle]
pub unsafe extern "C" fn kiln_register_op(def: *const kiln_custom_op) -> kiln_status {
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe {
        guard(|| {
            let d = read_def(def)?;
            let op = build_op(&d)?;
            // On a duplicate the new FfiOp must not run the caller's destructor.
            let op = Arc::new(op);
            if let Err(e) = custom::register(op.clone()) {
                if let Ok(FfiOp { core, kernels }) = Arc::try_unwrap(op) {
                    drop(kernels);
                    if let Ok(mut core) = Arc::try_unwrap(core) {
                        core.destroy = None;
                    }
                }
                return Err(Failure::invalid(e));
            }
            Ok(())
        })
    }
}

/// Unregisters the op `(domain, name)`: new graphs (`kiln_graph_add_op`, ONNX import,
/// `.kir` text) can no longer use it. Graphs and executables that already use it keep
/// working; the registration's `destroy` runs when the last of them is freed (at once if
/// none). `KILN_STATUS_UNKNOWN_OP` if no such op is registered. Thread-safe.
///
/// # Safety
/// `domain` and `name` are NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn kiln_unregister_op(
    domain: *const c_char,
    name: *const c_char,
) -> kiln_status {
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe {
        guard(|| {
            let q = custom::qualified(arg_str(domain, "domain")?, arg_str(name, "name")?);
            match custom::unregister(&q) {
                Some(_) => Ok(()),
                None => Err(Failure::new(
                    KILN_STATUS_UNKNOWN_OP,
                    format!("no op '{q}' is registered"),
                )),
            }
        })
    }
}

// ---- attributes -------------------------------------------------------------------

/// # Safety
/// `attrs` is NULL or from a live context; `name` a string.
unsafe fn attr_lookup<'a>(
    attrs: *const kiln_attrs,
    name: *const c_char,
) -> CResult<(&'a str, Option<&'a Attr>)> {
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe {
        let attrs = arg(attrs, "attrs")?;
        let name = arg_str(name, "name")?;
        Ok((name, attrs.attrs.get(name)))
    }
}

fn wrong_kind(name: &str, a: &Attr, want: &str) -> Failure {
    Failure::invalid(format!("attribute '{name}' is {}, not {want}", a.kind()))
}

/// The int attribute `name`, or `default_value` if the node has none. A different kind
/// is `KILN_STATUS_INVALID_ARGUMENT`.
///
/// # Safety
/// `attrs` comes from a live context; `name` is a string; `out` is valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_attrs_get_int(
    attrs: *const kiln_attrs,
    name: *const c_char,
    default_value: i64,
    out: *mut i64,
) -> kiln_status {
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe {
        guard(|| {
            let out = out_ptr(out, "out")?;
            let (name, a) = attr_lookup(attrs, name)?;
            *out = match a {
                None => default_value,
                Some(Attr::Int(v)) => *v,
                Some(a) => return Err(wrong_kind(name, a, "an int")),
            };
            Ok(())
        })
    }
}

/// The float attribute `name` (an int converts), or `default_value` if none.
///
/// # Safety
/// As `kiln_attrs_get_int`.
#[no_mangle]
pub unsafe extern "C" fn kiln_attrs_get_float(
    attrs: *const kiln_attrs,
    name: *const c_char,
    default_value: f64,
    out: *mut f64,
) -> kiln_status {
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe {
        guard(|| {
            let out = out_ptr(out, "out")?;
            let (name, a) = attr_lookup(attrs, name)?;
            *out = match a {
                None => default_value,
                Some(Attr::Float(v)) => *v,
                Some(Attr::Int(v)) => *v as f64,
                Some(a) => return Err(wrong_kind(name, a, "a float")),
            };
            Ok(())
        })
    }
}

/// The ints attribute `name`: `*data` (borrowed, valid during the callback) and `*len`;
/// NULL and 0 if the node has none.
///
/// # Safety
/// As `kiln_attrs_get_int`; `data` and `len` are valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_attrs_get_ints(
    attrs: *const kiln_attrs,
    name: *const c_char,
    data: *mut *const i64,
    len: *mut usize,
) -> kiln_status {
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe {
        guard(|| {
            let data = out_ptr(data, "data")?;
            let len = out_ptr(len, "len")?;
            let (name, a) = attr_lookup(attrs, name)?;
            let (p, n) = match a {
                None => (std::ptr::null(), 0),
                Some(Attr::Ints(v)) => (v.as_ptr(), v.len()),
                Some(a) => return Err(wrong_kind(name, a, "ints")),
            };
            *data = p;
            *len = n;
            Ok(())
        })
    }
}

/// The floats attribute `name`, as `kiln_attrs_get_ints`.
///
/// # Safety
/// As `kiln_attrs_get_ints`.
#[no_mangle]
pub unsafe extern "C" fn kiln_attrs_get_floats(
    attrs: *const kiln_attrs,
    name: *const c_char,
    data: *mut *const f64,
    len: *mut usize,
) -> kiln_status {
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe {
        guard(|| {
            let data = out_ptr(data, "data")?;
            let len = out_ptr(len, "len")?;
            let (name, a) = attr_lookup(attrs, name)?;
            let (p, n) = match a {
                None => (std::ptr::null(), 0),
                Some(Attr::Floats(v)) => (v.as_ptr(), v.len()),
                Some(a) => return Err(wrong_kind(name, a, "floats")),
            };
            *data = p;
            *len = n;
            Ok(())
        })
    }
}

// ---- inference --------------------------------------------------------------------

/// # Safety
/// `msg` is NULL or a string.
unsafe fn message(msg: *const c_char) -> String {
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe {
        if msg.is_null() {
            "(no message)".into()
        } else {
            std::ffi::CStr::from_ptr(msg).to_string_lossy().into_owned()
        }
    }
}

/// How many inputs the node has (omitted optional ones included); 0 for NULL.
///
/// # Safety
/// `ctx` is NULL or the live context of the current callback.
#[no_mangle]
pub unsafe extern "C" fn kiln_infer_context_num_inputs(ctx: *const kiln_infer_context) -> usize {
    // SAFETY: NULL or the live context, as the `# Safety` section above requires.
    unsafe { context_num_inputs(ctx) }
}

/// Input `index`'s dtype and rank. An omitted optional input gives `KILN_DTYPE_INVALID`
/// and rank 0 (and `KILN_STATUS_OK`); an index past the inputs is
/// `KILN_STATUS_INVALID_ARGUMENT`.
///
/// # Safety
/// `ctx` is the live context of the current callback; `dtype` and `rank` are valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_infer_context_input(
    ctx: *const kiln_infer_context,
    index: usize,
    dtype: *mut kiln_dtype,
    rank: *mut usize,
) -> kiln_status {
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe {
        guard(|| {
            let ctx = arg(ctx, "ctx")?;
            let dtype = out_ptr(dtype, "dtype")?;
            let rank = out_ptr(rank, "rank")?;
            let t = infer_input(ctx, index)?;
            *dtype = t.map_or(KILN_DTYPE_INVALID, |t| dtype_to_c(t.dtype));
            *rank = t.map_or(0, |t| t.rank());
            Ok(())
        })
    }
}

fn infer_input(ctx: &kiln_infer_context, index: usize) -> CResult<Option<&TensorType>> {
    ctx.inputs.get(index).map(Option::as_ref).ok_or_else(|| {
        Failure::invalid(format!(
            "index {index}: the node has {} inputs",
            ctx.inputs.len()
        ))
    })
}

/// Dim `axis` of input `index`: a fixed size (`*symbol` NULL), or `*size == -1` and
/// `*symbol` the symbol's name (borrowed, valid during the callback), which
/// `kiln_infer_context_set_output` accepts to say "the same size".
///
/// # Safety
/// `ctx` is the live context of the current callback; `size` and `symbol` are valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_infer_context_input_dim(
    ctx: *const kiln_infer_context,
    index: usize,
    axis: usize,
    size: *mut i64,
    symbol: *mut *const c_char,
) -> kiln_status {
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe {
        guard(|| {
            let ctx = arg(ctx, "ctx")?;
            let size = out_ptr(size, "size")?;
            let symbol = out_ptr(symbol, "symbol")?;
            let t = infer_input(ctx, index)?
                .ok_or_else(|| Failure::invalid(format!("input {index} is omitted")))?;
            let a = t.shape.axes.get(axis).ok_or_else(|| {
                Failure::invalid(format!("axis {axis}: input {index} has rank {}", t.rank()))
            })?;
            match &a.dim {
                Dim::Fixed(n) => {
                    *size = *n as i64;
                    *symbol = std::ptr::null();
                }
                Dim::Sym(_) => {
                    *size = -1;
                    *symbol = ctx.symbols[index][axis]
                        .as_ref()
                        .map_or(std::ptr::null(), |s| s.as_ptr());
                }
            }
            Ok(())
        })
    }
}

/// The node's attributes (borrowed from the context).
///
/// # Safety
/// `ctx` is NULL or the live context of the current callback.
#[no_mangle]
pub unsafe extern "C" fn kiln_infer_context_attrs(
    ctx: *const kiln_infer_context,
) -> *const kiln_attrs {
    // SAFETY: NULL or the live context, as the `# Safety` section above requires.
    unsafe { context_attrs(ctx) }
}

/// Sets output `index`'s type: `dtype` and `rank` dims, where `dims[k] >= 0` is a fixed
/// size and `dims[k] == -1` a symbolic one named `symbols[k]` (e.g. an input's symbol
/// from `kiln_infer_context_input_dim`, so the sizes are known equal), or a fresh symbol
/// when `symbols` or `symbols[k]` is NULL.
///
/// # Safety
/// `ctx` is the live context; `dims` (and `symbols` unless NULL) point to `rank` entries.
#[no_mangle]
pub unsafe extern "C" fn kiln_infer_context_set_output(
    ctx: *mut kiln_infer_context,
    index: usize,
    dtype: kiln_dtype,
    dims: *const i64,
    symbols: *const *const c_char,
    rank: usize,
) -> kiln_status {
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe {
        guard(|| {
            let ctx = arg_mut(ctx, "ctx")?;
            let dtype = dtype_from_c(dtype, "dtype")?;
            let dims = arg_slice(dims, rank, "dims")?;
            let syms = if symbols.is_null() {
                None
            } else {
                Some(arg_slice(symbols, rank, "symbols")?)
            };
            check_output_index(index, ctx.outputs.len())?;
            let mut shape = Vec::with_capacity(rank);
            for (k, &d) in dims.iter().enumerate() {
                shape.push(match d {
                    -1 => match syms.map_or(std::ptr::null(), |s| s[k]) {
                        p if p.is_null() => Dim::Sym(format!("{}.{index}.{k}", ctx.node_name)),
                        p => Dim::Sym(arg_str(p, &format!("symbols[{k}]"))?.to_string()),
                    },
                    d if d >= 0 => Dim::Fixed(d as usize),
                    d => {
                        return Err(Failure::invalid(format!(
                            "dims[{k}] is {d}: a dim is >= 0, or -1 for symbolic"
                        )))
                    }
                });
            }
            ctx.outputs[index] = Some(TensorType::new(dtype, Shape::new(shape)));
            Ok(())
        })
    }
}

fn check_output_index(index: usize, n: usize) -> CResult<()> {
    if index >= n {
        return Err(Failure::invalid(format!(
            "output index {index}: the op has {n} outputs"
        )));
    }
    Ok(())
}

/// Sets output `index`'s type to input `input`'s (dtype, dims, symbols and axis names):
/// the common case of an elementwise op.
///
/// # Safety
/// `ctx` is the live context of the current callback.
#[no_mangle]
pub unsafe extern "C" fn kiln_infer_context_set_output_like(
    ctx: *mut kiln_infer_context,
    index: usize,
    input: usize,
) -> kiln_status {
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe {
        guard(|| {
            let ctx = arg_mut(ctx, "ctx")?;
            check_output_index(index, ctx.outputs.len())?;
            let t = infer_input(ctx, input)?
                .ok_or_else(|| Failure::invalid(format!("input {input} is omitted")))?
                .clone();
            ctx.outputs[index] = Some(t);
            Ok(())
        })
    }
}

/// Records why inference fails (copied); the callback then returns a non-OK status, and
/// adding the node fails with `KILN_STATUS_INVALID_GRAPH` naming it and quoting this.
///
/// # Safety
/// `ctx` is the live context; `msg` NULL or a string.
#[no_mangle]
pub unsafe extern "C" fn kiln_infer_context_set_error(
    ctx: *mut kiln_infer_context,
    msg: *const c_char,
) -> kiln_status {
    // SAFETY: the live context and a string or NULL, as the `# Safety` section requires.
    unsafe { context_set_error(ctx, msg) }
}

// ---- kernels ----------------------------------------------------------------------

/// How many inputs the node has (omitted optional ones included); 0 for NULL.
///
/// # Safety
/// `ctx` is NULL or the live context of the current callback.
#[no_mangle]
pub unsafe extern "C" fn kiln_kernel_context_num_inputs(ctx: *const kiln_kernel_context) -> usize {
    // SAFETY: NULL or the live context, as the `# Safety` section above requires.
    unsafe { context_num_inputs(ctx) }
}

/// How many outputs the op has; 0 for NULL.
///
/// # Safety
/// `ctx` is NULL or the live context of the current callback.
#[no_mangle]
pub unsafe extern "C" fn kiln_kernel_context_num_outputs(ctx: *const kiln_kernel_context) -> usize {
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe {
        guard_or(0, || {
            ctx.as_ref().map_or(0, |c| match &c.outputs {
                Outputs::Allocated { made, .. } => made.len(),
                Outputs::Planned { given, .. } => given.len(),
            })
        })
    }
}

/// Input `index` as a view (read-only; an omitted optional input has `data == NULL`).
///
/// # Safety
/// `ctx` is the live context of the current callback; `view` is valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_kernel_context_input(
    ctx: *const kiln_kernel_context,
    index: usize,
    view: *mut kiln_tensor_view,
) -> kiln_status {
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe {
        guard(|| {
            let ctx = arg(ctx, "ctx")?;
            let view = out_ptr(view, "view")?;
            let v = ctx.inputs.get(index).ok_or_else(|| {
                Failure::invalid(format!(
                    "index {index}: the node has {} inputs",
                    ctx.inputs.len()
                ))
            })?;
            *view = match v {
                Some(v) => v.to_c(),
                None => kiln_tensor_view {
                    data: std::ptr::null_mut(),
                    dtype: KILN_DTYPE_INVALID,
                    rank: 0,
                    dims: std::ptr::null(),
                    strides: std::ptr::null(),
                },
            };
            Ok(())
        })
    }
}

/// Output `index`'s buffer, for an output of `rank` dims `dims` (what the kernel
/// computes): Kiln checks them against the op's inference for this run's inputs and
/// fails with `KILN_STATUS_RUN_FAILED` on a mismatch (the run then fails, naming the
/// node, whatever the callback returns). The buffer is writable until the callback
/// returns; call once per output.
///
/// # Safety
/// `ctx` is the live context; `dims` points to `rank` values; `view` is valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_kernel_context_output(
    ctx: *mut kiln_kernel_context,
    index: usize,
    dims: *const i64,
    rank: usize,
    view: *mut kiln_tensor_view,
) -> kiln_status {
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe {
        let mut failure = None;
        let status = guard(|| {
            let ctx = arg_mut(ctx, "ctx")?;
            let view = out_ptr(view, "view")?;
            let dims = arg_slice(dims, rank, "dims")?;
            let r = output_view(ctx, index, dims);
            if let Err(f) = &r {
                failure = Some(f.message.clone());
            }
            *view = r?;
            Ok(())
        });
        if let (Some(m), Some(ctx)) = (failure, ctx.as_mut()) {
            // Sticky: a kernel that ignores the status still fails the run.
            ctx.error.get_or_insert(m);
        }
        status
    }
}

fn output_view(
    ctx: &mut kiln_kernel_context,
    index: usize,
    dims: &[i64],
) -> CResult<kiln_tensor_view> {
    let fail = |m: String| Failure::new(KILN_STATUS_RUN_FAILED, m);
    if let Outputs::Planned { slots, given } = &mut ctx.outputs {
        let slot = slots.get(index).ok_or_else(|| {
            fail(format!(
                "output index {index}: the op has {} outputs",
                slots.len()
            ))
        })?;
        if given[index] {
            return Err(fail(format!("output {index} was already requested")));
        }
        let planned: Vec<i64> = slot.shape.iter().map(|&d| d as i64).collect();
        if dims != planned.as_slice() {
            return Err(fail(format!(
                "the kernel asked for output {index} with dims {dims:?}, inconsistent with inference ({}{:?})",
                slot.dtype, slot.shape
            )));
        }
        given[index] = true;
        let view = View::new(slot.data, slot.dtype, &slot.shape);
        let c = view.to_c();
        ctx.kept.push(view);
        return Ok(c);
    }
    let Outputs::Allocated { expected, made } = &mut ctx.outputs else {
        return Err(fail("the kernel has no outputs to give".into()));
    };
    let ty = expected.get(index).ok_or_else(|| {
        fail(format!(
            "output index {index}: the op has {} outputs",
            expected.len()
        ))
    })?;
    if made[index].is_some() {
        return Err(fail(format!("output {index} was already requested")));
    }
    let consistent = dims.len() == ty.rank()
        && dims.iter().zip(&ty.shape.axes).all(|(&d, a)| match a.dim {
            Dim::Fixed(n) => d == n as i64,
            Dim::Sym(_) => d >= 0,
        });
    if !consistent {
        return Err(fail(format!(
            "the kernel asked for output {index} with dims {dims:?}, inconsistent with inference ({ty})"
        )));
    }
    // Fits in memory (or the call fails), so the byte count below cannot overflow.
    let shape = dims_from_c(dims, "dims")?;
    let n: usize = shape.iter().product();
    let buf = AlignedBuf::new(n * ty.dtype.size_in_bytes()).map_err(fail)?;
    let view = View::new(buf.ptr, ty.dtype, &shape);
    let c = view.to_c();
    made[index] = Some((buf, ty.dtype, shape));
    // The view's dims and strides must outlive the callback: keep them with the inputs'.
    ctx.kept.push(view);
    Ok(c)
}

/// `bytes` of scratch memory, 64-byte aligned, zeroed, valid until the callback returns
/// (Kiln frees it).
///
/// # Safety
/// `ctx` is the live context of the current callback; `out` is valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_kernel_context_scratch(
    ctx: *mut kiln_kernel_context,
    bytes: usize,
    out: *mut *mut c_void,
) -> kiln_status {
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe {
        guard(|| {
            let ctx = arg_mut(ctx, "ctx")?;
            let out = out_ptr(out, "out")?;
            let layout = Layout::from_size_align(bytes.max(1), 64)
                .map_err(|_| Failure::invalid(format!("{bytes} bytes of scratch is too many")))?;
            let p = alloc_zeroed(layout);
            if p.is_null() {
                return Err(Failure::new(
                    KILN_STATUS_RUN_FAILED,
                    format!("could not allocate {bytes} bytes of scratch"),
                ));
            }
            ctx.scratch.push((p, layout));
            *out = p.cast();
            Ok(())
        })
    }
}

/// The node's attributes (borrowed from the context).
///
/// # Safety
/// `ctx` is NULL or the live context of the current callback.
#[no_mangle]
pub unsafe extern "C" fn kiln_kernel_context_attrs(
    ctx: *const kiln_kernel_context,
) -> *const kiln_attrs {
    // SAFETY: NULL or the live context, as the `# Safety` section above requires.
    unsafe { context_attrs(ctx) }
}

/// Records why the kernel fails (copied); the callback then returns a non-OK status and
/// `kiln_executable_run` fails with `KILN_STATUS_RUN_FAILED`, naming the op and node and
/// quoting this.
///
/// # Safety
/// `ctx` is the live context; `msg` NULL or a string.
#[no_mangle]
pub unsafe extern "C" fn kiln_kernel_context_set_error(
    ctx: *mut kiln_kernel_context,
    msg: *const c_char,
) -> kiln_status {
    // SAFETY: the live context and a string or NULL, as the `# Safety` section requires.
    unsafe { context_set_error(ctx, msg) }
}

// ---- gradients --------------------------------------------------------------------

const NONE_VALUE: kiln_value = kiln_value {
    node: KILN_VALUE_NONE_NODE,
    output: 0,
};

fn value_at(list: &[Option<Value>], index: usize, what: &str) -> CResult<kiln_value> {
    let v = list.get(index).ok_or_else(|| {
        Failure::invalid(format!("index {index}: the node has {} {what}", list.len()))
    })?;
    Ok(v.map_or(NONE_VALUE, kiln_value::from))
}

/// How many inputs the node has; 0 for NULL.
///
/// # Safety
/// `ctx` is NULL or the live context of the current callback.
#[no_mangle]
pub unsafe extern "C" fn kiln_gradient_context_num_inputs(
    ctx: *const kiln_gradient_context,
) -> usize {
    // SAFETY: NULL or the live context, as the `# Safety` section above requires.
    unsafe { context_num_inputs(ctx) }
}

/// How many outputs the node has; 0 for NULL.
///
/// # Safety
/// `ctx` is NULL or the live context of the current callback.
#[no_mangle]
pub unsafe extern "C" fn kiln_gradient_context_num_outputs(
    ctx: *const kiln_gradient_context,
) -> usize {
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe { guard_or(0, || ctx.as_ref().map_or(0, |c| c.outputs.len())) }
}

/// The node's input `index` as a value of the graph (`node == KILN_VALUE_NONE_NODE` if
/// omitted), to use in the backward computation.
///
/// # Safety
/// `ctx` is the live context; `out` is valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_gradient_context_input(
    ctx: *const kiln_gradient_context,
    index: usize,
    out: *mut kiln_value,
) -> kiln_status {
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe {
        guard(|| {
            let ctx = arg(ctx, "ctx")?;
            let out = out_ptr(out, "out")?;
            *out = value_at(&ctx.inputs, index, "inputs")?;
            Ok(())
        })
    }
}

/// The node's output `index` (the forward result) as a value of the graph.
///
/// # Safety
/// `ctx` is the live context; `out` is valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_gradient_context_output(
    ctx: *const kiln_gradient_context,
    index: usize,
    out: *mut kiln_value,
) -> kiln_status {
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe {
        guard(|| {
            let ctx = arg(ctx, "ctx")?;
            let out = out_ptr(out, "out")?;
            let outs: Vec<Option<Value>> = ctx.outputs.iter().copied().map(Some).collect();
            *out = value_at(&outs, index, "outputs")?;
            Ok(())
        })
    }
}

/// The gradient of the loss with respect to output `index` (same type as the output), or
/// `node == KILN_VALUE_NONE_NODE` when the loss does not depend on that output.
///
/// # Safety
/// `ctx` is the live context; `out` is valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_gradient_context_output_grad(
    ctx: *const kiln_gradient_context,
    index: usize,
    out: *mut kiln_value,
) -> kiln_status {
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe {
        guard(|| {
            let ctx = arg(ctx, "ctx")?;
            let out = out_ptr(out, "out")?;
            *out = value_at(&ctx.output_grads, index, "outputs")?;
            Ok(())
        })
    }
}

/// Sets the gradient of the loss with respect to input `index`: a value the callback
/// built in the graph, of the input's dtype and rank.
///
/// # Safety
/// `ctx` is the live context of the current callback.
#[no_mangle]
pub unsafe extern "C" fn kiln_gradient_context_set_input_grad(
    ctx: *mut kiln_gradient_context,
    index: usize,
    grad: kiln_value,
) -> kiln_status {
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe {
        guard(|| {
            let ctx = arg_mut(ctx, "ctx")?;
            let n = ctx.input_grads.len();
            let slot = ctx.input_grads.get_mut(index).ok_or_else(|| {
                Failure::invalid(format!("index {index}: the node has {n} inputs"))
            })?;
            *slot = (grad.node != KILN_VALUE_NONE_NODE).then_some(Value {
                node: NodeId(grad.node),
                output: grad.output,
            });
            Ok(())
        })
    }
}

/// The node's attributes (borrowed from the context).
///
/// # Safety
/// `ctx` is NULL or the live context of the current callback.
#[no_mangle]
pub unsafe extern "C" fn kiln_gradient_context_attrs(
    ctx: *const kiln_gradient_context,
) -> *const kiln_attrs {
    // SAFETY: NULL or the live context, as the `# Safety` section above requires.
    unsafe { context_attrs(ctx) }
}

/// Records why the gradient cannot be built (copied); the callback then returns a
/// non-OK status and `kiln_graph_add_gradients` fails naming the node.
///
/// # Safety
/// `ctx` is the live context; `msg` NULL or a string.
#[no_mangle]
pub unsafe extern "C" fn kiln_gradient_context_set_error(
    ctx: *mut kiln_gradient_context,
    msg: *const c_char,
) -> kiln_status {
    // SAFETY: the live context and a string or NULL, as the `# Safety` section requires.
    unsafe { context_set_error(ctx, msg) }
}
