//! NumPy arrays in and out: inputs read in place or copied once, DLPack objects through
//! `numpy.from_dlpack`, outputs handed over without a copy; the dtypes both sides know.
use crate::errors::{InvalidArgument, RunBadInput, Unsupported};
use kiln::tensor::TensorView;
use kiln::{DType, Tensor, TensorType};
use numpy::ndarray::ArrayD;
use numpy::{
    dtype, Element, IntoPyArray, PyArrayDescr, PyArrayDescrMethods, PyReadonlyArrayDyn,
    PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::prelude::*;

/// onnxruntime's name of a tensor type.
pub(crate) fn onnx_type_name(ty: &TensorType) -> String {
    let elem = match ty.dtype {
        DType::F32 => "float",
        DType::F64 => "double",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::I8 => "int8",
        DType::U8 => "uint8",
        DType::I16 => "int16",
        DType::U16 => "uint16",
        DType::I32 => "int32",
        DType::U32 => "uint32",
        DType::I64 => "int64",
        DType::U64 => "uint64",
        DType::Bool => "bool",
        DType::String => "string",
        other => return format!("tensor({other})"),
    };
    format!("tensor({elem})")
}

/// A tensor copied from `value` (converted to `dtype` first when given).
pub(crate) fn tensor_from(
    py: Python<'_>,
    value: &Bound<'_, PyAny>,
    dtype: Option<&str>,
) -> PyResult<Tensor> {
    let np = py.import("numpy")?;
    let array = match dtype {
        Some(d) => {
            let d: DType = d.parse().map_err(|e: String| InvalidArgument::new_err(e))?;
            let ty = TensorType::new(d, kiln::Shape::scalar());
            return input_tensor(
                py,
                "value",
                &ty,
                &np.getattr("asarray")?.call1((value, numpy_name(d)?))?,
            );
        }
        None => np.getattr("asarray")?.call1((value,))?,
    };
    let array = array.cast::<PyUntypedArray>()?;
    let d = (NUMPY_DTYPES.iter().map(|&(d, _)| d))
        .find(|&d| numpy_dtype(py, d).is_some_and(|w| array.dtype().is_equiv_to(&w)))
        .ok_or_else(|| {
            Unsupported::new_err(format!("NumPy dtype {} has no Kiln dtype", array.dtype()))
        })?;
    let ty = TensorType::new(d, kiln::Shape::scalar());
    input_tensor(py, "value", &ty, array.as_any())
}

/// The Kiln dtypes NumPy has, with NumPy's names.
pub(crate) const NUMPY_DTYPES: [(DType, &str); 12] = [
    (DType::F32, "float32"),
    (DType::F64, "float64"),
    (DType::F16, "float16"),
    (DType::I8, "int8"),
    (DType::U8, "uint8"),
    (DType::I16, "int16"),
    (DType::U16, "uint16"),
    (DType::I32, "int32"),
    (DType::U32, "uint32"),
    (DType::I64, "int64"),
    (DType::U64, "uint64"),
    (DType::Bool, "bool"),
];

/// NumPy's name of a Kiln dtype.
pub(crate) fn numpy_name(d: DType) -> PyResult<&'static str> {
    (NUMPY_DTYPES.iter().find(|(k, _)| *k == d))
        .map(|(_, n)| *n)
        .ok_or_else(|| Unsupported::new_err(format!("{d} has no NumPy dtype")))
}

/// A copy of a NumPy array of element type `T`, row-major, or `None` if `a` is not one.
pub(crate) fn array_of<T: Element + Clone>(a: &Bound<'_, PyAny>) -> Option<ArrayD<T>> {
    let a = a.extract::<PyReadonlyArrayDyn<'_, T>>().ok()?;
    Some(a.as_array().as_standard_layout().into_owned())
}

/// An input array read where it lies: a reference that keeps it alive, its dims, and
/// its buffer.
pub(crate) struct Borrowed<'py> {
    _array: Bound<'py, PyAny>,
    shape: Vec<usize>,
    data: *const u8,
    nbytes: usize,
}

impl<'py> Borrowed<'py> {
    /// `nbytes` at `data` as laid out by `shape`, kept alive by `owner`.
    ///
    /// # Safety
    /// `owner` keeps `nbytes` readable bytes at `data` alive while it lives.
    pub(crate) unsafe fn new(
        owner: Bound<'py, PyAny>,
        shape: Vec<usize>,
        data: *const u8,
        nbytes: usize,
    ) -> Borrowed<'py> {
        Borrowed {
            _array: owner,
            shape,
            data,
            nbytes,
        }
    }

    /// The array's buffer as a `dtype` tensor.
    pub(crate) fn view(&self, dtype: DType) -> Result<TensorView<'_>, String> {
        // SAFETY: `_array` holds a reference to the array (or kiln.Tensor), whose buffer
        // holds `nbytes` bytes from `data` (checked C-contiguous in `in_place`).
        let bytes = unsafe { std::slice::from_raw_parts(self.data, self.nbytes) };
        TensorView::new(dtype, &self.shape, bytes)
    }
}

/// How an input reaches the run: read in place, or copied first.
pub(crate) enum Fed<'py> {
    InPlace(Borrowed<'py>),
    Copied(Tensor),
}

/// `value` borrowed in place when it is a C-contiguous, aligned NumPy array of exactly
/// the input's element type; `None` when it must be converted (and copied).
pub(crate) fn in_place<'py>(
    py: Python<'py>,
    ty: &TensorType,
    value: &Bound<'py, PyAny>,
) -> Option<Borrowed<'py>> {
    let array = value.cast::<PyUntypedArray>().ok()?;
    let want = numpy_dtype(py, ty.dtype)?;
    if !array.dtype().is_equiv_to(&want) || !array.is_c_contiguous() {
        return None;
    }
    let raw = array.as_array_ptr();
    // SAFETY: `raw` is the live array `array` refers to; its flags and data are read.
    let (flags, data) = unsafe { ((*raw).fields.flags, (*raw).fields.data) };
    if flags & numpy::npyffi::NPY_ARRAY_ALIGNED == 0 {
        return None;
    }
    let shape = array.shape().to_vec();
    let nbytes = shape.iter().product::<usize>() * want.itemsize();
    Some(Borrowed {
        _array: array.clone().into_any(),
        shape,
        data: data as *const u8,
        nbytes,
    })
}

/// `value` itself, or, for an object that is not a NumPy array but speaks DLPack (a
/// PyTorch or JAX CPU tensor, …), the NumPy array over its memory (no copy).
pub(crate) fn from_dlpack<'py>(
    py: Python<'py>,
    name: &str,
    value: Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    if value.is_instance_of::<PyUntypedArray>() || !value.hasattr("__dlpack__")? {
        return Ok(value);
    }
    let from_dlpack = py.import("numpy")?.getattr("from_dlpack")?;
    from_dlpack.call1((&value,)).map_err(|e| {
        RunBadInput::new_err(format!(
            "input '{name}': its DLPack tensor is not readable on the host: {e}"
        ))
    })
}

/// NumPy's descriptor of a Kiln element type, where NumPy has one.
pub(crate) fn numpy_dtype(py: Python<'_>, d: DType) -> Option<Bound<'_, PyArrayDescr>> {
    Some(match d {
        DType::F32 => dtype::<f32>(py),
        DType::F64 => dtype::<f64>(py),
        DType::F16 => dtype::<half::f16>(py),
        DType::I8 => dtype::<i8>(py),
        DType::U8 => dtype::<u8>(py),
        DType::I16 => dtype::<i16>(py),
        DType::U16 => dtype::<u16>(py),
        DType::I32 => dtype::<i32>(py),
        DType::U32 => dtype::<u32>(py),
        DType::I64 => dtype::<i64>(py),
        DType::U64 => dtype::<u64>(py),
        DType::Bool => dtype::<bool>(py),
        _ => return None,
    })
}

/// A copy of input `name` from `value`: a NumPy array (or anything `numpy.asarray`
/// takes) of the input's element type, in row-major order.
pub(crate) fn input_tensor(
    py: Python<'_>,
    name: &str,
    ty: &TensorType,
    value: &Bound<'_, PyAny>,
) -> PyResult<Tensor> {
    let owned;
    let value = if value.is_instance_of::<PyUntypedArray>() {
        value
    } else {
        // A list or scalar takes the input's element type, as a literal would.
        let dtype = numpy_name(ty.dtype)?;
        let asarray = py.import("numpy")?.getattr("asarray")?;
        owned = asarray.call1((value, dtype)).map_err(|e| {
            RunBadInput::new_err(format!("input '{name}' is {}: {e}", onnx_type_name(ty)))
        })?;
        &owned
    };
    let t = match ty.dtype {
        DType::F32 => array_of(value).map(Tensor::F32),
        DType::F64 => array_of(value).map(Tensor::F64),
        DType::F16 => array_of(value).map(Tensor::F16),
        DType::I8 => array_of(value).map(Tensor::I8),
        DType::U8 => array_of(value).map(Tensor::U8),
        DType::I16 => array_of(value).map(Tensor::I16),
        DType::U16 => array_of(value).map(Tensor::U16),
        DType::I32 => array_of(value).map(Tensor::I32),
        DType::U32 => array_of(value).map(Tensor::U32),
        DType::I64 => array_of(value).map(Tensor::I64),
        DType::U64 => array_of(value).map(Tensor::U64),
        DType::Bool => array_of(value).map(Tensor::Bool),
        other => {
            return Err(Unsupported::new_err(format!(
                "input '{name}': {other} tensors cannot cross from Python yet"
            )))
        }
    };
    t.ok_or_else(|| {
        let got = value
            .getattr("dtype")
            .map_or_else(|_| "?".to_string(), |d| d.to_string());
        RunBadInput::new_err(format!(
            "input '{name}' is {}, the array given is {got}",
            onnx_type_name(ty)
        ))
    })
}

/// A NumPy array that owns `t`'s buffer (no copy).
pub(crate) fn output_array(py: Python<'_>, name: &str, t: Tensor) -> PyResult<Py<PyAny>> {
    let a = match t {
        Tensor::F32(a) => a.into_pyarray(py).into_any(),
        Tensor::F64(a) => a.into_pyarray(py).into_any(),
        Tensor::F16(a) => a.into_pyarray(py).into_any(),
        Tensor::I8(a) => a.into_pyarray(py).into_any(),
        Tensor::U8(a) => a.into_pyarray(py).into_any(),
        Tensor::I16(a) => a.into_pyarray(py).into_any(),
        Tensor::U16(a) => a.into_pyarray(py).into_any(),
        Tensor::I32(a) => a.into_pyarray(py).into_any(),
        Tensor::U32(a) => a.into_pyarray(py).into_any(),
        Tensor::I64(a) => a.into_pyarray(py).into_any(),
        Tensor::U64(a) => a.into_pyarray(py).into_any(),
        Tensor::Bool(a) => a.into_pyarray(py).into_any(),
        other => {
            return Err(Unsupported::new_err(format!(
                "output '{name}': {} values cannot cross to Python yet",
                other.kind_name()
            )))
        }
    };
    Ok(a.unbind())
}
