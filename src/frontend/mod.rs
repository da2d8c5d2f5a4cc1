//! Frontends: what turns a model from elsewhere into a Kiln graph. Today: ONNX.
pub mod onnx;
