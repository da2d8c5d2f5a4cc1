//! Tests of the `reduce` ops.
