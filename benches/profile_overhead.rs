//! What profiling costs: one model (ResNet-50 by default) compiled three times on the
//! CPU backend — profile off, the per-step table, and a Chrome trace written to a temp
//! file — then rounds of runs of the three, alternating; prints each one's median time
//! per run and the ratios to off, measured side by side in this one process.
//!
//! `cargo bench --bench profile_overhead [-- --model PATH] [-- --threads T] [-- --rounds R]
//! [-- --runs N] [-- --size S]` (the model's symbolic dims N=1, H=W=S, default 224).
#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::time::Instant;

use kiln::backend::cpu::CpuBackend;
use kiln::backend::{cpu_pass_options, Executable};
use kiln::frontend::onnx;
use kiln::passes::PassOptions;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `cargo test --all-targets` runs bench mains without `--bench`.
    if !args.iter().any(|a| a == "--bench") {
        println!(
            "profile_overhead: a benchmark; run it with `cargo bench --bench profile_overhead`"
        );
        return;
    }
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
    };
    let count =
        |name: &str, default: usize| flag(name).and_then(|v| v.parse().ok()).unwrap_or(default);
    let model = flag("--model").map_or_else(
        || common::root().join("target/real-models/resnet50/model.onnx"),
        std::path::PathBuf::from,
    );
    let threads = count("--threads", 1);
    let rounds = count("--rounds", 7);
    let runs = count("--runs", 5);
    let size = count("--size", 224);

    let mut g = onnx::import_file(&model).unwrap_or_else(|e| panic!("{}: {e}", model.display()));
    let dims: HashMap<String, usize> = [("N", 1), ("H", size), ("W", size)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    g.specialize(&dims).unwrap();
    let mut rng = common::Rng(11);
    let inputs = common::random_inputs(&g, &mut rng, 1, 1.0);
    let trace =
        std::env::temp_dir().join(format!("kiln-profile-overhead-{}.json", std::process::id()));
    // A second executable with profiling off, compiled last, is the control: how much
    // two identical executables differ (their weights' and arenas' placement).
    let modes = [
        ("off", String::new()),
        ("table", "table".to_string()),
        ("trace", trace.display().to_string()),
        ("off", String::new()),
    ];
    let exes: Vec<Box<dyn Executable>> = modes
        .iter()
        .map(|(_, profile)| {
            let mut passes = cpu_pass_options(PassOptions::default());
            passes.set("profile", profile).unwrap();
            let backend = CpuBackend {
                passes,
                threads,
                tuning: Default::default(),
            };
            let exe = backend.compile_cpu(&g).unwrap();
            exe.run(&inputs).unwrap();
            Box::new(exe) as Box<dyn Executable>
        })
        .collect();
    let mut times: Vec<Vec<f64>> = vec![vec![]; modes.len()];
    for round in 0..rounds {
        // Alternate the order too, so no mode always runs right after another.
        let order: Vec<usize> = if round % 2 == 0 {
            vec![0, 1, 2, 3]
        } else {
            vec![3, 2, 1, 0]
        };
        for k in order {
            for _ in 0..runs {
                let t = Instant::now();
                exes[k].run(&inputs).unwrap();
                times[k].push(t.elapsed().as_secs_f64());
            }
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let medians: Vec<f64> = times.iter_mut().map(median).collect();
    println!(
        "{}: {threads} thread(s), {rounds} rounds of {runs} runs each, alternating",
        model.display()
    );
    for ((name, _), m) in modes.iter().zip(&medians) {
        println!(
            "  profile {name:<6} median {:8.3} ms/run   {:.3}× off",
            m * 1e3,
            m / medians[0]
        );
    }
    // Forgotten, the table mode's sums are not printed at drop.
    exes.iter().for_each(|e| e.restart_profile());
    drop(exes);
    let bytes = std::fs::metadata(&trace).map_or(0, |m| m.len());
    println!("  trace: {bytes} bytes written to {}", trace.display());
    std::fs::remove_file(&trace).ok();
}
