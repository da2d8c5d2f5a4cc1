//! Convolutions whose filter is computed at run time and whose output is a few
//! positions (Conv's filter gradient, as autodiff writes it): one GEMM per output
//! position over all images ([`conv_per_position`]) rather than im2col per image.
use crate::backend::cpu::isa;
use crate::backend::cpu::kernels::conv::ConvShape;
use crate::backend::cpu::kernels::conv_grad::{
    conv_per_position, per_position_scratch_len, per_position_suits,
};
use crate::backend::cpu::program::{Cx, Kernel, Loc, Slot};

use super::Build;

struct PerPosition {
    shape: ConvShape,
    x: Slot,
    w: Slot,
    bias: Option<Slot>,
    y: Slot,
    scratch: Loc,
}

pub fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let attrs = &b.node.attrs;
    if b.node.op != "Conv"
        || !b.all_f32()
        || b.constant(1).is_some()
        || attrs.int_or("block", 0)? != 0
        || attrs.int_or("group", 1)? != 1
        || attrs.string_or("auto_pad", "NOTSET")? != "NOTSET"
    {
        return Ok(None);
    }
    let (Some(x), Some(w), y) = (b.input(0), b.input(1), &b.outs[0]) else {
        return Ok(None);
    };
    if x.shape.len() != 4 || w.shape.len() != 4 || w.shape[1] != x.shape[1] {
        return Ok(None);
    }
    let pair = |name: &str| -> Result<Option<[usize; 2]>, String> {
        Ok(match attrs.ints(name)? {
            Some(&[a, b]) => Some([a as usize, b as usize]),
            Some(_) => None,
            None => Some([1, 1]),
        })
    };
    let (Some(strides), Some(dilations)) = (pair("strides")?, pair("dilations")?) else {
        return Ok(None);
    };
    let pads = match attrs.ints("pads")? {
        Some(&[t, l, bo, r]) => [t as usize, l as usize, bo as usize, r as usize],
        Some(_) => return Ok(None),
        None => [0; 4],
    };
    let shape = ConvShape::new(
        x.shape[0],
        x.shape[1],
        [x.shape[2], x.shape[3]],
        w.shape[0],
        [w.shape[2], w.shape[3]],
        strides,
        pads,
        dilations,
        1,
    )?;
    if !per_position_suits(&shape) {
        return Ok(None);
    }
    if y.shape != [shape.n, shape.oc, shape.oh, shape.ow] {
        return Err(format!(
            "output {:?} is not {}×{}×{}×{}",
            y.shape, shape.n, shape.oc, shape.oh, shape.ow
        ));
    }
    Ok(Some(Box::new(PerPosition {
        shape,
        x: x.clone(),
        w: w.clone(),
        bias: b.input(2).cloned(),
        y: y.clone(),
        scratch: b.scratch(per_position_scratch_len(&shape) * 4),
    })))
}

impl Kernel for PerPosition {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let bias = self.bias.as_ref().map(|s| cx.f32(s));
        conv_per_position(
            isa::isa(),
            cx.pool,
            &self.shape,
            cx.f32(&self.x),
            cx.f32(&self.w),
            bias,
            cx.f32_mut(&self.y),
            cx.ptr(self.scratch) as *mut f32,
        );
        Ok(())
    }
    fn kind(&self) -> &'static str {
        "conv-per-position"
    }
}
