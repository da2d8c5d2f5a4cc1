//! Strings, sequences and optionals end to end: their types in the text format, the
//! sequence family and the shape ops that move strings, on `interp` and `cpu` alike,
//! and the errors that name the node or input.
use kiln::backend::{backend_for, Device};
use kiln::ir::text;
use kiln::tensor::{Optional, Sequence};
use kiln::{DType, Tensor};

fn f32s(shape: &[usize], v: &[f32]) -> Tensor {
    Tensor::from_vec(shape, v.to_vec()).unwrap()
}

fn strings(shape: &[usize], v: &[&str]) -> Tensor {
    Tensor::from_strings(shape, v.iter().map(|s| s.to_string()).collect()).unwrap()
}

fn seq(dtype: DType, items: Vec<Tensor>) -> Tensor {
    Tensor::Sequence(Sequence {
        dtype,
        inner: vec![],
        items,
    })
}

/// Parses `kir` (which must print back as itself) and runs it on both CPU-side
/// backends; both must agree. Returns the outputs or the (same) error.
fn run(kir: &str, inputs: &[Tensor]) -> Result<Vec<Tensor>, String> {
    let g = text::parse(kir, "test.kir", None).map_err(|e| e.to_string())?;
    assert_eq!(text::print(&g), kir, "print -> parse -> print");
    let mut results = vec![];
    for device in [Device::Interp, Device::Cpu] {
        let exe = backend_for(device)
            .unwrap()
            .compile(&g)
            .map_err(|e| e.to_string())?;
        results.push(exe.run(inputs).map_err(|e| e.to_string()));
    }
    let cpu = results.pop().unwrap();
    let interp = results.pop().unwrap();
    assert_eq!(cpu, interp, "cpu and interp differ");
    interp
}

#[test]
fn sequence_ops_build_read_and_join() {
    let kir = r#"graph "s" {
  %0 "a" = Parameter : f32[2]
  %1 "b" = Parameter : f32[3]
  %2 "s" = SequenceConstruct(%0, %1) : seq<f32[?]>
  %3 "minus1" = Constant : i64[] = [-1]
  %4 "last" = SequenceAt(%2, %3) : f32[last.0.0]
  %5 "zero" = Constant : i64[] = [0]
  %6 "front" = SequenceInsert(%2, %1, %5) : seq<f32[?]>
  %7 "n" = SequenceLength(%6) : i64[]
  %8 "cat" = ConcatFromSequence(%6) {axis = 0} : f32[cat.0.0]
  %9 "erased" = SequenceErase(%6, %5) : seq<f32[?]>
  return "last" = %4, "n" = %7, "cat" = %8, "erased" = %9
}
"#;
    let a = f32s(&[2], &[1.0, 2.0]);
    let b = f32s(&[3], &[3.0, 4.0, 5.0]);
    let out = run(kir, &[a.clone(), b.clone()]).unwrap();
    assert_eq!(out[0], b);
    assert_eq!(out[1], Tensor::scalar(3i64));
    assert_eq!(
        out[2],
        f32s(&[8], &[3.0, 4.0, 5.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    );
    assert_eq!(out[3], seq(DType::F32, vec![a, b]));
}

#[test]
fn split_to_sequence_and_stacking() {
    let kir = r#"graph "s" {
  %0 "x" = Parameter : f32[5, 2]
  %1 "two" = Constant : i64[] = [2]
  %2 "parts" = SplitToSequence(%0, %1) {axis = 0} : seq<f32[?, 2]>
  %3 "rows" = SplitToSequence(%0) {axis = 0, keepdims = 0} : seq<f32[2]>
  %4 "stacked" = ConcatFromSequence(%3) {axis = 1, new_axis = 1} : f32[2, stacked.0.1]
  return "parts" = %2, "stacked" = %4
}
"#;
    let v: Vec<f32> = (0..10).map(|i| i as f32).collect();
    let out = run(kir, &[f32s(&[5, 2], &v)]).unwrap();
    let Tensor::Sequence(parts) = &out[0] else {
        panic!("not a sequence: {:?}", out[0])
    };
    let shapes: Vec<&[usize]> = parts.items.iter().map(|t| t.shape()).collect();
    assert_eq!(shapes, [&[2, 2][..], &[2, 2], &[1, 2]]);
    assert_eq!(parts.items[2], f32s(&[1, 2], &[8.0, 9.0]));
    // Rows stacked as columns: the transpose.
    let t: Vec<f32> = (0..2)
        .flat_map(|c| (0..5).map(move |r| (2 * r + c) as f32))
        .collect();
    assert_eq!(out[1], f32s(&[2, 5], &t));
}

#[test]
fn optionals_hold_a_value_or_nothing() {
    let kir = r#"graph "o" {
  %0 "x" = Parameter : opt<seq<f32[?]>>
  %1 "has" = OptionalHasElement(%0) : bool[]
  %2 "none" = Optional() {type = "i64[3]"} : opt<i64[3]>
  %3 "has_none" = OptionalHasElement(%2) : bool[]
  %4 "wrapped" = Optional(%1) : opt<bool[]>
  %5 "back" = OptionalGetElement(%4) : bool[]
  return "has" = %1, "has_none" = %3, "back" = %5, "x" = %0
}
"#;
    let full = Tensor::Optional(Optional {
        dtype: DType::F32,
        inner: vec![kiln::ir::Container::Seq],
        value: Some(Box::new(seq(DType::F32, vec![f32s(&[1], &[7.0])]))),
    });
    let out = run(kir, std::slice::from_ref(&full)).unwrap();
    assert_eq!(out[0], Tensor::scalar(true));
    assert_eq!(out[1], Tensor::scalar(false));
    assert_eq!(out[2], Tensor::scalar(true));
    assert_eq!(out[3], full);
    let empty = Tensor::empty_container(
        DType::F32,
        &[kiln::ir::Container::Opt, kiln::ir::Container::Seq],
    );
    let out = run(kir, &[empty.clone().unwrap()]).unwrap();
    assert_eq!(out[0], Tensor::scalar(false));
    // A value of the wrong kind is refused by the input check.
    let e = run(kir, &[f32s(&[1], &[1.0])]).unwrap_err();
    assert!(
        e.contains("input 'x'") && e.contains("opt<seq<f32[?]>>"),
        "{e}"
    );
}

#[test]
fn run_time_errors_name_the_node() {
    let kir = r#"graph "e" {
  %0 "s" = Parameter : seq<f32[2]>
  %1 "at" = Parameter : i64[]
  %2 "item" = SequenceAt(%0, %1) : f32[2]
  %3 "o" = Optional() {type = "f32[2]"} : opt<f32[2]>
  %4 "get" = OptionalGetElement(%3) : f32[2]
  return "item" = %2, "get" = %4
}
"#;
    let s = seq(DType::F32, vec![f32s(&[2], &[1.0, 2.0])]);
    let e = run(kir, &[s.clone(), Tensor::scalar(1i64)]).unwrap_err();
    assert!(
        e.contains("'item'") && e.contains("position 1 is out of range"),
        "{e}"
    );
    let e = run(kir, &[s.clone(), Tensor::scalar(-1i64)]).unwrap_err();
    assert!(
        e.contains("'get'") && e.contains("the optional is empty"),
        "{e}"
    );
    // An item whose fixed size breaks the declared element type is refused up front.
    let bad = seq(DType::F32, vec![f32s(&[3], &[1.0, 2.0, 3.0])]);
    let e = run(kir, &[bad, Tensor::scalar(0i64)]).unwrap_err();
    assert!(e.contains("sequence item 0"), "{e}");
}

#[test]
fn shape_ops_move_strings_and_numeric_ops_refuse_them() {
    let kir = r#"graph "t" {
  %0 "w" = Parameter : string[2, 2]
  %1 "t" = Transpose(%0) {perm = [1, 0]} : string[2, 2]
  %2 "idx" = Constant : i64[3] = [1, 0, 1]
  %3 "g" = Gather(%1, %2) {axis = 0} : string[3, 2]
  %4 "c" = Constant : bool[2] = [true, false]
  %5 "fill" = Constant : string[] = ["-"]
  %6 "where" = Where(%4, %0, %5) : string[2, 2]
  %7 "eq" = Equal(%0, %5) : bool[2, 2]
  %8 "num" = Constant : string[2] = ["1.5", "-inf"]
  %9 "f" = Cast(%8) {to = "f32"} : f32[2]
  %10 "s" = Cast(%9) {to = "string"} : string[2]
  return "g" = %3, "where" = %6, "eq" = %7, "s" = %10
}
"#;
    let w = strings(&[2, 2], &["a", "b", "-", "d"]);
    let out = run(kir, &[w]).unwrap();
    assert_eq!(out[0], strings(&[3, 2], &["b", "d", "a", "-", "b", "d"]));
    assert_eq!(out[1], strings(&[2, 2], &["a", "-", "-", "-"]));
    assert_eq!(
        out[2],
        Tensor::from_vec(&[2, 2], vec![false, false, true, false]).unwrap()
    );
    assert_eq!(out[3], strings(&[2], &["1.5", "-INF"]));

    let bad = r#"graph "b" {
  %0 "w" = Parameter : string[2]
  %1 "y" = Add(%0, %0) : string[2]
  return "y" = %1
}
"#;
    let e = text::parse(bad, "b.kir", None).unwrap_err().to_string();
    assert!(e.contains("input 0 (A) is a string tensor"), "{e}");
    let bad = r#"graph "b" {
  %0 "s" = Parameter : seq<f32[2]>
  %1 "y" = Relu(%0) : f32[2]
  return "y" = %1
}
"#;
    let e = text::parse(bad, "b.kir", None).unwrap_err().to_string();
    assert!(
        e.contains("is a seq<f32[2]>; Relu takes tensors only"),
        "{e}"
    );
    let e = text::parse(&bad.replace("seq<f32[2]>", "f32[?]"), "b.kir", None).unwrap_err();
    assert!(e.to_string().contains("a dim"), "{e}");
}
