//! `kiln.Tensor`: a Kiln tensor handle (`kiln_tensor`) in Python, and DLPack both ways
//! through the C ABI's `kiln_tensor_{from,to}_dlpack`: a C-contiguous producer's memory
//! is wrapped, a strided one copied once, and exports never copy (unless asked to).
use crate::arrays::{numpy_dtype, numpy_name, Borrowed};
use crate::errors::{status_error, InvalidArgument, Unsupported};
use kiln::capi::dlpack::{
    kiln_tensor_from_dlpack, kiln_tensor_from_dlpack_legacy, kiln_tensor_to_dlpack,
    kiln_tensor_to_dlpack_legacy, DLManagedTensor, DLManagedTensorVersioned,
    DLPACK_FLAG_BITMASK_IS_COPIED, DLPACK_FLAG_BITMASK_READ_ONLY, DL_CPU,
};
use kiln::capi::tensor::{
    kiln_tensor, kiln_tensor_data, kiln_tensor_dims, kiln_tensor_dtype, kiln_tensor_free,
    kiln_tensor_nbytes, kiln_tensor_new, kiln_tensor_rank,
};
use kiln::capi::KILN_STATUS_OK;
use kiln::{DType, TensorType};
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

/// A `kiln_tensor` handle, freed once when dropped.
struct Handle(NonNull<kiln_tensor>);

// SAFETY: a kiln_tensor is not tied to a thread: its metadata is only read here, and what
// keeps its memory alive (an Arc, or a DLPack producer's deleter, which takes the GIL
// itself where it needs it) may be dropped on any thread.
unsafe impl Send for Handle {}
// SAFETY: as for Send: shared access only reads.
unsafe impl Sync for Handle {}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: the handle came from the C ABI and is freed only here.
        unsafe { kiln_tensor_free(self.0.as_ptr()) }
    }
}

/// A tensor in Kiln's memory or lent by another library through DLPack.
#[pyclass(module = "kiln", name = "Tensor", frozen)]
pub(crate) struct PyTensor {
    handle: Handle,
    dtype: DType,
    shape: Vec<usize>,
    /// The producer marked its memory read-only (a read-only NumPy array).
    read_only: bool,
}

impl PyTensor {
    fn from_handle(handle: *mut kiln_tensor, read_only: bool) -> PyResult<PyTensor> {
        let handle = NonNull::new(handle)
            .map(Handle)
            .ok_or_else(|| InvalidArgument::new_err("the C ABI gave no tensor"))?;
        let raw = handle.0.as_ptr();
        // SAFETY: `raw` is a live handle; its dims hold `rank` values.
        let (code, dims) = unsafe {
            let rank = kiln_tensor_rank(raw);
            let dims = kiln_tensor_dims(raw);
            let dims = if rank == 0 {
                &[][..]
            } else {
                std::slice::from_raw_parts(dims, rank)
            };
            (kiln_tensor_dtype(raw), dims.to_vec())
        };
        let dtype = DType::ALL
            .get(code as usize)
            .copied()
            .ok_or_else(|| InvalidArgument::new_err(format!("kiln_dtype {code} is unknown")))?;
        Ok(PyTensor {
            handle,
            dtype,
            shape: dims.into_iter().map(|d| d as usize).collect(),
            read_only,
        })
    }

    fn raw(&self) -> *mut kiln_tensor {
        self.handle.0.as_ptr()
    }

    fn data(&self) -> *mut u8 {
        // SAFETY: a live handle.
        unsafe { kiln_tensor_data(self.raw()).cast() }
    }

    fn nbytes(&self) -> usize {
        // SAFETY: a live handle.
        unsafe { kiln_tensor_nbytes(self.raw()) }
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

/// Imports the managed tensor in `capsule`, and marks the capsule used once Kiln owns it.
/// On failure the capsule is left as it is, so that its destructor deletes the tensor.
fn consume(capsule: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
    let ptr = capsule.as_ptr();
    let mut out: *mut kiln_tensor = std::ptr::null_mut();
    // SAFETY: `ptr` is a live object; a capsule of a DLPack name holds the managed tensor
    // the protocol says, not yet consumed while it has that name.
    unsafe {
        if ffi::PyCapsule_IsValid(ptr, VERSIONED.as_ptr()) == 1 {
            let managed = ffi::PyCapsule_GetPointer(ptr, VERSIONED.as_ptr());
            let managed = managed.cast::<DLManagedTensorVersioned>();
            // The flags are read before the import, which may delete the tensor at once.
            let read_only = (*managed).version.major == 1
                && (*managed).flags & DLPACK_FLAG_BITMASK_READ_ONLY != 0;
            let status = kiln_tensor_from_dlpack(managed, &mut out);
            if status != KILN_STATUS_OK {
                return Err(status_error(status));
            }
            ffi::PyCapsule_SetName(ptr, USED_VERSIONED.as_ptr());
            PyTensor::from_handle(out, read_only)
        } else if ffi::PyCapsule_IsValid(ptr, LEGACY.as_ptr()) == 1 {
            let managed = ffi::PyCapsule_GetPointer(ptr, LEGACY.as_ptr());
            let status = kiln_tensor_from_dlpack_legacy(managed.cast(), &mut out);
            if status != KILN_STATUS_OK {
                return Err(status_error(status));
            }
            ffi::PyCapsule_SetName(ptr, USED_LEGACY.as_ptr());
            PyTensor::from_handle(out, false)
        } else {
            Err(InvalidArgument::new_err(format!(
                "obj: __dlpack__ gave {}, not an unused 'dltensor_versioned' or 'dltensor' capsule",
                capsule.repr()?
            )))
        }
    }
}

/// A capsule's destructor: deletes the managed tensor unless a consumer took it (and
/// renamed the capsule).
unsafe extern "C" fn drop_versioned_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: the capsule is being destroyed; under its unused name it holds the
    // managed tensor `kiln_tensor_to_dlpack` made, deleted only here.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, VERSIONED.as_ptr()) == 1 {
            let managed = ffi::PyCapsule_GetPointer(capsule, VERSIONED.as_ptr());
            let managed = managed.cast::<DLManagedTensorVersioned>();
            if let Some(deleter) = (*managed).deleter {
                deleter(managed);
            }
        }
    }
}

unsafe extern "C" fn drop_legacy_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: as in `drop_versioned_capsule`, for `kiln_tensor_to_dlpack_legacy`.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, LEGACY.as_ptr()) == 1 {
            let managed = ffi::PyCapsule_GetPointer(capsule, LEGACY.as_ptr());
            let managed = managed.cast::<DLManagedTensor>();
            if let Some(deleter) = (*managed).deleter {
                deleter(managed);
            }
        }
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
    unsafe {
        let made = ffi::PyCapsule_New(managed, name.as_ptr(), Some(destructor));
        Bound::from_owned_ptr_or_err(py, made).inspect_err(|_| delete())
    }
}

/// A status from the C ABI as its exception.
fn checked(status: kiln::capi::kiln_status) -> PyResult<()> {
    if status == KILN_STATUS_OK {
        Ok(())
    } else {
        Err(status_error(status))
    }
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
        PyTuple::new(py, &self.shape)
    }

    /// NumPy's name of the element type (`"float32"`, …); Kiln's where NumPy has none.
    #[getter]
    fn dtype(&self) -> String {
        numpy_name(self.dtype).map_or_else(|_| self.dtype.to_string(), str::to_string)
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
        let descr = numpy_dtype(py, self.dtype)
            .ok_or_else(|| Unsupported::new_err(format!("{} has no NumPy dtype", self.dtype)))?;
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
            Some(true) => Some(self.copy()?),
            _ => None,
        };
        let source = copied.as_ref().map_or(self.raw(), PyTensor::raw);
        let versioned = max_version.is_some_and(|(major, _)| major >= 1);
        if versioned {
            let mut managed: *mut DLManagedTensorVersioned = std::ptr::null_mut();
            // SAFETY: a live handle; `managed` is written on success.
            checked(unsafe { kiln_tensor_to_dlpack(source, &mut managed) })?;
            // SAFETY: the export just made, deleted by the capsule (or here).
            unsafe {
                if copied.is_some() {
                    (*managed).flags |= DLPACK_FLAG_BITMASK_IS_COPIED;
                }
                let delete = || drop_managed(managed);
                capsule(
                    py,
                    managed.cast(),
                    VERSIONED,
                    drop_versioned_capsule,
                    delete,
                )
            }
        } else {
            let mut managed: *mut DLManagedTensor = std::ptr::null_mut();
            // SAFETY: as above.
            checked(unsafe { kiln_tensor_to_dlpack_legacy(source, &mut managed) })?;
            // SAFETY: as above.
            unsafe {
                let delete = || {
                    if let Some(deleter) = (*managed).deleter {
                        deleter(managed)
                    }
                };
                capsule(py, managed.cast(), LEGACY, drop_legacy_capsule, delete)
            }
        }
    }

    /// `(kDLCPU, 0)`: Kiln's tensors are host memory.
    fn __dlpack_device__(&self) -> (i32, i32) {
        (DL_CPU, 0)
    }

    fn __repr__(&self) -> String {
        let dims: Vec<String> = self.shape.iter().map(|d| d.to_string()).collect();
        format!(
            "kiln.Tensor(shape=({}), dtype={})",
            dims.join(", "),
            self.dtype()
        )
    }
}

/// Deletes an export no capsule took.
///
/// # Safety
/// `managed` is a live export not deleted yet.
unsafe fn drop_managed(managed: *mut DLManagedTensorVersioned) {
    // SAFETY: the caller's contract.
    unsafe {
        if let Some(deleter) = (*managed).deleter {
            deleter(managed)
        }
    }
}

impl PyTensor {
    /// A copy in memory of Kiln's own.
    fn copy(&self) -> PyResult<PyTensor> {
        let dims: Vec<i64> = self.shape.iter().map(|&d| d as i64).collect();
        let code = DType::ALL
            .iter()
            .position(|&d| d == self.dtype)
            .ok_or_else(|| InvalidArgument::new_err("an unknown dtype"))? as u32;
        let mut out: *mut kiln_tensor = std::ptr::null_mut();
        // SAFETY: `dims` holds `rank` values; `out` is written on success.
        checked(unsafe { kiln_tensor_new(code, dims.as_ptr(), dims.len(), &mut out) })?;
        let copy = PyTensor::from_handle(out, false)?;
        let n = self.nbytes();
        if n > 0 {
            // SAFETY: both hold `n` bytes (same dtype and dims); distinct buffers.
            unsafe { std::ptr::copy_nonoverlapping(self.data(), copy.data(), n) };
        }
        Ok(copy)
    }

    /// The tensor as input of type `ty`, read in place, when its dtype is the input's
    /// and its memory aligned to an element; `None` when it must be converted (copied).
    pub(crate) fn in_place<'py>(slf: &Bound<'py, Self>, ty: &TensorType) -> Option<Borrowed<'py>> {
        let t = slf.get();
        let data = t.data();
        if t.dtype != ty.dtype || !(data as usize).is_multiple_of(t.dtype.size_in_bytes()) {
            return None;
        }
        // SAFETY: `slf` keeps the handle, and so its `nbytes` bytes at `data`, alive.
        Some(unsafe { Borrowed::new(slf.clone().into_any(), t.shape.clone(), data, t.nbytes()) })
    }
}
