//! Training graphs on the CPU backend: the variables live in the executable, the values
//! `Assign` stores are computed straight into them, and the steps match the
//! interpreter's. Runs that store are serialized; a failed run stores nothing.
use crate::common;

use std::sync::Arc;

use kiln::autodiff::grad;
use kiln::backend::cpu::{Compiled, CpuBackend, CpuExecutable};
use kiln::backend::interp::InterpExecutable;
use kiln::backend::Executable;
use kiln::ir::{Attr, Attrs, DType, Graph, Shape, TensorType, Value};
use kiln::optim::{add_optimizer, Optimizer, Rule};
use kiln::passes::CompileOptions;
use kiln::{Dim, Tensor};

use common::{Need, Rng};

fn f32s(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F32, Shape::fixed(dims))
}

/// An MLP `sizes[0]`-…-`sizes[last]` (Relu) with softmax cross-entropy over a batch of
/// `batch` (symbolic when `None`), trained by `opt`; outputs the loss.
pub fn mlp(sizes: &[usize], batch: Option<usize>, opt: Rule) -> Graph {
    let mut g = Graph::new("mlp");
    let n = batch.map_or(Dim::Sym("N".into()), Dim::Fixed);
    let x: Value = g
        .add_parameter(
            "x",
            TensorType::new(
                DType::F32,
                Shape::new(vec![n.clone(), Dim::Fixed(sizes[0])]),
            ),
        )
        .unwrap()
        .into();
    let labels: Value = g
        .add_parameter("labels", TensorType::new(DType::I64, Shape::new(vec![n])))
        .unwrap()
        .into();
    let lr: Value = g.add_parameter("lr", f32s(&[])).unwrap().into();
    let mut h = x;
    let mut weights = vec![];
    for (i, w) in sizes.windows(2).enumerate() {
        let scale = (2.0 / w[0] as f32).sqrt();
        let wv = Rng(i as u64 + 1).f32_tensor(&[w[0], w[1]], scale);
        let bv = Rng(i as u64 + 100).f32_tensor(&[w[1]], 0.1);
        let wt: Value = g
            .add_variable(&format!("w{i}"), f32s(&[w[0], w[1]]), wv)
            .unwrap()
            .into();
        let bt: Value = g
            .add_variable(&format!("b{i}"), f32s(&[w[1]]), bv)
            .unwrap()
            .into();
        weights.extend([wt, bt]);
        let mm: Value = g.op("MatMul", &[h, wt], Attrs::new(), "").unwrap().into();
        h = g.op("Add", &[mm, bt], Attrs::new(), "").unwrap().into();
        if i + 2 < sizes.len() {
            h = g.op("Relu", &[h], Attrs::new(), "").unwrap().into();
        }
    }
    let loss: Value = g
        .op(
            "SoftmaxCrossEntropyLoss",
            &[h, labels],
            Attrs::new().with("reduction", Attr::String("mean".into())),
            "loss",
        )
        .unwrap()
        .into();
    let grads = grad(&mut g, loss, &weights).unwrap();
    let opt = Optimizer {
        rule: opt,
        weight_decay: 0.0,
        clip_norm: None,
    };
    add_optimizer(&mut g, &opt, &weights, &grads, lr).unwrap();
    g.add_output("loss", loss).unwrap();
    g
}

pub fn adam() -> Rule {
    Rule::Adam {
        beta1: 0.9,
        beta2: 0.999,
        epsilon: 1e-8,
        decoupled: false,
    }
}

pub fn cpu(g: &Graph, threads: usize) -> CpuExecutable {
    CpuBackend::new(CompileOptions {
        threads,
        ..Default::default()
    })
    .compile_cpu(g)
    .unwrap()
}

pub fn batch(n: usize, features: usize, classes: usize, seed: u64) -> Vec<Tensor> {
    let x = Rng(seed).f32_tensor(&[n, features], 1.0);
    let labels: Vec<i64> = (0..n as i64)
        .map(|i| (i * 7 + seed as i64) % classes as i64)
        .collect();
    vec![
        x,
        Tensor::from_vec(&[n], labels).unwrap(),
        Tensor::scalar(0.01f32),
    ]
}

#[test]
fn mlp_steps_match_the_interpreter() {
    for threads in [1, 2] {
        let g = mlp(&[20, 32, 16, 5], None, adam());
        let exe = cpu(&g, threads);
        let oracle = InterpExecutable::new(g.clone()).unwrap();
        for step in 0..5 {
            let inputs = batch(12 + step % 2, 20, 5, step as u64);
            let (a, b) = (exe.run(&inputs).unwrap(), oracle.run(&inputs).unwrap());
            a[0].check_close(&b[0], 1e-4, 1e-4)
                .unwrap_or_else(|e| panic!("step {step}, {threads} threads: loss {e}"));
        }
        assert_eq!(exe.variables(), oracle.variables());
        for (name, _) in exe.variables() {
            let (a, b) = (
                exe.read_variable(&name).unwrap(),
                oracle.read_variable(&name).unwrap(),
            );
            a.check_close(&b, 1e-4, 1e-4)
                .unwrap_or_else(|e| panic!("{name}, {threads} threads: {e}"));
        }
    }
}

#[test]
fn stored_values_are_computed_in_the_variables() {
    let g = mlp(&[16, 8, 4], Some(6), adam());
    let exe = cpu(&g, 1);
    let Compiled::Program(p) = &*exe.program(&[vec![6, 16], vec![6], vec![]]).unwrap() else {
        panic!("the static training graph is lowered");
    };
    // Weights, biases, both Adam moments of each, and the step count.
    assert_eq!(p.stores.len(), 4 * 3 + 1);
    assert_eq!(p.memory.stored.len(), p.stores.len());
    assert!(
        p.steps
            .iter()
            .all(|s| s.kernel.kind() != "copy" || !s.node.to_string().contains("Assign")),
        "no store needs a copy"
    );
    assert!(p.memory.planned_bytes >= p.memory.lower_bound_bytes);
}

#[test]
fn optimizer_state_is_updated_in_place() {
    // Nothing after Adam's loops can fail, so each loop writes its moments over the
    // ones it read: no second buffer to swap in. The weights' new values take over the
    // gradient's buffer instead (in the second buffer, swapped in).
    let g = mlp(&[16, 8, 4], Some(6), adam());
    let exe = cpu(&g, 1);
    let Compiled::Program(p) = &*exe.program(&[vec![6, 16], vec![6], vec![]]).unwrap() else {
        panic!("the static training graph is lowered");
    };
    let in_place = p.stores.len() - p.swaps.len();
    assert_eq!(
        in_place,
        2 * 4 + 1,
        "both moments of 4 parameters and the step count"
    );
    assert!(p.steps.iter().any(|s| s.updates_variable));
}

#[test]
fn adam_updates_run_in_their_own_loop() {
    // The body the optimizer builder's ops fuse into is the one the Adam loop knows: if
    // either changes, the update silently falls back to the generic loop; this says so.
    let isa = kiln::internals::cpu::isa();
    let found = if kiln::internals::cpu::adam::available(isa) {
        Ok(())
    } else {
        Err(format!("the Adam loop needs AVX-512F; kiln runs {isa:?}"))
    };
    if !common::require(Need::Avx512f, found) {
        return;
    }
    let g = mlp(&[16, 8, 4], Some(6), adam());
    let exe = cpu(&g, 1);
    let Compiled::Program(p) = &*exe.program(&[vec![6, 16], vec![6], vec![]]).unwrap() else {
        panic!("the static training graph is lowered");
    };
    let loops = p.steps.iter().filter(|s| s.kernel.kind() == "adam-update");
    assert_eq!(loops.count(), 4, "one per parameter");
}

/// `v ← v + 1`, then row `i` of the new value: the gather, which fails on a bad index,
/// runs after the update.
fn update_then_gather() -> Graph {
    let mut g = Graph::new("update_then_gather");
    let v: Value = g
        .add_variable(
            "v",
            f32s(&[3, 2]),
            Tensor::from_vec(&[3, 2], vec![1f32; 6]).unwrap(),
        )
        .unwrap()
        .into();
    let i: Value = g
        .add_parameter("i", TensorType::new(DType::I64, Shape::fixed(&[1])))
        .unwrap()
        .into();
    let one: Value = g
        .add_constant_value("one", Tensor::scalar(1f32))
        .unwrap()
        .into();
    let next: Value = g
        .add_op("Add", &[Some(v), Some(one)], Attrs::new(), "next")
        .unwrap()
        .into();
    g.add_op("Assign", &[Some(v), Some(next)], Attrs::new(), "store")
        .unwrap();
    let row: Value = g
        .add_op("Gather", &[Some(next), Some(i)], Attrs::new(), "row")
        .unwrap()
        .into();
    g.add_output("row", row).unwrap();
    g
}

#[test]
fn a_step_that_can_fail_after_the_update_keeps_it_out_of_place() {
    let exe = cpu(&update_then_gather(), 1);
    let Compiled::Program(p) = &*exe.program(&[vec![1]]).unwrap() else {
        panic!("lowered");
    };
    assert_eq!(p.swaps, p.stores, "the gather can fail after the update");
    let before = exe.read_variable("v").unwrap();
    let bad = Tensor::from_vec(&[1], vec![5i64]).unwrap();
    let err = exe.run(&[bad]).unwrap_err().to_string();
    assert!(err.contains("out of range"), "{err}");
    assert_eq!(
        exe.read_variable("v").unwrap(),
        before,
        "the failed run stored nothing"
    );
    let good = Tensor::from_vec(&[1], vec![2i64]).unwrap();
    let row = exe.run(&[good]).unwrap();
    assert_eq!(row[0], Tensor::from_vec(&[1, 2], vec![2f32; 2]).unwrap());
    assert_eq!(
        exe.read_variable("v").unwrap(),
        Tensor::from_vec(&[3, 2], vec![2f32; 6]).unwrap()
    );
}

#[test]
fn a_failed_run_stores_nothing_and_writes_are_checked() {
    let g = mlp(&[4, 3], Some(2), adam());
    let exe = cpu(&g, 1);
    let before = exe.read_variable("w0").unwrap();
    let mut bad = batch(2, 4, 3, 1);
    bad[1] = Tensor::from_vec(&[2], vec![0i64, 7]).unwrap(); // a class out of range
    assert!(exe.run(&bad).is_err());
    assert_eq!(exe.read_variable("w0").unwrap(), before);

    let err = exe
        .write_variables(&[
            ("w0", &Tensor::zeros(DType::F32, &[4, 3])),
            ("nope", &before),
        ])
        .unwrap_err()
        .to_string();
    assert!(err.contains("no variable 'nope'"), "{err}");
    assert_eq!(exe.read_variable("w0").unwrap(), before, "all or none");
    let err = exe
        .write_variables(&[("w0", &Tensor::zeros(DType::F32, &[3, 4]))])
        .unwrap_err()
        .to_string();
    assert!(err.contains("variable 'w0' is f32[4, 3]"), "{err}");

    let ones = Tensor::from_vec(&[4, 3], vec![1.0f32; 12]).unwrap();
    exe.write_variables(&[("w0", &ones)]).unwrap();
    assert_eq!(exe.read_variable("w0").unwrap(), ones);
    exe.run(&batch(2, 4, 3, 1)).unwrap();
    assert_ne!(
        exe.read_variable("w0").unwrap(),
        ones,
        "the step trained from the write"
    );
}

#[test]
fn concurrent_training_runs_are_serialized() {
    // SGD on one fixed batch: each step's update depends on the previous one, so 8 steps
    // from 4 threads equal 8 steps in a row only if no two runs overlapped.
    let sgd = Rule::Sgd {
        momentum: 0.9,
        nesterov: false,
    };
    let g = mlp(&[8, 16, 4], Some(4), sgd);
    let inputs = Arc::new(batch(4, 8, 4, 3));
    let shared = Arc::new(cpu(&g, 1));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (exe, inputs) = (shared.clone(), inputs.clone());
            std::thread::spawn(move || {
                for _ in 0..2 {
                    exe.run(&inputs).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let serial = cpu(&g, 1);
    for _ in 0..8 {
        serial.run(&inputs).unwrap();
    }
    for (name, _) in serial.variables() {
        assert_eq!(
            shared.read_variable(&name).unwrap(),
            serial.read_variable(&name).unwrap(),
            "{name}"
        );
    }
    // All at once (what a checkpoint saves) is the same state, in graph order.
    let all = shared.read_variables().unwrap();
    let names: Vec<String> = shared.variables().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        all.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>(),
        names
    );
    for (name, value) in &all {
        assert_eq!(value, &serial.read_variable(name).unwrap(), "{name}");
    }
}
