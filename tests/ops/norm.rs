//! Tests of the `norm` ops.
