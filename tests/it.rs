//! The hermetic suites and those over generated data (the ONNX node suite, contrib cases,
//! exporter-style models), one module per former test file, linked once: `cargo test --test it`,
//! one suite with `cargo test --test it passes::`.
mod common;

#[path = "autodiff.rs"]
mod autodiff;
#[path = "cli.rs"]
mod cli;
#[path = "compile_models.rs"]
mod compile_models;
#[path = "control_flow.rs"]
mod control_flow;
#[path = "cpu_backend.rs"]
mod cpu_backend;
#[path = "cpu_backward.rs"]
mod cpu_backward;
#[path = "cpu_control_flow.rs"]
mod cpu_control_flow;
#[path = "cpu_dynamic.rs"]
mod cpu_dynamic;
#[path = "cpu_generic_binary.rs"]
mod cpu_generic_binary;
#[path = "cpu_generic_unary.rs"]
mod cpu_generic_unary;
#[path = "cpu_host_program.rs"]
mod cpu_host_program;
#[path = "cpu_movement.rs"]
mod cpu_movement;
#[path = "cpu_nn_attention.rs"]
mod cpu_nn_attention;
#[path = "cpu_nn_loss_quant.rs"]
mod cpu_nn_loss_quant;
#[path = "cpu_quant.rs"]
mod cpu_quant;
#[path = "cpu_rnn.rs"]
mod cpu_rnn;
#[path = "cpu_shape_reduce.rs"]
mod cpu_shape_reduce;
#[path = "cpu_training.rs"]
mod cpu_training;
#[path = "cpu_trees.rs"]
mod cpu_trees;
#[path = "custom_op.rs"]
mod custom_op;
#[path = "fuzz_regressions.rs"]
mod fuzz_regressions;
#[path = "ir.rs"]
mod ir;
#[path = "onnx_contrib.rs"]
mod onnx_contrib;
#[path = "onnx_import.rs"]
mod onnx_import;
#[path = "onnx_ml.rs"]
mod onnx_ml;
#[path = "onnx_node.rs"]
mod onnx_node;
#[path = "op_matrix.rs"]
mod op_matrix;
#[path = "ops.rs"]
mod ops;
#[path = "optim.rs"]
mod optim;
#[path = "passes.rs"]
mod passes;
#[path = "pictures.rs"]
mod pictures;
#[path = "profile.rs"]
mod profile;
#[path = "sequences.rs"]
mod sequences;
#[path = "train.rs"]
mod train;
#[path = "train_memory.rs"]
mod train_memory;
#[path = "viz.rs"]
mod viz;
