//! Shape-family ops a backward graph needs: `Slice` with constant operands (the crop of
//! a filter gradient), a strided copy, and `ConstantOfShape` (zeros to scatter into),
//! a fill.
use crate::backend::cpu::program::{Cx, Kernel, Slot};
use crate::ir::ops::shape::slice::{slice_plan, slice_range};

use super::super::Build;

/// A strided copy: the output's dims, and per output axis the input's stride times the
/// slice's step; the input offset of the first element.
pub(super) struct SliceStep {
    x: Slot,
    dims: Vec<usize>,
    strides: Vec<isize>,
    base: usize,
    y: Slot,
}

/// `Slice` with constant starts, ends, axes and steps (the interpreter's plan and
/// clamping).
pub(super) fn build_slice(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let Some(x) = b.input(0) else { return Ok(None) };
    let y = &b.outs[0];
    let konst = |k: usize| -> Option<Option<Vec<i64>>> {
        match b.input(k) {
            None => Some(None),
            Some(_) => b.constant(k).map(|t| Some(t.to_i64_vec())),
        }
    };
    let (Some(Some(starts)), Some(Some(ends)), Some(axes), Some(steps)) =
        (konst(1), konst(2), konst(3), konst(4))
    else {
        return Ok(None);
    };
    let r = x.shape.len();
    let plan = slice_plan(r, &starts, &ends, axes.as_deref(), steps.as_deref())?;
    let mut in_strides = vec![1usize; r];
    for a in (0..r.saturating_sub(1)).rev() {
        in_strides[a] = in_strides[a + 1] * x.shape[a + 1];
    }
    let mut dims = x.shape.clone();
    let mut strides: Vec<isize> = in_strides.iter().map(|&s| s as isize).collect();
    let mut base = 0usize;
    for (axis, bounds) in plan.into_iter().enumerate() {
        let Some((start, end, step)) = bounds else {
            continue;
        };
        let range = slice_range(x.shape[axis], start, end, step)?;
        dims[axis] = range.len;
        if range.len > 0 {
            base += range.start as usize * in_strides[axis];
        }
        strides[axis] = in_strides[axis] as isize * range.step as isize;
    }
    if dims != y.shape || x.dtype != y.dtype {
        return Err(format!(
            "slicing {:?} gives {dims:?}, not {:?}",
            x.shape, y.shape
        ));
    }
    Ok(Some(Box::new(SliceStep {
        x: x.clone(),
        dims,
        strides,
        base,
        y: b.outs[0].clone(),
    })))
}

impl Kernel for SliceStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: the Kernel::run contract: the program's slots address live buffers of
        // their planned sizes for this run.
        unsafe {
            let Self {
                x,
                dims,
                strides,
                base,
                y: ys,
            } = self;
            let y = cx.ptr(ys.loc);
            let es = x.dtype.size_in_bytes();
            let r = dims.len();
            let total = ys.elements();
            if r == 0 || total == 0 {
                std::ptr::copy_nonoverlapping(cx.ptr(x.loc), y, ys.bytes());
                return Ok(());
            }
            let inner = dims[r - 1];
            let src = cx.ptr(x.loc).add(base * es) as *const u8;
            for row in 0..total / inner {
                let (mut rest, mut off) = (row, 0isize);
                for a in (0..r - 1).rev() {
                    off += (rest % dims[a]) as isize * strides[a];
                    rest /= dims[a];
                }
                let (s, d) = (src.offset(off * es as isize), y.add(row * inner * es));
                if strides[r - 1] == 1 {
                    std::ptr::copy_nonoverlapping(s, d, inner * es);
                } else {
                    for i in 0..inner {
                        let from = s.offset(i as isize * strides[r - 1] * es as isize);
                        std::ptr::copy_nonoverlapping(from, d.add(i * es), es);
                    }
                }
            }
            Ok(())
        }
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "slice"
    }
}

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
        // SAFETY: the Kernel::run contract: the program's slots address live buffers of
        // their planned sizes for this run.
        unsafe {
            let out = std::slice::from_raw_parts_mut(cx.ptr(self.y.loc), self.y.bytes());
            if self.element.iter().all(|&b| b == 0) {
                out.fill(0);
            } else {
                for chunk in out.chunks_exact_mut(self.element.len()) {
                    chunk.copy_from_slice(&self.element);
                }
            }
            Ok(())
        }
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "fill"
    }
}
