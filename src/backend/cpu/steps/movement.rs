//! Data movement, for every dtype by element size: `Concat`, `Split`, `Slice`,
//! `Expand`, `Tile` and `Transpose` as strided copies ([`CopyPlan`]); `Pad` (every mode)
//! and nearest `Resize` as table copies; linear and cubic `Resize` as separable passes
//! (f32, or f64 for the other dtypes); `Gather` on any axis, `GatherElements`, `ScatterND`; `Cast` between the
//! numeric dtypes and `Where` on every dtype. Shape operands (Slice's starts, Pad's
//! pads, Resize's scales) must be constants; otherwise the node is not this family's.
use crate::backend::cpu::kernels::movement::{
    cast, gather, gather_elements, scatter_nd, CopyPlan, ElementsDims, GatherDims, Reduction,
    TableCopy, FILL,
};
use crate::backend::cpu::kernels::resize::{AxisPass, ResizePlan, Weight};
use crate::backend::cpu::kernels::select::{select, Walk};
use crate::backend::cpu::program::{Cx, Kernel, Loc, Slot};
use crate::ir::ops::quant::range as quant_range;
use crate::ir::ops::resize::{resize_taps, AxisTaps};
use crate::ir::ops::shape::slice::{
    mode as pad_mode, pad_plan, pad_source, slice_plan, slice_range, Mode,
};
use crate::ir::DType;
use crate::tensor::{Elem, Tensor};
use crate::with_dtype;

use super::matmul_elem::{elems, elems_mut, scratch_f64};
use super::Build;

pub(crate) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    if b.outs.is_empty() {
        return Ok(None);
    }
    match b.node.op.as_str() {
        "Concat" => build_concat(b),
        "Split" => build_split(b),
        "Slice" => build_slice(b),
        "Expand" => build_expand(b),
        "Tile" => build_tile(b),
        "Transpose" => build_transpose(b),
        "Pad" => build_pad(b),
        "Resize" => build_resize(b),
        "Gather" => build_gather(b),
        "GatherElements" => build_gather_elements(b),
        "ScatterND" => build_scatter_nd(b),
        "Cast" => build_cast(b),
        "Where" => build_where(b),
        _ => Ok(None),
    }
}

fn strides(dims: &[usize]) -> Vec<isize> {
    CopyPlan::contiguous_strides(dims)
}

/// One strided copy of a step: from a slot at a byte offset to a slot at a byte offset.
struct Move {
    from: Loc,
    from_at: isize,
    to: Loc,
    to_at: isize,
    plan: CopyPlan,
}

/// A step made of strided copies (`kind` names the op for profiles).
pub struct Moves {
    kind: &'static str,
    moves: Vec<Move>,
}

impl Kernel for Moves {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        for m in &self.moves {
            // SAFETY: the Kernel::run contract: the slots address live buffers of their
            // planned sizes, and each plan was built from those slots' shapes.
            unsafe {
                m.plan.run(
                    cx.ptr(m.from).offset(m.from_at),
                    cx.ptr(m.to).offset(m.to_at),
                    cx.pool,
                )
            };
        }
        Ok(())
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        self.kind
    }
}

fn one_move(
    kind: &'static str,
    x: &Slot,
    x_at: isize,
    y: &Slot,
    dims: &[usize],
    src: &[isize],
) -> Result<Box<dyn Kernel>, String> {
    let es = x.dtype.size_in_bytes();
    let from_at = x_at
        .checked_mul(es as isize)
        .ok_or_else(|| format!("{kind}: the source offset overflows"))?;
    Ok(Box::new(Moves {
        kind,
        moves: vec![Move {
            from: x.loc,
            from_at,
            to: y.loc,
            to_at: 0,
            plan: CopyPlan::new(dims, src, &strides(dims), es),
        }],
    }))
}

/// Constant integer operand `k`: `Some(None)` when omitted, `None` when not a constant.
fn const_ints(b: &Build, k: usize) -> Option<Option<Vec<i64>>> {
    match b.input(k) {
        None => Some(None),
        Some(_) => b.constant(k).map(|t| Some(t.to_i64_vec())),
    }
}

fn shape_mismatch(op: &str, want: &[usize], y: &Slot) -> String {
    format!("{op} gives {want:?}, but the output is {:?}", y.shape)
}

fn build_concat(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let y = &b.outs[0];
    let r = y.shape.len();
    let Ok(axis) = crate::ir::shape::norm_axis(b.node.attrs.req_int("axis")?, r) else {
        return Ok(None);
    };
    let es = y.dtype.size_in_bytes();
    let ys = strides(&y.shape);
    let mut moves = vec![];
    let mut at = 0usize;
    for x in b.ins.iter() {
        let Some(x) = x else { return Ok(None) };
        if x.shape.len() != r || x.dtype != y.dtype {
            return Ok(None);
        }
        moves.push(Move {
            from: x.loc,
            from_at: 0,
            to: y.loc,
            to_at: (at as isize) * ys[axis] * es as isize,
            plan: CopyPlan::new(&x.shape, &strides(&x.shape), &ys, es),
        });
        at += x.shape[axis];
    }
    if at != y.shape.get(axis).copied().unwrap_or(0) {
        return Err(format!(
            "the inputs add up to {at} along axis {axis}, the output has {:?}",
            y.shape
        ));
    }
    Ok(Some(Box::new(Moves {
        kind: "concat",
        moves,
    })))
}

fn build_split(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let Some(x) = b.input(0) else { return Ok(None) };
    let r = x.shape.len();
    let Ok(axis) = crate::ir::shape::norm_axis(b.node.attrs.int_or("axis", 0)?, r) else {
        return Ok(None);
    };
    let es = x.dtype.size_in_bytes();
    let xs = strides(&x.shape);
    let mut moves = vec![];
    let mut at = 0usize;
    for y in b.outs {
        if y.shape.len() != r || y.dtype != x.dtype {
            return Ok(None);
        }
        moves.push(Move {
            from: x.loc,
            from_at: (at as isize) * xs[axis] * es as isize,
            to: y.loc,
            to_at: 0,
            plan: CopyPlan::new(&y.shape, &xs, &strides(&y.shape), es),
        });
        at += y.shape[axis];
    }
    if at > x.shape[axis] {
        return Err(format!(
            "the outputs take {at} along axis {axis} of {:?}",
            x.shape
        ));
    }
    Ok(Some(Box::new(Moves {
        kind: "split",
        moves,
    })))
}

/// `Slice` with constant starts, ends, axes and steps (any steps, negative too).
fn build_slice(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let Some(x) = b.input(0) else { return Ok(None) };
    let y = &b.outs[0];
    let (Some(Some(starts)), Some(Some(ends)), Some(axes), Some(steps)) = (
        const_ints(b, 1),
        const_ints(b, 2),
        const_ints(b, 3),
        const_ints(b, 4),
    ) else {
        return Ok(None);
    };
    let r = x.shape.len();
    let plan = slice_plan(r, &starts, &ends, axes.as_deref(), steps.as_deref())?;
    let xs = strides(&x.shape);
    let mut dims = x.shape.clone();
    let mut src = xs.clone();
    let mut base = 0isize;
    for (axis, bounds) in plan.into_iter().enumerate() {
        let Some((start, end, step)) = bounds else {
            continue;
        };
        let range = slice_range(x.shape[axis], start, end, step)?;
        dims[axis] = range.len;
        if range.len > 0 {
            base = (range.start as isize)
                .checked_mul(xs[axis])
                .and_then(|o| base.checked_add(o))
                .ok_or("slicing: the start offset overflows")?;
        }
        src[axis] = xs[axis] * range.step as isize;
    }
    if dims != y.shape || x.dtype != y.dtype {
        return Err(shape_mismatch("slicing", &dims, y));
    }
    Ok(Some(one_move("slice", x, base, y, &dims, &src)?))
}

/// `Expand`: the input's strides, 0 along broadcast axes.
fn build_expand(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let Some(x) = b.input(0) else { return Ok(None) };
    let y = &b.outs[0];
    let r = y.shape.len();
    if x.shape.len() > r || x.dtype != y.dtype {
        return Ok(None);
    }
    let mut xd = vec![1usize; r - x.shape.len()];
    xd.extend_from_slice(&x.shape);
    let xs = strides(&xd);
    let mut src = vec![0isize; r];
    for a in 0..r {
        src[a] = match (xd[a], y.shape[a]) {
            (d, n) if d == n => xs[a],
            (1, _) => 0,
            _ => return Err(format!("cannot expand {:?} to {:?}", x.shape, y.shape)),
        };
    }
    Ok(Some(one_move("expand", x, 0, y, &y.shape, &src)?))
}

/// `Tile`: each axis seen as (repeat, index), the repeat with source stride 0.
fn build_tile(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let Some(x) = b.input(0) else { return Ok(None) };
    let y = &b.outs[0];
    let r = x.shape.len();
    if y.shape.len() != r || x.dtype != y.dtype {
        return Ok(None);
    }
    let (xs, ys) = (strides(&x.shape), strides(&y.shape));
    let (mut dims, mut src, mut dst) = (vec![], vec![], vec![]);
    for a in 0..r {
        let (d, n) = (x.shape[a], y.shape[a]);
        if d == 0 || n % d != 0 {
            if n == 0 {
                return Ok(Some(Box::new(Moves {
                    kind: "tile",
                    moves: vec![],
                })));
            }
            return Err(format!("{:?} does not tile {:?}", x.shape, y.shape));
        }
        dims.extend([n / d, d]);
        src.extend([0, xs[a]]);
        dst.extend([ys[a] * d as isize, ys[a]]);
    }
    let es = x.dtype.size_in_bytes();
    Ok(Some(Box::new(Moves {
        kind: "tile",
        moves: vec![Move {
            from: x.loc,
            from_at: 0,
            to: y.loc,
            to_at: 0,
            plan: CopyPlan::new(&dims, &src, &dst, es),
        }],
    })))
}

/// `Transpose` of any rank: the output walked in order, the input by permuted strides.
fn build_transpose(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let Some(x) = b.input(0) else { return Ok(None) };
    let y = &b.outs[0];
    let r = x.shape.len();
    let perm: Vec<usize> = match b.node.attrs.ints("perm")? {
        Some(p) => p.iter().map(|&a| a as usize).collect(),
        None => (0..r).rev().collect(),
    };
    if perm.len() != r || perm.iter().any(|&a| a >= r) {
        return Err(format!("perm {perm:?} does not permute rank {r}"));
    }
    let xs = strides(&x.shape);
    let dims: Vec<usize> = perm.iter().map(|&a| x.shape[a]).collect();
    if dims != y.shape {
        return Err(shape_mismatch("the permutation", &dims, y));
    }
    let src: Vec<isize> = perm.iter().map(|&a| xs[a]).collect();
    Ok(Some(one_move("transpose", x, 0, y, &dims, &src)?))
}

/// A table copy with a fill value: fixed bytes, or one element of a slot read at run time.
pub struct TableStep {
    kind: &'static str,
    x: Slot,
    y: Slot,
    copy: TableCopy,
    value: Vec<u8>,
    value_slot: Option<Slot>,
}

impl Kernel for TableStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let es = self.y.dtype.size_in_bytes();
        let mut value = [0u8; 16];
        let value: &[u8] = match &self.value_slot {
            Some(s) if s.elements() >= 1 && es <= value.len() => {
                // SAFETY: the slot holds at least one element of es bytes.
                unsafe { std::ptr::copy_nonoverlapping(cx.ptr(s.loc), value.as_mut_ptr(), es) };
                &value[..es]
            }
            _ => &self.value,
        };
        // SAFETY: the tables were built from the slots' shapes (offsets inside x).
        unsafe {
            self.copy
                .run(cx.ptr(self.x.loc), cx.ptr(self.y.loc), value, cx.pool)
        };
        Ok(())
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        self.kind
    }
}

/// `Pad` with constant pads (and axes), every mode.
fn build_pad(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let Some(x) = b.input(0) else { return Ok(None) };
    let y = &b.outs[0];
    let (Some(Some(pads)), Some(axes)) = (const_ints(b, 1), const_ints(b, 3)) else {
        return Ok(None);
    };
    let m = pad_mode(b.node.attrs.string_or("mode", "constant")?)?;
    let r = x.shape.len();
    let plan = pad_plan(r, &pads, axes.as_deref())?;
    let xs = strides(&x.shape);
    let mut tables = vec![];
    for a in 0..r {
        let (d, n, begin) = (x.shape[a], y.shape.get(a).copied().unwrap_or(0), plan[a].0);
        if d == 0 && n > 0 && m != Mode::Constant {
            // The interpreter reports this one.
            return Ok(None);
        }
        // A model's pads set `n`: an impossible size is an error, not an abort.
        let mut table: Vec<isize> = Vec::new();
        table
            .try_reserve_exact(n)
            .map_err(|_| format!("padding: output axis {a} of {n} elements cannot be allocated"))?;
        table.extend((0..n).map(|o| match pad_source(o, begin, d, m) {
            Some(i) if i < d => i as isize * xs[a],
            _ => FILL,
        }));
        tables.push(table);
    }
    if y.shape.len() != r || x.dtype != y.dtype {
        return Err(shape_mismatch("padding", &x.shape, y));
    }
    let es = y.dtype.size_in_bytes();
    let value_slot = b.input(2).filter(|s| s.dtype == y.dtype).cloned();
    Ok(Some(Box::new(TableStep {
        kind: "pad",
        x: x.clone(),
        y: y.clone(),
        copy: TableCopy::new(tables, es),
        value: vec![0; es],
        value_slot,
    })))
}

/// The separable f32 interpolation of a linear or cubic `Resize`.
pub struct ResizeStep {
    x: Slot,
    y: Slot,
    plan: ResizePlan<f32>,
    scratch: Loc,
}

impl Kernel for ResizeStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: the plan was built from the slots' shapes; the scratch holds twice its
        // scratch length.
        unsafe {
            self.plan.run(
                cx.f32(&self.x),
                cx.f32_mut(&self.y),
                cx.ptr(self.scratch) as *mut f32,
                cx.pool,
            )
        };
        Ok(())
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "resize"
    }
}

/// `Resize` with constant roi, scales and sizes: nearest (or any mode whose taps are
/// single pixels) as a table copy on every dtype, linear and cubic as separable passes.
fn build_resize(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let Some(x) = b.input(0) else { return Ok(None) };
    let y = &b.outs[0];
    let operand = |k: usize| -> Option<Option<&Tensor>> {
        match b.input(k) {
            None => Some(None),
            Some(_) => b.constant(k).map(Some),
        }
    };
    let (Some(roi), Some(scales), Some(sizes)) = (operand(1), operand(2), operand(3)) else {
        return Ok(None);
    };
    let taps = resize_taps(&b.node.attrs, &x.shape, roi, scales, sizes)?;
    let mut dims = x.shape.clone();
    for (a, t) in &taps.axes {
        dims[*a] = t.len();
    }
    if dims != y.shape || x.dtype != y.dtype {
        return Err(shape_mismatch("resizing", &dims, y));
    }
    let single = |t: &Option<Vec<(usize, f64)>>| -> Option<Option<usize>> {
        match t {
            None => Some(None),
            Some(t) => {
                let mut live = t.iter().filter(|p| p.1 != 0.0);
                match (live.next(), live.next()) {
                    (Some(&(i, 1.0)), None) => Some(Some(i)),
                    _ => None,
                }
            }
        }
    };
    let all_single = taps
        .axes
        .iter()
        .all(|(_, t)| t.iter().all(|p| single(p).is_some()));
    if all_single {
        let xs = strides(&x.shape);
        let mut tables: Vec<Vec<isize>> = (0..x.shape.len())
            .map(|a| (0..x.shape[a]).map(|i| i as isize * xs[a]).collect())
            .collect();
        for (a, t) in &taps.axes {
            tables[*a] = t
                .iter()
                .map(|p| match single(p).flatten() {
                    Some(i) => i as isize * xs[*a],
                    None => FILL,
                })
                .collect();
        }
        let value = Tensor::from_f64s(y.dtype, &[1], &[taps.extrapolation])?.to_le_bytes();
        return Ok(Some(Box::new(TableStep {
            kind: "resize-nearest",
            x: x.clone(),
            y: y.clone(),
            copy: TableCopy::new(tables, y.dtype.size_in_bytes()),
            value,
            value_slot: None,
        })));
    }
    if taps.axes.is_empty() {
        return Ok(Some(one_move(
            "resize",
            x,
            0,
            y,
            &x.shape,
            &strides(&x.shape),
        )?));
    }
    if x.dtype != DType::F32 {
        if !(x.dtype.is_float() || x.dtype.is_int()) {
            return Ok(None);
        }
        let plan = resize_plan::<f64>(&x.shape, &taps.axes, taps.extrapolation);
        let (x_len, y_len) = (x.elements(), y.elements());
        let scratch = b.scratch((x_len + y_len + 2 * plan.scratch_len()) * 8);
        return Ok(Some(Box::new(ResizeElemStep {
            x: x.clone(),
            y: y.clone(),
            plan,
            scratch,
        })));
    }
    let plan = resize_plan::<f32>(&x.shape, &taps.axes, taps.extrapolation);
    let scratch = b.scratch(2 * plan.scratch_len() * 4);
    Ok(Some(Box::new(ResizeStep {
        x: x.clone(),
        y: y.clone(),
        plan,
        scratch,
    })))
}

/// One pass per resized axis of a `dims` tensor, in `F`.
fn resize_plan<F: Weight>(
    dims: &[usize],
    axes: &[(usize, AxisTaps)],
    extrapolation: f64,
) -> ResizePlan<F> {
    let mut shape = dims.to_vec();
    let mut passes = vec![];
    for (a, t) in axes {
        passes.push(AxisPass::new(&shape, *a, t));
        shape[*a] = t.len();
    }
    ResizePlan {
        passes,
        extrapolated: F::of(extrapolation),
    }
}

/// Linear and cubic `Resize` on the dtypes other than f32: X widened to f64 in scratch,
/// the f64 passes, then each value stored as the interpreter rounds it (integers half
/// to even, clamped to the dtype's range).
pub struct ResizeElemStep {
    x: Slot,
    y: Slot,
    plan: ResizePlan<f64>,
    /// X and Y as f64, then the plan's two halves.
    scratch: Loc,
}

/// [`ResizeElemStep`] on `T`.
///
/// # Safety
/// The Kernel::run contract, X and Y holding `T`s, the scratch the f64s build asked for.
unsafe fn resize_elem<T: Elem>(cx: &Cx, s: &ResizeElemStep) {
    let (x_len, y_len) = (s.x.elements(), s.y.elements());
    // SAFETY: X's `T`s, only read.
    let x = unsafe { elems::<T>(cx, &s.x) };
    // SAFETY: the scratch: x_len then y_len f64s, then the plan's two halves, apart
    // from X and Y.
    let wide = unsafe { scratch_f64(cx, s.scratch, x_len + y_len + 2 * s.plan.scratch_len()) };
    let (xw, rest) = wide.split_at_mut(x_len);
    let (yw, halves) = rest.split_at_mut(y_len);
    for (w, v) in xw.iter_mut().zip(x) {
        *w = v.to_f64();
    }
    // SAFETY: xw holds the input, yw the output, halves the plan's scratch; apart.
    unsafe {
        s.plan
            .run(xw.as_ptr(), yw.as_mut_ptr(), halves.as_mut_ptr(), cx.pool)
    };
    // SAFETY: Y's `T`s, its own buffer.
    let y = unsafe { elems_mut::<T>(cx, &s.y) };
    if T::DTYPE.is_float() {
        for (d, &v) in y.iter_mut().zip(yw.iter()) {
            *d = T::from_f64(v);
        }
    } else {
        let (lo, hi) = quant_range(T::DTYPE);
        for (d, &v) in y.iter_mut().zip(yw.iter()) {
            *d = T::from_f64(v.round_ties_even().clamp(lo, hi));
        }
    }
}

impl Kernel for ResizeElemStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: the Kernel::run contract; X and Y hold x.dtype (build checked).
        unsafe { with_dtype!(self.x.dtype, resize_elem(cx, self)) };
        Ok(())
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "resize-elem"
    }
}

/// `Gather` on any axis with i32 or i64 indices.
pub struct GatherStep {
    dims: GatherDims,
    data: Slot,
    indices: Slot,
    y: Slot,
}

impl Kernel for GatherStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: the dims were built from the slots' shapes.
        unsafe {
            gather(
                &self.dims,
                cx.ptr(self.data.loc),
                cx.ptr(self.indices.loc),
                cx.ptr(self.y.loc),
                cx.pool,
            )
        }
    }
    fn kind(&self) -> &'static str {
        "gather"
    }
}

fn index_dtype(s: &Slot) -> Option<bool> {
    match s.dtype {
        DType::I64 => Some(true),
        DType::I32 => Some(false),
        _ => None,
    }
}

fn build_gather(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let (Some(data), Some(indices)) = (b.input(0), b.input(1)) else {
        return Ok(None);
    };
    let y = &b.outs[0];
    let Some(wide) = index_dtype(indices) else {
        return Ok(None);
    };
    let r = data.shape.len();
    let Ok(axis) = crate::ir::shape::norm_axis(b.node.attrs.int_or("axis", 0)?, r) else {
        return Ok(None);
    };
    let mut want = data.shape[..axis].to_vec();
    want.extend_from_slice(&indices.shape);
    want.extend_from_slice(&data.shape[axis + 1..]);
    if want != y.shape || data.dtype != y.dtype {
        return Err(shape_mismatch("gathering", &want, y));
    }
    Ok(Some(Box::new(GatherStep {
        dims: GatherDims {
            outer: data.shape[..axis].iter().product(),
            axis: data.shape[axis],
            inner: data.shape[axis + 1..].iter().product(),
            indices: indices.elements(),
            elem: data.dtype.size_in_bytes(),
            wide,
        },
        data: data.clone(),
        indices: indices.clone(),
        y: y.clone(),
    })))
}

pub struct GatherElementsStep {
    dims: ElementsDims,
    data: Slot,
    indices: Slot,
    y: Slot,
}

impl Kernel for GatherElementsStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: the shapes were checked against each other at build.
        unsafe {
            gather_elements(
                &self.dims,
                cx.ptr(self.data.loc),
                cx.ptr(self.indices.loc),
                cx.ptr(self.y.loc),
            )
        }
    }
    fn kind(&self) -> &'static str {
        "gather-elements"
    }
}

fn build_gather_elements(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let (Some(data), Some(indices)) = (b.input(0), b.input(1)) else {
        return Ok(None);
    };
    let y = &b.outs[0];
    let Some(wide) = index_dtype(indices) else {
        return Ok(None);
    };
    let r = data.shape.len();
    let Ok(axis) = crate::ir::shape::norm_axis(b.node.attrs.int_or("axis", 0)?, r) else {
        return Ok(None);
    };
    let fits =
        indices.shape.len() == r && (0..r).all(|a| a == axis || indices.shape[a] <= data.shape[a]);
    if !fits || y.shape != indices.shape || y.dtype != data.dtype {
        // The interpreter reports a mismatch.
        return Ok(None);
    }
    Ok(Some(Box::new(GatherElementsStep {
        dims: ElementsDims {
            data: data.shape.clone(),
            index: indices.shape.clone(),
            axis,
            elem: data.dtype.size_in_bytes(),
            wide,
        },
        data: data.clone(),
        indices: indices.clone(),
        y: y.clone(),
    })))
}

pub struct ScatterNdStep {
    how: Reduction,
    k: usize,
    count: usize,
    data: Slot,
    indices: Slot,
    updates: Slot,
    y: Slot,
}

impl Kernel for ScatterNdStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let (d, y) = (cx.ptr(self.data.loc), cx.ptr(self.y.loc));
        if d != y {
            // SAFETY: y has data's shape and dtype (checked at build), so both slots hold
            // y.bytes(); y is not data's buffer (no in-place rule for ScatterND) unless
            // the planner aliased them, in which case the copy is skipped.
            unsafe { std::ptr::copy_nonoverlapping(d, y, self.y.bytes()) };
        }
        let (i, u) = (
            cx.ptr(self.indices.loc) as *const i64,
            cx.ptr(self.updates.loc),
        );
        let (dims, k, n, how) = (&self.data.shape, self.k, self.count, self.how);
        macro_rules! run {
            ($T:ty) => {
                // SAFETY: indices is [count, k] i64 and updates count slices of
                // data_dims[k..] (build's checks), and y now holds the data, all of
                // element type $T (y's dtype, or one of its size for plain copies).
                unsafe { scatter_nd::<$T>(dims, k, n, how, i, u as *const $T, y as *mut $T) }
            };
        }
        match (self.y.dtype, how) {
            (DType::F32, _) => run!(f32),
            (DType::F64, _) => run!(f64),
            (DType::I32, _) => run!(i32),
            (DType::I64, _) => run!(i64),
            (DType::I8, _) => run!(i8),
            (DType::U8, _) => run!(u8),
            (DType::I16, _) => run!(i16),
            (DType::U16, _) => run!(u16),
            (DType::U32, _) => run!(u32),
            (DType::U64, _) => run!(u64),
            (d, Reduction::None) => match d.size_in_bytes() {
                1 => run!(u8),
                2 => run!(u16),
                4 => run!(u32),
                _ => run!(u64),
            },
            (d, _) => Err(format!("no {d} reduction")),
        }
    }
    fn kind(&self) -> &'static str {
        "scatter-nd"
    }
}

fn build_scatter_nd(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let (Some(data), Some(indices), Some(updates)) = (b.input(0), b.input(1), b.input(2)) else {
        return Ok(None);
    };
    let y = &b.outs[0];
    let Some(how) = Reduction::parse(b.node.attrs.string_or("reduction", "none")?) else {
        return Ok(None);
    };
    let integer_or_plain = matches!(
        y.dtype,
        DType::F32
            | DType::F64
            | DType::I8
            | DType::U8
            | DType::I16
            | DType::U16
            | DType::I32
            | DType::U32
            | DType::I64
            | DType::U64
    );
    let sized = matches!(y.dtype.size_in_bytes(), 1 | 2 | 4 | 8);
    if indices.dtype != DType::I64 || indices.shape.is_empty() || !sized {
        return Ok(None);
    }
    if how != Reduction::None && !integer_or_plain {
        return Ok(None);
    }
    let q = indices.shape.len();
    let k = indices.shape[q - 1];
    let mut want = indices.shape[..q - 1].to_vec();
    if k > data.shape.len() {
        return Ok(None);
    }
    want.extend_from_slice(&data.shape[k..]);
    if updates.shape != want || y.shape != data.shape || updates.dtype != y.dtype {
        return Ok(None);
    }
    Ok(Some(Box::new(ScatterNdStep {
        how,
        k,
        count: indices.shape[..q - 1].iter().product(),
        data: data.clone(),
        indices: indices.clone(),
        updates: updates.clone(),
        y: y.clone(),
    })))
}

/// Runs `$body` with `$T` the element type of the numeric dtype `$d`; `$none` for the
/// others (strings, the low-bit storage types).
macro_rules! with_elem {
    ($d:expr, $T:ident => $body:expr, $none:expr) => {
        match $d {
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::F64 => {
                type $T = f64;
                $body
            }
            DType::F16 => {
                type $T = half::f16;
                $body
            }
            DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            DType::I8 => {
                type $T = i8;
                $body
            }
            DType::U8 => {
                type $T = u8;
                $body
            }
            DType::I16 => {
                type $T = i16;
                $body
            }
            DType::U16 => {
                type $T = u16;
                $body
            }
            DType::I32 => {
                type $T = i32;
                $body
            }
            DType::U32 => {
                type $T = u32;
                $body
            }
            DType::I64 => {
                type $T = i64;
                $body
            }
            DType::U64 => {
                type $T = u64;
                $body
            }
            DType::Bool => {
                type $T = bool;
                $body
            }
            _ => $none,
        }
    };
}

fn cast_dtype(d: DType) -> bool {
    with_elem!(d, T => { let _: Option<T> = None; true }, false)
}

pub struct CastStep {
    x: Slot,
    y: Slot,
}

impl Kernel for CastStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let Self { x, y } = self;
        let (src, dst) = (cx.ptr(x.loc), cx.ptr(y.loc));
        let n = x.elements();
        if x.dtype == y.dtype {
            if src != dst {
                // SAFETY: same dtype and element count (build's check), so both slots hold
                // x.bytes(); distinct addresses mean distinct buffers in the plan.
                unsafe { std::ptr::copy_nonoverlapping(src, dst, x.bytes()) };
            }
            return Ok(());
        }
        with_elem!(x.dtype, S => with_elem!(y.dtype, D => {
            // SAFETY: x holds n elements of S (its dtype) and y n of D (build checked the
            // counts equal); `cast` allows y to be x's buffer.
            unsafe { cast(src as *const S, dst as *mut D, n, cx.pool) }
        }, ()), ());
        Ok(())
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "cast"
    }
}

/// `Cast` between the numeric dtypes (float8 and the packed low-bit ones excluded).
fn build_cast(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let y = b.outs[0].clone();
    let Some(x) = b.input(0) else { return Ok(None) };
    if !cast_dtype(x.dtype) || !cast_dtype(y.dtype) || x.elements() != y.elements() {
        return Ok(None);
    }
    Ok(Some(Box::new(CastStep { x: x.clone(), y })))
}

pub struct WhereStep {
    walk: Walk,
    cond: Slot,
    x: Slot,
    /// The second choice (`Where`'s input 2), not the output.
    other: Slot,
    y: Slot,
}

impl Kernel for WhereStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let Self {
            walk,
            cond,
            x,
            other,
            y,
        } = self;
        let (c, xp, op, yp) = (
            cx.ptr(cond.loc),
            cx.ptr(x.loc),
            cx.ptr(other.loc),
            cx.ptr(y.loc),
        );
        macro_rules! run {
            ($T:ty) => {
                // SAFETY: the walk was built from the cond, x, other and y shapes, which
                // the slots hold (x, other and y in elements of x's size, $T's); y shares
                // a buffer only in place of a same-shaped operand, as `select` allows.
                unsafe {
                    select(
                        walk,
                        c,
                        xp as *const $T,
                        op as *const $T,
                        yp as *mut $T,
                        cx.pool,
                    )
                }
            };
        }
        match x.dtype.size_in_bytes() {
            1 => run!(u8),
            2 => run!(u16),
            4 => run!(u32),
            _ => run!(u64),
        }
        Ok(())
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "where"
    }
}

/// `Where` on every dtype of 1, 2, 4 or 8 bytes, with broadcasting.
fn build_where(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let y = b.outs[0].clone();
    let (Some(c), Some(x), Some(yv)) = (b.input(0), b.input(1), b.input(2)) else {
        return Ok(None);
    };
    let sized = matches!(x.dtype.size_in_bytes(), 1 | 2 | 4 | 8);
    if c.dtype != DType::Bool || !sized || yv.dtype != x.dtype || y.dtype != x.dtype {
        return Ok(None);
    }
    let walk = Walk::new(&[&c.shape, &x.shape, &yv.shape], &y.shape).ok_or_else(|| {
        format!(
            "{:?}, {:?}, {:?} do not broadcast to {:?}",
            c.shape, x.shape, yv.shape, y.shape
        )
    })?;
    Ok(Some(Box::new(WhereStep {
        walk,
        cond: c.clone(),
        x: x.clone(),
        other: yv.clone(),
        y,
    })))
}
