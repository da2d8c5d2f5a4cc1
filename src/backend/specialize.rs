//! Per-shape specialization, shared by the compiling backends (CPU, CUDA).
//!
//! A graph with symbolic input dims becomes one program per input-shape signature: the
//! first run with new shapes binds the symbols, runs the pass pipeline on the now-static
//! graph ([`specialize_for_shapes`]) and hands it to the backend's lowering; later runs
//! with those shapes reuse that program from the [`ProgramCache`]. A graph whose inputs
//! are all static has one signature ([`static_input_shapes`]), built at compile time so
//! that its errors show there.
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use crate::error::{Error, Result};
use crate::ir::{Attr, Attrs, DType, Dim, Graph, NodeId, Shape, TensorType};
use crate::passes::{run_passes, run_pipeline, CompileOptions, ConstantFold, InlineConstantIf};
use crate::tensor::Tensor;

/// `graph` with its input symbols bound to the sizes in `shapes` (one shape per graph
/// input, in order), then optimized by the pass pipeline under `passes`.
pub(crate) fn specialize_for_shapes(
    graph: &Graph,
    shapes: &[Vec<usize>],
    passes: &CompileOptions,
) -> Result<Graph> {
    let mut g = bind_input_shapes(graph, shapes, passes)?;
    if has_unranked(&g) {
        // The passes need ranks; the backends run such a graph on the interpreter.
        return Ok(g);
    }
    run_pipeline(&mut g, passes)?;
    Ok(g)
}

/// `graph` with its inputs' symbols bound to `shapes` and what that settles settled
/// (ranks, `If` branches), not yet optimized.
fn bind_input_shapes(
    graph: &Graph,
    shapes: &[Vec<usize>],
    passes: &CompileOptions,
) -> Result<Graph> {
    let mut g = graph.clone();
    let mut bindings = HashMap::new();
    for (&id, shape) in g.inputs().iter().zip(shapes) {
        let ty = &mut g.node_mut(id).outputs[0];
        if ty.is_unranked_tensor() {
            *ty = TensorType::new(ty.dtype, Shape::fixed(shape));
            continue;
        }
        for (axis, &size) in ty.shape.axes.iter().zip(shape) {
            if let Dim::Sym(s) = &axis.dim {
                bindings.insert(s.clone(), size);
            }
        }
    }
    g.specialize(&bindings)?;
    if !is_static(&g) {
        settle_types(&mut g, passes)?;
    }
    Ok(g)
}

fn has_unranked(g: &Graph) -> bool {
    g.nodes()
        .iter()
        .any(|n| n.outputs.iter().any(|t| t.is_unranked_tensor()))
}

fn is_static(g: &Graph) -> bool {
    g.nodes().iter().all(|n| {
        n.outputs
            .iter()
            .all(|t| t.is_static() || t.is_host_object())
    })
}

/// Makes static what the bound shapes decide: what they make constant is folded, the
/// `If`s whose condition that decides are inlined, and the branches of the `If`s left
/// (a condition computed from data) are specialized for the shapes of their captures,
/// so that an `If` whose branches then agree has static results. Repeats until every
/// type is static or nothing more changes.
fn settle_types(g: &mut Graph, passes: &CompileOptions) -> Result<()> {
    loop {
        // Only the rewrites that need no ranks.
        let report = run_passes(g, &[&ConstantFold, &InlineConstantIf], passes)?;
        if is_static(g) {
            return Ok(());
        }
        let folded = report.records.iter().any(|r| r.changed);
        if !specialize_branches(g, passes)? && !folded {
            return Ok(());
        }
    }
}

/// Specializes each branch of every `If` with static captures and a result that is not
/// static for those captures' shapes. A branch those shapes do not fit (it would fail
/// if it ran) becomes one that fails when it runs, with the other branch's result types
/// (see [`failing_branch`]), so that the `If` has them. Returns whether a branch changed.
fn specialize_branches(g: &mut Graph, passes: &CompileOptions) -> Result<bool> {
    const BRANCHES: [&str; 2] = ["then_branch", "else_branch"];
    let mut changed = false;
    for id in g.schedule()? {
        let node = g.node(id);
        if node.op != "If" || node.outputs.iter().all(|t| t.is_static()) {
            continue;
        }
        let captures: Option<Vec<Vec<usize>>> = node.inputs[1..]
            .iter()
            .map(|v| v.and_then(|v| g.value_type(v).ok()?.static_dims()))
            .collect();
        let (Some(captures), Some(cond)) = (captures, node.inputs[0]) else {
            continue;
        };
        let (Ok(Some(then)), Ok(Some(other))) =
            (node.attrs.graph(BRANCHES[0]), node.attrs.graph(BRANCHES[1]))
        else {
            continue;
        };
        let bodies = [then.clone(), other.clone()];
        if bodies
            .iter()
            .all(|b| static_input_shapes(b).as_ref() == Some(&captures))
        {
            continue;
        }
        let settled = bodies.map(|b| bind_input_shapes(&b, &captures, passes));
        let mut attrs = node.attrs.clone();
        let mut inputs = node.inputs.clone();
        let results_static = |b: &Graph| {
            b.outputs()
                .iter()
                .all(|o| b.value_type(o.value).is_ok_and(|t| t.is_static()))
        };
        let (good, e, bad) = match settled {
            [Ok(a), Ok(b)] => {
                attrs.set(BRANCHES[0], Attr::Graph(Arc::new(a)));
                attrs.set(BRANCHES[1], Attr::Graph(Arc::new(b)));
                g.node_mut(id).attrs = attrs;
                changed = true;
                continue;
            }
            [Ok(good), Err(e)] if results_static(&good) => (good, e, 1),
            [Err(e), Ok(good)] if results_static(&good) => (good, e, 0),
            _ => continue,
        };
        let params: Vec<TensorType> = node.inputs[1..]
            .iter()
            .map(|v| g.value_type(v.expect("checked static")).cloned())
            .collect::<Result<_>>()?;
        let cond_ty = g.value_type(cond)?.clone();
        let failing = failing_branch(BRANCHES[bad], &e.to_string(), &params, &cond_ty, &good)?;
        let mut good = good;
        good.add_parameter(&good.fresh_name("cond"), cond_ty)?;
        attrs.set(BRANCHES[1 - bad], Attr::Graph(Arc::new(good)));
        attrs.set(BRANCHES[bad], Attr::Graph(Arc::new(failing)));
        attrs.set("captures", Attr::Int(inputs.len() as i64));
        inputs.push(Some(cond));
        let n = g.node_mut(id);
        n.attrs = attrs;
        n.inputs = inputs;
        changed = true;
    }
    if changed {
        g.refresh_types()?;
    }
    Ok(changed)
}

/// A branch that fails when it runs, with the results of `like`: it gathers row `cond`
/// of an empty constant, out of range whichever way `cond` went, in a node whose name
/// says why (`why`) the branch `name` cannot run on these shapes. Its parameters are
/// the captures (`params`), then the condition.
fn failing_branch(
    name: &str,
    why: &str,
    params: &[TensorType],
    cond: &TensorType,
    like: &Graph,
) -> Result<Graph> {
    let mut b = Graph::new(name);
    for (k, ty) in params.iter().enumerate() {
        b.add_parameter(&format!("capture{k}"), ty.clone())?;
    }
    let c = b.add_parameter("cond", cond.clone())?;
    let to_i64 = Attrs::new().with("to", Attr::String("i64".into()));
    let row = b.op("Cast", &[c.into()], to_i64, "row")?;
    let scalar = b.add_constant_value(
        "scalar",
        Tensor::from_vec(&[0], Vec::<i64>::new()).map_err(Error::Graph)?,
    )?;
    let row = b.op(
        "Reshape",
        &[row.into(), scalar.into()],
        Attrs::new(),
        "row_index",
    )?;
    let why = why.replace('"', "'");
    for (k, o) in like.outputs().iter().enumerate() {
        let ty = like.value_type(o.value)?;
        let mut dims = vec![0];
        dims.extend(
            ty.static_dims()
                .ok_or_else(|| Error::Graph(format!("{name}: result {k} is not static")))?,
        );
        let rows = b.add_constant_value(&format!("result{k}"), Tensor::zeros(ty.dtype, &dims))?;
        let fails = format!("{name} cannot run on these input shapes ({why}): result {k}");
        let r = b.op("Gather", &[rows.into(), row.into()], Attrs::new(), &fails)?;
        b.add_output(&o.name, r.into())?;
    }
    Ok(b)
}

/// The graph inputs' dims when all are static (one program serves every run).
pub(crate) fn static_input_shapes(g: &Graph) -> Option<Vec<Vec<usize>>> {
    g.inputs()
        .iter()
        .map(|&id| g.node(id).outputs[0].static_dims())
        .collect()
}

/// Output `k` of node `id` as a dtype and fixed dims, or an error naming the node when
/// its type is not static (a program is made for one input-shape signature).
pub(crate) fn static_output(g: &Graph, id: NodeId, k: usize) -> Result<(DType, Vec<usize>)> {
    let ty = &g.node(id).outputs[k];
    ty.shape
        .to_fixed()
        .map(|shape| (ty.dtype, shape))
        .ok_or_else(|| {
            Error::Graph(format!(
                "{}: output {k} has type {ty}, not static",
                g.describe(id)
            ))
        })
}

/// An executable's programs by input-shape signature. Runs from many threads share it;
/// a program is built outside the lock, and when two runs build the same signature at
/// once the first to finish is kept.
pub(crate) struct ProgramCache<P> {
    programs: RwLock<HashMap<Vec<Vec<usize>>, Arc<P>>>,
}

impl<P> ProgramCache<P> {
    pub(crate) fn new() -> ProgramCache<P> {
        ProgramCache {
            programs: RwLock::new(HashMap::new()),
        }
    }

    /// The program for `shapes`, built by `build` on first sight.
    pub(crate) fn get_or_build(
        &self,
        shapes: &[Vec<usize>],
        build: impl FnOnce() -> Result<P>,
    ) -> Result<Arc<P>> {
        if let Some(p) = self
            .programs
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(shapes)
        {
            return Ok(p.clone());
        }
        let built = Arc::new(build()?);
        let mut map = self.programs.write().unwrap_or_else(|e| e.into_inner());
        Ok(map.entry(shapes.to_vec()).or_insert(built).clone())
    }

    /// Every program built so far, for reports.
    pub(crate) fn all(&self) -> Vec<Arc<P>> {
        let programs = self.programs.read().unwrap_or_else(|e| e.into_inner());
        programs.values().cloned().collect()
    }

    /// The program already built for these inputs' shapes, found without allocating
    /// (the hot path of a run).
    pub(crate) fn find(&self, inputs: &[Tensor]) -> Option<Arc<P>> {
        self.find_by(|shapes| {
            shapes.len() == inputs.len() && shapes.iter().zip(inputs).all(|(s, t)| s == t.shape())
        })
    }

    /// The program built for the signature `matches` accepts, found without allocating.
    pub(crate) fn find_by(&self, matches: impl Fn(&[Vec<usize>]) -> bool) -> Option<Arc<P>> {
        let programs = self.programs.read().unwrap_or_else(|e| e.into_inner());
        programs
            .iter()
            .find(|(shapes, _)| matches(shapes))
            .map(|(_, p)| p.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::text::parse;

    #[test]
    fn the_cache_builds_a_signature_once_and_finds_it_by_the_inputs_shapes() {
        let cache: ProgramCache<usize> = ProgramCache::new();
        let mut builds = 0;
        let mut build = |n| {
            builds += 1;
            Ok(n)
        };
        assert_eq!(*cache.get_or_build(&[vec![2, 3]], || build(1)).unwrap(), 1);
        assert_eq!(*cache.get_or_build(&[vec![2, 3]], || build(2)).unwrap(), 1);
        assert_eq!(builds, 1);
        let input = Tensor::zeros(DType::F32, &[2, 3]);
        assert_eq!(
            cache.find(std::slice::from_ref(&input)).as_deref(),
            Some(&1)
        );
        let other = Tensor::zeros(DType::F32, &[3, 2]);
        assert!(cache.find(&[other]).is_none());
        assert!(cache.find(&[input.clone(), input]).is_none());
        // A failed build caches nothing.
        assert!(cache
            .get_or_build(&[vec![4]], || Err(Error::Graph("no".into())))
            .is_err());
        assert!(cache.find(&[Tensor::zeros(DType::F32, &[4])]).is_none());
    }

    #[test]
    fn specializing_binds_the_input_symbols_and_static_shapes_follow() {
        let g = parse(
            "graph \"g\" {\n  %0 \"x\" = Parameter : f32[n, 3]\n  \
             %1 \"y\" = Relu(%0) : f32[n, 3]\n  return \"y\" = %1\n}\n",
            "t.kir",
            None,
        )
        .unwrap();
        assert_eq!(static_input_shapes(&g), None);
        let s = specialize_for_shapes(&g, &[vec![5, 3]], &CompileOptions::default()).unwrap();
        assert_eq!(static_input_shapes(&s), Some(vec![vec![5, 3]]));
        let y = s.outputs()[0].value.node;
        assert_eq!(static_output(&s, y, 0).unwrap(), (DType::F32, vec![5, 3]));
        let y = g.outputs()[0].value.node;
        let err = static_output(&g, y, 0).unwrap_err().to_string();
        assert!(err.contains("not static"), "{err}");
    }
}
