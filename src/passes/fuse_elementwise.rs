//! Elementwise fusion: a tree of elementwise and broadcasting ops becomes one `Fused`
//! node, which a backend compiles into one loop over the output. Grown from the root
//! (reverse schedule) through operands that are elementwise ops with a single reader
//! (their results are never stored), and through operands of the root's type that
//! others read too, provided none of those others leads to the root: such a result is
//! exported as an extra output of the loop. The second kind is what an optimizer step
//! is made of (Adam's m' and v' are both stored and read by the weight update), and
//! exporting them makes the step one pass over the parameter's tensors instead of three.
use std::collections::{HashMap, HashSet};

use super::pattern::{ops, Pat, Uses};
use super::{replacement, sweep, Changed, Pass, PassContext};
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
    let mut shared = Shared {
        root: id,
        fusible: root,
        ancestors: None,
        exported: vec![],
    };
    collect(g, uses, id, member, &mut shared, &mut group);
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
    let mut attrs = Attrs::new().with("body", Attr::Strings(body));
    // Exported: the shared members read outside the group (a member whose other
    // reader is the root needs no output). In step order, so that the outputs come out
    // the same on every run.
    let mut steps: Vec<usize> = shared
        .exported
        .iter()
        .filter(|&&n| uses.users(n.into()).iter().any(|u| !index.contains_key(u)))
        .map(|n| index[n])
        .collect();
    steps.sort_unstable();
    if !steps.is_empty() {
        attrs.set(
            "outputs",
            Attr::Ints(steps.iter().map(|&k| k as i64).collect()),
        );
    }
    let Some(new) = replacement(g, id, id, "Fused", &ins, attrs, cx)? else {
        return Ok(false);
    };
    for (k, &step) in steps.iter().enumerate() {
        g.replace_uses(group[step].into(), new.out(k as u32 + 1))?;
    }
    Ok(true)
}

/// What `collect` needs to take in an operand that others read too.
struct Shared<'p> {
    root: NodeId,
    /// An elementwise op that can be a body step.
    fusible: &'p Pat,
    /// Every node the root depends on (data and control edges), computed on first need.
    ancestors: Option<HashSet<NodeId>>,
    /// The members that others read too: those read outside the group become extra
    /// outputs.
    exported: Vec<NodeId>,
}

impl Shared<'_> {
    /// Whether the operand `v` may join as an exported step: a fusible elementwise op of
    /// the root's type, that is no graph output, whose readers are the group-to-be's
    /// `reader` and nodes that do not lead to the root (else the fused node would
    /// depend on its own output).
    fn admits(&mut self, g: &Graph, uses: &Uses, v: Value, reader: NodeId) -> bool {
        if v.output != 0
            || uses.is_graph_output(v)
            || self.fusible.matches(g, uses, v).is_none()
            || g.node(v.node).outputs[0] != g.node(self.root).outputs[0]
        {
            return false;
        }
        let root = self.root;
        let ancestors = self.ancestors.get_or_insert_with(|| ancestors(g, root));
        uses.users(v)
            .iter()
            .all(|&u| u == reader || !ancestors.contains(&u))
    }
}

fn ancestors(g: &Graph, root: NodeId) -> HashSet<NodeId> {
    let mut seen = HashSet::new();
    let mut stack = vec![root];
    while let Some(id) = stack.pop() {
        let n = g.node(id);
        for p in n
            .inputs
            .iter()
            .flatten()
            .map(|v| v.node)
            .chain(n.control_deps.iter().copied())
        {
            if seen.insert(p) {
                stack.push(p);
            }
        }
    }
    seen
}

fn collect(
    g: &Graph,
    uses: &Uses,
    id: NodeId,
    member: &Pat,
    shared: &mut Shared,
    group: &mut Vec<NodeId>,
) {
    for v in g.node(id).inputs.iter().flatten() {
        if v.output != 0 || group.contains(&v.node) {
            continue;
        }
        if member.matches(g, uses, *v).is_some() {
            collect(g, uses, v.node, member, shared, group);
        } else if shared.admits(g, uses, *v, id) {
            shared.exported.push(v.node);
            collect(g, uses, v.node, member, shared, group);
        }
    }
    group.push(id);
}
