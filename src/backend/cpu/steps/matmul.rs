//! Matrix products: `MatMul` (batched, broadcasting), `Gemm` and `FusedMatMul` (bias,
//! residual and activation fused into the GEMM's epilogue).
use crate::backend::cpu::kernels::gemm::{self, Bias, Epilogue, Mat, PackedB};
use crate::backend::cpu::kernels::Act;
use crate::backend::cpu::program::{Cx, Kernel, Loc, Slot};

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
}

#[derive(Clone, Copy)]
enum BiasKind {
    PerRow,
    PerCol,
}

pub fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let op = b.node.op.as_str();
    if !matches!(op, "MatMul" | "Gemm" | "FusedMatMul") || !b.all_f32() {
        return Ok(None);
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
    match op {
        "FusedMatMul" => {
            act = Act::from_attrs(attrs)?;
            if let Some(s) = b.input(2) {
                match bias_kind(s, m, n) {
                    Some(kind) => bias = Some((s.clone(), kind)),
                    None => return Ok(None),
                }
            }
            if let Some(z) = b.input(3) {
                if z.shape == y.shape {
                    residual = Some(z.clone());
                } else {
                    // A bias that is not a constant (a variable being trained) is fused
                    // as the addend Z; broadcast along rows or columns, it is a bias.
                    match (bias, bias_kind(z, m, n)) {
                        (None, Some(kind)) => bias = Some((z.clone(), kind)),
                        _ => return Ok(None),
                    }
                }
            }
        }
        "Gemm" => {
            if attrs.float_or("alpha", 1.0)? != 1.0 {
                return Ok(None);
            }
            if let Some(c) = b.input(2) {
                if attrs.float_or("beta", 1.0)? != 1.0 {
                    return Ok(None);
                }
                if c.shape == y.shape {
                    residual = Some(c.clone());
                } else if let Some(kind) = bias_kind(c, m, n) {
                    bias = Some((c.clone(), kind));
                } else {
                    return Ok(None);
                }
            }
        }
        _ => {}
    }
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
            Some(unsafe { PackedB::new(k, n, view) })
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
    })))
}

/// A matrix product's sizes after transposition, and the GEMMs it takes: per GEMM the
/// element offsets of its A and B matrices.
pub(crate) struct Geometry {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batches: Vec<(usize, usize)>,
}

/// The geometry of `A' · B'` (A', B' transposed in their last two axes if asked),
/// batched and broadcast like numpy's matmul, vectors as one-row / one-column matrices,
/// for a Y of `y_elements`. A weight matrix shared by every batch folds A's batch into
/// its rows (one GEMM).
pub(crate) fn geometry(
    a_shape: &[usize],
    b_shape: &[usize],
    y_elements: usize,
    trans_a: bool,
    trans_b: bool,
) -> Result<Geometry, String> {
    let a_mat = if a_shape.len() == 1 {
        vec![1, a_shape[0]]
    } else {
        a_shape.to_vec()
    };
    let b_mat = if b_shape.len() == 1 {
        vec![b_shape[0], 1]
    } else {
        b_shape.to_vec()
    };
    let (ra, rb) = (a_mat.len(), b_mat.len());
    if ra < 2 || rb < 2 {
        return Err("a matrix product needs operands of rank >= 1".into());
    }
    let (m, k) = if trans_a {
        (a_mat[ra - 1], a_mat[ra - 2])
    } else {
        (a_mat[ra - 2], a_mat[ra - 1])
    };
    let (k2, n) = if trans_b {
        (b_mat[rb - 1], b_mat[rb - 2])
    } else {
        (b_mat[rb - 2], b_mat[rb - 1])
    };
    if k != k2 {
        return Err(format!("inner sizes {k} and {k2} differ"));
    }
    // The batch: A's and B's leading axes broadcast (Y's, unless a vector dropped one).
    let batch_shape = broadcast(&a_mat[..ra - 2], &b_mat[..rb - 2])?;
    let mut batches = batch_offsets(
        &batch_shape,
        &a_mat[..ra - 2],
        m * k,
        &b_mat[..rb - 2],
        k * n,
    );
    if y_elements != batches.len() * m * n {
        return Err(format!(
            "Y of {y_elements} elements does not hold {}×{m}×{n}",
            batches.len()
        ));
    }
    let mut m = m;
    if rb == 2 && !trans_a && ra > 2 && batches.len() > 1 {
        m *= batches.len();
        batches = vec![(0, 0)];
    }
    Ok(Geometry { m, n, k, batches })
}

fn broadcast(a: &[usize], b: &[usize]) -> Result<Vec<usize>, String> {
    let r = a.len().max(b.len());
    let at = |s: &[usize], i: usize| {
        if i + s.len() >= r {
            s[i + s.len() - r]
        } else {
            1
        }
    };
    (0..r)
        .map(|i| match (at(a, i), at(b, i)) {
            (x, y) if x == y || y == 1 => Ok(x),
            (1, y) => Ok(y),
            (x, y) => Err(format!("batch sizes {x} and {y} do not broadcast")),
        })
        .collect()
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

/// For each index of the broadcast batch `shape`: the element offsets of the A and B
/// matrices (`a_batch`/`b_batch` right-aligned, size-1 axes broadcast).
pub(crate) fn batch_offsets(
    shape: &[usize],
    a_batch: &[usize],
    a_size: usize,
    b_batch: &[usize],
    b_size: usize,
) -> Vec<(usize, usize)> {
    let strides = |batch: &[usize], size: usize| {
        let mut st = vec![0; shape.len()];
        let mut s = size;
        for (i, &d) in batch.iter().enumerate().rev() {
            let axis = shape.len() - batch.len() + i;
            st[axis] = if d == 1 { 0 } else { s };
            s *= d;
        }
        st
    };
    let (sa, sb) = (strides(a_batch, a_size), strides(b_batch, b_size));
    let total: usize = shape.iter().product();
    (0..total)
        .map(|mut idx| {
            let (mut oa, mut ob) = (0, 0);
            for axis in (0..shape.len()).rev() {
                let i = idx % shape[axis];
                idx /= shape[axis];
                oa += i * sa[axis];
                ob += i * sb[axis];
            }
            (oa, ob)
        })
        .collect()
}

impl MatMulStep {
    /// The product of batch `i`.
    unsafe fn one(&self, cx: &Cx, i: usize, pool: Option<&crate::backend::cpu::pool::Pool>) {
        // SAFETY: callers uphold this unsafe fn's contract: pointers valid for the lengths
        // used, and the CPU features it is compiled for.
        unsafe {
            let (oa, ob) = self.batches[i];
            let (m, n, k) = (self.m, self.n, self.k);
            let a = cx.f32(&self.a).add(oa);
            let b = cx.f32(&self.b).add(ob);
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
            let ep = Epilogue {
                bias: match &self.bias {
                    None => Bias::None,
                    Some((s, BiasKind::PerRow)) => Bias::PerRow(cx.f32(s)),
                    Some((s, BiasKind::PerCol)) => Bias::PerCol(cx.f32(s)),
                },
                residual: self.residual.as_ref().map(|z| (cx.f32(z).add(y_off), n)),
                act: self.act,
            };
            let y = cx.f32_mut(&self.y).add(y_off);
            match &self.packed {
                Some(p) => gemm::gemm_packed(pool, m, n, k, a, p, y, n, &ep),
                None => gemm::gemm(pool, m, n, k, a, b, y, n, &ep),
            }
        }
    }
}

impl Kernel for MatMulStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: callers uphold this unsafe fn's contract: pointers valid for the lengths
        // used, and the CPU features it is compiled for.
        unsafe {
            let threads = cx.pool.map_or(1, |p| p.threads());
            match cx.pool {
                // Many small products: one per task, each on one thread.
                Some(pool) if self.batches.len() >= 2 * threads => {
                    pool.run(self.batches.len(), &|i| self.one(cx, i, None))
                }
                _ => (0..self.batches.len()).for_each(|i| self.one(cx, i, cx.pool)),
            }
            Ok(())
        }
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "gemm"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_offsets_broadcast_like_numpy() {
        // A [2,1] batches against B [3]: 2×3 products.
        let offs = batch_offsets(&[2, 3], &[2, 1], 10, &[3], 100);
        assert_eq!(
            offs,
            vec![(0, 0), (0, 100), (0, 200), (10, 0), (10, 100), (10, 200)]
        );
        assert_eq!(broadcast(&[2, 1], &[3]).unwrap(), vec![2, 3]);
        assert!(broadcast(&[2], &[3]).is_err());
    }
}
