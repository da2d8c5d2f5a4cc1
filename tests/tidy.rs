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

/// The C ABI's files.
fn capi_files(root: &Path) -> Vec<std::path::PathBuf> {
    let mut files = vec![];
    common::rust_files(&root.join("src/capi"), &mut files);
    files.sort();
    files
}

/// `path:line` as the failure messages name it, relative to the crate.
fn place(root: &Path, f: &Path, line: usize) -> String {
    format!("{}:{line}", f.strip_prefix(root).unwrap_or(f).display())
}

#[test]
fn every_c_export_runs_under_guard() {
    // Architecture invariant: no panic unwinds into C. Each export calls `guard` or
    // `guard_or`, or one of these helpers, which do (custom_op/mod.rs).
    let helpers = [
        "context_num_inputs(",
        "context_attrs(",
        "context_set_error(",
    ];
    // Constant getters that cannot panic.
    let constants = [
        "kiln_status_string",
        "kiln_version_number",
        "kiln_version_string",
        "kiln_has_cuda",
    ];
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut bad = vec![];
    for f in capi_files(root) {
        let text = std::fs::read_to_string(&f).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            if l.trim() != concat!("#[no_", "mangle]") {
                continue;
            }
            // The body: from the signature to the closing brace at column 0.
            let end = (i..lines.len())
                .find(|&k| lines[k] == "}")
                .unwrap_or(lines.len());
            let body = lines[i..end].join("\n");
            let name = body
                .split("fn ")
                .nth(1)
                .and_then(|s| s.split(['(', '<']).next())
                .unwrap_or("?");
            let guarded = ["guard(", "guard_or("]
                .iter()
                .chain(&helpers)
                .any(|g| body.contains(g));
            if !guarded && !constants.contains(&name) {
                bad.push(format!("{} {name}", place(root, &f, i + 1)));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "exports that neither call guard/guard_or nor are constant getters:\n{}",
        bad.join("\n")
    );
}

/// The Rust files that may hold `unsafe`: the library's and the Python bindings'.
fn unsafe_files(root: &Path) -> Vec<std::path::PathBuf> {
    let mut files = vec![];
    for dir in ["src", "bindings/python/src"] {
        common::rust_files(&root.join(dir), &mut files);
    }
    files.sort();
    files
}

/// Every `// SAFETY:` comment in `files`: its place and its text, whitespace
/// normalised across the comment's lines.
fn safety_comments(root: &Path, files: &[std::path::PathBuf]) -> Vec<(String, String)> {
    let mut out = vec![];
    for f in files {
        let text = std::fs::read_to_string(f).unwrap();
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        for (i, l) in lines.iter().enumerate() {
            let Some(first) = l.strip_prefix("// SAFETY:") else {
                continue;
            };
            let mut words: Vec<&str> = first.split_whitespace().collect();
            for next in &lines[i + 1..] {
                match next.strip_prefix("//") {
                    Some(more) if !more.trim_start().starts_with("SAFETY:") => {
                        words.extend(more.split_whitespace())
                    }
                    _ => break,
                }
            }
            out.push((place(root, f, i + 1), words.join(" ")));
        }
    }
    out
}

#[test]
fn no_safety_comment_is_boilerplate() {
    // Each unsafe block says why *that* operation is sound; a sentence copied onto many
    // blocks says nothing about any of them.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let comments = safety_comments(root, &unsafe_files(root));
    let mut by_text: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for (at, text) in &comments {
        by_text.entry(text).or_default().push(at);
    }
    let repeated: Vec<String> = by_text
        .iter()
        .filter(|(_, at)| at.len() > 5)
        .map(|(text, at)| format!("{} times: \"{text}\" at {}", at.len(), at.join(", ")))
        .collect();
    assert!(
        repeated.is_empty(),
        "SAFETY comments repeated more than 5 times:\n{}",
        repeated.join("\n")
    );
}

#[test]
fn unsafe_blocks_are_short() {
    // Unsafe covers the operations that need it (a pointer read or write, a call of a
    // `target_feature` function), not a function's whole body.
    const MAX_LINES: usize = 10;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut bad = vec![];
    for f in unsafe_files(root) {
        let text = std::fs::read_to_string(&f).unwrap();
        let bytes = text.as_bytes();
        let needle = concat!("unsafe", " {");
        let mut from = 0;
        while let Some(k) = text[from..].find(needle) {
            let start = from + k;
            from = start + needle.len();
            // The matching brace (format strings' braces pair up too).
            let mut depth = 0usize;
            let mut end = bytes.len();
            for (j, &b) in bytes.iter().enumerate().skip(from - 1) {
                match b {
                    b'{' => depth += 1,
                    b'}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = j;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let first = text[..start].lines().count().max(1);
            // From the `unsafe {` line to the closing brace's, both counted.
            let lines = text[..end].lines().count() + 1 - first;
            if lines > MAX_LINES {
                bad.push(format!("{} ({lines} lines)", place(root, &f, first)));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "unsafe blocks longer than {MAX_LINES} lines:\n{}",
        bad.join("\n")
    );
}
