//! Elementwise ops: unary math, binary arithmetic/comparison/logic with numpy
//! broadcasting, variadic Sum/Mean/Max/Min, Where and Clip.
//!
//! Reference semantics: floats compute in f64 and round once to their dtype; integers
//! compute in i64 and wrap to theirs (see `Tensor::to_f64_array`).
use crate::ir::ops::{InPlace, Origin};
use ndarray::{ArrayD, IxDyn, Zip};

use super::util::{out, same_dtype};
use super::{leak, AttrSpec, EvalCtx, InferCtx, Op, OpSchema};
use crate::ir::shape::broadcast_shapes;
use crate::ir::{AttrKind, Attrs, DType, Shape, TensorType};
use crate::tensor::Tensor;

// ---------------------------------------------------------------- unary

/// Up to three float parameters read from attributes once per node.
type Params = [f64; 3];

/// An integer kernel that may fail (division by zero).
type IntFn = fn(i64, i64) -> Result<i64, String>;

struct Unary {
    schema: OpSchema,
    /// Which input dtypes are accepted, and how that set is described in errors.
    accepts: (fn(DType) -> bool, &'static str),
    params: fn(&Attrs) -> Result<Params, String>,
    float: fn(f64, &Params) -> f64,
    /// The integer form, for ops ONNX defines on integers (Neg, Abs, Sign, Relu).
    int: Option<fn(i64) -> i64>,
    /// Some(Bool) for predicates (IsNaN, IsInf): the output dtype when it is not the input's.
    out_dtype: Option<DType>,
    /// The f32 form, for ops whose result on f32 follows the ONNX reference's arithmetic
    /// step by step in f32 rather than rounding the exact value once (see `sigmoid_f32`).
    f32: Option<fn(f32) -> f32>,
}

fn no_params(_: &Attrs) -> Result<Params, String> {
    Ok([0.0; 3])
}

fn is_float(d: DType) -> bool {
    d.is_float()
}
fn is_signed_numeric(d: DType) -> bool {
    d.is_float() || (d.is_int() && d.is_signed())
}
fn is_numeric(d: DType) -> bool {
    d.is_numeric()
}
fn is_bool(d: DType) -> bool {
    d == DType::Bool
}

const FLOAT: (fn(DType) -> bool, &str) = (is_float, "a float type");
const SIGNED: (fn(DType) -> bool, &str) = (is_signed_numeric, "a float or signed integer type");
const NUMERIC: (fn(DType) -> bool, &str) = (is_numeric, "a numeric type");

impl Op for Unary {
    fn schema(&self) -> &OpSchema {
        &self.schema
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        if !(self.accepts.0)(x.dtype) {
            return Err(format!(
                "input 0 must be {}, got {}",
                self.accepts.1, x.dtype
            ));
        }
        (self.params)(cx.attrs)?;
        Ok(out(self.out_dtype.unwrap_or(x.dtype), x.shape.clone()))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let p = (self.params)(cx.attrs)?;
        let dtype = self.out_dtype.unwrap_or(x.dtype());
        if let (Some(f), Tensor::F32(a)) = (self.f32, x) {
            return Ok(vec![Tensor::F32(a.mapv(f))]);
        }
        let y = match (self.int, x.dtype().is_float()) {
            (Some(fi), false) => Tensor::from_i64_array(dtype, x.to_i64_array().mapv(fi)),
            _ => Tensor::from_f64_array(dtype, x.to_f64_array().mapv(|v| (self.float)(v, &p))),
        };
        Ok(vec![y])
    }
}

/// The schema of an elementwise op of one input `X` and one output `Y`.
fn one_input_schema(name: &'static str, doc: &'static str, attrs: &'static [AttrSpec]) -> OpSchema {
    OpSchema {
        name,
        family: "elementwise",
        inputs: &["X"],
        outputs: &["Y"],
        attrs,
        doc,
        in_place: InPlace::AnySameShape,
        origin: Origin::Onnx,
    }
}

impl Unary {
    fn op(self) -> &'static dyn Op {
        leak(self)
    }

    /// Marks a Kiln extension, which no model may name.
    fn kiln(mut self) -> Unary {
        self.schema.origin = Origin::Kiln;
        self
    }

    fn new(
        name: &'static str,
        doc: &'static str,
        attrs: &'static [AttrSpec],
        accepts: (fn(DType) -> bool, &'static str),
        params: fn(&Attrs) -> Result<Params, String>,
        float: fn(f64, &Params) -> f64,
        int: Option<fn(i64) -> i64>,
    ) -> Unary {
        Unary {
            schema: one_input_schema(name, doc, attrs),
            accepts,
            params,
            float,
            int,
            out_dtype: None,
            f32: None,
        }
    }
}

fn simple(name: &'static str, doc: &'static str, f: fn(f64, &Params) -> f64) -> &'static dyn Op {
    Unary::new(name, doc, &[], FLOAT, no_params, f, None).op()
}

fn alpha(default: f64) -> impl Fn(&Attrs) -> Result<Params, String> {
    move |a| Ok([a.float_or("alpha", default)?, 0.0, 0.0])
}

const ALPHA: &[AttrSpec] = &[AttrSpec::opt("alpha", AttrKind::Float, "see doc")];
const SELU_ATTRS: &[AttrSpec] = &[
    AttrSpec::opt("alpha", AttrKind::Float, "1.67326319217681884765625"),
    AttrSpec::opt("gamma", AttrKind::Float, "1.05070102214813232421875"),
];
const HARD_SIGMOID_ATTRS: &[AttrSpec] = &[
    AttrSpec::opt("alpha", AttrKind::Float, "0.2"),
    AttrSpec::opt("beta", AttrKind::Float, "0.5"),
];
const GELU_ATTRS: &[AttrSpec] = &[AttrSpec::opt("approximate", AttrKind::String, "none")];

/// Sigmoid of an f32 as onnxruntime and the ONNX reference compute it: `1 / (1 + e^-x)`
/// rounded to f32 at each step. It can differ from the exactly rounded value by an ulp,
/// and a dynamically quantized model downstream turns that ulp into a flipped u8 when a
/// quotient lands on a rounding tie; following the reference keeps such models agreeing.
fn sigmoid_f32(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

fn softplus(x: f64) -> f64 {
    // ln(1 + e^x) without overflow for large x.
    if x > 0.0 {
        x + (-x).exp().ln_1p()
    } else {
        x.exp().ln_1p()
    }
}

fn sign(x: f64) -> f64 {
    if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else {
        x // keeps 0, -0 and NaN
    }
}

fn gelu_params(a: &Attrs) -> Result<Params, String> {
    match a.string_or("approximate", "none")? {
        "none" => Ok([0.0; 3]),
        "tanh" => Ok([1.0, 0.0, 0.0]),
        s => Err(format!(
            "attribute 'approximate' must be \"none\" or \"tanh\", got \"{s}\""
        )),
    }
}

fn gelu(x: f64, p: &Params) -> f64 {
    if p[0] == 0.0 {
        0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
    } else {
        let c = (2.0 / std::f64::consts::PI).sqrt();
        0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
    }
}

fn unary_ops() -> Vec<&'static dyn Op> {
    vec![
        Unary::new(
            "Neg",
            "-x.",
            &[],
            SIGNED,
            no_params,
            |x, _| -x,
            Some(i64::wrapping_neg),
        )
        .op(),
        Unary::new(
            "Abs",
            "|x|.",
            &[],
            NUMERIC,
            no_params,
            |x, _| x.abs(),
            Some(i64::wrapping_abs),
        )
        .op(),
        Unary::new(
            "Sign",
            "-1, 0 or 1 by the sign of x (NaN stays NaN).",
            &[],
            NUMERIC,
            no_params,
            |x, _| sign(x),
            Some(i64::signum),
        )
        .op(),
        Unary::new(
            "Relu",
            "max(x, 0).",
            &[],
            SIGNED,
            no_params,
            |x, _| if x > 0.0 || x.is_nan() { x } else { 0.0 },
            Some(|x| x.max(0)),
        )
        .op(),
        simple("Exp", "e^x.", |x, _| x.exp()),
        simple("Log", "ln x (NaN below 0, -inf at 0).", |x, _| x.ln()),
        simple("Sqrt", "√x.", |x, _| x.sqrt()),
        simple("Reciprocal", "1/x.", |x, _| 1.0 / x),
        simple("Tanh", "tanh x.", |x, _| x.tanh()),
        Unary {
            f32: Some(sigmoid_f32),
            ..Unary::new(
                "Sigmoid",
                "1/(1+e^-x).",
                &[],
                FLOAT,
                no_params,
                |x, _| sigmoid(x),
                None,
            )
        }
        .op(),
        simple("Erf", "The error function.", |x, _| libm::erf(x)),
        simple("Sin", "sin x.", |x, _| x.sin()),
        simple("Cos", "cos x.", |x, _| x.cos()),
        simple("Tan", "tan x.", |x, _| x.tan()),
        simple("Asin", "asin x.", |x, _| x.asin()),
        simple("Acos", "acos x.", |x, _| x.acos()),
        simple("Atan", "atan x.", |x, _| x.atan()),
        simple("Sinh", "sinh x.", |x, _| x.sinh()),
        simple("Cosh", "cosh x.", |x, _| x.cosh()),
        simple("Asinh", "asinh x.", |x, _| x.asinh()),
        simple("Acosh", "acosh x.", |x, _| x.acosh()),
        simple("Atanh", "atanh x.", |x, _| x.atanh()),
        simple("Floor", "⌊x⌋.", |x, _| x.floor()),
        simple("Ceil", "⌈x⌉.", |x, _| x.ceil()),
        simple(
            "Round",
            "x rounded to the nearest integer, ties to even.",
            |x, _| x.round_ties_even(),
        ),
        simple("Softplus", "ln(1 + e^x).", |x, _| softplus(x)),
        simple("Softsign", "x / (1 + |x|).", |x, _| x / (1.0 + x.abs())),
        simple("Mish", "x · tanh(softplus(x)).", |x, _| {
            x * softplus(x).tanh()
        }),
        simple("HardSwish", "x · max(0, min(1, x/6 + 1/2)).", |x, _| {
            x * (x / 6.0 + 0.5).clamp(0.0, 1.0)
        }),
        Unary::new(
            "Silu",
            "Kiln-only: x · sigmoid(x) (SiLU), what the recognize pass makes of x * Sigmoid(x).",
            &[],
            FLOAT,
            no_params,
            |x, _| x * sigmoid(x),
            None,
        )
        .kiln()
        .op(),
        Unary::new(
            "LeakyRelu",
            "x if x ≥ 0 else alpha·x; alpha defaults to 0.01.",
            ALPHA,
            FLOAT,
            |a| alpha(0.01)(a),
            |x, p| if x >= 0.0 { x } else { p[0] * x },
            None,
        )
        .op(),
        Unary::new(
            "Elu",
            "x if x ≥ 0 else alpha·(e^x − 1); alpha defaults to 1.",
            ALPHA,
            FLOAT,
            |a| alpha(1.0)(a),
            |x, p| if x >= 0.0 { x } else { p[0] * x.exp_m1() },
            None,
        )
        .op(),
        Unary::new(
            "Celu",
            "max(0, x) + min(0, alpha·(e^(x/alpha) − 1)); alpha defaults to 1.",
            ALPHA,
            FLOAT,
            |a| alpha(1.0)(a),
            |x, p| x.max(0.0) + (p[0] * (x / p[0]).exp_m1()).min(0.0),
            None,
        )
        .op(),
        Unary::new(
            "ThresholdedRelu",
            "x if x > alpha else 0; alpha defaults to 1.",
            ALPHA,
            FLOAT,
            |a| alpha(1.0)(a),
            |x, p| if x > p[0] { x } else { 0.0 },
            None,
        )
        .op(),
        Unary::new(
            "Selu",
            "gamma·(x if x > 0 else alpha·(e^x − 1)); ONNX's defaults.",
            SELU_ATTRS,
            FLOAT,
            |a| {
                Ok([
                    a.float_or("alpha", 1.673_263_192_176_818_8)?,
                    a.float_or("gamma", 1.050_701_022_148_132_3)?,
                    0.0,
                ])
            },
            |x, p| p[1] * if x > 0.0 { x } else { p[0] * x.exp_m1() },
            None,
        )
        .op(),
        Unary::new(
            "HardSigmoid",
            "max(0, min(1, alpha·x + beta)); alpha = 0.2, beta = 0.5 by default.",
            HARD_SIGMOID_ATTRS,
            FLOAT,
            |a| Ok([a.float_or("alpha", 0.2)?, a.float_or("beta", 0.5)?, 0.0]),
            |x, p| (p[0] * x + p[1]).clamp(0.0, 1.0),
            None,
        )
        .op(),
        Unary::new(
            "Gelu",
            "x·Φ(x); approximate = \"tanh\" uses the tanh approximation.",
            GELU_ATTRS,
            FLOAT,
            gelu_params,
            gelu,
            None,
        )
        .op(),
        Unary::new(
            "Not",
            "Logical not of a bool tensor.",
            &[],
            (is_bool, "bool"),
            no_params,
            |x, _| if x == 0.0 { 1.0 } else { 0.0 },
            Some(|x| (x == 0) as i64),
        )
        .op(),
        predicate("IsNaN", "Whether x is NaN.", &[], |x, _| x.is_nan()),
        predicate(
            "IsInf",
            "Whether x is +infinity (if detect_positive) or -infinity (if detect_negative).",
            IS_INF_ATTRS,
            |x, [pos, neg]| (pos && x == f64::INFINITY) || (neg && x == f64::NEG_INFINITY),
        ),
    ]
}

const IS_INF_ATTRS: &[AttrSpec] = &[
    AttrSpec::opt("detect_negative", AttrKind::Int, "1"),
    AttrSpec::opt("detect_positive", AttrKind::Int, "1"),
];

/// A float predicate; `f` gets the value and IsInf's [detect_positive, detect_negative].
type PredicateFn = fn(f64, [bool; 2]) -> bool;

fn predicate(
    name: &'static str,
    doc: &'static str,
    attrs: &'static [AttrSpec],
    f: PredicateFn,
) -> &'static dyn Op {
    leak(Predicate {
        schema: one_input_schema(name, doc, attrs),
        f,
    })
}

struct Predicate {
    schema: OpSchema,
    f: PredicateFn,
}

impl Op for Predicate {
    fn schema(&self) -> &OpSchema {
        &self.schema
    }
    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        super::util::require_dtype(x, 0, is_float, "a float type")?;
        Ok(out(DType::Bool, x.shape.clone()))
    }
    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?.to_f64_array();
        let flags = [
            cx.attrs.int_or("detect_positive", 1)? != 0,
            cx.attrs.int_or("detect_negative", 1)? != 0,
        ];
        Ok(vec![Tensor::Bool(x.mapv(|v| (self.f)(v, flags)))])
    }
}

// ---------------------------------------------------------------- broadcasting helpers

/// The numpy broadcast of runtime shapes, or an error naming both.
pub(crate) fn broadcast_dims(a: &[usize], b: &[usize]) -> Result<Vec<usize>, String> {
    let rank = a.len().max(b.len());
    (0..rank)
        .map(|i| {
            let x = (i + a.len()).checked_sub(rank).map_or(1, |j| a[j]);
            let y = (i + b.len()).checked_sub(rank).map_or(1, |j| b[j]);
            match (x, y) {
                (1, d) | (d, 1) => Ok(d),
                (p, q) if p == q => Ok(p),
                _ => Err(format!("cannot broadcast shapes {a:?} and {b:?}")),
            }
        })
        .collect()
}

/// `f` applied to `a` and `b` broadcast together.
pub(crate) fn zip_broadcast<A: Copy, B: Copy, O>(
    a: &ArrayD<A>,
    b: &ArrayD<B>,
    f: impl Fn(A, B) -> O,
) -> Result<ArrayD<O>, String> {
    let shape = broadcast_dims(a.shape(), b.shape())?;
    let av = a
        .broadcast(IxDyn(&shape))
        .expect("checked by broadcast_dims");
    let bv = b
        .broadcast(IxDyn(&shape))
        .expect("checked by broadcast_dims");
    Ok(Zip::from(&av).and(&bv).map_collect(|&x, &y| f(x, y)))
}

/// Broadcast inference over any number of typed inputs (names checked).
fn broadcast_all(inputs: &[&TensorType]) -> Result<Shape, String> {
    let mut shape = inputs[0].shape.clone();
    for t in &inputs[1..] {
        shape = broadcast_shapes(&shape, &t.shape)?;
    }
    Ok(shape)
}

// ---------------------------------------------------------------- binary

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// Same dtype in and out: float in f64, int in i64.
    Arith,
    /// Numeric in, bool out.
    Compare,
    /// Bool in, bool out.
    Logic,
}

struct Binary {
    schema: OpSchema,
    kind: Kind,
    float: fn(f64, f64) -> f64,
    int: Option<IntFn>,
}

impl Op for Binary {
    fn schema(&self) -> &OpSchema {
        &self.schema
    }

    fn takes(&self) -> super::Takes {
        if self.schema.name == "Equal" {
            super::Takes::Strings
        } else {
            super::Takes::Numeric
        }
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (a, b) = (cx.input(0)?, cx.input(1)?);
        let dtype = same_dtype(self.schema.name, &[a, b])?;
        let ok = match self.kind {
            Kind::Logic => dtype == DType::Bool,
            Kind::Compare => dtype != DType::Bool || self.schema.name == "Equal",
            Kind::Arith => dtype.is_float() || (dtype.is_int() && self.int.is_some()),
        };
        if !ok {
            return Err(format!("{} is not defined for {dtype}", self.schema.name));
        }
        let shape = broadcast_shapes(&a.shape, &b.shape)?;
        Ok(out(
            if self.kind == Kind::Arith {
                dtype
            } else {
                DType::Bool
            },
            shape,
        ))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let (a, b) = (cx.input(0)?, cx.input(1)?);
        if let (Tensor::String(x), Tensor::String(y)) = (a, b) {
            // Only Equal takes strings (see `takes`).
            let (x, y) = (x.map(|s| s.as_str()), y.map(|s| s.as_str()));
            return Ok(vec![Tensor::Bool(zip_broadcast(&x, &y, |p, q| p == q)?)]);
        }
        let dtype = a.dtype();
        let y = match self.kind {
            Kind::Logic => {
                let f = self.float;
                Tensor::Bool(zip_broadcast(
                    &a.to_bool_array(),
                    &b.to_bool_array(),
                    |x, y| f(x as u8 as f64, y as u8 as f64) != 0.0,
                )?)
            }
            Kind::Compare if dtype.is_float() => {
                let f = self.float;
                Tensor::Bool(zip_broadcast(
                    &a.to_f64_array(),
                    &b.to_f64_array(),
                    |x, y| f(x, y) != 0.0,
                )?)
            }
            Kind::Compare => {
                let f = self.int.expect("comparisons have an int form");
                let r = zip_broadcast(&a.to_i64_array(), &b.to_i64_array(), f)?;
                Tensor::Bool(collect_results(r)?.mapv(|v| v != 0))
            }
            Kind::Arith if dtype.is_float() => Tensor::from_f64_array(
                dtype,
                zip_broadcast(&a.to_f64_array(), &b.to_f64_array(), self.float)?,
            ),
            Kind::Arith => {
                let f = self
                    .int
                    .ok_or_else(|| format!("{} is not defined for {dtype}", self.schema.name))?;
                let r = zip_broadcast(&a.to_i64_array(), &b.to_i64_array(), f)?;
                Tensor::from_i64_array(dtype, collect_results(r)?)
            }
        };
        Ok(vec![y])
    }
}

fn collect_results(r: ArrayD<Result<i64, String>>) -> Result<ArrayD<i64>, String> {
    if let Some(Err(e)) = r.iter().find(|v| v.is_err()) {
        return Err(e.clone());
    }
    Ok(r.mapv_into_any(|v| v.unwrap()))
}

fn binary(
    name: &'static str,
    doc: &'static str,
    kind: Kind,
    float: fn(f64, f64) -> f64,
    int: Option<IntFn>,
) -> &'static dyn Op {
    leak(Binary {
        schema: OpSchema {
            name,
            family: "elementwise",
            inputs: &["A", "B"],
            outputs: &["C"],
            attrs: &[],
            doc,
            in_place: InPlace::AnySameShape,
            origin: Origin::Onnx,
        },
        kind,
        float,
        int,
    })
}

fn b2f(b: bool) -> f64 {
    b as u8 as f64
}

fn int_div(x: i64, y: i64) -> Result<i64, String> {
    if y == 0 {
        return Err("integer division by zero".into());
    }
    Ok(x.wrapping_div(y))
}

fn int_pow(x: i64, y: i64) -> Result<i64, String> {
    if y < 0 {
        // Only 1 and -1 have integer reciprocals; everything else truncates to 0.
        return Ok(match x {
            1 => 1,
            -1 => {
                if y % 2 == 0 {
                    1
                } else {
                    -1
                }
            }
            0 => return Err("0 raised to a negative power".into()),
            _ => 0,
        });
    }
    Ok(x.wrapping_pow(y.min(u32::MAX as i64) as u32))
}

fn binary_ops() -> Vec<&'static dyn Op> {
    vec![
        binary(
            "Add",
            "A + B.",
            Kind::Arith,
            |x, y| x + y,
            Some(|x, y| Ok(x.wrapping_add(y))),
        ),
        binary(
            "Sub",
            "A − B.",
            Kind::Arith,
            |x, y| x - y,
            Some(|x, y| Ok(x.wrapping_sub(y))),
        ),
        binary(
            "Mul",
            "A · B.",
            Kind::Arith,
            |x, y| x * y,
            Some(|x, y| Ok(x.wrapping_mul(y))),
        ),
        binary(
            "Div",
            "A / B; integers truncate toward zero, and dividing by 0 is an error.",
            Kind::Arith,
            |x, y| x / y,
            Some(int_div),
        ),
        binary(
            "Equal",
            "A == B.",
            Kind::Compare,
            |x, y| b2f(x == y),
            Some(|x, y| Ok((x == y) as i64)),
        ),
        binary(
            "Less",
            "A < B.",
            Kind::Compare,
            |x, y| b2f(x < y),
            Some(|x, y| Ok((x < y) as i64)),
        ),
        binary(
            "Greater",
            "A > B.",
            Kind::Compare,
            |x, y| b2f(x > y),
            Some(|x, y| Ok((x > y) as i64)),
        ),
        binary(
            "LessOrEqual",
            "A <= B.",
            Kind::Compare,
            |x, y| b2f(x <= y),
            Some(|x, y| Ok((x <= y) as i64)),
        ),
        binary(
            "GreaterOrEqual",
            "A >= B.",
            Kind::Compare,
            |x, y| b2f(x >= y),
            Some(|x, y| Ok((x >= y) as i64)),
        ),
        binary(
            "And",
            "A ∧ B (bool).",
            Kind::Logic,
            |x, y| b2f(x != 0.0 && y != 0.0),
            None,
        ),
        binary(
            "Or",
            "A ∨ B (bool).",
            Kind::Logic,
            |x, y| b2f(x != 0.0 || y != 0.0),
            None,
        ),
        binary(
            "Xor",
            "A ⊕ B (bool).",
            Kind::Logic,
            |x, y| b2f((x != 0.0) != (y != 0.0)),
            None,
        ),
        leak(Pow),
        leak(Mod),
        leak(PRelu),
        variadic(
            "Sum",
            "The elementwise sum of one or more inputs (broadcast).",
            |v| v.iter().sum(),
            |v| v.iter().fold(0i64, |s, &x| s.wrapping_add(x)),
        ),
        variadic(
            "Mean",
            "The elementwise mean of one or more float inputs (broadcast).",
            |v| v.iter().sum::<f64>() / v.len() as f64,
            |_| unreachable!("Mean is float-only"),
        ),
        variadic(
            "Max",
            "The elementwise maximum of one or more inputs (broadcast); NaN wins.",
            |v| v.iter().copied().fold(f64::NEG_INFINITY, nan_max),
            |v| *v.iter().max().unwrap(),
        ),
        variadic(
            "Min",
            "The elementwise minimum of one or more inputs (broadcast); NaN wins.",
            |v| v.iter().copied().fold(f64::INFINITY, nan_min),
            |v| *v.iter().min().unwrap(),
        ),
    ]
}

fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

fn nan_min(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.min(b)
    }
}

/// `Pow(X, Y)`: Y may be of another numeric dtype (ONNX's T1); the result has X's dtype.
struct Pow;

const POW: OpSchema = OpSchema {
    name: "Pow",
    family: "elementwise",
    inputs: &["X", "Y"],
    outputs: &["Z"],
    attrs: &[],
    doc: "X^Y; Y may have another numeric dtype. Integer X with negative Y truncates.",
    in_place: InPlace::AnySameShape,
    origin: Origin::Onnx,
};

impl Op for Pow {
    fn schema(&self) -> &OpSchema {
        &POW
    }
    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (x, y) = (cx.input(0)?, cx.input(1)?);
        super::util::require_dtype(x, 0, is_numeric, "a numeric type")?;
        super::util::require_dtype(y, 1, is_numeric, "a numeric type")?;
        Ok(out(x.dtype, broadcast_shapes(&x.shape, &y.shape)?))
    }
    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let (x, y) = (cx.input(0)?, cx.input(1)?);
        let z = if x.dtype().is_float() {
            Tensor::from_f64_array(
                x.dtype(),
                zip_broadcast(&x.to_f64_array(), &y.to_f64_array(), f64::powf)?,
            )
        } else if y.dtype().is_float() {
            let r = zip_broadcast(&x.to_f64_array(), &y.to_f64_array(), f64::powf)?;
            Tensor::from_f64_array(x.dtype(), r)
        } else {
            let r = zip_broadcast(&x.to_i64_array(), &y.to_i64_array(), int_pow)?;
            Tensor::from_i64_array(x.dtype(), collect_results(r)?)
        };
        Ok(vec![z])
    }
}

/// `Mod(A, B)`: with `fmod = 0` the result takes the divisor's sign, as Python's `%`;
/// with `fmod = 1` the dividend's, as C's `fmod`.
struct Mod;

const MOD: OpSchema = OpSchema {
    name: "Mod",
    family: "elementwise",
    inputs: &["A", "B"],
    outputs: &["C"],
    attrs: &[AttrSpec::opt("fmod", AttrKind::Int, "0")],
    doc: "Remainder. fmod = 0: sign of the divisor (Python's %); fmod = 1: sign of the dividend (C's fmod).",
    in_place: InPlace::AnySameShape,
    origin: Origin::Onnx,
};

impl Op for Mod {
    fn schema(&self) -> &OpSchema {
        &MOD
    }
    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (a, b) = (cx.input(0)?, cx.input(1)?);
        let dtype = same_dtype("Mod", &[a, b])?;
        let fmod = cx.attrs.int_or("fmod", 0)?;
        if !dtype.is_numeric() {
            return Err(format!("Mod is not defined for {dtype}"));
        }
        if fmod != 0 && fmod != 1 {
            return Err(format!("attribute 'fmod' must be 0 or 1, got {fmod}"));
        }
        Ok(out(dtype, broadcast_shapes(&a.shape, &b.shape)?))
    }
    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let (a, b) = (cx.input(0)?, cx.input(1)?);
        let fmod = cx.attrs.int_or("fmod", 0)? == 1;
        let c = if a.dtype().is_float() {
            Tensor::from_f64_array(
                a.dtype(),
                zip_broadcast(&a.to_f64_array(), &b.to_f64_array(), |x, y| {
                    let r = x % y;
                    // numpy's mod: a nonzero remainder takes the divisor's sign.
                    if !fmod && r != 0.0 && (r < 0.0) != (y < 0.0) {
                        r + y
                    } else {
                        r
                    }
                })?,
            )
        } else {
            let r = zip_broadcast(&a.to_i64_array(), &b.to_i64_array(), |x, y| {
                if y == 0 {
                    return Err("integer modulo by zero".to_string());
                }
                let r = x.wrapping_rem(y);
                Ok(if !fmod && r != 0 && (r < 0) != (y < 0) {
                    r + y
                } else {
                    r
                })
            })?;
            Tensor::from_i64_array(a.dtype(), collect_results(r)?)
        };
        Ok(vec![c])
    }
}

/// `PRelu(X, slope)`: x if x ≥ 0 else slope·x, slope broadcast to X.
struct PRelu;

const PRELU: OpSchema = OpSchema {
    name: "PRelu",
    family: "elementwise",
    inputs: &["X", "slope"],
    outputs: &["Y"],
    attrs: &[],
    doc: "x if x ≥ 0 else slope·x; slope broadcasts to X.",
    in_place: InPlace::AnySameShape,
    origin: Origin::Onnx,
};

impl Op for PRelu {
    fn schema(&self) -> &OpSchema {
        &PRELU
    }
    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (x, s) = (cx.input(0)?, cx.input(1)?);
        let dtype = same_dtype("PRelu", &[x, s])?;
        super::util::require_dtype(x, 0, is_float, "a float type")?;
        let shape = broadcast_shapes(&x.shape, &s.shape)?;
        if shape.dims() != x.shape.dims() {
            return Err(format!("slope {} must broadcast to X {}", s.shape, x.shape));
        }
        Ok(out(dtype, shape))
    }
    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let (x, s) = (cx.input(0)?, cx.input(1)?);
        let y = zip_broadcast(&x.to_f64_array(), &s.to_f64_array(), |x, a| {
            if x >= 0.0 {
                x
            } else {
                a * x
            }
        })?;
        Ok(vec![Tensor::from_f64_array(x.dtype(), y)])
    }
}

/// Sum, Mean, Max, Min: one or more same-dtype inputs, broadcast together.
struct Variadic {
    schema: OpSchema,
    float: fn(&[f64]) -> f64,
    int: fn(&[i64]) -> i64,
}

fn variadic(
    name: &'static str,
    doc: &'static str,
    float: fn(&[f64]) -> f64,
    int: fn(&[i64]) -> i64,
) -> &'static dyn Op {
    leak(Variadic {
        schema: OpSchema {
            name,
            family: "elementwise",
            inputs: &["data_0..."],
            outputs: &["result"],
            attrs: &[],
            doc,
            in_place: InPlace::AnySameShape,
            origin: Origin::Onnx,
        },
        float,
        int,
    })
}

impl Op for Variadic {
    fn schema(&self) -> &OpSchema {
        &self.schema
    }
    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let inputs: Vec<&TensorType> = (0..cx.inputs.len())
            .map(|i| cx.input(i))
            .collect::<Result<_, _>>()?;
        if inputs.is_empty() {
            return Err(format!("{} needs at least one input", self.schema.name));
        }
        let dtype = same_dtype(self.schema.name, &inputs)?;
        let ok = if self.schema.name == "Mean" {
            dtype.is_float()
        } else {
            dtype.is_numeric()
        };
        if !ok {
            return Err(format!("{} is not defined for {dtype}", self.schema.name));
        }
        Ok(out(dtype, broadcast_all(&inputs)?))
    }
    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let inputs: Vec<&Tensor> = (0..cx.inputs.len())
            .map(|i| cx.input(i))
            .collect::<Result<_, _>>()?;
        let dtype = inputs[0].dtype();
        let mut shape = inputs[0].shape().to_vec();
        for t in &inputs[1..] {
            shape = broadcast_dims(&shape, t.shape())?;
        }
        let y = if dtype.is_float() {
            let arrays: Vec<ArrayD<f64>> = inputs.iter().map(|t| t.to_f64_array()).collect();
            let views: Vec<_> = arrays
                .iter()
                .map(|a| a.broadcast(IxDyn(&shape)).unwrap())
                .collect();
            let r = ArrayD::from_shape_fn(IxDyn(&shape), |ix| {
                let vals: Vec<f64> = views.iter().map(|v| v[&ix]).collect();
                (self.float)(&vals)
            });
            Tensor::from_f64_array(dtype, r)
        } else {
            let arrays: Vec<ArrayD<i64>> = inputs.iter().map(|t| t.to_i64_array()).collect();
            let views: Vec<_> = arrays
                .iter()
                .map(|a| a.broadcast(IxDyn(&shape)).unwrap())
                .collect();
            let r = ArrayD::from_shape_fn(IxDyn(&shape), |ix| {
                let vals: Vec<i64> = views.iter().map(|v| v[&ix]).collect();
                (self.int)(&vals)
            });
            Tensor::from_i64_array(dtype, r)
        };
        Ok(vec![y])
    }
}

// ---------------------------------------------------------------- Where, Clip

struct Where;

const WHERE: OpSchema = OpSchema {
    name: "Where",
    family: "elementwise",
    inputs: &["condition", "X", "Y"],
    outputs: &["output"],
    attrs: &[],
    doc: "X where condition else Y; all three broadcast together.",
    in_place: InPlace::AnySameShape,
    origin: Origin::Onnx,
};

impl Op for Where {
    fn takes(&self) -> crate::ir::ops::Takes {
        crate::ir::ops::Takes::MovedStrings
    }
    fn schema(&self) -> &OpSchema {
        &WHERE
    }
    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (c, x, y) = (cx.input(0)?, cx.input(1)?, cx.input(2)?);
        super::util::require_dtype(c, 0, is_bool, "bool")?;
        let dtype = same_dtype("Where", &[x, y])?;
        Ok(out(dtype, broadcast_all(&[c, x, y])?))
    }
    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let c = cx.input(0)?.expect::<bool>()?;
        let (x, y) = (cx.input(1)?, cx.input(2)?);
        fn pick<T: crate::tensor::Elem>(
            c: &ArrayD<bool>,
            x: &ArrayD<T>,
            y: &Tensor,
        ) -> Result<ArrayD<T>, String> {
            let y = y.expect::<T>()?;
            let shape = broadcast_dims(&broadcast_dims(c.shape(), x.shape())?, y.shape())?;
            let (c, x, y) = (
                c.broadcast(IxDyn(&shape)).unwrap(),
                x.broadcast(IxDyn(&shape)).unwrap(),
                y.broadcast(IxDyn(&shape)).unwrap(),
            );
            Ok(Zip::from(&c)
                .and(&x)
                .and(&y)
                .map_collect(|&c, &x, &y| if c { x } else { y }))
        }
        let r: Result<Tensor, String> =
            crate::match_tensor!(x, xa => pick(c, xa, y).map(crate::tensor::Elem::wrap));
        Ok(vec![r?])
    }
}

struct Clip;

const CLIP: OpSchema = OpSchema {
    name: "Clip",
    family: "elementwise",
    inputs: &["input", "min?", "max?"],
    outputs: &["output"],
    attrs: &[],
    doc: "input limited to [min, max]; min and max are optional scalars of input's dtype.",
    in_place: InPlace::AnySameShape,
    origin: Origin::Onnx,
};

impl Op for Clip {
    fn schema(&self) -> &OpSchema {
        &CLIP
    }
    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        super::util::require_dtype(x, 0, is_numeric, "a numeric type")?;
        for i in 1..3 {
            if let Some(b) = cx.opt_input(i) {
                if b.dtype != x.dtype || b.rank() > 1 || b.num_elements().is_some_and(|n| n != 1) {
                    return Err(format!("input {i} must be a scalar {}, got {b}", x.dtype));
                }
            }
        }
        Ok(out(x.dtype, x.shape.clone()))
    }
    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let bound = |i: usize| -> Result<Option<f64>, String> {
            match cx.opt_input(i) {
                None => Ok(None),
                Some(t) if t.len() == 1 => Ok(Some(t.to_f64_vec()[0])),
                Some(t) => Err(format!("input {i} must hold one value, has {}", t.len())),
            }
        };
        let (lo, hi) = (bound(1)?, bound(2)?);
        let y = if x.dtype().is_float() {
            let (lo, hi) = (lo.unwrap_or(f64::NEG_INFINITY), hi.unwrap_or(f64::INFINITY));
            Tensor::from_f64_array(
                x.dtype(),
                x.to_f64_array()
                    .mapv(|v| if v.is_nan() { v } else { v.max(lo).min(hi) }),
            )
        } else {
            let lo = lo.map_or(i64::MIN, |v| v as i64);
            let hi = hi.map_or(i64::MAX, |v| v as i64);
            Tensor::from_i64_array(x.dtype(), x.to_i64_array().mapv(|v| v.max(lo).min(hi)))
        };
        Ok(vec![y])
    }
}

pub(crate) fn ops() -> Vec<&'static dyn Op> {
    let mut ops = unary_ops();
    ops.extend(binary_ops());
    ops.push(leak(Where));
    ops.push(leak(Clip));
    ops
}
