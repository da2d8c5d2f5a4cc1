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
//! Debugging switches ([`CompileOptions::set`]; each also an environment variable
//! `KILN_<KEY>`, e.g. `KILN_DUMP_IR=after-all`): `dump-ir`
//! (`before-all|after-all|after=p1,p2|changed`), `dump-ir-dir` (one `.kir` file per
//! step instead of stderr), `pass-timing`, `disable-passes`, `rewrite-limit` (apply only
//! the first N rewrites: bisect a miscompile to one rewrite), `fold-limit`, and
//! `layout` (`plain` or `nchw16c`; unset, the backend chooses).
mod canonicalize;
mod constant_fold;
mod cse;
mod dce;
mod einsum;
mod fold_batchnorm;
mod fuse_elementwise;
mod fuse_epilogue;
mod fuse_quant;
mod layout;
mod manager;
mod options;
pub mod pattern;
mod recognize;
mod registry;
mod rewrite;
mod simplify;

pub use manager::{
    run_passes, run_pipeline, PassContext, PassRecord, PassReport, DUMP_ELIDE_LIMIT, MAX_ITERATIONS,
};
pub use options::{CompileOptions, DumpIr, Profiling, Tuning};
pub use registry::{lookup, parse_pipeline, DEFAULT_PIPELINE, PASSES};
use rewrite::{
    add_const, add_in_place_of, give_back_name, replace_node, replacement, sweep, try_add,
};
pub(crate) use {constant_fold::ConstantFold, simplify::InlineConstantIf};

use crate::error::Result;
use crate::ir::Graph;

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
