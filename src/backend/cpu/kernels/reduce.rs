//! Reductions over any set of axes of a dense f32 tensor (ReduceSum, Mean, Max, Min,
//! Prod, L1, L2, LogSum, LogSumExp, SumSquare).
//!
//! The input's axes are merged into runs of kept and reduced axes. When the innermost
//! run is reduced, each output element folds contiguous runs with several vector
//! accumulators; when it is kept, each output row accumulates whole input rows
//! lane-wise. Both are vectorized, and the outputs are split over the pool. Floats
//! accumulate in f32 (the interpreter uses f64): sums are off by a few ulp per term at
//! worst, as onnxruntime's are.
use std::ops::Range;

use super::math;
use super::par::{for_ranges, SyncPtr};
use crate::backend::cpu::isa::Isa;
use crate::backend::cpu::pool::Pool;
use crate::ir::ops::reduce::ReduceKind;
use crate::tensor::Elem;

/// The fold that accumulates the kind (LogSumExp's second pass is `ExpSum`).
fn fold_of(kind: ReduceKind) -> Fold {
    match kind {
        ReduceKind::Sum | ReduceKind::Mean | ReduceKind::LogSum => Fold::Sum,
        ReduceKind::Max | ReduceKind::LogSumExp => Fold::Max,
        ReduceKind::Min => Fold::Min,
        ReduceKind::Prod => Fold::Prod,
        ReduceKind::L1 => Fold::AbsSum,
        ReduceKind::L2 | ReduceKind::SumSquare => Fold::SquareSum,
    }
}

/// The accumulated value → the result (`count`: the elements reduced).
fn finish(kind: ReduceKind, acc: f32, count: usize) -> f32 {
    match kind {
        ReduceKind::Mean => acc / count as f32,
        ReduceKind::L2 => acc.sqrt(),
        ReduceKind::LogSum => acc.ln(),
        _ => acc,
    }
}

/// What one pass accumulates: a map of each element and an associative combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fold {
    Sum,
    AbsSum,
    SquareSum,
    /// Σ e^(x − shift): LogSumExp's second pass.
    ExpSum,
    Prod,
    /// NaN wins, as in the interpreter.
    Max,
    Min,
}

impl Fold {
    fn init(self) -> f32 {
        match self {
            Fold::Prod => 1.0,
            Fold::Max => f32::NEG_INFINITY,
            Fold::Min => f32::INFINITY,
            _ => 0.0,
        }
    }

    #[inline(always)]
    fn map(self, x: f32, shift: f32) -> f32 {
        match self {
            Fold::AbsSum => x.abs(),
            Fold::SquareSum => x * x,
            Fold::ExpSum => math::exp(x - shift),
            _ => x,
        }
    }

    #[inline(always)]
    fn combine(self, acc: f32, v: f32) -> f32 {
        match self {
            Fold::Prod => acc * v,
            Fold::Max if v > acc || v.is_nan() => v,
            Fold::Min if v < acc || v.is_nan() => v,
            Fold::Max | Fold::Min => acc,
            _ => acc + v,
        }
    }
}

/// A reduction of one input shape over fixed axes, worked out at compile time.
#[derive(Debug, Clone)]
pub struct ReducePlan {
    /// The kept axes outside the innermost run, as (size, input stride).
    kept: Vec<(usize, usize)>,
    /// The reduced axes outside the innermost run, as (size, input stride).
    reduced: Vec<(usize, usize)>,
    /// The innermost run's length and whether it is reduced.
    inner: usize,
    inner_reduced: bool,
    /// Elements folded into each output, and the input's and output's lengths.
    count: usize,
    in_len: usize,
    out_len: usize,
}

impl ReducePlan {
    /// `axes`: the reduced axes of `shape` (any order, each once).
    pub(crate) fn new(shape: &[usize], axes: &[usize]) -> ReducePlan {
        // Size-1 axes dropped; adjacent axes of the same kind merged (the input is dense).
        let mut runs: Vec<(usize, bool)> = vec![];
        for (ax, &size) in shape.iter().enumerate() {
            let red = axes.contains(&ax);
            if size == 1 {
                continue;
            }
            match runs.last_mut() {
                Some((s, r)) if *r == red => *s *= size,
                _ => runs.push((size, red)),
            }
        }
        let (inner, inner_reduced) = runs.pop().unwrap_or((1, false));
        let mut stride = inner;
        let (mut kept, mut reduced) = (vec![], vec![]);
        for &(size, red) in runs.iter().rev() {
            if red {
                reduced.push((size, stride));
            } else {
                kept.push((size, stride));
            }
            stride *= size;
        }
        kept.reverse();
        reduced.reverse();
        let in_len: usize = shape.iter().product();
        let count: usize = axes.iter().map(|&a| shape[a]).product();
        ReducePlan {
            kept,
            reduced,
            inner,
            inner_reduced,
            count,
            in_len,
            out_len: shape
                .iter()
                .enumerate()
                .filter(|(a, _)| !axes.contains(a))
                .map(|(_, d)| d)
                .product(),
        }
    }

    pub(crate) fn out_len(&self) -> usize {
        self.out_len
    }

    /// The input offset of the `i`-th combination of `axes`.
    #[inline]
    fn offset(axes: &[(usize, usize)], mut i: usize) -> usize {
        let mut off = 0;
        for &(size, stride) in axes.iter().rev() {
            off += (i % size) * stride;
            i /= size;
        }
        off
    }

    fn reduced_combinations(&self) -> usize {
        self.reduced.iter().map(|a| a.0).product()
    }
}

/// Reduces `x` into `y` as `plan` says. LogSumExp with a kept innermost run needs
/// `scratch` of `y.len()` floats (the per-output maxima); otherwise it may be empty.
pub(crate) fn reduce(
    isa: Isa,
    kind: ReduceKind,
    plan: &ReducePlan,
    x: &[f32],
    y: &mut [f32],
    scratch: &mut [f32],
    pool: Option<&Pool>,
) {
    assert_eq!(x.len(), plan.in_len);
    assert_eq!(y.len(), plan.out_len);
    if plan.out_len == 0 {
        return;
    }
    if plan.count == 0 {
        // Nothing to fold: the identity, finished (LogSumExp's is -inf = ln 0).
        y.fill(finish(kind, fold_of(kind).init(), 0));
        return;
    }
    let yp = SyncPtr(y.as_mut_ptr());
    if plan.inner_reduced {
        let per = plan.count;
        for_ranges(pool, plan.out_len, per, &|r| {
            // SAFETY: each task writes its own outputs.
            let y = unsafe { std::slice::from_raw_parts_mut(yp.get().add(r.start), r.len()) };
            runs_reduced(isa, kind, plan, x, y, r);
        });
    } else {
        assert!(kind != ReduceKind::LogSumExp || scratch.len() >= plan.out_len);
        let rows = plan.out_len / plan.inner;
        let pieces = if rows >= 8 {
            1
        } else {
            (plan.inner / 1024).clamp(1, 8)
        };
        let chunk = plan.inner.div_ceil(pieces);
        let sp = SyncPtr(scratch.as_mut_ptr());
        for_ranges(pool, rows * pieces, chunk * plan.count, &|r| {
            for t in r {
                let (row, piece) = (t / pieces, t % pieces);
                let j = piece * chunk..((piece + 1) * chunk).min(plan.inner);
                let at = row * plan.inner + j.start;
                // SAFETY: each task writes its own run of y and of the scratch.
                let (y, m) = unsafe {
                    (
                        std::slice::from_raw_parts_mut(yp.get().add(at), j.len()),
                        std::slice::from_raw_parts_mut(sp.get().add(at), j.len()),
                    )
                };
                rows_kept(isa, kind, plan, x, row, j, y, m);
            }
        });
    }
}

/// Reduces `x` into `y` as `plan` says on a dtype other than f32, as the interpreter
/// does: integers in i64, wrapping (the kinds integers take: Sum, Max, Min, Prod, L1,
/// SumSquare), floats in f64, each output rounded once.
pub(crate) fn reduce_elem<T: Elem>(
    kind: ReduceKind,
    plan: &ReducePlan,
    x: &[T],
    y: &mut [T],
    pool: Option<&Pool>,
) {
    assert_eq!(x.len(), plan.in_len);
    assert_eq!(y.len(), plan.out_len);
    let combos = plan.reduced_combinations();
    let int = T::DTYPE.is_int();
    // Every input element folded into output o, in order.
    let visit = |o: usize, f: &mut dyn FnMut(T)| {
        let (base, run) = if plan.inner_reduced {
            (ReducePlan::offset(&plan.kept, o), plan.inner)
        } else {
            let (row, j) = (o / plan.inner, o % plan.inner);
            (ReducePlan::offset(&plan.kept, row) + j, 1)
        };
        for c in 0..combos {
            let at = base + ReducePlan::offset(&plan.reduced, c);
            x[at..at + run].iter().for_each(|&v| f(v));
        }
    };
    let yp = SyncPtr(y.as_mut_ptr());
    for_ranges(pool, plan.out_len, plan.count, &|r| {
        for o in r {
            let out = if int {
                let (init, f): (i64, fn(i64, i64) -> i64) = match kind {
                    ReduceKind::Max => (i64::MIN, |a, v| a.max(v)),
                    ReduceKind::Min => (i64::MAX, |a, v| a.min(v)),
                    ReduceKind::Prod => (1, |a, v| a.wrapping_mul(v)),
                    ReduceKind::L1 => (0, |a, v| a.wrapping_add(v.wrapping_abs())),
                    ReduceKind::SumSquare => (0, |a, v| a.wrapping_add(v.wrapping_mul(v))),
                    _ => (0, |a, v| a.wrapping_add(v)),
                };
                let mut acc = init;
                visit(o, &mut |v| acc = f(acc, v.to_i64()));
                T::from_i64(acc)
            } else {
                let fold = |shift: f64, map: fn(f64, f64) -> f64, max: bool| {
                    let mut acc = if max { f64::NEG_INFINITY } else { 0.0 };
                    visit(o, &mut |v| {
                        let v = map(v.to_f64(), shift);
                        acc = if !max {
                            acc + v
                        } else if v > acc || v.is_nan() {
                            v
                        } else {
                            acc
                        };
                    });
                    acc
                };
                let id = |v: f64, _| v;
                let count = plan.count as f64;
                T::from_f64(match kind {
                    ReduceKind::Sum => fold(0.0, id, false),
                    ReduceKind::Mean => fold(0.0, id, false) / count,
                    ReduceKind::Max => fold(0.0, id, true),
                    ReduceKind::Min => -fold(0.0, |v, _| -v, true),
                    ReduceKind::Prod => {
                        let mut acc = 1.0;
                        visit(o, &mut |v| acc *= v.to_f64());
                        acc
                    }
                    ReduceKind::L1 => fold(0.0, |v, _| v.abs(), false),
                    ReduceKind::L2 => fold(0.0, |v, _| v * v, false).sqrt(),
                    ReduceKind::LogSum => fold(0.0, id, false).ln(),
                    ReduceKind::SumSquare => fold(0.0, |v, _| v * v, false),
                    ReduceKind::LogSumExp => {
                        let m = fold(0.0, id, true);
                        let m = if m.is_finite() { m } else { 0.0 };
                        fold(m, |v, m| (v - m).exp(), false).ln() + m
                    }
                })
            };
            // SAFETY: o < out_len, and each task writes its own outputs.
            unsafe { *yp.get().add(o) = out };
        }
    });
}

/// Outputs `r` when the innermost run is reduced: each folds its contiguous runs.
fn runs_reduced(
    isa: Isa,
    kind: ReduceKind,
    plan: &ReducePlan,
    x: &[f32],
    y: &mut [f32],
    r: Range<usize>,
) {
    let combos = plan.reduced_combinations();
    let fold_all = |base: usize, fold: Fold, shift: f32| {
        let mut acc = fold.init();
        for c in 0..combos {
            let at = base + ReducePlan::offset(&plan.reduced, c);
            acc = fold.combine(acc, fold_run(isa, fold, &x[at..at + plan.inner], shift));
        }
        acc
    };
    for (o, out) in r.zip(y) {
        let base = ReducePlan::offset(&plan.kept, o);
        *out = if kind == ReduceKind::LogSumExp {
            let m = fold_all(base, Fold::Max, 0.0);
            let m = if m.is_finite() { m } else { 0.0 };
            fold_all(base, Fold::ExpSum, m).ln() + m
        } else {
            finish(kind, fold_all(base, fold_of(kind), 0.0), plan.count)
        };
    }
}

/// Columns `j` of output row `row` when the innermost run is kept: whole input rows
/// accumulate lane-wise into `y`; `m` holds LogSumExp's maxima.
#[allow(clippy::too_many_arguments)]
fn rows_kept(
    isa: Isa,
    kind: ReduceKind,
    plan: &ReducePlan,
    x: &[f32],
    row: usize,
    j: Range<usize>,
    y: &mut [f32],
    m: &mut [f32],
) {
    let base = ReducePlan::offset(&plan.kept, row) + j.start;
    let n = j.len();
    let pass = |fold: Fold, acc: &mut [f32], shift: &[f32]| {
        acc.fill(fold.init());
        for c in 0..plan.reduced_combinations() {
            let at = base + ReducePlan::offset(&plan.reduced, c);
            fold_rows(isa, fold, acc, &x[at..at + n], shift);
        }
    };
    if kind == ReduceKind::LogSumExp {
        pass(Fold::Max, m, &[]);
        m.iter_mut()
            .filter(|v| !v.is_finite())
            .for_each(|v| *v = 0.0);
        pass(Fold::ExpSum, y, m);
        for (v, m) in y.iter_mut().zip(m.iter()) {
            *v = v.ln() + m;
        }
    } else {
        pass(fold_of(kind), y, &[]);
        y.iter_mut().for_each(|v| *v = finish(kind, *v, plan.count));
    }
}

/// The fold of one contiguous run.
fn fold_run(isa: Isa, fold: Fold, x: &[f32], shift: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if math::use_avx2(isa) {
        // SAFETY: `use_avx2` just saw AVX2 and FMA on this CPU, all `fold_run` needs.
        return unsafe { avx2::fold_run(fold, x, shift) };
    }
    let _ = isa;
    x.iter()
        .fold(fold.init(), |acc, &v| fold.combine(acc, fold.map(v, shift)))
}

/// `acc[k] = combine(acc[k], map(x[k], shift[k]))` (`shift` only for `ExpSum`).
fn fold_rows(isa: Isa, fold: Fold, acc: &mut [f32], x: &[f32], shift: &[f32]) {
    assert_eq!(acc.len(), x.len());
    assert!(fold != Fold::ExpSum || shift.len() == x.len());
    #[cfg(target_arch = "x86_64")]
    if math::use_avx2(isa) {
        // SAFETY: AVX2+FMA detected by `use_avx2`; `x` is as long as `acc` and so is
        // `shift` for ExpSum (both asserted above).
        unsafe { avx2::fold_rows(fold, acc, x, shift) };
        return;
    }
    let _ = isa;
    for (k, (a, &v)) in acc.iter_mut().zip(x).enumerate() {
        let s = if fold == Fold::ExpSum { shift[k] } else { 0.0 };
        *a = fold.combine(*a, fold.map(v, s));
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::Fold;
    use crate::backend::cpu::kernels::math::avx2 as vm;
    use std::arch::x86_64::*;

    // `map`, `combine`, `run` and `rows` are `#[inline(always)]`, which `#[target_feature]`
    // does not allow, so that each fold's loop is specialised with no branch in it: so
    // they are `unsafe fn`s whose contract is the CPU features, called from the two
    // `#[target_feature]` entry points below.

    /// `x` under the fold's map (|x|, x², e^(x − shift), else x).
    ///
    /// # Safety
    /// The CPU has AVX2+FMA.
    #[inline(always)]
    unsafe fn map(fold: Fold, x: __m256, shift: __m256) -> __m256 {
        // SAFETY: the caller promises AVX2+FMA, all these register operations need.
        unsafe {
            match fold {
                Fold::AbsSum => vm::abs(x),
                Fold::SquareSum => _mm256_mul_ps(x, x),
                Fold::ExpSum => vm::exp(_mm256_sub_ps(x, shift)),
                _ => x,
            }
        }
    }

    /// The fold's vector combine (product, NaN-keeping max/min, else sum).
    ///
    /// # Safety
    /// The CPU has AVX2+FMA.
    #[inline(always)]
    unsafe fn combine(fold: Fold, acc: __m256, v: __m256) -> __m256 {
        // SAFETY: register-only AVX/AVX2 work, and the contract says the CPU has them.
        unsafe {
            match fold {
                Fold::Prod => _mm256_mul_ps(acc, v),
                Fold::Max | Fold::Min => vm::max_min_nan(fold == Fold::Max, acc, v),
                _ => _mm256_add_ps(acc, v),
            }
        }
    }

    /// # Safety
    /// AVX2+FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn fold_run(fold: Fold, x: &[f32], shift: f32) -> f32 {
        // One instantiation per fold, so that the loop has no branch in it.
        macro_rules! with {
            ($($f:ident)*) => {
                // SAFETY: `run` needs only AVX2+FMA, which `fold_run` is compiled for.
                unsafe {
                    match fold {
                        $(Fold::$f => run(Fold::$f, x, shift),)*
                    }
                }
            };
        }
        with!(Sum AbsSum SquareSum ExpSum Prod Max Min)
    }

    /// # Safety
    /// The CPU has AVX2+FMA.
    #[inline(always)]
    unsafe fn run(fold: Fold, x: &[f32], shift: f32) -> f32 {
        let n = x.len();
        let p = x.as_ptr();
        // SAFETY: a register broadcast; the contract gives AVX.
        let s = unsafe { _mm256_set1_ps(shift) };
        // Four accumulators hide the add latency.
        // SAFETY: as for `s`, a broadcast of the fold's identity.
        let mut acc = [unsafe { _mm256_set1_ps(fold.init()) }; 4];
        let mut i = 0;
        while i + 32 <= n {
            for (k, a) in acc.iter_mut().enumerate() {
                // SAFETY: `i + 8·k + 8 <= i + 32 <= n` (k < 4, loop bound): inside `x`;
                // map and combine need AVX2+FMA, which the contract gives.
                *a = unsafe { combine(fold, *a, map(fold, _mm256_loadu_ps(p.add(i + 8 * k)), s)) };
            }
            i += 32;
        }
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n` by the loop bound, so `x[i..i + 8]`; AVX2+FMA (contract).
            acc[0] = unsafe { combine(fold, acc[0], map(fold, _mm256_loadu_ps(p.add(i)), s)) };
            i += 8;
        }
        let mut lanes = [0f32; 32];
        for (k, a) in acc.iter().enumerate() {
            // SAFETY: `k < 4`, so `lanes[8·k..8·k + 8]` is inside the local 32 floats.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr().add(8 * k), *a) };
        }
        let mut r = fold.init();
        for v in lanes {
            r = fold.combine(r, v);
        }
        for &v in &x[i..] {
            r = fold.combine(r, fold.map(v, shift));
        }
        r
    }

    /// # Safety
    /// AVX2+FMA; `x` as long as `acc`, and `shift` too for `ExpSum`.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn fold_rows(fold: Fold, acc: &mut [f32], x: &[f32], shift: &[f32]) {
        macro_rules! with {
            ($($f:ident)*) => {
                // SAFETY: `rows` needs AVX2+FMA (enabled here) and the lengths that the
                // caller of `fold_rows` promised for these same slices.
                unsafe {
                    match fold {
                        $(Fold::$f => rows(Fold::$f, acc, x, shift),)*
                    }
                }
            };
        }
        with!(Sum AbsSum SquareSum ExpSum Prod Max Min)
    }

    /// # Safety
    /// AVX2+FMA; `x` as long as `acc`, and `shift` too for `ExpSum`.
    #[inline(always)]
    unsafe fn rows(fold: Fold, acc: &mut [f32], x: &[f32], shift: &[f32]) {
        let n = acc.len();
        let (a, p) = (acc.as_mut_ptr(), x.as_ptr());
        let exp = fold == Fold::ExpSum;
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n` by the loop bound; `shift` holds `n` floats when `exp`
            // (contract); AVX (contract) for the zero vector otherwise.
            let s = unsafe {
                if exp {
                    _mm256_loadu_ps(shift.as_ptr().add(i))
                } else {
                    _mm256_setzero_ps()
                }
            };
            // SAFETY: `x` and `acc` hold `n` floats (contract) and `i + 8 <= n`; `acc` is
            // `&mut`, so `a` is its only access; AVX2+FMA by the contract.
            unsafe {
                let v = map(fold, _mm256_loadu_ps(p.add(i)), s);
                _mm256_storeu_ps(a.add(i), combine(fold, _mm256_loadu_ps(a.add(i)), v));
            }
            i += 8;
        }
        for k in i..n {
            let s = if exp { shift[k] } else { 0.0 };
            acc[k] = fold.combine(acc[k], fold.map(x[k], s));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::kernels::math::tests::isas;
    use crate::backend::cpu::kernels::testutil::{lcg_data, pools};
    use crate::ir::ops::{self, EvalCtx};
    use crate::ir::{Attr, Attrs, DType, Shape, TensorType};
    use crate::tensor::Tensor;

    const KINDS: [(&str, ReduceKind); 10] = [
        ("ReduceSum", ReduceKind::Sum),
        ("ReduceMean", ReduceKind::Mean),
        ("ReduceMax", ReduceKind::Max),
        ("ReduceMin", ReduceKind::Min),
        ("ReduceProd", ReduceKind::Prod),
        ("ReduceL1", ReduceKind::L1),
        ("ReduceL2", ReduceKind::L2),
        ("ReduceLogSum", ReduceKind::LogSum),
        ("ReduceLogSumExp", ReduceKind::LogSumExp),
        ("ReduceSumSquare", ReduceKind::SumSquare),
    ];

    fn interp(name: &str, x: &Tensor, axes: &[usize]) -> Tensor {
        let axes_t = Tensor::from_vec(
            &[axes.len()],
            axes.iter().map(|&a| a as i64).collect::<Vec<_>>(),
        )
        .unwrap();
        let ins = [Some(x), Some(&axes_t)];
        let xt = TensorType::new(DType::F32, Shape::fixed(x.shape()));
        let types = [Some(&xt), None];
        let attrs = Attrs::new().with("noop_with_empty_axes", Attr::Int(1));
        let cx = EvalCtx {
            inputs: &ins,
            input_types: &types,
            attrs: &attrs,
        };
        ops::lookup(name).unwrap().eval(&cx).unwrap().remove(0)
    }

    /// Every kind over every axis pattern (inner reduced or kept, several reduced runs,
    /// size-1 and empty axes, long runs split over the pool) against the interpreter:
    /// exact for Max/Min, else within 2e-6 of the f64 result relative to the summed
    /// magnitudes (f32 accumulation), NaN where it is.
    #[test]
    fn reductions_match_interpreter() {
        let cases: Vec<(Vec<usize>, Vec<usize>)> = vec![
            (vec![37], vec![0]),
            (vec![5, 37], vec![1]),
            (vec![5, 37], vec![0]),
            (vec![5, 37], vec![0, 1]),
            (vec![2, 3, 4, 9], vec![1, 3]),
            (vec![2, 3, 4, 9], vec![0, 2]),
            (vec![3, 1, 20], vec![1]),
            (vec![3, 1, 20], vec![]),
            (vec![4, 0, 3], vec![1]),
            (vec![4, 0, 3], vec![2]),
            (vec![2, 3000], vec![0]),
            (vec![3000, 7], vec![1]),
            (vec![6, 128, 64], vec![2]),
        ];
        for pool in pools() {
            for isa in isas() {
                for (shape, axes) in &cases {
                    let n: usize = shape.iter().product();
                    let mut data = lcg_data(n, 1.5, n as u64);
                    for (name, kind) in KINDS {
                        if kind == ReduceKind::Prod || kind == ReduceKind::LogSum {
                            // Products near 1, sums away from 0.
                            data.iter_mut().for_each(|v| *v = 1.0 + v.abs() * 0.01);
                        }
                        let x = Tensor::from_vec(shape, data.clone()).unwrap();
                        let want = interp(name, &x, axes).to_f64_vec();
                        let plan = ReducePlan::new(shape, axes);
                        let mut y = vec![0.0; plan.out_len()];
                        let mut scratch = vec![0.0; plan.out_len()];
                        reduce(isa, kind, &plan, &data, &mut y, &mut scratch, pool.as_ref());
                        let mag: f64 = data.iter().map(|v| v.abs() as f64).sum::<f64>().max(1.0);
                        for (k, (g, w)) in y.iter().zip(&want).enumerate() {
                            let tol = match kind {
                                ReduceKind::Max | ReduceKind::Min => 0.0,
                                ReduceKind::Prod => 1e-5 * w.abs(),
                                _ => 2e-6 * mag.min(1e4) + 2e-6 * w.abs(),
                            };
                            let ok = (g.is_nan() && w.is_nan())
                                || *g as f64 == *w
                                || (*g as f64 - w).abs() <= tol;
                            assert!(
                                ok,
                                "{name} {shape:?} {axes:?} {} at {k}: {g} vs {w}",
                                isa.name()
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn nan_wins_max_and_min() {
        for isa in isas() {
            for at in [0, 5, 40] {
                let mut x = lcg_data(48, 1.0, 3);
                x[at] = f32::NAN;
                let plan = ReducePlan::new(&[48], &[0]);
                for kind in [ReduceKind::Max, ReduceKind::Min] {
                    let mut y = [0.0];
                    reduce(isa, kind, &plan, &x, &mut y, &mut [], None);
                    assert!(
                        y[0].is_nan(),
                        "{kind:?} {} NaN at {at}: {}",
                        isa.name(),
                        y[0]
                    );
                }
                let plan = ReducePlan::new(&[6, 8], &[0]);
                let mut y = [0.0; 8];
                reduce(isa, ReduceKind::Max, &plan, &x, &mut y, &mut [], None);
                assert!(y[at % 8].is_nan());
                assert_eq!(y.iter().filter(|v| v.is_nan()).count(), 1);
            }
        }
    }
}
