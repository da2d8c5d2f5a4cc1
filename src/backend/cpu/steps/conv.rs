//! Convolutions (`Conv`, `FusedConv`) of 1 to 3 spatial axes: blocked NCHW16c ones by
//! the direct kernel with weights packed at compile time (group 1, or per group when
//! the groups are whole channel blocks) or the blocked depthwise kernel (one channel
//! per group), plain NCHW ones (any groups)
//! by im2col + GEMM or, with one input channel per group, the direct depthwise kernel.
//! Where a shape has several algorithms, [`tune::choose`] picks (cost model, tune cache
//! or measurement). The kernels are 2-D: a 1-D convolution is one row, a 2-D one over
//! a single column (W = 1, a 1×1-wide kernel) runs as a row (the same bytes, and the
//! kernels tile along rows), and a 3-D one adds a depth axis to im2col.
use crate::aligned::AlignedBuf;
use crate::backend::cpu::kernels::conv::{
    self, micro_tile, ConvShape, Depth, PackedConv, PackedDepthwise, PackedWinograd,
};
use crate::backend::cpu::kernels::Act;
use crate::backend::cpu::pool::Pool;
use crate::backend::cpu::program::{Cx, Kernel, Loc, Slot};
use crate::backend::cpu::tune::{self, Choice};
use crate::ir::Attrs;

use super::Build;

struct Blocked {
    algo: BlockedAlgo,
    /// The algorithm's scratch in the step scratch region (Winograd's transformed
    /// tiles, per thread), if it needs any.
    scratch: Option<Loc>,
    x: Slot,
    z: Option<Slot>,
    y: Slot,
    act: Act,
}

/// The algorithms for a blocked convolution.
enum BlockedAlgo {
    Direct(PackedConv),
    /// A strided 1×1 convolution (the `ConvShape`) as the direct one at stride 1 over
    /// its input pixels, copied compact to the scratch first.
    Subsampled(PackedConv, ConvShape),
    Winograd(PackedWinograd),
    /// One channel per group.
    Depthwise(PackedDepthwise),
    /// Groups of whole channel blocks: a group's channels are contiguous in each image
    /// of an NCHW16c tensor, so each group runs as its own group-1 convolution.
    Grouped(Grouped),
}

/// A grouped blocked convolution: one group-1 algorithm (of one image) per group.
struct Grouped {
    per_group: Vec<BlockedAlgo>,
    images: usize,
    /// Floats of one group's input and output slice of one image.
    x_group: usize,
    y_group: usize,
}

impl BlockedAlgo {
    /// # Safety
    /// As [`conv::conv_blocked`].
    /// `scratch` must hold [`Self::scratch_bytes`].
    unsafe fn run(
        &self,
        pool: Option<&Pool>,
        x: *const f32,
        z: Option<*const f32>,
        y: *mut f32,
        act: Act,
        scratch: *mut f32,
    ) {
        match self {
            // SAFETY: x, z and y are sized for `p` (this fn's contract).
            BlockedAlgo::Direct(p) => unsafe { conv::conv_blocked(pool, p, x, z, y, act) },
            BlockedAlgo::Subsampled(p, s) => {
                // SAFETY: x is the strided conv `s`'s input; scratch holds scratch_bytes =
                // p.x_len() floats, the compact input, apart from x.
                unsafe { conv::subsample(pool, s, x, scratch) };
                // SAFETY: scratch now holds the stride-1 conv `p`'s x_len floats; z and y
                // are its output's size, apart from scratch.
                unsafe { conv::conv_blocked(pool, p, scratch, z, y, act) }
            }
            // SAFETY: x, z, y as `conv_winograd` asks; scratch holds the
            // `p.scratch_len(threads)` floats of `scratch_bytes`.
            BlockedAlgo::Winograd(p) => unsafe {
                conv::conv_winograd(pool, p, x, z, y, act, scratch)
            },
            // SAFETY: x holds `p.x_len()` floats, y and z `p.y_len()` (the contract).
            BlockedAlgo::Depthwise(p) => unsafe {
                conv::conv_depthwise_blocked(pool, p, x, z, y, act)
            },
            BlockedAlgo::Grouped(g) => {
                let groups = g.per_group.len();
                for image in 0..g.images {
                    for (i, algo) in g.per_group.iter().enumerate() {
                        let (xo, yo) = (
                            (image * groups + i) * g.x_group,
                            (image * groups + i) * g.y_group,
                        );
                        // SAFETY: x holds `images` images of `groups` input slices and
                        // y, z as many output slices (the contract, at the whole
                        // shape's sizes), each slice what `algo` (of one image) reads
                        // or writes; the algorithms run one after another, so the
                        // shared scratch (the largest's) is theirs in turn.
                        unsafe {
                            algo.run(
                                pool,
                                x.add(xo),
                                z.map(|z| z.add(yo)),
                                y.add(yo),
                                act,
                                scratch,
                            )
                        }
                    }
                }
            }
        }
    }

    fn scratch_bytes(&self, pool: Option<&Pool>) -> usize {
        match self {
            BlockedAlgo::Direct(_) | BlockedAlgo::Depthwise(_) => 0,
            BlockedAlgo::Winograd(p) => p.scratch_len(pool.map_or(1, Pool::threads)) * 4,
            BlockedAlgo::Subsampled(p, _) => p.x_len() * 4,
            BlockedAlgo::Grouped(g) => g
                .per_group
                .iter()
                .map(|a| a.scratch_bytes(pool))
                .max()
                .unwrap_or(0),
        }
    }
}

/// A grouped convolution whose groups are whole channel blocks, as one group-1
/// algorithm per group (each chosen like a group-1 conv's: Winograd where it wins).
fn grouped(
    b: &Build,
    shape: ConvShape,
    w: &[f32],
    bias: Option<&[f32]>,
    act: Act,
    residual: bool,
) -> Result<BlockedAlgo, String> {
    let groups = shape.groups;
    let (icg, ocg) = (shape.ic / groups, shape.oc / groups);
    if !icg.is_multiple_of(conv::BLOCK) || !ocg.is_multiple_of(conv::BLOCK) {
        return Err(format!(
            "a blocked grouped conv needs whole blocks of {} channels per group, not {icg} \
             in and {ocg} out",
            conv::BLOCK
        ));
    }
    shape.check_weights(w, bias)?;
    let one = ConvShape {
        n: 1,
        ic: icg,
        oc: ocg,
        groups: 1,
        ..shape
    };
    let w_group = ocg * icg * shape.kh * shape.kw;
    let per_group = (0..groups)
        .map(|i| {
            let w = &w[i * w_group..(i + 1) * w_group];
            let bias = bias.map(|b| &b[i * ocg..(i + 1) * ocg]);
            choose_blocked(b, one, false, w, bias, act, residual)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(BlockedAlgo::Grouped(Grouped {
        per_group,
        images: shape.n,
        x_group: icg * shape.ih * shape.iw,
        y_group: ocg * shape.oh * shape.ow,
    }))
}

/// The blocked algorithm for `shape`: the tune cache's or measured winner, else the cost
/// model's.
fn choose_blocked(
    b: &Build,
    shape: ConvShape,
    plain_x: bool,
    w: &[f32],
    bias: Option<&[f32]>,
    act: Act,
    residual: bool,
) -> Result<BlockedAlgo, String> {
    let candidates: &[&'static str] = if conv::winograd_supported(&shape) && !plain_x {
        &["direct", "winograd2", "winograd4"]
    } else {
        &["direct"]
    };
    let make = |name: &str| -> Result<BlockedAlgo, String> {
        let winograd = |m| -> Result<BlockedAlgo, String> {
            let p = PackedWinograd::new(shape, m, w, bias)?;
            Ok(BlockedAlgo::Winograd(p))
        };
        match name {
            "direct" => Ok(match shape.subsampled().filter(|_| !plain_x) {
                Some(unit) => BlockedAlgo::Subsampled(
                    PackedConv::new(unit.pointwise_rows(micro_tile(unit.oc)), w, bias)?,
                    shape,
                ),
                None => BlockedAlgo::Direct(
                    PackedConv::new(shape.pointwise_rows(micro_tile(shape.oc)), w, bias)?
                        .with_plain_x(plain_x),
                ),
            }),
            "winograd2" => winograd(2),
            "winograd4" => winograd(4),
            other => Err(format!("no blocked conv algorithm {other:?}")),
        }
    };
    if candidates.len() == 1 {
        return make(candidates[0]);
    }
    let built = if b.tuning.measure {
        candidates
            .iter()
            .map(|c| make(c))
            .collect::<Result<Vec<_>, _>>()?
    } else {
        vec![]
    };
    let choice = Choice {
        key: key(&shape, "nchw16c"),
        candidates,
        model: blocked_model(&shape, candidates),
    };
    let (x_len, y_len) = (
        blocked_len(&shape, shape.ic, shape.ih * shape.iw),
        blocked_len(&shape, shape.oc, shape.oh * shape.ow),
    );
    let scratch_bytes = built.iter().map(|a| a.scratch_bytes(b.pool)).max();
    let mut trial = None;
    let (i, _) = tune::choose(b.tuning, b.pool, &choice, &mut |i| {
        let t = trial.get_or_insert_with(|| -> crate::Result<_> {
            let scratch = AlignedBuf::try_zeroed(scratch_bytes.unwrap_or(0))?;
            Ok((Trial::new(x_len, y_len, residual)?, scratch))
        });
        // Without its buffers nothing is timed; the error is returned after the choice.
        let Ok(t) = t else {
            return;
        };
        let (xp, zp, yp) = t.0.ptrs();
        let scratch = t.1.as_mut_ptr() as *mut f32;
        // SAFETY: the trial buffers have the packed conv's lengths, the scratch the
        // largest candidate's.
        unsafe { built[i].run(b.pool, xp, zp, yp, act, scratch) }
    });
    if let Some(Err(e)) = trial {
        return Err(format!("timing the convolution's algorithms: {e}"));
    }
    match built.into_iter().nth(i) {
        Some(algo) => Ok(algo),
        None => make(candidates[i]),
    }
}

/// The cost model: Winograd for 3×3 stride-1 convolutions, F(4,3) when the image has
/// enough 4×4 tiles to amortize its 36 transformed weight matrices, F(2,3) down to 8×8
/// output pixels, and the direct kernel below that: there (ResNet-50's 7×7 stage at
/// batch 1) the 16 transformed weight matrices, each used by a dozen tiles, stream
/// 16/9 of the direct kernel's weight bytes from memory, and F(2,3) ran at 49 % of the
/// FMA peak where the direct kernel runs at ~60 %. The measurements behind the
/// thresholds are in `bench/RESULTS.md`.
fn blocked_model(s: &ConvShape, candidates: &[&str]) -> usize {
    let pixels = s.n * s.oh * s.ow;
    let pick = if s.oh * s.ow >= 12 * 12 {
        "winograd4"
    } else if pixels >= 8 * 8 {
        "winograd2"
    } else {
        "direct"
    };
    candidates.iter().position(|c| *c == pick).unwrap_or(0)
}

/// Floats of an NCHW16c tensor of `channels` × `pixels` per image.
fn blocked_len(s: &ConvShape, channels: usize, pixels: usize) -> usize {
    s.n * channels.div_ceil(conv::BLOCK) * pixels * conv::BLOCK
}

struct Plain {
    shape: ConvShape,
    /// [`Depth::FLAT`] unless 3-D (then the algorithm is im2col).
    depth: Depth,
    algo: PlainAlgo,
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

#[derive(Clone, Copy)]
enum PlainAlgo {
    Im2col,
    /// One input channel per group.
    Depthwise,
    /// Few output channels per group ([`conv::direct_supported`]).
    Direct,
}

/// The spatial sizes of [N, C, spatial...] or blocked [N, CB, spatial..., b].
fn spatial(t: &[usize], blocked: bool) -> Option<&[usize]> {
    t.get(2..t.len().saturating_sub(usize::from(blocked)))
}

/// One spatial axis of a window: the input's and kernel's sizes along it and its
/// attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Axis {
    pub input: usize,
    pub kernel: usize,
    pub stride: usize,
    /// Begin and end.
    pub pads: [usize; 2],
    pub dilation: usize,
}

impl Axis {
    const UNIT: Axis = Axis {
        input: 1,
        kernel: 1,
        stride: 1,
        pads: [0, 0],
        dilation: 1,
    };

    /// One position, one tap, no padding: the axis changes nothing.
    fn is_trivial(&self) -> bool {
        self.input == 1 && self.kernel == 1 && self.pads == [0, 0]
    }
}

/// The axes of a window over spatial sizes `input` with kernel sizes `kernel` (1 to 3
/// axes) and the ONNX attributes `strides`, `pads`, `dilations`, as [depth, rows,
/// columns]: fewer axes are padded in front with unit ones. `None` for other ranks.
pub(super) fn window_axes(
    attrs: &Attrs,
    input: &[usize],
    kernel: &[usize],
) -> Result<Option<[Axis; 3]>, String> {
    let r = input.len();
    if !(1..=3).contains(&r) || kernel.len() != r {
        return Ok(None);
    }
    // The catalogue's windows: auto_pad resolved against the static input.
    let input_dims: Vec<Option<usize>> = input.iter().map(|&n| Some(n)).collect();
    let windows = crate::ir::ops::conv::windows(attrs, kernel, &input_dims)?;
    let mut axes = [Axis::UNIT; 3];
    for (i, w) in windows.iter().enumerate() {
        axes[3 - r + i] = Axis {
            input: input[i],
            kernel: w.kernel,
            stride: w.stride,
            pads: [w.pad_begin, w.pad_end],
            dilation: w.dilation,
        };
    }
    Ok(Some(axes))
}

/// A node like `b`'s with attributes `attrs`, built as `b` would be.
pub(super) fn build_with_attrs(
    b: &Build,
    attrs: Attrs,
    build: super::Builder,
) -> Result<Option<Box<dyn Kernel>>, String> {
    let mut node = b.node.clone();
    node.attrs = attrs;
    build(&Build { node: &node, ..*b })
}

pub(crate) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let op = b.node.op.as_str();
    if !matches!(op, "Conv" | "FusedConv") || !b.all_f32() {
        return Ok(None);
    }
    let attrs = &b.node.attrs;
    let block = attrs.int_or("block", 0)? as usize;
    // X stays NCHW under a blocked Y (a first layer's few channels).
    let plain_x = block > 0 && attrs.int_or("plain_x", 0)? != 0;
    let (x, w, y) = (
        b.input(0).ok_or("missing X")?,
        b.input(1).ok_or("missing W")?,
        &b.outs[0],
    );
    let (Some(xs), Some(ys)) = (
        spatial(&x.shape, block > 0 && !plain_x),
        spatial(&y.shape, block > 0),
    ) else {
        return Ok(None);
    };
    if w.shape.len() != xs.len() + 2 || (block != 0 && (block != conv::BLOCK || xs.len() > 2)) {
        return Ok(None);
    }
    let Some([d, mut h, mut wa]) = window_axes(attrs, xs, &w.shape[2..])? else {
        return Ok(None);
    };
    if wa.is_trivial() && !h.is_trivial() {
        std::mem::swap(&mut h, &mut wa);
    }
    let group = attrs.int_or("group", 1)?;
    let group = usize::try_from(group).map_err(|_| format!("group {group} is negative"))?;
    let (n, oc, icg) = (x.shape[0], w.shape[0], w.shape[1]);
    let shape = ConvShape::new(
        n,
        icg.checked_mul(group)
            .ok_or("the channel count overflows")?,
        [h.input, wa.input],
        oc,
        [h.kernel, wa.kernel],
        [h.stride, wa.stride],
        [h.pads[0], wa.pads[0], h.pads[1], wa.pads[1]],
        [h.dilation, wa.dilation],
        group,
    )?;
    let depth = Depth::new(d.input, d.kernel, d.stride, d.pads, d.dilation)?;
    if ys.iter().product::<usize>() != depth.output * shape.oh * shape.ow {
        return Err(format!(
            "output {:?} is not {}×{}×{} pixels",
            y.shape, depth.output, shape.oh, shape.ow
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
        let w = wv.as_slice().expect("standard layout");
        let bias = bv.as_ref().map(|v| v.as_slice().expect("standard layout"));
        let depthwise = shape.ic == shape.groups && shape.oc == shape.groups;
        let algo = if shape.groups > 1 && depthwise && !plain_x {
            BlockedAlgo::Depthwise(PackedDepthwise::new(shape, w, bias)?)
        } else if shape.groups > 1 && !plain_x {
            grouped(b, shape, w, bias, act, z.is_some())?
        } else {
            choose_blocked(b, shape, plain_x, w, bias, act, z.is_some())?
        };
        let bytes = algo.scratch_bytes(b.pool);
        return Ok(Some(Box::new(Blocked {
            algo,
            scratch: (bytes > 0).then(|| b.scratch(bytes)),
            x: x.clone(),
            z,
            y: y.clone(),
            act,
        })));
    }
    let depthwise = shape.groups > 1 && shape.ic == shape.groups && depth == Depth::FLAT;
    let algo = if depthwise {
        let choice = Choice {
            key: key(&shape, "nchw"),
            candidates: &["depthwise", "im2col"],
            model: 0,
        };
        let (i, _) = tune::choose(b.tuning, b.pool, &choice, &mut |i| {
            let trial = Trial::new(
                shape.n * shape.ic * shape.ih * shape.iw,
                y.elements(),
                false,
            );
            // Without memory to time them the candidates go untimed: the choice only
            // affects speed, and the step's own buffers are allocated (and checked) later.
            let (Ok(mut t), Ok(w)) = (trial, Trial::filled(w.elements())) else {
                return;
            };
            let mut scratch = vec![0.0f32; conv::conv_plain_scratch_len(&shape)];
            let (xp, _, yp) = t.ptrs();
            let (p, s, wp) = (b.pool, &shape, w.as_ptr() as *const f32);
            // SAFETY: buffers sized per the kernels' contracts.
            unsafe {
                match i {
                    0 => conv::conv_depthwise(p, s, wp, None, xp, None, yp, act),
                    _ => conv::conv_im2col(p, s, wp, None, xp, None, yp, act, scratch.as_mut_ptr()),
                }
            }
        });
        if i == 0 {
            PlainAlgo::Depthwise
        } else {
            PlainAlgo::Im2col
        }
    } else if depth == Depth::FLAT && conv::direct_supported(&shape) {
        choose_direct(b, &shape, w.elements(), y.elements(), act)
    } else {
        PlainAlgo::Im2col
    };
    // Scratch: the im2col matrix or padded input, then (when aliased) the residual's copy.
    let im2col = match algo {
        PlainAlgo::Im2col => {
            (conv::conv_volume_scratch_len(&shape, &depth) * 4).next_multiple_of(64)
        }
        PlainAlgo::Direct => (conv::conv_direct_scratch_len(&shape) * 4).next_multiple_of(64),
        PlainAlgo::Depthwise => 0,
    };
    let aliased = z.as_ref().is_some_and(|z| z.loc == y.loc);
    let scratch = b.scratch(im2col + if aliased { y.bytes() } else { 0 });
    let z_copy = match scratch {
        Loc::Arena(at) if aliased => Some(Loc::Arena(at + im2col)),
        _ => None,
    };
    Ok(Some(Box::new(Plain {
        shape,
        depth,
        algo,
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

/// Direct or im2col for a plain convolution with few output channels per group: the
/// tune cache's or measured winner, else direct (the cost model: im2col's GEMM fills
/// at most 8 of its 16 tile rows there).
fn choose_direct(b: &Build, shape: &ConvShape, w_len: usize, y_len: usize, act: Act) -> PlainAlgo {
    let choice = Choice {
        key: key(shape, "nchw"),
        candidates: &["direct", "im2col"],
        model: 0,
    };
    let (i, _) = tune::choose(b.tuning, b.pool, &choice, &mut |i| {
        let x_len = shape.n * shape.ic * shape.ih * shape.iw;
        // Without memory to time them the candidates go untimed (as for depthwise).
        let (Ok(mut t), Ok(w)) = (Trial::new(x_len, y_len, false), Trial::filled(w_len)) else {
            return;
        };
        let scratch_len = match i {
            0 => conv::conv_direct_scratch_len(shape),
            _ => conv::conv_plain_scratch_len(shape),
        };
        let mut scratch = vec![0.0f32; scratch_len];
        let (xp, _, yp) = t.ptrs();
        let (p, s, wp, sp) = (
            b.pool,
            shape,
            w.as_ptr() as *const f32,
            scratch.as_mut_ptr(),
        );
        // SAFETY: buffers sized per the kernels' contracts, the scratch per candidate.
        unsafe {
            match i {
                0 => conv::conv_direct(p, s, wp, None, xp, None, yp, act, sp),
                _ => conv::conv_im2col(p, s, wp, None, xp, None, yp, act, sp),
            }
        }
    });
    if i == 0 {
        PlainAlgo::Direct
    } else {
        PlainAlgo::Im2col
    }
}

/// The problem a tune-cache entry is about: the geometry and the layout.
fn key(s: &ConvShape, layout: &str) -> String {
    format!(
        "conv {layout} n{} ic{} {}x{} oc{} k{}x{} o{}x{} s{}x{} p{},{} d{}x{} g{}",
        s.n,
        s.ic,
        s.ih,
        s.iw,
        s.oc,
        s.kh,
        s.kw,
        s.oh,
        s.ow,
        s.strides[0],
        s.strides[1],
        s.pad_top,
        s.pad_left,
        s.dilations[0],
        s.dilations[1],
        s.groups
    )
}

/// Buffers a candidate runs on while it is being timed (small finite values: the
/// speed of denormals or NaNs is not what is measured).
struct Trial {
    x: AlignedBuf,
    z: Option<AlignedBuf>,
    y: AlignedBuf,
}

impl Trial {
    fn new(x: usize, y: usize, residual: bool) -> crate::Result<Trial> {
        Ok(Trial {
            x: Trial::filled(x)?,
            z: residual.then(|| Trial::filled(y)).transpose()?,
            y: AlignedBuf::try_zeroed(y * 4)?,
        })
    }
    fn filled(floats: usize) -> crate::Result<AlignedBuf> {
        let mut b = AlignedBuf::try_zeroed(floats * 4)?;
        for (i, v) in b.as_mut_bytes().chunks_exact_mut(4).enumerate() {
            v.copy_from_slice(&(((i % 17) as f32 - 8.0) * 0.01).to_le_bytes());
        }
        Ok(b)
    }
    fn ptrs(&mut self) -> (*const f32, Option<*const f32>, *mut f32) {
        (
            self.x.as_ptr() as *const f32,
            self.z.as_ref().map(|z| z.as_ptr() as *const f32),
            self.y.as_mut_ptr() as *mut f32,
        )
    }
}

impl Kernel for Blocked {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let z = self.z.as_ref().map(|z| cx.f32(z));
        let scratch = self
            .scratch
            .map_or(std::ptr::null_mut(), |at| cx.ptr(at) as *mut f32);
        let (x, y) = (cx.f32(&self.x), cx.f32_mut(&self.y));
        // SAFETY: `cx` holds the program's arena (Kernel::run's contract), where lowering
        // placed x, z and y at the blocked sizes of `self.algo` and a scratch of its
        // `scratch_bytes` when it needs one.
        unsafe { self.algo.run(cx.pool, x, z, y, self.act, scratch) };
        Ok(())
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        match &self.algo {
            BlockedAlgo::Direct(_) | BlockedAlgo::Subsampled(..) => "conv-blocked",
            BlockedAlgo::Winograd(p) if p.m() == 2 => "conv-winograd2",
            BlockedAlgo::Winograd(..) => "conv-winograd4",
            BlockedAlgo::Depthwise(_) => "conv-depthwise-blocked",
            BlockedAlgo::Grouped(_) => "conv-grouped-blocked",
        }
    }
}

impl Kernel for Plain {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let mut z = self.z.as_ref().map(|z| cx.f32(z));
        if let (Some(at), Some(src)) = (self.z_copy, z) {
            let copy = cx.ptr(at) as *mut f32;
            // SAFETY: z has y's element count, and lowering put the copy in the arena
            // right after the im2col scratch, y.bytes() long, apart from z (which is y).
            unsafe { std::ptr::copy_nonoverlapping(src, copy, self.y.elements()) };
            z = Some(copy);
        }
        let (pool, s, d, act) = (cx.pool, &self.shape, &self.depth, self.act);
        let (w, x, y) = (cx.f32(&self.w), cx.f32(&self.x), cx.f32_mut(&self.y));
        let bias = self.bias.as_ref().map(|b| cx.f32(b));
        match self.algo {
            // SAFETY: the arena (Kernel::run's contract) holds w, bias, x, z and y at the
            // NCHW sizes of `s`, y apart from the inputs (z copied away when aliased).
            PlainAlgo::Depthwise => unsafe { conv::conv_depthwise(pool, s, w, bias, x, z, y, act) },
            PlainAlgo::Direct => {
                let scratch = cx.ptr(self.scratch) as *mut f32;
                // SAFETY: as for depthwise, with the scratch slot sized by
                // `conv_direct_scratch_len` at lowering (the flat depth only).
                unsafe { conv::conv_direct(pool, s, w, bias, x, z, y, act, scratch) }
            }
            PlainAlgo::Im2col => {
                let scratch = cx.ptr(self.scratch) as *mut f32;
                // SAFETY: as for depthwise, with the volume's depth `d`, and the scratch
                // slot sized by `conv_volume_scratch_len` at lowering.
                unsafe { conv::conv_im2col_volume(pool, s, d, w, bias, x, z, y, act, scratch) }
            }
        }
        Ok(())
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        match self.algo {
            PlainAlgo::Im2col => "conv-im2col",
            PlainAlgo::Depthwise => "conv-depthwise",
            PlainAlgo::Direct => "conv-direct",
        }
    }
}
