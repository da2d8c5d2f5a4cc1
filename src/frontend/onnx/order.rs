//! The order a graph's nodes import in. ONNX requires nodes in topological order, but
//! onnxruntime sorts them and some exporters write them unsorted, so the importer sorts
//! too: Kahn's algorithm taking the lowest file index first, so a sorted graph keeps its
//! order (and its node numbers in errors) exactly.
use std::collections::{BTreeSet, HashMap, HashSet};

use super::proto::{GraphProto, NodeProto};
use crate::error::{Error, Result};

/// The indices of `graph.node` in an order where every node follows the nodes producing
/// the names it reads (its inputs and the outer names its subgraphs read). A name no node
/// of this graph produces is left to the importer to resolve or refuse. A cycle is an
/// error naming the nodes on it.
pub(super) fn topological(graph: &GraphProto) -> Result<Vec<usize>> {
    let nodes = &graph.node;
    let mut producer: HashMap<&str, usize> = HashMap::new();
    for (i, n) in nodes.iter().enumerate() {
        for o in n.output.iter().filter(|o| !o.is_empty()) {
            // A name produced twice is the importer's error to report; the first wins.
            producer.entry(o.as_str()).or_insert(i);
        }
    }
    let mut readers: Vec<Vec<usize>> = vec![vec![]; nodes.len()];
    let mut pending = vec![0usize; nodes.len()];
    for (i, n) in nodes.iter().enumerate() {
        let mut deps = BTreeSet::new();
        for name in reads(n) {
            if let Some(&p) = producer.get(name) {
                if p != i {
                    deps.insert(p);
                }
            }
        }
        pending[i] = deps.len();
        for p in deps {
            readers[p].push(i);
        }
    }
    let mut ready: BTreeSet<usize> = (0..nodes.len()).filter(|&i| pending[i] == 0).collect();
    let mut order = Vec::with_capacity(nodes.len());
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &r in &readers[i] {
            pending[r] -= 1;
            if pending[r] == 0 {
                ready.insert(r);
            }
        }
    }
    if order.len() < nodes.len() {
        let placed: HashSet<usize> = order.iter().copied().collect();
        let stuck: Vec<String> = (0..nodes.len())
            .filter(|i| !placed.contains(i))
            .take(8)
            .map(|i| format!("#{i} '{}' ({})", nodes[i].name(), nodes[i].op_type()))
            .collect();
        return Err(Error::Graph(format!(
            "the graph has a cycle: nodes {} (and what reads them) depend on each other",
            stuck.join(", ")
        )));
    }
    Ok(order)
}

/// The names node `n` reads: its inputs, and those its subgraphs read but do not
/// produce themselves (their captures of this scope).
fn reads(n: &NodeProto) -> Vec<&str> {
    let mut names: Vec<&str> = n
        .input
        .iter()
        .map(String::as_str)
        .filter(|s| !s.is_empty())
        .collect();
    for a in &n.attribute {
        for g in a.g.iter().chain(&a.graphs) {
            names.extend(free_names(g));
        }
    }
    names
}

/// The names graph `g` (and its own subgraphs) read from outside it.
fn free_names(g: &GraphProto) -> Vec<&str> {
    let mut defined: HashSet<&str> = g
        .node
        .iter()
        .flat_map(|n| n.output.iter())
        .map(String::as_str)
        .collect();
    defined.extend(g.input.iter().map(|i| i.name()));
    defined.extend(g.initializer.iter().map(|t| t.name()));
    g.node
        .iter()
        .flat_map(reads)
        .filter(|s| !defined.contains(s))
        .collect()
}
