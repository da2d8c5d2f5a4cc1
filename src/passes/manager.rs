//! The manager: runs a pipeline pass by pass (fixpoint rounds, disabled passes, the
//! rewrite budget, verification after each pass, IR dumps) and reports what each did.
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::options::{CompileOptions, DumpIr};
use super::registry::parse_pipeline;
use super::Pass;
use crate::error::{Error, Result};
use crate::ir::{text, verify, Attr, Graph};

/// The most rounds a fixpoint pass runs.
pub const MAX_ITERATIONS: usize = 10;

/// What a pass sees besides the graph: the options and the rewrite budget.
pub struct PassContext<'a> {
    pub options: &'a CompileOptions,
    rewrites: usize,
    limit_reached: bool,
}

impl PassContext<'_> {
    /// Asks to apply one rewrite; false once the `rewrite-limit` is spent, and the pass
    /// must then leave the match alone.
    pub fn allow_rewrite(&mut self) -> bool {
        if self
            .options
            .rewrite_limit
            .is_some_and(|l| self.rewrites >= l)
        {
            self.limit_reached = true;
            return false;
        }
        self.rewrites += 1;
        true
    }
}

/// One pass's share of a pipeline run.
#[derive(Debug, Clone)]
pub struct PassRecord {
    pub pass: &'static str,
    /// Rounds run (a fixpoint pass runs until unchanged).
    pub iterations: usize,
    pub changed: bool,
    pub rewrites: usize,
    pub nodes_after: usize,
    pub time: Duration,
    pub skipped: bool,
}

/// What a pipeline run did, pass by pass.
#[derive(Debug, Clone, Default)]
pub struct PassReport {
    pub records: Vec<PassRecord>,
    /// Whether the `rewrite-limit` stopped a rewrite.
    pub limit_reached: bool,
}

impl PassReport {
    pub fn total_time(&self) -> Duration {
        self.records.iter().map(|r| r.time).sum()
    }

    /// The timing table `pass-timing` prints.
    pub fn timing_table(&self) -> String {
        let mut s = String::from("pass                 rounds  rewrites  nodes   time (ms)\n");
        for r in &self.records {
            let note = if r.skipped { "  (disabled)" } else { "" };
            writeln!(
                s,
                "{:<20} {:>6}  {:>8}  {:>5}  {:>10.3}{note}",
                r.pass,
                r.iterations,
                r.rewrites,
                r.nodes_after,
                r.time.as_secs_f64() * 1e3
            )
            .ok();
        }
        writeln!(
            s,
            "{:<20} {:>6}  {:>8}  {:>5}  {:>10.3}",
            "total",
            "",
            self.records.iter().map(|r| r.rewrites).sum::<usize>(),
            self.records.last().map_or(0, |r| r.nodes_after),
            self.total_time().as_secs_f64() * 1e3
        )
        .ok();
        s
    }
}

/// Dumps print constants of up to this many elements; larger ones are `elided(n)`.
pub const DUMP_ELIDE_LIMIT: usize = 256;

/// Where IR dumps go: numbered files in a folder, or stderr.
struct Dumper<'a> {
    options: &'a CompileOptions,
    seq: usize,
}

impl Dumper<'_> {
    fn dump(&mut self, g: &Graph, when: &str, pass: &str) -> Result<()> {
        self.seq += 1;
        // A model's weights would make a dump gigabytes of digits: large ones are elided.
        let opts = text::PrintOptions {
            elide_limit: Some(DUMP_ELIDE_LIMIT),
            ..Default::default()
        };
        let text = text::print_with(g, &opts).0;
        match &self.options.dump_ir_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
                let path = dir.join(format!("{:03}-{when}-{pass}.kir", self.seq));
                std::fs::write(&path, text).map_err(|e| Error::io(&path, e))
            }
            None => {
                eprintln!("// ----- IR {when} {pass} -----\n{text}");
                Ok(())
            }
        }
    }
}

/// Runs `options.pipeline` over `g`.
pub fn run_pipeline(g: &mut Graph, options: &CompileOptions) -> Result<PassReport> {
    run_passes(g, &parse_pipeline(&options.pipeline)?, options)
}

/// Runs `passes` in order over `g` with `options`' debugging switches (its `pipeline`
/// is not read): for passes outside the registry, such as tests' own.
pub fn run_passes(
    g: &mut Graph,
    passes: &[&dyn Pass],
    options: &CompileOptions,
) -> Result<PassReport> {
    let mut cx = PassContext {
        options,
        rewrites: 0,
        limit_reached: false,
    };
    let mut dumper = Dumper { options, seq: 0 };
    let mut report = PassReport::default();
    optimize_bodies(g, passes, options)?;
    for &pass in passes {
        let name = pass.name();
        if options.disabled.iter().any(|d| d == name) {
            report.records.push(PassRecord {
                pass: name,
                iterations: 0,
                changed: false,
                rewrites: 0,
                nodes_after: g.len(),
                time: Duration::ZERO,
                skipped: true,
            });
            continue;
        }
        if options.dump_ir == DumpIr::BeforeAll {
            dumper.dump(g, "before", name)?;
        }
        let start = Instant::now();
        let rewrites_before = cx.rewrites;
        let mut iterations = 0;
        let mut changed = false;
        loop {
            iterations += 1;
            let round = pass
                .run(g, &mut cx)
                .map_err(|e| Error::Graph(format!("pass '{name}': {e}")))?;
            if round {
                // What the rewrites left dead goes, and types refined by them (a shape
                // operand that became a constant) flow down to the readers.
                g.compact();
                g.refresh_types().map_err(|e| {
                    Error::Graph(format!("pass '{name}' left an invalid graph: {e}"))
                })?;
            }
            if options.verify {
                verify(g).map_err(|e| {
                    Error::Graph(format!("pass '{name}' left an invalid graph: {e}"))
                })?;
            }
            changed |= round;
            if !round || !pass.fixpoint() || iterations >= MAX_ITERATIONS || cx.limit_reached {
                break;
            }
        }
        let record = PassRecord {
            pass: name,
            iterations,
            changed,
            rewrites: cx.rewrites - rewrites_before,
            nodes_after: g.len(),
            time: start.elapsed(),
            skipped: false,
        };
        let dump = match &options.dump_ir {
            DumpIr::AfterAll => true,
            DumpIr::After(list) => list.iter().any(|p| p == name),
            DumpIr::Changed => changed,
            _ => false,
        };
        if dump {
            dumper.dump(g, "after", name)?;
        }
        report.records.push(record);
    }
    report.limit_reached = cx.limit_reached;
    if options.pass_timing {
        eprint!("{}", report.timing_table());
    }
    Ok(report)
}

/// Runs `passes` inside every control-flow body first (inside out, each body a graph of
/// its own), so that the parent's rewrites (inlining a branch, unrolling a loop) splice
/// optimized bodies; the parent's types are then re-inferred from the new bodies.
fn optimize_bodies(g: &mut Graph, passes: &[&dyn Pass], options: &CompileOptions) -> Result<()> {
    let mut changed = false;
    for id in g.schedule()? {
        let bodies: Vec<(String, Arc<Graph>)> = g
            .node(id)
            .attrs
            .graphs()
            .map(|(k, b)| (k.clone(), b.clone()))
            .collect();
        for (attr, body) in bodies {
            let mut optimized = (*body).clone();
            run_passes(&mut optimized, passes, options)
                .map_err(|e| Error::Graph(format!("{}: body '{attr}': {e}", g.describe(id))))?;
            if optimized != *body {
                g.node_mut(id)
                    .attrs
                    .set(&attr, Attr::Graph(Arc::new(optimized)));
                changed = true;
            }
        }
    }
    if changed {
        g.refresh_types()?;
    }
    Ok(())
}
