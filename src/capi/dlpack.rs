//! DLPack 1.0 at the C ABI: the four exports, over `crate::interop::dlpack`.
use std::ptr::NonNull;

use super::kiln_status;
use super::tensor::kiln_tensor;
use super::{guard, into_handle, out_ptr, Failure};
use crate::interop::dlpack::{
    export_legacy, export_versioned, import_legacy, import_versioned, DLManagedTensor,
    DLManagedTensorVersioned,
};

/// Imports a DLPack 1.0 tensor (any minor version of major 1) on the CPU (`kDLCPU`).
/// A compact row-major tensor (`strides` NULL or those of row-major order) is wrapped
/// without a copy; a strided one is copied once into row-major order. `byte_offset` is
/// honoured. The dtypes are those of `kiln_dtype` that DLPack has (`kDLBool` as
/// `KILN_DTYPE_BOOL`), with `lanes` 1.
///
/// Ownership follows the DLPack convention: on success `src` is Kiln's, and its deleter
/// is called exactly once: before this returns when the data was copied, or, when
/// wrapped, once `*out` is freed (and any `kiln_tensor_to_dlpack` export of it deleted).
/// On failure (a non-CPU device: `KILN_STATUS_UNSUPPORTED`; another major version:
/// `KILN_STATUS_UNSUPPORTED_VERSION`; a dtype Kiln lacks such as complex, or lanes other
/// than 1: `KILN_STATUS_UNSUPPORTED`) the deleter is not called: `src` is still the
/// caller's. A `DLPACK_FLAG_BITMASK_READ_ONLY` tensor is wrapped too: do not write
/// through `kiln_tensor_data` of it.
///
/// # Safety
/// `src` is NULL or a live DLPack managed tensor, whose `dl_tensor` fields are valid as
/// dlpack.h describes; `out` is valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_tensor_from_dlpack(
    src: *mut DLManagedTensorVersioned,
    out: *mut *mut kiln_tensor,
) -> kiln_status {
    guard(|| {
        let out = out_ptr(out, "out")?;
        let src = NonNull::new(src).ok_or_else(|| Failure::null("src"))?;
        // SAFETY: the caller's contract: a non-NULL `src` is a live managed tensor.
        let t = unsafe { import_versioned(src, "src")? };
        // SAFETY: `out` is valid and non-NULL (`out_ptr`); written once the import holds.
        unsafe { *out = into_handle(kiln_tensor(t)) };
        Ok(())
    })
}

/// `kiln_tensor_from_dlpack` for an unversioned (pre-1.0) `DLManagedTensor`, with the
/// same rules and ownership.
///
/// # Safety
/// As for `kiln_tensor_from_dlpack`.
#[no_mangle]
pub unsafe extern "C" fn kiln_tensor_from_dlpack_legacy(
    src: *mut DLManagedTensor,
    out: *mut *mut kiln_tensor,
) -> kiln_status {
    guard(|| {
        let out = out_ptr(out, "out")?;
        let src = NonNull::new(src).ok_or_else(|| Failure::null("src"))?;
        // SAFETY: the caller's contract: a non-NULL `src` is a live unversioned tensor.
        let t = unsafe { import_legacy(src, "src")? };
        // SAFETY: `out` was checked by `out_ptr`; nothing else writes it.
        unsafe { *out = into_handle(kiln_tensor(t)) };
        Ok(())
    })
}

/// Exports `t` as a DLPack 1.0 tensor on the CPU over the same memory, without a copy:
/// compact row-major, `strides` given, `byte_offset` 0, `DLPACK_FLAG_BITMASK_READ_ONLY`
/// when `t` came read-only from DLPack. `*out` holds its own share of the memory, so
/// `t` may be freed first; the consumer calls `(*out)->deleter(*out)` once when done,
/// which frees what the export owns. A tensor from `kiln_tensor_wrap` is exported over
/// the caller's memory, which must then outlive the export too. Every `kiln_dtype`
/// except the string and low-bit (float8, float4, 4- and 2-bit integer) ones has a
/// DLPack type; those fail with `KILN_STATUS_UNSUPPORTED`.
///
/// # Safety
/// `t` is NULL or a live tensor handle; `out` is valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_tensor_to_dlpack(
    t: *mut kiln_tensor,
    out: *mut *mut DLManagedTensorVersioned,
) -> kiln_status {
    guard(|| {
        let out = out_ptr(out, "out")?;
        // SAFETY: the caller's contract: `t` is NULL or a live handle.
        let t = unsafe { super::arg(t, "t")? };
        let managed = export_versioned(&t.0, "t", false)?;
        // SAFETY: the caller passed a valid `out`, non-NULL by `out_ptr`.
        unsafe { *out = managed.as_ptr() };
        Ok(())
    })
}

/// `kiln_tensor_to_dlpack` as an unversioned (pre-1.0) `DLManagedTensor`, for consumers
/// that ask for one; it has no read-only flag.
///
/// # Safety
/// As for `kiln_tensor_to_dlpack`.
#[no_mangle]
pub unsafe extern "C" fn kiln_tensor_to_dlpack_legacy(
    t: *mut kiln_tensor,
    out: *mut *mut DLManagedTensor,
) -> kiln_status {
    guard(|| {
        let out = out_ptr(out, "out")?;
        // SAFETY: as the caller promises, `t` is NULL or a live tensor handle.
        let t = unsafe { super::arg(t, "t")? };
        let managed = export_legacy(&t.0, "t")?;
        // SAFETY: a valid `out` by the contract, non-NULL by `out_ptr`.
        unsafe { *out = managed.as_ptr() };
        Ok(())
    })
}
