//! String ops and LabelEncoder against hand-computed expectations (the ONNX node suite
//! and tests/onnx_ml.rs check them against onnxruntime too).
use kiln::ir::Attr;
use kiln::Tensor;

use crate::ops::harness::*;

fn strs(shape: &[usize], v: &[&str]) -> Tensor {
    Tensor::from_strings(shape, v.iter().map(|s| s.to_string()).collect()).unwrap()
}

fn words(v: &[&str]) -> Attr {
    Attr::Strings(v.iter().map(|s| s.to_string()).collect())
}

#[test]
fn string_normalizer_drops_stopwords_and_changes_case() {
    let x = strs(&[1, 4], &["Straße", "the", "THE", "Öl"]);
    let a = attrs(&[
        ("case_change_action", Attr::String("UPPER".into())),
        ("stopwords", words(&["the"])),
    ]);
    let y = run1("StringNormalizer", vec![Symbolic(x.clone())], a);
    assert_eq!(y, strs(&[1, 2], &["STRASSE", "ÖL"]));
    let sensitive = attrs(&[
        ("is_case_sensitive", Attr::Int(1)),
        ("stopwords", words(&["the", "Straße", "Öl"])),
    ]);
    let y = run1("StringNormalizer", vec![Input(x)], sensitive);
    assert_eq!(y, strs(&[1, 1], &["THE"]));
    let e = run_err(
        "StringNormalizer",
        vec![Input(strs(&[2, 1], &["a", "b"]))],
        attrs(&[]),
    );
    assert!(e.contains("X must be [C] or [1, C]"), "{e}");
}

#[test]
fn string_concat_broadcasts() {
    let x = strs(&[2, 1], &["a", "é"]);
    let y = strs(&[3], &["1", "", "😀"]);
    let z = run1("StringConcat", vec![Input(x), Input(y)], attrs(&[]));
    assert_eq!(z, strs(&[2, 3], &["a1", "a", "a😀", "é1", "é", "é😀"]));
    let e = run_err(
        "StringConcat",
        vec![Input(strs(&[1], &["a"])), Input(f32s(&[1], &[1.0]))],
        attrs(&[]),
    );
    assert!(e.contains("Y must be a string tensor"), "{e}");
}

#[test]
fn string_split_pads_and_counts() {
    let x = strs(&[3], &["a,b,,c", "", "x"]);
    let out = run(
        "StringSplit",
        vec![Symbolic(x.clone())],
        attrs(&[("delimiter", Attr::String(",".into()))]),
    )
    .unwrap();
    assert_eq!(
        out[0],
        strs(
            &[3, 4],
            &["a", "b", "", "c", "", "", "", "", "x", "", "", ""]
        )
    );
    assert_eq!(out[1], i64s(&[3], &[4, 1, 1]));
    let out = run(
        "StringSplit",
        vec![Input(strs(&[2], &["  one  two three ", " "]))],
        attrs(&[("maxsplit", Attr::Int(1))]),
    )
    .unwrap();
    assert_eq!(out[0], strs(&[2, 2], &["one", "two three", "", ""]));
    assert_eq!(out[1], i64s(&[2], &[2, 0]));
}

#[test]
fn regex_full_match_anchors_the_pattern() {
    let x = strs(&[4], &["abc", "abcd", "xabc", ""]);
    let a = attrs(&[("pattern", Attr::String("a.c|".into()))]);
    let y = run1("RegexFullMatch", vec![Symbolic(x.clone())], a);
    assert_eq!(y, bools(&[4], &[true, false, false, true]));
    let bad = attrs(&[("pattern", Attr::String("a(b".into()))]);
    let e = run_err("RegexFullMatch", vec![Input(x)], bad);
    assert!(e.contains("'a(b' is not a valid regular expression"), "{e}");
}

#[test]
fn label_encoder_maps_each_key_kind() {
    let to_ints = attrs(&[
        ("keys_strings", words(&["a", "b"])),
        ("values_int64s", Attr::Ints(vec![7, 8])),
    ]);
    let y = run1(
        "LabelEncoder",
        vec![Input(strs(&[3], &["b", "z", "a"]))],
        to_ints,
    );
    assert_eq!(y, i64s(&[3], &[8, -1, 7]));
    let to_strings = attrs(&[
        ("keys_int64s", Attr::Ints(vec![1, 2])),
        ("values_strings", words(&["one", "two"])),
        ("default_string", Attr::String("many".into())),
    ]);
    let y = run1(
        "LabelEncoder",
        vec![Input(i32s(&[2, 2], &[2, 1, 5, 2]))],
        to_strings,
    );
    assert_eq!(y, strs(&[2, 2], &["two", "one", "many", "two"]));
    let to_floats = attrs(&[
        ("keys_floats", Attr::Floats(vec![0.5, f64::NAN])),
        ("values_floats", Attr::Floats(vec![1.5, 2.5])),
    ]);
    let y = run1(
        "LabelEncoder",
        vec![Input(f32s(&[3], &[0.5, f32::NAN, 1.0]))],
        to_floats,
    );
    // NaN matches no key, as in onnxruntime; the default float is -0.0.
    assert_eq!(y, f32s(&[3], &[1.5, -0.0, -0.0]));
    let e = run_err(
        "LabelEncoder",
        vec![Input(f32s(&[1], &[1.0]))],
        attrs(&[
            ("keys_strings", words(&["a"])),
            ("values_int64s", Attr::Ints(vec![1])),
        ]),
    );
    assert!(e.contains("keys_strings needs a string X"), "{e}");
}
