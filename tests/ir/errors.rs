//! Every kind of bad graph gets an error naming its place: `file:line:col` for text,
//! the node (index, name, op) for graphs built through the API.
use kiln::ir::text::parse;
use kiln::ir::{verify, Attr, Attrs, DType, Dim, Graph, Shape, TensorType, Value};
use kiln::{Error, NodeId};

const HEAD: &str = "graph \"g\" {\n  %0 \"x\" = Parameter : f32[2, 3]\n";

/// Parses `HEAD` + `body`, expecting an error at exactly `line:col` containing `msg`.
#[track_caller]
fn parse_fails(body: &str, line: usize, col: usize, msg: &str) {
    let text = format!("{HEAD}{body}");
    match parse(&text, "t.kir", None) {
        Ok(_) => panic!("should fail:\n{text}"),
        Err(e @ Error::Parse { .. }) => {
            let s = e.to_string();
            assert!(
                s.starts_with(&format!("t.kir:{line}:{col}: ")) && s.contains(msg),
                "got: {s}\nwanted {line}:{col} {msg}"
            );
        }
        Err(e) => panic!("not a parse error: {e:?}"),
    }
}

#[test]
fn syntax_errors_give_line_and_column() {
    parse_fails(
        "  %1 \"y\" Relu(%0) : f32[2, 3]\n}\n",
        3,
        10,
        "expected '=', found 'Relu'",
    );
    parse_fails(
        "  %1 \"y = Relu(%0) : f32[2, 3]\n}\n",
        3,
        6,
        "unterminated string",
    );
    parse_fails(
        "  %1 \"y\\q\" = Relu(%0) : f32[2, 3]\n}\n",
        3,
        8,
        "unknown escape",
    );
    parse_fails(
        "  %2 \"y\" = Relu(%0) : f32[2, 3]\n}\n",
        3,
        3,
        "expected node %1",
    );
    parse_fails(
        "  %1 \"y\" = Relu(%1) : f32[2, 3]\n}\n",
        3,
        17,
        "%1 is not defined before this point",
    );
    parse_fails(
        "  %1 \"y\" = Relu(%0:1) : f32[2, 3]\n}\n",
        3,
        17,
        "%0 has 1 outputs; there is no output 1",
    );
    parse_fails(
        "  %1 \"y\" = Relu(%0) : f33[2, 3]\n}\n",
        3,
        23,
        "unknown dtype 'f33'",
    );
    parse_fails(
        "  %1 \"y\" = Relu(%0) : f32[2, -3]\n}\n",
        3,
        30,
        "expected a dim",
    );
    parse_fails(
        "  %1 \"c\" = Constant : f32[2] = [1.0]\n}\n",
        3,
        32,
        "1 values given, f32[2] holds 2",
    );
    parse_fails(
        "  %1 \"c\" = Constant : bool[1] = [1]\n}\n",
        3,
        34,
        "expected a bool value, found integer 1",
    );
    parse_fails(
        "  %1 \"c\" = Constant : i8[1] = [300]\n}\n",
        3,
        32,
        "expected a i8 value, found integer 300",
    );
    parse_fails(
        "  %1 \"c\" = Constant : f32[1] = [1.0.0]\n}\n",
        3,
        36,
        "unexpected character '.'",
    );
    parse_fails(
        "  %1 \"y\" = Transpose(%0) {perm = []} : f32[3, 2]\n}\n",
        3,
        34,
        "an empty list needs its kind",
    );
    parse_fails(
        "  %1 \"y\" = Relu(%0) {a = 1, a = 2} : f32[2, 3]\n}\n",
        3,
        29,
        "attribute 'a' is given twice",
    );
    parse_fails(
        "  %1 \"y\" = Relu(%0) : f32[2, 3]\n}\nextra",
        5,
        1,
        "expected the end of the file",
    );
    parse_fails(
        "  %1 \"y\" = Relu(%0) : f32[2, 3]\n",
        4,
        1,
        "expected a node (%k ...), 'return' or '}'",
    );
    parse_fails(
        "  %1 \"c\" = Constant : f32[1] = external(\"w.bin\", 0, 4)\n}\n",
        3,
        41,
        "need the .kir file's directory",
    );
    parse_fails(
        "  return \"a\" = %0, \"a\" = %0\n}\n",
        3,
        20,
        "two graph outputs are named 'a'",
    );
    parse_fails(
        "  %1 \"y\" = Relu(%0) : f32[2, 3]\n  %2 \"x\" = Relu(%0) : f32[2, 3]\n}\n",
        4,
        6,
        "the name 'x' is used",
    );
    parse_fails(
        "  %1 \"y\" = Relu(%0) : f32[2, 3] @\n}\n",
        3,
        33,
        "unexpected character '@'",
    );
    parse_fails(
        "  %1 \"y\" = Relu(%0) : f32[2, 3] after(%0:1)\n}\n",
        3,
        39,
        "a node reference like %3",
    );
}

#[test]
fn semantic_errors_point_at_the_node() {
    parse_fails(
        "  %1 \"y\" = Frobnicate(%0) : f32[2, 3]\n}\n",
        3,
        12,
        "unknown op 'Frobnicate'",
    );
    parse_fails("  %1 \"y\" = Relu(%0) : f32[3, 2]\n}\n", 3, 3, "node #1 'y' (Relu): declared output types (f32[3, 2]) differ from the inferred (f32[2, 3])");
    parse_fails(
        "  %1 \"y\" = Relu(%0) {alpha = 0.1} : f32[2, 3]\n}\n",
        3,
        3,
        "node #1 'y' (Relu): unknown attribute 'alpha'",
    );
    parse_fails(
        "  %1 \"y\" = Add(%0) : f32[2, 3]\n}\n",
        3,
        3,
        "Add takes 2 inputs, got 1",
    );
    parse_fails(
        "  %1 \"y\" = Softmax(%0) {axis = \"last\"} : f32[2, 3]\n}\n",
        3,
        3,
        "attribute 'axis' must be int, got string",
    );
    parse_fails(
        "  %1 \"c\" = Constant : i64[1] = [1]\n  %2 \"y\" = Add(%0, %1) : f32[2, 3]\n}\n",
        4,
        3,
        "dtype mismatch",
    );
    parse_fails(
        "  %1 \"y\" = Relu(%0) : (f32[2, 3], f32[2, 3])\n}\n",
        3,
        3,
        "declared output types",
    );
}

fn param(g: &mut Graph, name: &str, dims: &[usize], names: &[&str]) -> Value {
    let dims: Vec<Dim> = dims.iter().map(|&d| Dim::Fixed(d)).collect();
    let names = names.iter().map(|n| Some(n.to_string())).collect();
    g.add_parameter(name, TensorType::new(DType::F32, Shape::named(dims, names)))
        .unwrap()
        .into()
}

#[test]
fn api_errors_name_the_node() {
    let mut g = Graph::new("g");
    let a = param(&mut g, "a", &[2, 3], &["B", "C"]);
    let b = param(&mut g, "b", &[2, 3], &["B", "H"]);
    let e = g
        .op("Add", &[a, b], Attrs::new(), "sum")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("node #2 'sum' (Add)") && e.contains("'C' vs 'H'"),
        "{e}"
    );
    let e = g.op("Nope", &[a], Attrs::new(), "n").unwrap_err();
    assert!(
        matches!(e, Error::UnknownOp(_))
            && e.to_string().contains("'Nope' is not in the catalogue"),
        "{e}"
    );
    let e = g
        .op("Relu", &[a], Attrs::new().with("bogus", Attr::Int(1)), "r")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("node #2 'r' (Relu): unknown attribute 'bogus'"),
        "{e}"
    );
    let e = g
        .op("Relu", &[a], Attrs::new(), "a")
        .unwrap_err()
        .to_string();
    assert!(e.contains("a node named 'a' already exists"), "{e}");
    let e = g.add_output("y", NodeId(9).into()).unwrap_err().to_string();
    assert!(e.contains("9"), "{e}");
    let r = g.op("Relu", &[a], Attrs::new(), "r").unwrap();
    let e = g.add_control_dep(NodeId(0), r).unwrap_err().to_string();
    assert!(e.contains("must be an earlier node"), "{e}");
    g.add_output("y", r.into()).unwrap();
    let e = g.add_output("y", r.into()).unwrap_err().to_string();
    assert!(e.contains("'y' already exists"), "{e}");
    verify(&g).unwrap();
}

/// Inputs found by fuzzing that overflowed size arithmetic: each must be an error.
#[test]
fn absurd_sizes_are_errors_not_overflows() {
    let cases = [
        "  %1 \"p\" = Constant : i64[2] = [9223372036854775807, 9223372036854775807]\n  %2 \"y\" = Pad(%0, %1) : f32[2, 3]\n",
        "  %1 \"s\" = Constant : i64[2] = [4294967296, 4294967296]\n  %2 \"y\" = Reshape(%0, %1) : f32[2, 3]\n",
        "  %1 \"c\" = Constant : f32[4294967296, 4294967296] = [1.0]\n",
    ];
    for body in cases {
        let text = format!("{HEAD}{body}}}\n");
        assert!(parse(&text, "t.kir", None).is_err(), "{body}");
    }
    let mut g = Graph::new("g");
    let x = param(&mut g, "x", &[1, 1, 5, 5], &["N", "C", "H", "W"]);
    let w = param(&mut g, "w", &[1, 1, 3, 3], &["M", "K", "KH", "KW"]);
    let big = Attrs::new().with("strides", Attr::Ints(vec![i64::MAX, i64::MAX]));
    assert!(g.op("ConvTranspose", &[x, w], big, "ct").is_err());
    let e = g
        .op("Parameter", &[], Attrs::new(), "p")
        .unwrap_err()
        .to_string();
    assert!(e.contains("add_parameter"), "{e}");
}

/// A `Fused` body operand that starts with a multi-byte character is an error naming the
/// step, from `.kir` text and from the API alike (it once sliced the text at a byte).
#[test]
fn fused_body_operands_are_checked_not_sliced() {
    for operand in ["é", "é0", "i", "t", "x0", "i-1", "iΩ"] {
        let body =
            format!("  %1 \"f\" = Fused(%0) {{body = [\"Relu({operand})\"]}} : f32[2, 3]\n}}\n");
        parse_fails(&body, 3, 3, &format!("body step 0 'Relu({operand})'"));

        let mut g = Graph::new("g");
        let x = param(&mut g, "x", &[2, 3], &["B", "C"]);
        let attrs = Attrs::new().with("body", Attr::Strings(vec![format!("Relu({operand})")]));
        let e = g.op("Fused", &[x], attrs, "f").unwrap_err().to_string();
        assert!(
            e.contains("node #1 'f' (Fused)") && e.contains("body step 0"),
            "{operand}: {e}"
        );
    }
}

/// `external("file", ..)` reads only inside the `.kir` file's folder, as ONNX external
/// data does: no absolute path, no `..`.
#[test]
fn external_weights_stay_inside_the_kir_files_folder() {
    let root = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("ir_external_confined");
    let dir = root.join("model");
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    let four_floats: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    std::fs::write(root.join("secret.bin"), &four_floats).unwrap();
    std::fs::write(dir.join("sub/w.bin"), &four_floats).unwrap();
    let kir = |file: &str| {
        let text = format!(
            "graph \"g\" {{\n  %0 \"a\" = Constant : f32[2] = external(\"{file}\", 0, 8)\n  %1 \"b\" = Constant : f32[2] = external(\"{file}\", 8, 8)\n  return \"y\" = %1\n}}\n"
        );
        let path = dir.join("model.kir");
        std::fs::write(&path, text).unwrap();
        kiln::ir::text::parse_file(&path)
    };
    let g = kir("sub/w.bin").unwrap();
    assert_eq!(g.len(), 2);
    for file in ["../secret.bin", "sub/../../secret.bin", "/etc/passwd", ""] {
        let e = kir(file).unwrap_err();
        assert!(
            matches!(e, Error::Parse { line: 2, .. })
                && (e.to_string().contains("leaves the .kir file's folder")
                    || e.to_string().contains("needs a name")),
            "{file}: {e}"
        );
    }
}
