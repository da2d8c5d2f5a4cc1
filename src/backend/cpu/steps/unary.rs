//! One-input elementwise ops on every dtype the f32 paths of [`super::eltwise`] leave:
//! `Cast` and `CastLike` wherever a float8, float4 or sub-byte integer is involved (and
//! `CastLike` between any pair; `Cast` between the other numeric dtypes is
//! [`super::movement`]'s), `BitCast`, the unary math ops and activations on any float
//! dtype (the trigonometric and hyperbolic ones, Shrink and Celu on f32 too), their
//! integer forms, `Not`, `BitwiseNot`, `IsNaN` and `IsInf`. Each is one typed loop over
//! the slots' memory (see [`crate::backend::cpu::kernels::unary`]); an op the planner
//! runs in place reads each element before it writes it.
use crate::backend::cpu::kernels::movement;
use crate::backend::cpu::kernels::unary::{self as k, Encoder, FloatOp, IntOp, Predicate, Src};
use crate::backend::cpu::program::{Cx, Kernel, Loc, Slot};
use crate::ir::DType;
use crate::tensor::lowbit::E8M0Rounding;
use crate::tensor::Elem;
use crate::with_dtype;

use super::Build;

enum What {
    /// `Cast`/`CastLike` to the input's own dtype: a copy (nothing when in place).
    Copy,
    /// `Cast`/`CastLike` by the element types' conversion (the interpreter's `Cast`).
    Convert,
    /// `Cast` to e8m0, or to another float8 with `saturate = 0`.
    Encode(Encoder),
    /// `BitCast` that keeps the bytes.
    Bits,
    /// `BitCast` between one-byte dtypes that checks or masks each byte.
    BitsChecked,
    Float(FloatOp),
    Int(IntOp),
    Predicate(Predicate),
}

pub struct UnaryStep {
    what: What,
    x: Slot,
    y: Slot,
    /// Where x is first copied (and its sub-byte integers sign-extended) when the step
    /// cannot read it where it is.
    stage: Option<Loc>,
}

/// Whether [`movement`]'s `Cast` covers `d` (the plain numeric dtypes and bool).
fn plain(d: DType) -> bool {
    d.is_float() || d.is_int() || d == DType::Bool
}

/// Whether `d` is one of the sub-byte integers, whose memory form may be either.
fn sub_byte_signed(d: DType) -> bool {
    matches!(d, DType::I4 | DType::I2)
}

fn cast_what(b: &Build, x: &Slot, y: &Slot) -> Result<Option<What>, String> {
    if b.node.op == "Cast" && plain(x.dtype) && plain(y.dtype) {
        return Ok(None);
    }
    if x.dtype == y.dtype {
        return Ok(Some(What::Copy));
    }
    let saturate = b.node.attrs.int_or("saturate", 1)? != 0;
    let mode: E8M0Rounding = b.node.attrs.string_or("round_mode", "up")?.parse()?;
    Ok(Some(match Encoder::of(y.dtype, saturate, mode) {
        Some(enc) => What::Encode(enc),
        None => What::Convert,
    }))
}

fn bitcast_what(x: &Slot, y: &Slot) -> Option<What> {
    if x.dtype.size_in_bytes() != y.dtype.size_in_bytes() {
        return None;
    }
    // Bytes a plain dtype takes as they are; a bool or low-bit target checks each one,
    // and a sub-byte integer source gives only its low bits (as its tensor's bytes do).
    let kept = y.dtype.is_float() || y.dtype.is_int();
    Some(if kept && !sub_byte_signed(x.dtype) {
        What::Bits
    } else {
        What::BitsChecked
    })
}

fn op_what(b: &Build, x: &Slot, y: &Slot) -> Result<Option<What>, String> {
    let op = b.node.op.as_str();
    if b.ins.len() != 1 {
        return Ok(None);
    }
    if op == "IsNaN" || op == "IsInf" {
        if !x.dtype.is_float() || y.dtype != DType::Bool {
            return Ok(None);
        }
        let flag = |k: &str| b.node.attrs.int_or(k, 1).map(|v| v != 0);
        return Ok(Some(What::Predicate(if op == "IsNaN" {
            Predicate::IsNaN
        } else {
            Predicate::IsInf {
                positive: flag("detect_positive")?,
                negative: flag("detect_negative")?,
            }
        })));
    }
    if x.dtype != y.dtype {
        return Ok(None);
    }
    // The interpreter's choice: an op's integer form on every dtype but the floats.
    if let Some(int) = IntOp::of(op) {
        if !x.dtype.is_float() || int == IntOp::BitwiseNot {
            return Ok(Some(What::Int(int)));
        }
    }
    Ok(FloatOp::of(op, &b.node.attrs)?.map(What::Float))
}

pub(crate) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let (Some(x), [y]) = (b.input(0), b.outs) else {
        return Ok(None);
    };
    if x.dtype == DType::String || y.dtype == DType::String || x.elements() != y.elements() {
        return Ok(None);
    }
    let what = match b.node.op.as_str() {
        "Cast" | "CastLike" => cast_what(b, x, y)?,
        "BitCast" => bitcast_what(x, y),
        _ => op_what(b, x, y)?,
    };
    let Some(what) = what else { return Ok(None) };
    // In place on its own dtype a loop reads each element before writing it; anything
    // else the planner would put in x's buffer reads x from a copy.
    let aliased = x.loc == y.loc && x.dtype != y.dtype;
    let reads_elements = !matches!(what, What::Copy | What::Bits | What::BitsChecked);
    let stage =
        (aliased || (reads_elements && sub_byte_signed(x.dtype))).then(|| b.scratch(x.bytes()));
    Ok(Some(Box::new(UnaryStep {
        what,
        x: x.clone(),
        y: y.clone(),
        stage,
    })))
}

/// `n` elements of `T` at `p`, read-only.
///
/// # Safety
/// `p` holds `n` initialized `T`s that nothing writes while the slice lives.
unsafe fn elems<'a, T>(p: *const u8, n: usize) -> &'a [T] {
    // SAFETY: the caller's promise: `n` live `T`s at `p`, aligned as the plan aligns.
    unsafe { std::slice::from_raw_parts(p as *const T, n) }
}

/// `n` elements of `T` at `p`, for writing.
///
/// # Safety
/// `p` holds `n` `T`s that nothing else reads or writes while the slice lives.
unsafe fn elems_mut<'a, T>(p: *mut u8, n: usize) -> &'a mut [T] {
    // SAFETY: the caller's promise: `n` `T`s at `p`, this slice their only user.
    unsafe { std::slice::from_raw_parts_mut(p as *mut T, n) }
}

/// The float or integer op on `T`, reading `src` (`None`: in place on the output).
///
/// # Safety
/// `src` holds `y.elements()` `T`s other than y's buffer; y's slot holds them too.
unsafe fn run_same<T: Elem>(
    cx: &Cx,
    what: &What,
    src: Option<*const u8>,
    y: &Slot,
) -> Result<(), String> {
    let n = y.elements();
    // SAFETY: y's slot holds n `T`s (the step's dtype) and only this step writes it now.
    let out = unsafe { elems_mut::<T>(cx.ptr(y.loc), n) };
    // SAFETY: src is another buffer holding n `T`s (the contract), read-only here.
    let x = src.map_or(Src::InPlace, |p| Src::Other(unsafe { elems::<T>(p, n) }));
    match what {
        What::Float(op) => k::float(*op, cx.pool, x, out),
        What::Int(op) => k::int(*op, cx.pool, x, out),
        _ => unreachable!("run_same runs the float and integer ops"),
    }
    Ok(())
}

/// IsNaN/IsInf on `T`s at `src` into y's bools.
///
/// # Safety
/// `src` holds `y.elements()` `T`s, a buffer other than y's bool slot.
unsafe fn run_predicate<T: Elem>(
    cx: &Cx,
    p: Predicate,
    src: *const u8,
    y: &Slot,
) -> Result<(), String> {
    let n = y.elements();
    // SAFETY: the float input's n elements at `src` (the contract), only read.
    let x = unsafe { elems::<T>(src, n) };
    // SAFETY: y's bool slot, n bytes, written only here and distinct from `src`.
    let out = unsafe { elems_mut::<bool>(cx.ptr(y.loc), n) };
    k::predicate(p, cx.pool, x, out);
    Ok(())
}

/// The float8 codes of the `S`s at `src` into y.
///
/// # Safety
/// `src` holds `y.elements()` `S`s, a buffer other than y's one-byte slot.
unsafe fn run_encode<S: Elem>(
    cx: &Cx,
    enc: Encoder,
    src: *const u8,
    y: &Slot,
) -> Result<(), String> {
    let n = y.elements();
    // SAFETY: n source elements of S at `src` (the contract), not written meanwhile.
    let x = unsafe { elems::<S>(src, n) };
    // SAFETY: y is a float8 slot, one byte per element, distinct from the source.
    let out = unsafe { elems_mut::<u8>(cx.ptr(y.loc), n) };
    k::encode(enc, cx.pool, x, out);
    Ok(())
}

/// Calls `$f::<$s, D>` with `D` the element type of `$dtype` (as `with_dtype!` does for
/// one type).
macro_rules! with_dst {
    ($dtype:expr, $f:ident::<$s:ty>($($arg:expr),*)) => {{
        use crate::tensor::lowbit::*;
        match $dtype {
            DType::F32 => $f::<$s, f32>($($arg),*),
            DType::F64 => $f::<$s, f64>($($arg),*),
            DType::F16 => $f::<$s, half::f16>($($arg),*),
            DType::BF16 => $f::<$s, half::bf16>($($arg),*),
            DType::I8 => $f::<$s, i8>($($arg),*),
            DType::U8 => $f::<$s, u8>($($arg),*),
            DType::I32 => $f::<$s, i32>($($arg),*),
            DType::I64 => $f::<$s, i64>($($arg),*),
            DType::Bool => $f::<$s, bool>($($arg),*),
            DType::I16 => $f::<$s, i16>($($arg),*),
            DType::U16 => $f::<$s, u16>($($arg),*),
            DType::U32 => $f::<$s, u32>($($arg),*),
            DType::U64 => $f::<$s, u64>($($arg),*),
            DType::F8E4M3FN => $f::<$s, F8E4M3FN>($($arg),*),
            DType::F8E4M3FNUZ => $f::<$s, F8E4M3FNUZ>($($arg),*),
            DType::F8E5M2 => $f::<$s, F8E5M2>($($arg),*),
            DType::F8E5M2FNUZ => $f::<$s, F8E5M2FNUZ>($($arg),*),
            DType::F8E8M0 => $f::<$s, F8E8M0>($($arg),*),
            DType::F4E2M1 => $f::<$s, F4E2M1>($($arg),*),
            DType::I4 => $f::<$s, I4>($($arg),*),
            DType::U4 => $f::<$s, U4>($($arg),*),
            DType::I2 => $f::<$s, I2>($($arg),*),
            DType::U2 => $f::<$s, U2>($($arg),*),
            other => return Err(format!("{other} is not a numeric dtype here")),
        }
    }};
}

/// `Cast` of the `S`s at `src` into y's dtype.
///
/// # Safety
/// `src` holds `y.elements()` `S`s (sign-extended if sub-byte), not y's buffer unless
/// the element sizes are equal.
unsafe fn run_convert<S: Elem>(cx: &Cx, src: *const u8, y: &Slot) -> Result<(), String> {
    // SAFETY: passed on from this function's contract, with y's slot of its dtype.
    unsafe { with_dst!(y.dtype, convert_to::<S>(cx, src, y)) }
}

/// # Safety
/// As for [`run_convert`], y's slot holding `D`s.
unsafe fn convert_to<S: Elem, D: Elem>(cx: &Cx, src: *const u8, y: &Slot) -> Result<(), String> {
    let (dst, n) = (cx.ptr(y.loc) as *mut D, y.elements());
    // SAFETY: n `S`s at src and n `D`s at dst, the same buffer only for equal sizes,
    // which `movement::cast` allows (it reads each element before writing it).
    unsafe { movement::cast(src as *const S, dst, n, cx.pool) };
    Ok(())
}

impl Kernel for UnaryStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let Self { what, x, y, stage } = self;
        if y.elements() == 0 {
            return Ok(());
        }
        let (at, dst) = (cx.ptr(x.loc), cx.ptr(y.loc));
        let src = match stage {
            Some(s) => {
                let s = cx.ptr(*s);
                // SAFETY: x's slot holds x.bytes() and the scratch that build sized for
                // them is another buffer, written only here.
                let (from, to) = unsafe { (elems::<u8>(at, x.bytes()), elems_mut(s, x.bytes())) };
                k::normalize(x.dtype, from, to);
                s as *const u8
            }
            None => at as *const u8,
        };
        // Reading y's own buffer: a staged x never is.
        let in_place = stage.is_none() && x.loc == y.loc;
        match what {
            What::Copy | What::Bits if in_place => {}
            What::Copy | What::Bits => {
                // SAFETY: equal byte sizes (a copy or a BitCast of equal element sizes),
                // and distinct addresses are distinct planned buffers.
                unsafe { std::ptr::copy_nonoverlapping(src, dst, y.bytes()) };
            }
            What::BitsChecked => {
                let n = y.elements();
                // SAFETY: one-byte elements, `n` of them at `src` (x or its staged copy,
                // which is never y's buffer: aliasing stages it).
                let from = unsafe { elems::<u8>(src, n) };
                // SAFETY: y's n one-byte elements, written only here.
                let to = unsafe { elems_mut::<u8>(dst, n) };
                k::bitcast_bytes(x.dtype, y.dtype, from, to)?;
            }
            // SAFETY: x (or its copy) holds y.elements() of x's dtype, another buffer
            // than y's unless they share a dtype (then the op runs in place).
            What::Float(_) | What::Int(_) => unsafe {
                let src = (!in_place).then_some(src);
                with_dtype!(y.dtype, run_same(cx, what, src, y))?
            },
            // SAFETY: x's floats at src, y's bools elsewhere (aliasing stages x).
            What::Predicate(p) => unsafe { with_dtype!(x.dtype, run_predicate(cx, *p, src, y))? },
            // SAFETY: x's elements at src, normalized; y's codes in another buffer.
            What::Encode(enc) => unsafe { with_dtype!(x.dtype, run_encode(cx, *enc, src, y))? },
            // SAFETY: x's elements at src, normalized; y of y's dtype, the same buffer
            // only when the planner shared one of equal element size.
            What::Convert => unsafe { with_dtype!(x.dtype, run_convert(cx, src, y))? },
        }
        Ok(())
    }
    fn can_fail(&self) -> bool {
        matches!(self.what, What::BitsChecked)
    }
    fn kind(&self) -> &'static str {
        match self.what {
            What::Copy | What::Convert | What::Encode(_) => "cast",
            What::Bits | What::BitsChecked => "bitcast",
            What::Float(_) => "unary-elem",
            What::Int(_) => "unary-int",
            What::Predicate(_) => "float-class",
        }
    }
}
