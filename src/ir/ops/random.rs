//! Randomness: Dropout, with a counter-based generator.
//!
//! Element `i`'s random bits are a pure function of `(seed, counter, i)` (a splitmix64
//! finalizer chain, [`bits`]), not a stream drawn in order, so any split of the elements
//! over threads gives the same result, and a kernel may compute any element on its own.
//! `counter` is a Kiln-only input: a training graph feeds it from a `Variable` that an
//! `Assign` increments every run (`crate::train::dropout_training`), which gives a fresh
//! mask per step without recompiling.
use super::{leak, AttrSpec, EvalCtx, InferCtx, Op, OpSchema};
use crate::ir::ops::{InPlace, Origin};
use crate::ir::{AttrKind, Attrs, DType, TensorType};
use crate::tensor::Tensor;

/// splitmix64's finalizer: a bijection of u64 whose output bits each depend on every
/// input bit (Steele, Lea and Flood, "Fast splittable pseudorandom number generators").
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// The stream key for one (seed, counter) pair: the counter is mixed before it meets
/// the seed, so that neighbouring counters give unrelated keys.
pub(crate) fn stream_key(seed: i64, counter: i64) -> u64 {
    mix64((seed as u64) ^ mix64((counter as u64).wrapping_add(GOLDEN)))
}

/// 64 random bits for element `i` of the stream `key`: splitmix64's `i`-th output.
pub(crate) fn bits(key: u64, i: u64) -> u64 {
    mix64(key.wrapping_add(i.wrapping_add(1).wrapping_mul(GOLDEN)))
}

/// A uniform draw in [0, 1) from the top 53 bits.
pub(crate) fn uniform(key: u64, i: u64) -> f64 {
    (bits(key, i) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Whether element `i` is kept by a dropout of `ratio` on stream `key`.
pub(crate) fn keep(key: u64, i: u64, ratio: f64) -> bool {
    uniform(key, i) >= ratio
}

struct Dropout;

const DROPOUT: OpSchema = OpSchema {
    name: "Dropout",
    family: "random",
    inputs: &["data", "ratio?", "training_mode?", "counter?"],
    outputs: &["output", "mask"],
    attrs: &[AttrSpec::opt("seed", AttrKind::Int, "0")],
    doc: "In training mode (training_mode true), output = data · mask / (1 − ratio) where \
          mask[i] is false with probability ratio (default 0.5, in [0, 1)); otherwise \
          output = data and mask is all true. mask[i] is a pure function of (seed, counter, \
          i): the same on every run, backend and thread count. Kiln-only: the optional \
          i64 scalar input `counter`, mixed with `seed`, so that a graph can draw a fresh \
          mask per run (seed defaults to 0, not to a random value as in ONNX).",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

/// Checks that input `i`, if given, is a scalar (one element) whose dtype passes `ok`.
fn scalar_input(
    cx: &InferCtx<'_>,
    i: usize,
    name: &str,
    ok: fn(DType) -> bool,
    what: &str,
) -> Result<(), String> {
    if let Some(t) = cx.opt_input(i) {
        if !ok(t.dtype) || t.num_elements() != Some(1) {
            return Err(format!("input {i} ({name}) must be {what} scalar, got {t}"));
        }
    }
    Ok(())
}

fn check_ratio(ratio: f64) -> Result<f64, String> {
    if (0.0..1.0).contains(&ratio) {
        Ok(ratio)
    } else {
        Err(format!("ratio must be in [0, 1), got {ratio}"))
    }
}

fn seed(attrs: &Attrs) -> Result<i64, String> {
    attrs.int_or("seed", 0)
}

impl Op for Dropout {
    fn schema(&self) -> &OpSchema {
        &DROPOUT
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        if !x.dtype.is_float() {
            return Err(format!(
                "input 0 (data) must be a float type, got {}",
                x.dtype
            ));
        }
        scalar_input(cx, 1, "ratio", DType::is_float, "a float")?;
        scalar_input(cx, 2, "training_mode", |d| d == DType::Bool, "a bool")?;
        scalar_input(cx, 3, "counter", DType::is_int, "an integer")?;
        if let Some(r) = cx.const_input(1) {
            check_ratio(r.to_f64_vec()[0])?;
        }
        seed(cx.attrs)?;
        let mask = TensorType::new(DType::Bool, x.shape.clone());
        Ok(vec![x.clone(), mask])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let ratio = check_ratio(cx.opt_input(1).map_or(0.5, |r| r.to_f64_vec()[0]))?;
        let training = cx.opt_input(2).is_some_and(|t| t.to_f64_vec()[0] != 0.0);
        if !training {
            let all = Tensor::from_vec(x.shape(), vec![true; x.len()])?;
            return Ok(vec![x.clone(), all]);
        }
        let counter = cx.opt_input(3).map_or(0, |c| c.to_i64_vec()[0]);
        let key = stream_key(seed(cx.attrs)?, counter);
        // Standard (row-major) order: element i is the i-th of the flat data.
        let mask: Vec<bool> = (0..x.len() as u64).map(|i| keep(key, i, ratio)).collect();
        let scale = 1.0 / (1.0 - ratio);
        let y: Vec<f64> = x
            .to_f64_vec()
            .iter()
            .zip(&mask)
            // A dropped element is v·0 (as in ONNX): NaN stays NaN.
            .map(|(&v, &m)| if m { v * scale } else { v * 0.0 })
            .collect();
        Ok(vec![
            Tensor::from_f64s(x.dtype(), x.shape(), &y)?,
            Tensor::from_vec(x.shape(), mask)?,
        ])
    }
}

pub(crate) fn ops() -> Vec<&'static dyn Op> {
    vec![leak(Dropout)]
}
