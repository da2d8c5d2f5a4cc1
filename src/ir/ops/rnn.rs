//! The recurrent layers RNN, GRU and LSTM (ONNX 22): forward, reverse or
//! bidirectional, per-batch `sequence_lens`, both layouts, configurable activations,
//! cell clipping, LSTM peepholes and `input_forget`, GRU `linear_before_reset`.
//!
//! One op per layer rather than an unrolled graph: the sequence length may be symbolic,
//! and a backend lowers each to a fused kernel. The reference steps one batch row at a
//! time in f64.
use crate::ir::ops::{InPlace, Origin};
use ndarray::{ArrayD, IxDyn};

use super::util::same_dtype;
use super::{leak, AttrSpec, EvalCtx, InferCtx, Op, OpSchema};
use crate::ir::{AttrKind, Attrs, DType, Dim, Shape, TensorType};
use crate::tensor::Tensor;

#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Cell {
    Rnn,
    Gru,
    Lstm,
}

impl Cell {
    pub(crate) fn gates(self) -> usize {
        match self {
            Cell::Rnn => 1,
            Cell::Gru => 3,
            Cell::Lstm => 4,
        }
    }

    /// The default activations of one direction.
    fn default_activations(self) -> &'static [&'static str] {
        match self {
            Cell::Rnn => &["Tanh"],
            Cell::Gru => &["Sigmoid", "Tanh"],
            Cell::Lstm => &["Sigmoid", "Tanh", "Tanh"],
        }
    }
}

struct Recurrent {
    schema: OpSchema,
    cell: Cell,
}

const COMMON_ATTRS: [AttrSpec; 7] = [
    AttrSpec::opt("activation_alpha", AttrKind::Floats, "per activation"),
    AttrSpec::opt("activation_beta", AttrKind::Floats, "per activation"),
    AttrSpec::opt("activations", AttrKind::Strings, "the layer's defaults"),
    AttrSpec::opt("clip", AttrKind::Float, "none"),
    AttrSpec::opt("direction", AttrKind::String, "forward"),
    AttrSpec::opt("hidden_size", AttrKind::Int, "from R"),
    AttrSpec::opt("layout", AttrKind::Int, "0"),
];

const RNN_ATTRS: &[AttrSpec] = &COMMON_ATTRS;
const GRU_ATTRS: &[AttrSpec] = &[
    COMMON_ATTRS[0],
    COMMON_ATTRS[1],
    COMMON_ATTRS[2],
    COMMON_ATTRS[3],
    COMMON_ATTRS[4],
    COMMON_ATTRS[5],
    COMMON_ATTRS[6],
    AttrSpec::opt("linear_before_reset", AttrKind::Int, "0"),
];
const LSTM_ATTRS: &[AttrSpec] = &[
    COMMON_ATTRS[0],
    COMMON_ATTRS[1],
    COMMON_ATTRS[2],
    COMMON_ATTRS[3],
    COMMON_ATTRS[4],
    COMMON_ATTRS[5],
    AttrSpec::opt("input_forget", AttrKind::Int, "0"),
    COMMON_ATTRS[6],
];

pub(crate) fn directions(attrs: &Attrs) -> Result<usize, String> {
    match attrs.string_or("direction", "forward")? {
        "forward" | "reverse" => Ok(1),
        "bidirectional" => Ok(2),
        d => Err(format!(
            "direction must be forward, reverse or bidirectional, got '{d}'"
        )),
    }
}

/// One activation function with its alpha and beta (ONNX's defaults where not given).
#[derive(Clone, Copy)]
pub(crate) struct Activation {
    pub(crate) kind: &'static str,
    pub(crate) alpha: f64,
    pub(crate) beta: f64,
}

impl Activation {
    fn new(name: &str, alpha: Option<f64>, beta: Option<f64>) -> Result<Activation, String> {
        let (kind, a, b) = match name.to_ascii_lowercase().as_str() {
            "relu" => ("relu", 0.0, 0.0),
            "tanh" => ("tanh", 0.0, 0.0),
            "sigmoid" => ("sigmoid", 0.0, 0.0),
            "affine" => ("affine", 1.0, 0.0),
            "leakyrelu" => ("leakyrelu", 0.01, 0.0),
            "thresholdedrelu" => ("thresholdedrelu", 1.0, 0.0),
            "scaledtanh" => ("scaledtanh", 1.0, 1.0),
            "hardsigmoid" => ("hardsigmoid", 0.2, 0.5),
            "elu" => ("elu", 1.0, 0.0),
            "softsign" => ("softsign", 0.0, 0.0),
            "softplus" => ("softplus", 0.0, 0.0),
            _ => return Err(format!("unknown activation '{name}'")),
        };
        Ok(Activation {
            kind,
            alpha: alpha.unwrap_or(a),
            beta: beta.unwrap_or(b),
        })
    }

    pub(crate) fn apply(&self, x: f64) -> f64 {
        let (a, b) = (self.alpha, self.beta);
        match self.kind {
            "relu" => x.max(0.0),
            "tanh" => x.tanh(),
            "sigmoid" => 1.0 / (1.0 + (-x).exp()),
            "affine" => a * x + b,
            "leakyrelu" => {
                if x >= 0.0 {
                    x
                } else {
                    a * x
                }
            }
            "thresholdedrelu" => {
                if x > a {
                    x
                } else {
                    0.0
                }
            }
            "scaledtanh" => a * (b * x).tanh(),
            "hardsigmoid" => (a * x + b).clamp(0.0, 1.0),
            "elu" => {
                if x >= 0.0 {
                    x
                } else {
                    a * (x.exp() - 1.0)
                }
            }
            "softsign" => x / (1.0 + x.abs()),
            _ => x.exp().ln_1p(),
        }
    }
}

/// Each direction's activations, from `activations` and its alpha/beta lists (the i-th
/// activation takes the i-th alpha and beta).
pub(crate) fn activations(
    cell: Cell,
    attrs: &Attrs,
    dirs: usize,
) -> Result<Vec<Vec<Activation>>, String> {
    let per_dir = cell.default_activations().len();
    let names: Vec<String> = match attrs.strings("activations")? {
        Some(n) => n.to_vec(),
        None => (0..dirs)
            .flat_map(|_| cell.default_activations().iter().map(|s| s.to_string()))
            .collect(),
    };
    if names.len() != per_dir * dirs {
        return Err(format!(
            "activations has {} names, expected {} ({per_dir} per direction)",
            names.len(),
            per_dir * dirs
        ));
    }
    let alphas = attrs.floats("activation_alpha")?.unwrap_or_default();
    let betas = attrs.floats("activation_beta")?.unwrap_or_default();
    let all = names
        .iter()
        .enumerate()
        .map(|(i, n)| Activation::new(n, alphas.get(i).copied(), betas.get(i).copied()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(all.chunks(per_dir).map(|c| c.to_vec()).collect())
}

impl Op for Recurrent {
    fn schema(&self) -> &OpSchema {
        &self.schema
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (x, w, r) = (cx.input(0)?, cx.input(1)?, cx.input(2)?);
        let dtype = same_dtype(self.schema.name, &[x, w, r])?;
        if !dtype.is_float() {
            return Err(format!("X, W and R must be float, got {dtype}"));
        }
        if x.rank() != 3 || w.rank() != 3 || r.rank() != 3 {
            return Err(format!("X, W and R must be 3-D, got {x}, {w}, {r}"));
        }
        let dirs = directions(cx.attrs)?;
        activations(self.cell, cx.attrs, dirs)?;
        let hidden = match cx.attrs.int("hidden_size")? {
            Some(h) if h >= 1 => Dim::Fixed(h as usize),
            Some(h) => return Err(format!("hidden_size must be positive, got {h}")),
            None => r.shape.dim(2).clone(),
        };
        if let (Some(h), Some(rows)) = (hidden.fixed(), w.shape.dim(1).fixed()) {
            if rows != self.cell.gates() * h {
                return Err(format!(
                    "W has {rows} rows, expected {} gates x hidden size {h}",
                    self.cell.gates()
                ));
            }
        }
        if let Some(d) = w.shape.dim(0).fixed() {
            if d != dirs {
                return Err(format!(
                    "W has {d} directions, the direction attribute {dirs}"
                ));
            }
        }
        if let Some(s) = cx.opt_input(4) {
            if s.dtype != DType::I32 || s.rank() != 1 {
                return Err(format!("sequence_lens must be i32[batch], got {s}"));
            }
        }
        for i in [3, 5, 6, 7] {
            if let Some(t) = cx.opt_input(i) {
                if t.dtype != dtype {
                    return Err(format!("input {i} must be {dtype}, got {}", t.dtype));
                }
            }
        }
        let batch_first = cx.attrs.int_or("layout", 0)? != 0;
        let (seq, batch) = if batch_first {
            (x.shape.dim(1).clone(), x.shape.dim(0).clone())
        } else {
            (x.shape.dim(0).clone(), x.shape.dim(1).clone())
        };
        let d = Dim::Fixed(dirs);
        let y = if batch_first {
            Shape::new([batch.clone(), seq, d.clone(), hidden.clone()])
        } else {
            Shape::new([seq, d.clone(), batch.clone(), hidden.clone()])
        };
        let state = if batch_first {
            Shape::new([batch, d, hidden])
        } else {
            Shape::new([d, batch, hidden])
        };
        let mut out = vec![
            TensorType::new(dtype, y),
            TensorType::new(dtype, state.clone()),
        ];
        if self.cell == Cell::Lstm {
            out.push(TensorType::new(dtype, state));
        }
        Ok(out)
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let a = cx.attrs;
        let xt = cx.input(0)?;
        let dtype = xt.dtype();
        let batch_first = a.int_or("layout", 0)? != 0;
        let mut x = xt.to_f64_array();
        if batch_first {
            x = x
                .permuted_axes(IxDyn(&[1, 0, 2]))
                .as_standard_layout()
                .into_owned();
        }
        let (w, r) = (cx.input(1)?.to_f64_array(), cx.input(2)?.to_f64_array());
        let (seq, batch, input) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        let dirs = directions(a)?;
        let acts = activations(self.cell, a, dirs)?;
        let hidden = r.shape()[2];
        let g = self.cell.gates();
        if w.shape() != [dirs, g * hidden, input] || r.shape() != [dirs, g * hidden, hidden] {
            return Err(format!(
                "W {:?} and R {:?} do not fit X {:?} with {dirs} directions and hidden size {hidden}",
                w.shape(),
                r.shape(),
                x.shape()
            ));
        }
        let opt = |i: usize, shape: &[usize]| -> Result<Option<ArrayD<f64>>, String> {
            let Some(t) = cx.opt_input(i) else {
                return Ok(None);
            };
            let mut t = t.to_f64_array();
            if batch_first && (i == 5 || i == 6) {
                t = t
                    .permuted_axes(IxDyn(&[1, 0, 2]))
                    .as_standard_layout()
                    .into_owned();
            }
            if t.shape() != shape {
                return Err(format!("input {i} is {:?}, expected {shape:?}", t.shape()));
            }
            Ok(Some(t))
        };
        let bias = opt(3, &[dirs, 2 * g * hidden])?;
        let h0 = opt(5, &[dirs, batch, hidden])?;
        let c0 = if self.cell == Cell::Lstm {
            opt(6, &[dirs, batch, hidden])?
        } else {
            None
        };
        let peep = if self.cell == Cell::Lstm {
            opt(7, &[dirs, 3 * hidden])?
        } else {
            None
        };
        let lens: Vec<usize> = match cx.opt_input(4) {
            None => vec![seq; batch],
            Some(t) => {
                let v = t.to_i64_vec();
                if v.len() != batch || v.iter().any(|&l| l < 0 || l as usize > seq) {
                    return Err(format!(
                        "sequence_lens {v:?} must give each of {batch} batch rows a length <= {seq}"
                    ));
                }
                v.into_iter().map(|l| l as usize).collect()
            }
        };
        let clip = a.float("clip")?;
        let clip = |v: f64| match clip {
            Some(c) => v.clamp(-c, c),
            None => v,
        };
        let linear_before_reset = a.int_or("linear_before_reset", 0)? != 0;
        let input_forget = a.int_or("input_forget", 0)? != 0;
        let reverse_only = a.string_or("direction", "forward")? == "reverse";

        let mut y = ArrayD::<f64>::zeros(IxDyn(&[seq, dirs, batch, hidden]));
        let mut y_h = ArrayD::<f64>::zeros(IxDyn(&[dirs, batch, hidden]));
        let mut y_c = ArrayD::<f64>::zeros(IxDyn(&[dirs, batch, hidden]));
        // dot(row `j` of gate block `k` of M[d], v)
        let dot = |m: &ArrayD<f64>, d: usize, row: usize, v: &[f64]| -> f64 {
            v.iter().enumerate().map(|(e, &x)| m[[d, row, e]] * x).sum()
        };
        for d in 0..dirs {
            let reverse = reverse_only || d == 1;
            let act = &acts[d];
            let b = |k: usize, j: usize| bias.as_ref().map_or(0.0, |b| b[[d, k * hidden + j]]);
            let rb =
                |k: usize, j: usize| bias.as_ref().map_or(0.0, |b| b[[d, (g + k) * hidden + j]]);
            let p = |k: usize, j: usize| peep.as_ref().map_or(0.0, |p| p[[d, k * hidden + j]]);
            for n in 0..batch {
                let mut h: Vec<f64> = (0..hidden)
                    .map(|j| h0.as_ref().map_or(0.0, |h| h[[d, n, j]]))
                    .collect();
                let mut c: Vec<f64> = (0..hidden)
                    .map(|j| c0.as_ref().map_or(0.0, |c| c[[d, n, j]]))
                    .collect();
                for step in 0..lens[n] {
                    let t = if reverse { lens[n] - 1 - step } else { step };
                    let xt: Vec<f64> = (0..input).map(|e| x[[t, n, e]]).collect();
                    // Gate k's pre-activation for unit j: W x + R h + biases.
                    let pre = |k: usize, j: usize, h: &[f64]| {
                        dot(&w, d, k * hidden + j, &xt)
                            + dot(&r, d, k * hidden + j, h)
                            + b(k, j)
                            + rb(k, j)
                    };
                    let next: Vec<f64> = match self.cell {
                        Cell::Rnn => (0..hidden)
                            .map(|j| act[0].apply(clip(pre(0, j, &h))))
                            .collect(),
                        Cell::Gru => {
                            // Gates z, r, h; the candidate resets h before or after R.
                            let z: Vec<f64> = (0..hidden)
                                .map(|j| act[0].apply(clip(pre(0, j, &h))))
                                .collect();
                            let rs: Vec<f64> = (0..hidden)
                                .map(|j| act[0].apply(clip(pre(1, j, &h))))
                                .collect();
                            let reset: Vec<f64> = h.iter().zip(&rs).map(|(h, r)| h * r).collect();
                            (0..hidden)
                                .map(|j| {
                                    let row = 2 * hidden + j;
                                    let wx = dot(&w, d, row, &xt) + b(2, j);
                                    let rh = if linear_before_reset {
                                        rs[j] * (dot(&r, d, row, &h) + rb(2, j))
                                    } else {
                                        dot(&r, d, row, &reset) + rb(2, j)
                                    };
                                    let cand = act[1].apply(clip(wx + rh));
                                    (1.0 - z[j]) * cand + z[j] * h[j]
                                })
                                .collect()
                        }
                        Cell::Lstm => {
                            // Gates i, o, f, c; peepholes i, o, f.
                            let mut next = vec![0.0; hidden];
                            for j in 0..hidden {
                                let i = act[0].apply(clip(pre(0, j, &h) + p(0, j) * c[j]));
                                let f = if input_forget {
                                    1.0 - i
                                } else {
                                    act[0].apply(clip(pre(2, j, &h) + p(2, j) * c[j]))
                                };
                                let cand = act[1].apply(clip(pre(3, j, &h)));
                                let cell = f * c[j] + i * cand;
                                let o = act[0].apply(clip(pre(1, j, &h) + p(1, j) * cell));
                                next[j] = o * act[2].apply(cell);
                                c[j] = cell;
                            }
                            next
                        }
                    };
                    h = next;
                    for j in 0..hidden {
                        y[[t, d, n, j]] = h[j];
                    }
                }
                for j in 0..hidden {
                    y_h[[d, n, j]] = h[j];
                    y_c[[d, n, j]] = c[j];
                }
            }
        }
        let (y, y_h, y_c) = if batch_first {
            let t = |a: ArrayD<f64>, p: &[usize]| {
                a.permuted_axes(IxDyn(p)).as_standard_layout().into_owned()
            };
            (t(y, &[2, 0, 1, 3]), t(y_h, &[1, 0, 2]), t(y_c, &[1, 0, 2]))
        } else {
            (y, y_h, y_c)
        };
        let mut out = vec![
            Tensor::from_f64_array(dtype, y),
            Tensor::from_f64_array(dtype, y_h),
        ];
        if self.cell == Cell::Lstm {
            out.push(Tensor::from_f64_array(dtype, y_c));
        }
        Ok(out)
    }
}

pub(crate) fn ops() -> Vec<&'static dyn Op> {
    vec![
        leak(Recurrent {
            schema: OpSchema {
                name: "RNN",
                family: "rnn",
                inputs: &["X", "W", "R", "B?", "sequence_lens?", "initial_h?"],
                outputs: &["Y", "Y_h"],
                attrs: RNN_ATTRS,
                doc: "Elman RNN: h = f(W x + R h + Wb + Rb), f = Tanh by default. X is \
                      [seq, batch, input] ([batch, seq, input] with layout 1); Y is \
                      [seq, dirs, batch, hidden], zero past a row's sequence_lens.",
                in_place: InPlace::No,
                origin: Origin::Onnx,
            },
            cell: Cell::Rnn,
        }),
        leak(Recurrent {
            schema: OpSchema {
                name: "GRU",
                family: "rnn",
                inputs: &["X", "W", "R", "B?", "sequence_lens?", "initial_h?"],
                outputs: &["Y", "Y_h"],
                attrs: GRU_ATTRS,
                doc: "Gated recurrent unit, gates z, r, h (W is [dirs, 3*hidden, input]); \
                      linear_before_reset applies the reset gate after R's product.",
                in_place: InPlace::No,
                origin: Origin::Onnx,
            },
            cell: Cell::Gru,
        }),
        leak(Recurrent {
            schema: OpSchema {
                name: "LSTM",
                family: "rnn",
                inputs: &[
                    "X",
                    "W",
                    "R",
                    "B?",
                    "sequence_lens?",
                    "initial_h?",
                    "initial_c?",
                    "P?",
                ],
                outputs: &["Y", "Y_h", "Y_c"],
                attrs: LSTM_ATTRS,
                doc: "Long short-term memory, gates i, o, f, c (W is [dirs, 4*hidden, \
                      input]), peepholes P (i, o, f), input_forget couples f = 1 - i. \
                      Always has all three outputs.",
                in_place: InPlace::No,
                origin: Origin::Onnx,
            },
            cell: Cell::Lstm,
        }),
    ]
}
