//! Each `kiln::Error` as the Python exception of its C status (`KILN_STATUS_*`), all
//! subclasses of `KilnError`, with the library's message unchanged.
use kiln::interop::InteropError;
use kiln::Error;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

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
pub(crate) fn to_py(e: Error) -> PyErr {
    let m = e.to_string();
    exception(&e, m)
}

/// A tensor that could not cross (DLPack, a copy): the exception of the `Error` it is,
/// with its message as is, as C's `kiln_last_error_message` gives it.
pub(crate) fn interop_error(e: InteropError) -> PyErr {
    let m = e.message.clone();
    exception(&e.into_error(), m)
}

/// The exception class of `e`'s C status, saying `m`.
fn exception(e: &Error, m: String) -> PyErr {
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
pub(crate) fn run_error(e: Error) -> PyErr {
    match e {
        Error::InvalidArgument(m) => RunBadInput::new_err(m),
        other => to_py(other),
    }
}
