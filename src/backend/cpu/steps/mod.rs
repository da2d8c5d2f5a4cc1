//! Kernel selection: which step a node lowers to. Each family module turns a node whose
//! op, dtypes and attributes it covers into a kernel and says `None` otherwise; what no
//! family covers runs through [`fallback`].
use super::program::{Kernel, Slot};
use crate::ir::{Graph, Node, NodeId};
use crate::tensor::Tensor;

pub mod fallback;
pub mod matmul;
pub mod view;

/// What a family builder sees of a node.
pub struct Build<'a> {
    pub g: &'a Graph,
    pub id: NodeId,
    pub node: &'a Node,
    /// The inputs' slots (`None`: an omitted optional input).
    pub ins: &'a [Option<Slot>],
    /// The inputs' values when they are constants (weights to pack at compile time).
    pub in_data: &'a [Option<&'a Tensor>],
    pub outs: &'a [Slot],
}

impl Build<'_> {
    pub fn input(&self, k: usize) -> Option<&Slot> {
        self.ins.get(k).and_then(Option::as_ref)
    }
    pub fn constant(&self, k: usize) -> Option<&Tensor> {
        self.in_data.get(k).copied().flatten()
    }
    /// Whether every input and output present is f32.
    pub fn all_f32(&self) -> bool {
        self.ins
            .iter()
            .flatten()
            .chain(self.outs)
            .all(|s| s.dtype == crate::ir::DType::F32)
    }
}

type Builder = fn(&Build) -> Result<Option<Box<dyn Kernel>>, String>;

/// The family builders, tried in order.
const FAMILIES: &[Builder] = &[matmul::build, view::build];

/// The kernel for `b`'s node: the first family that covers it, else the fallback.
pub fn build(b: &Build) -> Result<Box<dyn Kernel>, String> {
    for family in FAMILIES {
        if let Some(k) = family(b)? {
            return Ok(k);
        }
    }
    fallback::build(b)
}

/// Floating-point operations of `b`'s node (products and convolutions; the rest is
/// memory-bound and not counted).
pub fn flops(b: &Build) -> f64 {
    let out = |k: usize| b.outs.get(k).map_or(0.0, |s| s.elements() as f64);
    match b.node.op.as_str() {
        "Conv" | "FusedConv" => {
            // 2 · outputs · (input channels per group · kernel size)
            let w = match b.input(1) {
                Some(w) => w,
                None => return 0.0,
            };
            let per_out: usize = w.shape[1..].iter().product();
            2.0 * out(0) * per_out as f64
        }
        "MatMul" | "FusedMatMul" | "Gemm" => {
            let a = match b.input(0) {
                Some(a) => a,
                None => return 0.0,
            };
            let trans_a = b.node.attrs.int_or("transA", 0).unwrap_or(0) != 0;
            let k = if trans_a && a.shape.len() >= 2 {
                a.shape[a.shape.len() - 2]
            } else {
                *a.shape.last().unwrap_or(&1)
            };
            2.0 * out(0) * k as f64
        }
        _ => 0.0,
    }
}
