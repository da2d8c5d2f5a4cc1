//! String ops: StringNormalizer, StringConcat, StringSplit, RegexFullMatch (RE2 syntax,
//! through the `regex` crate, which implements it), and `ai.onnx.ml`'s LabelEncoder,
//! which maps strings, integers or floats to any of them.
use crate::ir::ops::{InPlace, Origin};
use ndarray::{ArrayD, IxDyn, Zip};

use super::elementwise::broadcast_dims;
use super::{leak, AttrSpec, EvalCtx, InferCtx, Op, OpSchema, Takes};
use crate::ir::shape::broadcast_shapes;
use crate::ir::{AttrKind, Attrs, DType, Dim, Shape, TensorType};
use crate::tensor::Tensor;

/// An error unless input `i` is a string tensor.
fn string_input<'a>(cx: &InferCtx<'a>, i: usize, name: &str) -> Result<&'a TensorType, String> {
    let t = cx.input(i)?;
    if !t.dtype.is_string() {
        return Err(format!("{name} must be a string tensor, got {t}"));
    }
    Ok(t)
}

fn strings<'a>(cx: &EvalCtx<'a>, i: usize, name: &str) -> Result<&'a ArrayD<String>, String> {
    match cx.input(i)? {
        Tensor::String(a) => Ok(a),
        t => Err(format!("{name} must be a string tensor, got {}", t.dtype())),
    }
}

// ------------------------------------------------------------------ StringNormalizer

struct StringNormalizer;

const STRING_NORMALIZER: OpSchema = OpSchema {
    name: "StringNormalizer",
    family: "strings",
    inputs: &["X"],
    outputs: &["Y"],
    attrs: &[
        AttrSpec::opt("case_change_action", AttrKind::String, "NONE"),
        AttrSpec::opt("is_case_sensitive", AttrKind::Int, "0"),
        AttrSpec::opt("locale", AttrKind::String, "en_US (Unicode case rules)"),
        AttrSpec::opt("stopwords", AttrKind::Strings, "none"),
    ],
    doc: "Removes the elements of string X ([C] or [1, C]) equal to a stopword (ignoring \
          case unless is_case_sensitive), then changes the rest's case (LOWER, UPPER or \
          NONE) by Unicode's rules; Y is [C'] or [1, C'], or [\"\"] when nothing is left.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

#[derive(Clone, Copy)]
enum CaseChange {
    Lower,
    Upper,
    None,
}

struct Normalizer {
    case: CaseChange,
    sensitive: bool,
    stopwords: Vec<String>,
}

fn normalizer(attrs: &Attrs) -> Result<Normalizer, String> {
    let case = match attrs.string_or("case_change_action", "NONE")? {
        "LOWER" => CaseChange::Lower,
        "UPPER" => CaseChange::Upper,
        "NONE" => CaseChange::None,
        other => {
            return Err(format!(
                "case_change_action must be LOWER, UPPER or NONE, got '{other}'"
            ))
        }
    };
    let sensitive = attrs.int_or("is_case_sensitive", 0)? != 0;
    let stopwords = attrs
        .strings("stopwords")?
        .unwrap_or(&[])
        .iter()
        .map(|w| {
            if sensitive {
                w.clone()
            } else {
                w.to_lowercase()
            }
        })
        .collect();
    Ok(Normalizer {
        case,
        sensitive,
        stopwords,
    })
}

impl Normalizer {
    fn stopword(&self, s: &str) -> bool {
        if self.sensitive {
            self.stopwords.iter().any(|w| w == s)
        } else {
            let lower = s.to_lowercase();
            self.stopwords.contains(&lower)
        }
    }

    fn change_case(&self, s: &str) -> String {
        match self.case {
            CaseChange::Lower => s.to_lowercase(),
            CaseChange::Upper => s.to_uppercase(),
            CaseChange::None => s.to_string(),
        }
    }
}

impl Op for StringNormalizer {
    fn schema(&self) -> &OpSchema {
        &STRING_NORMALIZER
    }

    fn takes(&self) -> Takes {
        Takes::Strings
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = string_input(cx, 0, "X")?;
        normalizer(cx.attrs)?;
        let kept = cx.fresh_dim(0, x.rank().saturating_sub(1));
        let dims = match x.rank() {
            1 => vec![kept],
            2 if x.shape.dim(0).fixed().is_none_or(|n| n == 1) => vec![Dim::Fixed(1), kept],
            _ => return Err(format!("X must be [C] or [1, C], got {x}")),
        };
        Ok(vec![TensorType::new(DType::String, Shape::new(dims))])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = strings(cx, 0, "X")?;
        let n = normalizer(cx.attrs)?;
        if x.ndim() == 2 && x.shape()[0] != 1 {
            return Err(format!("X must be [C] or [1, C], got {:?}", x.shape()));
        }
        let mut kept: Vec<String> = x
            .iter()
            .filter(|s| !n.stopword(s))
            .map(|s| n.change_case(s))
            .collect();
        if kept.is_empty() {
            kept.push(String::new());
        }
        let shape = if x.ndim() == 2 {
            vec![1, kept.len()]
        } else {
            vec![kept.len()]
        };
        Ok(vec![Tensor::from_strings(&shape, kept)?])
    }
}

// ---------------------------------------------------------------------- StringConcat

struct StringConcat;

const STRING_CONCAT: OpSchema = OpSchema {
    name: "StringConcat",
    family: "strings",
    inputs: &["X", "Y"],
    outputs: &["Z"],
    attrs: &[],
    doc: "Z = X followed by Y, string tensors broadcast as numpy does.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

impl Op for StringConcat {
    fn schema(&self) -> &OpSchema {
        &STRING_CONCAT
    }

    fn takes(&self) -> Takes {
        Takes::Strings
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (x, y) = (string_input(cx, 0, "X")?, string_input(cx, 1, "Y")?);
        let shape = broadcast_shapes(&x.shape, &y.shape)?;
        Ok(vec![TensorType::new(DType::String, shape)])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let (x, y) = (strings(cx, 0, "X")?, strings(cx, 1, "Y")?);
        let shape = broadcast_dims(x.shape(), y.shape())?;
        let (Some(xb), Some(yb)) = (x.broadcast(IxDyn(&shape)), y.broadcast(IxDyn(&shape))) else {
            return Err(format!(
                "cannot broadcast {:?} with {:?}",
                x.shape(),
                y.shape()
            ));
        };
        let z = Zip::from(&xb)
            .and(&yb)
            .map_collect(|a, b| format!("{a}{b}"));
        Ok(vec![Tensor::String(z)])
    }
}

// ----------------------------------------------------------------------- StringSplit

struct StringSplit;

const STRING_SPLIT: OpSchema = OpSchema {
    name: "StringSplit",
    family: "strings",
    inputs: &["X"],
    outputs: &["Y", "Z"],
    attrs: &[
        AttrSpec::opt("delimiter", AttrKind::String, "runs of whitespace"),
        AttrSpec::opt("maxsplit", AttrKind::Int, "unlimited"),
    ],
    doc: "Splits each string of X at delimiter (none or empty: at runs of whitespace, \
          ignoring leading and trailing ones), at most maxsplit times from the left, as \
          Python's str.split does (but a last part keeps no trailing whitespace). Y is X's shape plus an axis as long as the most \
          parts, padded with empty strings; Z (i64, X's shape) each string's part count.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

/// Python's `str.isspace` characters.
fn python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// `s.split(delimiter, maxsplit)` as Python computes it, but for trailing whitespace.
fn split(s: &str, delimiter: Option<&str>, maxsplit: Option<usize>) -> Vec<String> {
    let limit = maxsplit.unwrap_or(usize::MAX);
    if let Some(d) = delimiter {
        return s
            .splitn(limit.saturating_add(1), d)
            .map(String::from)
            .collect();
    }
    // The spec removes leading and trailing whitespace first (so does onnxruntime);
    // Python keeps the trailing whitespace of a part that maxsplit left whole.
    let mut parts = vec![];
    let mut rest = s.trim_matches(python_space);
    while !rest.is_empty() {
        if parts.len() == limit {
            parts.push(rest.to_string());
            break;
        }
        let end = rest.find(python_space).unwrap_or(rest.len());
        parts.push(rest[..end].to_string());
        rest = rest[end..].trim_start_matches(python_space);
    }
    parts
}

fn split_attrs(attrs: &Attrs) -> Result<(Option<&str>, Option<usize>), String> {
    let delimiter = attrs.string("delimiter")?.filter(|d| !d.is_empty());
    // A negative maxsplit means no limit, as in Python.
    let maxsplit = attrs.int("maxsplit")?.and_then(|m| usize::try_from(m).ok());
    Ok((delimiter, maxsplit))
}

impl Op for StringSplit {
    fn schema(&self) -> &OpSchema {
        &STRING_SPLIT
    }

    fn takes(&self) -> Takes {
        Takes::Strings
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = string_input(cx, 0, "X")?;
        split_attrs(cx.attrs)?;
        let mut dims: Vec<Dim> = x.shape.axes.iter().map(|a| a.dim.clone()).collect();
        dims.push(cx.fresh_dim(0, x.rank()));
        Ok(vec![
            TensorType::new(DType::String, Shape::new(dims)),
            TensorType::new(DType::I64, x.shape.clone()),
        ])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = strings(cx, 0, "X")?;
        let (delimiter, maxsplit) = split_attrs(cx.attrs)?;
        let parts: Vec<Vec<String>> = x.iter().map(|s| split(s, delimiter, maxsplit)).collect();
        let width = parts.iter().map(Vec::len).max().unwrap_or(0);
        let mut shape = x.shape().to_vec();
        shape.push(width);
        super::util::check_size(&shape)?;
        let counts: Vec<i64> = parts.iter().map(|p| p.len() as i64).collect();
        let mut y = Vec::with_capacity(parts.len() * width);
        for mut p in parts {
            p.resize(width, String::new());
            y.extend(p);
        }
        Ok(vec![
            Tensor::from_strings(&shape, y)?,
            Tensor::from_vec(x.shape(), counts)?,
        ])
    }
}

// -------------------------------------------------------------------- RegexFullMatch

struct RegexFullMatch;

const REGEX_FULL_MATCH: OpSchema = OpSchema {
    name: "RegexFullMatch",
    family: "strings",
    inputs: &["X"],
    outputs: &["Y"],
    attrs: &[AttrSpec::req("pattern", AttrKind::String)],
    doc: "Y (bool, X's shape): whether the whole of each string of X matches pattern \
          (RE2 syntax).",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

/// The pattern, anchored at both ends; a malformed one is an error quoting it.
fn full_match_regex(attrs: &Attrs) -> Result<regex::Regex, String> {
    let pattern = attrs.string("pattern")?.ok_or("pattern is required")?;
    regex::Regex::new(&format!("^(?:{pattern})$"))
        .map_err(|e| format!("pattern '{pattern}' is not a valid regular expression: {e}"))
}

impl Op for RegexFullMatch {
    fn schema(&self) -> &OpSchema {
        &REGEX_FULL_MATCH
    }

    fn takes(&self) -> Takes {
        Takes::Strings
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = string_input(cx, 0, "X")?;
        full_match_regex(cx.attrs)?;
        Ok(vec![TensorType::new(DType::Bool, x.shape.clone())])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = strings(cx, 0, "X")?;
        let re = full_match_regex(cx.attrs)?;
        Ok(vec![Tensor::Bool(x.map(|s| re.is_match(s)))])
    }
}

// ---------------------------------------------------------------------- LabelEncoder

struct LabelEncoder;

const LABEL_ENCODER: OpSchema = OpSchema {
    name: "LabelEncoder",
    family: "strings",
    inputs: &["X"],
    outputs: &["Y"],
    attrs: &[
        AttrSpec::opt("default_float", AttrKind::Float, "-0.0"),
        AttrSpec::opt("default_int64", AttrKind::Int, "-1"),
        AttrSpec::opt("default_string", AttrKind::String, "_Unused"),
        AttrSpec::opt("keys_floats", AttrKind::Floats, "one keys_ list"),
        AttrSpec::opt("keys_int64s", AttrKind::Ints, "one keys_ list"),
        AttrSpec::opt("keys_strings", AttrKind::Strings, "one keys_ list"),
        AttrSpec::opt("values_floats", AttrKind::Floats, "one values_ list"),
        AttrSpec::opt("values_int64s", AttrKind::Ints, "one values_ list"),
        AttrSpec::opt("values_strings", AttrKind::Strings, "one values_ list"),
    ],
    doc: "ONNX-ML's LabelEncoder: each element of X (strings for keys_strings, integers \
          for keys_int64s, floats for keys_floats; NaN matches no key) replaced by the \
          value of its key, or the default where it has none. Y has X's shape and the \
          values' dtype: string, i64 or f32.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

#[derive(Debug)]
pub(crate) enum Keys<'a> {
    Floats(Vec<f64>),
    Ints(&'a [i64]),
    Strings(&'a [String]),
}

#[derive(Debug)]
pub(crate) enum Values<'a> {
    Floats(Vec<f64>, f64),
    Ints(&'a [i64], i64),
    Strings(&'a [String], &'a str),
}

impl Keys<'_> {
    fn len(&self) -> usize {
        match self {
            Keys::Floats(v) => v.len(),
            Keys::Ints(v) => v.len(),
            Keys::Strings(v) => v.len(),
        }
    }

    fn fits(&self, x: DType) -> bool {
        match self {
            Keys::Floats(_) => x.is_float(),
            Keys::Ints(_) => x.is_int(),
            Keys::Strings(_) => x.is_string(),
        }
    }

    fn what(&self) -> &'static str {
        match self {
            Keys::Floats(_) => "keys_floats needs a float X",
            Keys::Ints(_) => "keys_int64s needs an integer X",
            Keys::Strings(_) => "keys_strings needs a string X",
        }
    }
}

impl Values<'_> {
    fn len(&self) -> usize {
        match self {
            Values::Floats(v, _) => v.len(),
            Values::Ints(v, _) => v.len(),
            Values::Strings(v, _) => v.len(),
        }
    }

    fn dtype(&self) -> DType {
        match self {
            Values::Floats(..) => DType::F32,
            Values::Ints(..) => DType::I64,
            Values::Strings(..) => DType::String,
        }
    }

    /// Y from each element's key position (`None`: the default).
    fn gather(&self, shape: &[usize], at: &[Option<usize>]) -> Result<Tensor, String> {
        match self {
            Values::Floats(v, d) => {
                let y: Vec<f64> = at.iter().map(|k| k.map_or(*d, |k| v[k])).collect();
                Tensor::from_f64s(DType::F32, shape, &y)
            }
            Values::Ints(v, d) => {
                let y: Vec<i64> = at.iter().map(|k| k.map_or(*d, |k| v[k])).collect();
                Tensor::from_vec(shape, y)
            }
            Values::Strings(v, d) => {
                let y: Vec<String> = at
                    .iter()
                    .map(|k| k.map_or(d.to_string(), |k| v[k].clone()))
                    .collect();
                Tensor::from_strings(shape, y)
            }
        }
    }
}

/// LabelEncoder's keys and values (with the default) from its attributes.
pub(crate) fn label_encoder(attrs: &Attrs) -> Result<(Keys<'_>, Values<'_>), String> {
    let keys = match (
        attrs.floats("keys_floats")?,
        attrs.ints("keys_int64s")?,
        attrs.strings("keys_strings")?,
    ) {
        (Some(f), None, None) => Keys::Floats(f),
        (None, Some(i), None) => Keys::Ints(i),
        (None, None, Some(s)) => Keys::Strings(s),
        _ => {
            return Err(
                "exactly one of keys_floats, keys_int64s and keys_strings is required".into(),
            )
        }
    };
    let values = match (
        attrs.floats("values_floats")?,
        attrs.ints("values_int64s")?,
        attrs.strings("values_strings")?,
    ) {
        (Some(f), None, None) => Values::Floats(f, attrs.float_or("default_float", -0.0)?),
        (None, Some(i), None) => Values::Ints(i, attrs.int_or("default_int64", -1)?),
        (None, None, Some(s)) => Values::Strings(s, attrs.string_or("default_string", "_Unused")?),
        _ => {
            return Err(
                "exactly one of values_floats, values_int64s and values_strings is required".into(),
            )
        }
    };
    if keys.len() != values.len() {
        return Err(format!("{} keys for {} values", keys.len(), values.len()));
    }
    Ok((keys, values))
}

impl Op for LabelEncoder {
    fn schema(&self) -> &OpSchema {
        &LABEL_ENCODER
    }

    fn takes(&self) -> Takes {
        Takes::Strings
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        let (keys, values) = label_encoder(cx.attrs)?;
        if !keys.fits(x.dtype) {
            return Err(format!("{}, got X {x}", keys.what()));
        }
        Ok(vec![TensorType::new(values.dtype(), x.shape.clone())])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let (keys, values) = label_encoder(cx.attrs)?;
        // The first of equal keys wins; keys are few, a linear search is the reference.
        let at: Vec<Option<usize>> = match (&keys, x) {
            (Keys::Strings(k), Tensor::String(a)) => a
                .iter()
                .map(|s| k.iter().position(|key| key == s))
                .collect(),
            (Keys::Ints(k), _) if x.dtype().is_int() => x
                .to_i64_vec()
                .iter()
                .map(|v| k.iter().position(|key| key == v))
                .collect(),
            (Keys::Floats(k), _) if x.dtype().is_float() => x
                .to_f64_vec()
                .iter()
                .map(|v| k.iter().position(|key| key == v))
                .collect(),
            _ => return Err(format!("{}, got X {}", keys.what(), x.dtype())),
        };
        Ok(vec![values.gather(x.shape(), &at)?])
    }
}

pub(crate) fn ops() -> Vec<&'static dyn Op> {
    vec![
        leak(StringNormalizer),
        leak(StringConcat),
        leak(StringSplit),
        leak(RegexFullMatch),
        leak(LabelEncoder),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_follows_python() {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(split("  a b  c  ", None, None), s(&["a", "b", "c"]));
        assert_eq!(split("  a b  c  ", None, Some(1)), s(&["a", "b  c"]));
        assert_eq!(split("", None, None), s(&[]));
        assert_eq!(split("", Some("."), None), s(&[""]));
        assert_eq!(split("a..b", Some("."), None), s(&["a", "", "b"]));
        assert_eq!(split("a.b.c", Some("."), Some(1)), s(&["a", "b.c"]));
        assert_eq!(split("x\u{1f}y", None, None), s(&["x", "y"]));
    }
}
