//! Bit operations on integers: BitShift, BitwiseAnd/Or/Xor (numpy broadcasting) and
//! BitwiseNot. They work on the bits of each dtype (via i64 and back, which keeps them).
use super::elementwise::zip_broadcast;
use super::util::{out, same_dtype};
use super::{leak, AttrSpec, EvalCtx, InferCtx, Op, OpSchema};
use crate::ir::ops::{InPlace, Origin};
use crate::ir::shape::broadcast_shapes;
use crate::ir::{AttrKind, DType, TensorType};
use crate::tensor::Tensor;

fn integer(t: &TensorType, i: usize) -> Result<(), String> {
    if t.dtype.is_int() {
        Ok(())
    } else {
        Err(format!(
            "input {i} must be an integer type, got {}",
            t.dtype
        ))
    }
}

/// Bits of dtype `d`, for shifts.
fn width(d: DType) -> u32 {
    8 * d.size_in_bytes() as u32
}

#[derive(Clone, Copy)]
enum Kind {
    Shift,
    And,
    Or,
    Xor,
}

struct Binary {
    schema: OpSchema,
    kind: Kind,
}

impl Op for Binary {
    fn schema(&self) -> &OpSchema {
        &self.schema
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (a, b) = (cx.input(0)?, cx.input(1)?);
        integer(a, 0)?;
        let dtype = same_dtype(self.schema.name, &[a, b])?;
        if let Kind::Shift = self.kind {
            match cx.attrs.string("direction")? {
                Some("LEFT" | "RIGHT") => {}
                Some(d) => return Err(format!("direction must be LEFT or RIGHT, got '{d}'")),
                None => return Err("missing required attribute 'direction'".into()),
            }
        }
        Ok(out(dtype, broadcast_shapes(&a.shape, &b.shape)?))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let (a, b) = (cx.input(0)?, cx.input(1)?);
        let dtype = a.dtype();
        let bits = width(dtype);
        let left = cx.attrs.string_or("direction", "")? == "LEFT";
        // Unsigned values as their u64 bit patterns (masked to the dtype's width).
        let mask = if bits == 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        };
        let signed = dtype.is_signed();
        let y = zip_broadcast(&a.to_i64_array(), &b.to_i64_array(), |x, y| {
            match self.kind {
                Kind::And => x & y,
                Kind::Or => x | y,
                Kind::Xor => x ^ y,
                // Shifts of `bits` or more (or negative ones) shift everything out: 0,
                // or -1 for a negative value shifted right. Signed values shift their
                // bits left (wrapping) and arithmetically right.
                Kind::Shift if signed => match u32::try_from(y) {
                    Ok(s) if s < bits && left => (((x as u64) << s) & mask) as i64,
                    Ok(s) if s < bits => x >> s,
                    _ if !left && x < 0 => -1,
                    _ => 0,
                },
                Kind::Shift => {
                    let (x, s) = ((x as u64) & mask, y as u64);
                    let r = if s >= bits as u64 {
                        0
                    } else if left {
                        (x << s) & mask
                    } else {
                        x >> s
                    };
                    r as i64
                }
            }
        })?;
        Ok(vec![Tensor::from_i64_array(dtype, y)])
    }
}

struct Not;

const NOT: OpSchema = OpSchema {
    name: "BitwiseNot",
    family: "bitwise",
    inputs: &["X"],
    outputs: &["Y"],
    attrs: &[],
    doc: "Flips every bit.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

impl Op for Not {
    fn schema(&self) -> &OpSchema {
        &NOT
    }
    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        integer(x, 0)?;
        Ok(vec![x.clone()])
    }
    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        Ok(vec![Tensor::from_i64_array(
            x.dtype(),
            x.to_i64_array().mapv(|v| !v),
        )])
    }
}

fn binary(
    name: &'static str,
    doc: &'static str,
    attrs: &'static [AttrSpec],
    kind: Kind,
) -> &'static dyn Op {
    leak(Binary {
        schema: OpSchema {
            name,
            family: "bitwise",
            inputs: &["A", "B"],
            outputs: &["C"],
            attrs,
            doc,
            in_place: InPlace::No,
            origin: Origin::Onnx,
        },
        kind,
    })
}

pub(crate) fn ops() -> Vec<&'static dyn Op> {
    const SHIFT: &[AttrSpec] = &[AttrSpec::req("direction", AttrKind::String)];
    vec![
        binary(
            "BitShift",
            "Shifts X left or right by Y bits (`direction`): signed values wrap left and \
             shift arithmetically right; shifts out of 0..bits give 0 (or -1 for a \
             negative value shifted right).",
            SHIFT,
            Kind::Shift,
        ),
        binary(
            "BitwiseAnd",
            "Bitwise and, numpy broadcasting.",
            &[],
            Kind::And,
        ),
        binary(
            "BitwiseOr",
            "Bitwise or, numpy broadcasting.",
            &[],
            Kind::Or,
        ),
        binary(
            "BitwiseXor",
            "Bitwise exclusive or, numpy broadcasting.",
            &[],
            Kind::Xor,
        ),
        leak(Not),
    ]
}
