//! Dead-code elimination: drops what no output, `Assign` or variable needs, and
//! renumbers the graph depth-first from its outputs (`Graph::compact`).
use super::{Changed, Pass, PassContext};
use crate::error::Result;
use crate::ir::Graph;

pub struct Dce;

impl Pass for Dce {
    fn name(&self) -> &'static str {
        "dce"
    }
    fn summary(&self) -> &'static str {
        "remove nodes nothing needs; renumber depth-first from the outputs"
    }
    fn fixpoint(&self) -> bool {
        false
    }
    fn run(&self, g: &mut Graph, _: &mut PassContext) -> Result<Changed> {
        Ok(g.compact())
    }
}
