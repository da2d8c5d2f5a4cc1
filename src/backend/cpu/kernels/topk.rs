//! TopK along an axis of `[outer, len, inner]` (any dtype; floats compared as f64,
//! integers exactly, as the interpreter does): per lane the k largest (or smallest)
//! values, best first, and their indices, ties in index order: the interpreter's order
//! ([`topk_cmp`], then the index), a total one, so selecting the k best and sorting
//! only them gives it exactly.
use super::par::SyncPtr;
use crate::backend::cpu::pool::Pool;
use crate::ir::ops::select::topk_cmp;
use crate::tensor::Elem;

/// Where a TopK's operands are and what it selects.
pub(crate) struct TopK {
    pub dims: [usize; 3],
    pub k: usize,
    pub largest: bool,
}

impl TopK {
    /// u32 entries of scratch [`TopK::run`] needs with `threads` threads.
    pub(crate) fn scratch_len(&self, threads: usize) -> usize {
        self.tasks(threads) * self.dims[1]
    }

    fn tasks(&self, threads: usize) -> usize {
        let lanes = self.dims[0] * self.dims[2];
        threads.min(lanes).max(1)
    }

    /// # Safety
    /// `x` readable for outer·len·inner floats; `values` and `indices` writable for
    /// outer·k·inner elements; `scratch` for [`TopK::scratch_len`] of the pool's threads.
    pub(crate) unsafe fn run<T: Elem>(
        &self,
        x: *const T,
        values: *mut T,
        indices: *mut i64,
        scratch: *mut u32,
        pool: Option<&Pool>,
    ) {
        let [outer, len, inner] = self.dims;
        let lanes = outer * inner;
        if lanes == 0 || self.k == 0 {
            return;
        }
        let tasks = self.tasks(pool.map_or(1, Pool::threads));
        let (xp, vp, ip, sp) = (
            SyncPtr(x as *mut T),
            SyncPtr(values),
            SyncPtr(indices),
            SyncPtr(scratch),
        );
        let task = |t: usize| {
            // SAFETY: task `t < tasks` owns scratch slot t, `len` u32 at `t · len`, inside the
            // scratch of `scratch_len` = tasks · len entries (contract).
            let order = unsafe { std::slice::from_raw_parts_mut(sp.get().add(t * len), len) };
            for lane in t * lanes / tasks..(t + 1) * lanes / tasks {
                let (o, i) = (lane / inner, lane % inner);
                // SAFETY: `o < outer`, `i < inner` and `j < len` (an entry of `order`), so
                // the element is inside `x`'s outer·len·inner floats (contract).
                let at = |j: u32| unsafe { *xp.get().add((o * len + j as usize) * inner + i) };
                self.lane(order, &|p, q| topk_cmp(at(p), at(q)));
                for (slot, &j) in order[..self.k].iter().enumerate() {
                    let out = (o * self.k + slot) * inner + i;
                    // SAFETY: `slot < k`, so `out` is inside the outer·k·inner elements of
                    // `values` and `indices` (contract); lane (o, i) is this task's alone.
                    unsafe {
                        *vp.get().add(out) = at(j);
                        *ip.get().add(out) = j as i64;
                    }
                }
            }
        };
        match pool {
            Some(p) if tasks > 1 => p.run(tasks, &task),
            _ => (0..tasks).for_each(task),
        }
    }

    /// Orders the first k entries of `order` as the interpreter's stable sort would.
    fn lane(&self, order: &mut [u32], cmp: &dyn Fn(u32, u32) -> std::cmp::Ordering) {
        for (j, o) in order.iter_mut().enumerate() {
            *o = j as u32;
        }
        let total = |p: &u32, q: &u32| {
            let c = cmp(*p, *q);
            if self.largest { c.reverse() } else { c }.then(p.cmp(q))
        };
        let k = self.k;
        if k < order.len() {
            order.select_nth_unstable_by(k - 1, total);
        }
        order[..k].sort_unstable_by(total);
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{lcg_data, pools};
    use super::*;
    use crate::ir::ops::{self, EvalCtx};
    use crate::ir::{Attr, Attrs};
    use crate::tensor::Tensor;

    #[test]
    fn matches_the_interpreter_with_ties_and_nans() {
        for pool in pools() {
            for &(dims, k) in &[
                ([1, 10, 1], 3),
                ([3, 7, 5], 7),
                ([2, 50, 3], 1),
                ([4, 33, 1], 20),
                ([1, 1, 1], 1),
            ] {
                let [outer, len, inner] = dims;
                // Few distinct values: many ties; a NaN in some lanes.
                let mut x: Vec<f32> = lcg_data(outer * len * inner, 4.0, len as u64)
                    .iter()
                    .map(|v| v.round())
                    .collect();
                if x.len() > 9 {
                    x[4] = f32::NAN;
                }
                for largest in [true, false] {
                    let t = TopK { dims, k, largest };
                    let mut v = vec![0.0f32; outer * k * inner];
                    let mut idx = vec![0i64; outer * k * inner];
                    let mut scratch = vec![0u32; t.scratch_len(2)];
                    // SAFETY: every buffer has the length run asks for.
                    unsafe {
                        t.run(
                            x.as_ptr(),
                            v.as_mut_ptr(),
                            idx.as_mut_ptr(),
                            scratch.as_mut_ptr(),
                            pool.as_ref(),
                        )
                    };
                    let xt = Tensor::from_vec(&[outer, len, inner], x.clone()).unwrap();
                    let kt = Tensor::from_vec(&[1], vec![k as i64]).unwrap();
                    let mut attrs = Attrs::new();
                    attrs.set("axis", Attr::Int(1));
                    attrs.set("largest", Attr::Int(largest as i64));
                    let cx = EvalCtx {
                        inputs: &[Some(&xt), Some(&kt)],
                        input_types: &[None, None],
                        attrs: &attrs,
                    };
                    let want = ops::lookup("TopK").unwrap().eval(&cx).unwrap();
                    assert_eq!(
                        idx,
                        want[1].to_i64_vec(),
                        "{dims:?} k={k} largest={largest}"
                    );
                    let got: Vec<f64> = v.iter().map(|&v| v as f64).collect();
                    let want: Vec<f64> = want[0].to_f64_vec();
                    assert!(
                        got.iter()
                            .zip(&want)
                            .all(|(a, b)| a == b || (a.is_nan() && b.is_nan())),
                        "{dims:?} k={k}: {got:?} vs {want:?}"
                    );
                }
            }
        }
    }
}
