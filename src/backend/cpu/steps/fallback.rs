//! The generic step: copies the inputs out of the arena into tensors, runs the op's
//! `eval`, checks what it returns against the lowered types and copies it back. It
//! allocates per run. For a catalogue op that `eval` is the interpreter's (`fallback`,
//! only under `allow-fallback`); for a registered op without a buffer kernel it is the
//! op's own implementation, its author's kernel (`custom-eval`, always).
use crate::backend::cpu::program::{Cx, Kernel, Slot};
use crate::ir::ops::custom::{self, OpRef};
use crate::ir::ops::EvalCtx;
use crate::ir::{Attrs, TensorType};
use crate::tensor::Tensor;

use super::Build;

pub struct Fallback {
    op: OpRef,
    kind: &'static str,
    attrs: Attrs,
    ins: Vec<Option<Slot>>,
    in_types: Vec<Option<TensorType>>,
    outs: Vec<Slot>,
}

pub(crate) fn build(b: &Build) -> Result<Box<dyn Kernel>, String> {
    let op =
        b.g.op_impl(&b.node.op)
            .ok_or_else(|| format!("unknown op {}", b.node.op))?;
    let in_types = b
        .node
        .inputs
        .iter()
        .map(|v| v.map(|v| b.g.node(v.node).outputs[v.output as usize].clone()))
        .collect();
    let kind = match op {
        OpRef::Registered(_) => "custom-eval",
        OpRef::Catalogue(_) => "fallback",
    };
    Ok(Box::new(Fallback {
        op,
        kind,
        attrs: b.node.attrs.clone(),
        ins: b.ins.to_vec(),
        in_types,
        outs: b.outs.to_vec(),
    }))
}

/// The tensor in `s`, copied out of memory.
///
/// # Safety
/// `s` must address `s.bytes()` readable bytes under `cx`.
pub(crate) unsafe fn read(cx: &Cx, s: &Slot) -> Result<Tensor, String> {
    // SAFETY: `s` addresses s.bytes() readable bytes under `cx` (the contract).
    let bytes = unsafe { std::slice::from_raw_parts(cx.ptr(s.loc), s.bytes()) };
    Tensor::from_le_bytes(s.dtype, &s.shape, bytes)
}

/// Copies `t` into `s`, checking that it is what `s` was lowered for.
///
/// # Safety
/// `s` must address `s.bytes()` writable bytes under `cx`.
pub(crate) unsafe fn write(cx: &Cx, s: &Slot, t: &Tensor) -> Result<(), String> {
    if t.dtype() != s.dtype || t.shape() != s.shape.as_slice() {
        return Err(format!(
            "produced {}{:?}, lowered for {}{:?}",
            t.dtype(),
            t.shape(),
            s.dtype,
            s.shape
        ));
    }
    let bytes = t.to_le_bytes();
    // SAFETY: `t` has s's dtype and shape (checked above), so its bytes are s.bytes(),
    // which `s` addresses writable (the contract); `bytes` is a fresh Vec.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), cx.ptr(s.loc), bytes.len()) };
    Ok(())
}

impl Kernel for Fallback {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let ins = self
            .ins
            .iter()
            // SAFETY: each present input slot addresses its s.bytes() under `cx`, as
            // Kernel::run's contract has the program's slots live for the run.
            .map(|s| s.as_ref().map(|s| unsafe { read(cx, s) }).transpose())
            .collect::<Result<Vec<_>, _>>()?;
        let args: Vec<Option<&Tensor>> = ins.iter().map(Option::as_ref).collect();
        let types: Vec<Option<&TensorType>> = self.in_types.iter().map(Option::as_ref).collect();
        let outs = custom::contain(&self.op, || {
            crate::ir::ops::evaluate(
                &*self.op,
                &EvalCtx {
                    inputs: &args,
                    input_types: &types,
                    attrs: &self.attrs,
                },
            )
        })?;
        if outs.len() != self.outs.len() {
            return Err(format!(
                "produced {} outputs, expected {}",
                outs.len(),
                self.outs.len()
            ));
        }
        for (k, (t, s)) in outs.iter().zip(&self.outs).enumerate() {
            // SAFETY: output slot s addresses s.bytes() writable bytes for this run (the
            // program's slots, by Kernel::run's contract); the inputs were copied out.
            unsafe { write(cx, s, t) }.map_err(|e| format!("output {k}: {e}"))?;
        }
        Ok(())
    }
    fn kind(&self) -> &'static str {
        self.kind
    }
}
