//! Numpy broadcasting of several operands into one output, as kernels walk it: the
//! output's axes with size-1 axes dropped and neighbours merged wherever every
//! operand's strides continue, so each operand is read contiguously, as one repeated
//! value, or through as few strided axes as possible. The CPU kernels run loops over
//! it; the CUDA generator turns it into index arithmetic.

/// Strides (in elements) of `shape` broadcast into `out`, right-aligned (0 along
/// broadcast axes); `None` when it does not broadcast.
pub fn broadcast_strides(shape: &[usize], out: &[usize]) -> Option<Vec<usize>> {
    let lead = out.len().checked_sub(shape.len())?;
    let mut strides = vec![0; out.len()];
    let mut step = 1;
    for (k, &d) in shape.iter().enumerate().rev() {
        if d != 1 && d != out[lead + k] {
            return None;
        }
        strides[lead + k] = if d == 1 { 0 } else { step };
        step *= d;
    }
    Some(strides)
}

/// An output's merged axes and every operand's stride along each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergedAxes {
    /// Merged sizes, outermost first (empty for a single element).
    pub dims: Vec<usize>,
    /// Per operand, its stride along each merged axis.
    pub strides: Vec<Vec<usize>>,
}

impl MergedAxes {
    /// The merged axes of an output of `out` over operands of `shapes`; `None` when one
    /// does not broadcast.
    pub fn new(shapes: &[&[usize]], out: &[usize]) -> Option<MergedAxes> {
        let all: Vec<Vec<usize>> = shapes
            .iter()
            .map(|s| broadcast_strides(s, out))
            .collect::<Option<_>>()?;
        let mut dims: Vec<usize> = vec![];
        let mut strides: Vec<Vec<usize>> = vec![vec![]; shapes.len()];
        for (ax, &size) in out.iter().enumerate() {
            if size == 1 {
                continue;
            }
            let continues = !dims.is_empty()
                && strides
                    .iter()
                    .zip(&all)
                    .all(|(l, s)| l.last() == Some(&(s[ax] * size)));
            if continues {
                *dims.last_mut().expect("not empty") *= size;
                for (l, s) in strides.iter_mut().zip(&all) {
                    *l.last_mut().expect("not empty") = s[ax];
                }
            } else {
                dims.push(size);
                for (l, s) in strides.iter_mut().zip(&all) {
                    l.push(s[ax]);
                }
            }
        }
        Some(MergedAxes { dims, strides })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strides_of_broadcast_shapes() {
        assert_eq!(broadcast_strides(&[3, 1], &[2, 3, 4]), Some(vec![0, 1, 0]));
        assert_eq!(broadcast_strides(&[], &[2]), Some(vec![0]));
        assert_eq!(broadcast_strides(&[2, 4], &[2, 4]), Some(vec![4, 1]));
        assert_eq!(broadcast_strides(&[3], &[4]), None);
        assert_eq!(broadcast_strides(&[1, 4], &[4]), None);
    }

    #[test]
    fn merges_axes_where_every_stride_continues() {
        let m = MergedAxes::new(&[&[2, 3, 4, 5], &[4, 1], &[1]], &[2, 3, 4, 5]).unwrap();
        assert_eq!(m.dims, vec![6, 4, 5]);
        assert_eq!(
            m.strides,
            vec![vec![20, 5, 1], vec![0, 1, 0], vec![0, 0, 0]]
        );
        // Size-1 axes vanish; same shapes merge into one run.
        let m = MergedAxes::new(&[&[2, 1, 3], &[2, 1, 3]], &[2, 1, 3]).unwrap();
        assert_eq!(m.dims, vec![6]);
        assert_eq!(m.strides, vec![vec![1], vec![1]]);
        let m = MergedAxes::new(&[&[]], &[]).unwrap();
        assert!(m.dims.is_empty());
        assert!(MergedAxes::new(&[&[4]], &[2, 3]).is_none());
    }
}
