//! RNN, GRU and LSTM against the ONNX reference (`onnx.reference`, onnx 1.23.2).
//! The reference ignores `sequence_lens`, so the LSTM case's expectations stitch
//! together reference runs on each batch row's valid prefix.
use kiln::ir::Attr;
use kiln::Tensor;

use crate::ops::harness::*;

/// `((arange(n) % k) - off) * 0.25` in `shape`.
fn r(shape: &[usize], k: usize, off: f64) -> Tensor {
    let n: usize = shape.iter().product();
    f64s(
        shape,
        &(0..n)
            .map(|i| ((i % k) as f64 - off) * 0.25)
            .collect::<Vec<_>>(),
    )
}

#[test]
fn lstm_bidirectional_with_peepholes_and_sequence_lengths() {
    let (h, b, s) = (2, 2, 3);
    let out = run(
        "LSTM",
        vec![
            Symbolic(r(&[s, b, 2], 7, 3.0)),
            Input(r(&[2, 4 * h, 2], 5, 2.0)),
            Input(r(&[2, 4 * h, h], 3, 1.0)),
            Input(r(&[2, 8 * h], 4, 1.5)),
            Input(Tensor::from_vec(&[2], vec![3i32, 2]).unwrap()),
            Input(r(&[2, b, h], 5, 2.5)),
            Input(r(&[2, b, h], 3, 0.5)),
            Input(r(&[2, 3 * h], 3, 1.0)),
        ],
        attrs(&[("direction", Attr::String("bidirectional".into()))]),
    )
    .unwrap();
    let y = [
        0.0537662397698829,
        0.1929793881432544,
        0.1099284986737086,
        0.10746569002950257,
        0.005829698608282115,
        0.2956125399527371,
        0.03611134050337083,
        0.2704504759296035,
        0.07171703765080922,
        0.21756401646596402,
        0.04887289366750306,
        0.24015408486841944,
        0.08591445983829338,
        0.29124994051068437,
        -0.028087736769078334,
        0.17124662115343564,
        0.053881533087432106,
        0.26592134261811656,
        0.0,
        0.0,
        -0.009165151381331862,
        0.26567281324503816,
        0.0,
        0.0,
    ];
    assert_close(&out[0], &f64s(&[s, 2, b, h], &y), 1e-12, 1e-12);
    let y_h = [
        0.053881533087432106,
        0.26592134261811656,
        0.04887289366750306,
        0.24015408486841944,
        0.005829698608282115,
        0.2956125399527371,
        0.03611134050337083,
        0.2704504759296035,
    ];
    assert_close(&out[1], &f64s(&[2, b, h], &y_h), 1e-12, 1e-12);
    let y_c = [
        0.09813701942114483,
        0.41304621151070314,
        0.06618486660349651,
        0.4193072360835941,
        0.00872241225202091,
        0.5002716279653574,
        0.06187683826658921,
        0.43177037011090214,
    ];
    assert_close(&out[2], &f64s(&[2, b, h], &y_c), 1e-12, 1e-12);
}

#[test]
fn gru_batch_first_linear_before_reset() {
    let out = run(
        "GRU",
        vec![
            Input(r(&[2, 3, 2], 7, 3.0)),
            Input(r(&[1, 6, 2], 5, 2.0)),
            Input(r(&[1, 6, 2], 3, 1.0)),
            Input(r(&[1, 12], 4, 1.5)),
        ],
        attrs(&[
            ("layout", Attr::Int(1)),
            ("linear_before_reset", Attr::Int(1)),
        ]),
    )
    .unwrap();
    let y = [
        -0.28108646281098193,
        0.252720931162683,
        -0.34963506058070704,
        0.2536897731810171,
        -0.18335452377080846,
        0.08539670547153555,
        -0.27344469733010535,
        -0.05743874643796059,
        -0.395411244974085,
        0.1495269245063297,
        -0.3145871503668415,
        0.10607264379786671,
    ];
    assert_close(&out[0], &f64s(&[2, 3, 1, 2], &y), 1e-12, 1e-12);
    let y_h = [
        -0.18335452377080846,
        0.08539670547153555,
        -0.3145871503668415,
        0.10607264379786671,
    ];
    assert_close(&out[1], &f64s(&[2, 1, 2], &y_h), 1e-12, 1e-12);
}

#[test]
fn rnn_reverse_with_an_affine_activation() {
    let out = run(
        "RNN",
        vec![
            Input(r(&[3, 2, 2], 7, 3.0)),
            Input(r(&[1, 2, 2], 5, 2.0)),
            Input(r(&[1, 2, 2], 3, 1.0)),
        ],
        attrs(&[
            ("direction", Attr::String("reverse".into())),
            ("activations", Attr::Strings(vec!["Affine".into()])),
            ("activation_alpha", Attr::Floats(vec![0.5])),
            ("activation_beta", Attr::Floats(vec![0.1f32 as f64])),
        ]),
    )
    .unwrap();
    let y = [
        0.35712890757713467,
        0.007128907716833055,
        0.16279297007713467,
        0.09990234521683306,
        -0.057031248696148396,
        0.18593750149011612,
        -0.0023437486961483955,
        -0.0015624985098838806,
        0.2562500014901161,
        0.06875000149011612,
        0.06875000149011612,
        0.13125000149011612,
    ];
    assert_close(&out[0], &f64s(&[3, 1, 2, 2], &y), 1e-12, 1e-12);
    assert_close(&out[1], &f64s(&[1, 2, 2], &y[..4]), 1e-12, 1e-12);
}

#[test]
fn recurrent_errors() {
    let e = run_err(
        "LSTM",
        vec![
            Input(r(&[3, 2, 2], 7, 3.0)),
            Input(r(&[1, 6, 2], 5, 2.0)),
            Input(r(&[1, 6, 2], 3, 1.0)),
        ],
        kiln::ir::Attrs::new(),
    );
    assert!(
        e.contains("W has 6 rows, expected 4 gates x hidden size 2"),
        "{e}"
    );
    let e = run_err(
        "RNN",
        vec![
            Input(r(&[3, 2, 2], 7, 3.0)),
            Input(r(&[1, 2, 2], 5, 2.0)),
            Input(r(&[1, 2, 2], 3, 1.0)),
        ],
        attrs(&[("activations", Attr::Strings(vec!["Frob".into()]))]),
    );
    assert!(e.contains("unknown activation 'Frob'"), "{e}");
    let e = run_err(
        "GRU",
        vec![
            Input(r(&[3, 2, 2], 7, 3.0)),
            Input(r(&[1, 6, 2], 5, 2.0)),
            Input(r(&[1, 6, 2], 3, 1.0)),
            Absent,
            Input(Tensor::from_vec(&[2], vec![4i32, 1]).unwrap()),
        ],
        kiln::ir::Attrs::new(),
    );
    assert!(e.contains("sequence_lens [4, 1]"), "{e}");
}

/// DynamicQuantizeLSTM (onnxruntime's numerics are checked in `tests/onnx_contrib.rs`)
/// against the float LSTM with its dequantized weights: it differs only by the u8
/// quantization of X and the hidden state, a few hundredths here. The sequence length
/// is symbolic.
#[test]
fn dynamic_quantize_lstm_tracks_the_float_lstm() {
    let (seq, batch, input, hidden) = (4, 2, 3, 2);
    let g4 = 4 * hidden;
    let ramp = |n: usize, k: i64, off: i64| -> Vec<i8> {
        (0..n as i64).map(|i| ((i * 7 % k) - off) as i8).collect()
    };
    let (w, r_) = (ramp(input * g4, 23, 11), ramp(hidden * g4, 19, 9));
    let (w_scale, r_scale) = (0.05f32, 0.08f32);
    // The float LSTM's W is [dirs, 4*hidden, input]: the transpose, dequantized.
    let transpose = |q: &[i8], rows: usize, scale: f32| -> Tensor {
        let v: Vec<f32> = (0..g4 * rows)
            .map(|i| q[(i % rows) * g4 + i / rows] as f32 * scale)
            .collect();
        Tensor::from_vec(&[1, g4, rows], v).unwrap()
    };
    let x = r(&[seq, batch, input], 7, 3.0);
    let x = Tensor::from_f64s(kiln::DType::F32, x.shape(), &x.to_f64_vec()).unwrap();
    let f32s = |t: Tensor| Tensor::from_f64s(kiln::DType::F32, t.shape(), &t.to_f64_vec()).unwrap();
    let bias = f32s(r(&[1, 2 * g4], 5, 2.0));
    let float = run(
        "LSTM",
        vec![
            Input(x.clone()),
            Input(transpose(&w, input, w_scale)),
            Input(transpose(&r_, hidden, r_scale)),
            Input(bias.clone()),
        ],
        kiln::ir::Attrs::new(),
    )
    .unwrap();
    let quantized = run(
        "DynamicQuantizeLSTM",
        vec![
            Symbolic(x),
            Input(Tensor::from_vec(&[1, input, g4], w).unwrap()),
            Input(Tensor::from_vec(&[1, hidden, g4], r_).unwrap()),
            Input(bias),
            Absent,
            Absent,
            Absent,
            Absent,
            Input(Tensor::from_vec(&[1], vec![w_scale]).unwrap()),
            Input(Tensor::from_vec(&[1], vec![0i8]).unwrap()),
            Input(Tensor::from_vec(&[1], vec![r_scale]).unwrap()),
            Input(Tensor::from_vec(&[1], vec![0i8]).unwrap()),
        ],
        attrs(&[("hidden_size", Attr::Int(hidden as i64))]),
    )
    .unwrap();
    assert_eq!(quantized.len(), 3);
    for (q, f) in quantized.iter().zip(&float) {
        assert_eq!(q.shape(), f.shape());
        assert_close(q, f, 0.03, 0.0);
        // ... and not equal: the activations really were quantized.
        assert!(q.check_close(f, 1e-6, 0.0).is_err());
    }
    let e = run_err(
        "DynamicQuantizeLSTM",
        vec![
            Input(Tensor::from_vec(&[1, 1, 1], vec![0.5f32]).unwrap()),
            Input(Tensor::from_vec(&[1, 1, 4], vec![1.0f32; 4]).unwrap()),
            Input(Tensor::from_vec(&[1, 1, 4], vec![1i8; 4]).unwrap()),
            Absent,
            Absent,
            Absent,
            Absent,
            Absent,
            Input(Tensor::from_vec(&[1], vec![0.1f32]).unwrap()),
            Input(Tensor::from_vec(&[1], vec![0i8]).unwrap()),
            Input(Tensor::from_vec(&[1], vec![0.1f32]).unwrap()),
            Input(Tensor::from_vec(&[1], vec![0i8]).unwrap()),
        ],
        kiln::ir::Attrs::new(),
    );
    assert!(e.contains("W must be 3-D int8 or uint8"), "{e}");
}
