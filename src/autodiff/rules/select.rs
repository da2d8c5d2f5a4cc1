//! Selections share one exact backward: the op applied to an "iota" (each element's
//! flat index in its input) says where every output element came from, and
//! ScatterElements with reduction "add" sums the output gradient back there, so
//! duplicates (a Gather of one row twice, Tile, reflect padding) add up.
use super::Cx;
use crate::error::Result;
use crate::ir::{Attr, Attrs, DType, Value};

/// The gradient of a pure selection of `x` (each output element is some element of `x`):
/// `select` applied to an iota of `x`'s shape gives each output element's flat source
/// index, and `gy` is summed there.
pub(super) fn scatter_back(
    cx: &mut Cx,
    x: Value,
    gy: Value,
    select: impl FnOnce(&mut Cx, Value) -> Result<Value>,
) -> Result<Value> {
    let none = Attrs::new();
    let n = cx.op("Size", &[x], none.clone())?;
    let (zero, step) = (cx.scalar(DType::I64, 0.0)?, cx.scalar(DType::I64, 1.0)?);
    let range = cx.op("Range", &[zero, n, step], none.clone())?;
    let shape = cx.shape_of(x)?;
    let iota = cx.op("Reshape", &[range, shape], none.clone())?;
    let from = select(cx, iota)?;
    let flat = cx.ints(&[-1])?;
    let from = cx.op("Reshape", &[from, flat], none.clone())?;
    let updates = cx.op("Reshape", &[gy, flat], none.clone())?;
    let z = cx.zeros_like(x, &cx.ty(x))?;
    let z = cx.op("Reshape", &[z, flat], none.clone())?;
    let add = Attrs::new().with("reduction", Attr::String("add".into()));
    let d = cx.op("ScatterElements", &[z, from, updates], add)?;
    cx.reshape_like(d, x)
}
