//! Every catalogue op against hand- or numpy-computed expectations, run through the
//! reference interpreter. One module per op family (`tests/ops/<family>.rs`).
#[path = "ops/harness.rs"]
mod harness;

#[path = "ops/attention.rs"]
mod attention;
#[path = "ops/bitwise.rs"]
mod bitwise;
#[path = "ops/conv.rs"]
mod conv;
#[path = "ops/coverage.rs"]
mod coverage;
#[path = "ops/elementwise.rs"]
mod elementwise;
#[path = "ops/fused.rs"]
mod fused;
#[path = "ops/gather.rs"]
mod gather;
#[path = "ops/loss.rs"]
mod loss;
#[path = "ops/matmul.rs"]
mod matmul;
#[path = "ops/misc.rs"]
mod misc;
#[path = "ops/norm.rs"]
mod norm;
#[path = "ops/pool.rs"]
mod pool;
#[path = "ops/quant.rs"]
mod quant;
#[path = "ops/random.rs"]
mod random;
#[path = "ops/reduce.rs"]
mod reduce;
#[path = "ops/resize.rs"]
mod resize;
#[path = "ops/rnn.rs"]
mod rnn;
#[path = "ops/sequence.rs"]
mod sequence;
#[path = "ops/shape.rs"]
mod shape;
#[path = "ops/signal.rs"]
mod signal;
#[path = "ops/state.rs"]
mod state;
#[path = "ops/strings.rs"]
mod strings;
#[path = "ops/text.rs"]
mod text;
#[path = "ops/tree.rs"]
mod tree;
