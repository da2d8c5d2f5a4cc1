//! Reverse-mode automatic differentiation on the IR: [`grad`] appends to a graph the
//! nodes that compute the gradient of a scalar loss with respect to parameters or
//! variables, one rule per op (`rules/`, one file per op family as in `ir::ops`),
//! so the backward computation is an ordinary graph: verified, optimized,
//! memory-planned and run like any other.
//!
//! The walk visits, in reverse order of the graph's arena (which is topological: a
//! node's inputs precede it), the nodes that lie on a float-valued path from a `wrt`
//! source to the loss; each sums the gradients reaching its outputs and hands them to
//! its op's rule, which returns one gradient per input. Rules build their results from
//! catalogue ops, so gradients of gradients come from the same rules.
use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::ir::{Attr, Attrs, DType, Graph, NodeId, TensorType, Value};
use crate::tensor::Tensor;

mod rules;

/// The gradients of `loss` (a float value with one element) with respect to each of
/// `wrt` (parameters or variables of float type), as new values of `g`, in order. A
/// `wrt` the loss does not depend on gets zeros.
pub fn grad(g: &mut Graph, loss: Value, wrt: &[Value]) -> Result<Vec<Value>> {
    let loss_ty = g.value_type(loss)?.clone();
    let loss_name = g.node(loss.node).name.clone();
    if !loss_ty.dtype.is_float() || loss_ty.num_elements() != Some(1) {
        return Err(Error::Graph(format!(
            "the loss '{loss_name}' ({}) must be a float scalar (one element), has type {loss_ty}",
            g.node(loss.node).op
        )));
    }
    for &w in wrt {
        let n = g.node(g.value_type(w).map(|_| w.node)?);
        if !matches!(n.op.as_str(), "Parameter" | "Variable") {
            return Err(Error::Graph(format!(
                "gradients are taken with respect to parameters and variables; '{}' is a {}",
                n.name, n.op
            )));
        }
        if !n.outputs[0].dtype.is_float() {
            return Err(Error::Graph(format!(
                "'{}' has type {}: only float values have gradients",
                n.name, n.outputs[0]
            )));
        }
    }
    let last = loss.node.index();
    // Forward: which nodes depend on a `wrt` through float values only.
    let mut float_path = vec![false; last + 1];
    // A `wrt` made after the loss cannot be on a path to it.
    for w in wrt.iter().filter(|w| w.node.index() <= last) {
        float_path[w.node.index()] = true;
    }
    for i in 0..=last {
        let n = g.node(NodeId(i as u32));
        for v in n.inputs.iter().flatten() {
            let k = v.node.index();
            let float_in = g.node(v.node).outputs[v.output as usize].dtype.is_float();
            float_path[i] |= float_path[k] && float_in;
        }
    }
    // Backward: which nodes the loss depends on.
    let mut needed = vec![false; last + 1];
    needed[last] = true;
    for i in (0..=last).rev() {
        if needed[i] {
            for v in g.node(NodeId(i as u32)).inputs.iter().flatten() {
                needed[v.node.index()] = true;
            }
        }
    }
    let mut cx = Cx {
        g,
        partials: HashMap::new(),
    };
    let ones = cx.constant(&loss_ty, 1.0)?;
    cx.partials.insert(loss, vec![ones]);
    let is_wrt = |id: NodeId| wrt.iter().any(|w| w.node == id);
    for i in (0..=last).rev() {
        let id = NodeId(i as u32);
        if !(needed[i] && float_path[i]) || is_wrt(id) {
            continue;
        }
        let n_out = cx.g.node(id).outputs.len();
        let gys = (0..n_out as u32)
            .map(|o| cx.total(id.out(o)))
            .collect::<Result<Vec<_>>>()?;
        if gys.iter().all(Option::is_none) {
            continue;
        }
        let node = cx.g.node(id).clone();
        let what = || format!("node '{}' ({})", node.name, node.op);
        // A registered op brings its own rule (the user's gradient callback).
        let own = match cx.g.op_impl(&node.op) {
            Some(op) => op.gradient(cx.g, id, &gys),
            None => None,
        };
        let result = match own {
            Some(r) => r.map_err(Error::Graph),
            None if node.op.contains("::") => Err(Error::Graph(format!(
                "no gradient rule for {} (register the op with a gradient callback)",
                node.op
            ))),
            None => rules::backward(&mut cx, id, &gys),
        };
        let gxs = result.map_err(|e| match e {
            Error::Graph(m) => Error::Graph(format!("gradient of {}: {m}", what())),
            e => e,
        })?;
        for (k, v) in node.inputs.iter().enumerate() {
            let Some(v) = *v else { continue };
            if !(float_path[v.node.index()]
                && cx.g.node(v.node).outputs[v.output as usize]
                    .dtype
                    .is_float())
            {
                continue;
            }
            match gxs.get(k).copied().flatten() {
                Some(gx) => cx.partials.entry(v).or_default().push(gx),
                None => {
                    return Err(Error::Graph(format!(
                        "{} is not differentiable with respect to its input {k}",
                        what()
                    )))
                }
            }
        }
    }
    let mut out = vec![];
    for &w in wrt {
        let total = cx.total(w)?;
        let gw = match total {
            Some(v) => v,
            None if reaches(cx.g, w, loss) => {
                return Err(Error::Graph(format!(
                "the loss '{loss_name}' depends on '{}' only through integer values: no gradient",
                cx.g.node(w.node).name
            )))
            }
            None => {
                let ty = cx.g.value_type(w)?.clone();
                cx.zeros_like(w, &ty)?
            }
        };
        out.push(gw);
    }
    Ok(out)
}

/// Whether `to` depends on `from` at all.
fn reaches(g: &Graph, from: Value, to: Value) -> bool {
    if from.node > to.node {
        return false;
    }
    let mut seen = vec![false; to.node.index() + 1];
    let mut stack = vec![to.node];
    while let Some(id) = stack.pop() {
        if id == from.node {
            return true;
        }
        if std::mem::replace(&mut seen[id.index()], true) {
            continue;
        }
        stack.extend(g.node(id).inputs.iter().flatten().map(|v| v.node));
    }
    false
}

/// The walk's state, and the helpers rules build their gradients with.
pub(crate) struct Cx<'g> {
    pub g: &'g mut Graph,
    /// The gradient contributions reaching each value so far.
    partials: HashMap<Value, Vec<Value>>,
}

impl Cx<'_> {
    /// The sum of the contributions to `v`'s gradient.
    fn total(&mut self, v: Value) -> Result<Option<Value>> {
        let Some(parts) = self.partials.remove(&v) else {
            return Ok(None);
        };
        let mut it = parts.into_iter();
        let mut sum = it.next().expect("a contribution");
        for p in it {
            sum = self.op("Add", &[sum, p], Attrs::new())?;
        }
        self.partials.insert(v, vec![sum]);
        Ok(Some(sum))
    }

    pub(crate) fn ty(&self, v: Value) -> TensorType {
        self.g.value_type(v).expect("an existing value").clone()
    }

    pub(crate) fn op(&mut self, op: &str, inputs: &[Value], attrs: Attrs) -> Result<Value> {
        self.g.apply(op, inputs, attrs)
    }

    /// A constant filled with `v`, typed `ty` (static).
    pub(crate) fn constant(&mut self, ty: &TensorType, v: f64) -> Result<Value> {
        let dims = ty
            .shape
            .to_fixed()
            .ok_or_else(|| Error::Graph(format!("a constant of type {ty} needs static dims")))?;
        let n = dims.iter().product();
        let t = Tensor::from_f64s(ty.dtype, &dims, &vec![v; n]).map_err(Error::Graph)?;
        let name = self.g.fresh_name("grad_const");
        Ok(self.g.add_constant(&name, ty.clone(), t)?.into())
    }

    /// A scalar constant of `dtype`.
    pub(crate) fn scalar(&mut self, dtype: DType, v: f64) -> Result<Value> {
        self.g.scalar("grad_const", dtype, v)
    }

    /// An i64 vector constant (axes, shapes).
    pub(crate) fn ints(&mut self, v: &[i64]) -> Result<Value> {
        self.g.ints("grad_axes", v)
    }

    /// Zeros shaped like `like` (its dims may be symbolic).
    pub(crate) fn zeros_like(&mut self, like: Value, ty: &TensorType) -> Result<Value> {
        let shape = self.op("Shape", &[like], Attrs::new())?;
        let attrs = Attrs::new()
            .with("value", Attr::Float(0.0))
            .with("dtype", Attr::String(ty.dtype.to_string()));
        self.op("ConstantOfShape", &[shape], attrs)
    }

    /// `gy` (broadcast result) summed back to the shape of `x` (an operand of the
    /// broadcasting op): over the leading axes `x` lacks and the axes where `x` has 1.
    pub(crate) fn unbroadcast(&mut self, gy: Value, x: Value) -> Result<Value> {
        let (ty, xt) = (self.ty(gy), self.ty(x));
        if ty.shape.dims() == xt.shape.dims() {
            return Ok(gy);
        }
        let lead = ty.rank() - xt.rank();
        let mut axes: Vec<i64> = (0..lead as i64).collect();
        for i in 0..xt.rank() {
            let (dx, dy) = (xt.shape.dim(i), ty.shape.dim(lead + i));
            if dx.fixed() == Some(1) && dy.fixed() != Some(1) {
                axes.push((lead + i) as i64);
            }
        }
        let mut s = gy;
        if !axes.is_empty() {
            let a = self.ints(&axes)?;
            s = self.op("ReduceSum", &[gy, a], Attrs::new())?;
        }
        self.reshape_like(s, x)
    }

    /// size(a) / size(b) as a scalar of `a`'s dtype, at run time (dims may be symbolic):
    /// how many elements of `a` a mean over `b`'s elements averages.
    pub(crate) fn count_ratio(&mut self, a: Value, b: Value) -> Result<Value> {
        let to = Attrs::new().with("to", Attr::String(self.ty(a).dtype.to_string()));
        let na = self.op("Size", &[a], Attrs::new())?;
        let nb = self.op("Size", &[b], Attrs::new())?;
        let na = self.op("Cast", &[na], to.clone())?;
        let nb = self.op("Cast", &[nb], to)?;
        self.op("Div", &[na, nb], Attrs::new())
    }

    /// `v`'s shape as an i64 vector: a constant when static (so that what is reshaped
    /// to it keeps static dims), else the `Shape` op.
    pub(crate) fn shape_of(&mut self, v: Value) -> Result<Value> {
        match self.ty(v).static_dims() {
            Some(d) => self.ints(&d.iter().map(|&d| d as i64).collect::<Vec<_>>()),
            None => self.op("Shape", &[v], Attrs::new()),
        }
    }

    /// `x` reshaped to `like`'s shape. With one symbolic dim (a batch) and the others
    /// fixed and non-zero, the target is a constant with -1 there, so the result keeps
    /// the fixed dims in its type (a `Shape` operand would make every dim a new symbol,
    /// and the rules below, a convolution's filter gradient, need them static).
    pub(crate) fn reshape_like(&mut self, x: Value, like: Value) -> Result<Value> {
        let dims = self.ty(like).shape.dims();
        let fixed: Vec<Option<usize>> = dims.iter().map(|d| d.fixed()).collect();
        let symbolic = fixed.iter().filter(|d| d.is_none()).count();
        let shape = if symbolic == 1 && fixed.iter().all(|d| *d != Some(0)) {
            let target: Vec<i64> = fixed.iter().map(|d| d.map_or(-1, |d| d as i64)).collect();
            self.ints(&target)?
        } else {
            self.shape_of(like)?
        };
        self.op("Reshape", &[x, shape], Attrs::new())
    }
}
