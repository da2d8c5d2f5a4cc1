//! Graphs from Python: loaded, parsed or built op by op (`Graph`, `Value`, `Axis`),
//! differentiated (`grad`) and given an optimizer (`add_optimizer`).
use crate::arrays::tensor_from;
use crate::errors::{to_py, InvalidArgument};
use crate::executable::{compile_options, node_arg, node_args, signature, NodeArg, PyExecutable};
use kiln::frontend::onnx;
use kiln::ir::text;
use kiln::ir::{Attr, Attrs};
use kiln::optim::{Optimizer, Rule};
use kiln::{DType, Dim, Graph, TensorType, Value};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use pyo3::IntoPyObjectExt;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

/// A dataflow graph: loaded from `.onnx` or `.kir`, parsed from `.kir` text, or built
/// op by op (`parameter`, `constant`, `variable`, `op`, `output`, and the operators of
/// the values they return).
#[pyclass(module = "kiln", name = "Graph", frozen)]
pub(crate) struct PyGraph {
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
pub(crate) fn value_of(g: &Bound<'_, PyGraph>, v: Value) -> PyValue {
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
    /// threads (0: one per core; `None`: the `threads` option). The compile options
    /// come from the `KILN_*` environment variables, then `threads`, then `options`
    /// (`{"profile": "all", "autotune": 1}`: the keys and values the command line's
    /// `--option` and C's `kiln_compile_options_set_option` take). The GIL is released
    /// meanwhile; the graph may be built on afterwards without changing the executable.
    #[pyo3(signature = (backend = "cpu", threads = None, options = None))]
    fn compile(
        &self,
        py: Python<'_>,
        backend: &str,
        threads: Option<usize>,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PyExecutable> {
        let options = compile_options(threads, options)?;
        PyExecutable::compile(py, self.lock().clone(), backend, options)
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

    /// The graph as Graphviz DOT text (deterministic; what `kiln viz` writes): node
    /// `#12` is DOT node `n12`; large graphs collapsed by name scope.
    fn to_dot(&self) -> String {
        kiln::ir::dot::to_dot(&self.lock())
    }

    #[getter]
    fn name(&self) -> String {
        self.lock().name.clone()
    }

    /// The graph's inputs (`Parameter` nodes) in order.
    #[getter]
    fn inputs(&self, py: Python<'_>) -> PyResult<Vec<NodeArg>> {
        let (inputs, _) = signature(&self.lock()).map_err(to_py)?;
        node_args(py, &inputs)
    }

    /// The graph's outputs in order.
    #[getter]
    fn outputs(&self, py: Python<'_>) -> PyResult<Vec<NodeArg>> {
        let (_, outputs) = signature(&self.lock()).map_err(to_py)?;
        node_args(py, &outputs)
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
pub(crate) struct PyAxis {
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
pub(crate) fn dim_of(d: &Bound<'_, PyAny>) -> PyResult<Dim> {
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
pub(crate) fn shape_of(items: &[Bound<'_, PyAny>]) -> PyResult<kiln::Shape> {
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

/// Attributes from keyword arguments: ints, floats, strings, lists of each, graphs.
pub(crate) fn attrs_of(kw: Option<&Bound<'_, PyDict>>) -> PyResult<Attrs> {
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
pub(crate) struct PyValue {
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
pub(crate) fn grad(
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
pub(crate) fn add_optimizer(
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

/// One op of the catalogue: its name, one-line signature and doc, its inputs' and
/// outputs' names (`x?` optional, `xs...` variadic) and its attributes as
/// `(name, kind, required)`.
type CatalogueEntry = (
    String,
    String,
    String,
    Vec<String>,
    Vec<String>,
    Vec<(String, String, bool)>,
);

/// The op catalogue, by name.
#[pyfunction]
pub(crate) fn catalogue() -> Vec<CatalogueEntry> {
    (kiln::ir::ops::catalogue().values())
        .map(|op| {
            let s = op.schema();
            let names = |list: &[&str]| list.iter().map(|n| n.to_string()).collect();
            let attrs = (s.attrs.iter())
                .map(|a| (a.name.to_string(), a.kind.to_string(), a.required))
                .collect();
            (
                s.name.to_string(),
                s.signature(),
                s.doc.to_string(),
                names(s.inputs),
                names(s.outputs),
                attrs,
            )
        })
        .collect()
}

/// Loads `path`: an ONNX model (`.onnx`, its external data beside it) or `.kir` text.
#[pyfunction]
pub(crate) fn load(py: Python<'_>, path: std::path::PathBuf) -> PyResult<PyGraph> {
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
pub(crate) fn load_onnx_bytes(
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
pub(crate) fn parse(source: &str, name: &str) -> PyResult<PyGraph> {
    let graph = text::parse(source, name, None::<&Path>).map_err(to_py)?;
    Ok(PyGraph::wrap(graph))
}
