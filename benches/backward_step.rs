//! Forward + backward of issue 7's training graphs on the CPU backend (no optimizer:
//! the gradients are outputs): the MLP 784-512-512-10 and the small CNN at batch 64.
//! Prints each graph's steps that run on the generic fallback, then the median time of
//! repeated runs on 1 and 2 threads. `KILN_PROFILE=1` adds the time per kernel kind.
//!
//! `cargo bench --bench backward_step [-- mlp|cnn] [-- --runs N]`
#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use kiln::backend::cpu::{Compiled, CpuBackend};
use kiln::backend::Executable;
use kiln::passes::CompileOptions;

/// A training graph at a batch size.
type MakeGraph = fn(usize) -> common::train_graphs::TrainGraph;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `cargo test --all-targets` runs bench mains without `--bench`: timing belongs to
    // `cargo bench` (tests/cpu_backward.rs checks these graphs).
    if !args.iter().any(|a| a == "--bench") {
        println!("backward_step: a benchmark; run it with `cargo bench --bench backward_step`");
        return;
    }
    let runs = args
        .iter()
        .position(|a| a == "--runs")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(30usize);
    let cases: [(&str, MakeGraph); 2] = [
        ("mlp", common::train_graphs::mlp),
        ("cnn", common::train_graphs::cnn),
    ];
    let wanted: Vec<&String> = args
        .iter()
        .filter(|a| !a.starts_with("--") && a.parse::<usize>().is_err())
        .collect();
    for (name, make) in cases {
        if !wanted.is_empty() && !wanted.iter().any(|w| w.as_str() == name) {
            continue;
        }
        let t = make(64);
        for threads in [1, 2] {
            let backend = CpuBackend::new(CompileOptions {
                threads,
                ..Default::default()
            });
            let exe = backend.compile_cpu(&t.g).expect("compiles");
            if threads == 1 {
                let shapes: Vec<Vec<usize>> = t.inputs.iter().map(|t| t.shape().to_vec()).collect();
                if let Compiled::Program(p) = &*exe.program(&shapes).expect("lowers") {
                    let fallbacks: Vec<String> = p
                        .steps
                        .iter()
                        .filter(|s| s.kernel.kind() == "fallback")
                        .map(|s| s.node.to_string())
                        .collect();
                    println!(
                        "{name}: {} steps, {} fallback",
                        p.steps.len(),
                        fallbacks.len()
                    );
                    for f in fallbacks {
                        println!("  fallback: {f}");
                    }
                }
            }
            for _ in 0..3 {
                exe.run(&t.inputs).expect("runs");
            }
            let mut times: Vec<f64> = (0..runs)
                .map(|_| {
                    let t0 = Instant::now();
                    exe.run(&t.inputs).expect("runs");
                    t0.elapsed().as_secs_f64() * 1e3
                })
                .collect();
            times.sort_by(f64::total_cmp);
            println!(
                "{name} batch 64, {threads} thread(s): median {:.3} ms (min {:.3}, {runs} runs)",
                times[runs / 2],
                times[0]
            );
        }
    }
}
