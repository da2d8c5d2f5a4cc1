//! Tests of the `conv` ops.
