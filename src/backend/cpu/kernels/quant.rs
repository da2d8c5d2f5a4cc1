//! Quantized kernels: dynamic u8 quantization (the interpreter's f32 numerics, one pass
//! for the range and one for the values, both vectorized and split over the pool) and `ConvInteger`'s operand for the integer
//! GEMM ([`super::qgemm`]): the image channels-last, then its patches written straight
//! into the GEMM's packed B (a column per output position), so that every tap is a copy
//! of `channels` bytes, four at a time when the channels fill whole groups.
use super::par::{for_ranges, SyncPtr};
use super::qgemm::{padded_k, BView, NR};
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
    let isa = isa::isa();
    // SAFETY: the caller's contract: x holds len floats; the ISA's features are present.
    let (lo, hi) = unsafe { range(isa, x, len, pool) };
    let (scale, zero_point) = dynamic_quantize_params(lo, hi);
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

/// The most pieces [`range`] splits x into: their partial ranges live on the stack.
const RANGE_PIECES: usize = 64;

/// x's range as `DynamicQuantizeLinear` takes it: (min, max) of the values and 0, NaN
/// skipped. Pieces of at least [`CHUNK`] in parallel; min and max are order-free, so
/// the pieces combine to the one-pass result.
///
/// # Safety
/// `x` readable for `len` elements; `isa`'s features present.
unsafe fn range(isa: Isa, x: *const f32, len: usize, pool: Option<&Pool>) -> (f32, f32) {
    let piece = CHUNK.max(len.div_ceil(RANGE_PIECES));
    let pieces = len.div_ceil(piece);
    let mut parts = [(0.0f32, 0.0f32); RANGE_PIECES];
    let (xp, pp) = (SyncPtr(x as *mut f32), SyncPtr(parts.as_mut_ptr()));
    for_ranges(pool, pieces, piece, &|r| {
        for p in r {
            let (start, end) = (p * piece, ((p + 1) * piece).min(len));
            // SAFETY: start..end lies inside x; each piece writes its own part (p <
            // pieces <= RANGE_PIECES); the caller's ISA contract.
            unsafe { *pp.get().add(p) = range_of(isa, xp.get().add(start), end - start) };
        }
    });
    parts[..pieces]
        .iter()
        .fold((0.0f32, 0.0f32), |(lo, hi), &(l, h)| (lo.min(l), hi.max(h)))
}

/// (min, max) of `len` floats at `x` and 0, NaN skipped, on the ISA's widest vectors.
///
/// # Safety
/// `x` readable for `len` elements; `isa`'s features present.
pub(crate) unsafe fn range_of(isa: Isa, x: *const f32, len: usize) -> (f32, f32) {
    /// Sixteen independent lanes (f32::max and min skip a NaN).
    #[inline(always)]
    fn body(xs: &[f32]) -> (f32, f32) {
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
        (lo, hi)
    }
    /// Four accumulators of sixteen lanes: `vmaxps`/`vminps` return their second
    /// operand, the accumulator, when the element (the first) is NaN.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn avx512(x: *const f32, len: usize) -> (f32, f32) {
        use std::arch::x86_64::*;
        let (mut lo, mut hi) = ([_mm512_setzero_ps(); 4], [_mm512_setzero_ps(); 4]);
        let whole = len / 64 * 64;
        for i in (0..whole).step_by(64) {
            for u in 0..4 {
                // SAFETY: i + 64 <= len.
                let v = unsafe { _mm512_loadu_ps(x.add(i + 16 * u)) };
                hi[u] = _mm512_max_ps(v, hi[u]);
                lo[u] = _mm512_min_ps(v, lo[u]);
            }
        }
        let (mut l, mut h) = ([0f32; 16], [0f32; 16]);
        // SAFETY: the arrays hold sixteen floats.
        unsafe {
            let m = _mm512_max_ps(_mm512_max_ps(hi[0], hi[1]), _mm512_max_ps(hi[2], hi[3]));
            _mm512_storeu_ps(h.as_mut_ptr(), m);
            let m = _mm512_min_ps(_mm512_min_ps(lo[0], lo[1]), _mm512_min_ps(lo[2], lo[3]));
            _mm512_storeu_ps(l.as_mut_ptr(), m);
        }
        // SAFETY: the tail of x.
        let (tl, th) = body(unsafe { std::slice::from_raw_parts(x.add(whole), len - whole) });
        (
            l.iter().fold(tl, |a, &b| a.min(b)),
            h.iter().fold(th, |a, &b| a.max(b)),
        )
    }
    /// The same with eight lanes.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2(x: *const f32, len: usize) -> (f32, f32) {
        use std::arch::x86_64::*;
        let (mut lo, mut hi) = ([_mm256_setzero_ps(); 4], [_mm256_setzero_ps(); 4]);
        let whole = len / 32 * 32;
        for i in (0..whole).step_by(32) {
            for u in 0..4 {
                // SAFETY: i + 32 <= len.
                let v = unsafe { _mm256_loadu_ps(x.add(i + 8 * u)) };
                hi[u] = _mm256_max_ps(v, hi[u]);
                lo[u] = _mm256_min_ps(v, lo[u]);
            }
        }
        let (mut l, mut h) = ([0f32; 8], [0f32; 8]);
        // SAFETY: the arrays hold eight floats.
        unsafe {
            let m = _mm256_max_ps(_mm256_max_ps(hi[0], hi[1]), _mm256_max_ps(hi[2], hi[3]));
            _mm256_storeu_ps(h.as_mut_ptr(), m);
            let m = _mm256_min_ps(_mm256_min_ps(lo[0], lo[1]), _mm256_min_ps(lo[2], lo[3]));
            _mm256_storeu_ps(l.as_mut_ptr(), m);
        }
        // SAFETY: the tail of x.
        let (tl, th) = body(unsafe { std::slice::from_raw_parts(x.add(whole), len - whole) });
        (
            l.iter().fold(tl, |a, &b| a.min(b)),
            h.iter().fold(th, |a, &b| a.max(b)),
        )
    }
    // SAFETY: the caller's contract, and the features of the ISA chosen.
    unsafe {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => avx512(x, len),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => avx2(x, len),
            _ => body(std::slice::from_raw_parts(x, len)),
        }
    }
}

/// [`dynamic_quantize_one`] over a range, compiled for the ISA so that the rounding is
/// one instruction.
///
/// # Safety
/// `x` readable and `y` writable for `len` elements; `isa`'s features present.
pub(crate) unsafe fn quantize_range(
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
    /// The same operations sixteen lanes at a time: `vmaxps` returns its second operand
    /// when the first is NaN, as `f32::max` skips a NaN; the rounding is to nearest
    /// even; the result, a whole number in 0..=255, truncates to its byte exactly.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn avx512(x: *const f32, y: *mut u8, len: usize, scale: f32, zero_point: f32) {
        use std::arch::x86_64::*;
        let (s, lo, hi, z) = (
            _mm512_set1_ps(scale),
            _mm512_set1_ps(-zero_point),
            _mm512_set1_ps(255.0 - zero_point),
            _mm512_set1_ps(zero_point),
        );
        let whole = len / 16 * 16;
        for i in (0..whole).step_by(16) {
            // SAFETY: i + 16 <= len: inside both buffers.
            unsafe {
                let v = _mm512_div_ps(_mm512_loadu_ps(x.add(i)), s);
                let v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
                let v =
                    _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
                let q = _mm512_cvtps_epi32(_mm512_add_ps(v, z));
                _mm_storeu_si128(y.add(i) as *mut __m128i, _mm512_cvtepi32_epi8(q));
            }
        }
        // SAFETY: the tail of both buffers.
        unsafe { body(x.add(whole), y.add(whole), len - whole, scale, zero_point) }
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2(x: *const f32, y: *mut u8, len: usize, scale: f32, zero_point: f32) {
        // SAFETY: `body` asks only that `x` and `y` hold `len` elements, as this
        // function's caller guarantees; AVX2 just shapes the code generated for it.
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

/// Where an element's zero point is: one for all, or one per index `(e / inner) % len`
/// (a matrix's rows: inner = its columns; its columns: inner = 1).
#[derive(Debug, Clone, Copy)]
pub(crate) enum ZeroPointAt {
    All,
    Along { inner: usize, len: usize },
}

impl ZeroPointAt {
    /// The index of element `e`'s zero point.
    pub(crate) fn index(self, e: usize) -> usize {
        match self {
            ZeroPointAt::All => 0,
            ZeroPointAt::Along { inner, len } => (e / inner) % len,
        }
    }
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
    /// Columns of a patch: kernel taps × channels.
    pub(crate) fn depth(&self) -> usize {
        self.channels * self.taps()
    }
    pub(crate) fn taps(&self) -> usize {
        self.kernel.iter().product()
    }
    /// Rows of the patch matrix: output positions.
    pub(crate) fn positions(&self) -> usize {
        self.output.iter().product()
    }
    pub(crate) fn input_plane(&self) -> usize {
        self.input.iter().product()
    }
}

/// Elements of the image per parallel task of [`channels_last`].
const PIXELS: usize = 1024;

/// The 8-bit image `x` (`channels` planes) channels-last in `out` (`plane × channels`),
/// each byte as the signed b' of [`super::qgemm`] (u8 flipped to `b − 128`), so that a
/// patch's taps are runs of `channels` bytes; and each pixel's Σb' in `sums`, so that a
/// patch's sum is one addition per tap.
///
/// # Safety
/// `x` readable for `channels` planes, `out` writable for as many bytes, `sums` for
/// one i32 per pixel.
pub(crate) unsafe fn channels_last(
    g: &ConvGeometry,
    x: *const u8,
    kind: Bytes,
    out: *mut u8,
    sums: *mut i32,
    pool: Option<&Pool>,
) {
    let (plane, c) = (g.input_plane(), g.channels);
    let flip = match kind {
        Bytes::U8 => 0x80u8,
        Bytes::I8 => 0,
    };
    let (xp, op, sp) = (SyncPtr(x as *mut u8), SyncPtr(out), SyncPtr(sums));
    for_ranges(pool, plane.div_ceil(PIXELS), PIXELS * c, &|r| {
        let (start, end) = (r.start * PIXELS, (r.end * PIXELS).min(plane));
        // Pixel by pixel: the writes run on, the sum stays in a register, and the reads
        // (one stream per channel) stay in L1 for the 64 pixels of a line.
        for p in start..end {
            let mut sum = 0i32;
            for ch in 0..c {
                // SAFETY: p < plane and ch < channels: inside both buffers; each task
                // writes its own pixels.
                unsafe {
                    let v = *xp.get().add(ch * plane + p) ^ flip;
                    *op.get().add(p * c + ch) = v;
                    sum += v as i8 as i32;
                }
            }
            // SAFETY: p < plane: this task's pixel.
            unsafe { *sp.get().add(p) = sum };
        }
    });
}

/// The patch matrix of a channels-last image ([`channels_last`]) written straight into
/// a packed B of the integer GEMM: column p (an output position) holds, tap by tap
/// (depth, height, width), the `channels` bytes under it, and `beta` (the zero point's
/// b': padding is the zero point) where the tap falls in the padding; each column's
/// β is `beta` and its Σb' the sum of its taps' pixel sums.
///
/// # Safety
/// `image` readable for plane × channels bytes and `pixel_sums` for plane i32 (as
/// [`channels_last`] wrote them); `b` a packed B of depth × positions in writable memory.
pub(crate) unsafe fn im2col_packed(
    g: &ConvGeometry,
    image: *const u8,
    pixel_sums: *const i32,
    beta: i32,
    b: &BView,
    pool: Option<&Pool>,
) {
    let (c, taps, depth) = (g.channels, g.taps(), g.depth());
    let kp = padded_k(depth);
    let positions = g.positions();
    let (ip, sp) = (SyncPtr(image as *mut u8), SyncPtr(pixel_sums as *mut i32));
    let pad_sum = beta.wrapping_mul(c as i32);
    let source = |o: usize, k: usize, axis: usize| -> Option<usize> {
        let p = (o * g.stride[axis] + k * g.dilation[axis]) as isize - g.pad_begin[axis] as isize;
        (0..g.input[axis] as isize)
            .contains(&p)
            .then_some(p as usize)
    };
    // Whole 4-byte groups per tap when the channels fill them.
    let words = c % 4 == 0;
    let pad_word = u32::from_ne_bytes([beta as u8; 4]);
    for_ranges(pool, positions.div_ceil(NR), NR * kp, &|panels| {
        for panel in panels {
            let (data, sums, betas) = b.panel_mut(panel);
            let data = SyncPtr(data as *mut u8);
            // SAFETY: `panel < ⌈positions/32⌉`: its kp·32 bytes lie inside the packed B
            // (the contract), and `for_ranges` gives this task its panels alone.
            unsafe { std::ptr::write_bytes(data.get(), 0, kp * NR) };
            // The position and the tap advance by counters: no division per byte.
            let p0 = panel * NR;
            let (mut od, mut oh, mut ow) = (
                p0 / (g.output[1] * g.output[2]),
                (p0 / g.output[2]) % g.output[1],
                p0 % g.output[2],
            );
            for lane in 0..NR {
                let p = p0 + lane;
                let mut sum = 0i32;
                if p < positions {
                    // SAFETY: `lane < 32`: column lane's bytes start at 4·lane in the panel.
                    let column = unsafe { data.get().add(lane * 4) };
                    let (mut kd, mut kh, mut kw) = (0, 0, 0);
                    for tap in 0..taps {
                        let src = match (source(od, kd, 0), source(oh, kh, 1), source(ow, kw, 2)) {
                            (Some(id), Some(ih), Some(iw)) => {
                                let pixel = (id * g.input[1] + ih) * g.input[2] + iw;
                                // SAFETY: `source` kept (id, ih, iw) inside the input, so
                                // `pixel < plane`, whose sums the contract makes readable.
                                sum = sum.wrapping_add(unsafe { *sp.get().add(pixel) });
                                // SAFETY: the pixel's `c` channel bytes lie in the image.
                                Some(unsafe { ip.get().add(pixel * c) })
                            }
                            _ => {
                                sum = sum.wrapping_add(pad_sum);
                                None
                            }
                        };
                        let k0 = tap * c;
                        if words {
                            for w in 0..c / 4 {
                                let v = match src {
                                    // SAFETY: `4·w + 4 <= c`: four of the pixel's channel bytes.
                                    Some(s) => unsafe {
                                        (s.add(4 * w) as *const u32).read_unaligned()
                                    },
                                    None => pad_word,
                                };
                                // SAFETY: K index k0 + 4·w < taps·c = depth <= kp: group
                                // k0/4 + w of the panel's column lane, inside its kp·32 bytes.
                                unsafe {
                                    (column.add((k0 / 4 + w) * NR * 4) as *mut u32)
                                        .write_unaligned(v)
                                };
                            }
                        } else {
                            for e in 0..c {
                                // SAFETY: `e < c`: one of the pixel's channel bytes.
                                let v = src.map_or(beta as u8, |s| unsafe { *s.add(e) });
                                let kk = k0 + e;
                                // SAFETY: `kk < depth <= kp`: byte kk % 4 of group kk / 4 of
                                // column lane, inside the panel.
                                unsafe { *column.add((kk / 4) * NR * 4 + kk % 4) = v };
                            }
                        }
                        kw += 1;
                        if kw == g.kernel[2] {
                            kw = 0;
                            kh += 1;
                            if kh == g.kernel[1] {
                                kh = 0;
                                kd += 1;
                            }
                        }
                    }
                    ow += 1;
                    if ow == g.output[2] {
                        ow = 0;
                        oh += 1;
                        if oh == g.output[1] {
                            oh = 0;
                            od += 1;
                        }
                    }
                }
                // SAFETY: `lane < 32`: the panel's Σb' and β slots of column lane.
                unsafe {
                    *sums.add(lane) = sum;
                    *betas.add(lane) = if p < positions { beta } else { 0 };
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
    fn every_isa_quantizes_as_the_reference() {
        let mut x: Vec<f32> = (0..100)
            .map(|i| ((i * 37) % 61) as f32 * 0.25 - 7.0)
            .collect();
        x[5] = f32::NAN;
        x[20] = f32::INFINITY;
        x[21] = f32::NEG_INFINITY;
        x[22] = 1e30;
        for (scale, zero_point) in [(0.1f32, 0.0f32), (0.05, 128.0), (0.5, 255.0), (3.0, 7.0)] {
            for isa in [Isa::Portable, Isa::Avx2, Isa::Avx512] {
                if isa > isa::detected() {
                    continue;
                }
                let mut y = vec![0u8; x.len()];
                // SAFETY: both buffers hold x.len() elements; the ISA is present.
                unsafe {
                    quantize_range(isa, x.as_ptr(), y.as_mut_ptr(), x.len(), scale, zero_point)
                };
                for (i, (&v, &q)) in x.iter().zip(&y).enumerate() {
                    let want = dynamic_quantize_one(v, scale, zero_point);
                    assert_eq!(q, want, "{isa:?} element {i} = {v}, scale {scale}");
                }
            }
        }
    }

    #[test]
    fn every_isa_finds_the_range() {
        for len in [0usize, 1, 15, 64, 100, 1000] {
            for shift in [0.0f32, 5.0, -5.0] {
                let mut x: Vec<f32> = (0..len)
                    .map(|i| ((i * 37) % 61) as f32 * 0.25 - 7.0 + shift)
                    .collect();
                if len > 10 {
                    x[len / 2] = f32::NAN;
                    x[3] = f32::NAN;
                }
                let hi = x.iter().fold(0.0f32, |a, &b| a.max(b));
                let lo = x.iter().fold(0.0f32, |a, &b| a.min(b));
                for isa in [Isa::Portable, Isa::Avx2, Isa::Avx512] {
                    if isa > isa::detected() {
                        continue;
                    }
                    // SAFETY: x holds len floats; the ISA is present.
                    let got = unsafe { range_of(isa, x.as_ptr(), len) };
                    assert_eq!(got, (lo, hi), "{isa:?} len {len} shift {shift}");
                }
            }
        }
    }

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
}
