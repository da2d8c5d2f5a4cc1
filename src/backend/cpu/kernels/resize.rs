//! Linear and cubic `Resize`, computing in f32 for f32 and in f64 for the other dtypes
//! (widened on load, rounded at the store by the caller): one 1-D pass per resized axis (the reference's
//! separable interpolation), each output index a weighted sum of its taps. A pass over
//! an axis with elements after it (H of NCHW) adds whole input rows scaled by their
//! weight, a loop the compiler vectorizes; a pass over the last axis sums gathered
//! elements. Nearest resizing is a table copy (`movement::TableCopy`), not this.
use super::par::{for_ranges, SyncPtr};
use crate::backend::cpu::pool::Pool;

/// The number type a pass computes in.
pub trait Weight:
    Copy + Default + Send + Sync + std::ops::Mul<Output = Self> + std::ops::AddAssign
{
    fn of(w: f64) -> Self;
}
impl Weight for f32 {
    fn of(w: f64) -> f32 {
        w as f32
    }
}
impl Weight for f64 {
    fn of(w: f64) -> f64 {
        w
    }
}

/// One axis' interpolation: the tensor seen as `[outer, n_in, inner]` becomes
/// `[outer, n_out, inner]`.
#[derive(Debug, Clone)]
pub struct AxisPass<F> {
    outer: usize,
    n_in: usize,
    inner: usize,
    /// Per output index, its range in `index`/`weight` (empty: the extrapolation value).
    taps: Vec<(u32, u32)>,
    index: Vec<usize>,
    weight: Vec<F>,
}

impl<F: Weight> AxisPass<F> {
    /// The pass over axis `axis` of `dims` with, per output index, its (input index,
    /// weight) taps or `None` (extrapolated). Zero weights are dropped.
    pub fn new(dims: &[usize], axis: usize, taps: &[Option<Vec<(usize, f64)>>]) -> Self {
        let (mut index, mut weight, mut ranges) = (vec![], vec![], vec![]);
        for t in taps {
            let start = index.len() as u32;
            for &(i, w) in t.iter().flatten() {
                if w != 0.0 {
                    index.push(i);
                    weight.push(F::of(w));
                }
            }
            ranges.push((start, index.len() as u32));
        }
        AxisPass {
            outer: dims[..axis].iter().product(),
            n_in: dims[axis],
            inner: dims[axis + 1..].iter().product(),
            taps: ranges,
            index,
            weight,
        }
    }

    fn n_out(&self) -> usize {
        self.taps.len()
    }

    /// Elements of the pass' output.
    pub fn out_len(&self) -> usize {
        self.outer * self.n_out() * self.inner
    }

    /// Runs the pass from `x` into `y`; `extrapolated` is the value of points with no taps.
    ///
    /// # Safety
    /// `x` holds `outer · n_in · inner` floats, `y` [`AxisPass::out_len`]; no overlap.
    pub unsafe fn run(&self, x: *const F, y: *mut F, extrapolated: F, pool: Option<&Pool>) {
        let (xs, ys) = (SyncPtr(x as *mut F), SyncPtr(y));
        let (n_out, inner, n_in) = (self.n_out(), self.inner, self.n_in);
        let taps_per = self.index.len().div_ceil(n_out.max(1)).max(1);
        if inner == 1 {
            for_ranges(pool, self.outer, n_out * taps_per, &|r| {
                for o in r {
                    // SAFETY: row o < outer of x (n_in floats) and of y (n_out floats) lie
                    // inside their buffers.
                    let (xr, yr) = unsafe { (xs.get().add(o * n_in), ys.get().add(o * n_out)) };
                    for (j, &(s, e)) in self.taps.iter().enumerate() {
                        let mut acc = if s == e { extrapolated } else { F::default() };
                        for t in s as usize..e as usize {
                            // SAFETY: tap index self.index[t] < n_in (clamped by the
                            // reference): inside row o of x.
                            acc += self.weight[t] * unsafe { *xr.add(self.index[t]) };
                        }
                        // SAFETY: output j < n_out (one tap range each) of row o, which
                        // only this task writes.
                        unsafe { *yr.add(j) = acc };
                    }
                }
            });
            return;
        }
        for_ranges(pool, self.outer * n_out, inner * taps_per, &|r| {
            for row in r {
                let (o, j) = (row / n_out, row % n_out);
                let (s, e) = self.taps[j];
                // SAFETY: output row `row` < outer·n_out holds inner floats inside y, and
                // only this task writes it.
                let out =
                    unsafe { std::slice::from_raw_parts_mut(ys.get().add(row * inner), inner) };
                if s == e {
                    out.fill(extrapolated);
                    continue;
                }
                let input = |t: usize| {
                    let at = (o * n_in + self.index[t]) * inner;
                    // SAFETY: input row index[t] < n_in of outer index o: inner floats
                    // inside x, which does not overlap y.
                    unsafe { std::slice::from_raw_parts(xs.get().add(at), inner) }
                };
                let (s, e) = (s as usize, e as usize);
                let w0 = self.weight[s];
                for (d, &v) in out.iter_mut().zip(input(s)) {
                    *d = w0 * v;
                }
                for t in s + 1..e {
                    let w = self.weight[t];
                    for (d, &v) in out.iter_mut().zip(input(t)) {
                        *d += w * v;
                    }
                }
            }
        });
    }
}

/// A whole resize: its passes in order, the intermediate results alternating between
/// two scratch buffers.
#[derive(Debug, Clone)]
pub struct ResizePlan<F> {
    pub passes: Vec<AxisPass<F>>,
    pub extrapolated: F,
}

impl<F: Weight> ResizePlan<F> {
    /// Floats of each of the two scratch buffers.
    pub fn scratch_len(&self) -> usize {
        let n = self.passes.len().saturating_sub(1);
        self.passes[..n]
            .iter()
            .map(AxisPass::<F>::out_len)
            .max()
            .unwrap_or(0)
    }

    /// Runs every pass from `x` to `y`.
    ///
    /// # Safety
    /// `x` holds the input, `y` the output, `scratch` twice [`ResizePlan::scratch_len`]
    /// floats; none overlap.
    pub unsafe fn run(&self, x: *const F, y: *mut F, scratch: *mut F, pool: Option<&Pool>) {
        let half = self.scratch_len();
        let mut from = x;
        for (k, pass) in self.passes.iter().enumerate() {
            let to = if k + 1 == self.passes.len() {
                y
            } else {
                // SAFETY: scratch holds two halves (the caller's contract).
                unsafe { scratch.add((k % 2) * half) }
            };
            // SAFETY: `from` holds this pass' input (x or the previous half), `to` its output.
            unsafe { pass.run(from, to, self.extrapolated, pool) };
            from = to;
        }
    }
}
