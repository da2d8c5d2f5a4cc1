//! 2-D convolutions (`Conv`, `FusedConv`): blocked NCHW16c ones by the direct kernel
//! with weights packed at compile time, plain NCHW ones (any groups) by im2col + GEMM.
use crate::backend::cpu::kernels::conv::{self, ConvShape, PackedConv};
use crate::backend::cpu::kernels::Act;
use crate::backend::cpu::program::{Cx, Kernel, Loc, Slot};

use super::Build;

struct Blocked {
    packed: PackedConv,
    x: Slot,
    z: Option<Slot>,
    y: Slot,
    act: Act,
}

struct Plain {
    shape: ConvShape,
    w: Slot,
    bias: Option<Slot>,
    x: Slot,
    z: Option<Slot>,
    y: Slot,
    act: Act,
    scratch: Loc,
    /// Where the residual is copied first when the planner gave Y the residual's buffer
    /// (the GEMM writes Y before its epilogue reads the residual).
    z_copy: Option<Loc>,
}

pub fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let op = b.node.op.as_str();
    if !matches!(op, "Conv" | "FusedConv") || !b.all_f32() {
        return Ok(None);
    }
    let attrs = &b.node.attrs;
    if !matches!(attrs.string_or("auto_pad", "NOTSET")?, "NOTSET") {
        return Ok(None);
    }
    let block = attrs.int_or("block", 0)? as usize;
    // X stays NCHW under a blocked Y (a first layer's few channels).
    let plain_x = block > 0 && attrs.int_or("plain_x", 0)? != 0;
    let (x, w, y) = (
        b.input(0).ok_or("missing X")?,
        b.input(1).ok_or("missing W")?,
        &b.outs[0],
    );
    let spatial = if block > 0 && !plain_x {
        x.shape.len().saturating_sub(3)
    } else {
        x.shape.len().saturating_sub(2)
    };
    if spatial != 2 || w.shape.len() != 4 || (block != 0 && block != conv::BLOCK) {
        return Ok(None);
    }
    let group = attrs.int_or("group", 1)? as usize;
    let pair = |name: &str, default: usize| -> Result<[usize; 2], String> {
        match attrs.ints(name)? {
            Some([a, b]) => Ok([*a as usize, *b as usize]),
            Some(v) => Err(format!("{name} {v:?} is not 2-D")),
            None => Ok([default; 2]),
        }
    };
    let pads = match attrs.ints("pads")? {
        Some(&[t, l, bo, r]) => [t as usize, l as usize, bo as usize, r as usize],
        Some(v) => return Err(format!("pads {v:?} is not 2-D")),
        None => [0; 4],
    };
    let (n, ih, iw) = (x.shape[0], x.shape[2], x.shape[3]);
    let (oc, icg, kh, kw) = (w.shape[0], w.shape[1], w.shape[2], w.shape[3]);
    let shape = ConvShape::new(
        n,
        icg * group,
        [ih, iw],
        oc,
        [kh, kw],
        pair("strides", 1)?,
        pads,
        pair("dilations", 1)?,
        group,
    )?;
    if y.shape[2..4] != [shape.oh, shape.ow] {
        return Err(format!(
            "output {:?} is not {}×{}",
            y.shape, shape.oh, shape.ow
        ));
    }
    let act = if op == "FusedConv" {
        Act::from_attrs(attrs)?
    } else {
        Act::None
    };
    let bias = b.input(2).cloned();
    let z = if op == "FusedConv" {
        b.input(3).cloned()
    } else {
        None
    };
    if block > 0 {
        let Some(wt) = b.constant(1) else {
            return Ok(None);
        };
        let wv = wt.expect::<f32>()?.as_standard_layout().into_owned();
        let bv = match b.constant(2) {
            Some(t) => Some(t.expect::<f32>()?.as_standard_layout().into_owned()),
            None if bias.is_some() => return Ok(None),
            None => None,
        };
        let packed = PackedConv::new(
            shape,
            wv.as_slice().expect("standard layout"),
            bv.as_ref().map(|v| v.as_slice().expect("standard layout")),
        )?
        .with_plain_x(plain_x);
        return Ok(Some(Box::new(Blocked {
            packed,
            x: x.clone(),
            z,
            y: y.clone(),
            act,
        })));
    }
    // Scratch: the im2col matrix, then (when aliased) the residual's copy.
    let im2col = (conv::conv_plain_scratch_len(&shape) * 4).next_multiple_of(64);
    let aliased = z.as_ref().is_some_and(|z| z.loc == y.loc);
    let scratch = b.scratch(im2col + if aliased { y.bytes() } else { 0 });
    let z_copy = match scratch {
        Loc::Arena(at) if aliased => Some(Loc::Arena(at + im2col)),
        _ => None,
    };
    Ok(Some(Box::new(Plain {
        shape,
        w: w.clone(),
        bias,
        x: x.clone(),
        z,
        y: y.clone(),
        act,
        scratch,
        z_copy,
    })))
}

impl Kernel for Blocked {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let z = self.z.as_ref().map(|z| cx.f32(z));
        conv::conv_blocked(
            cx.pool,
            &self.packed,
            cx.f32(&self.x),
            z,
            cx.f32_mut(&self.y),
            self.act,
        );
        Ok(())
    }
    fn kind(&self) -> &'static str {
        "conv-blocked"
    }
}

impl Kernel for Plain {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let mut z = self.z.as_ref().map(|z| cx.f32(z));
        if let (Some(at), Some(src)) = (self.z_copy, z) {
            let copy = cx.ptr(at) as *mut f32;
            std::ptr::copy_nonoverlapping(src, copy, self.y.elements());
            z = Some(copy);
        }
        conv::conv_plain(
            cx.pool,
            &self.shape,
            cx.f32(&self.w),
            self.bias.as_ref().map(|b| cx.f32(b)),
            cx.f32(&self.x),
            z,
            cx.f32_mut(&self.y),
            self.act,
            cx.ptr(self.scratch) as *mut f32,
        );
        Ok(())
    }
    fn kind(&self) -> &'static str {
        "conv-im2col"
    }
}
