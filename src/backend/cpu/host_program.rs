//! Signatures that keep host objects (strings, sequences, optionals), or types known only
//! at run time after specialization and after keying by input values ([`by_value`]):
//! a host program. It walks the specialized graph in schedule order with the values in
//! host memory, and runs each node as one of
//! - `dynamic-kernel`: the node alone, as a graph of its own at the shapes its inputs
//!   have at run time (its constant operands copied in), specialized and lowered like
//!   any signature and cached by those shapes. SplitToSequence and ConcatFromSequence on
//!   numbers run so too, as the Split or Concat their data movement is;
//! - `host-string` / `host-sequence`: ops on text, and the plumbing of sequences and
//!   optionals, through the catalogue's implementation: the only one there is, and one
//!   that moves values or works on the text (no arithmetic);
//! - `custom-eval`: a registered op whose result's type is known only once it runs,
//!   through its author's own `eval` (the only kernel it has for such a result);
//! - `host-if` / `host-loop`: the condition and trip count read here, each body compiled
//!   (a program, or a host program of its own) by the shapes it is given. (A Scan runs as
//!   a kernel: its trip count is its inputs' length.)
//!
//! The reference interpreter is never a step: a node none of these can run is an error
//! naming it (the interpreter runs it only under `KILN_ALLOW_FALLBACK=1`).
//!
//! [`by_value`]: super::by_value
use std::borrow::Borrow;
use std::sync::Arc;

use super::{Compiled, CpuExecutable, StepInfo};
use crate::backend::specialize::ProgramCache;
use crate::error::{Error, Result};
use crate::ir::eval::bind;
use crate::ir::ops::control::{empty_stack, loop_counts, single_value, stack, MAX_ITERATIONS};
use crate::ir::ops::custom::{contain, OpRef};
use crate::ir::ops::sequence::split_sizes;
use crate::ir::ops::{evaluate, EvalCtx};
use crate::ir::shape::norm_axis;
use crate::ir::{Attr, Attrs, Graph, Node, NodeId, Shape, TensorType, Value};
use crate::tensor::{Sequence, Tensor};

/// A specialized graph run node by node on the host (see the module comment).
pub struct HostProgram {
    graph: Graph,
    steps: Vec<HostStep>,
    /// By node index: the graph input a `Parameter` is.
    param: Vec<Option<usize>>,
    /// By node index: how many operand slots and graph outputs read the node, so that a
    /// value is dropped after its last read.
    reads: Vec<usize>,
}

struct HostStep {
    id: NodeId,
    run: Run,
}

enum Run {
    Parameter,
    Constant,
    /// The node as a graph of its own, compiled by its inputs' shapes.
    Kernel(ProgramCache<Compiled>),
    /// A Split (and a Squeeze per part when the axis goes), by the input's shape and
    /// the parts' sizes.
    SplitToSequence(ProgramCache<Compiled>),
    /// A Concat (of Unsqueezes for `new_axis`), by the items' shapes.
    ConcatFromSequence(ProgramCache<Compiled>),
    Host(OpRef, &'static str),
    /// The two branches' programs, `else_branch` first.
    If([ProgramCache<Compiled>; 2]),
    Loop(ProgramCache<Compiled>),
}

impl Run {
    fn kind(&self) -> Option<&'static str> {
        Some(match self {
            Run::Parameter | Run::Constant => return None,
            Run::Kernel(_) | Run::SplitToSequence(_) | Run::ConcatFromSequence(_) => {
                "dynamic-kernel"
            }
            Run::Host(_, kind) => kind,
            Run::If(_) => "host-if",
            Run::Loop(_) => "host-loop",
        })
    }

    /// The programs built so far, for reports.
    fn programs(&self) -> Vec<Arc<Compiled>> {
        match self {
            Run::Kernel(c)
            | Run::SplitToSequence(c)
            | Run::ConcatFromSequence(c)
            | Run::Loop(c) => c.all(),
            Run::If([a, b]) => a.all().into_iter().chain(b.all()).collect(),
            Run::Parameter | Run::Constant | Run::Host(..) => vec![],
        }
    }
}

/// Whether a node reads or makes host objects.
fn touches_host_objects(g: &Graph, node: &Node) -> bool {
    node.outputs.iter().any(TensorType::is_host_object)
        || node
            .inputs
            .iter()
            .flatten()
            .any(|&v| g.value_type(v).is_ok_and(TensorType::is_host_object))
}

impl HostProgram {
    /// The host program of specialized graph `g`; nodes whose inputs are static are
    /// compiled now, so that their errors show at compile time.
    pub(super) fn new(exe: &CpuExecutable, g: Graph) -> Result<HostProgram> {
        let params = g.inputs();
        let mut param = vec![None; g.len()];
        for (k, id) in params.iter().enumerate() {
            param[id.index()] = Some(k);
        }
        let mut reads = vec![0; g.len()];
        for n in g.nodes() {
            for v in n.inputs.iter().flatten() {
                reads[v.node.index()] += 1;
            }
        }
        for o in g.outputs() {
            reads[o.value.node.index()] += 1;
        }
        let mut steps = vec![];
        for id in g.schedule()? {
            let node = g.node(id);
            let strings = node.outputs.iter().any(|t| t.dtype.is_string())
                || node
                    .inputs
                    .iter()
                    .flatten()
                    .any(|&v| g.value_type(v).is_ok_and(|t| t.dtype.is_string()));
            let run = match node.op.as_str() {
                "Parameter" => Run::Parameter,
                "Constant" => Run::Constant,
                "Variable" | "Assign" => {
                    return Err(Error::Graph(format!(
                        "{}: a graph with state whose types stay dynamic or hold host objects has no cpu program (KILN_ALLOW_FALLBACK=1 runs it on the reference interpreter)",
                        g.describe(id)
                    )))
                }
                "If" => Run::If([ProgramCache::new(), ProgramCache::new()]),
                "Loop" => Run::Loop(ProgramCache::new()),
                "SplitToSequence" if !strings => Run::SplitToSequence(ProgramCache::new()),
                "ConcatFromSequence" if !strings => Run::ConcatFromSequence(ProgramCache::new()),
                op => {
                    let imp = g.op_impl(op).ok_or_else(|| {
                        Error::UnknownOp(format!("{}: unknown op", g.describe(id)))
                    })?;
                    // Sequence and optional ops are host plumbing even without a host
                    // operand (an OptionalHasElement of nothing).
                    if touches_host_objects(&g, node) || imp.schema().family == "sequence" {
                        Run::Host(imp, if strings { "host-string" } else { "host-sequence" })
                    } else if matches!(imp, OpRef::Registered(_))
                        && node.outputs.iter().any(|t| !t.is_static())
                    {
                        Run::Host(imp, "custom-eval")
                    } else {
                        Run::Kernel(ProgramCache::new())
                    }
                }
            };
            steps.push(HostStep { id, run });
        }
        let h = HostProgram {
            graph: g,
            steps,
            param,
            reads,
        };
        for step in &h.steps {
            let Run::Kernel(cache) = &step.run else {
                continue;
            };
            let node = h.graph.node(step.id);
            let types: Option<Vec<TensorType>> = operands(&h.graph, node)
                .map(|v| {
                    h.graph
                        .value_type(v)
                        .ok()
                        .filter(|t| t.is_static())
                        .cloned()
                })
                .collect();
            if let Some(types) = types {
                let dims: Vec<Vec<usize>> =
                    types.iter().filter_map(TensorType::static_dims).collect();
                cache.get_or_build(&dims, || exe.node_program(&h.graph, step.id, &types))?;
            }
        }
        Ok(h)
    }

    /// The host steps (the kinds above) and, one level deeper, the programs built for
    /// each so far.
    pub(super) fn report(
        &self,
        exe: &CpuExecutable,
        depth: usize,
        out: &mut Vec<StepInfo>,
    ) -> Result<()> {
        for step in &self.steps {
            let Some(kind) = step.run.kind() else {
                continue;
            };
            out.push(StepInfo {
                node: self.graph.describe(step.id),
                kind,
                depth,
            });
            for p in step.run.programs() {
                out.extend(exe.report(&p)?.into_iter().map(|s| StepInfo {
                    depth: s.depth + depth + 1,
                    ..s
                }));
            }
        }
        Ok(())
    }
}

/// The operands of `node` that become parameters of its graph of one node: present and
/// not constants (those are copied in).
fn operands<'a>(g: &'a Graph, node: &'a Node) -> impl Iterator<Item = Value> + 'a {
    node.inputs
        .iter()
        .flatten()
        .copied()
        .filter(|v| g.node(v.node).op != "Constant")
}

/// The static type of a run-time value.
fn type_of(t: &Tensor) -> TensorType {
    TensorType::new(t.dtype(), Shape::fixed(t.shape()))
}

fn parameter(sub: &mut Graph, name: &str, ty: TensorType) -> Result<Value> {
    let name = sub.fresh_name(name);
    Ok(sub.add_parameter(&name, ty)?.out(0))
}

fn i64_constant(sub: &mut Graph, name: &str, v: &[usize]) -> Result<Value> {
    let v: Vec<i64> = v
        .iter()
        .map(|&x| i64::try_from(x).map_err(|_| Error::Graph(format!("{x} is too large"))))
        .collect::<Result<_>>()?;
    let t = Tensor::from_vec(&[v.len()], v).map_err(Error::Graph)?;
    let name = sub.fresh_name(name);
    Ok(sub.add_constant_value(&name, t)?.out(0))
}

impl CpuExecutable {
    /// Node `id` of `g` alone, its non-constant operands of the static types `ins`,
    /// compiled without a host program of its own.
    fn node_program(&self, g: &Graph, id: NodeId, ins: &[TensorType]) -> Result<Compiled> {
        let node = g.node(id);
        let mut sub = Graph::new(&format!("{}.{}", g.name, node.name));
        let mut ins = ins.iter();
        let mut inputs = vec![];
        for v in &node.inputs {
            inputs.push(match v {
                None => None,
                Some(v) if g.node(v.node).op == "Constant" => {
                    let c = g.node(v.node);
                    let data = c.data.as_deref().expect("verified: a constant has data");
                    let name = sub.fresh_name(&c.name);
                    Some(
                        sub.add_constant(&name, c.outputs[0].clone(), data.clone())?
                            .out(0),
                    )
                }
                Some(v) => {
                    let ty = ins.next().expect("one type per operand").clone();
                    Some(parameter(&mut sub, &g.node(v.node).name, ty)?)
                }
            });
        }
        let n = sub.add_op(&node.op, &inputs, node.attrs.clone(), &node.name)?;
        for k in 0..node.outputs.len() {
            sub.add_output(&k.to_string(), n.out(k as u32))?;
        }
        let shapes: Vec<Vec<usize>> = sub
            .inputs()
            .iter()
            .map(|&p| sub.node(p).outputs[0].static_dims().expect("fixed"))
            .collect();
        self.specialize_with(&sub, &shapes, true, false)
    }

    /// A run of a host program (see the module comment).
    pub(super) fn run_host<T: Borrow<Tensor>>(
        &self,
        h: &HostProgram,
        inputs: &[T],
    ) -> Result<Vec<Tensor>> {
        let g = &h.graph;
        let mut values: Vec<Vec<Tensor>> = vec![vec![]; g.len()];
        let mut left = h.reads.clone();
        for step in &h.steps {
            if matches!(step.run, Run::Parameter) {
                continue;
            }
            let node = g.node(step.id);
            let outs = {
                let value = |v: Value| -> &Tensor {
                    match h.param[v.node.index()] {
                        Some(k) => inputs[k].borrow(),
                        None => &values[v.node.index()][v.output as usize],
                    }
                };
                let args: Vec<Option<&Tensor>> = node.inputs.iter().map(|v| v.map(value)).collect();
                match self.run_host_step(g, step, &args) {
                    Ok(outs) => outs,
                    Err(e) => {
                        let e = e.into_message();
                        return Err(Error::Runtime(format!("{}: {e}", g.describe(step.id))));
                    }
                }
            };
            if outs.len() != node.outputs.len() {
                return Err(Error::Runtime(format!(
                    "{}: gave {} results, its type says {}",
                    g.describe(step.id),
                    outs.len(),
                    node.outputs.len()
                )));
            }
            for (k, (t, ty)) in outs.iter().zip(&node.outputs).enumerate() {
                bind(ty, t, &mut Default::default()).map_err(|e| {
                    Error::Runtime(format!("{}: result {k}: {e}", g.describe(step.id)))
                })?;
            }
            for v in node.inputs.iter().flatten() {
                let k = v.node.index();
                left[k] -= 1;
                if left[k] == 0 {
                    values[k] = vec![];
                }
            }
            values[step.id.index()] = outs;
        }
        Ok(g.outputs()
            .iter()
            .map(|o| match h.param[o.value.node.index()] {
                Some(k) => inputs[k].borrow().clone(),
                None => values[o.value.node.index()][o.value.output as usize].clone(),
            })
            .collect())
    }

    fn run_host_step(
        &self,
        g: &Graph,
        step: &HostStep,
        args: &[Option<&Tensor>],
    ) -> Result<Vec<Tensor>> {
        let node = g.node(step.id);
        let attrs = &node.attrs;
        let present = || args.iter().flatten().copied();
        match &step.run {
            Run::Parameter => unreachable!("read where it is used"),
            Run::Constant => Ok(vec![node
                .data
                .as_deref()
                .expect("verified: a constant has data")
                .clone()]),
            Run::Kernel(cache) => {
                let ins: Vec<&Tensor> = node
                    .inputs
                    .iter()
                    .zip(args)
                    .filter(|(v, _)| v.is_some_and(|v| g.node(v.node).op != "Constant"))
                    .filter_map(|(_, a)| *a)
                    .collect();
                let p = match cache.find_by(|s| same_shapes(s, &ins)) {
                    Some(p) => p,
                    None => {
                        let types: Vec<TensorType> = ins.iter().map(|t| type_of(t)).collect();
                        let shapes = shapes_of(&ins);
                        cache.get_or_build(&shapes, || self.node_program(g, step.id, &types))?
                    }
                };
                self.run_compiled(&p, &ins)
            }
            Run::Host(op, _) => {
                let types: Vec<Option<&TensorType>> = node
                    .inputs
                    .iter()
                    .map(|v| v.and_then(|v| g.value_type(v).ok()))
                    .collect();
                let cx = EvalCtx {
                    inputs: args,
                    input_types: &types,
                    attrs,
                };
                contain(op, || evaluate(&**op, &cx)).map_err(Error::Runtime)
            }
            Run::SplitToSequence(cache) => {
                let x = operand(args, 0)?;
                let axis = norm_axis(attrs.int_or("axis", 0).map_err(Error::Graph)?, x.rank())
                    .map_err(Error::Runtime)?;
                let keepdims = attrs.int_or("keepdims", 1).map_err(Error::Graph)? != 0;
                let split = args.get(1).copied().flatten();
                let (sizes, drop_axis) =
                    split_sizes(x.shape()[axis], split, keepdims).map_err(Error::Runtime)?;
                let items = if sizes.is_empty() {
                    vec![]
                } else {
                    let key = [
                        x.shape().to_vec(),
                        sizes.clone(),
                        vec![axis, drop_axis as usize],
                    ];
                    let p = cache.get_or_build(&key, || {
                        self.split_program(g, step.id, x, axis, &sizes, drop_axis)
                    })?;
                    self.run_compiled(&p, &[x])?
                };
                Ok(vec![Tensor::Sequence(Sequence {
                    dtype: x.dtype(),
                    inner: vec![],
                    items,
                })])
            }
            Run::ConcatFromSequence(cache) => {
                let Some(Tensor::Sequence(seq)) = args.first().copied().flatten() else {
                    return Err(Error::Runtime("input 0 is not a sequence".into()));
                };
                let first = seq
                    .items
                    .first()
                    .ok_or_else(|| Error::Runtime("cannot concatenate an empty sequence".into()))?;
                let new_axis = attrs.int_or("new_axis", 0).map_err(Error::Graph)? != 0;
                let axis = attrs.req_int("axis").map_err(Error::Graph)?;
                let axis = norm_axis(axis, first.rank() + usize::from(new_axis))
                    .map_err(Error::Runtime)?;
                let items: Vec<&Tensor> = seq.items.iter().collect();
                let p = match cache.find_by(|s| same_shapes(s, &items)) {
                    Some(p) => p,
                    None => {
                        let shapes = shapes_of(&items);
                        cache.get_or_build(&shapes, || {
                            self.concat_program(g, step.id, &items, axis, new_axis)
                        })?
                    }
                };
                self.run_compiled(&p, &items)
            }
            Run::If(branches) => {
                let cond = single_value(operand(args, 0)?, "cond").map_err(Error::Runtime)? != 0;
                let body = attrs
                    .req_graph(if cond { "then_branch" } else { "else_branch" })
                    .map_err(Error::Graph)?;
                let caps: Vec<&Tensor> = present().skip(1).collect();
                self.run_body(&branches[usize::from(cond)], body, &caps)
            }
            Run::Loop(cache) => self.run_loop(cache, attrs, args),
        }
    }

    /// `body` on `ins`, its program for their shapes from `cache` (built on first sight).
    fn run_body(
        &self,
        cache: &ProgramCache<Compiled>,
        body: &Graph,
        ins: &[&Tensor],
    ) -> Result<Vec<Tensor>> {
        let p = match cache.find_by(|s| same_shapes(s, ins)) {
            Some(p) => p,
            None => {
                let shapes = shapes_of(ins);
                cache.get_or_build(&shapes, || self.specialize_with(body, &shapes, true, true))?
            }
        };
        self.run_compiled(&p, ins)
            .map_err(|e| Error::Runtime(format!("body '{}': {e}", body.name)))
    }

    /// A Loop: the trip count and condition read here, the body run per iteration, the
    /// scan outputs stacked at the end (ONNX semantics, as the catalogue's Loop).
    fn run_loop(
        &self,
        cache: &ProgramCache<Compiled>,
        attrs: &Attrs,
        args: &[Option<&Tensor>],
    ) -> Result<Vec<Tensor>> {
        let runtime = Error::Runtime;
        let (carried, _) = loop_counts(args.len(), attrs).map_err(Error::Graph)?;
        let body = attrs.req_graph("body").map_err(Error::Graph)?;
        let trips = match args[0] {
            Some(m) => single_value(m, "M").map_err(runtime)?,
            None => i64::MAX,
        };
        let mut cond = match args[1] {
            Some(c) => single_value(c, "cond").map_err(runtime)? != 0,
            None => true,
        };
        let mut state: Vec<Tensor> = (2..2 + carried)
            .map(|k| operand(args, k).cloned())
            .collect::<Result<_>>()?;
        let caps: Vec<&Tensor> = (2 + carried..args.len())
            .map(|k| operand(args, k))
            .collect::<Result<_>>()?;
        let mut first_shapes = vec![vec![], vec![]];
        first_shapes.extend(
            state
                .iter()
                .chain(caps.iter().copied())
                .map(|t| t.shape().to_vec()),
        );
        let n_scan = body.outputs().len().saturating_sub(1 + carried);
        let mut scans: Vec<Vec<Tensor>> = vec![vec![]; n_scan];
        let mut i = 0i64;
        while i < trips && cond {
            if i >= MAX_ITERATIONS {
                return Err(runtime(format!(
                    "the loop ran {MAX_ITERATIONS} iterations without ending"
                )));
            }
            let outs = {
                let (iteration, c) = (Tensor::scalar(i), Tensor::scalar(cond));
                let mut ins: Vec<&Tensor> = vec![&iteration, &c];
                ins.extend(state.iter());
                ins.extend(caps.iter().copied());
                self.run_body(cache, body, &ins)?
            };
            let mut outs = outs.into_iter();
            let c = outs
                .next()
                .ok_or_else(|| runtime("the body gave no cond".into()))?;
            cond = single_value(&c, "the body's cond").map_err(runtime)? != 0;
            state = outs.by_ref().take(carried).collect();
            for (acc, t) in scans.iter_mut().zip(outs) {
                acc.push(t);
            }
            i += 1;
        }
        let mut results = state;
        for (k, parts) in scans.into_iter().enumerate() {
            let empty = empty_stack(body, 1 + carried + k, 0, &first_shapes).map_err(runtime)?;
            results.push(stack(parts, 0, false, empty).map_err(runtime)?);
        }
        Ok(results)
    }

    /// SplitToSequence's data movement: Split into `sizes` along `axis`, each part
    /// squeezed when `drop_axis`.
    fn split_program(
        &self,
        g: &Graph,
        id: NodeId,
        x: &Tensor,
        axis: usize,
        sizes: &[usize],
        drop_axis: bool,
    ) -> Result<Compiled> {
        let name = &g.node(id).name;
        let mut sub = Graph::new(&format!("{}.{name}", g.name));
        let p = parameter(&mut sub, name, type_of(x))?;
        let split = i64_constant(&mut sub, "split", sizes)?;
        let axis_attr = Attrs::new().with("axis", Attr::Int(axis as i64));
        let split_name = sub.fresh_name(name);
        let parts = sub.op("Split", &[p, split], axis_attr, &split_name)?;
        let axes = drop_axis
            .then(|| i64_constant(&mut sub, "axes", &[axis]))
            .transpose()?;
        for k in 0..sizes.len() {
            let mut part = parts.out(k as u32);
            if let Some(axes) = axes {
                part = sub.op("Squeeze", &[part, axes], Attrs::new(), "")?.out(0);
            }
            sub.add_output(&k.to_string(), part)?;
        }
        self.specialize_with(&sub, &[x.shape().to_vec()], true, false)
    }

    /// ConcatFromSequence's data movement: Concat along `axis` of the items, each given
    /// a size-1 axis there first when `new_axis`.
    fn concat_program(
        &self,
        g: &Graph,
        id: NodeId,
        items: &[&Tensor],
        axis: usize,
        new_axis: bool,
    ) -> Result<Compiled> {
        let name = &g.node(id).name;
        let mut sub = Graph::new(&format!("{}.{name}", g.name));
        let axes = new_axis
            .then(|| i64_constant(&mut sub, "axes", &[axis]))
            .transpose()?;
        let mut parts = vec![];
        for t in items {
            let mut part = parameter(&mut sub, "item", type_of(t))?;
            if let Some(axes) = axes {
                part = sub.op("Unsqueeze", &[part, axes], Attrs::new(), "")?.out(0);
            }
            parts.push(part);
        }
        let axis_attr = Attrs::new().with("axis", Attr::Int(axis as i64));
        let concat_name = sub.fresh_name(name);
        let joined = sub.op("Concat", &parts, axis_attr, &concat_name)?;
        sub.add_output("0", joined.out(0))?;
        self.specialize_with(&sub, &shapes_of(items), true, false)
    }
}

fn operand<'a>(args: &[Option<&'a Tensor>], k: usize) -> Result<&'a Tensor> {
    args.get(k)
        .copied()
        .flatten()
        .ok_or_else(|| Error::Runtime(format!("operand {k} is missing")))
}

fn shapes_of(ins: &[&Tensor]) -> Vec<Vec<usize>> {
    ins.iter().map(|t| t.shape().to_vec()).collect()
}

/// Whether a cached signature is `ins`' shapes (without allocating).
fn same_shapes(shapes: &[Vec<usize>], ins: &[&Tensor]) -> bool {
    shapes.len() == ins.len() && shapes.iter().zip(ins).all(|(s, t)| s == t.shape())
}
