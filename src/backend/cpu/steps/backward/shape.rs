//! `ConstantOfShape` (zeros a backward graph scatters into): a fill.
use crate::backend::cpu::program::{Cx, Kernel, Slot};

use super::super::Build;

/// `ConstantOfShape`: the output filled with one element's bytes.
pub(super) struct FillStep {
    element: Vec<u8>,
    y: Slot,
}

pub(super) fn build_fill(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let y = b.outs[0].clone();
    let v = b.node.attrs.float_or("value", 0.0)?;
    let t = crate::tensor::Tensor::from_f64s(y.dtype, &[1], &[v])?;
    Ok(Some(Box::new(FillStep {
        element: t.to_le_bytes(),
        y,
    })))
}

impl Kernel for FillStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let ptr = cx.ptr(self.y.loc);
        // SAFETY: the output slot's y.bytes() bytes, live for this run by Kernel::run's
        // contract; the fill reads no other slot.
        let out = unsafe { std::slice::from_raw_parts_mut(ptr, self.y.bytes()) };
        if self.element.iter().all(|&b| b == 0) {
            out.fill(0);
        } else {
            for chunk in out.chunks_exact_mut(self.element.len()) {
                chunk.copy_from_slice(&self.element);
            }
        }
        Ok(())
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "fill"
    }
}
