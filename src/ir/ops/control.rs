//! Control flow: If, Loop and Scan (ONNX semantics, opset 9+ for Scan). Each runs a
//! body, an ordinary `Graph` held as a graph attribute. Bodies are closed: the body's
//! `Parameter`s in creation order are its inputs and its graph outputs its results. A
//! value the body reads from the enclosing graph is passed explicitly: a trailing
//! operand of the op (a capture, counted by the `captures` attribute) and a matching
//! trailing body `Parameter`.
//!
//! Inference checks each body's signature against the operands (count, dtype, rank) and
//! translates the body's result types into the parent: a body symbol bound by a
//! parameter becomes the operand's dim; any other symbolic dim, or one that differs
//! between branches or iterations, becomes a fresh symbol of the node.
use crate::ir::ops::{InPlace, Origin};
use std::collections::HashMap;

use ndarray::{ArrayD, Axis as NdAxis};

use super::{leak, AttrSpec, EvalCtx, InferCtx, Op, OpSchema};
use crate::ir::eval::run_body;
use crate::ir::shape::norm_axis;
use crate::ir::{AttrKind, Attrs, DType, Dim, Graph, NodeId, Shape, TensorType};
use crate::match_tensor;
use crate::tensor::{Elem, Tensor};

/// How deeply bodies may nest (a body's body's ...): deeper is an error, so that
/// recursion over bodies (verify, print, import, evaluation) stays bounded.
pub const MAX_NESTING: usize = 64;

/// The most iterations a reference `Loop` runs: a loop without a trip count whose
/// condition never turns false is an error here instead of a hang.
pub(crate) const MAX_ITERATIONS: i64 = 1 << 24;

/// The captures attribute every control-flow op has.
const CAPTURES: AttrSpec = AttrSpec::opt("captures", AttrKind::Int, "0");

/// The number of trailing capture operands, checked against the operand count `n` of
/// which `fixed` are not captures.
fn captures(attrs: &Attrs, n: usize, fixed: usize) -> Result<usize, String> {
    let c = attrs.int_or("captures", 0)?;
    let c = usize::try_from(c).map_err(|_| format!("captures must be >= 0, got {c}"))?;
    match n.checked_sub(fixed) {
        Some(rest) if rest >= c => Ok(c),
        _ => Err(format!(
            "captures = {c}, but the op has only {n} inputs of which {fixed} are not captures"
        )),
    }
}

/// A body result's dims in the parent; `None` where the parent cannot name one.
type ParentDims = Vec<Option<Dim>>;

/// One body's parameters and result types as the parent sees them.
struct Signature<'a> {
    body: &'a Graph,
    attr: &'a str,
    /// Body symbol → the dim of the operand its parameter receives.
    symbols: HashMap<String, Dim>,
}

impl<'a> Signature<'a> {
    /// Checks the body's parameters against `expected` (one type per parameter, or
    /// `None` for an omitted operand, which only checks the count).
    fn new(
        attrs: &'a Attrs,
        attr: &'a str,
        expected: &[Option<&TensorType>],
    ) -> Result<Signature<'a>, String> {
        let body = attrs.req_graph(attr)?;
        let params = body.inputs();
        if params.len() != expected.len() {
            return Err(format!(
                "body '{attr}' takes {} inputs, the op passes it {}",
                params.len(),
                expected.len()
            ));
        }
        let mut symbols = HashMap::new();
        for (i, (&p, want)) in params.iter().zip(expected).enumerate() {
            let node = body.node(p);
            let got = node
                .outputs
                .first()
                .ok_or_else(|| format!("body '{attr}': parameter {i} has no type"))?;
            let Some(want) = want else { continue };
            // A rank unknown on either side is checked when the value arrives.
            let ranks_differ = got.ranked && want.ranked && got.rank() != want.rank();
            if got.dtype != want.dtype || ranks_differ {
                return Err(format!(
                    "body '{attr}': input {i} ('{}') is {got}, the op passes it {want}",
                    node.name
                ));
            }
            for (g, w) in got.shape.axes.iter().zip(&want.shape.axes) {
                match (&g.dim, &w.dim) {
                    (Dim::Fixed(a), Dim::Fixed(b)) if a != b => {
                        return Err(format!(
                            "body '{attr}': input {i} ('{}') is {got}, the op passes it {want}",
                            node.name
                        ))
                    }
                    (Dim::Sym(s), d) => {
                        symbols.entry(s.clone()).or_insert_with(|| d.clone());
                    }
                    _ => {}
                }
            }
        }
        Ok(Signature {
            body,
            attr,
            symbols,
        })
    }

    fn outputs(&self) -> usize {
        self.body.outputs().len()
    }

    /// Result `i`'s type in the parent; a dim it cannot name is `None`. An error when
    /// the result's rank is unknown.
    fn result(&self, i: usize) -> Result<(DType, ParentDims), String> {
        match self.result_type(i)? {
            (dtype, Some(dims)) => Ok((dtype, dims)),
            (_, None) => Err(format!(
                "body '{}' result {i} has an unknown rank, which this op needs",
                self.attr
            )),
        }
    }

    /// Result `i`'s type as the body has it.
    fn body_result(&self, i: usize) -> Result<&'a TensorType, String> {
        let o = self
            .body
            .outputs()
            .get(i)
            .ok_or_else(|| format!("body '{}' has no output {i}", self.attr))?;
        self.body
            .value_type(o.value)
            .map_err(|e| format!("body '{}': {e}", self.attr))
    }

    /// Result `i`'s dtype and, when its rank is known, dims as in [`Signature::result`].
    fn result_type(&self, i: usize) -> Result<(DType, Option<ParentDims>), String> {
        let ty = self.body_result(i)?;
        if !ty.ranked {
            return Ok((ty.dtype, None));
        }
        let dims = ty
            .shape
            .axes
            .iter()
            .map(|a| match &a.dim {
                Dim::Fixed(n) => Some(Dim::Fixed(*n)),
                Dim::Sym(s) => self.symbols.get(s).cloned(),
            })
            .collect();
        Ok((ty.dtype, Some(dims)))
    }
}

/// A type from known dims, fresh symbols for output `out` where unknown (`shift` is the
/// position of the first given dim in the output, for Loop and Scan's stacked axis).
fn with_fresh(
    cx: &InferCtx<'_>,
    out: usize,
    dtype: DType,
    dims: &[Option<Dim>],
    skip: Option<usize>,
) -> TensorType {
    let dims = dims.iter().enumerate().map(|(axis, d)| {
        let axis = match skip {
            Some(s) if axis >= s => axis + 1,
            _ => axis,
        };
        d.clone().unwrap_or_else(|| cx.fresh_dim(out, axis))
    });
    TensorType::new(dtype, Shape::new(dims.collect::<Vec<_>>()))
}

/// If result `i` when a branch gives a sequence or optional: both must give the same
/// containers of the same dtype; their elements' shapes are kept where they agree (or
/// the taken branch's, when `taken` says which runs), else unranked.
fn branch_containers(
    i: usize,
    a: &TensorType,
    b: &TensorType,
    taken: Option<bool>,
) -> Result<TensorType, String> {
    if a.dtype != b.dtype || a.containers != b.containers {
        return Err(format!(
            "result {i}: then_branch gives {a}, else_branch {b}"
        ));
    }
    Ok(match taken {
        Some(true) => a.clone(),
        Some(false) => b.clone(),
        None if a == b => a.clone(),
        None => a.clone().without_rank(),
    })
}

/// The type of a value the body carries from one iteration to the next: the initial
/// value's dims where the body keeps them, fresh symbols where it may change them.
fn carried_type(
    cx: &InferCtx<'_>,
    sig: &Signature<'_>,
    result: usize,
    out: usize,
    initial: &TensorType,
    what: &str,
) -> Result<TensorType, String> {
    if !initial.is_tensor() {
        // A sequence or optional is carried as it is: the body must give the same type.
        let o = sig
            .body
            .outputs()
            .get(result)
            .ok_or_else(|| format!("body '{}' has no output {result}", sig.attr))?;
        let ty = sig
            .body
            .value_type(o.value)
            .map_err(|e| format!("body '{}': {e}", sig.attr))?;
        if ty.dtype != initial.dtype || ty.containers != initial.containers {
            return Err(format!(
                "body '{}' output {result} is {ty}, but the {what} it carries is {initial}",
                sig.attr
            ));
        }
        return Ok(initial.clone());
    }
    let (dtype, dims) = sig.result_type(result)?;
    let dims = match dims {
        Some(dims) if initial.ranked => dims,
        // The carried value's rank is unknown where it starts or where the body leaves it.
        _ if dtype == initial.dtype => return Ok(TensorType::unranked(dtype)),
        _ => {
            return Err(format!(
                "body '{}' output {result} is {dtype}, but the {what} it carries is {initial}",
                sig.attr
            ))
        }
    };
    if dtype != initial.dtype || dims.len() != initial.rank() {
        return Err(format!(
            "body '{}' output {result} is {dtype} of rank {}, but the {what} it carries is {initial}",
            sig.attr,
            dims.len()
        ));
    }
    let kept: Vec<Option<Dim>> = dims
        .iter()
        .zip(&initial.shape.axes)
        .map(|(d, a)| (d.as_ref() == Some(&a.dim)).then(|| a.dim.clone()))
        .collect();
    Ok(with_fresh(cx, out, dtype, &kept, None))
}

/// An error unless `t` is a one-element tensor of `dtype` (a scalar or shape `[1]`); of
/// a tensor of unknown rank only the dtype is known (the evaluation checks the rest).
fn check_single(t: &TensorType, dtype: DType, what: &str) -> Result<(), String> {
    let single =
        !t.ranked || t.rank() == 0 || (t.rank() == 1 && t.shape.axes[0].dim != Dim::Fixed(0));
    if t.dtype != dtype || !single || t.num_elements().is_some_and(|n| n != 1) {
        return Err(format!("{what} must be a {dtype} scalar, got {t}"));
    }
    Ok(())
}

/// The one element of a scalar-like tensor.
pub(crate) fn single_value(t: &Tensor, what: &str) -> Result<i64, String> {
    let v = t.to_i64_vec();
    match v.as_slice() {
        [x] => Ok(*x),
        _ => Err(format!(
            "{what} must have one element, got shape {:?}",
            t.shape()
        )),
    }
}

fn schedule_of(body: &Graph) -> Result<Vec<NodeId>, String> {
    body.schedule()
        .map_err(|e| format!("body '{}': {e}", body.name))
}

fn slice_at(t: &Tensor, axis: usize, i: usize) -> Result<Tensor, String> {
    Ok(crate::map_tensor!(t, a => a.index_axis(NdAxis(axis), i).to_owned()))
}

fn stack_onto<T: Elem>(first: &ArrayD<T>, rest: &[Tensor], axis: usize) -> Result<Tensor, String> {
    let mut views = vec![first.view()];
    for t in rest {
        views.push(T::view(t).ok_or("iterations differ in dtype")?.view());
    }
    ndarray::stack(NdAxis(axis), &views)
        .map(T::wrap)
        .map_err(|e| format!("iterations' results differ in shape: {e}"))
}

/// The per-iteration results stacked along a new `axis` (reversed first if `reverse`);
/// `empty` is the shape of a result when there were no iterations.
pub(crate) fn stack(
    mut parts: Vec<Tensor>,
    axis: usize,
    reverse: bool,
    empty: Tensor,
) -> Result<Tensor, String> {
    if reverse {
        parts.reverse();
    }
    match parts.split_first() {
        None => Ok(empty),
        Some((first, rest)) => match_tensor!(first, a => stack_onto(a, rest, axis)),
    }
}

/// An empty stack of body result `i`: zero along `axis`; elsewhere the body's fixed
/// dims, or the size a symbol takes in the parameters' shapes (`param_shapes`, what the
/// first iteration would have received), else 0.
pub(crate) fn empty_stack(
    body: &Graph,
    i: usize,
    axis: usize,
    param_shapes: &[Vec<usize>],
) -> Result<Tensor, String> {
    let mut sizes: HashMap<&str, usize> = HashMap::new();
    for (p, shape) in body.inputs().into_iter().zip(param_shapes) {
        for (a, &n) in body.node(p).outputs[0].shape.axes.iter().zip(shape) {
            if let Dim::Sym(s) = &a.dim {
                sizes.entry(s.as_str()).or_insert(n);
            }
        }
    }
    let o = body
        .outputs()
        .get(i)
        .ok_or_else(|| format!("body '{}' has no output {i}", body.name))?;
    let ty = body.value_type(o.value).map_err(|e| e.to_string())?;
    let mut dims: Vec<usize> = ty
        .shape
        .axes
        .iter()
        .map(|a| match &a.dim {
            Dim::Fixed(n) => *n,
            Dim::Sym(s) => sizes.get(s.as_str()).copied().unwrap_or(0),
        })
        .collect();
    dims.insert(axis.min(dims.len()), 0);
    Ok(Tensor::zeros(ty.dtype, &dims))
}

fn inputs_owned(cx: &EvalCtx<'_>, range: std::ops::Range<usize>) -> Result<Vec<Tensor>, String> {
    range.map(|i| cx.input(i).cloned()).collect()
}

// ---------------------------------------------------------------- If

struct If;

const IF: OpSchema = OpSchema {
    name: "If",
    family: "control",
    inputs: &["cond", "captures..."],
    outputs: &["outputs..."],
    attrs: &[
        AttrSpec::req("then_branch", AttrKind::Graph),
        AttrSpec::req("else_branch", AttrKind::Graph),
        CAPTURES,
    ],
    doc: "Runs `then_branch` if the one-element bool `cond` is true, else `else_branch`; \
          both take the captures and must give results of the same dtypes. A result whose \
          rank differs between the branches has an unknown rank until `cond` is a constant.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

impl Op for If {
    /// Values pass through the bodies as they are: any kind.
    fn takes(&self) -> super::Takes {
        super::Takes::Any
    }
    fn schema(&self) -> &OpSchema {
        &IF
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        check_single(cx.input(0)?, DType::Bool, "cond")?;
        let n = cx.inputs.len();
        if captures(cx.attrs, n, 1)? != n - 1 {
            return Err(format!(
                "every input after cond is a capture: captures must be {}",
                n - 1
            ));
        }
        let caps: Vec<Option<&TensorType>> = cx.inputs[1..].iter().map(|t| t.as_ref()).collect();
        let then = Signature::new(cx.attrs, "then_branch", &caps)?;
        let other = Signature::new(cx.attrs, "else_branch", &caps)?;
        if then.outputs() != other.outputs() {
            return Err(format!(
                "then_branch gives {} results, else_branch {}",
                then.outputs(),
                other.outputs()
            ));
        }
        // A constant condition: the taken branch alone says what the results are.
        let taken = cx
            .const_input(0)
            .and_then(|c| single_value(c, "cond").ok())
            .map(|c| c != 0);
        (0..then.outputs())
            .map(|i| {
                let (body_a, body_b) = (then.body_result(i)?, other.body_result(i)?);
                if !body_a.is_tensor() || !body_b.is_tensor() {
                    return branch_containers(i, body_a, body_b, taken);
                }
                let ((a, a_dims), (b, b_dims)) = (then.result_type(i)?, other.result_type(i)?);
                if a != b {
                    return Err(format!(
                        "result {i}: then_branch gives {a}, else_branch {b}"
                    ));
                }
                let dims = match (taken, a_dims, b_dims) {
                    (Some(true), dims, _) | (Some(false), _, dims) => dims,
                    (None, Some(x), Some(y)) if x.len() == y.len() => Some(
                        x.into_iter()
                            .zip(y)
                            .map(|(x, y)| if x == y { x } else { None })
                            .collect(),
                    ),
                    // The rank depends on which branch runs.
                    (None, _, _) => None,
                };
                Ok(match dims {
                    Some(dims) => with_fresh(cx, i, a, &dims, None),
                    None => TensorType::unranked(a),
                })
            })
            .collect()
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let cond = single_value(cx.input(0)?, "cond")? != 0;
        let body = cx
            .attrs
            .req_graph(if cond { "then_branch" } else { "else_branch" })?;
        let caps = inputs_owned(cx, 1..cx.inputs.len())?;
        run_body(body, &schedule_of(body)?, &caps)
    }
}

// ---------------------------------------------------------------- Loop

struct Loop;

const LOOP: OpSchema = OpSchema {
    name: "Loop",
    family: "control",
    inputs: &["M?", "cond?", "v_initial..."],
    outputs: &["outputs..."],
    attrs: &[AttrSpec::req("body", AttrKind::Graph), CAPTURES],
    doc: "Runs `body` while the iteration count is below the i64 scalar `M` (if given) and \
          the bool scalar condition holds (`cond`, then the body's first result). The body \
          takes (iteration, cond, carried..., captures...) and gives (cond, carried..., \
          scan outputs...); the results are the final carried values, then each scan \
          output stacked on a new leading axis.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

/// Loop's operands: how many carried values and captures.
pub(crate) fn loop_counts(cx_inputs: usize, attrs: &Attrs) -> Result<(usize, usize), String> {
    if cx_inputs < 2 {
        return Err(
            "Loop takes M and cond (each may be omitted, `_`) before its carried values".into(),
        );
    }
    let c = captures(attrs, cx_inputs, 2)?;
    Ok((cx_inputs - 2 - c, c))
}

impl Op for Loop {
    /// Values pass through the bodies as they are: any kind.
    fn takes(&self) -> super::Takes {
        super::Takes::Any
    }
    fn schema(&self) -> &OpSchema {
        &LOOP
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (carried, _) = loop_counts(cx.inputs.len(), cx.attrs)?;
        if let Some(m) = cx.opt_input(0) {
            check_single(m, DType::I64, "M")?;
        }
        if let Some(c) = cx.opt_input(1) {
            check_single(c, DType::Bool, "cond")?;
        }
        let iter = TensorType::new(DType::I64, Shape::scalar());
        let cond = TensorType::new(DType::Bool, Shape::scalar());
        let mut expected: Vec<Option<&TensorType>> = vec![None, None];
        for i in 2..cx.inputs.len() {
            expected.push(Some(cx.input(i)?));
        }
        let sig = Signature::new(cx.attrs, "body", &expected)?;
        let params = sig.body.inputs();
        for (i, want) in [(0, &iter), (1, &cond)] {
            let got = &sig.body.node(params[i]).outputs[0];
            check_single(
                got,
                want.dtype,
                &format!("body input {i} ('{}')", sig.body.node(params[i]).name),
            )?;
        }
        let n_out = sig.outputs();
        if n_out < 1 + carried {
            return Err(format!(
                "body gives {n_out} results; it must give cond and the {carried} carried values first"
            ));
        }
        let cond_type = match sig.result_type(0)? {
            (dtype, Some(dims)) => TensorType::new(
                dtype,
                Shape::new(dims.into_iter().map(|d| d.unwrap_or(Dim::Fixed(1)))),
            ),
            (dtype, None) => TensorType::unranked(dtype),
        };
        check_single(&cond_type, DType::Bool, "body result 0 (cond)")?;
        let mut outs = Vec::with_capacity(n_out - 1);
        for k in 0..carried {
            let initial = cx.input(2 + k)?;
            outs.push(carried_type(
                cx,
                &sig,
                1 + k,
                k,
                initial,
                &format!("carried value {k}"),
            )?);
        }
        let trips = match cx.const_input(0) {
            Some(m) if runs_every_trip(cx, sig.body) => single_value(m, "M")
                .ok()
                .map(|m| Dim::Fixed(m.max(0) as usize)),
            _ => None,
        };
        for r in 1 + carried..n_out {
            let out = r - 1;
            let (dtype, Some(dims)) = sig.result_type(r)? else {
                // Stacking results of unknown rank gives a stack of unknown rank.
                outs.push(TensorType::unranked(sig.result_type(r)?.0));
                continue;
            };
            let mut ty = with_fresh(cx, out, dtype, &dims, Some(0));
            let len = trips.clone().unwrap_or_else(|| cx.fresh_dim(out, 0));
            ty.shape.axes.insert(
                0,
                crate::ir::Axis {
                    dim: len,
                    name: None,
                },
            );
            outs.push(ty);
        }
        Ok(outs)
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let (carried, _) = loop_counts(cx.inputs.len(), cx.attrs)?;
        let body = cx.attrs.req_graph("body")?;
        let schedule = schedule_of(body)?;
        let trips = match cx.opt_input(0) {
            Some(m) => single_value(m, "M")?,
            None => i64::MAX,
        };
        let mut cond = match cx.opt_input(1) {
            Some(c) => single_value(c, "cond")? != 0,
            None => true,
        };
        let mut state = inputs_owned(cx, 2..2 + carried)?;
        let caps = inputs_owned(cx, 2 + carried..cx.inputs.len())?;
        let mut first_shapes = vec![vec![], vec![]];
        first_shapes.extend(state.iter().chain(&caps).map(|t| t.shape().to_vec()));
        let n_scan = body.outputs().len().saturating_sub(1 + carried);
        let mut scans: Vec<Vec<Tensor>> = vec![vec![]; n_scan];
        let mut i = 0i64;
        while i < trips && cond {
            if i >= MAX_ITERATIONS {
                return Err(format!(
                    "the loop ran {MAX_ITERATIONS} iterations without ending"
                ));
            }
            let mut args = Vec::with_capacity(2 + carried + caps.len());
            args.push(Tensor::scalar(i));
            args.push(Tensor::scalar(cond));
            args.append(&mut state);
            args.extend(caps.iter().cloned());
            let mut outs = run_body(body, &schedule, &args)?.into_iter();
            let c = outs.next().ok_or("the body gave no cond")?;
            cond = single_value(&c, "the body's cond")? != 0;
            state = outs.by_ref().take(carried).collect();
            for (acc, t) in scans.iter_mut().zip(outs) {
                acc.push(t);
            }
            i += 1;
        }
        let mut results = state;
        for (k, parts) in scans.into_iter().enumerate() {
            let empty = empty_stack(body, 1 + carried + k, 0, &first_shapes)?;
            results.push(stack(parts, 0, false, empty)?);
        }
        Ok(results)
    }
}

/// Whether a Loop surely runs all `M` trips: its condition starts true (no `cond`, or a
/// constant true) and the body passes it on unchanged or gives a constant true. (The
/// body's condition counts even without a `cond` operand, as in onnxruntime.)
fn runs_every_trip(cx: &InferCtx<'_>, body: &Graph) -> bool {
    let is_true = |t: &Tensor| t.to_i64_vec() == [1];
    let starts_true = match cx.opt_input(1) {
        None => true,
        Some(_) => cx.const_input(1).is_some_and(is_true),
    };
    let Some(out) = body.outputs().first() else {
        return false;
    };
    let node = body.node(out.value.node);
    let passed_on = body.inputs().get(1) == Some(&out.value.node);
    let constant_true = node.op == "Constant" && node.data.as_deref().is_some_and(is_true);
    starts_true && (passed_on || constant_true)
}

// ---------------------------------------------------------------- Scan

struct Scan;

const SCAN: OpSchema = OpSchema {
    name: "Scan",
    family: "control",
    inputs: &["initial_state_and_scan_inputs..."],
    outputs: &["final_state_and_scan_outputs..."],
    attrs: &[
        AttrSpec::req("body", AttrKind::Graph),
        AttrSpec::req("num_scan_inputs", AttrKind::Int),
        AttrSpec::opt("scan_input_axes", AttrKind::Ints, "0 for each"),
        AttrSpec::opt(
            "scan_input_directions",
            AttrKind::Ints,
            "0 (forward) for each",
        ),
        AttrSpec::opt("scan_output_axes", AttrKind::Ints, "0 for each"),
        AttrSpec::opt(
            "scan_output_directions",
            AttrKind::Ints,
            "0 (forward) for each",
        ),
        CAPTURES,
    ],
    doc: "Runs `body` once per slice of the scan inputs along their scan axes, carrying \
          the state: the body takes (state..., one slice of each scan input..., \
          captures...) and gives (state..., scan outputs...); the results are the final \
          state, then the scan outputs stacked along their axes (ONNX opset 9+).",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

/// Scan's layout: how many state values, scan inputs and captures; each scan input's
/// axis and direction.
struct ScanLayout {
    state: usize,
    scans: usize,
    input_axes: Vec<usize>,
    input_reverse: Vec<bool>,
}

/// `len` values of a per-scan-input or per-scan-output list attribute, `0` by default.
fn per_item(attrs: &Attrs, name: &str, len: usize) -> Result<Vec<i64>, String> {
    match attrs.ints(name)? {
        None => Ok(vec![0; len]),
        Some(v) if v.len() == len => Ok(v.to_vec()),
        Some(v) => Err(format!("{name} has {} entries, expected {len}", v.len())),
    }
}

fn directions(attrs: &Attrs, name: &str, len: usize) -> Result<Vec<bool>, String> {
    per_item(attrs, name, len)?
        .into_iter()
        .map(|d| match d {
            0 => Ok(false),
            1 => Ok(true),
            d => Err(format!("{name} entries must be 0 or 1, got {d}")),
        })
        .collect()
}

impl ScanLayout {
    fn new(attrs: &Attrs, ranks: &[usize]) -> Result<ScanLayout, String> {
        let m = attrs.req_int("num_scan_inputs")?;
        let scans = usize::try_from(m)
            .ok()
            .filter(|&m| m >= 1)
            .ok_or_else(|| format!("num_scan_inputs must be at least 1, got {m}"))?;
        let n = ranks.len();
        let c = captures(attrs, n, 0)?;
        let state = (n - c).checked_sub(scans).ok_or_else(|| {
            format!(
                "num_scan_inputs = {scans}, but there are only {} non-capture inputs",
                n - c
            )
        })?;
        let input_axes = per_item(attrs, "scan_input_axes", scans)?
            .into_iter()
            .enumerate()
            .map(|(j, a)| {
                norm_axis(a, ranks[state + j]).map_err(|e| format!("scan input {j}: {e}"))
            })
            .collect::<Result<_, _>>()?;
        let input_reverse = directions(attrs, "scan_input_directions", scans)?;
        Ok(ScanLayout {
            state,
            scans,
            input_axes,
            input_reverse,
        })
    }
}

impl Op for Scan {
    fn schema(&self) -> &OpSchema {
        &SCAN
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let types: Vec<&TensorType> = (0..cx.inputs.len())
            .map(|i| cx.input(i))
            .collect::<Result<_, _>>()?;
        let ranks: Vec<usize> = types.iter().map(|t| t.rank()).collect();
        let lay = ScanLayout::new(cx.attrs, &ranks)?;
        let mut len: Option<(usize, Dim)> = None;
        let mut slices = Vec::with_capacity(lay.scans);
        for j in 0..lay.scans {
            let t = types[lay.state + j];
            let axis = lay.input_axes[j];
            let d = t.shape.axes[axis].dim.clone();
            match &len {
                Some((k, Dim::Fixed(a))) if matches!(d, Dim::Fixed(b) if b != *a) => {
                    return Err(format!(
                        "scan input {j} has {d} steps along axis {axis}, scan input {k} has {a}"
                    ))
                }
                Some((_, Dim::Fixed(_))) => {}
                _ => len = Some((j, d)),
            }
            let mut s = t.clone();
            s.shape.axes.remove(axis);
            slices.push(s);
        }
        let mut expected: Vec<Option<&TensorType>> =
            types[..lay.state].iter().map(|&t| Some(t)).collect();
        expected.extend(slices.iter().map(Some));
        expected.extend(types[lay.state + lay.scans..].iter().map(|&t| Some(t)));
        let sig = Signature::new(cx.attrs, "body", &expected)?;
        let n_out = sig.outputs();
        if n_out < lay.state {
            return Err(format!(
                "body gives {n_out} results; it must give the {} state values first",
                lay.state
            ));
        }
        let mut outs = Vec::with_capacity(n_out);
        for (k, initial) in types[..lay.state].iter().enumerate() {
            let what = format!("state value {k}");
            outs.push(carried_type(cx, &sig, k, k, initial, &what)?);
        }
        let k_out = n_out - lay.state;
        let out_axes = per_item(cx.attrs, "scan_output_axes", k_out)?;
        directions(cx.attrs, "scan_output_directions", k_out)?;
        let steps = len.map(|(_, d)| d).expect("num_scan_inputs >= 1");
        for (k, &axis) in out_axes.iter().enumerate() {
            let out = lay.state + k;
            let (dtype, dims) = sig.result(out)?;
            let axis =
                norm_axis(axis, dims.len() + 1).map_err(|e| format!("scan output {k}: {e}"))?;
            let mut ty = with_fresh(cx, out, dtype, &dims, Some(axis));
            ty.shape.axes.insert(
                axis,
                crate::ir::Axis {
                    dim: steps.clone(),
                    name: None,
                },
            );
            outs.push(ty);
        }
        Ok(outs)
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let inputs = inputs_owned(cx, 0..cx.inputs.len())?;
        let ranks: Vec<usize> = inputs.iter().map(|t| t.rank()).collect();
        let lay = ScanLayout::new(cx.attrs, &ranks)?;
        let body = cx.attrs.req_graph("body")?;
        let schedule = schedule_of(body)?;
        let scan_inputs = &inputs[lay.state..lay.state + lay.scans];
        let steps = scan_inputs[0].shape()[lay.input_axes[0]];
        for (j, t) in scan_inputs.iter().enumerate() {
            let n = t.shape()[lay.input_axes[j]];
            if n != steps {
                return Err(format!(
                    "scan input {j} has {n} steps, scan input 0 has {steps}"
                ));
            }
        }
        let caps = &inputs[lay.state + lay.scans..];
        let n_scan_out = body.outputs().len().saturating_sub(lay.state);
        let mut state: Vec<Tensor> = inputs[..lay.state].to_vec();
        let mut first_shapes: Vec<Vec<usize>> = state.iter().map(|t| t.shape().to_vec()).collect();
        for (j, t) in scan_inputs.iter().enumerate() {
            let mut dims = t.shape().to_vec();
            dims.remove(lay.input_axes[j]);
            first_shapes.push(dims);
        }
        first_shapes.extend(caps.iter().map(|t| t.shape().to_vec()));
        let mut scans: Vec<Vec<Tensor>> = vec![vec![]; n_scan_out];
        for step in 0..steps {
            let mut args = std::mem::take(&mut state);
            for (j, t) in scan_inputs.iter().enumerate() {
                let i = if lay.input_reverse[j] {
                    steps - 1 - step
                } else {
                    step
                };
                args.push(slice_at(t, lay.input_axes[j], i)?);
            }
            args.extend(caps.iter().cloned());
            let mut outs = run_body(body, &schedule, &args)?.into_iter();
            state = outs.by_ref().take(lay.state).collect();
            for (acc, t) in scans.iter_mut().zip(outs) {
                acc.push(t);
            }
        }
        let out_axes = per_item(cx.attrs, "scan_output_axes", n_scan_out)?;
        let out_reverse = directions(cx.attrs, "scan_output_directions", n_scan_out)?;
        let mut results = state;
        for (k, parts) in scans.into_iter().enumerate() {
            let o = &body.outputs()[lay.state + k];
            let rank = body.value_type(o.value).map_err(|e| e.to_string())?.rank();
            let axis = norm_axis(out_axes[k], rank + 1)?;
            let empty = empty_stack(body, lay.state + k, axis, &first_shapes)?;
            results.push(stack(parts, axis, out_reverse[k], empty)?);
        }
        Ok(results)
    }
}

pub(crate) fn ops() -> Vec<&'static dyn Op> {
    vec![leak(If), leak(Loop), leak(Scan)]
}

/// The most iterations a Loop of constants may take to be evaluated ahead of a run (by
/// the importer or constant folding); a longer one, or one only its condition ends,
/// stays a node and runs when the graph does.
pub(crate) const MAX_FOLDED_TRIPS: i64 = 1024;

/// Whether evaluating `op` ahead of a run takes bounded time: a Loop needs a constant
/// trip count (`trip_count`, its first operand) of at most [`MAX_FOLDED_TRIPS`], and no
/// body inside may hold a Loop (nested trip counts multiply).
pub(crate) fn folds_in_bounded_time(op: &str, trip_count: Option<&Tensor>, attrs: &Attrs) -> bool {
    fn holds_loop(g: &Graph) -> bool {
        g.nodes()
            .iter()
            .any(|n| n.op == "Loop" || n.attrs.graphs().any(|(_, b)| holds_loop(b)))
    }
    let bounded = op != "Loop"
        || trip_count.is_some_and(|m| matches!(m.to_i64_vec()[..], [m] if m <= MAX_FOLDED_TRIPS));
    bounded && !attrs.graphs().any(|(_, b)| holds_loop(b))
}
