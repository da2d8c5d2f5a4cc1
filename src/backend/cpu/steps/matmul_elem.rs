//! Matrix products on the dtypes the f32 GEMM does not take (f64, f16, bf16 and the
//! integers): `MatMul` (batched, broadcast, 1-D operands), `Gemm` (transposes, alpha,
//! beta, C broadcast to [M, N]) and `FusedMatMul` (a bias and Z broadcast to Y, then
//! the activation), as typed loops that accumulate in f64 like the reference and round
//! once per op the reference rounds for. Also the f32 epilogue that the packed GEMM's
//! own cannot express ([`Post`]): alpha, beta and addends broadcast any way.
use super::eltwise::ELEM_DTYPES;
use crate::backend::cpu::kernels::binary::Broadcast;
use crate::backend::cpu::kernels::Act;
use crate::backend::cpu::program::{Cx, Kernel, Loc, Slot};
use crate::backend::matmul_geometry::{geometry, Geometry};
use crate::ir::DType;
use crate::tensor::Elem;
use crate::with_dtype;

use super::Build;

/// `s`'s elements as `T`s, to read.
///
/// # Safety
/// `s` holds `s.elements()` `T`s under `cx`, which nothing writes while the slice lives.
pub(super) unsafe fn elems<'a, T>(cx: &Cx, s: &Slot) -> &'a [T] {
    // SAFETY: the caller vouches for s.elements() live, unwritten `T`s at the slot.
    unsafe { std::slice::from_raw_parts(cx.ptr(s.loc) as *const T, s.elements()) }
}

/// `s`'s elements as `T`s, to write.
///
/// # Safety
/// `s` holds `s.elements()` `T`s under `cx`, which nothing else reads or writes while
/// the slice lives.
#[allow(clippy::mut_from_ref)]
pub(super) unsafe fn elems_mut<'a, T>(cx: &Cx, s: &Slot) -> &'a mut [T] {
    // SAFETY: the caller vouches that the slot's `T`s are this slice's alone for 'a.
    unsafe { std::slice::from_raw_parts_mut(cx.ptr(s.loc) as *mut T, s.elements()) }
}

/// `n` f64 of scratch at `at`, to write.
///
/// # Safety
/// `at` is a scratch region of at least `n` f64 that only this step uses while it runs.
#[allow(clippy::mut_from_ref)]
pub(super) unsafe fn scratch_f64<'a>(cx: &Cx, at: Loc, n: usize) -> &'a mut [f64] {
    // SAFETY: the caller's scratch of n f64, lowering-sized and aligned (memory::ALIGN).
    unsafe { std::slice::from_raw_parts_mut(cx.ptr(at) as *mut f64, n) }
}

/// Addends of an m×n product broadcast to Y, after it: `y = act(alpha·y + Σ beta·x)`.
pub(super) struct Post {
    pub alpha: f32,
    pub adds: Vec<(Slot, f32)>,
    pub plan: Broadcast,
    pub act: Act,
}

impl Post {
    /// `adds` broadcast to `y` (`None` when one does not).
    pub(super) fn new(alpha: f32, adds: Vec<(Slot, f32)>, y: &Slot, act: Act) -> Option<Post> {
        let shapes: Vec<&[usize]> = adds.iter().map(|(s, _)| s.shape.as_slice()).collect();
        let plan = Broadcast::new(&shapes, &y.shape)?;
        Some(Post {
            alpha,
            adds,
            plan,
            act,
        })
    }

    /// Applies it to `y`, the product, in place.
    ///
    /// # Safety
    /// The addends' slots hold their shapes' f32 under `cx`, apart from `y`.
    pub(super) unsafe fn run(&self, cx: &Cx, y: &mut [f32]) {
        if self.alpha != 1.0 {
            y.iter_mut().for_each(|v| *v *= self.alpha);
        }
        let srcs: [&[f32]; 2] = std::array::from_fn(|k| match self.adds.get(k) {
            // SAFETY: the addends are f32 inputs of their shapes, only read (the contract).
            Some((s, _)) => unsafe { elems::<f32>(cx, s) },
            None => &[],
        });
        let rows = self.plan.rows();
        if !self.adds.is_empty() && self.plan.total() > 0 && rows > 0 {
            let inner = self.plan.total() / rows;
            let strides = *self.plan.inner_strides();
            for (row, out) in y.chunks_mut(inner).enumerate().take(rows) {
                let offs = self.plan.offsets(row);
                for (t, v) in out.iter_mut().enumerate() {
                    for (k, (_, beta)) in self.adds.iter().enumerate() {
                        let x = srcs[k][offs[k] + t * strides[k]];
                        *v += if *beta == 1.0 { x } else { beta * x };
                    }
                }
            }
        }
        self.act.apply(y);
    }
}

/// The product's epilogue in the generic loop.
enum Tail {
    /// MatMul: the product, rounded.
    None,
    /// Gemm: `alpha·AB + beta·C` in f64, C at `i·cm + j·cn` (strides 0 where it
    /// broadcasts), rounded once.
    Gemm {
        alpha: f64,
        c: Option<(Slot, f64, usize, usize)>,
    },
    /// FusedMatMul: the product rounded, then each addend added and rounded (the Add
    /// op's), then the activation (f16/bf16 in f32, as the f32 kernels compute it).
    Fused {
        adds: Vec<Slot>,
        plan: Broadcast,
        act: Act,
    },
}

struct MatMulElem {
    dtype: DType,
    a: Slot,
    b: Slot,
    y: Slot,
    m: usize,
    n: usize,
    k: usize,
    trans_a: bool,
    trans_b: bool,
    batches: Vec<(usize, usize)>,
    tail: Tail,
    /// n f64: one row's sums.
    acc: Loc,
}

/// A MatMul, Gemm or FusedMatMul on f32 or one of [`ELEM_DTYPES`] (f32 only when `b`'s f32 GEMM
/// step declined it).
pub(super) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let op = b.node.op.as_str();
    let (Some(a), Some(bm), [y]) = (b.input(0), b.input(1), b.outs) else {
        return Ok(None);
    };
    let dtype = y.dtype;
    if !(dtype == DType::F32 || ELEM_DTYPES.contains(&dtype))
        || a.dtype != dtype
        || bm.dtype != dtype
    {
        return Ok(None);
    }
    if b.ins.iter().flatten().any(|s| s.dtype != dtype) {
        return Ok(None);
    }
    let attrs = &b.node.attrs;
    let (trans_a, trans_b) = match op {
        "MatMul" => (false, false),
        "Gemm" | "FusedMatMul" => (
            attrs.int_or("transA", 0)? != 0,
            attrs.int_or("transB", 0)? != 0,
        ),
        _ => return Ok(None),
    };
    if a.shape.len() < 2 && trans_a || bm.shape.len() < 2 && trans_b {
        return Ok(None);
    }
    if op == "Gemm" && (a.shape.len() != 2 || bm.shape.len() != 2) {
        return Ok(None);
    }
    let Geometry { m, n, k, batches } =
        geometry(&a.shape, &bm.shape, y.elements(), trans_a, trans_b)?;
    let tail = match op {
        "Gemm" => {
            let c = match b.input(2) {
                None => None,
                Some(c) => {
                    if c.shape.len() > 2 {
                        return Ok(None);
                    }
                    let mut dims = [1usize; 2];
                    dims[2 - c.shape.len()..].copy_from_slice(&c.shape);
                    if (dims[0] != 1 && dims[0] != m) || (dims[1] != 1 && dims[1] != n) {
                        return Err(format!("C {:?} does not broadcast to [{m}, {n}]", c.shape));
                    }
                    let cn = usize::from(dims[1] != 1);
                    let cm = if dims[0] != 1 { dims[1] } else { 0 };
                    Some((c.clone(), attrs.float_or("beta", 1.0)?, cm, cn))
                }
            };
            Tail::Gemm {
                alpha: attrs.float_or("alpha", 1.0)?,
                c,
            }
        }
        "FusedMatMul" => {
            if dtype.is_int() {
                return Ok(None);
            }
            let act = Act::from_attrs(attrs)?;
            if act != Act::None && dtype == DType::F64 {
                return Ok(None);
            }
            let adds: Vec<Slot> = [b.input(2), b.input(3)]
                .into_iter()
                .flatten()
                .cloned()
                .collect();
            let shapes: Vec<&[usize]> = adds.iter().map(|s| s.shape.as_slice()).collect();
            let Some(plan) = Broadcast::new(&shapes, &y.shape) else {
                return Ok(None);
            };
            Tail::Fused { adds, plan, act }
        }
        _ => Tail::None,
    };
    let acc = b.scratch(n.checked_mul(8).ok_or("matmul row overflows")?);
    Ok(Some(Box::new(MatMulElem {
        dtype,
        a: a.clone(),
        b: bm.clone(),
        y: y.clone(),
        m,
        n,
        k,
        trans_a,
        trans_b,
        batches,
        tail,
        acc,
    })))
}

/// A float as `T` the way the reference finishes a product: integers truncate.
fn finish<T: Elem>(v: f64) -> T {
    if T::DTYPE.is_int() {
        T::from_i64(v as i64)
    } else {
        T::from_f64(v)
    }
}

impl MatMulElem {
    /// # Safety
    /// The slots hold `T`s of their shapes in `cx` (Y apart from every input), and the
    /// scratch `acc` is this step's.
    unsafe fn run_as<T: Elem>(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: A and B are this step's `T` inputs, only read.
        let (a, bm) = unsafe { (elems::<T>(cx, &self.a), elems::<T>(cx, &self.b)) };
        // SAFETY: Y, the output, in a buffer of its own (no in-place for products).
        let y = unsafe { elems_mut::<T>(cx, &self.y) };
        // SAFETY: the n-f64 row scratch build asked for.
        let acc = unsafe { scratch_f64(cx, self.acc, self.n) };
        let (m, n, k) = (self.m, self.n, self.k);
        let c_slot = match &self.tail {
            Tail::Gemm {
                c: Some((s, ..)), ..
            } => Some(s),
            _ => None,
        };
        // SAFETY: Gemm's C, a `T` input, only read.
        let c = c_slot.map_or(&[][..], |s| unsafe { elems::<T>(cx, s) });
        for (bi, &(oa, ob)) in self.batches.iter().enumerate() {
            let yb = &mut y[bi * m * n..(bi + 1) * m * n];
            for i in 0..m {
                acc.fill(0.0);
                for p in 0..k {
                    let av = if self.trans_a {
                        a[oa + p * m + i]
                    } else {
                        a[oa + i * k + p]
                    }
                    .to_f64();
                    if self.trans_b {
                        for (j, s) in acc.iter_mut().enumerate() {
                            *s += av * bm[ob + j * k + p].to_f64();
                        }
                    } else {
                        let row = &bm[ob + p * n..ob + (p + 1) * n];
                        for (s, bv) in acc.iter_mut().zip(row) {
                            *s += av * bv.to_f64();
                        }
                    }
                }
                let out = &mut yb[i * n..(i + 1) * n];
                match &self.tail {
                    Tail::Gemm { alpha, c: cc } => {
                        for (j, (o, s)) in out.iter_mut().zip(acc.iter()).enumerate() {
                            let mut v = alpha * s;
                            if let Some((_, beta, cm, cn)) = cc {
                                v += beta * c[i * cm + j * cn].to_f64();
                            }
                            *o = finish(v);
                        }
                    }
                    _ => {
                        for (o, s) in out.iter_mut().zip(acc.iter()) {
                            *o = finish(*s);
                        }
                    }
                }
            }
        }
        if let Tail::Fused { adds, plan, act } = &self.tail {
            let srcs: [&[T]; 2] = std::array::from_fn(|k| match adds.get(k) {
                // SAFETY: the bias and Z inputs, `T`s of their shapes, only read.
                Some(s) => unsafe { elems::<T>(cx, s) },
                None => &[],
            });
            let rows = plan.rows();
            if !adds.is_empty() && plan.total() > 0 && rows > 0 {
                let inner = plan.total() / rows;
                let strides = *plan.inner_strides();
                for (row, out) in y.chunks_mut(inner).enumerate().take(rows) {
                    let offs = plan.offsets(row);
                    for (t, v) in out.iter_mut().enumerate() {
                        for (k, src) in srcs.iter().enumerate().take(adds.len()) {
                            let x = src[offs[k] + t * strides[k]];
                            *v = T::from_f64(v.to_f64() + x.to_f64());
                        }
                    }
                }
            }
            if *act != Act::None {
                for v in y.iter_mut() {
                    *v = T::from_f64(act.scalar(v.to_f64() as f32) as f64);
                }
            }
        }
        Ok(())
    }
}

impl Kernel for MatMulElem {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: every slot holds `dtype` elements of its shape (checked at build).
        unsafe { with_dtype!(self.dtype, run_as_of(self, cx)) }
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "matmul-elem"
    }
}

/// [`MatMulElem::run_as`] as a free fn, for `with_dtype!`.
///
/// # Safety
/// As for [`MatMulElem::run_as`].
unsafe fn run_as_of<T: Elem>(s: &MatMulElem, cx: &Cx) -> Result<(), String> {
    // SAFETY: passed on from the caller.
    unsafe { s.run_as::<T>(cx) }
}
