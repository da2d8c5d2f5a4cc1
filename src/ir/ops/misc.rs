//! The `misc` family of the op catalogue.
use super::Op;

pub fn ops() -> Vec<&'static dyn Op> {
    vec![]
}
