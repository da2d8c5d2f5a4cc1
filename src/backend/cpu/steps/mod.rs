//! Kernel selection: which step a node lowers to. Each family module turns a node whose
//! op, dtypes and attributes it covers into a kernel and says `None` otherwise; what no
//! family covers runs through [`fallback`].
use super::pool::Pool;
use super::program::{Kernel, Loc, Slot};
use crate::ir::{Graph, Node, NodeId};
use crate::passes::CompileOptions;
use crate::passes::Tuning;
use crate::tensor::Tensor;

pub mod attention;
pub mod attention_elem;
pub mod backward;
pub mod control;
pub mod conv;
pub mod conv_elem;
pub mod conv_grad;
pub mod custom;
pub mod elementwise_any;
pub mod eltwise;
pub mod fallback;
pub mod index_ops;
pub mod label_encoder;
pub mod loss_sample;
pub mod matmul;
pub mod matmul_elem;
pub mod mel;
pub mod movement;
pub mod nms;
pub mod nn;
pub mod norm_elem;
pub mod pool_nd;
pub mod quant;
pub mod reduce;
pub mod rnn;
pub mod rnn_elem;
pub mod scatter_elem;
pub mod trees;
pub mod unary;
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
    /// Where the step scratch region starts in the arena: after every planned buffer.
    /// Steps run one at a time, so all share it; lowering sizes it by the largest ask.
    pub scratch_at: usize,
    pub scratch_bytes: &'a std::cell::Cell<usize>,
    /// The executable's pool (what the kernels will run with) and how it chooses
    /// algorithms (see [`super::tune`]).
    pub pool: Option<&'a Pool>,
    pub tuning: &'a Tuning,
    /// The pass options, for the bodies of control-flow ops (compiled like a program).
    pub passes: &'a CompileOptions,
}

impl Build<'_> {
    pub(crate) fn input(&self, k: usize) -> Option<&Slot> {
        self.ins.get(k).and_then(Option::as_ref)
    }
    /// A scratch buffer of `bytes` for this step (valid only while it runs).
    pub(crate) fn scratch(&self, bytes: usize) -> Loc {
        self.scratch_bytes.set(self.scratch_bytes.get().max(bytes));
        Loc::Arena(self.scratch_at)
    }
    pub(crate) fn constant(&self, k: usize) -> Option<&Tensor> {
        self.in_data.get(k).copied().flatten()
    }
    /// Whether every input and output present is f32.
    pub(crate) fn all_f32(&self) -> bool {
        self.ins
            .iter()
            .flatten()
            .chain(self.outs)
            .all(|s| s.dtype == crate::ir::DType::F32)
    }
}

type Builder = fn(&Build) -> Result<Option<Box<dyn Kernel>>, String>;

/// The family builders, tried in order.
const FAMILIES: &[Builder] = &[
    control::build,
    custom::build,
    matmul::build,
    conv_grad::build,
    conv::build,
    conv_elem::build,
    backward::build_max_pool_indices,
    nn::build,
    attention::build,
    reduce::build,
    reduce::build_topk,
    eltwise::build,
    unary::build,
    elementwise_any::build,
    view::build,
    movement::build,
    quant::build,
    trees::build,
    rnn::build,
    rnn_elem::build,
    mel::build,
    label_encoder::build,
    rnn::build_quant_lstm,
    backward::build,
    index_ops::build,
    loss_sample::build,
    scatter_elem::build,
];

/// The kernel for `b`'s node: the first family that covers it, else for a registered op
/// its own `eval` on copies, else (only with the `allow-fallback` option) the
/// interpreter's op on copies.
pub(crate) fn build(b: &Build) -> Result<Box<dyn Kernel>, String> {
    for family in FAMILIES {
        if let Some(k) = family(b)? {
            return Ok(k);
        }
    }
    let registered = matches!(
        b.g.op_impl(&b.node.op),
        Some(crate::ir::ops::custom::OpRef::Registered(_))
    );
    if registered || b.passes.allow_fallback {
        return fallback::build(b);
    }
    let dtypes = |s: &mut dyn Iterator<Item = &Slot>| {
        s.map(|s| s.dtype.name()).collect::<Vec<_>>().join(", ")
    };
    Err(format!(
        "no cpu kernel for {} of ({}) → ({}), shapes {} (KILN_ALLOW_FALLBACK=1 runs it on the reference interpreter, for debugging)",
        b.node.op,
        dtypes(&mut b.ins.iter().flatten()),
        dtypes(&mut b.outs.iter()),
        super::lower::shapes_of(b.ins, b.outs),
    ))
}
