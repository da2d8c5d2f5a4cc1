//! CUDA C → PTX with NVRTC, cached in-process.
//!
//! cudarc opens libnvrtc by name (`libnvrtc.so.12` among others) through the dynamic
//! loader, so it is found on `LD_LIBRARY_PATH` (set before the process starts; the
//! loader reads it once): `scripts/cuda-tools.sh` installs NVIDIA's wheel and prints
//! the line to export. cudarc panics on a missing library, so presence is checked first.
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::nvrtc::{self, CompileError, CompileOptions};

use super::probe::no_panic;
use crate::error::{Error, Result};

/// The virtual architectures Kiln compiles for: Ampere and Hopper.
pub const ARCHES: [&str; 2] = ["compute_80", "compute_90"];

/// Why NVRTC cannot be used, or Ok.
pub fn available() -> std::result::Result<(), String> {
    // SAFETY: only tries to dlopen NVRTC's library names.
    if unsafe { nvrtc::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(
            "NVRTC not found (libnvrtc.so.12 is not on the loader's path; \
             eval \"$(scripts/cuda-tools.sh)\" installs it and sets LD_LIBRARY_PATH)"
                .to_string(),
        )
    }
}

/// The cache key: the source's hash (the source itself is kept to rule out a
/// collision), the architecture and the extra options.
#[derive(Hash, PartialEq, Eq)]
struct Key {
    source_hash: u64,
    arch: String,
    options: Vec<String>,
}

type Cache = Mutex<HashMap<Key, (Arc<str>, Arc<str>)>>;

fn cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// Compiles `source` (whose kernel is `entry`, named in errors) to PTX for `arch`
/// (`"compute_80"`, ...) with `options` passed to NVRTC as they are. Compiles each
/// (source, arch, options) once per process. A rejected program is an
/// `Error::Compile` naming the entry and carrying NVRTC's log.
pub fn compile_ptx(entry: &str, source: &str, arch: &str, options: &[String]) -> Result<Arc<str>> {
    let mut hasher = DefaultHasher::new();
    source.hash(&mut hasher);
    let key = Key {
        source_hash: hasher.finish(),
        arch: arch.to_string(),
        options: options.to_vec(),
    };
    if let Some((src, ptx)) = cache().lock().ok().and_then(|c| c.get(&key).cloned()) {
        if &*src == source {
            return Ok(ptx);
        }
    }
    available().map_err(|why| Error::Device(format!("kernel {entry}: {why}")))?;
    if source.contains('\0') {
        return Err(Error::Compile(format!(
            "kernel {entry}: the CUDA source contains a NUL byte"
        )));
    }
    let opts = CompileOptions {
        options: std::iter::once(format!("--gpu-architecture={arch}"))
            .chain(options.iter().cloned())
            .collect(),
        name: Some(format!("{entry}.cu")),
        ..Default::default()
    };
    let compiled = no_panic("NVRTC", || nvrtc::compile_ptx_with_opts(source, opts))
        .map_err(|e| Error::Compile(format!("kernel {entry}: {e}")))?
        .map_err(|e| Error::Compile(format!("kernel {entry} ({arch}): {}", describe(&e))))?;
    let ptx: Arc<str> = no_panic("NVRTC", || compiled.to_src())
        .map_err(|e| Error::Compile(format!("kernel {entry}: {e}")))?
        .into();
    if let Ok(mut c) = cache().lock() {
        c.insert(key, (source.into(), ptx.clone()));
    }
    Ok(ptx)
}

/// NVRTC's failure as text: the log for a compile error.
fn describe(e: &CompileError) -> String {
    match e {
        CompileError::CompileError {
            nvrtc,
            options,
            log,
        } => format!(
            "NVRTC rejected it ({nvrtc:?}; options {}):\n{}",
            options.join(" "),
            log.to_string_lossy().trim_end()
        ),
        other => format!("NVRTC failed: {other:?}"),
    }
}
