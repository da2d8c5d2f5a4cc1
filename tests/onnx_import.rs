//! The ONNX importer on hand-built models: what it keeps (symbolic dims, initializers,
//! external data) and every kind of bad input, each a clear error and never a panic.
use crate::common;

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

/// A model with one graph input per `(name, dims)`, each dim a `dim_value`, a
/// `dim_param` or neither (`None`), and each input's `Relu` an output.
fn relu_model(inputs: &[(&str, Vec<Option<dimension::Value>>)]) -> proto::ModelProto {
    let mut m = good();
    let graph = m.graph.as_mut().unwrap();
    graph.initializer.clear();
    graph.input = inputs
        .iter()
        .map(|(name, dims)| {
            let mut v = input(name, FLOAT, &[]);
            let Some(proto::type_proto::Value::TensorType(t)) =
                v.r#type.as_mut().and_then(|t| t.value.as_mut())
            else {
                unreachable!()
            };
            t.shape.as_mut().unwrap().dim = dims
                .iter()
                .map(|d| Dimension {
                    value: d.clone(),
                    ..Default::default()
                })
                .collect();
            v
        })
        .collect();
    graph.node = vec![];
    graph.output = vec![];
    for (name, _) in inputs {
        let y = format!("{name}_relu");
        graph.node.push(node("Relu", &[name], &[&y]));
        graph.output.push(input(&y, FLOAT, &[]));
    }
    m
}

fn run_interp_and_cpu(g: &kiln::ir::Graph, inputs: &[Tensor]) -> [kiln::Result<Vec<Tensor>>; 2] {
    let cpu = kiln::backend::backend_with(
        kiln::backend::Device::Cpu,
        kiln::passes::CompileOptions {
            threads: 1,
            ..Default::default()
        },
    )
    .unwrap()
    .compile(g)
    .unwrap();
    [
        InterpExecutable::new(g.clone()).unwrap().run(inputs),
        cpu.run(inputs),
    ]
}

#[test]
fn unknown_dims_are_each_their_own_symbol() {
    use dimension::Value::{DimParam, DimValue};
    // An OCR classifier's input: batch -1, height and width both "?".
    let m = relu_model(&[(
        "x",
        vec![
            Some(DimValue(-1)),
            Some(DimValue(3)),
            Some(DimParam("?".into())),
            Some(DimParam("?".into())),
        ],
    )]);
    let g = import_bytes(&m.encode_to_vec(), None).unwrap();
    assert_eq!(
        g.value_type(g.inputs()[0].into()).unwrap().to_string(),
        "f32[x.0, 3, x.2, x.3]"
    );
    let x = common::Rng(7).f32_tensor(&[1, 3, 48, 192], 1.0);
    let relu: Vec<f64> = x.to_f64_vec().iter().map(|v| v.max(0.0)).collect();
    let relu = Tensor::from_f64s(kiln::ir::DType::F32, x.shape(), &relu).unwrap();
    for y in run_interp_and_cpu(&g, std::slice::from_ref(&x)) {
        assert_eq!(y.unwrap()[0], relu);
    }
    // Every spelling of "unknown", for two inputs that then differ in that dim: no
    // spelling may tie the two together.
    let spellings: [Option<dimension::Value>; 5] = [
        Some(DimParam("?".into())),
        Some(DimParam(String::new())),
        None,
        Some(DimValue(-1)),
        Some(DimValue(0)),
    ];
    for unknown in spellings {
        let m = relu_model(&[
            ("a", vec![unknown.clone(), Some(DimValue(2))]),
            ("b", vec![unknown.clone(), Some(DimValue(2))]),
        ]);
        let g = import_bytes(&m.encode_to_vec(), None).unwrap();
        let types: Vec<String> = g
            .inputs()
            .iter()
            .map(|&p| g.value_type(p.into()).unwrap().to_string())
            .collect();
        assert_eq!(types, ["f32[a.0, 2]", "f32[b.0, 2]"], "{unknown:?}");
        let a = Tensor::from_vec(&[1, 2], vec![1.0f32, 2.0]).unwrap();
        let b = Tensor::from_vec(&[4, 2], vec![0.5f32; 8]).unwrap();
        for y in run_interp_and_cpu(&g, &[a.clone(), b.clone()]) {
            let y = y.unwrap_or_else(|e| panic!("{unknown:?}: {e}"));
            assert_eq!((y[0].shape(), y[1].shape()), (&[1, 2][..], &[4, 2][..]));
        }
    }
}

#[test]
fn a_named_dim_param_still_means_equal() {
    use dimension::Value::{DimParam, DimValue};
    let n = || vec![Some(DimParam("N".into())), Some(DimValue(2))];
    let m = relu_model(&[("a", n()), ("b", n())]);
    let g = import_bytes(&m.encode_to_vec(), None).unwrap();
    let a = Tensor::from_vec(&[3, 2], vec![1.0f32; 6]).unwrap();
    for y in run_interp_and_cpu(&g, &[a.clone(), a.clone()]) {
        assert_eq!(y.unwrap()[0].shape(), &[3, 2]);
    }
    let b = Tensor::from_vec(&[4, 2], vec![1.0f32; 8]).unwrap();
    for y in run_interp_and_cpu(&g, &[a.clone(), b.clone()]) {
        let e = y.expect_err("N is 3 for a and 4 for b").to_string();
        assert!(e.contains('N'), "{e}");
    }
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
    // A dangling name, and a cycle.
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
    assert!(e.contains("cycle") && e.contains("#0 'Relu_node'"), "{e}");
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
    // A well-formed model using what Kiln does not implement is Unsupported, a status of
    // its own, not an unknown op.
    let opset29 = model(vec![node("Relu", &["x"], &["y"])], vec![], 29).encode_to_vec();
    assert!(matches!(
        import_bytes(&opset29, None),
        Err(Error::Unsupported(_))
    ));
    let mut untouched = std::ptr::null_mut();
    // SAFETY: `opset29` is a live buffer of its length; `untouched` is writable.
    let status = unsafe {
        kiln::capi::graph::kiln_graph_import_onnx_bytes(
            opset29.as_ptr().cast(),
            opset29.len(),
            &mut untouched,
        )
    };
    assert_eq!(status, kiln::capi::KILN_STATUS_UNSUPPORTED);
    assert!(untouched.is_null());
    let mut bn = node("BatchNormalization", &["x", "w", "w", "w", "w"], &["y"]);
    bn.attribute.push(proto::AttributeProto {
        name: Some("spatial".into()),
        r#type: Some(proto::attribute_proto::AttributeType::Int as i32),
        i: Some(0),
        ..Default::default()
    });
    let m = model(vec![bn], vec![w()], 7).encode_to_vec();
    let e = import_bytes(&m, None).unwrap_err();
    assert!(
        matches!(&e, Error::Unsupported(m) if m.contains("'BatchNormalization_node'") && m.contains("spatial = 0")),
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
    m.graph.as_mut().unwrap().input[0] = input("x", 14, &[Ok(3)]);
    let e = err(&m);
    assert!(
        e.contains("graph input 'x'") && e.contains("COMPLEX64 is not supported"),
        "{e}"
    );
    let mut m = good();
    m.graph.as_mut().unwrap().output[0].name = Some("zzz".into());
    assert!(err(&m).contains("graph output 'zzz' is not produced"));
    m.graph = None;
    assert!(err(&m).contains("no graph"));
}

fn attr_strings(name: &str, v: &[&str]) -> proto::AttributeProto {
    proto::AttributeProto {
        name: Some(name.into()),
        r#type: Some(proto::attribute_proto::AttributeType::Strings as i32),
        strings: v.iter().map(|s| s.as_bytes().to_vec()).collect(),
        ..Default::default()
    }
}

fn attr_float(name: &str, v: f32) -> proto::AttributeProto {
    proto::AttributeProto {
        name: Some(name.into()),
        r#type: Some(proto::attribute_proto::AttributeType::Float as i32),
        f: Some(v),
        ..Default::default()
    }
}

/// Kiln's own ops (what the passes build, the graph's sources and state, Kiln's
/// extensions: the schema's `origin`) are never read from a model: each is an error naming the node.
#[test]
fn kiln_internal_ops_are_refused_by_name() {
    let internal: Vec<&str> = kiln::ir::ops::catalogue()
        .values()
        .map(|op| op.schema())
        .filter(|s| s.origin == kiln::ir::ops::Origin::Kiln)
        .map(|s| s.name)
        .collect();
    for op in [
        "Fused",
        "FusedConv",
        "FusedMatMul",
        "Reorder",
        "Parameter",
        "Variable",
        "Assign",
        "Dot",
        "MseLoss",
    ] {
        assert!(internal.contains(&op), "{op} is not marked internal");
    }
    for op in internal {
        let e = err(&model(vec![node(op, &["x"], &["y"])], vec![], 17));
        assert!(
            e.contains(&format!("ONNX node #0 '{op}_node' ({op}"))
                && e.contains(&format!("op '{op}' is Kiln-internal")),
            "{e}"
        );
    }
    // The model that panicked the importer: a Fused body operand starting with 'é'.
    let mut fused = node("Fused", &["x"], &["y"]);
    fused.attribute.push(attr_strings("body", &["Relu(é)"]));
    let e = err(&model(vec![fused], vec![], 17));
    assert!(
        e.contains("'Fused_node' (Fused") && e.contains("Kiln-internal"),
        "{e}"
    );
}

fn u8_tensor(name: &str, dims: &[i64]) -> proto::TensorProto {
    let n = dims.iter().product::<i64>() as usize;
    proto::TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(2),
        raw_data: Some(vec![1u8; n].into()),
        ..Default::default()
    }
}

/// Nodes whose importer rewrites indexed an operand that a malformed node lacks: each is
/// an error naming the node.
#[test]
fn malformed_rewritten_nodes_are_errors_not_panics() {
    // Opset 7-10 Pad with a value attribute but no inputs and no pads attribute.
    let mut pad = node("Pad", &[], &["y"]);
    pad.attribute.push(attr_float("value", 1.0));
    let e = err(&model(vec![pad], vec![], 10));
    assert!(
        e.contains("'Pad_node' (Pad") && e.contains("input 0 (data) is required"),
        "{e}"
    );
    // DepthToSpace whose blocksize squared overflows.
    let mut d2s = node("DepthToSpace", &["x"], &["y"]);
    d2s.attribute.push(proto::AttributeProto {
        name: Some("blocksize".into()),
        r#type: Some(proto::attribute_proto::AttributeType::Int as i32),
        i: Some(i64::MAX),
        ..Default::default()
    });
    let mut m = model(vec![d2s], vec![], 13);
    m.graph.as_mut().unwrap().input[0] = input("x", FLOAT, &[Ok(1), Ok(4), Ok(2), Ok(2)]);
    let e = err(&m);
    assert!(
        e.contains("'DepthToSpace_node'") && e.contains("too large"),
        "{e}"
    );
    // ConvInteger / MatMulInteger with a rank-0 data operand and a per-axis zero point.
    for (op, ins, inits) in [
        (
            "ConvInteger",
            vec!["x", "w", "", "wz"],
            vec![u8_tensor("w", &[1, 1, 1]), u8_tensor("wz", &[1])],
        ),
        (
            "MatMulInteger",
            vec!["x", "b", "az"],
            vec![u8_tensor("b", &[1]), u8_tensor("az", &[1])],
        ),
    ] {
        let mut m = model(vec![node(op, &ins, &["y"])], inits, 17);
        m.graph.as_mut().unwrap().input[0] = input("x", 2, &[]);
        let e = err(&m);
        // An error naming the node and the rank-0 operand (`f32[]` once X is widened).
        assert!(
            e.contains(&format!("'{op}_node' ({op}")) && (e.contains("rank") || e.contains("[]")),
            "{e}"
        );
    }
}

// ---------------------------------------------------------------- mutation testing

/// Deterministic xorshift64 for the mutations.
use common::{panic_of, Rng};

fn attr_int(name: &str, v: i64) -> proto::AttributeProto {
    proto::AttributeProto {
        name: Some(name.into()),
        r#type: Some(proto::attribute_proto::AttributeType::Int as i32),
        i: Some(v),
        ..Default::default()
    }
}

fn attr_ints(name: &str, v: &[i64]) -> proto::AttributeProto {
    proto::AttributeProto {
        name: Some(name.into()),
        r#type: Some(proto::attribute_proto::AttributeType::Ints as i32),
        ints: v.to_vec(),
        ..Default::default()
    }
}

fn attr_floats(name: &str, v: &[f32]) -> proto::AttributeProto {
    proto::AttributeProto {
        name: Some(name.into()),
        r#type: Some(proto::attribute_proto::AttributeType::Floats as i32),
        floats: v.to_vec(),
        ..Default::default()
    }
}

fn attr_string(name: &str, v: &str) -> proto::AttributeProto {
    proto::AttributeProto {
        name: Some(name.into()),
        r#type: Some(proto::attribute_proto::AttributeType::String as i32),
        s: Some(v.as_bytes().to_vec()),
        ..Default::default()
    }
}

fn attr_tensor(name: &str, t: proto::TensorProto) -> proto::AttributeProto {
    proto::AttributeProto {
        name: Some(name.into()),
        r#type: Some(proto::attribute_proto::AttributeType::Tensor as i32),
        t: Some(t),
        ..Default::default()
    }
}

const UINT8: i32 = 2;
const INT32: i32 = 6;
const INT64: i32 = 7;
const BOOL: i32 = 9;

/// An initializer of ONNX element type `elem` holding `values` (cast to it).
fn init(name: &str, elem: i32, dims: &[i64], values: &[f64]) -> proto::TensorProto {
    let raw: Vec<u8> = values
        .iter()
        .flat_map(|&v| match elem {
            FLOAT => (v as f32).to_le_bytes().to_vec(),
            UINT8 | BOOL => vec![v as u8],
            INT32 => (v as i32).to_le_bytes().to_vec(),
            INT64 => (v as i64).to_le_bytes().to_vec(),
            _ => unreachable!("element type {elem}"),
        })
        .collect();
    proto::TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(elem),
        raw_data: Some(raw.into()),
        ..Default::default()
    }
}

/// `n` values cycling through a small range (enough for weights and indices alike).
fn ramp(n: usize) -> Vec<f64> {
    (0..n).map(|i| (i % 3) as f64).collect()
}

fn n_of(dims: &[i64]) -> usize {
    dims.iter().product::<i64>() as usize
}

/// A one-node model: graph inputs `ins` (name, element type, dims), initializers, the
/// node, and the node's outputs as the graph's outputs; `domains` adds opset imports.
fn one_node(
    opset: i64,
    domains: &[(&str, i64)],
    ins: &[(&str, i32, &[i64])],
    inits: Vec<proto::TensorProto>,
    n: proto::NodeProto,
) -> proto::ModelProto {
    let mut opset_import = vec![proto::OperatorSetIdProto {
        domain: Some(String::new()),
        version: Some(opset),
    }];
    for (d, v) in domains {
        opset_import.push(proto::OperatorSetIdProto {
            domain: Some(d.to_string()),
            version: Some(*v),
        });
    }
    let output = n
        .output
        .iter()
        .map(|o| proto::ValueInfoProto {
            name: Some(o.clone()),
            ..Default::default()
        })
        .collect();
    proto::ModelProto {
        ir_version: Some(8),
        opset_import,
        graph: Some(proto::GraphProto {
            name: Some("seed".into()),
            node: vec![n],
            initializer: inits,
            input: ins
                .iter()
                .map(|(name, elem, dims)| {
                    input(
                        name,
                        *elem,
                        &dims.iter().map(|&d| Ok(d)).collect::<Vec<_>>(),
                    )
                })
                .collect(),
            output,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn with(mut n: proto::NodeProto, attrs: Vec<proto::AttributeProto>) -> proto::NodeProto {
    n.attribute = attrs;
    n
}

fn in_domain(mut n: proto::NodeProto, domain: &str) -> proto::NodeProto {
    n.domain = Some(domain.into());
    n
}

/// One small model per ONNX op that the importer rewrites (older opsets' attribute
/// forms, type codes, `Constant`) or expands into catalogue ops, each importing cleanly.
fn rewritten_op_models() -> Vec<(String, proto::ModelProto)> {
    let x4: &[i64] = &[2, 3, 4, 4];
    let c3 = |name: &str| init(name, FLOAT, &[3], &[1.0, 0.5, 2.0]);
    let u8s = |name: &str, dims: &[i64]| init(name, UINT8, dims, &ramp(n_of(dims)));
    let f32s = |name: &str, dims: &[i64]| init(name, FLOAT, dims, &ramp(n_of(dims)));
    let scalar = |name: &str, elem: i32, v: f64| init(name, elem, &[], &[v]);
    let ml = [("ai.onnx.ml", 3)];
    let training = [("ai.onnx.preview.training", 1)];
    let mut seeds = vec![
        (
            "MeanVarianceNormalization",
            one_node(
                13,
                &[],
                &[("x", FLOAT, x4)],
                vec![],
                node("MeanVarianceNormalization", &["x"], &["y"]),
            ),
        ),
        (
            "BatchNormalization-training",
            one_node(
                15,
                &[],
                &[("x", FLOAT, x4)],
                vec![c3("s"), c3("b"), c3("m"), c3("v")],
                with(
                    node(
                        "BatchNormalization",
                        &["x", "s", "b", "m", "v"],
                        &["y", "rm", "rv"],
                    ),
                    vec![attr_int("training_mode", 1)],
                ),
            ),
        ),
        (
            "BatchNormalization-7",
            one_node(
                7,
                &[],
                &[("x", FLOAT, x4)],
                vec![c3("s"), c3("b"), c3("m"), c3("v")],
                with(
                    node("BatchNormalization", &["x", "s", "b", "m", "v"], &["y"]),
                    vec![attr_int("spatial", 1)],
                ),
            ),
        ),
        (
            "GroupNormalization",
            one_node(
                18,
                &[],
                &[("x", FLOAT, &[2, 4, 3, 3])],
                vec![f32s("s", &[2]), f32s("b", &[2])],
                with(
                    node("GroupNormalization", &["x", "s", "b"], &["y"]),
                    vec![attr_int("num_groups", 2)],
                ),
            ),
        ),
        (
            "DepthToSpace",
            one_node(
                13,
                &[],
                &[("x", FLOAT, &[1, 8, 2, 2])],
                vec![],
                with(
                    node("DepthToSpace", &["x"], &["y"]),
                    vec![attr_int("blocksize", 2), attr_string("mode", "CRD")],
                ),
            ),
        ),
        (
            "SpaceToDepth",
            one_node(
                13,
                &[],
                &[("x", FLOAT, &[1, 2, 4, 4])],
                vec![],
                with(
                    node("SpaceToDepth", &["x"], &["y"]),
                    vec![attr_int("blocksize", 2)],
                ),
            ),
        ),
        (
            "Compress",
            one_node(
                11,
                &[],
                &[("x", FLOAT, &[3, 2])],
                vec![init("c", BOOL, &[3], &[1.0, 0.0, 1.0])],
                with(
                    node("Compress", &["x", "c"], &["y"]),
                    vec![attr_int("axis", 0)],
                ),
            ),
        ),
        (
            "EyeLike",
            one_node(
                9,
                &[],
                &[("x", FLOAT, &[3, 4])],
                vec![],
                with(node("EyeLike", &["x"], &["y"]), vec![attr_int("k", 1)]),
            ),
        ),
        (
            "ConvInteger",
            one_node(
                10,
                &[],
                &[("x", UINT8, &[1, 1, 4, 4])],
                vec![
                    u8s("w", &[2, 1, 3, 3]),
                    scalar("xz", UINT8, 1.0),
                    u8s("wz", &[2]),
                ],
                node("ConvInteger", &["x", "w", "xz", "wz"], &["y"]),
            ),
        ),
        (
            "MatMulInteger",
            one_node(
                10,
                &[],
                &[("a", UINT8, &[2, 3])],
                vec![u8s("b", &[3, 4]), u8s("az", &[2]), u8s("bz", &[4])],
                node("MatMulInteger", &["a", "b", "az", "bz"], &["y"]),
            ),
        ),
        (
            "QLinearConv",
            one_node(
                10,
                &[],
                &[("x", UINT8, &[1, 1, 4, 4])],
                vec![
                    scalar("xs", FLOAT, 0.5),
                    scalar("xz", UINT8, 1.0),
                    u8s("w", &[2, 1, 3, 3]),
                    f32s("ws", &[2]),
                    u8s("wz", &[2]),
                    scalar("ys", FLOAT, 0.25),
                    scalar("yz", UINT8, 3.0),
                    init("b", INT32, &[2], &[1.0, -1.0]),
                ],
                node(
                    "QLinearConv",
                    &["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"],
                    &["y"],
                ),
            ),
        ),
        (
            "QLinearMatMul",
            one_node(
                10,
                &[],
                &[("a", UINT8, &[2, 3])],
                vec![
                    scalar("as", FLOAT, 0.5),
                    scalar("az", UINT8, 1.0),
                    u8s("b", &[3, 4]),
                    scalar("bs", FLOAT, 0.5),
                    scalar("bz", UINT8, 2.0),
                    scalar("ys", FLOAT, 0.25),
                    scalar("yz", UINT8, 3.0),
                ],
                node(
                    "QLinearMatMul",
                    &["a", "as", "az", "b", "bs", "bz", "ys", "yz"],
                    &["y"],
                ),
            ),
        ),
        (
            "Swish",
            one_node(
                24,
                &[],
                &[("x", FLOAT, &[2, 3])],
                vec![],
                node("Swish", &["x"], &["y"]),
            ),
        ),
        (
            "Upsample-7",
            one_node(
                7,
                &[],
                &[("x", FLOAT, &[1, 1, 2, 2])],
                vec![],
                with(
                    node("Upsample", &["x"], &["y"]),
                    vec![attr_floats("scales", &[1.0, 1.0, 2.0, 2.0])],
                ),
            ),
        ),
        (
            "Resize-10",
            one_node(
                10,
                &[],
                &[("x", FLOAT, &[1, 1, 2, 2])],
                vec![init("sc", FLOAT, &[4], &[1.0, 1.0, 2.0, 3.0])],
                node("Resize", &["x", "sc"], &["y"]),
            ),
        ),
        (
            "Constant",
            one_node(
                13,
                &[],
                &[],
                vec![],
                with(
                    node("Constant", &[], &["y"]),
                    vec![attr_tensor("value", f32s("v", &[2, 2]))],
                ),
            ),
        ),
        (
            "Constant-floats",
            one_node(
                13,
                &[],
                &[],
                vec![],
                with(
                    node("Constant", &[], &["y"]),
                    vec![attr_floats("value_floats", &[1.0, 2.0])],
                ),
            ),
        ),
        (
            "QuantizeLinear",
            one_node(
                21,
                &[],
                &[("x", FLOAT, &[4])],
                vec![scalar("s", FLOAT, 0.5), scalar("z", UINT8, 2.0)],
                with(
                    node("QuantizeLinear", &["x", "s", "z"], &["y"]),
                    vec![attr_int("output_dtype", 0)],
                ),
            ),
        ),
        (
            "DequantizeLinear",
            one_node(
                13,
                &[],
                &[("x", UINT8, &[4])],
                vec![scalar("s", FLOAT, 0.5), scalar("z", UINT8, 2.0)],
                node("DequantizeLinear", &["x", "s", "z"], &["y"]),
            ),
        ),
        (
            "HannWindow",
            one_node(
                17,
                &[],
                &[],
                vec![scalar("n", INT64, 8.0)],
                with(
                    node("HannWindow", &["n"], &["y"]),
                    vec![attr_int("output_datatype", 1)],
                ),
            ),
        ),
        (
            "Cast",
            one_node(
                13,
                &[],
                &[("x", FLOAT, &[2, 3])],
                vec![],
                with(
                    node("Cast", &["x"], &["y"]),
                    vec![attr_int("to", INT64 as i64)],
                ),
            ),
        ),
        (
            "ConstantOfShape",
            one_node(
                9,
                &[],
                &[],
                vec![init("sh", INT64, &[2], &[2.0, 3.0])],
                with(
                    node("ConstantOfShape", &["sh"], &["y"]),
                    vec![attr_tensor("value", init("v", FLOAT, &[1], &[1.5]))],
                ),
            ),
        ),
        (
            "Dropout-10",
            one_node(
                10,
                &[],
                &[("x", FLOAT, &[2, 3])],
                vec![],
                with(
                    node("Dropout", &["x"], &["y"]),
                    vec![proto::AttributeProto {
                        name: Some("ratio".into()),
                        r#type: Some(proto::attribute_proto::AttributeType::Float as i32),
                        f: Some(0.25),
                        ..Default::default()
                    }],
                ),
            ),
        ),
        (
            "ReduceSum-11",
            one_node(
                11,
                &[],
                &[("x", FLOAT, &[2, 3, 4])],
                vec![],
                with(
                    node("ReduceSum", &["x"], &["y"]),
                    vec![attr_ints("axes", &[1]), attr_int("keepdims", 0)],
                ),
            ),
        ),
        (
            "ReduceMean-13",
            one_node(
                13,
                &[],
                &[("x", FLOAT, &[2, 3, 4])],
                vec![],
                with(
                    node("ReduceMean", &["x"], &["y"]),
                    vec![attr_ints("axes", &[-1])],
                ),
            ),
        ),
        (
            "Squeeze-11",
            one_node(
                11,
                &[],
                &[("x", FLOAT, &[1, 3, 1])],
                vec![],
                with(
                    node("Squeeze", &["x"], &["y"]),
                    vec![attr_ints("axes", &[0, 2])],
                ),
            ),
        ),
        (
            "Unsqueeze-11",
            one_node(
                11,
                &[],
                &[("x", FLOAT, &[3])],
                vec![],
                with(
                    node("Unsqueeze", &["x"], &["y"]),
                    vec![attr_ints("axes", &[0])],
                ),
            ),
        ),
        (
            "Split-11",
            one_node(
                11,
                &[],
                &[("x", FLOAT, &[4, 2])],
                vec![],
                with(
                    node("Split", &["x"], &["y0", "y1"]),
                    vec![attr_ints("split", &[1, 3]), attr_int("axis", 0)],
                ),
            ),
        ),
        (
            "Split-13",
            one_node(
                13,
                &[],
                &[("x", FLOAT, &[4, 2])],
                vec![],
                node("Split", &["x"], &["y0", "y1"]),
            ),
        ),
        (
            "Slice-9",
            one_node(
                9,
                &[],
                &[("x", FLOAT, &[4, 5])],
                vec![],
                with(
                    node("Slice", &["x"], &["y"]),
                    vec![
                        attr_ints("starts", &[1, 0]),
                        attr_ints("ends", &[3, 4]),
                        attr_ints("axes", &[0, 1]),
                    ],
                ),
            ),
        ),
        (
            "Pad-10",
            one_node(
                10,
                &[],
                &[("x", FLOAT, &[2, 3])],
                vec![],
                with(
                    node("Pad", &["x"], &["y"]),
                    vec![
                        attr_ints("pads", &[1, 0, 0, 2]),
                        proto::AttributeProto {
                            name: Some("value".into()),
                            r#type: Some(proto::attribute_proto::AttributeType::Float as i32),
                            f: Some(1.5),
                            ..Default::default()
                        },
                    ],
                ),
            ),
        ),
        (
            "Clip-10",
            one_node(
                10,
                &[],
                &[("x", FLOAT, &[2, 3])],
                vec![],
                with(
                    node("Clip", &["x"], &["y"]),
                    vec![proto::AttributeProto {
                        name: Some("min".into()),
                        r#type: Some(proto::attribute_proto::AttributeType::Float as i32),
                        f: Some(-0.5),
                        ..Default::default()
                    }],
                ),
            ),
        ),
        (
            "DFT-17",
            one_node(
                17,
                &[],
                &[("x", FLOAT, &[1, 8, 1])],
                vec![],
                with(node("DFT", &["x"], &["y"]), vec![attr_int("axis", 1)]),
            ),
        ),
        (
            "GridSample-16",
            one_node(
                16,
                &[],
                &[("x", FLOAT, &[1, 1, 4, 4])],
                vec![init(
                    "grid",
                    FLOAT,
                    &[1, 2, 2, 2],
                    &[0.1, -0.2, 0.3, 0.4, -0.5, 0.6, 0.7, -0.8],
                )],
                with(
                    node("GridSample", &["x", "grid"], &["y"]),
                    vec![attr_string("mode", "bilinear")],
                ),
            ),
        ),
        (
            "TopK-9",
            one_node(
                9,
                &[],
                &[("x", FLOAT, &[2, 5])],
                vec![],
                with(node("TopK", &["x"], &["v", "i"]), vec![attr_int("k", 2)]),
            ),
        ),
        (
            "Softmax-11",
            one_node(
                11,
                &[],
                &[("x", FLOAT, &[2, 3, 4])],
                vec![],
                with(node("Softmax", &["x"], &["y"]), vec![attr_int("axis", 1)]),
            ),
        ),
        (
            "LogSoftmax-11",
            one_node(
                11,
                &[],
                &[("x", FLOAT, &[2, 3, 4])],
                vec![],
                node("LogSoftmax", &["x"], &["y"]),
            ),
        ),
        (
            "Hardmax-11",
            one_node(
                11,
                &[],
                &[("x", FLOAT, &[2, 3, 4])],
                vec![],
                with(node("Hardmax", &["x"], &["y"]), vec![attr_int("axis", 2)]),
            ),
        ),
        (
            "Scatter-10",
            one_node(
                10,
                &[],
                &[("x", FLOAT, &[3, 3])],
                vec![
                    init("i", INT64, &[1, 3], &[1.0, 0.0, 2.0]),
                    f32s("u", &[1, 3]),
                ],
                with(
                    node("Scatter", &["x", "i", "u"], &["y"]),
                    vec![attr_int("axis", 0)],
                ),
            ),
        ),
        (
            "Shape-15",
            one_node(
                15,
                &[],
                &[("x", FLOAT, &[2, 3, 4])],
                vec![],
                with(
                    node("Shape", &["x"], &["y"]),
                    vec![attr_int("start", 1), attr_int("end", -1)],
                ),
            ),
        ),
        (
            "Binarizer",
            one_node(
                17,
                &ml,
                &[("x", FLOAT, &[2, 3])],
                vec![],
                in_domain(node("Binarizer", &["x"], &["y"]), "ai.onnx.ml"),
            ),
        ),
        (
            "ArrayFeatureExtractor",
            one_node(
                17,
                &ml,
                &[("x", FLOAT, &[2, 3])],
                vec![init("i", INT64, &[2], &[0.0, 2.0])],
                in_domain(
                    node("ArrayFeatureExtractor", &["x", "i"], &["y"]),
                    "ai.onnx.ml",
                ),
            ),
        ),
        (
            "Adagrad",
            one_node(
                17,
                &training,
                &[("x", FLOAT, &[3])],
                vec![
                    scalar("r", FLOAT, 0.1),
                    scalar("t", INT64, 1.0),
                    c3("g"),
                    c3("h"),
                ],
                in_domain(
                    node("Adagrad", &["r", "t", "x", "g", "h"], &["x2", "h2"]),
                    "ai.onnx.preview.training",
                ),
            ),
        ),
        (
            "Momentum",
            one_node(
                17,
                &training,
                &[("x", FLOAT, &[3])],
                vec![
                    scalar("r", FLOAT, 0.1),
                    scalar("t", INT64, 1.0),
                    c3("g"),
                    c3("v"),
                ],
                in_domain(
                    with(
                        node("Momentum", &["r", "t", "x", "g", "v"], &["x2", "v2"]),
                        vec![
                            proto::AttributeProto {
                                name: Some("alpha".into()),
                                r#type: Some(proto::attribute_proto::AttributeType::Float as i32),
                                f: Some(0.9),
                                ..Default::default()
                            },
                            proto::AttributeProto {
                                name: Some("beta".into()),
                                r#type: Some(proto::attribute_proto::AttributeType::Float as i32),
                                f: Some(1.0),
                                ..Default::default()
                            },
                            attr_string("mode", "standard"),
                            proto::AttributeProto {
                                name: Some("norm_coefficient".into()),
                                r#type: Some(proto::attribute_proto::AttributeType::Float as i32),
                                f: Some(0.0),
                                ..Default::default()
                            },
                        ],
                    ),
                    "ai.onnx.preview.training",
                ),
            ),
        ),
        (
            "Adam",
            one_node(
                17,
                &training,
                &[("x", FLOAT, &[3])],
                vec![
                    scalar("r", FLOAT, 0.1),
                    scalar("t", INT64, 1.0),
                    c3("g"),
                    c3("v"),
                    c3("h"),
                ],
                in_domain(
                    node("Adam", &["r", "t", "x", "g", "v", "h"], &["x2", "v2", "h2"]),
                    "ai.onnx.preview.training",
                ),
            ),
        ),
    ];
    seeds.push(("Mul-Relu", good()));
    seeds
        .into_iter()
        .map(|(name, m)| (name.to_string(), m))
        .collect()
}

/// Values a mutated int attribute or dim takes: the edges of every range.
const EDGE_INTS: [i64; 10] = [0, 1, -1, 2, -2, 7, 1 << 31, 1 << 40, i64::MAX, i64::MIN];

/// One structured mutation of `m` (or a few raw byte edits of its encoding); returns
/// what it did, for the failure message.
fn mutate(m: &mut proto::ModelProto, bytes: &mut Option<Vec<u8>>, rng: &mut Rng) -> String {
    let g = m.graph.get_or_insert_with(Default::default);
    let names: Vec<String> = g
        .input
        .iter()
        .map(|i| i.name().to_string())
        .chain(g.initializer.iter().map(|t| t.name().to_string()))
        .chain(g.node.iter().flat_map(|n| n.output.clone()))
        .collect();
    match rng.below(12) {
        0 | 1 => {
            let Some(n) = g.node.first_mut() else {
                return "no node".into();
            };
            if n.attribute.is_empty() {
                return "no attribute".into();
            }
            let k = rng.below(n.attribute.len());
            let a = &mut n.attribute[k];
            let v = *rng.pick(&EDGE_INTS);
            a.i = Some(v);
            a.f = Some(*rng.pick(&[0.0, -1.0, f32::NAN, f32::INFINITY, 1e30]));
            if !a.ints.is_empty() {
                let j = rng.below(a.ints.len());
                a.ints[j] = v;
            }
            if rng.below(3) == 0 {
                a.ints.push(v);
            }
            format!("attribute {} = {v}", a.name())
        }
        2 => {
            let Some(n) = g.node.first_mut() else {
                return "no node".into();
            };
            if n.attribute.is_empty() {
                return "no attribute".into();
            }
            let k = rng.below(n.attribute.len());
            format!("removed attribute {}", n.attribute.remove(k).name())
        }
        3 => {
            let Some(n) = g.node.first_mut() else {
                return "no node".into();
            };
            if n.input.is_empty() {
                return "no input".into();
            }
            let k = rng.below(n.input.len());
            match rng.below(3) {
                0 => n.input[k] = String::new(),
                1 => {
                    n.input.truncate(k);
                }
                _ => n.input[k] = rng.pick(&names).clone(),
            }
            format!("inputs {:?}", n.input)
        }
        4 => {
            let Some(n) = g.node.first_mut() else {
                return "no node".into();
            };
            n.input.push(rng.pick(&names).clone());
            if rng.below(2) == 0 {
                n.output.push("extra".into());
            }
            format!("inputs {:?}, outputs {:?}", n.input, n.output)
        }
        5 => {
            let Some(i) = g.input.first_mut() else {
                return "no input".into();
            };
            let Some(proto::type_proto::Value::TensorType(t)) =
                i.r#type.as_mut().and_then(|t| t.value.as_mut())
            else {
                return "no tensor type".into();
            };
            let dims = &mut t.shape.get_or_insert_with(Default::default).dim;
            match rng.below(3) {
                0 if !dims.is_empty() => {
                    let k = rng.below(dims.len());
                    dims[k].value = Some(dimension::Value::DimValue(*rng.pick(&EDGE_INTS)));
                }
                1 if !dims.is_empty() => {
                    dims.pop();
                }
                _ => dims.push(Dimension {
                    value: Some(dimension::Value::DimValue(*rng.pick(&[1, 2, 3]))),
                    ..Default::default()
                }),
            }
            format!(
                "input dims {:?}",
                dims.iter().map(|d| &d.value).collect::<Vec<_>>()
            )
        }
        6 => {
            let elem = rng.below(26) as i32;
            if let Some(Some(proto::type_proto::Value::TensorType(t))) = g
                .input
                .first_mut()
                .map(|i| i.r#type.as_mut().and_then(|t| t.value.as_mut()))
            {
                t.elem_type = Some(elem);
            }
            format!("input element type {elem}")
        }
        7 => {
            let Some(t) = g.initializer.first_mut() else {
                return "no initializer".into();
            };
            match rng.below(3) {
                0 => t.dims = vec![],
                1 => t.dims.push(*rng.pick(&[0, 1, 2, 1 << 40])),
                _ => t.data_type = Some(rng.below(20) as i32),
            }
            format!(
                "initializer {} dims {:?} type {:?}",
                t.name(),
                t.dims,
                t.data_type
            )
        }
        8 => {
            let v = rng.below(31) as i64;
            m.opset_import[0].version = Some(v);
            format!("opset {v}")
        }
        9 => {
            let Some(n) = g.node.first_mut() else {
                return "no node".into();
            };
            let op = *rng.pick(&[
                "Conv",
                "MatMul",
                "Gemm",
                "Pad",
                "Slice",
                "Reshape",
                "Gather",
                "Resize",
                "Softmax",
                "TopK",
                "Split",
                "Concat",
                "Einsum",
                "MaxPool",
                "LSTM",
                "Where",
                "Expand",
                "Tile",
                "Transpose",
                "CumSum",
                "OneHot",
                "NonZero",
                "Unique",
                "ScatterND",
                "GatherND",
                "DFT",
                "STFT",
                "Attention",
                "RotaryEmbedding",
                "ConvTranspose",
                "LpPool",
                "Range",
                "Trilu",
                "ReverseSequence",
                "CenterCropPad",
                "NonMaxSuppression",
                "RNN",
                "GRU",
                "LayerNormalization",
                "Det",
                "Mod",
            ]);
            n.op_type = Some(op.into());
            n.domain = None;
            format!("op_type {op}")
        }
        _ => {
            let b = bytes.get_or_insert_with(|| m.encode_to_vec());
            let mut did = vec![];
            for _ in 0..1 + rng.below(4) {
                let i = rng.below(b.len());
                match rng.below(3) {
                    0 => b[i] = rng.below(256) as u8,
                    1 => b.truncate(i.max(1)),
                    _ => b.insert(i, rng.below(256) as u8),
                }
                did.push(i);
            }
            format!("bytes edited at {did:?}")
        }
    }
}

/// What every mutant goes through: import (or parse), verify, the pass pipeline and a
/// CPU compile. Errors are fine; only a panic is a failure.
fn through_the_compiler(g: kiln::Result<kiln::ir::Graph>) {
    let Ok(g) = g else { return };
    if kiln::ir::verify(&g).is_err() {
        return;
    }
    let mut optimized = g.clone();
    let _ = kiln::passes::run_pipeline(&mut optimized, &kiln::passes::CompileOptions::default());
    let cpu = kiln::backend::backend_with(
        kiln::backend::Device::Cpu,
        kiln::passes::CompileOptions {
            threads: 1,
            ..Default::default()
        },
    )
    .unwrap();
    let _ = cpu.compile(&g);
}

/// The repository's real models (`target/real-models/*/model.onnx`, made by
/// `scripts/test-onnx-models.sh`); absent, the test skips them through
/// `common::require` (`KILN_REQUIRE=onnx-suite` makes that a failure).
fn real_models() -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/real-models");
    let found = common::exists(&dir, "scripts/test-onnx-models.sh")
        .map_err(|why| format!("{why}: the mutation test skips the real models"));
    if !common::require(common::Need::OnnxSuite, found) {
        return vec![];
    }
    let Ok(entries) = std::fs::read_dir(&dir) else {
        panic!("{} cannot be read", dir.display());
    };
    let mut models: Vec<(String, Vec<u8>)> = entries
        .filter_map(|e| {
            let p = e.ok()?.path().join("model.onnx");
            let bytes = std::fs::read(&p).ok()?;
            Some((p.display().to_string(), bytes))
        })
        .collect();
    models.sort();
    models
}

/// Bounded, deterministic mutation testing of everything that reads a model: every
/// model of the corpus (the real models, one model per ONNX op the importer rewrites or
/// expands, `examples/data/*.onnx`) is mutated structurally and byte-wise, and each
/// mutant goes through import, verify, the pass pipeline and a CPU compile; a panic
/// anywhere fails the test naming the seed model and the mutation. (`fuzz/` has the
/// unbounded cargo-fuzz targets; `tests/ir.rs` does the same for `.kir` graphs.)
/// `com.example::ScaledSwish` (what `examples/data/swish_mlp.onnx` uses):
/// `x * sigmoid(beta * x)`.
struct ScaledSwish;

const SCALED_SWISH: kiln::ir::ops::OpSchema = kiln::ir::ops::OpSchema {
    name: "com.example::ScaledSwish",
    family: "custom",
    inputs: &["x"],
    outputs: &["y"],
    attrs: &[],
    doc: "x * sigmoid(beta * x)",
    in_place: kiln::ir::ops::InPlace::No,
    origin: kiln::ir::ops::Origin::Onnx,
};

impl kiln::ir::ops::Op for ScaledSwish {
    fn schema(&self) -> &kiln::ir::ops::OpSchema {
        &SCALED_SWISH
    }
    fn validate_attrs(&self, attrs: &kiln::ir::Attrs) -> Result<(), String> {
        attrs.float_or("beta", 1.0).map(|_| ())
    }
    fn infer(&self, cx: &kiln::ir::ops::InferCtx<'_>) -> Result<Vec<kiln::ir::TensorType>, String> {
        Ok(vec![cx.input(0)?.clone()])
    }
    fn eval(&self, cx: &kiln::ir::ops::EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let beta = cx.attrs.float_or("beta", 1.0)?;
        let x = cx.input(0)?;
        let v: Vec<f64> = x
            .to_f64_vec()
            .iter()
            .map(|&x| x / (1.0 + (-beta * x).exp()))
            .collect();
        Ok(vec![Tensor::from_f64s(x.dtype(), x.shape(), &v)?])
    }
}

#[test]
fn mutated_models_never_panic() {
    const MUTANTS_PER_SEED: usize = 150;
    // The real models are large (ResNet-50, a BERT encoder): each of their mutants costs
    // a whole-model compile, so they get fewer, keeping the test within a minute or two.
    const MUTANTS_PER_REAL_MODEL: usize = 12;
    // The examples' custom-domain model imports only with its op registered.
    kiln::ir::ops::custom::register(std::sync::Arc::new(ScaledSwish)).unwrap();
    let mut seeds: Vec<(String, proto::ModelProto)> = rewritten_op_models();
    for (name, m) in &seeds {
        if let Err(e) = import_bytes(&m.encode_to_vec(), None) {
            panic!("seed {name} does not import: {e}");
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<(String, Vec<u8>)> = real_models();
    // The examples, and the test fixtures (among them a model with If, Loop and Scan).
    for dir in ["examples/data", "tests/onnx"] {
        let mut found: Vec<_> = std::fs::read_dir(root.join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "onnx"))
            .collect();
        found.sort();
        for p in found {
            files.push((p.display().to_string(), std::fs::read(&p).unwrap()));
        }
    }
    for (name, bytes) in files {
        let m = proto::ModelProto::decode(bytes.as_slice())
            .unwrap_or_else(|e| panic!("{name} is not an ONNX model: {e}"));
        if let Err(e) = import_bytes(&bytes, None) {
            panic!("seed {name} does not import: {e}");
        }
        seeds.push((name, m));
    }
    // Two workers over the seeds (the test is the suite's longest); each seed has a
    // generator of its own, so its mutants do not depend on the split.
    let mutate_seed = |i: usize, name: &str, seed: &proto::ModelProto| {
        let mut rng = Rng(0x2545_F491_4F6C_DD1D ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let count = if name.contains("real-models") {
            MUTANTS_PER_REAL_MODEL
        } else {
            MUTANTS_PER_SEED
        };
        let mut panics = vec![];
        for k in 0..count {
            let mut m = seed.clone();
            let mut bytes = None;
            let did: Vec<String> = (0..1 + rng.below(3))
                .map(|_| mutate(&mut m, &mut bytes, &mut rng))
                .collect();
            let bytes = bytes.unwrap_or_else(|| m.encode_to_vec());
            if let Some(p) = panic_of(|| through_the_compiler(import_bytes(&bytes, None))) {
                panics.push(format!("{name} mutant {k} ({}): {p}", did.join("; ")));
            }
        }
        (count, panics)
    };
    let per_seed: Vec<(usize, Vec<String>)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|w| {
                let (seeds, mutate_seed) = (&seeds, &mutate_seed);
                s.spawn(move || {
                    (w..seeds.len())
                        .step_by(2)
                        .map(|i| (i, mutate_seed(i, &seeds[i].0, &seeds[i].1)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all: Vec<_> = workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect();
        all.sort_by_key(|(i, _)| *i);
        all.into_iter().map(|(_, r)| r).collect()
    });
    let mut mutants: usize = per_seed.iter().map(|(n, _)| n).sum();
    let mut panics: Vec<String> = per_seed.into_iter().flat_map(|(_, p)| p).collect();
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let onnx_models = seeds.len();
    let mut graphs = vec![];
    for dir in ["tests/graphs", "examples/graphs"] {
        for e in std::fs::read_dir(root.join(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "kir") {
                graphs.push(p);
            }
        }
    }
    graphs.sort();
    for path in &graphs {
        let text: Vec<char> = std::fs::read_to_string(path).unwrap().chars().collect();
        for k in 0..MUTANTS_PER_SEED {
            let mut t = text.clone();
            let did: Vec<String> = (0..1 + rng.below(3))
                .map(|_| mutate_text(&mut t, &mut rng))
                .collect();
            let t: String = t.into_iter().collect();
            mutants += 1;
            let parsed = || kiln::ir::text::parse(&t, "mutant.kir", path.parent());
            if let Some(p) = panic_of(|| through_the_compiler(parsed())) {
                panics.push(format!(
                    "{} mutant {k} ({}): {p}",
                    path.display(),
                    did.join("; ")
                ));
            }
        }
    }
    println!(
        "{mutants} mutants of {onnx_models} ONNX models and {} .kir graphs",
        graphs.len()
    );
    assert!(
        panics.is_empty(),
        "{} panics:\n{}",
        panics.len(),
        panics.join("\n")
    );
}

/// One edit of `.kir` text: a token of the grammar inserted, a span deleted or
/// repeated, or a number changed to an edge value.
fn mutate_text(t: &mut Vec<char>, rng: &mut Rng) -> String {
    let i = rng.below(t.len());
    match rng.below(4) {
        0 => {
            let tok = *rng.pick(&[
                "%0",
                "%9",
                ":1",
                ",",
                "[",
                "]",
                "(",
                ")",
                "{",
                "}",
                "=",
                ":",
                "_",
                "\"",
                "-1",
                "0",
                "99999999999999999999",
                "4294967296",
                "f64",
                "i8",
                "bool",
                "N",
                "é",
                "Fused",
                "ints[]",
                " after(%1)",
                "external(\"x\", 0, 4)",
            ]);
            t.splice(i..i, tok.chars());
            format!("inserted {tok:?} at {i}")
        }
        1 => {
            let n = 1 + rng.below(8);
            let end = (i + n).min(t.len());
            t.drain(i..end);
            format!("deleted {i}..{end}")
        }
        2 => {
            let end = (i + 1 + rng.below(30)).min(t.len());
            let span: Vec<char> = t[i..end].to_vec();
            t.splice(i..i, span);
            format!("repeated {i}..{end}")
        }
        _ => match t.iter().skip(i).position(|c| c.is_ascii_digit()) {
            Some(d) => {
                let at = i + d;
                let v = *rng.pick(&["0", "-1", "65536", "9223372036854775807", "1e308"]);
                t.splice(at..at + 1, v.chars());
                format!("number at {at} to {v}")
            }
            None => "no number".into(),
        },
    }
}

/// Nodes out of topological order import as onnxruntime sorts them; a real cycle is an
/// error naming its nodes.
#[test]
fn unsorted_nodes_are_sorted_and_cycles_named() {
    let sorted = good();
    let mut unsorted = good();
    unsorted.graph.as_mut().unwrap().node.reverse();
    let x = Tensor::from_vec(&[2, 3], vec![1.0f32, -1.0, 2.0, 0.5, 3.0, -4.0]).unwrap();
    let run = |m: &proto::ModelProto| {
        let g = import_bytes(&m.encode_to_vec(), None).unwrap();
        let [interp, cpu] = run_interp_and_cpu(&g, std::slice::from_ref(&x));
        (interp.unwrap(), cpu.unwrap(), kiln::ir::text::print(&g))
    };
    let (want, _, want_text) = run(&sorted);
    let (got, got_cpu, got_text) = run(&unsorted);
    assert_eq!(got, want);
    assert_eq!(got_cpu, want);
    assert_eq!(got_text, want_text, "a sorted import is the same graph");

    let cyclic = model(
        vec![
            node("Mul", &["x", "b"], &["a"]),
            node("Relu", &["a"], &["b"]),
            node("Identity", &["b"], &["y"]),
        ],
        vec![],
        17,
    );
    let e = err(&cyclic);
    assert!(
        e.contains("cycle") && e.contains("'Mul_node' (Mul)") && e.contains("'Relu_node' (Relu)"),
        "{e}"
    );
}

/// A one-element 1-D scale is per-tensor whatever `axis` says, as onnxruntime reads it
/// (onnxruntime's quantizer writes such bias scales with `axis` set).
#[test]
fn one_element_scales_are_per_tensor_whatever_the_axis() {
    let dq = with(
        node("DequantizeLinear", &["q", "s", "z"], &["y"]),
        vec![attr_int("axis", 1)],
    );
    let m = one_node(
        21,
        &[],
        &[("q", INT32, &[4])],
        vec![
            init("s", FLOAT, &[1], &[0.5]),
            init("z", INT32, &[1], &[2.0]),
        ],
        dq,
    );
    let g = import_bytes(&m.encode_to_vec(), None).unwrap();
    let q = Tensor::from_vec(&[4], vec![0i32, 2, 5, -4]).unwrap();
    let want = Tensor::from_vec(&[4], vec![-1.0f32, 0.0, 1.5, -3.0]).unwrap();
    for got in run_interp_and_cpu(&g, &[q]) {
        assert_eq!(got.unwrap(), vec![want.clone()]);
    }
}

/// What onnxruntime accepts and Kiln does too: an opset domain imported but unused, and a
/// declared output shape other than the computed one (the computed one wins).
#[test]
fn unused_domains_and_stale_output_shapes_import() {
    let mut m = good();
    m.opset_import.push(proto::OperatorSetIdProto {
        domain: Some("com.example.unused".into()),
        version: Some(3),
    });
    let graph = m.graph.as_mut().unwrap();
    graph.output = vec![input("y", FLOAT, &[Ok(7), Ok(9), Ok(1)])];
    let g = import_bytes(&m.encode_to_vec(), None).unwrap();
    let y = g.value_type(g.outputs()[0].value).unwrap();
    assert_eq!(y.to_string(), "f32[N, 3]");
}
