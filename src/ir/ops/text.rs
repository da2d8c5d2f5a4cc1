//! Text features: TfIdfVectorizer over integer or string tokens.
use crate::ir::ops::{InPlace, Origin};
use std::collections::HashMap;

use ndarray::{ArrayD, IxDyn};

use super::{leak, AttrSpec, EvalCtx, InferCtx, Op, OpSchema, Takes};
use crate::ir::{AttrKind, Attrs, DType, Dim, Shape, TensorType};
use crate::tensor::Tensor;

struct TfIdfVectorizer;

const TF_IDF_VECTORIZER: OpSchema = OpSchema {
    name: "TfIdfVectorizer",
    family: "text",
    inputs: &["X"],
    outputs: &["Y"],
    attrs: &[
        AttrSpec::req("max_gram_length", AttrKind::Int),
        AttrSpec::req("max_skip_count", AttrKind::Int),
        AttrSpec::req("min_gram_length", AttrKind::Int),
        AttrSpec::req("mode", AttrKind::String),
        AttrSpec::req("ngram_counts", AttrKind::Ints),
        AttrSpec::req("ngram_indexes", AttrKind::Ints),
        AttrSpec::opt("pool_int64s", AttrKind::Ints, "this or pool_strings"),
        AttrSpec::opt("pool_strings", AttrKind::Strings, "this or pool_int64s"),
        AttrSpec::opt("weights", AttrKind::Floats, "1 per n-gram"),
    ],
    doc: "Counts the pool's n-grams (min_gram_length..max_gram_length tokens, taken \
          every 1..max_skip_count+1 tokens; unigrams once) in each row of X ([C] or \
          [B, C]; integers for pool_int64s, strings for pool_strings) into f32 Y [..., max(ngram_indexes) + 1]: mode TF (counts), \
          IDF (weight where present) or TFIDF (count x weight).",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

/// The pool's n-grams: the tokens of each in-range n-gram to its output column.
struct Pool {
    grams: HashMap<Vec<i64>, usize>,
    columns: usize,
    min: usize,
    max: usize,
    max_skip: usize,
    mode: Mode,
    weights: Vec<f64>,
    /// For `pool_strings`: each pool string's token id (its first position).
    string_ids: Option<HashMap<String, i64>>,
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Tf,
    Idf,
    TfIdf,
}

fn pool(attrs: &Attrs) -> Result<Pool, String> {
    // A string pool becomes ids: equal strings, equal ids.
    let (tokens, string_ids): (Vec<i64>, _) =
        match (attrs.ints("pool_int64s")?, attrs.strings("pool_strings")?) {
            (Some(ints), None) => (ints.to_vec(), None),
            (None, Some(strings)) => {
                let mut ids: HashMap<String, i64> = HashMap::new();
                let tokens = strings
                    .iter()
                    .enumerate()
                    .map(|(i, s)| *ids.entry(s.clone()).or_insert(i as i64))
                    .collect();
                (tokens, Some(ids))
            }
            _ => return Err("exactly one of pool_int64s and pool_strings is required".into()),
        };
    let counts = attrs
        .ints("ngram_counts")?
        .ok_or("ngram_counts is required")?;
    let indexes = attrs
        .ints("ngram_indexes")?
        .ok_or("ngram_indexes is required")?;
    let int = |name| -> Result<usize, String> {
        let v = attrs.req_int(name)?;
        usize::try_from(v).map_err(|_| format!("{name} must not be negative, got {v}"))
    };
    let (min, max, max_skip) = (
        int("min_gram_length")?,
        int("max_gram_length")?,
        int("max_skip_count")?,
    );
    if min < 1 || min > max {
        return Err(format!(
            "need 1 <= min_gram_length {min} <= max_gram_length {max}"
        ));
    }
    let mode = match attrs.string_or("mode", "")? {
        "TF" => Mode::Tf,
        "IDF" => Mode::Idf,
        "TFIDF" => Mode::TfIdf,
        m => return Err(format!("mode must be TF, IDF or TFIDF, got '{m}'")),
    };
    if indexes.iter().any(|&i| i < 0) {
        return Err("ngram_indexes must not be negative".into());
    }
    let columns = indexes.iter().map(|&i| i as usize + 1).max().unwrap_or(0);
    // Section k of the pool (from ngram_counts[k]) holds the (k+1)-grams; ids run over
    // all sections in order, in-range sizes or not.
    let mut grams = HashMap::new();
    let mut id = 0usize;
    for (k, &start) in counts.iter().enumerate() {
        let end = counts.get(k + 1).copied().unwrap_or(tokens.len() as i64);
        let (start, end) = (start as usize, end as usize);
        if start > end || end > tokens.len() {
            return Err(format!(
                "ngram_counts {counts:?} do not fit a pool of {}",
                tokens.len()
            ));
        }
        let n = k + 1;
        for gram in tokens[start..end].chunks(n).filter(|g| g.len() == n) {
            if (min..=max).contains(&n) {
                let column = *indexes
                    .get(id)
                    .ok_or_else(|| format!("ngram_indexes has no entry for n-gram {id}"))?;
                grams.insert(gram.to_vec(), column as usize);
            }
            id += 1;
        }
    }
    let weights = attrs.floats("weights")?.unwrap_or_default();
    if !weights.is_empty() && weights.len() < columns {
        return Err(format!(
            "weights has {} values for {columns} columns",
            weights.len()
        ));
    }
    Ok(Pool {
        grams,
        columns,
        min,
        max,
        max_skip,
        mode,
        weights,
        string_ids,
    })
}

impl Op for TfIdfVectorizer {
    fn schema(&self) -> &OpSchema {
        &TF_IDF_VECTORIZER
    }

    fn takes(&self) -> Takes {
        Takes::Strings
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        let p = pool(cx.attrs)?;
        match (p.string_ids.is_some(), x.dtype) {
            (false, DType::I32 | DType::I64) | (true, DType::String) => {}
            (false, d) => return Err(format!("X must be i32 or i64 tokens, got {d}")),
            (true, d) => return Err(format!("X must be string tokens for pool_strings, got {d}")),
        }
        if x.rank() > 2 {
            return Err(format!("X must be [C] or [B, C], got {x}"));
        }
        let mut dims: Vec<Dim> = if x.rank() == 2 {
            vec![x.shape.dim(0).clone()]
        } else {
            vec![]
        };
        dims.push(Dim::Fixed(p.columns));
        Ok(vec![TensorType::new(DType::F32, Shape::new(dims))])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let p = pool(cx.attrs)?;
        let tokens = match (&p.string_ids, x) {
            // A token outside the pool gets an id no pool entry has.
            (Some(ids), Tensor::String(a)) => a
                .iter()
                .map(|s| ids.get(s).copied().unwrap_or(-1))
                .collect(),
            (None, _) if x.dtype().is_int() => x.to_i64_vec(),
            _ => return Err(format!("X of {} does not fit the pool", x.dtype())),
        };
        let (rows, width) = match x.shape() {
            [b, c] => (*b, *c),
            [c] => (1, *c),
            _ => (1, tokens.len()),
        };
        let mut counts = vec![0u64; rows * p.columns];
        for r in 0..rows {
            let row = &tokens[r * width..(r + 1) * width];
            for skip in 1..=p.max_skip + 1 {
                // Unigrams are counted once, at the first skip distance.
                let smallest = if skip > 1 { p.min.max(2) } else { p.min };
                for start in 0..row.len() {
                    for n in smallest..=p.max {
                        let last = start + skip * (n - 1);
                        if last >= row.len() {
                            break;
                        }
                        let gram: Vec<i64> = (0..n).map(|k| row[start + skip * k]).collect();
                        if let Some(&c) = p.grams.get(&gram) {
                            counts[r * p.columns + c] += 1;
                        }
                    }
                }
            }
        }
        let weight = |c: usize| p.weights.get(c).copied().unwrap_or(1.0);
        let y: Vec<f64> = counts
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let c = i % p.columns.max(1);
                match p.mode {
                    Mode::Tf => n as f64,
                    Mode::Idf => {
                        if n > 0 {
                            weight(c)
                        } else {
                            0.0
                        }
                    }
                    Mode::TfIdf => n as f64 * weight(c),
                }
            })
            .collect();
        let shape = if x.rank() == 2 {
            vec![rows, p.columns]
        } else {
            vec![p.columns]
        };
        let y = ArrayD::from_shape_vec(IxDyn(&shape), y).map_err(|e| e.to_string())?;
        Ok(vec![Tensor::from_f64_array(DType::F32, y)])
    }
}

pub(crate) fn ops() -> Vec<&'static dyn Op> {
    vec![leak(TfIdfVectorizer)]
}
