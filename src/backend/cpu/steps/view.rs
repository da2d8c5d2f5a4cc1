//! Data movement. Ops that only relabel the shape (`Reshape`, `Flatten`, `Squeeze`,
//! `Unsqueeze`, `Identity`): the memory planner usually gives the output the input's
//! buffer, and then the step does nothing; otherwise it copies the bytes. `Transpose`:
//! a strided copy. `Gather` on axis 0: row copies.
use crate::backend::cpu::program::{Cx, Kernel, Slot};
use crate::ir::DType;

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
        // SAFETY: callers uphold this unsafe fn's contract: pointers valid for the lengths
        // used, and the CPU features it is compiled for.
        unsafe {
            let (src, dst) = (cx.ptr(self.from.loc), cx.ptr(self.to.loc));
            if src != dst {
                std::ptr::copy_nonoverlapping(src, dst, self.to.bytes());
            }
            Ok(())
        }
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "copy"
    }
}

/// `Transpose` of any rank and element size: the output walked in order, the input by
/// permuted strides; runs along an axis that stays innermost are block copies.
pub struct Transpose {
    x: Slot,
    y: Slot,
    /// Output dims and the input strides (elements) of each output axis.
    dims: Vec<usize>,
    strides: Vec<usize>,
}

pub(crate) fn build_transpose(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    if b.node.op != "Transpose" {
        return Ok(None);
    }
    let x = b.input(0).ok_or("missing input 0")?.clone();
    let r = x.shape.len();
    let perm: Vec<usize> = match b.node.attrs.ints("perm")? {
        Some(p) => p.iter().map(|&a| a as usize).collect(),
        None => (0..r).rev().collect(),
    };
    let mut in_strides = vec![1; r];
    for a in (0..r.saturating_sub(1)).rev() {
        in_strides[a] = in_strides[a + 1] * x.shape[a + 1];
    }
    let y = b.outs[0].clone();
    let dims: Vec<usize> = perm.iter().map(|&a| x.shape[a]).collect();
    if dims != y.shape {
        return Err(format!(
            "perm {perm:?} of {:?} is not {:?}",
            x.shape, y.shape
        ));
    }
    let strides = perm.iter().map(|&a| in_strides[a]).collect();
    Ok(Some(Box::new(Transpose {
        x,
        y,
        dims,
        strides,
    })))
}

impl Kernel for Transpose {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: callers uphold this unsafe fn's contract: pointers valid for the lengths
        // used, and the CPU features it is compiled for.
        unsafe {
            let es = self.x.dtype.size_in_bytes();
            let (src, dst) = (cx.ptr(self.x.loc) as *const u8, cx.ptr(self.y.loc));
            let r = self.dims.len();
            if r == 0 || self.y.elements() == 0 {
                std::ptr::copy_nonoverlapping(src, dst, self.y.bytes());
                return Ok(());
            }
            let inner = self.dims[r - 1];
            let rows = self.y.elements() / inner;
            let contiguous = self.strides[r - 1] == 1;
            let (src, dst) = (src as usize, dst as usize);
            let body = |row: usize| {
                // The input offset of output row `row` (all axes but the last).
                let (mut rest, mut off) = (row, 0);
                for a in (0..r - 1).rev() {
                    off += (rest % self.dims[a]) * self.strides[a];
                    rest /= self.dims[a];
                }
                let (s, d) = (
                    (src + off * es) as *const u8,
                    (dst + row * inner * es) as *mut u8,
                );
                // Offsets stay inside the input and this row of the output.
                {
                    if contiguous {
                        std::ptr::copy_nonoverlapping(s, d, inner * es);
                    } else {
                        let step = self.strides[r - 1] * es;
                        for i in 0..inner {
                            std::ptr::copy_nonoverlapping(s.add(i * step), d.add(i * es), es);
                        }
                    }
                }
            };
            match cx.pool {
                Some(pool) if self.y.bytes() >= 1 << 16 => {
                    let chunk = rows.div_ceil(4 * pool.threads());
                    pool.run(rows.div_ceil(chunk), &|t| {
                        (t * chunk..rows.min(t * chunk + chunk)).for_each(body)
                    })
                }
                _ => (0..rows).for_each(body),
            }
            Ok(())
        }
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "transpose"
    }
}

/// `Gather` on axis 0 (embedding lookups): one row copy per index.
pub struct GatherRows {
    data: Slot,
    indices: Slot,
    y: Slot,
    /// Bytes per row of `data`.
    row: usize,
}

pub(crate) fn build_gather(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    if b.node.op != "Gather" || b.node.attrs.int_or("axis", 0)? != 0 {
        return Ok(None);
    }
    let (Some(data), Some(indices)) = (b.input(0), b.input(1)) else {
        return Ok(None);
    };
    if !matches!(indices.dtype, DType::I64 | DType::I32) || data.shape.is_empty() {
        return Ok(None);
    }
    let row = data.bytes() / data.shape[0].max(1);
    Ok(Some(Box::new(GatherRows {
        data: data.clone(),
        indices: indices.clone(),
        y: b.outs[0].clone(),
        row,
    })))
}

impl Kernel for GatherRows {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: callers uphold this unsafe fn's contract: pointers valid for the lengths
        // used, and the CPU features it is compiled for.
        unsafe {
            let rows = self.data.shape[0] as i64;
            let (src, dst, ip) = (
                cx.ptr(self.data.loc),
                cx.ptr(self.y.loc),
                cx.ptr(self.indices.loc),
            );
            for k in 0..self.indices.elements() {
                let i = match self.indices.dtype {
                    DType::I32 => *(ip as *const i32).add(k) as i64,
                    _ => *(ip as *const i64).add(k),
                };
                let i = if i < 0 { i + rows } else { i };
                if !(0..rows).contains(&i) {
                    return Err(format!("index {i} is out of range for {rows} rows"));
                }
                std::ptr::copy_nonoverlapping(
                    src.add(i as usize * self.row),
                    dst.add(k * self.row),
                    self.row,
                );
            }
            Ok(())
        }
    }
    fn kind(&self) -> &'static str {
        "gather"
    }
}
