//! Memory planning: where every intermediate tensor of a scheduled graph lives in one
//! preallocated arena.
//!
//! [`plan`] takes a graph and the order its nodes run (usually `g.schedule()?`) and
//! returns a [`MemoryPlan`]; [`to_json`] and [`to_svg`] report it, [`plan_view`] draws
//! it with the backend's steps.
//!
//! # What lives in the arena
//!
//! Every output of every scheduled node except the sources: `Parameter`, `Constant` and
//! `Variable` hold graph inputs, weights and state, which live outside (and `Assign` has
//! no outputs). Graph outputs are in the arena and live to the end of the schedule; an
//! output nobody reads lives only at the step that makes it. Every arena value must have
//! a static type: specialize symbolic dims first.
//!
//! Except what a variable stores: the value the last `Assign` to a variable stores
//! lives to the end of the run like an output, and its buffer (with the values before
//! it that took it over in place) is the variable's next-value storage, which the
//! executable owns ([`MemoryPlan::stored`]); it counts in none of the numbers below.
//! When that buffer's first value is computed by the last node reading the variable,
//! from the variable itself under the in-place rules below, it may overwrite the
//! variable's current value ([`StoredBuffer::in_place`]): an optimizer's moment
//! `m ← β·m + (1−β)·g` needs no second buffer.
//!
//! # Liveness ([`liveness`])
//!
//! A value is live from its def step (its node's position in the schedule) to its last
//! use (the latest step of a node reading it), both inclusive: at step `s` a node's
//! inputs and outputs are all live.
//!
//! # In-place reuse ([`inplace`])
//!
//! At step `s` an output may take over the buffer of an input that dies at `s` (its last
//! use is `s`, it is not a graph output, it is an arena value and has the same byte
//! size), each input buffer going to at most one output:
//!
//! - elementwise ops (the catalogue's `elementwise` family) and `Fused` (a fused
//!   elementwise chain): any input whose shape equals the output's, so a broadcast
//!   input, read many times, is never overwritten;
//! - `FusedConv`: only input 3, the residual (same shape);
//! - the views `Reshape`, `Flatten`, `Squeeze`, `Unsqueeze`, `Identity`: input 0, an
//!   alias of the same bytes.
//!
//! Values sharing memory form a *buffer*, live from its first value's def to its last
//! value's last use. [`MemoryPlan::buffer_of`] says which buffer a value is in.
//!
//! # Alignment
//!
//! Offsets are multiples of [`ALIGN`] (64 bytes) and every size is rounded up to it,
//! and all the byte counts of a plan are in those rounded sizes (a 4-byte scalar counts
//! 64), so the numbers below compare like with like. `bytes` fields holding a tensor's
//! exact size say so.
//!
//! # The numbers
//!
//! - `naive_bytes`: every arena value in its own buffer, nothing shared: the sum of all
//!   their sizes.
//! - `planned_bytes`: the arena the planner ([`planner`]) found: it runs several greedy
//!   heuristics (by size first fit, by size best fit, by breadth, by lifetime, by
//!   area) and keeps the smallest.
//! - `lower_bound_bytes`: the most bytes of buffers live at any one step. No placement
//!   of these buffers fits in less, so `planned_bytes / lower_bound_bytes` measures the
//!   planner (typically within a few percent); `lower_bound_without_inplace_bytes` is
//!   the same with every value its own buffer, and measures what in-place reuse saves.
pub mod inplace;
pub mod liveness;
mod plan;
pub mod plan_view;
pub mod planner;
pub mod report;
mod svg;

pub use plan::{plan, BufferPlan, MemoryPlan, StepDetail, StoredBuffer, ValuePlan};
pub use planner::ALIGN;
pub use report::to_json;
pub use svg::{to_svg, xml};
