//! Tensors: dense, row-major buffers that carry run inputs and outputs.
use std::ffi::c_void;

use super::kiln_status;
use super::{arg, arg_slice, free_handle, guard, guard_or, into_handle, out_ptr, CResult, Failure};
use crate::interop::{checked_dims, HostTensor};
use crate::ir::DType;
use crate::tensor::Tensor;

/// An element type.
pub type kiln_dtype = u32;

pub const KILN_DTYPE_F32: kiln_dtype = 0;
pub const KILN_DTYPE_F64: kiln_dtype = 1;
pub const KILN_DTYPE_F16: kiln_dtype = 2;
pub const KILN_DTYPE_BF16: kiln_dtype = 3;
pub const KILN_DTYPE_I8: kiln_dtype = 4;
pub const KILN_DTYPE_U8: kiln_dtype = 5;
pub const KILN_DTYPE_I32: kiln_dtype = 6;
pub const KILN_DTYPE_I64: kiln_dtype = 7;
/// One byte per element, 0 or 1.
pub const KILN_DTYPE_BOOL: kiln_dtype = 8;
pub const KILN_DTYPE_I16: kiln_dtype = 9;
pub const KILN_DTYPE_U16: kiln_dtype = 10;
pub const KILN_DTYPE_U32: kiln_dtype = 11;
pub const KILN_DTYPE_U64: kiln_dtype = 12;
/// Text. A model's string values are reported with it, but C tensors cannot hold
/// strings yet: passing it as an argument fails with `KILN_STATUS_UNSUPPORTED`.
pub const KILN_DTYPE_STRING: kiln_dtype = 13;
/// The low-bit dtypes take one byte per element: a float8/float4 code in the low bits,
/// a uint4/uint2 value, an int4/int2 value in the low bits or sign-extended (read back
/// in the low bits).
pub const KILN_DTYPE_F8E4M3FN: kiln_dtype = 14;
pub const KILN_DTYPE_F8E4M3FNUZ: kiln_dtype = 15;
pub const KILN_DTYPE_F8E5M2: kiln_dtype = 16;
pub const KILN_DTYPE_F8E5M2FNUZ: kiln_dtype = 17;
pub const KILN_DTYPE_F8E8M0: kiln_dtype = 18;
pub const KILN_DTYPE_F4E2M1: kiln_dtype = 19;
pub const KILN_DTYPE_I4: kiln_dtype = 20;
pub const KILN_DTYPE_U4: kiln_dtype = 21;
pub const KILN_DTYPE_I2: kiln_dtype = 22;
pub const KILN_DTYPE_U2: kiln_dtype = 23;
/// What the getters return for a NULL handle; never accepted as an argument.
pub const KILN_DTYPE_INVALID: kiln_dtype = 0xFFFF_FFFF;

/// `DType::ALL` is in `kiln_dtype` order.
pub(crate) fn dtype_from_c(d: kiln_dtype, arg: &str) -> CResult<DType> {
    let dtype = DType::ALL.get(d as usize).copied().ok_or_else(|| {
        Failure::invalid(format!(
            "{arg}: {d} is not a kiln_dtype (0..={})",
            DType::ALL.len() - 1
        ))
    })?;
    if dtype.is_string() {
        return Err(Failure::from(crate::Error::Unsupported(format!(
            "{arg}: string tensors cannot cross the C ABI yet"
        ))));
    }
    Ok(dtype)
}

pub(crate) fn dtype_to_c(d: DType) -> kiln_dtype {
    DType::ALL.iter().position(|&x| x == d).expect("in ALL") as kiln_dtype
}

/// Dims from C: each must be >= 0 and their product must fit in memory.
pub(crate) fn dims_from_c(dims: &[i64], arg: &str) -> CResult<Vec<usize>> {
    Ok(checked_dims(dims, arg)?)
}

/// A tensor handle: a dtype, dims, and a buffer it owns or borrows.
pub struct kiln_tensor(pub(crate) HostTensor);

impl kiln_tensor {
    /// A new owned handle holding a copy of `t`.
    pub(crate) fn from_tensor(t: &Tensor) -> CResult<kiln_tensor> {
        Ok(kiln_tensor(HostTensor::from_tensor(t)?))
    }
}

/// Creates a tensor that owns zeroed, 64-byte aligned memory for `rank` dims
/// (`dims` may be NULL when `rank` is 0). On success `*out` is a new handle the caller
/// frees with `kiln_tensor_free`.
///
/// # Safety
/// `dims` points to `rank` values; `out` is a valid pointer.
#[no_mangle]
pub unsafe extern "C" fn kiln_tensor_new(
    dtype: kiln_dtype,
    dims: *const i64,
    rank: usize,
    out: *mut *mut kiln_tensor,
) -> kiln_status {
    guard(|| {
        let out = out_ptr(out, "out")?;
        let dtype = dtype_from_c(dtype, "dtype")?;
        // SAFETY: the caller's contract: `dims` points to `rank` values.
        let dims = unsafe { arg_slice(dims, rank, "dims")? };
        let t = HostTensor::zeroed(dtype, dims)?;
        // SAFETY: `out` is a valid out-parameter (checked non-NULL above).
        unsafe { *out = into_handle(kiln_tensor(t)) };
        Ok(())
    })
}

/// Creates a tensor over caller memory, without copying: `data` must hold exactly
/// `nbytes` = elements × element size bytes, row-major, little-endian, and stay valid
/// (and not be freed) until the handle is freed. `data` may be NULL only when `nbytes` is
/// 0. The caller frees the handle with `kiln_tensor_free`, which leaves `data` alone.
///
/// # Safety
/// `dims` points to `rank` values; `data` to `nbytes` bytes as above; `out` is valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_tensor_wrap(
    dtype: kiln_dtype,
    dims: *const i64,
    rank: usize,
    data: *mut c_void,
    nbytes: usize,
    out: *mut *mut kiln_tensor,
) -> kiln_status {
    guard(|| {
        let out = out_ptr(out, "out")?;
        let dtype = dtype_from_c(dtype, "dtype")?;
        // SAFETY: the caller's contract: `dims` points to `rank` values.
        let dims = unsafe { arg_slice(dims, rank, "dims")? };
        // SAFETY: the caller's contract: `data` holds `nbytes` bytes until the handle is
        // freed.
        let t = unsafe { HostTensor::borrowed(dtype, dims, data.cast(), nbytes)? };
        // SAFETY: `out` is a valid out-parameter (checked non-NULL above).
        unsafe { *out = into_handle(kiln_tensor(t)) };
        Ok(())
    })
}

/// The tensor's data (row-major, little-endian); NULL for a NULL handle. Valid until the
/// handle is freed. Writing through it is allowed while no run uses the tensor.
///
/// # Safety
/// `t` is NULL or a live tensor handle.
#[no_mangle]
pub unsafe extern "C" fn kiln_tensor_data(t: *mut kiln_tensor) -> *mut c_void {
    guard_or(std::ptr::null_mut(), || {
        // SAFETY: the caller's contract: `t` is NULL or a live handle.
        let t = unsafe { arg(t, "t") };
        t.map_or(std::ptr::null_mut(), |t| t.0.data_ptr().cast())
    })
}

/// The size of the tensor's data in bytes; 0 for a NULL handle.
///
/// # Safety
/// `t` is NULL or a live tensor handle.
#[no_mangle]
pub unsafe extern "C" fn kiln_tensor_nbytes(t: *const kiln_tensor) -> usize {
    // SAFETY: the caller's contract: `t` is NULL or a live handle.
    guard_or(0, || unsafe { arg(t, "t") }.map_or(0, |t| t.0.nbytes()))
}

/// The tensor's dtype; `KILN_DTYPE_INVALID` for a NULL handle.
///
/// # Safety
/// `t` is NULL or a live tensor handle.
#[no_mangle]
pub unsafe extern "C" fn kiln_tensor_dtype(t: *const kiln_tensor) -> kiln_dtype {
    guard_or(KILN_DTYPE_INVALID, || {
        // SAFETY: `t` is NULL or a live handle, read only for its dtype.
        let t = unsafe { arg(t, "t") };
        t.map_or(KILN_DTYPE_INVALID, |t| dtype_to_c(t.0.dtype()))
    })
}

/// The tensor's rank; 0 for a NULL handle.
///
/// # Safety
/// `t` is NULL or a live tensor handle.
#[no_mangle]
pub unsafe extern "C" fn kiln_tensor_rank(t: *const kiln_tensor) -> usize {
    // SAFETY: the caller's contract: `t` is NULL or a live handle.
    guard_or(0, || unsafe { arg(t, "t") }.map_or(0, |t| t.0.dims().len()))
}

/// The tensor's `rank` dims, owned by the handle and valid until it is freed; NULL for
/// a NULL handle (and possibly for rank 0).
///
/// # Safety
/// `t` is NULL or a live tensor handle.
#[no_mangle]
pub unsafe extern "C" fn kiln_tensor_dims(t: *const kiln_tensor) -> *const i64 {
    guard_or(std::ptr::null(), || {
        // SAFETY: a NULL or live `t`, whose dims outlive this call with the handle.
        let t = unsafe { arg(t, "t") };
        t.map_or(std::ptr::null(), |t| t.0.dims().as_ptr())
    })
}

/// Frees a tensor handle and its memory, unless wrapped (a DLPack export of it keeps the
/// memory until its deleter runs; a tensor from DLPack calls the producer's deleter
/// here). NULL is a no-op.
///
/// # Safety
/// `t` is NULL or a live tensor handle, not used again.
#[no_mangle]
pub unsafe extern "C" fn kiln_tensor_free(t: *mut kiln_tensor) {
    // SAFETY: the caller's contract: `t` is NULL or a live handle, never used again.
    guard_or((), || unsafe { free_handle(t) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kiln_dtype_constant_is_its_dtype_code() {
        let constants = [
            (KILN_DTYPE_F32, DType::F32),
            (KILN_DTYPE_F64, DType::F64),
            (KILN_DTYPE_F16, DType::F16),
            (KILN_DTYPE_BF16, DType::BF16),
            (KILN_DTYPE_I8, DType::I8),
            (KILN_DTYPE_U8, DType::U8),
            (KILN_DTYPE_I32, DType::I32),
            (KILN_DTYPE_I64, DType::I64),
            (KILN_DTYPE_BOOL, DType::Bool),
            (KILN_DTYPE_I16, DType::I16),
            (KILN_DTYPE_U16, DType::U16),
            (KILN_DTYPE_U32, DType::U32),
            (KILN_DTYPE_U64, DType::U64),
            (KILN_DTYPE_STRING, DType::String),
            (KILN_DTYPE_F8E4M3FN, DType::F8E4M3FN),
            (KILN_DTYPE_F8E4M3FNUZ, DType::F8E4M3FNUZ),
            (KILN_DTYPE_F8E5M2, DType::F8E5M2),
            (KILN_DTYPE_F8E5M2FNUZ, DType::F8E5M2FNUZ),
            (KILN_DTYPE_F8E8M0, DType::F8E8M0),
            (KILN_DTYPE_F4E2M1, DType::F4E2M1),
            (KILN_DTYPE_I4, DType::I4),
            (KILN_DTYPE_U4, DType::U4),
            (KILN_DTYPE_I2, DType::I2),
            (KILN_DTYPE_U2, DType::U2),
        ];
        assert_eq!(constants.len(), DType::ALL.len());
        for (code, dtype) in constants {
            assert_eq!(dtype_to_c(dtype), code, "{dtype}");
        }
    }
}
