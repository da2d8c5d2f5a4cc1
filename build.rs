//! Sets the shared library's soname and, with the `openblas` feature only (the GEMM
//! bench and the test comparing against OpenBLAS), links OpenBLAS from the system
//! (Debian's `libopenblas-dev`). The `openblas-src` crate is avoided on purpose: its
//! source build downloads a tarball and fails offline.
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // Consumers link the shared library by name, not by the path it was built at.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libkiln.so");
    // No library code path calls OpenBLAS, so embedders do not link it.
    if std::env::var_os("CARGO_FEATURE_OPENBLAS").is_none() {
        return;
    }
    println!("cargo:rerun-if-env-changed=KILN_OPENBLAS_LIB_DIR");
    if let Ok(dir) = std::env::var("KILN_OPENBLAS_LIB_DIR") {
        println!("cargo:rustc-link-search=native={dir}");
        println!("cargo:rustc-link-lib=openblas");
        return;
    }
    // pkg-config first (it knows Debian's alternatives path), then the plain library name.
    let probe = Command::new("pkg-config")
        .args(["--libs-only-L", "openblas"])
        .output();
    if let Ok(out) = probe {
        if out.status.success() {
            for flag in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                if let Some(dir) = flag.strip_prefix("-L") {
                    println!("cargo:rustc-link-search=native={dir}");
                }
            }
        }
    }
    println!("cargo:rustc-link-lib=openblas");
}
