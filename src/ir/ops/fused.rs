//! Kiln-only ops that only passes create: a convolution or matmul with its epilogue
//! (bias, residual, activation), an integer convolution dequantized with its epilogue,
//! and a chain of elementwise ops as one `Fused` op.
//!
//! Their reference evaluation applies the catalogue's own ops step by step (Conv, then
//! Add, then the activation), rounding where the unfused graph rounds, so a fused graph
//! computes what the graph it came from computes; a backend compiles them into one
//! kernel or loop.
//!
//! The layout pass gives FusedConv a `block` (X, Z and Y in the blocked layout of
//! `layout.rs`) and, for a first layer with few input channels, `plain_x` (X stays
//! plain NCHW while Z and Y are blocked); the reference converts to plain, runs Conv
//! and blocks the result.
use super::conv::CONV_ATTRS;
use super::{layout, leak, lookup, AttrSpec, EvalCtx, InferCtx, Op, OpSchema};
use crate::ir::ops::{InPlace, Origin};
use crate::ir::{Attr, AttrKind, Attrs, DType, TensorType};
use crate::tensor::Tensor;

/// The activations an epilogue may apply, as catalogue ops.
pub const ACTIVATIONS: &[&str] = &[
    "Relu",
    "LeakyRelu",
    "Sigmoid",
    "Tanh",
    "HardSigmoid",
    "Elu",
    "Gelu",
    "Clip",
    "HardSwish",
    "Silu",
    "Mish",
    "Softplus",
    "Softsign",
    "Selu",
    "Celu",
    "ThresholdedRelu",
];

/// `activation` and `activation_attrs` as an op to apply: its name, attributes and the
/// constant inputs after X (Clip's bounds).
struct Activation {
    op: &'static dyn Op,
    attrs: Attrs,
    extra: Vec<Tensor>,
}

fn activation(attrs: &Attrs, dtype: DType) -> Result<Option<Activation>, String> {
    let name = attrs.string_or("activation", "none")?;
    if name == "none" {
        return Ok(None);
    }
    if !ACTIVATIONS.contains(&name) {
        return Err(format!(
            "unknown activation '{name}' (known: none, {})",
            ACTIVATIONS.join(", ")
        ));
    }
    let op = lookup(name).expect("activations are catalogue ops");
    let mut act_attrs = Attrs::new();
    let mut bounds = [None, None];
    for kv in attrs.strings("activation_attrs")?.unwrap_or(&[]) {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("activation_attrs: '{kv}' is not NAME=VALUE"))?;
        if name == "Clip" && (k == "min" || k == "max") {
            let x: f64 = v
                .parse()
                .map_err(|_| format!("activation_attrs: bad {k} '{v}'"))?;
            bounds[(k == "max") as usize] = Some(x);
            continue;
        }
        let spec = op.schema().attrs.iter().find(|s| s.name == k);
        act_attrs.set(k, parse_scalar(k, v, spec.map(|s| s.kind))?);
    }
    op.schema().validate_attrs(&act_attrs)?;
    let extra = if name == "Clip" {
        let lo = bounds[0].unwrap_or(f64::NEG_INFINITY);
        let hi = bounds[1].unwrap_or(f64::INFINITY);
        vec![scalar(dtype, lo)?, scalar(dtype, hi)?]
    } else {
        vec![]
    };
    Ok(Some(Activation {
        op,
        attrs: act_attrs,
        extra,
    }))
}

fn scalar(dtype: DType, v: f64) -> Result<Tensor, String> {
    Tensor::from_f64s(dtype, &[], &[v])
}

/// An attribute value from its text, by the kind the op's schema gives it.
fn parse_scalar(name: &str, v: &str, kind: Option<AttrKind>) -> Result<Attr, String> {
    let bad = || format!("attribute {name}: cannot read '{v}'");
    Ok(match kind {
        Some(AttrKind::Int) => Attr::Int(v.parse().map_err(|_| bad())?),
        Some(AttrKind::Float) => Attr::Float(v.parse().map_err(|_| bad())?),
        Some(AttrKind::String) => Attr::String(v.to_string()),
        Some(k) => return Err(format!("attribute {name}: {k} values cannot be fused")),
        None => return Err(format!("unknown attribute '{name}'")),
    })
}

/// The text of an attribute for `activation_attrs` and `Fused` bodies.
pub(crate) fn scalar_text(a: &Attr) -> Option<String> {
    match a {
        Attr::Int(i) => Some(i.to_string()),
        Attr::Float(f) => Some(format!("{f:?}")),
        Attr::String(s) if !s.contains([' ', ',', ')', '=']) => Some(s.clone()),
        _ => None,
    }
}

/// Applies `op` through its reference evaluation.
fn eval_op(
    op: &dyn Op,
    inputs: &[Option<&Tensor>],
    types: &[Option<&TensorType>],
    attrs: &Attrs,
) -> Result<Tensor, String> {
    let cx = EvalCtx {
        inputs,
        input_types: types,
        attrs,
    };
    op.eval(&cx)?
        .into_iter()
        .next()
        .ok_or_else(|| format!("{} gave no output", op.schema().name))
}

fn infer_op(
    op: &dyn Op,
    cx: &InferCtx<'_>,
    inputs: &[Option<TensorType>],
    consts: &[Option<&Tensor>],
    attrs: &Attrs,
) -> Result<TensorType, String> {
    let sub = InferCtx {
        node_name: cx.node_name,
        inputs,
        consts,
        attrs,
    };
    op.infer(&sub)?
        .into_iter()
        .next()
        .ok_or_else(|| format!("{} infers no output", op.schema().name))
}

/// The epilogue after the main op's output `y`: `+ Z` (input `z`), then the activation.
struct Epilogue;

/// `y + operand`'s type, which must be `y`'s: the operand (a bias, a residual) may
/// broadcast into the output but not widen it. `what` names it in errors.
fn add_into(
    cx: &InferCtx<'_>,
    y: TensorType,
    operand: &TensorType,
    what: &str,
) -> Result<TensorType, String> {
    apply_into("Add", cx, y, operand, what)
}

/// `y op operand`'s type for a binary `op`, which must be `y`'s (as [`add_into`]).
fn apply_into(
    op: &str,
    cx: &InferCtx<'_>,
    y: TensorType,
    operand: &TensorType,
    what: &str,
) -> Result<TensorType, String> {
    let binary = lookup(op).expect("a catalogue op");
    let t = infer_op(
        binary,
        cx,
        &[Some(y.clone()), Some(operand.clone())],
        &[],
        &Attrs::new(),
    )
    .map_err(|e| format!("{what}: {e}"))?;
    if t.shape != y.shape {
        return Err(format!(
            "{what} ({operand}) must not broadcast the output ({y})"
        ));
    }
    Ok(t)
}

/// `y + operand` by the catalogue's Add (`y` when the operand is omitted).
fn add_eval(y: Tensor, operand: Option<&Tensor>) -> Result<Tensor, String> {
    match operand {
        None => Ok(y),
        Some(t) => {
            let add = lookup("Add").expect("Add");
            eval_op(add, &[Some(&y), Some(t)], &[None, None], &Attrs::new())
        }
    }
}

impl Epilogue {
    fn infer(cx: &InferCtx<'_>, y: TensorType, z: usize) -> Result<TensorType, String> {
        let mut y = y;
        if let Some(zt) = cx.opt_input(z) {
            y = add_into(cx, y, zt, "residual Z")?;
        }
        if let Some(act) = activation(cx.attrs, y.dtype)? {
            let mut ins = vec![Some(y.clone())];
            ins.extend(
                act.extra
                    .iter()
                    .map(|t| Some(TensorType::new(t.dtype(), crate::ir::Shape::scalar()))),
            );
            y = infer_op(act.op, cx, &ins, &[], &act.attrs)?;
        }
        Ok(y)
    }

    fn eval(cx: &EvalCtx<'_>, y: Tensor, z: usize) -> Result<Tensor, String> {
        let mut y = add_eval(y, cx.opt_input(z))?;
        if let Some(act) = activation(cx.attrs, y.dtype())? {
            let mut ins = vec![Some(&y)];
            ins.extend(act.extra.iter().map(Some));
            let types = vec![None; ins.len()];
            y = eval_op(act.op, &ins, &types, &act.attrs)?;
        }
        Ok(y)
    }
}

const EPILOGUE_ATTRS: [AttrSpec; 2] = [
    AttrSpec::opt(
        "activation",
        AttrKind::String,
        "none (or Relu, LeakyRelu, Sigmoid, Tanh, HardSigmoid, Elu, Gelu, Clip)",
    ),
    AttrSpec::opt(
        "activation_attrs",
        AttrKind::Strings,
        "the activation's attributes as NAME=VALUE; Clip's bounds as min=, max=",
    ),
];

/// The attributes of `schema` minus the epilogue's: what the main op sees.
fn main_attrs(attrs: &Attrs) -> Attrs {
    let mut a = attrs.clone();
    a.0.remove("activation");
    a.0.remove("activation_attrs");
    a.0.remove("block");
    a.0.remove("plain_x");
    a
}

// ---------------------------------------------------------------- FusedConv

struct FusedConv;

const FUSED_CONV: OpSchema = OpSchema {
    name: "FusedConv",
    family: "fused",
    inputs: &["X", "W", "B?", "Z?"],
    outputs: &["Y"],
    attrs: &[
        AttrSpec::opt("auto_pad", AttrKind::String, "NOTSET"),
        AttrSpec::opt("dilations", AttrKind::Ints, "1 per axis"),
        AttrSpec::opt("group", AttrKind::Int, "1"),
        AttrSpec::opt("kernel_shape", AttrKind::Ints, "W's spatial dims"),
        AttrSpec::opt("pads", AttrKind::Ints, "0"),
        AttrSpec::opt("strides", AttrKind::Ints, "1 per axis"),
        AttrSpec::opt(
            "block",
            AttrKind::Int,
            "0: plain NCHW; b > 0: X, Z and Y blocked by b channels (see Reorder)",
        ),
        AttrSpec::opt(
            "plain_x",
            AttrKind::Int,
            "0; 1 with block > 0: X stays plain NCHW (a first layer's few channels)",
        ),
        EPILOGUE_ATTRS[0],
        EPILOGUE_ATTRS[1],
    ],
    doc: "Kiln-only, made by the fuse-epilogue pass: Y = activation(Conv(X, W, B) + Z). \
          Conv's attributes; Z (the residual) has Y's shape. With block > 0 (the layout \
          pass) X, Z and Y are in the blocked layout, W and B stay plain; with plain_x = 1 \
          too, X stays plain (blocking a 1- or 3-channel image would pad it to b lanes).",
    in_place: InPlace::InputSameShape(3),
    origin: Origin::Kiln,
};

impl Op for FusedConv {
    fn schema(&self) -> &OpSchema {
        &FUSED_CONV
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let conv = lookup("Conv").expect("Conv");
        let (b, plain_x) = conv_block(cx.attrs)?;
        let mut ins: Vec<Option<TensorType>> = cx.inputs[..cx.inputs.len().min(3)].to_vec();
        if b > 0 {
            let c_in = blocked_conv_channels(cx.input(1)?, cx.attrs)?;
            if !plain_x {
                let x = layout::plain_type(cx.input(0)?, b, c_in).map_err(|e| format!("X: {e}"))?;
                ins[0] = Some(x);
            }
        }
        let consts = &cx.consts[..cx.consts.len().min(3)];
        let mut y = infer_op(conv, cx, &ins, consts, &main_attrs(cx.attrs))?;
        if b > 0 {
            y = layout::blocked_type(&y, b)?;
        }
        Ok(vec![Epilogue::infer(cx, y, 3)?])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let conv = lookup("Conv").expect("Conv");
        let (b, plain_x) = conv_block(cx.attrs)?;
        let n = cx.inputs.len().min(3);
        let attrs = main_attrs(cx.attrs);
        if b == 0 {
            let y = eval_op(conv, &cx.inputs[..n], &cx.input_types[..n], &attrs)?;
            return Ok(vec![Epilogue::eval(cx, y, 3)?]);
        }
        // The reference for the blocked form: plain X, plain conv, blocked Y.
        let w = cx.input(1)?;
        let group = usize::try_from(cx.attrs.int_or("group", 1)?).map_err(|_| "negative group")?;
        let c_in = w
            .shape()
            .get(1)
            .copied()
            .ok_or("W needs rank >= 3")?
            .checked_mul(group)
            .ok_or("the channel count overflows")?;
        let x = if plain_x {
            cx.input(0)?.clone()
        } else {
            layout::unblock(cx.input(0)?, b, c_in)?
        };
        let mut ins: Vec<Option<&Tensor>> = cx.inputs[..n].to_vec();
        ins[0] = Some(&x);
        let y = eval_op(conv, &ins, &vec![None; n], &attrs)?;
        Ok(vec![Epilogue::eval(cx, layout::block(&y, b)?, 3)?])
    }
}

/// FusedConv's `block` (0 = plain) and whether X stays plain (`plain_x`).
fn conv_block(attrs: &Attrs) -> Result<(usize, bool), String> {
    let b = match attrs.int_or("block", 0)? {
        b if (0..=1024).contains(&b) => b as usize,
        b => return Err(format!("block must be 0 to 1024, got {b}")),
    };
    match attrs.int_or("plain_x", 0)? {
        0 => Ok((b, false)),
        1 if b > 0 => Ok((b, true)),
        1 => Err("plain_x = 1 needs block > 0 (a plain conv's X is plain anyway)".into()),
        v => Err(format!("plain_x must be 0 or 1, got {v}")),
    }
}

/// X's channel count for a blocked conv: W's axis 1 (input channels per group) times
/// the groups (group 1, one channel per group, or groups of whole blocks).
fn blocked_conv_channels(w: &TensorType, attrs: &Attrs) -> Result<usize, String> {
    let group = attrs.int_or("group", 1)?;
    let group = usize::try_from(group)
        .ok()
        .filter(|&g| g > 0)
        .ok_or_else(|| format!("group must be positive, got {group}"))?;
    let c = w
        .shape
        .dim(1)
        .fixed()
        .filter(|_| w.rank() >= 3)
        .ok_or_else(|| format!("W ({w}) needs static channel axes"))?;
    c.checked_mul(group)
        .ok_or_else(|| format!("{c} channels × group {group} overflows"))
}

// ---------------------------------------------------------------- FusedMatMul

struct FusedMatMul;

const FUSED_MATMUL: OpSchema = OpSchema {
    name: "FusedMatMul",
    family: "fused",
    inputs: &["A", "B", "bias?", "Z?"],
    outputs: &["Y"],
    attrs: &[
        AttrSpec::opt("transA", AttrKind::Int, "0"),
        AttrSpec::opt("transB", AttrKind::Int, "0"),
        EPILOGUE_ATTRS[0],
        EPILOGUE_ATTRS[1],
    ],
    doc: "Kiln-only, made by the simplify and fuse-epilogue passes: Y = activation(\
          MatMul(A', B') + bias + Z), where A' and B' are A and B with their last two \
          axes swapped if transA / transB. bias broadcasts to the product; Z has Y's shape.",
    in_place: InPlace::No,
    origin: Origin::Kiln,
};

/// `t` with its last two axes swapped.
fn swap_last_type(t: &TensorType) -> Result<TensorType, String> {
    let r = t.rank();
    if r < 2 {
        return Err(format!("a transposed operand needs rank >= 2, got {t}"));
    }
    let mut t = t.clone();
    t.shape.axes.swap(r - 2, r - 1);
    Ok(t)
}

fn swap_last(t: &Tensor) -> Result<Tensor, String> {
    let r = t.rank();
    if r < 2 {
        return Err(format!("a transposed operand needs rank >= 2, got {r}"));
    }
    let mut perm: Vec<i64> = (0..r as i64).collect();
    perm.swap(r - 2, r - 1);
    let transpose = lookup("Transpose").expect("Transpose");
    eval_op(
        transpose,
        &[Some(t)],
        &[None],
        &Attrs::new().with("perm", Attr::Ints(perm)),
    )
}

impl Op for FusedMatMul {
    fn schema(&self) -> &OpSchema {
        &FUSED_MATMUL
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let mut ab = [cx.input(0)?.clone(), cx.input(1)?.clone()];
        for (i, flag) in ["transA", "transB"].iter().enumerate() {
            if cx.attrs.int_or(flag, 0)? != 0 {
                ab[i] = swap_last_type(&ab[i])?;
            }
        }
        let matmul = lookup("MatMul").expect("MatMul");
        let [a, b] = ab;
        let mut y = infer_op(matmul, cx, &[Some(a), Some(b)], &[], &Attrs::new())?;
        if let Some(bias) = cx.opt_input(2) {
            y = add_into(cx, y, bias, "bias")?;
        }
        Ok(vec![Epilogue::infer(cx, y, 3)?])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let mut ab = [cx.input(0)?.clone(), cx.input(1)?.clone()];
        for (i, flag) in ["transA", "transB"].iter().enumerate() {
            if cx.attrs.int_or(flag, 0)? != 0 {
                ab[i] = swap_last(&ab[i])?;
            }
        }
        let matmul = lookup("MatMul").expect("MatMul");
        let y = eval_op(
            matmul,
            &[Some(&ab[0]), Some(&ab[1])],
            &[None, None],
            &Attrs::new(),
        )?;
        let y = add_eval(y, cx.opt_input(2))?;
        Ok(vec![Epilogue::eval(cx, y, 3)?])
    }
}

// ---------------------------------------------------------------- FusedConvInteger

struct FusedConvInteger;

const FUSED_CONV_INTEGER: OpSchema = OpSchema {
    name: "FusedConvInteger",
    family: "fused",
    inputs: &[
        "x",
        "w",
        "x_zero_point?",
        "w_zero_point?",
        "bias?",
        "scale",
        "Z?",
    ],
    outputs: &["Y"],
    attrs: &[
        CONV_ATTRS[0],
        CONV_ATTRS[1],
        CONV_ATTRS[2],
        CONV_ATTRS[3],
        CONV_ATTRS[4],
        CONV_ATTRS[5],
        EPILOGUE_ATTRS[0],
        EPILOGUE_ATTRS[1],
    ],
    doc: "Kiln-only, made by the fuse-quant pass: a dynamically quantized convolution \
          dequantized, Y = activation(f32(ConvInteger(x, w, x_zero_point, w_zero_point) + \
          bias) * scale + Z). ConvInteger's attributes; bias is i32 and broadcasts into \
          the integer output, scale is f32 and broadcasts into Y, Z has Y's shape.",
    in_place: InPlace::No,
    origin: Origin::Kiln,
};

/// The catalogue's `Cast` to f32.
fn cast_f32_attrs() -> Attrs {
    Attrs::new().with("to", Attr::String("f32".into()))
}

impl Op for FusedConvInteger {
    fn schema(&self) -> &OpSchema {
        &FUSED_CONV_INTEGER
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let conv = lookup("ConvInteger").expect("ConvInteger");
        let n = cx.inputs.len().min(4);
        let mut y = infer_op(
            conv,
            cx,
            &cx.inputs[..n],
            &cx.consts[..cx.consts.len().min(4)],
            &main_attrs(cx.attrs),
        )?;
        if let Some(bias) = cx.opt_input(4) {
            y = add_into(cx, y, bias, "bias")?;
        }
        let cast = lookup("Cast").expect("Cast");
        y = infer_op(cast, cx, &[Some(y)], &[], &cast_f32_attrs())?;
        let scaled = apply_into("Mul", cx, y, cx.input(5)?, "scale")?;
        Ok(vec![Epilogue::infer(cx, scaled, 6)?])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let conv = lookup("ConvInteger").expect("ConvInteger");
        let n = cx.inputs.len().min(4);
        let y = eval_op(
            conv,
            &cx.inputs[..n],
            &cx.input_types[..cx.input_types.len().min(4)],
            &main_attrs(cx.attrs),
        )?;
        let y = add_eval(y, cx.opt_input(4))?;
        let cast = lookup("Cast").expect("Cast");
        let y = eval_op(cast, &[Some(&y)], &[None], &cast_f32_attrs())?;
        let mul = lookup("Mul").expect("Mul");
        let y = eval_op(
            mul,
            &[Some(&y), Some(cx.input(5)?)],
            &[None, None],
            &Attrs::new(),
        )?;
        Ok(vec![Epilogue::eval(cx, y, 6)?])
    }
}

// ---------------------------------------------------------------- Fused

/// One step of a `Fused` body: `Op(i0, t1, _) name=value ...`.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub op: String,
    pub args: Vec<Option<Arg>>,
    pub attrs: Attrs,
}

/// A step's operand: an input of the fused node or an earlier step's result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg {
    Input(usize),
    Step(usize),
}

impl Step {
    /// The body text of this step.
    pub(crate) fn text(&self) -> Result<String, String> {
        let args: Vec<String> = self
            .args
            .iter()
            .map(|a| match a {
                None => "_".to_string(),
                Some(Arg::Input(i)) => format!("i{i}"),
                Some(Arg::Step(i)) => format!("t{i}"),
            })
            .collect();
        let mut s = format!("{}({})", self.op, args.join(", "));
        for (k, v) in self.attrs.iter() {
            let v = scalar_text(v).ok_or_else(|| format!("attribute {k} cannot be fused"))?;
            s.push_str(&format!(" {k}={v}"));
        }
        Ok(s)
    }

    fn parse(text: &str, index: usize, n_inputs: usize) -> Result<Step, String> {
        let bad = |why: &str| format!("body step {index} '{text}': {why}");
        let open = text.find('(').ok_or_else(|| bad("expected Op(args)"))?;
        let close = text.find(')').ok_or_else(|| bad("expected ')'"))?;
        let op = text[..open].trim();
        let schema = lookup(op)
            .ok_or_else(|| bad("not a catalogue op"))?
            .schema();
        if schema.family != "elementwise" {
            return Err(bad("only elementwise ops can be fused"));
        }
        let mut args = vec![];
        for a in text[open + 1..close]
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
        {
            let parsed = if a == "_" {
                None
            } else {
                let not_an_operand = || bad(&format!("operand '{a}' is not iN, tN or _"));
                let (step, k) = match (a.strip_prefix('i'), a.strip_prefix('t')) {
                    (Some(k), _) => (false, k),
                    (_, Some(k)) => (true, k),
                    _ => return Err(not_an_operand()),
                };
                let k: usize = k.parse().map_err(|_| not_an_operand())?;
                Some(match step {
                    false if k < n_inputs => Arg::Input(k),
                    true if k < index => Arg::Step(k),
                    _ => return Err(bad(&format!("operand {a} does not exist here"))),
                })
            };
            args.push(parsed);
        }
        let mut attrs = Attrs::new();
        for kv in text[close + 1..].split_whitespace() {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| bad("attributes are NAME=VALUE"))?;
            let kind = schema.attrs.iter().find(|s| s.name == k).map(|s| s.kind);
            attrs.set(k, parse_scalar(k, v, kind).map_err(|e| bad(&e))?);
        }
        schema.validate_attrs(&attrs).map_err(|e| bad(&e))?;
        Ok(Step {
            op: op.to_string(),
            args,
            attrs,
        })
    }
}

/// The steps a `Fused` node also exports, as outputs 1, 2, …: its `outputs` attribute,
/// checked against a body of `steps` steps (each an earlier step than the last, once).
pub(crate) fn exported_steps(attrs: &Attrs, steps: usize) -> Result<Vec<usize>, String> {
    let Some(list) = attrs.ints("outputs")? else {
        return Ok(vec![]);
    };
    let mut seen = vec![];
    for &k in list {
        if k < 0 || k as usize + 1 >= steps {
            return Err(format!(
                "outputs names step {k}, which is not a step before the last of {steps}"
            ));
        }
        if seen.contains(&(k as usize)) {
            return Err(format!("outputs names step {k} twice"));
        }
        seen.push(k as usize);
    }
    Ok(seen)
}

/// The steps of a `Fused` node's `body`.
pub(crate) fn body(attrs: &Attrs, n_inputs: usize) -> Result<Vec<Step>, String> {
    let lines = attrs
        .strings("body")?
        .ok_or("missing required attribute 'body'")?;
    if lines.is_empty() {
        return Err("the body has no steps".into());
    }
    lines
        .iter()
        .enumerate()
        .map(|(i, l)| Step::parse(l, i, n_inputs))
        .collect()
}

struct Fused;

const FUSED: OpSchema = OpSchema {
    name: "Fused",
    family: "fused",
    inputs: &["inputs..."],
    outputs: &["output", "exported..."],
    attrs: &[
        AttrSpec::req("body", AttrKind::Strings),
        AttrSpec::opt("outputs", AttrKind::Ints, "none"),
    ],
    doc: "Kiln-only, made by the fuse-elementwise pass: a chain of elementwise ops as one \
          op. body lists the steps, each `Op(args) name=value ...` with operands iN (input \
          N), tN (step N's result) or _ (omitted); the last step is output 0, and the steps \
          listed in outputs are outputs 1, 2, … (results that other nodes read too). A \
          backend compiles it into one loop over the output.",
    in_place: InPlace::AnySameShape,
    origin: Origin::Kiln,
};

impl Op for Fused {
    fn schema(&self) -> &OpSchema {
        &FUSED
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let steps = body(cx.attrs, cx.inputs.len())?;
        let mut results: Vec<TensorType> = vec![];
        for (i, step) in steps.iter().enumerate() {
            let mut types = vec![];
            let mut consts = vec![];
            for a in &step.args {
                match a {
                    None => {
                        types.push(None);
                        consts.push(None);
                    }
                    Some(Arg::Input(k)) => {
                        types.push(Some(cx.input(*k)?.clone()));
                        consts.push(cx.const_input(*k));
                    }
                    Some(Arg::Step(k)) => {
                        types.push(Some(results[*k].clone()));
                        consts.push(None);
                    }
                }
            }
            let op = lookup(&step.op).expect("parsed");
            let t = infer_op(op, cx, &types, &consts, &step.attrs)
                .map_err(|e| format!("body step {i} ({}): {e}", step.op))?;
            results.push(t);
        }
        exported(results, cx.attrs)
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let steps = body(cx.attrs, cx.inputs.len())?;
        let mut results: Vec<Tensor> = vec![];
        for step in &steps {
            let mut ins: Vec<Option<&Tensor>> = vec![];
            let mut types: Vec<Option<&TensorType>> = vec![];
            for a in &step.args {
                match a {
                    None => {
                        ins.push(None);
                        types.push(None);
                    }
                    Some(Arg::Input(k)) => {
                        ins.push(Some(cx.input(*k)?));
                        types.push(cx.input_types.get(*k).copied().flatten());
                    }
                    Some(Arg::Step(k)) => {
                        ins.push(Some(&results[*k]));
                        types.push(None);
                    }
                }
            }
            let op = lookup(&step.op).expect("parsed");
            let t = eval_op(op, &ins, &types, &step.attrs)?;
            results.push(t);
        }
        exported(results, cx.attrs)
    }
}

/// Output 0 (the last step's result) and then the exported steps' results.
fn exported<T: Clone>(mut results: Vec<T>, attrs: &Attrs) -> Result<Vec<T>, String> {
    let extra = exported_steps(attrs, results.len())?;
    let mut outs = vec![results.pop().expect("non-empty body")];
    outs.extend(extra.iter().map(|&k| results[k].clone()));
    Ok(outs)
}

pub(crate) fn ops() -> Vec<&'static dyn Op> {
    vec![
        leak(FusedConv),
        leak(FusedMatMul),
        leak(FusedConvInteger),
        leak(Fused),
    ]
}
