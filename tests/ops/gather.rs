//! Tests of the `gather` ops.
