//! Tests of the `pool` ops.
