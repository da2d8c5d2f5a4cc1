//! onnxruntime's `com.microsoft` contrib ops (and the two it registers in the default
//! domain) on generated cases: `scripts/contrib-cases.sh` writes one small model per op
//! and attribute variant with onnxruntime's outputs into `target/contrib-cases`; each
//! imports and runs on `interp` and `cpu`. Float outputs agree within 1e-4 of the
//! reference's largest magnitude, integer outputs exactly.
use crate::common;

use std::path::{Path, PathBuf};

use common::Need;
use kiln::backend::{backend_with, Device};
use kiln::frontend::onnx;
use kiln::passes::CompileOptions;
use kiln::{DType, Tensor};

fn cases_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/contrib-cases")
}

fn read_set(dir: &Path, kind: &str) -> Result<Vec<Tensor>, String> {
    let mut out = vec![];
    for i in 0.. {
        let p = dir.join(format!("test_data_set_0/{kind}_{i}.pb"));
        let Ok(bytes) = std::fs::read(&p) else { break };
        out.push(onnx::read_tensor_pb(&bytes).map_err(|e| format!("{kind} {i}: {e}"))?);
    }
    Ok(out)
}

/// Whether `got` matches `want`: the same dtype and shape, integers equal, floats within
/// 1e-4 of `want`'s largest magnitude.
fn agrees(got: &Tensor, want: &Tensor) -> Result<(), String> {
    if got.dtype() != want.dtype() || got.shape() != want.shape() {
        return Err(format!(
            "got {:?}{:?}, expected {:?}{:?}",
            got.dtype(),
            got.shape(),
            want.dtype(),
            want.shape()
        ));
    }
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let float = matches!(want.dtype(), DType::F32 | DType::F64 | DType::F16);
    let largest = w.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let tolerance = if float { 1e-4 * largest.max(1e-3) } else { 0.0 };
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        if (a - b).abs() > tolerance || a.is_nan() != b.is_nan() {
            return Err(format!(
                "element {i}: {a}, expected {b} (tolerance {tolerance:e})"
            ));
        }
    }
    Ok(())
}

/// Cases with a known cpu gap, run with the interpreter fallback asked for (STATUS.md's
/// known gaps): DynamicQuantizeLSTM whose weights are run-time inputs (the quantized LSTM
/// kernel packs constant weights only).
const NEEDS_FALLBACK: &str = "dynamic_quantize_lstm";

fn run_case(dir: &Path, device: Device) -> Result<(), String> {
    let graph = onnx::import_file(&dir.join("model.onnx")).map_err(|e| format!("import: {e}"))?;
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    let options = CompileOptions {
        allow_fallback: name.starts_with(NEEDS_FALLBACK),
        ..CompileOptions::default()
    };
    let exe = backend_with(device, options)
        .and_then(|b| b.compile(&graph))
        .map_err(|e| format!("compile: {e}"))?;
    let (inputs, want) = (read_set(dir, "input")?, read_set(dir, "output")?);
    let got = exe.run(&inputs).map_err(|e| format!("run: {e}"))?;
    if got.len() != want.len() {
        return Err(format!("{} outputs, expected {}", got.len(), want.len()));
    }
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        agrees(g, w).map_err(|e| format!("output {i}: {e}"))?;
    }
    Ok(())
}

#[test]
fn contrib_ops_agree_with_onnxruntime() {
    let dir = cases_dir();
    if !common::require(
        Need::ContribCases,
        common::exists(&dir, "scripts/contrib-cases.sh"),
    ) {
        return;
    }
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("model.onnx").exists())
        .collect();
    cases.sort();
    assert!(cases.len() >= 30, "only {} cases in {dir:?}", cases.len());
    let mut failures = vec![];
    println!("{} contrib cases on interp and cpu", cases.len());
    for case in &cases {
        for device in [Device::Interp, Device::Cpu] {
            if let Err(e) = run_case(case, device) {
                let name = case.file_name().unwrap().to_string_lossy();
                failures.push(format!("{name} on {device:?}: {e}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} runs failed:\n{}",
        failures.len(),
        2 * cases.len(),
        failures.join("\n")
    );
}

#[test]
fn an_unsupported_contrib_op_names_the_node_and_domain() {
    use kiln::frontend::onnx::proto;
    use prost::Message;
    let model = proto::ModelProto {
        ir_version: Some(8),
        opset_import: vec![
            proto::OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(17),
            },
            proto::OperatorSetIdProto {
                domain: Some("com.microsoft".into()),
                version: Some(1),
            },
        ],
        graph: Some(proto::GraphProto {
            name: Some("g".into()),
            node: vec![proto::NodeProto {
                op_type: Some("NoSuchContribOp".into()),
                domain: Some("com.microsoft".into()),
                name: Some("mystery".into()),
                input: vec![],
                output: vec!["y".into()],
                ..Default::default()
            }],
            output: vec![proto::ValueInfoProto {
                name: Some("y".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let e = onnx::import_bytes(&model.encode_to_vec(), None)
        .unwrap_err()
        .to_string();
    for part in ["'mystery'", "NoSuchContribOp", "com.microsoft"] {
        assert!(e.contains(part), "{e}");
    }
}
