//! Tree ensembles of `ai.onnx.ml`: `TreeEnsemble` (opset 5) and the older
//! `TreeEnsembleRegressor` and `TreeEnsembleClassifier` (opsets 1 and 3, what skl2onnx
//! exports). All three read their attributes into one [`Forest`] and share its walker,
//! aggregation and post-transforms; the classifier's binary and label rules follow the
//! ONNX reference implementation (which onnxruntime agrees with).
use crate::ir::ops::{InPlace, Origin};
use std::collections::{BTreeMap, HashMap};

use super::{leak, AttrSpec, EvalCtx, InferCtx, Op, OpSchema};
use crate::ir::{AttrKind, Attrs, DType, Dim, Shape, TensorType};
use crate::tensor::Tensor;

/// Where a branch leads.
#[derive(Clone, Copy, Debug)]
enum Child {
    Branch(usize),
    Leaf(usize),
}

/// A branch's test of its feature `x` against its split value.
#[derive(Debug)]
enum Rule {
    Leq,
    Lt,
    Gte,
    Gt,
    Eq,
    Neq,
    Member(Vec<f64>),
}

#[derive(Debug)]
struct Branch {
    feature: usize,
    rule: Rule,
    split: f64,
    /// Whether a missing (NaN) feature takes the true branch whatever the rule says.
    missing_true: bool,
    yes: Child,
    no: Child,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Aggregate {
    Average,
    Sum,
    Min,
    Max,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum PostTransform {
    None,
    Softmax,
    Logistic,
    SoftmaxZero,
    Probit,
}

impl PostTransform {
    fn parse(name: &str) -> Result<PostTransform, String> {
        Ok(match name {
            "NONE" => PostTransform::None,
            "SOFTMAX" => PostTransform::Softmax,
            "LOGISTIC" => PostTransform::Logistic,
            "SOFTMAX_ZERO" => PostTransform::SoftmaxZero,
            "PROBIT" => PostTransform::Probit,
            other => {
                return Err(format!(
                "post_transform must be NONE, SOFTMAX, LOGISTIC, SOFTMAX_ZERO or PROBIT, got '{other}'"
            ))
            }
        })
    }

    /// Transforms one row of scores in place, as the ONNX reference does.
    fn apply(self, scores: &mut [f64]) {
        match self {
            PostTransform::None => {}
            PostTransform::Logistic => {
                for s in scores.iter_mut() {
                    let v = 1.0 / (1.0 + (-s.abs()).exp());
                    *s = if *s < 0.0 { 1.0 - v } else { v };
                }
            }
            PostTransform::Softmax => {
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let mut sum = 0.0;
                for s in scores.iter_mut() {
                    *s = (*s - max).exp();
                    sum += *s;
                }
                for s in scores.iter_mut() {
                    *s /= sum;
                }
            }
            PostTransform::SoftmaxZero => {
                // Scores of (near) zero stay zero: they are classes no tree voted for.
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let exp_neg_max = (-max).exp();
                let mut sum = 0.0;
                for s in scores.iter_mut() {
                    *s = if s.abs() > 1e-7 {
                        (*s - max).exp()
                    } else {
                        *s * exp_neg_max
                    };
                    sum += *s;
                }
                for s in scores.iter_mut() {
                    *s = if sum == 0.0 { 0.5 } else { *s / sum };
                }
            }
            PostTransform::Probit => {
                for s in scores.iter_mut() {
                    *s = std::f64::consts::SQRT_2 * erf_inv(*s * 2.0 - 1.0);
                }
            }
        }
    }
}

/// The approximation of the inverse error function ONNX's reference and onnxruntime use
/// for PROBIT (Winitzki's, a = 0.147).
fn erf_inv(x: f64) -> f64 {
    let sign = if x < 0.0 { -1.0 } else { 1.0 };
    let x = (1.0 - x) * (1.0 + x);
    if x == 0.0 {
        return 0.0;
    }
    let log = x.ln();
    let v = 2.0 / (std::f64::consts::PI * 0.147) + 0.5 * log;
    let v2 = log / 0.147;
    sign * (-v + (v * v - v2).sqrt()).sqrt()
}

/// Every tree of an ensemble, in one form whatever attributes described it: the
/// branches packed for the walk ([`Node`], 24 bytes: a forest of a few thousand nodes
/// stays in L1), each leaf's weights in one flat list.
#[derive(Debug)]
struct Forest {
    nodes: Vec<Node>,
    /// The sets of the `Member` branches, indexed by their `split`.
    sets: Vec<Vec<f64>>,
    /// Leaf l's (target, weight) pairs are `weights[leaf_start[l]..leaf_start[l + 1]]`.
    leaf_start: Vec<usize>,
    weights: Vec<(usize, f64)>,
    /// Each tree's root, a [`Node`] child.
    roots: Vec<u32>,
    max_feature: Option<usize>,
    max_target: Option<usize>,
    targets: usize,
    aggregate: Aggregate,
    post: PostTransform,
    /// The same trees for the walk without jumps, when they allow it.
    uniform: Option<Uniform>,
}

/// A forest whose branches all compare by one rule (not a set), again: each leaf is a
/// node that leads to itself, so a walk needs no test of where it is: each step is a
/// load and a select with no jump to mispredict, and all of a tree's walks step together
/// until they are all at leaves. The comparisons and the
/// leaves reached are the branchy walk's.
#[derive(Debug)]
struct Uniform {
    rule: u8,
    /// Branch i, then leaf l at `branches + l`.
    nodes: Vec<Node>,
    branches: u32,
    /// Each tree's root (in `nodes`) and its shortest and longest paths' branches.
    roots: Vec<(u32, (u32, u32))>,
}

impl Uniform {
    /// Walks each row's tree from `at` (row r's at `x[r·features..]`) to its leaf by
    /// rule `RULE`, leaving each at its leaf tagged with [`LEAF`].
    fn walk<const RULE: u8>(&self, x: &[f64], features: usize, steps: (u32, u32), at: &mut [u32]) {
        let (shortest, longest) = steps;
        for step in 0..longest {
            // Past the shortest path, stop once every walk is at its leaf (an unbalanced
            // tree's longest path is rarely the rows' path).
            if step >= shortest && at.iter().all(|&a| a >= self.branches) {
                break;
            }
            for (r, a) in at.iter_mut().enumerate() {
                let n = &self.nodes[*a as usize];
                let v = x[r * features + n.feature as usize];
                let holds = match RULE {
                    0 => v <= n.split,
                    1 => v < n.split,
                    2 => v >= n.split,
                    3 => v > n.split,
                    4 => v == n.split,
                    _ => v != n.split,
                } | (n.missing_true & v.is_nan());
                *a = if holds { n.yes } else { n.no };
            }
        }
        for a in at {
            *a = (*a - self.branches) | LEAF;
        }
    }

    /// `None` for mixed rules, sets, or branches that form a cycle (the branchy walk
    /// reports it).
    fn new(nodes: &[Node], leaves: usize, roots: &[u32]) -> Option<Uniform> {
        let rule = nodes.first().map_or(0, |n| n.rule);
        if nodes
            .iter()
            .any(|n| n.rule != rule || n.rule == RULE_MEMBER)
        {
            return None;
        }
        let branches = u32::try_from(nodes.len()).ok()?;
        let total = u32::try_from(nodes.len() + leaves).ok()?;
        let at = |c: u32| {
            if c & LEAF != 0 {
                branches + (c & !LEAF)
            } else {
                c
            }
        };
        let mut fast: Vec<Node> = nodes
            .iter()
            .map(|n| Node {
                yes: at(n.yes),
                no: at(n.no),
                ..*n
            })
            .collect();
        fast.extend((branches..total).map(|i| Node {
            split: 0.0,
            feature: 0,
            yes: i,
            no: i,
            rule,
            missing_true: false,
        }));
        // Shortest and longest paths by an iterative post-order walk; a node met again
        // while still open is on a cycle.
        const OPEN: (u32, u32) = (u32::MAX, u32::MAX);
        let mut depth: Vec<Option<(u32, u32)>> = vec![None; nodes.len()];
        let of = |depth: &[Option<(u32, u32)>], c: u32| {
            if c >= branches {
                Some((0, 0))
            } else {
                depth[c as usize]
            }
        };
        let mut stack = vec![];
        let mut tree_roots = Vec::with_capacity(roots.len());
        for &root in roots {
            let r = at(root);
            stack.push(r);
            while let Some(&b) = stack.last() {
                let n = fast[b as usize];
                match (of(&depth, n.yes), of(&depth, n.no)) {
                    (Some(OPEN), _) | (_, Some(OPEN)) => return None,
                    (Some(y), Some(o)) => {
                        if b < branches {
                            depth[b as usize] = Some((1 + y.0.min(o.0), 1 + y.1.max(o.1)));
                        }
                        stack.pop();
                    }
                    _ => {
                        depth[b as usize] = Some(OPEN);
                        for c in [n.yes, n.no] {
                            if of(&depth, c).is_none() {
                                stack.push(c);
                            }
                        }
                    }
                }
            }
            tree_roots.push((r, of(&depth, r)?));
        }
        Some(Uniform {
            rule,
            nodes: fast,
            branches,
            roots: tree_roots,
        })
    }
}

/// A branch as the walk reads it. A child is a branch index, or a leaf index with
/// [`LEAF`] set.
#[derive(Clone, Copy, Debug)]
struct Node {
    /// The split value; for [`RULE_MEMBER`], the index of the set in `Forest::sets`.
    split: f64,
    feature: u32,
    yes: u32,
    no: u32,
    rule: u8,
    missing_true: bool,
}

const LEAF: u32 = 1 << 31;
const RULE_MEMBER: u8 = 6;

impl Forest {
    fn new(
        branches: Vec<Branch>,
        leaves: Vec<Vec<(usize, f64)>>,
        roots: Vec<Child>,
        targets: usize,
        aggregate: Aggregate,
        post: PostTransform,
    ) -> Result<Forest, String> {
        let counts = (branches.len(), leaves.len());
        let too_many = || format!("{} branches or {} leaves are too many", counts.0, counts.1);
        let child = |c: Child| -> Result<u32, String> {
            let (i, tag) = match c {
                Child::Branch(b) => (b, 0),
                Child::Leaf(l) => (l, LEAF),
            };
            u32::try_from(i)
                .ok()
                .filter(|&i| i < LEAF)
                .map(|i| i | tag)
                .ok_or_else(too_many)
        };
        let max_feature = branches.iter().map(|b| b.feature).max();
        let mut sets = vec![];
        let mut nodes = Vec::with_capacity(branches.len());
        for b in branches {
            let (rule, split) = match b.rule {
                Rule::Leq => (0, b.split),
                Rule::Lt => (1, b.split),
                Rule::Gte => (2, b.split),
                Rule::Gt => (3, b.split),
                Rule::Eq => (4, b.split),
                Rule::Neq => (5, b.split),
                Rule::Member(set) => {
                    sets.push(set);
                    (RULE_MEMBER, (sets.len() - 1) as f64)
                }
            };
            nodes.push(Node {
                split,
                feature: u32::try_from(b.feature)
                    .map_err(|_| format!("feature index {} is too large", b.feature))?,
                yes: child(b.yes)?,
                no: child(b.no)?,
                rule,
                missing_true: b.missing_true,
            });
        }
        let mut leaf_start = Vec::with_capacity(leaves.len() + 1);
        let mut weights = vec![];
        for leaf in leaves {
            leaf_start.push(weights.len());
            weights.extend(leaf);
        }
        leaf_start.push(weights.len());
        let max_target = weights.iter().map(|&(t, _)| t).max();
        let roots: Vec<u32> = roots.into_iter().map(child).collect::<Result<_, _>>()?;
        Ok(Forest {
            uniform: Uniform::new(&nodes, leaf_start.len() - 1, &roots),
            nodes,
            sets,
            leaf_start,
            weights,
            roots,
            max_feature,
            max_target,
            targets,
            aggregate,
            post,
        })
    }

    /// The largest feature index a branch reads.
    fn max_feature(&self) -> Option<usize> {
        self.max_feature
    }

    /// Steps each walk in `at` (row r's at `x[r·features..]`) until all reach leaves.
    /// The walks are independent: interleaved, their loads overlap.
    fn walk(&self, x: &[f64], features: usize, at: &mut [u32]) -> Result<(), String> {
        // A walk longer than the number of branches has gone round a cycle.
        for _ in 0..=self.nodes.len() {
            let mut done = true;
            for (r, a) in at.iter_mut().enumerate() {
                if *a & LEAF != 0 {
                    continue;
                }
                done = false;
                let n = self.nodes[*a as usize];
                let x = x[r * features + n.feature as usize];
                let holds = match n.rule {
                    0 => x <= n.split,
                    1 => x < n.split,
                    2 => x >= n.split,
                    3 => x > n.split,
                    4 => x == n.split,
                    5 => x != n.split,
                    _ => self.sets[n.split as usize].contains(&x),
                };
                // Comparisons with NaN are IEEE's (only Neq holds), unless missing is true.
                *a = if holds || (n.missing_true && x.is_nan()) {
                    n.yes
                } else {
                    n.no
                };
            }
            if done {
                return Ok(());
            }
        }
        Err("the trees' branches form a cycle".into())
    }

    /// The aggregated scores per target of the `rows` rows of `x` (`features` each) into
    /// `scores` (`width` per row); `seen[r·width + t]` says whether a leaf reached
    /// scored target t of row r (else its score is 0). Each row sums its trees in
    /// order, whatever the interleaving.
    fn scores_into(
        &self,
        x: &[f64],
        [rows, features]: [usize; 2],
        scores: &mut [f64],
        seen: &mut [bool],
    ) -> Result<(), String> {
        if let Some(f) = self.max_feature.filter(|&f| f >= features) {
            return Err(format!(
                "a branch reads feature {f} of rows of {features} features"
            ));
        }
        let width = scores.len() / rows.max(1);
        if let Some(t) = self.max_target.filter(|&t| t >= width) {
            return Err(format!("target {t} is out of range"));
        }
        scores.fill(0.0);
        seen.fill(false);
        const WALKS: usize = 16;
        for start in (0..rows).step_by(WALKS) {
            let block = WALKS.min(rows - start);
            let x = &x[start * features..];
            let mut at = [0u32; WALKS];
            for (t, &root) in self.roots.iter().enumerate() {
                let at = &mut at[..block];
                match &self.uniform {
                    Some(u) => {
                        let (root, steps) = u.roots[t];
                        at.fill(root);
                        match u.rule {
                            0 => u.walk::<0>(x, features, steps, at),
                            1 => u.walk::<1>(x, features, steps, at),
                            2 => u.walk::<2>(x, features, steps, at),
                            3 => u.walk::<3>(x, features, steps, at),
                            4 => u.walk::<4>(x, features, steps, at),
                            _ => u.walk::<5>(x, features, steps, at),
                        }
                    }
                    None => {
                        at.fill(root);
                        self.walk(x, features, at)?;
                    }
                }
                for (r, &leaf) in at.iter().enumerate() {
                    let leaf = (leaf & !LEAF) as usize;
                    let row = (start + r) * width;
                    for &(target, weight) in
                        &self.weights[self.leaf_start[leaf]..self.leaf_start[leaf + 1]]
                    {
                        let (slot, seen) = (&mut scores[row + target], &mut seen[row + target]);
                        *slot = match (*seen, self.aggregate) {
                            (false, _) => weight,
                            (true, Aggregate::Sum | Aggregate::Average) => *slot + weight,
                            (true, Aggregate::Min) => slot.min(weight),
                            (true, Aggregate::Max) => slot.max(weight),
                        };
                        *seen = true;
                    }
                }
            }
        }
        if self.aggregate == Aggregate::Average && !self.roots.is_empty() {
            let trees = self.roots.len() as f64;
            for s in scores.iter_mut() {
                *s /= trees;
            }
        }
        Ok(())
    }

    /// The rows of `x` ([N, F], or [F] for one row) as f64.
    fn rows(x: &Tensor) -> (usize, usize, Vec<f64>) {
        let values = x.to_f64_vec();
        match x.shape() {
            [n, f] => (*n, *f, values),
            _ => (1, values.len(), values),
        }
    }
}

/// A tree ensemble read from its attributes once, for a backend that runs it many times
/// with the interpreter's own walk (so with its results): a regressor's or a
/// classifier's scores per row, post-transformed.
pub struct Ensemble {
    forest: Forest,
    base: Vec<f64>,
    /// A classifier's labels, and the one class every weight is for when binary.
    classifier: Option<(Labels, Option<usize>)>,
}

impl Ensemble {
    /// The ensemble of op `op` (`TreeEnsemble`, `TreeEnsembleRegressor` or
    /// `TreeEnsembleClassifier`) with `attrs`.
    pub fn new(op: &str, attrs: &Attrs) -> Result<Ensemble, String> {
        Ok(match op {
            "TreeEnsemble" => Ensemble {
                forest: forest_v5(attrs)?,
                base: vec![],
                classifier: None,
            },
            "TreeEnsembleRegressor" => {
                let (forest, base) = regressor_forest(attrs)?;
                Ensemble {
                    forest,
                    base,
                    classifier: None,
                }
            }
            "TreeEnsembleClassifier" => {
                let c = classifier(attrs)?;
                Ensemble {
                    forest: c.forest,
                    base: c.base,
                    classifier: Some((c.labels, c.binary)),
                }
            }
            other => return Err(format!("{other} is not a tree ensemble")),
        })
    }

    /// Scores per row: targets or classes.
    pub fn width(&self) -> usize {
        self.forest.targets
    }

    /// The features a row needs at least.
    pub fn features(&self) -> usize {
        self.forest.max_feature().map_or(0, |f| f + 1)
    }

    /// A classifier's integer labels (`None`: a regressor, or string labels).
    pub fn int_labels(&self) -> Option<&[i64]> {
        match &self.classifier {
            Some((Labels::Ints(v), _)) => Some(v),
            _ => None,
        }
    }

    /// The post-transformed scores of the rows of `x` (`features` each; as many as
    /// `picks`) into `scores` (`width` per row; `seen` is as long, scratch), and each
    /// row's index of its first largest score (a classifier's pick) into `picks`.
    pub fn rows(
        &self,
        x: &[f64],
        features: usize,
        scores: &mut [f64],
        seen: &mut [bool],
        picks: &mut [usize],
    ) -> Result<(), String> {
        self.forest
            .scores_into(x, [picks.len(), features], scores, seen)?;
        let base = |k: usize| match self.base.len() {
            0 => 0.0,
            1 if self.classifier.is_some() => self.base[0],
            _ => self.base.get(k).copied().unwrap_or(0.0),
        };
        let width = self.width();
        for (scores, pick) in scores.chunks_exact_mut(width.max(1)).zip(picks) {
            match &self.classifier {
                Some((_, Some(k))) => {
                    // Binary: the one class's score s gives the pair (1 - s, s) or (-s, s).
                    let s = scores.get(*k).copied().unwrap_or(0.0) + base(*k);
                    let other = match self.forest.post {
                        PostTransform::None | PostTransform::Probit => 1.0 - s,
                        _ => -s,
                    };
                    if let [a, b] = scores {
                        (*a, *b) = (other, s);
                    }
                }
                _ => {
                    for (k, s) in scores.iter_mut().enumerate() {
                        *s += base(k);
                    }
                }
            }
            self.forest.post.apply(scores);
            // The first largest score wins, as numpy's argmax.
            *pick = scores
                .iter()
                .enumerate()
                .fold(0, |best, (k, &s)| if s > scores[best] { k } else { best });
        }
        Ok(())
    }

    /// Every row of `x`: the scores [N × width] and each row's pick.
    fn run(&self, x: &Tensor) -> Result<(usize, Vec<f64>, Vec<usize>), String> {
        let (n, features, values) = Forest::rows(x);
        let width = self.width();
        super::util::check_size(&[n, width])?;
        let mut scores = vec![0.0; n * width];
        let mut seen = vec![false; n * width];
        let mut picks = vec![0; n];
        let values = values.get(..n * features).unwrap_or(&[]);
        self.rows(values, features, &mut scores, &mut seen, &mut picks)?;
        Ok((n, scores, picks))
    }
}

fn aggregate_by_name(name: &str) -> Result<Aggregate, String> {
    Ok(match name {
        "AVERAGE" => Aggregate::Average,
        "SUM" => Aggregate::Sum,
        "MIN" => Aggregate::Min,
        "MAX" => Aggregate::Max,
        other => {
            return Err(format!(
                "aggregate_function must be AVERAGE, SUM, MIN or MAX, got '{other}'"
            ))
        }
    })
}

fn index(v: i64, what: &str, len: usize) -> Result<usize, String> {
    usize::try_from(v)
        .ok()
        .filter(|&i| i < len)
        .ok_or_else(|| format!("{what} {v} is out of range (0..{len})"))
}

/// `n_targets`, within the reference interpreter's size limit (it sizes every output row).
fn target_count(n: i64) -> Result<usize, String> {
    let n = usize::try_from(n).map_err(|_| format!("n_targets must not be negative, got {n}"))?;
    super::util::check_size(&[n])?;
    Ok(n)
}

fn ints<'a>(attrs: &'a Attrs, name: &str) -> Result<&'a [i64], String> {
    Ok(attrs.ints(name)?.unwrap_or(&[]))
}

fn floats(attrs: &Attrs, name: &str) -> Result<Vec<f64>, String> {
    Ok(attrs.floats(name)?.unwrap_or_default())
}

/// An error unless every named list has `len` entries (an absent one has none).
fn same_length(attrs: &Attrs, len: usize, names: &[&str]) -> Result<(), String> {
    for name in names {
        let got = match attrs.get(name) {
            Some(crate::ir::Attr::Ints(v)) => v.len(),
            Some(crate::ir::Attr::Floats(v)) => v.len(),
            Some(crate::ir::Attr::Strings(v)) => v.len(),
            _ => 0,
        };
        if got != len {
            return Err(format!("{name} has {got} entries, {} has {len}", names[0]));
        }
    }
    Ok(())
}

/// The opset-5 `TreeEnsemble`'s attributes: nodes by index, leaves by index, roots.
fn forest_v5(attrs: &Attrs) -> Result<Forest, String> {
    let splits = floats(attrs, "nodes_splits")?;
    let n = splits.len();
    same_length(
        attrs,
        n,
        &[
            "nodes_splits",
            "nodes_featureids",
            "nodes_modes",
            "nodes_truenodeids",
            "nodes_falsenodeids",
            "nodes_trueleafs",
            "nodes_falseleafs",
        ],
    )?;
    if attrs.get("nodes_missing_value_tracks_true").is_some() {
        same_length(
            attrs,
            n,
            &["nodes_splits", "nodes_missing_value_tracks_true"],
        )?;
    }
    let weights = floats(attrs, "leaf_weights")?;
    same_length(attrs, weights.len(), &["leaf_weights", "leaf_targetids"])?;
    let targets = target_count(attrs.req_int("n_targets")?)?;
    let leaves = ints(attrs, "leaf_targetids")?
        .iter()
        .zip(&weights)
        .map(|(&t, &w)| Ok(vec![(index(t, "leaf_targetids entry", targets)?, w)]))
        .collect::<Result<Vec<_>, String>>()?;
    let (features, modes) = (
        ints(attrs, "nodes_featureids")?,
        ints(attrs, "nodes_modes")?,
    );
    let (true_ids, false_ids) = (
        ints(attrs, "nodes_truenodeids")?,
        ints(attrs, "nodes_falsenodeids")?,
    );
    let (true_leafs, false_leafs) = (
        ints(attrs, "nodes_trueleafs")?,
        ints(attrs, "nodes_falseleafs")?,
    );
    let missing = ints(attrs, "nodes_missing_value_tracks_true")?;
    let child = |id: i64, leaf: i64, what: &str| -> Result<Child, String> {
        Ok(if leaf != 0 {
            Child::Leaf(index(id, &format!("{what} (a leaf)"), leaves.len())?)
        } else {
            Child::Branch(index(id, what, n)?)
        })
    };
    // The members of MEMBER nodes, in node order, each set ended by a NaN.
    let mut members = floats(attrs, "membership_values")?.into_iter();
    let mut branches = Vec::with_capacity(n);
    for i in 0..n {
        let rule = match modes[i] {
            0 => Rule::Leq,
            1 => Rule::Lt,
            2 => Rule::Gte,
            3 => Rule::Gt,
            4 => Rule::Eq,
            5 => Rule::Neq,
            6 => {
                let set: Vec<f64> = members.by_ref().take_while(|m| !m.is_nan()).collect();
                if set.is_empty() {
                    return Err(format!(
                        "node {i} tests set membership but membership_values has no set for it"
                    ));
                }
                Rule::Member(set)
            }
            m => return Err(format!("nodes_modes[{i}] = {m} is not a mode (0..=6)")),
        };
        branches.push(Branch {
            feature: index(features[i], "nodes_featureids entry", usize::MAX)?,
            rule,
            split: splits[i],
            missing_true: missing.get(i).is_some_and(|&m| m != 0),
            yes: child(true_ids[i], true_leafs[i], "nodes_truenodeids entry")?,
            no: child(false_ids[i], false_leafs[i], "nodes_falsenodeids entry")?,
        });
    }
    let roots = ints(attrs, "tree_roots")?
        .iter()
        .map(|&r| {
            let root = index(r, "tree_roots entry", n)?;
            // A tree that is a single leaf: a node whose branches both lead to it.
            Ok(match (&branches[root].yes, &branches[root].no) {
                (Child::Leaf(a), Child::Leaf(b)) if a == b => Child::Leaf(*a),
                _ => Child::Branch(root),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let aggregate = match attrs.int_or("aggregate_function", 1)? {
        0 => Aggregate::Average,
        1 => Aggregate::Sum,
        2 => Aggregate::Min,
        3 => Aggregate::Max,
        a => return Err(format!("aggregate_function must be 0..=3, got {a}")),
    };
    let post = match attrs.int_or("post_transform", 0)? {
        0 => PostTransform::None,
        1 => PostTransform::Softmax,
        2 => PostTransform::Logistic,
        3 => PostTransform::SoftmaxZero,
        4 => PostTransform::Probit,
        p => return Err(format!("post_transform must be 0..=4, got {p}")),
    };
    Forest::new(branches, leaves, roots, targets, aggregate, post)
}

/// The opset 1/3 form: nodes named by (tree id, node id), leaves the nodes of mode LEAF,
/// each leaf's weights listed by (tree id, node id) under `prefix` (`target` or `class`).
fn forest_v3(attrs: &Attrs, prefix: &str, targets: usize) -> Result<Forest, String> {
    let tree_ids = ints(attrs, "nodes_treeids")?;
    let n = tree_ids.len();
    same_length(
        attrs,
        n,
        &[
            "nodes_treeids",
            "nodes_nodeids",
            "nodes_featureids",
            "nodes_modes",
            "nodes_values",
            "nodes_truenodeids",
            "nodes_falsenodeids",
        ],
    )?;
    if attrs.get("nodes_missing_value_tracks_true").is_some() {
        same_length(
            attrs,
            n,
            &["nodes_treeids", "nodes_missing_value_tracks_true"],
        )?;
    }
    let node_ids = ints(attrs, "nodes_nodeids")?;
    let modes = attrs.strings("nodes_modes")?.unwrap_or(&[]);
    let (features, values) = (
        ints(attrs, "nodes_featureids")?,
        floats(attrs, "nodes_values")?,
    );
    let (true_ids, false_ids) = (
        ints(attrs, "nodes_truenodeids")?,
        ints(attrs, "nodes_falsenodeids")?,
    );
    let missing = ints(attrs, "nodes_missing_value_tracks_true")?;
    // Each node's place among the branches or the leaves.
    let mut place: HashMap<(i64, i64), Child> = HashMap::with_capacity(n);
    let (mut n_branches, mut n_leaves) = (0, 0);
    for i in 0..n {
        let child = if modes[i] == "LEAF" {
            n_leaves += 1;
            Child::Leaf(n_leaves - 1)
        } else {
            n_branches += 1;
            Child::Branch(n_branches - 1)
        };
        if place.insert((tree_ids[i], node_ids[i]), child).is_some() {
            return Err(format!(
                "node {} of tree {} is listed twice",
                node_ids[i], tree_ids[i]
            ));
        }
    }
    let find = |tree: i64, node: i64| -> Result<Child, String> {
        place
            .get(&(tree, node))
            .copied()
            .ok_or_else(|| format!("tree {tree} has no node {node}"))
    };
    let mut branches = Vec::with_capacity(n_branches);
    for i in 0..n {
        let rule = match modes[i].as_str() {
            "LEAF" => continue,
            "BRANCH_LEQ" => Rule::Leq,
            "BRANCH_LT" => Rule::Lt,
            "BRANCH_GTE" => Rule::Gte,
            "BRANCH_GT" => Rule::Gt,
            "BRANCH_EQ" => Rule::Eq,
            "BRANCH_NEQ" => Rule::Neq,
            m => {
                return Err(format!(
                    "nodes_modes[{i}] = '{m}' is not LEAF or a BRANCH_ mode"
                ))
            }
        };
        branches.push(Branch {
            feature: index(features[i], "nodes_featureids entry", usize::MAX)?,
            rule,
            split: values[i],
            missing_true: missing.get(i).is_some_and(|&m| m != 0),
            yes: find(tree_ids[i], true_ids[i])?,
            no: find(tree_ids[i], false_ids[i])?,
        });
    }
    let weight_names = [
        format!("{prefix}_weights"),
        format!("{prefix}_treeids"),
        format!("{prefix}_nodeids"),
        format!("{prefix}_ids"),
    ];
    let weights = floats(attrs, &weight_names[0])?;
    let names: Vec<&str> = weight_names.iter().map(String::as_str).collect();
    same_length(attrs, weights.len(), &names)?;
    let mut leaves = vec![vec![]; n_leaves];
    for (k, &w) in weights.iter().enumerate() {
        let tree = ints(attrs, &weight_names[1])?[k];
        let node = ints(attrs, &weight_names[2])?[k];
        let target = index(ints(attrs, &weight_names[3])?[k], &weight_names[3], targets)?;
        match find(tree, node)? {
            Child::Leaf(l) => leaves[l].push((target, w)),
            Child::Branch(_) => {
                return Err(format!(
                    "{} names node {node} of tree {tree}, which is not a LEAF",
                    weight_names[0]
                ))
            }
        }
    }
    // Each tree's root is its first node, trees in increasing id order.
    let mut roots: BTreeMap<i64, Child> = BTreeMap::new();
    for i in 0..n {
        let child = find(tree_ids[i], node_ids[i])?;
        roots.entry(tree_ids[i]).or_insert(child);
    }
    Forest::new(
        branches,
        leaves,
        roots.into_values().collect(),
        targets,
        aggregate_by_name(attrs.string_or("aggregate_function", "SUM")?)?,
        PostTransform::parse(attrs.string_or("post_transform", "NONE")?)?,
    )
}

/// X ([N, F] or [F]) and the output's rows: N, or 1.
fn rows_of(x: &TensorType, forest: &Forest) -> Result<Dim, String> {
    let width = match x.rank() {
        1 => x.shape.dim(0),
        2 => x.shape.dim(1),
        _ => return Err(format!("X must be [N, F] or [F], got {x}")),
    };
    if let (Some(f), Some(max)) = (width.fixed(), forest.max_feature()) {
        if max >= f {
            return Err(format!(
                "a branch reads feature {max} but X has {f} features"
            ));
        }
    }
    Ok(if x.rank() == 2 {
        x.shape.dim(0).clone()
    } else {
        Dim::Fixed(1)
    })
}

const NODE_ATTRS_V3: [AttrSpec; 9] = [
    AttrSpec::opt("nodes_falsenodeids", AttrKind::Ints, ""),
    AttrSpec::opt("nodes_featureids", AttrKind::Ints, ""),
    AttrSpec::opt("nodes_hitrates", AttrKind::Floats, "unused"),
    AttrSpec::opt("nodes_missing_value_tracks_true", AttrKind::Ints, "0s"),
    AttrSpec::opt("nodes_modes", AttrKind::Strings, ""),
    AttrSpec::opt("nodes_nodeids", AttrKind::Ints, ""),
    AttrSpec::opt("nodes_treeids", AttrKind::Ints, ""),
    AttrSpec::opt("nodes_truenodeids", AttrKind::Ints, ""),
    AttrSpec::opt("nodes_values", AttrKind::Floats, ""),
];

struct TreeEnsemble;

const TREE_ENSEMBLE: OpSchema = OpSchema {
    name: "TreeEnsemble",
    family: "tree",
    inputs: &["X"],
    outputs: &["Y"],
    attrs: &[
        AttrSpec::opt("aggregate_function", AttrKind::Int, "1 (SUM)"),
        AttrSpec::req("leaf_targetids", AttrKind::Ints),
        AttrSpec::req("leaf_weights", AttrKind::Floats),
        AttrSpec::opt("membership_values", AttrKind::Floats, "none"),
        AttrSpec::req("n_targets", AttrKind::Int),
        AttrSpec::req("nodes_falseleafs", AttrKind::Ints),
        AttrSpec::req("nodes_falsenodeids", AttrKind::Ints),
        AttrSpec::req("nodes_featureids", AttrKind::Ints),
        AttrSpec::opt("nodes_hitrates", AttrKind::Floats, "unused"),
        AttrSpec::opt("nodes_missing_value_tracks_true", AttrKind::Ints, "0s"),
        AttrSpec::req("nodes_modes", AttrKind::Ints),
        AttrSpec::req("nodes_splits", AttrKind::Floats),
        AttrSpec::req("nodes_trueleafs", AttrKind::Ints),
        AttrSpec::req("nodes_truenodeids", AttrKind::Ints),
        AttrSpec::opt("post_transform", AttrKind::Int, "0 (NONE)"),
        AttrSpec::req("tree_roots", AttrKind::Ints),
    ],
    doc: "ONNX-ML opset 5's tree ensemble: float X [N, F] through the trees rooted at \
          tree_roots (nodes by index; modes 0-6 LEQ, LT, GTE, GT, EQ, NEQ, MEMBER; a \
          NaN feature takes the true branch where nodes_missing_value_tracks_true says \
          so), the leaves' weights aggregated per target (0-3: AVERAGE, SUM, MIN, MAX) \
          and post-transformed (0-4: NONE, SOFTMAX, LOGISTIC, SOFTMAX_ZERO, PROBIT) \
          into Y [N, n_targets] of X's dtype.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

impl Op for TreeEnsemble {
    fn schema(&self) -> &OpSchema {
        &TREE_ENSEMBLE
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        if !matches!(x.dtype, DType::F32 | DType::F64 | DType::F16) {
            return Err(format!("X must be f32, f64 or f16, got {}", x.dtype));
        }
        let forest = forest_v5(cx.attrs)?;
        let n = rows_of(x, &forest)?;
        Ok(vec![TensorType::new(
            x.dtype,
            Shape::new(vec![n, Dim::Fixed(forest.targets)]),
        )])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let e = Ensemble::new("TreeEnsemble", cx.attrs)?;
        let (n, y, _) = e.run(x)?;
        Ok(vec![Tensor::from_f64s(x.dtype(), &[n, e.width()], &y)?])
    }
}

/// The integer and float dtypes the opset 1/3 ensembles read.
fn check_v3_input(x: &TensorType) -> Result<(), String> {
    if !matches!(x.dtype, DType::F32 | DType::F64 | DType::I64 | DType::I32) {
        return Err(format!("X must be f32, f64, i64 or i32, got {}", x.dtype));
    }
    Ok(())
}

struct TreeEnsembleRegressor;

const TREE_ENSEMBLE_REGRESSOR: OpSchema = OpSchema {
    name: "TreeEnsembleRegressor",
    family: "tree",
    inputs: &["X"],
    outputs: &["Y"],
    attrs: &[
        AttrSpec::opt("aggregate_function", AttrKind::String, "SUM"),
        AttrSpec::opt("base_values", AttrKind::Floats, "0s"),
        AttrSpec::opt("n_targets", AttrKind::Int, "1"),
        NODE_ATTRS_V3[0],
        NODE_ATTRS_V3[1],
        NODE_ATTRS_V3[2],
        NODE_ATTRS_V3[3],
        NODE_ATTRS_V3[4],
        NODE_ATTRS_V3[5],
        NODE_ATTRS_V3[6],
        NODE_ATTRS_V3[7],
        NODE_ATTRS_V3[8],
        AttrSpec::opt("post_transform", AttrKind::String, "NONE"),
        AttrSpec::opt("target_ids", AttrKind::Ints, ""),
        AttrSpec::opt("target_nodeids", AttrKind::Ints, ""),
        AttrSpec::opt("target_treeids", AttrKind::Ints, ""),
        AttrSpec::opt("target_weights", AttrKind::Floats, ""),
    ],
    doc: "ONNX-ML's tree ensemble regressor (opsets 1 and 3): X [N, F] through trees of \
          nodes named by (nodes_treeids, nodes_nodeids), the LEAF nodes' target_weights \
          aggregated per target (AVERAGE, SUM, MIN, MAX), plus base_values, \
          post-transformed into f32 Y [N, n_targets].",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

fn regressor_forest(attrs: &Attrs) -> Result<(Forest, Vec<f64>), String> {
    let targets = target_count(attrs.int_or("n_targets", 1)?)?;
    let forest = forest_v3(attrs, "target", targets)?;
    let base = floats(attrs, "base_values")?;
    if !base.is_empty() && base.len() != targets {
        return Err(format!(
            "base_values has {} values for {targets} targets",
            base.len()
        ));
    }
    Ok((forest, base))
}

impl Op for TreeEnsembleRegressor {
    fn schema(&self) -> &OpSchema {
        &TREE_ENSEMBLE_REGRESSOR
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        check_v3_input(x)?;
        let (forest, _) = regressor_forest(cx.attrs)?;
        let n = rows_of(x, &forest)?;
        Ok(vec![TensorType::new(
            DType::F32,
            Shape::new(vec![n, Dim::Fixed(forest.targets)]),
        )])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let e = Ensemble::new("TreeEnsembleRegressor", cx.attrs)?;
        let (n, y, _) = e.run(cx.input(0)?)?;
        Ok(vec![Tensor::from_f64s(DType::F32, &[n, e.width()], &y)?])
    }
}

struct TreeEnsembleClassifier;

const TREE_ENSEMBLE_CLASSIFIER: OpSchema = OpSchema {
    name: "TreeEnsembleClassifier",
    family: "tree",
    inputs: &["X"],
    outputs: &["Y", "Z"],
    attrs: &[
        AttrSpec::opt("base_values", AttrKind::Floats, "0s"),
        AttrSpec::opt("class_ids", AttrKind::Ints, ""),
        AttrSpec::opt("class_nodeids", AttrKind::Ints, ""),
        AttrSpec::opt("class_treeids", AttrKind::Ints, ""),
        AttrSpec::opt("class_weights", AttrKind::Floats, ""),
        AttrSpec::opt("classlabels_int64s", AttrKind::Ints, "one of the two"),
        AttrSpec::opt("classlabels_strings", AttrKind::Strings, "one of the two"),
        NODE_ATTRS_V3[0],
        NODE_ATTRS_V3[1],
        NODE_ATTRS_V3[2],
        NODE_ATTRS_V3[3],
        NODE_ATTRS_V3[4],
        NODE_ATTRS_V3[5],
        NODE_ATTRS_V3[6],
        NODE_ATTRS_V3[7],
        NODE_ATTRS_V3[8],
        AttrSpec::opt("post_transform", AttrKind::String, "NONE"),
    ],
    doc: "ONNX-ML's tree ensemble classifier (opsets 1 and 3): X [N, F] through trees \
          of nodes named by (nodes_treeids, nodes_nodeids), the LEAF nodes' \
          class_weights summed per class plus base_values; when every weight is for one \
          class of two, that score s gives the pair (1 - s, s) (or (-s, s) before \
          LOGISTIC, SOFTMAX or SOFTMAX_ZERO). Z [N, classes] are the post-transformed \
          scores (f32), Y [N] the label of each row's largest.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

/// The classifier's forest, base values, labels and whether it is the binary case.
struct Classifier {
    forest: Forest,
    base: Vec<f64>,
    labels: Labels,
    /// The one class every weight is for, when there are two classes.
    binary: Option<usize>,
}

enum Labels {
    Ints(Vec<i64>),
    Strings(Vec<String>),
}

impl Labels {
    fn len(&self) -> usize {
        match self {
            Labels::Ints(v) => v.len(),
            Labels::Strings(v) => v.len(),
        }
    }
}

fn classifier(attrs: &Attrs) -> Result<Classifier, String> {
    let labels = match (
        attrs.ints("classlabels_int64s")?,
        attrs.strings("classlabels_strings")?,
    ) {
        (Some(ints), None) => Labels::Ints(ints.to_vec()),
        (None, Some(strings)) => Labels::Strings(strings.to_vec()),
        _ => {
            return Err(
                "exactly one of classlabels_int64s and classlabels_strings is required".into(),
            )
        }
    };
    let classes = labels.len();
    if classes < 2 {
        return Err(format!("need at least 2 class labels, got {classes}"));
    }
    let forest = forest_v3(attrs, "class", classes)?;
    let base = floats(attrs, "base_values")?;
    if !base.is_empty() && base.len() != classes && base.len() != 1 {
        return Err(format!(
            "base_values has {} values for {classes} classes",
            base.len()
        ));
    }
    let class_ids = ints(attrs, "class_ids")?;
    let binary = match class_ids.first() {
        Some(&first) if classes == 2 && class_ids.iter().all(|&c| c == first) => {
            Some(index(first, "class_ids entry", classes)?)
        }
        _ => None,
    };
    Ok(Classifier {
        forest,
        base,
        labels,
        binary,
    })
}

impl Op for TreeEnsembleClassifier {
    fn schema(&self) -> &OpSchema {
        &TREE_ENSEMBLE_CLASSIFIER
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        check_v3_input(x)?;
        let c = classifier(cx.attrs)?;
        let n = rows_of(x, &c.forest)?;
        let label_dtype = match c.labels {
            Labels::Ints(_) => DType::I64,
            Labels::Strings(_) => DType::String,
        };
        Ok(vec![
            TensorType::new(label_dtype, Shape::new(vec![n.clone()])),
            TensorType::new(DType::F32, Shape::new(vec![n, Dim::Fixed(c.labels.len())])),
        ])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let e = Ensemble::new("TreeEnsembleClassifier", cx.attrs)?;
        let classes = e.width();
        let (n, z, picks) = e.run(cx.input(0)?)?;
        let Some((labels, _)) = &e.classifier else {
            return Err("not a classifier".into());
        };
        let y = match labels {
            Labels::Ints(labels) => {
                let y: Vec<i64> = picks.iter().map(|&k| labels[k]).collect();
                Tensor::from_i64s(DType::I64, &[n], &y)?
            }
            Labels::Strings(labels) => {
                let y: Vec<String> = picks.iter().map(|&k| labels[k].clone()).collect();
                Tensor::from_strings(&[n], y)?
            }
        };
        Ok(vec![y, Tensor::from_f64s(DType::F32, &[n, classes], &z)?])
    }
}

pub(crate) fn ops() -> Vec<&'static dyn Op> {
    vec![
        leak(TreeEnsemble),
        leak(TreeEnsembleRegressor),
        leak(TreeEnsembleClassifier),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A seeded forest of `trees` unbalanced trees, every branch by `rule`, some
    /// with NaN going the true way.
    fn forest(trees: usize, rule: fn() -> Rule, seed: u64) -> Forest {
        let mut s = seed;
        let mut next = move |n: u64| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 33) % n
        };
        let (mut branches, mut leaves, mut roots) = (vec![], vec![], vec![]);
        for _ in 0..trees {
            // A chain that leans one way, with leaves hanging off: depths 1 to 7.
            let depth = 1 + next(7) as usize;
            let first = branches.len();
            roots.push(Child::Branch(first));
            for d in 0..depth {
                let leaf = Child::Leaf(leaves.len());
                leaves.push(vec![(next(3) as usize, next(100) as f64 / 10.0)]);
                let on = if d + 1 == depth {
                    leaves.push(vec![(0, 1.0)]);
                    Child::Leaf(leaves.len() - 1)
                } else {
                    Child::Branch(first + d + 1)
                };
                let (yes, no) = if next(2) == 0 { (leaf, on) } else { (on, leaf) };
                branches.push(Branch {
                    feature: next(4) as usize,
                    rule: rule(),
                    split: next(10) as f64 / 2.0,
                    missing_true: next(2) == 0,
                    yes,
                    no,
                });
            }
        }
        Forest::new(
            branches,
            leaves,
            roots,
            3,
            Aggregate::Sum,
            PostTransform::None,
        )
        .unwrap()
    }

    /// The walk without jumps reaches the branchy walk's leaves, NaNs and ties included.
    #[test]
    fn uniform_walks_agree_with_the_branchy_walk() {
        let rules: [fn() -> Rule; 6] = [
            || Rule::Leq,
            || Rule::Lt,
            || Rule::Gte,
            || Rule::Gt,
            || Rule::Eq,
            || Rule::Neq,
        ];
        let rows = 37;
        let x: Vec<f64> = (0..rows * 4)
            .map(|i| {
                if i % 11 == 0 {
                    f64::NAN
                } else {
                    (i * 7 % 12) as f64 / 2.0
                }
            })
            .collect();
        for (k, rule) in rules.into_iter().enumerate() {
            let mut f = forest(20, rule, k as u64);
            assert!(f.uniform.is_some(), "rule {k}");
            let mut fast = vec![0.0; rows * 3];
            f.scores_into(&x, [rows, 4], &mut fast, &mut vec![false; rows * 3])
                .unwrap();
            f.uniform = None;
            let mut slow = vec![0.0; rows * 3];
            f.scores_into(&x, [rows, 4], &mut slow, &mut vec![false; rows * 3])
                .unwrap();
            assert_eq!(fast, slow, "rule {k}");
        }
        // Mixed rules and sets keep the branchy walk.
        let mut f = forest(3, || Rule::Leq, 9);
        assert!(f.uniform.is_some());
        f.nodes[1].rule = 1;
        assert!(Uniform::new(&f.nodes, f.leaf_start.len() - 1, &f.roots).is_none());
    }

    /// Branches that lead back to themselves are no uniform forest; the branchy walk
    /// reports the cycle.
    #[test]
    fn a_cycle_is_reported_not_walked() {
        let b = |yes, no| Branch {
            feature: 0,
            rule: Rule::Leq,
            split: 0.5,
            missing_true: false,
            yes,
            no,
        };
        let f = Forest::new(
            vec![
                b(Child::Branch(1), Child::Leaf(0)),
                b(Child::Branch(0), Child::Leaf(0)),
            ],
            vec![vec![(0, 1.0)]],
            vec![Child::Branch(0)],
            1,
            Aggregate::Sum,
            PostTransform::None,
        )
        .unwrap();
        assert!(f.uniform.is_none());
        let err = f
            .scores_into(&[0.0], [1, 1], &mut [0.0], &mut [false])
            .unwrap_err();
        assert!(err.contains("cycle"), "{err}");
    }
}
