//! The pools `nn`'s f32 2-D kernels decline (1-D, 3-D, auto_pad, dilations with ceil
//! mode, count_include_pad, storage_order, LpPool, integer and non-f32 MaxPool): one
//! table-driven loop of [`pool_nd`] on the input's dtype.
use crate::backend::cpu::kernels::par::{for_ranges, SyncPtr};
use crate::backend::cpu::kernels::pool_nd::{pool_nd, NdKind, PoolTable};
use crate::backend::cpu::program::{Cx, Kernel, Slot};
use crate::ir::ops::conv::windows;
use crate::ir::DType;
use crate::tensor::Elem;
use crate::with_dtype;

use super::Build;

struct PoolNdStep {
    kind: NdKind,
    table: PoolTable,
    planes: usize,
    x: Slot,
    y: Slot,
    indices: Option<Slot>,
}

pub(crate) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let op = b.node.op.as_str();
    let (Some(x), [y, ..]) = (b.input(0), b.outs) else {
        return Ok(None);
    };
    let attrs = &b.node.attrs;
    let r = x.shape.len();
    let dtype_ok =
        x.dtype.is_float() || (op == "MaxPool" && matches!(x.dtype, DType::I8 | DType::U8));
    if r < 3 || !dtype_ok || y.dtype != x.dtype || attrs.int_or("block", 0)? != 0 {
        return Ok(None);
    }
    let kind = match op {
        "MaxPool" => NdKind::Max,
        "AveragePool" => NdKind::Average {
            include_pad: attrs.int_or("count_include_pad", 0)? != 0,
        },
        "LpPool" => {
            let p = attrs.int_or("p", 2)?;
            if p < 1 {
                return Ok(None);
            }
            NdKind::Lp(p as f64)
        }
        _ => return Ok(None),
    };
    let Some(kernel) = attrs.ints("kernel_shape")? else {
        return Ok(None);
    };
    if kernel.len() != r - 2 || kernel.iter().any(|&k| k < 1) {
        return Ok(None);
    }
    let kernel: Vec<usize> = kernel.iter().map(|&k| k as usize).collect();
    let input = &x.shape[2..];
    let known: Vec<Option<usize>> = input.iter().map(|&d| Some(d)).collect();
    let wins = windows(attrs, &kernel, &known)?;
    let ceil = attrs.int_or("ceil_mode", 0)? != 0;
    let output = wins
        .iter()
        .zip(input)
        .map(|(w, &n)| w.outputs(n, ceil))
        .collect::<Result<Vec<_>, _>>()?;
    if y.shape[..2] != x.shape[..2] || y.shape[2..] != output[..] {
        return Err(format!(
            "{op}: the output is {:?}, the windows give {output:?}",
            y.shape
        ));
    }
    let indices =
        (op == "MaxPool" && b.outs.len() > 1 && super::nn::used(b, 1)).then(|| b.outs[1].clone());
    if indices.as_ref().is_some_and(|s| s.dtype != DType::I64) {
        return Ok(None);
    }
    let col_major = indices.is_some() && attrs.int_or("storage_order", 0)? != 0;
    let Some(table) = PoolTable::new(&wins, input, &output, col_major) else {
        return Ok(None);
    };
    Ok(Some(Box::new(PoolNdStep {
        kind,
        table,
        planes: x.shape[0] * x.shape[1],
        x: x.clone(),
        y: y.clone(),
        indices,
    })))
}

/// The pool on `T`.
///
/// # Safety
/// The Kernel::run contract: x and y hold `T`s of their shapes, Indices i64 of its.
unsafe fn run_typed<T: Elem>(cx: &Cx, s: &PoolNdStep) -> Result<(), String> {
    // SAFETY: x's slot holds its elements of T; a pool never runs in place, so no
    // output below is x's buffer.
    let x = unsafe { std::slice::from_raw_parts(cx.ptr(s.x.loc) as *const T, s.x.elements()) };
    let t = &s.table;
    let y = SyncPtr(cx.ptr(s.y.loc) as *mut T);
    let ix = s
        .indices
        .as_ref()
        .map(|i| SyncPtr(cx.ptr(i.loc) as *mut i64));
    let work = t.in_plane + t.taps.len();
    for_ranges(cx.pool, s.planes, work, &|r| {
        let (at, len) = (r.start * t.out_plane, r.len() * t.out_plane);
        // SAFETY: y holds planes × out_plane T (its slot); planes `r` are this task's
        // alone, so this part of it is written by no other task.
        let ys = unsafe { std::slice::from_raw_parts_mut(y.get().add(at), len) };
        // SAFETY: Indices (an i64 slot of y's shape, build checked) at this task's planes.
        let is = ix.map(|p| unsafe { std::slice::from_raw_parts_mut(p.get().add(at), len) });
        pool_nd(s.kind, t, r, x, ys, is);
    });
    Ok(())
}

impl Kernel for PoolNdStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: the Kernel::run contract, x and y of `x.dtype` (build checked).
        unsafe { with_dtype!(self.x.dtype, run_typed(cx, self)) }
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "pool-nd"
    }
}

/// GlobalAveragePool / GlobalMaxPool / GlobalLpPool on the dtypes (and, for Lp, every
/// float) `nn`'s f32 kernel does not take: one value per (N, C) plane, in f64.
struct GlobalStep {
    kind: NdKind,
    plane: usize,
    x: Slot,
    y: Slot,
}

pub(crate) fn build_global(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let (Some(x), [y]) = (b.input(0), b.outs) else {
        return Ok(None);
    };
    let attrs = &b.node.attrs;
    if x.shape.len() < 3
        || !x.dtype.is_float()
        || y.dtype != x.dtype
        || attrs.int_or("block", 0)? != 0
        || y.elements() != x.shape[0] * x.shape[1]
    {
        return Ok(None);
    }
    let kind = match b.node.op.as_str() {
        "GlobalMaxPool" => NdKind::Max,
        "GlobalAveragePool" => NdKind::Average { include_pad: false },
        "GlobalLpPool" => {
            let p = attrs.int_or("p", 2)?;
            if p < 1 {
                return Err(format!("p must be 1 or more, got {p}"));
            }
            NdKind::Lp(p as f64)
        }
        _ => return Ok(None),
    };
    Ok(Some(Box::new(GlobalStep {
        kind,
        plane: x.shape[2..].iter().product(),
        x: x.clone(),
        y: y.clone(),
    })))
}

/// The global pool on `T`.
///
/// # Safety
/// The Kernel::run contract: x and y hold `T`s of their shapes.
unsafe fn run_global<T: Elem>(cx: &Cx, s: &GlobalStep) -> Result<(), String> {
    // SAFETY: x's slot holds its `T`s, only read (a global pool never runs in place).
    let x = unsafe { std::slice::from_raw_parts(cx.ptr(s.x.loc) as *const T, s.x.elements()) };
    // SAFETY: y's slot, one `T` per plane, this step's output alone.
    let y = unsafe { std::slice::from_raw_parts_mut(cx.ptr(s.y.loc) as *mut T, s.y.elements()) };
    let n = s.plane;
    for (i, o) in y.iter_mut().enumerate() {
        let plane = x[i * n..(i + 1) * n].iter().map(|v| v.to_f64());
        *o = T::from_f64(match s.kind {
            NdKind::Max => plane.fold(f64::NEG_INFINITY, f64::max),
            NdKind::Average { .. } if n == 0 => f64::NAN,
            NdKind::Average { .. } => plane.sum::<f64>() / n as f64,
            NdKind::Lp(p) => plane.map(|v| v.abs().powf(p)).sum::<f64>().powf(1.0 / p),
        });
    }
    Ok(())
}

impl Kernel for GlobalStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: the Kernel::run contract; the global pool's x and y hold x.dtype.
        unsafe { with_dtype!(self.x.dtype, run_global(cx, self)) }
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "global-pool-elem"
    }
}
