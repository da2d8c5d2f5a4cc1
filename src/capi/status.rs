//! Errors and versions.
use std::ffi::c_char;

use super::last_error_ptr;

/// The result of every fallible call. Codes are ranged: 1xx a bad argument, 2xx a bad
/// graph, 3xx compiling, 4xx running, 5xx the device, 9xx a bug in Kiln. The message of
/// the last failure on the calling thread is `kiln_last_error_message()`.
pub type kiln_status = u32;

/// Success.
pub const KILN_STATUS_OK: kiln_status = 0;
/// A required pointer (handle, out-parameter, array) was NULL.
pub const KILN_STATUS_NULL_ARGUMENT: kiln_status = 100;
/// An argument is out of range or malformed (bad dtype, non-UTF-8 name, size mismatch).
pub const KILN_STATUS_INVALID_ARGUMENT: kiln_status = 101;
/// A caller-provided array is too small; the call reports the size it needs.
pub const KILN_STATUS_BUFFER_TOO_SMALL: kiln_status = 102;
/// Reading or writing a file failed.
pub const KILN_STATUS_IO: kiln_status = 103;
/// A versioned struct (e.g. `kiln_custom_op`, a DLPack tensor) from an interface version
/// or with fields this library does not implement.
pub const KILN_STATUS_UNSUPPORTED_VERSION: kiln_status = 104;
/// The graph is invalid: types, shapes, axis names, attributes, names, references.
pub const KILN_STATUS_INVALID_GRAPH: kiln_status = 200;
/// An op type the catalogue does not know.
pub const KILN_STATUS_UNKNOWN_OP: kiln_status = 201;
/// `.kir` text that does not parse.
pub const KILN_STATUS_PARSE: kiln_status = 202;
/// A well-formed model or graph uses something Kiln does not implement (an attribute
/// value, a dtype, an ONNX domain or opset, an attribute type).
pub const KILN_STATUS_UNSUPPORTED: kiln_status = 203;
/// Compiling a valid graph failed.
pub const KILN_STATUS_COMPILE_FAILED: kiln_status = 300;
/// A run failed while computing (e.g. an index out of range in the data).
pub const KILN_STATUS_RUN_FAILED: kiln_status = 400;
/// The inputs of a run do not match the graph (count, dtype, shape, symbol bindings).
pub const KILN_STATUS_RUN_BAD_INPUT: kiln_status = 401;
/// The requested device or backend is not available in this build or on this machine.
pub const KILN_STATUS_DEVICE_UNAVAILABLE: kiln_status = 500;
/// A bug in Kiln (a caught panic); the message says where.
pub const KILN_STATUS_INTERNAL: kiln_status = 900;

const STATUS_NAMES: &[(kiln_status, &str)] = &[
    (KILN_STATUS_OK, "KILN_STATUS_OK\0"),
    (KILN_STATUS_NULL_ARGUMENT, "KILN_STATUS_NULL_ARGUMENT\0"),
    (
        KILN_STATUS_INVALID_ARGUMENT,
        "KILN_STATUS_INVALID_ARGUMENT\0",
    ),
    (
        KILN_STATUS_BUFFER_TOO_SMALL,
        "KILN_STATUS_BUFFER_TOO_SMALL\0",
    ),
    (KILN_STATUS_IO, "KILN_STATUS_IO\0"),
    (
        KILN_STATUS_UNSUPPORTED_VERSION,
        "KILN_STATUS_UNSUPPORTED_VERSION\0",
    ),
    (KILN_STATUS_INVALID_GRAPH, "KILN_STATUS_INVALID_GRAPH\0"),
    (KILN_STATUS_UNKNOWN_OP, "KILN_STATUS_UNKNOWN_OP\0"),
    (KILN_STATUS_PARSE, "KILN_STATUS_PARSE\0"),
    (KILN_STATUS_UNSUPPORTED, "KILN_STATUS_UNSUPPORTED\0"),
    (KILN_STATUS_COMPILE_FAILED, "KILN_STATUS_COMPILE_FAILED\0"),
    (KILN_STATUS_RUN_FAILED, "KILN_STATUS_RUN_FAILED\0"),
    (KILN_STATUS_RUN_BAD_INPUT, "KILN_STATUS_RUN_BAD_INPUT\0"),
    (
        KILN_STATUS_DEVICE_UNAVAILABLE,
        "KILN_STATUS_DEVICE_UNAVAILABLE\0",
    ),
    (KILN_STATUS_INTERNAL, "KILN_STATUS_INTERNAL\0"),
];

/// The message of the last failed call on this thread, or "" if none has failed.
/// Successful calls leave it unchanged. The string is owned by Kiln and valid until the
/// next failing call on the same thread. Thread-safe (each thread has its own).
#[no_mangle]
pub extern "C" fn kiln_last_error_message() -> *const c_char {
    super::guard_or(c"".as_ptr(), last_error_ptr)
}

/// The name of a status code (`"KILN_STATUS_OK"`), or `"KILN_STATUS_UNKNOWN"` for a code
/// Kiln does not define. The string is static. Thread-safe.
#[no_mangle]
pub extern "C" fn kiln_status_string(status: kiln_status) -> *const c_char {
    STATUS_NAMES
        .iter()
        .find(|(s, _)| *s == status)
        .map_or(c"KILN_STATUS_UNKNOWN".as_ptr(), |(_, name)| {
            name.as_ptr().cast()
        })
}

/// A status's name without the NUL, for messages.
pub(crate) fn status_name(status: kiln_status) -> &'static str {
    STATUS_NAMES
        .iter()
        .find(|(s, _)| *s == status)
        .map_or("KILN_STATUS_UNKNOWN", |(_, name)| {
            name.trim_end_matches('\0')
        })
}

const fn parse_u32(s: &str) -> u32 {
    let b = s.as_bytes();
    let mut i = 0;
    let mut v = 0;
    while i < b.len() {
        v = v * 10 + (b[i] - b'0') as u32;
        i += 1;
    }
    v
}

/// `major * 10000 + minor * 100 + patch`, as `KILN_VERSION_NUMBER` in the header.
pub(crate) const VERSION_NUMBER: u32 = parse_u32(env!("CARGO_PKG_VERSION_MAJOR")) * 10000
    + parse_u32(env!("CARGO_PKG_VERSION_MINOR")) * 100
    + parse_u32(env!("CARGO_PKG_VERSION_PATCH"));

/// The library's version as `major * 10000 + minor * 100 + patch`; compare it with the
/// header's `KILN_VERSION_NUMBER` to check that a program runs against the library it
/// was compiled for. Thread-safe.
#[no_mangle]
pub extern "C" fn kiln_version_number() -> u32 {
    VERSION_NUMBER
}

/// The library's version as text, `"major.minor.patch"`. The string is static.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn kiln_version_string() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}
