//! Registered ops with a buffer kernel (C kernels registered through
//! `kiln_register_op`): the kernel computes on the arena's buffers as planned (in place
//! when the op allows it and the planner chose it), with no copies, where the generic
//! fallback would copy every input and output.
use std::sync::Arc;

use crate::backend::cpu::program::{Cx, Kernel, Slot};
use crate::backend::registered::{BufferKernel, Kernels, RawTensor};
use crate::ir::ops::custom::{self, OpRef};
use crate::ir::Attrs;

use super::Build;

pub struct Custom {
    /// Held so the registration outlives the program; `contain` names it.
    op: OpRef,
    kernel: Arc<dyn BufferKernel>,
    attrs: Attrs,
    ins: Vec<Option<Slot>>,
    outs: Vec<Slot>,
}

pub(crate) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    if !b.node.op.contains("::") {
        return Ok(None);
    }
    let Some(op) = b.g.op_impl(&b.node.op) else {
        return Ok(None);
    };
    if !matches!(op, OpRef::Registered(_)) {
        return Ok(None);
    }
    let Some(kernel) = Kernels::of(&*op).and_then(|k| k.buffers.clone()) else {
        return Ok(None);
    };
    Ok(Some(Box::new(Custom {
        op,
        kernel,
        attrs: b.node.attrs.clone(),
        ins: b.ins.to_vec(),
        outs: b.outs.to_vec(),
    })))
}

impl Kernel for Custom {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let raw = |s: &Slot| RawTensor {
            data: cx.ptr(s.loc),
            dtype: s.dtype,
            shape: s.shape.clone(),
        };
        let ins: Vec<Option<RawTensor>> = self.ins.iter().map(|s| s.as_ref().map(raw)).collect();
        let outs: Vec<RawTensor> = self.outs.iter().map(raw).collect();
        custom::contain(&self.op, || self.kernel.compute(&ins, &outs, &self.attrs))
    }
    fn kind(&self) -> &'static str {
        "custom"
    }
}
