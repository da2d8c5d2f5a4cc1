//! A compiled `Loop` against the same computation unrolled into a flat graph, both on
//! the CPU backend: 1,000 iterations of `h ← tanh(h·W + b)` (h f32[1, width]), runs of
//! the two alternating; prints each one's median time and the ratio loop / unrolled.
//!
//! `cargo bench --bench control_flow [-- --runs N] [-- --width W]`
#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use kiln::backend::cpu::CpuBackend;
use kiln::backend::Executable;
use kiln::passes::CompileOptions;

use common::control_graphs::{recurrence_inputs, recurrence_loop, recurrence_unrolled};

const ITERATIONS: i64 = 1000;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `cargo test --all-targets` runs bench mains without `--bench`.
    if !args.iter().any(|a| a == "--bench") {
        println!("control_flow: a benchmark; run it with `cargo bench --bench control_flow`");
        return;
    }
    let flag = |name: &str, default: usize| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let runs = flag("--runs", 21);
    let width = flag("--width", 16);
    let backend = CpuBackend::new(CompileOptions {
        threads: 1,
        ..Default::default()
    });
    let inputs = recurrence_inputs(width, 1);
    let t0 = Instant::now();
    let looped = backend
        .compile_cpu(&recurrence_loop(ITERATIONS, width, false))
        .expect("the loop compiles");
    let loop_compile = t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    let unrolled = backend
        .compile_cpu(&recurrence_unrolled(ITERATIONS, width))
        .expect("the unrolled graph compiles");
    let unrolled_compile = t0.elapsed().as_secs_f64();
    let a = looped.run(&inputs).expect("runs");
    let b = unrolled.run(&inputs).expect("runs");
    a[0].check_close(&b[0], 1e-5, 1e-4)
        .expect("the same result");
    for _ in 0..3 {
        looped.run(&inputs).expect("runs");
        unrolled.run(&inputs).expect("runs");
    }
    let time = |exe: &dyn Executable| {
        let t = Instant::now();
        exe.run(&inputs).expect("runs");
        t.elapsed().as_secs_f64() * 1e6
    };
    let (mut tl, mut tu) = (vec![], vec![]);
    for _ in 0..runs {
        tl.push(time(&looped));
        tu.push(time(&unrolled));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (ml, mu) = (median(&mut tl), median(&mut tu));
    println!(
        "{ITERATIONS} iterations, width {width}, 1 thread, {runs} alternating runs:\n  \
         loop     median {ml:9.1} µs (compile {:.1} ms)\n  \
         unrolled median {mu:9.1} µs (compile {:.1} ms)\n  \
         loop / unrolled = {:.2}",
        loop_compile * 1e3,
        unrolled_compile * 1e3,
        ml / mu
    );
}
