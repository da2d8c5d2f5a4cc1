//! The arena planner: given buffers with a size and a live range of schedule steps, give
//! each an offset in one arena so that buffers live at the same step never share a byte.
//!
//! This is offline dynamic storage allocation (NP-hard in general), so it runs a few
//! greedy heuristics and keeps the smallest arena. Each heuristic takes the buffers in
//! some order and puts each at an offset chosen among the gaps left by the
//! already-placed buffers whose live ranges overlap its own:
//!
//! - `greedy-by-size`: largest first, lowest gap that fits (first fit). The classic
//!   TFLite / MNN planner; near-optimal on chain-like CNN graphs.
//! - `best-fit-by-size`: largest first, the smallest gap that fits.
//! - `greedy-by-breadth`: buffers that touch the busiest steps first (by the peak live
//!   bytes over their range, then by size), first fit. Works the bottleneck first.
//! - `greedy-by-lifetime`: longest-lived first (then largest), first fit: long-lived
//!   buffers settle at the bottom and short ones stack above them.
//! - `greedy-by-area`: by size × lifetime, first fit.
//!
//! Sizes are rounded up to [`ALIGN`] bytes and offsets are multiples of it. Ties are
//! broken by buffer index, so the result is deterministic. Each heuristic is O(n²) in
//! the number of buffers (each placement scans the placed ones once).

/// Every offset is a multiple of this, and every size is rounded up to it.
pub const ALIGN: usize = 64;

/// `n` rounded up to a multiple of [`ALIGN`], or `None` on overflow.
pub(crate) fn align_up(n: usize) -> Option<usize> {
    n.checked_next_multiple_of(ALIGN)
}

/// A buffer to place: its size in bytes and the steps it is live, `first..=last`
/// (`first <= last`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval {
    pub size: usize,
    pub first: usize,
    pub last: usize,
}

impl Interval {
    /// Whether the two are live at a common step.
    pub(crate) fn overlaps(&self, other: &Interval) -> bool {
        self.first <= other.last && other.first <= self.last
    }
}

/// A placement heuristic (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    GreedyBySize,
    BestFitBySize,
    GreedyByBreadth,
    GreedyByLifetime,
    GreedyByArea,
}

impl Strategy {
    /// Every heuristic, in the order [`place`] tries them (the first wins a tie).
    pub const ALL: [Strategy; 5] = [
        Strategy::GreedyBySize,
        Strategy::BestFitBySize,
        Strategy::GreedyByBreadth,
        Strategy::GreedyByLifetime,
        Strategy::GreedyByArea,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Strategy::GreedyBySize => "greedy-by-size",
            Strategy::BestFitBySize => "best-fit-by-size",
            Strategy::GreedyByBreadth => "greedy-by-breadth",
            Strategy::GreedyByLifetime => "greedy-by-lifetime",
            Strategy::GreedyByArea => "greedy-by-area",
        }
    }
}

/// Where each buffer goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// One offset per input interval, in input order; multiples of [`ALIGN`].
    pub offsets: Vec<usize>,
    /// The arena size: the highest `offset + aligned size` (0 when there is nothing).
    pub arena_bytes: usize,
    /// The heuristic that produced it.
    pub strategy: Strategy,
    /// Every heuristic tried and the arena it needed, in [`Strategy::ALL`] order.
    pub tried: Vec<(Strategy, usize)>,
}

/// Runs every heuristic and keeps the smallest arena (the earliest on a tie).
pub(crate) fn place(intervals: &[Interval]) -> Placement {
    let sizes = aligned_sizes(intervals);
    let mut best: Option<(Strategy, Vec<usize>, usize)> = None;
    let mut tried = Vec::with_capacity(Strategy::ALL.len());
    for s in Strategy::ALL {
        let (offsets, arena) = run(intervals, &sizes, s);
        tried.push((s, arena));
        if best.as_ref().is_none_or(|b| arena < b.2) {
            best = Some((s, offsets, arena));
        }
    }
    let (strategy, offsets, arena_bytes) = best.expect("at least one strategy");
    Placement {
        offsets,
        arena_bytes,
        strategy,
        tried,
    }
}

/// Runs one heuristic.
pub fn place_with(intervals: &[Interval], strategy: Strategy) -> Placement {
    let sizes = aligned_sizes(intervals);
    let (offsets, arena_bytes) = run(intervals, &sizes, strategy);
    Placement {
        offsets,
        arena_bytes,
        strategy,
        tried: vec![(strategy, arena_bytes)],
    }
}

/// The largest total aligned size of the intervals live at one step: no arena can be
/// smaller.
pub(crate) fn lower_bound(intervals: &[Interval]) -> usize {
    let sizes = aligned_sizes(intervals);
    peak_profile(intervals, &sizes)
        .into_iter()
        .max()
        .unwrap_or(0)
}

fn aligned_sizes(intervals: &[Interval]) -> Vec<usize> {
    intervals
        .iter()
        .map(|iv| align_up(iv.size).expect("buffer size overflows when aligned"))
        .collect()
}

/// For each interval, the peak total size live at any step of its range.
fn peak_profile(intervals: &[Interval], sizes: &[usize]) -> Vec<usize> {
    // Live bytes only rise where an interval starts, so the peak over a range is the
    // peak over the start points inside it (or at its own start).
    let mut events: Vec<(usize, bool, usize)> = Vec::with_capacity(intervals.len() * 2);
    for (iv, &size) in intervals.iter().zip(sizes) {
        events.push((iv.first, true, size));
        // Ends after `last`: `last + 1`, ordered before starts at the same point.
        events.push((iv.last.saturating_add(1), false, size));
    }
    // At equal points, ends (false) sort before starts (true).
    events.sort_unstable();
    let mut points: Vec<(usize, usize)> = vec![]; // (step, live bytes from it on)
    let mut live = 0usize;
    for (at, start, size) in events {
        if start {
            live += size;
        } else {
            live -= size;
        }
        match points.last_mut() {
            Some(p) if p.0 == at => p.1 = live,
            _ => points.push((at, live)),
        }
    }
    intervals
        .iter()
        .map(|iv| {
            let lo = points.partition_point(|p| p.0 < iv.first);
            points[lo..]
                .iter()
                .take_while(|p| p.0 <= iv.last)
                .map(|p| p.1)
                .max()
                .unwrap_or(0)
        })
        .collect()
}

fn order(intervals: &[Interval], sizes: &[usize], strategy: Strategy) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..intervals.len()).collect();
    let span = |i: usize| intervals[i].last.saturating_sub(intervals[i].first) + 1;
    match strategy {
        Strategy::GreedyBySize | Strategy::BestFitBySize => idx.sort_by_key(|&i| {
            (
                std::cmp::Reverse((sizes[i], span(i))),
                intervals[i].first,
                i,
            )
        }),
        Strategy::GreedyByLifetime => idx.sort_by_key(|&i| {
            (
                std::cmp::Reverse((span(i), sizes[i])),
                intervals[i].first,
                i,
            )
        }),
        Strategy::GreedyByArea => idx.sort_by_key(|&i| {
            let area = (sizes[i] as u128) * (span(i) as u128);
            (std::cmp::Reverse((area, sizes[i])), intervals[i].first, i)
        }),
        Strategy::GreedyByBreadth => {
            let peak = peak_profile(intervals, sizes);
            idx.sort_by_key(|&i| {
                (
                    std::cmp::Reverse((peak[i], sizes[i], span(i))),
                    intervals[i].first,
                    i,
                )
            })
        }
    }
    idx
}

fn run(intervals: &[Interval], sizes: &[usize], strategy: Strategy) -> (Vec<usize>, usize) {
    let best_fit = strategy == Strategy::BestFitBySize;
    let mut offsets = vec![0usize; intervals.len()];
    // Placed buffers, sorted by offset: (offset, end, index).
    let mut placed: Vec<(usize, usize, usize)> = Vec::with_capacity(intervals.len());
    let mut arena = 0usize;
    for i in order(intervals, sizes, strategy) {
        let size = sizes[i];
        if size == 0 {
            continue; // occupies nothing: offset 0, conflicts with nobody
        }
        let iv = &intervals[i];
        let mut cursor = 0usize;
        let mut chosen: Option<usize> = None;
        let mut best_gap: Option<(usize, usize)> = None; // (gap, offset)
        for &(off, end, j) in &placed {
            if !iv.overlaps(&intervals[j]) {
                continue;
            }
            if off >= cursor + size {
                // [cursor, off) is free of every conflicting buffer.
                if !best_fit {
                    chosen = Some(cursor);
                    break;
                }
                let gap = off - cursor;
                if best_gap.is_none_or(|(g, _)| gap < g) {
                    best_gap = Some((gap, cursor));
                }
            }
            cursor = cursor.max(end);
        }
        let offset = chosen.or(best_gap.map(|(_, o)| o)).unwrap_or(cursor);
        offsets[i] = offset;
        let end = offset + size;
        arena = arena.max(end);
        let at = placed.partition_point(|p| p.0 <= offset);
        placed.insert(at, (offset, end, i));
    }
    (offsets, arena)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// splitmix64: a tiny deterministic PRNG for the property tests.
    pub(crate) struct Rng(u64);

    impl Rng {
        pub(crate) fn new(seed: u64) -> Rng {
            Rng(seed)
        }
        pub(crate) fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        /// Uniform in `lo..=hi`.
        pub(crate) fn range(&mut self, lo: usize, hi: usize) -> usize {
            lo + (self.next() % (hi - lo + 1) as u64) as usize
        }
    }

    /// Panics unless `p` is a valid placement of `ivs`; returns the lower bound.
    pub(crate) fn check(ivs: &[Interval], p: &Placement) -> usize {
        assert_eq!(p.offsets.len(), ivs.len());
        let mut top = 0;
        for (i, a) in ivs.iter().enumerate() {
            let (oa, sa) = (p.offsets[i], align_up(a.size).unwrap());
            assert_eq!(oa % ALIGN, 0, "offset {oa} of #{i} is not aligned");
            top = top.max(oa + sa);
            for (j, b) in ivs.iter().enumerate().skip(i + 1) {
                let (ob, sb) = (p.offsets[j], align_up(b.size).unwrap());
                if a.overlaps(b) && sa > 0 && sb > 0 {
                    assert!(
                        oa + sa <= ob || ob + sb <= oa,
                        "#{i} {a:?} at {oa} and #{j} {b:?} at {ob} collide ({})",
                        p.strategy.name()
                    );
                }
            }
        }
        assert_eq!(top, p.arena_bytes);
        let lb = lower_bound(ivs);
        assert!(
            p.arena_bytes >= lb,
            "arena {} < lower bound {lb}",
            p.arena_bytes
        );
        lb
    }

    fn iv(size: usize, first: usize, last: usize) -> Interval {
        Interval { size, first, last }
    }

    #[test]
    fn disjoint_lifetimes_share_offset_zero() {
        let ivs = [iv(100, 0, 1), iv(1000, 2, 3), iv(10, 4, 4)];
        let p = place(&ivs);
        assert_eq!(p.offsets, vec![0, 0, 0]);
        assert_eq!(p.arena_bytes, 1024);
        assert_eq!(check(&ivs, &p), 1024);
    }

    #[test]
    fn overlapping_lifetimes_stack() {
        let ivs = [iv(64, 0, 2), iv(128, 1, 3), iv(64, 3, 4), iv(0, 0, 9)];
        let p = place(&ivs);
        check(&ivs, &p);
        assert_eq!(p.arena_bytes, 192);
        assert_eq!(lower_bound(&ivs), 192);
        assert_eq!(p.tried.len(), Strategy::ALL.len());
    }

    #[test]
    fn first_fit_and_best_fit_choose_different_gaps() {
        // Three live-everywhere buffers with holes of 128 and 64 between them once the
        // middle ones die; a late 64-byte buffer fits both holes.
        let ivs = [
            iv(64, 0, 4),
            iv(128, 0, 1),
            iv(64, 0, 4),
            iv(64, 0, 1),
            iv(64, 0, 4),
            iv(64, 2, 4),
        ];
        for s in Strategy::ALL {
            check(&ivs, &place_with(&ivs, s));
        }
    }

    #[test]
    fn empty_input() {
        let p = place(&[]);
        assert_eq!(p.arena_bytes, 0);
        assert!(p.offsets.is_empty());
        assert_eq!(lower_bound(&[]), 0);
    }

    /// Random interval sets: every heuristic's placement is valid, and the best one's
    /// ratio to the lower bound stays small.
    #[test]
    fn property_random_intervals() {
        let mut rng = Rng::new(0x6b69_6c6e);
        let mut worst = 1.0f64;
        let mut sum = 0.0f64;
        let cases = 400;
        for case in 0..cases {
            let n = rng.range(1, 60);
            let steps = rng.range(1, 50);
            let ivs: Vec<Interval> = (0..n)
                .map(|_| {
                    let first = rng.range(0, steps - 1);
                    let len = match rng.range(0, 3) {
                        0 => 0,
                        1 => rng.range(0, 3),
                        _ => rng.range(0, steps - 1 - first),
                    };
                    let last = (first + len).min(steps - 1);
                    let size = match rng.range(0, 9) {
                        0 => 0,
                        1 => rng.range(1, 64),
                        2..=5 => rng.range(1, 1 << 20),
                        _ => 1 << rng.range(6, 22),
                    };
                    Interval { size, first, last }
                })
                .collect();
            for s in Strategy::ALL {
                check(&ivs, &place_with(&ivs, s));
            }
            let p = place(&ivs);
            let lb = check(&ivs, &p);
            let ratio = if lb == 0 {
                1.0
            } else {
                p.arena_bytes as f64 / lb as f64
            };
            assert!(ratio < 2.0, "case {case}: ratio {ratio} ({ivs:?})");
            worst = worst.max(ratio);
            sum += ratio;
        }
        eprintln!(
            "planner property test: {cases} cases, worst planned/lower-bound {worst:.4}, mean {:.4}",
            sum / cases as f64
        );
    }

    /// Timing for 1,000 and 3,000 buffers (run in release: `cargo test --release --lib
    /// memory -- --ignored --nocapture`).
    #[test]
    #[ignore = "a timing, not a check: meaningful only in release builds"]
    fn timing_thousands_of_buffers() {
        for n in [1000usize, 3000] {
            let mut rng = Rng::new(n as u64);
            let steps = n;
            let ivs: Vec<Interval> = (0..n)
                .map(|i| {
                    let len = if rng.range(0, 9) == 0 {
                        rng.range(0, steps / 4)
                    } else {
                        rng.range(0, 8)
                    };
                    Interval {
                        size: 1 << rng.range(8, 22),
                        first: i,
                        last: (i + len).min(steps - 1),
                    }
                })
                .collect();
            let t = std::time::Instant::now();
            let p = place(&ivs);
            let dt = t.elapsed();
            let lb = check(&ivs, &p);
            eprintln!(
                "{n} buffers: {:?}, planned/lower-bound {:.4} ({})",
                dt,
                p.arena_bytes as f64 / lb as f64,
                p.strategy.name()
            );
        }
    }
}
