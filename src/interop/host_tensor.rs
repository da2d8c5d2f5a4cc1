//! `HostTensor`: a dense, row-major tensor in host memory that Kiln owns, borrows from
//! a C caller, or holds for another library that lent it through DLPack.
use std::any::Any;
use std::sync::Arc;

use super::InteropError;
use crate::aligned::AlignedBuf;
use crate::tensor::{DType, Tensor};

/// `dims` as sizes, each checked to be >= 0 with a product that fits in memory; `what`
/// names the dims in messages.
pub(crate) fn checked_dims(dims: &[i64], what: &str) -> Result<Vec<usize>, InteropError> {
    let mut n: usize = 1;
    let mut out = Vec::with_capacity(dims.len());
    for (i, &d) in dims.iter().enumerate() {
        let d = usize::try_from(d)
            .map_err(|_| InteropError::invalid(format!("{what}[{i}] is {d}; dims must be >= 0")))?;
        n = n
            .checked_mul(d)
            .filter(|&n| n <= isize::MAX as usize / 8)
            .ok_or_else(|| {
                InteropError::invalid(format!("{what}: {dims:?} is too many elements"))
            })?;
        out.push(d);
    }
    Ok(out)
}

/// Zeroed, aligned memory for a tensor Kiln owns; running out of memory is an argument
/// error (the caller asked for too much), not an abort.
pub(crate) fn owned_storage(nbytes: usize) -> Result<AlignedBuf, InteropError> {
    AlignedBuf::try_zeroed(nbytes)
        .map_err(|_| InteropError::invalid(format!("cannot allocate a tensor of {nbytes} bytes")))
}

/// Whatever keeps a tensor's memory alive; shared with DLPack exports, so that the
/// memory outlives the tensor while a consumer still reads it.
pub(crate) type Keeper = Arc<dyn Any + Send + Sync>;

enum Storage {
    /// Shared only with DLPack exports of the tensor.
    Owned(Arc<AlignedBuf>),
    /// A C caller's memory (`kiln_tensor_wrap`); may be NULL when empty.
    Borrowed(*mut u8),
    /// Another library's memory (DLPack), handed back when the last holder of `keeper`
    /// drops it.
    Lent {
        data: *mut u8,
        keeper: Keeper,
        read_only: bool,
    },
}

/// A dtype, dims (each >= 0) and `nbytes` of row-major, little-endian elements in host
/// memory that the tensor owns, borrows or was lent.
pub struct HostTensor {
    dtype: DType,
    dims: Vec<i64>,
    nbytes: usize,
    storage: Storage,
}

// SAFETY: owned memory is an `Arc<AlignedBuf>` and a lender's `keeper` is `Send + Sync`;
// the raw pointers are only the addresses of that memory, or of a C caller's, which
// `HostTensor::borrowed`'s contract keeps valid whichever thread holds the tensor.
unsafe impl Send for HostTensor {}
// SAFETY: `&HostTensor` only reads the metadata and hands out the data address; writes
// through that address are the caller's to order against readers, as C's are.
unsafe impl Sync for HostTensor {}

impl HostTensor {
    /// A tensor that owns zeroed, 64-byte aligned memory of `dtype` × `dims`.
    pub fn zeroed(dtype: DType, dims: &[i64]) -> Result<HostTensor, InteropError> {
        let shape = checked_dims(dims, "dims")?;
        let nbytes = shape.iter().product::<usize>() * dtype.size_in_bytes();
        Ok(HostTensor::owning(
            dtype,
            dims.to_vec(),
            owned_storage(nbytes)?,
        ))
    }

    /// A tensor over `nbytes` of caller memory at `data`, which must be exactly
    /// `dtype` × `dims`; `data` may be NULL only when `nbytes` is 0.
    ///
    /// # Safety
    /// `data` holds `nbytes` bytes that stay valid, and are written by no one while
    /// Kiln reads them, until the tensor is dropped.
    pub(crate) unsafe fn borrowed(
        dtype: DType,
        dims: &[i64],
        data: *mut u8,
        nbytes: usize,
    ) -> Result<HostTensor, InteropError> {
        let shape = checked_dims(dims, "dims")?;
        let want = shape.iter().product::<usize>() * dtype.size_in_bytes();
        if nbytes != want {
            return Err(InteropError::invalid(format!(
                "nbytes is {nbytes}, but {dtype}{shape:?} needs {want}"
            )));
        }
        if data.is_null() && nbytes > 0 {
            return Err(InteropError::null("data"));
        }
        Ok(HostTensor {
            dtype,
            dims: dims.to_vec(),
            nbytes,
            storage: Storage::Borrowed(data),
        })
    }

    /// A tensor that owns `buf`, which holds `dtype` × `dims` row-major.
    pub(crate) fn owning(dtype: DType, dims: Vec<i64>, buf: AlignedBuf) -> HostTensor {
        HostTensor {
            dtype,
            dims,
            nbytes: buf.len(),
            storage: Storage::Owned(Arc::new(buf)),
        }
    }

    /// A tensor over `nbytes` of another library's memory at `data`, which `keeper`
    /// keeps alive.
    pub(crate) fn lent(
        dtype: DType,
        dims: Vec<i64>,
        data: *mut u8,
        nbytes: usize,
        keeper: Keeper,
        read_only: bool,
    ) -> HostTensor {
        HostTensor {
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

    /// A new owned tensor holding a copy of `t`.
    pub(crate) fn from_tensor(t: &Tensor) -> Result<HostTensor, InteropError> {
        // A dense tensor's bytes are copied as they lie (one pass, no element walk);
        // low-bit codes are normalized by `to_le_bytes`.
        let view = t.bytes_view().filter(|_| !t.dtype().is_low_bit());
        let packed;
        let bytes = match &view {
            Some(v) => v.bytes(),
            None => {
                packed = t.to_le_bytes();
                &packed
            }
        };
        let mut buf = owned_storage(bytes.len())?;
        buf.as_mut_bytes().copy_from_slice(bytes);
        let dims = t.shape().iter().map(|&d| d as i64).collect();
        Ok(HostTensor::owning(t.dtype(), dims, buf))
    }

    /// A copy in memory of Kiln's own.
    pub fn owned_copy(&self) -> Result<HostTensor, InteropError> {
        let mut buf = owned_storage(self.nbytes)?;
        buf.as_mut_bytes().copy_from_slice(self.bytes());
        Ok(HostTensor::owning(self.dtype, self.dims.clone(), buf))
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn dims(&self) -> &[i64] {
        &self.dims
    }

    /// The dims as sizes (every constructor checked them).
    pub fn shape(&self) -> Vec<usize> {
        self.sizes().to_vec()
    }

    /// The dims as sizes, in place (a run reads its inputs' shapes without allocating).
    pub(crate) fn sizes(&self) -> &[usize] {
        const _: () = assert!(
            std::mem::size_of::<usize>() == std::mem::size_of::<i64>()
                && std::mem::align_of::<usize>() == std::mem::align_of::<i64>()
        );
        // SAFETY: usize and i64 have one size and alignment (asserted), and every
        // constructor checked each dim is >= 0, so each reads as the same number.
        unsafe { std::slice::from_raw_parts(self.dims.as_ptr().cast::<usize>(), self.dims.len()) }
    }

    pub fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// The address of the first element; NULL only for a borrowed empty tensor. Writing
    /// through it is allowed while nothing reads the tensor, unless it is read-only.
    pub fn data_ptr(&self) -> *mut u8 {
        match &self.storage {
            // The buffer is the tensor's; C and Python may write through the pointer.
            Storage::Owned(b) => b.as_ptr().cast_mut(),
            Storage::Borrowed(p) => *p,
            Storage::Lent { data, .. } => *data,
        }
    }

    /// Whether the lender marked the memory read-only.
    pub fn is_read_only(&self) -> bool {
        matches!(
            self.storage,
            Storage::Lent {
                read_only: true,
                ..
            }
        )
    }

    /// The data address and what keeps it alive past the tensor (None for borrowed
    /// caller memory, which the caller keeps).
    pub(crate) fn shared_data(&self) -> (*mut u8, Option<Keeper>) {
        let keeper = match &self.storage {
            Storage::Owned(b) => Some(Arc::clone(b) as Keeper),
            Storage::Borrowed(_) => None,
            Storage::Lent { keeper, .. } => Some(Arc::clone(keeper)),
        };
        (self.data_ptr(), keeper)
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        let p = self.data_ptr();
        if self.nbytes == 0 || p.is_null() {
            return &[];
        }
        // SAFETY: owned and lent memory holds `nbytes` while the tensor lives (a lender's
        // keeper is released only on drop); borrowed memory does by `borrowed`'s contract.
        unsafe { std::slice::from_raw_parts(p, self.nbytes) }
    }

    /// A copy as a `Tensor`; `what` names it in errors.
    pub(crate) fn to_tensor(&self, what: &str) -> Result<Tensor, InteropError> {
        Tensor::from_le_bytes(self.dtype, &self.shape(), self.bytes())
            .map_err(|e| InteropError::invalid(format!("{what}: {e}")))
    }
}
