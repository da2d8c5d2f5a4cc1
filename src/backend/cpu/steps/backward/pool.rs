//! MaxPool with its Indices output (a trained CNN's), over windows that tile the image.
use crate::backend::cpu::kernels::pool_indices::max_pool_tiles;
use crate::backend::cpu::program::{Cx, Kernel, Slot};
use crate::ir::DType;

use super::super::Build;

/// MaxPool with Indices over non-overlapping windows.
pub(super) struct MaxPoolIndicesStep {
    x: Slot,
    indices: Slot,
    planes: usize,
    hw: [usize; 2],
    kernel: [usize; 2],
    y: Slot,
}

/// MaxPool whose Indices output is used (a trained CNN's), over plain NCHW windows
/// that tile the image: kernel = strides, no pads, no dilation, floor mode. The others
/// are the pooling family's.
pub(super) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let attrs = &b.node.attrs;
    let (Some(x), [y, indices]) = (b.input(0), b.outs) else {
        return Ok(None);
    };
    let used = b.g.outputs().iter().any(|o| o.value == b.id.out(1))
        || b.g
            .nodes()
            .iter()
            .any(|n| n.inputs.contains(&Some(b.id.out(1))));
    if !used
        || x.dtype != DType::F32
        || y.dtype != DType::F32
        || indices.dtype != DType::I64
        || x.shape.len() != 4
        || attrs.int_or("block", 0)? != 0
        || attrs.int_or("storage_order", 0)? != 0
        || attrs.int_or("ceil_mode", 0)? != 0
        || attrs.string_or("auto_pad", "NOTSET")? != "NOTSET"
    {
        return Ok(None);
    }
    let kernel = match attrs.ints("kernel_shape")? {
        Some(&[a, b]) if a > 0 && b > 0 => [a as usize, b as usize],
        _ => return Ok(None),
    };
    let tiles = attrs
        .ints("strides")?
        .is_some_and(|s| s == [kernel[0] as i64, kernel[1] as i64])
        && attrs
            .ints("pads")?
            .is_none_or(|p| p.iter().all(|&v| v == 0))
        && attrs
            .ints("dilations")?
            .is_none_or(|d| d.iter().all(|&v| v == 1));
    let hw = [x.shape[2], x.shape[3]];
    if !tiles || hw[0] < kernel[0] || hw[1] < kernel[1] {
        return Ok(None);
    }
    let want = [x.shape[0], x.shape[1], hw[0] / kernel[0], hw[1] / kernel[1]];
    if y.shape != want || indices.shape != want {
        return Err(format!("outputs {:?} are not {want:?}", y.shape));
    }
    Ok(Some(Box::new(MaxPoolIndicesStep {
        x: x.clone(),
        indices: indices.clone(),
        planes: x.shape[0] * x.shape[1],
        hw,
        kernel,
        y: b.outs[0].clone(),
    })))
}

impl Kernel for MaxPoolIndicesStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let Self {
            x,
            indices,
            planes,
            hw,
            kernel,
            y,
        } = self;
        // SAFETY: slot x holds its x.elements() floats in the arena `cx` holds (the
        // Kernel::run contract), read-only during the step.
        let xs = unsafe { std::slice::from_raw_parts(cx.f32(x), x.elements()) };
        // SAFETY: output slot y's y.elements() floats, a buffer of its own (apart from x
        // and the indices).
        let ys = unsafe { std::slice::from_raw_parts_mut(cx.ptr(y.loc) as *mut f32, y.elements()) };
        let (ip, n) = (cx.ptr(indices.loc) as *mut i64, indices.elements());
        // SAFETY: the second output's n i64 indices, apart from x and y.
        let is = unsafe { std::slice::from_raw_parts_mut(ip, n) };
        max_pool_tiles(xs, *planes, *hw, *kernel, ys, is, cx.pool);
        Ok(())
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "pool-indices"
    }
}
