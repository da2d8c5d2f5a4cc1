//! Shapes: fixed and symbolic dims, each axis optionally named.
//!
//! A symbolic dim (`N`, `S`) stands for a size known only at run time; two equal symbols
//! are the same size. An axis name (`C`, `H`, `batch`) is a label that ops may use
//! instead of a position, and that the verifier checks where two tensors meet.
use std::fmt;

use super::DType;

/// One dimension: a known size or a named symbol.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dim {
    Fixed(usize),
    Sym(String),
}

impl Dim {
    pub(crate) fn fixed(self: &Dim) -> Option<usize> {
        match self {
            Dim::Fixed(n) => Some(*n),
            Dim::Sym(_) => None,
        }
    }
    pub(crate) fn is_one(&self) -> bool {
        *self == Dim::Fixed(1)
    }
}

impl From<usize> for Dim {
    fn from(n: usize) -> Dim {
        Dim::Fixed(n)
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Fixed(n) => write!(f, "{n}"),
            Dim::Sym(s) => f.write_str(s),
        }
    }
}

/// One axis of a shape: its size and, optionally, its name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Axis {
    pub dim: Dim,
    pub name: Option<String>,
}

/// A shape: an ordered list of axes. Rank 0 is a scalar.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Shape {
    pub axes: Vec<Axis>,
}

impl Shape {
    pub fn scalar() -> Shape {
        Shape { axes: vec![] }
    }

    /// An unnamed shape from dims.
    pub fn new(dims: impl IntoIterator<Item = Dim>) -> Shape {
        Shape {
            axes: dims
                .into_iter()
                .map(|dim| Axis { dim, name: None })
                .collect(),
        }
    }

    /// An unnamed, fully static shape.
    pub fn fixed(dims: &[usize]) -> Shape {
        Shape::new(dims.iter().map(|&d| Dim::Fixed(d)))
    }

    /// A shape from dims with one optional name per axis.
    pub fn named(dims: Vec<Dim>, names: Vec<Option<String>>) -> Shape {
        assert_eq!(dims.len(), names.len(), "one name slot per axis");
        Shape {
            axes: dims
                .into_iter()
                .zip(names)
                .map(|(dim, name)| Axis { dim, name })
                .collect(),
        }
    }

    pub(crate) fn rank(&self) -> usize {
        self.axes.len()
    }

    pub(crate) fn dim(&self, i: usize) -> &Dim {
        &self.axes[i].dim
    }

    pub fn dims(&self) -> Vec<Dim> {
        self.axes.iter().map(|a| a.dim.clone()).collect()
    }

    pub(crate) fn name(&self, i: usize) -> Option<&str> {
        self.axes[i].name.as_deref()
    }

    pub(crate) fn has_names(&self) -> bool {
        self.axes.iter().any(|a| a.name.is_some())
    }

    /// The same dims with every name dropped.
    pub fn unnamed(&self) -> Shape {
        Shape::new(self.dims())
    }

    /// The position of the axis called `name`.
    pub(crate) fn axis_by_name(&self, name: &str) -> Option<usize> {
        self.axes
            .iter()
            .position(|a| a.name.as_deref() == Some(name))
    }

    /// All dims as sizes, if every one is fixed.
    pub fn to_fixed(&self) -> Option<Vec<usize>> {
        self.axes.iter().map(|a| a.dim.fixed()).collect()
    }

    pub(crate) fn is_static(&self) -> bool {
        self.axes.iter().all(|a| matches!(a.dim, Dim::Fixed(_)))
    }

    /// The number of elements, if static.
    pub fn num_elements(&self) -> Option<usize> {
        // A product too large for usize is no count at all.
        self.to_fixed()
            .and_then(|d| d.iter().try_fold(1usize, |n, &x| n.checked_mul(x)))
    }

    /// Resolves a possibly negative `axis` against this rank (ONNX convention).
    pub(crate) fn norm_axis(&self, axis: i64) -> Result<usize, String> {
        norm_axis(axis, self.rank())
    }
}

/// Resolves a possibly negative `axis` against `rank`; `-1` is the last axis.
pub(crate) fn norm_axis(axis: i64, rank: usize) -> Result<usize, String> {
    let r = rank as i64;
    if axis < -r || axis >= r {
        return Err(format!("axis {axis} is out of range for rank {rank}"));
    }
    Ok(if axis < 0 { axis + r } else { axis } as usize)
}

/// Two axis names that meet (in a broadcast, a contraction) must agree when both are
/// given; the survivor is whichever is given.
pub(crate) fn merge_names(a: Option<&str>, b: Option<&str>) -> Result<Option<String>, String> {
    match (a, b) {
        (Some(x), Some(y)) if x != y => Err(format!("axis name mismatch: '{x}' vs '{y}'")),
        (Some(x), _) | (_, Some(x)) => Ok(Some(x.to_string())),
        (None, None) => Ok(None),
    }
}

/// Numpy (multidirectional) broadcasting of two shapes, with axis names checked.
///
/// Fixed 1 broadcasts to anything; a symbol meets a fixed size n != 1 as n (checked at
/// run time); two different symbols are assumed equal (also checked at run time) and the
/// first one is kept.
pub(crate) fn broadcast_shapes(a: &Shape, b: &Shape) -> Result<Shape, String> {
    let rank = a.rank().max(b.rank());
    let mut axes = Vec::with_capacity(rank);
    for i in 0..rank {
        let ax = (i + a.rank()).checked_sub(rank).map(|j| &a.axes[j]);
        let bx = (i + b.rank()).checked_sub(rank).map(|j| &b.axes[j]);
        let axis = match (ax, bx) {
            (Some(x), None) | (None, Some(x)) => x.clone(),
            (Some(x), Some(y)) => {
                let name = merge_names(x.name.as_deref(), y.name.as_deref()).map_err(|e| {
                    format!("cannot broadcast {a} with {b}: {e} at axis {i} of the result")
                })?;
                let dim = match (&x.dim, &y.dim) {
                    (Dim::Fixed(1), d) | (d, Dim::Fixed(1)) => d.clone(),
                    (Dim::Fixed(p), Dim::Fixed(q)) if p != q => {
                        return Err(format!(
                            "cannot broadcast {a} with {b}: dims {p} and {q} at axis {i} of the result differ"
                        ))
                    }
                    (Dim::Fixed(p), _) | (_, Dim::Fixed(p)) => Dim::Fixed(*p),
                    (s, _) => s.clone(),
                };
                Axis { dim, name }
            }
            (None, None) => unreachable!("i < max rank"),
        };
        axes.push(axis);
    }
    Ok(Shape { axes })
}

impl fmt::Display for Shape {
    /// `[N, 784]`, or with names `[batch:N, C:3]`: the text format's spelling.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, a) in self.axes.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            if let Some(n) = &a.name {
                write!(f, "{}:", quote_ident(n))?;
            }
            match &a.dim {
                Dim::Fixed(n) => write!(f, "{n}")?,
                Dim::Sym(s) => f.write_str(&quote_ident(s))?,
            }
        }
        f.write_str("]")
    }
}

/// A name printed bare when it is an identifier, else as a quoted string.
pub(crate) fn quote_ident(s: &str) -> String {
    let mut chars = s.chars();
    let ident = matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
    if ident {
        s.to_string()
    } else {
        quote_string(s)
    }
}

/// A Rust/JSON-style quoted string with `\"`, `\\`, `\n`, `\t` and `\u{..}` escapes.
pub(crate) fn quote_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// An element type and a shape: the type of every value in a graph.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Shape,
}

impl TensorType {
    pub fn new(dtype: DType, shape: Shape) -> TensorType {
        TensorType { dtype, shape }
    }
    pub fn rank(&self) -> usize {
        self.shape.rank()
    }
}

impl fmt::Display for TensorType {
    /// `f32[N, 784]`: the text format's spelling.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, self.shape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sym(s: &str) -> Dim {
        Dim::Sym(s.into())
    }

    #[test]
    fn broadcast_follows_numpy() {
        let a = Shape::new([sym("N"), Dim::Fixed(1), Dim::Fixed(4)]);
        let b = Shape::fixed(&[3, 1]);
        let c = broadcast_shapes(&a, &b).unwrap();
        assert_eq!(c.dims(), vec![sym("N"), Dim::Fixed(3), Dim::Fixed(4)]);
        assert!(broadcast_shapes(&Shape::fixed(&[2]), &Shape::fixed(&[3])).is_err());
        assert_eq!(
            broadcast_shapes(&Shape::scalar(), &Shape::fixed(&[0])).unwrap(),
            Shape::fixed(&[0])
        );
    }

    #[test]
    fn broadcast_checks_axis_names() {
        let a = Shape::named(vec![Dim::Fixed(2)], vec![Some("C".into())]);
        let b = Shape::named(vec![Dim::Fixed(2)], vec![Some("H".into())]);
        let e = broadcast_shapes(&a, &b).unwrap_err();
        assert!(e.contains("'C' vs 'H'"), "{e}");
        let u = Shape::fixed(&[2]);
        assert_eq!(broadcast_shapes(&a, &u).unwrap().name(0), Some("C"));
    }

    #[test]
    fn display_quotes_odd_names() {
        let s = Shape::named(
            vec![sym("N"), Dim::Fixed(3)],
            vec![Some("batch".into()), Some("a b".into())],
        );
        assert_eq!(s.to_string(), "[batch:N, \"a b\":3]");
    }
}
