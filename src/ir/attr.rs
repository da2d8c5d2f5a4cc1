//! Node attributes: a sorted map from name to a typed value (sorted so that printing is
//! deterministic). Names and meanings follow ONNX where ONNX has the op.
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use super::graph::Graph;

/// The kind of an attribute value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttrKind {
    Int,
    Float,
    String,
    Ints,
    Floats,
    Strings,
    /// A subgraph (a control-flow op's body): closed, its `Parameter`s are its inputs.
    Graph,
}

impl fmt::Display for AttrKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AttrKind::Int => "int",
            AttrKind::Float => "float",
            AttrKind::String => "string",
            AttrKind::Ints => "ints",
            AttrKind::Floats => "floats",
            AttrKind::Strings => "strings",
            AttrKind::Graph => "graph",
        })
    }
}

/// An attribute value.
#[derive(Debug, Clone, PartialEq)]
pub enum Attr {
    Int(i64),
    Float(f64),
    String(String),
    Ints(Vec<i64>),
    Floats(Vec<f64>),
    Strings(Vec<String>),
    Graph(Arc<Graph>),
}

impl Attr {
    pub(crate) fn kind(&self) -> AttrKind {
        match self {
            Attr::Int(_) => AttrKind::Int,
            Attr::Float(_) => AttrKind::Float,
            Attr::String(_) => AttrKind::String,
            Attr::Ints(_) => AttrKind::Ints,
            Attr::Floats(_) => AttrKind::Floats,
            Attr::Strings(_) => AttrKind::Strings,
            Attr::Graph(_) => AttrKind::Graph,
        }
    }
}

/// A node's attributes, sorted by name.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Attrs(pub BTreeMap<String, Attr>);

impl Attrs {
    pub fn new() -> Attrs {
        Attrs::default()
    }

    /// Builder-style insert: `Attrs::new().with("axis", Attr::Int(1))`.
    pub fn with(mut self, name: &str, value: Attr) -> Attrs {
        self.0.insert(name.to_string(), value);
        self
    }

    pub fn set(&mut self, name: &str, value: Attr) {
        self.0.insert(name.to_string(), value);
    }

    pub fn get(&self, name: &str) -> Option<&Attr> {
        self.0.get(name)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &Attr)> {
        self.0.iter()
    }

    fn wrong(name: &str, want: AttrKind, got: &Attr) -> String {
        format!("attribute '{name}' must be {want}, got {}", got.kind())
    }

    pub fn int(&self, name: &str) -> Result<Option<i64>, String> {
        match self.get(name) {
            None => Ok(None),
            Some(Attr::Int(v)) => Ok(Some(*v)),
            Some(a) => Err(Self::wrong(name, AttrKind::Int, a)),
        }
    }

    pub fn int_or(&self, name: &str, default: i64) -> Result<i64, String> {
        Ok(self.int(name)?.unwrap_or(default))
    }

    pub(crate) fn req_int(&self, name: &str) -> Result<i64, String> {
        self.int(name)?
            .ok_or_else(|| format!("missing required attribute '{name}'"))
    }

    /// A float attribute; an int value is accepted and widened.
    pub(crate) fn float(&self, name: &str) -> Result<Option<f64>, String> {
        match self.get(name) {
            None => Ok(None),
            Some(Attr::Float(v)) => Ok(Some(*v)),
            Some(Attr::Int(v)) => Ok(Some(*v as f64)),
            Some(a) => Err(Self::wrong(name, AttrKind::Float, a)),
        }
    }

    pub fn float_or(&self, name: &str, default: f64) -> Result<f64, String> {
        Ok(self.float(name)?.unwrap_or(default))
    }

    pub(crate) fn string(&self, name: &str) -> Result<Option<&str>, String> {
        match self.get(name) {
            None => Ok(None),
            Some(Attr::String(v)) => Ok(Some(v)),
            Some(a) => Err(Self::wrong(name, AttrKind::String, a)),
        }
    }

    pub fn string_or<'a>(&'a self, name: &str, default: &'a str) -> Result<&'a str, String> {
        Ok(self.string(name)?.unwrap_or(default))
    }

    pub(crate) fn ints(&self, name: &str) -> Result<Option<&[i64]>, String> {
        match self.get(name) {
            None => Ok(None),
            Some(Attr::Ints(v)) => Ok(Some(v)),
            Some(a) => Err(Self::wrong(name, AttrKind::Ints, a)),
        }
    }

    /// A float-list attribute; an int list is accepted and widened.
    pub(crate) fn floats(&self, name: &str) -> Result<Option<Vec<f64>>, String> {
        match self.get(name) {
            None => Ok(None),
            Some(Attr::Floats(v)) => Ok(Some(v.clone())),
            Some(Attr::Ints(v)) => Ok(Some(v.iter().map(|&x| x as f64).collect())),
            Some(a) => Err(Self::wrong(name, AttrKind::Floats, a)),
        }
    }

    pub fn strings(&self, name: &str) -> Result<Option<&[String]>, String> {
        match self.get(name) {
            None => Ok(None),
            Some(Attr::Strings(v)) => Ok(Some(v)),
            Some(a) => Err(Self::wrong(name, AttrKind::Strings, a)),
        }
    }
}

impl Attrs {
    /// A graph attribute (a body).
    pub fn graph(&self, name: &str) -> Result<Option<&Arc<Graph>>, String> {
        match self.get(name) {
            None => Ok(None),
            Some(Attr::Graph(g)) => Ok(Some(g)),
            Some(a) => Err(Self::wrong(name, AttrKind::Graph, a)),
        }
    }

    pub(crate) fn req_graph(&self, name: &str) -> Result<&Arc<Graph>, String> {
        self.graph(name)?
            .ok_or_else(|| format!("missing required attribute '{name}'"))
    }

    /// The graph attributes (bodies), by name.
    pub fn graphs(&self) -> impl Iterator<Item = (&String, &Arc<Graph>)> {
        self.0.iter().filter_map(|(k, v)| match v {
            Attr::Graph(g) => Some((k, g)),
            _ => None,
        })
    }
}
