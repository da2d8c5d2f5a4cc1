//! `ai.onnx.ml` and string models against onnxruntime, on `interp` and `cpu`: the tree
//! ensembles of `tests/onnx/trees` (scikit-learn models exported by skl2onnx and
//! hand-written ones) and the string ops of `tests/onnx/strings`, with onnxruntime's
//! outputs (`scripts/make-ml-fixtures.py` writes both); labels and strings exact, scores
//! within 1e-5. And bad models: each a clear error naming the node.
use crate::common;

use std::path::{Path, PathBuf};

use kiln::backend::{backend_for, Device};
use kiln::frontend::onnx::{self, proto};
use kiln::Tensor;
use prost::Message;

fn cases(folder: &str) -> Vec<PathBuf> {
    let dir = common::root().join("tests/onnx").join(folder);
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.join("model.onnx").exists())
        .collect();
    cases.sort();
    cases
}

fn read_all(set: &Path, kind: &str) -> Vec<Tensor> {
    (0..)
        .map(|i| set.join(format!("{kind}_{i}.pb")))
        .take_while(|p| p.exists())
        .map(|p| onnx::read_tensor_pb(&std::fs::read(&p).expect("read")).expect("a tensor"))
        .collect()
}

/// Runs a case on `device`; the error says which output differs and how.
fn run_case(case: &Path, device: Device) -> Result<(), String> {
    let graph = onnx::import_file(&case.join("model.onnx")).map_err(|e| format!("import: {e}"))?;
    let exe = backend_for(device)
        .and_then(|b| b.compile(&graph))
        .map_err(|e| format!("compile: {e}"))?;
    let set = case.join("test_data_set_0");
    let got = exe
        .run(&read_all(&set, "input"))
        .map_err(|e| format!("run: {e}"))?;
    let want = read_all(&set, "output");
    if got.len() != want.len() {
        return Err(format!("{} outputs, expected {}", got.len(), want.len()));
    }
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        // Labels are integers a unit apart at least, so this is exact for them; scores
        // are within 1e-5 (and 1e-6 relative: onnxruntime sums large ones in f32).
        g.check_close(w, 1e-5, 1e-6)
            .map_err(|e| format!("output {i}: {e}"))?;
    }
    Ok(())
}

/// Every case of `folder` (at least `min` of them) on both CPU-side backends.
fn agree_with_onnxruntime(folder: &str, min: usize) {
    let cases = cases(folder);
    assert!(cases.len() >= min, "only {} cases in {folder}", cases.len());
    let mut failures = vec![];
    for case in &cases {
        for device in [Device::Interp, Device::Cpu] {
            if let Err(e) = run_case(case, device) {
                failures.push(format!("{} on {device:?}: {e}", case.display()));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn tree_ensembles_agree_with_onnxruntime() {
    agree_with_onnxruntime("trees", 30);
}

#[test]
fn string_ops_agree_with_onnxruntime() {
    agree_with_onnxruntime("strings", 10);
}

/// A fixture's model with `edit` applied to its one tree-ensemble node.
fn edited(case: &str, edit: impl FnOnce(&mut proto::NodeProto)) -> Vec<u8> {
    let path = common::root()
        .join("tests/onnx/trees")
        .join(case)
        .join("model.onnx");
    let mut model = proto::ModelProto::decode(&*std::fs::read(path).expect("read")).expect("model");
    let graph = model.graph.as_mut().expect("a graph");
    let node = graph
        .node
        .iter_mut()
        .find(|n| n.op_type().starts_with("TreeEnsemble"))
        .expect("a tree ensemble node");
    node.name = Some("the_trees".into());
    edit(node);
    model.encode_to_vec()
}

fn attr<'a>(node: &'a mut proto::NodeProto, name: &str) -> &'a mut proto::AttributeProto {
    node.attribute
        .iter_mut()
        .find(|a| a.name() == name)
        .unwrap_or_else(|| panic!("no attribute {name}"))
}

fn import_error(bytes: &[u8]) -> String {
    match onnx::import_bytes(bytes, None) {
        Ok(_) => panic!("the bad model imported"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_tree_ensembles_are_errors_naming_the_node() {
    let out_of_range = edited("dt_regressor", |n| {
        attr(n, "nodes_truenodeids").ints[0] = 9999;
    });
    let e = import_error(&out_of_range);
    assert!(e.contains("the_trees") && e.contains("no node 9999"), "{e}");

    let bad_mode = edited("regressor_branch_leq_sum", |n| {
        attr(n, "nodes_modes").strings[0] = b"BRANCH_SOMETIMES".to_vec();
    });
    let e = import_error(&bad_mode);
    assert!(
        e.contains("the_trees") && e.contains("BRANCH_SOMETIMES"),
        "{e}"
    );

    let short = edited("regressor_branch_leq_sum", |n| {
        attr(n, "nodes_values").floats.pop();
    });
    let e = import_error(&short);
    assert!(
        e.contains("the_trees") && e.contains("nodes_values has 7 entries"),
        "{e}"
    );

    let feature = edited("regressor_branch_leq_sum", |n| {
        attr(n, "nodes_featureids").ints[0] = 3;
    });
    let e = import_error(&feature);
    assert!(e.contains("the_trees") && e.contains("feature 3"), "{e}");

    let class = edited("classifier_post_none", |n| {
        attr(n, "class_ids").ints[0] = 3;
    });
    let e = import_error(&class);
    assert!(e.contains("the_trees") && e.contains("class_ids 3"), "{e}");

    let targets = edited("dt_regressor", |n| {
        attr(n, "n_targets").i = Some(1 << 40);
    });
    let e = import_error(&targets);
    assert!(e.contains("the_trees") && e.contains("limit"), "{e}");

    // Opset 5: a leaf index past the leaves, a cycle found at run time.
    let leaf = edited("tree_ensemble_v5_member_average", |n| {
        attr(n, "nodes_truenodeids").ints[1] = 7;
    });
    let e = import_error(&leaf);
    assert!(e.contains("the_trees") && e.contains("out of range"), "{e}");
    let cycle = edited("tree_ensemble_v5_member_average", |n| {
        // Node 1 leads back to itself on both ways.
        attr(n, "nodes_trueleafs").ints[1] = 0;
        attr(n, "nodes_truenodeids").ints[1] = 1;
        attr(n, "nodes_falseleafs").ints[1] = 0;
        attr(n, "nodes_falsenodeids").ints[1] = 1;
    });
    let graph = onnx::import_bytes(&cycle, None).expect("a cycle is found at run time");
    let exe = backend_for(Device::Interp)
        .and_then(|b| b.compile(&graph))
        .expect("compile");
    let x = Tensor::from_vec(&[1, 3], vec![0.0f32, 0.0, 0.0]).expect("x");
    let e = exe.run(&[x]).expect_err("a cycle").to_string();
    assert!(e.contains("the_trees") && e.contains("cycle"), "{e}");
}

/// A fixture's model with `edit` applied to the whole model.
fn edited_model(folder: &str, case: &str, edit: impl FnOnce(&mut proto::ModelProto)) -> Vec<u8> {
    let path = common::root()
        .join("tests/onnx")
        .join(folder)
        .join(case)
        .join("model.onnx");
    let mut model = proto::ModelProto::decode(&*std::fs::read(path).expect("read")).expect("model");
    edit(&mut model);
    model.encode_to_vec()
}

fn first_node(model: &mut proto::ModelProto) -> &mut proto::NodeProto {
    let node = &mut model.graph.as_mut().expect("a graph").node[0];
    node.name = Some("the_node".into());
    node
}

#[test]
fn bad_string_models_are_errors_naming_the_node() {
    let regex = edited_model("strings", "regex_full_match_classes", |m| {
        attr(first_node(m), "pattern").s = Some(b"([a-z]+".to_vec());
    });
    let e = import_error(&regex);
    assert!(
        e.contains("the_node") && e.contains("'([a-z]+' is not a valid regular expression"),
        "{e}"
    );

    // A string where a number is expected: the trees' X.
    let strings_in = edited_model("trees", "dt_regressor", |m| {
        first_node(m);
        let x = &mut m.graph.as_mut().expect("a graph").input[0];
        let Some(proto::type_proto::Value::TensorType(t)) =
            x.r#type.as_mut().and_then(|t| t.value.as_mut())
        else {
            panic!("a tensor input")
        };
        t.elem_type = Some(proto::tensor_proto::DataType::String as i32);
    });
    let e = import_error(&strings_in);
    assert!(
        e.contains("the_node") && e.contains("input 0 (X) is a string tensor"),
        "{e}"
    );

    // Integer keys for string X, and keys and values of different lengths.
    let keys = edited_model("strings", "label_encoder_v2_string_to_string", |m| {
        let node = first_node(m);
        let a = attr(node, "keys_strings");
        a.name = Some("keys_int64s".into());
        a.r#type = Some(proto::attribute_proto::AttributeType::Ints as i32);
        a.strings.clear();
        a.ints = vec![1, 2];
    });
    let e = import_error(&keys);
    assert!(
        e.contains("the_node") && e.contains("keys_int64s needs an integer X"),
        "{e}"
    );
    let lengths = edited_model("strings", "label_encoder_v2_string_to_string", |m| {
        attr(first_node(m), "values_strings").strings.pop();
    });
    let e = import_error(&lengths);
    assert!(
        e.contains("the_node") && e.contains("2 keys for 1 values"),
        "{e}"
    );

    let case = edited_model("strings", "strnormalizer_insensitive_lower", |m| {
        attr(first_node(m), "case_change_action").s = Some(b"TITLE".to_vec());
    });
    let e = import_error(&case);
    assert!(e.contains("the_node") && e.contains("'TITLE'"), "{e}");
}

/// The imported models print as `.kir` text that parses back to the same text: NaN
/// separators in `membership_values`, Unicode and backslashes in string attributes.
#[test]
fn ml_models_round_trip_through_text() {
    for case in cases("trees").iter().chain(&cases("strings")) {
        let graph = onnx::import_file(&case.join("model.onnx")).expect("import");
        let text = kiln::ir::text::print(&graph);
        let again = kiln::ir::text::parse(&text, "model.kir", None)
            .unwrap_or_else(|e| panic!("{}: {e}\n{text}", case.display()));
        assert_eq!(kiln::ir::text::print(&again), text, "{}", case.display());
    }
}
