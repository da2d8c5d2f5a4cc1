//! Data movement. Ops that only relabel the shape (`Reshape`, `Flatten`, `Squeeze`,
//! `Unsqueeze`, `Identity`, and `OptionalGetElement` of a plain tensor): the memory
//! planner usually gives the output the input's buffer, and then the step does nothing;
//! otherwise it copies the bytes (the other data movement is [`super::movement`]'s).
//! `OptionalHasElement` of a plain tensor or of nothing is known from the operand alone.
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
    if b.node.op == "OptionalHasElement" {
        // A lowered graph holds no optionals: the operand is a tensor or absent.
        return Ok(Some(Box::new(Fill {
            byte: u8::from(b.input(0).is_some()),
            to: b.outs[0].clone(),
        })));
    }
    if !matches!(
        b.node.op.as_str(),
        "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" | "Identity" | "OptionalGetElement"
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

/// Every byte of a slot set to one value: a result known from the types alone (bools).
pub(crate) struct Fill {
    pub(crate) byte: u8,
    pub(crate) to: Slot,
}

impl Kernel for Fill {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: the output slot addresses to.bytes() writable bytes for the run.
        unsafe { std::ptr::write_bytes(cx.ptr(self.to.loc), self.byte, self.to.bytes()) };
        Ok(())
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "constant"
    }
}
