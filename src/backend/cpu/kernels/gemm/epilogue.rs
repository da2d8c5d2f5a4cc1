//! The epilogue's two forms and the tile store: [`apply_epilogue`] applies an
//! [`Epilogue`] to a row of C after the fact, [`Ep`] is the epilogue positioned at a
//! sub-matrix with the activation split into ReLU (fused in registers) and the rest,
//! [`Tile`] is one micro-tile's store as the micro-kernels see it, and
//! [`store_tile_scalar`] the scalar store of the portable kernel and the edge tiles.
use super::{Bias, Epilogue, MR, NR};
use crate::backend::cpu::kernels::Act;

/// Applies `ep` to `row[..]`, the elements (i, j0..j0+len) of C.
///
/// # Safety
/// The epilogue's pointers must cover row i and columns j0..j0+len.
pub unsafe fn apply_epilogue(ep: &Epilogue, i: usize, j0: usize, row: &mut [f32], _ldc: usize) {
    match ep.bias {
        Bias::None => {}
        Bias::PerRow(b) => {
            // SAFETY: the bias has m values (the caller's contract).
            let v = unsafe { *b.add(i) };
            row.iter_mut().for_each(|x| *x += v);
        }
        Bias::PerCol(b) => {
            // SAFETY: the bias covers columns j0..j0+len (the caller's contract).
            let b = unsafe { std::slice::from_raw_parts(b.add(j0), row.len()) };
            row.iter_mut().zip(b).for_each(|(x, v)| *x += v);
        }
    }
    if let Some((r, ldr)) = ep.residual {
        // SAFETY: the residual covers row i, columns j0..j0+len (the caller's contract).
        let r = unsafe { std::slice::from_raw_parts(r.add(i * ldr + j0), row.len()) };
        row.iter_mut().zip(r).for_each(|(x, v)| *x += v);
    }
    ep.act.apply(row);
}

/// One micro-tile's store: where it goes and what the epilogue adds.
pub(crate) struct Tile {
    /// C at the tile's (0, 0), row stride `ldc`; `mr`×`nr` of it are stored.
    pub(super) c: *mut f32,
    pub(super) ldc: usize,
    pub(super) mr: usize,
    pub(super) nr: usize,
    /// Add to C (a later KC slice) rather than overwrite it.
    pub(super) accumulate: bool,
    /// The last KC slice: apply the epilogue.
    pub(super) last: bool,
    /// Per-row bias at the tile's row 0, or null.
    pub(super) bias_row: *const f32,
    /// Per-column bias at the tile's column 0, or null.
    pub(super) bias_col: *const f32,
    /// Residual at the tile's (0, 0) with row stride `ldr`, or null.
    pub(super) res: *const f32,
    pub(super) ldr: usize,
    pub(super) relu: bool,
    /// An activation other than None/ReLU, applied to each stored row segment.
    pub(super) act: Option<Act>,
    /// Cache lines the AVX-512 kernel asks L2 for while it runs (the next B panel's
    /// share), starting at `prefetch`; 0 for none.
    pub(super) prefetch: *const f32,
    pub(super) prefetch_lines: usize,
}

/// Stores a computed tile `acc` by the rules of `t` (the edge-tile and portable path).
///
/// # Safety
/// `t` must describe a valid `mr`×`nr` tile of C and matching epilogue extents.
pub(crate) unsafe fn store_tile_scalar(acc: &[[f32; NR]; MR], t: &Tile) {
    for (r, acc_row) in acc.iter().enumerate().take(t.mr) {
        // SAFETY: row r < mr of the tile has nr elements (the caller's contract).
        let row = unsafe { std::slice::from_raw_parts_mut(t.c.add(r * t.ldc), t.nr) };
        for (j, (o, &v)) in row.iter_mut().zip(acc_row).enumerate() {
            let mut v = v;
            if t.accumulate {
                v += *o;
            }
            if t.last {
                if !t.bias_row.is_null() {
                    // SAFETY: the per-row bias covers the tile's rows.
                    v += unsafe { *t.bias_row.add(r) };
                }
                if !t.bias_col.is_null() {
                    // SAFETY: the per-column bias covers the tile's columns.
                    v += unsafe { *t.bias_col.add(j) };
                }
                if !t.res.is_null() {
                    // SAFETY: the residual covers the tile.
                    v += unsafe { *t.res.add(r * t.ldr + j) };
                }
                if t.relu {
                    v = crate::backend::cpu::kernels::math::relu(v);
                }
            }
            *o = v;
        }
        if t.last {
            if let Some(act) = t.act {
                act.apply(row);
            }
        }
    }
}

/// The epilogue with its pointers at C's (0, 0) and the activation split.
#[derive(Clone, Copy)]
pub(super) struct Ep {
    pub(super) bias_row: *const f32,
    pub(super) bias_col: *const f32,
    pub(super) res: *const f32,
    pub(super) ldr: usize,
    pub(super) relu: bool,
    pub(super) act: Option<Act>,
}

// SAFETY: the bias and residual pointers are read-only views of buffers the GEMM's
// caller keeps alive and unwritten for the call, so any thread may read them.
unsafe impl Send for Ep {}
// SAFETY: an `&Ep` only hands out copies of those read-only pointers; nothing is
// written through them.
unsafe impl Sync for Ep {}

impl Ep {
    pub(super) fn new(ep: &Epilogue) -> Ep {
        let (bias_row, bias_col) = match ep.bias {
            Bias::None => (std::ptr::null(), std::ptr::null()),
            Bias::PerRow(p) => (p, std::ptr::null()),
            Bias::PerCol(p) => (std::ptr::null(), p),
        };
        let (res, ldr) = ep.residual.unwrap_or((std::ptr::null(), 0));
        let (relu, act) = match ep.act {
            Act::None => (false, None),
            Act::Relu => (true, None),
            a => (false, Some(a)),
        };
        Ep {
            bias_row,
            bias_col,
            res,
            ldr,
            relu,
            act,
        }
    }

    /// This epilogue for the sub-matrix of C starting at (i, j).
    ///
    /// # Safety
    /// (i, j) must lie within C (so the offsets stay within the epilogue's extents).
    pub(super) unsafe fn at(&self, i: usize, j: usize) -> Ep {
        // SAFETY: (i, j) lies within C, so each non-null offset (row i of the per-row
        // bias, column j of the per-column one, element (i, j) of the residual) stays in
        // its extent; `offset` leaves null pointers null.
        unsafe {
            Ep {
                bias_row: offset(self.bias_row, i),
                bias_col: offset(self.bias_col, j),
                res: offset(self.res, i * self.ldr + j),
                ..*self
            }
        }
    }
}

/// `p + n`, keeping null as null.
///
/// # Safety
/// A non-null `p + n` must stay within `p`'s allocation.
unsafe fn offset(p: *const f32, n: usize) -> *const f32 {
    if p.is_null() {
        p
    } else {
        // SAFETY: `p` is non-null here, and `p + n` stays in its allocation by the
        // caller's contract.
        unsafe { p.add(n) }
    }
}

/// `C = epilogue(0)` (the k = 0 product).
///
/// # Safety
/// C and `ep` cover m×n.
pub(super) unsafe fn epilogue_only(m: usize, n: usize, c: *mut f32, ldc: usize, ep: &Ep) {
    let zero = [[0f32; NR]; MR];
    let mut i = 0;
    while i < m {
        let mut j = 0;
        while j < n {
            // SAFETY: `i < m`, `j < n`: (i, j) lies in C and in `ep`'s m×n extents.
            let (e, c) = unsafe { (ep.at(i, j), c.add(i * ldc + j)) };
            let t = Tile {
                c,
                ldc,
                mr: MR.min(m - i),
                nr: NR.min(n - j),
                accumulate: false,
                last: true,
                bias_row: e.bias_row,
                bias_col: e.bias_col,
                res: e.res,
                ldr: e.ldr,
                relu: e.relu,
                act: e.act,
                prefetch: std::ptr::null(),
                prefetch_lines: 0,
            };
            // SAFETY: the tile's min(6, m - i) rows × min(16, n - j) columns lie in C
            // and the epilogue's extents.
            unsafe { store_tile_scalar(&zero, &t) };
            j += NR;
        }
        i += MR;
    }
}
