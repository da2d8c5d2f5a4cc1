//! Tests of the `shape` ops.
