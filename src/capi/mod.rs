//! The C ABI: what `include/kiln.h` declares, one file per header section.
//!
//! Every exported function runs its body through [`guard`], which catches panics (they
//! become `KILN_STATUS_INTERNAL` with the panic's message) and records the message of any
//! failure for `kiln_last_error_message`. Arguments are checked through the helpers
//! below, so a NULL handle or out-parameter, a non-UTF-8 string or an out-of-range enum
//! value is an error naming the argument, never undefined behaviour. Out-parameters are
//! written only on success.
//!
//! Enums that C passes *in* (`kiln_dtype`, `kiln_attr_kind`, `kiln_status`) are fixed-width
//! integer typedefs with `#define`d values rather than C enums: a C caller can pass any
//! integer, and receiving that as a Rust enum would be undefined behaviour.
#![allow(non_camel_case_types)]

use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::error::Error;
use crate::interop::{InteropError, InteropErrorKind};

pub mod compile;
pub mod control;
pub mod custom_op;
pub mod device;
pub mod dlpack;
pub mod graph;
pub mod status;
pub mod tensor;
pub mod train;
pub mod variables;

pub use status::*;

/// A failed call: the status to return and the message to keep.
pub(crate) struct Failure {
    pub status: kiln_status,
    pub message: String,
}

impl Failure {
    pub(crate) fn new(status: kiln_status, message: impl Into<String>) -> Failure {
        Failure {
            status,
            message: message.into(),
        }
    }

    pub(crate) fn null(arg: &str) -> Failure {
        Failure::new(KILN_STATUS_NULL_ARGUMENT, format!("{arg} is NULL"))
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Failure {
        Failure::new(KILN_STATUS_INVALID_ARGUMENT, message)
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        let status = match &e {
            Error::InvalidArgument(_) => KILN_STATUS_INVALID_ARGUMENT,
            Error::Io(_) => KILN_STATUS_IO,
            Error::Parse { .. } => KILN_STATUS_PARSE,
            Error::UnknownOp(_) => KILN_STATUS_UNKNOWN_OP,
            Error::Unsupported(_) => KILN_STATUS_UNSUPPORTED,
            Error::Graph(_) => KILN_STATUS_INVALID_GRAPH,
            Error::Compile(_) => KILN_STATUS_COMPILE_FAILED,
            Error::Runtime(_) => KILN_STATUS_RUN_FAILED,
            Error::Device(_) => KILN_STATUS_DEVICE_UNAVAILABLE,
        };
        Failure::new(status, e.to_string())
    }
}

/// A tensor that could not cross keeps its message as is; its kind picks the status.
impl From<InteropError> for Failure {
    fn from(e: InteropError) -> Failure {
        let status = match e.kind {
            InteropErrorKind::Null => KILN_STATUS_NULL_ARGUMENT,
            InteropErrorKind::Invalid => KILN_STATUS_INVALID_ARGUMENT,
            InteropErrorKind::Unsupported => KILN_STATUS_UNSUPPORTED,
            InteropErrorKind::UnsupportedVersion => KILN_STATUS_UNSUPPORTED_VERSION,
        };
        Failure::new(status, e.message)
    }
}

pub(crate) type CResult<T> = Result<T, Failure>;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    // Interior NULs cannot be in a C string; show them rather than cut the message.
    let c = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// A pointer to this thread's last error message, valid until the next failing call on
/// this thread.
pub(crate) fn last_error_ptr() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Runs one C entry point's body: panics and errors become a status and a message.
pub(crate) fn guard(body: impl FnOnce() -> CResult<()>) -> kiln_status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => KILN_STATUS_OK,
        Ok(Err(f)) => {
            set_last_error(&f.message);
            f.status
        }
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_last_error(&format!("internal error (a bug in Kiln): {what}"));
            KILN_STATUS_INTERNAL
        }
    }
}

/// For entry points that cannot report a status (`*_free`, getters): panics are
/// swallowed, since unwinding into C is undefined behaviour.
pub(crate) fn guard_or<T>(fallback: T, body: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(fallback)
}

/// `p` as a reference, or a NULL-argument failure naming `arg`.
///
/// # Safety
/// `p` is NULL or points to a live `T` for `'a`.
pub(crate) unsafe fn arg<'a, T>(p: *const T, arg: &str) -> CResult<&'a T> {
    // SAFETY: NULL is checked by `as_ref`; any other `p` is a live `T` for 'a (contract).
    unsafe { p.as_ref().ok_or_else(|| Failure::null(arg)) }
}

/// # Safety
/// `p` is NULL or points to a live `T` not aliased for `'a`.
pub(crate) unsafe fn arg_mut<'a, T>(p: *mut T, arg: &str) -> CResult<&'a mut T> {
    // SAFETY: a non-NULL `p` is a live `T` nobody else touches for 'a, so `&mut` is unique.
    unsafe { p.as_mut().ok_or_else(|| Failure::null(arg)) }
}

/// A NUL-terminated UTF-8 string argument.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string live for `'a`.
pub(crate) unsafe fn arg_str<'a>(p: *const c_char, arg: &str) -> CResult<&'a str> {
    // SAFETY: `from_ptr` runs only on a non-NULL `p`, which the caller promises is
    // NUL-terminated and live for 'a.
    unsafe {
        if p.is_null() {
            return Err(Failure::null(arg));
        }
        CStr::from_ptr(p)
            .to_str()
            .map_err(|_| Failure::invalid(format!("{arg} is not valid UTF-8")))
    }
}

/// `len` elements at `p`; `p` may be NULL only when `len` is 0.
///
/// # Safety
/// When `len > 0`, `p` points to `len` initialized `T`s live for `'a`.
pub(crate) unsafe fn arg_slice<'a, T>(p: *const T, len: usize, arg: &str) -> CResult<&'a [T]> {
    // SAFETY: `from_raw_parts` runs only for len > 0 and non-NULL `p`, which then points
    // to `len` initialized `T`s live for 'a, as the caller guarantees.
    unsafe {
        if len == 0 {
            return Ok(&[]);
        }
        if p.is_null() {
            return Err(Failure::null(arg));
        }
        Ok(std::slice::from_raw_parts(p, len))
    }
}

/// Checks an out-parameter before any work is done, so that a NULL one fails early.
pub(crate) fn out_ptr<T>(p: *mut T, arg: &str) -> CResult<*mut T> {
    if p.is_null() {
        Err(Failure::null(arg))
    } else {
        Ok(p)
    }
}

/// Moves `value` to the heap for C to own.
pub(crate) fn into_handle<T>(value: T) -> *mut T {
    Box::into_raw(Box::new(value))
}

/// Frees a handle made by `into_handle`; NULL is a no-op.
///
/// # Safety
/// `p` is NULL or came from `into_handle::<T>` and is not used again.
pub(crate) unsafe fn free_handle<T>(p: *mut T) {
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe {
        if !p.is_null() {
            drop(Box::from_raw(p));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::CStr;

    use super::*;

    fn last_error() -> String {
        // SAFETY: the pointer is this thread's NUL-terminated message.
        unsafe { CStr::from_ptr(last_error_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn a_panic_becomes_internal_with_its_message() {
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {})); // keep the test output quiet
        let status = guard(|| panic!("boom at {}", 42));
        std::panic::set_hook(hook);
        assert_eq!(status, KILN_STATUS_INTERNAL);
        assert!(last_error().contains("boom at 42"), "{}", last_error());
        assert_eq!(guard_or(7, || panic!("quiet")), 7);
    }

    #[test]
    fn errors_map_to_status_ranges_and_messages_survive_nuls() {
        let status = guard(|| Err(Error::UnknownOp("'X' \0 is unknown".into()).into()));
        assert_eq!(status, KILN_STATUS_UNKNOWN_OP);
        assert_eq!(last_error(), "unknown op: 'X' \\0 is unknown");
        assert_eq!(guard(|| Ok(())), KILN_STATUS_OK);
        assert_eq!(
            last_error(),
            "unknown op: 'X' \\0 is unknown",
            "success keeps the last error"
        );
        let status = guard(|| Err(Error::Unsupported("spatial = 0".into()).into()));
        assert_eq!(status, KILN_STATUS_UNSUPPORTED);
        assert_eq!(last_error(), "unsupported: spatial = 0");
    }
}
