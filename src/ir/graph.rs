//! The dataflow graph: an arena of nodes; a value is one output of one node.
use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use super::attr::Attrs;
use super::ops::{self, InferCtx};
use super::shape::{Dim, Shape, TensorType, ANY_DIM};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// A node's index in its graph's arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

impl NodeId {
    pub(crate) fn index(self) -> usize {
        self.0 as usize
    }
}

/// One output of one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Value {
    pub node: NodeId,
    pub output: u32,
}

impl NodeId {
    /// This node's output `i`.
    pub fn out(self, i: u32) -> Value {
        Value {
            node: self,
            output: i,
        }
    }
}

impl From<NodeId> for Value {
    /// A node's first output.
    fn from(n: NodeId) -> Value {
        n.out(0)
    }
}

/// One op application.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// Unique within the graph. For a `Parameter`, the graph input's name.
    pub name: String,
    /// The catalogue name of the op (`Conv`, `Parameter`, …).
    pub op: String,
    /// Operands in order; `None` is an omitted optional input.
    pub inputs: Vec<Option<Value>>,
    pub attrs: Attrs,
    /// The type of each output (declared for sources, inferred otherwise).
    pub outputs: Vec<TensorType>,
    /// Nodes that must run before this one although no value flows (orders `Assign`s).
    pub control_deps: Vec<NodeId>,
    /// A `Constant`'s value or a `Variable`'s initial value.
    pub data: Option<Arc<Tensor>>,
}

/// A graph output: a value under a name.
#[derive(Debug, Clone, PartialEq)]
pub struct GraphOutput {
    pub name: String,
    pub value: Value,
}

/// A dataflow graph. Nodes are only appended, and a node's inputs and control
/// dependencies must already exist, so a graph built through this API is acyclic.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Graph {
    pub name: String,
    nodes: Vec<Node>,
    outputs: Vec<GraphOutput>,
    /// The registered (user) ops the nodes use, held so they outlive unregistration.
    pinned: ops::custom::Pinned,
    /// What rewritten nodes replaced: for pictures and reports, not part of the graph's
    /// meaning (never printed, ignored by `==`).
    provenance: Provenance,
}

/// One node a pass replaced: its name and op when it was replaced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub name: String,
    pub op: String,
}

/// Per node, the original nodes it stands in for, carried through later rewrites. An
/// entry is pending until the next `compact`: it counts only if the nodes it came
/// through (`via`) are gone by then, since a node another reader keeps was not replaced.
#[derive(Debug, Clone, Default)]
struct Provenance(HashMap<NodeId, Vec<(Origin, Vec<NodeId>)>>);

impl PartialEq for Provenance {
    /// Bookkeeping, not meaning: two graphs of the same nodes are equal.
    fn eq(&self, _: &Provenance) -> bool {
        true
    }
}

impl Graph {
    pub fn new(name: &str) -> Graph {
        Graph {
            name: name.to_string(),
            ..Graph::default()
        }
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }

    pub(crate) fn node_ids(&self) -> impl Iterator<Item = NodeId> {
        (0..self.nodes.len() as u32).map(NodeId)
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The type of a value.
    pub fn value_type(&self, v: Value) -> Result<&TensorType> {
        self.nodes
            .get(v.node.index())
            .and_then(|n| n.outputs.get(v.output as usize))
            .ok_or_else(|| Error::Graph(format!("value %{}:{} does not exist", v.node.0, v.output)))
    }

    /// The `Parameter` nodes in creation order: the graph's inputs.
    pub fn inputs(&self) -> Vec<NodeId> {
        self.node_ids()
            .filter(|&id| self.node(id).op == "Parameter")
            .collect()
    }

    pub fn outputs(&self) -> &[GraphOutput] {
        &self.outputs
    }

    /// The node called `name`.
    pub fn find(&self, name: &str) -> Option<NodeId> {
        self.node_ids().find(|&id| self.node(id).name == name)
    }

    /// `"node #3 'conv1' (Conv)"`: how errors name a node.
    pub fn describe(&self, id: NodeId) -> String {
        let n = self.node(id);
        format!("node #{} '{}' ({})", id.0, n.name, n.op)
    }

    fn check_name(&self, name: &str) -> Result<()> {
        if name.is_empty() {
            return Err(Error::InvalidArgument(
                "a node name must not be empty".into(),
            ));
        }
        if self.find(name).is_some() {
            return Err(Error::Graph(format!(
                "a node named '{name}' already exists"
            )));
        }
        Ok(())
    }

    /// `name`, or `<op>_<index>` when empty.
    fn name_or_default(&self, name: &str, op: &str) -> String {
        if name.is_empty() {
            format!("{}_{}", op.to_ascii_lowercase(), self.nodes.len())
        } else {
            name.to_string()
        }
    }

    fn push(&mut self, node: Node) -> NodeId {
        self.pinned.pin(&node.op);
        self.nodes.push(node);
        NodeId(self.nodes.len() as u32 - 1)
    }

    /// A graph input of the given type.
    pub fn add_parameter(&mut self, name: &str, ty: TensorType) -> Result<NodeId> {
        self.check_name(name)?;
        Ok(self.push(Node {
            name: name.to_string(),
            op: "Parameter".into(),
            inputs: vec![],
            attrs: Attrs::new(),
            outputs: vec![ty],
            control_deps: vec![],
            data: None,
        }))
    }

    /// A constant with the given value; `ty` carries the dims and axis names, and must
    /// be static and match the value.
    pub fn add_constant(&mut self, name: &str, ty: TensorType, value: Tensor) -> Result<NodeId> {
        self.add_stateful("Constant", name, ty, value)
    }

    /// A constant typed after its value, unnamed axes.
    pub fn add_constant_value(&mut self, name: &str, value: Tensor) -> Result<NodeId> {
        let ty = TensorType::new(value.dtype(), super::Shape::fixed(value.shape()));
        self.add_constant(name, ty, value)
    }

    /// State that persists across runs, starting from `init`; changed only by `Assign`.
    pub fn add_variable(&mut self, name: &str, ty: TensorType, init: Tensor) -> Result<NodeId> {
        self.add_stateful("Variable", name, ty, init)
    }

    fn add_stateful(
        &mut self,
        op: &str,
        name: &str,
        ty: TensorType,
        value: Tensor,
    ) -> Result<NodeId> {
        let name = self.name_or_default(name, op);
        self.check_name(&name)?;
        check_data(&ty, &value).map_err(|e| Error::Graph(format!("{op} '{name}': {e}")))?;
        Ok(self.push(Node {
            name,
            op: op.into(),
            inputs: vec![],
            attrs: Attrs::new(),
            outputs: vec![ty],
            control_deps: vec![],
            data: Some(Arc::new(value)),
        }))
    }

    /// Applies catalogue op `op` to `inputs`; the output types are inferred now, so a
    /// bad operand is an error here, naming the node. An empty `name` gets a default.
    pub fn add_op(
        &mut self,
        op: &str,
        inputs: &[Option<Value>],
        attrs: Attrs,
        name: &str,
    ) -> Result<NodeId> {
        if matches!(op, "Parameter" | "Constant" | "Variable") {
            return Err(Error::InvalidArgument(format!(
                "{op} is a source: add it with add_{} (it needs a declared type)",
                op.to_ascii_lowercase()
            )));
        }
        let name = self.name_or_default(name, op);
        self.check_name(&name)?;
        let mut node = Node {
            name,
            op: op.to_string(),
            inputs: inputs.to_vec(),
            attrs,
            outputs: vec![],
            control_deps: vec![],
            data: None,
        };
        let id = NodeId(self.nodes.len() as u32);
        node.outputs = self.infer_node(&node).map_err(|e| {
            let what = format!("node #{} '{}' ({})", id.0, node.name, node.op);
            match e {
                Error::UnknownOp(m) => Error::UnknownOp(format!("{what}: {m}")),
                e => Error::Graph(format!("{what}: {}", e.into_message())),
            }
        })?;
        Ok(self.push(node))
    }

    /// Shorthand for `add_op` with every input present.
    pub fn op(&mut self, op: &str, inputs: &[Value], attrs: Attrs, name: &str) -> Result<NodeId> {
        let inputs: Vec<Option<Value>> = inputs.iter().map(|&v| Some(v)).collect();
        self.add_op(op, &inputs, attrs, name)
    }

    /// Orders `node` after `after` (no value flows). `after` must be an earlier node.
    pub fn add_control_dep(&mut self, node: NodeId, after: NodeId) -> Result<()> {
        if node.index() >= self.nodes.len() || after >= node {
            return Err(Error::Graph(format!(
                "control dependency %{} -> %{}: the dependency must be an earlier node",
                after.0, node.0
            )));
        }
        let deps = &mut self.nodes[node.index()].control_deps;
        if !deps.contains(&after) {
            deps.push(after);
        }
        Ok(())
    }

    /// Marks `value` as the graph output `name`.
    pub fn add_output(&mut self, name: &str, value: Value) -> Result<()> {
        self.value_type(value)?;
        if name.is_empty() {
            return Err(Error::InvalidArgument("a graph output needs a name".into()));
        }
        if self.outputs.iter().any(|o| o.name == name) {
            return Err(Error::Graph(format!(
                "a graph output named '{name}' already exists"
            )));
        }
        self.outputs.push(GraphOutput {
            name: name.to_string(),
            value,
        });
        Ok(())
    }

    /// The part of the graph whose types are all static, when some are not (dims known
    /// only at run time, host objects): the nodes with static outputs reading only such
    /// nodes, with the graph's static outputs and every static value a left-out node
    /// reads as its outputs. Also returns how many nodes were left out and the first.
    /// `None` when every type is static.
    pub fn static_part(&self) -> Result<Option<(Graph, usize, NodeId)>> {
        let schedule = self.schedule()?;
        let mut dynamic = vec![false; self.nodes.len()];
        for &id in &schedule {
            let n = self.node(id);
            dynamic[id.index()] = n
                .outputs
                .iter()
                .any(|t| !t.is_static() || t.is_host_object())
                || n.inputs.iter().flatten().any(|v| dynamic[v.node.index()]);
        }
        let Some(first) = schedule.iter().copied().find(|id| dynamic[id.index()]) else {
            return Ok(None);
        };
        let mut part = self.clone();
        part.outputs.retain(|o| !dynamic[o.value.node.index()]);
        let mut frontier: Vec<Value> = vec![];
        for &id in schedule.iter().filter(|id| dynamic[id.index()]) {
            for v in self.node(id).inputs.iter().flatten() {
                if !dynamic[v.node.index()] && !frontier.contains(v) {
                    frontier.push(*v);
                }
            }
        }
        for v in frontier {
            let name = part.fresh_name(&format!("{}.static", self.node(v.node).name));
            part.outputs.push(GraphOutput { name, value: v });
        }
        // (A left-out Assign stays, as compact keeps state: planning then says why.)
        part.compact();
        let left_out = dynamic.iter().filter(|&&d| d).count();
        Ok(Some((part, left_out, first)))
    }

    /// The op called `name` as this graph knows it: a registered op it uses (even if
    /// unregistered since), else the catalogue's or the registry's.
    pub fn op_impl(&self, name: &str) -> Option<ops::custom::OpRef> {
        match self.pinned.get(name) {
            Some(op) => Some(ops::custom::OpRef::Registered(op.clone())),
            None => ops::custom::resolve(name),
        }
    }

    /// The node's output types as the catalogue infers them from its current inputs.
    /// Errors do not name the node (callers add that).
    pub(crate) fn infer_node(&self, node: &Node) -> Result<Vec<TensorType>> {
        let op = self.op_impl(&node.op).ok_or_else(|| {
            Error::UnknownOp(if node.op.contains("::") {
                format!(
                    "'{}' is not a registered op (kiln_register_op; it may have been unregistered)",
                    node.op
                )
            } else {
                format!("'{}' is not in the catalogue", node.op)
            })
        })?;
        let schema = op.schema();
        op.validate_attrs(&node.attrs).map_err(Error::Graph)?;
        if schema.family == "source" {
            return Ok(node.outputs.clone());
        }
        let (min, max) = schema.input_arity();
        let n = node.inputs.len();
        if n < min || max.is_some_and(|m| n > m) {
            let want = match max {
                Some(m) if m == min => format!("{m}"),
                Some(m) => format!("{min} to {m}"),
                None => format!("at least {min}"),
            };
            return Err(Error::Graph(format!(
                "{} takes {want} inputs, got {n}",
                node.op
            )));
        }
        let mut types = Vec::with_capacity(n);
        let mut consts = Vec::with_capacity(n);
        for (i, input) in node.inputs.iter().enumerate() {
            match input {
                None if schema.input_optional(i) => {
                    types.push(None);
                    consts.push(None);
                }
                None => {
                    return Err(Error::Graph(format!(
                        "input {i} ({}) is required",
                        schema
                            .inputs
                            .get(i)
                            .or(schema.inputs.last())
                            .unwrap_or(&"?")
                    )))
                }
                Some(v) => {
                    types.push(Some(self.value_type(*v)?.clone()));
                    let src = self.node(v.node);
                    consts.push(if src.op == "Constant" {
                        src.data.as_deref()
                    } else {
                        None
                    });
                }
            }
        }
        ops::check_takes(&*op, &types).map_err(Error::Graph)?;
        let infer = |types: &[Option<TensorType>]| {
            let cx = InferCtx {
                node_name: &node.name,
                inputs: types,
                consts: &consts,
                attrs: &node.attrs,
            };
            ops::custom::contain(&op, || op.infer(&cx)).map_err(Error::Graph)
        };
        // (A sequence of unknown-rank tensors is the sequence ops' own business.)
        let unranked = |t: &Option<TensorType>| t.as_ref().is_some_and(|t| t.is_unranked_tensor());
        if schema.family == "control" || !types.iter().any(unranked) {
            return infer(&types);
        }
        // An operand of unknown rank (until specialization binds the shapes it depends
        // on): the outputs' rank is unknown too. Their dtypes and count come from
        // inferring with the operand at a rank the op takes: the other operands' largest
        // rank first (elementwise ops), then each rank up to 8; its dims unknown, or ones
        // (for ops that need a static length, such as a shape operand's).
        let largest = types
            .iter()
            .flatten()
            .filter(|t| t.ranked && t.is_tensor())
            .map(|t| t.rank());
        let ranks = largest.max().into_iter().chain(0..=8);
        let mut first_error = None;
        for (rank, dim) in ranks.flat_map(|r| [(r, Dim::Sym(ANY_DIM.into())), (r, Dim::Fixed(1))]) {
            let probe: Vec<Option<TensorType>> = types
                .iter()
                .map(|t| match t {
                    Some(t) if t.is_unranked_tensor() => {
                        let dims = vec![dim.clone(); rank];
                        let mut ranked = t.clone();
                        ranked.shape = Shape::new(dims);
                        ranked.ranked = true;
                        Some(ranked)
                    }
                    other => other.clone(),
                })
                .collect();
            match infer(&probe) {
                Ok(outs) => return Ok(outs.into_iter().map(TensorType::without_rank).collect()),
                Err(e) => first_error = first_error.or(Some(e)),
            }
        }
        let e = first_error.expect("at least one rank was tried");
        Err(Error::Graph(format!(
            "{} (an operand's rank is unknown: no rank up to 8 fits)",
            e.into_message()
        )))
    }

    /// A deterministic topological order over data and control edges: among the nodes
    /// that are ready, the lowest index goes first. Errors on a cycle.
    pub fn schedule(&self) -> Result<Vec<NodeId>> {
        let n = self.nodes.len();
        let mut pending = vec![0usize; n];
        let mut users: Vec<Vec<usize>> = vec![vec![]; n];
        for (i, node) in self.nodes.iter().enumerate() {
            let preds: HashSet<usize> = node
                .inputs
                .iter()
                .flatten()
                .map(|v| v.node.index())
                .chain(node.control_deps.iter().map(|d| d.index()))
                .collect();
            for p in preds {
                if p >= n {
                    return Err(Error::Graph(format!(
                        "{} refers to node #{p}, which does not exist",
                        self.describe(NodeId(i as u32))
                    )));
                }
                pending[i] += 1;
                users[p].push(i);
            }
        }
        let mut ready: BTreeSet<usize> = (0..n).filter(|&i| pending[i] == 0).collect();
        let mut order = Vec::with_capacity(n);
        while let Some(i) = ready.pop_first() {
            order.push(NodeId(i as u32));
            for &u in &users[i] {
                pending[u] -= 1;
                if pending[u] == 0 {
                    ready.insert(u);
                }
            }
        }
        if order.len() != n {
            let stuck = (0..n).find(|&i| pending[i] > 0).unwrap();
            return Err(Error::Graph(format!(
                "the graph has a cycle through {}",
                self.describe(NodeId(stuck as u32))
            )));
        }
        Ok(order)
    }

    /// The node `id`, for passes that edit it in place. The caller keeps its outputs
    /// true (`refresh_types`), which `verify` checks.
    pub fn node_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.nodes[id.index()]
    }

    /// A name no node has yet: `base`, else `base.1`, `base.2`, ...
    pub fn fresh_name(&self, base: &str) -> String {
        let taken: HashSet<&str> = self.nodes.iter().map(|n| n.name.as_str()).collect();
        if !taken.contains(base) {
            return base.to_string();
        }
        (1..)
            .map(|i| format!("{base}.{i}"))
            .find(|n| !taken.contains(n.as_str()))
            .expect("some suffix is free")
    }

    /// Makes every reader of `old` (node inputs and graph outputs) read `new` instead;
    /// returns how many uses moved. `new` must have `old`'s dtype and rank (or any rank
    /// when `old`'s is unknown).
    pub(crate) fn replace_uses(&mut self, old: Value, new: Value) -> Result<usize> {
        let (a, b) = (self.value_type(old)?, self.value_type(new)?);
        // A value of unknown rank may become one of a known rank (an `If` inlined).
        let ranks_differ = a.ranked && (!b.ranked || a.rank() != b.rank());
        if a.dtype != b.dtype || ranks_differ {
            return Err(Error::Graph(format!(
                "cannot replace %{}:{} ({a}) by %{}:{} ({b})",
                old.node.0, old.output, new.node.0, new.output
            )));
        }
        let mut moved = 0;
        for node in &mut self.nodes {
            for v in node.inputs.iter_mut().flatten() {
                if *v == old {
                    *v = new;
                    moved += 1;
                }
            }
        }
        for o in &mut self.outputs {
            if o.value == old {
                o.value = new;
                moved += 1;
            }
        }
        Ok(moved)
    }

    /// Re-infers every node's output types in schedule order, so that types refined by
    /// an edit (a shape operand that became a constant, a fixed input dim) flow down.
    pub(crate) fn refresh_types(&mut self) -> Result<()> {
        for id in self.schedule()? {
            if ops::lookup(&self.node(id).op).is_some_and(|o| o.schema().family == "source") {
                continue;
            }
            let outputs = self.infer_node(self.node(id)).map_err(|e| {
                Error::Graph(format!("{}: {}", self.describe(id), e.into_message()))
            })?;
            self.nodes[id.index()].outputs = outputs;
        }
        Ok(())
    }

    /// Gives the inputs' symbolic dims sizes (`bindings`, by symbol) and re-infers the
    /// graph. Returns the symbols of input types that `bindings` did not give.
    pub fn specialize(&mut self, bindings: &HashMap<String, usize>) -> Result<Vec<String>> {
        let mut unbound = BTreeSet::new();
        for id in self.inputs() {
            for axis in &mut self.nodes[id.index()].outputs[0].shape.axes {
                if let Dim::Sym(s) = &axis.dim {
                    match bindings.get(s) {
                        Some(&n) => axis.dim = Dim::Fixed(n),
                        None => {
                            unbound.insert(s.clone());
                        }
                    }
                }
            }
        }
        self.refresh_types()?;
        Ok(unbound.into_iter().collect())
    }

    /// Removes the nodes nothing needs and renumbers the rest in a depth-first order
    /// from the outputs (so that the schedule, and the printed text, is that order).
    /// Needed: the graph outputs, every `Assign`, what they read or wait for, and every
    /// `Parameter` (the graph's signature; they keep their relative order, first).
    /// Returns whether anything changed (a node went or moved).
    pub(crate) fn compact(&mut self) -> bool {
        let n = self.nodes.len();
        let params: Vec<NodeId> = self.inputs();
        let mut roots: Vec<NodeId> = self.outputs.iter().map(|o| o.value.node).collect();
        // State is part of the signature too: variables stay even when nothing reads them.
        roots.extend(
            self.node_ids()
                .filter(|&id| matches!(self.node(id).op.as_str(), "Assign" | "Variable")),
        );
        let mut order: Vec<NodeId> = params.clone();
        let mut placed = vec![false; n];
        for p in &params {
            placed[p.index()] = true;
        }
        // Iterative post-order: a node is placed once all it depends on is placed.
        for root in roots {
            let mut stack = vec![(root, false)];
            while let Some((id, expanded)) = stack.pop() {
                if placed[id.index()] {
                    continue;
                }
                if expanded {
                    placed[id.index()] = true;
                    order.push(id);
                    continue;
                }
                stack.push((id, true));
                let node = &self.nodes[id.index()];
                let deps = node.control_deps.iter().copied();
                let ins = node.inputs.iter().flatten().map(|v| v.node);
                let mut deps: Vec<NodeId> = deps.chain(ins).collect();
                deps.reverse();
                stack.extend(
                    deps.into_iter()
                        .filter(|d| !placed[d.index()])
                        .map(|d| (d, false)),
                );
            }
        }
        let mut new_index = vec![u32::MAX; n];
        for (i, id) in order.iter().enumerate() {
            new_index[id.index()] = i as u32;
        }
        let map = |v: Value| Value {
            node: NodeId(new_index[v.node.index()]),
            output: v.output,
        };
        let mut old: Vec<Option<Node>> = std::mem::take(&mut self.nodes)
            .into_iter()
            .map(Some)
            .collect();
        for id in &order {
            let mut node = old[id.index()].take().expect("each node placed once");
            for v in node.inputs.iter_mut().flatten() {
                *v = map(*v);
            }
            for d in &mut node.control_deps {
                *d = NodeId(new_index[d.index()]);
            }
            self.nodes.push(node);
        }
        for o in &mut self.outputs {
            o.value = map(o.value);
        }
        let gone = |id: &NodeId| new_index.get(id.index()).is_none_or(|&i| i == u32::MAX);
        let old_provenance = std::mem::take(&mut self.provenance.0);
        for (id, mut list) in old_provenance {
            if gone(&id) {
                continue;
            }
            list.retain(|(_, via)| via.iter().all(gone));
            for (_, via) in &mut list {
                via.clear();
            }
            if !list.is_empty() {
                self.provenance
                    .0
                    .insert(NodeId(new_index[id.index()]), list);
            }
        }
        n != order.len() || order.iter().enumerate().any(|(i, id)| id.index() != i)
    }

    /// Copies `body`'s nodes into this graph, its parameters bound to `args` (one per
    /// parameter, in order), each copy named after `prefix` and the body's node; returns
    /// the values of the body's outputs. The copies are re-inferred on `args`' types,
    /// so a mismatch is an error. For passes that inline a control-flow body.
    pub fn inline(&mut self, body: &Graph, args: &[Value], prefix: &str) -> Result<Vec<Value>> {
        let params = body.inputs();
        if params.len() != args.len() {
            return Err(Error::Graph(format!(
                "body '{}' takes {} inputs, {} given",
                body.name,
                params.len(),
                args.len()
            )));
        }
        let bound: HashMap<NodeId, Value> =
            params.iter().copied().zip(args.iter().copied()).collect();
        let mut copies: HashMap<NodeId, NodeId> = HashMap::new();
        for id in body.schedule()? {
            if bound.contains_key(&id) {
                continue;
            }
            let n = body.node(id);
            let name = self.fresh_name(&format!("{prefix}.{}", n.name));
            let copy = match n.op.as_str() {
                "Constant" => {
                    let data = n.data.as_deref().ok_or_else(|| {
                        Error::Graph(format!("{}: has no data", body.describe(id)))
                    })?;
                    self.add_constant(&name, n.outputs[0].clone(), data.clone())?
                }
                "Variable" | "Assign" | "Parameter" => {
                    return Err(Error::Graph(format!(
                        "{}: cannot be inlined",
                        body.describe(id)
                    )))
                }
                _ => {
                    let inputs: Vec<Option<Value>> = n
                        .inputs
                        .iter()
                        .map(|v| v.map(|v| inlined(&bound, &copies, v)))
                        .collect();
                    self.add_op(&n.op, &inputs, n.attrs.clone(), &name)?
                }
            };
            copies.insert(id, copy);
        }
        Ok(body
            .outputs()
            .iter()
            .map(|o| inlined(&bound, &copies, o.value))
            .collect())
    }

    /// The original nodes `id` replaced (in the order they were computed), as the passes
    /// recorded them; empty for a node no rewrite made. Settled by the manager's
    /// compaction after each pass.
    pub fn origins(&self, id: NodeId) -> Vec<&Origin> {
        self.provenance
            .0
            .get(&id)
            .map(|list| list.iter().map(|(o, _)| o).collect())
            .unwrap_or_default()
    }

    /// Records that `new` replaces `root` and what `root` computes from values other
    /// than `new`'s operands: the nodes walked upward from `root`, stopping at `new`'s
    /// operands and at sources. A walked node that already has origins contributes
    /// those instead of itself. Each is pending until `compact` finds it gone.
    pub(crate) fn record_replaced(&mut self, new: NodeId, root: NodeId) {
        // A walk that reaches a graph input (or runs long) is not cut off by `new`'s
        // operands (a layout pass's reorders sit between): then only `root` itself.
        const MAX_WALK: usize = 128;
        let stop: HashSet<NodeId> = self
            .node(new)
            .inputs
            .iter()
            .flatten()
            .map(|v| v.node)
            .collect();
        let mut seen: BTreeSet<NodeId> = BTreeSet::new();
        let mut stack = vec![root];
        let mut escaped = false;
        while let Some(id) = stack.pop() {
            if id == new || stop.contains(&id) || seen.contains(&id) {
                continue;
            }
            let n = self.node(id);
            match n.op.as_str() {
                "Constant" => continue,
                "Parameter" | "Variable" => escaped = true,
                _ => {}
            }
            if escaped || seen.len() >= MAX_WALK {
                escaped = true;
                break;
            }
            seen.insert(id);
            stack.extend(n.inputs.iter().flatten().map(|v| v.node));
        }
        if escaped {
            seen = BTreeSet::from([root]);
        }
        let mut found: Vec<(Origin, Vec<NodeId>)> = vec![];
        for id in seen {
            match self.provenance.0.get(&id) {
                Some(list) => found.extend(list.iter().map(|(o, via)| {
                    let mut via = via.clone();
                    via.push(id);
                    (o.clone(), via)
                })),
                None => {
                    let n = self.node(id);
                    let origin = Origin {
                        name: n.name.clone(),
                        op: n.op.clone(),
                    };
                    found.push((origin, vec![id]));
                }
            }
        }
        // Once per node walked (`via` ends with it): an earlier record, made under the
        // name the node had then, wins.
        let entry = self.provenance.0.entry(new).or_default();
        let walked: HashSet<NodeId> = entry
            .iter()
            .filter_map(|(_, via)| via.last().copied())
            .collect();
        entry.extend(
            found
                .into_iter()
                .filter(|(_, via)| via.last().is_none_or(|v| !walked.contains(v))),
        );
    }

    /// Appends a node as given, without inference: for the text parser, which verifies
    /// the whole graph afterwards.
    pub(crate) fn push_unchecked(&mut self, node: Node) -> NodeId {
        self.push(node)
    }

    pub(crate) fn push_output_unchecked(&mut self, out: GraphOutput) {
        self.outputs.push(out);
    }
}

/// Where a body's value went when it was inlined: a bound parameter's argument, or
/// the same output of the node's copy (every node is copied before its readers).
fn inlined(bound: &HashMap<NodeId, Value>, copies: &HashMap<NodeId, NodeId>, v: Value) -> Value {
    match bound.get(&v.node) {
        Some(&arg) => arg,
        None => copies[&v.node].out(v.output),
    }
}

/// A source's data must be static and match its declared type.
pub(crate) fn check_data(ty: &TensorType, value: &Tensor) -> std::result::Result<(), String> {
    if !ty.is_tensor() || !value.is_tensor() {
        return Err(format!(
            "value is {}, declared type is {ty}: only tensors are stored data",
            value.kind_name()
        ));
    }
    let dims = ty
        .shape
        .to_fixed()
        .ok_or_else(|| format!("type {ty} must be static"))?;
    if value.dtype() != ty.dtype || value.shape() != dims.as_slice() {
        return Err(format!(
            "value is {}{:?}, declared type is {ty}",
            value.dtype(),
            value.shape()
        ));
    }
    Ok(())
}

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&super::text::print(self))
    }
}
