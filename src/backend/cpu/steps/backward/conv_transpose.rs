//! `ConvTranspose`, the data gradient of a convolution, on the CPU's transposed
//! convolution kernel (4-D, explicit pads, no `output_shape`).
use crate::backend::cpu::isa;
use crate::backend::cpu::kernels::conv_transpose::{conv_transpose, ConvTransposeShape};
use crate::backend::cpu::program::{Cx, Kernel, Loc, Slot};

use super::super::Build;

pub(super) struct ConvTransposeStep {
    shape: ConvTransposeShape,
    x: Slot,
    w: Slot,
    bias: Option<Slot>,
    scratch: Loc,
    y: Slot,
}

pub(super) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let attrs = &b.node.attrs;
    if !b.all_f32()
        || attrs.string_or("auto_pad", "NOTSET")? != "NOTSET"
        || attrs.get("output_shape").is_some()
    {
        return Ok(None);
    }
    let (Some(x), Some(w), y) = (b.input(0), b.input(1), &b.outs[0]) else {
        return Ok(None);
    };
    if x.shape.len() != 4 || w.shape.len() != 4 || y.shape.len() != 4 {
        return Ok(None);
    }
    let pair = |name: &str, default: usize| -> Result<[usize; 2], String> {
        match attrs.ints(name)? {
            Some(&[a, b]) => Ok([a as usize, b as usize]),
            Some(v) => Err(format!("{name} {v:?} is not 2-D")),
            None => Ok([default; 2]),
        }
    };
    let pads = match attrs.ints("pads")? {
        Some(&[t, l, bo, r]) => [t as usize, l as usize, bo as usize, r as usize],
        Some(v) => return Err(format!("pads {v:?} is not 2-D")),
        None => [0; 4],
    };
    let groups = attrs.int_or("group", 1)? as usize;
    let shape = ConvTransposeShape {
        n: x.shape[0],
        c: x.shape[1],
        h: x.shape[2],
        w: x.shape[3],
        m: y.shape[1],
        kh: w.shape[2],
        kw: w.shape[3],
        oh: y.shape[2],
        ow: y.shape[3],
        strides: pair("strides", 1)?,
        pad_top: pads[0],
        pad_left: pads[1],
        dilations: pair("dilations", 1)?,
        groups,
    };
    shape.check()?;
    if w.shape[0] != shape.c || w.shape[1] * groups != shape.m {
        return Err(format!(
            "W {:?} does not map {} channels to {} in {groups} groups",
            w.shape, shape.c, shape.m
        ));
    }
    // The output size the attributes give (output_padding included) must be Y's.
    let opad = pair("output_padding", 0)?;
    let full = |i: usize, a: usize, k: usize| {
        shape.strides[a] * (i.max(1) - 1) + opad[a] + shape.dilations[a] * (k - 1) + 1
    };
    let (fh, fw) = (full(shape.h, 0, shape.kh), full(shape.w, 1, shape.kw));
    if fh != shape.oh + pads[0] + pads[2] || fw != shape.ow + pads[1] + pads[3] {
        return Err(format!(
            "output {:?} is not the {fh}×{fw} full result less pads {pads:?}",
            y.shape
        ));
    }
    Ok(Some(Box::new(ConvTransposeStep {
        shape,
        x: x.clone(),
        w: w.clone(),
        bias: b.input(2).cloned(),
        scratch: b.scratch(shape.scratch_len() * 4),
        y: b.outs[0].clone(),
    })))
}

impl Kernel for ConvTransposeStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: the Kernel::run contract: the program's slots address live buffers of
        // their planned sizes for this run.
        unsafe {
            let bias = self.bias.as_ref().map(|s| cx.f32(s));
            let scratch = cx.ptr(self.scratch) as *mut f32;
            conv_transpose(
                isa::isa(),
                cx.pool,
                &self.shape,
                cx.f32(&self.x),
                cx.f32(&self.w),
                bias,
                cx.ptr(self.y.loc) as *mut f32,
                scratch,
            );
            Ok(())
        }
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "conv-transpose"
    }
}
