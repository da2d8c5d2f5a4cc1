//! Quantized kernels: dynamic u8 quantization (the interpreter's f32 numerics, one pass
//! for the range and one for the values) and the integer operands of `MatMulInteger`
//! and `ConvInteger` widened to f32 for the packed GEMM.
//!
//! The GEMM computes integer products exactly in f32 while every partial sum stays
//! within 2^24 (all integers up to it are f32 values, whatever the order of the
//! additions): [`exact_depth`] is how many products of the operands' largest
//! magnitudes fit, and the products split K into chunks of that depth, each chunk's
//! exact result converted to i32 and summed there.
use super::par::{for_ranges, SyncPtr};
use crate::backend::cpu::isa::{self, Isa};
use crate::backend::cpu::pool::Pool;
use crate::ir::ops::quant::{dynamic_quantize_one, dynamic_quantize_params};

/// Elements per parallel task of the elementwise loops here.
const CHUNK: usize = 16 * 1024;

/// Quantizes `len` floats at `x` into `y` as `DynamicQuantizeLinear` does; returns the
/// scale and the zero point.
///
/// # Safety
/// `x` readable and `y` writable for `len` elements, not overlapping.
pub(crate) unsafe fn dynamic_quantize_u8(
    x: *const f32,
    y: *mut u8,
    len: usize,
    pool: Option<&Pool>,
) -> (f32, u8) {
    // SAFETY: the caller's contract: x holds len floats.
    let xs = unsafe { std::slice::from_raw_parts(x, len) };
    // Sixteen independent lanes (max and min are order-free, NaN is skipped by both).
    let (mut hi, mut lo) = ([0.0f32; 16], [0.0f32; 16]);
    let mut chunks = xs.chunks_exact(16);
    for c in &mut chunks {
        for l in 0..16 {
            hi[l] = hi[l].max(c[l]);
            lo[l] = lo[l].min(c[l]);
        }
    }
    for &v in chunks.remainder() {
        hi[0] = hi[0].max(v);
        lo[0] = lo[0].min(v);
    }
    let hi = hi.iter().fold(0.0f32, |a, &b| a.max(b));
    let lo = lo.iter().fold(0.0f32, |a, &b| a.min(b));
    let (scale, zero_point) = dynamic_quantize_params(lo, hi);
    let isa = isa::isa();
    let (xp, yp) = (SyncPtr(x as *mut f32), SyncPtr(y));
    for_ranges(pool, len.div_ceil(CHUNK), CHUNK, &|r| {
        let (start, end) = (r.start * CHUNK, (r.end * CHUNK).min(len));
        // SAFETY: start..end lies inside both buffers; each task writes its own range;
        // the ISA's features are present (isa() checked them).
        unsafe {
            quantize_range(
                isa,
                xp.get().add(start),
                yp.get().add(start),
                end - start,
                scale,
                zero_point,
            )
        }
    });
    (scale, zero_point as u8)
}

/// [`dynamic_quantize_one`] over a range, compiled for the ISA so that the rounding is
/// one instruction.
///
/// # Safety
/// `x` readable and `y` writable for `len` elements; `isa`'s features present.
unsafe fn quantize_range(
    isa: Isa,
    x: *const f32,
    y: *mut u8,
    len: usize,
    scale: f32,
    zero_point: f32,
) {
    #[inline(always)]
    unsafe fn body(x: *const f32, y: *mut u8, len: usize, scale: f32, zero_point: f32) {
        for i in 0..len {
            // SAFETY: i < len, inside both buffers.
            unsafe { *y.add(i) = dynamic_quantize_one(*x.add(i), scale, zero_point) };
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn avx512(x: *const f32, y: *mut u8, len: usize, scale: f32, zero_point: f32) {
        // SAFETY: forwarded contract.
        unsafe { body(x, y, len, scale, zero_point) }
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2(x: *const f32, y: *mut u8, len: usize, scale: f32, zero_point: f32) {
        // SAFETY: forwarded contract.
        unsafe { body(x, y, len, scale, zero_point) }
    }
    // SAFETY: the caller's contract, and the features of the ISA chosen.
    unsafe {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => avx512(x, y, len, scale, zero_point),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => avx2(x, y, len, scale, zero_point),
            _ => body(x, y, len, scale, zero_point),
        }
    }
}

/// An 8-bit integer operand's element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bytes {
    U8,
    I8,
}

impl Bytes {
    #[inline(always)]
    pub(crate) fn value(self, b: u8) -> i32 {
        match self {
            Bytes::U8 => b as i32,
            Bytes::I8 => b as i8 as i32,
        }
    }
}

/// How many products of factors at most `a_max` and `b_max` in magnitude sum exactly
/// in f32 (at least 1).
pub(crate) fn exact_depth(a_max: u32, b_max: u32) -> usize {
    let product = (a_max.max(1) as u64) * (b_max.max(1) as u64);
    ((1u64 << 24) / product).max(1) as usize
}

/// Where an element's zero point is: one for all, or one per index `(e / inner) % len`
/// (a matrix's rows: inner = its columns; its columns: inner = 1).
#[derive(Debug, Clone, Copy)]
pub(crate) enum ZeroPointAt {
    All,
    Along { inner: usize, len: usize },
}

/// `out[e] = value(src[e]) - value(zero_point[at(e)])` as f32, for `len` elements.
///
/// # Safety
/// `src` readable and `out` writable for `len` elements; `zero_point` (if any) for the
/// indices `at` names.
pub(crate) unsafe fn widen(
    src: *const u8,
    kind: Bytes,
    zero_point: Option<(*const u8, Bytes, ZeroPointAt)>,
    out: *mut f32,
    len: usize,
    pool: Option<&Pool>,
) {
    let (s, o) = (SyncPtr(src as *mut u8), SyncPtr(out));
    let zp = zero_point.map(|(p, k, at)| (SyncPtr(p as *mut u8), k, at));
    for_ranges(pool, len.div_ceil(CHUNK), CHUNK, &|r| {
        let (start, end) = (r.start * CHUNK, (r.end * CHUNK).min(len));
        for e in start..end {
            // SAFETY: e < len; the zero point index is inside it by the caller's
            // contract; each task writes its own range.
            unsafe {
                let z = match zp {
                    None => 0,
                    Some((p, k, ZeroPointAt::All)) => k.value(*p.get()),
                    Some((p, k, ZeroPointAt::Along { inner, len })) => {
                        k.value(*p.get().add((e / inner) % len))
                    }
                };
                *o.get().add(e) = (kind.value(*s.get().add(e)) - z) as f32;
            }
        }
    });
}

/// `acc[i] = exact[i]` (first) or `acc[i] += exact[i]`, the f32 values whole numbers
/// within 2^24, `acc` i32; `acc` may be `exact`'s buffer when `first`.
///
/// # Safety
/// Both hold `len` elements.
pub(crate) unsafe fn accumulate_exact(
    exact: *const f32,
    acc: *mut i32,
    len: usize,
    first: bool,
    pool: Option<&Pool>,
) {
    let (s, o) = (SyncPtr(exact as *mut f32), SyncPtr(acc));
    for_ranges(pool, len.div_ceil(CHUNK), CHUNK, &|r| {
        let (start, end) = (r.start * CHUNK, (r.end * CHUNK).min(len));
        for i in start..end {
            // SAFETY: i < len; each element is read before it is written.
            unsafe {
                let v = *s.get().add(i) as i32;
                let a = o.get().add(i);
                *a = if first { v } else { (*a).wrapping_add(v) };
            }
        }
    });
}

/// A convolution's geometry over up to three spatial axes (missing leading axes are 1).
#[derive(Debug, Clone)]
pub(crate) struct ConvGeometry {
    pub channels: usize,
    pub input: [usize; 3],
    pub output: [usize; 3],
    pub kernel: [usize; 3],
    pub stride: [usize; 3],
    pub dilation: [usize; 3],
    pub pad_begin: [usize; 3],
}

impl ConvGeometry {
    /// Rows of the column matrix: channels × kernel taps.
    pub(crate) fn depth(&self) -> usize {
        self.channels * self.kernel.iter().product::<usize>()
    }
    /// Columns of the column matrix: output positions.
    pub(crate) fn positions(&self) -> usize {
        self.output.iter().product()
    }
    fn input_plane(&self) -> usize {
        self.input.iter().product()
    }
}

/// The column matrix `[depth × positions]` of the 8-bit image `x` (`channels` planes):
/// row (c, tap) holds `value(x) - zero_point` under that tap at each output position,
/// 0 where the tap falls in the padding (padding is the zero point).
///
/// # Safety
/// `x` readable for `channels` planes, `col` writable for depth × positions floats.
pub(crate) unsafe fn im2col(
    g: &ConvGeometry,
    x: *const u8,
    kind: Bytes,
    zero_point: i32,
    col: *mut f32,
    pool: Option<&Pool>,
) {
    let taps: usize = g.kernel.iter().product();
    let positions = g.positions();
    let (xp, cp) = (SyncPtr(x as *mut u8), SyncPtr(col));
    let source = |o: usize, k: usize, axis: usize| -> Option<usize> {
        let p = (o * g.stride[axis] + k * g.dilation[axis]) as isize - g.pad_begin[axis] as isize;
        (0..g.input[axis] as isize)
            .contains(&p)
            .then_some(p as usize)
    };
    for_ranges(pool, g.depth(), positions, &|rows| {
        for row in rows {
            let (c, tap) = (row / taps, row % taps);
            let (kd, kh, kw) = (
                tap / (g.kernel[1] * g.kernel[2]),
                (tap / g.kernel[2]) % g.kernel[1],
                tap % g.kernel[2],
            );
            // SAFETY: row < depth: its plane and its row of col are inside the buffers;
            // every index below is checked against the input's extent.
            unsafe {
                let plane = xp.get().add(c * g.input_plane());
                let mut out = cp.get().add(row * positions);
                for od in 0..g.output[0] {
                    let id = source(od, kd, 0);
                    for oh in 0..g.output[1] {
                        let ih = source(oh, kh, 1);
                        let Some((id, ih)) = id.zip(ih) else {
                            std::ptr::write_bytes(out, 0, g.output[2]);
                            out = out.add(g.output[2]);
                            continue;
                        };
                        let line = plane.add((id * g.input[1] + ih) * g.input[2]);
                        for ow in 0..g.output[2] {
                            *out = match source(ow, kw, 2) {
                                Some(iw) => (kind.value(*line.add(iw)) - zero_point) as f32,
                                None => 0.0,
                            };
                            out = out.add(1);
                        }
                    }
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::super::testutil::pools;
    use super::*;
    use crate::ir::ops::quant::dynamic_quantize_params;

    #[test]
    fn dynamic_quantization_matches_the_reference_values() {
        let x: Vec<f32> = (0..40_000)
            .map(|i| ((i * 7919) % 1000) as f32 / 37.0 - 9.5)
            .chain([f32::NAN, 0.5, -0.5])
            .collect();
        let hi = x.iter().fold(0.0f32, |a, &b| a.max(b));
        let lo = x.iter().fold(0.0f32, |a, &b| a.min(b));
        let (scale, zero_point) = dynamic_quantize_params(lo, hi);
        for pool in pools() {
            let mut y = vec![0u8; x.len()];
            // SAFETY: both buffers hold x.len() elements.
            let (s, z) =
                unsafe { dynamic_quantize_u8(x.as_ptr(), y.as_mut_ptr(), x.len(), pool.as_ref()) };
            assert_eq!((s, z as f32), (scale, zero_point));
            for (i, (&v, &q)) in x.iter().zip(&y).enumerate() {
                assert_eq!(q, dynamic_quantize_one(v, scale, zero_point), "element {i}");
            }
        }
    }

    #[test]
    fn exact_depth_keeps_sums_within_f32_integers() {
        assert_eq!(exact_depth(255, 255), (1 << 24) / 65025);
        assert_eq!(exact_depth(0, 0), 1 << 24);
        assert!(exact_depth(255, 128) * 255 * 128 <= 1 << 24);
    }
}
