//! `kiln_attrs_get_*`: a node's attributes as the callbacks read them.
use std::ffi::c_char;

use super::kiln_attrs;
use crate::capi::{arg, arg_str, guard, kiln_status, out_ptr, CResult, Failure};
use crate::ir::Attr;

/// # Safety
/// `attrs` is NULL or from a live context; `name` a string.
unsafe fn attr_lookup<'a>(
    attrs: *const kiln_attrs,
    name: *const c_char,
) -> CResult<(&'a str, Option<&'a Attr>)> {
    // SAFETY: `attrs` is NULL or borrowed from a live context, live for the callback.
    let attrs = unsafe { arg(attrs, "attrs") }?;
    // SAFETY: the attribute's `name` is NULL or a NUL-terminated string.
    let name = unsafe { arg_str(name, "name") }?;
    Ok((name, attrs.attrs.get(name)))
}

fn wrong_kind(name: &str, a: &Attr, want: &str) -> Failure {
    Failure::invalid(format!("attribute '{name}' is {}, not {want}", a.kind()))
}

/// The int attribute `name`, or `default_value` if the node has none. A different kind
/// is `KILN_STATUS_INVALID_ARGUMENT`.
///
/// # Safety
/// `attrs` comes from a live context; `name` is a string; `out` is valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_attrs_get_int(
    attrs: *const kiln_attrs,
    name: *const c_char,
    default_value: i64,
    out: *mut i64,
) -> kiln_status {
    guard(|| {
        let out = out_ptr(out, "out")?;
        // SAFETY: `attrs` is from a live context and `name` a string, as documented.
        let (name, a) = unsafe { attr_lookup(attrs, name) }?;
        let v = match a {
            None => default_value,
            Some(Attr::Int(v)) => *v,
            Some(a) => return Err(wrong_kind(name, a, "an int")),
        };
        // SAFETY: `out` is non-NULL (checked) and valid for an i64 (# Safety).
        unsafe { *out = v };
        Ok(())
    })
}

/// The float attribute `name` (an int converts), or `default_value` if none.
///
/// # Safety
/// As `kiln_attrs_get_int`.
#[no_mangle]
pub unsafe extern "C" fn kiln_attrs_get_float(
    attrs: *const kiln_attrs,
    name: *const c_char,
    default_value: f64,
    out: *mut f64,
) -> kiln_status {
    guard(|| {
        let out = out_ptr(out, "out")?;
        // SAFETY: as kiln_attrs_get_int: a live context's attrs and a string name.
        let (name, a) = unsafe { attr_lookup(attrs, name) }?;
        let v = match a {
            None => default_value,
            Some(Attr::Float(v)) => *v,
            Some(Attr::Int(v)) => *v as f64,
            Some(a) => return Err(wrong_kind(name, a, "a float")),
        };
        // SAFETY: the float goes to `out`, non-NULL and writable by contract.
        unsafe { *out = v };
        Ok(())
    })
}

/// The ints attribute `name`: `*data` (borrowed, valid during the callback) and `*len`;
/// NULL and 0 if the node has none.
///
/// # Safety
/// As `kiln_attrs_get_int`; `data` and `len` are valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_attrs_get_ints(
    attrs: *const kiln_attrs,
    name: *const c_char,
    data: *mut *const i64,
    len: *mut usize,
) -> kiln_status {
    guard(|| {
        let data = out_ptr(data, "data")?;
        let len = out_ptr(len, "len")?;
        // SAFETY: `attrs` comes from the live context, `name` is a string (# Safety).
        let (name, a) = unsafe { attr_lookup(attrs, name) }?;
        let (p, n) = match a {
            None => (std::ptr::null(), 0),
            Some(Attr::Ints(v)) => (v.as_ptr(), v.len()),
            Some(a) => return Err(wrong_kind(name, a, "ints")),
        };
        // SAFETY: `data` and `len` were checked non-NULL; the header makes them valid.
        unsafe { (*data, *len) = (p, n) };
        Ok(())
    })
}

/// The floats attribute `name`, as `kiln_attrs_get_ints`.
///
/// # Safety
/// As `kiln_attrs_get_ints`.
#[no_mangle]
pub unsafe extern "C" fn kiln_attrs_get_floats(
    attrs: *const kiln_attrs,
    name: *const c_char,
    data: *mut *const f64,
    len: *mut usize,
) -> kiln_status {
    guard(|| {
        let data = out_ptr(data, "data")?;
        let len = out_ptr(len, "len")?;
        // SAFETY: the floats lookup has kiln_attrs_get_ints's contract: live attrs, a name.
        let (name, a) = unsafe { attr_lookup(attrs, name) }?;
        let (p, n) = match a {
            None => (std::ptr::null(), 0),
            Some(Attr::Floats(v)) => (v.as_ptr(), v.len()),
            Some(a) => return Err(wrong_kind(name, a, "floats")),
        };
        // SAFETY: the borrowed array and its length go to two valid, non-NULL slots.
        unsafe { (*data, *len) = (p, n) };
        Ok(())
    })
}
