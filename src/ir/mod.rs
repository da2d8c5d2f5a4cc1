//! The IR: shapes with symbolic dims and named axes, attributes, the graph, the
//! op catalogue, the verifier, and the `.kir` text format.
//!
//! Architecture invariant: `ir` depends on nothing else in the crate but `tensor` (the
//! payload of constants) and `error`.
pub mod attr;
mod build;
pub mod dot;
pub(crate) mod eval;
pub mod graph;
pub mod ops;
pub mod shape;
pub mod text;
pub mod verify;

/// Re-exported so the IR's users name dtypes where they name shapes; it lives in the
/// `tensor` leaf, which must not import `ir`.
pub use crate::tensor::DType;
pub use attr::{Attr, AttrKind, Attrs};
pub use graph::{Graph, GraphOutput, Node, NodeId, Origin, Value};
pub use shape::{Axis, Container, Dim, Shape, TensorType};
pub use verify::verify;
