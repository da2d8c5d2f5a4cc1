//! The ONNX importer: an ONNX model (protobuf, decoded by prost from the committed
//! `proto.rs`) to a Kiln graph. Catalogue ops share ONNX's names, inputs and attributes,
//! so most nodes map one to one; `ops.rs` rewrites the rest (older opsets' attribute
//! forms, `Constant`, `Cast`'s type codes, opset 7-11 `Dropout`'s ratio) and `expand.rs`
//! builds ONNX ops that are not catalogue ops out of ones that are.
//!
//! Every error names the ONNX node (index, name, op type, domain, opset).
use std::collections::{HashMap, HashSet};
use std::path::Path;

use prost::Message;

use crate::error::{Error, Result};
use crate::ir::text::weights::WeightsFiles;
use crate::ir::{Attr, Attrs, Container, Dim, Graph, Shape, TensorType, Value};
use crate::tensor::Tensor;

mod contrib;
mod expand;
mod ops;
mod order;
#[allow(clippy::all, missing_docs, rustdoc::all)]
#[rustfmt::skip] // generated; tests/onnx_proto.rs compares it byte for byte
pub mod proto;
mod tensor;

use proto::{attribute_proto::AttributeType, type_proto, AttributeProto, ModelProto, NodeProto};

/// Imports the model at `path`; external data files are read next to it.
pub fn import_file(path: &Path) -> Result<Graph> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    // Decoding from `Bytes` makes each tensor's raw_data a slice of this one buffer.
    let model = decode(bytes::Bytes::from(bytes));
    model
        .and_then(|m| import_model(&m, path.parent()))
        .map_err(|e| match e {
            Error::InvalidArgument(m) => Error::InvalidArgument(format!("{}: {m}", path.display())),
            e => e,
        })
}

/// Imports a serialized model; `base_dir` is where external data files live (`None`:
/// a model with external data is an error).
pub fn import_bytes(bytes: &[u8], base_dir: Option<&Path>) -> Result<Graph> {
    import_model(&decode(bytes)?, base_dir)
}

/// Where a partial import stopped: the ONNX node (or graph output) that failed, and why.
#[derive(Debug)]
pub struct ImportFailure {
    /// The ONNX node's name (its first output's name when it has none).
    pub node: String,
    pub op: String,
    pub error: Error,
    /// The values the failed node reads that were imported, for drawing its edges.
    pub inputs: Vec<Value>,
}

/// Imports as much of the model as imports: the graph of the nodes before the first
/// one that fails, and that failure (None when the whole model imports; then the graph
/// is what `import_file` gives). For pictures of a model that does not import; an error
/// is returned only when not even the graph's inputs and initializers import.
pub fn import_partial(path: &Path) -> Result<(Graph, Option<ImportFailure>)> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let model = decode(bytes::Bytes::from(bytes))?;
    import_model_with(&model, path.parent(), true)
}

fn decode(buf: impl bytes::Buf) -> Result<ModelProto> {
    ModelProto::decode(buf)
        .map_err(|e| Error::InvalidArgument(format!("not a valid ONNX model: {e}")))
}

fn import_model(model: &ModelProto, base_dir: Option<&Path>) -> Result<Graph> {
    Ok(import_model_with(model, base_dir, false)?.0)
}

/// The import; with `partial`, a failing node (or graph output) stops it and is
/// returned with the graph so far instead of failing it.
fn import_model_with(
    model: &ModelProto,
    base_dir: Option<&Path>,
    partial: bool,
) -> Result<(Graph, Option<ImportFailure>)> {
    let opset = model
        .opset_import
        .iter()
        .find(|o| matches!(o.domain(), "" | "ai.onnx"))
        .map(|o| o.version());
    if let Some(v) = opset.filter(|v| !(1..=28).contains(v)) {
        return Err(Error::Unsupported(format!(
            "ai.onnx opset {v} is not supported (1 to 28 are)"
        )));
    }
    let opset = opset.unwrap_or(0);
    let domain_opsets: HashMap<String, i64> = model
        .opset_import
        .iter()
        .map(|o| (o.domain().to_string(), o.version()))
        .collect();
    let graph = model
        .graph
        .as_ref()
        .ok_or_else(|| Error::InvalidArgument("the model has no graph".into()))?;
    let weights = WeightsFiles::new(base_dir);
    let mut imp = Importer {
        g: Graph::new(if graph.name().is_empty() {
            "onnx"
        } else {
            graph.name()
        }),
        values: HashMap::new(),
        names: HashSet::new(),
        opset,
        domain_opsets,
        weights: &weights,
        outer: None,
        depth: 0,
        captured: vec![],
    };
    imp.initializers(graph)?;
    for input in &graph.input {
        if imp.values.contains_key(input.name()) {
            continue; // an initializer: a constant with a default, kept constant
        }
        let ty = value_type(input)
            .map_err(|e| Error::InvalidArgument(format!("graph input '{}': {e}", input.name())))?;
        let name = imp.unique_name(input.name());
        let id = imp.g.add_parameter(&name, ty)?;
        imp.values.insert(input.name().to_string(), id.into());
    }
    if partial {
        let order = match order::topological(graph) {
            Ok(order) => order,
            Err(error) => {
                let failure = ImportFailure {
                    node: "graph".into(),
                    op: "order".into(),
                    error,
                    inputs: vec![],
                };
                return Ok((imp.g, Some(failure)));
            }
        };
        for i in order {
            let node = &graph.node[i];
            if let Err(error) = imp.import_node(i, node) {
                let inputs = node
                    .input
                    .iter()
                    .filter_map(|n| imp.values.get(n).copied())
                    .collect();
                let name = match node.name() {
                    "" => node.output.first().cloned().unwrap_or_default(),
                    n => n.to_string(),
                };
                let failure = ImportFailure {
                    node: name,
                    op: node.op_type().to_string(),
                    error,
                    inputs,
                };
                return Ok((imp.g, Some(failure)));
            }
        }
        if let Err(error) = imp.outputs(graph) {
            let failure = ImportFailure {
                node: "graph outputs".into(),
                op: "output".into(),
                error,
                inputs: vec![],
            };
            return Ok((imp.g, Some(failure)));
        }
    } else {
        imp.nodes_and_outputs(graph)?;
    }
    crate::ir::verify(&imp.g)?;
    Ok((imp.g, None))
}

/// A serialized `TensorProto` (the `.pb` files of the ONNX test suites) as a tensor.
pub fn read_tensor_pb(bytes: &[u8]) -> Result<Tensor> {
    let t = proto::TensorProto::decode(bytes)
        .map_err(|e| Error::InvalidArgument(format!("not a TensorProto: {e}")))?;
    tensor::tensor(&t, &WeightsFiles::new(None)).map_err(Error::InvalidArgument)
}

/// A serialized value of type `ty` (a `TensorProto`, `SequenceProto` or `OptionalProto`,
/// as the ONNX test suites store sequence and optional inputs and outputs).
pub fn read_value_pb(bytes: &[u8], ty: &TensorType) -> Result<Tensor> {
    tensor::value_pb(bytes, ty).map_err(Error::InvalidArgument)
}

/// The ai.onnx opset a serialized model imports, if it decodes.
pub fn model_opset(bytes: &[u8]) -> Option<i64> {
    let m = ModelProto::decode(bytes).ok()?;
    m.opset_import
        .iter()
        .find(|o| matches!(o.domain(), "" | "ai.onnx"))
        .map(|o| o.version())
}

/// A graph input's type: element type and dims, inside sequences and optionals. A named
/// `dim_param` is a symbol that every input naming it shares; what exporters write for
/// "unknown" (`?`, an empty `dim_param`, no value, a `dim_value` of zero or less) is a
/// fresh symbol of its own, `<input>.<axis>`, so that two unknown dims never have to agree.
fn value_type(v: &proto::ValueInfoProto) -> std::result::Result<TensorType, String> {
    let t = v.r#type.as_ref().ok_or("the input has no type")?;
    type_of(t, v.name())
}

/// A `TypeProto` as a Kiln type (no shape: an unknown rank).
fn type_of(t: &proto::TypeProto, name: &str) -> std::result::Result<TensorType, String> {
    let elem = |e: &Option<Box<proto::TypeProto>>| {
        e.as_deref()
            .ok_or_else(|| "a sequence or optional type without an element type".to_string())
            .and_then(|e| type_of(e, name))
    };
    let t = match t.value.as_ref() {
        Some(type_proto::Value::TensorType(t)) => t,
        Some(type_proto::Value::SequenceType(s)) => {
            let inner = elem(&s.elem_type)?;
            let shape = inner.ranked.then(|| inner.shape.clone());
            return Ok(inner.wrapped(Container::Seq, shape));
        }
        Some(type_proto::Value::OptionalType(o)) => {
            let inner = elem(&o.elem_type)?;
            let shape = inner.ranked.then(|| inner.shape.clone());
            return Ok(inner.wrapped(Container::Opt, shape));
        }
        _ => return Err("only tensors, sequences and optionals are supported (not maps)".into()),
    };
    let dtype = tensor::dtype(t.elem_type())?;
    let Some(shape) = t.shape.as_ref() else {
        return Ok(TensorType::unranked(dtype));
    };
    use proto::tensor_shape_proto::dimension::Value as D;
    let dims = shape
        .dim
        .iter()
        .enumerate()
        .map(|(i, d)| match &d.value {
            Some(D::DimValue(n)) if *n > 0 => Dim::Fixed(*n as usize),
            Some(D::DimParam(p)) if !p.is_empty() && p != "?" => Dim::Sym(p.clone()),
            _ => Dim::Sym(format!("{name}.{i}")),
        })
        .collect::<Vec<_>>();
    Ok(TensorType::new(dtype, Shape::new(dims)))
}

/// The state of one import.
pub(super) struct Importer<'a> {
    g: Graph,
    /// ONNX value names to Kiln values.
    values: HashMap<String, Value>,
    names: HashSet<String>,
    /// The ai.onnx opset (0: the model imports none).
    opset: i64,
    /// Every imported domain's opset (ai.onnx as "" or "ai.onnx").
    domain_opsets: HashMap<String, i64>,
    /// The external data files, shared with the bodies.
    weights: &'a WeightsFiles<'a>,
    /// The enclosing graph's import when this one is a body: names it does not define
    /// are looked up there and become captures.
    outer: Option<&'a Importer<'a>>,
    /// How many bodies enclose this graph.
    depth: usize,
    /// The outer names this body captures, in the order of their parameters.
    captured: Vec<String>,
}

impl Importer<'_> {
    fn domain_opset(&self, domain: &str) -> Option<i64> {
        let alias = if domain == "ai.onnx" { "" } else { domain };
        self.domain_opsets
            .get(domain)
            .or_else(|| self.domain_opsets.get(alias))
            .copied()
    }

    /// `base`, or `base_2`, `base_3`... so that node names stay unique.
    fn unique_name(&mut self, base: &str) -> String {
        let base = if base.is_empty() { "node" } else { base };
        let mut name = base.to_string();
        let mut k = 1;
        while self.names.contains(&name) {
            k += 1;
            name = format!("{base}_{k}");
        }
        self.names.insert(name.clone());
        name
    }

    fn constant(&mut self, name: &str, t: Tensor) -> Result<Value> {
        let name = self.unique_name(name);
        Ok(self.g.add_constant_value(&name, t)?.into())
    }

    fn ints(&mut self, name: &str, v: &[i64]) -> Result<Value> {
        let t = Tensor::from_vec(&[v.len()], v.to_vec()).map_err(Error::InvalidArgument)?;
        self.constant(name, t)
    }

    /// Adds catalogue op `op`; returns its outputs. When every input is a constant (or,
    /// for `Shape` and `Size`, has a static shape) the op is evaluated now and its results become
    /// constants: exporters compute shapes with small subgraphs, and folding them here
    /// gives later ops (`Reshape`, `Split`, ...) the exact dims they need.
    fn add(
        &mut self,
        op: &str,
        inputs: &[Option<Value>],
        attrs: Attrs,
        name: &str,
    ) -> Result<Vec<Value>> {
        if let Some(folded) = self.fold(op, inputs, &attrs, name)? {
            return Ok(folded);
        }
        let name = self.unique_name(name);
        let id = self.g.add_op(op, inputs, attrs, &name)?;
        Ok((0..self.g.node(id).outputs.len())
            .map(|i| id.out(i as u32))
            .collect())
    }

    fn fold(
        &mut self,
        op: &str,
        inputs: &[Option<Value>],
        attrs: &Attrs,
        name: &str,
    ) -> Result<Option<Vec<Value>>> {
        let data = |v: &Value| {
            let n = self.g.node(v.node);
            (n.op == "Constant").then(|| n.data.clone()).flatten()
        };
        if op == "Shape" {
            let Some(Some(x)) = inputs.first() else {
                return Ok(None);
            };
            let Some(dims) = self.g.value_type(*x)?.static_dims() else {
                return Ok(None);
            };
            let r = dims.len() as i64;
            let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
            let start = clamp(attrs.int_or("start", 0).map_err(Error::Graph)?);
            let end = clamp(attrs.int_or("end", r).map_err(Error::Graph)?).max(start);
            let kept = dims.get(start..end).ok_or_else(|| {
                Error::Graph(format!(
                    "Shape: start {start} and end {end} do not select within rank {r}"
                ))
            })?;
            let v: Vec<i64> = kept.iter().map(|&d| d as i64).collect();
            return Ok(Some(vec![self.ints(name, &v)?]));
        }
        if op == "Size" {
            let Some(Some(x)) = inputs.first() else {
                return Ok(None);
            };
            let Some(n) = self.g.value_type(*x)?.num_elements() else {
                return Ok(None);
            };
            return Ok(Some(vec![self.constant(name, Tensor::scalar(n as i64))?]));
        }
        let Some(catalogue_op) = crate::ir::ops::lookup(op) else {
            return Ok(None);
        };
        if matches!(catalogue_op.schema().family, "source" | "state") || inputs.is_empty() {
            return Ok(None);
        }
        let mut values = vec![];
        for v in inputs {
            match v {
                None => values.push(None),
                Some(v) => match data(v) {
                    Some(d) => values.push(Some(d)),
                    None => return Ok(None),
                },
            }
        }
        let trip_count = values.first().and_then(|v| v.as_deref());
        if !crate::ir::ops::control::folds_in_bounded_time(op, trip_count, attrs) {
            return Ok(None);
        }
        // Type-check as the real node would, so that folding never hides an error.
        let probe = crate::ir::Node {
            name: name.to_string(),
            op: op.to_string(),
            inputs: inputs.to_vec(),
            attrs: attrs.clone(),
            outputs: vec![],
            control_deps: vec![],
            data: None,
        };
        // Sequences and optionals stay ops: a constant holds a tensor.
        if !self.g.infer_node(&probe)?.iter().all(|t| t.is_tensor()) {
            return Ok(None);
        }
        let refs: Vec<Option<&Tensor>> = values.iter().map(|v| v.as_deref()).collect();
        let in_types: Vec<Option<TensorType>> = inputs
            .iter()
            .map(|v| v.map(|v| self.g.value_type(v).cloned()).transpose())
            .collect::<Result<_>>()?;
        let in_type_refs: Vec<Option<&TensorType>> = in_types.iter().map(|t| t.as_ref()).collect();
        let cx = crate::ir::ops::EvalCtx {
            inputs: &refs,
            input_types: &in_type_refs,
            attrs,
        };
        let outs = crate::ir::ops::evaluate(catalogue_op, &cx).map_err(Error::Graph)?;
        let mut vals = vec![];
        for (i, t) in outs.into_iter().enumerate() {
            let n = if i == 0 {
                name.to_string()
            } else {
                format!("{name}.{i}")
            };
            vals.push(self.constant(&n, t)?);
        }
        Ok(Some(vals))
    }

    fn input(&mut self, name: &str) -> Result<Option<Value>> {
        if name.is_empty() {
            return Ok(None);
        }
        if let Some(v) = self.values.get(name) {
            return Ok(Some(*v));
        }
        if let Some(v) = self.capture(name)? {
            return Ok(Some(v));
        }
        self.values.get(name).copied().map(Some).ok_or_else(|| {
            Error::Graph(format!(
                "input '{name}' is not produced by an earlier node, an initializer or a graph input (a dangling name, or a cycle)"
            ))
        })
    }

    fn value_type(&self, v: Value) -> Result<TensorType> {
        Ok(self.g.value_type(v)?.clone())
    }

    /// A node of a registered op's domain: the op, with the node's attributes (tensor
    /// attributes have no Kiln form for registered ops).
    fn custom_node(&mut self, node: &NodeProto, op: &str) -> Result<Vec<Value>> {
        let inputs: Vec<Option<Value>> = node
            .input
            .iter()
            .map(|n| self.input(n))
            .collect::<Result<_>>()?;
        let mut attrs = Attrs::new();
        for a in &node.attribute {
            match attr(a, self.weights)? {
                AttrValue::Plain(v) => attrs.set(a.name(), v),
                AttrValue::Tensor(_) => {
                    return Err(Error::Graph(format!(
                        "attribute '{}': tensor attributes are not passed to registered ops",
                        a.name()
                    )))
                }
            }
        }
        let name = if node.name().is_empty() {
            node.output.first().map_or("", |s| s.as_str())
        } else {
            node.name()
        };
        // Added as is: registered ops are never evaluated at import (they may be impure).
        let name = self.unique_name(name);
        let id = self.g.add_op(op, &inputs, attrs, &name)?;
        Ok((0..self.g.node(id).outputs.len())
            .map(|i| id.out(i as u32))
            .collect())
    }

    /// Converts one node; returns its outputs in ONNX order.
    fn node(&mut self, node: &NodeProto) -> Result<Vec<Value>> {
        let domain = match node.domain() {
            "" => "ai.onnx",
            d => d,
        };
        let custom = crate::ir::ops::custom::qualified(domain, node.op_type());
        if crate::ir::ops::custom::registered(&custom).is_some() {
            return self.custom_node(node, &custom);
        }
        if !matches!(
            domain,
            "ai.onnx" | "ai.onnx.ml" | "ai.onnx.preview.training" | "com.microsoft"
        ) {
            return Err(Error::Unsupported(format!(
                "domain '{domain}' is not supported"
            )));
        }
        // onnxruntime's own tools write com.microsoft nodes without importing the domain
        // (its contrib ops have one version), and onnxruntime runs such models.
        if self.domain_opset(domain).is_none() && domain != "com.microsoft" {
            return Err(Error::InvalidArgument(format!(
                "the model imports no opset of domain '{domain}'"
            )));
        }
        let inputs: Vec<Option<Value>> = node
            .input
            .iter()
            .map(|n| self.input(n))
            .collect::<Result<_>>()?;
        let mut attrs = Attrs::new();
        let mut tensors = HashMap::new();
        let mut bodies = vec![];
        for a in &node.attribute {
            if a.r#type() == AttributeType::Graph {
                let g = a.g.as_ref().ok_or_else(|| {
                    Error::InvalidArgument(format!("attribute '{}' has no graph", a.name()))
                })?;
                if domain != "ai.onnx" || !matches!(node.op_type(), "If" | "Loop" | "Scan") {
                    return Err(Error::Unsupported(format!(
                        "attribute '{}' is a graph: only If, Loop and Scan take graph attributes",
                        a.name()
                    )));
                }
                bodies.push((a.name().to_string(), g));
                continue;
            }
            match attr(a, self.weights)? {
                AttrValue::Plain(v) => attrs.set(a.name(), v),
                AttrValue::Tensor(t) => {
                    tensors.insert(a.name().to_string(), t);
                }
            }
        }
        let name = if node.name().is_empty() {
            node.output.first().map_or("", |s| s.as_str())
        } else {
            node.name()
        };
        if matches!(node.op_type(), "If" | "Loop" | "Scan") && domain == "ai.onnx" {
            return self.control_node(node.op_type(), name, inputs, attrs, bodies);
        }
        let kind = ops::NodeKind {
            domain,
            op: node.op_type(),
            name,
            n_outputs: node.output.len(),
            named: &node
                .output
                .iter()
                .map(|o| !o.is_empty())
                .collect::<Vec<_>>(),
        };
        ops::convert(self, kind, inputs, attrs, tensors)
    }
}

enum AttrValue {
    Plain(Attr),
    Tensor(Tensor),
}

fn attr(a: &AttributeProto, weights: &WeightsFiles) -> Result<AttrValue> {
    let utf8 = |b: &[u8]| {
        String::from_utf8(b.to_vec())
            .map_err(|_| Error::InvalidArgument(format!("attribute '{}' is not UTF-8", a.name())))
    };
    Ok(AttrValue::Plain(match a.r#type() {
        AttributeType::Float => Attr::Float(a.f() as f64),
        AttributeType::Int => Attr::Int(a.i()),
        AttributeType::String => Attr::String(utf8(a.s())?),
        AttributeType::Floats => Attr::Floats(a.floats.iter().map(|&f| f as f64).collect()),
        AttributeType::Ints => Attr::Ints(a.ints.clone()),
        AttributeType::Strings => {
            Attr::Strings(a.strings.iter().map(|s| utf8(s)).collect::<Result<_>>()?)
        }
        // A type (Optional's) as the text format spells it.
        AttributeType::TypeProto => {
            let tp = a.tp.as_ref().ok_or_else(|| {
                Error::InvalidArgument(format!("attribute '{}' has no type", a.name()))
            })?;
            let t = type_of(tp, a.name())
                .map_err(|e| Error::Unsupported(format!("attribute '{}': {e}", a.name())))?;
            Attr::String(t.to_string())
        }
        AttributeType::Tensor => {
            let t = a.t.as_ref().ok_or_else(|| {
                Error::InvalidArgument(format!("attribute '{}' has no tensor", a.name()))
            })?;
            return tensor::tensor(t, weights)
                .map(AttrValue::Tensor)
                .map_err(|e| Error::InvalidArgument(format!("attribute '{}': {e}", a.name())));
        }
        other => {
            return Err(Error::Unsupported(format!(
                "attribute '{}' of type {} is not supported",
                a.name(),
                other.as_str_name()
            )))
        }
    }))
}

/// What a body's formal input receives from its op, which fixes its type when the model
/// leaves it out (Loop's iteration number and condition usually have no shape).
enum Formal {
    /// Exactly this type (Loop's iteration and condition, Scan's slices).
    Exact(TensorType),
    /// A value carried from one iteration to the next, starting as this type: the dtype
    /// and rank are the initial value's, and a dim stays fixed only where the model
    /// declares that same size (the body may change the others).
    Carried(TensorType),
}

impl<'a> Importer<'a> {
    /// The graph's initializers, as constants.
    fn initializers(&mut self, graph: &proto::GraphProto) -> Result<()> {
        for init in &graph.initializer {
            let t = tensor::tensor(init, self.weights).map_err(|e| {
                Error::InvalidArgument(format!("initializer '{}': {e}", init.name()))
            })?;
            let v = self.constant(init.name(), t)?;
            self.values.insert(init.name().to_string(), v);
        }
        Ok(())
    }

    /// Imports the graph's nodes in topological order, then marks its outputs.
    fn nodes_and_outputs(&mut self, graph: &proto::GraphProto) -> Result<()> {
        for i in order::topological(graph)? {
            self.import_node(i, &graph.node[i])?;
        }
        self.outputs(graph)
    }

    /// Imports ONNX node `i`, binding its output names.
    fn import_node(&mut self, i: usize, node: &NodeProto) -> Result<()> {
        let domain = match node.domain() {
            "" => "ai.onnx",
            d => d,
        };
        let domain_opset = self.domain_opset(domain).unwrap_or(0);
        let what = || {
            format!(
                "ONNX node #{i} '{}' ({}, domain '{domain}', opset {domain_opset})",
                node.name(),
                node.op_type(),
            )
        };
        let outs = self.node(node).map_err(|e| match e {
            Error::UnknownOp(m) => Error::UnknownOp(format!("{}: {m}", what())),
            Error::Unsupported(m) => Error::Unsupported(format!("{}: {m}", what())),
            Error::Graph(m) | Error::InvalidArgument(m) => Error::Graph(format!("{}: {m}", what())),
            e => e,
        })?;
        for (k, name) in node.output.iter().enumerate() {
            if name.is_empty() {
                continue;
            }
            let v = outs.get(k).copied().ok_or_else(|| {
                Error::Graph(format!(
                    "{}: Kiln's {} has {} outputs, the node names {}",
                    what(),
                    node.op_type(),
                    outs.len(),
                    node.output.len()
                ))
            })?;
            self.values.insert(name.clone(), v);
        }
        Ok(())
    }

    /// Marks the graph's outputs.
    fn outputs(&mut self, graph: &proto::GraphProto) -> Result<()> {
        for out in &graph.output {
            let v = self.input(out.name()).ok().flatten().ok_or_else(|| {
                Error::Graph(format!(
                    "graph output '{}' is not produced by any node",
                    out.name()
                ))
            })?;
            self.g.add_output(out.name(), v)?;
        }
        Ok(())
    }

    /// The type of the value an enclosing graph calls `name`, and its data if constant.
    fn outer_value(&self, name: &str) -> Option<(TensorType, Option<std::sync::Arc<Tensor>>)> {
        match self.values.get(name) {
            Some(&v) => {
                let node = self.g.node(v.node);
                let ty = self.g.value_type(v).ok()?.clone();
                Some((
                    ty,
                    (node.op == "Constant").then(|| node.data.clone()).flatten(),
                ))
            }
            None => self.outer?.outer_value(name),
        }
    }

    /// In a body, `name` from an enclosing graph: a copy of it if it is a constant (so
    /// that the body folds as its parent does), else a new trailing parameter.
    fn capture(&mut self, name: &str) -> Result<Option<Value>> {
        let Some((ty, data)) = self.outer.and_then(|o| o.outer_value(name)) else {
            return Ok(None);
        };
        let v: Value = match data {
            Some(d) => {
                let unique = self.unique_name(name);
                self.g.add_constant(&unique, ty, (*d).clone())?.into()
            }
            None => {
                let unique = self.unique_name(name);
                self.captured.push(name.to_string());
                self.g.add_parameter(&unique, ty)?.into()
            }
        };
        self.values.insert(name.to_string(), v);
        Ok(Some(v))
    }

    /// Imports graph attribute `attr` as a body: its formal inputs typed after
    /// `formals`, then parameters for the outer names in `precaptured` (so that If's
    /// branches share one capture list), then whatever else it captures. Returns the
    /// body and the outer names it captures, in parameter order.
    fn body(
        &self,
        attr: &str,
        graph: &proto::GraphProto,
        formals: &[Formal],
        precaptured: &[String],
    ) -> Result<(Graph, Vec<String>)> {
        let depth = self.depth + 1;
        if depth > crate::ir::ops::control::MAX_NESTING {
            return Err(Error::Graph(format!(
                "body '{attr}' nests deeper than {} levels",
                crate::ir::ops::control::MAX_NESTING
            )));
        }
        if graph.input.len() != formals.len() {
            return Err(Error::Graph(format!(
                "body '{attr}' has {} inputs, the op passes it {}",
                graph.input.len(),
                formals.len()
            )));
        }
        let mut sub = Importer {
            g: Graph::new(if graph.name().is_empty() {
                attr
            } else {
                graph.name()
            }),
            values: HashMap::new(),
            names: HashSet::new(),
            opset: self.opset,
            domain_opsets: self.domain_opsets.clone(),
            weights: self.weights,
            outer: Some(self),
            depth,
            captured: vec![],
        };
        let in_body = |e: Error| match e {
            Error::Unsupported(m) => Error::Unsupported(format!("body '{attr}': {m}")),
            Error::UnknownOp(m) => Error::UnknownOp(format!("body '{attr}': {m}")),
            e => Error::Graph(format!("body '{attr}': {}", strip(e))),
        };
        for (input, formal) in graph.input.iter().zip(formals) {
            let ty = match formal {
                Formal::Exact(t) => t.clone(),
                // A sequence or optional carries its type as it is (its element
                // symbols already promise nothing).
                Formal::Carried(t) if !t.is_tensor() => t.clone(),
                Formal::Carried(t) => {
                    let declared = value_type(input).ok().filter(|d| d.rank() == t.rank());
                    let dims = t.shape.axes.iter().enumerate().map(|(i, a)| {
                        match declared.as_ref().map(|d| &d.shape.axes[i].dim) {
                            Some(d @ Dim::Fixed(_)) if *d == a.dim => d.clone(),
                            _ => Dim::Sym(format!("{}.{i}", input.name())),
                        }
                    });
                    TensorType::new(t.dtype, Shape::new(dims.collect::<Vec<_>>()))
                }
            };
            let name = sub.unique_name(input.name());
            let id = sub.g.add_parameter(&name, ty).map_err(in_body)?;
            sub.values.insert(input.name().to_string(), id.into());
        }
        for name in precaptured {
            sub.capture(name).map_err(in_body)?;
        }
        sub.initializers(graph).map_err(in_body)?;
        sub.nodes_and_outputs(graph).map_err(in_body)?;
        Ok((sub.g, sub.captured))
    }

    /// If, Loop or Scan: their bodies imported, each outer name a body reads passed as
    /// a trailing capture operand.
    fn control_node(
        &mut self,
        op: &str,
        name: &str,
        mut inputs: Vec<Option<Value>>,
        mut attrs: Attrs,
        bodies: Vec<(String, &proto::GraphProto)>,
    ) -> Result<Vec<Value>> {
        let find = |want: &str| {
            bodies
                .iter()
                .find(|(n, _)| n == want)
                .map(|(_, g)| *g)
                .ok_or_else(|| Error::Graph(format!("{op} needs the graph attribute '{want}'")))
        };
        if let Some((extra, _)) = bodies.iter().find(|(n, _)| {
            !matches!(
                (op, n.as_str()),
                ("If", "then_branch" | "else_branch") | ("Loop" | "Scan", "body")
            )
        }) {
            return Err(Error::Graph(format!(
                "{op} has no graph attribute '{extra}'"
            )));
        }
        let operand = |i: usize| -> Result<TensorType> {
            match inputs.get(i).copied().flatten() {
                Some(v) => Ok(self.value_type(v)?),
                None => Err(Error::Graph(format!("{op}: input {i} is required"))),
            }
        };
        let constant_cond = match inputs.first().copied().flatten() {
            Some(c) if op == "If" => {
                let n = self.g.node(c.node);
                (n.op == "Constant")
                    .then(|| n.data.as_deref().map(|t| t.to_i64_vec()))
                    .flatten()
            }
            _ => None,
        };
        if let Some([cond]) = constant_cond.as_deref() {
            // Only the branch taken is imported, spliced into this graph: the other one
            // may not even type-check with the shapes this model has (ONNX functions
            // such as AffineGrid's branch on the input's rank).
            let branch = if *cond != 0 {
                "then_branch"
            } else {
                "else_branch"
            };
            let (body, caps) = self.body(branch, find(branch)?, &[], &[])?;
            let mut args = vec![];
            for outer in &caps {
                args.extend(self.input(outer)?);
            }
            let prefix = self.unique_name(name);
            return self.g.inline(&body, &args, &prefix);
        }
        if op == "Scan" && self.opset < 9 {
            return self.scan8(name, inputs, &attrs, find("body")?);
        }
        let captured = match op {
            "If" => {
                let (mut then, then_caps) =
                    self.body("then_branch", find("then_branch")?, &[], &[])?;
                let (other, caps) =
                    self.body("else_branch", find("else_branch")?, &[], &then_caps)?;
                for outer in &caps[then_caps.len()..] {
                    let (ty, _) = self
                        .outer_value(outer)
                        .ok_or_else(|| Error::Graph(format!("'{outer}' is not defined")))?;
                    then.add_parameter(&then.fresh_name(outer), ty)?;
                }
                attrs.set("then_branch", Attr::Graph(std::sync::Arc::new(then)));
                attrs.set("else_branch", Attr::Graph(std::sync::Arc::new(other)));
                caps
            }
            "Loop" => {
                let mut formals = vec![
                    Formal::Exact(TensorType::new(crate::ir::DType::I64, Shape::scalar())),
                    Formal::Exact(TensorType::new(crate::ir::DType::Bool, Shape::scalar())),
                ];
                for i in 2..inputs.len() {
                    formals.push(Formal::Carried(operand(i)?));
                }
                let (body, caps) = self.body("body", find("body")?, &formals, &[])?;
                attrs.set("body", Attr::Graph(std::sync::Arc::new(body)));
                caps
            }
            _ => {
                let m = attrs.int_or("num_scan_inputs", 0).map_err(Error::Graph)?;
                let scans = usize::try_from(m).unwrap_or(usize::MAX);
                let state = inputs.len().checked_sub(scans).ok_or_else(|| {
                    Error::Graph(format!(
                        "num_scan_inputs = {m}, but the node has {} inputs",
                        inputs.len()
                    ))
                })?;
                let axes = attrs.ints("scan_input_axes").map_err(Error::Graph)?;
                let mut formals = vec![];
                for i in 0..inputs.len() {
                    let t = operand(i)?;
                    if i < state {
                        formals.push(Formal::Carried(t));
                        continue;
                    }
                    let axis = axes.and_then(|a| a.get(i - state)).copied().unwrap_or(0);
                    let axis = t
                        .shape
                        .norm_axis(axis)
                        .map_err(|e| Error::Graph(format!("scan input {}: {e}", i - state)))?;
                    let mut slice = t.clone();
                    slice.shape.axes.remove(axis);
                    formals.push(Formal::Exact(slice));
                }
                let (body, caps) = self.body("body", find("body")?, &formals, &[])?;
                attrs.set("body", Attr::Graph(std::sync::Arc::new(body)));
                caps
            }
        };
        for outer in &captured {
            let v = self.input(outer)?;
            inputs.push(v);
        }
        attrs.set("captures", Attr::Int(captured.len() as i64));
        self.add(op, &inputs, attrs, name)
    }

    /// Opset-8 Scan (a batch axis 0 on every input and output, the sequence on axis 1 of
    /// the scan inputs) as an opset-9 Scan over the batch whose body is an opset-9 Scan
    /// over the sequence of one batch entry.
    fn scan8(
        &mut self,
        name: &str,
        inputs: Vec<Option<Value>>,
        attrs: &Attrs,
        graph: &proto::GraphProto,
    ) -> Result<Vec<Value>> {
        if inputs.first().copied().flatten().is_some() {
            return Err(Error::Unsupported(
                "opset-8 Scan with sequence_lens is not supported".into(),
            ));
        }
        let m = attrs.req_int("num_scan_inputs").map_err(Error::Graph)?;
        let operands: Vec<Value> = inputs
            .iter()
            .skip(1)
            .map(|v| {
                v.ok_or_else(|| Error::Graph("Scan: only sequence_lens may be omitted".into()))
            })
            .collect::<Result<_>>()?;
        let scans = usize::try_from(m)
            .ok()
            .filter(|&m| m >= 1 && m <= operands.len())
            .ok_or_else(|| {
                Error::Graph(format!(
                    "num_scan_inputs = {m} does not fit the {} inputs",
                    operands.len()
                ))
            })?;
        let state = operands.len() - scans;
        // Each operand without its batch axis; the inner body also loses the sequence axis.
        let mut entry_types = vec![];
        let mut formals = vec![];
        for (i, &v) in operands.iter().enumerate() {
            let mut t = self.value_type(v)?;
            if t.rank() < if i < state { 1 } else { 2 } {
                return Err(Error::Graph(format!(
                    "Scan-8 input {} has no batch (and sequence) axis: {t}",
                    i + 1
                )));
            }
            t.shape.axes.remove(0);
            entry_types.push(t.clone());
            if i < state {
                formals.push(Formal::Carried(t));
            } else {
                t.shape.axes.remove(0);
                formals.push(Formal::Exact(t));
            }
        }
        let (inner, caps) = self.body("body", graph, &formals, &[])?;
        let mut cap_values = vec![];
        for outer in &caps {
            cap_values.extend(self.input(outer)?);
        }
        let mut per_entry = Graph::new("batch_entry");
        let mut args = vec![];
        for (i, t) in entry_types.into_iter().enumerate() {
            args.push(Some(per_entry.add_parameter(&format!("in{i}"), t)?.into()));
        }
        for (k, &v) in cap_values.iter().enumerate() {
            args.push(Some(
                per_entry
                    .add_parameter(&format!("capture{k}"), self.value_type(v)?)?
                    .into(),
            ));
        }
        let mut inner_attrs = Attrs::new()
            .with("body", Attr::Graph(std::sync::Arc::new(inner)))
            .with("num_scan_inputs", Attr::Int(scans as i64))
            .with("captures", Attr::Int(caps.len() as i64));
        if let Some(d) = attrs.ints("directions").map_err(Error::Graph)? {
            inner_attrs.set("scan_input_directions", Attr::Ints(d.to_vec()));
        }
        let scan = per_entry.add_op("Scan", &args, inner_attrs, "scan")?;
        for k in 0..per_entry.node(scan).outputs.len() {
            per_entry.add_output(&format!("out{k}"), scan.out(k as u32))?;
        }
        let outer_attrs = Attrs::new()
            .with("body", Attr::Graph(std::sync::Arc::new(per_entry)))
            .with("num_scan_inputs", Attr::Int(operands.len() as i64))
            .with("captures", Attr::Int(caps.len() as i64));
        let mut outer_inputs: Vec<Option<Value>> = operands.into_iter().map(Some).collect();
        outer_inputs.extend(cap_values.into_iter().map(Some));
        self.add("Scan", &outer_inputs, outer_attrs, name)
    }
}

/// An error's message without its kind, for re-wrapping with context.
fn strip(e: Error) -> String {
    match e {
        Error::Graph(m)
        | Error::InvalidArgument(m)
        | Error::Unsupported(m)
        | Error::UnknownOp(m) => m,
        e => e.to_string(),
    }
}
