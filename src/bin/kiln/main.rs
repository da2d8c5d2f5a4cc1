//! The `kiln` command-line tool: list the op catalogue, check, print and run `.kir`
//! graphs, and inspect `.npy` files.
//!
//! Exit status: 0 on success, 1 when Kiln reports an error (printed to stderr as
//! `kiln: <message>`), 2 for a command line clap rejects.
use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use kiln::backend::{backend_with, Backend};
use kiln::frontend::onnx;
use kiln::ir::{ops, text};
use kiln::passes::{self, CompileOptions};
use kiln::tensor::npy;

mod bench;
mod compile;
mod timeline;
mod viz;
use kiln::{DType, Error, Graph, Result, Tensor};

#[derive(Parser)]
#[command(
    name = "kiln",
    version,
    about = "Kiln: a deep-learning graph compiler and runtime"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the op catalogue, one op a line with its inputs, outputs and attributes.
    Ops {
        /// Only the ops of this family (elementwise, reduce, matmul, conv, ...).
        #[arg(long)]
        family: Option<String>,
        /// Also print each op's documentation.
        #[arg(short, long)]
        verbose: bool,
    },
    /// Parse (or import) and verify a .kir or .onnx graph; print a summary or the errors.
    Check { file: PathBuf },
    /// Print a .kir or .onnx graph as canonical .kir text.
    Print { file: PathBuf },
    /// Inputs, outputs, op histogram and parameter count of a .kir or .onnx graph.
    Info { file: PathBuf },
    /// Run a .kir or .onnx graph on .npy inputs; write each output as DIR/<output name>.npy.
    ///
    /// A string tensor is a .npy of a NumPy unicode dtype (`<U..`). A sequence is a folder
    /// holding 0.npy, 1.npy, … (folders 0/, 1/, … for a sequence of sequences), given as
    /// `--input NAME=DIR` and written as DIR/<output name>/. An optional is its value;
    /// an absent optional input is `--input NAME=` (an empty path), and an absent
    /// optional output writes nothing.
    Run {
        file: PathBuf,
        /// Input files (or sequence folders) in graph-input order.
        #[arg(long, num_args = 1..)]
        inputs: Vec<PathBuf>,
        /// An input by name: `--input x=x.npy`, `--input seq=seq_dir`, `--input opt=`
        /// (absent) (repeatable; not mixed with --inputs).
        #[arg(long = "input", value_name = "NAME=PATH")]
        named: Vec<String>,
        /// Where to write the outputs (created if missing).
        #[arg(long)]
        outputs: Option<PathBuf>,
        /// cpu (the optimizing backend), interp (the reference interpreter, to check
        /// against) or cuda:N.
        #[arg(long, default_value = "cpu")]
        backend: String,
        /// Print each output.
        #[arg(long)]
        print: bool,
        /// With --print, print every element rather than a summary.
        #[arg(long)]
        full: bool,
        /// A compile option, as `KILN_<KEY>` and the C API's
        /// `kiln_compile_options_set_option` take it: `--option threads=1`,
        /// `--option autotune=1` (repeatable; after the environment and the other flags).
        #[arg(long = "option", value_name = "KEY=VALUE")]
        options: Vec<String>,
    },
    /// Optimize a .kir or .onnx graph through the pass pipeline and plan its memory.
    Compile {
        file: PathBuf,
        /// The pipeline: comma-separated pass names (see `kiln passes`).
        #[arg(long)]
        passes: Option<String>,
        /// Print the IR: before-all, after-all, after=p1,p2 or changed.
        #[arg(long, value_name = "SPEC")]
        dump_ir: Option<String>,
        /// Write each dump to DIR/NNN-<when>-<pass>.kir instead of stderr.
        #[arg(long, value_name = "DIR")]
        dump_ir_dir: Option<PathBuf>,
        /// Print each pass's time and rewrites.
        #[arg(long)]
        pass_timing: bool,
        /// Passes to skip: a,b.
        #[arg(long, value_name = "LIST")]
        disable_passes: Option<String>,
        /// Apply only the first N rewrites (to bisect a miscompile).
        #[arg(long, value_name = "N")]
        rewrite_limit: Option<usize>,
        /// plain or nchw<block>c; the cpu backend's choice (nchw16c) by default.
        #[arg(long)]
        layout: Option<String>,
        /// Give a symbolic input dim a size: `--shape N=1` (repeatable; others default to 1).
        #[arg(long = "shape", value_name = "SYM=SIZE")]
        shapes: Vec<String>,
        /// Write the memory plan's report (JSON) here.
        #[arg(long, value_name = "FILE.json")]
        memory_report: Option<PathBuf>,
        /// Write a chart of live memory per step (SVG) here.
        #[arg(long, value_name = "FILE.svg")]
        memory_chart: Option<PathBuf>,
        /// Draw the cpu program's execution plan here (HTML; SVG for a .svg path):
        /// each tensor at its arena offset over the steps that hold it.
        #[arg(long, value_name = "FILE.html")]
        plan_view: Option<PathBuf>,
        /// With --plan-view: run the model this many times on zero inputs (after one
        /// warm-up, on every core) and show each step's measured time.
        #[arg(long, value_name = "N", default_value_t = 0)]
        plan_view_runs: usize,
        /// Write the optimized graph as .kir text here.
        #[arg(short, long, value_name = "FILE.kir")]
        output: Option<PathBuf>,
        /// Compile this many times and report the median time of each phase.
        #[arg(long, default_value_t = 1)]
        repeat: usize,
        /// Also lower for the cpu backend and list each step's kernel (control-flow
        /// bodies indented); steps that run the reference interpreter are marked.
        #[arg(long)]
        report: bool,
        /// A compile option, as `KILN_<KEY>` and the C API's
        /// `kiln_compile_options_set_option` take it: `--option threads=1`,
        /// `--option autotune=1` (repeatable; after the environment and the other flags).
        #[arg(long = "option", value_name = "KEY=VALUE")]
        options: Vec<String>,
    },
    /// Time a .kir or .onnx graph: median/p10/p90 latency and GFLOP/s, warm-up excluded.
    Bench {
        file: PathBuf,
        /// Give a symbolic input dim a size: `--shape N=1` (repeatable; others default to 1).
        #[arg(long = "shape", value_name = "SYM=SIZE")]
        shapes: Vec<String>,
        /// Input .npy files in graph-input order (default: random inputs of the shapes).
        #[arg(long, num_args = 1..)]
        inputs: Vec<PathBuf>,
        /// interp, cpu or cuda:N.
        #[arg(long, default_value = "cpu")]
        backend: String,
        /// Threads per run (0 = one per core, the default; the `threads` option).
        #[arg(long)]
        threads: Option<usize>,
        /// Untimed runs after the first.
        #[arg(long, default_value_t = 3)]
        warmup: usize,
        /// Timed runs (0: as many as fit in --seconds, at least 10).
        #[arg(long, default_value_t = 0)]
        iterations: usize,
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
        /// One JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// Also print the per-step profile of the timed runs: time, share, GFLOP/s and
        /// share of the FMA peak (measured in the same run), sorted by time (to stderr
        /// with --json).
        #[arg(long)]
        profile: bool,
        /// Write a Chrome trace-event file of every run (Perfetto, chrome://tracing).
        #[arg(long, value_name = "FILE")]
        trace: Option<PathBuf>,
        /// A compile option, as `KILN_<KEY>` and the C API's
        /// `kiln_compile_options_set_option` take it: `--option threads=1`,
        /// `--option autotune=1` (repeatable; after the environment and the other flags).
        #[arg(long = "option", value_name = "KEY=VALUE")]
        options: Vec<String>,
    },
    /// Draw a profile trace (`kiln bench --trace FILE`, `KILN_PROFILE=FILE`) as a
    /// self-contained HTML timeline: a row per thread, steps colored by kernel, the
    /// arena's live bytes below.
    Timeline {
        trace: PathBuf,
        /// The HTML page to write.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Draw a .kir or .onnx graph: DOT on stdout, or -o FILE.dot / .svg / .html (the
    /// last two through Graphviz's `dot`). Large graphs are collapsed by name scope;
    /// a model that fails to import is drawn up to the failing node.
    Viz {
        file: PathBuf,
        /// Write here: .dot, .svg or .html (a page with each collapsed box expandable).
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// Draw the graph after the cpu backend's pass pipeline, fused nodes as clusters
        /// of what they replaced, coloured by the kernel each node runs.
        #[arg(long)]
        optimized: bool,
        /// Give a symbolic input dim a size: `--shape N=1` (repeatable; with --optimized
        /// others default to 1).
        #[arg(long = "shape", value_name = "SYM=SIZE")]
        shapes: Vec<String>,
    },
    /// List the passes, one a line, and the default pipeline.
    Passes,
    /// Print a .npy file's dtype, shape and values.
    Npy {
        file: PathBuf,
        #[arg(long)]
        full: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match dispatch(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kiln: {e}");
            ExitCode::from(1)
        }
    }
}

fn dispatch(command: Command) -> Result<()> {
    match command {
        Command::Ops { family, verbose } => list_ops(family.as_deref(), verbose),
        Command::Check { file } => check(&file),
        Command::Print { file } => emit(&text::print(&load(&file)?)),
        Command::Info { file } => info(&file),
        Command::Run {
            file,
            inputs,
            named,
            outputs,
            backend,
            print,
            full,
            options,
        } => run(
            &file,
            &inputs,
            &named,
            outputs.as_deref(),
            &*backend_with(backend.parse()?, compile_options(&[], &options)?)?,
            print,
            full,
        ),
        Command::Compile {
            file,
            passes,
            dump_ir,
            dump_ir_dir,
            pass_timing,
            disable_passes,
            rewrite_limit,
            layout,
            shapes,
            memory_report,
            memory_chart,
            plan_view,
            plan_view_runs,
            output,
            repeat,
            report,
            options,
        } => {
            let flags = [
                ("passes", passes),
                ("dump-ir", dump_ir),
                ("dump-ir-dir", dump_ir_dir.map(|d| d.display().to_string())),
                ("pass-timing", pass_timing.then(|| "1".to_string())),
                ("disable-passes", disable_passes),
                ("rewrite-limit", rewrite_limit.map(|n| n.to_string())),
                ("layout", layout),
            ];
            let options = compile_options(&flags, &options)?;
            compile::run(&compile::Request {
                file: &file,
                options,
                shapes: &shapes,
                memory_report: memory_report.as_deref(),
                memory_chart: memory_chart.as_deref(),
                plan_view: plan_view.as_deref(),
                plan_view_runs,
                output: output.as_deref(),
                repeat: repeat.max(1),
                report,
            })
        }
        Command::Bench {
            file,
            shapes,
            inputs,
            backend,
            threads,
            warmup,
            iterations,
            seconds,
            json,
            profile,
            trace,
            options,
        } => bench::run(&bench::Request {
            file: &file,
            shapes: &shapes,
            inputs: &inputs,
            backend: &backend,
            options: compile_options(&[("threads", threads.map(|n| n.to_string()))], &options)?,
            warmup,
            iterations,
            seconds,
            json,
            profile,
            trace: trace.as_deref(),
        }),
        Command::Timeline { trace, output } => timeline::run(&trace, &output),
        Command::Viz {
            file,
            output,
            optimized,
            shapes,
        } => viz::run(&viz::Request {
            file: &file,
            output: output.as_deref(),
            optimized,
            shapes: &shapes,
        }),
        Command::Passes => {
            let mut out = String::new();
            for p in passes::PASSES {
                writeln!(out, "{:<18} {}", p.name(), p.summary()).ok();
            }
            writeln!(out, "default pipeline: {}", passes::DEFAULT_PIPELINE).ok();
            emit(&out)
        }
        Command::Npy { file, full } => emit(&format!("{}\n", describe(&npy::read(&file)?, full))),
    }
}

fn list_ops(family: Option<&str>, verbose: bool) -> Result<()> {
    let mut out = String::new();
    let all = ops::catalogue();
    if let Some(f) = family {
        if !all.values().any(|op| op.schema().family == f) {
            let mut families: Vec<&str> = all.values().map(|op| op.schema().family).collect();
            families.dedup();
            families.sort();
            families.dedup();
            return Err(Error::InvalidArgument(format!(
                "unknown op family '{f}' (known: {})",
                families.join(", ")
            )));
        }
    }
    let mut n = 0;
    for op in all.values() {
        let s = op.schema();
        if family.is_some_and(|f| f != s.family) {
            continue;
        }
        writeln!(out, "{}", s.signature()).ok();
        if verbose {
            writeln!(out, "    [{}] {}", s.family, s.doc).ok();
        }
        n += 1;
    }
    writeln!(out, "{n} ops").ok();
    emit(&out)
}

/// A graph from `.kir` text or, by extension, an `.onnx` model.
pub(crate) fn load(file: &Path) -> Result<Graph> {
    if file
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("onnx"))
    {
        onnx::import_file(file)
    } else {
        text::parse_file(file)
    }
}

fn info(file: &Path) -> Result<()> {
    let g = load(file)?;
    let mut out = String::new();
    writeln!(out, "graph \"{}\": {} nodes", g.name, g.len()).ok();
    for &id in &g.inputs() {
        let n = g.node(id);
        writeln!(out, "input  {} {}", n.name, n.outputs[0]).ok();
    }
    for o in g.outputs() {
        let ty = g.value_type(o.value)?;
        writeln!(out, "output {} {ty}", o.name).ok();
    }
    let mut ops: std::collections::BTreeMap<&str, usize> = Default::default();
    let mut params = 0usize;
    for n in g.nodes() {
        *ops.entry(n.op.as_str()).or_default() += 1;
        if let Some(d) = &n.data {
            params += d.len();
        }
    }
    let mut ops: Vec<_> = ops.into_iter().collect();
    ops.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let hist: Vec<String> = ops.iter().map(|(op, n)| format!("{op} {n}")).collect();
    writeln!(out, "ops    {}", hist.join(", ")).ok();
    writeln!(
        out,
        "parameters {params} (elements of constants and variables)"
    )
    .ok();
    emit(&out)
}

fn check(file: &Path) -> Result<()> {
    let g = load(file)?;
    let inputs: Vec<String> = g
        .inputs()
        .iter()
        .map(|&id| {
            let n = g.node(id);
            format!("{} {}", n.name, n.outputs[0])
        })
        .collect();
    let outputs: Vec<String> = g
        .outputs()
        .iter()
        .map(|o| {
            let ty = g.value_type(o.value).map(|t| t.to_string());
            format!("{} {}", o.name, ty.unwrap_or_default())
        })
        .collect();
    emit(&format!(
        "{}: graph \"{}\" is valid: {} nodes; inputs: {}; outputs: {}\n",
        file.display(),
        g.name,
        g.len(),
        list_or_none(&inputs),
        list_or_none(&outputs)
    ))
}

/// Writes to stdout; a closed pipe (`kiln ops | head`) is not an error.
pub(crate) fn emit(text: &str) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(Error::Io(format!("stdout: {e}")))
        }
        _ => Ok(()),
    }
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "none".into()
    } else {
        items.join(", ")
    }
}

/// The run-time inputs in graph-input order, from positional paths or `name=path` pairs.
pub(crate) fn read_inputs(
    g: &Graph,
    positional: &[PathBuf],
    named: &[String],
) -> Result<Vec<Tensor>> {
    let params: Vec<String> = g
        .inputs()
        .iter()
        .map(|&id| g.node(id).name.clone())
        .collect();
    if !positional.is_empty() && !named.is_empty() {
        return Err(Error::InvalidArgument(
            "give inputs either in order (--inputs) or by name (--input), not both".into(),
        ));
    }
    let paths: Vec<PathBuf> = if named.is_empty() {
        if positional.len() != params.len() {
            return Err(Error::InvalidArgument(format!(
                "the graph takes {} inputs ({}), {} given",
                params.len(),
                params.join(", "),
                positional.len()
            )));
        }
        positional.to_vec()
    } else {
        let mut by_name: HashMap<&str, PathBuf> = HashMap::new();
        for pair in named {
            let (name, path) = pair.split_once('=').ok_or_else(|| {
                Error::InvalidArgument(format!("--input '{pair}': expected NAME=PATH"))
            })?;
            if !params.iter().any(|p| p == name) {
                return Err(Error::InvalidArgument(format!(
                    "--input '{name}': the graph has no input of that name (inputs: {})",
                    list_or_none(&params)
                )));
            }
            if by_name.insert(name, PathBuf::from(path)).is_some() {
                return Err(Error::InvalidArgument(format!(
                    "--input '{name}' given twice"
                )));
            }
        }
        params
            .iter()
            .map(|p| {
                by_name.remove(p.as_str()).ok_or_else(|| {
                    Error::InvalidArgument(format!("input '{p}' is missing (--input {p}=PATH)"))
                })
            })
            .collect::<Result<_>>()?
    };
    g.inputs()
        .iter()
        .zip(&paths)
        .map(|(&id, p)| {
            let ty = &g.node(id).outputs[0];
            npy::read_value(p, ty.dtype, &ty.containers).map_err(|e| match e {
                Error::InvalidArgument(m) => {
                    Error::InvalidArgument(format!("input '{}': {m}", g.node(id).name))
                }
                e => e,
            })
        })
        .collect()
}

/// The compile options: the environment's (`KILN_<KEY>`), then the command's own
/// `flags` that were given, then each `--option KEY=VALUE`, all through
/// [`CompileOptions::set`] as the C API and Python set them.
fn compile_options(flags: &[(&str, Option<String>)], given: &[String]) -> Result<CompileOptions> {
    let mut options = CompileOptions::from_env()?;
    for (key, value) in flags {
        if let Some(v) = value {
            options.set(key, v)?;
        }
    }
    for kv in given {
        let (key, value) = kv
            .split_once('=')
            .ok_or_else(|| Error::InvalidArgument(format!("--option {kv}: expected KEY=VALUE")))?;
        options.set(key, value)?;
    }
    Ok(options)
}

fn run(
    file: &Path,
    positional: &[PathBuf],
    named: &[String],
    out_dir: Option<&Path>,
    backend: &dyn Backend,
    print: bool,
    full: bool,
) -> Result<()> {
    let g = load(file)?;
    let inputs = read_inputs(&g, positional, named)?;
    let exe = backend.compile(&g)?;
    let outputs = exe.run(&inputs)?;
    if let Some(dir) = out_dir {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    let mut out = String::new();
    for (o, t) in g.outputs().iter().zip(&outputs) {
        if let Some(dir) = out_dir {
            let written = npy::write_value(&dir.join(file_safe(&o.name)), t)?;
            for path in &written {
                writeln!(out, "wrote {}", path.display()).ok();
            }
            if written.is_empty() {
                writeln!(out, "{} is an empty optional: nothing written", o.name).ok();
            }
        }
        if print {
            writeln!(out, "{} = {}", o.name, describe(t, full)).ok();
        }
    }
    emit(&out)
}

/// An output name as a file name: path separators and other awkward characters become `_`.
fn file_safe(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// `f32[2, 3] [1, 2, 3, 4, 5, 6]`, eliding the middle of long tensors unless `full`.
fn describe(t: &Tensor, full: bool) -> String {
    const EDGE: usize = 8;
    match t {
        Tensor::Sequence(s) => {
            let items: Vec<String> = s.items.iter().map(|i| describe(i, full)).collect();
            return format!(
                "{} of {} [{}]",
                t.kind_name(),
                s.items.len(),
                items.join("; ")
            );
        }
        Tensor::Optional(o) => {
            return match &o.value {
                Some(v) => format!("{} holding {}", t.kind_name(), describe(v, full)),
                None => format!("{} (empty)", t.kind_name()),
            }
        }
        Tensor::String(a) => {
            let values: Vec<String> = a.iter().map(|s| format!("{s:?}")).collect();
            let body = if full || values.len() <= 2 * EDGE {
                values.join(", ")
            } else {
                format!(
                    "{}, ... ({} more), {}",
                    values[..EDGE].join(", "),
                    values.len() - 2 * EDGE,
                    values[values.len() - EDGE..].join(", ")
                )
            };
            return format!("string{:?} [{body}]", t.shape());
        }
        _ => {}
    }
    let values: Vec<String> = if t.dtype() == DType::F64 {
        t.to_f64_vec().iter().map(|v| format!("{v}")).collect()
    } else if t.dtype().is_float() || t.dtype().is_minifloat() {
        // f32, f16, bf16, float8 and float4 are exact in f32: print the shortest text of the f32.
        t.to_f64_vec()
            .iter()
            .map(|&v| format!("{}", v as f32))
            .collect()
    } else if t.dtype() == DType::Bool {
        t.to_i64_vec()
            .iter()
            .map(|&v| (v != 0).to_string())
            .collect()
    } else {
        t.to_i64_vec().iter().map(|v| v.to_string()).collect()
    };
    let body = if full || values.len() <= 2 * EDGE {
        values.join(", ")
    } else {
        format!(
            "{}, ... ({} more), {}",
            values[..EDGE].join(", "),
            values.len() - 2 * EDGE,
            values[values.len() - EDGE..].join(", ")
        )
    };
    format!("{}{:?} [{body}]", t.dtype(), t.shape())
}
