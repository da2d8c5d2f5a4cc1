//! TfIdfVectorizer against the ONNX reference (onnx 1.23.2).
use kiln::ir::{Attr, Attrs};
use kiln::Tensor;

use crate::ops::harness::*;

fn tfidf(extra: &[(&str, Attr)]) -> Attrs {
    let mut a = attrs(&[
        ("mode", Attr::String("TFIDF".into())),
        ("min_gram_length", Attr::Int(1)),
        ("max_gram_length", Attr::Int(2)),
        ("max_skip_count", Attr::Int(2)),
        ("ngram_counts", Attr::Ints(vec![0, 3])),
        ("ngram_indexes", Attr::Ints(vec![0, 1, 2, 3, 4])),
        ("pool_int64s", Attr::Ints(vec![2, 3, 5, 5, 6, 2, 3])),
        ("weights", Attr::Floats(vec![1.0, 0.5, 2.0, 3.0, 0.25])),
    ]);
    for (k, v) in extra {
        a.set(k, v.clone());
    }
    a
}

#[test]
fn tf_idf_counts_skip_grams() {
    let x = Tensor::from_vec(&[2, 6], vec![2i32, 3, 5, 5, 6, 2, 3, 2, 3, 6, 5, 5]).unwrap();
    let y = run1("TfIdfVectorizer", vec![Symbolic(x)], tfidf(&[]));
    let want = [2.0, 0.5, 4.0, 6.0, 0.25, 1.0, 1.0, 4.0, 0.0, 0.25];
    assert_eq!(y, f32s(&[2, 5], &want));
    let e = run_err(
        "TfIdfVectorizer",
        vec![Input(i64s(&[3], &[1, 2, 3]))],
        tfidf(&[("mode", Attr::String("BM25".into()))]),
    );
    assert!(e.contains("mode must be TF, IDF or TFIDF"), "{e}");
    let e = run_err(
        "TfIdfVectorizer",
        vec![Input(i64s(&[3], &[1, 2, 3]))],
        tfidf(&[("pool_strings", Attr::Strings(vec!["a".into()]))]),
    );
    assert!(
        e.contains("exactly one of pool_int64s and pool_strings"),
        "{e}"
    );
}

#[test]
fn tf_idf_counts_string_tokens() {
    // The same pool and rows as above, with each number spelled as a word; a token
    // outside the pool ("seven") matches nothing.
    let word =
        |n: i64| ["", "", "two", "three", "", "five", "six", "seven"][n as usize].to_string();
    let mut a = tfidf(&[]);
    a.0.remove("pool_int64s");
    a.set(
        "pool_strings",
        Attr::Strings([2, 3, 5, 5, 6, 2, 3].map(word).to_vec()),
    );
    let rows = [2, 3, 5, 5, 6, 2, 3, 2, 3, 6, 5, 7];
    let x = Tensor::from_strings(&[2, 6], rows.map(word).to_vec()).unwrap();
    let y = run1("TfIdfVectorizer", vec![Symbolic(x)], a.clone());
    let want = [2.0, 0.5, 4.0, 6.0, 0.25, 1.0, 1.0, 2.0, 0.0, 0.25];
    assert_eq!(y, f32s(&[2, 5], &want));
    let e = run_err("TfIdfVectorizer", vec![Input(i64s(&[3], &[1, 2, 3]))], a);
    assert!(
        e.contains("X must be string tokens for pool_strings"),
        "{e}"
    );
}
