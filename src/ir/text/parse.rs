//! The parser (see the module docs for the grammar): recursive descent over the lexer's
//! tokens, then the verifier, whose errors are reported at the offending node's line.
use std::path::Path;
use std::sync::Arc;

use super::lex::{lex, Tok, Token};
use super::weights::WeightsFiles;
use crate::error::{Error, Result};
use crate::ir::graph::{GraphOutput, Node};
use crate::ir::ops::control::MAX_NESTING;
use crate::ir::shape::ANY_DIM;
use crate::ir::{
    verify, Attr, Attrs, Container, DType, Dim, Graph, NodeId, Shape, TensorType, Value,
};
use crate::tensor::{lowbit, Tensor};

/// Parses `.kir` text; `file` names the source in errors, and external weights are read
/// relative to `base_dir` when given.
pub fn parse(text: &str, file: &str, base_dir: Option<&Path>) -> Result<Graph> {
    let tokens = lex(text).map_err(|e| Error::Parse {
        file: file.into(),
        line: e.line,
        col: e.col,
        msg: e.msg,
    })?;
    let mut p = Parser {
        tokens,
        pos: 0,
        file,
        node_pos: vec![],
        depth: 0,
        weights: WeightsFiles::new(base_dir),
    };
    let g = p.graph()?;
    verify::verify_located(&g).map_err(|(node, e)| {
        let (line, col) = node
            .and_then(|id| p.node_pos.get(id.index()).copied())
            .unwrap_or((1, 1));
        let msg = match e {
            Error::Graph(m) => m,
            Error::UnknownOp(m) => format!("unknown op: {m}"),
            e => e.to_string(),
        };
        p.error_at(line, col, msg)
    })?;
    Ok(g)
}

/// Reads and parses a `.kir` file.
pub fn parse_file(path: &Path) -> Result<Graph> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    parse(&text, &path.display().to_string(), path.parent())
}

struct Parser<'a> {
    tokens: Vec<Token>,
    pos: usize,
    file: &'a str,
    /// Where each node starts, for verifier errors.
    node_pos: Vec<(usize, usize)>,
    /// How many bodies enclose the graph being parsed.
    depth: usize,
    /// The external weights files read so far, by name: each is read once per parse.
    weights: WeightsFiles<'a>,
}

type PResult<T> = Result<T>;

impl Parser<'_> {
    fn peek(&self) -> &Token {
        &self.tokens[self.pos.min(self.tokens.len() - 1)]
    }

    fn next(&mut self) -> Token {
        let t = self.peek().clone();
        if self.pos < self.tokens.len() - 1 {
            self.pos += 1;
        }
        t
    }

    fn error_at(&self, line: usize, col: usize, msg: impl Into<String>) -> Error {
        Error::Parse {
            file: self.file.into(),
            line,
            col,
            msg: msg.into(),
        }
    }

    fn error<T>(&self, t: &Token, msg: impl Into<String>) -> PResult<T> {
        Err(self.error_at(t.line, t.col, msg))
    }

    fn expected<T>(&self, what: &str) -> PResult<T> {
        let t = self.peek().clone();
        self.error(&t, format!("expected {what}, found {}", t.tok.describe()))
    }

    fn is_punct(&self, c: char) -> bool {
        self.peek().tok == Tok::Punct(c)
    }

    fn is_ident(&self, s: &str) -> bool {
        matches!(&self.peek().tok, Tok::Ident(i) if i == s)
    }

    fn punct(&mut self, c: char) -> PResult<()> {
        if self.is_punct(c) {
            self.next();
            Ok(())
        } else {
            self.expected(&format!("'{c}'"))
        }
    }

    fn keyword(&mut self, s: &str) -> PResult<()> {
        if self.is_ident(s) {
            self.next();
            Ok(())
        } else {
            self.expected(&format!("'{s}'"))
        }
    }

    fn string(&mut self, what: &str) -> PResult<String> {
        match self.peek().tok.clone() {
            Tok::Str(s) => {
                self.next();
                Ok(s)
            }
            _ => self.expected(what),
        }
    }

    fn int(&mut self, what: &str) -> PResult<i64> {
        match self.peek().tok {
            Tok::Int(v) => {
                self.next();
                Ok(v)
            }
            _ => self.expected(what),
        }
    }

    /// A name in a type: an identifier or a quoted string.
    fn name(&mut self, what: &str) -> PResult<String> {
        match self.peek().tok.clone() {
            Tok::Ident(s) | Tok::Str(s) => {
                self.next();
                Ok(s)
            }
            _ => self.expected(what),
        }
    }

    /// A `%k[:i]` reference to an earlier node of `g`.
    fn reference(&mut self, g: &Graph) -> PResult<Value> {
        let t = self.peek().clone();
        let Tok::Ref(k, out) = t.tok else {
            return self.expected("a value reference like %3 or %3:1");
        };
        self.next();
        if k as usize >= g.len() {
            return self.error(&t, format!("%{k} is not defined before this point"));
        }
        let outs = g.node(NodeId(k)).outputs.len();
        if out as usize >= outs {
            return self.error(
                &t,
                format!("%{k} has {outs} outputs; there is no output {out}"),
            );
        }
        Ok(NodeId(k).out(out))
    }

    /// A `%k` naming an earlier node (in `after(...)`), whatever its outputs.
    fn node_reference(&mut self, g: &Graph) -> PResult<NodeId> {
        let t = self.peek().clone();
        match t.tok {
            Tok::Ref(k, 0) if (k as usize) < g.len() => {
                self.next();
                Ok(NodeId(k))
            }
            Tok::Ref(k, 0) => self.error(&t, format!("%{k} is not defined before this point")),
            _ => self.expected("a node reference like %3"),
        }
    }

    fn graph(&mut self) -> PResult<Graph> {
        let g = self.graph_block()?;
        if self.peek().tok != Tok::Eof {
            return self.expected("the end of the file after the graph");
        }
        Ok(g)
    }

    /// A body: a nested `graph "name" { ... }` as an attribute value. Its nodes number
    /// from 0 and refer only to each other (bodies are closed).
    fn body(&mut self) -> PResult<Graph> {
        let t = self.peek().clone();
        if self.depth >= MAX_NESTING {
            return self.error(&t, format!("bodies nest deeper than {MAX_NESTING} levels"));
        }
        self.depth += 1;
        let outer = std::mem::take(&mut self.node_pos);
        let g = self.graph_block();
        self.node_pos = outer;
        self.depth -= 1;
        g
    }

    fn graph_block(&mut self) -> PResult<Graph> {
        self.keyword("graph")?;
        let name = self.string("the graph's name as a quoted string")?;
        self.punct('{')?;
        let mut g = Graph::new(&name);
        while matches!(self.peek().tok, Tok::Ref(..)) {
            self.node(&mut g)?;
        }
        if self.is_ident("return") {
            self.next();
            loop {
                let t = self.peek().clone();
                let name = self.string("an output name as a quoted string")?;
                if g.outputs().iter().any(|o| o.name == name) {
                    return self.error(&t, format!("two graph outputs are named '{name}'"));
                }
                self.punct('=')?;
                let value = self.reference(&g)?;
                g.push_output_unchecked(GraphOutput { name, value });
                if !self.is_punct(',') {
                    break;
                }
                self.next();
            }
        }
        if !self.is_punct('}') {
            return self.expected("a node (%k ...), 'return' or '}'");
        }
        self.next();
        Ok(g)
    }

    fn node(&mut self, g: &mut Graph) -> PResult<()> {
        let start = self.peek().clone();
        let Tok::Ref(k, out) = start.tok else {
            unreachable!("called on a reference")
        };
        if k as usize != g.len() || out != 0 {
            return self.error(
                &start,
                format!("expected node %{} (nodes are numbered in order)", g.len()),
            );
        }
        self.next();
        let name_tok = self.peek().clone();
        let name = self.string("the node's name as a quoted string")?;
        if g.find(&name).is_some() {
            return self.error(
                &name_tok,
                format!("the name '{name}' is used by an earlier node"),
            );
        }
        self.punct('=')?;
        let op_tok = self.peek().clone();
        let Tok::Ident(op) = op_tok.tok.clone() else {
            return self.expected("an op name");
        };
        self.next();
        if g.op_impl(&op).is_none() {
            let hint = if op.contains("::") {
                "no op is registered under this name (kiln_register_op)"
            } else {
                "see `kiln ops`"
            };
            return self.error(&op_tok, format!("unknown op '{op}' ({hint})"));
        }
        let mut inputs = vec![];
        if self.is_punct('(') {
            self.next();
            while !self.is_punct(')') {
                if self.is_ident("_") {
                    self.next();
                    inputs.push(None);
                } else {
                    inputs.push(Some(self.reference(g)?));
                }
                if !self.is_punct(',') {
                    break;
                }
                self.next();
            }
            self.punct(')')?;
        }
        let attrs = if self.is_punct('{') {
            self.attrs()?
        } else {
            Attrs::new()
        };
        self.punct(':')?;
        let outputs = self.types()?;
        let mut control_deps = vec![];
        if self.is_ident("after") {
            self.next();
            self.punct('(')?;
            loop {
                control_deps.push(self.node_reference(g)?);
                if !self.is_punct(',') {
                    break;
                }
                self.next();
            }
            self.punct(')')?;
        }
        let mut data = None;
        if self.is_punct('=') {
            self.next();
            let [ty] = outputs.as_slice() else {
                return self.error(&start, "only single-output sources carry data");
            };
            data = Some(Arc::new(self.data(ty)?));
        }
        g.push_unchecked(Node {
            name,
            op,
            inputs,
            attrs,
            outputs,
            control_deps,
            data,
        });
        self.node_pos.push((start.line, start.col));
        Ok(())
    }

    fn attrs(&mut self) -> PResult<Attrs> {
        self.punct('{')?;
        let mut attrs = Attrs::new();
        while !self.is_punct('}') {
            let t = self.peek().clone();
            let Tok::Ident(name) = t.tok.clone() else {
                return self.expected("an attribute name");
            };
            self.next();
            if attrs.get(&name).is_some() {
                return self.error(&t, format!("attribute '{name}' is given twice"));
            }
            self.punct('=')?;
            let value = self.attr_value()?;
            attrs.set(&name, value);
            if !self.is_punct(',') {
                break;
            }
            self.next();
        }
        self.punct('}')?;
        Ok(attrs)
    }

    fn attr_value(&mut self) -> PResult<Attr> {
        let t = self.peek().clone();
        match t.tok.clone() {
            Tok::Int(v) => {
                self.next();
                Ok(Attr::Int(v))
            }
            Tok::Float(v) => {
                self.next();
                Ok(Attr::Float(v))
            }
            Tok::Ident(s) if s == "inf" || s == "NaN" => {
                self.next();
                Ok(Attr::Float(if s == "inf" {
                    f64::INFINITY
                } else {
                    f64::NAN
                }))
            }
            Tok::Str(s) => {
                self.next();
                Ok(Attr::String(s))
            }
            Tok::Ident(s) if s == "graph" => Ok(Attr::Graph(Arc::new(self.body()?))),
            Tok::Ident(s) if matches!(s.as_str(), "ints" | "floats" | "strings") => {
                self.next();
                self.punct('[')?;
                self.punct(']')?;
                Ok(match s.as_str() {
                    "ints" => Attr::Ints(vec![]),
                    "floats" => Attr::Floats(vec![]),
                    _ => Attr::Strings(vec![]),
                })
            }
            Tok::Punct('[') => {
                self.next();
                let mut items = vec![];
                while !self.is_punct(']') {
                    items.push(self.next());
                    if !self.is_punct(',') {
                        break;
                    }
                    self.next();
                }
                self.punct(']')?;
                list_attr(&items)
                    .map_err(|(tok, msg)| self.error_at(tok.line, tok.col, msg))
                    .and_then(|a| match a {
                        Some(a) => Ok(a),
                        None => self.error(
                            &t,
                            "an empty list needs its kind: ints[], floats[] or strings[]",
                        ),
                    })
            }
            _ => self.expected("an attribute value"),
        }
    }

    /// `f32[N, 4]`, or a parenthesized list for any other number of outputs.
    fn types(&mut self) -> PResult<Vec<TensorType>> {
        if !self.is_punct('(') {
            return Ok(vec![self.tensor_type()?]);
        }
        self.next();
        let mut types = vec![];
        while !self.is_punct(')') {
            types.push(self.tensor_type()?);
            if !self.is_punct(',') {
                break;
            }
            self.next();
        }
        self.punct(')')?;
        Ok(types)
    }

    /// `f32[N, 4]`, `f32` (unknown rank), or inside containers `seq<f32[?, 4]>`,
    /// `opt<seq<f32>>`.
    fn tensor_type(&mut self) -> PResult<TensorType> {
        self.type_in(false)
    }

    /// A type; `in_seq` when inside a sequence, where dims may be `?`. No dims: the rank
    /// is unknown (`f32`, `seq<f32>`).
    fn type_in(&mut self, in_seq: bool) -> PResult<TensorType> {
        let t = self.peek().clone();
        let Tok::Ident(d) = t.tok.clone() else {
            return self.expected("a type like f32[N, 4]");
        };
        let container = match d.as_str() {
            "seq" => Some(Container::Seq),
            "opt" => Some(Container::Opt),
            _ => None,
        };
        if let Some(c) = container {
            self.next();
            self.punct('<')?;
            let inner = self.type_in(in_seq || c == Container::Seq)?;
            self.punct('>')?;
            let shape = inner.ranked.then(|| inner.shape.clone());
            return Ok(inner.wrapped(c, shape));
        }
        let Ok(dtype) = d.parse::<DType>() else {
            return self.error(&t, format!("unknown dtype '{d}'"));
        };
        self.next();
        if !self.is_punct('[') {
            return Ok(TensorType::unranked(dtype));
        }
        self.punct('[')?;
        let (mut dims, mut names) = (vec![], vec![]);
        while !self.is_punct(']') {
            let first = self.peek().clone();
            let mut name = None;
            if matches!(first.tok, Tok::Ident(_) | Tok::Str(_))
                && self
                    .tokens
                    .get(self.pos + 1)
                    .is_some_and(|n| n.tok == Tok::Punct(':'))
            {
                name = Some(self.name("an axis name")?);
                self.next();
            }
            let t = self.peek().clone();
            dims.push(match t.tok {
                Tok::Int(n) if n >= 0 => {
                    self.next();
                    Dim::Fixed(n as usize)
                }
                Tok::Punct('?') if in_seq => {
                    self.next();
                    Dim::Sym(ANY_DIM.into())
                }
                Tok::Ident(_) | Tok::Str(_) => Dim::Sym(self.name("a dim")?),
                _ => return self.expected("a dim (a size or a symbol)"),
            });
            names.push(name);
            if !self.is_punct(',') {
                break;
            }
            self.next();
        }
        self.punct(']')?;
        Ok(TensorType::new(dtype, Shape::named(dims, names)))
    }

    /// `[v, ...]` inline, or `external("file", offset, len)`.
    fn data(&mut self, ty: &TensorType) -> PResult<Tensor> {
        let t = self.peek().clone();
        let Some(dims) = ty.static_dims() else {
            return self.error(
                &t,
                format!("a source with data must have a static type, not {ty}"),
            );
        };
        if self.is_ident("elided") {
            return self.error(
                &t,
                "this constant's data was elided (an IR dump); print the graph without eliding to parse it",
            );
        }
        if self.is_ident("external") {
            self.next();
            self.punct('(')?;
            let file_tok = self.peek().clone();
            let file = self.string("the weights file name")?;
            self.punct(',')?;
            let offset = self.int("a byte offset")?;
            self.punct(',')?;
            let len = self.int("a byte length")?;
            self.punct(')')?;
            if self.weights.dir().is_none() {
                return self.error(&file_tok, "external weights need the .kir file's directory");
            }
            let bytes = match self.weights.get(&file, "the .kir file's folder") {
                Ok(bytes) => bytes,
                Err(e) => return self.error(&file_tok, e),
            };
            let range = usize::try_from(offset)
                .ok()
                .zip(usize::try_from(len).ok())
                .and_then(|(o, l)| Some(o..o.checked_add(l)?))
                .filter(|r| r.end <= bytes.len());
            let Some(range) = range else {
                return self.error(
                    &file_tok,
                    format!(
                        "bytes {offset}..+{len} are outside '{file}' ({} bytes)",
                        bytes.len()
                    ),
                );
            };
            return Tensor::from_le_bytes(ty.dtype, &dims, &bytes[range])
                .or_else(|e| self.error(&file_tok, e));
        }
        self.punct('[')?;
        let mut items = vec![];
        while !self.is_punct(']') {
            items.push(self.next());
            if !self.is_punct(',') {
                break;
            }
            self.next();
        }
        self.punct(']')?;
        let Some(n) = dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) else {
            return self.error(&t, format!("{ty} has too many elements"));
        };
        if items.len() != n {
            return self.error(&t, format!("{} values given, {ty} holds {n}", items.len()));
        }
        if ty.dtype.is_string() {
            let mut v = Vec::with_capacity(n);
            for it in &items {
                match &it.tok {
                    Tok::Str(s) => v.push(s.clone()),
                    other => {
                        return self
                            .error(it, format!("expected a string, found {}", other.describe()))
                    }
                }
            }
            Tensor::from_strings(&dims, v).or_else(|e| self.error(&t, e))
        } else if ty.dtype.is_float() || ty.dtype.is_minifloat() {
            let mut v = Vec::with_capacity(n);
            for it in &items {
                v.push(match &it.tok {
                    Tok::Float(f) => *f,
                    Tok::Int(i) => *i as f64,
                    Tok::Ident(s) if s == "inf" => f64::INFINITY,
                    Tok::Ident(s) if s == "NaN" => f64::NAN,
                    other => {
                        return self
                            .error(it, format!("expected a number, found {}", other.describe()))
                    }
                });
            }
            if ty.dtype.is_minifloat() {
                lowbit::minifloat_from_f64s(ty.dtype, &dims, &v)
            } else {
                Tensor::from_f64s(ty.dtype, &dims, &v)
            }
            .or_else(|e| self.error(&t, e))
        } else {
            let mut v = Vec::with_capacity(n);
            let is_bool = ty.dtype == DType::Bool;
            for it in &items {
                v.push(match (&it.tok, is_bool) {
                    (Tok::Ident(s), true) if s == "true" => 1,
                    (Tok::Ident(s), true) if s == "false" => 0,
                    (Tok::Int(i), false) if in_range(*i, ty.dtype) => *i,
                    (other, _) => {
                        return self.error(
                            it,
                            format!("expected a {} value, found {}", ty.dtype, other.describe()),
                        )
                    }
                });
            }
            Tensor::from_i64s(ty.dtype, &dims, &v).or_else(|e| self.error(&t, e))
        }
    }
}

fn in_range(v: i64, dtype: DType) -> bool {
    match dtype {
        DType::I8 => i8::try_from(v).is_ok(),
        DType::U8 => u8::try_from(v).is_ok(),
        DType::I32 => i32::try_from(v).is_ok(),
        DType::I16 => i16::try_from(v).is_ok(),
        DType::U16 => u16::try_from(v).is_ok(),
        DType::U32 => u32::try_from(v).is_ok(),
        DType::I4 => (lowbit::I4::MIN..=lowbit::I4::MAX).contains(&v),
        DType::U4 => (lowbit::U4::MIN..=lowbit::U4::MAX).contains(&v),
        DType::I2 => (lowbit::I2::MIN..=lowbit::I2::MAX).contains(&v),
        DType::U2 => (lowbit::U2::MIN..=lowbit::U2::MAX).contains(&v),
        _ => true,
    }
}

/// A bracketed attribute list: all ints, numbers with a float (floats), or all strings.
/// `None` for an empty list, whose kind the text must spell.
fn list_attr(items: &[Token]) -> std::result::Result<Option<Attr>, (Token, String)> {
    let Some(first) = items.first() else {
        return Ok(None);
    };
    if matches!(first.tok, Tok::Str(_)) {
        let mut v = vec![];
        for it in items {
            match &it.tok {
                Tok::Str(s) => v.push(s.clone()),
                other => {
                    return Err((
                        it.clone(),
                        format!("expected a string, found {}", other.describe()),
                    ))
                }
            }
        }
        return Ok(Some(Attr::Strings(v)));
    }
    let mut ints = vec![];
    let mut floats = vec![];
    let mut any_float = false;
    for it in items {
        match &it.tok {
            Tok::Int(i) => {
                ints.push(*i);
                floats.push(*i as f64);
            }
            Tok::Float(f) => {
                any_float = true;
                floats.push(*f);
            }
            Tok::Ident(s) if s == "inf" || s == "NaN" => {
                any_float = true;
                floats.push(if s == "inf" { f64::INFINITY } else { f64::NAN });
            }
            other => {
                return Err((
                    it.clone(),
                    format!("expected a number, found {}", other.describe()),
                ))
            }
        }
    }
    Ok(Some(if any_float {
        Attr::Floats(floats)
    } else {
        Attr::Ints(ints)
    }))
}
