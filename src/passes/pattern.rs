//! The pattern matcher: "regular expressions for graphs".
//!
//! A [`Pat`] describes the values that flow into a root value: op-type nodes (one op or
//! alternatives), wildcards, constants, predicates on a node (attributes, shapes,
//! dtypes), captures (a name bound twice must bind the same value, so `x * sigmoid(x)`
//! is expressible), alternatives, optional nodes and repeated chains, and the
//! single-consumer constraint that a fusion needs before it may swallow a node. Nodes
//! with control dependencies never match: rewriting them would lose the order.
//! Matching walks operand edges upward from the root, backtracking over alternatives,
//! commutative operand orders and chain lengths.
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::ir::{Graph, Node, NodeId, Value};
use crate::tensor::Tensor;

/// Who reads each value, counting only nodes the graph still needs (dead nodes that a
/// rewrite left for `dce` do not count).
pub struct Uses {
    users: HashMap<Value, Vec<NodeId>>,
    live: Vec<bool>,
    outputs: HashSet<Value>,
}

impl Uses {
    pub(crate) fn new(g: &Graph) -> Uses {
        let mut live = vec![false; g.len()];
        let mut stack: Vec<NodeId> = g.outputs().iter().map(|o| o.value.node).collect();
        stack.extend(
            g.node_ids().filter(|&id| {
                matches!(g.node(id).op.as_str(), "Assign" | "Variable" | "Parameter")
            }),
        );
        while let Some(id) = stack.pop() {
            if std::mem::replace(&mut live[id.index()], true) {
                continue;
            }
            let n = g.node(id);
            stack.extend(n.inputs.iter().flatten().map(|v| v.node));
            stack.extend(n.control_deps.iter().copied());
        }
        let mut users: HashMap<Value, Vec<NodeId>> = HashMap::new();
        for id in g.node_ids().filter(|id| live[id.index()]) {
            for v in g.node(id).inputs.iter().flatten() {
                users.entry(*v).or_default().push(id);
            }
        }
        let outputs = g.outputs().iter().map(|o| o.value).collect();
        Uses {
            users,
            live,
            outputs,
        }
    }

    /// The live nodes reading `v`, once per operand slot.
    pub(crate) fn users(&self, v: Value) -> &[NodeId] {
        self.users.get(&v).map_or(&[], |u| u.as_slice())
    }

    pub(crate) fn is_live(&self, id: NodeId) -> bool {
        self.live.get(id.index()).copied().unwrap_or(false)
    }

    pub(crate) fn is_graph_output(&self, v: Value) -> bool {
        self.outputs.contains(&v)
    }

    /// Whether `id`'s outputs are read by exactly one operand slot in all, and none is a
    /// graph output: a fusion may then absorb the node.
    pub(crate) fn single_use(&self, g: &Graph, id: NodeId) -> bool {
        let n = g.node(id).outputs.len() as u32;
        let reads: usize = (0..n).map(|i| self.users(id.out(i)).len()).sum();
        reads == 1 && (0..n).all(|i| !self.is_graph_output(id.out(i)))
    }
}

/// A predicate on a matched node.
pub type NodePred = Arc<dyn Fn(&Graph, &Node) -> bool + Send + Sync>;
/// A predicate on a matched value.
pub type ValuePred = Arc<dyn Fn(&Graph, Value) -> bool + Send + Sync>;
/// A predicate on a matched constant's value.
pub type ConstPred = Arc<dyn Fn(&Tensor) -> bool + Send + Sync>;

/// A pattern over the value flowing into an operand.
#[derive(Clone)]
pub enum Pat {
    /// Any present value.
    Any,
    /// An omitted optional operand.
    Absent,
    /// The output of a `Constant` whose value satisfies the predicate.
    Const(Option<ConstPred>),
    /// A present value satisfying the predicate.
    Where(ValuePred),
    /// Output 0 of a node matching the node pattern.
    Node(Box<NodePat>),
    /// The first alternative that matches.
    Alt(Vec<Pat>),
    /// Binds the matched value to a name.
    Capture(String, Box<Pat>),
    /// `min..=max` nodes matching `step`, each feeding the next through operand
    /// `through`, above a value matching `below`; longest first. Each step's value is
    /// bound to `name` (root first). `min 0, max 1` is an optional node.
    Chain {
        step: Box<NodePat>,
        through: usize,
        min: usize,
        max: usize,
        below: Box<Pat>,
        name: Option<String>,
    },
}

/// A node: its op (one of `ops`), its operands (a prefix; unlisted operands are free),
/// and constraints.
#[derive(Clone)]
pub struct NodePat {
    ops: Vec<String>,
    args: Vec<Pat>,
    commutative: bool,
    single_use: bool,
    preds: Vec<NodePred>,
}

/// A node of op `name`.
pub(crate) fn op(name: &str) -> NodePat {
    ops(&[name])
}

/// A node of any of the ops `names`.
pub(crate) fn ops(names: &[&str]) -> NodePat {
    NodePat {
        ops: names.iter().map(|s| s.to_string()).collect(),
        args: vec![],
        commutative: false,
        single_use: false,
        preds: vec![],
    }
}

/// Any present value.
pub(crate) fn any() -> Pat {
    Pat::Any
}

/// A present value satisfying `f`.
pub(crate) fn value_where(f: impl Fn(&Graph, Value) -> bool + Send + Sync + 'static) -> Pat {
    Pat::Where(Arc::new(f))
}

/// Any value that is not a constant's.
pub(crate) fn non_constant() -> Pat {
    value_where(|g, v| g.node(v.node).op != "Constant")
}

/// Any constant.
pub(crate) fn constant() -> Pat {
    Pat::Const(None)
}

/// A constant every element of which satisfies `f` (read as f64).
pub(crate) fn const_where(f: impl Fn(f64) -> bool + Send + Sync + 'static) -> Pat {
    Pat::Const(Some(Arc::new(move |t: &Tensor| {
        !t.is_empty() && t.to_f64_vec().into_iter().all(&f)
    })))
}

/// A constant whose every element is `x`.
pub(crate) fn splat(x: f64) -> Pat {
    const_where(move |v| v == x)
}

/// The first of `alternatives` that matches.
pub(crate) fn alt(alternatives: Vec<Pat>) -> Pat {
    Pat::Alt(alternatives)
}

/// `step` above `below` (through operand `through`), or just `below`.
pub fn optional(step: NodePat, through: usize, below: Pat) -> Pat {
    chain(step, through, 0, 1, below)
}

/// Between `min` and `max` `step` nodes in a row above `below`.
pub fn chain(step: NodePat, through: usize, min: usize, max: usize, below: Pat) -> Pat {
    Pat::Chain {
        step: Box::new(step),
        through,
        min,
        max,
        below: Box::new(below),
        name: None,
    }
}

impl NodePat {
    /// The first operands' patterns, in order.
    pub(crate) fn args(mut self, args: Vec<Pat>) -> NodePat {
        self.args = args;
        self
    }

    /// The two operands may match in either order.
    pub(crate) fn commutative(mut self) -> NodePat {
        self.commutative = true;
        self
    }

    /// The node's outputs have exactly one reader and are not graph outputs.
    pub(crate) fn single_use(mut self) -> NodePat {
        self.single_use = true;
        self
    }

    /// A predicate on the node (its attributes, input and output types).
    pub(crate) fn when(
        mut self,
        f: impl Fn(&Graph, &Node) -> bool + Send + Sync + 'static,
    ) -> NodePat {
        self.preds.push(Arc::new(f));
        self
    }

    pub(crate) fn pat(self) -> Pat {
        Pat::Node(Box::new(self))
    }

    pub(crate) fn capture(self, name: &str) -> Pat {
        self.pat().capture(name)
    }
}

impl From<NodePat> for Pat {
    fn from(p: NodePat) -> Pat {
        p.pat()
    }
}

impl Pat {
    pub(crate) fn capture(self, name: &str) -> Pat {
        Pat::Capture(name.to_string(), Box::new(self))
    }

    /// For a chain: binds each step's value to `name`.
    pub fn each(self, name: &str) -> Pat {
        match self {
            Pat::Chain {
                step,
                through,
                min,
                max,
                below,
                ..
            } => Pat::Chain {
                step,
                through,
                min,
                max,
                below,
                name: Some(name.to_string()),
            },
            other => other.capture(name),
        }
    }

    /// Matches at `root`.
    pub(crate) fn matches(&self, g: &Graph, uses: &Uses, root: Value) -> Option<Match> {
        let mut m = Matcher {
            g,
            uses,
            caps: vec![],
        };
        let ok = m.pat(self, Some(root));
        ok.then_some(Match { caps: m.caps })
    }
}

/// What a match bound.
#[derive(Debug, Clone)]
pub struct Match {
    caps: Vec<(String, Value)>,
}

impl Match {
    /// The value bound to `name` (the first, for a chain).
    pub(crate) fn get(&self, name: &str) -> Option<Value> {
        self.caps.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
    }

    /// The value bound to `name`; the pattern guarantees it.
    pub(crate) fn value(&self, name: &str) -> Value {
        self.get(name)
            .unwrap_or_else(|| panic!("pattern has no capture '{name}'"))
    }

    /// The node of the value bound to `name`.
    pub(crate) fn node(&self, name: &str) -> NodeId {
        self.value(name).node
    }

    /// Every value bound to `name`, in binding order.
    pub fn all(&self, name: &str) -> Vec<Value> {
        self.caps
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| *v)
            .collect()
    }
}

struct Matcher<'a> {
    g: &'a Graph,
    uses: &'a Uses,
    caps: Vec<(String, Value)>,
}

impl Matcher<'_> {
    /// Tries `p` at `v`; on failure the captures are as before.
    fn pat(&mut self, p: &Pat, v: Option<Value>) -> bool {
        let mark = self.caps.len();
        let ok = self.pat_inner(p, v);
        if !ok {
            self.caps.truncate(mark);
        }
        ok
    }

    fn pat_inner(&mut self, p: &Pat, v: Option<Value>) -> bool {
        let Some(v) = v else {
            // An omitted operand: only Absent matches it, perhaps inside Alt or Capture.
            return match p {
                Pat::Absent => true,
                Pat::Alt(alts) => alts.iter().any(|a| self.pat(a, None)),
                Pat::Capture(_, inner) => self.pat(inner, None),
                _ => false,
            };
        };
        match p {
            Pat::Any => true,
            Pat::Absent => false,
            Pat::Where(f) => f(self.g, v),
            Pat::Const(pred) => {
                let n = self.g.node(v.node);
                n.op == "Constant"
                    && match (pred, &n.data) {
                        (None, _) => true,
                        (Some(f), Some(t)) => f(t),
                        (Some(_), None) => false,
                    }
            }
            Pat::Node(np) => v.output == 0 && self.node(np, v.node),
            Pat::Alt(alts) => alts.iter().any(|a| self.pat(a, Some(v))),
            Pat::Capture(name, inner) => {
                if let Some((_, bound)) = self.caps.iter().find(|(n, _)| n == name) {
                    if *bound != v {
                        return false;
                    }
                }
                if !self.pat(inner, Some(v)) {
                    return false;
                }
                self.caps.push((name.clone(), v));
                true
            }
            Pat::Chain {
                step,
                through,
                min,
                max,
                below,
                name,
            } => {
                // The longest run of step nodes first, then shorter ones.
                let mut run = vec![];
                let mut cur = Some(v);
                while run.len() < *max {
                    let Some(c) = cur else { break };
                    let mark = self.caps.len();
                    if c.output != 0 || !self.node(step, c.node) {
                        self.caps.truncate(mark);
                        break;
                    }
                    self.caps.truncate(mark);
                    run.push(c);
                    cur = self.g.node(c.node).inputs.get(*through).copied().flatten();
                }
                for k in (*min..=run.len()).rev() {
                    let mark = self.caps.len();
                    let start = if k == 0 {
                        Some(v)
                    } else {
                        self.g
                            .node(run[k - 1].node)
                            .inputs
                            .get(*through)
                            .copied()
                            .flatten()
                    };
                    // Re-match the steps for their captures, then what lies below.
                    let steps_ok = run[..k].iter().all(|s| self.node(step, s.node));
                    if steps_ok && self.pat(below, start) {
                        if let Some(name) = name {
                            for s in &run[..k] {
                                self.caps.push((name.clone(), *s));
                            }
                        }
                        return true;
                    }
                    self.caps.truncate(mark);
                }
                false
            }
        }
    }

    fn node(&mut self, p: &NodePat, id: NodeId) -> bool {
        let n = self.g.node(id);
        // A node ordered by control dependencies keeps its place: a rewrite would drop
        // the order along with the node.
        if !p.ops.contains(&n.op) || !n.control_deps.is_empty() {
            return false;
        }
        if p.single_use && !self.uses.single_use(self.g, id) {
            return false;
        }
        if !p.preds.iter().all(|f| f(self.g, n)) {
            return false;
        }
        // Operands past the node's last are omitted ones.
        let operand = |i: usize| n.inputs.get(i).copied().flatten();
        let mark = self.caps.len();
        let in_order = p
            .args
            .iter()
            .enumerate()
            .all(|(i, a)| self.pat(a, operand(i)));
        if in_order {
            return true;
        }
        self.caps.truncate(mark);
        if p.commutative && p.args.len() == 2 && n.inputs.len() == 2 {
            let swapped = self.pat(&p.args[0], operand(1)) && self.pat(&p.args[1], operand(0));
            if swapped {
                return true;
            }
            self.caps.truncate(mark);
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::text;

    fn graph(body: &str) -> Graph {
        let src = format!("graph \"t\" {{\n{body}\n}}\n");
        text::parse(&src, "t.kir", None).unwrap()
    }

    /// The first output of the node called `name`.
    fn v(g: &Graph, name: &str) -> Value {
        g.find(name).expect("node exists").into()
    }

    const CHAIN: &str = r#"
  %0 "x" = Parameter : f32[2, 3]
  %1 "c" = Constant : f32[3] = [1, 2, 3]
  %2 "a" = Add(%0, %1) : f32[2, 3]
  %3 "r1" = Relu(%2) : f32[2, 3]
  %4 "r2" = Relu(%3) : f32[2, 3]
  %5 "s" = Sigmoid(%4) : f32[2, 3]
  %6 "m" = Mul(%5, %0) : f32[2, 3]
  return "y" = %6, "a" = %2"#;

    #[test]
    fn op_types_wildcards_and_captures() {
        let g = graph(CHAIN);
        let uses = Uses::new(&g);
        let p = op("Add")
            .args(vec![any().capture("x"), constant().capture("c")])
            .pat();
        let m = p.matches(&g, &uses, v(&g, "a")).expect("Add(x, const)");
        assert_eq!(m.value("x"), v(&g, "x"));
        assert_eq!(m.value("c"), v(&g, "c"));
        assert!(
            p.matches(&g, &uses, v(&g, "r1")).is_none(),
            "a Relu is not an Add"
        );
        // Alternatives of op types, and predicates on the node.
        let p = ops(&["Sigmoid", "Tanh"])
            .when(|_, n| n.outputs[0].rank() == 2)
            .pat();
        assert!(p.matches(&g, &uses, v(&g, "s")).is_some());
        let p = ops(&["Sigmoid"])
            .when(|_, n| n.outputs[0].rank() == 3)
            .pat();
        assert!(p.matches(&g, &uses, v(&g, "s")).is_none());
    }

    #[test]
    fn a_name_bound_twice_binds_one_value() {
        let g = graph(CHAIN);
        let uses = Uses::new(&g);
        // m = sigmoid(...) * x: x must be the same value on both sides.
        let x = || any().capture("x");
        let same = op("Mul")
            .args(vec![op("Sigmoid").args(vec![x()]).pat(), x()])
            .pat();
        assert!(
            same.matches(&g, &uses, v(&g, "m")).is_none(),
            "Sigmoid reads r2, not x"
        );
        let deep = op("Mul").args(vec![any(), any().capture("x")]).pat();
        assert_eq!(
            deep.matches(&g, &uses, v(&g, "m")).unwrap().value("x"),
            v(&g, "x")
        );
    }

    #[test]
    fn commutative_operands_match_either_way() {
        let g = graph(CHAIN);
        let uses = Uses::new(&g);
        let p = |comm: bool| {
            let n = op("Mul").args(vec![any().capture("x"), op("Sigmoid").pat()]);
            if comm { n.commutative() } else { n }.pat()
        };
        assert!(p(false).matches(&g, &uses, v(&g, "m")).is_none());
        let m = p(true).matches(&g, &uses, v(&g, "m")).unwrap();
        assert_eq!(m.value("x"), v(&g, "x"));
    }

    #[test]
    fn single_use_sees_graph_outputs_and_readers() {
        let g = graph(CHAIN);
        let uses = Uses::new(&g);
        // "a" is a graph output as well as Relu's operand: not single-use.
        let p = op("Relu").args(vec![op("Add").single_use().pat()]).pat();
        assert!(p.matches(&g, &uses, v(&g, "r1")).is_none());
        let p = op("Relu").args(vec![op("Relu").single_use().pat()]).pat();
        assert!(p.matches(&g, &uses, v(&g, "r2")).is_some());
        // x is read by the Add and the Mul.
        assert_eq!(uses.users(v(&g, "x")).len(), 2);
        assert!(!uses.single_use(&g, v(&g, "x").node));
    }

    #[test]
    fn chains_take_the_longest_run_that_lets_the_rest_match() {
        let g = graph(CHAIN);
        let uses = Uses::new(&g);
        let relus = chain(op("Relu"), 0, 1, 5, op("Add").pat().capture("base")).each("relu");
        let m = relus.matches(&g, &uses, v(&g, "r2")).unwrap();
        assert_eq!(m.all("relu"), vec![v(&g, "r2"), v(&g, "r1")]);
        assert_eq!(m.value("base"), v(&g, "a"));
        // At most one Relu: r2 then r1 is not an Add, so no match.
        let one = chain(op("Relu"), 0, 1, 1, op("Add").pat());
        assert!(one.matches(&g, &uses, v(&g, "r2")).is_none());
        // Backtracking: below must match Relu, so the chain stops one short.
        let short = chain(op("Relu"), 0, 1, 5, op("Relu").pat().capture("last")).each("relu");
        let m = short.matches(&g, &uses, v(&g, "r2")).unwrap();
        assert_eq!(m.all("relu"), vec![v(&g, "r2")]);
        assert_eq!(m.value("last"), v(&g, "r1"));
    }

    #[test]
    fn optional_nodes_and_omitted_operands() {
        let g = graph(
            r#"
  %0 "x" = Parameter : f32[1, 1, 4, 4]
  %1 "w" = Constant : f32[1, 1, 1, 1] = [2]
  %2 "conv" = Conv(%0, %1) : f32[1, 1, 4, 4]
  %3 "relu" = Relu(%2) : f32[1, 1, 4, 4]
  return "y" = %3, "z" = %2"#,
        );
        let uses = Uses::new(&g);
        let conv = || {
            op("Conv")
                .args(vec![any(), constant(), Pat::Absent])
                .capture("conv")
        };
        let p = optional(op("Relu"), 0, conv()).each("act");
        let at_relu = p.matches(&g, &uses, v(&g, "relu")).unwrap();
        assert_eq!(at_relu.all("act").len(), 1);
        let at_conv = p.matches(&g, &uses, v(&g, "conv")).unwrap();
        assert!(at_conv.all("act").is_empty());
        assert_eq!(at_conv.value("conv"), v(&g, "conv"));
        // Conv has no bias: a pattern that wants one fails; Alt takes either.
        let biased = op("Conv").args(vec![any(), constant(), constant()]).pat();
        assert!(biased.matches(&g, &uses, v(&g, "conv")).is_none());
        let either = op("Conv")
            .args(vec![any(), constant(), alt(vec![constant(), Pat::Absent])])
            .pat();
        assert!(either.matches(&g, &uses, v(&g, "conv")).is_some());
    }

    #[test]
    fn constant_predicates_read_values() {
        let g = graph(CHAIN);
        let uses = Uses::new(&g);
        let add = |c: Pat| op("Add").args(vec![any(), c]).pat();
        assert!(add(splat(1.0)).matches(&g, &uses, v(&g, "a")).is_none());
        assert!(add(const_where(|x| x > 0.0))
            .matches(&g, &uses, v(&g, "a"))
            .is_some());
        assert!(add(const_where(|x| x > 1.0))
            .matches(&g, &uses, v(&g, "a"))
            .is_none());
    }

    #[test]
    fn nodes_ordered_by_control_dependencies_do_not_match() {
        let mut g = graph(CHAIN);
        let (r1, r2) = (g.find("r1").unwrap(), g.find("r2").unwrap());
        let uses = Uses::new(&g);
        let p = op("Relu").args(vec![op("Relu").pat()]).pat();
        assert!(p.matches(&g, &uses, r2.into()).is_some());
        g.add_control_dep(r2, r1).unwrap();
        assert!(p.matches(&g, &uses, r2.into()).is_none());
    }
}
