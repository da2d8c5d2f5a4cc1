//! Data movement. Ops that only relabel the shape (`Reshape`, `Flatten`, `Squeeze`,
//! `Unsqueeze`, `Identity`): the memory planner usually gives the output the input's
//! buffer, and then the step does nothing; otherwise it copies the bytes (the other
//! data movement is [`super::movement`]'s).
use crate::backend::cpu::program::{Cx, Kernel, Slot};

use super::Build;

pub struct Copy {
    from: Slot,
    to: Slot,
}

impl Copy {
    /// A copy of `from`'s bytes to `to` (of the same size).
    pub(crate) fn new(from: Slot, to: Slot) -> Copy {
        debug_assert_eq!(from.bytes(), to.bytes());
        Copy { from, to }
    }
}

pub(crate) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    if !matches!(
        b.node.op.as_str(),
        "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" | "Identity"
    ) {
        return Ok(None);
    }
    let from = b.input(0).ok_or("missing input 0")?.clone();
    let to = b.outs[0].clone();
    if from.bytes() != to.bytes() {
        return Err(format!(
            "a view of {} bytes as {} bytes",
            from.bytes(),
            to.bytes()
        ));
    }
    Ok(Some(Box::new(Copy { from, to })))
}

impl Kernel for Copy {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let (src, dst) = (cx.ptr(self.from.loc), cx.ptr(self.to.loc));
        if src != dst {
            // SAFETY: both slots hold to.bytes() (equal sizes: `build`'s check, `new`'s
            // contract), live for the run; a view not given its input's buffer gets a
            // buffer of its own, so the two do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(src, dst, self.to.bytes()) };
        }
        Ok(())
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "copy"
    }
}
