//! Every catalogue op against hand- or numpy-computed expectations, run through the
//! reference interpreter. One module per op family (`tests/ops/<family>.rs`).
#[path = "ops/harness.rs"]
mod harness;

#[path = "ops/coverage.rs"]
mod coverage;
#[path = "ops/elementwise.rs"]
mod elementwise;
