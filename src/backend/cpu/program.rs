//! What lowering produces: a flat list of kernel steps over one arena. Running it walks
//! the list; nothing is looked up, allocated or locked per step (except by the generic
//! fallback step, see `steps::fallback`).
use crate::ir::{DType, Graph, NodeId};

use super::pool::Pool;

/// Where a value's bytes are while a program runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loc {
    /// At this byte offset of the run's arena (the memory plan's placement).
    Arena(usize),
    /// In a constant the program owns (weights), at a stable address.
    Const(*const u8),
    /// The graph input with this index, read in place from the caller's tensor.
    Input(usize),
    /// Variable storage: for `n` variables, `k < n` is variable `k`'s current value
    /// (what runs read) and `n + k` the buffer its next value is computed into (which a
    /// successful run makes current; see `state`).
    State(usize),
}

// SAFETY: `Const` points into buffers the program owns and never mutates after lowering.
unsafe impl Send for Loc {}
// SAFETY: a `Loc` is an offset, an index or a `Const` address of bytes that nothing
// writes after lowering, so reading one from many threads only ever reads.
unsafe impl Sync for Loc {}

/// A value as kernels see it: where, what dtype, what (static) shape.
#[derive(Debug, Clone)]
pub struct Slot {
    pub loc: Loc,
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl Slot {
    /// Elements.
    pub(crate) fn elements(&self) -> usize {
        self.shape.iter().product()
    }
    pub(crate) fn bytes(&self) -> usize {
        self.elements() * self.dtype.size_in_bytes()
    }
}

/// One run's view of memory.
pub struct Cx<'a> {
    pub arena: *mut u8,
    pub inputs: &'a [*const u8],
    /// The variables' buffers, indexed by [`Loc::State`].
    pub state: &'a [*mut u8],
    pub pool: Option<&'a Pool>,
}

// SAFETY: a run's tasks share the context read-only; which bytes each writes is the
// kernels' business (disjoint per task).
unsafe impl Sync for Cx<'_> {}

impl Cx<'_> {
    /// The address of `slot`'s first byte.
    pub(crate) fn ptr(&self, loc: Loc) -> *mut u8 {
        match loc {
            // SAFETY: offsets come from the plan and lie inside the arena.
            Loc::Arena(off) => unsafe { self.arena.add(off) },
            Loc::Const(p) => p as *mut u8,
            Loc::Input(i) => self.inputs[i] as *mut u8,
            Loc::State(k) => self.state[k],
        }
    }
    pub(crate) fn f32(&self, s: &Slot) -> *const f32 {
        self.ptr(s.loc) as *const f32
    }
    pub(crate) fn f32_mut(&self, s: &Slot) -> *mut f32 {
        self.ptr(s.loc) as *mut f32
    }
}

/// A lowered node.
pub trait Kernel: Send + Sync {
    /// Runs the step.
    ///
    /// # Safety
    /// `cx` must hold an arena of the program's size and its inputs, of the types the
    /// program was lowered for.
    unsafe fn run(&self, cx: &Cx) -> Result<(), String>;
    /// A short name for profiles and dumps (`gemm`, `conv-blocked`, `fallback`…).
    fn kind(&self) -> &'static str;
    /// Whether `run` may return an error. Kernels whose run has no error path say no;
    /// lowering updates variables in place only when no step after the update can fail.
    fn can_fail(&self) -> bool {
        true
    }
    /// The programs a control-flow step runs (its branches or body), for reports.
    fn bodies(&self) -> Vec<&super::lower::Program> {
        vec![]
    }
}

/// The node a step came from, for errors, profiles and traces: its id in the optimized
/// graph (the `#12` the graph picture and the plan view show too), name and op.
#[derive(Debug, Clone)]
pub struct StepNode {
    pub id: NodeId,
    pub name: String,
    pub op: String,
}

impl StepNode {
    pub(crate) fn of(g: &Graph, id: NodeId) -> StepNode {
        let n = g.node(id);
        StepNode {
            id,
            name: n.name.clone(),
            op: n.op.clone(),
        }
    }
}

impl std::fmt::Display for StepNode {
    /// As [`Graph::describe`] writes it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "node #{} '{}' ({})", self.id.0, self.name, self.op)
    }
}

/// A step: the node it came from and its kernel, with what profiles and traces report.
pub struct Step {
    pub node: StepNode,
    pub kernel: Box<dyn Kernel>,
    /// Whether it writes a variable's next value over its current one.
    pub updates_variable: bool,
    /// Its floating-point work per run (matrix products, convolutions and recurrent
    /// layers; 0 for the rest).
    pub flops: f64,
    /// Its operands' shapes (`1×3×224×224, 64×3×7×7 → 1×64×112×112`) and bytes.
    pub shapes: String,
    pub bytes: usize,
    /// The arena bytes the memory plan has live while it runs.
    pub live_bytes: usize,
}

/// A step whose output extent depends on the data (`NonMaxSuppression`, `NonZero`): it
/// writes its result compactly at the start of an upper-bound buffer and returns the
/// size of the output's one dynamic axis.
pub trait Source: Send + Sync {
    /// Runs the step.
    ///
    /// # Safety
    /// As for [`Kernel::run`].
    unsafe fn run(&self, cx: &Cx) -> Result<usize, String>;
    /// As for [`Kernel::kind`].
    fn kind(&self) -> &'static str;
}
