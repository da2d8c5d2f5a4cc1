//! What profiling costs: one model (ResNet-50 by default) compiled on the CPU backend
//! with the profile off, with the per-step table and with a Chrome trace written to a
//! temp file (several executables of each), then rounds of runs of all of them,
//! alternating; prints each mode's median time per run and its ratio to off, measured
//! side by side in this one process, and the noise floor.
//!
//! `cargo bench --bench profile_overhead [-- --model PATH] [-- --threads T] [-- --rounds R]
//! [-- --runs N] [-- --copies C] [-- --size S]` (the model's dims N=1, H=W=S, default 224).
#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::time::Instant;

use kiln::backend::cpu::CpuBackend;
use kiln::backend::Executable;
use kiln::frontend::onnx;
use kiln::passes::CompileOptions;

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
    let rounds = count("--rounds", 11);
    let runs = count("--runs", 3);
    let copies = count("--copies", 3);
    let size = count("--size", 224);

    let mut g = onnx::import_file(&model).unwrap_or_else(|e| panic!("{}: {e}", model.display()));
    let dims: HashMap<String, usize> = [("N", 1), ("H", size), ("W", size)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    g.specialize(&dims).unwrap();
    let mut rng = common::Rng(11);
    let inputs = common::random_inputs(&g, &mut rng, 1, 1.0);
    let dir = std::env::temp_dir().join(format!("kiln-profile-overhead-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Two executables that differ in nothing still run apart by several percent (where
    // their weights and arenas landed): so each mode has `copies` executables, compiled
    // interleaved, and a mode's figure is the median over all of its copies' runs; the
    // spread of the off copies' own medians is printed as the noise floor.
    let modes = ["off", "table", "trace"];
    let mut exes: Vec<(usize, Box<dyn Executable>)> = vec![];
    for copy in 0..copies {
        for (m, mode) in modes.iter().enumerate() {
            let profile = match *mode {
                "trace" => dir.join(format!("trace-{copy}.json")).display().to_string(),
                "off" => String::new(),
                other => other.to_string(),
            };
            let mut options = CompileOptions {
                threads,
                ..Default::default()
            };
            options.set("profile", &profile).unwrap();
            let backend = CpuBackend::new(options);
            let exe = backend.compile_cpu(&g).unwrap();
            exe.run(&inputs).unwrap();
            exes.push((m, Box::new(exe)));
        }
    }
    let mut times: Vec<Vec<f64>> = vec![vec![]; exes.len()];
    for round in 0..rounds {
        // Alternate the order too, so no executable always runs right after another.
        let order: Vec<usize> = if round % 2 == 0 {
            (0..exes.len()).collect()
        } else {
            (0..exes.len()).rev().collect()
        };
        for k in order {
            for _ in 0..runs {
                let t = Instant::now();
                exes[k].1.run(&inputs).unwrap();
                times[k].push(t.elapsed().as_secs_f64());
            }
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let of_mode = |m: usize| exes.iter().zip(&times).filter(move |((k, _), _)| *k == m);
    let medians: Vec<f64> = (0..modes.len())
        .map(|m| median(of_mode(m).flat_map(|(_, t)| t.clone()).collect()))
        .collect();
    let off_copies: Vec<f64> = of_mode(0).map(|(_, t)| median(t.clone())).collect();
    let spread = off_copies.iter().cloned().fold(f64::MIN, f64::max)
        / off_copies.iter().cloned().fold(f64::MAX, f64::min);
    println!(
        "{}: {threads} thread(s), {copies} executables per mode, {rounds} rounds of {runs} \
         runs each, alternating",
        model.display()
    );
    for (name, m) in modes.iter().zip(&medians) {
        println!(
            "  profile {name:<6} median {:8.3} ms/run   {:.3}× off",
            m * 1e3,
            m / medians[0]
        );
    }
    println!("  noise floor: the off executables' medians differ by up to {spread:.3}×");
    // Forgotten, the table mode's sums are not printed at drop.
    exes.iter().for_each(|(_, e)| e.restart_profile());
    drop(exes);
    let bytes = std::fs::metadata(dir.join("trace-0.json")).map_or(0, |m| m.len());
    println!("  trace: {bytes} bytes per executable");
    std::fs::remove_dir_all(&dir).ok();
}
