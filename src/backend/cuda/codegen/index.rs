//! Index arithmetic from specialized shapes: where element `i` of an output lives in
//! each input that broadcasts into it (numpy rules), as C statements with the sizes as
//! constants.

/// Strides (in elements) of `shape` broadcast into `out`, right-aligned; `None` when it
/// does not broadcast.
pub(crate) fn broadcast_strides(shape: &[usize], out: &[usize]) -> Option<Vec<usize>> {
    if shape.len() > out.len() {
        return None;
    }
    let lead = out.len() - shape.len();
    let mut strides = vec![0; out.len()];
    let mut step = 1;
    for (k, &d) in shape.iter().enumerate().rev() {
        let o = out[lead + k];
        if d == o && d != 1 {
            strides[lead + k] = step;
        } else if d != 1 {
            return None;
        }
        step *= d;
    }
    Some(strides)
}

/// An output walked in merged axes: size-1 axes dropped, neighbours merged where every
/// operand's strides continue, so each operand is contiguous, repeated or strided by as
/// few axes as possible.
#[derive(Debug, Clone)]
pub struct Walk {
    /// Merged sizes, outermost first.
    pub dims: Vec<usize>,
    /// Per operand, its stride along each merged axis.
    pub strides: Vec<Vec<usize>>,
}

impl Walk {
    /// The walk of an output of `out` over operands of `shapes`; `None` when one does
    /// not broadcast.
    pub(crate) fn new(out: &[usize], shapes: &[&[usize]]) -> Option<Walk> {
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
            let st: Vec<usize> = all.iter().map(|s| s[ax]).collect();
            if let Some(last) = dims.last_mut() {
                if strides
                    .iter()
                    .zip(&st)
                    .all(|(l, s)| l.last() == Some(&(s * size)))
                {
                    *last *= size;
                    for (l, s) in strides.iter_mut().zip(&st) {
                        *l.last_mut().expect("merged") = *s;
                    }
                    continue;
                }
            }
            dims.push(size);
            for (l, s) in strides.iter_mut().zip(&st) {
                l.push(*s);
            }
        }
        Some(Walk { dims, strides })
    }

    /// How operand `k` is read at linear index `i`.
    pub(crate) fn access(&self, k: usize) -> Access {
        let st = &self.strides[k];
        if st.iter().all(|&s| s == 0) {
            return Access::Repeated;
        }
        let mut step = 1;
        let mut contiguous = true;
        for (d, &s) in self.dims.iter().zip(st).rev() {
            contiguous &= s == step;
            step *= d;
        }
        if contiguous {
            Access::Linear
        } else {
            Access::Strided
        }
    }

    /// C statements that split `lin` into merged coordinates `{p}c0, {p}c1, …` (of type
    /// `idx`), and per operand the offset expression. Operands read linearly or
    /// repeated need no coordinates, so none are emitted when no operand is strided.
    pub(crate) fn offsets(&self, lin: &str, idx: &str, p: &str) -> (Vec<String>, Vec<String>) {
        let n = self.strides.len();
        let strided = (0..n).any(|k| self.access(k) == Access::Strided);
        let mut stmts = vec![];
        if strided {
            let r = self.dims.len();
            stmts.push(format!("{idx} {p}r = {lin};"));
            for a in (1..r).rev() {
                let d = self.dims[a];
                stmts.push(format!("const {idx} {p}c{a} = {p}r % {d}u; {p}r /= {d}u;"));
            }
            stmts.push(format!("const {idx} {p}c0 = {p}r;"));
        }
        let offs = (0..n)
            .map(|k| match self.access(k) {
                Access::Repeated => "0".to_string(),
                Access::Linear => lin.to_string(),
                Access::Strided => {
                    let terms: Vec<String> = self.strides[k]
                        .iter()
                        .enumerate()
                        .filter(|(_, &s)| s != 0)
                        .map(|(a, &s)| {
                            if s == 1 {
                                format!("{p}c{a}")
                            } else {
                                format!("{p}c{a} * {s}u")
                            }
                        })
                        .collect();
                    format!("({})", terms.join(" + "))
                }
            })
            .collect();
        (stmts, offs)
    }
}

/// How an operand is read along a walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// At the output's own index.
    Linear,
    /// One value everywhere.
    Repeated,
    /// Through coordinates.
    Strided,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_axes_where_strides_continue() {
        let w = Walk::new(&[2, 3, 4, 5], &[&[2, 3, 4, 5], &[4, 1], &[1]]).unwrap();
        assert_eq!(w.dims, vec![6, 4, 5]);
        assert_eq!(w.access(0), Access::Linear);
        assert_eq!(w.access(1), Access::Strided);
        assert_eq!(w.access(2), Access::Repeated);
        assert_eq!(w.strides[1], vec![0, 1, 0]);
        assert!(Walk::new(&[2, 3], &[&[4]]).is_none());
    }
}
