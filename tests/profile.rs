//! The `profile` option on the CPU backend: a trace path writes a Chrome trace-event
//! file that a JSON parser reads, with the format's required fields on every event, one
//! complete event per executed step per run, worker shares of parallel loops, and arena
//! counters; a path that cannot be written fails the compile; the table lists every
//! step; off, nothing is recorded.
use crate::common;

use std::collections::BTreeSet;

use kiln::backend::cpu::CpuBackend;
use kiln::backend::Executable;
use kiln::ir::Attrs;
use kiln::passes::CompileOptions;
use kiln::{Graph, Tensor};
use serde_json::Value as Json;

use common::{op, param, weight, Rng};

/// x[64, 256] → MatMul 256×512 → Relu → MatMul 512×128 → Softmax: big enough for the
/// GEMM to split across two threads.
fn mlp() -> Graph {
    let mut rng = Rng(7);
    let mut g = Graph::new("mlp");
    let x = param(&mut g, "x", &[64, 256]);
    let w1 = weight(&mut g, &mut rng, "w1", &[256, 512]);
    let w2 = weight(&mut g, &mut rng, "w2", &[512, 128]);
    let h = op(&mut g, "MatMul", &[x, w1], Attrs::new());
    let h = op(&mut g, "Relu", &[h], Attrs::new());
    let y = op(&mut g, "MatMul", &[h, w2], Attrs::new());
    let y = op(&mut g, "Softmax", &[y], Attrs::new());
    g.add_output("y", y).unwrap();
    g
}

fn compile(g: &Graph, profile: &str, threads: usize) -> kiln::Result<Box<dyn Executable>> {
    let mut options = CompileOptions {
        threads,
        ..Default::default()
    };
    options.set("profile", profile)?;
    let backend = CpuBackend::new(options);
    Ok(Box::new(backend.compile_cpu(g)?))
}

/// The CPU program's steps for the input.
fn steps_of(g: &Graph) -> Vec<kiln::backend::cpu::StepInfo> {
    let backend = CpuBackend::new(CompileOptions {
        threads: 1,
        ..Default::default()
    });
    let exe = backend.compile_cpu(g).unwrap();
    exe.step_report(&[vec![64, 256]]).unwrap()
}

fn input() -> Tensor {
    Rng(3).f32_tensor(&[64, 256], 1.0)
}

#[test]
fn a_trace_has_every_step_of_every_run_with_the_required_fields() {
    let dir = std::env::temp_dir().join(format!("kiln-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("trace.json");
    let g = mlp();
    let exe = compile(&g, path.to_str().unwrap(), 2).unwrap();
    const RUNS: usize = 5;
    let want = exe.run(&[input()]).unwrap();
    for _ in 1..RUNS {
        assert_eq!(exe.run(&[input()]).unwrap(), want);
    }
    let steps = steps_of(&g);
    drop(exe);

    let text = std::fs::read_to_string(&path).unwrap();
    let trace: Json = serde_json::from_str(&text).expect("the trace is JSON");
    let events = trace["traceEvents"]
        .as_array()
        .expect("a traceEvents array");
    for e in events {
        let ph = e["ph"].as_str().expect("every event has ph");
        assert!(e["pid"].is_u64() && e["tid"].is_u64(), "pid and tid: {e}");
        assert!(e["name"].is_string(), "name: {e}");
        match ph {
            "X" => {
                let (ts, dur) = (e["ts"].as_f64(), e["dur"].as_f64());
                assert!(
                    ts.is_some_and(|t| t >= 0.0) && dur.is_some_and(|d| d >= 0.0),
                    "{e}"
                );
                assert!(
                    e["args"]["node"].is_u64() && e["args"]["kernel"].is_string(),
                    "{e}"
                );
            }
            "C" => {
                assert!(e["ts"].is_f64() || e["ts"].is_u64(), "{e}");
                assert!(e["args"]["live bytes"].is_u64(), "{e}");
            }
            "M" => assert!(e["args"]["name"].is_string(), "{e}"),
            other => panic!("unexpected phase {other}: {e}"),
        }
    }
    // The run's steps on the caller's thread: every step of every run, in order.
    let caller_steps: Vec<&Json> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] != "parallel")
        .collect();
    assert_eq!(caller_steps.len(), RUNS * steps.len(), "{text}");
    for (k, e) in caller_steps.iter().enumerate() {
        let want = &steps[k % steps.len()];
        assert_eq!(e["args"]["kernel"], want.kind, "{e}");
        let id = e["args"]["node"].as_u64().unwrap();
        assert!(
            want.node.starts_with(&format!("node #{id} ")),
            "{e} vs {}",
            want.node
        );
    }
    // The GEMMs split across both threads: the worker's shares are on its own row.
    let callers: BTreeSet<u64> = caller_steps
        .iter()
        .map(|e| e["tid"].as_u64().unwrap())
        .collect();
    let shares: Vec<&Json> = events.iter().filter(|e| e["cat"] == "parallel").collect();
    assert!(!shares.is_empty(), "no worker shares in {text}");
    assert!(shares
        .iter()
        .all(|e| !callers.contains(&e["tid"].as_u64().unwrap())));
    let named: BTreeSet<u64> = events
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .map(|e| e["tid"].as_u64().unwrap())
        .collect();
    assert!(
        callers.iter().all(|t| named.contains(t)),
        "every row is named"
    );
    assert!(events.iter().any(|e| e["ph"] == "C"), "arena counters");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_trace_path_that_cannot_be_written_fails_the_compile() {
    let bad = std::env::temp_dir().join("kiln-no-such-dir/deeper/trace.json");
    let err = compile(&mlp(), bad.to_str().unwrap(), 1)
        .err()
        .expect("an error");
    let msg = err.to_string();
    assert!(
        msg.contains("kiln-no-such-dir") && msg.contains("trace"),
        "{msg}"
    );
}

#[test]
fn the_table_lists_each_step_once_and_forgets_what_it_printed() {
    let g = mlp();
    let exe = compile(&g, "table", 1).unwrap();
    for _ in 0..3 {
        exe.run(&[input()]).unwrap();
    }
    let table = exe.take_profile(true).expect("a table");
    let rows: Vec<&str> = table.lines().filter(|l| l.contains("node #")).collect();
    assert_eq!(rows.len(), steps_of(&g).len(), "{table}");
    assert!(
        table.contains("gemm") && table.contains("GFLOP/s"),
        "{table}"
    );
    assert_eq!(exe.take_profile(true), None, "forgotten once taken");
    let off = compile(&g, "", 1).unwrap();
    off.run(&[input()]).unwrap();
    assert_eq!(off.take_profile(true), None, "off records nothing");
}
