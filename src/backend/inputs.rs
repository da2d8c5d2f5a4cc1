//! Checking a run's inputs against the graph's parameters, the same way on every
//! backend: count, dtype, rank, fixed sizes, and one size per symbol.
pub(crate) use crate::ir::eval::{check_input_types, check_view_types, input_types};
