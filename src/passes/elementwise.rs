//! Elementwise fusion: a tree of elementwise and broadcasting ops whose inner results
//! nobody else reads becomes one `Fused` node, which a backend compiles into one loop
//! over the output (no intermediate tensor is stored). Grown from the root (reverse
//! schedule) through operands that are elementwise ops with a single reader.
use std::collections::HashMap;

use super::pattern::{ops, Pat, Uses};
use super::{replace_node, sweep, Changed, Pass, PassContext};
use crate::error::Result;
use crate::ir::ops::fused::{scalar_text, Arg, Step};
use crate::ir::{Attr, Attrs, Graph, Node, NodeId, Value};

pub struct FuseElementwise;

impl Pass for FuseElementwise {
    fn name(&self) -> &'static str {
        "fuse-elementwise"
    }
    fn summary(&self) -> &'static str {
        "fuse trees of elementwise/broadcast ops into one Fused op"
    }
    fn run(&self, g: &mut Graph, cx: &mut PassContext) -> Result<Changed> {
        let names: Vec<&str> = crate::ir::ops::catalogue()
            .values()
            .filter(|o| o.schema().family == "elementwise")
            .map(|o| o.schema().name)
            .collect();
        let root = ops(&names).when(fusible).pat();
        let member = ops(&names).when(fusible).single_use().pat();
        sweep(g, cx, true, |g, uses, id, cx| {
            fuse(g, uses, id, cx, &root, &member)
        })
    }
}

/// Whether every attribute can be written into a body step.
fn fusible(_: &Graph, n: &Node) -> bool {
    n.outputs.len() == 1 && n.attrs.iter().all(|(_, v)| scalar_text(v).is_some())
}

fn fuse(
    g: &mut Graph,
    uses: &Uses,
    id: NodeId,
    cx: &mut PassContext,
    root: &Pat,
    member: &Pat,
) -> Result<bool> {
    if root.matches(g, uses, id.into()).is_none() {
        return Ok(false);
    }
    // The group: the root and, transitively, operands that are single-reader
    // elementwise ops. Collected depth-first, so operands precede their readers.
    let mut group: Vec<NodeId> = vec![];
    collect(g, uses, id, member, &mut group);
    if group.len() < 2 {
        return Ok(false);
    }
    let index: HashMap<NodeId, usize> = group.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    let mut inputs: Vec<Value> = vec![];
    let mut body: Vec<String> = vec![];
    for &n in &group {
        let node = g.node(n);
        let args = node
            .inputs
            .iter()
            .map(|v| {
                v.map(|v| match index.get(&v.node) {
                    Some(&k) if v.output == 0 => Arg::Step(k),
                    _ => {
                        let k = inputs.iter().position(|&x| x == v).unwrap_or_else(|| {
                            inputs.push(v);
                            inputs.len() - 1
                        });
                        Arg::Input(k)
                    }
                })
            })
            .collect();
        let step = Step {
            op: node.op.clone(),
            args,
            attrs: node.attrs.clone(),
        };
        match step.text() {
            Ok(t) => body.push(t),
            Err(_) => return Ok(false),
        }
    }
    let ins: Vec<Option<Value>> = inputs.into_iter().map(Some).collect();
    let attrs = Attrs::new().with("body", Attr::Strings(body));
    replace_node(g, id, id, "Fused", &ins, attrs, cx)
}

fn collect(g: &Graph, uses: &Uses, id: NodeId, member: &Pat, group: &mut Vec<NodeId>) {
    for v in g.node(id).inputs.iter().flatten() {
        if v.output == 0 && !group.contains(&v.node) && member.matches(g, uses, *v).is_some() {
            collect(g, uses, v.node, member, group);
        }
    }
    group.push(id);
}
