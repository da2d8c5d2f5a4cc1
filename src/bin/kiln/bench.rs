//! `kiln bench`: latency of one model on one backend, warm-up excluded.
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kiln::backend::flops::graph_flops;
use kiln::backend::{backend_with, Device};
use kiln::passes::{CompileOptions, Profiling};
use kiln::{DType, Result, Tensor};

use crate::compile::bindings;
use crate::{emit, load, read_inputs};

pub struct Request<'a> {
    pub file: &'a Path,
    pub shapes: &'a [String],
    pub inputs: &'a [PathBuf],
    pub backend: &'a str,
    pub options: CompileOptions,
    pub warmup: usize,
    /// 0: as many as fit in `seconds` (at least 10).
    pub iterations: usize,
    pub seconds: f64,
    pub json: bool,
    /// Print the per-step profile table of the timed runs.
    pub profile: bool,
    /// Write a Chrome trace of every run here.
    pub trace: Option<&'a Path>,
}

pub(crate) fn run(req: &Request) -> Result<()> {
    let mut g = load(req.file)?;
    let mut given = bindings(req.shapes)?;
    let inputs = if req.inputs.is_empty() {
        for s in g.specialize(&given)? {
            eprintln!("kiln: symbolic dim {s} was not given (--shape {s}=SIZE): 1 assumed");
            given.insert(s, 1);
        }
        g.specialize(&given)?;
        random_inputs(&g)?
    } else {
        let t = read_inputs(&g, req.inputs, &[])?;
        let shapes: Vec<Vec<usize>> = t.iter().map(|t| t.shape().to_vec()).collect();
        for (&id, shape) in g.inputs().iter().zip(&shapes) {
            for (axis, &n) in g.node(id).outputs[0].shape.axes.iter().zip(shape) {
                if let kiln::ir::Dim::Sym(s) = &axis.dim {
                    given.insert(s.clone(), n);
                }
            }
        }
        g.specialize(&given)?;
        t
    };
    let device: Device = req.backend.parse()?;
    let t0 = Instant::now();
    let mut options = req.options.clone();
    if let Some(path) = req.trace {
        options.profile = Profiling::Trace(path.to_path_buf());
    } else if req.profile {
        options.profile = Profiling::Collect;
    }
    let exe = backend_with(device, options)?.compile(&g)?;
    exe.run(&inputs)?;
    let compile = t0.elapsed();
    for _ in 0..req.warmup {
        exe.run(&inputs)?;
    }
    // The table counts the timed runs only.
    exe.restart_profile();
    let mut times = vec![];
    let start = Instant::now();
    loop {
        let t = Instant::now();
        exe.run(&inputs)?;
        times.push(t.elapsed());
        let n = times.len();
        let done = if req.iterations > 0 {
            n >= req.iterations
        } else {
            n >= 10 && start.elapsed().as_secs_f64() >= req.seconds
        };
        if done {
            break;
        }
    }
    // Without --profile, a `KILN_PROFILE=1` table is left to print at drop.
    let table = req.profile.then(|| exe.take_profile(true)).flatten();
    drop(exe);
    times.sort();
    let pct = |p: f64| ms(times[((times.len() - 1) as f64 * p).round() as usize]);
    let median = pct(0.5);
    let gflops = graph_flops(&g) / (median * 1e-3) / 1e9;
    let mut out = String::new();
    if req.json {
        writeln!(
            out,
            "{{\"model\": {:?}, \"backend\": {:?}, \"threads\": {}, \"median_ms\": {:.4}, \
             \"p10_ms\": {:.4}, \"p90_ms\": {:.4}, \"iterations\": {}, \"gflops\": {:.2}, \
             \"first_run_ms\": {:.1}}}",
            req.file.display().to_string(),
            req.backend,
            req.options.threads,
            median,
            pct(0.1),
            pct(0.9),
            times.len(),
            gflops,
            ms(compile)
        )
        .ok();
    } else {
        writeln!(
            out,
            "{}: {} thread(s) on {}\n  median {:.3} ms  p10 {:.3} ms  p90 {:.3} ms  \
             ({} iterations, {} warm-up)\n  {:.1} GFLOP/s  (compile + first run {:.1} ms)",
            req.file.display(),
            if req.options.threads == 0 {
                "all".to_string()
            } else {
                req.options.threads.to_string()
            },
            req.backend,
            median,
            pct(0.1),
            pct(0.9),
            times.len(),
            req.warmup,
            gflops,
            ms(compile)
        )
        .ok();
    }
    if req.profile {
        let table =
            table.unwrap_or_else(|| format!("(the {} backend does not profile)\n", req.backend));
        if req.json {
            eprint!("{table}");
        } else {
            out.push_str(&table);
        }
    }
    if let Some(path) = req.trace {
        writeln!(out, "wrote {}", path.display()).ok();
    }
    emit(&out)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Inputs of the specialized graph's types: floats uniform in [-1, 1), integers in
/// [0, 16) (valid ids for embedding lookups), from a fixed seed.
fn random_inputs(g: &kiln::Graph) -> Result<Vec<Tensor>> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    g.inputs()
        .iter()
        .map(|&id| {
            let ty = &g.node(id).outputs[0];
            let shape = ty.static_dims().expect("specialized");
            let n: usize = shape.iter().product();
            let values: Vec<f64> = if ty.dtype.is_float() {
                (0..n).map(|_| next() * 2.0 - 1.0).collect()
            } else if ty.dtype == DType::Bool {
                (0..n).map(|_| (next() < 0.5) as u8 as f64).collect()
            } else {
                (0..n).map(|_| (next() * 16.0).floor()).collect()
            };
            Tensor::from_f64s(ty.dtype, &shape, &values).map_err(kiln::Error::InvalidArgument)
        })
        .collect()
}
