//! Ops defined in Python (`kiln.custom_op`): a NumPy function registered in the library's
//! run-time op registry (`kiln::ir::ops::custom`, the registry the C ABI's
//! `kiln_register_op` fills), so graphs built in Python and ONNX nodes of its domain use
//! it, the passes treat it as opaque, the CPU backend runs it between its own kernels,
//! and `kiln.grad` differentiates through it.
//!
//! A gradient is a second NumPy function, registered as the op `domain::name.grad`: the
//! forward op's gradient rule adds one node of it, taking the forward node's inputs,
//! outputs and output gradients, and giving one gradient per input.
//!
//! Kernels are called with the GIL taken back from the run that released it, from
//! whichever thread runs the step. Inputs are handed over as fresh NumPy arrays (a
//! kernel may keep them), results are converted to the inferred dtype and copied into
//! Kiln's buffers after their shapes are checked against inference.
use crate::arrays::{output_array, tensor_from};
use crate::errors::InvalidArgument;
use crate::graph::dim_of;
use kiln::backend::registered::{BufferKernel, Kernels, RawTensor};
use kiln::ir::ops::custom;
use kiln::ir::ops::{EvalCtx, InferCtx, Op, OpSchema};
use kiln::ir::{Attr, Attrs};
use kiln::tensor::TensorView;
use kiln::{DType, Dim, Graph, NodeId, Shape, Tensor, TensorType, Value};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use pyo3::IntoPyObjectExt;
use std::sync::Arc;

/// What a Python op's node computes: the forward function, or the gradient function of
/// a forward op with `inputs` inputs and `outputs` outputs.
enum Kernel {
    Forward {
        compute: Py<PyAny>,
        infer: Option<Py<PyAny>>,
        /// `domain::name.grad`, when a gradient was given.
        gradient: Option<String>,
    },
    Gradient {
        gradient: Py<PyAny>,
        inputs: usize,
        outputs: usize,
    },
}

/// A Python op: its functions, shared with the buffer kernel it hands the CPU backend.
struct PythonOp {
    core: Arc<PythonCore>,
    kernels: Kernels,
}

impl std::ops::Deref for PythonOp {
    type Target = PythonCore;
    fn deref(&self) -> &PythonCore {
        &self.core
    }
}

impl PythonOp {
    fn new(core: PythonCore) -> PythonOp {
        let core = Arc::new(core);
        let kernels = Kernels {
            buffers: Some(core.clone()),
            cuda: None,
        };
        PythonOp { core, kernels }
    }
}

struct PythonCore {
    schema: OpSchema,
    kernel: Kernel,
    pure: bool,
}

/// A Python exception as the library's error text: `TypeError: message`.
fn message(py: Python<'_>, e: PyErr) -> String {
    let kind = e
        .get_type(py)
        .name()
        .map_or_else(|_| "Exception".to_string(), |n| n.to_string());
    format!("{kind}: {}", e.value(py))
}

/// A node's attributes as keyword arguments (graph attributes are not handed over).
fn kwargs<'py>(py: Python<'py>, attrs: &Attrs) -> PyResult<Bound<'py, PyDict>> {
    let kw = PyDict::new(py);
    for (name, attr) in attrs.iter() {
        let value = match attr {
            Attr::Int(i) => i.into_py_any(py)?,
            Attr::Float(f) => f.into_py_any(py)?,
            Attr::String(s) => s.into_py_any(py)?,
            Attr::Ints(v) => v.into_py_any(py)?,
            Attr::Floats(v) => v.into_py_any(py)?,
            Attr::Strings(v) => v.into_py_any(py)?,
            Attr::Graph(_) => continue,
        };
        kw.set_item(name, value)?;
    }
    Ok(kw)
}

/// A type as the infer function sees it: `(shape, dtype)`, each dim an int or a
/// symbol's name, the dtype Kiln's name (`"f32"`).
fn type_to_py(py: Python<'_>, t: &TensorType) -> PyResult<Py<PyAny>> {
    let dims = t
        .shape
        .dims()
        .into_iter()
        .map(|d| match d {
            Dim::Fixed(n) => n.into_py_any(py),
            Dim::Sym(s) => s.into_py_any(py),
        })
        .collect::<PyResult<Vec<_>>>()?;
    (PyTuple::new(py, dims)?, t.dtype.to_string()).into_py_any(py)
}

/// A `(shape, dtype)` pair from an infer function; the dtype Kiln's or NumPy's name.
fn type_from_py(t: &Bound<'_, PyAny>) -> PyResult<TensorType> {
    let (shape, dtype): (Vec<Bound<'_, PyAny>>, Bound<'_, PyAny>) = t.extract().map_err(|_| {
        InvalidArgument::new_err(format!(
            "infer must give (shape, dtype) pairs, not {}",
            t.repr().map_or_else(|_| "?".into(), |r| r.to_string())
        ))
    })?;
    let dims = shape.iter().map(dim_of).collect::<PyResult<Vec<_>>>()?;
    let name = dtype.str()?.to_string();
    let dtype = match name.parse::<DType>() {
        Ok(d) => d,
        Err(e) => crate::arrays::NUMPY_DTYPES
            .iter()
            .find(|(_, n)| *n == name)
            .map(|&(d, _)| d)
            .ok_or_else(|| InvalidArgument::new_err(e))?,
    };
    Ok(TensorType::new(dtype, Shape::new(dims)))
}

/// One result or a tuple/list of them, as a list.
fn results<'py>(r: Bound<'py, PyAny>) -> PyResult<Vec<Bound<'py, PyAny>>> {
    if r.is_instance_of::<PyTuple>() || r.is_instance_of::<PyList>() {
        r.try_iter()?.collect()
    } else {
        Ok(vec![r])
    }
}

impl PythonCore {
    fn num_inputs(&self) -> usize {
        self.schema.inputs.len()
    }

    fn infer_types(
        &self,
        inputs: &[Option<TensorType>],
        attrs: &Attrs,
    ) -> Result<Vec<TensorType>, String> {
        match &self.kernel {
            Kernel::Forward { infer: None, .. } => {
                let first = inputs.first().cloned().flatten();
                let first = first.ok_or("without an infer function the op needs input 0")?;
                Ok(vec![first; self.schema.outputs.len()])
            }
            Kernel::Forward {
                infer: Some(infer), ..
            } => Python::attach(|py| {
                let call = || -> PyResult<Vec<TensorType>> {
                    let args = inputs
                        .iter()
                        .map(|t| {
                            t.as_ref()
                                .map_or_else(|| Ok(py.None()), |t| type_to_py(py, t))
                        })
                        .collect::<PyResult<Vec<_>>>()?;
                    let kw = kwargs(py, attrs)?;
                    let r = infer.bind(py).call(PyTuple::new(py, args)?, Some(&kw))?;
                    let list = if r.is_instance_of::<PyList>() {
                        r.try_iter()?.collect::<PyResult<Vec<_>>>()?
                    } else {
                        vec![r]
                    };
                    list.iter().map(type_from_py).collect()
                };
                let types = call().map_err(|e| format!("infer raised {}", message(py, e)))?;
                if types.len() != self.schema.outputs.len() {
                    return Err(format!(
                        "infer gave {} types for {} outputs",
                        types.len(),
                        self.schema.outputs.len()
                    ));
                }
                Ok(types)
            }),
            // One gradient per forward input, of its type.
            Kernel::Gradient { inputs: n, .. } => (0..*n)
                .map(|i| {
                    let t = inputs.get(i).cloned().flatten();
                    t.ok_or_else(|| format!("input {i} is required"))
                })
                .collect(),
        }
    }

    /// Calls the Python function on `inputs`; its results, checked against `expected`.
    fn call(
        &self,
        inputs: Vec<Option<Tensor>>,
        attrs: &Attrs,
        expected: &[TensorType],
    ) -> Result<Vec<Tensor>, String> {
        Python::attach(|py| {
            let call = || -> PyResult<Vec<Tensor>> {
                let mut arrays = Vec::with_capacity(inputs.len());
                for (i, t) in inputs.into_iter().enumerate() {
                    arrays.push(match t {
                        Some(t) => output_array(py, &format!("input {i}"), t)?,
                        None => py.None(),
                    });
                }
                let kw = kwargs(py, attrs)?;
                let made = match &self.kernel {
                    Kernel::Forward { compute, .. } => compute
                        .bind(py)
                        .call(PyTuple::new(py, arrays)?, Some(&kw))?,
                    Kernel::Gradient {
                        gradient,
                        inputs,
                        outputs,
                    } => {
                        let mut rest = arrays;
                        let output_grads = rest.split_off(inputs + outputs);
                        let outs = rest.split_off(*inputs);
                        let args = (
                            PyList::new(py, rest)?,
                            PyList::new(py, outs)?,
                            PyList::new(py, output_grads)?,
                        );
                        gradient.bind(py).call(args, Some(&kw))?
                    }
                };
                let made = results(made)?;
                if made.len() != expected.len() {
                    return Err(InvalidArgument::new_err(format!(
                        "it returned {} arrays for {} outputs",
                        made.len(),
                        expected.len()
                    )));
                }
                let mut tensors = Vec::with_capacity(made.len());
                for (k, (m, ty)) in made.iter().zip(expected).enumerate() {
                    // A gradient of None: the input does not change the loss.
                    let t = if m.is_none() && matches!(self.kernel, Kernel::Gradient { .. }) {
                        let dims = ty.shape.to_fixed().ok_or_else(|| {
                            InvalidArgument::new_err(format!(
                                "output {k}: the type {ty} is not concrete"
                            ))
                        })?;
                        Tensor::zeros(ty.dtype, &dims)
                    } else {
                        tensor_from(py, m, Some(&ty.dtype.to_string()))?
                    };
                    let want = ty.shape.to_fixed();
                    if want.as_deref() != Some(t.shape()) {
                        return Err(InvalidArgument::new_err(format!(
                            "output {k} has shape {:?}, inference gave {ty}",
                            t.shape()
                        )));
                    }
                    tensors.push(t);
                }
                Ok(tensors)
            };
            call().map_err(|e| message(py, e))
        })
    }

    /// The concrete types of a node's outputs for the given input tensors' shapes.
    fn concrete(
        &self,
        inputs: &[Option<(DType, &[usize])>],
        attrs: &Attrs,
    ) -> Result<Vec<TensorType>, String> {
        let types: Vec<Option<TensorType>> = inputs
            .iter()
            .map(|t| t.map(|(d, dims)| TensorType::new(d, Shape::fixed(dims))))
            .collect();
        self.infer_types(&types, attrs)
    }
}

impl BufferKernel for PythonCore {
    fn compute(
        &self,
        inputs: &[Option<RawTensor>],
        outputs: &[RawTensor],
        attrs: &Attrs,
    ) -> Result<(), String> {
        let shapes: Vec<Option<(DType, &[usize])>> = inputs
            .iter()
            .map(|t| t.as_ref().map(|t| (t.dtype, &t.shape[..])))
            .collect();
        let expected = self.concrete(&shapes, attrs)?;
        let mut tensors = Vec::with_capacity(inputs.len());
        for t in inputs {
            tensors.push(match t {
                None => None,
                Some(t) => {
                    let len = t.shape.iter().product::<usize>() * t.dtype.size_in_bytes();
                    // SAFETY: the backend hands over a live row-major buffer of the
                    // input's dtype and shape for the duration of the call.
                    let bytes = unsafe { std::slice::from_raw_parts(t.data, len) };
                    Some(TensorView::new(t.dtype, &t.shape, bytes)?.to_tensor()?)
                }
            });
        }
        let made = self.call(tensors, attrs, &expected)?;
        for (k, (t, out)) in made.iter().zip(outputs).enumerate() {
            let view = t
                .bytes_view()
                .ok_or_else(|| format!("output {k} is not a dense tensor"))?;
            let len = out.shape.iter().product::<usize>() * out.dtype.size_in_bytes();
            if out.dtype != t.dtype() || out.shape != t.shape() || view.bytes().len() != len {
                return Err(format!(
                    "output {k}: the planned buffer does not match the result"
                ));
            }
            // SAFETY: `out.data` is the planned output buffer of `len` bytes, distinct
            // from the result's own memory.
            unsafe { std::ptr::copy_nonoverlapping(view.bytes().as_ptr(), out.data, len) };
        }
        Ok(())
    }
}

impl Op for PythonOp {
    fn schema(&self) -> &OpSchema {
        &self.schema
    }

    fn validate_attrs(&self, _attrs: &Attrs) -> Result<(), String> {
        // Any attribute: the Python functions take them as keyword arguments.
        Ok(())
    }

    fn pure(&self) -> bool {
        self.pure
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        self.infer_types(cx.inputs, cx.attrs)
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let shapes: Vec<Option<(DType, &[usize])>> = cx
            .inputs
            .iter()
            .map(|t| t.map(|t| (t.dtype(), t.shape())))
            .collect();
        let expected = self.concrete(&shapes, cx.attrs)?;
        let inputs = cx.inputs.iter().map(|t| t.cloned()).collect();
        self.call(inputs, cx.attrs, &expected)
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
        let Kernel::Forward {
            gradient: Some(gradient),
            ..
        } = &self.kernel
        else {
            return None;
        };
        let n = g.node(node).clone();
        let mut inputs = n.inputs.clone();
        inputs.extend((0..n.outputs.len() as u32).map(|i| Some(node.out(i))));
        inputs.extend(gys.iter().cloned());
        let name = format!("{}.grad", n.name);
        Some(
            g.add_op(gradient, &inputs, n.attrs.clone(), &name)
                .map_err(|e| e.to_string())
                .map(|id| {
                    (0..self.num_inputs() as u32)
                        .map(|i| Some(id.out(i)))
                        .collect()
                }),
        )
    }
}

/// Registers `compute` as the op `domain::name` with `inputs` inputs and `outputs`
/// outputs; with `gradient`, also `domain::name.grad`. `infer(*types, **attrs)` gives
/// the outputs' `(shape, dtype)` pairs; without it every output has input 0's type.
#[pyfunction]
#[pyo3(signature = (domain, name, compute, inputs = 1, outputs = 1, infer = None, gradient = None, pure = true, doc = ""))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn register_op(
    domain: &str,
    name: &str,
    compute: Py<PyAny>,
    inputs: usize,
    outputs: usize,
    infer: Option<Py<PyAny>>,
    gradient: Option<Py<PyAny>>,
    pure: bool,
    doc: &str,
) -> PyResult<String> {
    if outputs == 0 {
        return Err(InvalidArgument::new_err(format!(
            "{domain}::{name}: an op has at least one output"
        )));
    }
    let qualified = format!("{domain}::{name}");
    let names = |prefix: &str, n: usize, suffix: &str| -> Vec<String> {
        (0..n).map(|i| format!("{prefix}{i}{suffix}")).collect()
    };
    let gradient_name = gradient.as_ref().map(|_| format!("{qualified}.grad"));
    let forward = PythonOp::new(PythonCore {
        schema: custom::registered_schema(
            &qualified,
            &names("input", inputs, ""),
            &names("output", outputs, ""),
            doc,
        ),
        kernel: Kernel::Forward {
            compute,
            infer,
            gradient: gradient_name.clone(),
        },
        pure,
    });
    custom::register(Arc::new(forward)).map_err(InvalidArgument::new_err)?;
    if let (Some(gradient), Some(gradient_name)) = (gradient, gradient_name) {
        let mut grad_inputs = names("input", inputs, "");
        grad_inputs.extend(names("output", outputs, ""));
        grad_inputs.extend(names("output_grad", outputs, "?"));
        let backward = PythonOp::new(PythonCore {
            schema: custom::registered_schema(
                &gradient_name,
                &grad_inputs,
                &names("input_grad", inputs, ""),
                "the gradient of a Python op",
            ),
            kernel: Kernel::Gradient {
                gradient,
                inputs,
                outputs,
            },
            pure,
        });
        if let Err(e) = custom::register(Arc::new(backward)) {
            custom::unregister(&qualified);
            return Err(InvalidArgument::new_err(e));
        }
    }
    Ok(qualified)
}

/// Unregisters `domain::name` (and its gradient op); graphs that use it keep working.
/// Whether it was registered.
#[pyfunction]
pub(crate) fn unregister_op(domain: &str, name: &str) -> bool {
    let qualified = format!("{domain}::{name}");
    custom::unregister(&format!("{qualified}.grad"));
    custom::unregister(&qualified).is_some()
}
