//! The ONNX importer on hand-built models: what it keeps (symbolic dims, initializers,
//! external data) and every kind of bad input, each a clear error and never a panic.
use std::path::Path;

use kiln::backend::interp::InterpExecutable;
use kiln::backend::Executable;
use kiln::frontend::onnx::{import_bytes, import_file, proto};
use kiln::{Error, Tensor};
use prost::Message;
use proto::tensor_shape_proto::{dimension, Dimension};

fn input(name: &str, elem: i32, dims: &[Result<i64, &str>]) -> proto::ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| Dimension {
            value: Some(match d {
                Ok(n) => dimension::Value::DimValue(*n),
                Err(p) => dimension::Value::DimParam(p.to_string()),
            }),
            ..Default::default()
        })
        .collect();
    proto::ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(proto::TypeProto {
            value: Some(proto::type_proto::Value::TensorType(
                proto::type_proto::Tensor {
                    elem_type: Some(elem),
                    shape: Some(proto::TensorShapeProto { dim }),
                },
            )),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn node(op: &str, ins: &[&str], outs: &[&str]) -> proto::NodeProto {
    proto::NodeProto {
        op_type: Some(op.into()),
        name: Some(format!("{op}_node")),
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: outs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

const FLOAT: i32 = 1;

fn f32_tensor(name: &str, dims: &[i64], raw: Vec<u8>) -> proto::TensorProto {
    proto::TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(FLOAT),
        raw_data: Some(raw.into()),
        ..Default::default()
    }
}

/// y = relu(x * w), x: f32[N, 3], w an initializer.
fn model(
    nodes: Vec<proto::NodeProto>,
    init: Vec<proto::TensorProto>,
    opset: i64,
) -> proto::ModelProto {
    proto::ModelProto {
        ir_version: Some(8),
        opset_import: vec![proto::OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(opset),
        }],
        graph: Some(proto::GraphProto {
            name: Some("g".into()),
            node: nodes,
            initializer: init,
            input: vec![input("x", FLOAT, &[Err("N"), Ok(3)])],
            output: vec![input("y", FLOAT, &[Err("N"), Ok(3)])],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn w() -> proto::TensorProto {
    f32_tensor(
        "w",
        &[3],
        [1.0f32, -2.0, 3.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
    )
}

fn good() -> proto::ModelProto {
    model(
        vec![
            node("Mul", &["x", "w"], &["xw"]),
            node("Relu", &["xw"], &["y"]),
        ],
        vec![w()],
        17,
    )
}

fn err(m: &proto::ModelProto) -> String {
    match import_bytes(&m.encode_to_vec(), None) {
        Ok(_) => panic!("should fail"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn imports_and_runs_with_symbolic_dims() {
    let g = import_bytes(&good().encode_to_vec(), None).unwrap();
    assert_eq!(
        g.value_type(g.outputs()[0].value).unwrap().to_string(),
        "f32[N, 3]"
    );
    let exe = InterpExecutable::new(g).unwrap();
    let x = Tensor::from_vec(&[2, 3], vec![1.0f32, 1.0, 1.0, -1.0, 2.0, 0.5]).unwrap();
    let y = exe.run(&[x]).unwrap();
    assert_eq!(
        y[0],
        Tensor::from_vec(&[2, 3], vec![1.0f32, 0.0, 3.0, 0.0, 0.0, 1.5]).unwrap()
    );
    // IR 3 lists every initializer among the graph inputs too: it stays a constant.
    let mut m = good();
    let graph = m.graph.as_mut().unwrap();
    graph.input.push(input("w", FLOAT, &[Ok(3)]));
    let g = import_bytes(&m.encode_to_vec(), None).unwrap();
    assert_eq!(g.inputs().len(), 1);
    let g = import_file(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/onnx/scale_relu.onnx"))
        .unwrap();
    assert_eq!(g.inputs().len(), 1);
}

#[test]
fn external_data_is_read_inside_the_model_folder_only() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("onnx_external");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("w.bin"),
        [0u8, 0, 0, 0]
            .iter()
            .chain(&w().raw_data.unwrap())
            .copied()
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let ext = |location: &str| {
        let mut t = f32_tensor("w", &[3], vec![]);
        t.raw_data = None;
        t.data_location = Some(proto::tensor_proto::DataLocation::External as i32);
        t.external_data = [("location", location), ("offset", "4"), ("length", "12")]
            .iter()
            .map(|(k, v)| proto::StringStringEntryProto {
                key: Some(k.to_string()),
                value: Some(v.to_string()),
            })
            .collect();
        model(
            vec![
                node("Mul", &["x", "w"], &["xw"]),
                node("Relu", &["xw"], &["y"]),
            ],
            vec![t],
            17,
        )
    };
    let write = |m: &proto::ModelProto| {
        let p = dir.join("model.onnx");
        std::fs::write(&p, m.encode_to_vec()).unwrap();
        p
    };
    let g = import_file(&write(&ext("w.bin"))).unwrap();
    assert_eq!(g.len(), 4, "x, w, Mul, Relu");
    for (location, needle) in [
        ("../../etc/passwd", "leaves the model's folder"),
        ("/etc/passwd", "leaves the model's folder"),
        ("missing.bin", "missing.bin"),
    ] {
        let e = import_file(&write(&ext(location))).unwrap_err().to_string();
        assert!(
            e.contains(needle) && e.contains("initializer 'w'"),
            "{location}: {e}"
        );
    }
    let e = import_bytes(&ext("w.bin").encode_to_vec(), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("needs the model's folder"), "{e}");
}

#[test]
fn malformed_models_are_clear_errors() {
    let bytes = good().encode_to_vec();
    let e = import_bytes(&bytes[..bytes.len() / 2], None).unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("not a valid ONNX model"),
        "{e}"
    );
    assert!(import_bytes(b"\xff\xff\xff\xff garbage", None).is_err());
    // Raw data that does not fit the dims.
    let e = err(&model(
        vec![node("Relu", &["x"], &["y"])],
        vec![f32_tensor("w", &[3], vec![0; 8])],
        17,
    ));
    assert!(
        e.contains("initializer 'w'") && e.contains("8 bytes given"),
        "{e}"
    );
    // A dangling name, and a cycle (which reads as a use before definition).
    let e = err(&model(vec![node("Relu", &["nope"], &["y"])], vec![], 17));
    assert!(
        e.contains("Relu_node") && e.contains("input 'nope' is not produced"),
        "{e}"
    );
    let e = err(&model(
        vec![node("Relu", &["y"], &["a"]), node("Relu", &["a"], &["y"])],
        vec![],
        17,
    ));
    assert!(e.contains("ONNX node #0") && e.contains("input 'y'"), "{e}");
    // The pools' `block` is Kiln-internal (the layout pass's): never read from a model.
    let mut blocked = node("GlobalMaxPool", &["x"], &["y"]);
    blocked.attribute.push(proto::AttributeProto {
        name: Some("block".into()),
        r#type: Some(proto::attribute_proto::AttributeType::Int as i32),
        i: Some(16),
        ..Default::default()
    });
    let e = err(&model(vec![blocked], vec![], 17));
    assert!(
        e.contains("GlobalMaxPool: unknown attribute 'block'"),
        "{e}"
    );
    // Unsupported op, domain, opset, dtype.
    let e = err(&model(vec![node("Frobnicate", &["x"], &["y"])], vec![], 17));
    assert!(e.contains("ONNX node #0 'Frobnicate_node' (Frobnicate, domain 'ai.onnx', opset 17): op 'Frobnicate' is not supported"), "{e}");
    let mut custom = node("Relu", &["x"], &["y"]);
    custom.domain = Some("com.example".into());
    let e = err(&model(vec![custom], vec![], 17));
    assert!(e.contains("domain 'com.example' is not supported"), "{e}");
    let e = err(&model(vec![node("Relu", &["x"], &["y"])], vec![], 29));
    assert!(
        e.contains("ai.onnx opset 29 is not supported (1 to 28 are)"),
        "{e}"
    );
    // Opsets 1-6 import only for ops unchanged since: Relu's definition dates from 6.
    let e = err(&model(vec![node("Relu", &["x"], &["y"])], vec![], 5));
    assert!(e.contains("op 'Relu' at opset 5 is not supported"), "{e}");
    let relu6 = model(vec![node("Relu", &["x"], &["y"])], vec![], 6);
    assert!(import_bytes(&relu6.encode_to_vec(), None).is_ok());
    // A node of a domain the model does not import.
    let mut m = model(vec![node("Relu", &["x"], &["y"])], vec![], 17);
    m.opset_import[0].domain = Some("ai.onnx.ml".into());
    let e = err(&m);
    assert!(
        e.contains("the model imports no opset of domain 'ai.onnx'"),
        "{e}"
    );
    let mut m = model(vec![node("Relu", &["x"], &["y"])], vec![], 17);
    m.graph.as_mut().unwrap().input[0] = input("x", 8, &[Ok(3)]);
    let e = err(&m);
    assert!(
        e.contains("graph input 'x'") && e.contains("STRING is not supported"),
        "{e}"
    );
    let mut m = good();
    m.graph.as_mut().unwrap().output[0].name = Some("zzz".into());
    assert!(err(&m).contains("graph output 'zzz' is not produced"));
    m.graph = None;
    assert!(err(&m).contains("no graph"));
}

/// Bounded deterministic fuzzing of the decoder and importer: byte mutations of a valid
/// model must give Ok or Err, never a panic. (`fuzz/` has the cargo-fuzz target.)
#[test]
fn mutated_models_never_panic() {
    let bytes = good().encode_to_vec();
    let mut seed: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = move |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n.max(1) as u64) as usize
    };
    for _ in 0..5000 {
        let mut b = bytes.clone();
        for _ in 0..1 + next(4) {
            let i = next(b.len());
            match next(3) {
                0 => b[i] = next(256) as u8,
                1 => b.truncate(i.max(1)),
                _ => b.insert(i, next(256) as u8),
            }
        }
        let _ = import_bytes(&b, None);
    }
}
