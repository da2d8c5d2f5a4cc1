//! Gradient rules of the training-mode ops: Dropout and MseLoss.
use super::Cx;
use crate::error::{Error, Result};
use crate::ir::{Attrs, Node, Value};

/// The gradients of `node`'s inputs from `gy`, the gradient of its first output.
pub(crate) fn backward(cx: &mut Cx, node: &Node, gy: Value) -> Result<Vec<Option<Value>>> {
    let input = |k: usize| -> Result<Value> {
        node.inputs
            .get(k)
            .copied()
            .flatten()
            .ok_or_else(|| Error::Graph(format!("input {k} is missing")))
    };
    let none = Attrs::new();
    match node.op.as_str() {
        "Dropout" => {
            // The same dropout applied to gy: same seed, ratio, mode and counter give the
            // same mask, so this is gy · mask / (1 − ratio) in training mode and gy in
            // inference mode, and is itself differentiable (higher orders compose).
            let mut inputs = node.inputs.clone();
            inputs[0] = Some(gy);
            let gx = cx.g.add_op("Dropout", &inputs, node.attrs.clone(), "")?;
            // ratio, training_mode and counter are not differentiated.
            Ok(vec![Some(gx.into()), None, None, None])
        }
        "MseLoss" => {
            // d/dp = 2(p − t)·gy (÷ the element count for the mean); d/dt = −d/dp.
            let (p, t) = (input(0)?, input(1)?);
            let dt = cx.ty(p).dtype;
            let reduction = node
                .attrs
                .string_or("reduction", "mean")
                .map_err(Error::Graph)?
                .to_string();
            let diff = cx.op("Sub", &[p, t], none.clone())?;
            let two = cx.scalar(dt, 2.0)?;
            let mut scale = cx.op("Mul", &[gy, two], none.clone())?;
            if reduction == "mean" {
                // gy is a scalar: the ratio is p's element count, known at run time.
                let count = cx.count_ratio(p, gy)?;
                scale = cx.op("Div", &[scale, count], none.clone())?;
            }
            let gp = cx.op("Mul", &[diff, scale], none.clone())?;
            let gt = cx.op("Neg", &[gp], none)?;
            Ok(vec![Some(gp), Some(gt)])
        }
        op => Err(Error::Graph(format!(
            "no training-op gradient rule for {op}"
        ))),
    }
}
