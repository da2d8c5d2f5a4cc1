//! Attention (ONNX opsets 23-25): scaled dot-product attention over heads, with
//! grouped key/value heads, a past key/value cache, boolean or additive masks, causal
//! and sliding-window masking, per-batch key padding and soft-capping. And
//! RotaryEmbedding, the position encoding applied to its queries and keys.
//!
//! One op rather than a decomposition: a backend lowers it to a fused kernel, and the
//! reference below is the ONNX reference's arithmetic in f64, rounded once.
use crate::ir::ops::{InPlace, Origin};
use ndarray::{concatenate, ArrayD, Axis, IxDyn};

use super::util::same_dtype;
use super::{leak, AttrSpec, EvalCtx, InferCtx, Op, OpSchema};
use crate::ir::{AttrKind, Attrs, DType, Dim, Shape, TensorType};
use crate::tensor::Tensor;

struct Attention;

const ATTENTION: OpSchema = OpSchema {
    name: "Attention",
    family: "attention",
    inputs: &[
        "Q",
        "K",
        "V",
        "attn_mask?",
        "past_key?",
        "past_value?",
        "nonpad_kv_seqlen?",
    ],
    outputs: &["Y", "present_key", "present_value", "qk_matmul_output"],
    attrs: &[
        AttrSpec::opt("is_causal", AttrKind::Int, "0"),
        AttrSpec::opt("kv_num_heads", AttrKind::Int, "3-D inputs only"),
        AttrSpec::opt("left_window_size", AttrKind::Int, "-1 (unbounded)"),
        AttrSpec::opt("q_num_heads", AttrKind::Int, "3-D inputs only"),
        AttrSpec::opt("qk_matmul_output_mode", AttrKind::Int, "0"),
        AttrSpec::opt("right_window_size", AttrKind::Int, "-1 (unbounded)"),
        AttrSpec::opt("scale", AttrKind::Float, "1/sqrt(head size)"),
        AttrSpec::opt("softcap", AttrKind::Float, "0 (off)"),
        AttrSpec::opt(
            "softmax_precision",
            AttrKind::Int,
            "ignored: computes in f64",
        ),
    ],
    doc: "softmax(Q K^T * scale + bias) V per head. Q is [B, Hq, Sq, D] (or [B, Sq, Hq*D] \
          with q_num_heads/kv_num_heads); K, V have Hkv heads, Hq a multiple of Hkv. \
          past_key/past_value are prepended along the sequence axis (present_* return \
          them). The bias adds attn_mask (bool: false masks; or float, added; a mask \
          shorter than the keys is padded masked), the causal mask (is_causal, aligned \
          to the end of the past), the sliding window and keys at or past \
          nonpad_kv_seqlen[b]. Rows with every key masked give 0. qk_matmul_output is \
          the scores (mode 0/1, after softcap), with the bias (2) or the softmax (3), \
          as the ONNX reference computes them. Always has all four outputs.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

/// The head layout of one call, from the inputs' shapes and attributes.
struct Layout {
    three_d: bool,
    q_heads: Dim,
    kv_heads: Dim,
}

fn heads_attr(attrs: &Attrs, name: &str) -> Result<Option<usize>, String> {
    match attrs.int(name)? {
        None => Ok(None),
        Some(h) if h >= 1 => Ok(Some(h as usize)),
        Some(h) => Err(format!("{name} must be positive, got {h}")),
    }
}

fn layout(rank: usize, attrs: &Attrs, q: &Shape, k: &Shape) -> Result<Layout, String> {
    let (qh, kvh) = (
        heads_attr(attrs, "q_num_heads")?,
        heads_attr(attrs, "kv_num_heads")?,
    );
    match rank {
        3 => {
            let (Some(qh), Some(kvh)) = (qh, kvh) else {
                return Err("3-D Q, K, V need q_num_heads and kv_num_heads".into());
            };
            Ok(Layout {
                three_d: true,
                q_heads: Dim::Fixed(qh),
                kv_heads: Dim::Fixed(kvh),
            })
        }
        4 => Ok(Layout {
            three_d: false,
            q_heads: q.dim(1).clone(),
            kv_heads: k.dim(1).clone(),
        }),
        r => Err(format!("Q, K and V must be 3-D or 4-D, got rank {r}")),
    }
}

/// `d / by` when both are known, else a fresh symbol.
fn divide(d: &Dim, by: &Dim, fresh: Dim) -> Result<Dim, String> {
    match (d.fixed(), by.fixed()) {
        (Some(d), Some(b)) if d % b == 0 => Ok(Dim::Fixed(d / b)),
        (Some(d), Some(b)) => Err(format!("hidden size {d} is not a multiple of {b} heads")),
        _ => Ok(fresh),
    }
}

impl Op for Attention {
    fn schema(&self) -> &OpSchema {
        &ATTENTION
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (q, k, v) = (cx.input(0)?, cx.input(1)?, cx.input(2)?);
        let dtype = same_dtype("Attention", &[q, k, v])?;
        if !dtype.is_float() {
            return Err(format!("Q, K and V must be float, got {dtype}"));
        }
        if k.rank() != q.rank() || v.rank() != q.rank() {
            return Err(format!("Q, K and V must have one rank, got {q}, {k}, {v}"));
        }
        let lay = layout(q.rank(), cx.attrs, &q.shape, &k.shape)?;
        let seq = if lay.three_d { 1 } else { 2 };
        let (batch, q_len, kv_len) = (
            q.shape.dim(0).clone(),
            q.shape.dim(seq).clone(),
            k.shape.dim(seq).clone(),
        );
        let (head, v_head) = if lay.three_d {
            (
                divide(q.shape.dim(2), &lay.q_heads, cx.fresh_dim(1, 3))?,
                divide(v.shape.dim(2), &lay.kv_heads, cx.fresh_dim(2, 3))?,
            )
        } else {
            (q.shape.dim(3).clone(), v.shape.dim(3).clone())
        };
        if let (Some(a), Some(b)) = (lay.q_heads.fixed(), lay.kv_heads.fixed()) {
            if a % b != 0 {
                return Err(format!(
                    "{a} query heads are not a multiple of {b} key/value heads"
                ));
            }
        }
        if let Some(m) = cx.opt_input(3) {
            if m.dtype != DType::Bool && m.dtype != dtype {
                return Err(format!(
                    "attn_mask must be bool or {dtype}, got {}",
                    m.dtype
                ));
            }
            if m.rank() > 4 {
                return Err(format!("attn_mask has rank {}, at most 4", m.rank()));
            }
        }
        let past = match (cx.opt_input(4), cx.opt_input(5)) {
            (None, None) => None,
            (Some(pk), Some(pv)) => {
                if pk.rank() != 4 || pv.rank() != 4 || pk.dtype != dtype || pv.dtype != dtype {
                    return Err(format!(
                        "past_key and past_value must be 4-D {dtype}, got {pk}, {pv}"
                    ));
                }
                Some(pk.shape.dim(2).clone())
            }
            _ => return Err("past_key and past_value come together".into()),
        };
        if let Some(n) = cx.opt_input(6) {
            if past.is_some() {
                return Err("nonpad_kv_seqlen cannot be combined with a past cache".into());
            }
            if n.dtype != DType::I64 || n.rank() != 1 {
                return Err(format!("nonpad_kv_seqlen must be i64[B], got {n}"));
            }
        }
        let total = match (&past, kv_len.fixed()) {
            (None, _) => kv_len.clone(),
            (Some(p), Some(s)) if p.fixed().is_some() => Dim::Fixed(p.fixed().unwrap() + s),
            _ => cx.fresh_dim(1, 2),
        };
        let y = if lay.three_d {
            let hidden = match (lay.q_heads.fixed(), v_head.fixed()) {
                (Some(h), Some(d)) => Dim::Fixed(h * d),
                _ => cx.fresh_dim(0, 2),
            };
            Shape::new([batch.clone(), q_len.clone(), hidden])
        } else {
            Shape::new([
                batch.clone(),
                lay.q_heads.clone(),
                q_len.clone(),
                v_head.clone(),
            ])
        };
        let kv = |d: Dim| Shape::new([batch.clone(), lay.kv_heads.clone(), total.clone(), d]);
        Ok(vec![
            TensorType::new(dtype, y),
            TensorType::new(dtype, kv(head)),
            TensorType::new(dtype, kv(v_head)),
            TensorType::new(
                dtype,
                Shape::new([batch.clone(), lay.q_heads, q_len, total.clone()]),
            ),
        ])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let a = cx.attrs;
        let (qt, kt, vt) = (cx.input(0)?, cx.input(1)?, cx.input(2)?);
        let dtype = qt.dtype();
        let rank = qt.rank();
        let (q, k, v) = (qt.to_f64_array(), kt.to_f64_array(), vt.to_f64_array());
        let lay = layout(rank, a, &Shape::fixed(q.shape()), &Shape::fixed(k.shape()))?;
        let to_heads = |x: ArrayD<f64>, heads: &Dim| -> Result<ArrayD<f64>, String> {
            if !lay.three_d {
                return Ok(x);
            }
            let h = heads.fixed().unwrap_or(1);
            let s = x.shape().to_vec();
            if !s[2].is_multiple_of(h) {
                return Err(format!(
                    "hidden size {} is not a multiple of {h} heads",
                    s[2]
                ));
            }
            let x = x
                .into_shape_with_order(IxDyn(&[s[0], s[1], h, s[2] / h]))
                .map_err(|e| e.to_string())?;
            Ok(x.permuted_axes(IxDyn(&[0, 2, 1, 3]))
                .as_standard_layout()
                .into_owned())
        };
        let q = to_heads(q, &lay.q_heads)?;
        let mut k = to_heads(k, &lay.kv_heads)?;
        let mut v = to_heads(v, &lay.kv_heads)?;
        let (b_n, hq, sq, d) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
        let hkv = k.shape()[1];
        if k.shape()[0] != b_n
            || v.shape()[0] != b_n
            || v.shape()[1] != hkv
            || v.shape()[2] != k.shape()[2]
        {
            return Err(format!(
                "K {:?} and V {:?} do not match Q {:?}",
                k.shape(),
                v.shape(),
                q.shape()
            ));
        }
        if k.shape()[3] != d {
            return Err(format!("K's head size {} is not Q's {d}", k.shape()[3]));
        }
        if hkv == 0 || hq % hkv != 0 {
            return Err(format!(
                "{hq} query heads are not a multiple of {hkv} key/value heads"
            ));
        }
        let past_len = match (cx.opt_input(4), cx.opt_input(5)) {
            (Some(pk), Some(pv)) => {
                let (pk, pv) = (pk.to_f64_array(), pv.to_f64_array());
                k = concatenate(Axis(2), &[pk.view(), k.view()])
                    .map_err(|e| format!("past_key does not fit K: {e}"))?;
                v = concatenate(Axis(2), &[pv.view(), v.view()])
                    .map_err(|e| format!("past_value does not fit V: {e}"))?;
                Some(pk.shape()[2])
            }
            _ => None,
        };
        let (t, dv) = (k.shape()[2], v.shape()[3]);
        let nonpad = cx.opt_input(6).map(|n| n.to_i64_vec());
        if let Some(n) = &nonpad {
            if n.len() != b_n {
                return Err(format!(
                    "nonpad_kv_seqlen has {} values for batch {b_n}",
                    n.len()
                ));
            }
        }
        let mask = cx.opt_input(3);
        let mask_bool = mask.is_some_and(|m| m.dtype() == DType::Bool);
        let mask = mask.map(|m| m.to_f64_array());
        if let Some(m) = &mask {
            let want = [b_n, hq, sq, t];
            let ms = m.shape();
            let off = 4 - ms.len();
            for (i, &n) in ms.iter().enumerate() {
                let full = want[off + i];
                let ok = if i + 1 == ms.len() {
                    n <= full
                } else {
                    n == 1 || n == full
                };
                if !ok {
                    return Err(format!("attn_mask {ms:?} does not broadcast to {want:?}"));
                }
            }
        }
        let causal = a.int_or("is_causal", 0)? != 0;
        let (left, right) = (
            a.int_or("left_window_size", -1)?,
            a.int_or("right_window_size", -1)?,
        );
        let scale = match a.float("scale")? {
            Some(s) => s,
            None => 1.0 / (d as f64).sqrt(),
        };
        let softcap = a.float_or("softcap", 0.0)?;
        let mode = a.int_or("qk_matmul_output_mode", 0)?;
        if !(0..=3).contains(&mode) {
            return Err(format!("qk_matmul_output_mode must be 0 to 3, got {mode}"));
        }
        super::util::check_size(&[b_n, hq, sq, t])?;
        let mut y = ArrayD::<f64>::zeros(IxDyn(&[b_n, hq, sq, dv]));
        let mut qk_out = ArrayD::<f64>::zeros(IxDyn(&[b_n, hq, sq, t]));
        let (mut scores, mut biased, mut probs) = (vec![0.0; t], vec![0.0; t], vec![0.0; t]);
        for b in 0..b_n {
            // Where the causal frontier and the window sit: after the past, or at the
            // end of the batch's real keys.
            let offset = match (past_len, &nonpad) {
                (Some(p), _) => p as i64,
                (None, Some(n)) => n[b] - sq as i64,
                _ => 0,
            };
            for h in 0..hq {
                let hk = h / (hq / hkv);
                for i in 0..sq {
                    let mut row_masked = true;
                    for j in 0..t {
                        let mut s: f64 = (0..d)
                            .map(|e| q[[b, h, i, e]] * k[[b, hk, j, e]])
                            .sum::<f64>()
                            * scale;
                        if softcap > 0.0 {
                            s = (s / softcap).tanh() * softcap;
                        }
                        scores[j] = s;
                        let mut bias = 0.0;
                        if let Some(m) = &mask {
                            let ms = m.shape();
                            let full = [b, h, i, j];
                            let idx: Vec<usize> = (0..ms.len())
                                .map(|x| {
                                    let at = full[4 - ms.len() + x];
                                    if ms[x] == 1 && x + 1 < ms.len() {
                                        0
                                    } else {
                                        at
                                    }
                                })
                                .collect();
                            let last = *idx.last().unwrap_or(&0);
                            let val = if ms.is_empty() {
                                m[IxDyn(&[])]
                            } else if last >= ms[ms.len() - 1] {
                                // Past the mask's end: padded as masked.
                                if mask_bool {
                                    0.0
                                } else {
                                    f64::NEG_INFINITY
                                }
                            } else {
                                m[IxDyn(&idx)]
                            };
                            bias += if mask_bool {
                                if val != 0.0 {
                                    0.0
                                } else {
                                    f64::NEG_INFINITY
                                }
                            } else {
                                val
                            };
                        }
                        let diff = i as i64 + offset - j as i64;
                        if causal && diff < 0 {
                            bias = f64::NEG_INFINITY;
                        }
                        if (left >= 0 && diff > left) || (right >= 0 && -diff > right) {
                            bias = f64::NEG_INFINITY;
                        }
                        if nonpad.as_ref().is_some_and(|n| j as i64 >= n[b]) {
                            bias = f64::NEG_INFINITY;
                        }
                        row_masked &= bias == f64::NEG_INFINITY;
                        biased[j] = s + bias;
                    }
                    // A softmax that survives a row of -inf, and zeroes masked rows.
                    let max = biased.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let max = if max == f64::NEG_INFINITY { 0.0 } else { max };
                    let mut sum = 0.0;
                    for j in 0..t {
                        probs[j] = (biased[j] - max).exp();
                        sum += probs[j];
                    }
                    let sum = if sum == 0.0 { 1.0 } else { sum };
                    for p in probs.iter_mut() {
                        *p = if row_masked { 0.0 } else { *p / sum };
                    }
                    for j in 0..t {
                        qk_out[[b, h, i, j]] = match mode {
                            2 => biased[j],
                            3 => probs[j],
                            _ => scores[j],
                        };
                    }
                    for e in 0..dv {
                        y[[b, h, i, e]] = (0..t).map(|j| probs[j] * v[[b, hk, j, e]]).sum();
                    }
                }
            }
        }
        let y = if lay.three_d {
            y.permuted_axes(IxDyn(&[0, 2, 1, 3]))
                .as_standard_layout()
                .into_owned()
                .into_shape_with_order(IxDyn(&[b_n, sq, hq * dv]))
                .map_err(|e| e.to_string())?
        } else {
            y
        };
        Ok(vec![
            Tensor::from_f64_array(dtype, y),
            Tensor::from_f64_array(dtype, k),
            Tensor::from_f64_array(dtype, v),
            Tensor::from_f64_array(dtype, qk_out),
        ])
    }
}

// ---------------------------------------------------------------- RotaryEmbedding

struct RotaryEmbedding;

const ROTARY_EMBEDDING: OpSchema = OpSchema {
    name: "RotaryEmbedding",
    family: "attention",
    inputs: &["X", "cos_cache", "sin_cache", "position_ids?"],
    outputs: &["Y"],
    attrs: &[
        AttrSpec::opt("interleaved", AttrKind::Int, "0"),
        AttrSpec::opt("num_heads", AttrKind::Int, "3-D input only"),
        AttrSpec::opt("rotary_embedding_dim", AttrKind::Int, "the head size"),
    ],
    doc: "Rotates the first rotary_embedding_dim features of each head of X ([B, H, S, D], \
          or [B, S, H*D] with num_heads) by the angles whose cosines and sines are the \
          caches ([B, S, dim/2], or rows picked by position_ids [B, S]): pairs are the two \
          halves, or neighbours when interleaved.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

impl Op for RotaryEmbedding {
    fn schema(&self) -> &OpSchema {
        &ROTARY_EMBEDDING
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (x, cos, sin) = (cx.input(0)?, cx.input(1)?, cx.input(2)?);
        let dtype = same_dtype("RotaryEmbedding", &[x, cos, sin])?;
        if !dtype.is_float() {
            return Err(format!("X and the caches must be float, got {dtype}"));
        }
        match x.rank() {
            4 => {}
            3 if heads_attr(cx.attrs, "num_heads")?.is_some() => {}
            3 => return Err("a 3-D X needs num_heads".into()),
            r => return Err(format!("X must be 3-D or 4-D, got rank {r}")),
        }
        if let Some(p) = cx.opt_input(3) {
            if p.dtype != DType::I64 || p.rank() != 2 {
                return Err(format!("position_ids must be i64 [B, S], got {p}"));
            }
        }
        Ok(vec![x.clone()])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let xt = cx.input(0)?;
        let x = xt.to_f64_array();
        let (cos, sin) = (cx.input(1)?.to_f64_array(), cx.input(2)?.to_f64_array());
        let positions = cx.opt_input(3).map(|p| p.to_i64_array());
        let s = x.shape().to_vec();
        // (batch, seq, heads, head size) and where element (b, t, h, e) lives in X.
        let (b_n, s_n, h_n, d) = if s.len() == 4 {
            (s[0], s[2], s[1], s[3])
        } else {
            let h = heads_attr(cx.attrs, "num_heads")?.ok_or("a 3-D X needs num_heads")?;
            if s[2] % h != 0 {
                return Err(format!(
                    "hidden size {} is not a multiple of {h} heads",
                    s[2]
                ));
            }
            (s[0], s[1], h, s[2] / h)
        };
        let at = |b: usize, t: usize, h: usize, e: usize| -> Vec<usize> {
            if s.len() == 4 {
                vec![b, h, t, e]
            } else {
                vec![b, t, h * d + e]
            }
        };
        let dim = match rotary_dim(cx.attrs)? {
            Some(r) if r <= d && r % 2 == 0 => r,
            Some(r) => {
                return Err(format!(
                    "rotary_embedding_dim {r} must be even and at most {d}"
                ))
            }
            None => d,
        };
        let half = dim / 2;
        let interleaved = cx.attrs.int_or("interleaved", 0)? != 0;
        // The cache row of (b, t): picked by position_ids, or the cache's own [b, t].
        let row = |cache: &ArrayD<f64>, b: usize, t: usize| -> Result<Vec<f64>, String> {
            let idx: Vec<usize> = match &positions {
                Some(p) => {
                    let pos = *p.get(IxDyn(&[b, t])).ok_or("position_ids do not cover X")?;
                    let n = cache.shape()[0] as i64;
                    if pos < 0 || pos >= n || cache.ndim() != 2 {
                        return Err(format!("position {pos} is outside a cache of {n} rows"));
                    }
                    vec![pos as usize]
                }
                None if cache.ndim() == 3 => vec![b, t],
                None => {
                    return Err(format!(
                        "without position_ids the caches must be [B, S, {half}]"
                    ))
                }
            };
            let last = *cache.shape().last().unwrap_or(&0);
            if last != half {
                return Err(format!(
                    "the caches' last axis is {last}, not rotary_embedding_dim / 2 = {half}"
                ));
            }
            (0..half)
                .map(|k| {
                    let mut i = idx.clone();
                    i.push(k);
                    cache
                        .get(IxDyn(&i))
                        .copied()
                        .ok_or_else(|| "the caches do not cover X".to_string())
                })
                .collect()
        };
        let mut y = x.clone();
        for b in 0..b_n {
            for t in 0..s_n {
                let (c, sn) = (row(&cos, b, t)?, row(&sin, b, t)?);
                for h in 0..h_n {
                    for k in 0..half {
                        let (i, j) = if interleaved {
                            (2 * k, 2 * k + 1)
                        } else {
                            (k, k + half)
                        };
                        let (x1, x2) = (x[IxDyn(&at(b, t, h, i))], x[IxDyn(&at(b, t, h, j))]);
                        y[IxDyn(&at(b, t, h, i))] = c[k] * x1 - sn[k] * x2;
                        y[IxDyn(&at(b, t, h, j))] = sn[k] * x1 + c[k] * x2;
                    }
                }
            }
        }
        Ok(vec![Tensor::from_f64_array(xt.dtype(), y)])
    }
}

/// `rotary_embedding_dim`; 0 means the whole head.
fn rotary_dim(attrs: &Attrs) -> Result<Option<usize>, String> {
    match attrs.int("rotary_embedding_dim")? {
        None | Some(0) => Ok(None),
        Some(r) if r > 0 => Ok(Some(r as usize)),
        Some(r) => Err(format!(
            "rotary_embedding_dim must not be negative, got {r}"
        )),
    }
}

pub(crate) fn ops() -> Vec<&'static dyn Op> {
    vec![leak(Attention), leak(RotaryEmbedding)]
}
