//! The zoo: real ONNX models from PyPI packages and pinned tools (`scripts/model-zoo.sh`
//! writes them into `target/zoo`; `tests/zoo/README.md` lists them), each imported and
//! run on `interp` and on `cpu` and compared with onnxruntime's outputs: floats within
//! 1e-4 of the largest magnitude of the reference output, integers exact.
//!
//! `tests/zoo/expected.txt` records each model's outcome with a one-line reason for each
//! failure; a model recorded as passing that fails is a regression and fails this test.
//! `BLESS=1 cargo test --release --test zoo -- --nocapture` rewrites the record;
//! `KILN_ZOO_MODELS=substring` runs only the matching models (no record check).
mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kiln::backend::cpu::CpuBackend;
use kiln::backend::{backend_for, Device};
use kiln::frontend::onnx;
use kiln::passes::CompileOptions;
use kiln::Tensor;

/// How far a float output may be from the reference, relative to the reference's
/// largest finite magnitude.
const RELATIVE_TO_LARGEST: f64 = 1e-4;

fn zoo_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/zoo")
}

fn record_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/zoo/expected.txt")
}

/// `got` against onnxruntime's `want`: same dtype and shape; floats within
/// `RELATIVE_TO_LARGEST` of `want`'s largest finite magnitude, everything else exact.
fn compare(got: &Tensor, want: &Tensor) -> Result<(), String> {
    let atol = match want.dtype().is_float() {
        true => {
            let largest = want
                .to_f64_vec()
                .into_iter()
                .filter(|v| v.is_finite())
                .fold(0.0, |m: f64, v| m.max(v.abs()));
            RELATIVE_TO_LARGEST * largest
        }
        false => 0.0,
    };
    got.check_close(want, atol, 0.0)
}

/// The tensors `<kind>_0.pb`, `<kind>_1.pb`, … in `set`, in order.
fn read_tensors(set: &Path, kind: &str) -> Result<Vec<Tensor>, String> {
    let mut out = vec![];
    for i in 0.. {
        let path = set.join(format!("{kind}_{i}.pb"));
        let Ok(bytes) = std::fs::read(&path) else {
            break;
        };
        out.push(onnx::read_tensor_pb(&bytes).map_err(|e| format!("{}: {e}", path.display()))?);
    }
    Ok(out)
}

/// One model on `device`: `Ok` or why it fails, on one line.
fn check_model(dir: &Path, device: Device) -> Result<(), String> {
    let graph = onnx::import_file(&dir.join("model.onnx")).map_err(|e| format!("import: {e}"))?;
    let exe = backend_for(device)
        .and_then(|b| b.compile(&graph))
        .map_err(|e| format!("compile: {e}"))?;
    let set = dir.join("test_data_set_0");
    let inputs = read_tensors(&set, "input")?;
    let want = read_tensors(&set, "output")?;
    let got = exe.run(&inputs).map_err(|e| format!("run: {e}"))?;
    if got.len() != want.len() {
        return Err(format!("{} outputs, expected {}", got.len(), want.len()));
    }
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        compare(g, w).map_err(|e| format!("output {i}: {e}"))?;
    }
    Ok(())
}

/// A model's name and its outcome and time on `interp` and on `cpu`.
struct Outcome {
    name: String,
    interp: (Result<(), String>, Duration),
    cpu: (Result<(), String>, Duration),
}

impl Outcome {
    fn passes(&self) -> bool {
        self.interp.0.is_ok() && self.cpu.0.is_ok()
    }

    /// The record's line: `<model> pass` or `<model> fail <backend>: <first line of why>`.
    fn record_line(&self) -> String {
        let why = match (&self.interp.0, &self.cpu.0) {
            (Ok(()), Ok(())) => return format!("{} pass", self.name),
            (Err(e), _) => format!("interp: {e}"),
            (Ok(()), Err(e)) => format!("cpu: {e}"),
        };
        let why: String = why.lines().next().unwrap_or("").chars().take(200).collect();
        format!("{} fail {why}", self.name)
    }
}

/// One model on `device` and how long it took; a panic is an outcome, not the end.
fn catch(dir: &Path, device: Device) -> (Result<(), String>, Duration) {
    let start = Instant::now();
    let outcome = std::panic::catch_unwind(|| check_model(dir, device)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        Err(format!("PANIC {msg}"))
    });
    (outcome, start.elapsed())
}

// The reference interpreter on these models takes minutes per model unoptimised and
// seconds optimised: `make test` runs this with `--release`.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "slow unoptimised: cargo test --release --test zoo"
)]
fn zoo_models_agree_with_onnxruntime() {
    let dir = zoo_dir();
    let manifest = dir.join("manifest.txt");
    if !common::require(
        common::Need::Zoo,
        common::exists(&manifest, "scripts/model-zoo.sh"),
    ) {
        return;
    }
    let only = std::env::var("KILN_ZOO_MODELS").ok();
    let names: Vec<String> = std::fs::read_to_string(&manifest)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|n| only.as_ref().is_none_or(|o| n.contains(o.as_str())))
        .collect();
    // Two workers, each taking the next model; a panic is caught and recorded.
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut results: Vec<(usize, Outcome)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let mut done = vec![];
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(name) = names.get(i) else { break };
                        let model = dir.join(name);
                        let outcome = Outcome {
                            name: name.clone(),
                            interp: catch(&model, Device::Interp),
                            cpu: catch(&model, Device::Cpu),
                        };
                        println!(
                            "{name}: interp {:.1} s {:?}; cpu {:.1} s {:?}",
                            outcome.interp.1.as_secs_f64(),
                            outcome.interp.0,
                            outcome.cpu.1.as_secs_f64(),
                            outcome.cpu.0
                        );
                        done.push((i, outcome));
                    }
                    done
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    results.sort_by_key(|r| r.0);
    let results: Vec<Outcome> = results.into_iter().map(|r| r.1).collect();
    let passed = results.iter().filter(|r| r.passes()).count();
    println!(
        "zoo: {passed} of {} models agree with onnxruntime on interp and cpu",
        results.len()
    );
    if only.is_some() {
        return;
    }
    let mut record = String::from(
        "# model outcome [reason]: written by BLESS=1 cargo test --release --test zoo\n",
    );
    for r in &results {
        record.push_str(&r.record_line());
        record.push('\n');
    }
    if std::env::var_os("BLESS").is_some() {
        std::fs::write(record_path(), &record).unwrap();
    }
    let expected = std::fs::read_to_string(record_path()).unwrap_or_default();
    let mut problems = vec![];
    for line in expected.lines().filter(|l| !l.starts_with('#')) {
        let mut words = line.split_whitespace();
        let (Some(name), Some(outcome)) = (words.next(), words.next()) else {
            continue;
        };
        match results.iter().find(|r| r.name == name) {
            None => problems.push(format!("{name}: in the record, not in the zoo")),
            Some(r) if outcome == "pass" && !r.passes() => {
                problems.push(format!("{name} used to pass: {}", r.record_line()))
            }
            Some(r) if outcome != "pass" && r.passes() => {
                println!("{name} passes now: BLESS=1 to record it")
            }
            Some(_) => {}
        }
    }
    for r in &results {
        if !expected
            .lines()
            .any(|l| l.split_whitespace().next() == Some(&r.name))
        {
            problems.push(format!("{}: in the zoo, not in the record", r.name));
        }
    }
    assert!(
        problems.is_empty(),
        "the zoo differs from tests/zoo/expected.txt:\n{}",
        problems.join("\n")
    );
}

#[test]
fn comparison_is_relative_to_the_largest_reference_value_and_exact_on_integers() {
    let want = Tensor::from_vec(&[3], vec![1000.0f32, 1.0, -2.0]).unwrap();
    let near = Tensor::from_vec(&[3], vec![1000.05f32, 1.09, -2.09]).unwrap();
    assert!(compare(&near, &want).is_ok());
    let far = Tensor::from_vec(&[3], vec![1000.0f32, 1.2, -2.0]).unwrap();
    assert!(compare(&far, &want).is_err());
    let shape = Tensor::from_vec(&[1, 3], vec![1000.0f32, 1.0, -2.0]).unwrap();
    assert!(compare(&shape, &want).is_err());
    let ints = Tensor::from_vec(&[2], vec![5i64, 7]).unwrap();
    assert!(compare(&ints, &ints).is_ok());
    let off_by_one = Tensor::from_vec(&[2], vec![5i64, 8]).unwrap();
    assert!(compare(&off_by_one, &ints).is_err());
    let zeros = Tensor::from_vec(&[2], vec![0.0f32, 0.0]).unwrap();
    let tiny = Tensor::from_vec(&[2], vec![0.0f32, 1e-30]).unwrap();
    assert!(compare(&tiny, &zeros).is_err());
}

/// The steps of `graph` compiled for `cpu` at these input shapes that run the
/// interpreter's op (`fallback`) or the whole signature on the interpreter, each as
/// `<model>: <node> (<kind>)`.
fn fallback_steps(model: &str, graph: &kiln::Graph, shapes: &[Vec<usize>]) -> Vec<String> {
    let exe = CpuBackend::new(CompileOptions {
        threads: 1,
        ..CompileOptions::from_env().unwrap()
    })
    .compile_cpu(graph)
    .unwrap_or_else(|e| panic!("{model}: {e}"));
    exe.step_report(shapes)
        .unwrap_or_else(|e| panic!("{model}: {e}"))
        .into_iter()
        .filter(|s| s.is_fallback())
        .map(|s| format!("{model}: {} ({})", s.node, s.kind))
        .collect()
}

/// Every zoo model (at its test inputs' shapes) and every benchmark model (those of
/// `scripts/test-onnx-models.sh`) compiled for `cpu`: every step a kernel, none the
/// interpreter's op on copies (`fallback`) and no signature run on the interpreter as a
/// whole. Fails naming each offending step.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "slow unoptimised: cargo test --release --test zoo"
)]
fn zoo_models_compile_to_kernels_only() {
    let dir = zoo_dir();
    let manifest = dir.join("manifest.txt");
    let bench = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/real-models");
    if !common::require(
        common::Need::Zoo,
        common::exists(&manifest, "scripts/model-zoo.sh"),
    ) {
        return;
    }
    let only = std::env::var("KILN_ZOO_MODELS").ok();
    let wanted = |n: &str| only.as_ref().is_none_or(|o| n.contains(o.as_str()));
    let mut offenders = vec![];
    for name in std::fs::read_to_string(&manifest)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| wanted(n))
    {
        let model = dir.join(name);
        let graph = onnx::import_file(&model.join("model.onnx")).unwrap();
        let inputs = read_tensors(&model.join("test_data_set_0"), "input").unwrap();
        let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
        offenders.extend(fallback_steps(name, &graph, &shapes));
    }
    // The benchmark models take one input each, named after the graph input.
    for name in ["mlp", "small_cnn", "resnet18", "resnet50", "bert_encoder"] {
        let model = bench.join(name);
        if !wanted(name) || !model.join("model.onnx").exists() {
            continue;
        }
        let graph = onnx::import_file(&model.join("model.onnx")).unwrap();
        let shapes: Vec<Vec<usize>> = graph
            .inputs()
            .iter()
            .map(|&id| {
                let path = model.join(format!("{}.npy", graph.node(id).name));
                kiln::tensor::npy::read(&path)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
                    .shape()
                    .to_vec()
            })
            .collect();
        offenders.extend(fallback_steps(name, &graph, &shapes));
    }
    for o in &offenders {
        println!("{o}");
    }
    assert!(
        offenders.is_empty(),
        "{} steps run on the interpreter:\n{}",
        offenders.len(),
        offenders.join("\n")
    );
}
