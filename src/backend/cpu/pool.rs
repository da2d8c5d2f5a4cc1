//! The intra-op thread pool: `run(n, f)` calls `f(0..n)` across the pool's threads and
//! the caller's, and returns when all calls have.
//!
//! The first tasks have a home: task p is claimed first by participant p (the caller is
//! 0, worker k is k), so a loop split into one part per thread (the GEMM's split over N,
//! a recurrent layer's steps) keeps each part on one core, in its cache, from one loop
//! to the next. The other tasks are claimed in order by whoever is free, and a
//! participant with nothing left steals the home tasks of one that has not started, so
//! no run waits on a descheduled core. The caller polls for the workers' last tasks for
//! a bounded moment before it sleeps.
//!
//! Idle workers sleep on a condition variable. A worker that just finished a task polls
//! for the next parallel loop for a bounded moment (`SPIN`, half a millisecond)
//! before it sleeps, so that the loops of one run, back to back, do not each pay a
//! wake-up; once a run is over, nothing spins. One run at a time owns
//! the workers; a second thread calling `run` while they are busy (several threads
//! running one executable) does its tasks itself instead of waiting.
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, TryLockError};
use std::thread::JoinHandle;
use std::time::Instant;

type Task<'a> = dyn Fn(usize) + Sync + 'a;

/// A worker's share of one parallel loop, logged when the pool traces: what a profile
/// trace shows on the worker's row.
pub(crate) struct Share {
    pub(crate) tid: u64,
    pub(crate) start: Instant,
    pub(crate) end: Instant,
    /// The step whose loop it was (node id, kernel kind).
    pub(crate) node: u32,
    pub(crate) kind: &'static str,
    pub(crate) tasks: usize,
}

/// A parallel loop being run: its tasks are claimed by index.
struct Job {
    /// Valid while the caller of `run` waits; dereferenced only for claimed indices
    /// below `n`, all of which complete before `run` returns.
    f: *const Task<'static>,
    n: usize,
    /// Tasks 0..home have a home participant; bit p of `home_claimed` says task p is taken.
    home: usize,
    home_claimed: AtomicU64,
    /// The next task past the home ones.
    next: AtomicUsize,
    pending: AtomicUsize,
    panicked: AtomicBool,
    /// The step that started it, when the pool traces.
    step: (u32, &'static str),
}

// SAFETY: `f` is `Sync` and outlives every use (see `Job::f`).
unsafe impl Send for Job {}
// SAFETY: workers share a `&Job` to call `f` (a `Sync` closure, so callable from many
// threads at once) on distinct claimed indices; every other field is an atomic or is
// read only.
unsafe impl Sync for Job {}

impl Job {
    /// Participant `me`'s share: its home task, then the shared ones, then the home
    /// tasks nobody has claimed; how many it ran, and whether it finished the last.
    fn work(&self, me: usize) -> (usize, bool) {
        let mut finished_last = false;
        let mut ran = 0;
        let mut run = |i: usize| {
            ran += 1;
            // SAFETY: index i < n is unfinished, so the caller is still waiting.
            let f = unsafe { &*self.f };
            if catch_unwind(AssertUnwindSafe(|| f(i))).is_err() {
                self.panicked.store(true, Ordering::Relaxed);
            }
            finished_last = self.pending.fetch_sub(1, Ordering::AcqRel) == 1;
        };
        if me < self.home && self.claim_home(me) {
            run(me);
        }
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.n {
                break;
            }
            run(i);
        }
        for p in 0..self.home {
            if self.claim_home(p) {
                run(p);
            }
        }
        (ran, finished_last)
    }

    fn claim_home(&self, p: usize) -> bool {
        let bit = 1u64 << p;
        self.home_claimed.fetch_or(bit, Ordering::Relaxed) & bit == 0
    }
}

#[derive(Default)]
struct State {
    epoch: u64,
    job: Option<Arc<Job>>,
    shutdown: bool,
}

/// How long a worker polls for the next loop before sleeping: longer than most
/// single-threaded steps between two parallel ones (a reorder, a softmax), so a run's
/// loops rarely pay a wake-up (YOLOv8n at 2 threads: 50 µs → 500 µs, 11.6 → 10.9 ms).
const SPIN: std::time::Duration = std::time::Duration::from_micros(500);

#[derive(Default)]
struct Shared {
    /// `State::epoch`, readable without the lock (for the bounded poll).
    epoch: std::sync::atomic::AtomicU64,
    state: Mutex<State>,
    wake: Condvar,
    done: Condvar,
    /// The workers' shares of loops since the last `take_shares`, when tracing.
    shares: Option<Mutex<Vec<Share>>>,
}

/// A fixed set of worker threads (the caller counts as one).
pub struct Pool {
    shared: Arc<Shared>,
    /// Held for the length of a parallel `run`; keeps the last loop's job, reused by the
    /// next when no worker still holds it (so a loop does not allocate).
    busy: Mutex<Option<Arc<Job>>>,
    workers: Vec<JoinHandle<()>>,
}

impl Pool {
    /// A pool of `threads` (0 = one per core) including the calling thread.
    pub fn new(threads: usize) -> Pool {
        Pool::with_log(threads, false)
    }

    /// A pool whose workers log their shares of each loop (see [`Pool::take_shares`]).
    pub(crate) fn traced(threads: usize) -> Pool {
        Pool::with_log(threads, true)
    }

    fn with_log(threads: usize, log: bool) -> Pool {
        let threads = if threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            threads
        };
        let shared = Arc::new(Shared {
            shares: log.then(Mutex::default),
            ..Shared::default()
        });
        let workers = (1..threads)
            .map(|k| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("kiln-worker-{k}"))
                    .spawn(move || worker(&shared, k))
                    .expect("spawning a worker thread")
            })
            .collect();
        Pool {
            shared,
            busy: Mutex::new(None),
            workers,
        }
    }

    /// The workers' shares of loops logged since the last call (none unless traced).
    pub(crate) fn take_shares(&self) -> Vec<Share> {
        self.shared
            .shares
            .as_ref()
            .map_or_else(Vec::new, |s| std::mem::take(&mut *lock(s)))
    }

    /// How many threads a `run` may use.
    pub(crate) fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Calls `f(i)` for every `i` in `0..n`, in parallel, and returns when all are done.
    /// A panic in a task is re-raised here after the others finish.
    pub(crate) fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        if n == 0 {
            return;
        }
        let mut guard = match self.busy.try_lock() {
            Ok(g) if n > 1 && !self.workers.is_empty() => g,
            // One task, no workers, or another run owns them: do it here.
            Ok(_) | Err(TryLockError::WouldBlock) | Err(TryLockError::Poisoned(_)) => {
                return (0..n).for_each(f);
            }
        };
        // SAFETY: only the lifetime is erased; `run` does not return before every
        // claimed task has finished, and unclaimed indices are never called.
        let f: *const Task<'static> = unsafe { std::mem::transmute(f as *const Task<'_>) };
        let home = n.min(self.threads()).min(u64::BITS as usize);
        let fresh = Job {
            f,
            n,
            home,
            home_claimed: AtomicU64::new(0),
            next: AtomicUsize::new(home),
            pending: AtomicUsize::new(n),
            panicked: AtomicBool::new(false),
            step: match self.shared.shares {
                Some(_) => super::profile::current_step(),
                None => (0, ""),
            },
        };
        let job = match guard.as_mut().and_then(Arc::get_mut) {
            Some(reused) => {
                *reused = fresh;
                guard.clone().expect("just reused")
            }
            None => guard.insert(Arc::new(fresh)).clone(),
        };
        {
            let mut st = lock(&self.shared.state);
            st.epoch += 1;
            st.job = Some(job.clone());
            self.shared.epoch.store(st.epoch, Ordering::Release);
        }
        self.shared.wake.notify_all();
        job.work(0);
        // The workers' last tasks are usually moments from done: poll before sleeping.
        let polling = std::time::Instant::now();
        while job.pending.load(Ordering::Acquire) != 0 && polling.elapsed() < SPIN {
            std::hint::spin_loop();
        }
        let mut st = lock(&self.shared.state);
        while job.pending.load(Ordering::Acquire) != 0 {
            st = self.shared.done.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.job = None;
        drop(st);
        if job.panicked.load(Ordering::Relaxed) {
            resume_unwind(Box::new("a kernel task panicked"));
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        lock(&self.shared.state).shutdown = true;
        self.shared.wake.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Worker `me` (1-based: the caller of `run` is participant 0).
fn worker(shared: &Shared, me: usize) {
    // Workers only run kernels: denormals stay flushed for their lifetime.
    let _flush = super::denormals::FlushDenormals::new();
    let mut seen = 0;
    loop {
        let polling = std::time::Instant::now();
        while shared.epoch.load(Ordering::Acquire) == seen && polling.elapsed() < SPIN {
            std::hint::spin_loop();
        }
        let job = {
            let mut st = lock(&shared.state);
            while st.epoch == seen && !st.shutdown {
                st = shared.wake.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            if st.shutdown {
                return;
            }
            seen = st.epoch;
            st.job.clone()
        };
        if let Some(job) = job {
            let start = shared.shares.as_ref().map(|_| Instant::now());
            let (ran, finished_last) = job.work(me);
            if let (Some(shares), Some(start), true) = (&shared.shares, start, ran > 0) {
                let share = Share {
                    tid: super::profile::thread_id(),
                    start,
                    end: Instant::now(),
                    node: job.step.0,
                    kind: job.step.1,
                    tasks: ran,
                };
                lock(shares).push(share);
            }
            if finished_last {
                // Take the lock so the notification cannot slip between the caller's
                // check of `pending` and its wait.
                let _st = lock(&shared.state);
                shared.done.notify_all();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_index_runs_once() {
        for threads in [1, 2, 4] {
            let pool = Pool::new(threads);
            for n in [0, 1, 2, 3, 4, 5, 7, 1000] {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                pool.run(n, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
            }
        }
    }

    #[test]
    fn concurrent_callers_all_finish() {
        let pool = Pool::new(2);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..200 {
                        let sum = AtomicUsize::new(0);
                        pool.run(16, &|i| {
                            sum.fetch_add(i, Ordering::Relaxed);
                        });
                        assert_eq!(sum.load(Ordering::Relaxed), 120);
                    }
                });
            }
        });
    }

    #[test]
    fn a_panicking_task_is_reported_not_hung() {
        let pool = Pool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(8, &|i| assert_ne!(i, 5));
        }));
        assert!(r.is_err());
        let sum = AtomicUsize::new(0);
        pool.run(4, &|i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 6);
    }
}
