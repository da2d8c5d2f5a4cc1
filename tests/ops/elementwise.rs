//! Elementwise ops.
// The expected-value table is Python's output verbatim, constants included.
#![allow(clippy::approx_constant)]
use kiln::ir::{Attr, Attrs, DType, Dim};
use kiln::Tensor;

use crate::ops::harness::*;

const UNARY_XS: [f64; 5] = [-2.0, -0.5, 0.0, 0.75, 3.0];

/// (op, f(x) for x in UNARY_XS), computed with Python's math module.
pub const UNARY_TABLE: &[(&str, [f64; 5])] = &[
    (
        "Exp",
        [
            0.1353352832366127,
            0.6065306597126334,
            1.0,
            2.117000016612675,
            20.085536923187668,
        ],
    ),
    (
        "Log",
        [
            f64::NAN,
            f64::NAN,
            f64::NEG_INFINITY,
            -0.2876820724517809,
            1.0986122886681098,
        ],
    ),
    (
        "Sqrt",
        [
            f64::NAN,
            f64::NAN,
            0.0,
            0.8660254037844386,
            1.7320508075688772,
        ],
    ),
    (
        "Reciprocal",
        [
            -0.5,
            -2.0,
            f64::INFINITY,
            1.3333333333333333,
            0.3333333333333333,
        ],
    ),
    (
        "Tanh",
        [
            -0.9640275800758169,
            -0.46211715726000974,
            0.0,
            0.6351489523872873,
            0.9950547536867305,
        ],
    ),
    (
        "Sigmoid",
        [
            0.11920292202211755,
            0.3775406687981454,
            0.5,
            0.679178699175393,
            0.9525741268224334,
        ],
    ),
    (
        "Erf",
        [
            -0.9953222650189527,
            -0.5204998778130465,
            0.0,
            0.7111556336535151,
            0.9999779095030014,
        ],
    ),
    (
        "Sin",
        [
            -0.9092974268256817,
            -0.479425538604203,
            0.0,
            0.6816387600233341,
            0.1411200080598672,
        ],
    ),
    (
        "Cos",
        [
            -0.4161468365471424,
            0.8775825618903728,
            1.0,
            0.7316888688738209,
            -0.9899924966004454,
        ],
    ),
    (
        "Tan",
        [
            2.185039863261519,
            -0.5463024898437905,
            0.0,
            0.9315964599440725,
            -0.1425465430742778,
        ],
    ),
    (
        "Asin",
        [
            f64::NAN,
            -0.5235987755982989,
            0.0,
            0.848062078981481,
            f64::NAN,
        ],
    ),
    (
        "Acos",
        [
            f64::NAN,
            2.0943951023931957,
            1.5707963267948966,
            0.7227342478134157,
            f64::NAN,
        ],
    ),
    (
        "Atan",
        [
            -1.1071487177940904,
            -0.4636476090008061,
            0.0,
            0.6435011087932844,
            1.2490457723982544,
        ],
    ),
    (
        "Sinh",
        [
            -3.626860407847019,
            -0.5210953054937474,
            0.0,
            0.82231673193583,
            10.017874927409903,
        ],
    ),
    (
        "Cosh",
        [
            3.7621956910836314,
            1.1276259652063807,
            1.0,
            1.2946832846768448,
            10.067661995777765,
        ],
    ),
    (
        "Asinh",
        [
            -1.4436354751788103,
            -0.48121182505960347,
            0.0,
            0.6931471805599453,
            1.8184464592320668,
        ],
    ),
    (
        "Acosh",
        [f64::NAN, f64::NAN, f64::NAN, f64::NAN, 1.762747174039086],
    ),
    (
        "Atanh",
        [
            f64::NAN,
            -0.5493061443340548,
            0.0,
            0.9729550745276566,
            f64::NAN,
        ],
    ),
    ("Floor", [-2.0, -1.0, 0.0, 0.0, 3.0]),
    ("Ceil", [-2.0, 0.0, 0.0, 1.0, 3.0]),
    ("Round", [-2.0, 0.0, 0.0, 1.0, 3.0]),
    (
        "Softplus",
        [
            0.1269280110429725,
            0.4740769841801067,
            0.6931471805599453,
            1.1368710061148999,
            3.048587351573742,
        ],
    ),
    (
        "Softsign",
        [
            -0.6666666666666666,
            -0.3333333333333333,
            0.0,
            0.42857142857142855,
            0.75,
        ],
    ),
    (
        "Mish",
        [
            -0.2525014826957089,
            -0.22074377465173,
            0.0,
            0.6100183352182934,
            2.9865350049679575,
        ],
    ),
    (
        "HardSwish",
        [
            -0.33333333333333337,
            -0.20833333333333334,
            0.0,
            0.46875,
            3.0,
        ],
    ),
    // Kiln's own x·sigmoid(x), which the recognize pass makes of the exporters' chain.
    (
        "Silu",
        [
            -0.2384058440442351,
            -0.1887703343990727,
            0.0,
            0.5093840243815447,
            2.8577223804672998,
        ],
    ),
    ("LeakyRelu", [-0.02, -0.005, 0.0, 0.75, 3.0]),
    (
        "Elu",
        [-0.8646647167633873, -0.3934693402873666, 0.0, 0.75, 3.0],
    ),
    (
        "Celu",
        [-0.8646647167633873, -0.3934693402873666, 0.0, 0.75, 3.0],
    ),
    ("ThresholdedRelu", [0.0, 0.0, 0.0, 0.0, 3.0]),
    (
        "Selu",
        [
            -1.520166468595695,
            -0.6917581878028713,
            0.0,
            0.7880257405166103,
            3.1521029620664414,
        ],
    ),
    ("HardSigmoid", [0.09999999999999998, 0.4, 0.5, 0.65, 1.0]),
    (
        "Gelu",
        [
            -0.04550026389635842,
            -0.15426876936299344,
            0.0,
            0.5800294857173488,
            2.99595030590511,
        ],
    ),
    ("Relu", [0.0, 0.0, 0.0, 0.75, 3.0]),
    ("Neg", [2.0, 0.5, -0.0, -0.75, -3.0]),
    ("Abs", [2.0, 0.5, 0.0, 0.75, 3.0]),
    ("Sign", [-1.0, -1.0, 0.0, 1.0, 1.0]),
];

#[test]
fn unary_float_ops_match_python_math() {
    for (op, want) in UNARY_TABLE {
        let got = run1(op, vec![Input(f64s(&[5], &UNARY_XS))], Attrs::new());
        assert_close(&got, &f64s(&[5], want), 1e-12, 1e-6);
        // f32 computes in f64 and rounds once.
        let x32 = Tensor::F64(ndarray::arr1(&UNARY_XS).into_dyn()).cast(DType::F32);
        let got32 = run1(op, vec![Input(x32)], Attrs::new());
        assert_close(&got32, &f64s(&[5], want).cast(DType::F32), 1e-6, 1e-6);
    }
}

#[test]
fn unary_attributes_change_results() {
    let x = f32s(&[3], &[-2.0, 0.5, 4.0]);
    let a = attrs(&[("alpha", Attr::Float(0.5))]);
    assert_eq!(
        run1("LeakyRelu", vec![Input(x.clone())], a.clone()),
        f32s(&[3], &[-1.0, 0.5, 4.0])
    );
    assert_close(
        &run1("Elu", vec![Input(x.clone())], a.clone()),
        &f32s(&[3], &[0.5 * (-2f32).exp_m1(), 0.5, 4.0]),
        1e-7,
        0.0,
    );
    assert_eq!(
        run1("ThresholdedRelu", vec![Input(x.clone())], a.clone()),
        f32s(&[3], &[0.0, 0.0, 4.0])
    );
    let hs = attrs(&[("alpha", Attr::Float(0.25)), ("beta", Attr::Float(0.25))]);
    assert_eq!(
        run1("HardSigmoid", vec![Input(x.clone())], hs),
        f32s(&[3], &[0.0, 0.375, 1.0])
    );
    let tanh = attrs(&[("approximate", Attr::String("tanh".into()))]);
    // 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715x³))) at x = 0.5 is 0.34571400982514394.
    let g = run1("Gelu", vec![Input(f64s(&[1], &[0.5]))], tanh);
    assert_close(&g, &f64s(&[1], &[0.345_714_009_825_143_94]), 1e-12, 0.0);
    let bad = attrs(&[("approximate", Attr::String("cubic".into()))]);
    assert!(run_err("Gelu", vec![Input(x.clone())], bad).contains("approximate"));
    let selu = attrs(&[("alpha", Attr::Float(2.0)), ("gamma", Attr::Float(3.0))]);
    assert_close(
        &run1("Selu", vec![Input(x)], selu),
        &f32s(&[3], &[6.0 * (-2f32).exp_m1(), 1.5, 12.0]),
        1e-6,
        0.0,
    );
}

#[test]
fn integer_and_bool_unary_forms() {
    let x = i64s(&[4], &[-3, 0, 5, i64::MIN]);
    assert_eq!(
        run1("Neg", vec![Input(x.clone())], Attrs::new()),
        i64s(&[4], &[3, 0, -5, i64::MIN])
    );
    assert_eq!(
        run1("Abs", vec![Input(x.clone())], Attrs::new()),
        i64s(&[4], &[3, 0, 5, i64::MIN])
    );
    assert_eq!(
        run1("Sign", vec![Input(x.clone())], Attrs::new()),
        i64s(&[4], &[-1, 0, 1, -1])
    );
    assert_eq!(
        run1("Relu", vec![Input(x)], Attrs::new()),
        i64s(&[4], &[0, 0, 5, 0])
    );
    let b = bools(&[3], &[true, false, true]);
    assert_eq!(
        run1("Not", vec![Input(b)], Attrs::new()),
        bools(&[3], &[false, true, false])
    );
    let f = f32s(&[4], &[f32::NAN, f32::INFINITY, -f32::INFINITY, 1.0]);
    assert_eq!(
        run1("IsNaN", vec![Input(f.clone())], Attrs::new()),
        bools(&[4], &[true, false, false, false])
    );
    assert_eq!(
        run1("IsInf", vec![Input(f.clone())], Attrs::new()),
        bools(&[4], &[false, true, true, false])
    );
    assert_eq!(
        run1(
            "IsInf",
            vec![Input(f)],
            attrs(&[("detect_positive", Attr::Int(0))])
        ),
        bools(&[4], &[false, false, true, false])
    );
    // Round is half to even, as ONNX says.
    let r = run1(
        "Round",
        vec![Input(f32s(&[4], &[0.5, 1.5, 2.5, -2.5]))],
        Attrs::new(),
    );
    assert_eq!(r, f32s(&[4], &[0.0, 2.0, 2.0, -2.0]));
}

#[test]
fn unary_rejects_wrong_dtypes() {
    assert!(run_err("Exp", vec![Input(i64s(&[1], &[1]))], Attrs::new()).contains("float"));
    assert!(run_err("Not", vec![Input(f32s(&[1], &[1.0]))], Attrs::new()).contains("bool"));
    assert!(run_err(
        "Neg",
        vec![Input(Tensor::from_vec(&[1], vec![1u8]).unwrap())],
        Attrs::new()
    )
    .contains("signed"));
    let e = run_err(
        "Relu",
        vec![Input(f32s(&[1], &[1.0]))],
        attrs(&[("alpha", Attr::Float(1.0))]),
    );
    assert!(
        e.contains("unknown attribute 'alpha'") && e.contains("'op' (Relu)"),
        "{e}"
    );
}

#[test]
fn half_precision_rounds_once() {
    let x = Tensor::from_f64s(DType::F16, &[3], &[0.1, 1.0, 2.0]).unwrap();
    let y = run1("Exp", vec![Input(x.clone())], Attrs::new());
    let want = Tensor::F64(x.to_f64_array().mapv(f64::exp)).cast(DType::F16);
    assert_eq!(y, want);
    let xb = Tensor::from_f64s(DType::BF16, &[2], &[1.0, 3.0]).unwrap();
    let yb = run1("Add", vec![Input(xb.clone()), Input(xb)], Attrs::new());
    assert_eq!(
        yb,
        Tensor::from_f64s(DType::BF16, &[2], &[2.0, 6.0]).unwrap()
    );
}

#[test]
fn binary_arithmetic_broadcasts_like_numpy() {
    let a = f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let row = f32s(&[3], &[10.0, 20.0, 30.0]);
    let col = f32s(&[2, 1], &[100.0, 200.0]);
    assert_eq!(
        run1(
            "Add",
            vec![Input(a.clone()), Input(row.clone())],
            Attrs::new()
        ),
        f32s(&[2, 3], &[11.0, 22.0, 33.0, 14.0, 25.0, 36.0])
    );
    assert_eq!(
        run1(
            "Sub",
            vec![Input(col.clone()), Input(row.clone())],
            Attrs::new()
        ),
        f32s(&[2, 3], &[90.0, 80.0, 70.0, 190.0, 180.0, 170.0])
    );
    assert_eq!(
        run1(
            "Mul",
            vec![Input(a.clone()), Input(f32s(&[], &[2.0]))],
            Attrs::new()
        ),
        f32s(&[2, 3], &[2.0, 4.0, 6.0, 8.0, 10.0, 12.0])
    );
    assert_eq!(
        run1("Div", vec![Input(a.clone()), Input(col)], Attrs::new()),
        f32s(&[2, 3], &[0.01, 0.02, 0.03, 0.02, 0.025, 0.03])
    );
    let p = run1(
        "Pow",
        vec![Input(a.clone()), Input(i64s(&[], &[2]))],
        Attrs::new(),
    );
    assert_eq!(p, f32s(&[2, 3], &[1.0, 4.0, 9.0, 16.0, 25.0, 36.0]));
    // Broadcasting to an empty result and rank-0 with rank-0.
    let e = run1(
        "Add",
        vec![Input(f32s(&[0, 3], &[])), Input(row)],
        Attrs::new(),
    );
    assert_eq!(e.shape(), &[0, 3]);
    assert_eq!(
        run1(
            "Mul",
            vec![Input(f32s(&[], &[3.0])), Input(f32s(&[], &[4.0]))],
            Attrs::new()
        ),
        f32s(&[], &[12.0])
    );
    assert!(run_err(
        "Add",
        vec![
            Input(f32s(&[2], &[1.0, 2.0])),
            Input(f32s(&[3], &[1.0, 2.0, 3.0]))
        ],
        Attrs::new()
    )
    .contains("cannot broadcast"));
    assert!(run_err(
        "Add",
        vec![Input(f32s(&[1], &[1.0])), Input(i64s(&[1], &[1]))],
        Attrs::new()
    )
    .contains("dtype mismatch"));
}

#[test]
fn integer_arithmetic_wraps_and_truncates() {
    let a = i32s(&[4], &[7, -7, i32::MAX, 9]);
    let b = i32s(&[4], &[2, 2, 1, -4]);
    assert_eq!(
        run1(
            "Div",
            vec![Input(a.clone()), Input(b.clone())],
            Attrs::new()
        ),
        i32s(&[4], &[3, -3, i32::MAX, -2])
    );
    assert_eq!(
        run1(
            "Add",
            vec![Input(a.clone()), Input(b.clone())],
            Attrs::new()
        ),
        i32s(&[4], &[9, -5, i32::MIN, 5])
    );
    assert_eq!(
        run1(
            "Mod",
            vec![Input(a.clone()), Input(b.clone())],
            Attrs::new()
        ),
        i32s(&[4], &[1, 1, 0, -3])
    );
    let fmod = attrs(&[("fmod", Attr::Int(1))]);
    assert_eq!(
        run1(
            "Mod",
            vec![Input(a.clone()), Input(b.clone())],
            fmod.clone()
        ),
        i32s(&[4], &[1, -1, 0, 1])
    );
    let fm = run1(
        "Mod",
        vec![
            Input(f32s(&[2], &[-7.5, 7.5])),
            Input(f32s(&[2], &[2.0, -2.0])),
        ],
        fmod,
    );
    assert_eq!(fm, f32s(&[2], &[-1.5, 1.5]));
    let m = run1(
        "Mod",
        vec![
            Input(f32s(&[3], &[-7.5, 7.5, 4.0])),
            Input(f32s(&[3], &[2.0, -2.0, 2.0])),
        ],
        Attrs::new(),
    );
    assert_eq!(
        m,
        f32s(&[3], &[0.5, -0.5, 0.0]),
        "fmod = 0 follows the divisor"
    );
    assert!(run_err(
        "Div",
        vec![Input(a), Input(i32s(&[4], &[1, 0, 1, 1]))],
        Attrs::new()
    )
    .contains("division by zero"));
    let p = run1(
        "Pow",
        vec![
            Input(i64s(&[3], &[2, -1, 3])),
            Input(i64s(&[3], &[10, -3, 0])),
        ],
        Attrs::new(),
    );
    assert_eq!(p, i64s(&[3], &[1024, -1, 1]));
}

#[test]
fn comparisons_and_logic_give_bool() {
    let a = f32s(&[3], &[1.0, 2.0, f32::NAN]);
    let b = f32s(&[1], &[2.0]);
    let cases = [
        ("Equal", [false, true, false]),
        ("Less", [true, false, false]),
        ("Greater", [false, false, false]),
        ("LessOrEqual", [true, true, false]),
        ("GreaterOrEqual", [false, true, false]),
    ];
    for (op, want) in cases {
        assert_eq!(
            run1(op, vec![Input(a.clone()), Input(b.clone())], Attrs::new()),
            bools(&[3], &want),
            "{op}"
        );
    }
    let big = i64s(&[2], &[(1 << 53) + 1, 5]);
    let near = i64s(&[2], &[1 << 53, 5]);
    // Exact in i64 although the values are equal as f64.
    assert_eq!(
        run1("Equal", vec![Input(big), Input(near)], Attrs::new()),
        bools(&[2], &[false, true])
    );
    let x = bools(&[4], &[true, true, false, false]);
    let y = bools(&[4], &[true, false, true, false]);
    assert_eq!(
        run1(
            "And",
            vec![Input(x.clone()), Input(y.clone())],
            Attrs::new()
        ),
        bools(&[4], &[true, false, false, false])
    );
    assert_eq!(
        run1("Or", vec![Input(x.clone()), Input(y.clone())], Attrs::new()),
        bools(&[4], &[true, true, true, false])
    );
    assert_eq!(
        run1(
            "Xor",
            vec![Input(x.clone()), Input(y.clone())],
            Attrs::new()
        ),
        bools(&[4], &[false, true, true, false])
    );
    assert_eq!(
        run1("Equal", vec![Input(x.clone()), Input(y)], Attrs::new()),
        bools(&[4], &[true, false, false, true])
    );
    assert!(run_err(
        "And",
        vec![Input(a.clone()), Input(a.clone())],
        Attrs::new()
    )
    .contains("not defined"));
    assert!(
        run_err("Less", vec![Input(x.clone()), Input(x)], Attrs::new()).contains("not defined")
    );
}

#[test]
fn variadic_ops_broadcast_all_inputs() {
    let a = f32s(&[2, 1], &[1.0, 5.0]);
    let b = f32s(&[3], &[2.0, 4.0, 6.0]);
    let c = f32s(&[], &[3.0]);
    let args = || vec![Input(a.clone()), Input(b.clone()), Input(c.clone())];
    assert_eq!(
        run1("Sum", args(), Attrs::new()),
        f32s(&[2, 3], &[6.0, 8.0, 10.0, 10.0, 12.0, 14.0])
    );
    assert_eq!(
        run1("Mean", args(), Attrs::new()),
        f32s(
            &[2, 3],
            &[2.0, 8.0 / 3.0, 10.0 / 3.0, 10.0 / 3.0, 4.0, 14.0 / 3.0]
        )
    );
    assert_eq!(
        run1("Max", args(), Attrs::new()),
        f32s(&[2, 3], &[3.0, 4.0, 6.0, 5.0, 5.0, 6.0])
    );
    assert_eq!(
        run1("Min", args(), Attrs::new()),
        f32s(&[2, 3], &[1.0, 1.0, 1.0, 2.0, 3.0, 3.0])
    );
    assert_eq!(
        run1(
            "Max",
            vec![Input(i64s(&[2], &[1, 9])), Input(i64s(&[2], &[4, 2]))],
            Attrs::new()
        ),
        i64s(&[2], &[4, 9])
    );
    assert_eq!(run1("Max", vec![Input(a.clone())], Attrs::new()), a);
    let nan = run1(
        "Min",
        vec![Input(f32s(&[1], &[f32::NAN])), Input(f32s(&[1], &[0.0]))],
        Attrs::new(),
    );
    assert!(nan.to_f64_vec()[0].is_nan());
    assert!(run_err("Sum", vec![], Attrs::new()).contains("at least one"));
    assert!(run_err("Mean", vec![Input(i64s(&[1], &[1]))], Attrs::new()).contains("not defined"));
}

#[test]
fn where_clip_prelu() {
    let c = bools(&[2, 1], &[true, false]);
    let x = f32s(&[3], &[1.0, 2.0, 3.0]);
    let y = f32s(&[], &[-1.0]);
    assert_eq!(
        run1(
            "Where",
            vec![Input(c.clone()), Input(x.clone()), Input(y)],
            Attrs::new()
        ),
        f32s(&[2, 3], &[1.0, 2.0, 3.0, -1.0, -1.0, -1.0])
    );
    assert!(run_err(
        "Where",
        vec![Input(x.clone()), Input(x.clone()), Input(x.clone())],
        Attrs::new()
    )
    .contains("bool"));
    let v = f32s(&[4], &[-5.0, 0.5, 5.0, f32::NAN]);
    let lo = f32s(&[], &[-1.0]);
    let hi = f32s(&[], &[1.0]);
    let both = run1(
        "Clip",
        vec![Input(v.clone()), Input(lo.clone()), Input(hi.clone())],
        Attrs::new(),
    );
    assert_close(&both, &f32s(&[4], &[-1.0, 0.5, 1.0, f32::NAN]), 0.0, 0.0);
    let upper = run1(
        "Clip",
        vec![Input(v.clone()), Absent, Input(hi)],
        Attrs::new(),
    );
    assert_close(&upper, &f32s(&[4], &[-5.0, 0.5, 1.0, f32::NAN]), 0.0, 0.0);
    assert_close(
        &run1("Clip", vec![Input(v.clone())], Attrs::new()),
        &v,
        0.0,
        0.0,
    );
    let ci = run1(
        "Clip",
        vec![
            Input(i64s(&[3], &[-9, 3, 9])),
            Input(i64s(&[], &[0])),
            Absent,
        ],
        Attrs::new(),
    );
    assert_eq!(ci, i64s(&[3], &[0, 3, 9]));
    assert!(run_err(
        "Clip",
        vec![Input(v), Input(f32s(&[2], &[0.0, 1.0]))],
        Attrs::new()
    )
    .contains("scalar"));
    let slope = f32s(&[3], &[0.1, 0.2, 0.3]);
    let xs = f32s(&[2, 3], &[-1.0, -1.0, -1.0, 1.0, 1.0, 1.0]);
    assert_close(
        &run1(
            "PRelu",
            vec![Input(xs.clone()), Input(slope.clone())],
            Attrs::new(),
        ),
        &f32s(&[2, 3], &[-0.1, -0.2, -0.3, 1.0, 1.0, 1.0]),
        1e-7,
        0.0,
    );
    assert!(
        run_err("PRelu", vec![Input(slope), Input(xs)], Attrs::new()).contains("must broadcast")
    );
    drop(x);
}

#[test]
fn symbolic_dims_propagate_and_resolve_at_run_time() {
    let a = f32s(&[2, 3], &[1.0; 6]);
    let b = f32s(&[3], &[1.0, 2.0, 3.0]);
    let (g, _) = build(
        "Add",
        vec![Symbolic(a.clone()), Input(b.clone())],
        Attrs::new(),
    )
    .unwrap();
    let out = &g.node(g.find("op").unwrap()).outputs[0];
    assert_eq!(
        out.shape.dims(),
        vec![Dim::Sym("s0_0".into()), Dim::Fixed(3)]
    );
    assert_eq!(
        run1("Add", vec![Symbolic(a), Input(b)], Attrs::new()),
        f32s(&[2, 3], &[2.0, 3.0, 4.0, 2.0, 3.0, 4.0])
    );
}
