//! The output of a broadcasting kernel as a list of inner runs: the merged axes of
//! [`MergedAxes`] with the innermost one as the run, and each run's offset in every
//! operand. The binary, comparison/select and fused elementwise kernels all walk it.
use super::par::for_ranges;
use crate::backend::broadcast::MergedAxes;
use crate::backend::cpu::pool::Pool;

/// How up to `N` operands broadcast to an output, worked out once (a step does it at
/// compile time, so that a run allocates nothing).
#[derive(Debug, Clone)]
pub struct Runs<const N: usize> {
    /// Operands in use (the strides of the others are 0).
    n: usize,
    /// The outer merged axes, outermost first: (size, each operand's stride).
    outer: Vec<(usize, [usize; N])>,
    /// The length of a run (the innermost merged axis) and each operand's stride along
    /// it (0: the run repeats one value).
    inner: usize,
    inner_strides: [usize; N],
    lens: [usize; N],
    total: usize,
}

impl<const N: usize> Runs<N> {
    /// `None` when a shape does not broadcast to `out`, or there are more than `N`.
    pub fn new(shapes: &[&[usize]], out: &[usize]) -> Option<Runs<N>> {
        if shapes.len() > N {
            return None;
        }
        let m = MergedAxes::new(shapes, out)?;
        let at = |ax: usize| -> [usize; N] {
            std::array::from_fn(|k| m.strides.get(k).map_or(0, |s| s[ax]))
        };
        let mut outer: Vec<(usize, [usize; N])> = m
            .dims
            .iter()
            .enumerate()
            .map(|(ax, &d)| (d, at(ax)))
            .collect();
        let (inner, inner_strides) = outer.pop().unwrap_or((1, [0; N]));
        Some(Runs {
            n: shapes.len(),
            outer,
            inner,
            inner_strides,
            lens: std::array::from_fn(|k| shapes.get(k).map_or(1, |s| s.iter().product())),
            total: out.iter().product(),
        })
    }

    /// Elements of the output.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Elements each operand must hold.
    pub fn lens(&self) -> &[usize] {
        &self.lens[..self.n]
    }

    /// Each operand's stride along a run.
    pub fn inner_strides(&self) -> &[usize; N] {
        &self.inner_strides
    }

    /// How many runs the output has.
    pub fn rows(&self) -> usize {
        self.outer.iter().map(|d| d.0).product()
    }

    /// Each operand's offset at the start of run `row`.
    #[inline(always)]
    pub fn offsets(&self, row: usize) -> [usize; N] {
        let mut offs = [0; N];
        let mut rest = row;
        for (size, strides) in self.outer.iter().rev() {
            let i = rest % size;
            rest /= size;
            for (o, s) in offs[..self.n].iter_mut().zip(strides) {
                *o += i * s;
            }
        }
        offs
    }

    /// Run `row` is cut into `pieces` of `chunk` elements (the last may be shorter): a
    /// single long run is cut so that the pool has work to share.
    pub fn pieces(&self) -> (usize, usize) {
        let chunk = if self.rows() == 1 {
            self.inner.div_ceil(64).max(4096)
        } else {
            self.inner
        };
        (self.inner.div_ceil(chunk).max(1), chunk.max(1))
    }

    /// Calls `run(offsets, out_offset, len)` for every piece of every run, split over
    /// `pool` (`work` per element sizes the tasks).
    #[inline]
    pub fn for_each(
        &self,
        pool: Option<&Pool>,
        work: usize,
        run: impl Fn([usize; N], usize, usize) + Sync,
    ) {
        if self.total == 0 {
            return;
        }
        let (pieces, chunk) = self.pieces();
        for_ranges(pool, self.rows() * pieces, chunk * work, &|r| {
            for t in r {
                let (row, piece) = (t / pieces, t % pieces);
                let mut offs = self.offsets(row);
                let j0 = piece * chunk;
                for (o, s) in offs[..self.n].iter_mut().zip(self.inner_strides) {
                    *o += j0 * s;
                }
                run(offs, row * self.inner + j0, chunk.min(self.inner - j0));
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every output element is visited once, with each operand's numpy-broadcast offset.
    #[test]
    fn runs_cover_the_output_with_broadcast_offsets() {
        let out = [2usize, 3, 4];
        let shapes: [&[usize]; 3] = [&[2, 3, 4], &[3, 1], &[4]];
        let runs = Runs::<4>::new(&shapes, &out).unwrap();
        assert_eq!(runs.lens(), &[24, 3, 4]);
        let seen = std::sync::Mutex::new(vec![]);
        runs.for_each(None, 1, |offs, at, len| {
            for j in 0..len {
                let o: Vec<usize> = (0..3)
                    .map(|k| offs[k] + j * runs.inner_strides()[k])
                    .collect();
                seen.lock().unwrap().push((at + j, o));
            }
        });
        let mut seen = seen.into_inner().unwrap();
        seen.sort();
        assert_eq!(seen.len(), 24);
        for (i, o) in seen {
            let (a, b, c) = (i / 12, i / 4 % 3, i % 4);
            assert_eq!(o, vec![i, b, c], "element {i} = [{a}, {b}, {c}]");
        }
        assert!(Runs::<1>::new(&shapes, &out).is_none());
    }
}
