//! Gradient rules of the losses: SoftmaxCrossEntropyLoss.
use super::Cx;
use crate::error::{Error, Result};
use crate::ir::{Attr, Attrs, DType, NodeId, Value};

/// SoftmaxCrossEntropyLoss over [N, C] scores and [N] labels (no weights, no
/// ignore_index): d loss / d scores = (softmax − onehot) scaled by the reduction; a
/// gradient reaching the log_prob output adds log-softmax's own.
pub(super) fn softmax_cross_entropy(
    cx: &mut Cx,
    id: NodeId,
    gys: &[Option<Value>],
) -> Result<Vec<Option<Value>>> {
    let node = cx.g.node(id).clone();
    let none = Attrs::new();
    let (Some(scores), Some(labels)) = (node.inputs[0], node.inputs.get(1).copied().flatten())
    else {
        return Err(Error::Graph("scores and labels are required".into()));
    };
    if node.inputs.get(2).copied().flatten().is_some() || node.attrs.get("ignore_index").is_some() {
        return Err(Error::Graph(
            "the rule covers neither weights nor ignore_index".into(),
        ));
    }
    let st = cx.ty(scores);
    let classes = match (st.rank(), st.shape.dim(1).fixed()) {
        (2, Some(c)) => c,
        _ => {
            return Err(Error::Graph(format!(
                "the rule covers [N, C] scores with a static C, got {st}"
            )))
        }
    };
    let to = |dt: &str| Attrs::new().with("to", Attr::String(dt.to_string()));
    let dt = st.dtype.to_string();
    let p = cx.op("Exp", &[id.out(1)], none.clone())?;
    let mut total: Option<Value> = None;
    if let Some(gl) = gys.first().copied().flatten() {
        let reduction = node
            .attrs
            .string_or("reduction", "mean")
            .map_err(Error::Graph)?
            .to_string();
        // onehot[n, c] = (labels[n] == c)
        let range = cx.ints(&(0..classes as i64).collect::<Vec<_>>())?;
        let col = cx.ints(&[1])?;
        let l = cx.op("Unsqueeze", &[labels, col], none.clone())?;
        let l = if cx.ty(l).dtype == DType::I64 {
            l
        } else {
            cx.op("Cast", &[l], to("i64"))?
        };
        let eq = cx.op("Equal", &[l, range], none.clone())?;
        let onehot = cx.op("Cast", &[eq], to(&dt))?;
        let d = cx.op("Sub", &[p, onehot], none.clone())?;
        let g = match reduction.as_str() {
            "none" => {
                let gcol = cx.op("Unsqueeze", &[gl, col], none.clone())?;
                cx.op("Mul", &[d, gcol], none.clone())?
            }
            "sum" => cx.op("Mul", &[d, gl], none.clone())?,
            "mean" => {
                let n = cx.op("Size", &[labels], none.clone())?;
                let n = cx.op("Cast", &[n], to(&dt))?;
                let s = cx.op("Div", &[gl, n], none.clone())?;
                cx.op("Mul", &[d, s], none.clone())?
            }
            r => return Err(Error::Graph(format!("unknown reduction '{r}'"))),
        };
        total = Some(g);
    }
    if let Some(glp) = gys.get(1).copied().flatten() {
        let col = cx.ints(&[1])?;
        let s = cx.op("ReduceSum", &[glp, col], none.clone())?;
        let ps = cx.op("Mul", &[p, s], none.clone())?;
        let g = cx.op("Sub", &[glp, ps], none.clone())?;
        total = Some(match total {
            Some(t) => cx.op("Add", &[t, g], none)?,
            None => g,
        });
    }
    Ok(vec![total, None, None])
}
