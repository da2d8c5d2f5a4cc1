//! Packing: lays a block of A out as 6-row micro-panels and a block of B as 16-column
//! micro-panels (k-major, zero-padded at the ragged edge), the layout every
//! micro-kernel reads; the portable packers of full panels live here too.
use super::dispatch::Kernel;
use super::{MR, NR};

/// Packs the mc×kc block of A at `a` (strides rs, cs) into 6-row micro-panels, each
/// kc×6 floats k-major, zero-padding the last panel's missing rows.
///
/// # Safety
/// `a` addresses an mc×kc matrix; `dst` holds ⌈mc/6⌉·6·kc floats plus 8 of slack.
pub(super) unsafe fn pack_a(
    kern: Kernel,
    mc: usize,
    kc: usize,
    a: *const f32,
    rs: usize,
    cs: usize,
    dst: *mut f32,
) {
    let panels = mc.div_ceil(MR);
    for q in 0..panels {
        let rows = MR.min(mc - q * MR);
        // SAFETY: `q < panels`: row q·6 of A exists, and panel q of the destination
        // (kc·6 floats at q·6·kc) lies in its ⌈mc/6⌉·6·kc.
        let (base, pdst) = unsafe { (a.add(q * MR * rs), dst.add(q * MR * kc)) };
        if cs == 1 && rows == MR {
            // Row-major A: rows read contiguously and transposed.
            // SAFETY: 6 full rows of kc floats from `base`; panel q, then the next
            // panel or the slack, take the packer's 2-float spill; `kern` suits the CPU.
            unsafe { (kern.pack_a_rows)(kc, base, rs, pdst) };
            continue;
        }
        if rs == 1 && rows == MR {
            // Column-major A (a transposed gradient): six contiguous floats a column.
            // SAFETY: kc columns of 6 floats from `base`; panel q holds kc·6 floats.
            unsafe { (kern.pack_a_cols)(kc, base, cs, pdst) };
            continue;
        }
        // SAFETY: panel q's kc·6 floats, not otherwise borrowed while it is filled.
        let panel = unsafe { std::slice::from_raw_parts_mut(pdst, kc * MR) };
        if rows < MR {
            panel.fill(0.0);
        }
        for (p, col) in panel.chunks_exact_mut(MR).enumerate() {
            for (r, o) in col.iter_mut().enumerate().take(rows) {
                // SAFETY: `r < rows`, `p < kc`: element (q·6 + r, p) of the mc×kc A.
                *o = unsafe { *base.add(r * rs + p * cs) };
            }
        }
    }
}

/// Packs the kc×nc block of B at `b` (strides rs, cs) into 16-column micro-panels,
/// each kc×16 floats k-major, zero-padding the last panel's missing columns.
///
/// # Safety
/// `b` addresses a kc×nc matrix; `dst` holds ⌈nc/16⌉·16·kc floats.
pub(super) unsafe fn pack_b(
    kern: Kernel,
    kc: usize,
    nc: usize,
    b: *const f32,
    rs: usize,
    cs: usize,
    dst: *mut f32,
) {
    let panels = nc.div_ceil(NR);
    // SAFETY: the destination's extent (the caller's contract).
    let out = unsafe { std::slice::from_raw_parts_mut(dst, panels * NR * kc) };
    for (q, panel) in out.chunks_exact_mut(NR * kc).enumerate() {
        let cols = NR.min(nc - q * NR);
        // SAFETY: columns q·16 .. q·16+cols of B exist.
        let base = unsafe { b.add(q * NR * cs) };
        if cols < NR {
            panel.fill(0.0);
        }
        if cs == 1 && cols == NR {
            // SAFETY: the panel holds kc·16 floats; rows 0..kc of the 16 columns exist.
            unsafe { (kern.pack_b_rows)(kc, base, rs, panel.as_mut_ptr()) };
        } else if cs == 1 {
            for (p, row) in panel.chunks_exact_mut(NR).enumerate() {
                // SAFETY: row p of the panel has `cols` contiguous elements.
                let src = unsafe { std::slice::from_raw_parts(base.add(p * rs), cols) };
                row[..cols].copy_from_slice(src);
            }
        } else if rs == 1 && cols == NR {
            // Column-major B (a transposed weight matrix): columns read contiguously and
            // transposed.
            // SAFETY: the panel holds kc·16 floats; columns q·16 .. q·16+16 exist.
            unsafe { (kern.pack_b_cols)(kc, base, cs, panel.as_mut_ptr()) };
        } else if rs == 1 {
            for j in 0..cols {
                // SAFETY: column j of the panel has kc contiguous elements.
                let src = unsafe { std::slice::from_raw_parts(base.add(j * cs), kc) };
                for (p, &v) in src.iter().enumerate() {
                    panel[p * NR + j] = v;
                }
            }
        } else {
            for (p, row) in panel.chunks_exact_mut(NR).enumerate() {
                for (j, o) in row.iter_mut().enumerate().take(cols) {
                    // SAFETY: element (p, j) of the block.
                    *o = unsafe { *base.add(p * rs + j * cs) };
                }
            }
        }
    }
}

/// The portable packer of a full 6-row panel of row-major A.
///
/// # Safety
/// `a` addresses 6 rows of `kc` floats (row stride `rs`); `dst` holds `kc·6` floats.
pub(super) unsafe fn portable_pack_a_rows(kc: usize, a: *const f32, rs: usize, dst: *mut f32) {
    // SAFETY: the destination's extent (the caller's contract).
    let panel = unsafe { std::slice::from_raw_parts_mut(dst, kc * MR) };
    for r in 0..MR {
        // SAFETY: row r has kc contiguous elements.
        let src = unsafe { std::slice::from_raw_parts(a.add(r * rs), kc) };
        for (p, &v) in src.iter().enumerate() {
            panel[p * MR + r] = v;
        }
    }
}

/// The portable packer of a full 6-row panel of column-major A.
///
/// # Safety
/// `a` addresses `kc` columns of 6 floats (column stride `cs`); `dst` holds `kc·6`.
pub(super) unsafe fn portable_pack_a_cols(kc: usize, a: *const f32, cs: usize, dst: *mut f32) {
    // SAFETY: the destination's extent (the caller's contract).
    let panel = unsafe { std::slice::from_raw_parts_mut(dst, kc * MR) };
    for (p, col) in panel.chunks_exact_mut(MR).enumerate() {
        // SAFETY: column p has 6 contiguous elements.
        col.copy_from_slice(unsafe { std::slice::from_raw_parts(a.add(p * cs), MR) });
    }
}

/// The portable packer of a full 16-column panel of row-major B.
///
/// # Safety
/// `b` addresses `kc` rows of 16 floats (row stride `rs`); `dst` holds `kc·16`.
pub(super) unsafe fn portable_pack_b_rows(kc: usize, b: *const f32, rs: usize, dst: *mut f32) {
    // SAFETY: the destination's extent (the caller's contract).
    let panel = unsafe { std::slice::from_raw_parts_mut(dst, kc * NR) };
    for (p, row) in panel.chunks_exact_mut(NR).enumerate() {
        // SAFETY: row p has 16 contiguous elements (a fixed-size copy, which compiles to
        // vector moves rather than a memcpy call).
        row.copy_from_slice(unsafe { &*(b.add(p * rs) as *const [f32; NR]) });
    }
}

/// The portable packer of a full 16-column panel of column-major B.
///
/// # Safety
/// `b` addresses 16 columns of `kc` floats (column stride `cs`); `dst` holds `kc·16`.
pub(super) unsafe fn portable_pack_b_cols(kc: usize, b: *const f32, cs: usize, dst: *mut f32) {
    // SAFETY: the destination's extent (the caller's contract).
    let panel = unsafe { std::slice::from_raw_parts_mut(dst, kc * NR) };
    for j in 0..NR {
        // SAFETY: column j has kc contiguous elements.
        let src = unsafe { std::slice::from_raw_parts(b.add(j * cs), kc) };
        for (p, &v) in src.iter().enumerate() {
            panel[p * NR + j] = v;
        }
    }
}
