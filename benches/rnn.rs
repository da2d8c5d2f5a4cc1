//! The recurrent kernels on one layer: LSTM and GRU at hidden 1,024, batch 64, input
//! 1,024, 16 steps (the throughput case) and a silero-like 128-hidden, batch-1 layer (the
//! latency case), at one and two threads. Prints GFLOP/s of the two GEMMs' work (the
//! gate math is not counted), the share of this machine's FMA peak measured in the same
//! process (times the threads), and onnxruntime's time for the same single-op model
//! (`bench/rnn_ort.py`, when `target/py/bin/python` exists).
//!
//! `cargo bench --bench rnn`
use kiln::internals::cpu::rnn::{Cell, RnnAct, RnnIo, RnnLayer, RnnSpec};
use kiln::internals::cpu::Pool;
use kiln::internals::peak::fma_gflops;
use kiln::internals::AlignedBuf;
use std::process::Command;
use std::time::{Duration, Instant};

fn lcg(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5) * 2.0 * scale
        })
        .collect()
}

/// `values` in one of the crate's buffers.
fn floats(values: &[f32]) -> AlignedBuf {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
    AlignedBuf::try_from_bytes(&bytes).expect("memory for the bench's buffers")
}

/// `n` zeroed floats in one of the crate's buffers.
fn zeros(n: usize) -> AlignedBuf {
    AlignedBuf::try_zeroed(n * 4).expect("memory for the bench's buffers")
}

/// Rounds of (peak probe, layer timing) behind each row.
const ROUNDS: usize = 5;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The median time of `f` over about `budget` (at least 5 calls).
fn median_ms(f: &mut impl FnMut(), budget: Duration) -> f64 {
    f();
    let mut times = vec![];
    let start = Instant::now();
    while times.len() < 5 || (start.elapsed() < budget && times.len() < 500) {
        let t = Instant::now();
        f();
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    median(times)
}

/// The layer's median time and its median share of `threads` × the FMA peak, over
/// `ROUNDS` rounds that each probe the peak and then time the layer: a shared host's
/// clock moves, and within one round it moves both sides of the ratio alike.
fn measure(mut f: impl FnMut(), flops: f64, threads: usize) -> (f64, f64) {
    let (mut times, mut shares) = (vec![], vec![]);
    for _ in 0..ROUNDS {
        let peak = fma_gflops();
        let ms = median_ms(&mut f, Duration::from_millis(300));
        times.push(ms);
        if let Some(p) = peak {
            shares.push(100.0 * flops / ms / 1e6 / (p * threads as f64));
        }
    }
    let share = if shares.is_empty() {
        f64::NAN
    } else {
        median(shares)
    };
    (median(times), share)
}

/// onnxruntime's median milliseconds for the same layer, if python with it is here.
fn ort_ms(
    op: &str,
    seq: usize,
    batch: usize,
    input: usize,
    hidden: usize,
    threads: usize,
) -> Option<f64> {
    let root = env!("CARGO_MANIFEST_DIR");
    let python = format!("{root}/target/py/bin/python");
    let out = Command::new(python)
        .arg(format!("{root}/bench/rnn_ort.py"))
        .args([op, &seq.to_string(), &batch.to_string(), &input.to_string()])
        .args([hidden.to_string(), threads.to_string()])
        .output()
        .ok()?;
    String::from_utf8(out.stdout).ok()?.trim().parse().ok()
}

fn main() {
    // `cargo test --all-targets` runs benches without `--bench`: only check they start.
    if !std::env::args().any(|a| a == "--bench") {
        println!("rnn bench: run it with `cargo bench --bench rnn`");
        return;
    }
    match fma_gflops() {
        Some(p) => println!(
            "FMA peak, one thread (median of 7): {p:.1} GFLOP/s; each row is {ROUNDS} rounds \
             of (peak probe, layer timing): its time is the median of the rounds' times, its \
             share the median of the rounds' shares, as a shared host's clock moves"
        ),
        None => println!("FMA peak: not measurable on this CPU"),
    }
    let pools = [None, Some(Pool::new(2))];
    println!(
        "{:<6} {:>4} {:>6} {:>6} {:>6} {:>3} {:>10} {:>9} {:>7} {:>10} {:>8}",
        "layer",
        "seq",
        "batch",
        "input",
        "hidden",
        "thr",
        "kiln ms",
        "GFLOP/s",
        "% peak",
        "ort ms",
        "kiln/ort"
    );
    for (cell, name) in [(Cell::Lstm, "LSTM"), (Cell::Gru, "GRU")] {
        for (seq, batch, input, hidden) in
            [(16, 64, 1024, 1024), (1, 1, 128, 128), (64, 1, 128, 128)]
        {
            let spec = RnnSpec {
                cell,
                dirs: 1,
                reverse: false,
                seq,
                batch,
                input,
                hidden,
                batch_first: false,
                acts: vec![[RnnAct::Sigmoid, RnnAct::Tanh, RnnAct::Tanh]],
                clip: None,
                linear_before_reset: false,
                input_forget: false,
            };
            let gh = cell.gates() * hidden;
            let scale = 1.0 / (hidden as f32).sqrt();
            let w = lcg(gh * input, 1, scale);
            let r = lcg(gh * hidden, 2, scale);
            let b = lcg(2 * gh, 3, scale);
            // The activations and scratch in the crate's buffers, as a compiled
            // model's arena holds them (huge pages when large).
            let x = floats(&lcg(seq * batch * input, 4, 1.0));
            let mut y = zeros(seq * batch * hidden);
            let mut y_h = vec![0f32; batch * hidden];
            let mut y_c = vec![0f32; batch * hidden];
            let mut scratch = zeros(spec.scratch_floats());
            let flops = 2.0 * spec.macs() as f64;
            // SAFETY: w and r hold W and R of this spec.
            let layer = unsafe { RnnLayer::new(spec, Some(w.as_ptr()), Some(r.as_ptr())) };
            let io = RnnIo {
                x: x.as_ptr() as *const f32,
                w: w.as_ptr(),
                r: r.as_ptr(),
                b: Some(b.as_ptr()),
                lens: None,
                h0: None,
                c0: None,
                p: None,
                y: y.as_mut_ptr() as *mut f32,
                y_h: y_h.as_mut_ptr(),
                y_c: Some(y_c.as_mut_ptr()),
            };
            for (threads, pool) in [1, 2].into_iter().zip(&pools) {
                let sp = scratch.as_mut_ptr() as *mut f32;
                // SAFETY: every buffer holds what the spec says; scratch its floats.
                let run = || unsafe { layer.run(pool.as_ref(), &io, sp).expect("valid lengths") };
                let (ms, pct) = measure(run, flops, threads);
                let gflops = flops / ms / 1e6;
                let ort = ort_ms(name, seq, batch, input, hidden, threads);
                println!(
                    "{name:<6} {seq:>4} {batch:>6} {input:>6} {hidden:>6} {threads:>3} {ms:>10.4} {gflops:>9.1} {pct:>6.1}% {:>10} {:>8}",
                    ort.map_or("-".into(), |o| format!("{o:.4}")),
                    ort.map_or("-".into(), |o| format!("{:.2}", ms / o)),
                );
            }
        }
    }
}
