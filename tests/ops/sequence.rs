//! The sequence and optional family on the interpreter, op by op, against hand-computed
//! results (`tests/sequences.rs` runs them end to end on `interp` and `cpu` through the
//! text format; the node suite checks them against onnxruntime's outputs).
use kiln::backend::interp::InterpExecutable;
use kiln::backend::Executable;
use kiln::ir::{Attr, Attrs, Graph, Shape, TensorType, Value};
use kiln::tensor::Sequence;
use kiln::{DType, Tensor};

use crate::ops::harness::*;

/// A graph with f32[2] parameters `a`, `b` and the value `SequenceConstruct(a, b)`.
fn two_item_sequence() -> (Graph, Value) {
    let mut g = Graph::new("seq");
    let ty = TensorType::new(DType::F32, Shape::fixed(&[2]));
    let a: Value = g.add_parameter("a", ty.clone()).unwrap().into();
    let b: Value = g.add_parameter("b", ty).unwrap().into();
    let s = g
        .add_op("SequenceConstruct", &[Some(a), Some(b)], Attrs::new(), "s")
        .unwrap();
    (g, s.into())
}

fn add(g: &mut Graph, op: &str, inputs: &[Option<Value>], attrs: Attrs, name: &str) -> Value {
    g.add_op(op, inputs, attrs, name).unwrap().into()
}

fn exec(g: Graph, inputs: &[Tensor]) -> kiln::Result<Vec<Tensor>> {
    InterpExecutable::new(g)?.run(inputs)
}

fn items(t: &Tensor) -> &[Tensor] {
    match t {
        Tensor::Sequence(Sequence { items, .. }) => items,
        other => panic!("not a sequence: {other:?}"),
    }
}

#[test]
fn sequence_at_insert_erase_and_length() {
    let (mut g, s) = two_item_sequence();
    let last = g.add_constant_value("last", Tensor::scalar(-1i64)).unwrap();
    let at = add(
        &mut g,
        "SequenceAt",
        &[Some(s), Some(last.into())],
        Attrs::new(),
        "at",
    );
    let a: Value = g.find("a").unwrap().into();
    let appended = add(
        &mut g,
        "SequenceInsert",
        &[Some(s), Some(a), None],
        Attrs::new(),
        "ins",
    );
    let n = add(
        &mut g,
        "SequenceLength",
        &[Some(appended)],
        Attrs::new(),
        "n",
    );
    let erased = add(
        &mut g,
        "SequenceErase",
        &[Some(s), None],
        Attrs::new(),
        "erased",
    );
    for (name, v) in [("at", at), ("n", n), ("erased", erased), ("ins", appended)] {
        g.add_output(name, v).unwrap();
    }
    let (a, b) = (f32s(&[2], &[1.0, 2.0]), f32s(&[2], &[3.0, 4.0]));
    let out = exec(g, &[a.clone(), b.clone()]).unwrap();
    assert_eq!(out[0], b);
    assert_eq!(out[1], Tensor::scalar(3i64));
    assert_eq!(items(&out[2]), &[a.clone()][..]);
    assert_eq!(items(&out[3]), &[a.clone(), b, a][..]);
}

#[test]
fn sequence_at_out_of_range_names_the_node() {
    let (mut g, s) = two_item_sequence();
    let pos = g
        .add_parameter("pos", TensorType::new(DType::I64, Shape::scalar()))
        .unwrap();
    let at = add(
        &mut g,
        "SequenceAt",
        &[Some(s), Some(pos.into())],
        Attrs::new(),
        "pick",
    );
    g.add_output("y", at).unwrap();
    let x = f32s(&[2], &[0.0, 0.0]);
    let e = exec(g, &[x.clone(), x, Tensor::scalar(2i64)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("pick") && e.contains("SequenceAt"), "{e}");
}

#[test]
fn split_to_sequence_and_concat_from_sequence_invert_each_other() {
    let mut g = Graph::new("split");
    let x: Value = g
        .add_parameter("x", TensorType::new(DType::F32, Shape::fixed(&[4, 2])))
        .unwrap()
        .into();
    let two = g.add_constant_value("two", Tensor::scalar(2i64)).unwrap();
    let parts = add(
        &mut g,
        "SplitToSequence",
        &[Some(x), Some(two.into())],
        Attrs::new(),
        "parts",
    );
    let axis0 = attrs(&[("axis", Attr::Int(0))]);
    let back = add(&mut g, "ConcatFromSequence", &[Some(parts)], axis0, "back");
    g.add_output("parts", parts).unwrap();
    g.add_output("back", back).unwrap();
    let x = f32s(&[4, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
    let out = exec(g, std::slice::from_ref(&x)).unwrap();
    assert_eq!(
        items(&out[0]),
        &[
            f32s(&[2, 2], &[1.0, 2.0, 3.0, 4.0]),
            f32s(&[2, 2], &[5.0, 6.0, 7.0, 8.0])
        ][..]
    );
    assert_eq!(out[1], x);
}

#[test]
fn sequence_empty_then_insert() {
    let mut g = Graph::new("empty");
    let x: Value = g
        .add_parameter("x", TensorType::new(DType::I64, Shape::fixed(&[1])))
        .unwrap()
        .into();
    let dtype = attrs(&[("dtype", Attr::String("i64".into()))]);
    let empty = add(&mut g, "SequenceEmpty", &[], dtype, "empty");
    let one = add(
        &mut g,
        "SequenceInsert",
        &[Some(empty), Some(x), None],
        Attrs::new(),
        "one",
    );
    g.add_output("empty", empty).unwrap();
    g.add_output("one", one).unwrap();
    let x = i64s(&[1], &[7]);
    let out = exec(g, std::slice::from_ref(&x)).unwrap();
    assert!(items(&out[0]).is_empty());
    assert_eq!(items(&out[1]), &[x][..]);
}

#[test]
fn optionals_hold_a_value_or_nothing() {
    let mut g = Graph::new("opt");
    let x: Value = g
        .add_parameter("x", TensorType::new(DType::F32, Shape::fixed(&[2])))
        .unwrap()
        .into();
    let full = add(&mut g, "Optional", &[Some(x)], Attrs::new(), "full");
    let empty_type = attrs(&[("type", Attr::String("f32[2]".into()))]);
    let empty = add(&mut g, "Optional", &[None], empty_type, "empty");
    let has_full = add(
        &mut g,
        "OptionalHasElement",
        &[Some(full)],
        Attrs::new(),
        "has_full",
    );
    let has_empty = add(
        &mut g,
        "OptionalHasElement",
        &[Some(empty)],
        Attrs::new(),
        "has_empty",
    );
    let got = add(
        &mut g,
        "OptionalGetElement",
        &[Some(full)],
        Attrs::new(),
        "got",
    );
    for (name, v) in [
        ("has_full", has_full),
        ("has_empty", has_empty),
        ("got", got),
    ] {
        g.add_output(name, v).unwrap();
    }
    let x = f32s(&[2], &[1.5, -2.0]);
    let out = exec(g, std::slice::from_ref(&x)).unwrap();
    assert_eq!(out[0], Tensor::scalar(true));
    assert_eq!(out[1], Tensor::scalar(false));
    assert_eq!(out[2], x);
}
