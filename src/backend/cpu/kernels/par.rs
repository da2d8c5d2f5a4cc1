//! Splitting row-parallel kernels over the intra-op [`Pool`].
use std::ops::Range;

use crate::backend::cpu::pool::Pool;

/// A raw pointer that tasks share; each task touches only its own disjoint part.
#[derive(Clone, Copy)]
pub(crate) struct SyncPtr<T>(pub *mut T);

// SAFETY: used only to hand disjoint regions of one buffer to pool tasks, which all
// finish before the kernel that created the pointer returns.
unsafe impl<T> Send for SyncPtr<T> {}
// SAFETY: as for Send: tasks never touch the same elements.
unsafe impl<T> Sync for SyncPtr<T> {}

impl<T> SyncPtr<T> {
    /// The pointer (a method, so that closures capture the whole Sync wrapper).
    #[inline(always)]
    pub(crate) fn get(self) -> *mut T {
        self.0
    }
}

/// Below this many elements of work a task is not worth handing to another thread.
const MIN_TASK_WORK: usize = 16 * 1024;

/// Calls `f` on consecutive ranges covering `0..items`, in parallel over `pool` when the
/// work (`items · work_per_item` elements) is large enough to pay for it.
pub(crate) fn for_ranges(
    pool: Option<&Pool>,
    items: usize,
    work_per_item: usize,
    f: &(dyn Fn(Range<usize>) + Sync),
) {
    if items == 0 {
        return;
    }
    let threads = pool.map_or(1, |p| p.threads());
    let work = items.saturating_mul(work_per_item.max(1));
    let tasks = (work / MIN_TASK_WORK)
        .min(threads.saturating_mul(4))
        .min(items)
        .max(1);
    match pool {
        Some(p) if tasks > 1 => {
            let per = items.div_ceil(tasks);
            let tasks = items.div_ceil(per);
            p.run(tasks, &|t| f(t * per..((t + 1) * per).min(items)));
        }
        _ => f(0..items),
    }
}
