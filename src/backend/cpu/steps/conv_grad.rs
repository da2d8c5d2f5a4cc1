//! Convolutions whose filter is computed at run time (not a constant the compile packs):
//! with few output positions (Conv's filter gradient, as autodiff writes it), one GEMM
//! per output position over all images ([`conv_per_position`]) rather than im2col per
//! image; in the blocked layout (a trained layer's weights are parameters), the direct
//! blocked kernel with the weights packed at each run.
use crate::backend::cpu::isa;
use crate::backend::cpu::kernels::conv::{conv_blocked, micro_tile, ConvShape, PackedConv, BLOCK};
use crate::backend::cpu::kernels::conv_grad::{
    conv_per_position, per_position_scratch_len, per_position_suits,
};
use crate::backend::cpu::kernels::{reorder, Act};
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

/// A blocked (NCHW16c) filter-gradient-shaped convolution: the input unblocked into
/// scratch, [`conv_per_position`] into scratch, the result blocked into Y.
struct BlockedPerPosition {
    shape: ConvShape,
    act: Act,
    x: Slot,
    w: Slot,
    bias: Option<Slot>,
    y: Slot,
    scratch: Loc,
}

/// A blocked (NCHW16c) convolution whose weights are packed at each run.
struct BlockedRepack {
    shape: ConvShape,
    plain_x: bool,
    act: Act,
    x: Slot,
    w: Slot,
    bias: Option<Slot>,
    z: Option<Slot>,
    y: Slot,
}

pub(crate) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let attrs = &b.node.attrs;
    let op = b.node.op.as_str();
    if !matches!(op, "Conv" | "FusedConv")
        || !b.all_f32()
        || b.constant(1).is_some()
        || attrs.string_or("auto_pad", "NOTSET")? != "NOTSET"
    {
        return Ok(None);
    }
    if attrs.int_or("block", 0)? != 0 {
        return blocked_repack(b);
    }
    if op != "Conv" || attrs.int_or("group", 1)? != 1 {
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

fn blocked_repack(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let attrs = &b.node.attrs;
    if attrs.int_or("block", 0)? as usize != BLOCK {
        return Ok(None);
    }
    let plain_x = attrs.int_or("plain_x", 0)? != 0;
    let (Some(x), Some(w), y) = (b.input(0), b.input(1), &b.outs[0]) else {
        return Ok(None);
    };
    let spatial = x.shape.len().saturating_sub(if plain_x { 2 } else { 3 });
    if spatial != 2 || w.shape.len() != 4 {
        return Ok(None);
    }
    let pair = |name: &str| -> Result<[usize; 2], String> {
        match attrs.ints(name)? {
            Some(&[a, b]) => Ok([a as usize, b as usize]),
            Some(v) => Err(format!("{name} {v:?} is not 2-D")),
            None => Ok([1, 1]),
        }
    };
    let pads = match attrs.ints("pads")? {
        Some(&[t, l, bo, r]) => [t as usize, l as usize, bo as usize, r as usize],
        Some(v) => return Err(format!("pads {v:?} is not 2-D")),
        None => [0; 4],
    };
    let group = attrs.int_or("group", 1)? as usize;
    let shape = ConvShape::new(
        x.shape[0],
        w.shape[1] * group,
        [x.shape[2], x.shape[3]],
        w.shape[0],
        [w.shape[2], w.shape[3]],
        pair("strides")?,
        pads,
        pair("dilations")?,
        group,
    )?;
    if y.shape[2..4] != [shape.oh, shape.ow] {
        return Err(format!(
            "output {:?} is not {}×{}",
            y.shape, shape.oh, shape.ow
        ));
    }
    let fused = b.node.op == "FusedConv";
    let act = if fused {
        Act::from_attrs(attrs)?
    } else {
        Act::None
    };
    let z = if fused { b.input(3).cloned() } else { None };
    // A filter gradient's shape (few output positions, a large run-time filter): the
    // direct kernel would run 6-pixel tiles over 3-pixel rows and repack the whole
    // output gradient as weights; one GEMM per position beats it whatever the batch.
    let few_positions = shape.oh * shape.ow <= 64 && shape.kh * shape.kw >= 4 * shape.oh * shape.ow;
    if few_positions && group == 1 && !plain_x && z.is_none() {
        let plain_x_len = shape.n * shape.ic * shape.ih * shape.iw;
        let plain_y_len = shape.n * shape.oc * shape.oh * shape.ow;
        let floats = plain_x_len + plain_y_len + per_position_scratch_len(&shape);
        return Ok(Some(Box::new(BlockedPerPosition {
            shape,
            act,
            x: x.clone(),
            w: w.clone(),
            bias: b.input(2).cloned(),
            y: y.clone(),
            scratch: b.scratch(floats * 4),
        })));
    }
    // Packing checks the geometry now (on zeros) so that a run cannot fail on it.
    let zeros = vec![0.0; w.elements()];
    PackedConv::new(shape.pointwise_rows(micro_tile(shape.oc)), &zeros, None)?;
    Ok(Some(Box::new(BlockedRepack {
        shape: shape.pointwise_rows(micro_tile(shape.oc)),
        plain_x,
        act,
        x: x.clone(),
        w: w.clone(),
        bias: b.input(2).cloned(),
        z,
        y: y.clone(),
    })))
}

impl Kernel for BlockedRepack {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: the weight slot holds its w.elements() floats in the arena (the
        // Kernel::run contract); nothing writes it during the step.
        let w = unsafe { std::slice::from_raw_parts(cx.f32(&self.w), self.w.elements()) };
        let bias = (self.bias.as_ref())
            // SAFETY: the bias slot likewise holds its elements, read-only here.
            .map(|s| unsafe { std::slice::from_raw_parts(cx.f32(s), s.elements()) });
        let packed = PackedConv::new(self.shape, w, bias)?.with_plain_x(self.plain_x);
        let z = self.z.as_ref().map(|s| cx.f32(s));
        let (x, y) = (cx.f32(&self.x), cx.f32_mut(&self.y));
        // SAFETY: lowering gave x, z and y the layouts and sizes of `packed` (plain or
        // blocked x, blocked y and z) in the arena that `cx` holds.
        unsafe { conv_blocked(cx.pool, &packed, x, z, y, self.act) };
        Ok(())
    }
    fn kind(&self) -> &'static str {
        "conv-blocked-repack"
    }
}

impl Kernel for BlockedPerPosition {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let s = &self.shape;
        let (pool, block) = (cx.pool, BLOCK);
        let plain_x_len = s.n * s.ic * s.ih * s.iw;
        let plain_y_len = s.n * s.oc * s.oh * s.ow;
        // The scratch (lowered as plain_x_len + plain_y_len + per_position_scratch_len
        // floats) holds the plain x, then the plain y, then the GEMM's scratch.
        let px = cx.ptr(self.scratch) as *mut f32;
        // SAFETY: the plain y starts plain_x_len floats into that scratch.
        let py = unsafe { px.add(plain_x_len) };
        // SAFETY: and the per-position scratch plain_y_len floats after it.
        let rest = unsafe { py.add(plain_y_len) };
        // SAFETY: the blocked x slot's elements, read-only during the step.
        let xb = unsafe { std::slice::from_raw_parts(cx.f32(&self.x), self.x.elements()) };
        // SAFETY: the plain x part of the scratch, apart from every slot.
        let xs = unsafe { std::slice::from_raw_parts_mut(px, plain_x_len) };
        reorder::to_plain(xb, xs, s.n, s.ic, s.ih * s.iw, block, pool);
        let (w, bias) = (cx.f32(&self.w), self.bias.as_ref().map(|b| cx.f32(b)));
        // SAFETY: px holds the plain NCHW x, w and bias their slots; py's plain_y_len
        // floats and rest's per_position_scratch_len are apart from them and each other.
        unsafe { conv_per_position(isa::isa(), pool, s, px, w, bias, py, rest) };
        // SAFETY: the plain y part of the scratch, no longer aliased by `xs` or a kernel.
        let ys = unsafe { std::slice::from_raw_parts_mut(py, plain_y_len) };
        self.act.apply(ys);
        // SAFETY: the blocked y slot's elements, apart from the scratch.
        let yb = unsafe { std::slice::from_raw_parts_mut(cx.f32_mut(&self.y), self.y.elements()) };
        reorder::to_blocked(ys, yb, s.n, s.oc, s.oh * s.ow, block, pool);
        Ok(())
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "conv-per-position-blocked"
    }
}

impl Kernel for PerPosition {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let bias = self.bias.as_ref().map(|s| cx.f32(s));
        let (x, w, y) = (cx.f32(&self.x), cx.f32(&self.w), cx.f32_mut(&self.y));
        let scratch = cx.ptr(self.scratch) as *mut f32;
        // SAFETY: lowering sized x, w, bias and y for `self.shape` (NCHW) and the
        // scratch slot by `per_position_scratch_len`, in the arena `cx` holds.
        unsafe { conv_per_position(isa::isa(), cx.pool, &self.shape, x, w, bias, y, scratch) };
        Ok(())
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "conv-per-position"
    }
}
