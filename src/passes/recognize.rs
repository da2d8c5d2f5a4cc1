//! Recognition of composite ops from their decomposed forms, as exporters write them:
//!
//! - GELU: `x * 0.5 * (1 + erf(x / sqrt(2)))` (any association, `* (1/sqrt 2)` too) → `Gelu`;
//!   its tanh form `x * 0.5 * (1 + tanh(sqrt(2/π) * (x + 0.044715 x³)))` (x³ as
//!   `x * (x * (x * c))`, `x * x * x * c` or `Pow(x, 3) * c`; what jax2tf and PyTorch write)
//!   → `Gelu` with `approximate = "tanh"`.
//! - Softmax: `exp(x - max(x)) / sum(exp(x - max(x)))` (or without the max) over one
//!   axis → `Softmax`.
//! - LayerNorm: `(x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) * gamma + beta` over
//!   the last axis → `LayerNormalization`.
//!
//! - HardSwish: `x * clip(x + 3, 0, 6) / 6` (or `* (1/6)`, or the `/ 6` on the clip)
//!   and `x * HardSigmoid(x)` with alpha 1/6, beta 1/2 → `HardSwish`.
//! - SiLU: `x * sigmoid(x)` → `Silu`.
//!
//! The composite op computes in f64 and rounds once, so its result is as close to exact
//! as the decomposed graph's or closer.
use super::pattern::{alt, any, const_where, constant, op, splat, Match, NodePat, Pat, Uses};
use super::{replace_node, sweep, Changed, Pass, PassContext};
use crate::error::Result;
use crate::ir::{Attr, Attrs, Graph, Node, NodeId, Value};

pub struct Recognize;

impl Pass for Recognize {
    fn name(&self) -> &'static str {
        "recognize"
    }
    fn summary(&self) -> &'static str {
        "GELU (erf and tanh forms), HardSwish, SiLU, Softmax and LayerNormalization from their decomposed forms"
    }
    fn run(&self, g: &mut Graph, cx: &mut PassContext) -> Result<Changed> {
        let pats = Patterns::new();
        sweep(g, cx, true, |g, uses, id, cx| pats.apply(g, uses, id, cx))
    }
}

fn near(want: f64) -> Pat {
    const_where(move |v| (v - want).abs() <= 1e-6 * want.abs())
}

/// A reduction over one constant axis list, keeping dims.
fn reduce(name: &str, x: Pat, axes: &str) -> NodePat {
    op(name)
        .args(vec![x, constant().capture(axes)])
        .when(|_, n: &Node| n.attrs.int_or("keepdims", 1) == Ok(1))
}

struct Patterns {
    gelu: Pat,
    gelu_tanh: Pat,
    hardswish: Pat,
    silu: Pat,
    softmax: Pat,
    layernorm: Pat,
}

impl Patterns {
    fn new() -> Patterns {
        let x = || any().capture("x");
        // 1 + erf(x / sqrt 2)
        let erf_part = || {
            op("Add")
                .commutative()
                .args(vec![
                    op("Erf")
                        .args(vec![alt(vec![
                            op("Div")
                                .args(vec![x(), near(std::f64::consts::SQRT_2)])
                                .pat(),
                            op("Mul")
                                .commutative()
                                .args(vec![x(), near(std::f64::consts::FRAC_1_SQRT_2)])
                                .pat(),
                        ])])
                        .pat(),
                    splat(1.0),
                ])
                .pat()
        };
        let half = || splat(0.5);
        let mul = |a: Pat, b: Pat| op("Mul").commutative().args(vec![a, b]).pat();
        let gelu = alt(vec![
            mul(mul(x(), half()), erf_part()),
            mul(x(), mul(erf_part(), half())),
            mul(mul(x(), erf_part()), half()),
        ]);
        // 1 + tanh(sqrt(2/π) · (x + 0.044715 x³))
        let c = || near(0.044715);
        let cube = alt(vec![
            mul(x(), mul(x(), mul(x(), c()))),
            mul(mul(mul(x(), x()), x()), c()),
            mul(op("Pow").args(vec![x(), splat(3.0)]).pat(), c()),
        ]);
        let inner = op("Add").commutative().args(vec![x(), cube]).pat();
        let k = near((2.0 / std::f64::consts::PI).sqrt());
        let tanh_part = || {
            op("Add")
                .commutative()
                .args(vec![
                    op("Tanh").args(vec![mul(inner.clone(), k.clone())]).pat(),
                    splat(1.0),
                ])
                .pat()
        };
        let gelu_tanh = alt(vec![
            mul(mul(x(), half()), tanh_part()),
            mul(x(), mul(tanh_part(), half())),
            mul(mul(x(), tanh_part()), half()),
        ]);

        let shifted = alt(vec![
            op("Sub")
                .args(vec![x(), reduce("ReduceMax", x(), "max_axes").pat()])
                .pat(),
            x(),
        ]);
        let e = || op("Exp").args(vec![shifted.clone()]).capture("e");
        let softmax = op("Div")
            .args(vec![e(), reduce("ReduceSum", e(), "sum_axes").pat()])
            .pat();

        let d = || {
            op("Sub")
                .args(vec![x(), reduce("ReduceMean", x(), "mean_axes").pat()])
                .capture("d")
        };
        let square = alt(vec![
            op("Pow").args(vec![d(), splat(2.0)]).pat(),
            op("Mul").args(vec![d(), d()]).pat(),
        ]);
        let var = reduce("ReduceMean", square, "var_axes").pat();
        let std = op("Sqrt")
            .args(vec![op("Add")
                .commutative()
                .args(vec![var, constant().capture("eps")])
                .pat()])
            .pat();
        let normed = op("Div").args(vec![d(), std]).pat();
        let scaled = op("Mul")
            .commutative()
            .args(vec![normed, constant().capture("gamma")])
            .pat();
        let layernorm = alt(vec![
            op("Add")
                .commutative()
                .args(vec![scaled.clone(), constant().capture("beta")])
                .pat(),
            scaled,
        ]);
        // clip(x + 3, 0, 6)
        let clip6 = || {
            op("Clip")
                .args(vec![
                    op("Add").commutative().args(vec![x(), splat(3.0)]).pat(),
                    splat(0.0),
                    splat(6.0),
                ])
                .pat()
        };
        let hard_sigmoid = op("HardSigmoid")
            .when(|_, n: &Node| {
                let a = n.attrs.float_or("alpha", 0.2).unwrap_or(0.0);
                (a - 1.0 / 6.0).abs() <= 1e-6 && n.attrs.float_or("beta", 0.5) == Ok(0.5)
            })
            .args(vec![x()])
            .pat();
        let div6 = |a: Pat| {
            alt(vec![
                op("Div").args(vec![a.clone(), splat(6.0)]).pat(),
                mul(a, near(1.0 / 6.0)),
            ])
        };
        let hardswish = alt(vec![
            div6(mul(x(), clip6())),
            mul(x(), div6(clip6())),
            mul(x(), hard_sigmoid),
        ]);
        let silu = mul(x(), op("Sigmoid").args(vec![x()]).pat());
        Patterns {
            gelu,
            gelu_tanh,
            hardswish,
            silu,
            softmax,
            layernorm,
        }
    }

    fn apply(&self, g: &mut Graph, uses: &Uses, id: NodeId, cx: &mut PassContext) -> Result<bool> {
        let root: Value = id.into();
        if let Some(m) = self.gelu.matches(g, uses, root) {
            return replace_node(g, id, id, "Gelu", &[Some(m.value("x"))], Attrs::new(), cx);
        }
        if let Some(m) = self.gelu_tanh.matches(g, uses, root) {
            let attrs = Attrs::new().with("approximate", Attr::String("tanh".into()));
            return replace_node(g, id, id, "Gelu", &[Some(m.value("x"))], attrs, cx);
        }
        for (pat, name) in [(&self.hardswish, "HardSwish"), (&self.silu, "Silu")] {
            if let Some(m) = pat.matches(g, uses, root) {
                let x = m.value("x");
                if !g.value_type(x)?.dtype.is_float() {
                    return Ok(false);
                }
                return replace_node(g, id, id, name, &[Some(x)], Attrs::new(), cx);
            }
        }
        if let Some(m) = self.softmax.matches(g, uses, root) {
            let Some(axis) = one_axis(g, &m, &["sum_axes", "max_axes"]) else {
                return Ok(false);
            };
            let attrs = Attrs::new().with("axis", Attr::Int(axis));
            return replace_node(g, id, id, "Softmax", &[Some(m.value("x"))], attrs, cx);
        }
        if let Some(m) = self.layernorm.matches(g, uses, root) {
            let rank = g.value_type(m.value("x"))?.rank() as i64;
            let axis = one_axis(g, &m, &["mean_axes", "var_axes"]);
            let eps = g.node(m.node("eps")).data.as_ref().map(|t| t.to_f64_vec());
            let (Some(axis), Some([eps])) = (axis, eps.as_deref()) else {
                return Ok(false);
            };
            if axis != rank - 1 {
                return Ok(false);
            }
            let attrs = Attrs::new()
                .with("axis", Attr::Int(-1))
                .with("epsilon", Attr::Float(*eps));
            let inputs = [Some(m.value("x")), Some(m.value("gamma")), m.get("beta")];
            return replace_node(g, id, id, "LayerNormalization", &inputs, attrs, cx);
        }
        Ok(false)
    }
}

/// The one axis (made non-negative) that every named axes constant holds, or None.
fn one_axis(g: &Graph, m: &Match, names: &[&str]) -> Option<i64> {
    let rank = g.value_type(m.value("x")).ok()?.rank() as i64;
    let mut axis = None;
    for name in names {
        let Some(v) = m.get(name) else { continue };
        let vals = g.node(v.node).data.as_ref()?.to_i64_vec();
        let [a] = vals.as_slice() else { return None };
        let a = if *a < 0 { a + rank } else { *a };
        if axis.is_some_and(|b| b != a) {
            return None;
        }
        axis = Some(a);
    }
    axis
}
