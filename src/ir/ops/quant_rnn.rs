//! DynamicQuantizeLSTM: onnxruntime's LSTM with 8-bit weights, which quantizes its float
//! activations to u8 as it goes (all of X at once for the input products, the batch's
//! hidden state at each step for the recurrent ones). The sequence length may be
//! symbolic, so this is one op rather than an unrolled graph. The reference follows
//! onnxruntime's CPU kernel step for step, in f32 as it computes, so that results agree
//! to rounding; only the default activations are supported.
use super::quant::dynamic_quantize_u8;
use super::{leak, AttrSpec, EvalCtx, InferCtx, Op, OpSchema};
use crate::ir::ops::{InPlace, Origin};
use crate::ir::{AttrKind, DType, Dim, Shape, TensorType};
use crate::tensor::Tensor;

struct DynamicQuantizeLstm;

const SCHEMA: OpSchema = OpSchema {
    name: "DynamicQuantizeLSTM",
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
        "W_scale",
        "W_zero_point",
        "R_scale",
        "R_zero_point",
    ],
    outputs: &["Y", "Y_h", "Y_c"],
    attrs: &[
        AttrSpec::opt("activation_alpha", AttrKind::Floats, "unused"),
        AttrSpec::opt("activation_beta", AttrKind::Floats, "unused"),
        AttrSpec::opt(
            "activations",
            AttrKind::Strings,
            "Sigmoid, Tanh, Tanh (only)",
        ),
        AttrSpec::opt("clip", AttrKind::Float, "none"),
        AttrSpec::opt("direction", AttrKind::String, "forward"),
        AttrSpec::opt("hidden_size", AttrKind::Int, "from R"),
        AttrSpec::opt("input_forget", AttrKind::Int, "0"),
    ],
    doc: "Kiln-only form of com.microsoft DynamicQuantizeLSTM: an LSTM (gates i, o, f, c) \
          whose W [dirs, input, 4*hidden] and R [dirs, hidden, 4*hidden] are int8 or uint8 \
          with per-direction (or per-column) scales; X and each step's hidden state are \
          quantized to u8 by their range, the integer products scaled back to f32. \
          Always has all three outputs.",
    in_place: InPlace::No,
    origin: Origin::Kiln,
};

fn directions(dir: &str) -> Result<usize, String> {
    match dir {
        "forward" | "reverse" => Ok(1),
        "bidirectional" => Ok(2),
        d => Err(format!(
            "direction must be forward, reverse or bidirectional, got '{d}'"
        )),
    }
}

/// One direction's quantized weights `[k, n]` with their scales (one, or one per column)
/// and zero point (onnxruntime reads the first).
pub(crate) struct QuantWeights {
    pub(crate) values: Vec<i32>,
    pub(crate) n: usize,
    pub(crate) scales: Vec<f32>,
    pub(crate) zero: i32,
}

impl QuantWeights {
    pub(crate) fn new(
        w: &Tensor,
        scale: &Tensor,
        zero: &Tensor,
        d: usize,
        what: &str,
    ) -> Result<Self, String> {
        let (k, n) = (w.shape()[1], w.shape()[2]);
        let all = w.to_i64_vec();
        let values = all[d * k * n..(d + 1) * k * n]
            .iter()
            .map(|&v| v as i32)
            .collect();
        let per_dir = |t: &Tensor, name: &str| -> Result<Vec<f64>, String> {
            let v = t.to_f64_vec();
            let dirs = w.shape()[0];
            match t.shape() {
                [x] if *x == dirs => Ok(vec![v[d]]),
                [x, y] if *x == dirs && *y == n => Ok(v[d * n..(d + 1) * n].to_vec()),
                s => Err(format!(
                    "{what}_{name} must be [{dirs}] or [{dirs}, {n}], got {s:?}"
                )),
            }
        };
        let scales = per_dir(scale, "scale")?.iter().map(|&s| s as f32).collect();
        let zero = per_dir(zero, "zero_point")?[0] as i32;
        Ok(QuantWeights {
            values,
            n,
            scales,
            zero,
        })
    }

    /// `a [m, k] @ self`, with `a` quantized to u8 as a whole, added to `out [m, n]`.
    fn product_into(&self, a: &[f32], m: usize, out: &mut [f32]) {
        let k = a.len().checked_div(m).unwrap_or(0);
        let (q, a_scale, a_zero) = dynamic_quantize_u8(a.iter().copied());
        let a_zero = i32::from(a_zero);
        for row in 0..m {
            for col in 0..self.n {
                let mut acc = 0i32;
                for e in 0..k {
                    let x = i32::from(q[row * k + e]) - a_zero;
                    let w = self.values[e * self.n + col] - self.zero;
                    acc = acc.wrapping_add(x.wrapping_mul(w));
                }
                let s = self.scales[if self.scales.len() == 1 { 0 } else { col }];
                out[row * self.n + col] += acc as f32 * (a_scale * s);
            }
        }
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

impl Op for DynamicQuantizeLstm {
    fn schema(&self) -> &OpSchema {
        &SCHEMA
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (x, w, r) = (cx.input(0)?, cx.input(1)?, cx.input(2)?);
        if x.dtype != DType::F32 {
            return Err(format!("X must be f32, got {x}"));
        }
        for (t, name) in [(w, "W"), (r, "R")] {
            if !matches!(t.dtype, DType::I8 | DType::U8) || t.rank() != 3 {
                return Err(format!("{name} must be 3-D int8 or uint8, got {t}"));
            }
        }
        if x.rank() != 3 {
            return Err(format!("X must be 3-D, got {x}"));
        }
        if let Some(names) = cx.attrs.strings("activations")? {
            let default = ["Sigmoid", "Tanh", "Tanh"];
            if names.chunks(3).any(|c| c != default) {
                return Err(format!(
                    "activations {names:?} are not supported (only Sigmoid, Tanh, Tanh)"
                ));
            }
        }
        let dirs = directions(cx.attrs.string_or("direction", "forward")?)?;
        let hidden = match cx.attrs.int("hidden_size")? {
            Some(h) if h >= 1 => Dim::Fixed(h as usize),
            Some(h) => return Err(format!("hidden_size must be positive, got {h}")),
            None => r.shape.dim(1).clone(),
        };
        if let (Some(h), Some(cols)) = (hidden.fixed(), w.shape.dim(2).fixed()) {
            if cols != 4 * h {
                return Err(format!(
                    "W has {cols} columns, expected 4 x hidden size {h}"
                ));
            }
        }
        for i in [3, 5, 6, 7, 8, 10] {
            if let Some(t) = cx.opt_input(i) {
                if t.dtype != DType::F32 {
                    return Err(format!("input {i} must be f32, got {t}"));
                }
            }
        }
        for (i, weights) in [(9, w), (11, r)] {
            let z = cx.input(i)?;
            if z.dtype != weights.dtype {
                return Err(format!(
                    "input {i} (zero point) must be {}, got {z}",
                    weights.dtype
                ));
            }
        }
        if let Some(s) = cx.opt_input(4) {
            if s.dtype != DType::I32 || s.rank() != 1 {
                return Err(format!("sequence_lens must be i32[batch], got {s}"));
            }
        }
        let (seq, batch) = (x.shape.dim(0).clone(), x.shape.dim(1).clone());
        let d = Dim::Fixed(dirs);
        let state = Shape::new([d.clone(), batch.clone(), hidden.clone()]);
        Ok(vec![
            TensorType::new(DType::F32, Shape::new([seq, d, batch, hidden])),
            TensorType::new(DType::F32, state.clone()),
            TensorType::new(DType::F32, state),
        ])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let a = cx.attrs;
        let xt = cx.input(0)?;
        let (w, r) = (cx.input(1)?, cx.input(2)?);
        let [seq, batch, input] = *xt.shape() else {
            return Err(format!("X must be 3-D, got {:?}", xt.shape()));
        };
        let x: Vec<f32> = xt.to_f64_vec().iter().map(|&v| v as f32).collect();
        let reverse_only = a.string_or("direction", "forward")? == "reverse";
        let dirs = directions(a.string_or("direction", "forward")?)?;
        let hidden = r.shape()[1];
        let g4 = 4 * hidden;
        if w.shape() != [dirs, input, g4] || r.shape() != [dirs, hidden, g4] {
            return Err(format!(
                "W {:?} and R {:?} do not fit X {:?} with {dirs} directions and hidden size {hidden}",
                w.shape(),
                r.shape(),
                xt.shape()
            ));
        }
        let opt = |i: usize, shape: &[usize]| -> Result<Option<Vec<f32>>, String> {
            let Some(t) = cx.opt_input(i) else {
                return Ok(None);
            };
            if t.shape() != shape {
                return Err(format!("input {i} is {:?}, expected {shape:?}", t.shape()));
            }
            Ok(Some(t.to_f64_vec().iter().map(|&v| v as f32).collect()))
        };
        let bias = opt(3, &[dirs, 2 * g4])?;
        let h0 = opt(5, &[dirs, batch, hidden])?;
        let c0 = opt(6, &[dirs, batch, hidden])?;
        let peep = opt(7, &[dirs, 3 * hidden])?;
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
        let max_len = lens.iter().copied().max().unwrap_or(0);
        let clip = a.float("clip")?.map_or(f32::MAX, |c| c as f32);
        let input_forget = a.int_or("input_forget", 0)? != 0;

        let mut y = vec![0.0f32; seq * dirs * batch * hidden];
        let mut y_h = vec![0.0f32; dirs * batch * hidden];
        let mut y_c = vec![0.0f32; dirs * batch * hidden];
        for d in 0..dirs {
            let reverse = reverse_only || d == 1;
            let wq = QuantWeights::new(w, cx.input(8)?, cx.input(9)?, d, "W")?;
            let rq = QuantWeights::new(r, cx.input(10)?, cx.input(11)?, d, "R")?;
            // Row n's step t reads X at time `time(t, n)`: reversed within its length.
            let time = |t: usize, n: usize| {
                if reverse && t < lens[n] {
                    lens[n] - 1 - t
                } else {
                    t
                }
            };
            let mut inputs = vec![0.0f32; max_len * batch * input];
            for t in 0..max_len {
                for n in 0..batch {
                    let src = (time(t, n) * batch + n) * input;
                    let dst = (t * batch + n) * input;
                    inputs[dst..dst + input].copy_from_slice(&x[src..src + input]);
                }
            }
            let mut gates = vec![0.0f32; max_len * batch * g4];
            wq.product_into(&inputs, max_len * batch, &mut gates);
            let state = |s: &Option<Vec<f32>>| {
                s.as_ref().map_or(vec![0.0; batch * hidden], |v| {
                    v[d * batch * hidden..(d + 1) * batch * hidden].to_vec()
                })
            };
            let (mut h, mut c) = (state(&h0), state(&c0));
            let fused_bias = |k: usize, j: usize| {
                bias.as_ref().map_or(0.0, |b| {
                    b[d * 2 * g4 + k * hidden + j] + b[d * 2 * g4 + g4 + k * hidden + j]
                })
            };
            let p = |k: usize, j: usize| {
                peep.as_ref()
                    .map_or(0.0, |p| p[d * 3 * hidden + k * hidden + j])
            };
            for t in 0..max_len {
                let step = &mut gates[t * batch * g4..(t + 1) * batch * g4];
                rq.product_into(&h, batch, step);
                let mut next = vec![0.0f32; batch * hidden];
                for n in 0..batch {
                    if t >= lens[n] {
                        continue; // a finished row's output stays zero
                    }
                    let pre = |k: usize, j: usize| {
                        (step[n * g4 + k * hidden + j] + fused_bias(k, j)).clamp(-clip, clip)
                    };
                    for j in 0..hidden {
                        let c_prev = c[n * hidden + j];
                        let i = sigmoid(pre(0, j) + p(0, j) * c_prev);
                        let f = if input_forget {
                            1.0 - i
                        } else {
                            sigmoid(pre(2, j) + p(2, j) * c_prev)
                        };
                        let cand = pre(3, j).tanh();
                        let cell = (f * c_prev + i * cand).clamp(-clip, clip);
                        let o = sigmoid(pre(1, j) + p(1, j) * cell);
                        next[n * hidden + j] = o * cell.tanh();
                        c[n * hidden + j] = cell;
                    }
                    let out = ((time(t, n) * dirs + d) * batch + n) * hidden;
                    y[out..out + hidden].copy_from_slice(&next[n * hidden..(n + 1) * hidden]);
                    if t + 1 == lens[n] {
                        let at = (d * batch + n) * hidden;
                        y_h[at..at + hidden].copy_from_slice(&next[n * hidden..(n + 1) * hidden]);
                        y_c[at..at + hidden].copy_from_slice(&c[n * hidden..(n + 1) * hidden]);
                    }
                }
                h = next;
            }
        }
        let tensor = |v: Vec<f32>, shape: &[usize]| Tensor::from_vec(shape, v);
        Ok(vec![
            tensor(y, &[seq, dirs, batch, hidden])?,
            tensor(y_h, &[dirs, batch, hidden])?,
            tensor(y_c, &[dirs, batch, hidden])?,
        ])
    }
}

pub(crate) fn ops() -> Vec<&'static dyn Op> {
    vec![leak(DynamicQuantizeLstm)]
}
