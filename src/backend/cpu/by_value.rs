//! Signatures whose types depend on the values of small integer inputs (axes, shapes or
//! sizes a caller passes at run time) or of float scalars a `Range` reads (its start,
//! limit or delta): one program per tuple of those values, the inputs bound as constants
//! before the pipeline, so the rest folds and compiles as a static graph instead of
//! running on the interpreter.
use std::sync::{Arc, Mutex};

use super::Compiled;
use crate::error::Result;
use crate::ir::{Graph, NodeId};
use crate::tensor::Tensor;

/// Inputs of at most this many elements may key a program.
const MAX_KEY_ELEMENTS: usize = 64;
/// Programs kept per signature; the oldest goes first.
const MAX_PROGRAMS: usize = 16;

pub struct ByValue {
    /// The graph before specialization, and the input shapes of the signature.
    pub(super) graph: Graph,
    pub(super) shapes: Vec<Vec<usize>>,
    /// The graph inputs whose values key the programs.
    keys: Vec<usize>,
    programs: Mutex<Vec<(Vec<i64>, Arc<Compiled>)>>,
}

impl ByValue {
    /// For a signature of `graph` at `shapes` whose types stay dynamic: keyed by its
    /// small integer inputs, if it has any.
    pub(super) fn new(graph: &Graph, shapes: &[Vec<usize>]) -> Option<ByValue> {
        let read_by_range = |id: NodeId| {
            graph
                .nodes()
                .iter()
                .any(|n| n.op == "Range" && n.inputs.iter().flatten().any(|v| v.node == id))
        };
        let keys: Vec<usize> = graph
            .inputs()
            .iter()
            .zip(shapes)
            .enumerate()
            .filter(|(_, (&id, s))| {
                let t = &graph.node(id).outputs[0];
                // Checked: a signature's dims may be absurd (they are only a claim).
                let elements = s.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
                !t.is_host_object()
                    && (t.dtype.is_int() && elements.is_some_and(|n| n <= MAX_KEY_ELEMENTS)
                        || t.dtype.is_float() && elements == Some(1) && read_by_range(id))
            })
            .map(|(k, _)| k)
            .collect();
        (!keys.is_empty()).then(|| ByValue {
            graph: graph.clone(),
            shapes: shapes.to_vec(),
            keys,
            programs: Mutex::new(vec![]),
        })
    }

    /// The key inputs' values, flattened in order (floats by their bits).
    fn key(&self, inputs: &[Tensor]) -> Vec<i64> {
        self.keys
            .iter()
            .flat_map(|&k| match inputs[k].dtype().is_float() {
                true => inputs[k]
                    .to_f64_vec()
                    .into_iter()
                    .map(|v| v.to_bits() as i64)
                    .collect::<Vec<_>>(),
                false => inputs[k].to_i64_array().into_iter().collect(),
            })
            .collect()
    }

    /// The program for these inputs' key values, made by `compile` from the graph with
    /// the key inputs bound (their readers read constants of their values).
    pub(super) fn program(
        &self,
        inputs: &[Tensor],
        compile: impl FnOnce(&Graph) -> Result<Compiled>,
    ) -> Result<Arc<Compiled>> {
        let key = self.key(inputs);
        let cached = self
            .lock()
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, p)| p.clone());
        if let Some(p) = cached {
            return Ok(p);
        }
        let mut g = self.graph.clone();
        let params = g.inputs();
        for &k in &self.keys {
            let name = g.fresh_name(&format!("{}.value", g.node(params[k]).name));
            let c = g.add_constant_value(&name, inputs[k].clone())?;
            g.replace_uses(params[k].out(0), c.out(0))?;
        }
        let p = Arc::new(compile(&g)?);
        let mut programs = self.lock();
        if programs.len() >= MAX_PROGRAMS {
            programs.remove(0);
        }
        programs.push((key, p.clone()));
        Ok(p)
    }

    /// The programs made so far, for reports.
    pub(super) fn programs(&self) -> Vec<Arc<Compiled>> {
        self.lock().iter().map(|(_, p)| p.clone()).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(Vec<i64>, Arc<Compiled>)>> {
        self.programs.lock().unwrap_or_else(|e| e.into_inner())
    }
}
