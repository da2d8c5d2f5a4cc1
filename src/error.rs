//! The crate's one error type. Each variant maps onto one C status code (1xx argument,
//! 2xx graph, 3xx compile, 4xx run, 5xx device; `capi::Failure`), so keep them coarse and
//! put the detail (node name, op, axis names) into the message.

/// Every fallible Kiln operation returns this.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// A caller passed something unusable (a bad argument, a wrong input at run time).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A `.kir` text that does not parse; `line`/`col` are 1-based.
    #[error("{file}:{line}:{col}: {msg}")]
    Parse {
        file: String,
        line: usize,
        col: usize,
        msg: String,
    },
    /// An op name the catalogue does not know.
    #[error("unknown op: {0}")]
    UnknownOp(String),
    /// Something well-formed that Kiln does not implement: an attribute value, a dtype,
    /// an ONNX domain or opset, an attribute type.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A graph that fails verification: bad types, shapes, axis names, attributes.
    #[error("{0}")]
    Graph(String),
    /// Compiling a valid graph failed in a backend (e.g. NVRTC rejected a generated
    /// kernel); the message names the node or kernel and carries the compiler's log.
    #[error("compile failed: {0}")]
    Compile(String),
    /// A failure while running a graph.
    #[error("run failed: {0}")]
    Runtime(String),
    /// A device or backend that is not available.
    #[error("device unavailable: {0}")]
    Device(String),
    /// Reading or writing a file.
    #[error("{0}")]
    Io(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// Reading or writing `path` failed with `err`.
    pub fn io(path: &std::path::Path, err: impl std::fmt::Display) -> Error {
        Error::Io(format!("{}: {err}", path.display()))
    }

    /// The message without its kind's prefix, for wrapping in another error that names
    /// where it happened.
    pub fn into_message(self) -> String {
        match self {
            Error::Graph(m)
            | Error::InvalidArgument(m)
            | Error::UnknownOp(m)
            | Error::Unsupported(m)
            | Error::Runtime(m)
            | Error::Device(m)
            | Error::Io(m) => m,
            e => e.to_string(),
        }
    }
}
