//! The optimizing CPU backend: the pass pipeline, then lowering of the optimized IR to a
//! flat list of kernel calls over one arena laid out by the memory planner.
pub mod isa;
pub mod kernels;
pub mod pool;
