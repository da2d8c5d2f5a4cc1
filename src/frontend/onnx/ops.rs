//! ONNX nodes to catalogue ops. Most map one to one (same name, inputs, attributes);
//! here are the exceptions: attribute forms of older opsets that later became inputs,
//! the pre-13 softmaxes' 2-D coercion, `Constant`, `Cast`'s type codes,
//! `ConstantOfShape`'s tensor attribute, inference-mode `Dropout`.
use std::collections::HashMap;

use super::Importer;
use crate::error::{Error, Result};
use crate::ir::{ops, Attr, Attrs, Value};
use crate::tensor::Tensor;

type Inputs = Vec<Option<Value>>;

/// Moves attribute `name` (ints) to input position `at` as a constant, if present.
fn attr_to_input(
    imp: &mut Importer<'_>,
    inputs: &mut Inputs,
    attrs: &mut Attrs,
    name: &str,
    at: usize,
    node: &str,
) -> Result<()> {
    let Some(Attr::Ints(v)) = attrs.0.remove(name) else {
        return Ok(());
    };
    let c = imp.ints(&format!("{node}.{name}"), &v)?;
    if inputs.len() <= at {
        inputs.resize(at + 1, None);
    }
    inputs[at] = Some(c);
    Ok(())
}

/// A scalar constant of `like`'s dtype.
fn scalar_like(imp: &mut Importer<'_>, like: Value, v: f64, name: &str) -> Result<Value> {
    let dtype = imp.value_type(like)?.dtype;
    let t = Tensor::from_f64s(dtype, &[], &[v]).map_err(Error::InvalidArgument)?;
    imp.constant(name, t)
}

pub(super) fn convert(
    imp: &mut Importer<'_>,
    op: &str,
    name: &str,
    mut inputs: Inputs,
    mut attrs: Attrs,
    tensors: HashMap<String, Tensor>,
    n_outputs: usize,
) -> Result<Vec<Value>> {
    let opset = imp.opset;
    // Legacy attributes with no meaning any more.
    attrs.0.remove("consumed_inputs");
    if op == "BatchNormalization" {
        if let Some(Attr::Int(s)) = attrs.0.remove("spatial") {
            if s != 1 {
                return Err(Error::UnknownOp("spatial = 0 is not supported".into()));
            }
        }
    }
    // Opset 9-10's Scatter is ScatterElements under its old name.
    let op = if op == "Scatter" {
        "ScatterElements"
    } else {
        op
    };
    match op {
        "Constant" => {
            let t = constant_value(attrs, tensors)?;
            return Ok(vec![imp.constant(name, t)?]);
        }
        "QuantizeLinear" | "DequantizeLinear" | "HannWindow" | "HammingWindow"
        | "BlackmanWindow" => {
            // ONNX type codes to Kiln dtype names (0: unset).
            for key in ["output_dtype", "output_datatype"] {
                if let Some(Attr::Int(code)) = attrs.0.remove(key) {
                    if code != 0 {
                        let d = super::tensor::dtype_name(code).map_err(Error::UnknownOp)?;
                        attrs.set(key, Attr::String(d.into()));
                    }
                }
            }
        }
        "Cast" | "BitCast" => {
            if let Some(Attr::Int(code)) = attrs.0.remove("to") {
                let to = super::tensor::dtype_name(code).map_err(Error::UnknownOp)?;
                attrs.set("to", Attr::String(to.into()));
            }
        }
        "ConstantOfShape" => {
            if let Some(t) = tensors.get("value") {
                if t.len() != 1 {
                    return Err(Error::Graph("value must hold one element".into()));
                }
                attrs.set("value", Attr::Float(t.to_f64_vec()[0]));
                attrs.set("dtype", Attr::String(t.dtype().name().into()));
            }
        }
        "Dropout" => {
            if n_outputs > 1 {
                return Err(Error::UnknownOp(
                    "Dropout's mask output is not supported".into(),
                ));
            }
            // Inference only: a training_mode that is not a constant false would be random.
            if let Some(Some(t)) = inputs.get(2) {
                let node = imp.g.node(t.node);
                let off = node.op == "Constant"
                    && node
                        .data
                        .as_ref()
                        .is_some_and(|d| d.to_f64_vec().iter().all(|&v| v == 0.0));
                if !off {
                    return Err(Error::UnknownOp(
                        "Dropout in training mode is not supported".into(),
                    ));
                }
            }
            let x = inputs
                .first()
                .copied()
                .flatten()
                .ok_or_else(|| Error::Graph("Dropout needs an input".into()))?;
            return imp.add("Identity", &[Some(x)], Attrs::new(), name);
        }
        "ReduceSum" if opset < 13 => attr_to_input(imp, &mut inputs, &mut attrs, "axes", 1, name)?,
        "ReduceMean" | "ReduceMax" | "ReduceMin" | "ReduceProd" | "ReduceL1" | "ReduceL2"
        | "ReduceLogSum" | "ReduceLogSumExp" | "ReduceSumSquare"
            if opset < 18 =>
        {
            attr_to_input(imp, &mut inputs, &mut attrs, "axes", 1, name)?
        }
        "Squeeze" | "Unsqueeze" if opset < 13 => {
            attr_to_input(imp, &mut inputs, &mut attrs, "axes", 1, name)?
        }
        "Split" => {
            if opset < 13 {
                attr_to_input(imp, &mut inputs, &mut attrs, "split", 1, name)?;
            }
            // The node's output count says how many parts a run-time split makes.
            let constant_split = inputs
                .get(1)
                .copied()
                .flatten()
                .is_some_and(|v| imp.g.node(v.node).op == "Constant");
            if !constant_split && attrs.get("num_outputs").is_none() {
                attrs.set("num_outputs", Attr::Int(n_outputs as i64));
            }
        }
        "Slice" if opset < 10 => {
            for (k, a) in ["starts", "ends", "axes"].iter().enumerate() {
                attr_to_input(imp, &mut inputs, &mut attrs, a, k + 1, name)?;
            }
        }
        "Pad" if opset < 11 => {
            attr_to_input(imp, &mut inputs, &mut attrs, "pads", 1, name)?;
            if let Some(Attr::Float(v)) = attrs.0.remove("value") {
                let x = inputs[0].ok_or_else(|| Error::Graph("Pad needs data".into()))?;
                let c = scalar_like(imp, x, v, &format!("{name}.value"))?;
                inputs.push(Some(c));
            }
        }
        "Clip" if opset < 11 => {
            let x = inputs
                .first()
                .copied()
                .flatten()
                .ok_or_else(|| Error::Graph("Clip needs an input".into()))?;
            let lo = attrs.0.remove("min").map(|a| match a {
                Attr::Float(v) => v,
                _ => f64::MIN,
            });
            let hi = attrs.0.remove("max").map(|a| match a {
                Attr::Float(v) => v,
                _ => f64::MAX,
            });
            let lo = lo
                .map(|v| scalar_like(imp, x, v, &format!("{name}.min")))
                .transpose()?;
            let hi = hi
                .map(|v| scalar_like(imp, x, v, &format!("{name}.max")))
                .transpose()?;
            inputs = vec![Some(x), lo, hi];
        }
        "TopK" if opset < 10 => {
            if let Some(Attr::Int(k)) = attrs.0.remove("k") {
                let c = imp.ints(&format!("{name}.k"), &[k])?;
                inputs.push(Some(c));
            }
        }
        "Softmax" | "LogSoftmax" | "Hardmax" if opset < 13 => {
            // Before opset 13 these flatten to 2-D at `axis` (default 1) and work on rows.
            let x = inputs
                .first()
                .copied()
                .flatten()
                .ok_or_else(|| Error::Graph(format!("{op} needs an input")))?;
            let axis = attrs.int_or("axis", 1).map_err(Error::Graph)?;
            let shape = imp.add("Shape", &[Some(x)], Attrs::new(), &format!("{name}.shape"))?[0];
            let flat = imp.add(
                "Flatten",
                &[Some(x)],
                Attrs::new().with("axis", Attr::Int(axis)),
                &format!("{name}.2d"),
            )?[0];
            let y = imp.add(
                op,
                &[Some(flat)],
                Attrs::new().with("axis", Attr::Int(-1)),
                &format!("{name}.rows"),
            )?[0];
            return imp.add("Reshape", &[Some(y), Some(shape)], Attrs::new(), name);
        }
        _ => {}
    }
    if ops::lookup(op).is_none() || matches!(op, "Parameter" | "Variable" | "Assign" | "Dot") {
        return Err(Error::UnknownOp(format!("op '{op}' is not supported")));
    }
    // Trailing omitted optional inputs are simply absent.
    while inputs.last().is_some_and(|v| v.is_none()) {
        inputs.pop();
    }
    imp.add(op, &inputs, attrs, name)
}

/// A `Constant` node's value, from whichever of its attributes is set.
fn constant_value(attrs: Attrs, tensors: HashMap<String, Tensor>) -> Result<Tensor> {
    if let Some(t) = tensors.into_values().next() {
        return Ok(t);
    }
    let t = match attrs.0.into_iter().next() {
        Some((k, Attr::Float(v))) if k == "value_float" => Tensor::scalar(v as f32),
        Some((k, Attr::Int(v))) if k == "value_int" => Tensor::scalar(v),
        Some((k, Attr::Floats(v))) if k == "value_floats" => {
            Tensor::from_vec(&[v.len()], v.iter().map(|&x| x as f32).collect())
                .map_err(Error::InvalidArgument)?
        }
        Some((k, Attr::Ints(v))) if k == "value_ints" => {
            Tensor::from_vec(&[v.len()], v).map_err(Error::InvalidArgument)?
        }
        Some((k, _)) => {
            return Err(Error::UnknownOp(format!(
                "Constant attribute '{k}' is not supported"
            )))
        }
        None => return Err(Error::Graph("Constant has no value".into())),
    };
    Ok(t)
}
