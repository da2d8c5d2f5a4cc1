//! Contractions: MatMul (numpy semantics), Gemm, Einsum, and the Kiln-only Dot, which
//! contracts the axes its operands share by name; and Det.
//!
//! Reference semantics: floats compute in f64 and round once; integers in i64.
use crate::ir::ops::{InPlace, Origin};
use ndarray::{ArrayD, IxDyn};

use super::util::{out, same_dtype};
use super::{leak, AttrSpec, EvalCtx, InferCtx, Op, OpSchema};
use crate::ir::shape::{broadcast_shapes, merge_names, Axis};
use crate::ir::{AttrKind, DType, Dim, Shape, TensorType};
use crate::tensor::Tensor;

/// Two dims that must be equal (a contracted pair): fixed sizes must agree; a symbol
/// meets anything, and the fixed one survives.
fn unify(a: &Dim, b: &Dim, what: impl Fn() -> String) -> Result<Dim, String> {
    match (a, b) {
        (Dim::Fixed(x), Dim::Fixed(y)) if x != y => Err(format!("{} ({x} vs {y})", what())),
        (Dim::Fixed(_), _) => Ok(a.clone()),
        _ => Ok(b.clone()),
    }
}

fn numeric(t: &TensorType, i: usize) -> Result<(), String> {
    if t.dtype.is_numeric() {
        Ok(())
    } else {
        Err(format!("input {i} must be numeric, got {}", t.dtype))
    }
}

/// The general contraction every op here lowers to: `out[o] = Σ Π_k operand_k[...]`,
/// where each operand axis carries a label, `sizes[label]` is its extent, and an operand
/// axis of size 1 broadcasts. `out_labels` are the output axes in order; every other
/// label is summed over. Plain nested iteration over all labels, last label fastest:
/// obviously right. An element's offset is its label index dotted with per-label strides
/// (0 for a label the tensor lacks or broadcasts; a label named twice, an einsum
/// diagonal, adds both axes' strides), so the innermost label walks flat memory.
fn contract(
    operands: &[(&ArrayD<f64>, Vec<usize>)],
    sizes: &[usize],
    out_labels: &[usize],
) -> ArrayD<f64> {
    let out_shape: Vec<usize> = out_labels.iter().map(|&l| sizes[l]).collect();
    // A first label of extent 1 gives the loops an innermost label even for scalars.
    let sizes: Vec<usize> = std::iter::once(1).chain(sizes.iter().copied()).collect();
    let strides = |shape: &[usize], labels: &[usize]| -> Vec<usize> {
        let mut per_label = vec![0; sizes.len()];
        let mut step = 1;
        for (&extent, &l) in shape.iter().zip(labels).rev() {
            if extent != 1 {
                per_label[l + 1] += step;
            }
            step *= extent;
        }
        per_label
    };
    let data: Vec<_> = operands
        .iter()
        .map(|(a, _)| a.as_standard_layout())
        .collect();
    let data: Vec<&[f64]> = data
        .iter()
        .map(|a| a.as_slice().expect("standard layout"))
        .collect();
    let op_strides: Vec<Vec<usize>> = operands
        .iter()
        .map(|(a, labels)| strides(a.shape(), labels))
        .collect();
    let out_strides = strides(&out_shape, out_labels);
    let mut out = vec![0.0; out_shape.iter().product()];
    let last = sizes.len() - 1;
    let inner: Vec<usize> = op_strides.iter().map(|s| s[last]).collect();
    let mut idx = vec![0usize; last];
    let dot = |idx: &[usize], s: &[usize]| idx.iter().zip(s).map(|(i, s)| i * s).sum::<usize>();
    if sizes.contains(&0) {
        return ArrayD::zeros(IxDyn(&out_shape));
    }
    let mut base = vec![0usize; operands.len()];
    loop {
        for (b, s) in base.iter_mut().zip(&op_strides) {
            *b = dot(&idx, s);
        }
        let out_base = dot(&idx, &out_strides);
        for i in 0..sizes[last] {
            let mut prod = 1.0;
            for ((d, b), s) in data.iter().zip(&base).zip(&inner) {
                prod *= d[b + i * s];
            }
            out[out_base + i * out_strides[last]] += prod;
        }
        // The next combination of the outer labels, the last of them fastest.
        let mut l = last;
        loop {
            if l == 0 {
                return ArrayD::from_shape_vec(IxDyn(&out_shape), out).expect("sized");
            }
            l -= 1;
            idx[l] += 1;
            if idx[l] < sizes[l] {
                break;
            }
            idx[l] = 0;
        }
    }
}

/// Converts the result back: f64 for floats, rounded to i64 for integers.
fn finish(dtype: DType, a: ArrayD<f64>) -> Tensor {
    if dtype.is_float() {
        Tensor::from_f64_array(dtype, a)
    } else {
        Tensor::from_i64_array(dtype, a.mapv(|v| v as i64))
    }
}

// ---------------------------------------------------------------- MatMul

struct MatMul;

const MATMUL: OpSchema = OpSchema {
    name: "MatMul",
    family: "matmul",
    inputs: &["A", "B"],
    outputs: &["Y"],
    attrs: &[],
    doc: "Matrix product with numpy semantics: 1-D operands are promoted and the added \
          axis removed, leading (batch) axes broadcast.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

/// The MatMul output shape of `a` × `b` (numpy rules), names kept.
fn matmul_shape(a: &Shape, b: &Shape) -> Result<Shape, String> {
    if a.rank() == 0 || b.rank() == 0 {
        return Err("MatMul operands must have rank >= 1".into());
    }
    let unnamed = |d: Dim| Axis { dim: d, name: None };
    let mut a_axes = a.axes.clone();
    let mut b_axes = b.axes.clone();
    if a_axes.len() == 1 {
        a_axes.insert(0, unnamed(Dim::Fixed(1)));
    }
    if b_axes.len() == 1 {
        b_axes.push(unnamed(Dim::Fixed(1)));
    }
    let (ra, rb) = (a_axes.len(), b_axes.len());
    let k_a = &a_axes[ra - 1];
    let k_b = &b_axes[rb - 2];
    unify(&k_a.dim, &k_b.dim, || {
        format!(
            "inner dims differ: A's last axis is {} and B's second-to-last is {}",
            k_a.dim, k_b.dim
        )
    })?;
    merge_names(k_a.name.as_deref(), k_b.name.as_deref())
        .map_err(|e| format!("contracted axes: {e}"))?;
    let batch = broadcast_shapes(
        &Shape {
            axes: a_axes[..ra - 2].to_vec(),
        },
        &Shape {
            axes: b_axes[..rb - 2].to_vec(),
        },
    )?;
    let mut axes = batch.axes;
    if a.rank() > 1 {
        axes.push(a_axes[ra - 2].clone());
    }
    if b.rank() > 1 {
        axes.push(b_axes[rb - 1].clone());
    }
    Ok(Shape { axes })
}

impl Op for MatMul {
    fn schema(&self) -> &OpSchema {
        &MATMUL
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (a, b) = (cx.input(0)?, cx.input(1)?);
        numeric(a, 0)?;
        let dtype = same_dtype("MatMul", &[a, b])?;
        Ok(out(dtype, matmul_shape(&a.shape, &b.shape)?))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let (a, b) = (cx.input(0)?, cx.input(1)?);
        let (mut sa, mut sb) = (a.shape().to_vec(), b.shape().to_vec());
        let (a1, b1) = (sa.len() == 1, sb.len() == 1);
        if a1 {
            sa.insert(0, 1);
        }
        if b1 {
            sb.push(1);
        }
        let (ra, rb) = (sa.len(), sb.len());
        if sa[ra - 1] != sb[rb - 2] {
            return Err(format!(
                "inner dims differ: {:?} x {:?}",
                a.shape(),
                b.shape()
            ));
        }
        // Labels: batch axes right-aligned (0..nb), then m, n, k.
        let nb = (ra - 2).max(rb - 2);
        let mut sizes = vec![1usize; nb + 3];
        let (m, n, k) = (nb, nb + 1, nb + 2);
        let batch_labels = |r: usize| -> Vec<usize> { (nb - (r - 2)..nb).collect() };
        let mut la = batch_labels(ra);
        let mut lb = batch_labels(rb);
        for (labels, shape) in [(&la, &sa), (&lb, &sb)] {
            for (j, &l) in labels.iter().enumerate() {
                let d = shape[j];
                if d != 1 {
                    if sizes[l] != 1 && sizes[l] != d {
                        return Err(format!("batch dims do not broadcast: {sa:?} x {sb:?}"));
                    }
                    sizes[l] = d;
                }
            }
        }
        la.extend([m, k]);
        lb.extend([k, n]);
        sizes[m] = sa[ra - 2];
        sizes[n] = sb[rb - 1];
        sizes[k] = sa[ra - 1];
        // Operands may be views in any memory order (a Concat's output is not C-ordered).
        let fa = a
            .to_f64_array()
            .as_standard_layout()
            .into_owned()
            .into_shape_with_order(IxDyn(&sa))
            .map_err(|e| e.to_string())?;
        let fb = b
            .to_f64_array()
            .as_standard_layout()
            .into_owned()
            .into_shape_with_order(IxDyn(&sb))
            .map_err(|e| e.to_string())?;
        let mut out_labels: Vec<usize> = (0..nb).collect();
        if !a1 {
            out_labels.push(m);
        }
        if !b1 {
            out_labels.push(n);
        }
        // Contracting with k only, since an operand's size-1 axis broadcasts.
        let y = contract(&[(&fa, la), (&fb, lb)], &sizes, &out_labels);
        Ok(vec![finish(a.dtype(), y)])
    }
}

// ---------------------------------------------------------------- Gemm

struct Gemm;

const GEMM: OpSchema = OpSchema {
    name: "Gemm",
    family: "matmul",
    inputs: &["A", "B", "C?"],
    outputs: &["Y"],
    attrs: &[
        AttrSpec::opt("alpha", AttrKind::Float, "1.0"),
        AttrSpec::opt("beta", AttrKind::Float, "1.0"),
        AttrSpec::opt("transA", AttrKind::Int, "0"),
        AttrSpec::opt("transB", AttrKind::Int, "0"),
    ],
    doc: "Y = alpha * A' * B' + beta * C, A' and B' optionally transposed 2-D matrices; \
          C broadcasts to [M, N].",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

impl Op for Gemm {
    fn schema(&self) -> &OpSchema {
        &GEMM
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (a, b) = (cx.input(0)?, cx.input(1)?);
        numeric(a, 0)?;
        let dtype = same_dtype("Gemm", &[a, b])?;
        if a.rank() != 2 || b.rank() != 2 {
            return Err(format!("A and B must be 2-D, got {a} and {b}"));
        }
        let ta = cx.attrs.int_or("transA", 0)? != 0;
        let tb = cx.attrs.int_or("transB", 0)? != 0;
        let (m, ka) = if ta { (1, 0) } else { (0, 1) };
        let (kb, n) = if tb { (1, 0) } else { (0, 1) };
        unify(a.shape.dim(ka), b.shape.dim(kb), || {
            "the contracted dims of A and B differ".into()
        })?;
        let y = Shape {
            axes: vec![a.shape.axes[m].clone(), b.shape.axes[n].clone()],
        };
        if let Some(c) = cx.opt_input(2) {
            same_dtype("Gemm", &[a, c])?;
            let bc = broadcast_shapes(&c.shape, &y).map_err(|e| format!("C: {e}"))?;
            if bc.rank() != 2 || bc.dims() != y.dims() {
                return Err(format!("C ({c}) must broadcast to {y}"));
            }
        }
        Ok(out(dtype, y))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let (a, b) = (cx.input(0)?, cx.input(1)?);
        let alpha = cx.attrs.float_or("alpha", 1.0)?;
        let beta = cx.attrs.float_or("beta", 1.0)?;
        let mut fa = a.to_f64_array();
        let mut fb = b.to_f64_array();
        if cx.attrs.int_or("transA", 0)? != 0 {
            fa = fa.reversed_axes();
        }
        if cx.attrs.int_or("transB", 0)? != 0 {
            fb = fb.reversed_axes();
        }
        let (m, k, n) = (fa.shape()[0], fa.shape()[1], fb.shape()[1]);
        if fb.shape()[0] != k {
            return Err(format!("A' is {m}x{k} but B' is {}x{n}", fb.shape()[0]));
        }
        let ab = contract(&[(&fa, vec![0, 2]), (&fb, vec![2, 1])], &[m, n, k], &[0, 1]);
        let mut y = ab.mapv(|v| alpha * v);
        if let Some(c) = cx.opt_input(2) {
            let fc = c.to_f64_array();
            let fc = fc
                .broadcast(IxDyn(&[m, n]))
                .ok_or_else(|| format!("C {:?} does not broadcast to [{m}, {n}]", c.shape()))?;
            y.zip_mut_with(&fc, |v, &c| *v += beta * c);
        }
        Ok(vec![finish(a.dtype(), y)])
    }
}

// ---------------------------------------------------------------- Einsum

struct Einsum;

const EINSUM: OpSchema = OpSchema {
    name: "Einsum",
    family: "matmul",
    inputs: &["Inputs..."],
    outputs: &["Output"],
    attrs: &[AttrSpec::req("equation", AttrKind::String)],
    doc: "Einstein summation, e.g. \"bhqd,bhkd->bhqk\" or \"bi,oij,bj->bo\": letters label \
          axes, a repeated letter takes a diagonal, letters absent from the output are \
          summed, '...' broadcasts. Without '->' the output is the letters used once, sorted.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

/// A parsed equation: per operand its labels (letters, or `None` for the ellipsis), and
/// the output's.
pub(crate) struct Equation {
    inputs: Vec<Vec<Option<char>>>,
    output: Vec<Option<char>>,
}

fn parse_term(term: &str) -> Result<Vec<Option<char>>, String> {
    let mut labels = vec![];
    let mut rest = term.trim();
    while let Some(c) = rest.chars().next() {
        if rest.starts_with("...") {
            if labels.contains(&None) {
                return Err(format!("'{term}' has two ellipses"));
            }
            labels.push(None);
            rest = &rest[3..];
        } else if c.is_ascii_alphabetic() {
            labels.push(Some(c));
            rest = &rest[1..];
        } else if c == ' ' {
            rest = &rest[1..];
        } else {
            return Err(format!("unexpected {c:?} in equation term '{term}'"));
        }
    }
    Ok(labels)
}

pub(crate) fn parse_equation(eq: &str, n_inputs: usize) -> Result<Equation, String> {
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (eq, None),
    };
    let inputs = lhs
        .split(',')
        .map(parse_term)
        .collect::<Result<Vec<_>, _>>()?;
    if inputs.len() != n_inputs {
        return Err(format!(
            "equation '{eq}' has {} operands, the node has {n_inputs} inputs",
            inputs.len()
        ));
    }
    let output = match rhs {
        Some(r) => {
            let out = parse_term(r)?;
            for (i, l) in out.iter().enumerate() {
                if out[..i].contains(l) {
                    return Err(format!("output term '{r}' repeats a label"));
                }
                if let Some(c) = l {
                    if !inputs.iter().any(|t| t.contains(l)) {
                        return Err(format!("output label '{c}' is not in any operand"));
                    }
                }
            }
            out
        }
        None => {
            let mut once: Vec<char> = ('A'..='Z')
                .chain('a'..='z')
                .filter(|c| inputs.iter().flatten().filter(|l| **l == Some(*c)).count() == 1)
                .collect();
            once.sort_unstable();
            let ellipsis = inputs.iter().any(|t| t.contains(&None));
            ellipsis
                .then_some(None)
                .into_iter()
                .chain(once.into_iter().map(Some))
                .collect()
        }
    };
    Ok(Equation { inputs, output })
}

/// Expands each operand's ellipsis into numbered labels (right-aligned across
/// operands); returns per operand its axis labels, and the output labels. Labels: letters map to their char code, ellipsis axis j to 256 + j.
pub(crate) fn einsum_labels(
    eq: &Equation,
    ranks: &[usize],
) -> Result<(Vec<Vec<u32>>, Vec<u32>), String> {
    let mut widths = vec![];
    for (i, (t, &r)) in eq.inputs.iter().zip(ranks).enumerate() {
        let letters = t.iter().filter(|l| l.is_some()).count();
        let has_ellipsis = t.contains(&None);
        if (!has_ellipsis && letters != r) || letters > r {
            return Err(format!(
                "operand {i} has rank {r}, its term has {letters} labels"
            ));
        }
        widths.push(if has_ellipsis { r - letters } else { 0 });
    }
    let width = widths.iter().copied().max().unwrap_or(0);
    let labels_of = |t: &[Option<char>], w: usize| -> Vec<u32> {
        t.iter()
            .flat_map(|l| match l {
                Some(c) => vec![*c as u32],
                None => (width - w..width).map(|j| 256 + j as u32).collect(),
            })
            .collect()
    };
    let ins = eq
        .inputs
        .iter()
        .zip(&widths)
        .map(|(t, &w)| labels_of(t, w))
        .collect();
    Ok((ins, labels_of(&eq.output, width)))
}

impl Op for Einsum {
    fn schema(&self) -> &OpSchema {
        &EINSUM
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let n = cx.inputs.len();
        if n == 0 {
            return Err("Einsum needs at least one input".into());
        }
        let types: Vec<&TensorType> = (0..n).map(|i| cx.input(i)).collect::<Result<_, _>>()?;
        numeric(types[0], 0)?;
        let dtype = same_dtype("Einsum", &types)?;
        let eq = parse_equation(cx.attrs.string_or("equation", "")?, n)?;
        let ranks: Vec<usize> = types.iter().map(|t| t.rank()).collect();
        let (ins, outs) = einsum_labels(&eq, &ranks)?;
        let mut dims: std::collections::BTreeMap<u32, Axis> = Default::default();
        for (i, (labels, t)) in ins.iter().zip(&types).enumerate() {
            for (axis, &l) in t.shape.axes.iter().zip(labels) {
                let merged = match dims.get(&l) {
                    None => axis.clone(),
                    // Ellipsis axes broadcast; lettered ones must agree.
                    Some(prev) if l >= 256 && prev.dim.is_one() => axis.clone(),
                    Some(prev) if l >= 256 && axis.dim.is_one() => prev.clone(),
                    Some(prev) => Axis {
                        dim: unify(&prev.dim, &axis.dim, || {
                            format!("operand {i}: label sizes differ")
                        })?,
                        name: merge_names(prev.name.as_deref(), axis.name.as_deref())?,
                    },
                };
                dims.insert(l, merged);
            }
        }
        let axes = outs.iter().map(|l| dims[l].clone()).collect();
        Ok(out(dtype, Shape { axes }))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let n = cx.inputs.len();
        let ts: Vec<&Tensor> = (0..n).map(|i| cx.input(i)).collect::<Result<_, _>>()?;
        let eq = parse_equation(cx.attrs.string_or("equation", "")?, n)?;
        let ranks: Vec<usize> = ts.iter().map(|t| t.rank()).collect();
        let (ins, outs) = einsum_labels(&eq, &ranks)?;
        // Dense label numbering for `contract`.
        let mut ids: Vec<u32> = ins.iter().flatten().copied().collect();
        ids.sort_unstable();
        ids.dedup();
        let id = |l: u32| ids.binary_search(&l).expect("seen");
        let mut sizes = vec![1usize; ids.len()];
        for (labels, t) in ins.iter().zip(&ts) {
            for (&l, &d) in labels.iter().zip(t.shape()) {
                let s = &mut sizes[id(l)];
                if d != 1 && *s != 1 && *s != d {
                    return Err(format!("label sizes differ: {d} vs {s}"));
                }
                if d != 1 {
                    *s = d;
                }
            }
        }
        // A lettered axis of size 1 against a larger one is a mismatch, not a broadcast.
        for (labels, t) in ins.iter().zip(&ts) {
            for (&l, &d) in labels.iter().zip(t.shape()) {
                if l < 256 && d != sizes[id(l)] {
                    return Err(format!(
                        "label '{}' is {d} here, {} elsewhere",
                        l as u8 as char,
                        sizes[id(l)]
                    ));
                }
            }
        }
        let arrays: Vec<ArrayD<f64>> = ts.iter().map(|t| t.to_f64_array()).collect();
        let operands: Vec<(&ArrayD<f64>, Vec<usize>)> = arrays
            .iter()
            .zip(&ins)
            .map(|(a, l)| (a, l.iter().map(|&l| id(l)).collect()))
            .collect();
        let out_ids: Vec<usize> = outs.iter().map(|&l| id(l)).collect();
        Ok(vec![finish(
            ts[0].dtype(),
            contract(&operands, &sizes, &out_ids),
        )])
    }
}

// ---------------------------------------------------------------- Dot

struct Dot;

const DOT: OpSchema = OpSchema {
    name: "Dot",
    family: "matmul",
    inputs: &["A", "B"],
    outputs: &["Y"],
    attrs: &[],
    doc: "Kiln-only. Contracts every axis the operands share by name; the output has A's \
          other axes then B's, names kept. Both operands need axis names.",
    in_place: InPlace::No,
    origin: Origin::Kiln,
};

/// Per operand, which axes are contracted (by position in the other operand).
pub(crate) fn dot_plan(a: &Shape, b: &Shape) -> Result<Vec<(usize, usize)>, String> {
    if !a.has_names() || !b.has_names() {
        return Err("Dot contracts axes by name: both operands need named axes".into());
    }
    let mut pairs = vec![];
    for (i, ax) in a.axes.iter().enumerate() {
        let Some(name) = &ax.name else { continue };
        if let Some(j) = b.axis_by_name(name) {
            unify(&ax.dim, b.dim(j), || {
                format!(
                    "axis '{name}' is {} in input 0 but {} in input 1",
                    ax.dim,
                    b.dim(j)
                )
            })?;
            pairs.push((i, j));
        }
    }
    Ok(pairs)
}

impl Op for Dot {
    fn schema(&self) -> &OpSchema {
        &DOT
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (a, b) = (cx.input(0)?, cx.input(1)?);
        numeric(a, 0)?;
        let dtype = same_dtype("Dot", &[a, b])?;
        let pairs = dot_plan(&a.shape, &b.shape)?;
        let mut axes: Vec<Axis> = vec![];
        for (i, ax) in a.shape.axes.iter().enumerate() {
            if !pairs.iter().any(|p| p.0 == i) {
                axes.push(ax.clone());
            }
        }
        for (j, ax) in b.shape.axes.iter().enumerate() {
            if !pairs.iter().any(|p| p.1 == j) {
                axes.push(ax.clone());
            }
        }
        for (k, ax) in axes.iter().enumerate() {
            if ax.name.is_some() && axes[..k].iter().any(|o| o.name == ax.name) {
                return Err(format!(
                    "the output would have two axes named '{}'",
                    ax.name.as_deref().unwrap_or_default()
                ));
            }
        }
        Ok(out(dtype, Shape { axes }))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let (a, b) = (cx.input(0)?, cx.input(1)?);
        let pairs = dot_plan(&cx.input_type(0)?.shape, &cx.input_type(1)?.shape)?;
        let (ra, rb) = (a.rank(), b.rank());
        // Labels: A's axes 0..ra; B's contracted axes reuse A's label.
        let la: Vec<usize> = (0..ra).collect();
        let mut lb = vec![];
        let mut sizes: Vec<usize> = a.shape().to_vec();
        for j in 0..rb {
            match pairs.iter().find(|p| p.1 == j) {
                Some(&(i, _)) => {
                    if a.shape()[i] != b.shape()[j] {
                        return Err(format!(
                            "contracted axis sizes differ at run time: {} vs {}",
                            a.shape()[i],
                            b.shape()[j]
                        ));
                    }
                    lb.push(i);
                }
                None => {
                    lb.push(sizes.len());
                    sizes.push(b.shape()[j]);
                }
            }
        }
        let out_labels: Vec<usize> = (0..ra)
            .filter(|i| !pairs.iter().any(|p| p.0 == *i))
            .chain(ra..sizes.len())
            .collect();
        let (fa, fb) = (a.to_f64_array(), b.to_f64_array());
        // A size-1 axis must not broadcast here: sizes are exact, so `contract`'s
        // broadcasting rule only ever applies to axes of extent 1 anyway.
        let y = contract(&[(&fa, la), (&fb, lb)], &sizes, &out_labels);
        Ok(vec![finish(a.dtype(), y)])
    }
}

/// Dot as an `Einsum` equation over A's and B's ranks for `pairs` (from [`dot_plan`]):
/// a letter per axis, a contracted pair sharing A's, the output A's others then B's.
pub(crate) fn dot_equation(ra: usize, rb: usize, pairs: &[(usize, usize)]) -> Option<String> {
    let letter = |k: usize| {
        (k < 52).then(|| (b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"[k]) as char)
    };
    let la: Vec<char> = (0..ra).map(letter).collect::<Option<_>>()?;
    let mut next = ra;
    let mut lb = vec![];
    for j in 0..rb {
        lb.push(match pairs.iter().find(|p| p.1 == j) {
            Some(&(i, _)) => la[i],
            None => {
                next += 1;
                letter(next - 1)?
            }
        });
    }
    let out: String = (0..ra)
        .filter(|i| !pairs.iter().any(|p| p.0 == *i))
        .map(|i| la[i])
        .chain(
            (0..rb)
                .filter(|j| !pairs.iter().any(|p| p.1 == *j))
                .map(|j| lb[j]),
        )
        .collect();
    let (la, lb): (String, String) = (la.into_iter().collect(), lb.into_iter().collect());
    Some(format!("{la},{lb}->{out}"))
}

// ---------------------------------------------------------------- Det

struct Det;

const DET: OpSchema = OpSchema {
    name: "Det",
    family: "matmul",
    inputs: &["X"],
    outputs: &["Y"],
    attrs: &[],
    doc: "Determinant of each square matrix X[..., M, M] (by LU with partial pivoting).",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

/// The determinant of the row-major `m` x `m` matrix `a` (overwritten by its LU form);
/// the CPU backend's Det kernel calls it too.
pub(crate) fn determinant(a: &mut [f64], m: usize) -> f64 {
    let mut det = 1.0;
    for col in 0..m {
        let pivot = (col..m)
            .max_by(|&i, &j| a[i * m + col].abs().total_cmp(&a[j * m + col].abs()))
            .unwrap_or(col);
        if a[pivot * m + col] == 0.0 {
            return 0.0;
        }
        if pivot != col {
            for k in 0..m {
                a.swap(col * m + k, pivot * m + k);
            }
            det = -det;
        }
        let p = a[col * m + col];
        det *= p;
        for row in col + 1..m {
            let f = a[row * m + col] / p;
            for k in col..m {
                a[row * m + k] -= f * a[col * m + k];
            }
        }
    }
    det
}

impl Op for Det {
    fn schema(&self) -> &OpSchema {
        &DET
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        if !x.dtype.is_float() {
            return Err(format!("X must be float, got {}", x.dtype));
        }
        let r = x.rank();
        if r < 2 {
            return Err(format!("X must be [..., M, M], got {x}"));
        }
        if let (Some(a), Some(b)) = (x.shape.dim(r - 2).fixed(), x.shape.dim(r - 1).fixed()) {
            if a != b {
                return Err(format!("X's matrices must be square, got {a} x {b}"));
            }
        }
        Ok(out(x.dtype, Shape::new(x.shape.dims()[..r - 2].to_vec())))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let xt = cx.input(0)?;
        let x = xt.to_f64_array();
        let s = x.shape();
        let (m, r) = (s[s.len() - 1], s.len());
        if s[r - 2] != m {
            return Err(format!(
                "X's matrices must be square, got {} x {m}",
                s[r - 2]
            ));
        }
        let flat: Vec<f64> = x.as_standard_layout().iter().copied().collect();
        let dets: Vec<f64> = if m == 0 {
            vec![1.0; s[..r - 2].iter().product()]
        } else {
            flat.chunks(m * m)
                .map(|c| determinant(&mut c.to_vec(), m))
                .collect()
        };
        Ok(vec![Tensor::from_f64s(xt.dtype(), &s[..r - 2], &dets)?])
    }
}

pub(crate) fn ops() -> Vec<&'static dyn Op> {
    vec![leak(MatMul), leak(Gemm), leak(Einsum), leak(Dot), leak(Det)]
}
