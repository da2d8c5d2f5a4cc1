//! Devices: which backends this library was built with and which devices this machine
//! has. Tensors never live on a device at the C ABI: an executable compiled for
//! `"cuda:N"` copies its inputs to the device and its outputs back to host tensors
//! inside `kiln_executable_run`, so every `kiln_tensor` is host memory.
use std::ffi::c_char;

use super::{arg_str, guard, kiln_status};
use crate::backend::{device_available, Device};

/// 1 if this library was built with the CUDA backend (the `cuda` cargo feature), else
/// 0; the header's `KILN_HAS_CUDA` says what the installed package was built with.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn kiln_has_cuda() -> u32 {
    u32::from(cfg!(feature = "cuda"))
}

/// `KILN_STATUS_OK` if graphs can be compiled for `device` (`"cpu"`, `"interp"`,
/// `"cuda:N"`) here; otherwise `KILN_STATUS_DEVICE_UNAVAILABLE` with the reason in
/// `kiln_last_error_message()` (built without CUDA, no CUDA driver, no such device), or
/// `KILN_STATUS_INVALID_ARGUMENT` for a name that is no device. Loads and initializes
/// the CUDA driver the first time a CUDA device is asked about; never aborts on a
/// machine without one. Thread-safe.
///
/// # Safety
/// `device` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn kiln_device_available(device: *const c_char) -> kiln_status {
    guard(|| {
        // SAFETY: `device` is NULL or a NUL-terminated string (# Safety).
        let device: Device = unsafe { arg_str(device, "device") }?.parse()?;
        device_available(device)?;
        Ok(())
    })
}
