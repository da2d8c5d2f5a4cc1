//! Every op in the catalogue is exercised by name in some test of `tests/ops/`, or of
//! `tests/control_flow.rs` for If, Loop and Scan, whose tests build body graphs.
use std::path::Path;

#[test]
fn every_op_has_interpreter_tests() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ops");
    let mut text = String::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().unwrap() != "coverage.rs" {
            text.push_str(&std::fs::read_to_string(path).unwrap());
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    text.push_str(&std::fs::read_to_string(root.join("tests/control_flow.rs")).unwrap());
    let missing: Vec<&str> = kiln::ir::ops::catalogue()
        .keys()
        .copied()
        .filter(|name| !text.contains(&format!("\"{name}\"")))
        .collect();
    assert!(missing.is_empty(), "ops without tests: {missing:?}");
}
