//! `kiln.Tensor`: a Kiln host tensor in Python, and DLPack both ways through
//! `kiln::interop::dlpack`: a C-contiguous producer's memory is wrapped, a strided one
//! copied once, and exports never copy (unless asked to).
use crate::arrays::{numpy_dtype, numpy_name, Borrowed};
use crate::errors::{interop_error, InvalidArgument, Unsupported};
use kiln::interop::dlpack::{
    export_legacy, export_versioned, import_legacy, import_versioned, DLManagedTensor,
    DLManagedTensorVersioned, DLPACK_FLAG_BITMASK_READ_ONLY, DLPACK_VERSION, DL_CPU,
};
use kiln::interop::HostTensor;
use kiln::TensorType;
use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use std::ffi::{c_void, CStr};
use std::ptr::NonNull;

/// The capsule names of the Python DLPack protocol: a consumer renames the capsule to
/// the `used_` name once it owns the managed tensor.
const VERSIONED: &CStr = c"dltensor_versioned";
const USED_VERSIONED: &CStr = c"used_dltensor_versioned";
const LEGACY: &CStr = c"dltensor";
const USED_LEGACY: &CStr = c"used_dltensor";

/// A tensor in Kiln's memory or lent by another library through DLPack.
#[pyclass(module = "kiln", name = "Tensor", frozen)]
pub(crate) struct PyTensor {
    tensor: HostTensor,
    /// The producer marked its memory read-only (a read-only NumPy array), even when
    /// its strides made Kiln copy it.
    read_only: bool,
}

impl PyTensor {
    fn data(&self) -> *mut u8 {
        self.tensor.data_ptr()
    }

    /// A tensor over `obj`'s memory through its `__dlpack__` (a versioned capsule, or a
    /// legacy one from a producer older than DLPack 1.0).
    pub(crate) fn from_dlpack(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        let kwargs = PyDict::new(py);
        kwargs.set_item("max_version", (1, 0))?;
        let failed = |e: PyErr| Unsupported::new_err(format!("obj: its __dlpack__ failed: {e}"));
        let capsule = match obj.call_method("__dlpack__", (), Some(&kwargs)) {
            Ok(c) => c,
            // Producers from before DLPack 1.0 take no max_version.
            Err(e) if e.is_instance_of::<PyTypeError>(py) => {
                obj.call_method0("__dlpack__").map_err(failed)?
            }
            Err(e) => return Err(failed(e)),
        };
        consume(&capsule)
    }
}

/// The managed tensor a capsule named `name` holds (capsules never hold NULL).
///
/// # Safety
/// `capsule` is a live object.
unsafe fn capsule_pointer<T>(capsule: *mut ffi::PyObject, name: &CStr) -> Option<NonNull<T>> {
    // SAFETY: the caller's contract; checking the name first makes the read valid.
    let valid = unsafe { ffi::PyCapsule_IsValid(capsule, name.as_ptr()) } == 1;
    // SAFETY: a valid capsule of that name.
    let pointer = valid.then(|| unsafe { ffi::PyCapsule_GetPointer(capsule, name.as_ptr()) });
    pointer.and_then(|p| NonNull::new(p.cast()))
}

/// Imports the managed tensor in `capsule`, and marks the capsule used once Kiln owns it.
/// On failure the capsule is left as it is, so that its destructor deletes the tensor.
fn consume(capsule: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
    let ptr = capsule.as_ptr();
    // SAFETY: `capsule` keeps `ptr` alive.
    let versioned = unsafe { capsule_pointer::<DLManagedTensorVersioned>(ptr, VERSIONED) };
    // SAFETY: `capsule` keeps `ptr` alive for this second name check too.
    let legacy = unsafe { capsule_pointer::<DLManagedTensor>(ptr, LEGACY) };
    let (tensor, read_only, used) = match (versioned, legacy) {
        (Some(managed), _) => {
            // The flags are read before the import, which may delete the tensor at once.
            // SAFETY: an unused capsule of a DLPack name holds a live managed tensor, as
            // the protocol says; the flags are read only where 1.x lays them out.
            let read_only = unsafe {
                let m = managed.as_ref();
                m.version.major == DLPACK_VERSION.major
                    && m.flags & DLPACK_FLAG_BITMASK_READ_ONLY != 0
            };
            // SAFETY: that live managed tensor; on success it is Kiln's.
            let tensor = unsafe { import_versioned(managed, "src") }.map_err(interop_error)?;
            (tensor, read_only, USED_VERSIONED)
        }
        (None, Some(managed)) => {
            // SAFETY: the capsule's unused pre-1.0 managed tensor; on success Kiln's.
            let tensor = unsafe { import_legacy(managed, "src") }.map_err(interop_error)?;
            (tensor, false, USED_LEGACY)
        }
        (None, None) => {
            return Err(InvalidArgument::new_err(format!(
                "obj: __dlpack__ gave {}, not an unused 'dltensor_versioned' or 'dltensor' capsule",
                capsule.repr()?
            )))
        }
    };
    // SAFETY: a live capsule; the static `used` name says Kiln took the tensor.
    unsafe { ffi::PyCapsule_SetName(ptr, used.as_ptr()) };
    Ok(PyTensor { tensor, read_only })
}

/// A capsule's destructor: deletes the managed tensor unless a consumer took it (and
/// renamed the capsule).
unsafe extern "C" fn drop_versioned_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: the capsule is being destroyed, so still live.
    let managed = unsafe { capsule_pointer(capsule, VERSIONED) };
    if let Some(managed) = managed {
        // SAFETY: under its unused name it holds the export `__dlpack__` made, deleted
        // only here.
        unsafe { delete_versioned(managed) }
    }
}

unsafe extern "C" fn drop_legacy_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: a capsule being destroyed is live until this returns.
    let managed = unsafe { capsule_pointer(capsule, LEGACY) };
    if let Some(managed) = managed {
        // SAFETY: the unconsumed legacy export, deleted once, here.
        unsafe { delete_legacy(managed) }
    }
}

/// A capsule named `name` owning `managed`; if none can be made, `delete` frees it.
///
/// # Safety
/// `managed` is a live managed tensor that `destructor` deletes unless consumed.
unsafe fn capsule<'py>(
    py: Python<'py>,
    managed: *mut c_void,
    name: &'static CStr,
    destructor: unsafe extern "C" fn(*mut ffi::PyObject),
    delete: impl FnOnce(),
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: the caller's contract; the name is static, as the capsule keeps it.
    let made = unsafe { ffi::PyCapsule_New(managed, name.as_ptr(), Some(destructor)) };
    // SAFETY: `made` is a new reference or NULL with an exception set.
    unsafe { Bound::from_owned_ptr_or_err(py, made) }.inspect_err(|_| delete())
}

#[pymethods]
impl PyTensor {
    /// A tensor over `obj`: an object with `__dlpack__` (a NumPy array, a PyTorch or
    /// JAX CPU tensor, a `kiln.Tensor`) is read through DLPack, its memory shared when
    /// C-contiguous and copied once into row-major order when strided; anything else
    /// (lists, scalars) goes through `numpy.asarray` first.
    #[new]
    fn new(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        if obj.hasattr("__dlpack__")? {
            return PyTensor::from_dlpack(py, obj);
        }
        let array = py
            .import("numpy")?
            .getattr("asarray")?
            .call1((obj,))
            .map_err(|e| InvalidArgument::new_err(format!("obj: not an array: {e}")))?;
        PyTensor::from_dlpack(py, &array)
    }

    /// The dims.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.tensor.shape())
    }

    /// NumPy's name of the element type (`"float32"`, …); Kiln's where NumPy has none.
    #[getter]
    fn dtype(&self) -> String {
        let dtype = self.tensor.dtype();
        numpy_name(dtype).map_or_else(|_| dtype.to_string(), str::to_string)
    }

    /// The address of the first element.
    #[getter]
    fn data_ptr(&self) -> usize {
        self.data() as usize
    }

    /// NumPy's array interface: `numpy.asarray(t)` views the memory without a copy and
    /// keeps the tensor alive.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dtype = self.tensor.dtype();
        let descr = numpy_dtype(py, dtype)
            .ok_or_else(|| Unsupported::new_err(format!("{dtype} has no NumPy dtype")))?;
        let d = PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("shape", self.shape(py)?)?;
        d.set_item("typestr", descr.getattr("str")?)?;
        d.set_item("data", (self.data_ptr(), self.read_only))?;
        d.set_item("strides", py.None())?;
        Ok(d)
    }

    /// A NumPy array over the tensor's memory (no copy) that keeps it alive.
    pub(crate) fn numpy<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        py.import("numpy")?.getattr("asarray")?.call1((slf,))
    }

    /// The DLPack protocol: a versioned capsule (`"dltensor_versioned"`) when
    /// `max_version` is (1, 0) or later, the legacy `"dltensor"` one otherwise, over the
    /// tensor's memory (a copy only for `copy=True`). CPU only: `stream` must be None.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if let Some(s) = stream.filter(|s| !s.is_none()) {
            return Err(Unsupported::new_err(format!(
                "stream: a CPU tensor takes None, got {}",
                s.repr()?
            )));
        }
        if let Some(device) = dl_device.filter(|&d| d != (DL_CPU, 0)) {
            return Err(Unsupported::new_err(format!(
                "dl_device: {device:?} is not the CPU (1, 0); Kiln's tensors are host memory"
            )));
        }
        let copied = match copy {
            Some(true) => Some(self.tensor.owned_copy().map_err(interop_error)?),
            _ => None,
        };
        let source = copied.as_ref().unwrap_or(&self.tensor);
        let versioned = max_version.is_some_and(|(major, _)| major >= 1);
        if versioned {
            let managed = export_versioned(source, "t", copied.is_some()).map_err(interop_error)?;
            let delete = || {
                // SAFETY: the export just made, which no capsule took.
                unsafe { delete_versioned(managed) }
            };
            // SAFETY: the export just made, deleted by the capsule (or by `delete`).
            unsafe {
                capsule(
                    py,
                    managed.as_ptr().cast(),
                    VERSIONED,
                    drop_versioned_capsule,
                    delete,
                )
            }
        } else {
            let managed = export_legacy(source, "t").map_err(interop_error)?;
            let delete = || {
                // SAFETY: a fresh legacy export no capsule owns.
                unsafe { delete_legacy(managed) }
            };
            // SAFETY: the legacy export, deleted by the capsule or by `delete`.
            unsafe {
                capsule(
                    py,
                    managed.as_ptr().cast(),
                    LEGACY,
                    drop_legacy_capsule,
                    delete,
                )
            }
        }
    }

    /// `(kDLCPU, 0)`: Kiln's tensors are host memory.
    fn __dlpack_device__(&self) -> (i32, i32) {
        (DL_CPU, 0)
    }

    fn __repr__(&self) -> String {
        let dims: Vec<String> = self.tensor.dims().iter().map(|d| d.to_string()).collect();
        format!(
            "kiln.Tensor(shape=({}), dtype={})",
            dims.join(", "),
            self.dtype()
        )
    }
}

/// Deletes a versioned export through its own deleter.
///
/// # Safety
/// `managed` is a live export not deleted yet.
unsafe fn delete_versioned(managed: NonNull<DLManagedTensorVersioned>) {
    // SAFETY: the caller's contract: a live export.
    if let Some(deleter) = unsafe { managed.as_ref() }.deleter {
        // SAFETY: its own deleter, called once as the caller promises.
        unsafe { deleter(managed.as_ptr()) }
    }
}

/// Deletes a legacy export through its own deleter.
///
/// # Safety
/// As for `delete_versioned`.
unsafe fn delete_legacy(managed: NonNull<DLManagedTensor>) {
    // SAFETY: the caller's contract: a live legacy export.
    if let Some(deleter) = unsafe { managed.as_ref() }.deleter {
        // SAFETY: called once, on the export it belongs to.
        unsafe { deleter(managed.as_ptr()) }
    }
}

impl PyTensor {
    /// The tensor as input of type `ty`, read in place, when its dtype is the input's
    /// and its memory aligned to an element; `None` when it must be converted (copied).
    pub(crate) fn in_place<'py>(slf: &Bound<'py, Self>, ty: &TensorType) -> Option<Borrowed<'py>> {
        let t = &slf.get().tensor;
        let data = t.data_ptr();
        if t.dtype() != ty.dtype || !(data as usize).is_multiple_of(t.dtype().size_in_bytes()) {
            return None;
        }
        let (shape, nbytes) = (t.shape(), t.nbytes());
        // SAFETY: `slf` keeps the tensor, and so its `nbytes` bytes at `data`, alive.
        Some(unsafe { Borrowed::new(slf.clone().into_any(), shape, data, nbytes) })
    }
}
