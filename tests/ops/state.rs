//! Tests of the `state` ops.
