//! TfIdfVectorizer against the ONNX reference (onnx 1.23.2).
use kiln::ir::{Attr, Attrs};
use kiln::Tensor;

use crate::harness::*;

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
    assert!(e.contains("pool_strings needs string tensors"), "{e}");
}
