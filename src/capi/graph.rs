//! Graph building. A `kiln_graph` is single-writer: calls on one graph must not overlap
//! (different graphs may be built on different threads at once).
use std::ffi::{c_char, c_void, CString};

use super::tensor::{dims_from_c, dtype_from_c, kiln_dtype};
use super::{arg, arg_mut, arg_slice, arg_str, free_handle, guard, guard_or, into_handle};
use super::{kiln_status, out_ptr, CResult, Failure, KILN_STATUS_BUFFER_TOO_SMALL};
use crate::ir::{text, Attr, Attrs, Dim, Graph, Node, NodeId, Shape, TensorType, Value};
use crate::tensor::Tensor;

/// A graph under construction.
pub struct kiln_graph {
    pub(crate) graph: Graph,
}

/// An output of a node: `output` of node `node`. As an op input, `KILN_VALUE_NONE`
/// (`node == UINT32_MAX`) omits an optional operand.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kiln_value {
    pub node: u32,
    pub output: u32,
}

/// `kiln_value.node` of an omitted optional input.
pub const KILN_VALUE_NONE_NODE: u32 = u32::MAX;

impl From<Value> for kiln_value {
    fn from(v: Value) -> kiln_value {
        kiln_value {
            node: v.node.0,
            output: v.output,
        }
    }
}

/// Which field of a `kiln_attr` holds its value.
pub type kiln_attr_kind = u32;

/// `i`.
pub const KILN_ATTR_INT: kiln_attr_kind = 0;
/// `f`.
pub const KILN_ATTR_FLOAT: kiln_attr_kind = 1;
/// `s` (NUL-terminated UTF-8).
pub const KILN_ATTR_STRING: kiln_attr_kind = 2;
/// `ints[0..len]`.
pub const KILN_ATTR_INTS: kiln_attr_kind = 3;
/// `floats[0..len]`.
pub const KILN_ATTR_FLOATS: kiln_attr_kind = 4;
/// `strings[0..len]` (e.g. `axis_names`).
pub const KILN_ATTR_STRINGS: kiln_attr_kind = 5;

/// One attribute of an op: its name, its kind, and the one field the kind selects (the
/// others are ignored). Kiln copies everything it needs during the call.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kiln_attr {
    pub name: *const c_char,
    pub kind: kiln_attr_kind,
    pub i: i64,
    pub f: f64,
    pub s: *const c_char,
    pub ints: *const i64,
    pub floats: *const f64,
    pub len: usize,
    pub strings: *const *const c_char,
}

/// # Safety
/// The pointers the kind selects are valid as `kiln_attr` documents.
unsafe fn attr_from_c(a: &kiln_attr, i: usize) -> CResult<(String, Attr)> {
    // SAFETY: `a.name` is NULL or a NUL-terminated string (kiln_attr's contract).
    let name = unsafe { arg_str(a.name, &format!("attrs[{i}].name")) }?.to_string();
    let at = |field: &str| format!("attrs[{i}] ('{name}').{field}");
    let value = match a.kind {
        KILN_ATTR_INT => Attr::Int(a.i),
        KILN_ATTR_FLOAT => Attr::Float(a.f),
        // SAFETY: for a string attribute `s` is NULL or NUL-terminated (kind selects it).
        KILN_ATTR_STRING => Attr::String(unsafe { arg_str(a.s, &at("s")) }?.to_string()),
        // SAFETY: for KILN_ATTR_INTS, `ints` points to `len` values (kiln_attr's docs).
        KILN_ATTR_INTS => Attr::Ints(unsafe { arg_slice(a.ints, a.len, &at("ints")) }?.to_vec()),
        KILN_ATTR_FLOATS => {
            // SAFETY: the floats kind promises `len` f64s at `floats`.
            let floats = unsafe { arg_slice(a.floats, a.len, &at("floats")) }?;
            Attr::Floats(floats.to_vec())
        }
        KILN_ATTR_STRINGS => {
            // SAFETY: the strings kind promises `len` string pointers at `strings`.
            let ptrs = unsafe { arg_slice(a.strings, a.len, &at("strings")) }?;
            let mut v = Vec::with_capacity(ptrs.len());
            for (k, &p) in ptrs.iter().enumerate() {
                // SAFETY: each entry of `strings` is NULL or a NUL-terminated string.
                v.push(unsafe { arg_str(p, &at(&format!("strings[{k}]"))) }?.to_string());
            }
            Attr::Strings(v)
        }
        k => {
            return Err(Failure::invalid(format!(
                "{}: {k} is not a kiln_attr_kind (0..=5)",
                at("kind")
            )))
        }
    };
    Ok((name, value))
}

/// # Safety
/// `p` is NULL or a NUL-terminated string.
unsafe fn name_arg<'a>(p: *const c_char, arg: &str) -> CResult<&'a str> {
    if p.is_null() {
        Ok("")
    } else {
        // SAFETY: a non-NULL `p` is NUL-terminated, this function's contract.
        unsafe { arg_str(p, arg) }
    }
}

/// Creates an empty graph. On success `*out` is a new handle the caller frees with
/// `kiln_graph_free`.
///
/// # Safety
/// `out` is a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn kiln_graph_new(out: *mut *mut kiln_graph) -> kiln_status {
    guard(|| {
        let out = out_ptr(out, "out")?;
        let g = into_handle(kiln_graph {
            graph: Graph::new("graph"),
        });
        // SAFETY: `out` is non-NULL (checked) and valid for a write (# Safety).
        unsafe { *out = g };
        Ok(())
    })
}

/// Parses a graph from `.kir` text (see `kiln print`); errors give line and column.
/// On success `*out` is a new handle the caller frees with `kiln_graph_free`.
///
/// # Safety
/// `text` is a NUL-terminated string; `out` is a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn kiln_graph_parse(
    text: *const c_char,
    out: *mut *mut kiln_graph,
) -> kiln_status {
    guard(|| {
        let out = out_ptr(out, "out")?;
        // SAFETY: `text` is NULL or a NUL-terminated string, as the header requires.
        let graph = text::parse(unsafe { arg_str(text, "text") }?, "<text>", None)?;
        // SAFETY: `out` was checked not NULL; the caller made it writable.
        unsafe { *out = into_handle(kiln_graph { graph }) };
        Ok(())
    })
}

/// Imports the ONNX model at `path` (external data files are read from its folder and
/// may not leave it). On success `*out` is a new graph the caller frees with
/// `kiln_graph_free`; an unsupported op, opset or dtype is an error naming the node.
///
/// # Safety
/// `path` is a NUL-terminated string; `out` is a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn kiln_graph_import_onnx(
    path: *const c_char,
    out: *mut *mut kiln_graph,
) -> kiln_status {
    guard(|| {
        let out = out_ptr(out, "out")?;
        // SAFETY: the header makes `path` NULL or a NUL-terminated string.
        let path = std::path::Path::new(unsafe { arg_str(path, "path") }?);
        let graph = crate::frontend::onnx::import_file(path)?;
        // SAFETY: the imported graph goes to `out`, non-NULL and writable by contract.
        unsafe { *out = into_handle(kiln_graph { graph }) };
        Ok(())
    })
}

/// Imports a serialized ONNX model from memory (`len` bytes at `data`, copied as needed).
/// A model with external data needs `kiln_graph_import_onnx`. On success `*out` is a new
/// graph the caller frees with `kiln_graph_free`.
///
/// # Safety
/// `data` points to `len` bytes; `out` is a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn kiln_graph_import_onnx_bytes(
    data: *const c_void,
    len: usize,
    out: *mut *mut kiln_graph,
) -> kiln_status {
    guard(|| {
        let out = out_ptr(out, "out")?;
        // SAFETY: `data` points to `len` readable bytes (# Safety), borrowed for the call.
        let bytes = unsafe { arg_slice(data.cast::<u8>(), len, "data") }?;
        let graph = crate::frontend::onnx::import_bytes(bytes, None)?;
        // SAFETY: `out` is a valid, non-NULL slot for the new handle.
        unsafe { *out = into_handle(kiln_graph { graph }) };
        Ok(())
    })
}

/// Frees a graph. NULL is a no-op. Executables compiled from it stay valid.
///
/// # Safety
/// `g` is NULL or a live graph handle, not used again.
#[no_mangle]
pub unsafe extern "C" fn kiln_graph_free(g: *mut kiln_graph) {
    guard_or((), || {
        // SAFETY: `g` is NULL or a graph handle of Kiln's, not used after this call.
        unsafe { free_handle(g) }
    })
}

/// Adds a graph input. `dims[i] == -1` makes axis `i` symbolic; `axis_names` may be NULL
/// (and any entry NULL) for unnamed axes. A named symbolic axis uses its name as the
/// symbol, so equal names share one size; an unnamed one gets its own symbol. Inputs
/// are fed to `kiln_executable_run` in the order they were added. Names must be unique
/// (NULL or "" picks one). On success `*out` is the parameter's value.
///
/// # Safety
/// `g` is a live graph; `name` NULL or a string; `dims` (and `axis_names` unless NULL)
/// point to `rank` entries; `out` is valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_graph_add_parameter(
    g: *mut kiln_graph,
    name: *const c_char,
    dtype: kiln_dtype,
    dims: *const i64,
    axis_names: *const *const c_char,
    rank: usize,
    out: *mut kiln_value,
) -> kiln_status {
    guard(|| {
        // SAFETY: `g` is NULL or a live graph; graphs are single-writer (module docs).
        let g = unsafe { arg_mut(g, "g") }?;
        let out = out_ptr(out, "out")?;
        // SAFETY: `name` is NULL or a NUL-terminated string, as documented.
        let mut name = unsafe { name_arg(name, "name") }?.to_string();
        if name.is_empty() {
            name = format!("input{}", g.graph.inputs().len());
        }
        let dtype = dtype_from_c(dtype, "dtype")?;
        // SAFETY: `dims` points to `rank` values (# Safety); so `rank` is no bigger than
        // the caller's own array, which bounds the vectors below.
        let dims = unsafe { arg_slice(dims, rank, "dims") }?;
        let names: Vec<Option<String>> = if axis_names.is_null() {
            vec![None; rank]
        } else {
            // SAFETY: a non-NULL `axis_names` has `rank` entries, as the header says.
            let ptrs = unsafe { arg_slice(axis_names, rank, "axis_names") }?;
            let mut v = Vec::with_capacity(rank);
            for (i, &p) in ptrs.iter().enumerate() {
                // SAFETY: each axis name is NULL (unnamed) or a NUL-terminated string.
                let s = unsafe { name_arg(p, &format!("axis_names[{i}]")) }?;
                v.push((!s.is_empty()).then(|| s.to_string()));
            }
            v
        };
        let mut shape_dims = Vec::with_capacity(rank);
        for (i, &d) in dims.iter().enumerate() {
            shape_dims.push(match (d, &names[i]) {
                (-1, Some(axis)) => Dim::Sym(axis.clone()),
                (-1, None) => Dim::Sym(format!("{name}.{i}")),
                (d, _) if d >= 0 => Dim::Fixed(d as usize),
                (d, _) => {
                    return Err(Failure::invalid(format!(
                        "dims[{i}] is {d}: a dim is >= 0, or -1 for symbolic"
                    )))
                }
            });
        }
        let ty = TensorType::new(dtype, Shape::named(shape_dims, names));
        let id = g.graph.add_parameter(&name, ty)?;
        // SAFETY: `out` is non-NULL (out_ptr) and valid for a kiln_value (# Safety).
        unsafe { *out = Value::from(id).into() };
        Ok(())
    })
}

/// # Safety
/// As `kiln_graph_add_constant`.
#[allow(clippy::too_many_arguments)]
unsafe fn add_data_node(
    g: *mut kiln_graph,
    name: *const c_char,
    dtype: kiln_dtype,
    dims: *const i64,
    rank: usize,
    data: *const c_void,
    nbytes: usize,
    out: *mut kiln_value,
    variable: bool,
) -> CResult<()> {
    // SAFETY: as kiln_graph_add_constant's contract: `g` NULL or live, single-writer.
    let g = unsafe { arg_mut(g, "g") }?;
    let out = out_ptr(out, "out")?;
    // SAFETY: the node's `name` is NULL or NUL-terminated (the exports' contract).
    let name = unsafe { name_arg(name, "name") }?;
    let dtype = dtype_from_c(dtype, "dtype")?;
    // SAFETY: `dims` has `rank` entries, per the constant/variable contract.
    let shape = dims_from_c(unsafe { arg_slice(dims, rank, "dims") }?, "dims")?;
    // SAFETY: `data` points to `nbytes` readable bytes, copied before returning.
    let bytes = unsafe { arg_slice(data.cast::<u8>(), nbytes, "data") }?;
    let value = Tensor::from_le_bytes(dtype, &shape, bytes)
        .map_err(|e| Failure::invalid(format!("data: {e}")))?;
    let ty = TensorType::new(dtype, Shape::fixed(&shape));
    let id = if variable {
        g.graph.add_variable(name, ty, value)?
    } else {
        g.graph.add_constant(name, ty, value)?
    };
    // SAFETY: the new node's value goes to `out`, checked non-NULL and valid by contract.
    unsafe { *out = Value::from(id).into() };
    Ok(())
}

/// Adds a constant of static shape `dims`, copying `nbytes` of row-major little-endian
/// `data` (which must be exactly the tensor's size; bools are bytes 0 or 1). NULL or ""
/// `name` picks one. On success `*out` is its value.
///
/// # Safety
/// `g` is a live graph; `dims` points to `rank` values; `data` to `nbytes` bytes.
#[no_mangle]
pub unsafe extern "C" fn kiln_graph_add_constant(
    g: *mut kiln_graph,
    name: *const c_char,
    dtype: kiln_dtype,
    dims: *const i64,
    rank: usize,
    data: *const c_void,
    nbytes: usize,
    out: *mut kiln_value,
) -> kiln_status {
    guard(|| {
        // SAFETY: this export's contract is add_data_node's (`data` has `nbytes` bytes).
        unsafe { add_data_node(g, name, dtype, dims, rank, data, nbytes, out, false) }
    })
}

/// Adds a variable: state that persists across runs of one executable, starting from a
/// copy of `initial` (as `kiln_graph_add_constant`'s data) and changed only by `Assign`
/// ops. Each executable has its own copy of the state.
///
/// # Safety
/// As `kiln_graph_add_constant`.
#[no_mangle]
pub unsafe extern "C" fn kiln_graph_add_variable(
    g: *mut kiln_graph,
    name: *const c_char,
    dtype: kiln_dtype,
    dims: *const i64,
    rank: usize,
    initial: *const c_void,
    nbytes: usize,
    out: *mut kiln_value,
) -> kiln_status {
    guard(|| {
        // SAFETY: as for constants, with `initial` pointing to `nbytes` bytes.
        unsafe { add_data_node(g, name, dtype, dims, rank, initial, nbytes, out, true) }
    })
}

/// Applies catalogue op `op_type` (see `kiln ops`), or the external op registered as
/// `"domain::name"` (`kiln_register_op`; the graph then keeps it alive), to `inputs`,
/// with `attrs`. Output
/// types are inferred now, so a bad operand, attribute or shape fails here with a message
/// naming the node. On success the node's outputs are written to
/// `outputs[0..*n_outputs]`; if `outputs_capacity` is too small nothing is added,
/// `*n_outputs` says how many are needed and the status is
/// `KILN_STATUS_BUFFER_TOO_SMALL`. An input with `node == KILN_VALUE_NONE_NODE` omits an
/// optional operand.
///
/// # Safety
/// `g` is a live graph; `op_type` a string; `inputs`, `attrs` and `outputs` point to
/// `n_inputs`, `n_attrs` and `outputs_capacity` entries; `n_outputs` is valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_graph_add_op(
    g: *mut kiln_graph,
    op_type: *const c_char,
    inputs: *const kiln_value,
    n_inputs: usize,
    attrs: *const kiln_attr,
    n_attrs: usize,
    outputs: *mut kiln_value,
    outputs_capacity: usize,
    n_outputs: *mut usize,
) -> kiln_status {
    let args = OpArgs {
        op_type,
        inputs,
        n_inputs,
        attrs,
        n_attrs,
        outputs,
        outputs_capacity,
        n_outputs,
    };
    // SAFETY: add_op_with's contract is this export's, which the caller upholds.
    guard(|| unsafe { add_op_with(g, args, Attrs::new()) })
}

/// The arguments of [`kiln_graph_add_op`] after `g`, as C passed them.
pub(crate) struct OpArgs {
    pub(crate) op_type: *const c_char,
    pub(crate) inputs: *const kiln_value,
    pub(crate) n_inputs: usize,
    pub(crate) attrs: *const kiln_attr,
    pub(crate) n_attrs: usize,
    pub(crate) outputs: *mut kiln_value,
    pub(crate) outputs_capacity: usize,
    pub(crate) n_outputs: *mut usize,
}

/// [`kiln_graph_add_op`] with attributes `extra` besides the C ones (graph attributes).
///
/// # Safety
/// As for [`kiln_graph_add_op`].
pub(crate) unsafe fn add_op_with(g: *mut kiln_graph, args: OpArgs, extra: Attrs) -> CResult<()> {
    let OpArgs {
        op_type,
        inputs,
        n_inputs,
        attrs,
        n_attrs,
        outputs,
        outputs_capacity,
        n_outputs,
    } = args;
    // SAFETY: `g` is NULL or a live graph that only this call writes.
    let g = unsafe { arg_mut(g, "g") }?;
    // SAFETY: `op_type` is NULL or a NUL-terminated string (# Safety of the exports).
    let op = unsafe { arg_str(op_type, "op_type") }?;
    let n_out = out_ptr(n_outputs, "n_outputs")?;
    if outputs.is_null() && outputs_capacity > 0 {
        return Err(Failure::null("outputs"));
    }
    // SAFETY: `inputs` points to `n_inputs` kiln_values, read and copied here.
    let ins: Vec<Option<Value>> = unsafe { arg_slice(inputs, n_inputs, "inputs") }?
        .iter()
        .map(|v| {
            (v.node != KILN_VALUE_NONE_NODE).then_some(Value {
                node: NodeId(v.node),
                output: v.output,
            })
        })
        .collect();
    let mut attr_map = extra;
    // SAFETY: `attrs` points to `n_attrs` entries, as the header requires.
    let c_attrs = unsafe { arg_slice(attrs, n_attrs, "attrs") }?;
    for (i, a) in c_attrs.iter().enumerate() {
        // SAFETY: each attribute's selected pointers are valid (kiln_attr's docs).
        let (name, value) = unsafe { attr_from_c(a, i) }?;
        if attr_map.get(&name).is_some() {
            return Err(Failure::invalid(format!(
                "attrs[{i}]: attribute '{name}' is given twice"
            )));
        }
        attr_map.set(&name, value);
    }
    // Infer first, so that a too-small output array adds nothing.
    let probe = Node {
        name: String::new(),
        op: op.to_string(),
        inputs: ins.clone(),
        attrs: attr_map.clone(),
        outputs: vec![],
        control_deps: vec![],
        data: None,
    };
    let count = match g.graph.infer_node(&probe) {
        Ok(types) => types.len(),
        // Let add_op produce the error, which names the node.
        Err(_) => 0,
    };
    if count > outputs_capacity {
        // SAFETY: `n_outputs` was checked non-NULL; the caller made it writable.
        unsafe { *n_out = count };
        return Err(Failure::new(
            KILN_STATUS_BUFFER_TOO_SMALL,
            format!("{op} has {count} outputs; outputs_capacity is {outputs_capacity}"),
        ));
    }
    let id = g.graph.add_op(op, &ins, attr_map, "")?;
    let count = g.graph.node(id).outputs.len();
    if count > outputs_capacity {
        // The probe above infers the same node, so this is a bug, not a user's error.
        return Err(Failure::from(crate::error::Error::Graph(format!(
            "{op} has {count} outputs after the probe found fewer"
        ))));
    }
    // SAFETY: count <= outputs_capacity (checked), the slots `outputs` has (non-NULL
    // when count > 0, checked first); `n_out` is non-NULL and writable.
    unsafe {
        for i in 0..count {
            *outputs.add(i) = id.out(i as u32).into();
        }
        *n_out = count;
    }
    Ok(())
}

/// Orders node `node` after node `after` although no value flows between them (used to
/// order `Assign`s and the reads around them). `after` must be added before `node`.
///
/// # Safety
/// `g` is a live graph.
#[no_mangle]
pub unsafe extern "C" fn kiln_graph_add_control_dependency(
    g: *mut kiln_graph,
    node: u32,
    after: u32,
) -> kiln_status {
    guard(|| {
        // SAFETY: the header makes `g` NULL or a live graph with a single writer.
        let g = unsafe { arg_mut(g, "g") }?;
        Ok(g.graph.add_control_dep(NodeId(node), NodeId(after))?)
    })
}

/// Appends to `g` the reverse-mode gradient of `loss` (a float value with one element)
/// with respect to each of `wrt[0..n]` (parameters or variables of float type) and
/// writes the gradient values to `grads_out[0..n]`, in order. A `wrt` the loss does not
/// depend on gets zeros. A non-scalar loss, a `wrt` that is not a parameter or variable,
/// a path through an op without a gradient rule or only through integer values fail
/// with `KILN_STATUS_INVALID_GRAPH` and a message naming the node; then `grads_out` is
/// left untouched (the graph may have gained unused nodes).
///
/// # Safety
/// `g` is a live graph; `wrt` and `grads_out` point to `n` entries.
#[no_mangle]
pub unsafe extern "C" fn kiln_graph_add_gradients(
    g: *mut kiln_graph,
    loss: kiln_value,
    wrt: *const kiln_value,
    n: usize,
    grads_out: *mut kiln_value,
) -> kiln_status {
    guard(|| {
        // SAFETY: `g` is a live graph (or NULL) that nothing else uses during the call.
        let g = unsafe { arg_mut(g, "g") }?;
        // SAFETY: `wrt` points to `n` values (# Safety), copied at once.
        let wrt: Vec<Value> = unsafe { arg_slice(wrt, n, "wrt") }?
            .iter()
            .map(|v| Value {
                node: NodeId(v.node),
                output: v.output,
            })
            .collect();
        if grads_out.is_null() && n > 0 {
            return Err(Failure::null("grads_out"));
        }
        let loss = Value {
            node: NodeId(loss.node),
            output: loss.output,
        };
        let grads = crate::autodiff::grad(&mut g.graph, loss, &wrt)?;
        for (i, v) in grads.into_iter().enumerate() {
            // SAFETY: grad gives one value per `wrt`, so i < n, and `grads_out` (non-NULL
            // when n > 0) has `n` writable slots.
            unsafe { *grads_out.add(i) = v.into() };
        }
        Ok(())
    })
}

/// Marks `v` as a graph output called `name` (unique and non-empty). Outputs are returned
/// by `kiln_executable_run` in the order they were set.
///
/// # Safety
/// `g` is a live graph; `name` a string.
#[no_mangle]
pub unsafe extern "C" fn kiln_graph_set_output(
    g: *mut kiln_graph,
    name: *const c_char,
    v: kiln_value,
) -> kiln_status {
    guard(|| {
        // SAFETY: `g` is NULL or a live graph that this call alone writes.
        let g = unsafe { arg_mut(g, "g") }?;
        // SAFETY: the output's `name` is NULL or a NUL-terminated string (# Safety).
        let name = unsafe { arg_str(name, "name") }?;
        let v = Value {
            node: NodeId(v.node),
            output: v.output,
        };
        Ok(g.graph.add_output(name, v)?)
    })
}

/// `render(g)` as a new C string in `*out`: what `kiln_graph_to_text` and
/// `kiln_graph_to_dot` return.
///
/// # Safety
/// `out` is NULL (an error) or valid for a write.
unsafe fn write_text(
    g: &kiln_graph,
    out: *mut *mut c_char,
    render: fn(&Graph) -> String,
    what: &str,
) -> CResult<()> {
    let out = out_ptr(out, "out")?;
    let s = CString::new(render(&g.graph))
        .map_err(|_| Failure::invalid(format!("the graph's {what} contains a NUL byte")))?;
    // SAFETY: the caller's contract: `out` is valid for a write (checked not NULL).
    unsafe { *out = s.into_raw() };
    Ok(())
}

/// The graph as `.kir` text (deterministic; what `kiln print` shows). On success `*out`
/// is a new string the caller frees with `kiln_string_free`.
///
/// # Safety
/// `g` is a live graph; `out` is valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_graph_to_text(
    g: *const kiln_graph,
    out: *mut *mut c_char,
) -> kiln_status {
    guard(|| {
        // SAFETY: `g` is NULL or a live graph, only read while printing.
        let g = unsafe { arg(g, "g") }?;
        // SAFETY: `out` is NULL (an error) or valid for a write, write_text's contract.
        unsafe { write_text(g, out, text::print, "text") }
    })
}

/// The graph as Graphviz DOT text (deterministic; what `kiln viz` writes as .dot):
/// each node a box named `n<node>`, large graphs collapsed by name scope to at most 80
/// top-level boxes. On success `*out` is a new string the caller frees with
/// `kiln_string_free`.
///
/// # Safety
/// `g` is a live graph; `out` is valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_graph_to_dot(
    g: *const kiln_graph,
    out: *mut *mut c_char,
) -> kiln_status {
    guard(|| {
        // SAFETY: the header makes `g` NULL or a live graph; DOT rendering only reads it.
        let g = unsafe { arg(g, "g") }?;
        // SAFETY: as the header requires, `out` is valid for one write.
        unsafe { write_text(g, out, crate::ir::dot::to_dot, "DOT text") }
    })
}

/// Frees a string returned by Kiln. NULL is a no-op.
///
/// # Safety
/// `s` is NULL or a string Kiln returned as caller-owned, not used again.
#[no_mangle]
pub unsafe extern "C" fn kiln_string_free(s: *mut c_char) {
    guard_or((), || {
        if !s.is_null() {
            // SAFETY: a non-NULL `s` came from CString::into_raw in Kiln (write_text and
            // the like) and is freed once, as the header requires.
            drop(unsafe { CString::from_raw(s) });
        }
    })
}

/// The value of the graph's input (parameter) `index`, in the order inputs are fed to
/// `kiln_executable_run`: how a program finds the inputs of an imported graph (to feed
/// them or differentiate with respect to them). `KILN_STATUS_INVALID_ARGUMENT` past the
/// last input.
///
/// # Safety
/// `g` is a live graph; `out` is valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_graph_input_value(
    g: *const kiln_graph,
    index: usize,
    out: *mut kiln_value,
) -> kiln_status {
    guard(|| {
        // SAFETY: `g` is NULL or a live graph; its inputs are only read.
        let g = unsafe { arg(g, "g") }?;
        let out = out_ptr(out, "out")?;
        let inputs = g.graph.inputs();
        let id = inputs.get(index).ok_or_else(|| {
            Failure::invalid(format!(
                "index {index}: the graph has {} inputs",
                inputs.len()
            ))
        })?;
        // SAFETY: `out` is non-NULL (checked) and points to a writable kiln_value.
        unsafe { *out = Value::from(*id).into() };
        Ok(())
    })
}

/// The value behind the graph's output `index` (in the order outputs were set or
/// imported), e.g. to build a loss on an imported model's prediction.
/// `KILN_STATUS_INVALID_ARGUMENT` past the last output.
///
/// # Safety
/// `g` is a live graph; `out` is valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_graph_output_value(
    g: *const kiln_graph,
    index: usize,
    out: *mut kiln_value,
) -> kiln_status {
    guard(|| {
        // SAFETY: the header makes `g` NULL or a live graph, read here.
        let g = unsafe { arg(g, "g") }?;
        let out = out_ptr(out, "out")?;
        let outputs = g.graph.outputs();
        let o = outputs.get(index).ok_or_else(|| {
            Failure::invalid(format!(
                "index {index}: the graph has {} outputs",
                outputs.len()
            ))
        })?;
        // SAFETY: the output's value goes to `out`, a valid slot (checked non-NULL).
        unsafe { *out = o.value.into() };
        Ok(())
    })
}
