//! 2-D convolutions (`Conv`, `FusedConv`): blocked NCHW16c ones by the direct kernel
//! with weights packed at compile time, plain NCHW ones (any groups) by im2col + GEMM
//! or, with one input channel per group, the direct depthwise kernel. Where a shape has
//! several algorithms, [`tune::choose`] picks (cost model, tune cache or measurement).
use crate::aligned::AlignedBuf;
use crate::backend::cpu::kernels::conv::{self, ConvShape, PackedConv, PackedWinograd};
use crate::backend::cpu::kernels::Act;
use crate::backend::cpu::pool::Pool;
use crate::backend::cpu::program::{Cx, Kernel, Loc, Slot};
use crate::backend::cpu::tune::{self, Choice};

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
    Winograd(PackedWinograd),
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
        // SAFETY: the caller's contract.
        unsafe {
            match self {
                BlockedAlgo::Direct(p) => conv::conv_blocked(pool, p, x, z, y, act),
                BlockedAlgo::Winograd(p) => conv::conv_winograd(pool, p, x, z, y, act, scratch),
            }
        }
    }

    fn scratch_bytes(&self, pool: Option<&Pool>) -> usize {
        match self {
            BlockedAlgo::Direct(_) => 0,
            BlockedAlgo::Winograd(p) => p.scratch_len(pool.map_or(1, Pool::threads)) * 4,
        }
    }
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
            "direct" => Ok(BlockedAlgo::Direct(
                PackedConv::new(shape.pointwise_rows(), w, bias)?.with_plain_x(plain_x),
            )),
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
/// enough 4×4 tiles to amortize its 36 transformed weight matrices, else F(2,3); the
/// measurements behind the threshold are in `bench/RESULTS.md`.
fn blocked_model(s: &ConvShape, candidates: &[&str]) -> usize {
    let pick = if s.oh * s.ow >= 12 * 12 {
        "winograd4"
    } else {
        "winograd2"
    };
    candidates.iter().position(|c| *c == pick).unwrap_or(0)
}

/// Floats of an NCHW16c tensor of `channels` × `pixels` per image.
fn blocked_len(s: &ConvShape, channels: usize, pixels: usize) -> usize {
    s.n * channels.div_ceil(conv::BLOCK) * pixels * conv::BLOCK
}

struct Plain {
    shape: ConvShape,
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
}

pub(crate) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
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
        let w = wv.as_slice().expect("standard layout");
        let bias = bv.as_ref().map(|v| v.as_slice().expect("standard layout"));
        let algo = choose_blocked(b, shape, plain_x, w, bias, act, z.is_some())?;
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
    let depthwise = shape.groups > 1 && shape.ic == shape.groups;
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
    } else {
        PlainAlgo::Im2col
    };
    // Scratch: the im2col matrix, then (when aliased) the residual's copy.
    let im2col = match algo {
        PlainAlgo::Im2col => (conv::conv_plain_scratch_len(&shape) * 4).next_multiple_of(64),
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
        // SAFETY: callers uphold this unsafe fn's contract: pointers valid for the lengths
        // used, and the CPU features it is compiled for.
        unsafe {
            let z = self.z.as_ref().map(|z| cx.f32(z));
            let scratch = self
                .scratch
                .map_or(std::ptr::null_mut(), |at| cx.ptr(at) as *mut f32);
            let (x, y) = (cx.f32(&self.x), cx.f32_mut(&self.y));
            self.algo.run(cx.pool, x, z, y, self.act, scratch);
            Ok(())
        }
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        match &self.algo {
            BlockedAlgo::Direct(_) => "conv-blocked",
            BlockedAlgo::Winograd(p) if p.m() == 2 => "conv-winograd2",
            BlockedAlgo::Winograd(..) => "conv-winograd4",
        }
    }
}

impl Kernel for Plain {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: callers uphold this unsafe fn's contract: pointers valid for the lengths
        // used, and the CPU features it is compiled for.
        unsafe {
            let mut z = self.z.as_ref().map(|z| cx.f32(z));
            if let (Some(at), Some(src)) = (self.z_copy, z) {
                let copy = cx.ptr(at) as *mut f32;
                std::ptr::copy_nonoverlapping(src, copy, self.y.elements());
                z = Some(copy);
            }
            let (pool, s, act) = (cx.pool, &self.shape, self.act);
            let (w, x, y) = (cx.f32(&self.w), cx.f32(&self.x), cx.f32_mut(&self.y));
            let bias = self.bias.as_ref().map(|b| cx.f32(b));
            match self.algo {
                PlainAlgo::Depthwise => conv::conv_depthwise(pool, s, w, bias, x, z, y, act),
                PlainAlgo::Im2col => {
                    let scratch = cx.ptr(self.scratch) as *mut f32;
                    conv::conv_im2col(pool, s, w, bias, x, z, y, act, scratch)
                }
            }
            Ok(())
        }
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        match self.algo {
            PlainAlgo::Im2col => "conv-im2col",
            PlainAlgo::Depthwise => "conv-depthwise",
        }
    }
}
