//! Sequences and optionals: SequenceEmpty, SequenceConstruct, SequenceAt, SequenceInsert,
//! SequenceErase, SequenceLength, SplitToSequence, ConcatFromSequence, Optional,
//! OptionalHasElement, OptionalGetElement.
//!
//! A sequence's element type keeps only what every element shares (see `TensorType`),
//! so what takes an element out gives fresh symbols for the dims it cannot know.
use super::util::out;
use super::{evaluate, leak, lookup, AttrSpec, EvalCtx, InferCtx, Op, OpSchema, Takes};
use crate::ir::ops::{InPlace, Origin};
use crate::ir::shape::{norm_axis, ANY_DIM};
use crate::ir::{Attr, AttrKind, Attrs, Container, DType, Dim, Shape, TensorType};
use crate::tensor::{Optional, Sequence, Tensor};

pub(crate) fn ops() -> Vec<&'static dyn Op> {
    vec![
        leak(SequenceEmpty),
        leak(SequenceConstruct),
        leak(SequenceAt),
        leak(SequenceInsert),
        leak(SequenceErase),
        leak(SequenceLength),
        leak(SplitToSequence),
        leak(ConcatFromSequence),
        leak(OptionalOp),
        leak(OptionalHasElement),
        leak(OptionalGetElement),
    ]
}

/// The element shape two tensors share: fixed sizes where they agree, `?` elsewhere;
/// `None` (unknown rank) when the ranks differ or either is unknown.
fn shared_shape(a: Option<&Shape>, b: Option<&Shape>) -> Option<Shape> {
    let (a, b) = (a?, b?);
    if a.rank() != b.rank() {
        return None;
    }
    Some(Shape::new(a.dims().into_iter().zip(b.dims()).map(
        |(x, y)| match (x, y) {
            (Dim::Fixed(p), Dim::Fixed(q)) if p == q => Dim::Fixed(p),
            _ => Dim::Sym(ANY_DIM.into()),
        },
    )))
}

/// A type's shape if its rank is known.
fn known_shape(t: &TensorType) -> Option<&Shape> {
    t.ranked.then_some(&t.shape)
}

/// Input `i` as a sequence type, or an error naming it.
fn seq_input<'a>(cx: &InferCtx<'a>, i: usize) -> Result<&'a TensorType, String> {
    let t = cx.input(i)?;
    if t.container() != Some(Container::Seq) {
        return Err(format!("input {i} must be a sequence, got {t}"));
    }
    Ok(t)
}

/// Input `i` as a tensor type, or an error naming it.
fn tensor_input<'a>(cx: &InferCtx<'a>, i: usize) -> Result<&'a TensorType, String> {
    let t = cx.input(i)?;
    if !t.is_tensor() {
        return Err(format!("input {i} must be a tensor, got {t}"));
    }
    Ok(t)
}

/// An optional position input must be an integer scalar (or one-element) tensor.
fn check_position(cx: &InferCtx<'_>, i: usize) -> Result<(), String> {
    if let Some(t) = cx.opt_input(i) {
        if !t.is_tensor() || !matches!(t.dtype, DType::I32 | DType::I64) || t.rank() > 1 {
            return Err(format!(
                "input {i} (position) must be an i32 or i64 scalar, got {t}"
            ));
        }
    }
    Ok(())
}

/// The type of a value taken out of a sequence of `seq`: fresh symbols for unknown dims.
fn element_type(cx: &InferCtx<'_>, seq: &TensorType, what: &str) -> Result<TensorType, String> {
    let element = seq.unwrapped();
    if !element.ranked {
        return Err(format!(
            "{what}: the sequence's elements are of unknown rank ({seq}); declare their shape"
        ));
    }
    if !element.is_tensor() {
        return Ok(element);
    }
    let dims = element
        .shape
        .dims()
        .into_iter()
        .enumerate()
        .map(|(k, d)| match d {
            Dim::Sym(_) => cx.fresh_dim(0, k),
            d => d,
        })
        .collect::<Vec<_>>();
    Ok(TensorType::new(element.dtype, Shape::new(dims)))
}

fn the_sequence<'a>(cx: &EvalCtx<'a>, i: usize) -> Result<&'a Sequence, String> {
    match cx.input(i)? {
        Tensor::Sequence(s) => Ok(s),
        other => Err(format!(
            "input {i} must be a sequence, got {}",
            other.kind_name()
        )),
    }
}

/// A position input resolved against a length: `-n..n` (or `-n..=n` when `inclusive`).
fn position(
    cx: &EvalCtx<'_>,
    i: usize,
    len: usize,
    inclusive: bool,
) -> Result<Option<usize>, String> {
    let Some(p) = cx.opt_input(i) else {
        return Ok(None);
    };
    let v = p.to_i64_vec();
    let &[p] = v.as_slice() else {
        return Err(format!("position must hold one value, got {}", v.len()));
    };
    let n = i64::try_from(len).map_err(|_| "sequence too long")?;
    let hi = if inclusive { n } else { n - 1 };
    if p < -n || p > hi {
        return Err(format!(
            "position {p} is out of range for a sequence of {len} ({}..={hi})",
            -n
        ));
    }
    Ok(Some(if p < 0 { p + n } else { p } as usize))
}

/// An error unless `t` may be an item of `seq` (dtype and containers).
fn check_item(seq: &Sequence, t: &Tensor) -> Result<(), String> {
    if t.dtype() != seq.dtype || t.containers() != seq.inner {
        let want = Tensor::Sequence(Sequence {
            dtype: seq.dtype,
            inner: seq.inner.clone(),
            items: vec![],
        });
        return Err(format!(
            "a {} cannot go into a {}",
            t.kind_name(),
            want.kind_name()
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------- SequenceEmpty

struct SequenceEmpty;

const SEQUENCE_EMPTY: OpSchema = OpSchema {
    name: "SequenceEmpty",
    family: "sequence",
    inputs: &[],
    outputs: &["output"],
    attrs: &[AttrSpec::opt("dtype", AttrKind::String, "f32")],
    doc: "An empty sequence of `dtype` tensors.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

fn dtype_attr(attrs: &Attrs) -> Result<DType, String> {
    attrs
        .string_or("dtype", "f32")?
        .parse()
        .map_err(|e| format!("dtype: {e}"))
}

impl Op for SequenceEmpty {
    fn schema(&self) -> &OpSchema {
        &SEQUENCE_EMPTY
    }
    fn takes(&self) -> Takes {
        Takes::Any
    }
    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        Ok(vec![TensorType::sequence_of(dtype_attr(cx.attrs)?, None)])
    }
    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        Ok(vec![Tensor::Sequence(Sequence {
            dtype: dtype_attr(cx.attrs)?,
            inner: vec![],
            items: vec![],
        })])
    }
}

// ---------------------------------------------------------------- SequenceConstruct

struct SequenceConstruct;

const SEQUENCE_CONSTRUCT: OpSchema = OpSchema {
    name: "SequenceConstruct",
    family: "sequence",
    inputs: &["inputs..."],
    outputs: &["output_sequence"],
    attrs: &[],
    doc: "A sequence of the inputs, in order: tensors of one dtype.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

impl Op for SequenceConstruct {
    fn schema(&self) -> &OpSchema {
        &SEQUENCE_CONSTRUCT
    }
    fn takes(&self) -> Takes {
        Takes::Strings
    }
    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let first = tensor_input(cx, 0)?;
        let mut shape = known_shape(first).cloned();
        for i in 1..cx.inputs.len() {
            let t = tensor_input(cx, i)?;
            if t.dtype != first.dtype {
                return Err(format!(
                    "dtype mismatch: input 0 is {}, input {i} is {}",
                    first.dtype, t.dtype
                ));
            }
            shape = shared_shape(shape.as_ref(), known_shape(t));
        }
        Ok(vec![TensorType::sequence_of(first.dtype, shape)])
    }
    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let items = (0..cx.inputs.len())
            .map(|i| cx.input(i).cloned())
            .collect::<Result<Vec<_>, _>>()?;
        Ok(vec![Tensor::Sequence(Sequence {
            dtype: items.first().ok_or("needs an input")?.dtype(),
            inner: vec![],
            items,
        })])
    }
}

// ---------------------------------------------------------------- SequenceAt

struct SequenceAt;

const SEQUENCE_AT: OpSchema = OpSchema {
    name: "SequenceAt",
    family: "sequence",
    inputs: &["input_sequence", "position"],
    outputs: &["tensor"],
    attrs: &[],
    doc: "The item at `position` (negative counts from the end).",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

impl Op for SequenceAt {
    fn schema(&self) -> &OpSchema {
        &SEQUENCE_AT
    }
    fn takes(&self) -> Takes {
        Takes::Any
    }
    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let seq = seq_input(cx, 0)?;
        cx.input(1)?;
        check_position(cx, 1)?;
        Ok(vec![element_type(cx, seq, "SequenceAt")?])
    }
    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let seq = the_sequence(cx, 0)?;
        let p = position(cx, 1, seq.items.len(), false)?.ok_or("input 1 is required")?;
        Ok(vec![seq.items[p].clone()])
    }
}

// ---------------------------------------------------------------- SequenceInsert

struct SequenceInsert;

const SEQUENCE_INSERT: OpSchema = OpSchema {
    name: "SequenceInsert",
    family: "sequence",
    inputs: &["input_sequence", "tensor", "position?"],
    outputs: &["output_sequence"],
    attrs: &[],
    doc: "The sequence with `tensor` inserted before `position` (default: at the end).",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

impl Op for SequenceInsert {
    fn schema(&self) -> &OpSchema {
        &SEQUENCE_INSERT
    }
    fn takes(&self) -> Takes {
        Takes::Any
    }
    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let seq = seq_input(cx, 0)?;
        let t = cx.input(1)?;
        check_position(cx, 2)?;
        let element = seq.unwrapped();
        if t.dtype != seq.dtype || t.containers != element.containers {
            return Err(format!("input 1 is a {t}, which cannot go into a {seq}"));
        }
        if !t.is_tensor() {
            return Ok(vec![seq.clone()]);
        }
        // Unknown items stay unknown: the shape is what the old items and `t` share.
        let shape = shared_shape(known_shape(&element), known_shape(t));
        Ok(vec![TensorType::sequence_of(t.dtype, shape)])
    }
    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let seq = the_sequence(cx, 0)?;
        let t = cx.input(1)?;
        check_item(seq, t)?;
        let at = position(cx, 2, seq.items.len(), true)?.unwrap_or(seq.items.len());
        let mut items = seq.items.clone();
        items.insert(at, t.clone());
        Ok(vec![Tensor::Sequence(Sequence {
            items,
            ..seq.clone()
        })])
    }
}

// ---------------------------------------------------------------- SequenceErase

struct SequenceErase;

const SEQUENCE_ERASE: OpSchema = OpSchema {
    name: "SequenceErase",
    family: "sequence",
    inputs: &["input_sequence", "position?"],
    outputs: &["output_sequence"],
    attrs: &[],
    doc: "The sequence without the item at `position` (default: the last).",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

impl Op for SequenceErase {
    fn schema(&self) -> &OpSchema {
        &SEQUENCE_ERASE
    }
    fn takes(&self) -> Takes {
        Takes::Any
    }
    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        check_position(cx, 1)?;
        Ok(vec![seq_input(cx, 0)?.clone()])
    }
    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let seq = the_sequence(cx, 0)?;
        if seq.items.is_empty() {
            return Err("cannot erase from an empty sequence".into());
        }
        let at = position(cx, 1, seq.items.len(), false)?.unwrap_or(seq.items.len() - 1);
        let mut items = seq.items.clone();
        items.remove(at);
        Ok(vec![Tensor::Sequence(Sequence {
            items,
            ..seq.clone()
        })])
    }
}

// ---------------------------------------------------------------- SequenceLength

struct SequenceLength;

const SEQUENCE_LENGTH: OpSchema = OpSchema {
    name: "SequenceLength",
    family: "sequence",
    inputs: &["input_sequence"],
    outputs: &["length"],
    attrs: &[],
    doc: "The number of items, an i64 scalar.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

impl Op for SequenceLength {
    fn schema(&self) -> &OpSchema {
        &SEQUENCE_LENGTH
    }
    fn takes(&self) -> Takes {
        Takes::Any
    }
    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        seq_input(cx, 0)?;
        Ok(out(DType::I64, Shape::scalar()))
    }
    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let n = the_sequence(cx, 0)?.items.len();
        Ok(vec![Tensor::scalar(
            i64::try_from(n).map_err(|_| "sequence too long")?,
        )])
    }
}

// ---------------------------------------------------------------- SplitToSequence

struct SplitToSequence;

const SPLIT_TO_SEQUENCE: OpSchema = OpSchema {
    name: "SplitToSequence",
    family: "sequence",
    inputs: &["input", "split?"],
    outputs: &["output_sequence"],
    attrs: &[
        AttrSpec::opt("axis", AttrKind::Int, "0"),
        AttrSpec::opt("keepdims", AttrKind::Int, "1"),
    ],
    doc: "Splits along `axis` into a sequence: parts of the sizes in `split` (a 1-D \
          tensor), of `split` each (a scalar; the last may be smaller), or of 1 each \
          without `split`, when `keepdims = 0` drops the axis.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

impl Op for SplitToSequence {
    fn schema(&self) -> &OpSchema {
        &SPLIT_TO_SEQUENCE
    }
    fn takes(&self) -> Takes {
        Takes::Strings
    }
    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = tensor_input(cx, 0)?;
        let axis = norm_axis(cx.attrs.int_or("axis", 0)?, x.rank())?;
        let mut dims = x.shape.dims();
        let split = cx.opt_input(1);
        if let Some(s) = split {
            if !s.is_tensor() || !matches!(s.dtype, DType::I32 | DType::I64) || s.rank() > 1 {
                return Err(format!(
                    "input 1 (split) must be i32 or i64 of rank 0 or 1, got {s}"
                ));
            }
            dims[axis] = Dim::Sym(ANY_DIM.into());
        } else if cx.attrs.int_or("keepdims", 1)? == 0 {
            dims.remove(axis);
        } else {
            dims[axis] = Dim::Fixed(1);
        }
        Ok(vec![TensorType::sequence_of(
            x.dtype,
            Some(Shape::new(dims)),
        )])
    }
    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let axis = norm_axis(cx.attrs.int_or("axis", 0)?, x.rank())?;
        let keepdims = cx.attrs.int_or("keepdims", 1)? != 0;
        let (sizes, drop_axis) = split_sizes(x.shape()[axis], cx.opt_input(1), keepdims)?;
        let mut items = Vec::with_capacity(sizes.len());
        let mut start = 0;
        for size in sizes {
            let mut part = slice_axis(x, axis, start, start + size)?;
            if drop_axis {
                let mut shape = part.shape().to_vec();
                shape.remove(axis);
                part = reshape(&part, &shape)?;
            }
            items.push(part);
            start += size;
        }
        Ok(vec![Tensor::Sequence(Sequence {
            dtype: x.dtype(),
            inner: vec![],
            items,
        })])
    }
}

/// SplitToSequence's part sizes along an axis of `d` elements (`split` a scalar chunk or
/// a 1-D list, or absent: parts of 1), and whether the parts drop the axis (no `split`
/// and `keepdims` off). The cpu backend's host program splits with these too.
pub(crate) fn split_sizes(
    d: usize,
    split: Option<&Tensor>,
    keepdims: bool,
) -> Result<(Vec<usize>, bool), String> {
    Ok(match split {
        Some(s) if s.rank() == 0 => {
            let chunk = s.to_i64_vec()[0];
            let chunk = usize::try_from(chunk)
                .ok()
                .filter(|&c| c > 0)
                .ok_or_else(|| format!("split must be positive, got {chunk}"))?;
            let n = d.div_ceil(chunk);
            let sizes = (0..n).map(|k| chunk.min(d - k * chunk)).collect();
            (sizes, false)
        }
        Some(s) => {
            let sizes = s
                .to_i64_vec()
                .into_iter()
                .map(|v| usize::try_from(v).map_err(|_| format!("split has {v}")))
                .collect::<Result<Vec<_>, _>>()?;
            let total = sizes.iter().try_fold(0usize, |a, &b| a.checked_add(b));
            if total != Some(d) {
                return Err(format!(
                    "split {sizes:?} does not add up to the axis size {d}"
                ));
            }
            (sizes, false)
        }
        None => (vec![1; d], !keepdims),
    })
}

/// Runs catalogue op `name` (through [`evaluate`], so strings work too).
fn run_op(name: &str, inputs: &[&Tensor], attrs: &Attrs) -> Result<Vec<Tensor>, String> {
    let op = lookup(name).ok_or_else(|| format!("{name} is not in the catalogue"))?;
    let inputs: Vec<Option<&Tensor>> = inputs.iter().map(|&t| Some(t)).collect();
    let types = vec![None; inputs.len()];
    evaluate(
        op,
        &EvalCtx {
            inputs: &inputs,
            input_types: &types,
            attrs,
        },
    )
}

fn ints(v: &[usize]) -> Result<Tensor, String> {
    let v: Vec<i64> = v
        .iter()
        .map(|&x| i64::try_from(x).map_err(|_| format!("size {x} is too large")))
        .collect::<Result<_, _>>()?;
    Tensor::from_vec(&[v.len()], v)
}

fn slice_axis(x: &Tensor, axis: usize, start: usize, end: usize) -> Result<Tensor, String> {
    let (starts, ends, axes) = (ints(&[start])?, ints(&[end])?, ints(&[axis])?);
    Ok(run_op("Slice", &[x, &starts, &ends, &axes], &Attrs::new())?.remove(0))
}

fn reshape(x: &Tensor, shape: &[usize]) -> Result<Tensor, String> {
    Ok(run_op("Reshape", &[x, &ints(shape)?], &Attrs::new())?.remove(0))
}

// ---------------------------------------------------------------- ConcatFromSequence

struct ConcatFromSequence;

const CONCAT_FROM_SEQUENCE: OpSchema = OpSchema {
    name: "ConcatFromSequence",
    family: "sequence",
    inputs: &["input_sequence"],
    outputs: &["concat_result"],
    attrs: &[
        AttrSpec::req("axis", AttrKind::Int),
        AttrSpec::opt("new_axis", AttrKind::Int, "0"),
    ],
    doc: "The items joined along `axis`, or stacked along a new `axis` when \
          `new_axis = 1`; an empty sequence is an error.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

impl Op for ConcatFromSequence {
    fn schema(&self) -> &OpSchema {
        &CONCAT_FROM_SEQUENCE
    }
    fn takes(&self) -> Takes {
        Takes::Any
    }
    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let seq = seq_input(cx, 0)?;
        let element = element_type(cx, seq, "ConcatFromSequence")?;
        if !element.is_tensor() {
            return Err(format!("the items must be tensors, got {seq}"));
        }
        let new_axis = cx.attrs.int_or("new_axis", 0)? != 0;
        let rank = element.rank() + usize::from(new_axis);
        let axis = norm_axis(cx.attrs.req_int("axis")?, rank)?;
        let mut dims = element.shape.dims();
        if new_axis {
            dims.insert(axis, cx.fresh_dim(0, axis));
        } else {
            dims[axis] = cx.fresh_dim(0, axis);
        }
        Ok(out(element.dtype, Shape::new(dims)))
    }
    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let seq = the_sequence(cx, 0)?;
        let first = seq
            .items
            .first()
            .ok_or("cannot concatenate an empty sequence")?;
        let new_axis = cx.attrs.int_or("new_axis", 0)? != 0;
        let axis = norm_axis(
            cx.attrs.req_int("axis")?,
            first.rank() + usize::from(new_axis),
        )?;
        let items = if new_axis {
            seq.items
                .iter()
                .map(|t| {
                    let mut shape = t.shape().to_vec();
                    shape.insert(axis, 1);
                    reshape(t, &shape)
                })
                .collect::<Result<Vec<_>, _>>()?
        } else {
            seq.items.clone()
        };
        let refs: Vec<&Tensor> = items.iter().collect();
        let axis = i64::try_from(axis).map_err(|_| "axis too large")?;
        run_op("Concat", &refs, &Attrs::new().with("axis", Attr::Int(axis)))
    }
}

// ---------------------------------------------------------------- Optional

/// The `type` attribute: what an optional holds (of unknown rank when it has no dims).
fn held_type(text: &str) -> Result<TensorType, String> {
    let t: TensorType = format!("opt<{text}>")
        .parse()
        .map_err(|e| format!("type: {e}"))?;
    Ok(t.unwrapped())
}

struct OptionalOp;

const OPTIONAL: OpSchema = OpSchema {
    name: "Optional",
    family: "sequence",
    inputs: &["input?"],
    outputs: &["output"],
    attrs: &[AttrSpec::opt(
        "type",
        AttrKind::String,
        "the input's; required without one",
    )],
    doc: "An optional holding the input, or an empty one of `type`: the held value's type \
          spelled as in the text format (\"f32[3]\", \"seq<i64>\"; \"f32\" when the rank \
          is unknown).",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

impl Op for OptionalOp {
    fn schema(&self) -> &OpSchema {
        &OPTIONAL
    }
    fn takes(&self) -> Takes {
        Takes::Any
    }
    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let inner = match (cx.opt_input(0), cx.attrs.string("type")?) {
            (Some(t), Some(ty)) => {
                let want = held_type(ty)?;
                if want.dtype != t.dtype || want.containers != t.containers {
                    return Err(format!("input 0 is a {t}, but type says {want}"));
                }
                t.clone()
            }
            (Some(t), None) => t.clone(),
            (None, Some(ty)) => held_type(ty)?,
            (None, None) => return Err("an Optional without an input needs a type".into()),
        };
        if inner.container() == Some(Container::Opt) {
            return Err(format!("an optional cannot hold an optional ({inner})"));
        }
        let shape = inner.ranked.then(|| inner.shape.clone());
        Ok(vec![inner.wrapped(Container::Opt, shape)])
    }
    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let value = cx.opt_input(0).cloned().map(Box::new);
        let (dtype, inner) = match (&value, cx.attrs.string("type")?) {
            (Some(v), _) => (v.dtype(), v.containers()),
            (None, Some(ty)) => {
                let t = held_type(ty)?;
                (t.dtype, t.containers)
            }
            (None, None) => return Err("an Optional without an input needs a type".into()),
        };
        Ok(vec![Tensor::Optional(Optional {
            dtype,
            inner,
            value,
        })])
    }
}

// ---------------------------------------------------------------- OptionalHasElement

struct OptionalHasElement;

const OPTIONAL_HAS_ELEMENT: OpSchema = OpSchema {
    name: "OptionalHasElement",
    family: "sequence",
    inputs: &["input?"],
    outputs: &["output"],
    attrs: &[],
    doc: "Whether the input holds a value: false for an empty optional or no input, \
          true for a full optional, a tensor or a sequence.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

impl Op for OptionalHasElement {
    fn schema(&self) -> &OpSchema {
        &OPTIONAL_HAS_ELEMENT
    }
    fn takes(&self) -> Takes {
        Takes::Any
    }
    fn infer(&self, _cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        Ok(out(DType::Bool, Shape::scalar()))
    }
    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let has = match cx.opt_input(0) {
            None => false,
            Some(Tensor::Optional(o)) => o.value.is_some(),
            Some(_) => true,
        };
        Ok(vec![Tensor::scalar(has)])
    }
}

// ---------------------------------------------------------------- OptionalGetElement

struct OptionalGetElement;

const OPTIONAL_GET_ELEMENT: OpSchema = OpSchema {
    name: "OptionalGetElement",
    family: "sequence",
    inputs: &["input"],
    outputs: &["output"],
    attrs: &[],
    doc: "The value an optional holds (an error if it is empty); a tensor or a sequence \
          is passed through.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

impl Op for OptionalGetElement {
    fn schema(&self) -> &OpSchema {
        &OPTIONAL_GET_ELEMENT
    }
    fn takes(&self) -> Takes {
        Takes::Any
    }
    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let t = cx.input(0)?;
        if t.container() != Some(Container::Opt) {
            return Ok(vec![t.clone()]);
        }
        let inner = t.unwrapped();
        if !inner.ranked && inner.is_tensor() {
            return Err(format!(
                "the optional's tensor is of unknown rank ({t}); declare its shape"
            ));
        }
        Ok(vec![inner])
    }
    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        match cx.input(0)? {
            Tensor::Optional(o) => match &o.value {
                Some(v) => Ok(vec![(**v).clone()]),
                None => Err("the optional is empty".into()),
            },
            other => Ok(vec![other.clone()]),
        }
    }
}
