//! An executable's variables: listing, reading and writing them, and checkpoints.
//!
//! Every executable owns its variables (initialized from the graph's `Variable` nodes).
//! These calls are thread-safe: a read or write waits for a run that assigns variables to
//! finish, so it never sees or makes a half-done step.
use std::ffi::c_char;
use std::path::Path;

use super::compile::{kiln_executable, write_info};
use super::tensor::{kiln_dtype, kiln_tensor};
use super::{arg, arg_str, guard, guard_or, into_handle, kiln_status, out_ptr};
use crate::checkpoint;

/// The number of variables the executable owns; 0 for NULL.
///
/// # Safety
/// `e` is NULL or a live executable.
#[no_mangle]
pub unsafe extern "C" fn kiln_executable_variable_count(e: *const kiln_executable) -> usize {
    guard_or(0, || {
        // SAFETY: `e` is NULL or a live executable, whose variable list is fixed.
        unsafe { arg(e, "e") }.map_or(0, |e| e.variables.len())
    })
}

/// Describes variable `index` (in graph order): its name, dtype, and `rank` dims
/// (variables have static shapes). Any out-pointer may be NULL. The strings and arrays
/// belong to the executable and stay valid until it is freed. Thread-safe.
///
/// # Safety
/// `e` is a live executable; non-NULL out-pointers are valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_executable_variable_info(
    e: *const kiln_executable,
    index: usize,
    name: *mut *const c_char,
    dtype: *mut kiln_dtype,
    dims: *mut *const i64,
    rank: *mut usize,
) -> kiln_status {
    guard(|| {
        // SAFETY: `e` is NULL or a live executable (# Safety).
        let e = unsafe { arg(e, "e") }?;
        // SAFETY: each out-pointer is NULL or valid, what write_info asks.
        unsafe { write_info(&e.variables, "variable", index, name, dtype, dims, rank) }
    })
}

/// Copies variable `name`'s current value into a new tensor `*out`, which the caller
/// frees with `kiln_tensor_free`. An unknown name is `KILN_STATUS_INVALID_ARGUMENT`, with
/// the executable's variables listed in the message. Thread-safe: waits for a run that
/// assigns variables to finish, so the value is never a half-done step's.
///
/// # Safety
/// `e` is a live executable; `name` a string; `out` valid.
#[no_mangle]
pub unsafe extern "C" fn kiln_executable_read_variable(
    e: *const kiln_executable,
    name: *const c_char,
    out: *mut *mut kiln_tensor,
) -> kiln_status {
    guard(|| {
        // SAFETY: `e` is NULL or a live executable, shared safely (reads are locked).
        let e = unsafe { arg(e, "e") }?;
        // SAFETY: the variable's `name` is NULL or NUL-terminated, as documented.
        let name = unsafe { arg_str(name, "name") }?;
        let out = out_ptr(out, "out")?;
        let value = into_handle(kiln_tensor::from_tensor(&e.exe.read_variable(name)?)?);
        // SAFETY: `out` was checked non-NULL and the caller made it writable.
        unsafe { *out = value };
        Ok(())
    })
}

/// Replaces variable `name`'s value with a copy of `value`, which must have the
/// variable's dtype and dims (else `KILN_STATUS_INVALID_ARGUMENT` and nothing changes).
/// Thread-safe: waits for a run that assigns variables to finish; runs that start after
/// the call returns see the new value.
///
/// # Safety
/// `e` is a live executable; `name` a string; `value` a live tensor.
#[no_mangle]
pub unsafe extern "C" fn kiln_executable_write_variable(
    e: *const kiln_executable,
    name: *const c_char,
    value: *const kiln_tensor,
) -> kiln_status {
    guard(|| {
        // SAFETY: `e` is NULL or a live executable; writes lock its variables.
        let e = unsafe { arg(e, "e") }?;
        // SAFETY: `name` is NULL or a NUL-terminated string (# Safety).
        let name = unsafe { arg_str(name, "name") }?;
        // SAFETY: `value` is NULL or a live tensor, copied before returning.
        let value = unsafe { arg(value, "value") }?.0.to_tensor("value")?;
        e.exe.write_variables(&[(name, &value)])?;
        Ok(())
    })
}

/// Saves every variable to a checkpoint file at `path` (a small versioned binary format
/// with a checksum, see `src/checkpoint.rs`). The file is written beside `path` under a
/// temporary name and renamed over it, so `path` never holds a partial checkpoint. A
/// write that fails is `KILN_STATUS_IO`, naming the path. Thread-safe: the variables are
/// read together between runs that assign, so the file holds one step's state.
///
/// # Safety
/// `e` is a live executable; `path` a string.
#[no_mangle]
pub unsafe extern "C" fn kiln_executable_save_checkpoint(
    e: *const kiln_executable,
    path: *const c_char,
) -> kiln_status {
    guard(|| {
        // SAFETY: the header makes `e` NULL or a live executable; saving reads it locked.
        let e = unsafe { arg(e, "e") }?;
        // SAFETY: the checkpoint `path` is NULL or a NUL-terminated string.
        let path = unsafe { arg_str(path, "path") }?;
        checkpoint::save(e.exe.as_ref(), Path::new(path))?;
        Ok(())
    })
}

/// Loads a checkpoint saved by `kiln_executable_save_checkpoint` (from this executable
/// or another compiled from the same graph) into the executable's variables. The whole
/// file is checked first: unreadable, truncated, corrupt (checksum) or of an unknown
/// format version is `KILN_STATUS_IO`; variables that are not exactly the executable's
/// (a missing or extra name, another dtype or shape: a checkpoint of another graph) are
/// `KILN_STATUS_INVALID_ARGUMENT`, the message naming each variable. On any failure no
/// variable changes; on success all are replaced at once. Thread-safe: waits for a run
/// that assigns variables to finish.
///
/// # Safety
/// `e` is a live executable; `path` a string.
#[no_mangle]
pub unsafe extern "C" fn kiln_executable_load_checkpoint(
    e: *const kiln_executable,
    path: *const c_char,
) -> kiln_status {
    guard(|| {
        // SAFETY: `e` is NULL or a live executable, whose variables the load locks.
        let e = unsafe { arg(e, "e") }?;
        // SAFETY: `path` is NULL or NUL-terminated, as the header requires.
        let path = unsafe { arg_str(path, "path") }?;
        checkpoint::load(e.exe.as_ref(), Path::new(path))?;
        Ok(())
    })
}
