//! The checks of the tree itself: documents, layers, tidy rules, the generated header and
//! ONNX bindings: `cargo test --test tools`.
mod common;

#[path = "docs.rs"]
mod docs;
#[path = "header.rs"]
mod header;
#[path = "layers.rs"]
mod layers;
#[path = "onnx_proto.rs"]
mod onnx_proto;
#[path = "tidy.rs"]
mod tidy;
