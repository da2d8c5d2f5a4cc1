//! `kiln compile`: load, give symbolic input dims sizes, run the pass pipeline, plan
//! memory; print what happened and how long each phase took.
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use kiln::backend::cpu::{Compiled as CpuCompiled, CpuBackend, CpuExecutable};
use kiln::backend::cpu_pass_options;
use kiln::backend::Executable;
use kiln::ir::text;
use kiln::memory;
use kiln::memory::plan_view::{self, StepNote};
use kiln::passes::{run_pipeline, CompileOptions, PassReport, Profiling};
use kiln::{DType, Error, Graph, Result, Tensor};

use crate::{emit, load};

pub struct Request<'a> {
    pub file: &'a Path,
    pub options: CompileOptions,
    pub shapes: &'a [String],
    pub memory_report: Option<&'a Path>,
    pub memory_chart: Option<&'a Path>,
    /// Draw the cpu program's plan here: HTML, or SVG for a `.svg` path.
    pub plan_view: Option<&'a Path>,
    /// Time the plan view's steps over this many runs (0: no times).
    pub plan_view_runs: usize,
    pub output: Option<&'a Path>,
    pub repeat: usize,
    /// List the cpu program's steps and their kernels.
    pub report: bool,
}

/// One compile: the graph, what the passes did, the plan, and the phases' times.
struct Compiled {
    graph: Graph,
    /// What the plan covers: `graph`, or its static part when some dims are known only
    /// at run time.
    planned: Graph,
    nodes_before: usize,
    report: PassReport,
    plan: memory::MemoryPlan,
    notes: Vec<String>,
    times: [Duration; 3],
}

pub(crate) fn bindings(shapes: &[String]) -> Result<HashMap<String, usize>> {
    shapes
        .iter()
        .map(|s| {
            let bad = || Error::InvalidArgument(format!("--shape '{s}': expected SYMBOL=SIZE"));
            let (k, v) = s.split_once('=').ok_or_else(bad)?;
            Ok((k.trim().to_string(), v.trim().parse().map_err(|_| bad())?))
        })
        .collect()
}

fn compile_once(req: &Request, options: &CompileOptions) -> Result<Compiled> {
    let t0 = Instant::now();
    let mut graph = load(req.file)?;
    let nodes_before = graph.len();
    let mut given = bindings(req.shapes)?;
    // Symbols nobody gave default to 1, and the report says so.
    let unbound = graph.specialize(&given)?;
    let mut notes = vec![];
    for s in &unbound {
        notes.push(format!(
            "symbolic dim {s} was not given (--shape {s}=SIZE): 1 assumed"
        ));
        given.insert(s.clone(), 1);
    }
    if !unbound.is_empty() {
        graph.specialize(&given)?;
    }
    let t1 = Instant::now();
    let report = run_pipeline(&mut graph, options)?;
    let t2 = Instant::now();
    // Dims known only at run time (a Reshape of computed sizes): plan what is static.
    let (planned, plan) = match graph.static_part()? {
        None => (graph.clone(), memory::plan(&graph, &graph.schedule()?)?),
        Some((part, left_out, first)) => {
            notes.push(format!(
                "{left_out} of {} nodes have types known only at run time, from {} ({}) on: the plan covers the rest",
                graph.len(),
                graph.describe(first),
                graph.node(first).outputs.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ")
            ));
            let plan = memory::plan(&part, &part.schedule()?)?;
            (part, plan)
        }
    };
    let t3 = Instant::now();
    Ok(Compiled {
        graph,
        planned,
        nodes_before,
        report,
        plan,
        notes,
        times: [t1 - t0, t2 - t1, t3 - t2],
    })
}

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub(crate) fn run(req: &Request) -> Result<()> {
    // The pipeline as the cpu backend runs it (its layout, unless --layout says).
    let options = cpu_pass_options(req.options.clone());
    let first = compile_once(req, &options)?;
    let mut times: Vec<[Duration; 3]> = vec![first.times];
    // Repeats measure only: no dumps, no timing tables.
    let mut quiet = options.clone();
    quiet.dump_ir = Default::default();
    quiet.pass_timing = false;
    for _ in 1..req.repeat {
        times.push(compile_once(req, &quiet)?.times);
    }
    let phase = |i: usize| median(times.iter().map(|t| t[i]).collect());
    let total = median(times.iter().map(|t| t.iter().sum()).collect());
    let c = first;
    let mut out = String::new();
    writeln!(
        out,
        "{}: {} nodes -> {} after {} passes",
        req.file.display(),
        c.nodes_before,
        c.graph.len(),
        c.report.records.len()
    )
    .ok();
    let mut hist: BTreeMap<&str, usize> = BTreeMap::new();
    for n in c.graph.nodes() {
        if !matches!(n.op.as_str(), "Constant" | "Parameter" | "Variable") {
            *hist.entry(n.op.as_str()).or_default() += 1;
        }
    }
    let mut hist: Vec<_> = hist.into_iter().collect();
    hist.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let hist: Vec<String> = hist.iter().map(|(op, n)| format!("{op} {n}")).collect();
    writeln!(out, "ops    {}", hist.join(", ")).ok();
    for note in &c.notes {
        writeln!(out, "note   {note}").ok();
    }
    let p = &c.plan;
    writeln!(
        out,
        "memory naive {} B, planned {} B, lower bound {} B: naive/planned {:.2}, planned/lower bound {:.4} ({}, {} in-place)",
        p.naive_bytes,
        p.planned_bytes,
        p.lower_bound_bytes,
        p.naive_bytes as f64 / p.planned_bytes.max(1) as f64,
        p.ratio_to_lower_bound(),
        p.strategy,
        p.inplace_reuses
    )
    .ok();
    writeln!(
        out,
        "time   import {:.1} ms, passes {:.1} ms, plan {:.1} ms, total {:.1} ms (median of {})",
        ms(phase(0)),
        ms(phase(1)),
        ms(phase(2)),
        ms(total),
        times.len()
    )
    .ok();
    if let Some(path) = req.memory_report {
        let json = memory::to_json(&c.plan, &c.planned, &c.notes);
        std::fs::write(path, json).map_err(|e| Error::io(path, e))?;
        writeln!(out, "wrote {}", path.display()).ok();
    }
    if let Some(path) = req.memory_chart {
        let title = format!("{} — live memory per step", c.graph.name);
        std::fs::write(path, memory::to_svg(&c.plan, &c.planned, &title))
            .map_err(|e| Error::io(path, e))?;
        writeln!(out, "wrote {}", path.display()).ok();
    }
    if let Some(path) = req.output {
        text::save(&c.graph, path, Some(64))?;
        writeln!(out, "wrote {}", path.display()).ok();
    }
    if req.report {
        write_step_report(req, &options, &mut out)?;
    }
    if let Some(path) = req.plan_view {
        write_plan_view(req, &options, &c, path, &mut out)?;
    }
    emit(&out)
}

/// The model compiled for the cpu backend, with its inputs' static shapes (symbols bound
/// as for `compile`) and dtypes.
struct CpuModel {
    exe: CpuExecutable,
    shapes: Vec<Vec<usize>>,
    dtypes: Vec<DType>,
}

/// [`CpuModel`] under the pipeline without its dumps and timing tables, profiled as
/// `profile` says, its runs on `threads` threads (0: one per core).
fn cpu_executable(
    req: &Request,
    options: &CompileOptions,
    profile: Profiling,
    threads: usize,
) -> Result<CpuModel> {
    let mut graph = load(req.file)?;
    let mut given = bindings(req.shapes)?;
    for s in graph.specialize(&given)? {
        given.insert(s, 1);
    }
    graph.specialize(&given)?;
    let shapes = input_shapes(&graph)?;
    let dtypes = graph
        .inputs()
        .iter()
        .map(|&id| graph.node(id).outputs[0].dtype)
        .collect();
    let mut passes = options.clone();
    passes.dump_ir = Default::default();
    passes.pass_timing = false;
    passes.profile = profile;
    passes.threads = threads;
    let exe = CpuBackend { options: passes }.compile_cpu(&graph)?;
    Ok(CpuModel {
        exe,
        shapes,
        dtypes,
    })
}

/// The graph inputs' dims, or an error naming the first input whose type is not static.
pub(crate) fn input_shapes(graph: &Graph) -> Result<Vec<Vec<usize>>> {
    graph
        .inputs()
        .iter()
        .map(|&id| {
            let t = &graph.node(id).outputs[0];
            t.static_dims().ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "input '{}' has type {t}: give its dims with --shape",
                    graph.node(id).name
                ))
            })
        })
        .collect()
}

/// The cpu program's steps, one a line: `<index> <kernel> <node>`, bodies indented, and
/// a count of the steps that run the reference interpreter.
fn write_step_report(req: &Request, options: &CompileOptions, out: &mut String) -> Result<()> {
    let m = cpu_executable(req, options, Profiling::Off, 1)?;
    let steps = m.exe.step_report(&m.shapes)?;
    writeln!(out, "steps  (cpu; kernel, node)").ok();
    for (i, s) in steps.iter().enumerate() {
        let mark = if s.is_fallback() {
            "  <- interpreter"
        } else {
            ""
        };
        let indent = "  ".repeat(s.depth);
        writeln!(out, "{i:5}  {indent}{:<20} {}{mark}", s.kind, s.node).ok();
    }
    let slow = steps.iter().filter(|s| s.is_fallback()).count();
    writeln!(
        out,
        "kernels {} steps, {slow} on the reference interpreter",
        steps.len()
    )
    .ok();
    Ok(())
}

/// Draws the cpu program's memory plan with its steps' kernels (`--plan-view`) and,
/// after `req.plan_view_runs` runs on zero inputs, their measured times.
fn write_plan_view(
    req: &Request,
    options: &CompileOptions,
    c: &Compiled,
    path: &Path,
    out: &mut String,
) -> Result<()> {
    let t0 = Instant::now();
    let runs = req.plan_view_runs;
    // Timed runs use the options' threads (every core unless told), as `kiln bench` does.
    let (profile, threads) = match runs {
        0 => (Profiling::Off, 1),
        _ => (Profiling::Collect, options.threads),
    };
    let m = cpu_executable(req, options, profile, threads)?;
    let compiled = m.exe.program(&m.shapes)?;
    let CpuCompiled::Program(p) = &*compiled else {
        return Err(Error::InvalidArgument(format!(
            "--plan-view: {} does not lower to one static cpu program for these shapes \
             (a type stays dynamic or holds host objects), so it has no single memory plan",
            req.file.display()
        )));
    };
    let mut times = HashMap::new();
    if runs > 0 {
        let inputs: Vec<Tensor> = m
            .dtypes
            .iter()
            .zip(&m.shapes)
            .map(|(&d, s)| Tensor::zeros(d, s))
            .collect();
        // One warm-up run, left out.
        m.exe.run(&inputs)?;
        m.exe.restart_profile();
        (0..runs).try_for_each(|_| m.exe.run(&inputs).map(drop))?;
        times = (m.exe.step_times().into_iter())
            .map(|t| (t.node.0, t.seconds_per_call))
            .collect();
    }
    let mut timed = std::collections::HashSet::new();
    let notes: Vec<StepNote> = p
        .steps
        .iter()
        .map(|s| StepNote {
            node: s.node.id,
            kind: s.kernel.kind().to_string(),
            shapes: s.shapes.clone(),
            flops: s.flops,
            // A node's time goes to its first step.
            seconds: timed
                .insert(s.node.id.0)
                .then(|| times.get(&s.node.id.0).copied())
                .flatten(),
        })
        .collect();
    // `compile` ran the same pipeline on the same shapes: when its plan is the
    // program's, its graph is too and gives the tooltips their types.
    let graph = (c.plan == p.memory).then_some(&c.planned);
    let t1 = Instant::now();
    let title = format!("{} — cpu execution plan", c.graph.name);
    let svg = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("svg"));
    let text = if svg {
        plan_view::to_svg(&p.memory, graph, &notes, &title)
    } else {
        plan_view::to_html(&p.memory, graph, &notes, &title)
    };
    std::fs::write(path, text).map_err(|e| Error::io(path, e))?;
    let timing = if runs > 0 {
        format!("; {runs} timed runs after one warm-up")
    } else {
        String::new()
    };
    writeln!(
        out,
        "wrote {} ({} steps, {} buffers{timing}; lowering and runs {:.1} ms, drawing {:.1} ms)",
        path.display(),
        p.steps.len(),
        p.memory.buffers.len(),
        ms(t1 - t0),
        ms(t1.elapsed())
    )
    .ok();
    Ok(())
}
