//! `kiln._kiln`: the extension module under the `kiln` Python package.
//!
//! It holds what must be native: graphs loaded or parsed into the library's `Graph`,
//! their compiled executables, and the crossing of NumPy arrays in and out of a run.
//! The GIL is released while a graph compiles and while it runs, so Python threads run
//! one executable at once. Each `kiln::Error` becomes the exception of its C status
//! (`KILN_STATUS_*`), all subclasses of `KilnError`, with the library's message as is.
use kiln::backend::{backend_with, Device};
use kiln::frontend::onnx;
use kiln::ir::text;
use kiln::ir::{Attr, Attrs};
use kiln::optim::{Optimizer, Rule};
use kiln::passes::PassOptions;
use kiln::tensor::TensorView;
use kiln::{DType, Dim, Error, Graph, Tensor, TensorType, Value};
use numpy::ndarray::ArrayD;
use numpy::{
    dtype, Element, IntoPyArray, PyArrayDescr, PyArrayDescrMethods, PyReadonlyArrayDyn,
    PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use pyo3::IntoPyObjectExt;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

pyo3::create_exception!(kiln, KilnError, PyException, "Any error Kiln reports.");
pyo3::create_exception!(
    kiln,
    InvalidArgument,
    KilnError,
    "KILN_STATUS_INVALID_ARGUMENT: an unusable argument."
);
pyo3::create_exception!(
    kiln,
    IoError,
    KilnError,
    "KILN_STATUS_IO: reading or writing a file failed."
);
pyo3::create_exception!(
    kiln,
    ParseError,
    KilnError,
    "KILN_STATUS_PARSE: `.kir` text that does not parse."
);
pyo3::create_exception!(
    kiln,
    UnknownOp,
    KilnError,
    "KILN_STATUS_UNKNOWN_OP: an op the catalogue does not know."
);
pyo3::create_exception!(
    kiln,
    Unsupported,
    KilnError,
    "KILN_STATUS_UNSUPPORTED: well-formed, but not implemented."
);
pyo3::create_exception!(
    kiln,
    InvalidGraph,
    KilnError,
    "KILN_STATUS_INVALID_GRAPH: a graph that fails verification."
);
pyo3::create_exception!(
    kiln,
    CompileFailed,
    KilnError,
    "KILN_STATUS_COMPILE_FAILED: a backend could not compile a valid graph."
);
pyo3::create_exception!(
    kiln,
    RunFailed,
    KilnError,
    "KILN_STATUS_RUN_FAILED: a run failed."
);
pyo3::create_exception!(
    kiln,
    RunBadInput,
    KilnError,
    "KILN_STATUS_RUN_BAD_INPUT: a run's inputs do not fit the graph."
);
pyo3::create_exception!(
    kiln,
    DeviceUnavailable,
    KilnError,
    "KILN_STATUS_DEVICE_UNAVAILABLE: no such device or backend here."
);

/// The exception of `e`'s C status.
fn to_py(e: Error) -> PyErr {
    let m = e.to_string();
    match e {
        Error::InvalidArgument(_) => InvalidArgument::new_err(m),
        Error::Io(_) => IoError::new_err(m),
        Error::Parse { .. } => ParseError::new_err(m),
        Error::UnknownOp(_) => UnknownOp::new_err(m),
        Error::Unsupported(_) => Unsupported::new_err(m),
        Error::Graph(_) => InvalidGraph::new_err(m),
        Error::Compile(_) => CompileFailed::new_err(m),
        Error::Runtime(_) => RunFailed::new_err(m),
        Error::Device(_) => DeviceUnavailable::new_err(m),
    }
}

/// At run time a bad argument is a bad input, as `kiln_executable_run` reports it.
fn run_error(e: Error) -> PyErr {
    match e {
        Error::InvalidArgument(m) => RunBadInput::new_err(m),
        other => to_py(other),
    }
}

/// A graph input or output as onnxruntime's `NodeArg` shows it: `name`, `shape` (ints,
/// and strings for symbolic dims), `type` (`"tensor(float)"`, …).
#[pyclass(module = "kiln", name = "NodeArg", frozen, get_all)]
struct NodeArg {
    name: String,
    shape: Vec<Py<PyAny>>,
    r#type: String,
    /// Kiln's own name of the element type (`"f32"`, …).
    dtype: String,
}

#[pymethods]
impl NodeArg {
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let dims: Vec<String> = (self.shape.iter())
            .map(|d| d.bind(py).repr().map(|r| r.to_string()))
            .collect::<PyResult<_>>()?;
        Ok(format!(
            "NodeArg(name='{}', type='{}', shape=[{}])",
            self.name,
            self.r#type,
            dims.join(", ")
        ))
    }
}

/// onnxruntime's name of a tensor type.
fn onnx_type_name(ty: &TensorType) -> String {
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

fn node_arg(py: Python<'_>, name: &str, ty: &TensorType) -> PyResult<NodeArg> {
    let shape = (ty.shape.dims().into_iter())
        .map(|d| match d {
            Dim::Fixed(n) => n.into_py_any(py),
            Dim::Sym(s) => s.into_py_any(py),
        })
        .collect::<PyResult<_>>()?;
    Ok(NodeArg {
        name: name.to_string(),
        shape,
        r#type: onnx_type_name(ty),
        dtype: ty.dtype.to_string(),
    })
}

/// Named, typed values: a graph's inputs or outputs.
type Signature = Vec<(String, TensorType)>;

/// The graph's inputs and outputs.
fn signature(g: &Graph) -> Result<(Signature, Signature), Error> {
    let inputs = (g.inputs().into_iter())
        .map(|id| {
            let n = g.node(id);
            (n.name.clone(), n.outputs[0].clone())
        })
        .collect();
    let outputs = (g.outputs().iter())
        .map(|o| Ok((o.name.clone(), g.value_type(o.value)?.clone())))
        .collect::<Result<_, Error>>()?;
    Ok((inputs, outputs))
}

/// A dataflow graph: loaded from `.onnx` or `.kir`, parsed from `.kir` text, or built
/// op by op (`parameter`, `constant`, `variable`, `op`, `output`, and the operators of
/// the values they return).
#[pyclass(module = "kiln", name = "Graph", frozen)]
struct PyGraph {
    graph: Mutex<Graph>,
}

impl PyGraph {
    fn wrap(graph: Graph) -> PyGraph {
        PyGraph {
            graph: Mutex::new(graph),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Graph> {
        self.graph.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The value `v` of the graph `g` as a Python object.
fn value_of(g: &Bound<'_, PyGraph>, v: Value) -> PyValue {
    PyValue {
        graph: g.clone().unbind(),
        value: v,
    }
}

#[pymethods]
impl PyGraph {
    #[new]
    #[pyo3(signature = (name = "graph"))]
    fn new(name: &str) -> PyGraph {
        PyGraph::wrap(Graph::new(name))
    }

    /// Compiles the graph for `backend` (`"cpu"`, `"interp"`, `"cuda:N"`) on `threads`
    /// threads (0: one per core). Pass options come from the `KILN_*` environment
    /// variables, as for the command line. The GIL is released meanwhile; the graph
    /// may be built on afterwards without changing the executable.
    #[pyo3(signature = (backend = "cpu", threads = 0))]
    fn compile(&self, py: Python<'_>, backend: &str, threads: usize) -> PyResult<PyExecutable> {
        let device: Device = backend.parse().map_err(to_py)?;
        let graph = self.lock().clone();
        let (inputs, outputs) = signature(&graph).map_err(to_py)?;
        let exe = py
            .detach(move || {
                backend_with(device, PassOptions::from_env()?, threads)?.compile(&graph)
            })
            .map_err(to_py)?;
        Ok(PyExecutable {
            exe: Arc::from(exe),
            inputs,
            outputs,
        })
    }

    /// A graph input: `shape` lists ints, names of symbolic dims (`"N"`) and
    /// `kiln.Axis(name, size)` for named axes; `dtype` is Kiln's name (`"f32"`, …).
    #[pyo3(signature = (name, dtype, shape))]
    fn parameter(
        slf: &Bound<'_, Self>,
        name: &str,
        dtype: &str,
        shape: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<PyValue> {
        let dtype: DType = dtype
            .parse()
            .map_err(|e: String| InvalidArgument::new_err(e))?;
        let ty = TensorType::new(dtype, shape_of(&shape)?);
        let id = slf.get().lock().add_parameter(name, ty).map_err(to_py)?;
        Ok(value_of(slf, id.out(0)))
    }

    /// A constant holding a copy of `value` (a NumPy array or anything
    /// `numpy.asarray` takes); `dtype` converts it first.
    #[pyo3(signature = (value, name = "", dtype = None))]
    fn constant(
        slf: &Bound<'_, Self>,
        value: &Bound<'_, PyAny>,
        name: &str,
        dtype: Option<&str>,
    ) -> PyResult<PyValue> {
        let t = tensor_from(slf.py(), value, dtype)?;
        let id = slf
            .get()
            .lock()
            .add_constant_value(name, t)
            .map_err(to_py)?;
        Ok(value_of(slf, id.out(0)))
    }

    /// A variable: state an executable keeps across runs, starting from `value`
    /// (read and written with `Executable.read_variable` / `write_variables`).
    #[pyo3(signature = (name, value, dtype = None))]
    fn variable(
        slf: &Bound<'_, Self>,
        name: &str,
        value: &Bound<'_, PyAny>,
        dtype: Option<&str>,
    ) -> PyResult<PyValue> {
        let t = tensor_from(slf.py(), value, dtype)?;
        let ty = TensorType::new(t.dtype(), kiln::Shape::fixed(t.shape()));
        let id = slf.get().lock().add_variable(name, ty, t).map_err(to_py)?;
        Ok(value_of(slf, id.out(0)))
    }

    /// Catalogue op `op` on `inputs` (values of this graph, `None` for an absent
    /// optional input) with `attrs`; its output, or a tuple of them.
    #[pyo3(signature = (op, inputs, name = "", **attrs))]
    fn op(
        slf: &Bound<'_, Self>,
        op: &str,
        inputs: Vec<Option<PyRef<'_, PyValue>>>,
        name: &str,
        attrs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let mut values = Vec::with_capacity(inputs.len());
        for (i, v) in inputs.iter().enumerate() {
            values.push(match v {
                Some(v) if !v.graph.is(slf) => {
                    return Err(InvalidArgument::new_err(format!(
                        "{op}: input {i} belongs to another graph"
                    )))
                }
                Some(v) => Some(v.value),
                None => None,
            });
        }
        let attrs = attrs_of(attrs)?;
        let mut g = slf.get().lock();
        let id = g.add_op(op, &values, attrs, name).map_err(to_py)?;
        let n = g.node(id).outputs.len() as u32;
        drop(g);
        let outs: Vec<PyValue> = (0..n).map(|i| value_of(slf, id.out(i))).collect();
        if outs.len() == 1 {
            outs.into_iter().next().expect("one").into_py_any(py)
        } else {
            pyo3::types::PyTuple::new(py, outs)?.into_py_any(py)
        }
    }

    /// Marks `value` as the graph output `name`.
    fn output(slf: &Bound<'_, Self>, name: &str, value: PyRef<'_, PyValue>) -> PyResult<()> {
        if !value.graph.is(slf) {
            return Err(InvalidArgument::new_err(format!(
                "output '{name}': the value belongs to another graph"
            )));
        }
        slf.get()
            .lock()
            .add_output(name, value.value)
            .map_err(to_py)
    }

    /// The graph as `.kir` text (deterministic; `kiln.parse` reads it back).
    fn to_text(&self) -> String {
        text::print(&self.lock())
    }

    #[getter]
    fn name(&self) -> String {
        self.lock().name.clone()
    }

    /// The graph's inputs (`Parameter` nodes) in order.
    #[getter]
    fn inputs(&self, py: Python<'_>) -> PyResult<Vec<NodeArg>> {
        let (inputs, _) = signature(&self.lock()).map_err(to_py)?;
        inputs.iter().map(|(n, t)| node_arg(py, n, t)).collect()
    }

    /// The graph's outputs in order.
    #[getter]
    fn outputs(&self, py: Python<'_>) -> PyResult<Vec<NodeArg>> {
        let (_, outputs) = signature(&self.lock()).map_err(to_py)?;
        outputs.iter().map(|(n, t)| node_arg(py, n, t)).collect()
    }

    fn __str__(&self) -> String {
        self.to_text()
    }

    fn __repr__(&self) -> String {
        let g = self.lock();
        format!("<kiln.Graph '{}' of {} nodes>", g.name, g.len())
    }
}

/// A named axis of a parameter's shape: `kiln.Axis("C", 784)`, or a symbolic size
/// `kiln.Axis("batch", "N")`.
#[pyclass(module = "kiln", name = "Axis", frozen, get_all)]
struct PyAxis {
    name: String,
    size: Py<PyAny>,
}

#[pymethods]
impl PyAxis {
    #[new]
    fn new(name: String, size: Py<PyAny>) -> PyAxis {
        PyAxis { name, size }
    }
}

/// One dim: an int, or a symbol's name.
fn dim_of(d: &Bound<'_, PyAny>) -> PyResult<Dim> {
    if let Ok(n) = d.extract::<usize>() {
        return Ok(Dim::Fixed(n));
    }
    if let Ok(s) = d.extract::<String>() {
        return Ok(Dim::Sym(s));
    }
    Err(InvalidArgument::new_err(format!(
        "a dim is an int >= 0 or a symbol's name, not {}",
        d.repr()?
    )))
}

/// A shape from ints, symbol names and `kiln.Axis` items.
fn shape_of(items: &[Bound<'_, PyAny>]) -> PyResult<kiln::Shape> {
    let mut dims = Vec::with_capacity(items.len());
    let mut names = Vec::with_capacity(items.len());
    for item in items {
        if let Ok(axis) = item.cast::<PyAxis>() {
            let axis = axis.get();
            dims.push(dim_of(axis.size.bind(item.py()))?);
            names.push(Some(axis.name.clone()));
        } else {
            dims.push(dim_of(item)?);
            names.push(None);
        }
    }
    Ok(kiln::Shape::named(dims, names))
}

/// A tensor copied from `value` (converted to `dtype` first when given).
fn tensor_from(py: Python<'_>, value: &Bound<'_, PyAny>, dtype: Option<&str>) -> PyResult<Tensor> {
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
const NUMPY_DTYPES: [(DType, &str); 12] = [
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
fn numpy_name(d: DType) -> PyResult<&'static str> {
    (NUMPY_DTYPES.iter().find(|(k, _)| *k == d))
        .map(|(_, n)| *n)
        .ok_or_else(|| Unsupported::new_err(format!("{d} has no NumPy dtype")))
}

/// Attributes from keyword arguments: ints, floats, strings, lists of each, graphs.
fn attrs_of(kw: Option<&Bound<'_, PyDict>>) -> PyResult<Attrs> {
    let mut attrs = Attrs::new();
    let Some(kw) = kw else { return Ok(attrs) };
    for (k, v) in kw.iter() {
        let name: String = k.extract()?;
        let attr = if v.is_instance_of::<pyo3::types::PyBool>() {
            Attr::Int(i64::from(v.extract::<bool>()?))
        } else if let Ok(i) = v.extract::<i64>() {
            Attr::Int(i)
        } else if let Ok(f) = v.extract::<f64>() {
            Attr::Float(f)
        } else if let Ok(s) = v.extract::<String>() {
            Attr::String(s)
        } else if let Ok(g) = v.cast::<PyGraph>() {
            Attr::Graph(Arc::new(g.get().lock().clone()))
        } else if let Ok(i) = v.extract::<Vec<i64>>() {
            Attr::Ints(i)
        } else if let Ok(f) = v.extract::<Vec<f64>>() {
            Attr::Floats(f)
        } else if let Ok(s) = v.extract::<Vec<String>>() {
            Attr::Strings(s)
        } else {
            return Err(InvalidArgument::new_err(format!(
                "attribute '{name}': {} is not an int, float, string, list of one of those, or graph",
                v.repr()?
            )));
        };
        attrs.set(&name, attr);
    }
    Ok(attrs)
}

/// One output of one node of a graph being built; arithmetic on it adds nodes.
#[pyclass(module = "kiln", name = "Value", frozen)]
struct PyValue {
    graph: Py<PyGraph>,
    value: Value,
}

impl PyValue {
    /// `op(self, other)` (or `op(other, self)`): `other` a value of the same graph, or a
    /// number or array made a constant of this value's dtype.
    fn binary(
        &self,
        py: Python<'_>,
        op: &str,
        other: &Bound<'_, PyAny>,
        swap: bool,
    ) -> PyResult<Py<PyAny>> {
        let g = self.graph.bind(py);
        let other = match other.cast::<PyValue>() {
            Ok(v) => v.get().value,
            Err(_) => {
                let dtype = g.get().lock().value_type(self.value).map_err(to_py)?.dtype;
                let t = tensor_from(py, other, Some(&dtype.to_string()))?;
                g.get()
                    .lock()
                    .add_constant_value("", t)
                    .map_err(to_py)?
                    .out(0)
            }
        };
        let (a, b) = if swap {
            (other, self.value)
        } else {
            (self.value, other)
        };
        let a = value_of(g, a).into_pyobject(py)?;
        let b = value_of(g, b).into_pyobject(py)?;
        PyGraph::op(g, op, vec![Some(a.borrow()), Some(b.borrow())], "", None)
    }

    fn unary(&self, py: Python<'_>, op: &str) -> PyResult<Py<PyAny>> {
        let g = self.graph.bind(py);
        let me = value_of(g, self.value).into_pyobject(py)?;
        PyGraph::op(g, op, vec![Some(me.borrow())], "", None)
    }
}

#[pymethods]
impl PyValue {
    /// The graph the value belongs to.
    #[getter]
    fn graph(&self, py: Python<'_>) -> Py<PyGraph> {
        self.graph.clone_ref(py)
    }

    /// Its type as the text format writes it: `f32[batch:N, 784]`.
    #[getter]
    fn r#type(&self, py: Python<'_>) -> PyResult<String> {
        let g = self.graph.bind(py).get().lock();
        Ok(g.value_type(self.value).map_err(to_py)?.to_string())
    }

    #[getter]
    fn dtype(&self, py: Python<'_>) -> PyResult<String> {
        let g = self.graph.bind(py).get().lock();
        Ok(g.value_type(self.value).map_err(to_py)?.dtype.to_string())
    }

    /// Ints, and names for symbolic dims.
    #[getter]
    fn shape(&self, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        let ty = self
            .graph
            .bind(py)
            .get()
            .lock()
            .value_type(self.value)
            .map_err(to_py)?
            .clone();
        Ok(node_arg(py, "", &ty)?.shape)
    }

    /// The name of the node computing it.
    #[getter]
    fn name(&self, py: Python<'_>) -> String {
        self.graph
            .bind(py)
            .get()
            .lock()
            .node(self.value.node)
            .name
            .clone()
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "<kiln.Value '{}' {}>",
            self.name(py),
            self.r#type(py)?
        ))
    }

    fn __add__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.binary(py, "Add", o, false)
    }
    fn __radd__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.binary(py, "Add", o, true)
    }
    fn __sub__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.binary(py, "Sub", o, false)
    }
    fn __rsub__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.binary(py, "Sub", o, true)
    }
    fn __mul__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.binary(py, "Mul", o, false)
    }
    fn __rmul__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.binary(py, "Mul", o, true)
    }
    fn __truediv__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.binary(py, "Div", o, false)
    }
    fn __rtruediv__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.binary(py, "Div", o, true)
    }
    fn __matmul__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.binary(py, "MatMul", o, false)
    }
    fn __rmatmul__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.binary(py, "MatMul", o, true)
    }
    fn __neg__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.unary(py, "Neg")
    }
    fn __lt__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.binary(py, "Less", o, false)
    }
    fn __le__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.binary(py, "LessOrEqual", o, false)
    }
    fn __gt__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.binary(py, "Greater", o, false)
    }
    fn __ge__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.binary(py, "GreaterOrEqual", o, false)
    }
}

/// Gradients of the scalar `loss` with respect to each of `wrt`, as new values of
/// their graph (reverse mode, `autodiff::grad`).
#[pyfunction]
fn grad(
    py: Python<'_>,
    loss: PyRef<'_, PyValue>,
    wrt: Vec<PyRef<'_, PyValue>>,
) -> PyResult<Vec<PyValue>> {
    let g = loss.graph.bind(py);
    if let Some(i) = wrt.iter().position(|w| !w.graph.is(g)) {
        return Err(InvalidArgument::new_err(format!(
            "wrt[{i}] belongs to another graph than the loss"
        )));
    }
    let targets: Vec<Value> = wrt.iter().map(|w| w.value).collect();
    let grads = kiln::autodiff::grad(&mut g.get().lock(), loss.value, &targets).map_err(to_py)?;
    Ok(grads.into_iter().map(|v| value_of(g, v)).collect())
}

/// Appends one optimizer step to the graph of `vars` (variables) from `grads` at
/// learning rate `lr` (a float scalar value): `rule` is `"sgd"`, `"adam"` or
/// `"adamw"` (`optim::add_optimizer`; `kiln.optim` wraps it).
#[pyfunction]
#[pyo3(signature = (rule, vars, grads, lr, momentum = 0.0, nesterov = false, beta1 = 0.9,
    beta2 = 0.999, epsilon = 1e-8, weight_decay = 0.0, clip_norm = None))]
#[allow(clippy::too_many_arguments)]
fn add_optimizer(
    py: Python<'_>,
    rule: &str,
    vars: Vec<PyRef<'_, PyValue>>,
    grads: Vec<PyRef<'_, PyValue>>,
    lr: PyRef<'_, PyValue>,
    momentum: f64,
    nesterov: bool,
    beta1: f64,
    beta2: f64,
    epsilon: f64,
    weight_decay: f64,
    clip_norm: Option<f64>,
) -> PyResult<()> {
    let adam = |decoupled| Rule::Adam {
        beta1,
        beta2,
        epsilon,
        decoupled,
    };
    let rule = match rule {
        "sgd" => Rule::Sgd { momentum, nesterov },
        "adam" => adam(false),
        "adamw" => adam(true),
        other => {
            return Err(InvalidArgument::new_err(format!(
                "unknown optimizer '{other}' (sgd, adam, adamw)"
            )))
        }
    };
    let g = lr.graph.bind(py);
    if vars.iter().chain(&grads).any(|v| !v.graph.is(g)) {
        return Err(InvalidArgument::new_err(
            "the variables, gradients and learning rate belong to different graphs",
        ));
    }
    let opt = Optimizer {
        rule,
        weight_decay,
        clip_norm,
    };
    let vars: Vec<Value> = vars.iter().map(|v| v.value).collect();
    let grads: Vec<Value> = grads.iter().map(|v| v.value).collect();
    kiln::optim::add_optimizer(&mut g.get().lock(), &opt, &vars, &grads, lr.value)
        .map(drop)
        .map_err(to_py)
}

/// The op catalogue: (name, one-line signature, doc) for each op, by name.
#[pyfunction]
fn catalogue() -> Vec<(String, String, String)> {
    (kiln::ir::ops::catalogue().values())
        .map(|op| {
            let s = op.schema();
            (s.name.to_string(), s.signature(), s.doc.to_string())
        })
        .collect()
}

/// A compiled graph. Runs may come from many Python threads at once.
#[pyclass(module = "kiln", name = "Executable", frozen)]
struct PyExecutable {
    exe: Arc<dyn kiln::backend::Executable>,
    inputs: Signature,
    outputs: Signature,
}

/// A copy of a NumPy array of element type `T`, row-major, or `None` if `a` is not one.
fn array_of<T: Element + Clone>(a: &Bound<'_, PyAny>) -> Option<ArrayD<T>> {
    let a = a.extract::<PyReadonlyArrayDyn<'_, T>>().ok()?;
    Some(a.as_array().as_standard_layout().into_owned())
}

/// An input array read where it lies: a reference that keeps it alive, its dims, and
/// its buffer.
struct Borrowed<'py> {
    _array: Bound<'py, PyUntypedArray>,
    shape: Vec<usize>,
    data: *const u8,
    nbytes: usize,
}

/// How an input reaches the run: read in place, or copied first.
enum Fed<'py> {
    InPlace(Borrowed<'py>),
    Copied(Tensor),
}

/// `value` borrowed in place when it is a C-contiguous, aligned NumPy array of exactly
/// the input's element type; `None` when it must be converted (and copied).
fn in_place<'py>(
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
        _array: array.clone(),
        shape,
        data: data as *const u8,
        nbytes,
    })
}

/// `value` itself, or, for an object that is not a NumPy array but speaks DLPack (a
/// PyTorch or JAX CPU tensor, …), the NumPy array over its memory (no copy).
fn from_dlpack<'py>(
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
fn numpy_dtype(py: Python<'_>, d: DType) -> Option<Bound<'_, PyArrayDescr>> {
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
fn input_tensor(
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
fn output_array(py: Python<'_>, name: &str, t: Tensor) -> PyResult<Py<PyAny>> {
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

impl PyExecutable {
    /// Runs on `feeds` (input name → array); the outputs in graph order.
    fn run_all(&self, py: Python<'_>, feeds: &Bound<'_, PyDict>) -> PyResult<Vec<Tensor>> {
        let mut fed = Vec::with_capacity(self.inputs.len());
        for (name, ty) in &self.inputs {
            let value = feeds.get_item(name)?.ok_or_else(|| {
                RunBadInput::new_err(format!(
                    "missing input '{name}' (the graph's inputs: {})",
                    names(&self.inputs)
                ))
            })?;
            let value = from_dlpack(py, name, value)?;
            fed.push(match in_place(py, ty, &value) {
                Some(borrowed) => Fed::InPlace(borrowed),
                None => Fed::Copied(input_tensor(py, name, ty, &value)?),
            });
        }
        if feeds.len() != self.inputs.len() {
            for key in feeds.keys() {
                let key: String = key.extract()?;
                if !self.inputs.iter().any(|(n, _)| *n == key) {
                    return Err(RunBadInput::new_err(format!(
                        "'{key}' is not an input (the graph's inputs: {})",
                        names(&self.inputs)
                    )));
                }
            }
        }
        let views = (fed.iter().zip(&self.inputs))
            .map(|(f, (name, ty))| {
                let view = match f {
                    Fed::InPlace(b) => {
                        // SAFETY: `b` holds a reference to the array, whose buffer holds
                        // `nbytes` bytes from `data` (checked C-contiguous in `in_place`).
                        let bytes = unsafe { std::slice::from_raw_parts(b.data, b.nbytes) };
                        TensorView::new(ty.dtype, &b.shape, bytes)
                    }
                    Fed::Copied(t) => t.bytes_view().ok_or_else(|| "not dense".to_string()),
                };
                view.map_err(|e| RunBadInput::new_err(format!("input '{name}': {e}")))
            })
            .collect::<PyResult<Vec<_>>>()?;
        let exe = &self.exe;
        py.detach(|| exe.run_views(&views)).map_err(run_error)
    }

    /// The output positions `wanted` names, all of them for `None`.
    fn output_indices(&self, wanted: Option<Vec<String>>) -> PyResult<Vec<usize>> {
        let Some(wanted) = wanted else {
            return Ok((0..self.outputs.len()).collect());
        };
        (wanted.iter())
            .map(|w| {
                self.outputs
                    .iter()
                    .position(|(n, _)| n == w)
                    .ok_or_else(|| {
                        InvalidArgument::new_err(format!(
                            "'{w}' is not an output (the graph's outputs: {})",
                            names(&self.outputs)
                        ))
                    })
            })
            .collect()
    }
}

fn names(sig: &[(String, TensorType)]) -> String {
    sig.iter()
        .map(|(n, _)| n.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

#[pymethods]
impl PyExecutable {
    /// Runs on `feeds` (input name → NumPy array); returns {output name: array}. A
    /// C-contiguous, aligned array of the input's dtype is read in place; any other
    /// value is copied once into row-major order. The outputs are Kiln's buffers,
    /// handed over without a copy.
    fn run<'py>(
        &self,
        py: Python<'py>,
        feeds: &Bound<'py, PyDict>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let results = self.run_all(py, feeds)?;
        let out = PyDict::new(py);
        for ((name, _), t) in self.outputs.iter().zip(results) {
            out.set_item(name, output_array(py, name, t)?)?;
        }
        Ok(out)
    }

    /// `run` with the inputs as keyword arguments.
    #[pyo3(signature = (**inputs))]
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        inputs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let empty = PyDict::new(py);
        self.run(py, inputs.unwrap_or(&empty))
    }

    /// onnxruntime's form: the outputs named in `output_names` (all for `None`), in
    /// that order, as a list.
    #[pyo3(signature = (output_names, feeds))]
    fn run_list<'py>(
        &self,
        py: Python<'py>,
        output_names: Option<Vec<String>>,
        feeds: &Bound<'py, PyDict>,
    ) -> PyResult<Bound<'py, PyList>> {
        let picks = self.output_indices(output_names)?;
        let mut results: Vec<Option<Tensor>> =
            self.run_all(py, feeds)?.into_iter().map(Some).collect();
        let list = PyList::empty(py);
        for i in picks {
            let name = &self.outputs[i].0;
            // Each output's buffer is handed over once.
            let t = match results[i].take() {
                Some(t) => t,
                None => {
                    return Err(InvalidArgument::new_err(format!(
                        "output '{name}' is asked for twice"
                    )))
                }
            };
            list.append(output_array(py, name, t)?)?;
        }
        Ok(list)
    }

    #[getter]
    fn inputs(&self, py: Python<'_>) -> PyResult<Vec<NodeArg>> {
        self.inputs
            .iter()
            .map(|(n, t)| node_arg(py, n, t))
            .collect()
    }

    /// The variables the executable owns, by name and type, in graph order.
    #[getter]
    fn variables(&self, py: Python<'_>) -> PyResult<Vec<NodeArg>> {
        (self.exe.variables().iter())
            .map(|(n, t)| node_arg(py, n, t))
            .collect()
    }

    /// A copy of variable `name`'s current value.
    fn read_variable(&self, py: Python<'_>, name: &str) -> PyResult<Py<PyAny>> {
        let t = self.exe.read_variable(name).map_err(to_py)?;
        output_array(py, name, t)
    }

    /// Replaces the variables named in `values` (name → array), all or none.
    fn write_variables(&self, py: Python<'_>, values: &Bound<'_, PyDict>) -> PyResult<()> {
        let vars = self.exe.variables();
        let mut owned = Vec::with_capacity(values.len());
        for (k, v) in values.iter() {
            let name: String = k.extract()?;
            let dtype = (vars.iter().find(|(n, _)| *n == name)).map(|(_, t)| t.dtype.to_string());
            owned.push((name, tensor_from(py, &v, dtype.as_deref())?));
        }
        let refs: Vec<(&str, &Tensor)> = owned.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let exe = &self.exe;
        py.detach(|| exe.write_variables(&refs)).map_err(to_py)
    }

    #[getter]
    fn outputs(&self, py: Python<'_>) -> PyResult<Vec<NodeArg>> {
        self.outputs
            .iter()
            .map(|(n, t)| node_arg(py, n, t))
            .collect()
    }
}

/// Loads `path`: an ONNX model (`.onnx`, its external data beside it) or `.kir` text.
#[pyfunction]
fn load(py: Python<'_>, path: std::path::PathBuf) -> PyResult<PyGraph> {
    let graph = py
        .detach(|| {
            let onnx = (path.extension()).is_some_and(|e| e.eq_ignore_ascii_case("onnx"));
            if onnx {
                onnx::import_file(&path)
            } else {
                text::parse_file(&path)
            }
        })
        .map_err(to_py)?;
    Ok(PyGraph::wrap(graph))
}

/// Imports an ONNX model from its bytes (external data, if any, from `base_dir`).
#[pyfunction]
#[pyo3(signature = (data, base_dir = None))]
fn load_onnx_bytes(
    py: Python<'_>,
    data: &[u8],
    base_dir: Option<std::path::PathBuf>,
) -> PyResult<PyGraph> {
    let graph = py
        .detach(|| onnx::import_bytes(data, base_dir.as_deref()))
        .map_err(to_py)?;
    Ok(PyGraph::wrap(graph))
}

/// Parses `.kir` text (`Graph.to_text`'s language); `name` labels it in errors.
#[pyfunction]
#[pyo3(signature = (source, name = "<string>"))]
fn parse(source: &str, name: &str) -> PyResult<PyGraph> {
    let graph = text::parse(source, name, None::<&Path>).map_err(to_py)?;
    Ok(PyGraph::wrap(graph))
}

#[pymodule]
fn _kiln(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<PyGraph>()?;
    m.add_class::<PyExecutable>()?;
    m.add_class::<NodeArg>()?;
    m.add_class::<PyValue>()?;
    m.add_class::<PyAxis>()?;
    m.add_function(wrap_pyfunction!(grad, m)?)?;
    m.add_function(wrap_pyfunction!(catalogue, m)?)?;
    m.add_function(wrap_pyfunction!(add_optimizer, m)?)?;
    m.add_function(wrap_pyfunction!(load, m)?)?;
    m.add_function(wrap_pyfunction!(load_onnx_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(parse, m)?)?;
    m.add("KilnError", py.get_type::<KilnError>())?;
    m.add("InvalidArgument", py.get_type::<InvalidArgument>())?;
    m.add("IoError", py.get_type::<IoError>())?;
    m.add("ParseError", py.get_type::<ParseError>())?;
    m.add("UnknownOp", py.get_type::<UnknownOp>())?;
    m.add("Unsupported", py.get_type::<Unsupported>())?;
    m.add("InvalidGraph", py.get_type::<InvalidGraph>())?;
    m.add("CompileFailed", py.get_type::<CompileFailed>())?;
    m.add("RunFailed", py.get_type::<RunFailed>())?;
    m.add("RunBadInput", py.get_type::<RunBadInput>())?;
    m.add("DeviceUnavailable", py.get_type::<DeviceUnavailable>())?;
    Ok(())
}
