//! Attention against the ONNX reference (`onnx.reference.ops.op_attention`, onnx
//! 1.23.2) on `ramp` data.
use kiln::ir::{Attr, Attrs};

use crate::ops::harness::*;

const INF: f64 = f64::INFINITY;

#[test]
fn attention_with_grouped_heads_past_cache_padded_mask_and_softcap() {
    // Two query heads share one key/value head; one past step; the [2, 2] float mask
    // is padded to the 3 keys as masked; scores soft-capped at 2; output mode 3.
    let a = attrs(&[
        ("softcap", Attr::Float(2.0)),
        ("qk_matmul_output_mode", Attr::Int(3)),
    ]);
    let out = run(
        "Attention",
        vec![
            Input(ramp(&[1, 2, 2, 3], 7, 3.0)),
            Input(ramp(&[1, 1, 2, 3], 5, 2.0)),
            Symbolic(ramp(&[1, 1, 2, 2], 3, 1.0)),
            Input(f64s(&[2, 2], &[0.0, -1.0, 0.5, 0.0])),
            Input(ramp(&[1, 1, 1, 3], 4, 1.0)),
            Input(ramp(&[1, 1, 1, 2], 4, 2.0)),
        ],
        a,
    )
    .unwrap();
    let y = [
        -0.7804989843849139,
        -0.28049898438491394,
        -0.8586161956263131,
        -0.35861619562631303,
        -0.8378912890423424,
        -0.33789128904234245,
        -0.8112296656009274,
        -0.3112296656009273,
    ];
    assert_close(&out[0], &f64s(&[1, 2, 2, 2], &y), 1e-12, 1e-12);
    assert_eq!(out[1].shape(), &[1, 1, 3, 3]);
    assert_eq!(out[2].shape(), &[1, 1, 3, 2]);
    let probs = [
        0.5609979687698279,
        0.4390020312301722,
        0.0,
        0.7172323912526261,
        0.282767608747374,
        0.0,
        0.6757825780846849,
        0.32421742191531516,
        0.0,
        0.6224593312018546,
        0.37754066879814546,
        0.0,
    ];
    assert_close(&out[3], &f64s(&[1, 2, 2, 3], &probs), 1e-12, 1e-12);
}

#[test]
fn attention_3d_causal_with_bool_mask_and_key_padding() {
    // Batch 1 has 2 real keys of 3, so its causal frontier moves back by one and its
    // first query row is wholly masked: zeros. Output mode 2 (scores plus bias).
    let a = attrs(&[
        ("is_causal", Attr::Int(1)),
        ("q_num_heads", Attr::Int(2)),
        ("kv_num_heads", Attr::Int(1)),
        ("qk_matmul_output_mode", Attr::Int(2)),
    ]);
    let mask = bools(
        &[3, 3],
        &[true, true, false, true, true, false, false, false, false],
    );
    let out = run(
        "Attention",
        vec![
            Input(ramp(&[2, 3, 4], 7, 3.0)),
            Input(ramp(&[2, 3, 2], 5, 2.0)),
            Input(ramp(&[2, 3, 2], 3, 1.0)),
            Input(mask),
            Absent,
            Absent,
            Input(i64s(&[2], &[3, 2])),
        ],
        a,
    )
    .unwrap();
    let y = [
        -0.5,
        0.0,
        -0.5,
        0.0,
        0.24281668477319296,
        -0.3714083423865965,
        0.0,
        -0.25,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
        -0.5,
        0.0,
        -0.5,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
    ];
    assert_close(&out[0], &f64s(&[2, 3, 4], &y), 1e-12, 1e-12);
    let qk = [
        std::f64::consts::SQRT_2,
        -INF,
        -INF,
        -0.7071067811865475,
        0.35355339059327373,
        -INF,
        -INF,
        -INF,
        -INF,
        0.35355339059327373,
        -INF,
        -INF,
        -0.5303300858899106,
        -0.5303300858899106,
        -INF,
        -INF,
        -INF,
        -INF,
        -INF,
        -INF,
        -INF,
        0.17677669529663687,
        -INF,
        -INF,
        -INF,
        -INF,
        -INF,
        -INF,
        -INF,
        -INF,
        -0.17677669529663687,
        -INF,
        -INF,
        -INF,
        -INF,
        -INF,
    ];
    assert_close(&out[3], &f64s(&[2, 2, 3, 3], &qk), 1e-12, 1e-12);
}

#[test]
fn attention_errors() {
    let q = || Input(ramp(&[1, 2, 2, 3], 7, 3.0));
    let e = run_err(
        "Attention",
        vec![
            q(),
            Input(ramp(&[1, 2, 2, 3], 5, 2.0)),
            Input(i64s(&[1], &[1])),
        ],
        Attrs::new(),
    );
    assert!(e.contains("dtype mismatch"), "{e}");
    let e = run_err(
        "Attention",
        vec![
            Input(ramp(&[1, 2, 6], 7, 3.0)),
            Input(ramp(&[1, 2, 6], 5, 2.0)),
            Input(ramp(&[1, 2, 6], 5, 2.0)),
        ],
        Attrs::new(),
    );
    assert!(e.contains("need q_num_heads and kv_num_heads"), "{e}");
    let e = run_err(
        "Attention",
        vec![
            Input(ramp(&[1, 3, 2, 3], 7, 3.0)),
            Input(ramp(&[1, 2, 2, 3], 5, 2.0)),
            Input(ramp(&[1, 2, 2, 3], 5, 2.0)),
        ],
        Attrs::new(),
    );
    assert!(
        e.contains("3 query heads are not a multiple of 2 key/value heads"),
        "{e}"
    );
    let e = run_err(
        "Attention",
        vec![
            q(),
            Input(ramp(&[1, 2, 2, 3], 5, 2.0)),
            Input(ramp(&[1, 2, 2, 3], 5, 2.0)),
            Input(f64s(&[2, 5], &[0.0; 10])),
        ],
        Attrs::new(),
    );
    assert!(e.contains("does not broadcast"), "{e}");
}

#[test]
fn rotary_embedding_by_positions_and_by_cache_rows() {
    let (c, s) = (0.8775825618903728, 0.479425538604203);
    // 3-D X (2 heads of 4), interleaved, only the first 2 features rotated, caches
    // picked by position_ids.
    let y = run1(
        "RotaryEmbedding",
        vec![
            Input(ramp(&[1, 2, 8], 7, 3.0)),
            Input(f64s(&[3, 1], &[c, 1.0, c])),
            Input(f64s(&[3, 1], &[-s, 0.0, s])),
            Input(i64s(&[1, 2], &[2, 0])),
        ],
        attrs(&[
            ("interleaved", Attr::Int(1)),
            ("rotary_embedding_dim", Attr::Int(2)),
            ("num_heads", Attr::Int(2)),
        ]),
    );
    let want = [
        -0.8369483042313561,
        -1.5967208697966773,
        -0.5,
        0.0,
        -0.040634257659016626,
        1.1172953311924743,
        1.5,
        -1.5,
        -1.1172953311924743,
        0.040634257659016626,
        0.0,
        0.5,
        1.5967208697966773,
        0.8369483042313561,
        -1.5,
        -1.0,
    ];
    assert_close(&y, &f64s(&[1, 2, 8], &want), 1e-12, 1e-12);
    // 4-D X, halves rotated, caches [B, S, D/2].
    let y = run1(
        "RotaryEmbedding",
        vec![
            Symbolic(ramp(&[1, 1, 2, 4], 5, 2.0)),
            Input(f64s(&[1, 2, 2], &[c, 1.0, c, c])),
            Input(f64s(&[1, 2, 2], &[-s, 0.0, s, -s])),
        ],
        Attrs::new(),
    );
    let want = [
        -0.8775825618903728,
        -0.5,
        0.479425538604203,
        0.5,
        1.1172953311924743,
        -0.8775825618903728,
        0.040634257659016626,
        0.479425538604203,
    ];
    assert_close(&y, &f64s(&[1, 1, 2, 4], &want), 1e-12, 1e-12);
    let e = run_err(
        "RotaryEmbedding",
        vec![
            Input(ramp(&[1, 1, 2, 4], 5, 2.0)),
            Input(f64s(&[1, 2, 1], &[c, 1.0])),
            Input(f64s(&[1, 2, 1], &[-s, 0.0])),
        ],
        Attrs::new(),
    );
    assert!(e.contains("not rotary_embedding_dim / 2 = 2"), "{e}");
}
