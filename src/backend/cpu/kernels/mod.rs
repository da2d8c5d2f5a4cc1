//! The CPU backend's kernels. Each works on raw f32 buffers (arena slices) and is tested
//! against the reference interpreter; the vector paths are chosen by [`super::isa`].
pub mod activation;
pub mod adam;
pub mod binary;
#[cfg(feature = "openblas")]
pub mod blas;
pub(crate) mod broadcast;
pub mod conv;
pub mod conv_grad;
pub mod conv_transpose;
pub mod elementwise_any;
pub mod fused;
pub mod gemm;
pub mod index_ops;
pub mod loss;
pub mod loss_sample;
pub mod math;
pub mod movement;
pub mod nms;
pub mod norm;
pub(crate) mod par;
pub mod pool_indices;
pub mod pool_nd;
pub mod pooling;
pub mod qdq;
pub mod qgemm;
pub mod quant;
pub mod reduce;
pub mod reorder;
pub mod resize;
pub mod rnn;
pub mod scatter;
pub(crate) mod scatter_elem;
pub mod select;
pub mod softmax;
#[cfg(test)]
mod testutil;
pub(crate) mod topk;
pub mod trees;
pub mod unary;

pub use activation::Act;
