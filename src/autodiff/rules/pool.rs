//! Gradient rules of the pools: AveragePool (MaxPool's is in the table, through its
//! Indices).
use super::conv::{fixed_from, Geometry};
use super::{graph_err, input, mul, Cx, Grads};
use crate::error::{Error, Result};
use crate::ir::{Node, TensorType, Value};
use crate::tensor::Tensor;

/// AveragePool (any spatial rank, pads, strides, dilations, ceil_mode, either
/// count_include_pad): gy divided by each window's count (static: it depends only on
/// the geometry), spread back over the window by a transposed convolution with a
/// kernel of ones, one group per channel.
pub(super) fn average_pool(cx: &mut Cx, node: &Node, y: Value, gy: Value) -> Result<Grads> {
    let attrs = &node.attrs;
    if attrs.int_or("block", 0).map_err(graph_err)? != 0 {
        return Err(Error::Graph(
            "the rule covers the plain layout (block 0)".into(),
        ));
    }
    let xv = input(node, 0)?;
    let xt = cx.ty(xv);
    let kernel = attrs
        .ints("kernel_shape")
        .map_err(graph_err)?
        .ok_or_else(|| Error::Graph("kernel_shape is required".into()))?
        .to_vec();
    let c = fixed_from(cx, xv, 1, "channels")?[0];
    let geo = Geometry::new(
        attrs,
        kernel.clone(),
        fixed_from(cx, xv, 2, "spatial dims")?,
        fixed_from(cx, y, 2, "spatial dims")?,
    )?;
    let include_pad = attrs.int_or("count_include_pad", 0).map_err(graph_err)? != 0;
    let k = kernel.len();
    // Per axis, how many taps of the window at each output position count: inside the
    // input, or (count_include_pad) inside its explicit padding.
    let counts: Vec<Vec<f64>> = (0..k)
        .map(|i| {
            let (lo, hi) = if include_pad {
                (-geo.pads[i], geo.input[i] + geo.pads[i + k])
            } else {
                (0, geo.input[i])
            };
            (0..geo.output[i])
                .map(|o| {
                    (0..kernel[i])
                        .map(|t| o * geo.strides[i] + t * geo.dilations[i] - geo.pads[i])
                        .filter(|p| (lo..hi).contains(p))
                        .count() as f64
                })
                .collect()
        })
        .collect();
    let out_dims: Vec<usize> = geo.output.iter().map(|&d| d as usize).collect();
    let scale: Vec<f64> = ndarray::indices(ndarray::IxDyn(&out_dims))
        .into_iter()
        .map(|o| {
            let n: f64 = (0..k).map(|i| counts[i][o[i]]).product();
            // A window with nothing in it is NaN forward and depends on no input.
            if n > 0.0 {
                1.0 / n
            } else {
                0.0
            }
        })
        .collect();
    let mut sdims = vec![1, 1];
    sdims.extend(&out_dims);
    let t = Tensor::from_f64s(xt.dtype, &sdims, &scale).map_err(graph_err)?;
    let name = cx.g.fresh_name("grad_pool_scale");
    let scale: Value =
        cx.g.add_constant(
            &name,
            TensorType::new(xt.dtype, crate::ir::Shape::fixed(&sdims)),
            t,
        )?
        .into();
    let g = mul(cx, gy, scale)?;
    let mut wdims = vec![c as usize, 1];
    wdims.extend(kernel.iter().map(|&d| d as usize));
    let ones = cx.constant(
        &TensorType::new(xt.dtype, crate::ir::Shape::fixed(&wdims)),
        1.0,
    )?;
    let dx = cx.op("ConvTranspose", &[g, ones], geo.transpose_attrs(c)?)?;
    Ok(vec![Some(dx)])
}
