//! `ConvTranspose`, the data gradient of a convolution, on the CPU's transposed
//! convolution kernel (1 to 3 spatial axes, explicit pads, no `output_shape`); f64, f16
//! and bf16 on the same geometry in [`super::super::conv_elem`]'s loop.
use crate::backend::cpu::isa;
use crate::backend::cpu::kernels::conv::Depth;
use crate::backend::cpu::kernels::conv_transpose::{conv_transpose, ConvTransposeShape};
use crate::backend::cpu::program::{Cx, Kernel, Loc, Slot};
use crate::backend::cpu::steps::conv::window_axes;
use crate::backend::cpu::steps::conv_elem::{is_elem_float, ConvTransposeElem};
use crate::ir::DType;

use super::super::Build;

pub(super) struct ConvTransposeStep {
    shape: ConvTransposeShape,
    x: Slot,
    w: Slot,
    bias: Option<Slot>,
    scratch: Loc,
    y: Slot,
}

/// A ConvTranspose with `output_shape` or a SAME `auto_pad`: the same node with the
/// explicit pads the interpreter derives (the full output less the target, split as
/// auto_pad says), built as one with pads.
fn build_resolved(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let attrs = &b.node.attrs;
    let (Some(x), Some(w), y) = (b.input(0), b.input(1), &b.outs[0]) else {
        return Ok(None);
    };
    let k = x.shape.len().saturating_sub(2);
    if k == 0 || w.shape.len() != k + 2 || y.shape.len() != k + 2 {
        return Ok(None);
    }
    let auto_pad = attrs.string_or("auto_pad", "NOTSET")?;
    let list = |name: &str, default: i64| -> Result<Vec<i64>, String> {
        Ok(attrs.ints(name)?.map_or(vec![default; k], <[i64]>::to_vec))
    };
    let (strides, dil, opad) = (
        list("strides", 1)?,
        list("dilations", 1)?,
        list("output_padding", 0)?,
    );
    if strides.len() != k || dil.len() != k || opad.len() != k {
        return Ok(None);
    }
    let (mut begin, mut end) = (vec![], vec![]);
    for i in 0..k {
        let full = strides[i] * (x.shape[2 + i].max(1) as i64 - 1)
            + opad[i]
            + (w.shape[2 + i] as i64 - 1) * dil[i]
            + 1;
        let total = full - y.shape[2 + i] as i64;
        if total < 0 {
            return Ok(None);
        }
        let b0 = if auto_pad == "SAME_UPPER" {
            total / 2
        } else {
            total - total / 2
        };
        begin.push(b0);
        end.push(total - b0);
    }
    let mut plain = crate::ir::Attrs::new();
    for (name, v) in attrs.iter() {
        if name != "auto_pad" && name != "output_shape" && name != "pads" {
            plain.set(name, v.clone());
        }
    }
    begin.extend(end);
    plain.set("pads", crate::ir::Attr::Ints(begin));
    crate::backend::cpu::steps::conv::build_with_attrs(b, plain, build)
}

pub(super) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let attrs = &b.node.attrs;
    let dtype = b.outs.first().map(|y| y.dtype);
    let typed = |d| d == DType::F32 || is_elem_float(d);
    if !dtype.is_some_and(typed)
        || b.ins
            .iter()
            .flatten()
            .chain(b.outs)
            .any(|s| Some(s.dtype) != dtype)
    {
        return Ok(None);
    }
    if attrs.get("output_shape").is_some()
        || matches!(
            attrs.string_or("auto_pad", "NOTSET")?,
            "SAME_UPPER" | "SAME_LOWER"
        )
    {
        return build_resolved(b);
    }
    let (Some(x), Some(w), y) = (b.input(0), b.input(1), &b.outs[0]) else {
        return Ok(None);
    };
    let (Some(xs), Some(ys)) = (x.shape.get(2..), y.shape.get(2..)) else {
        return Ok(None);
    };
    if w.shape.len() != xs.len() + 2 || ys.len() != xs.len() {
        return Ok(None);
    }
    let Some(axes) = window_axes(attrs, xs, &w.shape[2..])? else {
        return Ok(None);
    };
    // The output sizes, padded in front like the axes.
    let mut out = [1; 3];
    out[3 - ys.len()..].copy_from_slice(ys);
    let mut opad = [0; 3];
    match attrs.ints("output_padding")? {
        None => {}
        Some(v) if v.len() == xs.len() && v.iter().all(|&p| p >= 0) => {
            for (o, &p) in opad[3 - v.len()..].iter_mut().zip(v) {
                *o = p as usize;
            }
        }
        Some(v) => {
            return Err(format!(
                "output_padding {v:?} does not fit {} axes",
                xs.len()
            ))
        }
    }
    // The output size the attributes give (output_padding included) must be Y's.
    for (i, ((a, &o), &p)) in axes.iter().zip(&out).zip(&opad).enumerate() {
        let full = a
            .stride
            .checked_mul(a.input.max(1) - 1)
            .and_then(|v| v.checked_add(p))
            .and_then(|v| v.checked_add(a.dilation.checked_mul(a.kernel.max(1) - 1)?))
            .and_then(|v| v.checked_add(1));
        if full.is_none()
            || full
                != o.checked_add(a.pads[0])
                    .and_then(|v| v.checked_add(a.pads[1]))
        {
            return Err(format!(
                "output {:?} is not the full result {full:?} less pads along axis {i}",
                y.shape
            ));
        }
    }
    let groups = attrs.int_or("group", 1)?;
    let groups = usize::try_from(groups).map_err(|_| format!("group {groups} is negative"))?;
    let [d, h, wa] = axes;
    let shape = ConvTransposeShape {
        n: x.shape[0],
        c: x.shape[1],
        h: h.input,
        w: wa.input,
        m: y.shape[1],
        kh: h.kernel,
        kw: wa.kernel,
        oh: out[1],
        ow: out[2],
        strides: [h.stride, wa.stride],
        pad_top: h.pads[0],
        pad_left: wa.pads[0],
        dilations: [h.dilation, wa.dilation],
        groups,
        depth: Depth {
            input: d.input,
            kernel: d.kernel,
            output: out[0],
            stride: d.stride,
            pad: d.pads[0],
            dilation: d.dilation,
        },
    };
    shape.check()?;
    if w.shape[0] != shape.c || w.shape[1].checked_mul(groups) != Some(shape.m) {
        return Err(format!(
            "W {:?} does not map {} channels to {} in {groups} groups",
            w.shape, shape.c, shape.m
        ));
    }
    if x.dtype != DType::F32 {
        return Ok(Some(ConvTransposeElem::build(b, shape, x, w, y)));
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
        let bias = self.bias.as_ref().map(|s| cx.f32(s));
        let scratch = cx.ptr(self.scratch) as *mut f32;
        let (x, w, y) = (
            cx.f32(&self.x),
            cx.f32(&self.w),
            cx.ptr(self.y.loc) as *mut f32,
        );
        // SAFETY: lowering checked x, w, bias and y against `self.shape` and sized the
        // scratch slot by its `scratch_len`; `cx` holds those slots (Kernel::run's
        // contract), y and scratch apart from the inputs.
        unsafe { conv_transpose(isa::isa(), cx.pool, &self.shape, x, w, bias, y, scratch) };
        Ok(())
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "conv-transpose"
    }
}
