//! Quantized steps. `DynamicQuantizeLinear`; `MatMulInteger` and `ConvInteger` as
//! exact f32 GEMMs over their widened operands (see [`kernels::quant`]), the constant
//! weights widened, zero-point-shifted (and packed) once at lowering; and
//! DequantizeLinear from the low-bit dtypes (int4/uint4/int2/uint2, float8, float4) to
//! f32: each element's byte indexes a 256-entry table of its value, then
//! `(value - zero_point) * scale`, per tensor, per axis or blocked. Both operands are
//! exact in f32, so one f32 multiply rounds once, as the interpreter's f64 does.
use crate::backend::cpu::kernels::gemm::{self, Epilogue, Mat, PackedB};
use crate::backend::cpu::kernels::quant::{
    self as kernels_quant, accumulate_exact, exact_depth, im2col, widen, Bytes, ConvGeometry,
    ZeroPointAt,
};
use crate::backend::cpu::program::{Cx, Kernel, Loc, Slot};
use crate::backend::matmul_geometry::{geometry, Geometry};
use crate::ir::ops::conv::windows;
use crate::ir::shape::norm_axis;
use crate::ir::DType;
use crate::tensor::Tensor;

use super::Build;

pub(crate) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    match b.node.op.as_str() {
        "DequantizeLinear" => build_dequantize_low_bit(b),
        "DynamicQuantizeLinear" => build_dynamic_quantize(b),
        "MatMulInteger" => build_matmul_integer(b),
        "ConvInteger" => build_conv_integer(b),
        _ => Ok(None),
    }
}

/// `DynamicQuantizeLinear`: f32 to u8 with the scale and zero point of x's range.
pub struct DynamicQuantize {
    x: Slot,
    y: Slot,
    scale: Slot,
    zero_point: Slot,
}

fn build_dynamic_quantize(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let (Some(x), [y, scale, zero_point]) = (b.input(0), b.outs) else {
        return Ok(None);
    };
    if x.dtype != DType::F32 || y.dtype != DType::U8 {
        return Ok(None);
    }
    Ok(Some(Box::new(DynamicQuantize {
        x: x.clone(),
        y: y.clone(),
        scale: scale.clone(),
        zero_point: zero_point.clone(),
    })))
}

impl Kernel for DynamicQuantize {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: the Kernel::run contract: x holds its f32 elements, y as many bytes,
        // the scale one f32 and the zero point one byte.
        unsafe {
            let (scale, zero_point) = kernels_quant::dynamic_quantize_u8(
                cx.f32(&self.x),
                cx.ptr(self.y.loc),
                self.x.elements(),
                cx.pool,
            );
            *cx.f32_mut(&self.scale) = scale;
            *cx.ptr(self.zero_point.loc) = zero_point;
            Ok(())
        }
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "dynamic-quantize"
    }
}

fn bytes_of(d: DType) -> Option<Bytes> {
    match d {
        DType::U8 => Some(Bytes::U8),
        DType::I8 => Some(Bytes::I8),
        _ => None,
    }
}

/// Largest magnitude of a widened runtime 8-bit operand minus its zero point.
const RUNTIME_MAX: u32 = 255;

/// Scratch sub-buffers of a step, each 64-byte aligned: byte offsets and the total.
fn carve(sizes: &[usize]) -> (Vec<usize>, usize) {
    let mut at = 0;
    let offsets = sizes
        .iter()
        .map(|&s| {
            let o = at;
            at += s.div_ceil(64) * 64;
            o
        })
        .collect();
    (offsets, at)
}

/// A constant 8-bit tensor minus its (constant) zero point, as f32 with the largest
/// magnitude: the zero point one for all (`per` = None) or one per index
/// `(e / inner) % len` (`per` = Some((inner, len))).
fn widen_constant(
    t: &Tensor,
    zero_point: Option<&Tensor>,
    per: Option<(usize, usize)>,
) -> Result<(Vec<f32>, u32), String> {
    let v = t.to_f64_vec();
    let z = zero_point.map(|z| z.to_f64_vec()).unwrap_or_default();
    let mut max = 0u32;
    let mut out = Vec::with_capacity(v.len());
    for (e, &x) in v.iter().enumerate() {
        let zi = match per {
            _ if z.len() <= 1 => 0,
            Some((inner, len)) => (e / inner) % len,
            None => return Err("a zero point per element is not supported".into()),
        };
        let w = x - z.get(zi).copied().unwrap_or(0.0);
        max = max.max(w.abs() as u32);
        out.push(w as f32);
    }
    Ok((out, max))
}

/// `MatMulInteger`: A (and B unless constant) widened into scratch, then per batch and
/// per exact chunk of K one f32 GEMM, summed in i32.
pub struct MatMulInteger {
    a: Slot,
    a_kind: Bytes,
    a_zero_point: Option<(Slot, Bytes, ZeroPointAt)>,
    b: Slot,
    b_kind: Bytes,
    b_zero_point: Option<(Slot, Bytes, ZeroPointAt)>,
    y: Slot,
    m: usize,
    n: usize,
    k: usize,
    batches: Vec<(usize, usize)>,
    /// B widened at lowering (a constant), and packed per chunk when one batch.
    b_const: Option<Vec<f32>>,
    b_packed: Vec<PackedB>,
    /// K's chunk depth within which f32 sums are exact.
    depth: usize,
    scratch: Loc,
    /// Byte offsets in the scratch of A', B' and the partial product.
    offsets: Vec<usize>,
}

fn build_matmul_integer(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let (Some(a), Some(bm), y) = (b.input(0), b.input(1), &b.outs[0]) else {
        return Ok(None);
    };
    let (Some(a_kind), Some(b_kind)) = (bytes_of(a.dtype), bytes_of(bm.dtype)) else {
        return Ok(None);
    };
    if y.dtype != DType::I32 {
        return Ok(None);
    }
    let Geometry { m, n, k, batches } = geometry(&a.shape, &bm.shape, y.elements(), false, false)?;
    // A's zero point: per tensor or per row of A; B's: per tensor or per column.
    let zero_point =
        |i: usize, v: &Slot, axis_from_end: usize| -> Option<Option<(Slot, Bytes, ZeroPointAt)>> {
            let Some(z) = b.input(i) else {
                return Some(None);
            };
            let kind = bytes_of(z.dtype)?;
            if z.elements() == 1 {
                return Some(Some((z.clone(), kind, ZeroPointAt::All)));
            }
            let rank = v.shape.len();
            if z.shape.len() != 1 || rank < 2 {
                return None;
            }
            let len = v.shape[rank - 1 - axis_from_end];
            let inner: usize = v.shape[rank - axis_from_end..].iter().product();
            (z.shape[0] == len).then(|| Some((z.clone(), kind, ZeroPointAt::Along { inner, len })))
        };
    let (Some(a_zero_point), Some(b_zero_point)) = (zero_point(2, a, 1), zero_point(3, bm, 0))
    else {
        return Ok(None);
    };
    let b_const_zero = match (&b_zero_point, b.constant(3)) {
        (None, _) => Some(None),
        (Some(_), Some(z)) => Some(Some(z)),
        (Some(_), None) => None,
    };
    let (b_const, b_max) = match (b.constant(1), b_const_zero) {
        (Some(t), Some(z)) => {
            let per = b_zero_point.as_ref().and_then(|(_, _, at)| match at {
                ZeroPointAt::Along { inner, len } => Some((*inner, *len)),
                ZeroPointAt::All => None,
            });
            let (w, max) = widen_constant(t, z, per)?;
            (Some(w), max)
        }
        _ => (None, RUNTIME_MAX),
    };
    let depth = exact_depth(RUNTIME_MAX, b_max);
    let mut b_packed = vec![];
    if let (Some(w), 1) = (&b_const, batches.len()) {
        let mut k0 = 0;
        while k0 < k {
            let kc = depth.min(k - k0);
            // SAFETY: rows k0..k0+kc of the k×n matrix w.
            b_packed.push(unsafe { PackedB::new(kc, n, Mat::rows(w.as_ptr().add(k0 * n), n)) });
            k0 += kc;
        }
    }
    let f = std::mem::size_of::<f32>();
    let partial = if depth < k { m * n * f } else { 0 };
    let b_bytes = if b_const.is_none() {
        bm.elements() * f
    } else {
        0
    };
    let (offsets, total) = carve(&[a.elements() * f, b_bytes, partial]);
    Ok(Some(Box::new(MatMulInteger {
        a: a.clone(),
        a_kind,
        a_zero_point,
        b: bm.clone(),
        b_kind,
        b_zero_point,
        y: y.clone(),
        m,
        n,
        k,
        batches,
        b_const,
        b_packed,
        depth,
        scratch: b.scratch(total),
        offsets,
    })))
}

impl Kernel for MatMulInteger {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: the Kernel::run contract: the slots hold their elements (one byte per
        // 8-bit element, i32 y), the scratch the sizes carved at lowering; the GEMMs
        // read m×k and k×n matrices at the batches' offsets, as the geometry planned.
        unsafe {
            let pool = cx.pool;
            let scratch = cx.ptr(self.scratch);
            let a_wide = scratch.add(self.offsets[0]) as *mut f32;
            let zp = |z: &Option<(Slot, Bytes, ZeroPointAt)>| {
                z.as_ref()
                    .map(|(s, k, at)| (cx.ptr(s.loc) as *const u8, *k, *at))
            };
            widen(
                cx.ptr(self.a.loc),
                self.a_kind,
                zp(&self.a_zero_point),
                a_wide,
                self.a.elements(),
                pool,
            );
            let b_wide = match &self.b_const {
                Some(w) => w.as_ptr(),
                None => {
                    let p = scratch.add(self.offsets[1]) as *mut f32;
                    widen(
                        cx.ptr(self.b.loc),
                        self.b_kind,
                        zp(&self.b_zero_point),
                        p,
                        self.b.elements(),
                        pool,
                    );
                    p
                }
            };
            let partial = scratch.add(self.offsets[2]) as *mut f32;
            let (m, n, k) = (self.m, self.n, self.k);
            let y = cx.ptr(self.y.loc);
            for (i, &(oa, ob)) in self.batches.iter().enumerate() {
                let y = (y as *mut f32).add(i * m * n);
                let mut k0 = 0;
                for chunk in 0.. {
                    if k0 >= k && chunk > 0 {
                        break;
                    }
                    let kc = self.depth.min(k - k0);
                    let out = if chunk == 0 { y } else { partial };
                    let a = Mat::rows(a_wide.add(oa + k0), k);
                    match self.b_packed.get(chunk) {
                        Some(p) => gemm::gemm_packed(pool, m, n, kc, a, p, out, n, &Epilogue::NONE),
                        None => {
                            let b = Mat::rows(b_wide.add(ob + k0 * n), n);
                            gemm::gemm(pool, m, n, kc, a, b, out, n, &Epilogue::NONE)
                        }
                    }
                    accumulate_exact(out, y as *mut i32, m * n, chunk == 0, pool);
                    k0 += kc;
                }
            }
            Ok(())
        }
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "gemm-integer"
    }
}

/// `ConvInteger`: per image and group, the column matrix of x minus its zero point,
/// then per exact chunk of its depth one f32 GEMM with the widened weights.
pub struct ConvInteger {
    x: Slot,
    x_kind: Bytes,
    x_zero_point: Option<(Slot, Bytes)>,
    y: Slot,
    geometry: ConvGeometry,
    groups: usize,
    /// Output channels per group.
    m: usize,
    /// W minus its zero point: [groups · m, depth].
    weights: Vec<f32>,
    depth: usize,
    scratch: Loc,
    offsets: Vec<usize>,
}

fn build_conv_integer(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let (Some(x), Some(w), y) = (b.input(0), b.input(1), &b.outs[0]) else {
        return Ok(None);
    };
    let (Some(x_kind), Some(w_data)) = (bytes_of(x.dtype), b.constant(1)) else {
        return Ok(None);
    };
    let rank = x.shape.len();
    if !(3..=5).contains(&rank) || w.shape.len() != rank || y.dtype != DType::I32 {
        return Ok(None);
    }
    let x_zero_point = match b.input(2) {
        None => None,
        Some(z) if z.elements() == 1 => match bytes_of(z.dtype) {
            Some(k) => Some((z.clone(), k)),
            None => return Ok(None),
        },
        Some(_) => return Ok(None),
    };
    let w_zero_point = match (b.input(3), b.constant(3)) {
        (None, _) => None,
        (Some(_), Some(z)) if z.len() == 1 || z.len() == w.shape[0] => Some(z),
        _ => return Ok(None),
    };
    let groups = usize::try_from(b.node.attrs.int_or("group", 1)?).map_err(|e| e.to_string())?;
    let (total_m, channels) = (w.shape[0], w.shape[1]);
    if groups == 0 || total_m % groups != 0 || x.shape[1] != channels * groups {
        return Ok(None);
    }
    let spatial = rank - 2;
    let kernel = w.shape[2..].to_vec();
    let input: Vec<Option<usize>> = x.shape[2..].iter().map(|&d| Some(d)).collect();
    let wins = windows(&b.node.attrs, &kernel, &input)?;
    let pad3 = |v: &[usize], fill: usize| -> [usize; 3] {
        let mut out = [fill; 3];
        out[3 - spatial..].copy_from_slice(v);
        out
    };
    let geometry = ConvGeometry {
        channels,
        input: pad3(&x.shape[2..], 1),
        output: pad3(&y.shape[2..], 1),
        kernel: pad3(&kernel, 1),
        stride: pad3(&wins.iter().map(|w| w.stride).collect::<Vec<_>>(), 1),
        dilation: pad3(&wins.iter().map(|w| w.dilation).collect::<Vec<_>>(), 1),
        pad_begin: pad3(&wins.iter().map(|w| w.pad_begin).collect::<Vec<_>>(), 0),
    };
    let depth_total = geometry.depth();
    let per_channel = w_data.len() / total_m.max(1);
    let (weights, w_max) = widen_constant(w_data, w_zero_point, Some((per_channel, total_m)))?;
    let depth = exact_depth(w_max, RUNTIME_MAX);
    let m = total_m / groups;
    let f = std::mem::size_of::<f32>();
    let positions = geometry.positions();
    let partial = if depth < depth_total {
        m * positions * f
    } else {
        0
    };
    let (offsets, total) = carve(&[depth_total * positions * f, partial]);
    Ok(Some(Box::new(ConvInteger {
        x: x.clone(),
        x_kind,
        x_zero_point,
        y: y.clone(),
        geometry,
        groups,
        m,
        weights,
        depth,
        scratch: b.scratch(total),
        offsets,
    })))
}

impl Kernel for ConvInteger {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: the Kernel::run contract: x holds N images of groups × channels
        // planes (bytes), y N × groups × m output planes (i32), the scratch the column
        // matrix and partial product carved at lowering.
        unsafe {
            let pool = cx.pool;
            let g = &self.geometry;
            let (k, p) = (g.depth(), g.positions());
            let plane: usize = g.input.iter().product();
            let zero_point = self
                .x_zero_point
                .as_ref()
                .map_or(0, |(s, kind)| kind.value(*cx.ptr(s.loc)));
            let scratch = cx.ptr(self.scratch);
            let col = scratch.add(self.offsets[0]) as *mut f32;
            let partial = scratch.add(self.offsets[1]) as *mut f32;
            let images = self.x.shape[0];
            let (x, y) = (cx.ptr(self.x.loc) as *const u8, cx.ptr(self.y.loc));
            for image in 0..images {
                for group in 0..self.groups {
                    let x = x.add((image * self.groups + group) * g.channels * plane);
                    im2col(g, x, self.x_kind, zero_point, col, pool);
                    let y = (y as *mut f32).add((image * self.groups + group) * self.m * p);
                    let w = self.weights.as_ptr().add(group * self.m * k);
                    let mut k0 = 0;
                    for chunk in 0.. {
                        if k0 >= k && chunk > 0 {
                            break;
                        }
                        let kc = self.depth.min(k - k0);
                        let out = if chunk == 0 { y } else { partial };
                        let a = Mat::rows(w.add(k0), k);
                        let b = Mat::rows(col.add(k0 * p), p);
                        gemm::gemm(pool, self.m, p, kc, a, b, out, p, &Epilogue::NONE);
                        accumulate_exact(out, y as *mut i32, self.m * p, chunk == 0, pool);
                        k0 += kc;
                    }
                }
            }
            Ok(())
        }
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "conv-integer"
    }
}

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

fn build_dequantize_low_bit(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
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
