//! Generators for the ops on host objects and for control flow: sequences, optionals,
//! strings, If, Loop and Scan. Bodies are typed by the column's dtype, so they are made
//! per column (`Form::typed_attrs`).
use super::{form, int, x, Form, In};

use std::sync::Arc;

use kiln::ir::{Attr, Attrs, DType, Dim, Graph, Shape, TensorType, Value};
use kiln::Tensor;

fn seq(items: &[&[usize]]) -> In {
    In::Seq(items.iter().map(|s| s.to_vec()).collect())
}

fn strings(dims: &[usize]) -> In {
    In::Str(dims.to_vec())
}

fn scalar_i64(v: i64) -> In {
    In::C(Tensor::scalar(v))
}

fn s(k: &str, v: &str) -> Attrs {
    Attrs::new().with(k, Attr::String(v.into()))
}

/// A form whose attributes (bodies) depend on the column's dtype.
fn typed(label: &str, ins: Vec<In>, attrs: fn(DType) -> Attrs) -> Form {
    let mut f = form(label, ins, Attrs::new());
    f.typed_attrs = Some(attrs);
    f
}

/// A body graph: parameters of these types, results made by `f`.
fn body(
    name: &str,
    params: &[TensorType],
    f: impl FnOnce(&mut Graph, &[Value]) -> Vec<Value>,
) -> Arc<Graph> {
    let mut g = Graph::new(name);
    let ps: Vec<Value> = params
        .iter()
        .enumerate()
        .map(|(k, t)| g.add_parameter(&format!("p{k}"), t.clone()).unwrap().into())
        .collect();
    for (k, v) in f(&mut g, &ps).into_iter().enumerate() {
        g.add_output(&format!("r{k}"), v).unwrap();
    }
    Arc::new(g)
}

fn op(g: &mut Graph, name: &str, ins: &[Value], attrs: Attrs) -> Value {
    g.op(name, ins, attrs, "").unwrap().into()
}

fn t(d: DType, dims: &[usize]) -> TensorType {
    TensorType::new(d, Shape::fixed(dims))
}

fn scalar(d: DType) -> TensorType {
    t(d, &[])
}

fn branches(then: Arc<Graph>, other: Arc<Graph>) -> Attrs {
    Attrs::new()
        .with("then_branch", Attr::Graph(then))
        .with("else_branch", Attr::Graph(other))
        .with("captures", Attr::Int(1))
}

fn if_static(d: DType) -> Attrs {
    let then = body("then", &[t(d, &[3, 3])], |g, p| {
        vec![op(g, "Identity", p, Attrs::new())]
    });
    let other = body("else", &[t(d, &[3, 3])], |g, p| {
        vec![op(
            g,
            "Transpose",
            p,
            Attrs::new().with("perm", Attr::Ints(vec![1, 0])),
        )]
    });
    branches(then, other)
}

fn if_dynamic(d: DType) -> Attrs {
    let then = body("then", &[t(d, &[3, 3])], |g, p| {
        vec![op(g, "Identity", p, Attrs::new())]
    });
    let other = body("else", &[t(d, &[3, 3])], |g, p| {
        vec![op(g, "Concat", &[p[0], p[0]], int("axis", 0))]
    });
    branches(then, other)
}

fn if_sequence(d: DType) -> Attrs {
    let then = body("then", &[t(d, &[3, 3])], |g, p| {
        vec![op(g, "SequenceConstruct", p, Attrs::new())]
    });
    let other = body("else", &[t(d, &[3, 3])], |g, p| {
        vec![op(g, "SequenceConstruct", &[p[0], p[0]], Attrs::new())]
    });
    branches(then, other)
}

/// A Loop body carrying `v` unchanged and giving it as a scan output each iteration.
fn loop_scan(d: DType) -> Attrs {
    let b = body(
        "body",
        &[scalar(DType::I64), scalar(DType::Bool), t(d, &[2, 3])],
        |g, p| vec![p[1], op(g, "Identity", &[p[2]], Attrs::new()), p[2]],
    );
    Attrs::new().with("body", Attr::Graph(b))
}

/// A Loop body doubling its carried value along axis 0 each iteration.
fn loop_growing(d: DType) -> Attrs {
    let grows = TensorType::new(d, Shape::new(vec![Dim::Sym("n".into()), Dim::Fixed(2)]));
    let b = body(
        "body",
        &[scalar(DType::I64), scalar(DType::Bool), grows],
        |g, p| vec![p[1], op(g, "Concat", &[p[2], p[2]], int("axis", 0))],
    );
    Attrs::new().with("body", Attr::Graph(b))
}

/// A Scan body: the state becomes the slice, the old state the scan output.
fn scan_swap(d: DType) -> Attrs {
    let b = body("body", &[t(d, &[2]), t(d, &[2])], |g, p| {
        vec![
            op(g, "Identity", &[p[1]], Attrs::new()),
            op(g, "Identity", &[p[0]], Attrs::new()),
        ]
    });
    Attrs::new()
        .with("body", Attr::Graph(b))
        .with("num_scan_inputs", Attr::Int(1))
}

/// The forms of `name`, if it is one of these ops.
pub(super) fn forms(name: &str) -> Option<Vec<Form>> {
    let none = Attrs::new;
    let bool_scalar = || In::T(DType::Bool, vec![]);
    Some(match name {
        "SequenceEmpty" => vec![
            form("f32", vec![], none()),
            form("i64", vec![], s("dtype", "i64")),
        ],
        "SequenceConstruct" => vec![
            form("one", vec![x(&[2, 3])], none()),
            form(
                "of different shapes",
                vec![x(&[2, 3]), x(&[4]), x(&[])],
                none(),
            ),
        ],
        "SequenceLength" => vec![
            form("three", vec![seq(&[&[2], &[3], &[0]])], none()),
            form("empty", vec![seq(&[])], none()),
        ],
        "SequenceAt" => vec![form(
            "run-time position, negative too",
            vec![
                seq(&[&[2, 3], &[4, 3], &[1, 3]]),
                In::I(DType::I64, vec![], -3, 3),
            ],
            none(),
        )],
        "SequenceInsert" => vec![
            form("at the back", vec![seq(&[&[2, 3]]), x(&[2, 3])], none()),
            form(
                "at a run-time position",
                vec![
                    seq(&[&[2], &[3]]),
                    x(&[1]),
                    In::I(DType::I32, vec![], -2, 3),
                ],
                none(),
            ),
        ],
        "SequenceErase" => vec![
            form("the last", vec![seq(&[&[2], &[3], &[1]])], none()),
            form(
                "at a run-time position",
                vec![seq(&[&[2], &[3], &[1]]), In::I(DType::I64, vec![], -3, 3)],
                none(),
            ),
        ],
        "SplitToSequence" => vec![
            form("ones along axis 0", vec![x(&[3, 2])], none()),
            form("ones, axis dropped", vec![x(&[3, 2])], int("keepdims", 0)),
            form(
                "chunks of 2, the last smaller",
                vec![x(&[2, 5]), scalar_i64(2)],
                int("axis", 1),
            ),
            form("sizes", vec![x(&[4, 2]), super::i64s(&[1, 3])], none()),
            form(
                "negative axis",
                vec![x(&[2, 3, 2]), super::i64s(&[2, 0, 1])],
                int("axis", -2),
            ),
            form("an empty axis", vec![x(&[0, 2])], none()),
        ],
        "ConcatFromSequence" => vec![
            form(
                "axis 0",
                vec![seq(&[&[2, 3], &[1, 3], &[0, 3]])],
                int("axis", 0),
            ),
            form(
                "a new last axis",
                vec![seq(&[&[2, 3], &[2, 3]])],
                int("axis", -1).with("new_axis", Attr::Int(1)),
            ),
        ],
        "Optional" => vec![
            form("of a tensor", vec![x(&[2, 3])], none()),
            form("of a sequence", vec![seq(&[&[2], &[1]])], none()),
            form("empty", vec![In::Absent], s("type", "f32[2]")),
        ],
        "OptionalHasElement" => vec![
            form("full", vec![In::Opt(Some(vec![2, 3]))], none()),
            form("empty", vec![In::Opt(None)], none()),
            form("a plain tensor", vec![x(&[2])], none()),
            form("nothing", vec![In::Absent], none()),
        ],
        "OptionalGetElement" => vec![
            form("full", vec![In::Opt(Some(vec![2, 3]))], none()),
            form("a plain tensor", vec![x(&[2, 3])], none()),
            form("a sequence", vec![seq(&[&[2], &[1]])], none()),
        ],
        "StringConcat" => vec![
            form("same shape", vec![strings(&[3]), strings(&[3])], none()),
            form("broadcast", vec![strings(&[2, 1]), strings(&[3])], none()),
            form("scalars", vec![strings(&[]), strings(&[])], none()),
        ],
        "StringNormalizer" => vec![
            form(
                "lower",
                vec![strings(&[4])],
                s("case_change_action", "LOWER"),
            ),
            form(
                "upper, stopwords",
                vec![strings(&[1, 4])],
                s("case_change_action", "UPPER")
                    .with("stopwords", Attr::Strings(vec!["monday".into()])),
            ),
        ],
        "StringSplit" => vec![
            form("whitespace", vec![strings(&[3])], none()),
            form(
                "a delimiter, maxsplit 1",
                vec![strings(&[2, 2])],
                s("delimiter", "a").with("maxsplit", Attr::Int(1)),
            ),
            form("empty", vec![strings(&[0])], none()),
        ],
        "RegexFullMatch" => vec![
            form("letters", vec![strings(&[4])], s("pattern", "[a-z]+")),
            form(
                "2-D, groups",
                vec![strings(&[2, 2])],
                s("pattern", "(mon|tues)day"),
            ),
        ],
        "If" => vec![
            typed(
                "branches of one type",
                vec![bool_scalar(), x(&[3, 3])],
                if_static,
            ),
            typed(
                "branches of different shapes",
                vec![bool_scalar(), x(&[3, 3])],
                if_dynamic,
            ),
            typed(
                "sequence results",
                vec![bool_scalar(), x(&[3, 3])],
                if_sequence,
            ),
        ],
        "Loop" => vec![
            typed(
                "constant trip count, a scan output",
                vec![scalar_i64(3), In::Absent, x(&[2, 3])],
                loop_scan,
            ),
            typed(
                "run-time trip count and condition, a scan output",
                vec![In::I(DType::I64, vec![], 0, 4), bool_scalar(), x(&[2, 3])],
                loop_scan,
            ),
            typed(
                "a carried value that grows",
                vec![In::I(DType::I64, vec![], 0, 4), In::Absent, x(&[1, 2])],
                loop_growing,
            ),
        ],
        "Scan" => vec![typed(
            "state and one scan input",
            vec![x(&[2]), x(&[3, 2])],
            scan_swap,
        )],
        _ => return None,
    })
}
