//! Profiling the CPU backend's runs when the `profile` option (`KILN_PROFILE`) asks:
//! every step timed and summed per node into a table (what `kiln bench --profile` and
//! `KILN_PROFILE=1` print), and, given a path, every step written to a Chrome
//! trace-event file as the runs go (it loads in Perfetto and `chrome://tracing`): one
//! complete (`"X"`) event per executed step on the thread that ran it, one per worker's
//! share of each parallel loop, and an `arena` counter of the plan's live bytes.
//!
//! Off, none of this exists: a run tests one `Option` per program. On, a run takes one
//! timestamp per step into a buffer and, when the program is done, takes the table's lock
//! once and the trace file's once; the file was opened at compile time, so a path that
//! cannot be written is a compile error rather than a profile lost at exit.
use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufWriter, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use super::peak;
use super::pool::{Pool, Share};
use super::program::{Step, StepNode};
use super::tail::SourceStep;
use crate::error::{Error, Result};
use crate::ir::NodeId;
use crate::memory::report::json_string;
use crate::passes::Profiling;

/// What a profile knows of a step besides its times.
pub(crate) struct StepMeta<'a> {
    pub(crate) node: &'a StepNode,
    pub(crate) kind: &'static str,
    pub(crate) flops: f64,
    pub(crate) shapes: &'a str,
    pub(crate) bytes: usize,
    /// Arena bytes live while it runs (0: not a planned step; no counter event).
    pub(crate) live_bytes: usize,
}

impl<'a> From<&'a Step> for StepMeta<'a> {
    fn from(s: &'a Step) -> StepMeta<'a> {
        StepMeta {
            node: &s.node,
            kind: s.kernel.kind(),
            flops: s.flops,
            shapes: &s.shapes,
            bytes: s.bytes,
            live_bytes: s.live_bytes,
        }
    }
}

impl<'a> From<&'a SourceStep> for StepMeta<'a> {
    fn from(s: &'a SourceStep) -> StepMeta<'a> {
        StepMeta {
            node: &s.node,
            kind: s.kernel.kind(),
            flops: 0.0,
            shapes: "",
            bytes: 0,
            live_bytes: 0,
        }
    }
}

/// A node's measured time, as [`super::CpuExecutable::step_times`] gives it.
#[derive(Debug, Clone)]
pub struct StepTiming {
    /// The node's id in the optimized graph of its program.
    pub node: NodeId,
    pub name: String,
    pub kind: &'static str,
    /// Its steps' mean seconds per call (a step per run, for all but the few nodes
    /// lowered to several steps), and how many calls were timed.
    pub seconds_per_call: f64,
    pub calls: usize,
}

/// One node's sums over the runs.
struct StepTime {
    node: StepNode,
    kind: &'static str,
    secs: f64,
    calls: usize,
    flops: f64,
    shapes: String,
}

pub(crate) struct Profiler {
    /// Time zero of the trace's timestamps.
    epoch: Instant,
    /// Per node id, its entries (one per distinct node of that id: programs for other
    /// shapes or a dynamic tail reuse ids).
    table: Mutex<HashMap<u32, Vec<StepTime>>>,
    /// Print the table when the executable drops: every step (`Some(true)`) or the
    /// slowest.
    print_at_exit: Option<bool>,
    trace: Option<Mutex<TraceFile>>,
}

impl Profiler {
    /// The profiler `profiling` asks for, if any; a trace file is created now.
    pub(crate) fn new(profiling: &Profiling) -> Result<Option<Profiler>> {
        let (print_at_exit, trace) = match profiling {
            Profiling::Off => return Ok(None),
            Profiling::Table { all } => (Some(*all), None),
            Profiling::Collect => (None, None),
            Profiling::Trace(path) => (None, Some(Mutex::new(TraceFile::create(path)?))),
        };
        Ok(Some(Profiler {
            epoch: Instant::now(),
            table: Mutex::new(HashMap::new()),
            print_at_exit,
            trace,
        }))
    }

    /// Whether the pool should log its workers' shares of parallel loops.
    pub(crate) fn traces(&self) -> bool {
        self.trace.is_some()
    }

    /// Runs `steps` in order with `run`, timing each; stops at the first error. Then
    /// records what ran (and the pool's workers' shares when tracing).
    pub(crate) fn run<'a, S>(
        &self,
        steps: &'a [S],
        pool: &Pool,
        mut run: impl FnMut(&S) -> Result<()>,
    ) -> Result<()>
    where
        &'a S: Into<StepMeta<'a>>,
    {
        let mut times = Vec::with_capacity(steps.len() + 1);
        times.push(Instant::now());
        let mut result = Ok(());
        for step in steps {
            let meta: StepMeta = step.into();
            CURRENT_STEP.set((meta.node.id.0, meta.kind));
            result = run(step);
            times.push(Instant::now());
            if result.is_err() {
                break;
            }
        }
        CURRENT_STEP.set(NO_STEP);
        let ran = steps.iter().map(Into::into).zip(times.windows(2));
        self.record(ran, pool);
        result
    }

    fn record<'m, 't>(
        &self,
        ran: impl Iterator<Item = (StepMeta<'m>, &'t [Instant])> + Clone,
        pool: &Pool,
    ) {
        {
            let mut table = lock(&self.table);
            for (m, t) in ran.clone() {
                let entries = table.entry(m.node.id.0).or_default();
                let i = match entries.iter().position(|e| e.node.name == m.node.name) {
                    Some(i) => i,
                    None => {
                        entries.push(StepTime {
                            node: m.node.clone(),
                            kind: m.kind,
                            secs: 0.0,
                            calls: 0,
                            flops: m.flops,
                            shapes: m.shapes.to_string(),
                        });
                        entries.len() - 1
                    }
                };
                entries[i].secs += (t[1] - t[0]).as_secs_f64();
                entries[i].calls += 1;
            }
        }
        let Some(trace) = &self.trace else { return };
        let shares = pool.take_shares();
        let tid = thread_id();
        let mut file = lock(trace);
        for (m, t) in ran {
            file.step(self.us(t[0]), self.us(t[1]), tid, &m);
        }
        for s in &shares {
            file.share(self.us(s.start), self.us(s.end), s);
        }
    }

    /// Microseconds since the profile began.
    fn us(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.epoch).as_secs_f64() * 1e6
    }

    /// The table of the runs so far, then forgets them: per step, its time per run, share
    /// of the total, GFLOP/s and share of the FMA peak of `threads` cores (measured now,
    /// so a slow layer shows as a low share on any host), sorted by time; every step
    /// when `all`, else the slowest 12, after the time per kernel kind. None when no step
    /// was timed.
    pub(crate) fn take_table(&self, threads: usize, all: bool) -> Option<String> {
        let mut steps: Vec<StepTime> = std::mem::take(&mut *lock(&self.table))
            .into_values()
            .flatten()
            .collect();
        if steps.is_empty() {
            return None;
        }
        steps.sort_by(|a, b| b.secs.total_cmp(&a.secs));
        let mut by_kind: Vec<(&str, f64, usize)> = vec![];
        for s in &steps {
            match by_kind.iter_mut().find(|k| k.0 == s.kind) {
                Some(k) => {
                    k.1 += s.secs;
                    k.2 += s.calls;
                }
                None => by_kind.push((s.kind, s.secs, s.calls)),
            }
        }
        by_kind.sort_by(|a, b| b.1.total_cmp(&a.1));
        let total: f64 = by_kind.iter().map(|k| k.1).sum::<f64>().max(1e-12);
        let mut out = String::from("kiln profile: time per kernel kind (all runs)\n");
        for (kind, t, n) in &by_kind {
            let share = 100.0 * t / total;
            let _ = writeln!(
                out,
                "  {kind:<14} {:>9.2} ms  {share:5.1}%  ({n} calls)",
                t * 1e3
            );
        }
        let peak = steps
            .iter()
            .any(|s| s.flops > 0.0)
            .then(peak::fma_gflops)
            .flatten();
        let which = if all { "all" } else { "slowest" };
        let _ = match peak {
            Some(p) => writeln!(
                out,
                "kiln profile: {which} steps by time; FMA peak {p:.1} GFLOP/s per core \
                 (measured now), shares of {threads} × it"
            ),
            None => writeln!(out, "kiln profile: {which} steps by time"),
        };
        let _ = writeln!(
            out,
            "  {:>9}  {:>6}  {:>13}  {:>12}  {:<14} node",
            "ms/run", "share", "GFLOP/s", "of peak", "kernel"
        );
        for s in steps.iter().take(if all { usize::MAX } else { 12 }) {
            let per_run = s.secs / s.calls as f64;
            let gflops = (s.flops > 0.0 && per_run > 0.0).then(|| s.flops / per_run / 1e9);
            let rate = gflops.map_or(String::new(), |g| format!("{g:.1}"));
            let of_peak = match (gflops, peak) {
                (Some(g), Some(p)) => format!("{:.1}%", 100.0 * g / (p * threads as f64)),
                _ => String::new(),
            };
            let _ = writeln!(
                out,
                "  {:>9.3}  {:>5.1}%  {rate:>13}  {of_peak:>12}  {:<14} {}{}",
                per_run * 1e3,
                100.0 * s.secs / total,
                s.kind,
                s.node,
                if s.shapes.is_empty() || s.flops == 0.0 {
                    String::new()
                } else {
                    format!("  {}", s.shapes)
                }
            );
        }
        Some(out)
    }

    /// Each timed node's mean time per run so far, by node id.
    pub(crate) fn step_times(&self) -> Vec<StepTiming> {
        let table = lock(&self.table);
        let mut out: Vec<StepTiming> = table
            .values()
            .flatten()
            .map(|s| StepTiming {
                node: s.node.id,
                name: s.node.name.clone(),
                kind: s.kind,
                seconds_per_call: s.secs / s.calls.max(1) as f64,
                calls: s.calls,
            })
            .collect();
        out.sort_by_key(|t| t.node);
        out
    }

    /// Forgets the table's sums.
    pub(crate) fn restart(&self) {
        lock(&self.table).clear();
    }

    /// What the executable's drop does: print the table under `KILN_PROFILE=1|all`.
    pub(crate) fn print_at_exit(&self, threads: usize) {
        if let Some(all) = self.print_at_exit {
            if let Some(table) = self.take_table(threads, all) {
                eprint!("{table}");
            }
        }
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        if let Some(trace) = &self.trace {
            lock(trace).finish();
        }
    }
}

/// The step the calling thread is running under a tracing profiler (node id, kernel
/// kind), for the pool to label the loops it starts.
const NO_STEP: (u32, &str) = (u32::MAX, "");

thread_local! {
    static CURRENT_STEP: Cell<(u32, &'static str)> = const { Cell::new(NO_STEP) };
    static THREAD_ID: Cell<u64> = const { Cell::new(0) };
}

pub(crate) fn current_step() -> (u32, &'static str) {
    CURRENT_STEP.get()
}

/// Names of the threads that have an id, for the trace's metadata.
static THREAD_NAMES: Mutex<Vec<(u64, String)>> = Mutex::new(Vec::new());

/// This thread's id in traces: small numbers from 1, given on first use.
pub(crate) fn thread_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let id = THREAD_ID.get();
    if id != 0 {
        return id;
    }
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    THREAD_ID.set(id);
    let name = std::thread::current()
        .name()
        .map_or_else(|| format!("thread {id}"), str::to_string);
    lock(&THREAD_NAMES).push((id, name));
    id
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The trace being written: `{"traceEvents":[` and the events so far; [`Self::finish`]
/// closes the array and the object.
struct TraceFile {
    path: PathBuf,
    out: BufWriter<File>,
    pid: u32,
    /// Threads whose name has been written.
    named: HashSet<u64>,
    /// The first write error (reported once, at the end).
    error: Option<std::io::Error>,
}

impl TraceFile {
    fn create(path: &Path) -> Result<TraceFile> {
        let file = File::create(path)
            .map_err(|e| Error::io(path, format!("cannot write the profile trace: {e}")))?;
        let mut t = TraceFile {
            path: path.to_path_buf(),
            out: BufWriter::with_capacity(1 << 20, file),
            pid: std::process::id(),
            named: HashSet::new(),
            error: None,
        };
        let head = format!(
            "{{\"traceEvents\":[\n{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{},\"tid\":0,\
             \"args\":{{\"name\":\"kiln\"}}}}",
            t.pid
        );
        t.write(&head);
        Ok(t)
    }

    fn write(&mut self, s: &str) {
        if self.error.is_none() {
            if let Err(e) = self.out.write_all(s.as_bytes()) {
                self.error = Some(e);
            }
        }
    }

    /// Writes `event` (an object) after a separator; names `tid` first if it is new.
    fn event(&mut self, tid: u64, event: &str) {
        if self.named.insert(tid) {
            let name = lock(&THREAD_NAMES)
                .iter()
                .find(|(id, _)| *id == tid)
                .map_or_else(|| format!("thread {tid}"), |(_, n)| n.clone());
            let meta = format!(
                ",\n{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{},\"tid\":{tid},\
                 \"args\":{{\"name\":{}}}}}",
                self.pid,
                json_string(&name)
            );
            self.write(&meta);
        }
        self.write(",\n");
        self.write(event);
    }

    fn step(&mut self, start: f64, end: f64, tid: u64, m: &StepMeta) {
        if m.live_bytes > 0 {
            let counter = format!(
                "{{\"name\":\"arena\",\"ph\":\"C\",\"ts\":{start:.3},\"pid\":{},\"tid\":{tid},\
                 \"args\":{{\"live bytes\":{}}}}}",
                self.pid, m.live_bytes
            );
            self.event(tid, &counter);
        }
        let event = format!(
            "{{\"name\":{},\"cat\":{},\"ph\":\"X\",\"ts\":{start:.3},\"dur\":{:.3},\"pid\":{},\
             \"tid\":{tid},\"args\":{{\"node\":{},\"op\":{},\"kernel\":{},\"shapes\":{},\
             \"bytes\":{},\"flops\":{}}}}}",
            json_string(&m.node.name),
            json_string(m.kind),
            end - start,
            self.pid,
            m.node.id.0,
            json_string(&m.node.op),
            json_string(m.kind),
            json_string(m.shapes),
            m.bytes,
            m.flops
        );
        self.event(tid, &event);
    }

    fn share(&mut self, start: f64, end: f64, s: &Share) {
        let event = format!(
            "{{\"name\":{},\"cat\":\"parallel\",\"ph\":\"X\",\"ts\":{start:.3},\"dur\":{:.3},\
             \"pid\":{},\"tid\":{},\"args\":{{\"node\":{},\"kernel\":{},\"tasks\":{}}}}}",
            json_string(s.kind),
            end - start,
            self.pid,
            s.tid,
            s.node,
            json_string(s.kind),
            s.tasks
        );
        self.event(s.tid, &event);
    }

    fn finish(&mut self) {
        self.write("\n],\"displayTimeUnit\":\"ms\"}\n");
        if self.error.is_none() {
            if let Err(e) = self.out.flush() {
                self.error = Some(e);
            }
        }
        if let Some(e) = &self.error {
            eprintln!("kiln: profile trace {}: {e}", self.path.display());
        }
    }
}
