//! The compiler on the exporter-style real models (written to `target/real-models` by
//! `scripts/test-onnx-models.sh`, which also checks the optimized graphs' outputs
//! against onnxruntime): what the pipeline leaves of each, and the memory plan's
//! numbers against the goals. `make test` runs the script first; a bare
//! `cargo test` skips with a message when the models are missing.
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use kiln::backend::cpu_pass_options;
use kiln::frontend::onnx;
use kiln::ir::ops::fused::ACTIVATIONS;
use kiln::memory::{self, MemoryPlan};
use kiln::passes::{run_pipeline, PassOptions};
use kiln::Graph;

fn model(name: &str) -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/real-models")
        .join(name)
        .join("model.onnx");
    if p.exists() {
        return Some(p);
    }
    assert!(
        std::env::var_os("KILN_REQUIRE_ONNX_SUITE").is_none(),
        "{} is missing: run scripts/test-onnx-models.sh",
        p.display()
    );
    eprintln!(
        "skipped: {} is missing (scripts/test-onnx-models.sh writes it)",
        p.display()
    );
    None
}

/// Imported, specialized to `dims`, optimized by the default pipeline as the cpu
/// backend runs it (verifying after every pass), and planned.
fn compile(path: &Path, dims: &[(&str, usize)]) -> (Graph, MemoryPlan) {
    let mut g = onnx::import_file(path).unwrap();
    let bindings: HashMap<String, usize> = dims.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    let unbound = g.specialize(&bindings).unwrap();
    assert!(unbound.is_empty(), "{unbound:?}");
    let options = cpu_pass_options(PassOptions {
        verify: true,
        ..PassOptions::default()
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
    let Some(path) = model("resnet50") else {
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
    // The cpu backend's layout: every conv but the 3-channel stem runs blocked, and a
    // reorder is left only where a plain op meets the blocked chain (after the max pool,
    // before the global pool).
    let blocked = convs
        .iter()
        .filter(|n| n.attrs.int_or("block", 0) == Ok(16))
        .count();
    assert_eq!(blocked, 52);
    assert_eq!(count(&g, "Reorder"), 2);
    assert!(plan.naive_bytes as f64 / plan.planned_bytes as f64 >= 5.0);
    assert!(plan.planned_bytes as f64 <= 1.05 * plan.lower_bound_bytes as f64);
}

#[test]
fn bert_encoder_recognizes_its_decomposed_layer_and_plans_near_the_bound() {
    let Some(path) = model("bert_encoder") else {
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
        ("resnet18", vec![("N", 1)]),
    ] {
        let Some(path) = model(name) else { return };
        let (_, plan) = compile(&path, &dims);
        assert!(
            plan.planned_bytes as f64 <= 1.05 * plan.lower_bound_bytes as f64,
            "{name}"
        );
    }
}
