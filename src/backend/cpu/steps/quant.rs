//! DequantizeLinear from the low-bit dtypes (int4/uint4/int2/uint2, float8, float4) to
//! f32: each element's byte indexes a 256-entry table of its value, then
//! `(value - zero_point) * scale`, per tensor, per axis or blocked. Both operands are
//! exact in f32, so one f32 multiply rounds once, as the interpreter's f64 does.
use crate::backend::cpu::program::{Cx, Kernel, Slot};
use crate::ir::shape::norm_axis;
use crate::ir::DType;
use crate::tensor::Tensor;

use super::Build;

pub struct DequantizeLowBit {
    x: Slot,
    scale: Slot,
    zero_point: Option<Slot>,
    y: Slot,
    /// The value of every byte an element of x's dtype may hold.
    table: Box<[f32; 256]>,
    /// x viewed as [outer, axis, inner] around the scale's axis.
    axis_len: usize,
    inner: usize,
    /// Elements along the axis that share a scale (1 per axis and per tensor).
    block: usize,
}

pub(crate) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    if b.node.op != "DequantizeLinear" {
        return Ok(None);
    }
    let (Some(x), Some(scale)) = (b.input(0), b.input(1)) else {
        return Ok(None);
    };
    let y = &b.outs[0];
    if !x.dtype.is_low_bit() || scale.dtype != DType::F32 || y.dtype != DType::F32 {
        return Ok(None);
    }
    // Float8 and float4 zero points are zero by definition (the interpreter ignores them).
    let zero_point = b.input(2).filter(|_| !x.dtype.is_minifloat()).cloned();
    if zero_point.as_ref().is_some_and(|z| z.dtype != x.dtype) {
        return Ok(None);
    }
    // The layouts the interpreter accepts; anything else falls back to it (and fails there).
    let rank = x.shape.len();
    let block_size = b.node.attrs.int_or("block_size", 0)?;
    let axis = || norm_axis(b.node.attrs.int_or("axis", 1).ok()?, rank).ok();
    let (axis_len, inner, block) = match scale.shape.len() {
        0 => (1, x.elements().max(1), 1),
        r if r == rank && block_size > 0 => {
            let Some(axis) = axis() else { return Ok(None) };
            let block = block_size as usize;
            let fits = (0..rank).all(|d| {
                scale.shape[d]
                    == if d == axis {
                        x.shape[d].div_ceil(block)
                    } else {
                        x.shape[d]
                    }
            });
            if !fits {
                return Ok(None);
            }
            (x.shape[axis], x.shape[axis + 1..].iter().product(), block)
        }
        1 if block_size <= 0 => {
            let Some(axis) = axis() else { return Ok(None) };
            if scale.shape[0] != x.shape[axis] {
                return Ok(None);
            }
            (x.shape[axis], x.shape[axis + 1..].iter().product(), 1)
        }
        _ => return Ok(None),
    };
    if zero_point
        .as_ref()
        .is_some_and(|z| z.elements() != scale.elements())
    {
        return Ok(None);
    }
    let mut table = Box::new([0f32; 256]);
    for (byte, v) in table.iter_mut().enumerate() {
        if let Ok(t) = Tensor::from_le_bytes(x.dtype, &[1], &[byte as u8]) {
            *v = t.to_f64_vec()[0] as f32;
        }
    }
    Ok(Some(Box::new(DequantizeLowBit {
        x: x.clone(),
        scale: scale.clone(),
        zero_point,
        y: y.clone(),
        table,
        axis_len,
        inner,
        block,
    })))
}

impl DequantizeLowBit {
    /// Where element `i`'s scale (and zero point) is: the scale is laid out as
    /// [outer, ceil(axis / block), inner] when blocked, [axis] per axis, [] per tensor.
    fn scale_index(&self, i: usize) -> usize {
        let (along, outer) = (
            (i / self.inner) % self.axis_len,
            i / (self.inner * self.axis_len),
        );
        if self.scale.shape.is_empty() {
            0
        } else if self.scale.shape.len() == 1 {
            along
        } else {
            let blocks = self.axis_len.div_ceil(self.block);
            (outer * blocks + along / self.block) * self.inner + i % self.inner
        }
    }
}

impl Kernel for DequantizeLowBit {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: the Kernel::run contract: the slots address live buffers of their
        // lowered sizes (one byte per x and zero-point element, f32 scale and y).
        unsafe {
            let n = self.x.elements();
            let x = std::slice::from_raw_parts(cx.ptr(self.x.loc), n);
            let scale = std::slice::from_raw_parts(
                cx.ptr(self.scale.loc) as *const f32,
                self.scale.elements(),
            );
            let zero_point = self
                .zero_point
                .as_ref()
                .map(|z| std::slice::from_raw_parts(cx.ptr(z.loc), z.elements()));
            let y = std::slice::from_raw_parts_mut(cx.ptr(self.y.loc) as *mut f32, n);
            for (i, (out, &byte)) in y.iter_mut().zip(x).enumerate() {
                let s = self.scale_index(i);
                let z = zero_point.map_or(0.0, |z| self.table[z[s] as usize]);
                *out = (self.table[byte as usize] - z) * scale[s];
            }
            Ok(())
        }
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "dequantize-low-bit"
    }
}
