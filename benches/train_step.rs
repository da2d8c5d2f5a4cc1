//! Kiln's side of the training-step comparison with JAX (issue 7): the MLP 784-512-512-10
//! or the small CNN, mean softmax cross-entropy, Adam, f32, built through the Rust API
//! (`tests/common/train_models.rs`) and compiled once; then steps are timed one by one.
//!
//! `cargo bench --bench train_step -- [--model mlp|cnn] [--batch 64] [--threads N]
//!     [--device cpu|interp] [--data DIR] [--steps N] [--serve]`
//!
//! `--data DIR` reads the initial weights (`DIR/<weight>.npy`, names as in
//! `weight_shapes`) and the batch (`DIR/x.npy`, `DIR/labels.npy`, i64), so that Kiln and
//! JAX start identically; without it, fixed pseudo-random ones. Prints one JSON object:
//! compile time, whether the kernels or the interpreter run the step, the step's memory
//! plan, and per-step times and losses.
//!
//! `--serve` is for `bench/train_compare.py`: after the JSON header line, each stdin
//! line `steps N` resets the weights and Adam's state to their initial values (untimed),
//! runs N steps and answers one JSON line with the N step times (ms) and the N losses;
//! `quit` or end of input ends. Process start and compilation stay out of every timing.
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::Instant;

use kiln::backend::cpu::{Compiled, CpuBackend};
use kiln::backend::{backend_with, Device, Executable};
use kiln::memory::MemoryPlan;
use kiln::passes::{run_pipeline, CompileOptions};
use kiln::tensor::npy;
use kiln::{Error, Graph, Result, Tensor};

#[path = "../tests/common/train_models.rs"]
mod train_models;

use train_models::{default_batch, default_weights, train_step, weight_shapes, Model};

struct Args {
    model: Model,
    batch: usize,
    threads: usize,
    device: Device,
    data: Option<PathBuf>,
    steps: usize,
    lr: f32,
    serve: bool,
}

fn usage(msg: &str) -> Error {
    Error::InvalidArgument(format!(
        "{msg}\nusage: train_step [--model mlp|cnn] [--batch N] [--threads N] \
         [--device cpu|interp] [--data DIR] [--steps N] [--lr F] [--serve]"
    ))
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        model: Model::Mlp,
        batch: 64,
        threads: 1,
        device: Device::Cpu,
        data: None,
        steps: 5,
        lr: 1e-3,
        serve: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        // `cargo bench` passes `--bench` to every bench binary.
        if flag == "--bench" {
            continue;
        }
        if flag == "--serve" {
            args.serve = true;
            continue;
        }
        let value = it
            .next()
            .ok_or_else(|| usage(&format!("{flag} needs a value")))?;
        let number = |v: &str| {
            v.parse::<usize>()
                .map_err(|_| usage(&format!("{flag}: '{v}' is not a count")))
        };
        match flag.as_str() {
            "--model" => {
                args.model = Model::parse(&value)
                    .ok_or_else(|| usage(&format!("--model: unknown model '{value}'")))?
            }
            "--batch" => args.batch = number(&value)?,
            "--threads" => args.threads = number(&value)?,
            "--device" => args.device = value.parse()?,
            "--data" => args.data = Some(PathBuf::from(value)),
            "--steps" => args.steps = number(&value)?,
            "--lr" => {
                args.lr = value
                    .parse()
                    .map_err(|_| usage(&format!("--lr: '{value}' is not a number")))?
            }
            _ => return Err(usage(&format!("unknown option '{flag}'"))),
        }
    }
    Ok(args)
}

/// The initial weights and the batch, from `.npy` files or the built-in defaults.
fn load(args: &Args) -> Result<(Vec<Tensor>, Tensor, Tensor)> {
    let Some(dir) = &args.data else {
        let (x, labels) = default_batch(args.model, args.batch);
        return Ok((default_weights(args.model), x, labels));
    };
    let read = |name: &str| npy::read(&dir.join(format!("{name}.npy")));
    let weights = weight_shapes(args.model)
        .iter()
        .map(|(name, _)| read(name))
        .collect::<Result<Vec<_>>>()?;
    let (x, labels) = (read("x")?, read("labels")?);
    if x.shape().first() != Some(&args.batch) {
        return Err(Error::InvalidArgument(format!(
            "{}: x has shape {:?}, the batch is {}",
            dir.display(),
            x.shape(),
            args.batch
        )));
    }
    Ok((weights, x, labels))
}

/// A memory plan's numbers as JSON.
fn plan_json(p: &MemoryPlan) -> String {
    format!(
        "{{\"planned_bytes\": {}, \"lower_bound_bytes\": {}, \"naive_bytes\": {}, \
         \"lower_bound_without_inplace_bytes\": {}, \"ratio\": {:.4}, \"strategy\": \"{}\"}}",
        p.planned_bytes,
        p.lower_bound_bytes,
        p.naive_bytes,
        p.lower_bound_without_inplace_bytes,
        p.planned_bytes as f64 / p.lower_bound_bytes.max(1) as f64,
        p.strategy
    )
}

/// The JSON string literal of `s`.
fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A number printed exactly (shortest round trip); NaN and infinities, which JSON
/// lacks, as null.
fn json_number(x: f64) -> String {
    if x.is_finite() {
        format!("{x}")
    } else {
        "null".into()
    }
}

/// A JSON list of numbers.
fn json_list(v: &[f64]) -> String {
    let items: Vec<String> = v.iter().map(|&x| json_number(x)).collect();
    format!("[{}]", items.join(", "))
}

/// The step compiled for `device`, with what runs it ("kernels" or "interpreter") and
/// the lowered program's memory plan as JSON (or why there is none).
fn compile(g: &Graph, args: &Args, shapes: &[Vec<usize>]) -> Result<(Box<dyn Executable>, String)> {
    if args.device != Device::Cpu {
        let exe = backend_with(
            args.device,
            CompileOptions {
                threads: args.threads,
                ..Default::default()
            },
        )?
        .compile(g)?;
        let why = json_string("the interpreter has no memory plan");
        return Ok((
            exe,
            format!("\"executor\": \"interpreter\", \"memory\": null, \"memory_note\": {why}"),
        ));
    }
    // The concrete CPU executable, whose program has the memory plan; graphs it does not
    // lower yet (state) run as `backend.compile` would run them.
    let backend = CpuBackend::new(CompileOptions {
        threads: args.threads,
        ..CompileOptions::from_env()?
    });
    match backend.compile_cpu(g) {
        Ok(exe) => {
            let (executor, memory) = match &*exe.program(shapes)? {
                Compiled::Program(p) => ("kernels", plan_json(&p.memory)),
                Compiled::Split(_) => ("kernels with a dynamic tail", "null".to_string()),
                Compiled::ByValue(_) => ("kernels per input value", "null".to_string()),
                Compiled::Host(_) => ("a host program", "null".to_string()),
                Compiled::Interp(_) => ("interpreter", "null".to_string()),
            };
            Ok((
                Box::new(exe),
                format!("\"executor\": \"{executor}\", \"memory\": {memory}"),
            ))
        }
        Err(e) => {
            use kiln::backend::Backend;
            let exe = backend.compile(g)?;
            // What the planner makes of the optimized step, as lowering would plan it:
            // a preview until the backend lowers graphs with state.
            let mut opt = g.clone();
            run_pipeline(&mut opt, &backend.options)?;
            let preview = kiln::memory::plan(&opt, &opt.schedule()?)?;
            Ok((
                exe,
                format!(
                    "\"executor\": \"interpreter\", \"memory\": null, \"memory_note\": {}, \
                     \"memory_preview\": {}",
                    json_string(&format!("not lowered: {e}")),
                    plan_json(&preview)
                ),
            ))
        }
    }
}

/// Runs `n` steps; their times (ms) and losses.
fn run_steps(exe: &dyn Executable, inputs: &[Tensor], n: usize) -> Result<(Vec<f64>, Vec<f64>)> {
    let mut times = Vec::with_capacity(n);
    let mut losses = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let out = exe.run(inputs)?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
        let loss = out
            .first()
            .map(|l| l.to_f64_vec())
            .and_then(|v| v.first().copied())
            .ok_or_else(|| Error::Runtime("the step returned no loss".into()))?;
        losses.push(loss);
    }
    Ok((times, losses))
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

fn main_result() -> Result<()> {
    let args = parse_args()?;
    let (weights, x, labels) = load(&args)?;
    let g = train_step(args.model, args.batch, &weights)?;
    let inputs = [x, labels, Tensor::scalar(args.lr)];
    let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
    let t = Instant::now();
    let (exe, about) = compile(&g, &args, &shapes)?;
    let compile_ms = t.elapsed().as_secs_f64() * 1e3;
    // Every variable's start (the weights and Adam's zeroed state), to reset rounds to.
    let initial: Vec<(String, Tensor)> = exe
        .variables()
        .into_iter()
        .map(|(name, _)| Ok((name.clone(), exe.read_variable(&name)?)))
        .collect::<Result<_>>()?;
    let reset = || {
        let values: Vec<(&str, &Tensor)> = initial.iter().map(|(n, t)| (n.as_str(), t)).collect();
        exe.write_variables(&values)
    };
    let header = format!(
        "\"model\": \"{}\", \"batch\": {}, \"threads\": {}, \"device\": \"{}\", \
         \"compile_ms\": {compile_ms:.3}, \"variables\": {}, {about}",
        args.model.name(),
        args.batch,
        args.threads,
        args.device,
        initial.len()
    );
    let stdout = std::io::stdout();
    if !args.serve {
        let (times, losses) = run_steps(exe.as_ref(), &inputs, args.steps)?;
        println!(
            "{{{header}, \"times_ms\": {}, \"median_ms\": {}, \"losses\": {}}}",
            json_list(&times),
            json_number(median(&times)),
            json_list(&losses)
        );
        return Ok(());
    }
    writeln!(stdout.lock(), "{{{header}}}").map_err(|e| Error::Runtime(e.to_string()))?;
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|e| Error::Runtime(format!("stdin: {e}")))?;
        let words: Vec<&str> = line.split_whitespace().collect();
        let reply = match words.as_slice() {
            [] => continue,
            ["quit"] => break,
            ["steps", n] => {
                let n: usize = n
                    .parse()
                    .map_err(|_| Error::InvalidArgument(format!("steps: '{n}' is not a count")))?;
                reset()?;
                let (times, losses) = run_steps(exe.as_ref(), &inputs, n)?;
                format!(
                    "{{\"times_ms\": {}, \"losses\": {}}}",
                    json_list(&times),
                    json_list(&losses)
                )
            }
            _ => format!(
                "{{\"error\": {}}}",
                json_string(&format!("unknown command '{line}' (steps N | quit)"))
            ),
        };
        let mut out = stdout.lock();
        writeln!(out, "{reply}")
            .and_then(|()| out.flush())
            .map_err(|e| Error::Runtime(e.to_string()))?;
    }
    Ok(())
}

fn main() {
    // `cargo test --all-targets` runs bench mains with no arguments; `cargo bench` passes
    // `--bench` and bench/train_compare its options: only those time anything.
    if std::env::args().len() == 1 {
        println!("train_step: a benchmark; see bench/train_compare or `cargo bench --bench train_step -- --help`");
        return;
    }
    if let Err(e) = main_result() {
        eprintln!("train_step: {e}");
        std::process::exit(1);
    }
}
