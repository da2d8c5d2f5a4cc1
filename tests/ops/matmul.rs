//! Tests of the `matmul` ops.
