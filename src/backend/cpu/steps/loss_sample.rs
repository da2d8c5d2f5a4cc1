//! Losses, sampling and dropout on any float dtype ([`kernels::loss_sample`], in f64 as
//! the interpreter computes them): `NegativeLogLikelihoodLoss` and
//! `SoftmaxCrossEntropyLoss` of every rank, reduction, weight and `ignore_index` (the
//! [N, C] unweighted f32 loss keeps its vectorized step in `backward`), `GridSample` of
//! every mode and padding, and `Dropout`, whose ratio, training mode and counter are
//! read from their slots at run time.
use crate::backend::cpu::kernels::loss::LossReduction;
use crate::backend::cpu::kernels::loss_sample::{
    dropout, GridMode, GridPadding, GridSample, Nll, MAX_AXES,
};
use crate::backend::cpu::program::{Cx, Kernel, Loc, Slot};
use crate::ir::ops::random::stream_key;
use crate::ir::DType;
use crate::tensor::Elem;
use crate::with_dtype;

use super::Build;

pub(crate) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    match b.node.op.as_str() {
        "NegativeLogLikelihoodLoss" => build_nll(b, false),
        "SoftmaxCrossEntropyLoss" => build_nll(b, true),
        "GridSample" => build_grid_sample(b),
        "Dropout" => build_dropout(b),
        "MseLoss" => build_mse(b),
        "AffineGrid" => build_affine_grid(b),
        _ => Ok(None),
    }
}

/// One element of `T` at `p`, as f64.
///
/// # Safety
/// `p` addresses a `T`.
unsafe fn scalar_f64<T: Elem>(p: *const u8) -> Result<f64, String> {
    // SAFETY: the caller's contract: a `T` lives at `p` (a one-element slot).
    Ok(unsafe { (p as *const T).read_unaligned() }.to_f64())
}

/// One element of `T` at `p`, as i64.
///
/// # Safety
/// `p` addresses a `T`.
unsafe fn scalar_i64<T: Elem>(p: *const u8) -> Result<i64, String> {
    // SAFETY: as for `scalar_f64`: the one element of an integer slot lies at `p`.
    Ok(unsafe { (p as *const T).read_unaligned() }.to_i64())
}

pub struct NllStep {
    plan: Nll,
    x: Slot,
    target: Slot,
    weight: Option<Slot>,
    loss: Slot,
    log_prob: Option<Slot>,
}

fn build_nll(b: &Build, softmax: bool) -> Result<Option<Box<dyn Kernel>>, String> {
    let (Some(x), Some(target)) = (b.input(0), b.input(1)) else {
        return Ok(None);
    };
    let Some(loss) = b.outs.first() else {
        return Ok(None);
    };
    let rank = x.shape.len();
    if !x.dtype.is_float()
        || !matches!(target.dtype, DType::I32 | DType::I64)
        || rank < 2
        || target.shape.len() != rank - 1
        || target.shape[0] != x.shape[0]
        || target.shape[1..] != x.shape[2..]
        || b.outs.iter().any(|o| o.dtype != x.dtype)
    {
        return Ok(None);
    }
    let weight = b.input(2).cloned();
    if weight
        .as_ref()
        .is_some_and(|w| w.dtype != x.dtype || w.shape != [x.shape[1]])
    {
        return Ok(None);
    }
    let attrs = &b.node.attrs;
    let Some(reduction) = LossReduction::from_attr(attrs.string_or("reduction", "mean")?) else {
        return Ok(None);
    };
    let want = match reduction {
        LossReduction::None => target.elements(),
        _ => 1,
    };
    let log_prob = b.outs.get(1).cloned().filter(|_| softmax);
    if loss.elements() != want || log_prob.as_ref().is_some_and(|l| l.shape != x.shape) {
        return Ok(None);
    }
    let plan = Nll {
        n: x.shape[0],
        classes: x.shape[1],
        inner: x.shape[2..].iter().product(),
        reduction,
        ignore_index: attrs.int("ignore_index")?,
        softmax,
    };
    Ok(Some(Box::new(NllStep {
        plan,
        x: x.clone(),
        target: target.clone(),
        weight,
        loss: loss.clone(),
        log_prob,
    })))
}

/// [`Nll::run`] on the step's slots, scores of `T` and targets of `L`.
///
/// # Safety
/// The slots hold their dtypes' elements in `cx` (the Kernel::run contract), `T` and
/// `L` being the scores' and the targets' element types.
unsafe fn run_nll<T: Elem, L: Elem>(cx: &Cx, s: &NllStep) -> Result<(), String> {
    // SAFETY: scores, targets and weights are input slots of their shapes, read only.
    let (x, target, weight) = unsafe {
        (
            std::slice::from_raw_parts(cx.ptr(s.x.loc) as *const T, s.x.elements()),
            std::slice::from_raw_parts(cx.ptr(s.target.loc) as *const L, s.target.elements()),
            (s.weight.as_ref())
                .map(|w| std::slice::from_raw_parts(cx.ptr(w.loc) as *const T, w.elements())),
        )
    };
    let loss_ptr = cx.ptr(s.loss.loc) as *mut T;
    // SAFETY: the loss output, its own buffer (the op is not in place), `T`s.
    let loss = unsafe { std::slice::from_raw_parts_mut(loss_ptr, s.loss.elements()) };
    // SAFETY: the log_prob output, x's shape of `T`s, apart from the loss and inputs.
    let log_prob = (s.log_prob.as_ref())
        .map(|l| unsafe { std::slice::from_raw_parts_mut(cx.ptr(l.loc) as *mut T, l.elements()) });
    s.plan.run(x, target, weight, loss, log_prob)
}

/// [`run_nll`] with the targets' type picked.
///
/// # Safety
/// As for [`run_nll`].
unsafe fn run_nll_scores<T: Elem>(cx: &Cx, s: &NllStep) -> Result<(), String> {
    match s.target.dtype {
        // SAFETY: the targets are i32 here (the contract holds as given).
        DType::I32 => unsafe { run_nll::<T, i32>(cx, s) },
        // SAFETY: build admits i32 and i64 targets only, so these are i64.
        _ => unsafe { run_nll::<T, i64>(cx, s) },
    }
}

impl Kernel for NllStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: the Kernel::run contract, with x's dtype as the scores' type.
        unsafe { with_dtype!(self.x.dtype, run_nll_scores(cx, self)) }
    }
    fn kind(&self) -> &'static str {
        if self.plan.softmax {
            "softmax-xent-nd"
        } else {
            "nll-loss"
        }
    }
}

pub struct GridSampleStep {
    plan: GridSample,
    x: Slot,
    grid: Slot,
    y: Slot,
    /// The grid's coordinates as f64.
    coords: Loc,
}

fn build_grid_sample(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let (Some(x), Some(grid), Some(y)) = (b.input(0), b.input(1), b.outs.first()) else {
        return Ok(None);
    };
    let rank = x.shape.len();
    let r = rank.saturating_sub(2);
    if !x.dtype.is_float()
        || !grid.dtype.is_float()
        || y.dtype != x.dtype
        || !(1..=MAX_AXES).contains(&r)
        || grid.shape.len() != rank
        || grid.shape[0] != x.shape[0]
        || grid.shape[rank - 1] != r
    {
        return Ok(None);
    }
    let attrs = &b.node.attrs;
    let mode = match attrs.string_or("mode", "linear")? {
        "nearest" => GridMode::Nearest,
        "linear" | "bilinear" => GridMode::Linear,
        "cubic" | "bicubic" => GridMode::Cubic,
        _ => return Ok(None),
    };
    let padding = match attrs.string_or("padding_mode", "zeros")? {
        "zeros" => GridPadding::Zeros,
        "border" => GridPadding::Border,
        "reflection" => GridPadding::Reflection,
        _ => return Ok(None),
    };
    let points: usize = grid.shape[1..rank - 1].iter().product();
    let mut want = x.shape[..2].to_vec();
    want.extend_from_slice(&grid.shape[1..rank - 1]);
    if y.shape != want {
        return Ok(None);
    }
    let plan = GridSample {
        mode,
        padding,
        align_corners: attrs.int_or("align_corners", 0)? != 0,
        n: x.shape[0],
        channels: x.shape[1],
        dims: x.shape[2..].to_vec(),
        points,
    };
    Ok(Some(Box::new(GridSampleStep {
        plan,
        x: x.clone(),
        grid: grid.clone(),
        y: y.clone(),
        coords: b.scratch(grid.elements() * 8),
    })))
}

/// The grid slot's `T`s as f64 into the scratch.
///
/// # Safety
/// The grid slot holds `T`s; the scratch holds as many f64.
unsafe fn load_coords<T: Elem>(cx: &Cx, s: &GridSampleStep) -> Result<(), String> {
    let n = s.grid.elements();
    // SAFETY: the grid input slot's `n` elements, read only.
    let grid = unsafe { std::slice::from_raw_parts(cx.ptr(s.grid.loc) as *const T, n) };
    // SAFETY: the scratch lowering sized for `n` f64 (8-byte aligned, as the arena is),
    // no planned buffer.
    let coords = unsafe { std::slice::from_raw_parts_mut(cx.ptr(s.coords) as *mut f64, n) };
    for (c, &g) in coords.iter_mut().zip(grid) {
        *c = g.to_f64();
    }
    Ok(())
}

/// [`GridSample::run`] on the step's slots, X and Y of `T`.
///
/// # Safety
/// X and Y hold `T`s of their shapes; the scratch holds the grid's coordinates.
unsafe fn run_grid_sample<T: Elem>(cx: &Cx, s: &GridSampleStep) -> Result<(), String> {
    // SAFETY: X is an input slot of `T`s; the scratch holds the grid's f64 coordinates
    // (just loaded); neither is Y's buffer (the op is not in place).
    let (x, coords) = unsafe {
        (
            std::slice::from_raw_parts(cx.ptr(s.x.loc) as *const T, s.x.elements()),
            std::slice::from_raw_parts(cx.ptr(s.coords) as *const f64, s.grid.elements()),
        )
    };
    // SAFETY: Y's output slot of `T`s, written only here.
    let y = unsafe { std::slice::from_raw_parts_mut(cx.ptr(s.y.loc) as *mut T, s.y.elements()) };
    s.plan.run(x, coords, y);
    Ok(())
}

impl Kernel for GridSampleStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: the Kernel::run contract, with the grid's dtype as its elements'.
        unsafe { with_dtype!(self.grid.dtype, load_coords(cx, self)) }?;
        // SAFETY: the Kernel::run contract, with X's dtype as X's and Y's elements'.
        unsafe { with_dtype!(self.x.dtype, run_grid_sample(cx, self)) }
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "grid-sample"
    }
}

pub struct DropoutStep {
    x: Slot,
    ratio: Option<Slot>,
    training: Option<Slot>,
    counter: Option<Slot>,
    seed: i64,
    y: Slot,
    mask: Option<Slot>,
}

fn build_dropout(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let (Some(x), Some(y)) = (b.input(0), b.outs.first()) else {
        return Ok(None);
    };
    let one = |k: usize| b.input(k).filter(|s| s.elements() == 1).cloned();
    let (ratio, training, counter) = (one(1), one(2), one(3));
    let mask = b.outs.get(1).cloned();
    if !x.dtype.is_float()
        || y.dtype != x.dtype
        || y.shape != x.shape
        || y.loc == x.loc
        || (b.input(1).is_some() && ratio.is_none())
        || (b.input(2).is_some() && training.is_none())
        || (b.input(3).is_some() && counter.is_none())
        || mask
            .as_ref()
            .is_some_and(|m| m.dtype != DType::Bool || m.shape != x.shape)
    {
        return Ok(None);
    }
    Ok(Some(Box::new(DropoutStep {
        x: x.clone(),
        ratio,
        training,
        counter,
        seed: b.node.attrs.int_or("seed", 0)?,
        y: y.clone(),
        mask,
    })))
}

/// [`dropout`] on the step's slots, data of `T`.
///
/// # Safety
/// x and y hold `T`s of x's shape, the mask bools of it.
unsafe fn run_dropout<T: Elem>(
    cx: &Cx,
    s: &DropoutStep,
    train: Option<(u64, f64)>,
) -> Result<(), String> {
    let n = s.x.elements();
    // SAFETY: the data input slot, `n` `T`s, read only.
    let x = unsafe { std::slice::from_raw_parts(cx.ptr(s.x.loc) as *const T, n) };
    // SAFETY: the output slot, `n` `T`s, not x's buffer (checked at build).
    let y = unsafe { std::slice::from_raw_parts_mut(cx.ptr(s.y.loc) as *mut T, n) };
    // SAFETY: the mask output slot, `n` bools, a buffer of its own.
    let mask = (s.mask.as_ref())
        .map(|m| unsafe { std::slice::from_raw_parts_mut(cx.ptr(m.loc) as *mut bool, n) });
    dropout(x, y, mask, train);
    Ok(())
}

impl Kernel for DropoutStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let ratio = match &self.ratio {
            // SAFETY: the ratio slot holds one element of its dtype (checked at build).
            Some(r) => unsafe { with_dtype!(r.dtype, scalar_f64(cx.ptr(r.loc))) }?,
            None => 0.5,
        };
        if !(0.0..1.0).contains(&ratio) {
            return Err(format!("ratio must be in [0, 1), got {ratio}"));
        }
        let training = match &self.training {
            // SAFETY: the training_mode slot holds one element of its dtype (build).
            Some(t) => unsafe { with_dtype!(t.dtype, scalar_f64(cx.ptr(t.loc))) }? != 0.0,
            None => false,
        };
        let train = if training {
            let counter = match &self.counter {
                // SAFETY: the counter slot holds one element of its dtype (build).
                Some(c) => unsafe { with_dtype!(c.dtype, scalar_i64(cx.ptr(c.loc))) }?,
                None => 0,
            };
            Some((stream_key(self.seed, counter), ratio))
        } else {
            None
        };
        // SAFETY: the Kernel::run contract, with x's dtype as the data's.
        unsafe { with_dtype!(self.x.dtype, run_dropout(cx, self, train)) }
    }
    fn kind(&self) -> &'static str {
        "dropout"
    }
}

/// MseLoss: (prediction - target)^2, kept (`none`) or summed / averaged, in f64.
struct MseStep {
    /// 0 none, 1 sum, 2 mean.
    reduce: u8,
    p: Slot,
    t: Slot,
    y: Slot,
}

fn build_mse(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let (Some(p), Some(t), [y]) = (b.input(0), b.input(1), b.outs) else {
        return Ok(None);
    };
    if !p.dtype.is_float() || t.dtype != p.dtype || y.dtype != p.dtype {
        return Ok(None);
    }
    if p.shape != t.shape {
        return Err(format!(
            "prediction has shape {:?}, target {:?}",
            p.shape, t.shape
        ));
    }
    let reduce = match b.node.attrs.string_or("reduction", "mean")? {
        "none" => 0,
        "sum" => 1,
        "mean" => 2,
        _ => return Ok(None),
    };
    if (reduce == 0 && y.shape != p.shape) || (reduce != 0 && y.elements() != 1) {
        return Ok(None);
    }
    Ok(Some(Box::new(MseStep {
        reduce,
        p: p.clone(),
        t: t.clone(),
        y: y.clone(),
    })))
}

/// The squared error on `T`.
///
/// # Safety
/// The Kernel::run contract: the three slots hold `T`s of their shapes, y its own buffer.
unsafe fn run_mse<T: Elem>(cx: &Cx, s: &MseStep) -> Result<(), String> {
    let n = s.p.elements();
    // SAFETY: MseLoss's prediction, `n` `T`s, only read.
    let p = unsafe { std::slice::from_raw_parts(cx.ptr(s.p.loc) as *const T, n) };
    // SAFETY: MseLoss's target, `n` `T`s of the prediction's shape, only read.
    let t = unsafe { std::slice::from_raw_parts(cx.ptr(s.t.loc) as *const T, n) };
    // SAFETY: MseLoss's loss output (not planned in place), its elements of `T`.
    let y = unsafe { std::slice::from_raw_parts_mut(cx.ptr(s.y.loc) as *mut T, s.y.elements()) };
    let sq = p.iter().zip(t).map(|(a, b)| {
        let d = a.to_f64() - b.to_f64();
        d * d
    });
    if s.reduce == 0 {
        for (o, v) in y.iter_mut().zip(sq) {
            *o = T::from_f64(v);
        }
    } else {
        let sum: f64 = sq.sum();
        y[0] = T::from_f64(if s.reduce == 1 { sum } else { sum / n as f64 });
    }
    Ok(())
}

impl Kernel for MseStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: the Kernel::run contract; prediction, target and loss hold p.dtype.
        unsafe { with_dtype!(self.p.dtype, run_mse(cx, self)) }
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "mse-loss"
    }
}

/// AffineGrid: theta [N, r, r+1] times each output pixel's (x, y[, z], 1), the
/// homogeneous coordinates tabled at build (the output shape is static); the size
/// input is read at run time and must agree with it.
struct AffineGridStep {
    r: usize,
    /// Per pixel (row-major over the spatial dims), its r+1 homogeneous coordinates.
    coords: Vec<f64>,
    /// [N, dims...], what size must say (its C is free).
    size_want: Vec<i64>,
    theta: Slot,
    size: Slot,
    y: Slot,
}

fn build_affine_grid(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let (Some(theta), Some(size), [y]) = (b.input(0), b.input(1), b.outs) else {
        return Ok(None);
    };
    let yr = y.shape.len();
    if !theta.dtype.is_float()
        || y.dtype != theta.dtype
        || size.dtype != DType::I64
        || !(4..=5).contains(&yr)
        || size.elements() != yr
        || theta.shape.len() != 3
    {
        return Ok(None);
    }
    let r = yr - 2;
    let n = y.shape[0];
    if theta.shape != [n, r, r + 1] || y.shape[yr - 1] != r {
        return Err(format!(
            "theta {:?} does not fit the grid {:?}",
            theta.shape, y.shape
        ));
    }
    let dims = &y.shape[1..yr - 1];
    let align = b.node.attrs.int_or("align_corners", 0)? != 0;
    let coord = |i: usize, len: usize| -> f64 {
        if align {
            if len == 1 {
                -1.0
            } else {
                -1.0 + 2.0 * i as f64 / (len - 1) as f64
            }
        } else {
            -1.0 + (2 * i + 1) as f64 / len as f64
        }
    };
    let pixels: usize = dims.iter().product();
    let mut coords = Vec::with_capacity(pixels * (r + 1));
    for mut at in 0..pixels {
        // The pixel's index, last axis first: x runs along the last axis.
        let mut idx = vec![0; r];
        for k in (0..r).rev() {
            idx[k] = at % dims[k];
            at /= dims[k];
        }
        coords.extend((0..r).map(|k| coord(idx[r - 1 - k], dims[r - 1 - k])));
        coords.push(1.0);
    }
    let mut size_want = vec![n as i64];
    size_want.extend(dims.iter().map(|&d| d as i64));
    Ok(Some(Box::new(AffineGridStep {
        r,
        coords,
        size_want,
        theta: theta.clone(),
        size: size.clone(),
        y: y.clone(),
    })))
}

/// The affine grid on `T`.
///
/// # Safety
/// The Kernel::run contract: theta and grid hold `T`s of their shapes, size i64s.
unsafe fn run_affine_grid<T: Elem>(cx: &Cx, s: &AffineGridStep) -> Result<(), String> {
    // SAFETY: AffineGrid's size input, an i64 vector of the grid's rank, only read.
    let size =
        unsafe { std::slice::from_raw_parts(cx.ptr(s.size.loc) as *const i64, s.size.elements()) };
    if size[0] != s.size_want[0] || size[2..] != s.size_want[1..] {
        return Err(format!(
            "AffineGrid: size {size:?} does not fit the grid {:?}",
            s.y.shape
        ));
    }
    // SAFETY: theta, `T`s of [N, r, r+1], only read.
    let theta =
        unsafe { std::slice::from_raw_parts(cx.ptr(s.theta.loc) as *const T, s.theta.elements()) };
    // SAFETY: the grid output (not planned in place), `T`s of its shape.
    let y = unsafe { std::slice::from_raw_parts_mut(cx.ptr(s.y.loc) as *mut T, s.y.elements()) };
    let (r, h) = (s.r, s.r + 1);
    let pixels = s.coords.len() / h;
    for (bi, th) in theta.chunks(r * h).enumerate() {
        let out = &mut y[bi * pixels * r..(bi + 1) * pixels * r];
        for (o, c) in out.chunks_mut(r).zip(s.coords.chunks(h)) {
            for (row, v) in o.iter_mut().enumerate() {
                let t = &th[row * h..(row + 1) * h];
                *v = T::from_f64(t.iter().zip(c).map(|(a, b)| a.to_f64() * b).sum());
            }
        }
    }
    Ok(())
}

impl Kernel for AffineGridStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: the Kernel::run contract; theta and the grid hold theta.dtype.
        unsafe { with_dtype!(self.theta.dtype, run_affine_grid(cx, self)) }
    }
    fn can_fail(&self) -> bool {
        true
    }
    fn kind(&self) -> &'static str {
        "affine-grid"
    }
}
