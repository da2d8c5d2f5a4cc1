//! Whether a CUDA device can be used, found out without panicking.
//!
//! cudarc loads libcuda lazily and panics when a symbol's library is missing (and
//! `CudaContext::new` is the first call that would load it), so every entry point into
//! the driver goes through [`probe`] first: library present, `cuInit`, device count,
//! ordinal in range. The driver calls also run under `catch_unwind` as a belt: a driver
//! too old to export a symbol cudarc wants panics in the same way.
use std::panic::{catch_unwind, AssertUnwindSafe};

use cudarc::driver::{result, sys};

use crate::error::{Error, Result};

/// Runs a driver call, turning a panic from cudarc's loader into an error message.
pub(crate) fn no_panic<T>(what: &str, f: impl FnOnce() -> T) -> std::result::Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|payload| {
        let msg = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("a panic without a message");
        format!("{what}: {msg}")
    })
}

/// The number of CUDA devices the driver reports, or why there are none to use (no
/// driver library, `cuInit` failing, ...). The error reads well after "cuda:N: ".
pub(crate) fn device_count() -> std::result::Result<u32, String> {
    // SAFETY: only tries to dlopen the driver's library names; nothing is called.
    if !unsafe { sys::is_culib_present() } {
        return Err("no CUDA driver (libcuda.so not found)".to_string());
    }
    no_panic("loading the CUDA driver", result::init)?
        .map_err(|e| format!("the CUDA driver failed to initialize ({e})"))?;
    let count = no_panic("loading the CUDA driver", result::device::get_count)?
        .map_err(|e| format!("the CUDA driver cannot count its devices ({e})"))?;
    Ok(count.max(0) as u32)
}

/// Ok if `cuda:ordinal` exists and its driver works; otherwise the `Error::Device`
/// (C: `KILN_STATUS_DEVICE_UNAVAILABLE`) saying why.
pub(crate) fn probe(ordinal: u32) -> Result<()> {
    let unavailable = |why: String| Error::Device(format!("cuda:{ordinal}: {why}"));
    match device_count().map_err(unavailable)? {
        0 => Err(unavailable(
            "no CUDA device (the driver reports none)".into(),
        )),
        n if ordinal >= n => Err(unavailable(format!(
            "no such device (the driver reports {n} CUDA device{})",
            if n == 1 { "" } else { "s" }
        ))),
        _ => Ok(()),
    }
}
