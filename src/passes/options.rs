//! How a graph compiles and runs: [`CompileOptions`] (the pass pipeline, profiling,
//! threads, algorithm tuning), set key by key from text the same way whether the CLI, the
//! C API, Python or the `KILN_<KEY>` environment variables give it.
use std::path::PathBuf;

use super::registry::{lookup, parse_pipeline, unknown_pass, DEFAULT_PIPELINE};
use crate::error::{Error, Result};

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

/// What a compiled executable's runs record (the `profile` option, `KILN_PROFILE`).
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Profiling {
    #[default]
    Off,
    /// Time every step; print the table when the executable is dropped: every step when
    /// `all` (`KILN_PROFILE=all`), else the slowest (`KILN_PROFILE=1`).
    Table { all: bool },
    /// Time every step for the caller to read (`Executable::take_profile`,
    /// `CpuExecutable::step_times`); print nothing. Not settable from text.
    Collect,
    /// Time every step and write a Chrome trace-event file here (created at compile
    /// time, completed when the executable is dropped).
    Trace(PathBuf),
}

/// How algorithm choices are made (the `autotune`, `tune-cache` and `tune-force` keys;
/// the CPU backend's `tune` module says how each is used).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tuning {
    /// Time the candidates of choices the cache does not answer.
    pub measure: bool,
    /// The cache file consulted and (when measuring) updated. Setting `autotune` with no
    /// cache yet set names the default one (`$XDG_CACHE_HOME/kiln/tune.tsv`); `None` while
    /// measuring measures every compile and keeps nothing.
    pub cache: Option<PathBuf>,
    /// Use this algorithm wherever it is a candidate, whatever the rest says (to test
    /// or time one algorithm across a model).
    pub force: Option<String>,
}

/// How a graph compiles and runs. `Default` gives the default pipeline with no
/// debugging, on one thread per core; [`CompileOptions::from_env`] adds the `KILN_*`
/// variables.
#[derive(Debug, Clone)]
pub struct CompileOptions {
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
    /// What the executable's runs record (the CPU backend's; others ignore it).
    pub profile: Profiling,
    /// Threads one run may use; 0 means one per core (the CPU backend's).
    pub threads: usize,
    /// How per-shape algorithm choices are made (the CPU backend's).
    pub tuning: Tuning,
    /// Let a node no kernel covers run the reference interpreter's op on copies (the CPU
    /// backend's), an opt-in for debugging (`KILN_ALLOW_FALLBACK=1`). Off (the default),
    /// such a graph is a compile error naming the node, its op and its operands' types
    /// and shapes: the interpreter is the oracle, never a step of the product path.
    pub allow_fallback: bool,
}

impl Default for CompileOptions {
    fn default() -> CompileOptions {
        CompileOptions {
            pipeline: DEFAULT_PIPELINE.to_string(),
            dump_ir: DumpIr::Never,
            dump_ir_dir: None,
            pass_timing: false,
            disabled: vec![],
            rewrite_limit: None,
            fold_limit: 1 << 20,
            verify: cfg!(debug_assertions),
            layout_block: None,
            profile: Profiling::Off,
            threads: 0,
            tuning: Tuning::default(),
            allow_fallback: false,
        }
    }
}

impl CompileOptions {
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
        "profile",
        "threads",
        "autotune",
        "tune-cache",
        "tune-force",
        "allow-fallback",
    ];

    /// The defaults, then every `KILN_<KEY>` variable that is set.
    pub fn from_env() -> Result<CompileOptions> {
        let mut o = CompileOptions::default();
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
            "profile" => {
                self.profile = match value {
                    "" | "0" | "off" => Profiling::Off,
                    "1" | "table" => Profiling::Table { all: false },
                    "all" => Profiling::Table { all: true },
                    path => Profiling::Trace(PathBuf::from(path)),
                }
            }
            "threads" => self.threads = if value.is_empty() { 0 } else { count(value)? },
            "autotune" => {
                self.tuning.measure = flag(value)?;
                if self.tuning.measure && self.tuning.cache.is_none() {
                    self.tuning.cache = default_tune_cache();
                }
            }
            "tune-cache" => self.tuning.cache = (!value.is_empty()).then(|| PathBuf::from(value)),
            "tune-force" => self.tuning.force = (!value.is_empty()).then(|| value.to_string()),
            "allow-fallback" => self.allow_fallback = flag(value)?,
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

/// The tune cache `autotune` uses unless `tune-cache` names one:
/// `$XDG_CACHE_HOME/kiln/tune.tsv`, else `~/.cache/kiln/tune.tsv`.
fn default_tune_cache() -> Option<PathBuf> {
    let base = match std::env::var_os("XDG_CACHE_HOME") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(std::env::var_os("HOME")?).join(".cache"),
    };
    Some(base.join("kiln").join("tune.tsv"))
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
