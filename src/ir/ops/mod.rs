//! The op catalogue: every op's schema, attribute validation, type/shape inference and
//! reference evaluation, one family a file.
//!
//! Names, inputs, attributes and semantics follow ONNX where ONNX has the op (latest
//! opset: e.g. `Reshape`'s shape, `Slice`'s starts and `ReduceSum`'s axes are inputs),
//! so that the ONNX importer needs no translation table for the common case. Kiln-only
//! ops (`Origin::Kiln`) and attributes (named axes: `axis_names`, `Dot`) say so in docs.
use std::collections::BTreeMap;
use std::sync::OnceLock;

use super::attr::{AttrKind, Attrs};
use super::shape::{Dim, Shape, TensorType};
use crate::tensor::Tensor;

pub mod attention;
pub mod bitwise;
pub mod control;
pub mod conv;
pub mod custom;
pub mod elementwise;
pub mod fused;
pub mod gather;
pub mod grid_sample;
pub mod layout;
pub mod loss;
pub mod matmul;
pub mod misc;
pub mod norm;
pub mod pool;
pub mod quant;
pub mod quant_rnn;
pub mod random;
pub mod reduce;
pub mod resize;
pub mod rnn;
pub mod scan;
pub mod scatter;
pub mod select;
pub mod sequence;
pub mod shape;
pub mod signal;
pub mod source;
pub mod strings;
pub mod text;
pub mod tree;

/// One attribute an op accepts.
#[derive(Debug, Clone, Copy)]
pub struct AttrSpec {
    pub name: &'static str,
    pub kind: AttrKind,
    pub required: bool,
    /// The default (as text, for `kiln ops`) or a short note; "" if none.
    pub default: &'static str,
}

impl AttrSpec {
    pub(crate) const fn req(name: &'static str, kind: AttrKind) -> AttrSpec {
        AttrSpec {
            name,
            kind,
            required: true,
            default: "",
        }
    }
    pub(crate) const fn opt(name: &'static str, kind: AttrKind, default: &'static str) -> AttrSpec {
        AttrSpec {
            name,
            kind,
            required: false,
            default,
        }
    }
}

/// What an op looks like from outside: its name, operands and attributes.
///
/// Inputs and outputs are listed by name; a trailing `?` marks an optional one (it may be
/// omitted, `_` in the text format) and a trailing `...` a variadic last one (zero or
/// more; an op that needs at least one says so in its infer).
#[derive(Debug, Clone, Copy)]
pub struct OpSchema {
    pub name: &'static str,
    /// The family file the op lives in: `elementwise`, `reduce`, `matmul`, …
    pub family: &'static str,
    pub inputs: &'static [&'static str],
    pub outputs: &'static [&'static str],
    pub attrs: &'static [AttrSpec],
    pub doc: &'static str,
    /// Which inputs an output may overwrite: the memory planner's in-place reuse.
    pub in_place: InPlace,
    /// Whether a model may name the op or only Kiln makes it.
    pub origin: Origin,
}

/// Which inputs of an op an output may overwrite. Part of the schema so that a new op
/// states it where it is defined, not in the memory planner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InPlace {
    /// None: the op reads its inputs while writing in an order that forbids it.
    No,
    /// Any input of exactly the output's shape: elementwise ops and `Fused` elementwise
    /// chains (a broadcast input is read many times per written element, so it cannot
    /// be overwritten).
    AnySameShape,
    /// Only the given input, of exactly the output's shape (`FusedConv`'s residual, 3),
    /// and only when that value is not also another operand of the node.
    InputSameShape(usize),
    /// Input 0 whatever its shape: the output is a view of it (`Reshape`, `Flatten`,
    /// `Squeeze`, `Unsqueeze`, `Identity`).
    View,
}

/// Who may create a node of an op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A standard op (ONNX's, or ONNX-ML's) that an imported model may name.
    Onnx,
    /// Kiln's own: what the passes build, the graph's sources (but `Constant`) and state,
    /// and Kiln's extensions (`Dot`, `Silu`, `MseLoss`, …). The ONNX importer refuses it.
    Kiln,
}

impl OpSchema {
    fn variadic(list: &[&str]) -> bool {
        list.last().is_some_and(|s| s.ends_with("..."))
    }

    /// The allowed number of inputs: (min, max or None for variadic).
    pub(crate) fn input_arity(&self) -> (usize, Option<usize>) {
        let min = self
            .inputs
            .iter()
            .filter(|s| !s.ends_with('?') && !s.ends_with("..."))
            .count();
        let max = (!Self::variadic(self.inputs)).then_some(self.inputs.len());
        (min, max)
    }

    /// Whether input `i` may be omitted.
    pub(crate) fn input_optional(&self, i: usize) -> bool {
        match self.inputs.get(i) {
            Some(s) => s.ends_with('?'),
            None => false,
        }
    }

    /// Checks names, kinds and required attributes against the spec.
    pub(crate) fn validate_attrs(&self, attrs: &Attrs) -> Result<(), String> {
        for (name, value) in attrs.iter() {
            let Some(spec) = self.attrs.iter().find(|s| s.name == name) else {
                let known: Vec<&str> = self.attrs.iter().map(|s| s.name).collect();
                return Err(if known.is_empty() {
                    format!(
                        "unknown attribute '{name}' ({} takes no attributes)",
                        self.name
                    )
                } else {
                    format!("unknown attribute '{name}' (known: {})", known.join(", "))
                });
            };
            let ok = value.kind() == spec.kind
                || (spec.kind == AttrKind::Float && value.kind() == AttrKind::Int)
                || (spec.kind == AttrKind::Floats && value.kind() == AttrKind::Ints);
            if !ok {
                return Err(format!(
                    "attribute '{name}' must be {}, got {}",
                    spec.kind,
                    value.kind()
                ));
            }
        }
        for spec in self.attrs.iter().filter(|s| s.required) {
            if attrs.get(spec.name).is_none() {
                return Err(format!("missing required attribute '{}'", spec.name));
            }
        }
        Ok(())
    }

    /// One line for `kiln ops`: `Conv(X, W, B?) -> (Y)  {auto_pad: string = NOTSET, ...}`.
    pub fn signature(&self) -> String {
        let attrs: Vec<String> = self
            .attrs
            .iter()
            .map(|a| match (a.required, a.default) {
                (true, _) => format!("{}: {} (required)", a.name, a.kind),
                (false, "") => format!("{}: {}", a.name, a.kind),
                (false, d) => format!("{}: {} = {d}", a.name, a.kind),
            })
            .collect();
        format!(
            "{}({}) -> ({}){}",
            self.name,
            self.inputs.join(", "),
            self.outputs.join(", "),
            if attrs.is_empty() {
                String::new()
            } else {
                format!("  {{{}}}", attrs.join(", "))
            }
        )
    }
}

/// The ops that take the low-bit storage dtypes (float8, float4, int4, int2): the
/// conversions and quantization, and pure data movement. Every other op refuses them
/// before its own inference, so no kernel ever reads them as another type.
const LOW_BIT_OPS: &[&str] = &[
    "Cast",
    "CastLike",
    "BitCast",
    "QuantizeLinear",
    "DequantizeLinear",
    "Identity",
    "Reshape",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "Transpose",
    "Concat",
    "Split",
    "Slice",
    "Gather",
    "Expand",
    "Tile",
    "Shape",
    "Size",
];

/// An error if `op` is given a low-bit input it does not take.
fn refuse_low_bit(op: &str, inputs: &[Option<TensorType>]) -> Result<(), String> {
    let low_bit = inputs.iter().flatten().find(|t| t.dtype.is_low_bit());
    match low_bit {
        Some(t) if !LOW_BIT_OPS.contains(&op) => Err(format!(
            "{op} does not take {} inputs (a storage type: Cast or DequantizeLinear it first)",
            t.dtype
        )),
        _ => Ok(()),
    }
}

/// What type/shape inference sees of a node.
pub struct InferCtx<'a> {
    /// The node's name, used to make fresh symbols deterministic.
    pub node_name: &'a str,
    /// Input types; `None` for an omitted optional input.
    pub inputs: &'a [Option<TensorType>],
    /// Input values where the input is a `Constant` (so shape operands can be read).
    pub consts: &'a [Option<&'a Tensor>],
    pub attrs: &'a Attrs,
}

impl<'a> InferCtx<'a> {
    /// Input `i`, or an error if it was omitted.
    pub fn input(&self, i: usize) -> Result<&'a TensorType, String> {
        self.inputs
            .get(i)
            .and_then(|t| t.as_ref())
            .ok_or_else(|| format!("input {i} is required"))
    }

    pub(crate) fn opt_input(&self, i: usize) -> Option<&'a TensorType> {
        self.inputs.get(i).and_then(|t| t.as_ref())
    }

    /// The value of input `i`, when it is a constant.
    pub(crate) fn const_input(&self, i: usize) -> Option<&'a Tensor> {
        self.consts.get(i).copied().flatten()
    }

    /// A new symbol for a dim that inference cannot know (e.g. `Reshape` by a computed
    /// shape): named after the node, output and axis, so it is the same on every run.
    pub(crate) fn fresh_dim(&self, output: usize, axis: usize) -> Dim {
        Dim::Sym(format!("{}.{output}.{axis}", self.node_name))
    }
}

/// What reference evaluation sees of a node.
pub struct EvalCtx<'a> {
    /// Input values; `None` for an omitted optional input.
    pub inputs: &'a [Option<&'a Tensor>],
    /// The inputs' declared types: what a tensor alone does not carry (axis names).
    pub input_types: &'a [Option<&'a TensorType>],
    pub attrs: &'a Attrs,
}

impl<'a> EvalCtx<'a> {
    pub fn input(&self, i: usize) -> Result<&'a Tensor, String> {
        self.inputs
            .get(i)
            .copied()
            .flatten()
            .ok_or_else(|| format!("input {i} is required"))
    }

    pub(crate) fn opt_input(&self, i: usize) -> Option<&'a Tensor> {
        self.inputs.get(i).copied().flatten()
    }

    /// The declared type of input `i` (for its axis names), or an error if omitted.
    pub(crate) fn input_type(&self, i: usize) -> Result<&'a TensorType, String> {
        self.input_types
            .get(i)
            .copied()
            .flatten()
            .ok_or_else(|| format!("input {i} is required"))
    }
}

/// The values an op takes as inputs ([`Op::takes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Takes {
    /// Dense numeric tensors only.
    Numeric,
    /// Also string tensors, which the op only moves (reshapes, gathers, slices, …):
    /// [`evaluate`] runs it on indices into the strings and maps the result back.
    MovedStrings,
    /// Also string tensors, which its own `eval` handles.
    Strings,
    /// Any value: strings, sequences and optionals too (its `eval` handles them).
    Any,
}

/// Runs `op`'s reference computation: the one entry every caller of `eval` uses, so that
/// ops which only move elements work on strings ([`Takes::MovedStrings`]).
pub fn evaluate(op: &dyn Op, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
    // An operand typed with an unknown rank has, now, the shape of its value.
    let known = |t: &Option<&Tensor>, ty: &Option<&TensorType>| match (t, ty) {
        (Some(t), Some(ty)) if ty.is_unranked_tensor() && t.is_tensor() => {
            Some(TensorType::new(ty.dtype, Shape::fixed(t.shape())))
        }
        _ => None,
    };
    if cx
        .inputs
        .iter()
        .zip(cx.input_types)
        .any(|(t, ty)| known(t, ty).is_some())
    {
        let actual: Vec<Option<TensorType>> = cx
            .inputs
            .iter()
            .zip(cx.input_types)
            .map(|(t, ty)| known(t, ty).or_else(|| ty.cloned()))
            .collect();
        let types: Vec<Option<&TensorType>> = actual.iter().map(Option::as_ref).collect();
        return evaluate(
            op,
            &EvalCtx {
                inputs: cx.inputs,
                input_types: &types,
                attrs: cx.attrs,
            },
        );
    }
    let has_strings = cx.inputs.iter().flatten().any(|t| t.dtype().is_string());
    if !has_strings || op.takes() != Takes::MovedStrings {
        return op.eval(cx);
    }
    // Every string input becomes i64 indices into one pool of all their strings.
    let mut pool: Vec<&String> = Vec::new();
    let mut moved: Vec<Option<Tensor>> = Vec::with_capacity(cx.inputs.len());
    for t in cx.inputs {
        moved.push(match t {
            Some(Tensor::String(a)) => {
                let start = pool.len() as i64;
                pool.extend(a.iter());
                let idx: Vec<i64> = (start..pool.len() as i64).collect();
                Some(Tensor::from_vec(a.shape(), idx)?)
            }
            _ => None,
        });
    }
    let inputs: Vec<Option<&Tensor>> = cx
        .inputs
        .iter()
        .zip(&moved)
        .map(|(t, m)| m.as_ref().or(*t))
        .collect();
    let outs = op.eval(&EvalCtx {
        inputs: &inputs,
        input_types: cx.input_types,
        attrs: cx.attrs,
    })?;
    outs.into_iter()
        .map(|t| match &t {
            Tensor::I64(a) => {
                let strings = a
                    .iter()
                    .map(|&i| {
                        usize::try_from(i)
                            .ok()
                            .and_then(|i| pool.get(i))
                            .map(|s| (*s).clone())
                            .ok_or_else(|| format!("string index {i} out of range"))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Tensor::from_strings(a.shape(), strings)
            }
            other => Err(format!(
                "{} moved strings but gave a {} output",
                op.schema().name,
                other.dtype()
            )),
        })
        .collect()
}

/// An error naming the first input `op` does not take (see [`Op::takes`]).
pub(crate) fn check_takes(op: &dyn Op, inputs: &[Option<TensorType>]) -> Result<(), String> {
    let takes = op.takes();
    for (i, t) in inputs.iter().enumerate() {
        let Some(t) = t else { continue };
        let name = op
            .schema()
            .inputs
            .get(i)
            .or(op.schema().inputs.last())
            .map_or("?", |n| n.trim_end_matches(['?', '.']));
        if !t.is_tensor() && takes != Takes::Any {
            return Err(format!(
                "input {i} ({name}) is a {t}; {} takes tensors only",
                op.schema().name
            ));
        }
        if t.dtype.is_string() && takes == Takes::Numeric {
            return Err(format!(
                "input {i} ({name}) is a string tensor; {} takes numeric tensors only",
                op.schema().name
            ));
        }
    }
    refuse_low_bit(op.schema().name, inputs)
}

/// An op of the catalogue.
pub trait Op: Send + Sync + 'static {
    fn schema(&self) -> &OpSchema;

    /// The output types from the input types and attributes; the one place where type,
    /// shape and axis-name errors are found. Attributes have already passed
    /// `schema().validate_attrs`. Errors need not name the node: the caller adds it.
    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String>;

    /// The reference computation: plain loops, obviously correct, slow on purpose.
    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String>;

    /// Which values besides dense numeric tensors the op takes; any other input is refused
    /// before `infer`, with an error naming it.
    fn takes(&self) -> Takes {
        Takes::Numeric
    }

    /// Checks a node's attributes before `infer`. Catalogue ops check them against their
    /// schema; ops registered at run time (`custom`) take any and check them in `infer`.
    fn validate_attrs(&self, attrs: &Attrs) -> Result<(), String> {
        self.schema().validate_attrs(attrs)
    }

    /// Whether a node whose inputs are all constants may be replaced by its result at
    /// compile time (constant folding). A registered op says so itself.
    fn pure(&self) -> bool {
        true
    }

    /// Whether an output may take over the buffer of a same-shaped input that dies at
    /// the node (elementwise ops say so through their family; registered ops here).
    fn may_run_in_place(&self) -> bool {
        false
    }

    /// What the op brings the backends besides `eval` (a registered op's kernels on
    /// planned buffers: `backend::registered::Kernels`). Opaque here: the core neither
    /// opens nor calls it, so it carries no pointer, arena or stream.
    fn backend_kernels(&self) -> Option<&(dyn std::any::Any + Send + Sync)> {
        None
    }

    /// An op's own gradient rule (registered ops: the user's gradient callback), which
    /// appends to `g` the gradients of node `node`'s inputs from its outputs' gradients
    /// `gys` (`None`: an output the loss does not use). `None` when the op brings no
    /// rule of its own (catalogue ops: autodiff's rules apply).
    #[allow(clippy::type_complexity)]
    fn gradient(
        &self,
        _g: &mut super::Graph,
        _node: super::NodeId,
        _gys: &[Option<super::Value>],
    ) -> Option<Result<Vec<Option<super::Value>>, String>> {
        None
    }
}

/// Every op, by name.
pub fn catalogue() -> &'static BTreeMap<&'static str, &'static dyn Op> {
    static CATALOGUE: OnceLock<BTreeMap<&'static str, &'static dyn Op>> = OnceLock::new();
    CATALOGUE.get_or_init(|| {
        let mut map = BTreeMap::new();
        let families: [fn() -> Vec<&'static dyn Op>; 30] = [
            source::ops,
            elementwise::ops,
            reduce::ops,
            matmul::ops,
            conv::ops,
            pool::ops,
            norm::ops,
            shape::ops,
            gather::ops,
            scatter::ops,
            select::ops,
            scan::ops,
            misc::ops,
            loss::ops,
            bitwise::ops,
            quant::ops,
            quant_rnn::ops,
            attention::ops,
            resize::ops,
            rnn::ops,
            signal::ops,
            text::ops,
            tree::ops,
            strings::ops,
            grid_sample::ops,
            fused::ops,
            layout::ops,
            random::ops,
            sequence::ops,
            control::ops,
        ];
        for family in families {
            for op in family() {
                let prev = map.insert(op.schema().name, op);
                assert!(prev.is_none(), "op {} registered twice", op.schema().name);
            }
        }
        map
    })
}

/// The op called `name`.
pub fn lookup(name: &str) -> Option<&'static dyn Op> {
    catalogue().get(name).copied()
}

/// Leaks `op` to give it the catalogue's `'static` lifetime; called once per op when the
/// catalogue is built.
pub(crate) fn leak<T: Op>(op: T) -> &'static dyn Op {
    Box::leak(Box::new(op))
}

/// Helpers shared by the families' infer functions.
pub mod util {
    use ndarray::{ArrayD, Dimension, IxDyn};

    use crate::ir::{DType, Shape, TensorType};
    use crate::tensor::{Elem, Tensor};

    /// A new array of `shape` whose element at `idx` is `a[src(idx)]`, or `fill` where
    /// `src` gives `None`: the one gather loop behind Slice, Pad, Tile and friends.
    pub(crate) fn remap<T: Elem>(
        a: &ArrayD<T>,
        shape: &[usize],
        fill: T,
        src: impl Fn(&[usize], &mut Vec<usize>) -> bool,
    ) -> Tensor {
        let mut buf = Vec::with_capacity(a.ndim());
        T::wrap(ArrayD::from_shape_fn(IxDyn(shape), |idx| {
            buf.clear();
            if src(idx.slice(), &mut buf) {
                a[IxDyn(&buf)]
            } else {
                fill
            }
        }))
    }

    /// An error unless every given input has the same dtype; returns it.
    pub(crate) fn same_dtype(op: &str, inputs: &[&TensorType]) -> Result<DType, String> {
        let first = inputs
            .first()
            .ok_or_else(|| format!("{op} needs an input"))?
            .dtype;
        for (i, t) in inputs.iter().enumerate().skip(1) {
            if t.dtype != first {
                return Err(format!(
                    "dtype mismatch: input 0 is {first}, input {i} is {}",
                    t.dtype
                ));
            }
        }
        Ok(first)
    }

    /// An error unless `t`'s dtype satisfies `ok`; `what` describes the allowed set.
    pub(crate) fn require_dtype(
        t: &TensorType,
        input: usize,
        ok: fn(DType) -> bool,
        what: &str,
    ) -> Result<(), String> {
        if ok(t.dtype) {
            Ok(())
        } else {
            Err(format!("input {input} must be {what}, got {}", t.dtype))
        }
    }

    /// The most elements a reference evaluation creates from a shape operand (2^30):
    /// beyond it an absurd shape in a model is an error, not an allocation that aborts.
    pub(crate) const MAX_ELEMENTS: usize = 1 << 30;

    /// An error unless a tensor of `shape` stays within [`MAX_ELEMENTS`].
    pub(crate) fn check_size(shape: &[usize]) -> Result<(), String> {
        match shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) {
            Some(n) if n <= MAX_ELEMENTS => Ok(()),
            _ => Err(format!(
                "a tensor of shape {shape:?} is larger than the reference interpreter's limit of {MAX_ELEMENTS} elements"
            )),
        }
    }

    pub(crate) fn out(dtype: DType, shape: Shape) -> Vec<TensorType> {
        vec![TensorType::new(dtype, shape)]
    }
}
