//! A graph as Graphviz DOT text: each node a box (op, `#id` and name, output types),
//! edges labelled with the value's type. Large graphs are collapsed into boxes by name
//! scope (`/encoder/layer.3/attention/MatMul` is in `encoder/layer.3/attention`), else
//! by chains, else by runs of the schedule, so that the top level fits on one screen; a
//! node a pass made is drawn as a cluster of the nodes it replaced (`Graph::origins`).
//! The DOT node of `NodeId(12)` is `n12`, and its tooltip is `Graph::describe`, so the
//! picture links up with reports keyed by node. Output is deterministic: same graph,
//! same bytes. Labels are plain quoted strings, escaped (`quote`): names are user bytes.
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;

use super::graph::{Graph, NodeId, Value};

/// What to draw besides the graph.
#[derive(Debug, Clone)]
pub struct DotOptions {
    /// At most this many boxes at the top level (collapsed scopes count one each).
    pub max_boxes: usize,
    /// Each node's kernel kind (say, from the cpu backend's step report): a colour
    /// per kind and a legend.
    pub kinds: BTreeMap<NodeId, String>,
    /// A node that failed to import, drawn in red after what was imported.
    pub failure: Option<Failure>,
    /// Give each collapsed box a `URL` to `#scope-s<k>` (the HTML page's sections).
    pub links: bool,
}

impl Default for DotOptions {
    fn default() -> DotOptions {
        DotOptions {
            max_boxes: 80,
            kinds: BTreeMap::new(),
            failure: None,
            links: false,
        }
    }
}

/// The node an import stopped at: its name, op, error and the values it read.
#[derive(Debug, Clone)]
pub struct Failure {
    pub name: String,
    pub op: String,
    pub message: String,
    pub inputs: Vec<Value>,
}

/// The top-level picture and one for each collapsed box.
#[derive(Debug, Clone)]
pub struct Picture {
    /// The top level, as DOT.
    pub top: String,
    /// How many boxes the top level has (nodes, collapsed boxes, the failed node,
    /// and the original nodes drawn in fusion clusters; not the legend).
    pub boxes: usize,
    pub scopes: Vec<ScopeView>,
}

/// A collapsed box's own picture.
#[derive(Debug, Clone)]
pub struct ScopeView {
    /// Its DOT node id and anchor, `s<k>`.
    pub id: String,
    /// What the box is: a scope path, a chain or a run of nodes.
    pub title: String,
    pub nodes: usize,
    pub dot: String,
}

/// The graph as DOT, collapsed to at most 80 top-level boxes.
pub fn to_dot(g: &Graph) -> String {
    picture(g, &DotOptions::default()).top
}

/// A box of the top level: one node or a collapsed group.
struct Unit {
    members: Vec<NodeId>,
    /// None for a lone node.
    title: Option<String>,
}

/// The graph as pictures: the top level and each collapsed box.
pub fn picture(g: &Graph, opts: &DotOptions) -> Picture {
    // Constants are weights: drawn they would double the picture and say little.
    let drawn: Vec<NodeId> = (0..g.len() as u32)
        .map(NodeId)
        .filter(|&id| g.node(id).op != "Constant")
        .collect();
    let budget = opts
        .max_boxes
        .saturating_sub(usize::from(opts.failure.is_some()))
        .max(1);
    let units = collapse(g, &drawn, budget);
    let collapsed = units.iter().any(|u| u.title.is_some());
    let palette = Palette::new(&opts.kinds);
    let mut unit_of: HashMap<NodeId, usize> = HashMap::new();
    for (k, u) in units.iter().enumerate() {
        for &m in &u.members {
            unit_of.insert(m, k);
        }
    }
    let mut out = header(&g.name);
    let mut boxes = 0;
    let mut scopes = vec![];
    for (k, u) in units.iter().enumerate() {
        match &u.title {
            None => boxes += node_stmt(&mut out, g, u.members[0], opts, &palette, !collapsed),
            Some(title) => {
                boxes += 1;
                let id = format!("s{k}");
                group_stmt(&mut out, g, &id, title, &u.members, opts, &palette);
                scopes.push(ScopeView {
                    dot: scope_dot(g, title, &u.members, opts, &palette),
                    id,
                    title: title.clone(),
                    nodes: u.members.len(),
                });
            }
        }
    }
    let unit_name = |k: usize| match units[k].title {
        None => format!("n{}", units[k].members[0].0),
        Some(_) => format!("s{k}"),
    };
    // Edges between boxes, once per pair of boxes, in a fixed order.
    let mut edges: BTreeMap<(usize, usize), BTreeSet<Value>> = BTreeMap::new();
    for &id in &drawn {
        for v in g.node(id).inputs.iter().flatten() {
            if let (Some(&a), Some(&b)) = (unit_of.get(&v.node), unit_of.get(&id)) {
                if a != b {
                    edges.entry((a, b)).or_default().insert(*v);
                }
            }
        }
    }
    for ((a, b), values) in &edges {
        edge_stmt(&mut out, g, &unit_name(*a), &unit_name(*b), values);
    }
    if let Some(f) = &opts.failure {
        boxes += 1;
        failure_stmt(&mut out, f);
        let from: BTreeSet<usize> = f
            .inputs
            .iter()
            .filter_map(|v| unit_of.get(&v.node).copied())
            .collect();
        for a in from {
            let _ = writeln!(out, "  {} -> failed [color=red];", unit_name(a));
        }
    }
    legend(&mut out, &palette);
    out.push_str("}\n");
    Picture {
        top: out,
        boxes,
        scopes,
    }
}

/// Groups `drawn` into at most `budget` boxes: node by node when that fits with each
/// fused node's cluster of originals; else (clusters then only in the collapsed boxes'
/// own pictures) by name scope, as deep as fits; then chains of boxes merge; then runs
/// of consecutive boxes.
fn collapse(g: &Graph, drawn: &[NodeId], budget: usize) -> Vec<Unit> {
    let all: Vec<Unit> = drawn
        .iter()
        .map(|&id| Unit {
            members: vec![id],
            title: None,
        })
        .collect();
    let with_clusters: usize = drawn.iter().map(|&id| 1 + cluster_origins(g, id)).sum();
    if with_clusters <= budget {
        return all;
    }
    let fits = |units: &[Unit]| units.len() <= budget && units.iter().any(|u| u.title.is_some());
    let scopes: Vec<Vec<String>> = drawn.iter().map(|&id| scope_of(g, id)).collect();
    let deepest = scopes.iter().map(Vec::len).max().unwrap_or(0);
    let mut units = all;
    for depth in (1..=deepest).rev() {
        units = by_scope(drawn, &scopes, depth);
        if fits(&units) {
            return units;
        }
    }
    units = merge_chains(g, units);
    if fits(&units) {
        return units;
    }
    merge_runs(g, units, budget)
}

/// The scope path of a node: its name's components but the last, split at `/` (at
/// `.` in names without one, as some exporters write); for a node whose name has none,
/// the scope its original nodes share.
fn scope_of(g: &Graph, id: NodeId) -> Vec<String> {
    let own = name_scope(&g.node(id).name);
    if !own.is_empty() {
        return own;
    }
    let mut common: Option<Vec<String>> = None;
    for o in g.origins(id) {
        let s = name_scope(&o.name);
        common = Some(match common {
            None => s,
            Some(c) => c
                .into_iter()
                .zip(s)
                .take_while(|(a, b)| a == b)
                .map(|(a, _)| a)
                .collect(),
        });
    }
    common.unwrap_or_default()
}

fn name_scope(name: &str) -> Vec<String> {
    let sep = if name.contains('/') { '/' } else { '.' };
    let parts: Vec<&str> = name.split(sep).filter(|p| !p.is_empty()).collect();
    match parts.split_last() {
        Some((_, scope)) => scope.iter().map(|s| s.to_string()).collect(),
        None => vec![],
    }
}

/// Nodes grouped by their scope cut to `depth`; a group of one stays a node.
fn by_scope(drawn: &[NodeId], scopes: &[Vec<String>], depth: usize) -> Vec<Unit> {
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut units: Vec<Unit> = vec![];
    for (&id, scope) in drawn.iter().zip(scopes) {
        if scope.is_empty() {
            units.push(Unit {
                members: vec![id],
                title: None,
            });
            continue;
        }
        let key = scope[..depth.min(scope.len())].join("/");
        match index.get(&key) {
            Some(&k) => units[k].members.push(id),
            None => {
                index.insert(key.clone(), units.len());
                units.push(Unit {
                    members: vec![id],
                    title: Some(key),
                });
            }
        }
    }
    for u in &mut units {
        if u.members.len() == 1 {
            u.title = None;
        }
    }
    units
}

/// Merges a box into its only predecessor box when it is that box's only successor.
fn merge_chains(g: &Graph, units: Vec<Unit>) -> Vec<Unit> {
    let mut unit_of: HashMap<NodeId, usize> = HashMap::new();
    for (k, u) in units.iter().enumerate() {
        for &m in &u.members {
            unit_of.insert(m, k);
        }
    }
    let n = units.len();
    let mut preds: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); n];
    let mut succs: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); n];
    for (k, u) in units.iter().enumerate() {
        for &m in &u.members {
            for v in g.node(m).inputs.iter().flatten() {
                if let Some(&p) = unit_of.get(&v.node) {
                    if p != k {
                        preds[k].insert(p);
                        succs[p].insert(k);
                    }
                }
            }
        }
    }
    // Units are in creation order of their first node, so a predecessor comes first.
    let mut head: Vec<usize> = (0..n).collect();
    for k in 0..n {
        if preds[k].len() == 1 {
            let p = *preds[k].first().expect("one");
            if succs[p].len() == 1 && p < k {
                head[k] = head[p];
            }
        }
    }
    let mut merged: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (k, &h) in head.iter().enumerate() {
        merged.entry(h).or_default().push(k);
    }
    let mut units: Vec<Option<Unit>> = units.into_iter().map(Some).collect();
    merged
        .into_values()
        .map(|ks| {
            if ks.len() == 1 {
                return units[ks[0]].take().expect("once");
            }
            let mut members = vec![];
            for k in ks {
                members.extend(units[k].take().expect("once").members);
            }
            members.sort();
            let first = &g.node(members[0]).name;
            let last = &g.node(*members.last().expect("some")).name;
            Unit {
                title: Some(format!("chain {first} … {last}")),
                members,
            }
        })
        .collect()
}

/// Merges runs of consecutive boxes so that at most `budget` remain.
fn merge_runs(g: &Graph, units: Vec<Unit>, budget: usize) -> Vec<Unit> {
    let per = units.len().div_ceil(budget.max(1)).max(2);
    let mut out = vec![];
    let mut units = units.into_iter().peekable();
    while units.peek().is_some() {
        let run: Vec<Unit> = units.by_ref().take(per).collect();
        let mut members: Vec<NodeId> = run.into_iter().flat_map(|u| u.members).collect();
        members.sort();
        let (a, b) = (members[0], *members.last().expect("some"));
        let title = if members.len() == 1 {
            None
        } else {
            Some(format!(
                "nodes #{}–#{} ({} … {})",
                a.0,
                b.0,
                g.node(a).name,
                g.node(b).name
            ))
        };
        out.push(Unit { members, title });
    }
    out
}

/// How many original nodes a lone node's fusion cluster draws (0: no cluster).
fn cluster_origins(g: &Graph, id: NodeId) -> usize {
    let origins = g.origins(id);
    let n = g.node(id);
    if origins.len() >= 2 || origins.iter().any(|o| o.op != n.op) {
        origins.len()
    } else {
        0
    }
}

/// `s` as a DOT quoted string: quotes and backslashes escaped, a newline as DOT's
/// line break, other control characters as visible `\xNN`, very long text cut.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    quote_into(&mut out, s);
    out.push('"');
    out
}

/// Lines as one DOT quoted string, each escaped, joined by DOT's line break.
fn quote_lines(lines: &[String]) -> String {
    let mut out = String::from("\"");
    for (i, l) in lines.iter().enumerate() {
        if i > 0 {
            out.push_str("\\n");
        }
        quote_into(&mut out, l);
    }
    out.push('"');
    out
}

fn quote_into(out: &mut String, s: &str) {
    const MAX_CHARS: usize = 200;
    for (i, c) in s.chars().enumerate() {
        if i == MAX_CHARS {
            out.push('…');
            break;
        }
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if c.is_control() => {
                let _ = write!(out, "\\\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
}

fn header(name: &str) -> String {
    format!(
        "digraph {} {{\n  compound=true;\n  node [shape=box, fontname=\"Helvetica\", fontsize=10];\n  edge [fontname=\"Helvetica\", fontsize=8];\n",
        quote(name)
    )
}

/// The node's label lines: op, `#id name`, output types, graph outputs, kernel.
fn node_lines(g: &Graph, id: NodeId, kind: Option<&String>) -> Vec<String> {
    let n = g.node(id);
    let mut lines = vec![n.op.clone(), format!("#{} {}", id.0, n.name)];
    const MAX_OUTPUTS: usize = 4;
    for t in n.outputs.iter().take(MAX_OUTPUTS) {
        lines.push(t.to_string());
    }
    if n.outputs.len() > MAX_OUTPUTS {
        lines.push(format!("… {} outputs", n.outputs.len()));
    }
    for o in g.outputs().iter().filter(|o| o.value.node == id) {
        lines.push(format!("→ output '{}'", o.name));
    }
    if let Some(k) = kind {
        lines.push(format!("kernel: {k}"));
    }
    lines
}

/// Writes a lone node (with its fusion cluster if `clusters`); returns its boxes.
/// Clusters are drawn only at a top level that is not collapsed, and in the collapsed
/// boxes' pictures.
fn node_stmt(
    out: &mut String,
    g: &Graph,
    id: NodeId,
    opts: &DotOptions,
    palette: &Palette,
    clusters: bool,
) -> usize {
    let n = g.node(id);
    let kind = opts.kinds.get(&id);
    let shape = match n.op.as_str() {
        "Parameter" | "Variable" => "ellipse",
        _ => "box",
    };
    let fill = palette.fill(kind);
    let stmt = format!(
        "n{} [id=\"n{}\", label={}, tooltip={}, shape={shape}, style=filled, fillcolor=\"{fill}\"];",
        id.0,
        id.0,
        quote_lines(&node_lines(g, id, kind)),
        quote(&g.describe(id)),
    );
    let shown = if clusters { cluster_origins(g, id) } else { 0 };
    if shown == 0 {
        let _ = writeln!(out, "  {stmt}");
        return 1;
    }
    let origins = g.origins(id);
    let _ = writeln!(
        out,
        "  subgraph cluster_n{} {{\n    label={};\n    style=dashed;\n    color=gray40;\n    {stmt}",
        id.0,
        quote(&format!("{} replaced {} nodes", n.op, origins.len()))
    );
    for (i, o) in origins.iter().enumerate() {
        let _ = writeln!(
            out,
            "    n{}_o{i} [label={}, style=dashed, color=gray50, fontcolor=gray30];\n    n{}_o{i} -> n{} [style=dotted, arrowhead=none, color=gray50];",
            id.0,
            quote_lines(&[o.op.clone(), o.name.clone()]),
            id.0,
            id.0
        );
    }
    out.push_str("  }\n");
    1 + origins.len()
}

/// The op histogram of `members`, most frequent first: `FusedConv×3, Reorder×1`.
fn histogram(g: &Graph, members: &[NodeId], top: usize) -> String {
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for &m in members {
        *count.entry(g.node(m).op.as_str()).or_default() += 1;
    }
    let mut list: Vec<(&str, usize)> = count.into_iter().collect();
    list.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let mut parts: Vec<String> = list
        .iter()
        .take(top)
        .map(|(op, n)| format!("{op}×{n}"))
        .collect();
    if list.len() > top {
        parts.push("…".into());
    }
    parts.join(", ")
}

fn group_stmt(
    out: &mut String,
    g: &Graph,
    id: &str,
    title: &str,
    members: &[NodeId],
    opts: &DotOptions,
    palette: &Palette,
) {
    let lines = vec![
        title.to_string(),
        format!("{} nodes (#{}…)", members.len(), members[0].0),
        histogram(g, members, 4),
    ];
    // The kernel most of its nodes run, for the colour.
    let mut kinds: BTreeMap<&String, usize> = BTreeMap::new();
    for m in members {
        if let Some(k) = opts.kinds.get(m) {
            *kinds.entry(k).or_default() += 1;
        }
    }
    let main = kinds
        .iter()
        .max_by_key(|(k, n)| (**n, std::cmp::Reverse(**k)))
        .map(|(k, _)| *k);
    let url = if opts.links {
        format!(", URL=\"#scope-{id}\"")
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "  {id} [id=\"{id}\", label={}, tooltip={}, shape=box3d, style=filled, fillcolor=\"{}\"{url}];",
        quote_lines(&lines),
        quote(&format!("{title}: {} nodes; {}", members.len(), histogram(g, members, 12))),
        palette.group_fill(main),
    );
}

fn edge_stmt(out: &mut String, g: &Graph, a: &str, b: &str, values: &BTreeSet<Value>) {
    let types: BTreeSet<String> = values
        .iter()
        .filter_map(|&v| g.value_type(v).ok().map(|t| t.to_string()))
        .collect();
    let label = if types.len() <= 2 {
        types.into_iter().collect::<Vec<_>>().join(", ")
    } else {
        format!("{} values", values.len())
    };
    let _ = writeln!(out, "  {a} -> {b} [label={}];", quote(&label));
}

fn failure_stmt(out: &mut String, f: &Failure) {
    let lines = vec![
        f.op.clone(),
        f.name.clone(),
        "import failed:".to_string(),
        f.message.clone(),
    ];
    let _ = writeln!(
        out,
        "  failed [id=\"failed\", label={}, tooltip={}, shape=box, style=filled, color=red, fontcolor=red, fillcolor=\"#ffe0e0\", penwidth=2];",
        quote_lines(&lines),
        quote(&f.message)
    );
}

/// A collapsed box's own picture: its nodes (with fusion clusters) and, as dashed
/// ellipses, the nodes outside it that it reads.
fn scope_dot(
    g: &Graph,
    title: &str,
    members: &[NodeId],
    opts: &DotOptions,
    palette: &Palette,
) -> String {
    let mut out = header(title);
    let inside: BTreeSet<NodeId> = members.iter().copied().collect();
    for &m in members {
        node_stmt(&mut out, g, m, opts, palette, true);
    }
    let mut outside: BTreeSet<NodeId> = BTreeSet::new();
    let mut edges: BTreeMap<(NodeId, NodeId), BTreeSet<Value>> = BTreeMap::new();
    for &m in members {
        for v in g.node(m).inputs.iter().flatten() {
            if g.node(v.node).op == "Constant" {
                continue;
            }
            if !inside.contains(&v.node) {
                outside.insert(v.node);
            }
            edges.entry((v.node, m)).or_default().insert(*v);
        }
    }
    for id in &outside {
        let _ = writeln!(
            out,
            "  n{} [label={}, tooltip={}, shape=ellipse, style=dashed];",
            id.0,
            quote_lines(&[format!("#{} {}", id.0, g.node(id.to_owned()).name)]),
            quote(&g.describe(*id))
        );
    }
    for ((a, b), values) in &edges {
        edge_stmt(
            &mut out,
            g,
            &format!("n{}", a.0),
            &format!("n{}", b.0),
            values,
        );
    }
    legend(&mut out, palette);
    out.push_str("}\n");
    out
}

/// A colour per kernel kind, in the kinds' sorted order.
struct Palette {
    kinds: Vec<String>,
}

const COLOURS: [&str; 12] = [
    "#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5",
    "#bc80bd", "#ccebc5", "#ffed6f", "#d9d9d9",
];

impl Palette {
    fn new(kinds: &BTreeMap<NodeId, String>) -> Palette {
        let set: BTreeSet<&String> = kinds.values().collect();
        Palette {
            kinds: set.into_iter().cloned().collect(),
        }
    }

    fn fill(&self, kind: Option<&String>) -> &'static str {
        match kind.and_then(|k| self.kinds.iter().position(|x| x == k)) {
            Some(i) => COLOURS[i % COLOURS.len()],
            None => "white",
        }
    }

    fn group_fill(&self, kind: Option<&String>) -> &'static str {
        match kind {
            Some(_) => self.fill(kind),
            None => "#e8eef7",
        }
    }
}

fn legend(out: &mut String, palette: &Palette) {
    if palette.kinds.is_empty() {
        return;
    }
    out.push_str("  subgraph cluster_legend {\n    label=\"kernels\";\n    style=solid;\n");
    for (i, k) in palette.kinds.iter().enumerate() {
        let _ = writeln!(
            out,
            "    legend{i} [label={}, style=filled, fillcolor=\"{}\"];",
            quote(k),
            palette.fill(Some(k))
        );
    }
    out.push_str("  }\n");
}
