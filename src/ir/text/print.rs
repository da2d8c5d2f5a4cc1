//! The printer. Everything it writes is deterministic: nodes in schedule order,
//! attributes sorted, no addresses.
use std::collections::HashMap;
use std::fmt::Write;
use std::path::Path;

use crate::error::{Error, Result};
use crate::ir::shape::quote_string;
use crate::ir::{Attr, Graph, NodeId, Value};
use crate::tensor::Tensor;

/// How to print constant data.
#[derive(Debug, Clone, Default)]
pub struct PrintOptions {
    /// Constants with more elements than this go to the weights file; `None` inlines all.
    pub inline_limit: Option<usize>,
    /// The weights file's name as the text refers to it (relative to the `.kir` file).
    pub weights_name: String,
    /// Constants with more elements than this print as `elided(<elements>)`, for dumps
    /// a person reads (such text does not parse back); applies before `inline_limit`.
    pub elide_limit: Option<usize>,
}

/// The graph as text, every constant inline.
pub fn print(g: &Graph) -> String {
    print_with(g, &PrintOptions::default()).0
}

/// The graph as text, and the bytes of the weights file (empty if nothing went there).
/// Each external constant starts at a 64-byte aligned offset.
pub fn print_with(g: &Graph, opts: &PrintOptions) -> (String, Vec<u8>) {
    let mut s = String::new();
    let mut weights = Vec::new();
    print_graph(g, opts, "", &mut s, &mut weights);
    s.push('\n');
    (s, weights)
}

/// Appends `g` as `graph "name" { ... }` (no final newline), each line after the first
/// indented by `indent`: bodies print nested in their node's attributes, one level
/// deeper, sharing the top graph's weights file.
fn print_graph(
    g: &Graph,
    opts: &PrintOptions,
    indent: &str,
    s: &mut String,
    weights: &mut Vec<u8>,
) {
    // A graph that fails to schedule (a cycle) still prints, in arena order, so that it
    // can be shown in the error report.
    let order = g.schedule().unwrap_or_else(|_| g.node_ids().collect());
    let number: HashMap<NodeId, usize> = order.iter().enumerate().map(|(i, &id)| (id, i)).collect();
    let refer = |v: &Value| match (number.get(&v.node), v.output) {
        (Some(k), 0) => format!("%{k}"),
        (Some(k), i) => format!("%{k}:{i}"),
        (None, _) => format!("%?{}", v.node.0),
    };
    let inner = format!("{indent}  ");
    writeln!(s, "graph {} {{", quote_string(&g.name)).unwrap();
    for (k, &id) in order.iter().enumerate() {
        let n = g.node(id);
        write!(s, "{inner}%{k} {} = {}", quote_string(&n.name), n.op).unwrap();
        let is_source = matches!(n.op.as_str(), "Parameter" | "Constant" | "Variable");
        if !is_source || !n.inputs.is_empty() {
            let ins: Vec<String> = n
                .inputs
                .iter()
                .map(|v| v.as_ref().map_or("_".to_string(), &refer))
                .collect();
            write!(s, "({})", ins.join(", ")).unwrap();
        }
        if !n.attrs.is_empty() {
            s.push_str(" {");
            for (i, (k, v)) in n.attrs.iter().enumerate() {
                if i > 0 {
                    s.push_str(", ");
                }
                write!(s, "{k} = ").unwrap();
                match v {
                    Attr::Graph(body) => print_graph(body, opts, &inner, s, weights),
                    v => s.push_str(&attr_text(v)),
                }
            }
            s.push('}');
        }
        let types: Vec<String> = n.outputs.iter().map(|t| t.to_string()).collect();
        if n.outputs.len() == 1 && !is_multi_output(&n.op) {
            write!(s, " : {}", types[0]).unwrap();
        } else {
            write!(s, " : ({})", types.join(", ")).unwrap();
        }
        if !n.control_deps.is_empty() {
            let mut deps: Vec<usize> = n
                .control_deps
                .iter()
                .filter_map(|d| number.get(d).copied())
                .collect();
            deps.sort_unstable();
            let deps: Vec<String> = deps.iter().map(|d| format!("%{d}")).collect();
            write!(s, " after({})", deps.join(", ")).unwrap();
        }
        if let Some(data) = &n.data {
            if opts.elide_limit.is_some_and(|lim| data.len() > lim) {
                write!(s, " = elided({})", data.len()).unwrap();
            } else if opts.inline_limit.is_some_and(|lim| data.len() > lim)
                // Strings have no byte layout for a weights file: always inline.
                && !data.dtype().is_string()
            {
                let offset = weights.len().div_ceil(64) * 64;
                weights.resize(offset, 0);
                let bytes = data.to_le_bytes();
                write!(
                    s,
                    " = external({}, {offset}, {})",
                    quote_string(&opts.weights_name),
                    bytes.len()
                )
                .unwrap();
                weights.extend_from_slice(&bytes);
            } else {
                write!(s, " = [{}]", data_text(data)).unwrap();
            }
        }
        s.push('\n');
    }
    if !g.outputs().is_empty() {
        let outs: Vec<String> = g
            .outputs()
            .iter()
            .map(|o| format!("{} = {}", quote_string(&o.name), refer(&o.value)))
            .collect();
        writeln!(s, "{inner}return {}", outs.join(", ")).unwrap();
    }
    write!(s, "{indent}}}").unwrap();
}

/// Ops whose single output is still written as a tuple, so that the parser need not
/// know arities: none today; kept as the one place to say so.
fn is_multi_output(_op: &str) -> bool {
    false
}

/// Writes `g` to `path`, constants above `inline_limit` elements into `<path>.weights`.
pub fn save(g: &Graph, path: &Path, inline_limit: Option<usize>) -> Result<()> {
    let weights_path = path.with_extension("kir.weights");
    let weights_name = weights_path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (text, weights) = print_with(
        g,
        &PrintOptions {
            inline_limit,
            weights_name,
            elide_limit: None,
        },
    );
    std::fs::write(path, text).map_err(|e| Error::io(path, e))?;
    if !weights.is_empty() {
        std::fs::write(&weights_path, weights).map_err(|e| Error::io(&weights_path, e))?;
    }
    Ok(())
}

/// A float that reads back to the same f64 and always looks like a float.
fn float_text(v: f64) -> String {
    format!("{v:?}")
}

fn attr_text(a: &Attr) -> String {
    fn list<T>(kind: &str, v: &[T], f: impl Fn(&T) -> String) -> String {
        if v.is_empty() {
            format!("{kind}[]")
        } else {
            format!("[{}]", v.iter().map(f).collect::<Vec<_>>().join(", "))
        }
    }
    match a {
        Attr::Int(v) => v.to_string(),
        Attr::Float(v) => float_text(*v),
        Attr::String(v) => quote_string(v),
        Attr::Ints(v) => list("ints", v, |x| x.to_string()),
        Attr::Floats(v) => list("floats", v, |x| float_text(*x)),
        Attr::Strings(v) => list("strings", v, |x| quote_string(x)),
        Attr::Graph(g) => {
            let mut s = String::new();
            print_graph(g, &PrintOptions::default(), "", &mut s, &mut vec![]);
            s
        }
    }
}

/// Row-major values; f32/f16/bf16 print their shortest f32 text, which reads back exactly.
fn data_text(t: &Tensor) -> String {
    let items: Vec<String> = match t {
        Tensor::F32(a) => a.iter().map(|v| format!("{v:?}")).collect(),
        Tensor::F64(a) => a.iter().map(|v| format!("{v:?}")).collect(),
        Tensor::F16(a) => a.iter().map(|v| format!("{:?}", v.to_f32())).collect(),
        Tensor::BF16(a) => a.iter().map(|v| format!("{:?}", v.to_f32())).collect(),
        Tensor::Bool(a) => a.iter().map(|v| v.to_string()).collect(),
        // float8/float4 values are exact in f64; they read back to the same code.
        t if t.dtype().is_minifloat() => t.to_f64_vec().iter().map(|v| format!("{v:?}")).collect(),
        Tensor::String(a) => a.iter().map(|v| quote_string(v)).collect(),
        other => other.to_i64_vec().iter().map(|v| v.to_string()).collect(),
    };
    items.join(", ")
}
