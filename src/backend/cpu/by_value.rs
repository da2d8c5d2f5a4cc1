//! Signatures whose types depend on the values of small inputs (axes, shapes or sizes a
//! caller passes at run time; Resize scales, a OneHot depth, Range bounds): one program
//! per tuple of those values, the inputs bound as constants before the pipeline, so the
//! rest folds and compiles as a static graph instead of running node by node.
//! Small integer inputs always key; float ones only where an op reads them for a shape
//! (Resize scales, Range bounds, a OneHot depth: [`sets_shape`]), so that a data input
//! does not recompile every run.
use std::borrow::Borrow;
use std::sync::{Arc, Mutex};

use super::Compiled;
use crate::error::Result;
use crate::ir::Graph;
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
    programs: Mutex<Vec<(Vec<u8>, Arc<Compiled>)>>,
    /// Whether a program may be a host program (not for a host program's own nodes).
    pub(super) host: bool,
}

impl ByValue {
    /// For a signature of `graph` at `shapes` whose types stay dynamic in `specialized`
    /// (`graph` specialized at `shapes`): keyed by its small inputs, if it has any.
    pub(super) fn new(
        graph: &Graph,
        specialized: &Graph,
        shapes: &[Vec<usize>],
        host: bool,
    ) -> Option<ByValue> {
        let read_for_a_shape = |id| {
            specialized.nodes().iter().any(|n| {
                n.inputs
                    .iter()
                    .enumerate()
                    .any(|(k, v)| v.is_some_and(|v| v.node == id) && sets_shape(&n.op, k))
            })
        };
        let keys: Vec<usize> = graph
            .inputs()
            .iter()
            .zip(shapes)
            .enumerate()
            .filter(|(k, (&id, s))| {
                let t = &graph.node(id).outputs[0];
                let elements = s
                    .iter()
                    .try_fold(1usize, |n, &d| n.checked_mul(d))
                    .unwrap_or(usize::MAX);
                let read = t.dtype.is_int()
                    || (specialized.inputs().get(*k)).is_some_and(|&p| read_for_a_shape(p));
                read && elements <= MAX_KEY_ELEMENTS && !t.is_host_object()
            })
            .map(|(k, _)| k)
            .collect();
        (!keys.is_empty()).then(|| ByValue {
            graph: graph.clone(),
            shapes: shapes.to_vec(),
            keys,
            programs: Mutex::new(vec![]),
            host,
        })
    }

    /// The key inputs' bytes, in order (one bit pattern per value, so a float key is
    /// exact).
    fn key<T: Borrow<Tensor>>(&self, inputs: &[T]) -> Vec<u8> {
        self.keys
            .iter()
            .flat_map(|&k| inputs[k].borrow().to_le_bytes())
            .collect()
    }

    /// The program for these inputs' key values, made by `compile` from the graph with
    /// the key inputs bound (their readers read constants of their values).
    pub(super) fn program<T: Borrow<Tensor>>(
        &self,
        inputs: &[T],
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
            let c = g.add_constant_value(&name, inputs[k].borrow().clone())?;
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

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(Vec<u8>, Arc<Compiled>)>> {
        self.programs.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Whether operand `k` of `op` is a float an op reads to size its result.
fn sets_shape(op: &str, k: usize) -> bool {
    matches!(
        (op, k),
        ("Resize", 1 | 2) | ("Upsample", 1) | ("Range", 0..=2) | ("OneHot", 1)
    )
}
