//! Tensors that cross between Kiln and foreign code: [`HostTensor`], the host memory
//! behind C's `kiln_tensor` and Python's `kiln.Tensor`, and [`dlpack`], sharing it with
//! other libraries in both directions. The C ABI and the Python bindings both wrap this
//! module; it knows neither C statuses nor Python exceptions.
use std::fmt;

pub mod dlpack;
mod host_tensor;

pub(crate) use host_tensor::checked_dims;
pub use host_tensor::HostTensor;

/// What kind of failure an [`InteropError`] is: a C status or a Python exception class
/// is chosen by it, so the kinds are the distinctions callers report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InteropErrorKind {
    /// A NULL pointer where memory was required.
    Null,
    /// Malformed: dims, strides, an offset, a size, or more memory than can be had.
    Invalid,
    /// Well-formed but not what Kiln reads or writes: a device, a dtype.
    Unsupported,
    /// A DLPack major version Kiln does not read.
    UnsupportedVersion,
}

/// Why a tensor could not cross. `message` is reported as is (C's
/// `kiln_last_error_message`, Python's exception), without a prefix for the kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InteropError {
    pub kind: InteropErrorKind,
    pub message: String,
}

impl InteropError {
    pub(crate) fn new(kind: InteropErrorKind, message: impl Into<String>) -> InteropError {
        InteropError {
            kind,
            message: message.into(),
        }
    }

    pub(crate) fn null(what: &str) -> InteropError {
        InteropError::new(InteropErrorKind::Null, format!("{what} is NULL"))
    }

    pub(crate) fn invalid(message: impl Into<String>) -> InteropError {
        InteropError::new(InteropErrorKind::Invalid, message)
    }

    pub(crate) fn unsupported(message: impl Into<String>) -> InteropError {
        InteropError::new(InteropErrorKind::Unsupported, message)
    }

    /// The crate's error of the same kind (a NULL is an invalid argument, another
    /// DLPack version something unsupported). A method, not `From`: a second
    /// conversion into `Error` would leave `?` in untyped closures ambiguous.
    pub fn into_error(self) -> crate::Error {
        match self.kind {
            InteropErrorKind::Null | InteropErrorKind::Invalid => {
                crate::Error::InvalidArgument(self.message)
            }
            InteropErrorKind::Unsupported | InteropErrorKind::UnsupportedVersion => {
                crate::Error::Unsupported(self.message)
            }
        }
    }
}

impl fmt::Display for InteropError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for InteropError {}
