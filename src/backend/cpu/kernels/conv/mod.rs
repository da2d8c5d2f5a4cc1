//! Convolutions. The kernels are 2-D: a 1-D convolution is a 2-D one of one row (and a
//! 2-D one over one column runs as a row, see the CPU step), a 3-D one is a depth axis
//! ([`Depth`]) over 2-D planes, run by im2col + GEMM.
//!
//! The paths, all fusing bias, a residual and an activation:
//! - [`blocked`]: direct convolution on NCHW16c tensors with weights packed at compile
//!   time (group 1; a grouped convolution whose groups hold whole 16-channel blocks runs
//!   one group-1 convolution per group, see the CPU step) ([`PackedConv`]) and AVX-512 and AVX2+FMA register-blocked micro-kernels
//!   (a strided unpadded 1×1 convolution runs at stride 1 over its input pixels copied
//!   compact: [`ConvShape::subsampled`], [`blocked::subsample`]);
//! - [`depthwise`]: direct depthwise convolution on NCHW16c tensors (one channel per
//!   group), weights packed at compile time ([`PackedDepthwise`]), AVX-512, AVX2 and
//!   portable micro-kernels;
//! - [`winograd`]: Winograd F(2×2, 3×3) / F(4×4, 3×3) for 3×3 stride-1 convolutions on
//!   NCHW16c tensors, weights transformed at compile time ([`PackedWinograd`]);
//! - [`direct`]: NCHW tensors whose groups have few output channels (up to
//!   [`DIRECT_MAX_GROUP_OC`]), vectorized along the output row over an input copied
//!   padded and split into stride phases;
//! - [`plain`]: NCHW tensors with any groups by im2col + [`super::gemm::gemm`] (1×1,
//!   stride-1, unpadded convolutions read the input directly); convolutions with one
//!   input channel per group (depthwise) run a direct kernel instead; 3-D convolutions
//!   gather their depth taps into the same im2col matrix, a chunk of output planes at a
//!   time.
pub mod blocked;
pub mod depthwise;
pub mod direct;
pub mod plain;
pub mod winograd;

#[cfg(test)]
mod tests;

pub use blocked::{conv_blocked, conv_blocked_isa, micro_tile, subsample, PackedConv, BLOCK};
pub use depthwise::{conv_depthwise_blocked, conv_depthwise_blocked_isa, PackedDepthwise};
#[cfg(test)]
use direct::DIRECT_MAX_GROUP_OC;
pub use direct::{conv_direct, conv_direct_isa, conv_direct_scratch_len, direct_supported};
pub use plain::{
    conv_depthwise, conv_im2col, conv_im2col_volume, conv_plain, conv_plain_scratch_len,
    conv_volume_scratch_len,
};
pub use winograd::{conv_winograd, conv_winograd_isa, winograd_supported, PackedWinograd};

/// The geometry of a 2-D convolution of an [N, IC, IH, IW] input with [OC, IC/groups,
/// KH, KW] weights into [N, OC, OH, OW]. The bottom/right pads are implied by `oh`/`ow`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvShape {
    pub n: usize,
    pub ic: usize,
    pub ih: usize,
    pub iw: usize,
    pub oc: usize,
    pub kh: usize,
    pub kw: usize,
    pub oh: usize,
    pub ow: usize,
    /// [vertical, horizontal]
    pub strides: [usize; 2],
    /// Top and left pads.
    pub pad_top: usize,
    pub pad_left: usize,
    /// [vertical, horizontal]
    pub dilations: [usize; 2],
    pub groups: usize,
}

impl ConvShape {
    /// Validates a convolution and computes its output size like ONNX `Conv`:
    /// `o = (i + pad_begin + pad_end - dilation·(k-1) - 1) / stride + 1`.
    /// `pads` is [top, left, bottom, right].
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        n: usize,
        ic: usize,
        [ih, iw]: [usize; 2],
        oc: usize,
        [kh, kw]: [usize; 2],
        strides: [usize; 2],
        pads: [usize; 4],
        dilations: [usize; 2],
        groups: usize,
    ) -> Result<ConvShape, String> {
        if groups == 0
            || ic == 0
            || oc == 0
            || !ic.is_multiple_of(groups)
            || !oc.is_multiple_of(groups)
        {
            return Err(format!(
                "conv: {ic} input and {oc} output channels do not split into {groups} groups"
            ));
        }
        if kh == 0 || kw == 0 {
            return Err(format!("conv: empty kernel {kh}×{kw}"));
        }
        if strides.contains(&0) || dilations.contains(&0) {
            return Err("conv: strides and dilations must be positive".into());
        }
        let oh = output_extent(ih, [pads[0], pads[2]], kh, strides[0], dilations[0])?;
        let ow = output_extent(iw, [pads[1], pads[3]], kw, strides[1], dilations[1])?;
        Ok(ConvShape {
            n,
            ic,
            ih,
            iw,
            oc,
            kh,
            kw,
            oh,
            ow,
            strides,
            pad_top: pads[0],
            pad_left: pads[1],
            dilations,
            groups,
        })
    }

    /// Multiply-adds times two: the conventional FLOP count.
    pub fn flops(&self) -> f64 {
        2.0 * (self.n * self.oc * self.oh * self.ow) as f64
            * (self.ic / self.groups * self.kh * self.kw) as f64
    }

    /// Checks plain [OC, IC/groups, KH, KW] weights and an optional [OC] bias against
    /// this shape (what every weight packer takes).
    pub(crate) fn check_weights(&self, w: &[f32], bias: Option<&[f32]>) -> Result<(), String> {
        let icg = self.ic / self.groups;
        if w.len() != self.oc * icg * self.kh * self.kw {
            return Err(format!(
                "conv weights hold {} values, expected {}×{}×{}×{}",
                w.len(),
                self.oc,
                icg,
                self.kh,
                self.kw
            ));
        }
        match bias {
            Some(b) if b.len() != self.oc => Err(format!(
                "conv bias holds {} values, expected {}",
                b.len(),
                self.oc
            )),
            _ => Ok(()),
        }
    }

    /// A 1×1, stride-1, unpadded convolution reads and writes each channel's H·W pixels
    /// contiguously, so any split of them into rows computes the same thing: this returns
    /// the shape with the rows the direct kernel fills best, for its micro-tile of `tile`
    /// pixels of one row ([`blocked::micro_tile`]: with 6, a 7-wide row wastes most of its
    /// second tile, while 49 pixels in one row fill eight). Other shapes are returned
    /// unchanged.
    pub fn pointwise_rows(&self, tile: usize) -> ConvShape {
        let pixels = self.oh * self.ow;
        if self.kh != 1 || self.kw != 1 || self.strides != [1, 1] || self.oh != self.ih {
            return *self;
        }
        if self.ow != self.iw || self.pad_top != 0 || self.pad_left != 0 || pixels == 0 {
            return *self;
        }
        // Rows of at most 128 pixels (a row's input stays in L1 across its tiles): the
        // divisor of H·W with the fewest micro-tile calls, then the longest row.
        let calls = |w: usize| (pixels / w) * w.div_ceil(tile);
        let best = (1..=pixels.min(128))
            .filter(|w| pixels.is_multiple_of(*w))
            .min_by_key(|&w| (calls(w), usize::MAX - w))
            .unwrap_or(self.ow);
        if calls(best) >= calls(self.ow) {
            return *self;
        }
        ConvShape {
            ih: pixels / best,
            iw: best,
            oh: pixels / best,
            ow: best,
            ..*self
        }
    }

    /// A 1×1 convolution at a stride above 1 without padding reads one input pixel in
    /// stride²: this returns it as the stride-1 convolution over those pixels, copied
    /// compact by [`blocked::subsample`], so its rows run full micro-tiles at a unit
    /// pixel stride (as oneDNN's reduce-to-unit-stride does). Other shapes: None.
    pub fn subsampled(&self) -> Option<ConvShape> {
        let [sh, sw] = self.strides;
        let pointwise = self.kh == 1 && self.kw == 1 && self.groups == 1;
        let unpadded = self.pad_top == 0 && self.pad_left == 0;
        let inside = self.oh > 0
            && self.ow > 0
            && (self.oh - 1) * sh < self.ih
            && (self.ow - 1) * sw < self.iw;
        (pointwise && unpadded && inside && self.strides != [1, 1]).then_some(ConvShape {
            ih: self.oh,
            iw: self.ow,
            strides: [1, 1],
            dilations: [1, 1],
            ..*self
        })
    }

    /// The contiguous range of kernel rows (and the first input row) whose input row is
    /// inside the image for output row `oy`: (kh0, kh1, iy of kh0).
    pub(crate) fn kh_range(&self, oy: usize) -> (usize, usize, usize) {
        valid_taps(
            oy * self.strides[0],
            self.pad_top,
            self.kh,
            self.dilations[0],
            self.ih,
        )
    }

    /// Like [`Self::kh_range`] for output column `ox`.
    pub(crate) fn kw_range(&self, ox: usize) -> (usize, usize, usize) {
        valid_taps(
            ox * self.strides[1],
            self.pad_left,
            self.kw,
            self.dilations[1],
            self.iw,
        )
    }

    /// The output columns [lo, hi) whose every kernel column is inside the image.
    pub(crate) fn interior_cols(&self) -> (usize, usize) {
        let (s, p, d) = (self.strides[1], self.pad_left, self.dilations[1]);
        let lo = p.div_ceil(s).min(self.ow);
        let reach = (self.kw - 1) * d; // ox·s - p + reach <= iw - 1
        let hi = if self.iw + p > reach {
            ((self.iw - 1 + p - reach) / s + 1).min(self.ow)
        } else {
            0
        };
        (lo, hi.max(lo))
    }
}

/// The output length of a convolution along one axis, like ONNX `Conv`:
/// `(i + pad_begin + pad_end - dilation·(k-1) - 1) / stride + 1`.
fn output_extent(
    i: usize,
    [p0, p1]: [usize; 2],
    k: usize,
    s: usize,
    d: usize,
) -> Result<usize, String> {
    if k == 0 || s == 0 || d == 0 {
        return Err("conv: kernels, strides and dilations must be positive".into());
    }
    let span = d
        .checked_mul(k - 1)
        .and_then(|v| v.checked_add(1))
        .ok_or("conv: kernel extent overflows")?;
    let padded = i
        .checked_add(p0)
        .and_then(|v| v.checked_add(p1))
        .ok_or("conv: padded extent overflows")?;
    if padded < span {
        return Err(format!(
            "conv: the kernel extent {span} exceeds the padded input {padded}"
        ));
    }
    Ok((padded - span) / s + 1)
}

/// The depth axis of a 3-D convolution over 2-D planes ([`ConvShape`] describes one
/// plane); 1-D and 2-D convolutions have the flat depth: one plane, one tap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Depth {
    pub input: usize,
    pub kernel: usize,
    pub output: usize,
    pub stride: usize,
    /// The front pad: output plane `o` starts at input plane `o·stride - pad`.
    pub pad: usize,
    pub dilation: usize,
}

impl Depth {
    pub const FLAT: Depth = Depth {
        input: 1,
        kernel: 1,
        output: 1,
        stride: 1,
        pad: 0,
        dilation: 1,
    };

    /// A convolution's depth axis, its output length computed like [`ConvShape::new`]'s.
    pub fn new(
        input: usize,
        kernel: usize,
        stride: usize,
        pads: [usize; 2],
        dilation: usize,
    ) -> Result<Depth, String> {
        Ok(Depth {
            input,
            kernel,
            output: output_extent(input, pads, kernel, stride, dilation)?,
            stride,
            pad: pads[0],
            dilation,
        })
    }

    /// Whether output plane `o` reads input plane `o` alone (every plane maps to itself).
    pub fn is_identity(&self) -> bool {
        self.kernel == 1 && self.stride == 1 && self.pad == 0 && self.output == self.input
    }

    /// The input plane kernel tap `t` of output plane `o` reads, if inside the volume.
    pub fn input_plane(&self, o: usize, t: usize) -> Option<usize> {
        (o * self.stride + t * self.dilation)
            .checked_sub(self.pad)
            .filter(|&i| i < self.input)
    }
}

/// Taps t in [t0, t1) with `0 <= base + t·d - pad < extent`, and the input index of t0.
fn valid_taps(base: usize, pad: usize, k: usize, d: usize, extent: usize) -> (usize, usize, usize) {
    // t0: the first t with base + t·d >= pad.
    let t0 = if base >= pad {
        0
    } else {
        (pad - base).div_ceil(d)
    };
    // t1: one past the last t with base + t·d < pad + extent.
    let lim = pad + extent; // base + t·d < lim
    let t1 = if base >= lim {
        0
    } else {
        (lim - base).div_ceil(d)
    };
    let (t0, t1) = (t0.min(k), t1.min(k));
    if t1 <= t0 {
        return (0, 0, 0);
    }
    (t0, t1, base + t0 * d - pad)
}
