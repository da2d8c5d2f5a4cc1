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
                Dim::Sym(s) if s == ANY_DIM => f.write_str(ANY_DIM)?,
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

/// An element type and a shape, inside zero or more containers: the type of every value
/// in a graph.
///
/// `containers` lists the sequences and optionals around the tensors, outermost first
/// (`opt<seq<f32[3]>>` is `[Opt, Seq]`); a plain tensor has none. Inside a sequence the
/// shape is only what every element shares: its symbols promise nothing (two elements
/// may differ; what takes an element out gets fresh symbols), its fixed sizes hold for
/// every element. `ranked` is false when even the rank is unknown (`seq<f32>`,
/// `opt<f32>`, or the plain `f32` of an `If` whose branches differ in rank): such a type's
/// shape is empty and says nothing, so read dims through [`TensorType::static_dims`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Shape,
    pub containers: Vec<Container>,
    /// False when the tensors' rank is unknown (the shape is then empty).
    pub ranked: bool,
}

impl TensorType {
    /// A plain tensor.
    pub fn new(dtype: DType, shape: Shape) -> TensorType {
        TensorType {
            dtype,
            shape,
            containers: vec![],
            ranked: true,
        }
    }

    /// A plain tensor of unknown rank: what a value whose rank depends on its input
    /// shapes has until they are bound (see `backend::specialize`).
    pub fn unranked(dtype: DType) -> TensorType {
        TensorType::new(dtype, Shape::scalar()).without_rank()
    }

    /// This type with the tensors' rank unknown (containers kept).
    pub fn without_rank(mut self) -> TensorType {
        self.shape = Shape::scalar();
        self.ranked = false;
        self
    }

    /// Whether this is a plain tensor of unknown rank.
    pub fn is_unranked_tensor(&self) -> bool {
        self.is_tensor() && !self.ranked
    }

    /// The dims when the type is ranked and every dim is fixed.
    pub fn static_dims(&self) -> Option<Vec<usize>> {
        self.ranked.then(|| self.shape.to_fixed()).flatten()
    }

    /// The element count when the type is ranked and its dims are fixed.
    pub fn num_elements(&self) -> Option<usize> {
        self.ranked.then(|| self.shape.num_elements()).flatten()
    }

    /// Whether the type is ranked and every dim is fixed.
    pub fn is_static(&self) -> bool {
        self.ranked && self.shape.axes.iter().all(|a| a.dim.fixed().is_some())
    }

    /// A sequence of tensors of `dtype`, of `shape` when known (element symbols are
    /// dropped: they would promise one size across elements).
    pub fn sequence_of(dtype: DType, shape: Option<Shape>) -> TensorType {
        TensorType::new(dtype, Shape::scalar()).wrapped(Container::Seq, shape)
    }

    /// This type inside `container`; a sequence's element shape becomes `shape` (fixed
    /// dims kept, symbols made anonymous) or unranked.
    pub fn wrapped(&self, container: Container, shape: Option<Shape>) -> TensorType {
        let mut t = self.clone();
        t.containers.insert(0, container);
        if container == Container::Seq && !self.in_sequence() {
            match shape {
                Some(s) => t.shape = anonymous(&s),
                None => {
                    t.shape = Shape::scalar();
                    t.ranked = false;
                }
            }
        }
        t
    }

    /// The type inside the outermost container (a plain tensor stays as it is).
    pub fn unwrapped(&self) -> TensorType {
        let mut t = self.clone();
        if !t.containers.is_empty() {
            t.containers.remove(0);
        }
        t
    }

    /// The outermost container, if any.
    pub fn container(&self) -> Option<Container> {
        self.containers.first().copied()
    }

    /// Whether this is a plain tensor (no sequence or optional around it).
    pub fn is_tensor(&self) -> bool {
        self.containers.is_empty()
    }

    /// Whether a sequence is among the containers (element symbols then mean nothing).
    pub fn in_sequence(&self) -> bool {
        self.containers.contains(&Container::Seq)
    }

    pub fn rank(&self) -> usize {
        self.shape.rank()
    }

    /// Whether values of this type are host objects (strings, sequences, optionals):
    /// no byte layout, so no arena buffer and no kernel reads them.
    pub fn is_host_object(&self) -> bool {
        !self.is_tensor() || self.dtype.is_string()
    }
}

/// A sequence's element shape: fixed sizes and axis names kept, each symbol replaced by
/// `?` (which promises nothing).
fn anonymous(s: &Shape) -> Shape {
    Shape {
        axes: s
            .axes
            .iter()
            .map(|a| Axis {
                dim: match &a.dim {
                    Dim::Fixed(n) => Dim::Fixed(*n),
                    Dim::Sym(_) => Dim::Sym(ANY_DIM.into()),
                },
                name: a.name.clone(),
            })
            .collect(),
    }
}

/// The symbol of a sequence element's dim that is not known: the same for every such
/// dim, and never bound to a size.
pub const ANY_DIM: &str = "?";

pub use crate::tensor::Container;

impl std::str::FromStr for TensorType {
    type Err = String;
    /// A type as [`TensorType`]'s `Display` spells it, without axis names: `f32[N, 3]`,
    /// `seq<f32[?, 3]>`, `opt<seq<i64>>`, `f32` (unknown rank).
    fn from_str(text: &str) -> Result<TensorType, String> {
        parse_type(text.trim(), false).map_err(|e| format!("bad type '{text}': {e}"))
    }
}

/// `in_seq`: dims may be `?`.
fn parse_type(text: &str, in_seq: bool) -> Result<TensorType, String> {
    for c in [Container::Seq, Container::Opt] {
        if let Some(rest) = text.strip_prefix(&format!("{c}<")) {
            let inner = rest.strip_suffix('>').ok_or("expected a closing '>'")?;
            let inner = parse_type(inner.trim(), in_seq || c == Container::Seq)?;
            let shape = inner.ranked.then(|| inner.shape.clone());
            return Ok(inner.wrapped(c, shape));
        }
    }
    let (dtype, dims) = match text.split_once('[') {
        Some((d, rest)) => (d, Some(rest.strip_suffix(']').ok_or("expected ']'")?)),
        None => (text, None),
    };
    let dtype: DType = dtype.trim().parse()?;
    let Some(dims) = dims else {
        return Ok(TensorType::unranked(dtype));
    };
    let dims = dims
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| match d.parse::<usize>() {
            Ok(n) => Ok(Dim::Fixed(n)),
            Err(_) if d == ANY_DIM && in_seq => Ok(Dim::Sym(ANY_DIM.into())),
            Err(_)
                if d.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.') =>
            {
                Ok(Dim::Sym(d.into()))
            }
            Err(_) => Err(format!("bad dim '{d}'")),
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(TensorType::new(dtype, Shape::new(dims)))
}

impl fmt::Display for TensorType {
    /// `f32[N, 784]`, `seq<f32[?, 3]>`, `opt<seq<f32>>`: the text format's spelling.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in &self.containers {
            write!(f, "{c}<")?;
        }
        write!(f, "{}", self.dtype)?;
        if self.ranked {
            write!(f, "{}", self.shape)?;
        }
        for _ in &self.containers {
            f.write_str(">")?;
        }
        Ok(())
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
    fn container_types_print_and_compare() {
        let t = TensorType::new(DType::F32, Shape::new([sym("N"), Dim::Fixed(3)]));
        let seq = t.wrapped(Container::Seq, Some(t.shape.clone()));
        assert_eq!(seq.to_string(), "seq<f32[?, 3]>");
        let opt = seq.wrapped(Container::Opt, None);
        assert_eq!(opt.to_string(), "opt<seq<f32[?, 3]>>");
        assert_eq!(opt.unwrapped(), seq);
        assert_ne!(seq, t);
        assert_eq!(
            TensorType::sequence_of(DType::I64, None).to_string(),
            "seq<i64>"
        );
        assert_eq!(
            t.wrapped(Container::Opt, None).to_string(),
            "opt<f32[N, 3]>"
        );
        for text in [
            "f32[N, 3]",
            "seq<f32[?, 3]>",
            "opt<seq<i64>>",
            "opt<u8[]>",
            "f32",
        ] {
            let t: TensorType = text.parse().unwrap();
            assert_eq!(t.to_string(), text);
        }
        // No dims: the rank is unknown, which no dims-based query mistakes for a scalar.
        let unranked: TensorType = "f32".parse().unwrap();
        assert!(unranked.is_unranked_tensor());
        assert_eq!(unranked.static_dims(), None);
        assert_eq!(unranked.num_elements(), None);
        assert!(!unranked.is_static());
        assert_eq!(
            "f32[]".parse::<TensorType>().unwrap().static_dims(),
            Some(vec![])
        );
        assert!("f32[?]".parse::<TensorType>().is_err());
        assert!("seq<f32[2]".parse::<TensorType>().is_err());
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
