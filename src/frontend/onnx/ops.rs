//! ONNX nodes to catalogue ops. Most map one to one (same name, inputs, attributes);
//! here are the exceptions: the other domains and the ops `expand.rs` builds, opsets
//! 1-6, attribute forms of older opsets that later became inputs (and Upsample, DFT-17,
//! GridSample-16), the pre-13 softmaxes' 2-D coercion, `Constant`, type codes,
//! `ConstantOfShape`'s tensor attribute, opset 7-11 `Dropout`'s ratio attribute.
use std::collections::HashMap;

use super::contrib;
use super::expand::{self, Builder};
use super::Importer;
use crate::error::{Error, Result};
use crate::ir::{ops, Attr, Attrs, DType, Value};
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

/// For each op whose definition in force at opset 7 is older than 7: the opset that
/// introduced that definition. A model of opset k < 7 imports as opset 7 when all its
/// ops are here with a version <= k (their meaning did not change from k to 7).
/// Generated from `onnx.defs.get_schema(op, 7).since_version` (onnx 1.23.2).
#[rustfmt::skip]
const DEFINED_BEFORE_OPSET_7: &[(&str, i64)] = &[
    ("Abs", 6), ("ArgMax", 1), ("ArgMin", 1), ("Cast", 6), ("Ceil", 6), ("Clip", 6),
    ("Concat", 4), ("Constant", 1), ("Conv", 1), ("ConvTranspose", 1), ("DepthToSpace", 1),
    ("Elu", 6), ("Exp", 6), ("Flatten", 1), ("Floor", 6), ("Gather", 1),
    ("GlobalAveragePool", 1), ("GlobalLpPool", 2), ("GlobalMaxPool", 1), ("HardSigmoid", 6),
    ("Hardmax", 1), ("Identity", 1), ("If", 1), ("InstanceNormalization", 6), ("LRN", 1),
    ("LeakyRelu", 6), ("Log", 6), ("LogSoftmax", 1), ("Loop", 1), ("LpNormalization", 1),
    ("LpPool", 2), ("MatMul", 1), ("Max", 6), ("MaxPool", 1), ("MaxRoiPool", 1),
    ("Mean", 6), ("Min", 6), ("Neg", 6), ("Not", 1), ("Pad", 2), ("RandomNormal", 1),
    ("RandomNormalLike", 1), ("RandomUniform", 1), ("RandomUniformLike", 1),
    ("Reciprocal", 6), ("ReduceL1", 1), ("ReduceL2", 1), ("ReduceLogSum", 1),
    ("ReduceLogSumExp", 1), ("ReduceMax", 1), ("ReduceMean", 1), ("ReduceMin", 1),
    ("ReduceProd", 1), ("ReduceSum", 1), ("ReduceSumSquare", 1), ("Relu", 6),
    ("Reshape", 5), ("Selu", 6), ("Shape", 1), ("Sigmoid", 6), ("Size", 1), ("Slice", 1),
    ("Softmax", 1), ("Softplus", 1), ("Softsign", 1), ("SpaceToDepth", 1), ("Split", 2),
    ("Sqrt", 6), ("Squeeze", 1), ("Sum", 6), ("Tanh", 6), ("Tile", 6), ("TopK", 1),
    ("Transpose", 1), ("Unsqueeze", 1),
];

/// Whether a model may not name this catalogue op: the schema says Kiln makes it (the
/// graph's sources and state, the forms the passes build, Kiln's extensions).
/// A one-element 1-D scale (and its zero point) of an unblocked `QuantizeLinear` or
/// `DequantizeLinear`, as a scalar: onnxruntime reads it as per-tensor whatever `axis`
/// says (quantizers write `axis` on bias scales of shape `[1]`), so Kiln does too.
fn per_tensor_scale(
    imp: &mut Importer<'_>,
    inputs: &mut Inputs,
    attrs: &Attrs,
    name: &str,
) -> Result<()> {
    if attrs.int_or("block_size", 0).map_err(Error::Graph)? != 0 {
        return Ok(());
    }
    let one_element = |imp: &Importer<'_>, v: Value| -> Result<bool> {
        let t = imp.value_type(v)?;
        Ok(t.rank() == 1 && t.shape.dim(0).fixed() == Some(1))
    };
    let Some(Some(scale)) = inputs.get(1).copied() else {
        return Ok(());
    };
    if !one_element(imp, scale)? {
        return Ok(());
    }
    let scalar = imp.ints(&format!("{name}.scalar_shape"), &[])?;
    for k in [1, 2] {
        if let Some(Some(v)) = inputs.get(k).copied() {
            if one_element(imp, v)? {
                let r = imp.add("Reshape", &[Some(v), Some(scalar)], Attrs::new(), name)?;
                inputs[k] = Some(r[0]);
            }
        }
    }
    Ok(())
}

pub(crate) fn kiln_internal(schema: &ops::OpSchema) -> bool {
    schema.origin == ops::Origin::Kiln
}

/// What `convert` needs to know of the ONNX node besides its operands.
pub(super) struct NodeKind<'s> {
    pub domain: &'s str,
    pub op: &'s str,
    /// The name Kiln's nodes for it are named after.
    pub name: &'s str,
    /// How many outputs the ONNX node names.
    pub n_outputs: usize,
    /// Which of them are used (an unused optional output has an empty name).
    pub named: &'s [bool],
}

pub(super) fn convert(
    imp: &mut Importer<'_>,
    kind: NodeKind<'_>,
    mut inputs: Inputs,
    mut attrs: Attrs,
    tensors: HashMap<String, Tensor>,
) -> Result<Vec<Value>> {
    let NodeKind {
        domain,
        op,
        name,
        n_outputs,
        named,
    } = kind;
    match domain {
        "com.microsoft" => {
            return contrib::convert(&mut Builder::new(imp, name), op, &inputs, attrs, named)
        }
        "ai.onnx.ml" => return ml(imp, op, name, inputs, attrs, tensors),
        "ai.onnx.preview.training" => {
            return expand::training(&mut Builder::new(imp, name), op, &inputs, &attrs)
        }
        _ => {} // ai.onnx: the importer admits no other domain
    }
    // onnxruntime registers its RMS normalization in the default domain.
    if op == "SimplifiedLayerNormalization" {
        return contrib::convert(&mut Builder::new(imp, name), op, &inputs, attrs, named);
    }
    let mut opset = imp.opset;
    if opset < 7 {
        match DEFINED_BEFORE_OPSET_7.iter().find(|(o, _)| *o == op) {
            Some(&(_, since)) if since <= opset => opset = 7,
            _ => {
                return Err(Error::Unsupported(format!(
                    "op '{op}' at opset {opset} is not supported (Kiln reads opsets 1-6 only for ops unchanged since; this one changed by opset 7)"
                )))
            }
        }
    }
    // Legacy attributes with no meaning any more.
    attrs.0.remove("consumed_inputs");
    // The pools' `block` is Kiln-internal (the layout pass's blocked form): a model's
    // pool is always plain, so an attribute of that name is an error, not a layout.
    if matches!(
        op,
        "MaxPool" | "AveragePool" | "GlobalMaxPool" | "GlobalAveragePool"
    ) && attrs.get("block").is_some()
    {
        return Err(Error::Graph(format!(
            "{op}: unknown attribute 'block' (it is not an ONNX attribute)"
        )));
    }
    if op == "BatchNormalization" {
        if let Some(Attr::Int(s)) = attrs.0.remove("spatial") {
            if s != 1 {
                return Err(Error::Unsupported("spatial = 0 is not supported".into()));
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
        "MeanVarianceNormalization" => {
            return expand::mean_variance_normalization(
                &mut Builder::new(imp, name),
                &inputs,
                &attrs,
            )
        }
        "BatchNormalization" if attrs.int_or("training_mode", 0).map_err(Error::Graph)? != 0 => {
            let b = &mut Builder::new(imp, name);
            return expand::batch_normalization_training(b, &inputs, &attrs, n_outputs);
        }
        "GroupNormalization" => {
            let b = &mut Builder::new(imp, name);
            return expand::group_normalization(b, &inputs, &attrs, opset);
        }
        "DepthToSpace" | "SpaceToDepth" => {
            return expand::depth_space(&mut Builder::new(imp, name), op, &inputs, &attrs)
        }
        "Compress" => return expand::compress(&mut Builder::new(imp, name), &inputs, &attrs),
        "EyeLike" => return expand::eye_like(&mut Builder::new(imp, name), &inputs, &attrs),
        "QLinearConv" => {
            return expand::qlinear(&mut Builder::new(imp, name), "Conv", &inputs, attrs)
        }
        "QLinearMatMul" => {
            return expand::qlinear(&mut Builder::new(imp, name), "MatMul", &inputs, attrs)
        }
        "Swish" => return expand::swish(&mut Builder::new(imp, name), &inputs, &attrs),
        "Upsample" | "Resize" if opset < 11 => {
            // Upsample (7-9) and Resize-10: scales only, asymmetric coordinates, nearest
            // rounding down (what the ONNX version converter spells out for Resize-11).
            if let Some(Attr::Floats(s)) = attrs.0.remove("scales") {
                let t = Tensor::from_vec(&[s.len()], s.iter().map(|&v| v as f32).collect())
                    .map_err(Error::InvalidArgument)?;
                inputs.push(Some(imp.constant(&format!("{name}.scales"), t)?));
            }
            let (x, scales) = (
                inputs.first().copied().flatten(),
                inputs.last().copied().flatten(),
            );
            inputs = vec![x, None, scales];
            attrs.set(
                "coordinate_transformation_mode",
                Attr::String("asymmetric".into()),
            );
            if attrs.string_or("mode", "nearest").map_err(Error::Graph)? == "nearest" {
                attrs.set("nearest_mode", Attr::String("floor".into()));
            }
            return imp.add("Resize", &inputs, attrs, name);
        }
        "Constant" => {
            let t = constant_value(attrs, tensors)?;
            return Ok(vec![imp.constant(name, t)?]);
        }
        "QuantizeLinear" | "DequantizeLinear" | "HannWindow" | "HammingWindow"
        | "BlackmanWindow" | "MelWeightMatrix" => {
            if matches!(op, "QuantizeLinear" | "DequantizeLinear") {
                per_tensor_scale(imp, &mut inputs, &attrs, name)?;
            }
            // ONNX type codes to Kiln dtype names (0: unset).
            for key in ["output_dtype", "output_datatype", "precision"] {
                if let Some(Attr::Int(code)) = attrs.0.remove(key) {
                    if code != 0 {
                        let d = super::tensor::dtype_name(code).map_err(Error::Unsupported)?;
                        attrs.set(key, Attr::String(d.into()));
                    }
                }
            }
        }
        "SequenceEmpty" => {
            if let Some(Attr::Int(code)) = attrs.0.remove("dtype") {
                let d = super::tensor::dtype_name(code).map_err(Error::Unsupported)?;
                attrs.set("dtype", Attr::String(d.into()));
            }
        }
        "Cast" | "BitCast" => {
            if let Some(Attr::Int(code)) = attrs.0.remove("to") {
                let to = super::tensor::dtype_name(code).map_err(Error::Unsupported)?;
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
        "Dropout" if opset < 12 => {
            // Opsets 7-11 have no training_mode: an imported model runs for inference
            // (output = data, mask all true). The ratio attribute becomes the input.
            if let Some(Attr::Float(r)) = attrs.0.remove("ratio") {
                let x = inputs
                    .first()
                    .copied()
                    .flatten()
                    .ok_or_else(|| Error::Graph("Dropout needs an input".into()))?;
                inputs.truncate(1);
                inputs.push(Some(scalar_like(imp, x, r, &format!("{name}.ratio"))?));
            }
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
                let x = expand::need(&inputs, 0, "data")?;
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
        "DFT" if opset < 20 => {
            // The axis was an attribute (default 1) before it became an input.
            let axis = attrs.int_or("axis", 1).map_err(Error::Graph)?;
            attrs.0.remove("axis");
            let axis = imp.constant(&format!("{name}.axis"), Tensor::scalar(axis))?;
            inputs.resize(2, None);
            inputs.push(Some(axis));
        }
        "GridSample" if opset < 20 => {
            // Opset 16 named the modes bilinear and bicubic.
            let mode = match attrs.string_or("mode", "bilinear").map_err(Error::Graph)? {
                "bilinear" => "linear",
                "bicubic" => "cubic",
                m => m,
            };
            attrs.set("mode", Attr::String(mode.to_string()));
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
    let Some(catalogue_op) = ops::lookup(op) else {
        return Err(Error::UnknownOp(format!("op '{op}' is not supported")));
    };
    if kiln_internal(catalogue_op.schema()) {
        return Err(Error::UnknownOp(format!(
            "op '{op}' is Kiln-internal, not an ONNX op"
        )));
    }
    // Trailing omitted optional inputs are simply absent.
    while inputs.last().is_some_and(|v| v.is_none()) {
        inputs.pop();
    }
    imp.add(op, &inputs, attrs, name)
}

/// An `ai.onnx.ml` node: the tree ensembles are catalogue ops, their tensor attributes
/// read as lists (opset 3's `<name>_as_tensor` as `<name>`); the small ops expand.
fn ml(
    imp: &mut Importer<'_>,
    op: &str,
    name: &str,
    inputs: Inputs,
    mut attrs: Attrs,
    tensors: HashMap<String, Tensor>,
) -> Result<Vec<Value>> {
    match op {
        "TreeEnsemble" | "TreeEnsembleRegressor" | "TreeEnsembleClassifier" => {
            for (key, t) in tensors {
                let key = key.strip_suffix("_as_tensor").unwrap_or(&key);
                let list = if key == "nodes_modes" {
                    Attr::Ints(t.to_i64_vec())
                } else {
                    Attr::Floats(t.to_f64_vec())
                };
                attrs.set(key, list);
            }
            imp.add(op, &inputs, attrs, name)
        }
        "LabelEncoder" => label_encoder(imp, name, inputs, attrs, tensors),
        _ => expand::ml(&mut Builder::new(imp, name), op, &inputs, &attrs),
    }
}

/// `LabelEncoder`: opset 1's `classes_strings` (string to its index, or index to string)
/// and opset 4's `keys_tensor`, `values_tensor` and `default_tensor` become the lists
/// of opset 2; values of a dtype other than f32, i64 and string are cast to it after.
fn label_encoder(
    imp: &mut Importer<'_>,
    name: &str,
    inputs: Inputs,
    mut attrs: Attrs,
    tensors: HashMap<String, Tensor>,
) -> Result<Vec<Value>> {
    let x = expand::need(&inputs, 0, "X")?;
    if let Some(Attr::Strings(classes)) = attrs.0.remove("classes_strings") {
        let indexes: Vec<i64> = (0..classes.len() as i64).collect();
        if imp.value_type(x)?.dtype.is_string() {
            attrs.set("keys_strings", Attr::Strings(classes));
            attrs.set("values_int64s", Attr::Ints(indexes));
            attrs.0.remove("default_string");
        } else {
            attrs.set("keys_int64s", Attr::Ints(indexes));
            attrs.set("values_strings", Attr::Strings(classes));
            attrs.0.remove("default_int64");
        }
    }
    // A tensor attribute's list: strings, floats or integers by its dtype.
    let list = |t: &Tensor, kind: &str| -> (String, Attr) {
        match t {
            Tensor::String(a) => (
                format!("{kind}_strings"),
                Attr::Strings(a.iter().cloned().collect()),
            ),
            _ if t.dtype().is_float() => (format!("{kind}_floats"), Attr::Floats(t.to_f64_vec())),
            _ => (format!("{kind}_int64s"), Attr::Ints(t.to_i64_vec())),
        }
    };
    let mut cast_to = None;
    for (key, t) in &tensors {
        match key.as_str() {
            "keys_tensor" => {
                let (k, v) = list(t, "keys");
                attrs.set(&k, v);
            }
            "values_tensor" => {
                let (k, v) = list(t, "values");
                attrs.set(&k, v);
                if !matches!(t.dtype(), DType::F32 | DType::I64 | DType::String) {
                    cast_to = Some(t.dtype());
                }
            }
            "default_tensor" => {}
            other => {
                return Err(Error::Unsupported(format!(
                    "LabelEncoder attribute '{other}' of type TENSOR is not supported"
                )))
            }
        }
    }
    if let Some(t) = tensors.get("default_tensor") {
        let (k, v) = list(t, "default");
        let single = match v {
            Attr::Strings(s) => s.into_iter().next().map(Attr::String),
            Attr::Floats(f) => f.first().map(|&f| Attr::Float(f)),
            Attr::Ints(i) => i.first().map(|&i| Attr::Int(i)),
            _ => None,
        }
        .ok_or_else(|| Error::Graph("default_tensor must hold one value".into()))?;
        let k = k
            .replace("_strings", "_string")
            .replace("_floats", "_float")
            .replace("_int64s", "_int64");
        attrs.set(&k, single);
    }
    let Some(to) = cast_to else {
        return imp.add("LabelEncoder", &inputs, attrs, name);
    };
    let y = imp.add("LabelEncoder", &inputs, attrs, &format!("{name}.values"))?;
    let cast = Attrs::new().with("to", Attr::String(to.name().into()));
    imp.add("Cast", &[y.first().copied()], cast, name)
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
            return Err(Error::Unsupported(format!(
                "Constant attribute '{k}' is not supported"
            )))
        }
        None => return Err(Error::Graph("Constant has no value".into())),
    };
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Exactly these catalogue ops are Kiln's own (the set the family and doc-prefix rule
    /// chose before `origin` existed), and every op of the families only Kiln makes is.
    #[test]
    fn internal_ops() {
        let internal: Vec<&str> = ops::catalogue()
            .values()
            .map(|o| o.schema())
            .filter(|s| kiln_internal(s))
            .map(|s| s.name)
            .collect();
        let expected = [
            "Assign",
            "Dot",
            "DynamicQuantizeLSTM",
            "Fused",
            "FusedConv",
            "FusedConvInteger",
            "FusedMatMul",
            "MseLoss",
            "Parameter",
            "Reorder",
            "Silu",
            "Variable",
        ];
        assert_eq!(internal, expected);
        for op in ops::catalogue().values() {
            let s = op.schema();
            if matches!(s.family, "fused" | "layout" | "state")
                || (s.family == "source" && s.name != "Constant")
            {
                assert_eq!(s.origin, ops::Origin::Kiln, "{}", s.name);
            }
        }
    }
}
