//! Sources (`Parameter`, `Constant`, `Variable`) and `Assign`, the only mutation.
//!
//! Sources are typed by declaration, not inference, and produce their values from the
//! runtime (inputs, data, state); `Assign` writes the runtime's variable state. So their
//! `eval` is never called by the interpreter, which handles them itself.
use super::{leak, EvalCtx, InferCtx, Op, OpSchema};
use crate::ir::ops::{InPlace, Origin};
use crate::ir::TensorType;
use crate::tensor::Tensor;

struct Source(OpSchema);

impl Op for Source {
    fn schema(&self) -> &OpSchema {
        &self.0
    }
    fn infer(&self, _: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        Err(format!("{} is typed by declaration", self.0.name))
    }
    fn eval(&self, _: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        Err(format!("{} is produced by the runtime", self.0.name))
    }
}

struct Assign;

const ASSIGN: OpSchema = OpSchema {
    name: "Assign",
    family: "state",
    inputs: &["variable", "value"],
    outputs: &[],
    attrs: &[],
    doc: "Kiln-only. Stores `value` into the Variable `variable` when the node runs; order it with control dependencies. Produces no value.",
    in_place: InPlace::No,
    origin: Origin::Kiln,
};

impl Op for Assign {
    fn schema(&self) -> &OpSchema {
        &ASSIGN
    }
    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (var, value) = (cx.input(0)?, cx.input(1)?);
        if var.dtype != value.dtype || var.shape.dims() != value.shape.dims() {
            return Err(format!(
                "cannot assign a {value} to a variable of type {var}"
            ));
        }
        Ok(vec![])
    }
    fn eval(&self, _: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        Err("Assign is executed by the runtime".into())
    }
}

pub(crate) fn ops() -> Vec<&'static dyn Op> {
    vec![
        leak(Source(OpSchema {
            name: "Parameter",
            family: "source",
            inputs: &[],
            outputs: &["value"],
            attrs: &[],
            doc: "A graph input, in creation order; its name is the node name.",
            in_place: InPlace::No,
            origin: Origin::Kiln,
        })),
        leak(Source(OpSchema {
            name: "Constant",
            family: "source",
            inputs: &[],
            outputs: &["value"],
            attrs: &[],
            doc: "A constant tensor carried by the node.",
            in_place: InPlace::No,
            origin: Origin::Onnx,
        })),
        leak(Source(OpSchema {
            name: "Variable",
            family: "source",
            inputs: &[],
            outputs: &["value"],
            attrs: &[],
            doc: "Kiln-only. State that persists across runs, starting from the node's data; changed only by Assign.",
            in_place: InPlace::No,
            origin: Origin::Kiln,
        })),
        leak(Assign),
    ]
}
