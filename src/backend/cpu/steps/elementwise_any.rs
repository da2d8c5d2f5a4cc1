//! Elementwise ops that the f32 family ([`super::eltwise`]) declines, on every numeric
//! dtype and bool, as typed loops computing what the interpreter computes
//! ([`crate::backend::cpu::kernels::elementwise_any`]): comparisons (those of f32, i32
//! and i64 are the backward family's `compare`), And/Or/Xor, the bitwise ops and
//! BitShift, Mod, Pow of mixed dtypes and of integers, variadic Sum/Mean/Max/Min, Clip
//! with constant or run-time bounds, PRelu; and `Fused` bodies the f32 loop declines
//! (other dtypes, comparisons into bool, run-time Clip bounds), as a chain of such
//! loops: each step into its own scratch region, the last into the output, exported
//! steps into their outputs. An input whose buffer an output took over is first copied
//! to scratch, so that no loop reads what it writes.
use super::eltwise::ELEM_DTYPES;
use super::Build;
use crate::backend::cpu::isa;
use crate::backend::cpu::kernels::binary::{self, BinOp, Broadcast, UnaryOp};
use crate::backend::cpu::kernels::elementwise_any::{self as any, LogicOp, SameOp, Spread, VarOp};
use crate::backend::cpu::kernels::select::{select, CmpOp, Walk};
use crate::backend::cpu::kernels::unary::{self as unary_kernels, FloatOp};
use crate::backend::cpu::kernels::Act;
use crate::backend::cpu::program::{Cx, Kernel, Loc, Slot};
use crate::ir::ops::fused::{self, Arg, Step};
use crate::ir::DType;
use crate::tensor::{Elem, Tensor};
use crate::with_dtype;

/// The single ops this family lowers (a `Fused` body may hold f32 unary ops and
/// `Where` too).
const OPS: &[&str] = &[
    "Equal",
    "Less",
    "LessOrEqual",
    "Greater",
    "GreaterOrEqual",
    "And",
    "Or",
    "Xor",
    "BitwiseAnd",
    "BitwiseOr",
    "BitwiseXor",
    "BitShift",
    "Mod",
    "Pow",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Sum",
    "Mean",
    "Max",
    "Min",
    "Clip",
    "PRelu",
];

/// A Clip bound: omitted, a constant, or the part's operand `k` (read at run time).
#[derive(Debug, Clone, Copy)]
enum Bound {
    None,
    Const(f64),
    Arg(usize),
}

enum Op {
    /// f32 arithmetic on the `binary` step's vectorized path.
    F32(BinOp, Broadcast),
    /// Arithmetic on one of [`ELEM_DTYPES`], as the `binary-elem` step computes it.
    Elem(BinOp, Broadcast),
    Same(SameOp, Broadcast),
    Cmp(CmpOp, Broadcast),
    Logic(LogicOp, Broadcast),
    /// Pow whose exponent has another dtype than its base.
    Pow(Broadcast),
    UnaryF32(UnaryOp),
    ActF32(Act),
    /// A one-input op on f64, f16 or bf16, through f64 as the `unary` step computes it.
    Float(FloatOp),
    Where(Walk),
    Clip(Bound, Bound),
    /// The fold of each operand into the accumulator at `Loc` (8 bytes an element).
    Variadic(VarOp, Vec<Spread>, Loc),
}

/// One loop: `op` over `args` into `y`, a buffer none of them is.
struct Part {
    op: Op,
    args: Vec<Slot>,
    y: Slot,
}

/// A node as a chain of elementwise loops (one for a single op).
pub struct AnyStep {
    /// Inputs an output took over, copied (from, to) before the loops run.
    copies: Vec<(Slot, Loc)>,
    parts: Vec<Part>,
    kind: &'static str,
    can_fail: bool,
}

/// The numpy broadcast of `shapes`.
fn broadcast(shapes: &[&[usize]]) -> Option<Vec<usize>> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1; rank];
    for s in shapes {
        for (o, &d) in out[rank - s.len()..].iter_mut().zip(s.iter()) {
            match (*o, d) {
                (_, 1) => {}
                (1, d) => *o = d,
                (a, d) if a == d => {}
                _ => return None,
            }
        }
    }
    Some(out)
}

/// Scratch regions laid out one after another inside the step's one scratch ask.
struct Regions {
    base: usize,
    bytes: usize,
}

impl Regions {
    fn take(&mut self, bytes: usize) -> Loc {
        let at = self.base + self.bytes;
        self.bytes += bytes.next_multiple_of(64);
        Loc::Arena(at)
    }
}

/// What a lowered body step computes: its loop, its operands, and its result's dtype
/// and shape.
type Lowered = (Op, Vec<Slot>, DType, Vec<usize>);

/// Step `st` on operands `args` (constant ones' values in `consts`); `None` when no loop
/// here computes it.
fn lower_step(
    st: &Step,
    args: &[Option<Slot>],
    consts: &[Option<&Tensor>],
    regions: &mut Regions,
) -> Result<Option<Lowered>, String> {
    let op = st.op.as_str();
    let present: Option<Vec<Slot>> = args.iter().cloned().collect();
    // Two operands of one dtype, their broadcast shape and plan.
    let pair = || -> Option<(Slot, Slot, Vec<usize>, Broadcast)> {
        let [Some(a), Some(b)] = args else {
            return None;
        };
        let shape = broadcast(&[&a.shape, &b.shape])?;
        let plan = Broadcast::new(&[&a.shape, &b.shape], &shape)?;
        Some((a.clone(), b.clone(), shape, plan))
    };
    if let Some(cmp) = CmpOp::from_op(op) {
        let Some((a, b, shape, plan)) = pair() else {
            return Ok(None);
        };
        if a.dtype != b.dtype || !(a.dtype.is_float() || a.dtype.is_int() || a.dtype == DType::Bool)
        {
            return Ok(None);
        }
        return Ok(Some((Op::Cmp(cmp, plan), vec![a, b], DType::Bool, shape)));
    }
    let same = |ok: fn(DType) -> bool, f: &dyn Fn(DType, Broadcast) -> Option<Op>| {
        let (a, b, shape, plan) = pair()?;
        if a.dtype != b.dtype || !ok(a.dtype) {
            return None;
        }
        let d = a.dtype;
        Some((f(d, plan)?, vec![a, b], d, shape))
    };
    let int = |d: DType| d.is_int();
    let num = |d: DType| d.is_float() || d.is_int();
    let lowered = match op {
        "And" | "Or" | "Xor" => {
            let l = match op {
                "And" => LogicOp::And,
                "Or" => LogicOp::Or,
                _ => LogicOp::Xor,
            };
            same(|d| d == DType::Bool, &|_, p| Some(Op::Logic(l, p)))
        }
        "BitwiseAnd" => same(int, &|_, p| Some(Op::Same(SameOp::BitAnd, p))),
        "BitwiseOr" => same(int, &|_, p| Some(Op::Same(SameOp::BitOr, p))),
        "BitwiseXor" => same(int, &|_, p| Some(Op::Same(SameOp::BitXor, p))),
        "BitShift" => {
            let left = match st.attrs.string_or("direction", "")? {
                "LEFT" => true,
                "RIGHT" => false,
                _ => return Ok(None),
            };
            same(int, &|_, p| Some(Op::Same(SameOp::Shift { left }, p)))
        }
        "Mod" => {
            let fmod = st.attrs.int_or("fmod", 0)? == 1;
            same(num, &|_, p| Some(Op::Same(SameOp::Mod { fmod }, p)))
        }
        "PRelu" => {
            let r = same(|d| d.is_float(), &|_, p| Some(Op::Same(SameOp::PRelu, p)));
            r.filter(|(_, a, _, shape)| &a[0].shape == shape)
        }
        "Pow" => match pair() {
            Some((a, b, shape, plan)) if num(a.dtype) && num(b.dtype) => {
                let d = a.dtype;
                let op = if b.dtype != d {
                    Op::Pow(plan)
                } else if d == DType::F32 {
                    Op::F32(BinOp::Pow, plan)
                } else if d.is_float() {
                    Op::Elem(BinOp::Pow, plan)
                } else {
                    Op::Same(SameOp::Arith(BinOp::Pow), plan)
                };
                Some((op, vec![a, b], d, shape))
            }
            _ => None,
        },
        "Add" | "Sub" | "Mul" | "Div" | "Max" | "Min" if args.len() == 2 => {
            let bin = super::eltwise::binary_op(op, 2).expect("an arithmetic op");
            same(num, &|d, p| match d {
                DType::F32 => Some(Op::F32(bin, p)),
                d if ELEM_DTYPES.contains(&d) => Some(Op::Elem(bin, p)),
                _ => None,
            })
        }
        "Sum" | "Mean" | "Max" | "Min" => {
            let Some(xs) = present.filter(|x| !x.is_empty()) else {
                return Ok(None);
            };
            let d = xs[0].dtype;
            let ok = if op == "Mean" { d.is_float() } else { num(d) };
            if !ok || xs.iter().any(|x| x.dtype != d) {
                return Ok(None);
            }
            let shapes: Vec<&[usize]> = xs.iter().map(|x| x.shape.as_slice()).collect();
            let Some(shape) = broadcast(&shapes) else {
                return Ok(None);
            };
            let Some(plans) = shapes
                .iter()
                .map(|s| Spread::new(&[s], &shape))
                .collect::<Option<Vec<_>>>()
            else {
                return Ok(None);
            };
            let var = match op {
                "Sum" => VarOp::Sum,
                "Mean" => VarOp::Mean,
                "Max" => VarOp::Max,
                _ => VarOp::Min,
            };
            let acc = regions.take(8 * shape.iter().product::<usize>());
            Some((Op::Variadic(var, plans, acc), xs, d, shape))
        }
        "Where" => match args {
            [Some(c), Some(x), Some(y)]
                if c.dtype == DType::Bool
                    && x.dtype == y.dtype
                    && matches!(x.dtype.size_in_bytes(), 1 | 2 | 4 | 8) =>
            {
                let shapes: [&[usize]; 3] = [&c.shape, &x.shape, &y.shape];
                broadcast(&shapes).and_then(|shape| {
                    let walk = Walk::new(&shapes, &shape)?;
                    let ops = vec![c.clone(), x.clone(), y.clone()];
                    Some((Op::Where(walk), ops, x.dtype, shape))
                })
            }
            _ => None,
        },
        "Clip" => {
            let Some(Some(x)) = args.first() else {
                return Ok(None);
            };
            if !num(x.dtype) {
                return Ok(None);
            }
            let mut ops = vec![x.clone()];
            let mut bound = |k: usize| -> Option<Bound> {
                match (args.get(k), consts.get(k).copied().flatten()) {
                    (None | Some(None), _) => Some(Bound::None),
                    (_, Some(t)) if t.len() == 1 => Some(Bound::Const(t.to_f64_vec()[0])),
                    (Some(Some(s)), _) if s.elements() == 1 && s.dtype == x.dtype => {
                        ops.push(s.clone());
                        Some(Bound::Arg(ops.len() - 1))
                    }
                    _ => None,
                }
            };
            let (Some(lo), Some(hi)) = (bound(1), bound(2)) else {
                return Ok(None);
            };
            let (d, shape) = (x.dtype, x.shape.clone());
            Some((Op::Clip(lo, hi), ops, d, shape))
        }
        _ => match args {
            [Some(x)] if x.dtype == DType::F32 => {
                let f = |k: &str, d: f64| st.attrs.float_or(k, d);
                let op = match (super::eltwise::unary_op(op), op) {
                    (Some(u), _) => Some(Op::UnaryF32(u)),
                    (None, "Gelu") => Some(Op::ActF32(
                        match st.attrs.string_or("approximate", "none")? {
                            "tanh" => Act::GeluTanh,
                            _ => Act::Gelu,
                        },
                    )),
                    (None, _) => match Act::of_op(op, f)? {
                        Some(act) => Some(Op::ActF32(act)),
                        // The rare ones (Sign, …) as the other floats run them.
                        None => FloatOp::of(op, &st.attrs)?.map(Op::Float),
                    },
                };
                op.map(|op| (op, vec![x.clone()], DType::F32, x.shape.clone()))
            }
            [Some(x)] if matches!(x.dtype, DType::F64 | DType::F16 | DType::BF16) => {
                FloatOp::of(op, &st.attrs)?
                    .map(|f| (Op::Float(f), vec![x.clone()], x.dtype, x.shape.clone()))
            }
            _ => None,
        },
    };
    Ok(lowered)
}

/// Whether `part` may fail at run time (an integer division or modulo by zero, 0 to
/// a negative power).
fn part_can_fail(part: &Part) -> bool {
    let int = part.args[0].dtype.is_int();
    match &part.op {
        Op::Elem(BinOp::Div, _) => int,
        Op::Same(op, _) => int && any::same_can_fail(*op),
        Op::Pow(_) => int && part.args[1].dtype.is_int(),
        _ => false,
    }
}

pub(crate) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    if b.outs.is_empty() {
        return Ok(None);
    }
    let op = b.node.op.as_str();
    let (body, exported) = if op == "Fused" {
        if b.ins.iter().any(Option::is_none) {
            return Ok(None);
        }
        let body = fused::body(&b.node.attrs, b.ins.len())?;
        // The f32 `Where(a op b, x, y)` is the backward family's compare-select.
        let compare_select = b.all_f32()
            && body.len() == 2
            && CmpOp::from_op(&body[0].op).is_some()
            && body[1].op == "Where";
        if compare_select {
            return Ok(None);
        }
        let exported = fused::exported_steps(&b.node.attrs, body.len())?;
        (body, exported)
    } else {
        if !OPS.contains(&op) {
            return Ok(None);
        }
        // Comparisons of f32, i32 and i64 are the backward family's `compare`.
        let plain = b
            .input(0)
            .is_some_and(|a| matches!(a.dtype, DType::F32 | DType::I32 | DType::I64));
        if CmpOp::from_op(op).is_some() && plain {
            return Ok(None);
        }
        let args = (0..b.ins.len())
            .map(|k| b.ins[k].as_ref().map(|_| Arg::Input(k)))
            .collect();
        let st = Step {
            op: op.to_string(),
            args,
            attrs: b.node.attrs.clone(),
        };
        (vec![st], vec![])
    };
    if b.outs.len() != exported.len() + 1 {
        return Ok(None);
    }
    let mut regions = Regions {
        base: b.scratch_at,
        bytes: 0,
    };
    let mut copies = vec![];
    let ins: Vec<Option<Slot>> = b
        .ins
        .iter()
        .map(|s| {
            s.as_ref().map(|s| {
                if b.outs.iter().any(|o| o.loc == s.loc) {
                    let to = regions.take(s.bytes());
                    copies.push((s.clone(), to));
                    Slot {
                        loc: to,
                        ..s.clone()
                    }
                } else {
                    s.clone()
                }
            })
        })
        .collect();
    let mut parts: Vec<Part> = vec![];
    for (i, st) in body.iter().enumerate() {
        let mut args = vec![];
        let mut consts = vec![];
        for a in &st.args {
            let (slot, c) = match a {
                None => (None, None),
                Some(Arg::Input(k)) => match ins.get(*k) {
                    Some(Some(s)) => (Some(s.clone()), b.constant(*k)),
                    _ => return Ok(None),
                },
                Some(Arg::Step(k)) => (Some(parts[*k].y.clone()), None),
            };
            args.push(slot);
            consts.push(c);
        }
        let Some((op, args, dtype, shape)) = lower_step(st, &args, &consts, &mut regions)? else {
            return Ok(None);
        };
        let out = if i + 1 == body.len() {
            Some(&b.outs[0])
        } else {
            exported
                .iter()
                .position(|&e| e == i)
                .map(|k| &b.outs[k + 1])
        };
        let y = match out {
            Some(o) if o.dtype != dtype || o.shape != shape => return Ok(None),
            Some(o) => o.clone(),
            None => {
                let bytes = shape.iter().product::<usize>() * dtype.size_in_bytes();
                Slot {
                    loc: regions.take(bytes),
                    dtype,
                    shape,
                }
            }
        };
        parts.push(Part { op, args, y });
    }
    if regions.bytes > 0 {
        b.scratch(regions.bytes);
    }
    let kind = if op == "Fused" {
        "fused-any"
    } else {
        match &parts[0].op {
            Op::Cmp(..) => "compare-any",
            Op::Logic(..) => "logic",
            Op::Same(SameOp::Mod { .. }, _) => "mod",
            Op::Same(SameOp::PRelu, _) => "prelu",
            Op::Same(SameOp::Arith(BinOp::Pow), _) | Op::Pow(_) => "pow-any",
            Op::Same(SameOp::Arith(_), _) | Op::F32(..) | Op::Elem(..) => "binary-any",
            Op::Same(..) => "bitwise",
            Op::Variadic(..) => "variadic",
            Op::Clip(..) => "clip",
            Op::UnaryF32(_) | Op::ActF32(_) | Op::Float(_) | Op::Where(_) => "elementwise-any",
        }
    };
    let can_fail = parts.iter().any(part_can_fail);
    Ok(Some(Box::new(AnyStep {
        copies,
        parts,
        kind,
        can_fail,
    })))
}

/// Slot `s`'s elements as `T`s.
///
/// # Safety
/// `s` holds `s.elements()` `T`s in `cx`'s memory, which nothing writes while the
/// slice lives.
unsafe fn view<'c, T>(cx: &'c Cx, s: &Slot) -> &'c [T] {
    // SAFETY: the caller's promise, for exactly this slot's elements.
    unsafe { std::slice::from_raw_parts(cx.ptr(s.loc) as *const T, s.elements()) }
}

/// Slot `s`'s elements as `T`s to write.
///
/// # Safety
/// `s` has room for `s.elements()` `T`s (any bits of which are valid `T`s) in `cx`'s
/// memory, which nothing else reads or writes while the slice lives.
#[allow(clippy::mut_from_ref)]
unsafe fn view_mut<'c, T>(cx: &'c Cx, s: &Slot) -> &'c mut [T] {
    // SAFETY: as the caller promises: room for the slot's elements, used only here.
    unsafe { std::slice::from_raw_parts_mut(cx.ptr(s.loc) as *mut T, s.elements()) }
}

// The typed loops of the parts. Each has the contract of `Part::run`: the part's slots
// hold their shapes of their dtypes (`T` being the dtype dispatched on), and `y` is no
// operand's buffer.

/// # Safety
/// As for [`Part::run`], `T` the dtype of the operands and of `y`.
unsafe fn run_elem<T: Elem>(cx: &Cx, op: BinOp, plan: &Broadcast, p: &Part) -> Result<(), String> {
    // SAFETY: both operands hold `T`s of their shapes and `y` is a distinct buffer of
    // `T`s (the part's contract), so the output aliases neither.
    let (a, b, y) = unsafe {
        (
            view(cx, &p.args[0]),
            view(cx, &p.args[1]),
            view_mut(cx, &p.y),
        )
    };
    binary::binary_elem::<T>(op, plan, a, b, y, cx.pool)
}

/// # Safety
/// As for [`run_elem`].
unsafe fn run_same<T: Elem>(cx: &Cx, op: SameOp, plan: &Broadcast, p: &Part) -> Result<(), String> {
    // SAFETY: the part's contract: `T` operands of their shapes, `y` of the same dtype
    // in a buffer of its own.
    let (a, b, y) = unsafe {
        (
            view(cx, &p.args[0]),
            view(cx, &p.args[1]),
            view_mut(cx, &p.y),
        )
    };
    any::binary_same::<T>(op, plan, a, b, y, cx.pool)
}

/// # Safety
/// As for [`Part::run`], `T` the operands' dtype; `y` is bool (bytes).
unsafe fn run_cmp<T: Elem>(cx: &Cx, op: CmpOp, plan: &Broadcast, p: &Part) -> Result<(), String> {
    // SAFETY: the operands hold `T`s of their shapes; `y` is the bool result, one byte
    // an element, a buffer no operand shares (the part's contract).
    let (a, b, y) = unsafe {
        (
            view(cx, &p.args[0]),
            view(cx, &p.args[1]),
            view_mut(cx, &p.y),
        )
    };
    any::compare_any::<T>(op, plan, a, b, y, cx.pool);
    Ok(())
}

/// # Safety
/// As for [`Part::run`], `X` the base's (and `y`'s) dtype, `Y` the exponent's.
unsafe fn run_pow2<X: Elem, Y: Elem>(cx: &Cx, plan: &Broadcast, p: &Part) -> Result<(), String> {
    // SAFETY: base of `X`s, exponent of `Y`s, each of its shape; `y` holds `X`s in its
    // own buffer (the part's contract).
    let (a, b, y) = unsafe {
        (
            view(cx, &p.args[0]),
            view(cx, &p.args[1]),
            view_mut(cx, &p.y),
        )
    };
    any::pow_any::<X, Y>(plan, a, b, y, cx.pool)
}

/// # Safety
/// As for [`run_pow2`], the exponent of any numeric dtype.
unsafe fn run_pow<X: Elem>(cx: &Cx, plan: &Broadcast, p: &Part) -> Result<(), String> {
    macro_rules! by_exponent {
        ($($d:ident => $t:ty),*) => {
            match p.args[1].dtype {
                // SAFETY: `$t` is the exponent's dtype, `X` the base's (this fn's contract).
                $(DType::$d => unsafe { run_pow2::<X, $t>(cx, plan, p) },)*
                other => Err(format!("Pow: {other} is not a numeric dtype")),
            }
        };
    }
    by_exponent!(
        F32 => f32, F64 => f64, F16 => half::f16, BF16 => half::bf16, I8 => i8, U8 => u8,
        I16 => i16, U16 => u16, I32 => i32, U32 => u32, I64 => i64, U64 => u64
    )
}

/// # Safety
/// As for [`Part::run`], `T` the dtype of `x`, the bounds and `y`.
unsafe fn run_clip<T: Elem>(cx: &Cx, lo: Bound, hi: Bound, p: &Part) -> Result<(), String> {
    let bound = |b: Bound| match b {
        Bound::None => None,
        Bound::Const(v) => Some(v),
        // SAFETY: a run-time bound is a one-element `T` operand (checked at lowering).
        Bound::Arg(k) => Some(unsafe { view::<T>(cx, &p.args[k]) }[0].to_f64()),
    };
    let (lo, hi) = (bound(lo), bound(hi));
    // SAFETY: `x` holds `T`s of y's shape, `y` is a buffer of its own (the contract).
    let (x, y) = unsafe { (view(cx, &p.args[0]), view_mut(cx, &p.y)) };
    any::clip::<T>(x, y, lo, hi, cx.pool);
    Ok(())
}

/// # Safety
/// As for [`Part::run`], `T` every operand's dtype and `y`'s; `acc` is scratch for
/// y's elements, 8 bytes each, apart from every operand.
unsafe fn run_variadic<T: Elem>(
    cx: &Cx,
    op: VarOp,
    plans: &[Spread],
    acc: Loc,
    p: &Part,
) -> Result<(), String> {
    let acc = Slot {
        loc: acc,
        dtype: DType::U64,
        shape: p.y.shape.clone(),
    };
    // SAFETY: the accumulator is this part's own scratch, sized for y's elements at 8
    // bytes each; `y` is a buffer no operand shares (the contract).
    let (acc, y) = unsafe { (view_mut::<u64>(cx, &acc), view_mut::<T>(cx, &p.y)) };
    let n = p.args.len();
    for (k, (x, plan)) in p.args.iter().zip(plans).enumerate() {
        // SAFETY: operand k holds `T`s of its shape (the contract), apart from y and acc.
        let x = unsafe { view::<T>(cx, x) };
        any::variadic_step::<T>(op, plan, k, n, x, acc, y, cx.pool);
    }
    Ok(())
}

/// # Safety
/// As for [`Part::run`], `T` being the operand's and y's float dtype.
unsafe fn run_float<T: Elem>(cx: &Cx, op: FloatOp, p: &Part) -> Result<(), String> {
    // SAFETY: the operand and y hold their elements as `T`s, in distinct buffers.
    let (x, y) = unsafe { (view::<T>(cx, &p.args[0]), view_mut::<T>(cx, &p.y)) };
    unary_kernels::float(op, cx.pool, unary_kernels::Src::Other(x), y);
    Ok(())
}

impl Part {
    /// # Safety
    /// `cx` holds the program's memory (the Kernel::run contract): each slot holds its
    /// shape's elements of its dtype, and `y` is none of the operands' buffers.
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let t = self.args[0].dtype;
        let (a, y) = (&self.args[0], &self.y);
        match &self.op {
            Op::F32(op, plan) => {
                // SAFETY: two f32 operands of their shapes and an f32 output apart from
                // both (this fn's contract).
                let (a, b, y) = unsafe { (view(cx, a), view(cx, &self.args[1]), view_mut(cx, y)) };
                binary::binary_planned(isa::isa(), *op, plan, a, b, y, cx.pool);
                Ok(())
            }
            // SAFETY: the operands and y hold `t`s, the dtype dispatched on.
            Op::Elem(op, plan) => unsafe { with_dtype!(t, run_elem(cx, *op, plan, self)) },
            // SAFETY: `t` is the dtype of both operands and of y, as run_same needs.
            Op::Same(op, plan) => unsafe { with_dtype!(t, run_same(cx, *op, plan, self)) },
            // SAFETY: bool operands are bytes, compared as u8; y is the bool output.
            Op::Cmp(op, plan) if t == DType::Bool => unsafe { run_cmp::<u8>(cx, *op, plan, self) },
            // SAFETY: run_cmp on the operands' own dtype `t`, y bool.
            Op::Cmp(op, plan) => unsafe { with_dtype!(t, run_cmp(cx, *op, plan, self)) },
            Op::Logic(op, plan) => {
                // SAFETY: bool operands (bytes) and a bool y in a buffer of its own.
                let (a, b, y) = unsafe { (view(cx, a), view(cx, &self.args[1]), view_mut(cx, y)) };
                any::logic(*op, plan, a, b, y, cx.pool);
                Ok(())
            }
            // SAFETY: the base and y hold `t`s; run_pow dispatches on the exponent's dtype.
            Op::Pow(plan) => unsafe { with_dtype!(t, run_pow(cx, plan, self)) },
            Op::UnaryF32(op) => {
                // SAFETY: an f32 operand of y's shape, y an f32 buffer apart from it.
                let (x, y) = unsafe { (view(cx, a), view_mut(cx, y)) };
                binary::unary(*op, x, y);
                Ok(())
            }
            // SAFETY: the operand and y hold `t`s (a float dtype) of one shape, apart.
            Op::Float(op) => unsafe { with_dtype!(t, run_float(cx, *op, self)) },
            Op::ActF32(act) => {
                // SAFETY: y is its own f32 buffer of the operand's shape.
                let y = unsafe { view_mut(cx, y) };
                // SAFETY: the operand holds y.len() floats and is not y's buffer.
                unsafe { act.apply_from(cx.f32(a), y, cx.pool) };
                Ok(())
            }
            // SAFETY: this fn's contract is run_where's.
            Op::Where(walk) => unsafe { self.run_where(cx, walk) },
            // SAFETY: x, the bounds and y all hold `t`s (checked at lowering).
            Op::Clip(lo, hi) => unsafe { with_dtype!(t, run_clip(cx, *lo, *hi, self)) },
            Op::Variadic(op, plans, acc) => {
                // SAFETY: every operand and y hold `t`s; acc is the part's own scratch.
                unsafe { with_dtype!(t, run_variadic(cx, *op, plans, *acc, self)) }
            }
        }
    }

    /// # Safety
    /// As for [`Part::run`].
    unsafe fn run_where(&self, cx: &Cx, walk: &Walk) -> Result<(), String> {
        let [c, x, other] = [0, 1, 2].map(|k| cx.ptr(self.args[k].loc) as *const u8);
        let y = cx.ptr(self.y.loc);
        macro_rules! run {
            ($T:ty) => {
                // SAFETY: the walk was made from the operands' shapes, which the slots
                // hold (x, other and y of one dtype, `$T`'s size); y is no operand's.
                unsafe {
                    select(
                        walk,
                        c,
                        x as *const $T,
                        other as *const $T,
                        y as *mut $T,
                        cx.pool,
                    )
                }
            };
        }
        match self.y.dtype.size_in_bytes() {
            1 => run!(u8),
            2 => run!(u16),
            4 => run!(u32),
            _ => run!(u64),
        }
        Ok(())
    }
}

impl Kernel for AnyStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        for (from, to) in &self.copies {
            // SAFETY: `from` is an input the output took over, `from.bytes()` long, and
            // `to` its own scratch region of that size, lowering laid out apart.
            unsafe { std::ptr::copy_nonoverlapping(cx.ptr(from.loc), cx.ptr(*to), from.bytes()) };
        }
        for part in &self.parts {
            // SAFETY: the Kernel::run contract gives the slots' memory; lowering wrote each
            // part into a buffer none of its operands is (scratch regions apart, inputs an
            // output took over read from their copies).
            unsafe { part.run(cx)? };
        }
        Ok(())
    }
    fn can_fail(&self) -> bool {
        self.can_fail
    }
    fn kind(&self) -> &'static str {
        self.kind
    }
}
