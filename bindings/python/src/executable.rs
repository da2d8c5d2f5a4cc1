//! Compiled graphs: runs from many Python threads with the GIL released, their inputs,
//! outputs and variables.
use crate::arrays::{
    from_dlpack, in_place, input_tensor, onnx_type_name, output_array, tensor_from, Fed,
};
use crate::errors::{run_error, to_py, InvalidArgument, RunBadInput};
use crate::tensor::PyTensor;
use kiln::backend::{backend_with, Device};
use kiln::passes::CompileOptions;
use kiln::{Dim, Error, Graph, Tensor, TensorType};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use pyo3::IntoPyObjectExt;
use std::sync::Arc;

/// A graph input or output as onnxruntime's `NodeArg` shows it: `name`, `shape` (ints,
/// and strings for symbolic dims), `type` (`"tensor(float)"`, …).
#[pyclass(module = "kiln", name = "NodeArg", frozen, get_all)]
pub(crate) struct NodeArg {
    name: String,
    pub(crate) shape: Vec<Py<PyAny>>,
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

pub(crate) fn node_arg(py: Python<'_>, name: &str, ty: &TensorType) -> PyResult<NodeArg> {
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

/// Each of `sig`'s values as a `NodeArg`.
pub(crate) fn node_args(py: Python<'_>, sig: &[(String, TensorType)]) -> PyResult<Vec<NodeArg>> {
    sig.iter().map(|(n, t)| node_arg(py, n, t)).collect()
}

/// Named, typed values: a graph's inputs or outputs.
pub(crate) type Signature = Vec<(String, TensorType)>;

/// The graph's inputs and outputs.
pub(crate) fn signature(g: &Graph) -> Result<(Signature, Signature), Error> {
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

/// The compile options of `Graph.compile`: the environment's (`KILN_*`), then
/// `threads`, then each `options` item (its value as text: `True` is `1`), all through
/// [`CompileOptions::set`] as the command line and C set them.
pub(crate) fn compile_options(
    threads: Option<usize>,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<CompileOptions> {
    let mut o = CompileOptions::from_env().map_err(to_py)?;
    if let Some(n) = threads {
        o.threads = n;
    }
    for (key, value) in options.into_iter().flat_map(|d| d.iter()) {
        let key: String = key.extract()?;
        let value = match value.extract::<bool>() {
            Ok(flag) => u8::from(flag).to_string(),
            Err(_) => value.str()?.to_string(),
        };
        o.set(&key, &value).map_err(to_py)?;
    }
    Ok(o)
}

/// A compiled graph. Runs may come from many Python threads at once.
#[pyclass(module = "kiln", name = "Executable", frozen)]
pub(crate) struct PyExecutable {
    exe: Arc<dyn kiln::backend::Executable>,
    inputs: Signature,
    outputs: Signature,
}

impl PyExecutable {
    /// Compiles `graph` for `backend` as `options` say, with the GIL released.
    pub(crate) fn compile(
        py: Python<'_>,
        graph: Graph,
        backend: &str,
        options: CompileOptions,
    ) -> PyResult<PyExecutable> {
        let device: Device = backend.parse().map_err(to_py)?;
        let (inputs, outputs) = signature(&graph).map_err(to_py)?;
        let exe = py
            .detach(move || backend_with(device, options)?.compile(&graph))
            .map_err(to_py)?;
        Ok(PyExecutable {
            exe: Arc::from(exe),
            inputs,
            outputs,
        })
    }

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
            // A kiln.Tensor of the input's dtype is read in place, any other as NumPy
            // sees it (copied into the input's type).
            let tensor = value.cast::<PyTensor>().ok().cloned();
            let value = match tensor {
                Some(t) => match PyTensor::in_place(&t, ty) {
                    Some(borrowed) => {
                        fed.push(Fed::InPlace(borrowed));
                        continue;
                    }
                    None => PyTensor::numpy(&t)?,
                },
                None => from_dlpack(py, name, value)?,
            };
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
                    Fed::InPlace(b) => b.view(ty.dtype),
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

pub(crate) fn names(sig: &[(String, TensorType)]) -> String {
    sig.iter()
        .map(|(n, _)| n.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

#[pymethods]
impl PyExecutable {
    /// Runs on `feeds` (input name → NumPy array or `kiln.Tensor`); returns {output
    /// name: array}. A C-contiguous, aligned array or a `kiln.Tensor` of the input's
    /// dtype is read in place; any other value is copied once into row-major order. The outputs are Kiln's buffers,
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
        node_args(py, &self.inputs)
    }

    /// The variables the executable owns, by name and type, in graph order.
    #[getter]
    fn variables(&self, py: Python<'_>) -> PyResult<Vec<NodeArg>> {
        node_args(py, &self.exe.variables())
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
        node_args(py, &self.outputs)
    }

    /// Writes every variable to the checkpoint file `path` (Kiln's versioned format, the
    /// one `kiln_executable_save_checkpoint` writes), atomically.
    fn save_checkpoint(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
        let exe = &*self.exe;
        py.detach(|| kiln::checkpoint::save(exe, &path))
            .map_err(to_py)
    }

    /// Reads the checkpoint at `path` into the variables, all or none: a file of other
    /// variables, or a corrupt one, changes nothing and raises naming the difference.
    fn load_checkpoint(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
        let exe = &*self.exe;
        py.detach(|| kiln::checkpoint::load(exe, &path))
            .map_err(to_py)
    }
}
