//! `ScatterElements` on f32 data: MaxPool's gradient adds each window's gradient at
//! the flat index of its maximum (`ScatterElements(zeros, indices, gy, add)`). Updates
//! land in index order, one at a time, so repeated indices combine as in the
//! interpreter; the caller has already put the data into the output.
use std::fmt::Debug;

/// How an update combines with the value it lands on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScatterReduce {
    None,
    Add,
    Mul,
    Max,
    Min,
}

impl ScatterReduce {
    pub(crate) fn from_attr(s: &str) -> Option<ScatterReduce> {
        Some(match s {
            "none" => ScatterReduce::None,
            "add" => ScatterReduce::Add,
            "mul" => ScatterReduce::Mul,
            "max" => ScatterReduce::Max,
            "min" => ScatterReduce::Min,
            _ => return None,
        })
    }

    #[inline(always)]
    fn apply(self, cur: f32, v: f32) -> f32 {
        match self {
            ScatterReduce::None => v,
            ScatterReduce::Add => cur + v,
            ScatterReduce::Mul => cur * v,
            ScatterReduce::Max => cur.max(v),
            ScatterReduce::Min => cur.min(v),
        }
    }
}

/// The geometry of one scatter: the data's and the indices' shapes (same rank) and the
/// axis the indices address.
#[derive(Debug, Clone)]
pub struct ScatterPlan {
    data: Vec<usize>,
    indices: Vec<usize>,
    axis: usize,
}

impl ScatterPlan {
    pub(crate) fn new(
        data: &[usize],
        indices: &[usize],
        axis: usize,
    ) -> Result<ScatterPlan, String> {
        if data.len() != indices.len() || axis >= data.len().max(1) {
            return Err(format!(
                "indices {indices:?} on axis {axis} of data {data:?}: ranks or axis do not match"
            ));
        }
        if let Some(a) = (0..data.len()).find(|&a| a != axis && indices[a] > data[a]) {
            return Err(format!(
                "indices {indices:?} exceed data {data:?} on axis {a}"
            ));
        }
        Ok(ScatterPlan {
            data: data.to_vec(),
            indices: indices.to_vec(),
            axis,
        })
    }
}

/// An index element (i32 or i64).
pub trait Index: Copy + Debug {
    fn get(self) -> i64;
}

impl Index for i64 {
    fn get(self) -> i64 {
        self
    }
}

impl Index for i32 {
    fn get(self) -> i64 {
        self as i64
    }
}

/// `out[i with its axis coordinate replaced by idx[i]] (reduce)= upd[i]` for every i in
/// row-major order; `out` holds the data. Negative indices count from the end; an index
/// out of range is an error (what landed before it stays).
pub(crate) fn scatter_elements<I: Index>(
    plan: &ScatterPlan,
    reduce: ScatterReduce,
    idx: &[I],
    upd: &[f32],
    out: &mut [f32],
) -> Result<(), String> {
    let r = plan.data.len();
    let n: usize = plan.indices.iter().product();
    assert!(idx.len() == n && upd.len() == n);
    assert_eq!(out.len(), plan.data.iter().product::<usize>());
    if n == 0 {
        return Ok(());
    }
    let size = plan.data.get(plan.axis).copied().unwrap_or(1) as i64;
    let resolve = |k: I| -> Result<usize, String> {
        let k = k.get();
        let i = if k < 0 { k + size } else { k };
        if (0..size).contains(&i) {
            Ok(i as usize)
        } else {
            Err(format!(
                "index {k} is out of range for axis {} of size {size}",
                plan.axis
            ))
        }
    };
    if r <= 1 {
        // The flat case (MaxPool's gradient): the index is the offset.
        for (&k, &v) in idx.iter().zip(upd) {
            let o = resolve(k)?;
            out[o] = reduce.apply(out[o], v);
        }
        return Ok(());
    }
    let mut strides = vec![1; r];
    for a in (0..r - 1).rev() {
        strides[a] = strides[a + 1] * plan.data[a + 1];
    }
    // Rows of the indices' last axis; within a row the data offset steps by its stride.
    let inner = plan.indices[r - 1];
    let rows = n / inner;
    let mut coord = vec![0; r - 1];
    for row in 0..rows {
        let base: usize = (0..r - 1)
            .filter(|&a| a != plan.axis)
            .map(|a| coord[a] * strides[a])
            .sum();
        let (ks, vs) = (
            &idx[row * inner..(row + 1) * inner],
            &upd[row * inner..(row + 1) * inner],
        );
        for (j, (&k, &v)) in ks.iter().zip(vs).enumerate() {
            let i = resolve(k)?;
            let o = if plan.axis == r - 1 {
                base + i
            } else {
                base + j + i * strides[plan.axis]
            };
            out[o] = reduce.apply(out[o], v);
        }
        for a in (0..r - 1).rev() {
            coord[a] += 1;
            if coord[a] < plan.indices[a] {
                break;
            }
            coord[a] = 0;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testutil::lcg_data;
    use super::*;

    /// The definition, element by element.
    fn reference(
        data: &[usize],
        ishape: &[usize],
        axis: usize,
        reduce: ScatterReduce,
        idx: &[i64],
        upd: &[f32],
        out: &mut [f32],
    ) {
        let r = data.len();
        for (i, (&k, &v)) in idx.iter().zip(upd).enumerate() {
            let (mut rest, mut coord) = (i, vec![0; r]);
            for a in (0..r).rev() {
                coord[a] = rest % ishape[a];
                rest /= ishape[a];
            }
            coord[axis] = if k < 0 { k + data[axis] as i64 } else { k } as usize;
            let mut o = 0;
            for a in 0..r {
                o = o * data[a] + coord[a];
            }
            out[o] = reduce.apply(out[o], v);
        }
    }

    #[test]
    fn scatters_on_every_axis_with_repeats_and_negative_indices() {
        let cases: &[(&[usize], &[usize], usize)] = &[
            (&[50], &[70], 0),
            (&[4, 7], &[3, 7], 0),
            (&[4, 7], &[4, 5], 1),
            (&[3, 5, 6], &[2, 4, 3], 1),
            (&[3, 5, 6], &[3, 5, 6], 2),
            (&[3, 5, 6], &[3, 2, 6], 0),
        ];
        let kinds = [
            ScatterReduce::None,
            ScatterReduce::Add,
            ScatterReduce::Mul,
            ScatterReduce::Max,
            ScatterReduce::Min,
        ];
        for (c, &(data, ishape, axis)) in cases.iter().enumerate() {
            let n: usize = ishape.iter().product();
            let d = data[axis] as i64;
            let idx: Vec<i64> = lcg_data(n, 1.0, c as u64)
                .iter()
                .map(|v| ((v + 1.0) * d as f32) as i64 % (2 * d) - d)
                .collect();
            let upd = lcg_data(n, 1.0, 10 + c as u64);
            let start = lcg_data(data.iter().product(), 1.0, 20 + c as u64);
            let plan = ScatterPlan::new(data, ishape, axis).unwrap();
            for reduce in kinds {
                let mut want = start.clone();
                reference(data, ishape, axis, reduce, &idx, &upd, &mut want);
                let mut got = start.clone();
                scatter_elements(&plan, reduce, &idx, &upd, &mut got).unwrap();
                assert_eq!(got, want, "{data:?} {ishape:?} axis {axis} {reduce:?}");
                let idx32: Vec<i32> = idx.iter().map(|&k| k as i32).collect();
                let mut got = start.clone();
                scatter_elements(&plan, reduce, &idx32, &upd, &mut got).unwrap();
                assert_eq!(got, want);
            }
        }
    }

    #[test]
    fn an_index_out_of_range_is_an_error() {
        let plan = ScatterPlan::new(&[2, 3], &[2, 3], 1).unwrap();
        let mut out = [0.0; 6];
        let e = scatter_elements(
            &plan,
            ScatterReduce::Add,
            &[0i64, 1, 2, 0, 3, 1],
            &[1.0; 6],
            &mut out,
        );
        assert!(e
            .unwrap_err()
            .contains("index 3 is out of range for axis 1 of size 3"));
        assert!(ScatterPlan::new(&[2, 3], &[2, 4], 0).is_err());
    }
}
