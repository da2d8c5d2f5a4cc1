//! Source hygiene that review would otherwise have to catch.
use crate::common;

use std::path::Path;

#[test]
fn no_leftover_debugging_or_placeholders_in_src() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![];
    common::rust_files(&root.join("src"), &mut files);
    // Spelled in pieces so that this file does not match itself.
    let banned = [
        concat!("todo", "!("),
        concat!("dbg", "!("),
        concat!("unimplemented", "!("),
    ];
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for b in banned {
            assert!(!text.contains(b), "{} contains {b}", f.display());
        }
    }
}

#[test]
fn only_capi_speaks_c() {
    // Architecture invariant: `extern "C"` and `#[no_mangle]` live only in src/capi/,
    // except the one file that imports a C library (OpenBLAS) for the CPU kernels and
    // the DLPack structs, whose deleters are C function pointers (and Kiln's deleters
    // of what it exports); neither exports a symbol.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![];
    common::rust_files(&root.join("src"), &mut files);
    // Rust's FFI forms only: the CUDA generator writes (and documents) `extern "C"
    // __global__` kernels, which is CUDA C, not an ABI of Kiln's.
    let banned = [
        concat!("extern ", "\"C\" fn"),
        concat!("extern ", "\"C\" {"),
        concat!("no_", "mangle"),
    ];
    let blas = root.join("src/backend/cpu/kernels/blas.rs");
    let dlpack = root.join("src/interop/dlpack.rs");
    for f in files
        .iter()
        .filter(|f| !f.starts_with(root.join("src/capi")))
    {
        let text = std::fs::read_to_string(f).unwrap();
        for b in banned {
            let named_exception = (*f == blas || *f == dlpack) && b.starts_with("extern");
            assert!(
                named_exception || !text.contains(b),
                "{} contains {b}",
                f.display()
            );
        }
    }
}

#[test]
fn kiln_require_names_needs_and_rejects_typos() {
    use common::{required_by, Need};
    assert_eq!(required_by("", Need::Gxx), Ok(false));
    assert_eq!(required_by("all", Need::CudaDevice), Ok(true));
    assert_eq!(required_by("onnx-suite, gxx", Need::Gxx), Ok(true));
    assert_eq!(required_by("onnx-suite,gxx", Need::Avx512f), Ok(false));
    assert_eq!(required_by("onnx-suite,zoo", Need::Zoo), Ok(true));
    let e = required_by("onnx-suite,avx512", Need::Gxx).unwrap_err();
    assert!(e.contains("'avx512'") && e.contains("avx512f"), "{e}");
}
