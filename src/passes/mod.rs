//! The pass pipeline: hardware-independent rewrites between the verified graph and a
//! backend.
//!
//! Every pass is registered by a kebab-case name in [`PASSES`]; a pipeline is a
//! comma-separated list of names (`"canonicalize,constant-fold,simplify,cse,dce"`),
//! the same text for the CLI (`kiln compile --passes`), the C API
//! (`kiln_compile_options_set_option(o, "passes", ...)`), the `KILN_PASSES` variable and
//! the tests. Rewrite passes run to a fixpoint (at most [`MAX_ITERATIONS`] rounds). With
//! `verify` on (debug builds and tests) the verifier runs after every pass, and an error
//! names the pass that broke the graph.
//!
//! Debugging switches ([`PassOptions::set`]; each also an environment variable
//! `KILN_<KEY>`, e.g. `KILN_DUMP_IR=after-all`): `dump-ir`
//! (`before-all|after-all|after=p1,p2|changed`), `dump-ir-dir` (one `.kir` file per
//! step instead of stderr), `pass-timing`, `disable-passes`, `rewrite-limit` (apply only
//! the first N rewrites: bisect a miscompile to one rewrite), `fold-limit`, and
//! `layout` (`plain` or `nchw16c`; unset, the backend chooses).
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::ir::{text, verify, Graph};

mod batchnorm;
mod canonicalize;
mod constant_fold;
mod cse;
mod dce;
mod elementwise;
mod epilogue;
mod layout;
pub mod pattern;
mod recognize;
mod simplify;

/// Whether a pass changed the graph.
pub type Changed = bool;

/// A graph-to-graph transformation.
pub trait Pass: Send + Sync {
    /// The kebab-case name pipelines use.
    fn name(&self) -> &'static str;
    /// One line for `kiln passes`.
    fn summary(&self) -> &'static str;
    /// Whether the pass runs again until it changes nothing (rewrite passes do).
    fn fixpoint(&self) -> bool {
        true
    }
    fn run(&self, g: &mut Graph, cx: &mut PassContext) -> Result<Changed>;
}

/// The registry: every pass, by name, in the order of the default pipeline.
pub static PASSES: &[&dyn Pass] = &[
    &canonicalize::Canonicalize,
    &constant_fold::ConstantFold,
    &simplify::Simplify,
    &cse::Cse,
    &recognize::Recognize,
    &batchnorm::FoldBatchNorm,
    &epilogue::FuseEpilogue,
    &elementwise::FuseElementwise,
    &layout::Layout,
    &dce::Dce,
];

/// The pipeline `kiln_compile` and `kiln compile` run unless told otherwise.
pub const DEFAULT_PIPELINE: &str = "canonicalize,constant-fold,simplify,cse,recognize,\
fold-batchnorm,fuse-epilogue,fuse-elementwise,layout,simplify,cse,dce";

/// Names that stand for several passes in a pipeline.
const ALIASES: &[(&str, &str)] = &[("fuse", "fold-batchnorm,fuse-epilogue,fuse-elementwise")];

/// The most rounds a fixpoint pass runs.
pub const MAX_ITERATIONS: usize = 10;

/// The pass called `name`.
pub(crate) fn lookup(name: &str) -> Option<&'static dyn Pass> {
    PASSES.iter().copied().find(|p| p.name() == name)
}

/// The passes of a pipeline text, aliases expanded; an unknown name is an error.
pub fn parse_pipeline(spec: &str) -> Result<Vec<&'static dyn Pass>> {
    let mut out = vec![];
    for name in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if let Some((_, expansion)) = ALIASES.iter().find(|(a, _)| *a == name) {
            out.extend(parse_pipeline(expansion)?);
            continue;
        }
        out.push(lookup(name).ok_or_else(|| unknown_pass(name))?);
    }
    Ok(out)
}

fn unknown_pass(name: &str) -> Error {
    let known: Vec<&str> = PASSES.iter().map(|p| p.name()).collect();
    Error::InvalidArgument(format!(
        "unknown pass '{name}' (known: {}; alias fuse)",
        known.join(", ")
    ))
}

/// When to print the IR between passes.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum DumpIr {
    #[default]
    Never,
    BeforeAll,
    AfterAll,
    /// After each of these passes.
    After(Vec<String>),
    /// After each pass that changed the graph.
    Changed,
}

/// How a pipeline runs. `Default` gives the default pipeline with no debugging;
/// [`PassOptions::from_env`] adds the `KILN_*` variables.
#[derive(Debug, Clone)]
pub struct PassOptions {
    pub pipeline: String,
    pub dump_ir: DumpIr,
    pub dump_ir_dir: Option<PathBuf>,
    pub pass_timing: bool,
    pub disabled: Vec<String>,
    pub rewrite_limit: Option<usize>,
    /// Constant folding creates no constant with more elements than this.
    pub fold_limit: usize,
    /// Run the verifier after every pass (on in debug builds).
    pub verify: bool,
    /// The channel block the `layout` pass gives convolutions (`layout = nchw16c`: 16);
    /// `Some(0)` keeps everything plain; `None` lets the backend choose.
    pub layout_block: Option<usize>,
}

impl Default for PassOptions {
    fn default() -> PassOptions {
        PassOptions {
            pipeline: DEFAULT_PIPELINE.to_string(),
            dump_ir: DumpIr::Never,
            dump_ir_dir: None,
            pass_timing: false,
            disabled: vec![],
            rewrite_limit: None,
            fold_limit: 1 << 20,
            verify: cfg!(debug_assertions),
            layout_block: None,
        }
    }
}

impl PassOptions {
    /// The option keys; each is also read from `KILN_<KEY>` (upper case, `_` for `-`).
    pub const KEYS: &'static [&'static str] = &[
        "passes",
        "dump-ir",
        "dump-ir-dir",
        "pass-timing",
        "disable-passes",
        "rewrite-limit",
        "fold-limit",
        "verify",
        "layout",
    ];

    /// The defaults, then every `KILN_<KEY>` variable that is set.
    pub fn from_env() -> Result<PassOptions> {
        let mut o = PassOptions::default();
        for key in Self::KEYS {
            let var = format!("KILN_{}", key.to_ascii_uppercase().replace('-', "_"));
            if let Ok(value) = std::env::var(&var) {
                o.set(key, &value)
                    .map_err(|e| Error::InvalidArgument(format!("{var}: {e}")))?;
            }
        }
        Ok(o)
    }

    /// Sets one option from its text, as the CLI, the C API and the environment give it.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let flag = |v: &str| match v {
            "1" | "true" | "on" | "yes" => Ok(true),
            "0" | "false" | "off" | "no" | "" => Ok(false),
            _ => Err(Error::InvalidArgument(format!(
                "{key}: expected 1 or 0, got '{v}'"
            ))),
        };
        let count = |v: &str| {
            v.parse::<usize>()
                .map_err(|_| Error::InvalidArgument(format!("{key}: expected a count, got '{v}'")))
        };
        match key {
            "passes" => {
                parse_pipeline(value)?;
                self.pipeline = value.to_string();
            }
            "dump-ir" => {
                self.dump_ir = match value {
                    "" | "never" => DumpIr::Never,
                    "before-all" => DumpIr::BeforeAll,
                    "after-all" => DumpIr::AfterAll,
                    "changed" => DumpIr::Changed,
                    v => match v.strip_prefix("after=") {
                        Some(list) => {
                            let names = names_of(list)?;
                            DumpIr::After(names)
                        }
                        None => {
                            return Err(Error::InvalidArgument(format!(
                                "dump-ir: expected before-all, after-all, after=p1,p2 or changed, got '{v}'"
                            )))
                        }
                    },
                }
            }
            "dump-ir-dir" => {
                self.dump_ir_dir = (!value.is_empty()).then(|| PathBuf::from(value));
            }
            "pass-timing" => self.pass_timing = flag(value)?,
            "disable-passes" => self.disabled = names_of(value)?,
            "rewrite-limit" => {
                self.rewrite_limit = if value.is_empty() {
                    None
                } else {
                    Some(count(value)?)
                }
            }
            "fold-limit" => self.fold_limit = count(value)?,
            "verify" => self.verify = flag(value)?,
            "layout" => {
                self.layout_block = match value {
                    "" => None,
                    "plain" | "nchw" => Some(0),
                    v => Some(
                        v.strip_prefix("nchw")
                            .and_then(|r| r.strip_suffix('c'))
                            .and_then(|n| n.parse::<usize>().ok())
                            .filter(|n| (1..=1024).contains(n))
                            .ok_or_else(|| {
                                Error::InvalidArgument(format!(
                                    "layout: expected plain or nchw<block>c (nchw16c), got '{v}'"
                                ))
                            })?,
                    ),
                }
            }
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "unknown option '{key}' (known: {})",
                    Self::KEYS.join(", ")
                )))
            }
        }
        Ok(())
    }
}

/// Pass names from a comma-separated list, each checked against the registry.
fn names_of(list: &str) -> Result<Vec<String>> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|n| {
            lookup(n)
                .map(|p| p.name().to_string())
                .ok_or_else(|| unknown_pass(n))
        })
        .collect()
}

/// What a pass sees besides the graph: the options and the rewrite budget.
pub struct PassContext<'a> {
    pub options: &'a PassOptions,
    rewrites: usize,
    limit_reached: bool,
}

impl PassContext<'_> {
    /// Asks to apply one rewrite; false once the `rewrite-limit` is spent, and the pass
    /// must then leave the match alone.
    pub(crate) fn allow_rewrite(&mut self) -> bool {
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
    pub(crate) fn total_time(&self) -> Duration {
        self.records.iter().map(|r| r.time).sum()
    }

    /// The timing table `pass-timing` prints.
    pub(crate) fn timing_table(&self) -> String {
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
    options: &'a PassOptions,
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
pub fn run_pipeline(g: &mut Graph, options: &PassOptions) -> Result<PassReport> {
    run_passes(g, &parse_pipeline(&options.pipeline)?, options)
}

/// Runs `passes` in order over `g` with `options`' debugging switches (its `pipeline`
/// is not read): for passes outside the registry, such as tests' own.
pub fn run_passes(
    g: &mut Graph,
    passes: &[&dyn Pass],
    options: &PassOptions,
) -> Result<PassReport> {
    let mut cx = PassContext {
        options,
        rewrites: 0,
        limit_reached: false,
    };
    let mut dumper = Dumper { options, seq: 0 };
    let mut report = PassReport::default();
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

/// Visits the live nodes in schedule order (or reversed), letting `rewrite` change the
/// graph at each; after a change the uses are recomputed. Nodes a rewrite appends are
/// visited by the next round.
fn sweep(
    g: &mut Graph,
    cx: &mut PassContext,
    reverse: bool,
    mut rewrite: impl FnMut(
        &mut Graph,
        &pattern::Uses,
        crate::ir::NodeId,
        &mut PassContext,
    ) -> Result<Changed>,
) -> Result<Changed> {
    let mut order = g.schedule()?;
    if reverse {
        order.reverse();
    }
    let mut uses = pattern::Uses::new(g);
    let mut changed = false;
    for id in order {
        if !uses.is_live(id) {
            continue;
        }
        if rewrite(g, &uses, id, cx)? {
            changed = true;
            uses = pattern::Uses::new(g);
        }
    }
    Ok(changed)
}

/// Adds `op` named after `base`; `None` when the catalogue rejects the operands (the
/// rewrite then does not apply).
fn try_add(
    g: &mut Graph,
    op: &str,
    inputs: &[Option<crate::ir::Value>],
    attrs: crate::ir::Attrs,
    base: &str,
) -> Option<crate::ir::NodeId> {
    let name = g.fresh_name(base);
    g.add_op(op, inputs, attrs, &name).ok()
}

/// Adds `op` to stand in for `like`: it takes `like`'s name (`like`, about to be
/// replaced, becomes `<name>.old` until the manager drops it), so dumps keep the
/// model's names and the symbols inference invents for unknown dims, which are named
/// after the node, come out the same as `like`'s. `None`, with `like`'s name back,
/// when the catalogue rejects the operands.
fn add_in_place_of(
    g: &mut Graph,
    like: crate::ir::NodeId,
    op: &str,
    inputs: &[Option<crate::ir::Value>],
    attrs: crate::ir::Attrs,
) -> Option<crate::ir::NodeId> {
    let name = g.node(like).name.clone();
    let old = g.fresh_name(&format!("{name}.old"));
    g.node_mut(like).name = old;
    match g.add_op(op, inputs, attrs, &name) {
        Ok(id) => Some(id),
        Err(_) => {
            g.node_mut(like).name = name;
            None
        }
    }
}

/// Replaces `root`'s output by a new `op(inputs) {attrs}` of the same type standing in
/// for `like` (`add_in_place_of`): the last step of most rewrites. False, and nothing
/// replaced, when the catalogue rejects the new node, its type differs, or the rewrite
/// budget is spent.
fn replace_node(
    g: &mut Graph,
    root: crate::ir::NodeId,
    like: crate::ir::NodeId,
    op: &str,
    inputs: &[Option<crate::ir::Value>],
    attrs: crate::ir::Attrs,
    cx: &mut PassContext,
) -> Result<Changed> {
    Ok(replacement(g, root, like, op, inputs, attrs, cx)?.is_some())
}

/// [`replace_node`], giving the new node (whose other outputs the caller may wire up).
fn replacement(
    g: &mut Graph,
    root: crate::ir::NodeId,
    like: crate::ir::NodeId,
    op: &str,
    inputs: &[Option<crate::ir::Value>],
    attrs: crate::ir::Attrs,
    cx: &mut PassContext,
) -> Result<Option<crate::ir::NodeId>> {
    let out_ty = g.node(root).outputs[0].clone();
    let Some(new) = add_in_place_of(g, like, op, inputs, attrs) else {
        return Ok(None);
    };
    if g.node(new).outputs[0] != out_ty || !cx.allow_rewrite() {
        give_back_name(g, new, like);
        return Ok(None);
    }
    g.replace_uses(root.into(), new.into())?;
    Ok(Some(new))
}

/// Undoes `add_in_place_of` for a rewrite that does not apply: `like` gets its name
/// back and `new` stays dead until the manager drops it.
fn give_back_name(g: &mut Graph, new: crate::ir::NodeId, like: crate::ir::NodeId) {
    let name = g.node(new).name.clone();
    let dead = g.fresh_name(&format!("{name}.rejected"));
    g.node_mut(new).name = dead;
    g.node_mut(like).name = name;
}

/// A new constant named after `base`.
fn add_const(g: &mut Graph, base: &str, t: crate::tensor::Tensor) -> Result<crate::ir::NodeId> {
    let name = g.fresh_name(base);
    g.add_constant_value(&name, t)
}
