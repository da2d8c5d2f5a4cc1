//! Each `kiln::Error` as the Python exception of its C status (`KILN_STATUS_*`), all
//! subclasses of `KilnError`, with the library's message unchanged.
use kiln::capi::{
    kiln_last_error_message, kiln_status, KILN_STATUS_COMPILE_FAILED,
    KILN_STATUS_DEVICE_UNAVAILABLE, KILN_STATUS_INVALID_ARGUMENT, KILN_STATUS_INVALID_GRAPH,
    KILN_STATUS_IO, KILN_STATUS_NULL_ARGUMENT, KILN_STATUS_PARSE, KILN_STATUS_RUN_BAD_INPUT,
    KILN_STATUS_RUN_FAILED, KILN_STATUS_UNKNOWN_OP, KILN_STATUS_UNSUPPORTED,
    KILN_STATUS_UNSUPPORTED_VERSION,
};
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

/// The exception of a failed C ABI call's `status`, with this thread's last message.
pub(crate) fn status_error(status: kiln_status) -> PyErr {
    // SAFETY: the message is this thread's NUL-terminated last error, read at once.
    let m = unsafe { std::ffi::CStr::from_ptr(kiln_last_error_message()) }
        .to_string_lossy()
        .into_owned();
    match status {
        KILN_STATUS_NULL_ARGUMENT | KILN_STATUS_INVALID_ARGUMENT => InvalidArgument::new_err(m),
        KILN_STATUS_IO => IoError::new_err(m),
        KILN_STATUS_PARSE => ParseError::new_err(m),
        KILN_STATUS_UNKNOWN_OP => UnknownOp::new_err(m),
        KILN_STATUS_UNSUPPORTED | KILN_STATUS_UNSUPPORTED_VERSION => Unsupported::new_err(m),
        KILN_STATUS_INVALID_GRAPH => InvalidGraph::new_err(m),
        KILN_STATUS_COMPILE_FAILED => CompileFailed::new_err(m),
        KILN_STATUS_RUN_FAILED => RunFailed::new_err(m),
        KILN_STATUS_RUN_BAD_INPUT => RunBadInput::new_err(m),
        KILN_STATUS_DEVICE_UNAVAILABLE => DeviceUnavailable::new_err(m),
        _ => KilnError::new_err(m),
    }
}
