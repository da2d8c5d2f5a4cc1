//! Inputs the cargo-fuzz targets (`fuzz/`) once crashed on, replayed through the same
//! checks without nightly: each file under `tests/fuzz/<target>/` is an input to that
//! target (`onnx_import`, `onnx_compile`, `kir_parse`), kept as the fuzzer wrote it
//! (minimized). A new crash becomes a test by copying its artifact there.
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use kiln::backend::{backend_with, Device};
use kiln::ir::text::{parse, print};
use kiln::passes::CompileOptions;

use crate::common;
use common::panic_of;

/// `fuzz/fuzz_targets/onnx_import.rs`: a graph or an error; a graph prints as text that
/// parses back and prints the same.
fn onnx_import(data: &[u8]) {
    let Ok(graph) = kiln::frontend::onnx::import_bytes(data, None) else {
        return;
    };
    round_trips(&graph);
}

/// `fuzz/fuzz_targets/onnx_compile.rs`: what imports passes the pipeline (verifying
/// after every pass) and compiles on `cpu`, or fails with an error that is not a pass
/// breaking a valid graph.
fn onnx_compile(data: &[u8]) {
    let Ok(mut g) = kiln::frontend::onnx::import_bytes(data, None) else {
        return;
    };
    let Ok(unbound) = g.specialize(&HashMap::new()) else {
        return;
    };
    let ones: HashMap<String, usize> = unbound.into_iter().map(|s| (s, 1)).collect();
    if g.specialize(&ones).is_err() {
        return;
    }
    let options = CompileOptions {
        verify: true,
        threads: 1,
        ..CompileOptions::default()
    };
    let backend = backend_with(Device::Cpu, options).unwrap();
    if let Err(e) = backend.compile(&g) {
        let message = e.to_string();
        assert!(
            !message.contains("left an invalid graph"),
            "a pass broke a valid graph: {message}"
        );
    }
}

/// `fuzz/fuzz_targets/kir_parse.rs`: a graph or an error; a graph verifies and round-trips.
fn kir_parse(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(graph) = parse(text, "fuzz.kir", None) else {
        return;
    };
    if let Err(e) = kiln::ir::verify(&graph) {
        panic!("a parsed graph does not verify: {e}");
    }
    round_trips(&graph);
}

fn round_trips(graph: &kiln::ir::Graph) {
    let printed = print(graph);
    let reparsed = parse(&printed, "printed.kir", None)
        .unwrap_or_else(|e| panic!("the printed graph does not parse back: {e}\n{printed}"));
    assert_eq!(
        printed,
        print(&reparsed),
        "print → parse → print is not the identity"
    );
}

fn inputs(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} holds no inputs", dir.display());
    files
}

/// Runs every input of `target` through `check`, each on its own so that one panic
/// names its file and the others still run.
fn replay(target: &str, check: fn(&[u8])) {
    let mut failures = vec![];
    for path in inputs(target) {
        let data = std::fs::read(&path).unwrap();
        if let Some(message) = panic_of(|| check(&data)) {
            failures.push(format!("{}: {message}", path.display()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn onnx_import_regressions() {
    replay("onnx_import", onnx_import);
}

#[test]
fn onnx_compile_regressions() {
    replay("onnx_compile", onnx_compile);
}

#[test]
fn kir_parse_regressions() {
    replay("kir_parse", kir_parse);
}

/// A constant is a tensor: `.kir` text declaring a sequence-typed constant is refused
/// at the node, rather than verifying and failing when the graph runs.
#[test]
fn a_constant_cannot_be_a_sequence() {
    let text = "graph \"g\" {\n  %0 \"s\" = Constant : seq<f32[]> = [1.0]\n  \
                %1 \"n\" = SequenceLength(%0) : i64[]\n  return \"n\" = %1\n}\n";
    let e = parse(text, "seq.kir", None).unwrap_err().to_string();
    for part in [
        "seq.kir:2:3",
        "'s' (Constant)",
        "seq<f32[]>",
        "only tensors",
    ] {
        assert!(e.contains(part), "{part:?} missing from: {e}");
    }
}

/// Branches that each build a sequence from a constant give an If of a sequence: the
/// importer does not fold the sequence into a (mistyped) constant.
#[test]
fn an_if_of_constant_sequences_stays_a_sequence() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz/onnx_import/if_branches_build_sequences.onnx");
    let g = kiln::frontend::onnx::import_file(&path).unwrap();
    let out = g.value_type(g.outputs()[0].value).unwrap();
    assert_eq!(out.to_string(), "seq<f32[5]>");
}

/// A Loop of constants is evaluated at import (and by constant folding) only when its
/// trip count is small: one of 2^62 iterations stays a node instead of hanging the
/// import, one of 3 still becomes a constant.
#[test]
fn only_a_short_loop_of_constants_is_evaluated_ahead() {
    use kiln::frontend::onnx::proto::ModelProto;
    use prost::Message;
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz/onnx_import/loop_of_constants_with_a_huge_trip_count.onnx");
    let bytes = std::fs::read(path).unwrap();
    let loops = |bytes: &[u8]| {
        let g = kiln::frontend::onnx::import_bytes(bytes, None).unwrap();
        g.nodes().iter().filter(|n| n.op == "Loop").count()
    };
    assert_eq!(loops(&bytes), 1);
    let mut model = ModelProto::decode(&bytes[..]).unwrap();
    let graph = model.graph.as_mut().unwrap();
    let trips = graph
        .initializer
        .iter_mut()
        .find(|t| t.name() == "M")
        .unwrap();
    trips.int64_data = vec![3];
    assert_eq!(loops(&model.encode_to_vec()), 0);
}

/// An If whose branch builds a sequence inside (its result a tensor) compiles on `cpu`:
/// the branch, which makes host objects, runs on the interpreter instead of being
/// lowered into an arena it has no bytes in.
#[test]
fn a_body_making_host_objects_compiles_on_cpu() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz/cpu/if_branch_builds_a_sequence_inside.kir");
    let g = kiln::ir::text::parse_file(&path).unwrap();
    let cpu = backend_with(
        Device::Cpu,
        CompileOptions {
            threads: 1,
            ..Default::default()
        },
    )
    .unwrap();
    let exe = cpu.compile(&g).unwrap();
    let x = kiln::Tensor::from_vec(&[3], vec![1.0f32, 2.0, 3.0]).unwrap();
    let y = exe.run(&[kiln::Tensor::scalar(true), x.clone()]).unwrap();
    assert_eq!(y[0], x);
}
