//! Issue 7's arena number: the memory planner's arena for the MLP 784-512-512-10
//! training step (batch 64, mean softmax cross-entropy, Adam) within 5% of its liveness
//! lower bound, measured on the program the CPU backend lowers for the step.
#[path = "common/train_models.rs"]
mod train_models;

use kiln::backend::cpu::{Compiled, CpuBackend};
use kiln::passes::CompileOptions;
use kiln::Tensor;
use train_models::{default_batch, default_weights, train_step, Model};

const BATCH: usize = 64;

#[test]
fn the_mlp_training_steps_arena_is_within_5_percent_of_its_lower_bound() {
    let g = train_step(Model::Mlp, BATCH, &default_weights(Model::Mlp)).unwrap();
    let backend = CpuBackend::new(CompileOptions {
        threads: 1,
        ..CompileOptions::from_env().unwrap()
    });
    // Until the CPU backend lowers graphs with state there is no program, hence no
    // plan: that is a failure of this test, not a pass.
    let exe = backend.compile_cpu(&g).unwrap_or_else(|e| {
        panic!("the CPU backend did not lower the MLP training step, so it has no memory plan: {e}")
    });
    let (x, labels) = default_batch(Model::Mlp, BATCH);
    let shapes = vec![
        x.shape().to_vec(),
        labels.shape().to_vec(),
        Tensor::scalar(1e-3f32).shape().to_vec(),
    ];
    let compiled = exe.program(&shapes).unwrap();
    let p = match &*compiled {
        Compiled::Program(p) => p,
        _ => panic!("the MLP training step is not one lowered program (no single memory plan)"),
    };
    let m = &p.memory;
    let ratio = m.planned_bytes as f64 / m.lower_bound_bytes as f64;
    println!(
        "MLP training step: planned {} B, lower bound {} B (ratio {ratio:.4}), naive {} B, \
         strategy {}",
        m.planned_bytes, m.lower_bound_bytes, m.naive_bytes, m.strategy
    );
    // The plan is the whole step's: each of the 6 weights, its two Adam moments and the
    // step count are stored, computed straight into the variables' next buffers (the
    // gradients too, when a moment's update takes over its buffer in place).
    let weights = 784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10;
    let stored: usize = m.stored.iter().map(|b| b.bytes).sum();
    assert_eq!(m.stored.len(), 6 * 3 + 1, "stored buffers");
    assert!(
        stored >= 3 * 4 * weights,
        "{stored} B stored, less than the weights and both moments"
    );
    assert!(
        ratio <= 1.05,
        "planned arena {} B is {ratio:.4} × the lower bound {} B (want ≤ 1.05)",
        m.planned_bytes,
        m.lower_bound_bytes
    );
}
