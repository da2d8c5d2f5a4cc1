//! Per-shape algorithm choice: a cost model by default, measurement when asked.
//!
//! A step with several algorithms for its shape (a 3×3 convolution: direct or Winograd)
//! asks [`choose`] with a key naming the shape and its candidates. The answer comes
//! from, in order:
//! 1. the tune cache, when one is configured and has an entry for this CPU model, ISA,
//!    thread count and key that names one of the candidates;
//! 2. with the `autotune` option (`KILN_AUTOTUNE=1`), measurement: each candidate runs
//!    on scratch buffers at compile time (one warm-up, then the median of at least 3
//!    runs and 20 ms); the winner is written to the cache;
//! 3. otherwise the caller's cost-model pick.
//!
//! The `tune-force` option (`KILN_TUNE_FORCE=name`) overrides all three wherever `name`
//! is a candidate (to test one algorithm, or time it across a whole model).
//!
//! The cache (the `tune-cache` option, `KILN_TUNE_CACHE=path`; with `autotune` and no
//! path, `$XDG_CACHE_HOME/kiln/tune.tsv` or `~/.cache/kiln/tune.tsv`) is a text file, one
//! decision per line: `cpu model \t isa \t threads \t key \t winner \t candidate=µs…`.
//! Lines that do not parse are ignored (and kept out of the next write); a write goes to
//! a temporary file renamed over the cache, so a reader never sees half a file. Two
//! processes tuning at once may each drop the other's new entries (last rename wins);
//! they are re-measured next time.
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::isa;
use super::pool::Pool;
use crate::passes::Tuning;

/// One choice to make: `key` names the problem (op and shape), `candidates` the
/// algorithms (stable names: they are what the cache stores).
pub struct Choice<'a> {
    pub key: String,
    pub candidates: &'a [&'static str],
    /// The cost model's pick (an index into `candidates`).
    pub model: usize,
}

/// Where a decision came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Model,
    Cache,
    Measured,
    /// [`Tuning::force`].
    Forced,
}

/// The index of the candidate to use. `run(i)` runs candidate `i` once (only called
/// when measuring); `pool` is the executable's (its thread count is part of the key).
pub(crate) fn choose(
    tuning: &Tuning,
    pool: Option<&Pool>,
    choice: &Choice,
    run: &mut dyn FnMut(usize),
) -> (usize, Source) {
    if let Some(i) = tuning
        .force
        .as_deref()
        .and_then(|f| choice.candidates.iter().position(|c| *c == f))
    {
        return (i, Source::Forced);
    }
    let threads = pool.map_or(1, Pool::threads);
    let id = EntryId {
        cpu: cpu_model(),
        isa: isa::isa().name().to_string(),
        threads,
        key: choice.key.clone(),
    };
    let Some(path) = &tuning.cache else {
        return if tuning.measure {
            (measure_all(choice, run).0, Source::Measured)
        } else {
            (choice.model, Source::Model)
        };
    };
    // One compile at a time reads and rewrites the file (the run path never gets here).
    let _guard = FILE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mut entries = read_cache(path);
    if let Some(e) = entries.get(&id) {
        if let Some(i) = choice.candidates.iter().position(|c| *c == e.winner) {
            return (i, Source::Cache);
        }
    }
    if !tuning.measure {
        return (choice.model, Source::Model);
    }
    let (best, times) = measure_all(choice, run);
    let timings = choice
        .candidates
        .iter()
        .zip(&times)
        .map(|(c, t)| format!("{c}={:.1}", t.as_secs_f64() * 1e6))
        .collect::<Vec<_>>()
        .join(" ");
    entries.insert(
        id,
        Entry {
            winner: choice.candidates[best].to_string(),
            timings,
        },
    );
    if let Err(e) = write_cache(path, &entries) {
        eprintln!("kiln: cannot write the tune cache {}: {e}", path.display());
    }
    (best, Source::Measured)
}

static FILE_LOCK: Mutex<()> = Mutex::new(());

/// The fastest candidate and every candidate's median time.
fn measure_all(choice: &Choice, run: &mut dyn FnMut(usize)) -> (usize, Vec<Duration>) {
    let times: Vec<Duration> = (0..choice.candidates.len())
        .map(|i| median_time(&mut || run(i)))
        .collect();
    let best = (0..times.len()).min_by_key(|&i| times[i]).unwrap_or(0);
    (best, times)
}

/// One warm-up, then the median of at least 3 runs and 20 ms (at most 50 runs).
fn median_time(run: &mut dyn FnMut()) -> Duration {
    run();
    let mut times = vec![];
    let start = Instant::now();
    while times.len() < 3 || (start.elapsed() < Duration::from_millis(20) && times.len() < 50) {
        let t = Instant::now();
        run();
        times.push(t.elapsed());
    }
    times.sort();
    times[times.len() / 2]
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct EntryId {
    cpu: String,
    isa: String,
    threads: usize,
    key: String,
}

#[derive(Debug, Clone)]
struct Entry {
    winner: String,
    timings: String,
}

const HEADER: &str =
    "# kiln tune cache: cpu model, isa, threads, problem, winner, median µs per candidate";

fn read_cache(path: &Path) -> BTreeMap<EntryId, Entry> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return BTreeMap::new();
    };
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let f: Vec<&str> = line.split('\t').collect();
            let [cpu, isa, threads, key, winner, timings] = f[..] else {
                return None;
            };
            let id = EntryId {
                cpu: cpu.into(),
                isa: isa.into(),
                threads: threads.parse().ok()?,
                key: key.into(),
            };
            let entry = Entry {
                winner: winner.into(),
                timings: timings.into(),
            };
            (!winner.is_empty()).then_some((id, entry))
        })
        .collect()
}

fn write_cache(path: &Path, entries: &BTreeMap<EntryId, Entry>) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut text = format!("{HEADER}\n");
    for (id, e) in entries {
        text += &format!(
            "{}\t{}\t{}\t{}\t{}\t{}\n",
            id.cpu, id.isa, id.threads, id.key, e.winner, e.timings
        );
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// The CPU's brand string (what the cache is keyed by: the same model tunes the same).
pub(crate) fn cpu_model() -> String {
    static MODEL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    MODEL.get_or_init(read_cpu_model).clone()
}

#[cfg(target_arch = "x86_64")]
fn read_cpu_model() -> String {
    use std::arch::x86_64::__cpuid;
    if __cpuid(0x8000_0000).eax < 0x8000_0004 {
        return "x86_64".into();
    }
    let bytes: Vec<u8> = (0x8000_0002..=0x8000_0004u32)
        .flat_map(|leaf| {
            let r = __cpuid(leaf);
            [r.eax, r.ebx, r.ecx, r.edx]
        })
        .flat_map(u32::to_le_bytes)
        .collect();
    let s = String::from_utf8_lossy(&bytes);
    let s = s.trim_matches(char::from(0)).trim();
    // A tab would break the file's columns.
    s.replace(['\t', '\n'], " ")
}

#[cfg(not(target_arch = "x86_64"))]
fn read_cpu_model() -> String {
    std::env::consts::ARCH.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn temp_cache(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("kiln-tune-{}-{name}.tsv", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    /// Candidate i takes `delays[i]` ms; counts the runs. The gaps are wide (20 ms against
    /// 1) so that a loaded machine cannot reorder the candidates.
    fn timed<'a>(delays: &[u64], runs: &'a mut Vec<usize>) -> impl FnMut(usize) + 'a {
        let delays = delays.to_vec();
        runs.resize(delays.len(), 0);
        move |i| {
            runs[i] += 1;
            std::thread::sleep(Duration::from_millis(delays[i]));
        }
    }

    #[test]
    fn without_measuring_the_model_decides() {
        let choice = Choice {
            key: "k".into(),
            candidates: &["a", "b"],
            model: 1,
        };
        let mut runs = vec![];
        let got = choose(
            &Tuning::default(),
            None,
            &choice,
            &mut timed(&[0, 0], &mut runs),
        );
        assert_eq!(got, (1, Source::Model));
        assert_eq!(runs, [0, 0]);
    }

    #[test]
    fn measuring_picks_the_fastest_and_the_cache_keeps_it() {
        let path = temp_cache("keeps");
        let tuning = Tuning {
            measure: true,
            cache: Some(path.clone()),
            force: None,
        };
        let choice = Choice {
            key: "conv n1 ic64".into(),
            candidates: &["slow", "fast", "slower"],
            model: 0,
        };
        let mut runs = vec![];
        let got = choose(&tuning, None, &choice, &mut timed(&[20, 1, 40], &mut runs));
        assert_eq!(got, (1, Source::Measured));
        assert!(
            runs.iter().all(|&n| n >= 4),
            "warm-up + 3 runs each: {runs:?}"
        );
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("# kiln tune cache"), "{text}");
        assert!(text.contains("\tconv n1 ic64\tfast\tslow="), "{text}");
        assert!(text.contains(&cpu_model()), "{text}");

        // Answered by the file now, with or without measuring; nothing runs.
        for measure in [true, false] {
            let tuning = Tuning {
                measure,
                cache: Some(path.clone()),
                force: None,
            };
            let mut runs = vec![];
            let got = choose(&tuning, None, &choice, &mut timed(&[0, 0, 0], &mut runs));
            assert_eq!(got, (1, Source::Cache));
            assert_eq!(runs, [0, 0, 0]);
        }
        // Another thread count is another entry; both stay in the file.
        let pool = Pool::new(2);
        let mut runs = vec![];
        let got = choose(
            &tuning,
            Some(&pool),
            &choice,
            &mut timed(&[1, 20, 40], &mut runs),
        );
        assert_eq!(got, (0, Source::Measured));
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 3, "{text}");
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn bad_lines_and_unknown_winners_are_ignored() {
        let path = temp_cache("bad");
        let id = |key: &str, winner: &str| {
            format!(
                "{}\t{}\t1\t{key}\t{winner}\ta=1\n",
                cpu_model(),
                isa::isa().name()
            )
        };
        let text = format!(
            "{HEADER}\ngarbage\n{}{}{}",
            id("gone", "removed-algorithm"),
            id("k", "b"),
            "a\tb\tnot-a-number\tk\tb\tx\n"
        );
        std::fs::write(&path, text).unwrap();
        let tuning = Tuning {
            measure: false,
            cache: Some(path.clone()),
            force: None,
        };
        let choice = |key: &str| Choice {
            key: key.into(),
            candidates: &["a", "b"],
            model: 0,
        };
        let mut none = |_| panic!("not measuring");
        assert_eq!(
            choose(&tuning, None, &choice("k"), &mut none),
            (1, Source::Cache)
        );
        assert_eq!(
            choose(&tuning, None, &choice("gone"), &mut none),
            (0, Source::Model)
        );
        // A file that cannot be written is reported, not fatal.
        let tuning = Tuning {
            measure: true,
            cache: Some(path.join("not-a-dir").join("tune.tsv")),
            force: None,
        };
        let mut runs = vec![];
        let got = choose(&tuning, None, &choice("k"), &mut timed(&[20, 0], &mut runs));
        assert_eq!(got, (1, Source::Measured));
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_forced_candidate_wins_where_it_is_one() {
        let tuning = Tuning {
            measure: true,
            force: Some("b".into()),
            ..Tuning::default()
        };
        let mut none = |_| panic!("not measuring");
        let choice = |candidates| Choice {
            key: "k".into(),
            candidates,
            model: 0,
        };
        let got = choose(&tuning, None, &choice(&["a", "b"]), &mut none);
        assert_eq!(got, (1, Source::Forced));
        let mut runs = vec![];
        let got = choose(
            &tuning,
            None,
            &choice(&["a", "c"]),
            &mut timed(&[20, 0], &mut runs),
        );
        assert_eq!(got, (1, Source::Measured));
    }

    #[test]
    fn the_cpu_model_is_one_printable_field() {
        let m = cpu_model();
        assert!(
            !m.is_empty() && !m.contains('\t') && !m.contains('\0'),
            "{m:?}"
        );
    }
}
