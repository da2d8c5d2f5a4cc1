//! DLPack 1.0: tensors shared with other libraries (NumPy, PyTorch, JAX, …) in both
//! directions without a copy where the layouts allow.
//!
//! The structs are dlpack.h's (v1.0, same field order). `kiln.h` only declares them by
//! name, so that it never conflicts with a `<dlpack/dlpack.h>` the caller includes for
//! their fields; cbindgen.toml keeps their definitions out of the header. The deleters
//! are C function pointers, so this is the one file outside `src/capi/` that defines
//! `extern "C"` functions: Kiln's deleters of the tensors it exports.
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::Arc;

use super::host_tensor::{checked_dims, owned_storage, Keeper};
use super::{HostTensor, InteropError, InteropErrorKind};
use crate::tensor::DType;

/// `DLPackVersion`: the ABI version of a `DLManagedTensorVersioned`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLPackVersion {
    pub major: u32,
    pub minor: u32,
}

/// `DLDevice`: `device_type` is dlpack.h's `DLDeviceType` enum (an `int`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLDevice {
    pub device_type: i32,
    pub device_id: i32,
}

/// `DLDataType`: `code` is a `DLDataTypeCode`, `bits` the size of one lane.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLDataType {
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

/// `DLTensor`: `strides` (in elements) may be NULL for a compact row-major tensor.
#[repr(C)]
#[derive(Debug)]
pub struct DLTensor {
    pub data: *mut c_void,
    pub device: DLDevice,
    pub ndim: i32,
    pub dtype: DLDataType,
    pub shape: *mut i64,
    pub strides: *mut i64,
    pub byte_offset: u64,
}

/// `DLManagedTensor`: the unversioned (pre-1.0) managed tensor.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensor {
    pub dl_tensor: DLTensor,
    pub manager_ctx: *mut c_void,
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// `DLManagedTensorVersioned` (DLPack >= 1.0).
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    pub version: DLPackVersion,
    pub manager_ctx: *mut c_void,
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    pub flags: u64,
    pub dl_tensor: DLTensor,
}

/// `flags`: the consumer must not write the memory.
pub const DLPACK_FLAG_BITMASK_READ_ONLY: u64 = 1;
/// `flags`: the producer copied the data for this export.
pub const DLPACK_FLAG_BITMASK_IS_COPIED: u64 = 1 << 1;

/// The DLPack version this library produces and reads (any minor of major 1).
pub const DLPACK_VERSION: DLPackVersion = DLPackVersion { major: 1, minor: 0 };

/// `kDLCPU`, the only device whose memory Kiln reads or hands out.
pub const DL_CPU: i32 = 1;

const DL_INT: u8 = 0;
const DL_UINT: u8 = 1;
const DL_FLOAT: u8 = 2;
const DL_BFLOAT: u8 = 4;
const DL_BOOL: u8 = 6;

/// Every Kiln dtype DLPack 1.0 can express, with its (code, bits); lanes are always 1.
const DL_DTYPES: [(DType, u8, u8); 13] = [
    (DType::F32, DL_FLOAT, 32),
    (DType::F64, DL_FLOAT, 64),
    (DType::F16, DL_FLOAT, 16),
    (DType::BF16, DL_BFLOAT, 16),
    (DType::I8, DL_INT, 8),
    (DType::I16, DL_INT, 16),
    (DType::I32, DL_INT, 32),
    (DType::I64, DL_INT, 64),
    (DType::U8, DL_UINT, 8),
    (DType::U16, DL_UINT, 16),
    (DType::U32, DL_UINT, 32),
    (DType::U64, DL_UINT, 64),
    (DType::Bool, DL_BOOL, 8),
];

/// DLPack's name of a `DLDataTypeCode`, for messages.
fn code_name(code: u8) -> String {
    let names = [
        "kDLInt",
        "kDLUInt",
        "kDLFloat",
        "kDLOpaqueHandle",
        "kDLBfloat",
    ];
    match code {
        0..=4 => names[code as usize].to_string(),
        5 => "kDLComplex".to_string(),
        6 => "kDLBool".to_string(),
        other => format!("code {other}"),
    }
}

/// DLPack's name of a `DLDeviceType`, for messages.
fn device_name(device_type: i32) -> String {
    let name = match device_type {
        1 => "kDLCPU",
        2 => "kDLCUDA",
        3 => "kDLCUDAHost",
        4 => "kDLOpenCL",
        7 => "kDLVulkan",
        8 => "kDLMetal",
        9 => "kDLVPI",
        10 => "kDLROCM",
        11 => "kDLROCMHost",
        12 => "kDLExtDev",
        13 => "kDLCUDAManaged",
        14 => "kDLOneAPI",
        15 => "kDLWebGPU",
        16 => "kDLHexagon",
        17 => "kDLMAIA",
        _ => "an unknown device type",
    };
    format!("{name} ({device_type})")
}

/// DLPack's type of a Kiln dtype, or an unsupported failure naming `what`.
fn dtype_to_dl(dtype: DType, what: &str) -> Result<DLDataType, InteropError> {
    (DL_DTYPES.iter().find(|(d, _, _)| *d == dtype))
        .map(|&(_, code, bits)| DLDataType {
            code,
            bits,
            lanes: 1,
        })
        .ok_or_else(|| {
            InteropError::unsupported(format!("{what}: {dtype} has no DLPack 1.0 data type"))
        })
}

fn dtype_from_dl(t: DLDataType, what: &str) -> Result<DType, InteropError> {
    (DL_DTYPES
        .iter()
        .find(|(_, code, bits)| (*code, *bits) == (t.code, t.bits)))
    .filter(|_| t.lanes == 1)
    .map(|&(d, _, _)| d)
    .ok_or_else(|| {
        InteropError::unsupported(format!(
            "{what} is {} with {} bits and {} lanes, which Kiln has no dtype for",
            code_name(t.code),
            t.bits,
            t.lanes
        ))
    })
}

/// A DLTensor checked for import: where its first element lies, and its strides when
/// they are not compact row-major (then it is copied).
struct Checked {
    dtype: DType,
    dims: Vec<i64>,
    shape: Vec<usize>,
    data: *mut u8,
    nbytes: usize,
    strides: Option<Vec<i64>>,
}

/// Checks `t` (named `what` in messages) for import.
///
/// # Safety
/// A non-NULL `t.shape` and `t.strides` point to `t.ndim` values each.
unsafe fn check(t: &DLTensor, what: &str) -> Result<Checked, InteropError> {
    if t.device.device_type != DL_CPU {
        return Err(InteropError::unsupported(format!(
            "{what}.device is {} device {}: only kDLCPU memory can be read",
            device_name(t.device.device_type),
            t.device.device_id
        )));
    }
    let dtype = dtype_from_dl(t.dtype, &format!("{what}.dtype"))?;
    let rank = usize::try_from(t.ndim)
        .map_err(|_| InteropError::invalid(format!("{what}.ndim is {}; must be >= 0", t.ndim)))?;
    let shape_what = format!("{what}.shape");
    let dims = if rank == 0 {
        vec![]
    } else if t.shape.is_null() {
        return Err(InteropError::null(&shape_what));
    } else {
        // SAFETY: the caller's contract: a non-NULL `shape` holds `ndim` values.
        unsafe { std::slice::from_raw_parts(t.shape, rank) }.to_vec()
    };
    let shape = checked_dims(&dims, &shape_what)?;
    let count: usize = shape.iter().product();
    let size = dtype.size_in_bytes();
    let nbytes = count * size;
    if t.data.is_null() && nbytes > 0 {
        return Err(InteropError::null(&format!("{what}.data")));
    }
    let offset = usize::try_from(t.byte_offset)
        .ok()
        .filter(|&o| o <= isize::MAX as usize)
        .ok_or_else(|| {
            InteropError::invalid(format!(
                "{what}.byte_offset {} is past memory",
                t.byte_offset
            ))
        })?;
    // The producer promises `byte_offset` lies within its allocation.
    let data = t.data.cast::<u8>().wrapping_add(offset);
    let strides = if t.strides.is_null() || count == 0 {
        None
    } else {
        // SAFETY: the caller's contract: non-NULL `strides` hold `ndim` values.
        let strides = unsafe { std::slice::from_raw_parts(t.strides, rank) }.to_vec();
        let mut reach: usize = 0;
        for (i, (&s, &d)) in strides.iter().zip(&shape).enumerate() {
            reach = (s.unsigned_abs() as usize)
                .checked_mul(d - 1)
                .and_then(|r| r.checked_mul(size))
                .and_then(|r| r.checked_add(reach))
                .filter(|&r| r <= isize::MAX as usize)
                .ok_or_else(|| {
                    InteropError::invalid(format!("{what}.strides[{i}] = {s} reaches past memory"))
                })?;
        }
        (!is_row_major(&shape, &strides)).then_some(strides)
    };
    Ok(Checked {
        dtype,
        dims,
        shape,
        data,
        nbytes,
        strides,
    })
}

/// Whether `strides` (in elements) lay `shape` out compactly in row-major order; a dim
/// of one element may have any stride, as NumPy and PyTorch give them.
fn is_row_major(shape: &[usize], strides: &[i64]) -> bool {
    let mut want: i64 = 1;
    for (&d, &s) in shape.iter().zip(strides).rev() {
        if d != 1 && s != want {
            return false;
        }
        want = want.saturating_mul(d as i64);
    }
    true
}

/// Copies the strided elements at `src` into `out` in row-major order.
///
/// # Safety
/// Every element `src + Σ index[k]·strides[k]·size` for index within `shape` is
/// readable (`check` has bounded that sum to `isize::MAX`); `out` holds them all.
unsafe fn gather(src: *const u8, shape: &[usize], strides: &[i64], size: usize, out: &mut [u8]) {
    let rank = shape.len();
    let mut index = vec![0usize; rank];
    let mut offset: isize = 0; // in elements, from `src`
    for chunk in out.chunks_exact_mut(size) {
        // SAFETY: `offset` is the element at `index`, within `shape`, which the
        // caller's contract makes readable; `chunk` is one element of `out`.
        unsafe {
            let from = src.offset(offset * size as isize);
            std::ptr::copy_nonoverlapping(from, chunk.as_mut_ptr(), size);
        }
        // Advance the odometer, innermost dim first.
        for k in (0..rank).rev() {
            index[k] += 1;
            offset += strides[k] as isize;
            if index[k] < shape[k] {
                break;
            }
            offset -= strides[k] as isize * shape[k] as isize;
            index[k] = 0;
        }
    }
}

/// A producer's managed tensor, whose deleter runs once when this is dropped.
enum Producer {
    Versioned(NonNull<DLManagedTensorVersioned>),
    Legacy(NonNull<DLManagedTensor>),
}

impl Producer {
    /// The tensor it describes.
    ///
    /// # Safety
    /// The managed tensor is live, and stays so while the reference is held.
    unsafe fn dl_tensor(&self) -> &DLTensor {
        match self {
            // SAFETY: the contract: a live managed tensor, not released while borrowed.
            Producer::Versioned(p) => unsafe { &p.as_ref().dl_tensor },
            // SAFETY: as for the versioned one.
            Producer::Legacy(p) => unsafe { &p.as_ref().dl_tensor },
        }
    }
}

struct ReleaseOnDrop(Producer);

// SAFETY: DLPack deleters may be called from any thread (producers that need a lock,
// like Python's, take it in the deleter); the memory is only read through the tensor.
unsafe impl Send for ReleaseOnDrop {}
// SAFETY: shared access to a `ReleaseOnDrop` never touches the managed tensor.
unsafe impl Sync for ReleaseOnDrop {}

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        match self.0 {
            Producer::Versioned(p) => {
                // SAFETY: `p` was live when ownership passed to Kiln, and is released
                // only here, once.
                if let Some(deleter) = unsafe { p.as_ref() }.deleter {
                    // SAFETY: the producer's own deleter of its own tensor, called once.
                    unsafe { deleter(p.as_ptr()) }
                }
            }
            Producer::Legacy(p) => {
                // SAFETY: as for the versioned tensor above.
                if let Some(deleter) = unsafe { p.as_ref() }.deleter {
                    // SAFETY: the producer's own deleter, called once.
                    unsafe { deleter(p.as_ptr()) }
                }
            }
        }
    }
}

/// A tensor over `producer`'s (compact: wrapped, keeping `producer` until dropped) or
/// over a row-major copy (strided: `producer` released at once). On failure `producer`
/// is left alone: it stays the caller's.
///
/// # Safety
/// `producer` is live and its memory is as DLPack promises.
unsafe fn import(
    producer: Producer,
    read_only: bool,
    what: &str,
) -> Result<HostTensor, InteropError> {
    // SAFETY: the caller's contract; the reference ends with `check`, before any release.
    let c = unsafe { check(producer.dl_tensor(), what)? };
    match &c.strides {
        None => {
            let keeper: Keeper = Arc::new(ReleaseOnDrop(producer));
            Ok(HostTensor::lent(
                c.dtype, c.dims, c.data, c.nbytes, keeper, read_only,
            ))
        }
        Some(strides) => {
            let mut buf = owned_storage(c.nbytes)?;
            let size = c.dtype.size_in_bytes();
            // SAFETY: `check` bounded the strides; the producer promises the memory.
            unsafe { gather(c.data, &c.shape, strides, size, buf.as_mut_bytes()) };
            // The copy is Kiln's: the producer's memory goes back now.
            drop(ReleaseOnDrop(producer));
            Ok(HostTensor::owning(c.dtype, c.dims, buf))
        }
    }
}

/// Imports a DLPack 1.0 tensor (any minor version of major 1) on the CPU; `name` names
/// it in messages (`src->version`, `src->dl_tensor.dtype`). A compact row-major tensor
/// is wrapped without a copy, a strided one copied once into row-major order.
///
/// On success `src` is Kiln's: its deleter runs exactly once, before this returns when
/// the data was copied, else once the tensor and every export of it are dropped. On
/// failure (`UnsupportedVersion` for another major version; `Unsupported` for another
/// device or a dtype Kiln lacks; `Invalid` or `Null` for malformed fields) `src` is
/// still the caller's. A `DLPACK_FLAG_BITMASK_READ_ONLY` tensor is wrapped too, and
/// [`HostTensor::is_read_only`] says so.
///
/// # Safety
/// `src` is a live DLPack managed tensor whose `dl_tensor` fields are valid as dlpack.h
/// describes.
pub unsafe fn import_versioned(
    src: NonNull<DLManagedTensorVersioned>,
    name: &str,
) -> Result<HostTensor, InteropError> {
    // Only the version is read before it is known: another major version may lay the
    // rest out differently.
    // SAFETY: the caller's contract: `src` is live; `version` leads every version.
    let version = unsafe { (*src.as_ptr()).version };
    if version.major != DLPACK_VERSION.major {
        return Err(InteropError::new(
            InteropErrorKind::UnsupportedVersion,
            format!(
                "{name}->version is {}.{}; Kiln reads DLPack 1.x",
                version.major, version.minor
            ),
        ));
    }
    // SAFETY: a live 1.x managed tensor, whose layout this struct is.
    let flags = unsafe { (*src.as_ptr()).flags };
    let read_only = flags & DLPACK_FLAG_BITMASK_READ_ONLY != 0;
    let what = format!("{name}->dl_tensor");
    // SAFETY: `src` is live with its memory as DLPack promises (this fn's contract), and
    // its major version was checked to be 1, the layout `Producer::Versioned` reads.
    unsafe { import(Producer::Versioned(src), read_only, &what) }
}

/// [`import_versioned`] for an unversioned (pre-1.0) `DLManagedTensor`, with the same
/// rules and ownership; it has no read-only flag.
///
/// # Safety
/// As for [`import_versioned`].
pub unsafe fn import_legacy(
    src: NonNull<DLManagedTensor>,
    name: &str,
) -> Result<HostTensor, InteropError> {
    let what = format!("{name}->dl_tensor");
    // SAFETY: `src` is a live pre-1.0 managed tensor with its memory as DLPack promises
    // (this fn's contract): what `import` asks of its producer.
    unsafe { import(Producer::Legacy(src), false, &what) }
}

/// What an export owns: the managed tensor handed out (first, so that its address is
/// the allocation's), the dims and strides it points to, and the tensor's memory.
#[repr(C)]
struct Exported<M> {
    managed: M,
    dims: Vec<i64>,
    strides: Vec<i64>,
    _keeper: Option<Keeper>,
}

/// A managed tensor Kiln hands out, versioned or not.
trait Managed {
    fn new(dl_tensor: DLTensor, flags: u64) -> Self;
    fn dl_tensor(&mut self) -> &mut DLTensor;
    fn manager_ctx(&mut self) -> &mut *mut c_void;
}

impl Managed for DLManagedTensorVersioned {
    fn new(dl_tensor: DLTensor, flags: u64) -> Self {
        DLManagedTensorVersioned {
            version: DLPACK_VERSION,
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_exported),
            flags,
            dl_tensor,
        }
    }
    fn dl_tensor(&mut self) -> &mut DLTensor {
        &mut self.dl_tensor
    }
    fn manager_ctx(&mut self) -> &mut *mut c_void {
        &mut self.manager_ctx
    }
}

impl Managed for DLManagedTensor {
    /// The unversioned struct has no flags: read-only and copied are not said.
    fn new(dl_tensor: DLTensor, _flags: u64) -> Self {
        DLManagedTensor {
            dl_tensor,
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_exported_legacy),
        }
    }
    fn dl_tensor(&mut self) -> &mut DLTensor {
        &mut self.dl_tensor
    }
    fn manager_ctx(&mut self) -> &mut *mut c_void {
        &mut self.manager_ctx
    }
}

/// An export of `t` (named `name` in messages) over its memory, for the consumer to
/// delete; its `manager_ctx` is its `Exported` allocation.
fn export<M: Managed>(t: &HostTensor, name: &str, flags: u64) -> Result<NonNull<M>, InteropError> {
    let dtype = dtype_to_dl(t.dtype(), name)?;
    let ndim = i32::try_from(t.dims().len()).map_err(|_| {
        InteropError::invalid(format!("{name} has {} dims, past DLPack's", t.dims().len()))
    })?;
    let dims = t.dims().to_vec();
    let mut strides = vec![1i64; dims.len()];
    for k in (0..dims.len().saturating_sub(1)).rev() {
        strides[k] = strides[k + 1].saturating_mul(dims[k + 1].max(1));
    }
    let (data, keeper) = t.shared_data();
    let dl_tensor = DLTensor {
        data: data.cast(),
        device: DLDevice {
            device_type: DL_CPU,
            device_id: 0,
        },
        ndim,
        dtype,
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    };
    let mut exported = Box::new(Exported {
        managed: M::new(dl_tensor, flags),
        dims,
        strides,
        _keeper: keeper,
    });
    // The vectors' heap buffers stay put while the box lives.
    let shape = exported.dims.as_mut_ptr();
    let strides = exported.strides.as_mut_ptr();
    let dl = exported.managed.dl_tensor();
    dl.shape = shape;
    dl.strides = strides;
    let raw = Box::into_raw(exported);
    // SAFETY: `raw` is the live allocation just made, not yet shared with anyone.
    let managed = unsafe { &mut (*raw).managed };
    *managed.manager_ctx() = raw.cast();
    Ok(NonNull::from(managed))
}

/// Exports `t` (named `name` in messages) as a DLPack 1.0 tensor on the CPU over the
/// same memory: compact row-major, `strides` given, `byte_offset` 0, flagged read-only
/// when `t` is, and as copied when `copied` (the caller made `t` for this export). The
/// export holds its own share of the memory (but for borrowed C memory, which must
/// outlive it), so `t` may be dropped first; the consumer calls its deleter once.
/// String and low-bit dtypes have no DLPack type: `Unsupported`.
pub fn export_versioned(
    t: &HostTensor,
    name: &str,
    copied: bool,
) -> Result<NonNull<DLManagedTensorVersioned>, InteropError> {
    let mut flags = 0;
    if t.is_read_only() {
        flags |= DLPACK_FLAG_BITMASK_READ_ONLY;
    }
    if copied {
        flags |= DLPACK_FLAG_BITMASK_IS_COPIED;
    }
    export(t, name, flags)
}

/// [`export_versioned`] as an unversioned (pre-1.0) `DLManagedTensor`, for consumers
/// that ask for one; it has no flags.
pub fn export_legacy(t: &HostTensor, name: &str) -> Result<NonNull<DLManagedTensor>, InteropError> {
    export(t, name, 0)
}

/// Runs a deleter's body; a panic there is dropped, since it must not unwind into the
/// consumer (C, or Python's capsule destructor).
fn without_unwinding(body: impl FnOnce()) {
    let _ = catch_unwind(AssertUnwindSafe(body));
}

unsafe extern "C" fn delete_exported(managed: *mut DLManagedTensorVersioned) {
    without_unwinding(|| {
        if !managed.is_null() {
            // SAFETY: `managed` came from `export_versioned`, whose allocation its
            // `manager_ctx` is; the consumer calls the deleter once.
            let exported = unsafe {
                Box::from_raw(
                    (*managed)
                        .manager_ctx
                        .cast::<Exported<DLManagedTensorVersioned>>(),
                )
            };
            drop(exported)
        }
    })
}

unsafe extern "C" fn delete_exported_legacy(managed: *mut DLManagedTensor) {
    without_unwinding(|| {
        if !managed.is_null() {
            // SAFETY: `managed` came from `export_legacy`, whose `Exported` allocation its
            // `manager_ctx` is, and is deleted once.
            let exported = unsafe {
                Box::from_raw((*managed).manager_ctx.cast::<Exported<DLManagedTensor>>())
            };
            drop(exported)
        }
    })
}

#[cfg(test)]
mod tests {
    use std::mem::{offset_of, size_of};

    use super::*;

    /// dlpack.h v1.0's layout on a 64-bit target.
    #[test]
    fn structs_have_dlpack_h_layout() {
        assert_eq!(size_of::<DLDevice>(), 8);
        assert_eq!(size_of::<DLDataType>(), 4);
        assert_eq!(
            [
                offset_of!(DLTensor, data),
                offset_of!(DLTensor, device),
                offset_of!(DLTensor, ndim),
                offset_of!(DLTensor, dtype),
                offset_of!(DLTensor, shape),
                offset_of!(DLTensor, strides),
                offset_of!(DLTensor, byte_offset),
                size_of::<DLTensor>()
            ],
            [0, 8, 16, 20, 24, 32, 40, 48]
        );
        assert_eq!(offset_of!(DLManagedTensor, manager_ctx), 48);
        assert_eq!(offset_of!(DLManagedTensor, deleter), 56);
        assert_eq!(
            [
                offset_of!(DLManagedTensorVersioned, version),
                offset_of!(DLManagedTensorVersioned, manager_ctx),
                offset_of!(DLManagedTensorVersioned, deleter),
                offset_of!(DLManagedTensorVersioned, flags),
                offset_of!(DLManagedTensorVersioned, dl_tensor),
                size_of::<DLManagedTensorVersioned>()
            ],
            [0, 8, 16, 24, 32, 80]
        );
    }

    #[test]
    fn every_dl_dtype_maps_both_ways() {
        for (dtype, _, _) in DL_DTYPES {
            let dl = dtype_to_dl(dtype, "t").unwrap();
            assert_eq!(dtype_from_dl(dl, "x").unwrap(), dtype);
            assert_eq!(dl.bits as usize, dtype.size_in_bytes() * 8);
        }
        let complex = DLDataType {
            code: 5,
            bits: 64,
            lanes: 1,
        };
        let e = dtype_from_dl(complex, "src->dl_tensor.dtype").unwrap_err();
        assert!(
            e.message.contains("kDLComplex with 64 bits"),
            "{}",
            e.message
        );
        assert!(dtype_to_dl(DType::F8E4M3FN, "t").is_err());
    }

    #[test]
    fn row_major_ignores_strides_of_single_element_dims() {
        assert!(is_row_major(&[3, 4], &[4, 1]));
        assert!(is_row_major(&[1, 4], &[99, 1]));
        assert!(!is_row_major(&[3, 4], &[1, 3]));
        assert!(!is_row_major(&[4], &[-1]));
    }

    #[test]
    fn gather_follows_negative_and_transposed_strides() {
        let data: Vec<i32> = (0..12).collect();
        let mut out = vec![0u8; 12 * 4];
        // The 4×3 transpose of a 3×4 row-major matrix.
        // SAFETY: the transpose visits each of the 12 elements of `data` once.
        unsafe { gather(data.as_ptr().cast(), &[4, 3], &[1, 4], 4, &mut out) };
        let got: Vec<i32> = (out.chunks(4))
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, [0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11]);
        // The reverse of the last row, starting at its end.
        let mut out = vec![0u8; 4 * 4];
        // SAFETY: from element 11, four steps of -1 stay within `data`.
        unsafe { gather(data.as_ptr().add(11).cast(), &[4], &[-1], 4, &mut out) };
        let got: Vec<i32> = (out.chunks(4))
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, [11, 10, 9, 8]);
    }
}
