//! Two-operand `Einsum`s lowered to one `MatMul` between transposes and reshapes (part
//! of `simplify`), so they run on the GEMM: the labels in both operands and the output
//! are the batch, those in one operand and the output are M (left) or N (right), those
//! in both operands only are K. `A` becomes `[batch, M, K]`, `B` `[batch, K, N]`, the
//! product is reshaped to the labels' extents and transposed into the output's order.
//! Only static shapes, and only equations of that form: a label repeated in an operand
//! (a diagonal), summed away in one operand alone, or broadcast between the operands
//! keeps the `Einsum`.
use super::{add_const, replace_node, try_add, Changed, PassContext};
use crate::error::Result;
use crate::ir::ops::matmul::{einsum_labels, parse_equation};
use crate::ir::{Attr, Attrs, Graph, NodeId, Value};
use crate::tensor::Tensor;

pub(super) fn lower(g: &mut Graph, id: NodeId, cx: &mut PassContext) -> Result<Changed> {
    let n = g.node(id);
    let ([Some(a), Some(b)], [out_ty]) = (n.inputs.as_slice(), n.outputs.as_slice()) else {
        return Ok(false);
    };
    let (a, b) = (*a, *b);
    let (Some(a_dims), Some(b_dims)) = (
        g.value_type(a)?.static_dims(),
        g.value_type(b)?.static_dims(),
    ) else {
        return Ok(false);
    };
    if out_ty.static_dims().is_none() {
        return Ok(false);
    }
    let Ok(eq) = parse_equation(n.attrs.string_or("equation", "").unwrap_or(""), 2) else {
        return Ok(false);
    };
    let Ok((ins, out)) = einsum_labels(&eq, &[a_dims.len(), b_dims.len()]) else {
        return Ok(false);
    };
    let (la, lb) = (&ins[0], &ins[1]);
    let repeats = |l: &[u32]| (0..l.len()).any(|i| l[..i].contains(&l[i]));
    if repeats(la) || repeats(lb) {
        return Ok(false);
    }
    let size = |l: u32| -> Option<usize> {
        let at =
            |labels: &[u32], dims: &[usize]| labels.iter().position(|&x| x == l).map(|i| dims[i]);
        match (at(la, &a_dims), at(lb, &b_dims)) {
            (Some(x), Some(y)) if x != y => None, // broadcast between the operands
            (Some(x), _) | (_, Some(x)) => Some(x),
            _ => None,
        }
    };
    let (mut batch, mut m, mut nn, mut k) = (vec![], vec![], vec![], vec![]);
    for &l in la.iter().chain(lb) {
        let (in_a, in_b, in_out) = (la.contains(&l), lb.contains(&l), out.contains(&l));
        let class = match (in_a, in_b, in_out) {
            (true, true, true) => &mut batch,
            (true, false, true) => &mut m,
            (false, true, true) => &mut nn,
            (true, true, false) => &mut k,
            _ => return Ok(false), // summed in one operand alone
        };
        if !class.contains(&l) {
            class.push(l);
        }
    }
    let mut extents = vec![];
    for labels in [&batch, &m, &nn, &k] {
        let mut product = 1usize;
        for &l in labels.iter() {
            let Some(s) = size(l) else { return Ok(false) };
            product *= s;
        }
        extents.push(product);
    }
    let [bsz, msz, nsz, ksz] = [extents[0], extents[1], extents[2], extents[3]];
    let name = g.node(id).name.clone();
    let i64s = |v: &[usize]| v.iter().map(|&x| x as i64).collect::<Vec<_>>();
    let transpose = |g: &mut Graph, x: Value, from: &[u32], to: Vec<u32>| -> Option<Value> {
        let perm: Vec<usize> = to
            .iter()
            .map(|l| from.iter().position(|x| x == l))
            .collect::<Option<_>>()?;
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return Some(x);
        }
        let attrs = Attrs::new().with("perm", Attr::Ints(i64s(&perm)));
        try_add(g, "Transpose", &[Some(x)], attrs, &name).map(Value::from)
    };
    let reshape = |g: &mut Graph, x: Value, dims: &[usize]| -> Result<Option<Value>> {
        let shape = add_const(
            g,
            &name,
            Tensor::from_vec(&[dims.len()], i64s(dims)).map_err(crate::error::Error::Graph)?,
        )?;
        Ok(try_add(
            g,
            "Reshape",
            &[Some(x), Some(shape.into())],
            Attrs::new(),
            &name,
        )
        .map(Value::from))
    };
    let cat = |parts: &[&Vec<u32>]| {
        parts
            .iter()
            .flat_map(|p| p.iter().copied())
            .collect::<Vec<_>>()
    };
    let (a3, b3) = if batch.is_empty() {
        (vec![msz, ksz], vec![ksz, nsz])
    } else {
        (vec![bsz, msz, ksz], vec![bsz, ksz, nsz])
    };
    let Some(at) = transpose(g, a, la, cat(&[&batch, &m, &k])) else {
        return Ok(false);
    };
    let Some(bt) = transpose(g, b, lb, cat(&[&batch, &k, &nn])) else {
        return Ok(false);
    };
    let (Some(a3), Some(b3)) = (reshape(g, at, &a3)?, reshape(g, bt, &b3)?) else {
        return Ok(false);
    };
    let Some(product) = try_add(g, "MatMul", &[Some(a3), Some(b3)], Attrs::new(), &name) else {
        return Ok(false);
    };
    // The product as the labels batch·m·n, then in the output's order.
    let grouped = cat(&[&batch, &m, &nn]);
    let grouped_dims: Vec<usize> = grouped.iter().map(|&l| size(l).unwrap_or(1)).collect();
    let perm: Vec<usize> = match out
        .iter()
        .map(|l| grouped.iter().position(|x| x == l))
        .collect::<Option<Vec<_>>>()
    {
        Some(p) => p,
        None => return Ok(false),
    };
    let shape = add_const(
        g,
        &name,
        Tensor::from_vec(&[grouped_dims.len()], i64s(&grouped_dims))
            .map_err(crate::error::Error::Graph)?,
    )?;
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        return replace_node(
            g,
            id,
            id,
            "Reshape",
            &[Some(product.into()), Some(shape.into())],
            Attrs::new(),
            cx,
        );
    }
    let Some(grouped) = try_add(
        g,
        "Reshape",
        &[Some(product.into()), Some(shape.into())],
        Attrs::new(),
        &name,
    ) else {
        return Ok(false);
    };
    let attrs = Attrs::new().with("perm", Attr::Ints(i64s(&perm)));
    replace_node(g, id, id, "Transpose", &[Some(grouped.into())], attrs, cx)
}
