//! Compiling and running. A `kiln_executable` is immutable and thread-safe: any number
//! of threads may call `kiln_executable_run` on one executable at once.
use std::ffi::{c_char, CString};

use super::graph::{kiln_graph, kiln_value};
use super::tensor::{dtype_to_c, kiln_dtype, kiln_tensor};
use super::{arg, arg_mut, arg_slice, arg_str, free_handle, guard, guard_or, into_handle};
use super::{kiln_status, out_ptr, CResult, Failure};
use super::{KILN_STATUS_BUFFER_TOO_SMALL, KILN_STATUS_RUN_BAD_INPUT};
use crate::backend::{backend_with, Device, Executable};
use crate::error::Error;
use crate::interop::{HostTensor, InteropError};
use crate::ir::{Dim, Graph, NodeId, TensorType, Value};
use crate::passes::CompileOptions;
use crate::tensor::{Tensor, TensorView};

/// How to compile: the backend and the [`CompileOptions`] (passes, profiling, threads,
/// tuning).
pub struct kiln_compile_options {
    device: Device,
    options: CompileOptions,
}

/// Creates options with the defaults: backend `"cpu"`, all cores, the default pass
/// pipeline, with every `KILN_<NAME>` variable of the environment for the names
/// `kiln_compile_options_set_option` takes applied (an invalid one fails here, naming
/// it). The caller frees them with
/// `kiln_compile_options_free`.
///
/// # Safety
/// `out` is a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn kiln_compile_options_new(
    out: *mut *mut kiln_compile_options,
) -> kiln_status {
    guard(|| {
        let out = out_ptr(out, "out")?;
        let options = into_handle(kiln_compile_options {
            device: Device::Cpu,
            options: CompileOptions::from_env()?,
        });
        // SAFETY: `out` is not NULL (checked) and the header requires it writable.
        unsafe { *out = options };
        Ok(())
    })
}

/// Frees options. NULL is a no-op.
///
/// # Safety
/// `o` is NULL or a live options handle, not used again.
#[no_mangle]
pub unsafe extern "C" fn kiln_compile_options_free(o: *mut kiln_compile_options) {
    guard_or((), || {
        // SAFETY: the caller passes NULL or options from kiln_compile_options_new, once.
        unsafe { free_handle(o) }
    })
}

/// Selects the backend by name: `"cpu"` (the best CPU path), `"interp"` (the reference
/// interpreter) or `"cuda:N"`. An unknown name fails here; a known but unavailable
/// device fails at `kiln_compile` with `KILN_STATUS_DEVICE_UNAVAILABLE`
/// (`kiln_device_available` asks beforehand). On `"cuda:N"`, runs still take and
/// return host tensors: the copies to and from the device happen inside the run.
///
/// # Safety
/// `o` is a live options handle; `device` a string.
#[no_mangle]
pub unsafe extern "C" fn kiln_compile_options_set_backend(
    o: *mut kiln_compile_options,
    device: *const c_char,
) -> kiln_status {
    guard(|| {
        // SAFETY: `o` is NULL or live options no other call is using (header contract).
        let o = unsafe { arg_mut(o, "o") }?;
        // SAFETY: `device` is NULL or a NUL-terminated string, as documented.
        o.device = unsafe { arg_str(device, "device") }?.parse()?;
        Ok(())
    })
}

/// The number of threads one run may use; 0 means one per core (the same as the
/// `"threads"` option of `kiln_compile_options_set_option`). The `"cpu"` device
/// gives each executable a pool of that many threads (the calling thread is one of
/// them; idle workers sleep); when several threads run one executable at once, one run
/// uses the pool and the others run on their own thread. The `"interp"` device runs
/// each call on the calling thread.
///
/// # Safety
/// `o` is a live options handle.
#[no_mangle]
pub unsafe extern "C" fn kiln_compile_options_set_threads(
    o: *mut kiln_compile_options,
    n: u32,
) -> kiln_status {
    guard(|| {
        // SAFETY: the header makes `o` NULL or a live options handle, used by this call only.
        unsafe { arg_mut(o, "o") }?.options.threads = n as usize;
        Ok(())
    })
}

/// Sets a compile option by name, the same text as the CLI, Python and the `KILN_<NAME>`
/// environment variables take (`"tune-cache"` is read from `KILN_TUNE_CACHE`): `"passes"` (a comma-separated pipeline, e.g.
/// `"canonicalize,constant-fold,simplify,cse,dce"`; `""` runs none), `"dump-ir"`
/// (`before-all`, `after-all`, `after=p1,p2`, `changed`), `"dump-ir-dir"`,
/// `"pass-timing"` (`1`/`0`), `"disable-passes"` (`a,b`), `"rewrite-limit"` (N: apply
/// only the first N rewrites, to bisect a miscompile), `"fold-limit"`, `"verify"`
/// (`1`: verify after every pass), `"layout"` (`plain` or `nchw16c`; unset, the backend
/// chooses: `"cpu"` blocks convolutions by 16 channels), `"profile"` (the `"cpu"`
/// backend's runs: `""`/`0` off; `1` or `all` print the per-step time table to stderr
/// when the executable is freed; any other value is a path, created when compiling, that
/// receives a Chrome trace-event JSON file of every run, complete when the executable is
/// freed), `"threads"` (N; 0 or `""`: one per core), `"autotune"` (`1`: time each
/// candidate algorithm of a shape at compile time and keep the fastest in the tune
/// cache), `"tune-cache"` (the cache file; unset with `autotune`, under
/// `$XDG_CACHE_HOME/kiln`), `"tune-force"` (an algorithm name used wherever it is a
/// candidate), `"allow-fallback"` (`1`: a node no kernel covers runs the reference
/// interpreter's op, for debugging; default `0`: it fails to compile, naming it). An
/// unknown name or a bad value fails here, naming it. The `"interp"`
/// backend runs the graph as given and ignores these.
///
/// # Safety
/// `o` is a live options handle; `name` and `value` are strings.
#[no_mangle]
pub unsafe extern "C" fn kiln_compile_options_set_option(
    o: *mut kiln_compile_options,
    name: *const c_char,
    value: *const c_char,
) -> kiln_status {
    guard(|| {
        // SAFETY: `o` is a live options handle not shared during the call (# Safety).
        let o = unsafe { arg_mut(o, "o") }?;
        // SAFETY: `name` and `value` are NULL or NUL-terminated, as the header asks.
        let (name, value) = unsafe { (arg_str(name, "name")?, arg_str(value, "value")?) };
        o.options.set(name, value)?;
        Ok(())
    })
}

/// A graph input or output (or an executable's variable) as discovery reports it.
pub(crate) struct IoInfo {
    name: CString,
    ty: TensorType,
    /// Fixed sizes, -1 where symbolic.
    dims: Vec<i64>,
}

/// The `rank` reported for a value whose rank is not known until run time (an `If`
/// whose branches differ in rank, an ONNX input without a shape); no dims are given.
/// The header spells it `SIZE_MAX` (cbindgen.toml).
///
/// cbindgen:ignore
pub const KILN_RANK_UNKNOWN: usize = usize::MAX;

impl IoInfo {
    /// The rank, or [`KILN_RANK_UNKNOWN`].
    fn rank(&self) -> usize {
        if self.ty.ranked {
            self.dims.len()
        } else {
            KILN_RANK_UNKNOWN
        }
    }

    pub(crate) fn new(name: &str, ty: &TensorType) -> CResult<IoInfo> {
        Ok(IoInfo {
            name: CString::new(name)
                .map_err(|_| Failure::invalid(format!("name '{name}' contains a NUL")))?,
            dims: ty
                .shape
                .axes
                .iter()
                .map(|a| match a.dim {
                    Dim::Fixed(n) => n as i64,
                    Dim::Sym(_) => -1,
                })
                .collect(),
            ty: ty.clone(),
        })
    }
}

/// A compiled graph.
pub struct kiln_executable {
    pub(crate) exe: Box<dyn Executable>,
    inputs: Vec<IoInfo>,
    outputs: Vec<IoInfo>,
    /// The executable's variables, in its order (see `variables.rs`).
    pub(crate) variables: Vec<IoInfo>,
}

fn io_of(g: &Graph) -> CResult<(Vec<IoInfo>, Vec<IoInfo>)> {
    let inputs = g
        .inputs()
        .iter()
        .map(|&id: &NodeId| {
            let n = g.node(id);
            IoInfo::new(&n.name, &n.outputs[0])
        })
        .collect::<CResult<_>>()?;
    let outputs = g
        .outputs()
        .iter()
        .map(|o| IoInfo::new(&o.name, g.value_type(o.value)?))
        .collect::<CResult<_>>()?;
    Ok((inputs, outputs))
}

/// Verifies `g` and compiles it for the options' backend (NULL options: the defaults).
/// The executable does not refer to the graph, which may be freed or changed after.
/// On success `*out` is a new handle the caller frees with `kiln_executable_free`.
///
/// # Safety
/// `g` is a live graph not being modified; `o` NULL or live options; `out` valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_compile(
    g: *const kiln_graph,
    o: *const kiln_compile_options,
    out: *mut *mut kiln_executable,
) -> kiln_status {
    guard(|| {
        // SAFETY: `g` is NULL or a live graph that nobody modifies during the call.
        let g = &unsafe { arg(g, "g") }?.graph;
        let out = out_ptr(out, "out")?;
        // SAFETY: NULL options mean the defaults; others are a live handle (# Safety).
        let (device, options) = match unsafe { o.as_ref() } {
            Some(o) => (o.device, o.options.clone()),
            None => (Device::Cpu, CompileOptions::from_env()?),
        };
        if g.outputs().is_empty() {
            return Err(Failure::from(Error::Graph(
                "the graph has no outputs (kiln_graph_set_output)".into(),
            )));
        }
        let exe = backend_with(device, options)?.compile(g)?;
        let (inputs, outputs) = io_of(g)?;
        let variables = exe
            .variables()
            .iter()
            .map(|(name, ty)| IoInfo::new(name, ty))
            .collect::<CResult<_>>()?;
        let exe = into_handle(kiln_executable {
            exe,
            inputs,
            outputs,
            variables,
        });
        // SAFETY: `out` was checked not NULL; the caller promises a writable slot.
        unsafe { *out = exe };
        Ok(())
    })
}

/// Frees an executable. NULL is a no-op. No run may be in progress on it.
///
/// # Safety
/// `e` is NULL or a live executable, not used again.
#[no_mangle]
pub unsafe extern "C" fn kiln_executable_free(e: *mut kiln_executable) {
    guard_or((), || {
        // SAFETY: `e` is NULL or an executable from kiln_compile, freed once, not running.
        unsafe { free_handle(e) }
    })
}

/// The number of inputs `kiln_executable_run` takes; 0 for NULL.
///
/// # Safety
/// `e` is NULL or a live executable.
#[no_mangle]
pub unsafe extern "C" fn kiln_executable_input_count(e: *const kiln_executable) -> usize {
    guard_or(0, || {
        // SAFETY: `e` is NULL or a live executable; only its input list is read.
        unsafe { arg(e, "e") }.map_or(0, |e| e.inputs.len())
    })
}

/// The number of outputs `kiln_executable_run` returns; 0 for NULL.
///
/// # Safety
/// `e` is NULL or a live executable.
#[no_mangle]
pub unsafe extern "C" fn kiln_executable_output_count(e: *const kiln_executable) -> usize {
    guard_or(0, || {
        // SAFETY: `e` is NULL or a live executable; only its output list is read.
        unsafe { arg(e, "e") }.map_or(0, |e| e.outputs.len())
    })
}

/// # Safety
/// Out-pointers are NULL or valid.
pub(crate) unsafe fn write_info(
    list: &[IoInfo],
    what: &str,
    index: usize,
    name: *mut *const c_char,
    dtype: *mut kiln_dtype,
    dims: *mut *const i64,
    rank: *mut usize,
) -> CResult<()> {
    let info = list.get(index).ok_or_else(|| {
        Failure::invalid(format!(
            "index {index} is out of range: there are {} {what}s",
            list.len()
        ))
    })?;
    // Each out-pointer may be NULL: ask only for what you need.
    if !name.is_null() {
        // SAFETY: a non-NULL `name` is valid for a write (this function's contract).
        unsafe { *name = info.name.as_ptr() };
    }
    if !dtype.is_null() {
        // SAFETY: the caller passes a valid `dtype` slot when it is not NULL.
        unsafe { *dtype = dtype_to_c(info.ty.dtype) };
    }
    if !dims.is_null() {
        // SAFETY: `dims` is not NULL, so by contract it points to a writable pointer.
        unsafe { *dims = info.dims.as_ptr() };
    }
    if !rank.is_null() {
        // SAFETY: the rank goes to a non-NULL `rank`, valid as the caller promises.
        unsafe { *rank = info.rank() };
    }
    Ok(())
}

/// Describes input `index`: its name, dtype, and `rank` dims (-1 where symbolic;
/// `KILN_RANK_UNKNOWN` and no dims when even the rank is unknown). Any out-pointer may be
/// NULL. The strings and arrays belong to the executable and stay
/// valid until it is freed.
///
/// # Safety
/// `e` is a live executable; non-NULL out-pointers are valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_executable_input_info(
    e: *const kiln_executable,
    index: usize,
    name: *mut *const c_char,
    dtype: *mut kiln_dtype,
    dims: *mut *const i64,
    rank: *mut usize,
) -> kiln_status {
    guard(|| {
        // SAFETY: `e` is NULL or a live executable, as the header requires.
        let e = unsafe { arg(e, "e") }?;
        // SAFETY: the out-pointers are NULL or valid, which is write_info's contract.
        unsafe { write_info(&e.inputs, "input", index, name, dtype, dims, rank) }
    })
}

/// Describes output `index`, as `kiln_executable_input_info`.
///
/// # Safety
/// `e` is a live executable; non-NULL out-pointers are valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_executable_output_info(
    e: *const kiln_executable,
    index: usize,
    name: *mut *const c_char,
    dtype: *mut kiln_dtype,
    dims: *mut *const i64,
    rank: *mut usize,
) -> kiln_status {
    guard(|| {
        // SAFETY: the header makes `e` NULL or a live executable.
        let e = unsafe { arg(e, "e") }?;
        // SAFETY: non-NULL out-pointers are valid (# Safety), as write_info requires.
        unsafe { write_info(&e.outputs, "output", index, name, dtype, dims, rank) }
    })
}

/// Runs the executable. `inputs` are in parameter order and must match the graph's
/// inputs in dtype and shape (symbolic dims bind per run, so one executable serves every
/// batch size); they are only read, in place on the `cpu` backend (data not aligned
/// to its element size, and inputs of low-bit dtypes, are copied first). On success each `outputs[i]` receives a new tensor
/// the caller frees with `kiln_tensor_free`; on failure none is written. Thread-safe:
/// many threads may run one executable at once (runs that assign variables are
/// serialized).
///
/// # Safety
/// `e` is a live executable; `inputs` points to `n_inputs` live tensors, `outputs` to
/// `n_outputs` writable slots.
#[no_mangle]
pub unsafe extern "C" fn kiln_executable_run(
    e: *const kiln_executable,
    inputs: *const *const kiln_tensor,
    n_inputs: usize,
    outputs: *mut *mut kiln_tensor,
    n_outputs: usize,
) -> kiln_status {
    guard(|| {
        // SAFETY: `e` is NULL or a live executable; runs only read it (thread-safe).
        let e = unsafe { arg(e, "e") }?;
        // SAFETY: `inputs` holds `n_inputs` tensor pointers, as the header requires.
        let ins = unsafe { arg_slice(inputs, n_inputs, "inputs") }?;
        if outputs.is_null() && n_outputs > 0 {
            return Err(Failure::null("outputs"));
        }
        if n_inputs != e.inputs.len() {
            return Err(Failure::new(
                KILN_STATUS_RUN_BAD_INPUT,
                format!(
                    "the graph takes {} inputs, {n_inputs} given",
                    e.inputs.len()
                ),
            ));
        }
        if n_outputs != e.outputs.len() {
            return Err(Failure::new(
                KILN_STATUS_BUFFER_TOO_SMALL,
                format!(
                    "the graph has {} outputs, n_outputs is {n_outputs}",
                    e.outputs.len()
                ),
            ));
        }
        // Named only when something is wrong: a run formats nothing.
        let what = |i: usize| format!("inputs[{i}] ('{}')", e.inputs[i].name.to_string_lossy());
        // Each input is read in place (kiln_tensor_wrap's memory too) unless its
        // bytes cannot be viewed as its dtype (misaligned): those are copied first.
        fn in_place(t: &HostTensor) -> Result<TensorView<'_>, String> {
            TensorView::new(t.dtype(), t.sizes(), t.bytes())
        }
        let tried = (ins.iter().enumerate())
            .map(|(i, &t)| {
                // SAFETY: each of the `n_inputs` pointers is NULL or a live tensor (# Safety).
                let t = unsafe { t.as_ref() }.ok_or_else(|| Failure::null(&what(i)))?;
                Ok((&t.0, in_place(&t.0)))
            })
            .collect::<CResult<Vec<_>>>()?;
        let copies = (tried.iter().enumerate())
            .filter(|(_, (_, view))| view.is_err())
            .map(|(i, (t, _))| t.to_tensor(&what(i)).map(|c| (i, c)))
            .collect::<Result<Vec<(usize, Tensor)>, InteropError>>()
            .map_err(|e| Failure::new(KILN_STATUS_RUN_BAD_INPUT, e.message))?;
        let views = (tried.into_iter().enumerate())
            .map(
                |(i, (_, view))| match (view, copies.iter().find(|(k, _)| *k == i)) {
                    (Ok(v), _) => Ok(v),
                    (Err(_), Some((_, c))) => c.bytes_view().ok_or_else(|| {
                        Failure::new(KILN_STATUS_RUN_BAD_INPUT, format!("{}: not dense", what(i)))
                    }),
                    (Err(err), None) => Err(Failure::new(KILN_STATUS_RUN_BAD_INPUT, err)),
                },
            )
            .collect::<CResult<Vec<_>>>()?;
        let results = e.exe.run_views(&views).map_err(|err| match err {
            Error::InvalidArgument(m) => Failure::new(KILN_STATUS_RUN_BAD_INPUT, m),
            other => Failure::from(other),
        })?;
        let handles: Vec<kiln_tensor> = results
            .iter()
            .map(kiln_tensor::from_tensor)
            .collect::<CResult<_>>()?;
        for (i, h) in handles.into_iter().enumerate() {
            // SAFETY: `outputs` is not NULL (n_outputs > 0 here) and has n_outputs ==
            // handles.len() writable slots, as the header requires.
            unsafe { *outputs.add(i) = into_handle(h) };
        }
        Ok(())
    })
}

/// The number of inputs (parameters) of a graph; 0 for NULL.
///
/// # Safety
/// `g` is NULL or a live graph.
#[no_mangle]
pub unsafe extern "C" fn kiln_graph_input_count(g: *const kiln_graph) -> usize {
    guard_or(0, || {
        // SAFETY: `g` is NULL or a live graph; counting its inputs only reads it.
        unsafe { arg(g, "g") }.map_or(0, |g| g.graph.inputs().len())
    })
}

/// The number of outputs set on a graph; 0 for NULL.
///
/// # Safety
/// `g` is NULL or a live graph.
#[no_mangle]
pub unsafe extern "C" fn kiln_graph_output_count(g: *const kiln_graph) -> usize {
    guard_or(0, || {
        // SAFETY: the header makes `g` NULL or a live graph, read here only.
        unsafe { arg(g, "g") }.map_or(0, |g| g.graph.outputs().len())
    })
}

/// The inferred type of value `v`: its dtype, and its dims (-1 where symbolic) written to
/// `dims[0..*rank]`. If `dims_capacity` is below the rank, `*rank` is set and the status
/// is `KILN_STATUS_BUFFER_TOO_SMALL`. A value whose rank is unknown until run time gives
/// `*rank = KILN_RANK_UNKNOWN` and no dims. `dtype` may be NULL.
///
/// # Safety
/// `g` is a live graph; `dims` points to `dims_capacity` slots; `rank` is valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_graph_value_type(
    g: *const kiln_graph,
    v: kiln_value,
    dtype: *mut kiln_dtype,
    dims: *mut i64,
    dims_capacity: usize,
    rank: *mut usize,
) -> kiln_status {
    guard(|| {
        // SAFETY: `g` is NULL or a live graph not being modified (# Safety).
        let g = unsafe { arg(g, "g") }?;
        let rank = out_ptr(rank, "rank")?;
        let ty = g.graph.value_type(Value {
            node: NodeId(v.node),
            output: v.output,
        })?;
        let info = IoInfo::new("", ty)?;
        if !dtype.is_null() {
            // SAFETY: a non-NULL `dtype` is valid for a write, as documented.
            unsafe { *dtype = dtype_to_c(ty.dtype) };
        }
        if !ty.ranked {
            // SAFETY: `rank` was checked not NULL; the header requires it valid.
            unsafe { *rank = KILN_RANK_UNKNOWN };
            return Ok(());
        }
        if info.dims.len() > dims_capacity {
            // SAFETY: a too-small buffer still reports the rank: `rank` is non-NULL, valid.
            unsafe { *rank = info.dims.len() };
            return Err(Failure::new(
                KILN_STATUS_BUFFER_TOO_SMALL,
                format!("rank {} > dims_capacity {dims_capacity}", info.dims.len()),
            ));
        }
        if dims.is_null() && !info.dims.is_empty() {
            return Err(Failure::null("dims"));
        }
        // SAFETY: `dims` has `dims_capacity` >= rank slots (checked above; the header
        // promises the capacity) and is not NULL when rank > 0; `rank` is non-NULL, valid.
        unsafe {
            for (i, &d) in info.dims.iter().enumerate() {
                *dims.add(i) = d;
            }
            *rank = info.dims.len();
        }
        Ok(())
    })
}
