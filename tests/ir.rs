//! The IR: the `.kir` text format (exact round trip on every graph in `tests/graphs/`
//! and `examples/graphs/`, external weights, snapshots of printed graphs), and the
//! errors of the parser and the verifier, each naming its place.
use std::path::{Path, PathBuf};

use kiln::ir::text::{parse, parse_file, print, save};
use kiln::ir::{Attr, Attrs, DType, Dim, Graph, Shape, TensorType};
use kiln::Tensor;

#[path = "ir/errors.rs"]
mod errors;

fn graph_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![];
    for dir in ["tests/graphs", "examples/graphs"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let p = entry.unwrap().path();
            if p.extension().is_some_and(|e| e == "kir") {
                files.push(p);
            }
        }
    }
    files.sort();
    assert!(files.len() >= 6, "{files:?}");
    files
}

/// The text without its leading comment lines, which the printer does not keep.
fn body(text: &str) -> String {
    text.lines()
        .skip_while(|l| l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn round_trip_is_exact_on_every_graph() {
    for f in graph_files() {
        let text = std::fs::read_to_string(&f).unwrap();
        let g = parse_file(&f).unwrap_or_else(|e| panic!("{e}"));
        let printed = print(&g);
        assert_eq!(
            printed,
            body(&text),
            "{} is not in canonical form",
            f.display()
        );
        // Text equality is graph equality here (and NaN constants compare unequal).
        let again = parse(&printed, "again", None).unwrap();
        assert_eq!(
            print(&again),
            printed,
            "{}: print -> parse -> print moved",
            f.display()
        );
    }
}

#[test]
fn external_weights_round_trip() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ir_external");
    std::fs::create_dir_all(&dir).unwrap();
    let mut g = Graph::new("weights");
    let x = g
        .add_parameter(
            "x",
            TensorType::new(
                DType::F32,
                Shape::new([Dim::Sym("N".into()), Dim::Fixed(8)]),
            ),
        )
        .unwrap();
    let w: Vec<f32> = (0..64).map(|i| i as f32 * 0.25 - 3.0).collect();
    let w = g
        .add_constant_value("w", Tensor::from_vec(&[8, 8], w).unwrap())
        .unwrap();
    let h = Tensor::from_vec(&[3], vec![half::f16::from_f32(0.5); 3]).unwrap();
    g.add_constant_value("small", h).unwrap();
    let y = g
        .op("MatMul", &[x.into(), w.into()], Attrs::new(), "y")
        .unwrap();
    g.add_output("y", y.into()).unwrap();
    let path = dir.join("model.kir");
    save(&g, &path, Some(4)).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.contains("= external(\"model.kir.weights\", 0, 256)"),
        "{text}"
    );
    assert!(
        text.contains("\"small\" = Constant : f16[3] = [0.5, 0.5, 0.5]"),
        "{text}"
    );
    let back = parse_file(&path).unwrap();
    assert_eq!(back, g);
    // Saving again writes the same bytes.
    let weights = std::fs::read(dir.join("model.kir.weights")).unwrap();
    save(&back, &path, Some(4)).unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    assert_eq!(
        std::fs::read(dir.join("model.kir.weights")).unwrap(),
        weights
    );
}

/// A residual block with named axes, built through the API.
fn residual_block() -> Graph {
    let mut g = Graph::new("residual");
    let named = |dims: Vec<Dim>, names: &[&str]| {
        Shape::named(dims, names.iter().map(|n| Some(n.to_string())).collect())
    };
    let x = g
        .add_parameter(
            "x",
            TensorType::new(
                DType::F32,
                named(
                    vec![Dim::Sym("B".into()), Dim::Fixed(4)],
                    &["batch", "feature"],
                ),
            ),
        )
        .unwrap();
    let w = Tensor::from_vec(&[4, 4], (0..16).map(|i| (i % 5) as f32 - 2.0).collect()).unwrap();
    let w = g
        .add_constant(
            "w",
            TensorType::new(
                DType::F32,
                named(vec![Dim::Fixed(4), Dim::Fixed(4)], &["feature", "hidden"]),
            ),
            w,
        )
        .unwrap();
    let h = g
        .op("Dot", &[x.into(), w.into()], Attrs::new(), "proj")
        .unwrap();
    let r = g.op("Relu", &[h.into()], Attrs::new(), "act").unwrap();
    let scale = g
        .add_constant_value(
            "scale",
            Tensor::from_vec(&[4], vec![1.0f32, 0.5, 2.0, 1.0]).unwrap(),
        )
        .unwrap();
    let eps = Attrs::new().with("epsilon", Attr::Float(1e-6));
    let ln = g
        .op("LayerNormalization", &[r.into(), scale.into()], eps, "norm")
        .unwrap();
    let s = g
        .op(
            "ReduceSum",
            &[ln.into()],
            Attrs::new().with("axis_names", Attr::Strings(vec!["hidden".into()])),
            "sum",
        )
        .unwrap();
    g.add_output("out", ln.into()).unwrap();
    g.add_output("sum", s.into()).unwrap();
    g
}

#[test]
fn snapshot_residual_block() {
    insta::assert_snapshot!(print(&residual_block()));
}

/// A training-style step with state, built through the API: variables, an Assign
/// ordered by a control dependency, a multi-output node.
fn stateful_step() -> Graph {
    let mut g = Graph::new("step");
    let x = g
        .add_parameter(
            "x",
            TensorType::new(
                DType::F64,
                Shape::new([Dim::Sym("N".into()), Dim::Fixed(3)]),
            ),
        )
        .unwrap();
    let acc = g
        .add_variable(
            "acc",
            TensorType::new(DType::F64, Shape::fixed(&[3])),
            Tensor::from_vec(&[3], vec![0.0f64; 3]).unwrap(),
        )
        .unwrap();
    let axes = g
        .add_constant_value("axes", Tensor::from_vec(&[1], vec![0i64]).unwrap())
        .unwrap();
    let keep = Attrs::new().with("keepdims", Attr::Int(0));
    let sum = g
        .op("ReduceSum", &[x.into(), axes.into()], keep, "sum")
        .unwrap();
    let new = g
        .op("Add", &[acc.into(), sum.into()], Attrs::new(), "acc.new")
        .unwrap();
    let k = g
        .add_constant_value("k", Tensor::from_vec(&[1], vec![2i64]).unwrap())
        .unwrap();
    let top = g
        .op("TopK", &[new.into(), k.into()], Attrs::new(), "top")
        .unwrap();
    let store = g
        .op("Assign", &[acc.into(), new.into()], Attrs::new(), "store")
        .unwrap();
    g.add_control_dep(store, top).unwrap();
    g.add_output("best", top.into()).unwrap();
    g.add_output("best.at", top.out(1)).unwrap();
    g
}

#[test]
fn snapshot_stateful_step() {
    insta::assert_snapshot!(print(&stateful_step()));
}

/// Deterministic byte-level mutations of every graph: parsing must return, never panic.
#[test]
fn mutated_text_never_panics() {
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n.max(1) as u64) as usize
    };
    let alphabet = b"%:=,()[]{}\"\\_-.0123456789eEaZ #\n\tinfNa";
    let mut ok = 0;
    for f in graph_files() {
        let text = std::fs::read_to_string(&f).unwrap().into_bytes();
        for _ in 0..600 {
            let mut t = text.clone();
            for _ in 0..1 + next(3) {
                let at = next(t.len());
                match next(4) {
                    0 => {
                        t.remove(at.min(t.len() - 1));
                    }
                    1 => t.insert(at, alphabet[next(alphabet.len())]),
                    2 => t.truncate(at),
                    _ => {
                        let i = at.min(t.len() - 1);
                        t[i] = alphabet[next(alphabet.len())];
                    }
                }
                if t.is_empty() {
                    t.push(b'g');
                }
            }
            let s = String::from_utf8_lossy(&t);
            if parse(&s, "fuzz.kir", None).is_ok() {
                ok += 1;
            }
        }
    }
    // Some mutations (inside a comment or a number) still parse; most must not.
    assert!(ok < 600 * graph_files().len() / 2, "{ok} mutants parsed");
}

#[test]
fn elided_constants_print_small_and_refuse_to_parse() {
    let mut g = Graph::new("big");
    let x = g
        .add_parameter("x", TensorType::new(DType::F32, Shape::fixed(&[300])))
        .unwrap();
    let w = g
        .add_constant_value("w", Tensor::from_vec(&[300], vec![1.5f32; 300]).unwrap())
        .unwrap();
    let y = g
        .op("Mul", &[x.into(), w.into()], Attrs::new(), "y")
        .unwrap();
    g.add_output("y", y.into()).unwrap();
    let opts = kiln::ir::text::PrintOptions {
        elide_limit: Some(256),
        ..Default::default()
    };
    let text = kiln::ir::text::print_with(&g, &opts).0;
    assert!(
        text.contains(r#""w" = Constant : f32[300] = elided(300)"#),
        "{text}"
    );
    let e = parse(&text, "dump.kir", None).unwrap_err().to_string();
    assert!(e.contains("dump.kir:3:") && e.contains("elided"), "{e}");
}

#[test]
fn low_bit_constants_round_trip_every_code() {
    let mut g = Graph::new("lowbit");
    let mut names = vec![];
    for dtype in DType::ALL.into_iter().filter(|d| d.is_low_bit()) {
        // Every in-memory byte the dtype has (NaN codes aside: NaN prints as one text).
        let bytes: Vec<u8> = (0..=255u8)
            .filter_map(|b| Tensor::from_le_bytes(dtype, &[1], &[b]).ok())
            .filter(|t| !t.to_f64_vec()[0].is_nan())
            .map(|t| t.to_le_bytes()[0])
            .collect();
        let t = Tensor::from_le_bytes(dtype, &[bytes.len()], &bytes).unwrap();
        let c = g
            .add_constant_value(&format!("c_{dtype}"), t.clone())
            .unwrap();
        g.add_output(&format!("y_{dtype}"), c.into()).unwrap();
        names.push((dtype, t));
    }
    let text = print(&g);
    let back = parse(&text, "lowbit", None).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(print(&back), text);
    for (i, (dtype, t)) in names.iter().enumerate() {
        let node = back.outputs()[i].value.node;
        assert_eq!(back.node(node).data.as_deref(), Some(t), "{dtype}");
    }
}
