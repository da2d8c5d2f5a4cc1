//! Tests of the `misc` ops.
