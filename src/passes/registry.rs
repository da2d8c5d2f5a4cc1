//! The registry: every pass by its kebab-case name, the default pipeline, and the
//! parsing of a pipeline text (aliases expanded, unknown names refused with the list of
//! known ones).
use super::Pass;
use crate::error::{Error, Result};

/// The registry: every pass, by name, in the order of the default pipeline.
pub static PASSES: &[&dyn Pass] = &[
    &super::canonicalize::Canonicalize,
    &super::constant_fold::ConstantFold,
    &super::simplify::Simplify,
    &super::cse::Cse,
    &super::recognize::Recognize,
    &super::fold_batchnorm::FoldBatchNorm,
    &super::fuse_epilogue::FuseEpilogue,
    &super::fuse_quant::FuseQuant,
    &super::fuse_elementwise::FuseElementwise,
    &super::layout::Layout,
    &super::dce::Dce,
];

/// The pipeline `kiln_compile` and `kiln compile` run unless told otherwise.
pub const DEFAULT_PIPELINE: &str = "canonicalize,constant-fold,simplify,cse,recognize,\
fold-batchnorm,fuse-epilogue,fuse-quant,fuse-elementwise,layout,simplify,cse,dce";

/// Names that stand for several passes in a pipeline.
const ALIASES: &[(&str, &str)] = &[("fuse", "fold-batchnorm,fuse-epilogue,fuse-elementwise")];

/// The pass called `name`.
pub fn lookup(name: &str) -> Option<&'static dyn Pass> {
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

pub(super) fn unknown_pass(name: &str) -> Error {
    let known: Vec<&str> = PASSES.iter().map(|p| p.name()).collect();
    Error::InvalidArgument(format!(
        "unknown pass '{name}' (known: {}; alias fuse)",
        known.join(", ")
    ))
}
