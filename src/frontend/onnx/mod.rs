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
use crate::ir::{Attr, Attrs, Container, Dim, Graph, Shape, TensorType, Value};
use crate::tensor::Tensor;

mod expand;
mod ops;
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

fn decode(buf: impl bytes::Buf) -> Result<ModelProto> {
    ModelProto::decode(buf)
        .map_err(|e| Error::InvalidArgument(format!("not a valid ONNX model: {e}")))
}

fn import_model(model: &ModelProto, base_dir: Option<&Path>) -> Result<Graph> {
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
        base_dir,
    };
    for init in &graph.initializer {
        let t = tensor::tensor(init, base_dir)
            .map_err(|e| Error::InvalidArgument(format!("initializer '{}': {e}", init.name())))?;
        let v = imp.constant(init.name(), t)?;
        imp.values.insert(init.name().to_string(), v);
    }
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
    for (i, node) in graph.node.iter().enumerate() {
        let domain = match node.domain() {
            "" => "ai.onnx",
            d => d,
        };
        let domain_opset = imp.domain_opset(domain).unwrap_or(0);
        let what = || {
            format!(
                "ONNX node #{i} '{}' ({}, domain '{domain}', opset {domain_opset})",
                node.name(),
                node.op_type(),
            )
        };
        let outs = imp.node(node).map_err(|e| match e {
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
            imp.values.insert(name.clone(), v);
        }
    }
    for out in &graph.output {
        let v = imp.values.get(out.name()).copied().ok_or_else(|| {
            Error::Graph(format!(
                "graph output '{}' is not produced by any node",
                out.name()
            ))
        })?;
        imp.g.add_output(out.name(), v)?;
    }
    crate::ir::verify(&imp.g)?;
    Ok(imp.g)
}

/// A serialized `TensorProto` (the `.pb` files of the ONNX test suites) as a tensor.
pub fn read_tensor_pb(bytes: &[u8]) -> Result<Tensor> {
    let t = proto::TensorProto::decode(bytes)
        .map_err(|e| Error::InvalidArgument(format!("not a TensorProto: {e}")))?;
    tensor::tensor(&t, None).map_err(Error::InvalidArgument)
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

/// A graph input's type: element type and dims (`dim_param` stays symbolic; a dim with
/// neither value nor name gets a symbol of its own), inside sequences and optionals.
fn value_type(v: &proto::ValueInfoProto) -> std::result::Result<TensorType, String> {
    let t = v.r#type.as_ref().ok_or("the input has no type")?;
    type_of(t, v.name(), false)
}

/// A `TypeProto` as a Kiln type; `in_container` allows an unknown rank.
fn type_of(
    t: &proto::TypeProto,
    name: &str,
    in_container: bool,
) -> std::result::Result<TensorType, String> {
    let elem = |e: &Option<Box<proto::TypeProto>>| {
        e.as_deref()
            .ok_or_else(|| "a sequence or optional type without an element type".to_string())
            .and_then(|e| type_of(e, name, true))
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
        if in_container {
            let mut ty = TensorType::new(dtype, Shape::scalar());
            ty.ranked = false;
            return Ok(ty);
        }
        return Err("the input has no shape (unknown rank is not supported)".into());
    };
    let dims = shape
        .dim
        .iter()
        .enumerate()
        .map(|(i, d)| match &d.value {
            Some(proto::tensor_shape_proto::dimension::Value::DimValue(n)) if *n >= 0 => {
                Dim::Fixed(*n as usize)
            }
            Some(proto::tensor_shape_proto::dimension::Value::DimParam(p)) if !p.is_empty() => {
                Dim::Sym(p.clone())
            }
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
    base_dir: Option<&'a Path>,
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
    /// for `Shape`, has a static shape) the op is evaluated now and its results become
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
            let Some(dims) = self.g.value_type(*x)?.shape.to_fixed() else {
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
        self.g.infer_node(&probe)?;
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

    fn input(&self, name: &str) -> Result<Option<Value>> {
        if name.is_empty() {
            return Ok(None);
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
            match attr(a, self.base_dir)? {
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
            "ai.onnx" | "ai.onnx.ml" | "ai.onnx.preview.training"
        ) {
            return Err(Error::Unsupported(format!(
                "domain '{domain}' is not supported"
            )));
        }
        if self.domain_opset(domain).is_none() {
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
        for a in &node.attribute {
            match attr(a, self.base_dir)? {
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
        let kind = ops::NodeKind {
            domain,
            op: node.op_type(),
            name,
            n_outputs: node.output.len(),
        };
        ops::convert(self, kind, inputs, attrs, tensors)
    }
}

enum AttrValue {
    Plain(Attr),
    Tensor(Tensor),
}

fn attr(a: &AttributeProto, base_dir: Option<&Path>) -> Result<AttrValue> {
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
            let t = type_of(tp, a.name(), true)
                .map_err(|e| Error::Unsupported(format!("attribute '{}': {e}", a.name())))?;
            Attr::String(t.to_string())
        }
        AttributeType::Tensor => {
            let t = a.t.as_ref().ok_or_else(|| {
                Error::InvalidArgument(format!("attribute '{}' has no tensor", a.name()))
            })?;
            return tensor::tensor(t, base_dir)
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
