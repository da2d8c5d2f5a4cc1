//! Matrix products: `MatMul` (batched, broadcasting), `Gemm` and `FusedMatMul` (bias,
//! residual and activation fused into the GEMM's epilogue, or applied after it when
//! alpha, beta or a broadcast addend does not fit that epilogue). Other dtypes run the
//! typed loops of [`super::matmul_elem`].
use crate::backend::cpu::kernels::gemm::{self, Bias, Epilogue, Mat, PackedB};
use crate::backend::cpu::kernels::Act;
use crate::backend::cpu::program::{Cx, Kernel, Loc, Slot};
use crate::backend::matmul_geometry::{geometry, Geometry};

use super::matmul_elem::{self, Post};
use super::Build;

/// One product `Y[batch] = A[batch]·B[batch]` per batch index, plus the epilogue.
pub struct MatMulStep {
    a: Slot,
    b: Slot,
    y: Slot,
    m: usize,
    n: usize,
    k: usize,
    trans_a: bool,
    trans_b: bool,
    /// Per batch index of Y: the element offsets of its A and B matrices.
    batches: Vec<(usize, usize)>,
    bias: Option<(Slot, BiasKind)>,
    residual: Option<Slot>,
    act: Act,
    /// B packed at compile time when it is a constant shared by every batch (weights).
    packed: Option<PackedB>,
    /// What the epilogue cannot do, after every batch's product (bias, residual and act
    /// are then off).
    post: Option<Post>,
}

#[derive(Clone, Copy)]
enum BiasKind {
    PerRow,
    PerCol,
}

pub(crate) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let op = b.node.op.as_str();
    if !matches!(op, "MatMul" | "Gemm" | "FusedMatMul") {
        return Ok(None);
    }
    if !b.all_f32() {
        return matmul_elem::build(b);
    }
    let attrs = &b.node.attrs;
    let (a, bm, y) = (
        b.input(0).ok_or("missing A")?,
        b.input(1).ok_or("missing B")?,
        &b.outs[0],
    );
    let trans_a = attrs.int_or("transA", 0)? != 0;
    let trans_b = attrs.int_or("transB", 0)? != 0;
    if a.shape.len() < 2 && trans_a || bm.shape.len() < 2 && trans_b {
        return Ok(None);
    }
    let Geometry { m, n, k, batches } =
        geometry(&a.shape, &bm.shape, y.elements(), trans_a, trans_b)?;
    let mut bias = None;
    let mut residual = None;
    let mut act = Act::None;
    // Whether the epilogue takes it all; else every addend goes to `post`.
    let mut fits = true;
    let mut adds: Vec<(Slot, f32)> = vec![];
    let mut alpha = 1.0f32;
    match op {
        "FusedMatMul" => {
            act = Act::from_attrs(attrs)?;
            adds = [b.input(2), b.input(3)]
                .into_iter()
                .flatten()
                .map(|s| (s.clone(), 1.0))
                .collect();
            if let Some(s) = b.input(2) {
                match bias_kind(s, m, n) {
                    Some(kind) => bias = Some((s.clone(), kind)),
                    None => fits = false,
                }
            }
            if let Some(z) = b.input(3) {
                if z.shape == y.shape {
                    residual = Some(z.clone());
                } else {
                    // A bias that is not a constant (a variable being trained) is fused
                    // as the addend Z; broadcast along rows or columns, it is a bias.
                    match (bias.is_none(), bias_kind(z, m, n)) {
                        (true, Some(kind)) => bias = Some((z.clone(), kind)),
                        _ => fits = false,
                    }
                }
            }
        }
        "Gemm" => {
            alpha = attrs.float_or("alpha", 1.0)? as f32;
            fits = alpha == 1.0;
            if let Some(c) = b.input(2) {
                let beta = attrs.float_or("beta", 1.0)? as f32;
                adds = vec![(c.clone(), beta)];
                fits &= beta == 1.0;
                if c.shape == y.shape {
                    residual = Some(c.clone());
                } else if let Some(kind) = bias_kind(c, m, n) {
                    bias = Some((c.clone(), kind));
                } else {
                    fits = false;
                }
            }
        }
        _ => {}
    }
    let post = if fits {
        None
    } else {
        let Some(post) = Post::new(alpha, adds, y, act) else {
            return Ok(None);
        };
        (bias, residual, act) = (None, None, Act::None);
        Some(post)
    };
    let packed = match b.constant(1) {
        Some(_) if batches.len() == 1 => {
            let Loc::Const(p) = bm.loc else {
                unreachable!("a constant lives in the program")
            };
            let p = p as *const f32;
            let view = if trans_b {
                Mat::rows(p, k).t()
            } else {
                Mat::rows(p, n)
            };
            // SAFETY: the constant holds B's k×n elements.
            Some(unsafe { PackedB::new(m, k, n, view) })
        }
        _ => None,
    };
    Ok(Some(Box::new(MatMulStep {
        a: a.clone(),
        b: bm.clone(),
        y: y.clone(),
        m,
        n,
        k,
        trans_a,
        trans_b,
        batches,
        bias,
        residual,
        act,
        packed,
        post,
    })))
}

/// How a bias of `s`'s shape adds to an m×n product: along rows or columns.
fn bias_kind(s: &Slot, m: usize, n: usize) -> Option<BiasKind> {
    let dims: Vec<usize> = s.shape.iter().copied().skip_while(|&d| d == 1).collect();
    match (dims.as_slice(), s.shape.last()) {
        ([], _) if n == 1 => Some(BiasKind::PerCol),
        ([d], _) if *d == n && s.shape.last() == Some(&n) => Some(BiasKind::PerCol),
        ([d, 1], _) if *d == m => Some(BiasKind::PerRow),
        _ => None,
    }
}

impl MatMulStep {
    /// The product of batch `i`.
    ///
    /// # Safety
    /// `cx` as [`Kernel::run`] asks (its slots address live buffers of their planned
    /// sizes), and `i < self.batches.len()`.
    unsafe fn one(&self, cx: &Cx, i: usize, pool: Option<&crate::backend::cpu::pool::Pool>) {
        let (oa, ob) = self.batches[i];
        let (m, n, k) = (self.m, self.n, self.k);
        // SAFETY: the batch's element offsets (from the broadcast geometry) start its
        // A and B matrices inside their slots.
        let (a, b) = unsafe { (cx.f32(&self.a).add(oa), cx.f32(&self.b).add(ob)) };
        let a = if self.trans_a {
            Mat::rows(a, m).t()
        } else {
            Mat::rows(a, k)
        };
        let b = if self.trans_b {
            Mat::rows(b, k).t()
        } else {
            Mat::rows(b, n)
        };
        let y_off = i * m * n;
        // SAFETY: Y and the residual (shaped like Y) hold batches·m·n floats, and
        // batch i's m×n block starts at i·m·n.
        let residual = unsafe { self.residual.as_ref().map(|z| (cx.f32(z).add(y_off), n)) };
        let ep = Epilogue {
            bias: match &self.bias {
                None => Bias::None,
                Some((s, BiasKind::PerRow)) => Bias::PerRow(cx.f32(s)),
                Some((s, BiasKind::PerCol)) => Bias::PerCol(cx.f32(s)),
            },
            residual,
            act: self.act,
        };
        // SAFETY: batch i's block of Y, i·m·n floats in, as for the residual.
        let y = unsafe { cx.f32_mut(&self.y).add(y_off) };
        match &self.packed {
            // SAFETY: the batch's m×k A, k×n B (packed with this k and n) and m×n Y (row
            // stride n, its own buffer, not A's or B's) and the bias (m or n values)
            // and residual blocks are in live slots.
            Some(p) => unsafe { gemm::gemm_packed(pool, m, n, k, a, p, y, n, &ep) },
            // SAFETY: as in the packed arm, with B the k×n matrix in its slot.
            None => unsafe { gemm::gemm(pool, m, n, k, a, b, y, n, &ep) },
        }
    }
}

impl Kernel for MatMulStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let threads = cx.pool.map_or(1, |p| p.threads());
        match cx.pool {
            // Many small products: one per task, each on one thread.
            Some(pool) if self.batches.len() >= 2 * threads => {
                // SAFETY: `cx` as this `run`'s contract gives it; task `i` is a batch
                // index, and each writes only its own block of Y.
                pool.run(self.batches.len(), &|i| unsafe { self.one(cx, i, None) })
            }
            // SAFETY: `cx` as `run` is given it; `i` runs over the batch indices.
            _ => (0..self.batches.len()).for_each(|i| unsafe { self.one(cx, i, cx.pool) }),
        }
        if let Some(post) = &self.post {
            // SAFETY: Y's f32, which the products above wrote and nothing else touches.
            let y =
                unsafe { std::slice::from_raw_parts_mut(cx.f32_mut(&self.y), self.y.elements()) };
            // SAFETY: the addends are the node's f32 inputs, none Y's buffer (no in-place).
            unsafe { post.run(cx, y) };
        }
        Ok(())
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "gemm"
    }
}
