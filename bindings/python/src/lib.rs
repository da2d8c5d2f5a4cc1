//! `kiln._kiln`: the extension module under the `kiln` Python package.
//!
//! It holds what must be native: graphs loaded or parsed into the library's `Graph`,
//! their compiled executables, the crossing of NumPy arrays in and out of a run, and
//! `kiln.Tensor` with DLPack both ways (over `kiln::interop`, as the C ABI's are).
//! The GIL is released while a graph compiles and while it runs, so Python threads run
//! one executable at once. Each `kiln::Error` becomes the exception of its C status
//! (`KILN_STATUS_*`), all subclasses of `KilnError`, with the library's message as is.
mod arrays;
mod custom_op;
mod errors;
mod executable;
mod graph;
mod tensor;

use crate::errors::*;
use crate::executable::{NodeArg, PyExecutable};
use crate::graph::*;
use crate::tensor::PyTensor;
use pyo3::prelude::*;

#[pymodule]
fn _kiln(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<PyGraph>()?;
    m.add_class::<PyExecutable>()?;
    m.add_class::<NodeArg>()?;
    m.add_class::<PyValue>()?;
    m.add_class::<PyAxis>()?;
    m.add_class::<PyTensor>()?;
    m.add_function(wrap_pyfunction!(grad, m)?)?;
    m.add_function(wrap_pyfunction!(catalogue, m)?)?;
    m.add_function(wrap_pyfunction!(add_optimizer, m)?)?;
    m.add_function(wrap_pyfunction!(load, m)?)?;
    m.add_function(wrap_pyfunction!(load_onnx_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(parse, m)?)?;
    m.add_function(wrap_pyfunction!(custom_op::register_op, m)?)?;
    m.add_function(wrap_pyfunction!(custom_op::unregister_op, m)?)?;
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
