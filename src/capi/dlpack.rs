//! DLPack 1.0: tensors shared with other libraries (NumPy, PyTorch, JAX, …) in both
//! directions without a copy where the layouts allow.
//!
//! The structs are dlpack.h's (v1.0, same field order). `kiln.h` only declares them by
//! name, so that it never conflicts with a `<dlpack/dlpack.h>` the caller includes for
//! their fields; cbindgen.toml keeps their definitions out of the header.
use std::ffi::c_void;
use std::sync::Arc;

use super::tensor::{dims_from_c, kiln_tensor, owned_storage, Keeper};
use super::{arg, arg_slice, guard, guard_or, into_handle, out_ptr, CResult, Failure};
use super::{kiln_status, KILN_STATUS_UNSUPPORTED, KILN_STATUS_UNSUPPORTED_VERSION};
use crate::ir::DType;

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
pub(crate) fn dtype_to_dl(dtype: DType, what: &str) -> CResult<DLDataType> {
    (DL_DTYPES.iter().find(|(d, _, _)| *d == dtype))
        .map(|&(_, code, bits)| DLDataType {
            code,
            bits,
            lanes: 1,
        })
        .ok_or_else(|| {
            Failure::new(
                KILN_STATUS_UNSUPPORTED,
                format!("{what}: {dtype} has no DLPack 1.0 data type"),
            )
        })
}

fn dtype_from_dl(t: DLDataType, what: &str) -> CResult<DType> {
    (DL_DTYPES
        .iter()
        .find(|(_, code, bits)| (*code, *bits) == (t.code, t.bits)))
    .filter(|_| t.lanes == 1)
    .map(|&(d, _, _)| d)
    .ok_or_else(|| {
        Failure::new(
            KILN_STATUS_UNSUPPORTED,
            format!(
                "{what} is {} with {} bits and {} lanes, which Kiln has no dtype for",
                code_name(t.code),
                t.bits,
                t.lanes
            ),
        )
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
/// `t.shape` and a non-NULL `t.strides` point to `t.ndim` values each.
unsafe fn check(t: &DLTensor, what: &str) -> CResult<Checked> {
    if t.device.device_type != DL_CPU {
        return Err(Failure::new(
            KILN_STATUS_UNSUPPORTED,
            format!(
                "{what}.device is {} device {}: only kDLCPU memory can be read",
                device_name(t.device.device_type),
                t.device.device_id
            ),
        ));
    }
    let dtype = dtype_from_dl(t.dtype, &format!("{what}.dtype"))?;
    let rank = usize::try_from(t.ndim)
        .map_err(|_| Failure::invalid(format!("{what}.ndim is {}; must be >= 0", t.ndim)))?;
    let shape_what = format!("{what}.shape");
    // SAFETY: the caller's contract: `shape` holds `ndim` values.
    let dims = unsafe { arg_slice(t.shape, rank, &shape_what)? }.to_vec();
    let shape = dims_from_c(&dims, &shape_what)?;
    let count: usize = shape.iter().product();
    let size = dtype.size_in_bytes();
    let nbytes = count * size;
    if t.data.is_null() && nbytes > 0 {
        return Err(Failure::null(&format!("{what}.data")));
    }
    let offset = usize::try_from(t.byte_offset)
        .ok()
        .filter(|&o| o <= isize::MAX as usize)
        .ok_or_else(|| {
            Failure::invalid(format!(
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
                    Failure::invalid(format!("{what}.strides[{i}] = {s} reaches past memory"))
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
        // SAFETY: the caller's contract covers every index the odometer visits.
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
    Versioned(*mut DLManagedTensorVersioned),
    Legacy(*mut DLManagedTensor),
}

struct ReleaseOnDrop(Producer);

// SAFETY: DLPack deleters may be called from any thread (producers that need a lock,
// like Python's, take it in the deleter); the memory is only read through the handle.
unsafe impl Send for ReleaseOnDrop {}
// SAFETY: as for Send; shared access never touches the managed tensor.
unsafe impl Sync for ReleaseOnDrop {}

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        // SAFETY: the pointer was live when ownership passed to Kiln and is released
        // only here, once.
        unsafe {
            match self.0 {
                Producer::Versioned(p) => {
                    if let Some(deleter) = (*p).deleter {
                        deleter(p)
                    }
                }
                Producer::Legacy(p) => {
                    if let Some(deleter) = (*p).deleter {
                        deleter(p)
                    }
                }
            }
        }
    }
}

/// A handle over `t` (compact: wrapped, keeping `producer` until freed) or over a
/// row-major copy (strided: `producer` released at once). On failure `producer` is
/// left alone: it stays the caller's.
///
/// # Safety
/// `t` belongs to `producer`, which is live, and its memory is as DLPack promises.
unsafe fn import(
    t: &DLTensor,
    producer: Producer,
    read_only: bool,
    what: &str,
) -> CResult<kiln_tensor> {
    // SAFETY: the caller's contract.
    let c = unsafe { check(t, what)? };
    match &c.strides {
        None => {
            let keeper: Keeper = Arc::new(ReleaseOnDrop(producer));
            Ok(kiln_tensor::lent(
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
            Ok(kiln_tensor::owning(c.dtype, c.dims, buf))
        }
    }
}

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
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe {
        guard(|| {
            let out = out_ptr(out, "out")?;
            let managed = arg(src, "src")?;
            // Only the version is read before it is known: another major version may
            // lay the rest out differently.
            if managed.version.major != DLPACK_VERSION.major {
                return Err(Failure::new(
                    KILN_STATUS_UNSUPPORTED_VERSION,
                    format!(
                        "src->version is {}.{}; Kiln reads DLPack 1.x",
                        managed.version.major, managed.version.minor
                    ),
                ));
            }
            let read_only = managed.flags & DLPACK_FLAG_BITMASK_READ_ONLY != 0;
            let t = import(
                &managed.dl_tensor,
                Producer::Versioned(src),
                read_only,
                "src->dl_tensor",
            )?;
            *out = into_handle(t);
            Ok(())
        })
    }
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
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe {
        guard(|| {
            let out = out_ptr(out, "out")?;
            let managed = arg(src, "src")?;
            let t = import(
                &managed.dl_tensor,
                Producer::Legacy(src),
                false,
                "src->dl_tensor",
            )?;
            *out = into_handle(t);
            Ok(())
        })
    }
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
    fn new(dl_tensor: DLTensor, read_only: bool) -> Self;
    fn dl_tensor(&mut self) -> &mut DLTensor;
    fn manager_ctx(&mut self) -> &mut *mut c_void;
}

impl Managed for DLManagedTensorVersioned {
    fn new(dl_tensor: DLTensor, read_only: bool) -> Self {
        let flags = if read_only {
            DLPACK_FLAG_BITMASK_READ_ONLY
        } else {
            0
        };
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
    /// The unversioned struct has no flags: read-only is not said.
    fn new(dl_tensor: DLTensor, _read_only: bool) -> Self {
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

/// An export of `t` over its memory, for the consumer to delete; its `manager_ctx` is
/// its `Exported` allocation.
fn export<M: Managed>(t: &kiln_tensor) -> CResult<*mut M> {
    let dtype = dtype_to_dl(t.dtype, "t")?;
    let ndim = i32::try_from(t.dims.len())
        .map_err(|_| Failure::invalid(format!("t has {} dims, past DLPack's", t.dims.len())))?;
    let dims = t.dims.clone();
    let mut strides = vec![1i64; dims.len()];
    for k in (0..dims.len().saturating_sub(1)).rev() {
        strides[k] = strides[k + 1].saturating_mul(dims[k + 1].max(1));
    }
    let (data, keeper, read_only) = t.shared_data();
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
        managed: M::new(dl_tensor, read_only),
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
    // SAFETY: `raw` is the live allocation just made; `managed` is its first field.
    unsafe {
        *(*raw).managed.manager_ctx() = raw.cast();
        Ok(std::ptr::addr_of_mut!((*raw).managed))
    }
}

unsafe extern "C" fn delete_exported(managed: *mut DLManagedTensorVersioned) {
    guard_or((), || {
        if !managed.is_null() {
            // SAFETY: `managed` came from `kiln_tensor_to_dlpack`, whose allocation its
            // `manager_ctx` is; the consumer calls the deleter once.
            unsafe {
                drop(Box::from_raw(
                    (*managed)
                        .manager_ctx
                        .cast::<Exported<DLManagedTensorVersioned>>(),
                ))
            }
        }
    })
}

unsafe extern "C" fn delete_exported_legacy(managed: *mut DLManagedTensor) {
    guard_or((), || {
        if !managed.is_null() {
            // SAFETY: as in `delete_exported`, for `kiln_tensor_to_dlpack_legacy`.
            unsafe {
                drop(Box::from_raw(
                    (*managed).manager_ctx.cast::<Exported<DLManagedTensor>>(),
                ))
            }
        }
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
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe {
        guard(|| {
            let out = out_ptr(out, "out")?;
            let t = arg(t, "t")?;
            *out = export::<DLManagedTensorVersioned>(t)?;
            Ok(())
        })
    }
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
    // SAFETY: the pointer arguments are valid as the `# Safety` section above requires.
    unsafe {
        guard(|| {
            let out = out_ptr(out, "out")?;
            let t = arg(t, "t")?;
            *out = export::<DLManagedTensor>(t)?;
            Ok(())
        })
    }
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
            let dl = dtype_to_dl(dtype, "t").map_err(|f| f.message).unwrap();
            assert_eq!(
                dtype_from_dl(dl, "x").map_err(|f| f.message).unwrap(),
                dtype
            );
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
        // SAFETY: every index stays within `data`.
        unsafe { gather(data.as_ptr().cast(), &[4, 3], &[1, 4], 4, &mut out) };
        let got: Vec<i32> = (out.chunks(4))
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, [0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11]);
        // The reverse of the last row, starting at its end.
        let mut out = vec![0u8; 4 * 4];
        // SAFETY: as above, from element 11 backwards.
        unsafe { gather(data.as_ptr().add(11).cast(), &[4], &[-1], 4, &mut out) };
        let got: Vec<i32> = (out.chunks(4))
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, [11, 10, 9, 8]);
    }
}
