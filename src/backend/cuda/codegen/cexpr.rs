//! The one table from an elementwise IR op to a CUDA C expression. Every generator
//! (plain elementwise ops, `Fused` bodies, epilogues) asks this table, so an op computes
//! the same way wherever it is fused.
//!
//! Values are f32 (`float`), bool (`bool`, stored as one byte), i32 (`int`) or i64
//! (`long long`); arithmetic is f32 only, comparisons read f32 and give bool, logic is
//! bool, `Cast` converts among the four.
use crate::ir::{Attrs, DType};

/// The type of a value inside a kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    F32,
    Bool,
    I32,
    I64,
}

impl Ty {
    pub(crate) fn of(dtype: DType) -> Option<Ty> {
        Some(match dtype {
            DType::F32 => Ty::F32,
            DType::Bool => Ty::Bool,
            DType::I32 => Ty::I32,
            DType::I64 => Ty::I64,
            _ => return None,
        })
    }

    /// The C type of a value in registers.
    pub(crate) fn value_c(self) -> &'static str {
        match self {
            Ty::F32 => "float",
            Ty::Bool => "bool",
            Ty::I32 => "int",
            Ty::I64 => "long long",
        }
    }

    /// The C type of an element in memory (a bool is one byte, 0 or 1).
    pub(crate) fn mem_c(self) -> &'static str {
        match self {
            Ty::Bool => "unsigned char",
            t => t.value_c(),
        }
    }

    /// `expr` (an element read from memory) as a value.
    pub(crate) fn load(self, expr: &str) -> String {
        match self {
            Ty::Bool => format!("({expr} != 0)"),
            _ => expr.to_string(),
        }
    }

    /// `expr` (a value) as the element stored.
    pub(crate) fn store(self, expr: &str) -> String {
        match self {
            Ty::Bool => format!("(unsigned char)({expr})"),
            _ => expr.to_string(),
        }
    }
}

/// A C expression and its type.
#[derive(Debug, Clone, PartialEq)]
pub struct CVal {
    pub expr: String,
    pub ty: Ty,
}

impl CVal {
    pub(crate) fn new(expr: impl Into<String>, ty: Ty) -> CVal {
        CVal {
            expr: expr.into(),
            ty,
        }
    }

    pub(crate) fn f32(v: f64) -> CVal {
        CVal::new(float_lit(v), Ty::F32)
    }
}

/// `v` rounded to f32 as a C literal that reads back exactly (Rust prints the shortest
/// round-trip form); infinities and NaN through helpers, since NVRTC has no <cmath>.
pub(crate) fn float_lit(v: f64) -> String {
    let f = v as f32;
    if f.is_nan() {
        "kiln_nan()".into()
    } else if f == f32::INFINITY {
        "kiln_inf()".into()
    } else if f == f32::NEG_INFINITY {
        "(-kiln_inf())".into()
    } else {
        let s = format!("{f:e}");
        if s.starts_with('-') {
            format!("({s}f)")
        } else {
            format!("{s}f")
        }
    }
}

/// Device helpers the table's expressions call: included in every generated kernel
/// (`static` so that several kernels may share one translation unit).
pub const PRELUDE: &str = r#"static __device__ __forceinline__ float kiln_inf() { return __int_as_float(0x7f800000); }
static __device__ __forceinline__ float kiln_nan() { return __int_as_float(0x7fffffff); }
static __device__ __forceinline__ bool kiln_isnan(float x) { return x != x; }
/* max/min where NaN wins, as the reference's. */
static __device__ __forceinline__ float kiln_max(float a, float b) { return (b > a || b != b) ? b : a; }
static __device__ __forceinline__ float kiln_min(float a, float b) { return (b < a || b != b) ? b : a; }
static __device__ __forceinline__ float kiln_relu(float x) { return (x > 0.0f || x != x) ? x : 0.0f; }
static __device__ __forceinline__ float kiln_sign(float x) { return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : x); }
static __device__ __forceinline__ float kiln_sigmoid(float x) {
  if (x >= 0.0f) { return 1.0f / (1.0f + expf(-x)); }
  const float e = expf(x);
  return e / (1.0f + e);
}
static __device__ __forceinline__ float kiln_softplus(float x) {
  return x > 0.0f ? x + log1pf(expf(-x)) : log1pf(expf(x));
}
static __device__ __forceinline__ float kiln_gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
static __device__ __forceinline__ float kiln_gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
}
static __device__ __forceinline__ float kiln_clip(float x, float lo, float hi) { return x != x ? x : fminf(fmaxf(x, lo), hi); }
/* Python's % (the sign of the divisor). */
static __device__ __forceinline__ float kiln_pymod(float a, float b) {
  const float r = fmodf(a, b);
  return (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) ? r + b : r;
}
/* float to integer: truncate, saturate, NaN gives 0 (as Cast's reference). */
static __device__ __forceinline__ int kiln_f2i32(float x) {
  return x != x ? 0 : (x >= 2147483648.0f ? 2147483647 : (x <= -2147483648.0f ? (-2147483647 - 1) : (int)x));
}
static __device__ __forceinline__ long long kiln_f2i64(float x) {
  return x != x ? 0ll : (x >= 9.2233720368547758e18f ? 9223372036854775807ll : (x <= -9.2233720368547758e18f ? (-9223372036854775807ll - 1ll) : (long long)x));
}
"#;

fn arity_err(op: &str, want: &str, got: usize) -> String {
    format!("{op} takes {want} operands, got {got}")
}

/// The expression of elementwise op `op` with `attrs` over `args` (None: an omitted
/// optional operand). Ok(None) when the table has no entry for `op`; Err when it has
/// one but not for these operand types (naming what is wrong).
pub(crate) fn elementwise(
    op: &str,
    attrs: &Attrs,
    args: &[Option<CVal>],
) -> Result<Option<CVal>, String> {
    let present: Vec<&CVal> = args.iter().flatten().collect();
    let x = || -> Result<&CVal, String> {
        match args.first() {
            Some(Some(v)) => Ok(v),
            _ => Err(format!("{op}: input 0 is missing")),
        }
    };
    let need = |ty: Ty, what: &str| -> Result<(), String> {
        for (i, a) in args.iter().enumerate() {
            if let Some(a) = a {
                if a.ty != ty {
                    return Err(format!(
                        "{op}: operand {i} is {:?}; the CUDA generator supports {what} here",
                        a.ty
                    ));
                }
            }
        }
        Ok(())
    };
    let f = |e: String| Ok(Some(CVal::new(e, Ty::F32)));
    let b = |e: String| Ok(Some(CVal::new(e, Ty::Bool)));
    let unary_f32 = |template: &str| -> Result<Option<CVal>, String> {
        if present.len() != 1 {
            return Err(arity_err(op, "1", present.len()));
        }
        need(Ty::F32, "f32")?;
        f(template.replace('X', &format!("({})", x()?.expr)))
    };
    let alpha = |default: f64| attrs.float_or("alpha", default);
    match op {
        "Neg" => unary_f32("(-X)"),
        "Abs" => unary_f32("fabsf(X)"),
        "Sign" => unary_f32("kiln_sign(X)"),
        "Relu" => unary_f32("kiln_relu(X)"),
        "Exp" => unary_f32("expf(X)"),
        "Log" => unary_f32("logf(X)"),
        "Sqrt" => unary_f32("sqrtf(X)"),
        "Reciprocal" => unary_f32("(1.0f / X)"),
        "Tanh" => unary_f32("tanhf(X)"),
        "Sigmoid" => unary_f32("kiln_sigmoid(X)"),
        "Erf" => unary_f32("erff(X)"),
        "Sin" => unary_f32("sinf(X)"),
        "Cos" => unary_f32("cosf(X)"),
        "Tan" => unary_f32("tanf(X)"),
        "Asin" => unary_f32("asinf(X)"),
        "Acos" => unary_f32("acosf(X)"),
        "Atan" => unary_f32("atanf(X)"),
        "Sinh" => unary_f32("sinhf(X)"),
        "Cosh" => unary_f32("coshf(X)"),
        "Asinh" => unary_f32("asinhf(X)"),
        "Acosh" => unary_f32("acoshf(X)"),
        "Atanh" => unary_f32("atanhf(X)"),
        "Floor" => unary_f32("floorf(X)"),
        "Ceil" => unary_f32("ceilf(X)"),
        // rintf rounds ties to even in the default rounding mode, as Round does.
        "Round" => unary_f32("rintf(X)"),
        "Softplus" => unary_f32("kiln_softplus(X)"),
        "Softsign" => unary_f32("(X / (1.0f + fabsf(X)))"),
        "Mish" => unary_f32("(X * tanhf(kiln_softplus(X)))"),
        "HardSwish" => unary_f32("(X * fminf(fmaxf(X / 6.0f + 0.5f, 0.0f), 1.0f))"),
        "Silu" => unary_f32("(X / (1.0f + expf(-X)))"),
        "LeakyRelu" => {
            let a = float_lit(alpha(0.01)?);
            unary_f32(&format!("(X >= 0.0f ? X : {a} * X)"))
        }
        "Elu" => {
            let a = float_lit(alpha(1.0)?);
            unary_f32(&format!("(X >= 0.0f ? X : {a} * expm1f(X))"))
        }
        "Celu" => {
            let a = float_lit(alpha(1.0)?);
            unary_f32(&format!(
                "(fmaxf(X, 0.0f) + fminf({a} * expm1f(X / {a}), 0.0f))"
            ))
        }
        "ThresholdedRelu" => {
            let a = float_lit(alpha(1.0)?);
            unary_f32(&format!("(X > {a} ? X : 0.0f)"))
        }
        "Selu" => {
            let a = float_lit(attrs.float_or("alpha", 1.673_263_192_176_818_8)?);
            let g = float_lit(attrs.float_or("gamma", 1.050_701_022_148_132_3)?);
            unary_f32(&format!("({g} * (X > 0.0f ? X : {a} * expm1f(X)))"))
        }
        "HardSigmoid" => {
            let a = float_lit(alpha(0.2)?);
            let bt = float_lit(attrs.float_or("beta", 0.5)?);
            unary_f32(&format!("fminf(fmaxf({a} * X + {bt}, 0.0f), 1.0f)"))
        }
        "Gelu" => match attrs.string_or("approximate", "none")? {
            "none" => unary_f32("kiln_gelu(X)"),
            "tanh" => unary_f32("kiln_gelu_tanh(X)"),
            s => Err(format!("Gelu: unknown approximate '{s}'")),
        },
        "IsNaN" => {
            unary_f32("X")?;
            b(format!("kiln_isnan({})", x()?.expr))
        }
        "IsInf" => {
            unary_f32("X")?;
            let v = &x()?.expr;
            let pos = attrs.int_or("detect_positive", 1)? != 0;
            let neg = attrs.int_or("detect_negative", 1)? != 0;
            b(format!(
                "(({pos} && {v} == kiln_inf()) || ({neg} && {v} == -kiln_inf()))",
                pos = pos as u8,
                neg = neg as u8
            ))
        }
        "Not" => {
            need(Ty::Bool, "bool")?;
            b(format!("(!{})", x()?.expr))
        }
        "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Mod" | "PRelu" => {
            if present.len() != 2 || args.len() != 2 {
                return Err(arity_err(op, "2", present.len()));
            }
            need(Ty::F32, "f32")?;
            let (a, c) = (&present[0].expr, &present[1].expr);
            f(match op {
                "Add" => format!("({a} + {c})"),
                "Sub" => format!("({a} - {c})"),
                "Mul" => format!("({a} * {c})"),
                "Div" => format!("({a} / {c})"),
                "Pow" => format!("powf({a}, {c})"),
                "Mod" if attrs.int_or("fmod", 0)? == 1 => format!("fmodf({a}, {c})"),
                "Mod" => format!("kiln_pymod({a}, {c})"),
                _ => format!("({a} >= 0.0f ? {a} : {c} * {a})"),
            })
        }
        "Sum" | "Mean" | "Max" | "Min" => {
            if present.is_empty() {
                return Err(arity_err(op, "1 or more", 0));
            }
            need(Ty::F32, "f32")?;
            let mut e = present[0].expr.clone();
            for v in &present[1..] {
                e = match op {
                    "Max" => format!("kiln_max({e}, {})", v.expr),
                    "Min" => format!("kiln_min({e}, {})", v.expr),
                    _ => format!("({e} + {})", v.expr),
                };
            }
            if op == "Mean" {
                e = format!("({e} / {})", float_lit(present.len() as f64));
            }
            f(e)
        }
        "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" => {
            if present.len() != 2 {
                return Err(arity_err(op, "2", present.len()));
            }
            let bool_eq = op == "Equal" && present[0].ty == Ty::Bool;
            need(if bool_eq { Ty::Bool } else { Ty::F32 }, "f32")?;
            let c = match op {
                "Equal" => "==",
                "Less" => "<",
                "Greater" => ">",
                "LessOrEqual" => "<=",
                _ => ">=",
            };
            b(format!("({} {c} {})", present[0].expr, present[1].expr))
        }
        "And" | "Or" | "Xor" => {
            if present.len() != 2 {
                return Err(arity_err(op, "2", present.len()));
            }
            need(Ty::Bool, "bool")?;
            let c = match op {
                "And" => "&&",
                "Or" => "||",
                _ => "!=",
            };
            b(format!("({} {c} {})", present[0].expr, present[1].expr))
        }
        "Where" => {
            if present.len() != 3 || args.len() != 3 {
                return Err(arity_err(op, "3", present.len()));
            }
            let (c, t, e) = (present[0], present[1], present[2]);
            if c.ty != Ty::Bool || t.ty != e.ty {
                return Err(format!(
                    "Where: condition must be bool and the branches of one type, got {:?}, {:?}, {:?}",
                    c.ty, t.ty, e.ty
                ));
            }
            Ok(Some(CVal::new(
                format!("({} ? {} : {})", c.expr, t.expr, e.expr),
                t.ty,
            )))
        }
        "Clip" => {
            let v = x()?;
            if v.ty != Ty::F32 {
                return Err(format!(
                    "Clip: input is {:?}; the CUDA generator supports f32 here",
                    v.ty
                ));
            }
            need(Ty::F32, "f32")?;
            let bound = |i: usize, inf: &str| {
                args.get(i)
                    .and_then(|a| a.as_ref())
                    .map_or(inf.to_string(), |a| a.expr.clone())
            };
            f(format!(
                "kiln_clip({}, {}, {})",
                v.expr,
                bound(1, "(-kiln_inf())"),
                bound(2, "kiln_inf()")
            ))
        }
        "Cast" => {
            let v = x()?;
            let to: DType = attrs
                .string_or("to", "")?
                .parse()
                .map_err(|e| format!("Cast: to: {e}"))?;
            let to = Ty::of(to).ok_or_else(|| {
                format!("Cast to {to}: the CUDA generator supports f32, i32, i64 and bool")
            })?;
            let e = &v.expr;
            let expr = match (v.ty, to) {
                (a, b) if a == b => e.clone(),
                (_, Ty::Bool) => format!("({e} != 0)"),
                (Ty::F32, Ty::I32) => format!("kiln_f2i32({e})"),
                (Ty::F32, Ty::I64) => format!("kiln_f2i64({e})"),
                (_, t) => format!("(({}){e})", t.value_c()),
            };
            Ok(Some(CVal::new(expr, to)))
        }
        _ => Ok(None),
    }
}

/// Whether `op` has an entry in the table (for any operand types).
pub(crate) fn covers(op: &str) -> bool {
    let probe = [
        Some(CVal::new("a", Ty::F32)),
        Some(CVal::new("b", Ty::F32)),
        Some(CVal::new("c", Ty::F32)),
    ];
    for n in 0..=3 {
        match elementwise(op, &Attrs::new(), &probe[..n]) {
            Ok(Some(_)) => return true,
            Err(_) => {}
            Ok(None) => return false,
        }
    }
    // Ops that take only other types (Not, And, Where, Cast without `to`) answer Err.
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_round_trip_as_f32() {
        for v in [0.1, -2.5, 1e-30, 3.0, 0.044715, f64::from(f32::MAX)] {
            let s = float_lit(v);
            let body = s.trim_start_matches('(').trim_end_matches(')');
            let parsed: f32 = body.trim_end_matches('f').parse().unwrap();
            assert_eq!(parsed, v as f32, "{s}");
        }
        assert_eq!(float_lit(f64::INFINITY), "kiln_inf()");
    }

    #[test]
    fn covers_ops_of_every_shape() {
        for op in ["Add", "Relu", "Where", "Not", "Cast", "Max", "Clip", "Gelu"] {
            assert!(covers(op), "{op}");
        }
        for op in ["MatMul", "Conv", "Softmax"] {
            assert!(!covers(op), "{op}");
        }
    }
}
