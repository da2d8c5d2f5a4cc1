//! Tensors: dense, row-major buffers that carry run inputs and outputs.
use std::any::Any;
use std::ffi::c_void;
use std::sync::Arc;

use super::{arg, arg_slice, free_handle, guard, guard_or, into_handle, out_ptr, CResult, Failure};
use super::{kiln_status, KILN_STATUS_INVALID_ARGUMENT};
use crate::aligned::AlignedBuf;
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
    let mut n: usize = 1;
    let mut out = Vec::with_capacity(dims.len());
    for (i, &d) in dims.iter().enumerate() {
        let d = usize::try_from(d)
            .map_err(|_| Failure::invalid(format!("{arg}[{i}] is {d}; dims must be >= 0")))?;
        n = n
            .checked_mul(d)
            .filter(|&n| n <= isize::MAX as usize / 8)
            .ok_or_else(|| Failure::invalid(format!("{arg}: {dims:?} is too many elements")))?;
        out.push(d);
    }
    Ok(out)
}

/// Zeroed, aligned memory for a tensor the library owns; running out of memory is an
/// argument error (the caller asked for too much), not an abort.
pub(crate) fn owned_storage(nbytes: usize) -> CResult<AlignedBuf> {
    AlignedBuf::try_zeroed(nbytes)
        .map_err(|_| Failure::invalid(format!("cannot allocate a tensor of {nbytes} bytes")))
}

/// Whatever keeps a tensor's memory alive; shared with DLPack exports, so that the
/// memory outlives the handle while a consumer still reads it.
pub(crate) type Keeper = Arc<dyn Any + Send + Sync>;

enum Storage {
    /// Shared only with DLPack exports of the handle (`kiln_tensor_to_dlpack`).
    Owned(Arc<AlignedBuf>),
    /// Caller memory (`kiln_tensor_wrap`); may be NULL when empty.
    Borrowed(*mut u8),
    /// Another library's memory (`kiln_tensor_from_dlpack`), handed back when the last
    /// holder of `keeper` drops it.
    Lent {
        data: *mut u8,
        keeper: Keeper,
        read_only: bool,
    },
}

/// A tensor handle: a dtype, dims, and a buffer it owns or borrows.
pub struct kiln_tensor {
    pub(crate) dtype: DType,
    pub(crate) dims: Vec<i64>,
    nbytes: usize,
    storage: Storage,
}

impl kiln_tensor {
    fn data_ptr(&self) -> *mut u8 {
        match &self.storage {
            // The buffer is the handle's; C may write through the pointer.
            Storage::Owned(b) => b.as_ptr().cast_mut(),
            Storage::Borrowed(p) => *p,
            Storage::Lent { data, .. } => *data,
        }
    }

    /// A handle that owns `buf`, which holds `dtype`×`dims` row-major.
    pub(crate) fn owning(dtype: DType, dims: Vec<i64>, buf: AlignedBuf) -> kiln_tensor {
        kiln_tensor {
            dtype,
            dims,
            nbytes: buf.len(),
            storage: Storage::Owned(Arc::new(buf)),
        }
    }

    /// A handle over `nbytes` of another library's memory at `data`, which `keeper`
    /// keeps alive.
    pub(crate) fn lent(
        dtype: DType,
        dims: Vec<i64>,
        data: *mut u8,
        nbytes: usize,
        keeper: Keeper,
        read_only: bool,
    ) -> kiln_tensor {
        kiln_tensor {
            dtype,
            dims,
            nbytes,
            storage: Storage::Lent {
                data,
                keeper,
                read_only,
            },
        }
    }

    /// The data pointer, what keeps it alive past the handle (None for a wrapped
    /// caller buffer, which the caller keeps), and whether it must not be written.
    pub(crate) fn shared_data(&self) -> (*mut u8, Option<Keeper>, bool) {
        let keeper = match &self.storage {
            Storage::Owned(b) => Some(Arc::clone(b) as Keeper),
            Storage::Borrowed(_) => None,
            Storage::Lent { keeper, .. } => Some(Arc::clone(keeper)),
        };
        let read_only = matches!(
            self.storage,
            Storage::Lent {
                read_only: true,
                ..
            }
        );
        (self.data_ptr(), keeper, read_only)
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        let p = self.data_ptr();
        if self.nbytes == 0 || p.is_null() {
            return &[];
        }
        // SAFETY: owned buffers hold `nbytes`; borrowed ones were promised to by the
        // caller of `kiln_tensor_wrap` for the handle's lifetime.
        unsafe { std::slice::from_raw_parts(p, self.nbytes) }
    }

    /// A copy as a `Tensor`; `what` names it in errors.
    pub(crate) fn to_tensor(&self, what: &str) -> CResult<Tensor> {
        let dims: Vec<usize> = self.dims.iter().map(|&d| d as usize).collect();
        Tensor::from_le_bytes(self.dtype, &dims, self.bytes())
            .map_err(|e| Failure::new(KILN_STATUS_INVALID_ARGUMENT, format!("{what}: {e}")))
    }

    /// A new owned handle holding a copy of `t`.
    pub(crate) fn from_tensor(t: &Tensor) -> CResult<kiln_tensor> {
        let bytes = t.to_le_bytes();
        let mut buf = owned_storage(bytes.len())?;
        buf.as_mut_bytes().copy_from_slice(&bytes);
        let dims = t.shape().iter().map(|&d| d as i64).collect();
        Ok(kiln_tensor::owning(t.dtype(), dims, buf))
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
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe {
        guard(|| {
            let out = out_ptr(out, "out")?;
            let dtype = dtype_from_c(dtype, "dtype")?;
            let dims = arg_slice(dims, rank, "dims")?;
            let shape = dims_from_c(dims, "dims")?;
            let nbytes = shape.iter().product::<usize>() * dtype.size_in_bytes();
            let t = kiln_tensor::owning(dtype, dims.to_vec(), owned_storage(nbytes)?);
            *out = into_handle(t);
            Ok(())
        })
    }
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
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe {
        guard(|| {
            let out = out_ptr(out, "out")?;
            let dtype = dtype_from_c(dtype, "dtype")?;
            let dims = arg_slice(dims, rank, "dims")?;
            let shape = dims_from_c(dims, "dims")?;
            let want = shape.iter().product::<usize>() * dtype.size_in_bytes();
            if nbytes != want {
                return Err(Failure::invalid(format!(
                    "nbytes is {nbytes}, but {dtype}{shape:?} needs {want}"
                )));
            }
            if data.is_null() && nbytes > 0 {
                return Err(Failure::null("data"));
            }
            let t = kiln_tensor {
                dtype,
                dims: dims.to_vec(),
                nbytes,
                storage: Storage::Borrowed(data.cast()),
            };
            *out = into_handle(t);
            Ok(())
        })
    }
}

/// The tensor's data (row-major, little-endian); NULL for a NULL handle. Valid until the
/// handle is freed. Writing through it is allowed while no run uses the tensor.
///
/// # Safety
/// `t` is NULL or a live tensor handle.
#[no_mangle]
pub unsafe extern "C" fn kiln_tensor_data(t: *mut kiln_tensor) -> *mut c_void {
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe {
        guard_or(std::ptr::null_mut(), || {
            arg(t, "t").map_or(std::ptr::null_mut(), |t| t.data_ptr().cast())
        })
    }
}

/// The size of the tensor's data in bytes; 0 for a NULL handle.
///
/// # Safety
/// `t` is NULL or a live tensor handle.
#[no_mangle]
pub unsafe extern "C" fn kiln_tensor_nbytes(t: *const kiln_tensor) -> usize {
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe { guard_or(0, || arg(t, "t").map_or(0, |t| t.nbytes)) }
}

/// The tensor's dtype; `KILN_DTYPE_INVALID` for a NULL handle.
///
/// # Safety
/// `t` is NULL or a live tensor handle.
#[no_mangle]
pub unsafe extern "C" fn kiln_tensor_dtype(t: *const kiln_tensor) -> kiln_dtype {
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe {
        guard_or(KILN_DTYPE_INVALID, || {
            arg(t, "t").map_or(KILN_DTYPE_INVALID, |t| dtype_to_c(t.dtype))
        })
    }
}

/// The tensor's rank; 0 for a NULL handle.
///
/// # Safety
/// `t` is NULL or a live tensor handle.
#[no_mangle]
pub unsafe extern "C" fn kiln_tensor_rank(t: *const kiln_tensor) -> usize {
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe { guard_or(0, || arg(t, "t").map_or(0, |t| t.dims.len())) }
}

/// The tensor's `rank` dims, owned by the handle and valid until it is freed; NULL for
/// a NULL handle (and possibly for rank 0).
///
/// # Safety
/// `t` is NULL or a live tensor handle.
#[no_mangle]
pub unsafe extern "C" fn kiln_tensor_dims(t: *const kiln_tensor) -> *const i64 {
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe {
        guard_or(std::ptr::null(), || {
            arg(t, "t").map_or(std::ptr::null(), |t| t.dims.as_ptr())
        })
    }
}

/// Frees a tensor handle and its memory, unless wrapped (a DLPack export of it keeps the
/// memory until its deleter runs; a tensor from DLPack calls the producer's deleter
/// here). NULL is a no-op.
///
/// # Safety
/// `t` is NULL or a live tensor handle, not used again.
#[no_mangle]
pub unsafe extern "C" fn kiln_tensor_free(t: *mut kiln_tensor) {
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe { guard_or((), || free_handle(t)) }
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
