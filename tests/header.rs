//! `include/kiln.h`: generated from `src/capi/` by cbindgen, committed, and kept honest.
//!
//! `BLESS=1 cargo test --test tools header::` rewrites it after a change to the C ABI.
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn header_path() -> PathBuf {
    root().join("include/kiln.h")
}

fn generate() -> String {
    let config = cbindgen::Config::from_file(root().join("cbindgen.toml")).unwrap();
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_config(config)
        .with_crate(root())
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut out);
    String::from_utf8(out).unwrap()
}

#[test]
fn header_is_fresh() {
    let want = generate();
    let path = header_path();
    if std::env::var_os("BLESS").is_some() {
        std::fs::write(&path, &want).unwrap();
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "include/kiln.h is stale: run `BLESS=1 cargo test --test tools header::` and commit it"
    );
}

#[test]
fn version_macros_match_the_library() {
    let text = std::fs::read_to_string(header_path()).unwrap();
    let number: u32 = text
        .lines()
        .find_map(|l| l.strip_prefix("#define KILN_VERSION_NUMBER "))
        .expect("KILN_VERSION_NUMBER in the header")
        .trim()
        .parse()
        .unwrap();
    assert_eq!(number, kiln::capi::kiln_version_number());
    // SAFETY: kiln_version_string returns a static NUL-terminated string.
    let s = unsafe { std::ffi::CStr::from_ptr(kiln::capi::kiln_version_string()) };
    assert_eq!(s.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
    assert!(text.contains(&format!(
        "#define KILN_VERSION_STRING \"{}\"",
        env!("CARGO_PKG_VERSION")
    )));
    for (part, value) in [
        ("MAJOR", env!("CARGO_PKG_VERSION_MAJOR")),
        ("MINOR", env!("CARGO_PKG_VERSION_MINOR")),
        ("PATCH", env!("CARGO_PKG_VERSION_PATCH")),
    ] {
        let line = format!("#define KILN_VERSION_{part} {value}\n");
        assert!(
            text.contains(&line),
            "the header lacks {line:?}: update cbindgen.toml"
        );
    }
}

/// Compiles a translation unit that includes only the header, with every warning an error.
fn compile_alone(compiler: &str, args: &[&str], ext: &str) {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("header");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join(format!("alone.{ext}"));
    std::fs::write(&src, "#include \"kiln.h\"\n#include \"kiln.h\"\nint main(void) { return kiln_version_number() == KILN_VERSION_NUMBER ? 0 : 1; }\n").unwrap();
    let out = Command::new(compiler)
        .args(args)
        .args([
            "-Wall",
            "-Wextra",
            "-Wpedantic",
            "-Werror",
            "-fsyntax-only",
            "-I",
        ])
        .arg(root().join("include"))
        .arg(&src)
        .output()
        .unwrap_or_else(|e| {
            panic!("{compiler} is needed to check the header (make test installs it): {e}")
        });
    assert!(
        out.status.success(),
        "{compiler} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn cpp_wrapper_compiles_alone() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("header");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("hpp_alone.cpp");
    std::fs::write(&src, "#include \"kiln.hpp\"\nint main() { return 0; }\n").unwrap();
    let out = Command::new("c++")
        .args([
            "-std=c++17",
            "-Wall",
            "-Wextra",
            "-Wpedantic",
            "-Werror",
            "-fsyntax-only",
            "-I",
        ])
        .arg(root().join("include"))
        .arg("-I")
        .arg(root().join("bindings/cpp"))
        .arg(&src)
        .output()
        .expect("c++ is needed to check kiln.hpp (make test installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn header_compiles_alone_as_c99_c11_and_cpp17() {
    compile_alone("cc", &["-std=c99"], "c");
    compile_alone("cc", &["-std=c11"], "c");
    compile_alone("c++", &["-std=c++17"], "cpp");
}

#[test]
fn every_exported_function_is_exercised_by_the_c_tests() {
    let header = std::fs::read_to_string(header_path()).unwrap();
    let mut tests = String::new();
    for entry in std::fs::read_dir(root().join("tests/capi")).unwrap() {
        tests.push_str(&std::fs::read_to_string(entry.unwrap().path()).unwrap());
    }
    let missing: Vec<&str> = header
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '('))
        .filter_map(|w| w.strip_suffix('('))
        .filter(|f| f.starts_with("kiln_") && !tests.contains(&format!("{f}(")))
        .collect();
    assert!(
        missing.is_empty(),
        "not called from tests/capi/*.c: {missing:?}"
    );
}

/// Only the C ABI's own names reach the header: a public Rust item elsewhere in the
/// crate (a pass constant, a planner enum) would otherwise leak in through cbindgen.
#[test]
fn every_exported_name_is_kilns() {
    let text = generate();
    let mut leaks = vec![];
    for line in text.lines() {
        let name = if let Some(rest) = line.strip_prefix("#define ") {
            rest.split_whitespace().next()
        } else if let Some(rest) = line.strip_prefix("typedef struct ") {
            rest.split_whitespace().next()
        } else if let Some(rest) = line.strip_prefix("typedef ") {
            // A function pointer type, `typedef R (*name)(args);`, or an alias.
            match rest.split_once("(*") {
                Some((_, tail)) => tail.split(')').next(),
                None => rest.trim_end_matches(';').split_whitespace().last(),
            }
        } else {
            None
        };
        if let Some(n) = name {
            let lower = n.to_ascii_lowercase();
            if !lower.starts_with("kiln") {
                leaks.push(n.to_string());
            }
        }
    }
    assert!(
        leaks.is_empty(),
        "names without the kiln prefix in kiln.h: {leaks:?} (exclude them in cbindgen.toml)"
    );
}
