//! The compiler on the exporter-style real models (written to `target/real-models` by
//! `scripts/test-onnx-models.sh`, which also checks the optimized graphs' outputs
//! against onnxruntime): what the pipeline leaves of each, and the memory plan's
//! numbers against the goals. `make test` runs the script first; a bare
//! `cargo test` skips through `common::require` when the models are missing.
use crate::common;

use std::collections::HashMap;
use std::path::Path;

use kiln::backend::cpu_pass_options;
use kiln::frontend::onnx;
use kiln::ir::ops::fused::ACTIVATIONS;
use kiln::memory::{self, MemoryPlan};
use kiln::passes::{run_pipeline, CompileOptions};
use kiln::Graph;

use common::real_model;

/// Imported, specialized to `dims`, optimized by the default pipeline as the cpu
/// backend runs it (verifying after every pass), and planned.
fn compile(path: &Path, dims: &[(&str, usize)]) -> (Graph, MemoryPlan) {
    let mut g = onnx::import_file(path).unwrap();
    let bindings: HashMap<String, usize> = dims.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    let unbound = g.specialize(&bindings).unwrap();
    assert!(unbound.is_empty(), "{unbound:?}");
    let options = cpu_pass_options(CompileOptions {
        verify: true,
        ..CompileOptions::default()
    });
    run_pipeline(&mut g, &options).unwrap();
    let plan = memory::plan(&g, &g.schedule().unwrap()).unwrap();
    println!(
        "{}: naive {} B, planned {} B, lower bound {} B, naive/planned {:.2}, planned/lower bound {:.4}",
        g.name,
        plan.naive_bytes,
        plan.planned_bytes,
        plan.lower_bound_bytes,
        plan.naive_bytes as f64 / plan.planned_bytes as f64,
        plan.ratio_to_lower_bound()
    );
    (g, plan)
}

fn count(g: &Graph, op: &str) -> usize {
    g.nodes().iter().filter(|n| n.op == op).count()
}

#[test]
fn resnet50_fuses_every_conv_epilogue_and_plans_near_the_bound() {
    let Some(path) = real_model("resnet50") else {
        return;
    };
    let (g, plan) = compile(&path, &[("N", 1), ("H", 224), ("W", 224)]);
    assert_eq!(count(&g, "BatchNormalization"), 0);
    let convs: Vec<_> = g
        .nodes()
        .iter()
        .filter(|n| n.op == "Conv" || n.op == "FusedConv")
        .collect();
    assert_eq!(convs.len(), 53);
    // Every conv has its bias (BatchNormalization's shift), and nothing that could have
    // joined an epilogue still reads a conv's output.
    assert!(convs
        .iter()
        .all(|n| n.inputs.get(2).copied().flatten().is_some()));
    for n in g.nodes() {
        let epilogue_op = n.op == "Add" || ACTIVATIONS.contains(&n.op.as_str());
        let reads_conv = n.inputs.iter().flatten().any(|v| {
            let src = &g.node(v.node).op;
            src == "Conv" || src == "FusedConv"
        });
        assert!(
            !(epilogue_op && reads_conv),
            "{} reads a conv's output",
            n.name
        );
    }
    // 49 of the 53 end in a Relu or a residual Add; the other 4 (the downsampling
    // shortcuts) have nothing after them to fuse.
    let with_epilogue = convs
        .iter()
        .filter(|n| {
            n.attrs.get("activation").is_some() || n.inputs.get(3).copied().flatten().is_some()
        })
        .count();
    assert_eq!(with_epilogue, 49);
    // The cpu backend's layout: every conv runs blocked (the 3-channel stem reads the
    // plain image), the pools too, and one reorder is left, where the classifier
    // flattens the pooled features.
    let blocked = convs
        .iter()
        .filter(|n| n.attrs.int_or("block", 0) == Ok(16))
        .count();
    assert_eq!(blocked, 53);
    let plain_x = convs
        .iter()
        .filter(|n| n.attrs.int_or("plain_x", 0) == Ok(1))
        .count();
    assert_eq!(plain_x, 1);
    assert_eq!(count(&g, "Reorder"), 1);
    assert!(plan.naive_bytes as f64 / plan.planned_bytes as f64 >= 5.0);
    assert!(plan.planned_bytes as f64 <= 1.05 * plan.lower_bound_bytes as f64);
}

#[test]
fn bert_encoder_recognizes_its_decomposed_layer_and_plans_near_the_bound() {
    let Some(path) = real_model("bert_encoder") else {
        return;
    };
    let (g, plan) = compile(&path, &[("B", 1), ("S", 128)]);
    // Layer 0 was written decomposed; both layers end up with the ops.
    assert_eq!(count(&g, "LayerNormalization"), 4);
    assert_eq!(count(&g, "Softmax"), 2);
    assert_eq!(count(&g, "Erf"), 0);
    assert_eq!(count(&g, "FusedMatMul"), 12);
    assert!(plan.planned_bytes as f64 <= 1.05 * plan.lower_bound_bytes as f64);
}

#[test]
fn small_models_plan_near_the_bound() {
    for (name, dims) in [
        ("mlp", vec![("N", 1)]),
        ("small_cnn", vec![("N", 1)]),
        ("resnet18", vec![("N", 1), ("H", 64), ("W", 64)]),
    ] {
        let Some(path) = real_model(name) else { return };
        let (_, plan) = compile(&path, &dims);
        assert!(
            plan.planned_bytes as f64 <= 1.05 * plan.lower_bound_bytes as f64,
            "{name}"
        );
    }
}

/// One SGD step of a 784-256-10 MLP with softmax cross-entropy, written by hand (forward,
/// backward, updates through `Assign`) until autodiff (issue 7) builds such graphs.
fn mlp_training_step(n: usize) -> Graph {
    use kiln::ir::{Attr, Attrs, DType, Shape, TensorType, Value};
    use kiln::Tensor;
    let mut g = Graph::new("mlp_train");
    let f32t = |d: &[usize]| TensorType::new(DType::F32, Shape::fixed(d));
    let x: Value = g.add_parameter("x", f32t(&[n, 784])).unwrap().into();
    let y: Value = g.add_parameter("labels", f32t(&[n, 10])).unwrap().into();
    let mut seed = 1u32;
    let mut init = |d: &[usize], scale: f32| {
        let k: usize = d.iter().product();
        let v: Vec<f32> = (0..k)
            .map(|_| {
                seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                ((seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * scale
            })
            .collect();
        Tensor::from_vec(d, v).unwrap()
    };
    let mut var = |g: &mut Graph, name: &str, d: &[usize], scale: f32| -> Value {
        g.add_variable(name, f32t(d), init(d, scale))
            .unwrap()
            .into()
    };
    let w1 = var(&mut g, "w1", &[784, 256], 0.1);
    let b1 = var(&mut g, "b1", &[256], 0.0);
    let w2 = var(&mut g, "w2", &[256, 10], 0.1);
    let b2 = var(&mut g, "b2", &[10], 0.0);
    let none = Attrs::new;
    let op = |g: &mut Graph, op: &str, ins: &[Value], attrs: Attrs| -> Value {
        let name = g.fresh_name(&op.to_ascii_lowercase());
        g.op(op, ins, attrs, &name).unwrap().into()
    };
    let t2 = || Attrs::new().with("perm", Attr::Ints(vec![1, 0]));
    let axes0 = g
        .add_constant_value("axes0", Tensor::from_vec(&[1], vec![0i64]).unwrap())
        .unwrap()
        .into();
    let keep0 = || Attrs::new().with("keepdims", Attr::Int(0));
    // Forward.
    let pre = op(&mut g, "MatMul", &[x, w1], none());
    let pre = op(&mut g, "Add", &[pre, b1], none());
    let h = op(&mut g, "Relu", &[pre], none());
    let logits = op(&mut g, "MatMul", &[h, w2], none());
    let logits = op(&mut g, "Add", &[logits, b2], none());
    let p = op(&mut g, "Softmax", &[logits], none());
    let logp = op(&mut g, "Log", &[p], none());
    let ylogp = op(&mut g, "Mul", &[y, logp], none());
    let loss = op(&mut g, "ReduceSum", &[ylogp], none());
    let inv_n = g
        .add_constant_value("inv_n", Tensor::scalar(-1.0f32 / n as f32))
        .unwrap()
        .into();
    let loss = op(&mut g, "Mul", &[loss, inv_n], none());
    // Backward: dlogits = (p - y) / n.
    let pos_inv_n = g
        .add_constant_value("pos_inv_n", Tensor::scalar(1.0f32 / n as f32))
        .unwrap()
        .into();
    let d = op(&mut g, "Sub", &[p, y], none());
    let dlogits = op(&mut g, "Mul", &[d, pos_inv_n], none());
    let ht = op(&mut g, "Transpose", &[h], t2());
    let dw2 = op(&mut g, "MatMul", &[ht, dlogits], none());
    let db2 = op(&mut g, "ReduceSum", &[dlogits, axes0], keep0());
    let w2t = op(&mut g, "Transpose", &[w2], t2());
    let dh = op(&mut g, "MatMul", &[dlogits, w2t], none());
    let zero = g
        .add_constant_value("zero", Tensor::scalar(0.0f32))
        .unwrap()
        .into();
    let active = op(&mut g, "Greater", &[pre, zero], none());
    let dpre = op(&mut g, "Where", &[active, dh, zero], none());
    let xt = op(&mut g, "Transpose", &[x], t2());
    let dw1 = op(&mut g, "MatMul", &[xt, dpre], none());
    let db1 = op(&mut g, "ReduceSum", &[dpre, axes0], keep0());
    // SGD.
    let lr = g
        .add_constant_value("lr", Tensor::scalar(0.1f32))
        .unwrap()
        .into();
    for (w, dw) in [(w1, dw1), (b1, db1), (w2, dw2), (b2, db2)] {
        let step = op(&mut g, "Mul", &[dw, lr], none());
        let new = op(&mut g, "Sub", &[w, step], none());
        let name = g.fresh_name("update");
        g.op("Assign", &[w, new], Attrs::new(), &name).unwrap();
    }
    g.add_output("loss", loss).unwrap();
    g
}

#[test]
fn mlp_training_step_plans_near_the_bound_and_trains_the_same() {
    use kiln::backend::interp::InterpExecutable;
    use kiln::backend::Executable;
    let g = mlp_training_step(64);
    let mut opt = g.clone();
    let options = cpu_pass_options(CompileOptions {
        verify: true,
        ..CompileOptions::default()
    });
    run_pipeline(&mut opt, &options).unwrap();
    let plan = memory::plan(&opt, &opt.schedule().unwrap()).unwrap();
    println!(
        "mlp_train (N=64): naive {} B, planned {} B, lower bound {} B, naive/planned {:.2}, planned/lower bound {:.4}",
        plan.naive_bytes,
        plan.planned_bytes,
        plan.lower_bound_bytes,
        plan.naive_bytes as f64 / plan.planned_bytes as f64,
        plan.ratio_to_lower_bound()
    );
    assert!(plan.planned_bytes as f64 <= 1.05 * plan.lower_bound_bytes as f64);
    // Three steps before and after the pipeline (a batch of 8 keeps the interpreter
    // quick): the same losses and the same weights.
    let n = 8;
    let g = mlp_training_step(n);
    let mut opt = g.clone();
    run_pipeline(&mut opt, &options).unwrap();
    let x = kiln::Tensor::from_vec(
        &[n, 784],
        (0..n * 784)
            .map(|i| ((i * 7919) % 255) as f32 / 255.0)
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let labels = kiln::Tensor::from_vec(
        &[n, 10],
        (0..n * 10)
            .map(|i| if i % 10 == (i / 10) % 10 { 1.0f32 } else { 0.0 })
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let (a, b) = (
        InterpExecutable::new(g).unwrap(),
        InterpExecutable::new(opt).unwrap(),
    );
    for _ in 0..3 {
        let inputs = [x.clone(), labels.clone()];
        let (la, lb) = (a.run(&inputs).unwrap(), b.run(&inputs).unwrap());
        lb[0].check_close(&la[0], 1e-6, 1e-5).unwrap();
    }
    for w in ["w1", "b1", "w2", "b2"] {
        let (wa, wb) = (a.read_variable(w).unwrap(), b.read_variable(w).unwrap());
        wb.check_close(&wa, 1e-6, 1e-5)
            .unwrap_or_else(|e| panic!("{w}: {e}"));
    }
}
