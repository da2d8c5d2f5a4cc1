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
use std::ffi::{c_char, c_void, CString};
use std::sync::Arc;

use crate::aligned::AlignedBuf;
use crate::capi::graph::kiln_graph;
use crate::capi::tensor::kiln_dtype;
use crate::capi::{arg_mut, arg_str, guard, guard_or, kiln_status, CResult, Failure};
use crate::capi::{KILN_STATUS_UNKNOWN_OP, KILN_STATUS_UNSUPPORTED_VERSION};
use crate::ir::ops::custom;
use crate::ir::{Attrs, TensorType, Value};

use ffi_op::{FfiCore, FfiOp};
use kernel_context::{Outputs, View};

// cbindgen reads this file's items, then these modules in turn: the blank lines keep
// rustfmt from sorting them, so the header keeps its order.
mod attrs;

mod infer_context;

mod kernel_context;

mod gradient_context;

mod ffi_op;

pub use attrs::*;
pub use gradient_context::*;
pub use infer_context::*;
pub use kernel_context::*;

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
    /// `kiln_kernel_context_scratch`'s buffers, freed with the context.
    scratch: Vec<AlignedBuf>,
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
    // SAFETY: this function's contract: `ctx` is NULL or a live context, read only.
    guard_or(0, || unsafe { ctx.as_ref() }.map_or(0, C::num_inputs))
}

/// # Safety
/// `ctx` is NULL or a live context.
unsafe fn context_attrs<C: CallbackContext>(ctx: *const C) -> *const kiln_attrs {
    guard_or(std::ptr::null(), || {
        // SAFETY: `ctx` is NULL or live (contract); the attrs it lends live as long.
        unsafe { ctx.as_ref() }.map_or(std::ptr::null(), |c| c.attrs() as *const kiln_attrs)
    })
}

/// # Safety
/// `ctx` is the live context; `msg` NULL or a NUL-terminated string.
unsafe fn context_set_error<C: CallbackContext>(ctx: *mut C, msg: *const c_char) -> kiln_status {
    guard(|| {
        // SAFETY: the caller passes the callback's live context (unshared during the
        // call) and `msg` NULL or NUL-terminated, as this function requires.
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

/// # Safety
/// `msg` is NULL or a string.
unsafe fn message(msg: *const c_char) -> String {
    if msg.is_null() {
        "(no message)".into()
    } else {
        // SAFETY: a non-NULL `msg` is NUL-terminated, as this function requires.
        unsafe { std::ffi::CStr::from_ptr(msg) }
            .to_string_lossy()
            .into_owned()
    }
}

// ---- registration -----------------------------------------------------------------

/// Reads a registration by the versioning rules (see `kiln_custom_op`).
///
/// # Safety
/// `def` points to at least `def->struct_size` readable bytes.
unsafe fn read_def(def: *const kiln_custom_op) -> CResult<kiln_custom_op> {
    if def.is_null() {
        return Err(Failure::null("def"));
    }
    // SAFETY: a non-NULL `def` has at least the 4 bytes of `struct_size` (# Safety),
    // maybe unaligned.
    let size = unsafe { std::ptr::read_unaligned(def.cast::<u32>()) } as usize;
    let ours = std::mem::size_of::<kiln_custom_op>();
    if size < MIN_SIZE {
        return Err(Failure::new(
        KILN_STATUS_UNSUPPORTED_VERSION,
        format!(
            "def->struct_size is {size}: a kiln_custom_op has at least {MIN_SIZE} bytes (KILN_CUSTOM_OP_MIN_SIZE; set struct_size = sizeof(kiln_custom_op))"
        ),
    ));
    }
    // SAFETY: all-zero is a valid kiln_custom_op (NULL pointers, no callbacks); the
    // caller's struct has `size` readable bytes, and at most `ours` go into `d`.
    let d = unsafe {
        let mut d: kiln_custom_op = std::mem::zeroed();
        std::ptr::copy_nonoverlapping(
            def.cast::<u8>(),
            (&mut d as *mut kiln_custom_op).cast::<u8>(),
            size.min(ours),
        );
        d
    };
    if size > ours {
        // SAFETY: bytes ours..size of the caller's struct, readable by the same promise.
        let tail = unsafe { std::slice::from_raw_parts(def.cast::<u8>().add(ours), size - ours) };
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
    guard(|| {
        // SAFETY: `def` is NULL or has `struct_size` readable bytes, read_def's contract.
        let d = unsafe { read_def(def) }?;
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
    guard(|| {
        // SAFETY: `domain` and `name` are NULL or NUL-terminated strings (# Safety).
        let (domain, name) = unsafe { (arg_str(domain, "domain")?, arg_str(name, "name")?) };
        let q = custom::qualified(domain, name);
        match custom::unregister(&q) {
            Some(_) => Ok(()),
            None => Err(Failure::new(
                KILN_STATUS_UNKNOWN_OP,
                format!("no op '{q}' is registered"),
            )),
        }
    })
}
