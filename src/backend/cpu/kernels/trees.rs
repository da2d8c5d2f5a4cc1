//! Tree ensembles over rows in parallel: rows converted to f64 and walked, several at a
//! time, by the interpreter's own [`Ensemble`] (built once at lowering), so the scores
//! are its own.
use std::sync::Mutex;

use super::par::{for_ranges, SyncPtr};
use crate::backend::cpu::pool::Pool;
use crate::ir::ops::tree::Ensemble;
use crate::ir::DType;

/// Where a tree step's rows go: f32 scores `[rows × width]` and, for a classifier with
/// integer labels, each row's label.
pub(crate) struct TreeOutputs<'a> {
    pub scores: *mut f32,
    pub labels: Option<(*mut i64, &'a [i64])>,
}

/// `out.len()` elements of `x` (of `dtype`: f32, f64, i32 or i64) from element `at` on,
/// as f64.
///
/// # Safety
/// `x` holds at least `at + out.len()` elements of `dtype`.
unsafe fn read_f64s(x: *const u8, dtype: DType, at: usize, out: &mut [f64]) {
    macro_rules! read {
        ($t:ty) => {
            for (k, v) in out.iter_mut().enumerate() {
                // SAFETY: element at + k < at + out.len() of x's `$t`s (contract).
                *v = unsafe { *(x as *const $t).add(at + k) } as f64;
            }
        };
    }
    match dtype {
        DType::F64 => read!(f64),
        DType::I64 => read!(i64),
        DType::I32 => read!(i32),
        _ => read!(f32),
    }
}

/// Runs `e` over `rows` rows of `features` values at `x` (of its dtype: f32, f64, i32 or
/// i64).
///
/// # Safety
/// `x` readable for rows × features values; `scratch` writable for rows × (features +
/// width) f64 and `seen` for rows × width bools; the outputs writable for their rows.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn ensemble_rows(
    e: &Ensemble,
    (x, x_dtype): (*const u8, DType),
    rows: usize,
    features: usize,
    scratch: *mut f64,
    seen: *mut bool,
    out: &TreeOutputs,
    pool: Option<&Pool>,
) -> Result<(), String> {
    let width = e.width();
    let failure = Mutex::new(None);
    let (xp, sp, seenp) = (SyncPtr(x as *mut u8), SyncPtr(scratch), SyncPtr(seen));
    let scores = SyncPtr(out.scores);
    let labels = out.labels.map(|(p, l)| (SyncPtr(p), l));
    let work = e.width().max(1) * 64;
    for_ranges(pool, rows, work, &|range| {
        // Rows in groups whose picks fit on the stack; the ensemble interleaves their walks.
        const GROUP: usize = 64;
        for start in range.clone().step_by(GROUP) {
            let n = GROUP.min(range.end - start);
            let mut picks = [0usize; GROUP];
            // SAFETY: rows `start..start + n` (all < rows) are this task's: their
            // `n · features` f64 at the scratch's front are inside its rows × (features +
            // width) (contract), and no other task touches them.
            let x = unsafe {
                std::slice::from_raw_parts_mut(sp.get().add(start * features), n * features)
            };
            // SAFETY: elements `start · features ..` of this group's `n · features` of `x`,
            // which holds rows × features of `x_dtype` (contract).
            unsafe { read_f64s(xp.get(), x_dtype, start * features, x) };
            // SAFETY: the scores scratch after the rows × features converted rows, at this
            // group's `n · width` f64: inside the scratch, disjoint from `x` above.
            let s = unsafe {
                std::slice::from_raw_parts_mut(
                    sp.get().add(rows * features + start * width),
                    n * width,
                )
            };
            // SAFETY: `seen` holds rows × width bools (contract); these are this group's.
            let seen = unsafe {
                std::slice::from_raw_parts_mut(seenp.get().add(start * width), n * width)
            };
            let result = e.rows(x, features, s, seen, &mut picks[..n]);
            for (k, &v) in s.iter().enumerate() {
                // SAFETY: `k < n · width`: this group's scores in the rows × width output.
                unsafe { *scores.get().add(start * width + k) = v as f32 };
            }
            if let Err(m) = result {
                if let Ok(mut f) = failure.lock() {
                    f.get_or_insert(m);
                }
                return;
            }
            if let Some((p, l)) = labels {
                for (r, &pick) in picks[..n].iter().enumerate() {
                    // SAFETY: `start + r < rows`, inside the labels output (one per row), and
                    // this task's row; `l.get` bounds the label itself.
                    unsafe { *p.get().add(start + r) = l.get(pick).copied().unwrap_or_default() };
                }
            }
        }
    });
    match failure.into_inner() {
        Ok(Some(m)) => Err(m),
        _ => Ok(()),
    }
}
