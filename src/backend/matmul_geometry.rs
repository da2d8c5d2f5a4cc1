//! The geometry of a matrix product, shared by the backends: the sizes after
//! transposition and, for a batched product broadcast like numpy's matmul, where each
//! GEMM's A and B start. The CPU step and the CUDA runtime both plan their GEMMs with it.

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

/// For each index of the broadcast batch `shape`: the element offsets of the A and B
/// matrices (`a_batch`/`b_batch` right-aligned, size-1 axes broadcast).
fn batch_offsets(
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

    #[test]
    fn a_shared_weight_folds_the_batch_into_rows_and_vectors_become_matrices() {
        let g = geometry(&[2, 3, 4], &[4, 5], 30, false, false).unwrap();
        assert_eq!((g.m, g.n, g.k, g.batches), (6, 5, 4, vec![(0, 0)]));
        // Transposed A cannot fold: one GEMM per batch.
        let g = geometry(&[2, 4, 3], &[4, 5], 30, true, false).unwrap();
        assert_eq!((g.m, g.n, g.k, g.batches), (3, 5, 4, vec![(0, 0), (12, 0)]));
        let g = geometry(&[4], &[4, 5], 5, false, false).unwrap();
        assert_eq!((g.m, g.n, g.k), (1, 5, 4));
        let g = geometry(&[3, 4], &[4], 3, false, false).unwrap();
        assert_eq!((g.m, g.n, g.k), (3, 1, 4));
        let err = geometry(&[3, 4], &[5, 2], 6, false, false).err().unwrap();
        assert!(err.contains("inner sizes 4 and 5"), "{err}");
        let err = geometry(&[3, 4], &[4, 2], 7, false, false).err().unwrap();
        assert!(err.contains("does not hold"), "{err}");
    }
}
