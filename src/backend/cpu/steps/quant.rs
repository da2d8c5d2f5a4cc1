//! Quantized steps. `DynamicQuantizeLinear`; `MatMulInteger` and `ConvInteger` as
//! exact integer GEMMs ([`kernels::qgemm`]), constant weights packed once at lowering
//! with their zero points (a convolution's as its patches run, see
//! [`kernels::quant::im2col_packed`]); `FusedConvInteger`, the same convolution with the
//! dequantizing epilogue in the GEMM; and
//! DequantizeLinear from the low-bit dtypes (int4/uint4/int2/uint2, float8, float4) to
//! f32: each element's byte indexes a 256-entry table of its value, then
//! `(value - zero_point) * scale`, per tensor, per axis or blocked. Both operands are
//! exact in f32, so one f32 multiply rounds once, as the interpreter's f64 does.
//! QuantizeLinear and DequantizeLinear of every other dtype pair ([`Qdq`]): x, the scale
//! and the zero point loaded as f64 by loops typed for their dtypes, the interpreter's
//! f64 arithmetic, the result stored in y's type ([`kernels::qdq`]). `ConvInteger` whose
//! weights are not constant runs as a direct integer convolution ([`ConvIntegerDirect`]).
use crate::backend::cpu::kernels::activation::Act;
use crate::backend::cpu::kernels::qdq::{
    self, ConvIntegerGeometry, Narrow, ScaleLayout, ScaleMap, Target,
};
use crate::backend::cpu::kernels::qgemm::{
    b_view, pack_b, packed_b_bytes, padded_k, prepare_a, qgemm, qgemm_dequant, Dequant, PackedB8,
    PreparedA,
};
use crate::backend::cpu::kernels::quant::{
    self as kernels_quant, channels_last, im2col_packed, Bytes, ConvGeometry, ZeroPointAt,
};
use crate::backend::cpu::program::{Cx, Kernel, Loc, Slot};
use crate::backend::matmul_geometry::{geometry, Geometry};
use crate::ir::ops::conv::windows;
use crate::ir::shape::norm_axis;
use crate::ir::DType;
use crate::tensor::lowbit::{self, MiniFloat};
use crate::tensor::{Elem, Tensor};
use crate::with_dtype;

use super::Build;

pub(crate) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    match b.node.op.as_str() {
        "DequantizeLinear" => match build_dequantize_low_bit(b)? {
            Some(k) => Ok(Some(k)),
            None => build_qdq(b, false),
        },
        "QuantizeLinear" => build_qdq(b, true),
        "DynamicQuantizeLinear" => build_dynamic_quantize(b),
        "MatMulInteger" => build_matmul_integer(b),
        "ConvInteger" => match build_conv_integer(b)? {
            Some(k) => Ok(Some(k)),
            None => build_conv_integer_direct(b),
        },
        "FusedConvInteger" => build_conv_integer(b),
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
        let (x, y, len) = (cx.f32(&self.x), cx.ptr(self.y.loc), self.x.elements());
        // SAFETY: the Kernel::run contract: x holds its `len` f32 elements and y, a
        // different slot, as many bytes.
        let (scale, zero_point) = unsafe { kernels_quant::dynamic_quantize_u8(x, y, len, cx.pool) };
        // SAFETY: the scale's slot holds one f32 and the zero point's one byte.
        unsafe {
            *cx.f32_mut(&self.scale) = scale;
            *cx.ptr(self.zero_point.loc) = zero_point;
        }
        Ok(())
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

/// A constant 8-bit tensor's bytes as stored (i8 in two's complement).
fn raw_bytes(t: &Tensor) -> Vec<u8> {
    t.to_f64_vec().iter().map(|&v| v as i64 as u8).collect()
}

/// An 8-bit zero point slot: where it is, its type and which element each index reads.
type ZeroPoint = (Slot, Bytes, ZeroPointAt);

/// `MatMulInteger`: per batch, A's rows made unsigned with their sums, B packed (at
/// lowering when constant with a constant zero point, else per run), then the integer
/// GEMM straight into y.
pub struct MatMulInteger {
    a: Slot,
    a_kind: Bytes,
    a_zero_point: Option<ZeroPoint>,
    b: Slot,
    b_kind: Bytes,
    b_zero_point: Option<ZeroPoint>,
    y: Slot,
    m: usize,
    n: usize,
    k: usize,
    batches: Vec<(usize, usize)>,
    /// Constant B packed at lowering, and which of them each batch multiplies by (empty
    /// when B is packed per run).
    b_packed: Vec<PackedB8>,
    b_index: Vec<usize>,
    scratch: Loc,
    /// Byte offsets in the scratch of A's rows, their terms and B packed.
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
    let zero_point = |i: usize, v: &Slot, axis_from_end: usize| -> Option<Option<ZeroPoint>> {
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
        (None, _) => Some(vec![]),
        (Some(_), Some(z)) => Some(z.to_f64_vec().iter().map(|&v| v as i32).collect()),
        (Some(_), None) => None,
    };
    let (mut b_packed, mut b_index) = (vec![], vec![]);
    if let (Some(t), Some(z)) = (b.constant(1), b_const_zero) {
        let bytes = raw_bytes(t);
        let at = b_zero_point
            .as_ref()
            .map_or(ZeroPointAt::All, |(_, _, at)| *at);
        let zb = |j: usize| z.get(at.index(j)).copied().unwrap_or(0);
        let mut packed_at: Vec<usize> = vec![];
        for &(_, ob) in &batches {
            let i = match packed_at.iter().position(|&o| o == ob) {
                Some(i) => i,
                None => {
                    if ob + k * n > bytes.len() {
                        return Ok(None);
                    }
                    // SAFETY: the k×n matrix at ob lies inside the bytes (checked).
                    let p = unsafe {
                        PackedB8::new(bytes.as_ptr().add(ob), b_kind, k, n, (n, 1), &zb)?
                    };
                    b_packed.push(p);
                    packed_at.push(ob);
                    packed_at.len() - 1
                }
            };
            b_index.push(i);
        }
    }
    let b_bytes = if b_index.is_empty() {
        packed_b_bytes(k, n)
    } else {
        0
    };
    let (offsets, total) = carve(&[m * padded_k(k), 2 * m * 4, b_bytes]);
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
        b_packed,
        b_index,
        scratch: b.scratch(total),
        offsets,
    })))
}

impl Kernel for MatMulInteger {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let pool = cx.pool;
        let scratch = cx.ptr(self.scratch);
        let (m, n, k) = (self.m, self.n, self.k);
        // SAFETY: the scratch holds the sizes carved at lowering, A's rows, A's terms
        // and a packed B, at these offsets (the Kernel::run contract).
        let (a_rows, a_terms, b_scratch) = unsafe {
            let a_terms = scratch.add(self.offsets[1]) as *mut i32;
            (
                scratch.add(self.offsets[0]),
                a_terms,
                scratch.add(self.offsets[2]),
            )
        };
        // The zero point of element e of an operand.
        let zp = |z: &Option<ZeroPoint>, e: usize| {
            z.as_ref().map_or(0, |(s, kind, at)| {
                // SAFETY: `at` maps the operand's element e to its zero point's index,
                // inside that slot (one byte per 8-bit element).
                kind.value(unsafe { *cx.ptr(s.loc).add(at.index(e)) })
            })
        };
        let (a, b) = (
            cx.ptr(self.a.loc) as *const u8,
            cx.ptr(self.b.loc) as *const u8,
        );
        let y = cx.ptr(self.y.loc) as *mut i32;
        for (i, &(oa, ob)) in self.batches.iter().enumerate() {
            let a_zero = |r: usize| zp(&self.a_zero_point, oa + r * k);
            let kind = self.a_kind;
            // SAFETY: batch i's m×k A starts at byte `oa` of A's slot (the geometry's
            // offsets); the scratch's A rows and terms fit m rows (carved at lowering).
            let av = unsafe { prepare_a(a.add(oa), kind, m, k, k, &a_zero, a_rows, a_terms, pool) };
            let bv = match self.b_index.get(i) {
                Some(&p) => self.b_packed[p].view(),
                None => {
                    let b_zero = |j: usize| zp(&self.b_zero_point, ob + j);
                    // SAFETY: batch i's k×n row-major B starts at byte `ob` of B's slot;
                    // the scratch's B part holds `packed_b_bytes(k, n)`, 4-byte aligned.
                    unsafe { pack_b(b.add(ob), self.b_kind, k, n, (n, 1), &b_zero, b_scratch) }
                }
            };
            // SAFETY: `av` and `bv` were just prepared and packed; batch i's m×n i32
            // block of Y starts at i·m·n in Y's slot of batches·m·n.
            unsafe { qgemm(pool, m, &av, &bv, y.add(i * m * n), (n, 1)) };
        }
        Ok(())
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "gemm-integer"
    }
}

/// `ConvInteger`: per image and group, the image channels-last, its patches packed as
/// the integer GEMM's B (a column per output position), then the weights (prepared at
/// lowering, one row per output channel) times them straight into y's planes.
/// `FusedConvInteger` too: the GEMM's epilogue then dequantizes ([`Dequant`]).
pub struct ConvInteger {
    x: Slot,
    x_kind: Bytes,
    x_zero_point: Option<(Slot, Bytes)>,
    y: Slot,
    geometry: ConvGeometry,
    groups: usize,
    /// Output channels per group.
    m: usize,
    /// Per group: W's rows (taps × channels, as the patches run) as the GEMM's A.
    weights: Vec<PreparedA>,
    scratch: Loc,
    offsets: Vec<usize>,
    dequant: Option<DequantSlots>,
}

/// `FusedConvInteger`'s epilogue operands: read at run time (the scale and the bias
/// come from the layer's `DynamicQuantizeLinear`).
struct DequantSlots {
    /// The i32 bias and whether it is one per output channel (else one for all).
    bias: Option<(Slot, bool)>,
    scale: Slot,
    z: Option<Slot>,
    act: Act,
}

/// `FusedConvInteger`'s epilogue, if this is one the kernel can apply: a bias of one
/// value or one per output channel (axis 1), one scale, a residual of y's shape.
fn dequant_slots(b: &Build, y: &Slot, total_m: usize) -> Result<Option<DequantSlots>, String> {
    let (Some(scale), None) = (b.input(5), b.ins.get(7)) else {
        return Ok(None);
    };
    if scale.dtype != DType::F32 || scale.elements() != 1 || y.dtype != DType::F32 {
        return Ok(None);
    }
    let bias = match b.input(4) {
        None => None,
        Some(s) if s.dtype != DType::I32 => return Ok(None),
        Some(s) if s.elements() == 1 => Some((s.clone(), false)),
        Some(s) => {
            // Right-aligned on y's axes, all ones but the channel axis.
            let rank = y.shape.len();
            let at = rank.checked_sub(s.shape.len());
            let per_channel = at.is_some_and(|at| {
                s.shape
                    .iter()
                    .enumerate()
                    .all(|(i, &d)| d == if at + i == 1 { total_m } else { 1 })
            });
            if !per_channel {
                return Ok(None);
            }
            Some((s.clone(), true))
        }
    };
    let z = match b.input(6) {
        None => None,
        Some(z) if z.dtype == DType::F32 && z.shape == y.shape => Some(z.clone()),
        Some(_) => return Ok(None),
    };
    let Ok(act) = Act::from_attrs(&b.node.attrs) else {
        return Ok(None);
    };
    Ok(Some(DequantSlots {
        bias,
        scale: scale.clone(),
        z,
        act,
    }))
}

fn build_conv_integer(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let (Some(x), Some(w), y) = (b.input(0), b.input(1), &b.outs[0]) else {
        return Ok(None);
    };
    let (Some(x_kind), Some(w_kind), Some(w_data)) =
        (bytes_of(x.dtype), bytes_of(w.dtype), b.constant(1))
    else {
        return Ok(None);
    };
    let rank = x.shape.len();
    let fused = b.node.op == "FusedConvInteger";
    let out_dtype = if fused { DType::F32 } else { DType::I32 };
    if !(3..=5).contains(&rank) || w.shape.len() != rank || y.dtype != out_dtype {
        return Ok(None);
    }
    let dequant = if fused {
        match dequant_slots(b, y, w.shape[0])? {
            Some(d) => Some(d),
            None => return Ok(None),
        }
    } else {
        None
    };
    let x_zero_point = match b.input(2) {
        None => None,
        Some(z) if z.elements() == 1 => match bytes_of(z.dtype) {
            Some(k) => Some((z.clone(), k)),
            None => return Ok(None),
        },
        Some(_) => return Ok(None),
    };
    let w_zero_point: Vec<i32> = match (b.input(3), b.constant(3)) {
        (None, _) => vec![],
        (Some(_), Some(z)) if z.len() == 1 || z.len() == w.shape[0] => {
            z.to_f64_vec().iter().map(|&v| v as i32).collect()
        }
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
    let (depth, taps) = (geometry.depth(), geometry.taps());
    let bytes = raw_bytes(w_data);
    if bytes.len() != total_m * depth {
        return Ok(None);
    }
    let m = total_m / groups;
    let mut weights = vec![];
    for g in 0..groups {
        // Row j of the group's weights reordered from (channel, tap) to the patches'
        // (tap, channel).
        let mut reordered = vec![0u8; m * depth];
        for j in 0..m {
            for c in 0..channels {
                for t in 0..taps {
                    reordered[j * depth + t * channels + c] =
                        bytes[(g * m + j) * depth + c * taps + t];
                }
            }
        }
        let zb = |j: usize| match w_zero_point.len() {
            0 => 0,
            1 => w_zero_point[0],
            _ => w_zero_point[g * m + j],
        };
        weights.push(PreparedA::new(&reordered, w_kind, m, depth, &zb)?);
    }
    let positions = geometry.positions();
    let (offsets, total) = carve(&[
        geometry.input_plane() * channels,
        packed_b_bytes(depth, positions),
        geometry.input_plane() * 4,
    ]);
    Ok(Some(Box::new(ConvInteger {
        x: x.clone(),
        x_kind,
        x_zero_point,
        y: y.clone(),
        geometry,
        groups,
        m,
        weights,
        scratch: b.scratch(total),
        offsets,
        dequant,
    })))
}

impl Kernel for ConvInteger {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // The Kernel::run contract: x holds N images of groups × channels planes
        // (bytes), y N × groups × m output planes (i32, or f32 when fused, as Z), the
        // bias groups × m (or one) i32, the scale one f32, the scratch the channels-last
        // image, its packed patches and its pixel sums carved at lowering.
        let pool = cx.pool;
        let g = &self.geometry;
        let p = g.positions();
        let plane = g.input_plane();
        // SAFETY: the zero point's slot holds (at least) one byte.
        let zero_point = (self.x_zero_point.as_ref())
            .map_or(0, |(s, kind)| kind.value(unsafe { *cx.ptr(s.loc) }));
        let scratch = cx.ptr(self.scratch);
        // SAFETY: the three scratch parts lie at their carved offsets, the second
        // `packed_b_bytes(depth, positions)` long (4-byte aligned, as carved).
        let (image, col, pixel_sums) = unsafe {
            let col = b_view(scratch.add(self.offsets[1]), g.depth(), p);
            (
                scratch.add(self.offsets[0]),
                col,
                scratch.add(self.offsets[2]) as *mut i32,
            )
        };
        // Padding reads as the zero point: b' = zero point − 128 for u8.
        let beta = zero_point - if self.x_kind == Bytes::U8 { 128 } else { 0 };
        let images = self.x.shape[0];
        let (x, y) = (
            cx.ptr(self.x.loc) as *const u8,
            cx.ptr(self.y.loc) as *mut i32,
        );
        for n in 0..images {
            for group in 0..self.groups {
                let at = n * self.groups + group;
                // SAFETY: `at < images·groups`: image n's group of `channels` planes in x;
                // the scratch parts hold its channels-last copy and pixel sums.
                unsafe {
                    let x = x.add(at * g.channels * plane);
                    channels_last(g, x, self.x_kind, image, pixel_sums, pool);
                    im2col_packed(g, image, pixel_sums, beta, &col, pool);
                }
                let w = self.weights[group].view();
                let out = at * self.m * p;
                match &self.dequant {
                    // SAFETY: the group's m output planes of p positions start at `out`
                    // in y; `w` and `col` are the prepared weights and the packed patches.
                    None => unsafe { qgemm(pool, self.m, &w, &col, y.add(out), (p, 1)) },
                    Some(d) => {
                        let bias = d.bias.as_ref().map_or((std::ptr::null(), 0), |(s, per)| {
                            let b = cx.ptr(s.loc) as *const i32;
                            if *per {
                                // SAFETY: a per-channel bias holds groups × m i32.
                                (unsafe { b.add(group * self.m) }, 1)
                            } else {
                                (b, 0)
                            }
                        });
                        // SAFETY: Z is shaped like y (f32): its block at `out` as y's.
                        let z = (d.z.as_ref()).map_or(std::ptr::null(), |s| unsafe {
                            (cx.ptr(s.loc) as *const f32).add(out)
                        });
                        let e = Dequant {
                            bias: bias.0,
                            bias_step: bias.1,
                            // SAFETY: the scale's slot holds one f32.
                            scale: unsafe { *cx.f32(&d.scale) },
                            z,
                            act: d.act,
                        };
                        // SAFETY: fused, y holds f32; the group's m planes start at `out`,
                        // with the bias (m values from `bias.0`, or one) and Z there.
                        unsafe {
                            let y = (y as *mut f32).add(out);
                            qgemm_dequant(pool, self.m, &w, &col, y, (p, 1), e);
                        }
                    }
                }
            }
        }
        Ok(())
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
    map: ScaleMap,
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
    let Some(map) = scale_map(b, x, scale)? else {
        return Ok(None);
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
        map,
    })))
}

impl Kernel for DequantizeLowBit {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let n = self.x.elements();
        let scale = (cx.ptr(self.scale.loc) as *const f32, self.scale.elements());
        // SAFETY: the Kernel::run contract: the slots address live buffers of their
        // lowered sizes (one byte per x and zero-point element, f32 scale and y), and
        // y, the only one written, is a slot of its own.
        let (x, scale, zero_point, y) = unsafe {
            let x = std::slice::from_raw_parts(cx.ptr(self.x.loc), n);
            let scale = std::slice::from_raw_parts(scale.0, scale.1);
            let zp = (self.zero_point.as_ref())
                .map(|z| std::slice::from_raw_parts(cx.ptr(z.loc), z.elements()));
            let y = std::slice::from_raw_parts_mut(cx.ptr(self.y.loc) as *mut f32, n);
            (x, scale, zp, y)
        };
        for (i, (out, &byte)) in y.iter_mut().zip(x).enumerate() {
            let s = self.map.index(i);
            let z = zero_point.map_or(0.0, |z| self.table[z[s] as usize]);
            *out = (self.table[byte as usize] - z) * scale[s];
        }
        Ok(())
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "dequantize-low-bit"
    }
}

/// How x's elements find their scale, in the layouts the interpreter accepts (`None`:
/// another, which lowering leaves to it).
fn scale_map(b: &Build, x: &Slot, scale: &Slot) -> Result<Option<ScaleMap>, String> {
    let rank = x.shape.len();
    let block_size = b.node.attrs.int_or("block_size", 0)?;
    let axis = || norm_axis(b.node.attrs.int_or("axis", 1).ok()?, rank).ok();
    let along = |axis: usize, layout: ScaleLayout, block: usize| ScaleMap {
        layout,
        axis_len: x.shape[axis],
        inner: x.shape[axis + 1..].iter().product(),
        block,
    };
    Ok(match scale.shape.len() {
        0 => Some(ScaleMap {
            layout: ScaleLayout::Tensor,
            axis_len: 1,
            inner: x.elements().max(1),
            block: 1,
        }),
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
            fits.then(|| along(axis, ScaleLayout::Blocked, block))
        }
        1 if block_size <= 0 => {
            let Some(axis) = axis() else { return Ok(None) };
            (scale.shape[0] == x.shape[axis]).then(|| along(axis, ScaleLayout::Axis, 1))
        }
        _ => None,
    })
}

/// The values integer dtype `d` holds (what quantizing saturates to); `None` for floats.
fn int_range(d: DType) -> Option<(f64, f64)> {
    let (lo, hi) = crate::ir::ops::quant::range(d);
    lo.is_finite().then_some((lo, hi))
}

/// `QuantizeLinear` (with `quantize`: how) or `DequantizeLinear` of any dtypes: x, the
/// scale and the zero point loaded as f64 into the scratch, the arithmetic there, the
/// result stored in y's type.
pub struct Qdq {
    quantize: Option<(Narrow, Target)>,
    x: Slot,
    scale: Slot,
    zero_point: Option<Slot>,
    y: Slot,
    map: ScaleMap,
    /// A float8 output that does not saturate: its codec.
    unsaturated: Option<MiniFloat>,
    scratch: Loc,
    /// Byte offsets in the scratch of x's, the scale's and the zero point's values.
    offsets: Vec<usize>,
}

fn build_qdq(b: &Build, quantize: bool) -> Result<Option<Box<dyn Kernel>>, String> {
    let (Some(x), Some(scale), Some(y)) = (b.input(0), b.input(1), b.outs.first()) else {
        return Ok(None);
    };
    let attrs = &b.node.attrs;
    let output_dtype = match attrs.string("output_dtype")? {
        Some(d) => match d.parse::<DType>() {
            Ok(d) => Some(d),
            Err(_) => return Ok(None),
        },
        None => None,
    };
    let mut zero_point = b.input(2).cloned();
    let how = if quantize {
        let d = output_dtype.unwrap_or(zero_point.as_ref().map_or(DType::U8, |z| z.dtype));
        if !(x.dtype.is_float() || x.dtype == DType::I32) || y.dtype != d {
            return Ok(None);
        }
        let precision = match attrs.string("precision")? {
            Some(p) => match p.parse::<DType>() {
                Ok(p) => p,
                Err(_) => return Ok(None),
            },
            None => x.dtype,
        };
        let narrow = match precision {
            DType::F32 => Narrow::F32,
            DType::F16 => Narrow::F16,
            DType::BF16 => Narrow::BF16,
            _ => Narrow::None,
        };
        let target = if d.is_minifloat() && d != DType::F8E8M0 {
            Target::Float {
                shift_by_zero_point: d == DType::F4E2M1,
            }
        } else {
            match int_range(d) {
                Some((lo, hi)) => Target::Int(lo, hi),
                None => return Ok(None),
            }
        };
        Some((narrow, target))
    } else {
        let d = output_dtype.unwrap_or(scale.dtype);
        if !(x.dtype.is_int() || x.dtype.is_low_bit()) || y.dtype != d {
            return Ok(None);
        }
        // Float8 and float4 zero points are zero by definition (the interpreter ignores them).
        if x.dtype.is_minifloat() {
            zero_point = None;
        }
        None
    };
    if !scale.dtype.is_float() || y.shape != x.shape {
        return Ok(None);
    }
    let Some(map) = scale_map(b, x, scale)? else {
        return Ok(None);
    };
    let zero_point_fits =
        |z: &Slot| z.shape == scale.shape || (scale.shape.is_empty() && z.elements() >= 1);
    if zero_point.as_ref().is_some_and(|z| !zero_point_fits(z)) {
        return Ok(None);
    }
    let saturate = attrs.int_or("saturate", 1)? != 0;
    let unsaturated = match y.dtype {
        _ if !quantize || saturate => None,
        DType::F8E4M3FN => Some(lowbit::E4M3FN),
        DType::F8E4M3FNUZ => Some(lowbit::E4M3FNUZ),
        DType::F8E5M2 => Some(lowbit::E5M2),
        DType::F8E5M2FNUZ => Some(lowbit::E5M2FNUZ),
        _ => None,
    };
    let z_len = zero_point.as_ref().map_or(0, |z| z.elements());
    let (offsets, total) = carve(&[x.elements() * 8, scale.elements() * 8, z_len * 8]);
    Ok(Some(Box::new(Qdq {
        quantize: how,
        x: x.clone(),
        scale: scale.clone(),
        zero_point,
        y: y.clone(),
        map,
        unsaturated,
        scratch: b.scratch(total),
        offsets,
    })))
}

/// Slot elements of `T` at `p` as f64 into `dst` (as many as it holds).
///
/// # Safety
/// `p` addresses `dst.len()` `T`s, none of them in `dst`.
unsafe fn load_slot<T: Elem>(p: *const u8, dst: &mut [f64]) -> Result<(), String> {
    // SAFETY: the caller's contract: `dst.len()` `T`s at `p`, apart from `dst`.
    let src = unsafe { std::slice::from_raw_parts(p as *const T, dst.len()) };
    qdq::load_f64(src, dst);
    Ok(())
}

/// f64s into `src.len()` elements of `T` at `p`, as a float (`whole`: an integer)
/// converts.
///
/// # Safety
/// `p` addresses `src.len()` writable `T`s, none of them in `src`.
unsafe fn store_slot<T: Elem>(p: *mut u8, src: &[f64], whole: bool) -> Result<(), String> {
    // SAFETY: the caller's contract: an output slot of `src.len()` `T`s at `p`.
    let dst = unsafe { std::slice::from_raw_parts_mut(p as *mut T, src.len()) };
    if whole {
        qdq::store_i64(src, dst);
    } else {
        qdq::store_f64(src, dst);
    }
    Ok(())
}

impl Kernel for Qdq {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let scratch = cx.ptr(self.scratch);
        let (n, ns) = (self.x.elements(), self.scale.elements());
        let nz = self.zero_point.as_ref().map_or(0, |z| z.elements());
        // SAFETY: the scratch's three parts, carved at lowering for x's, the scale's
        // and the zero point's values as f64 (64-byte aligned, disjoint).
        let (xs, ss, zs) = unsafe {
            let part = |k: usize, len: usize| {
                std::slice::from_raw_parts_mut(scratch.add(self.offsets[k]) as *mut f64, len)
            };
            (part(0, n), part(1, ns), part(2, nz))
        };
        // SAFETY: the Kernel::run contract: x, the scale and the zero point hold their
        // dtypes' elements, read into the scratch (another buffer).
        unsafe {
            with_dtype!(self.x.dtype, load_slot(cx.ptr(self.x.loc), xs))?;
            with_dtype!(self.scale.dtype, load_slot(cx.ptr(self.scale.loc), ss))?;
            if let Some(z) = &self.zero_point {
                with_dtype!(z.dtype, load_slot(cx.ptr(z.loc), zs))?;
            }
        }
        let zs = self.zero_point.as_ref().map(|_| &*zs);
        let whole = match self.quantize {
            Some((narrow, target)) => {
                qdq::quantize(xs, ss, zs, &self.map, narrow, target);
                matches!(target, Target::Int(..))
            }
            None => {
                qdq::dequantize(xs, ss, zs, &self.map);
                false
            }
        };
        let y = cx.ptr(self.y.loc);
        if let Some(codec) = self.unsaturated {
            // SAFETY: y's output slot holds `n` one-byte float8 codes.
            let codes = unsafe { std::slice::from_raw_parts_mut(y, n) };
            qdq::store_unsaturated(codec, xs, codes);
            return Ok(());
        }
        // SAFETY: y's output slot holds `n` elements of its dtype, apart from the scratch.
        unsafe { with_dtype!(self.y.dtype, store_slot(y, xs, whole)) }
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        if self.quantize.is_some() {
            "quantize"
        } else {
            "dequantize"
        }
    }
}

/// `ConvInteger` whose weights (or their zero point) are known only at run time:
/// [`qdq::conv_integer`], direct, over the slots.
pub struct ConvIntegerDirect {
    x: Slot,
    x_kind: Bytes,
    x_zero_point: Option<(Slot, Bytes)>,
    w: Slot,
    w_kind: Bytes,
    /// W's zero point and whether it is one per output channel.
    w_zero_point: Option<(Slot, Bytes, bool)>,
    y: Slot,
    geometry: ConvIntegerGeometry,
}

fn build_conv_integer_direct(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let (Some(x), Some(w), Some(y)) = (b.input(0), b.input(1), b.outs.first()) else {
        return Ok(None);
    };
    let (Some(x_kind), Some(w_kind)) = (bytes_of(x.dtype), bytes_of(w.dtype)) else {
        return Ok(None);
    };
    let rank = x.shape.len();
    if !(3..=5).contains(&rank)
        || w.shape.len() != rank
        || y.dtype != DType::I32
        || y.shape.len() != rank
    {
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
    let total_m = w.shape[0];
    let w_zero_point = match b.input(3) {
        None => None,
        Some(z) if z.elements() == 1 || (z.shape == [total_m]) => match bytes_of(z.dtype) {
            Some(k) => Some((z.clone(), k, z.elements() != 1)),
            None => return Ok(None),
        },
        Some(_) => return Ok(None),
    };
    let groups = usize::try_from(b.node.attrs.int_or("group", 1)?).map_err(|e| e.to_string())?;
    let channels = w.shape[1];
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
    if y.shape[..2] != [x.shape[0], total_m] {
        return Ok(None);
    }
    let geometry = ConvIntegerGeometry {
        images: x.shape[0],
        groups,
        channels,
        m: total_m / groups,
        input: pad3(&x.shape[2..], 1),
        output: pad3(&y.shape[2..], 1),
        kernel: pad3(&kernel, 1),
        stride: pad3(&wins.iter().map(|w| w.stride).collect::<Vec<_>>(), 1),
        dilation: pad3(&wins.iter().map(|w| w.dilation).collect::<Vec<_>>(), 1),
        pad_begin: pad3(&wins.iter().map(|w| w.pad_begin).collect::<Vec<_>>(), 0),
    };
    Ok(Some(Box::new(ConvIntegerDirect {
        x: x.clone(),
        x_kind,
        x_zero_point,
        w: w.clone(),
        w_kind,
        w_zero_point,
        y: y.clone(),
        geometry,
    })))
}

impl Kernel for ConvIntegerDirect {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let byte_slice = |s: &Slot| cx.ptr(s.loc) as *const u8;
        // SAFETY: the Kernel::run contract: x, w and x's zero point are 8-bit input
        // slots of their shapes (one byte an element), read only.
        let (x, w, xz) = unsafe {
            (
                std::slice::from_raw_parts(byte_slice(&self.x), self.x.elements()),
                std::slice::from_raw_parts(byte_slice(&self.w), self.w.elements()),
                (self.x_zero_point.as_ref()).map(|(z, k)| (*byte_slice(z), *k)),
            )
        };
        let wz = (self.w_zero_point.as_ref()).map(|(z, k, per)| {
            // SAFETY: w's zero point, an 8-bit input slot of one or M bytes, read only.
            let z = unsafe { std::slice::from_raw_parts(byte_slice(z), z.elements()) };
            (z, *k, *per)
        });
        let x_zero = xz.map_or(0, |(v, k)| k.value(v));
        let w_zero = |oc: usize| wz.map_or(0, |(z, k, per)| k.value(z[if per { oc } else { 0 }]));
        let y_ptr = cx.ptr(self.y.loc) as *mut i32;
        // SAFETY: y's i32 output slot, its own buffer (ConvInteger is not in place).
        let y = unsafe { std::slice::from_raw_parts_mut(y_ptr, self.y.elements()) };
        qdq::conv_integer(
            &self.geometry,
            (x, self.x_kind, x_zero),
            (w, self.w_kind),
            &w_zero,
            y,
        );
        Ok(())
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "conv-integer-direct"
    }
}
