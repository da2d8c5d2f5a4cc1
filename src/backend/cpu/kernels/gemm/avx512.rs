//! The AVX-512F micro-kernel: up to 12×32 (two adjacent 6-row A micro-panels × two
//! adjacent 16-column B micro-panels, 24 zmm accumulators) over the same packing as
//! the 6×16 kernels, so [`super::PackedB`] and the A panels are shared by every ISA.
//! Ragged tiles use the 6×32, 12×16 or 6×16 variant and masked loads/stores, so no
//! tile goes through a scratch copy.
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::{Tile, MR, NR};

/// Rows of the widest tile (two A micro-panels).
pub(super) const MR2: usize = 2 * MR;
/// Columns of the widest tile (two B micro-panels).
pub(super) const NR2: usize = 2 * NR;
/// K steps before a tile's end at which its C lines are asked of L1.
const C_NEAR: usize = 32;
/// K steps per block of the micro-kernel's loop (the steps `block!` spells out).
const UNROLL: usize = 8;

/// `C tile (op)= Ap·Bp`, then the tile's store rules (see [`Tile`]), for a tile of up
/// to 12 rows × 32 columns.
///
/// # Safety
/// The CPU must have AVX-512F. `ap` addresses ⌈t.mr/6⌉ consecutive packed A micro-panels
/// of `kc·6` floats, `bp` ⌈t.nr/16⌉ consecutive packed B micro-panels of `kc·16` floats
/// aligned to 64 bytes, and `t` a valid tile of C with `mr ≤ 12`, `nr ≤ 32`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn kernel(kc: usize, ap: *const f32, bp: *const f32, t: &Tile) {
    // SAFETY: the caller's contract, with the panel counts the variants read.
    unsafe {
        match (t.mr > MR, t.nr > NR) {
            (true, true) => tile::<2, 2>(kc, ap, bp, t),
            (true, false) => tile::<2, 1>(kc, ap, bp, t),
            (false, true) => tile::<1, 2>(kc, ap, bp, t),
            (false, false) => tile::<1, 1>(kc, ap, bp, t),
        }
    }
}

/// Stores row `$r` of the tile (`$np` 16-wide halves of `$row`) under the masks of
/// `$sm`: accumulate or overwrite, then (last block) bias, residual and ReLU in
/// registers (the caller runs other activations after the last row). A macro, not a
/// function: LLVM would not inline a `#[target_feature]` function called 12 times, and
/// passing the accumulators to one spilled all 24 to the stack on every tile.
///
/// Safety (the expansion site's): inside an `unsafe` AVX-512F context, `$r < t.mr`, and
/// `$t` a valid tile (see [`kernel`]); masked loads and stores touch only row `$r`'s
/// `nr` elements of C, the bias and the residual, masked-off lanes neither read nor
/// written.
macro_rules! store_row {
    ($row:expr, $r:expr, $np:expr, $t:expr, $sm:expr) => {{
        let (t, r, sm): (&Tile, usize, &StoreMasks) = ($t, $r, $sm);
        // SAFETY: `r < t.mr`, so row `r` of the tile lies inside C (the `Tile` contract).
        let c = unsafe { t.c.add(r * t.ldc) };
        for j in 0..$np {
            let (mask, off) = (sm.masks[j], j * NR);
            let mut v = $row[j];
            if t.accumulate {
                // SAFETY: `mask` keeps the load to the row's columns `off..nr`, in C.
                v = _mm512_add_ps(v, unsafe { _mm512_maskz_loadu_ps(mask, c.add(off)) });
            }
            if t.last {
                if !t.bias_row.is_null() {
                    // SAFETY: a non-null per-row bias covers the tile's rows, `r` among them.
                    v = _mm512_add_ps(v, _mm512_set1_ps(unsafe { *t.bias_row.add(r) }));
                }
                if !t.bias_col.is_null() {
                    v = _mm512_add_ps(v, sm.bias_col[j]);
                }
                if !t.res.is_null() {
                    // SAFETY: the residual covers the tile like C; `mask` keeps the
                    // read to row `r`'s columns `off..nr`.
                    let x = unsafe { _mm512_maskz_loadu_ps(mask, t.res.add(r * t.ldr + off)) };
                    v = _mm512_add_ps(v, x);
                }
                if t.relu {
                    v = _mm512_max_ps(_mm512_setzero_ps(), v);
                }
            }
            // SAFETY: the same masked columns `off..nr` of row `r` of C as the load above.
            unsafe { _mm512_mask_storeu_ps(c.add(off), mask, v) };
        }
    }};
}

/// The `6·MP × 16·NP` variant (MP, NP ∈ {1, 2}).
///
/// # Safety
/// As for [`kernel`], with `MP` A and `NP` B micro-panels present.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn tile<const MP: usize, const NP: usize>(
    kc: usize,
    ap: *const f32,
    bp: *const f32,
    t: &Tile,
) {
    let mut acc = [[_mm512_setzero_ps(); 2]; MR2];

    // The C tile (and the residual the store adds): asked of L2 now, so the
    // trip from L3 or memory overlaps the product, and of L1 only near the end
    // (`C_NEAR` steps before it), so the A and B streams do not evict it first. A
    // tile no deeper than that asks L1 at once, and only once.
    let res = if t.last { t.res } else { std::ptr::null() };
    macro_rules! prefetch_c {
        ($hint:ident) => {
            // Prefetches only hint the cache and never fault, so the addresses (rows
            // of the tile's C and residual) are computed with wrapping arithmetic.
            for r in 0..t.mr {
                let p = t.c.wrapping_add(r * t.ldc) as *const i8;
                _mm_prefetch::<$hint>(p);
                if t.nr > NR {
                    _mm_prefetch::<$hint>(p.wrapping_add(64));
                }
                if !res.is_null() {
                    let q = res.wrapping_add(r * t.ldr) as *const i8;
                    _mm_prefetch::<$hint>(q);
                    if t.nr > NR {
                        _mm_prefetch::<$hint>(q.wrapping_add(64));
                    }
                }
            }
        };
    }
    if kc > C_NEAR {
        prefetch_c!(_MM_HINT_T1);
    }

    let a_next = kc * MR;
    let b_next = kc * NR;
    let mut a = ap;
    let mut b = bp;
    macro_rules! step {
        ($off:expr) => {{
            let mut bv = [_mm512_setzero_ps(); 2];
            for (j, v) in bv.iter_mut().enumerate().take(NP) {
                // SAFETY: `b` walks panel 0's rows, `$off` steps before a step below kc,
                // so that row of panel `j < NP` (at j·kc·16) lies in the NP packed panels
                // of kc·16 floats, 64-byte aligned as they are (16 floats a row).
                *v = unsafe { _mm512_load_ps(b.add(j * b_next + $off * NR)) };
            }
            for (r, row) in acc.iter_mut().enumerate().take(MP * MR) {
                // SAFETY: as `a` walks panel 0's columns, that step's column of A panel
                // `r / 6 < MP` (at (r/6)·kc·6), row `r % 6`, lies in the MP panels of kc·6.
                let x = _mm512_set1_ps(unsafe { *a.add((r / MR) * a_next + $off * MR + r % MR) });
                for (c, v) in row.iter_mut().zip(&bv).take(NP) {
                    *c = _mm512_fmadd_ps(x, *v, *c);
                }
            }
        }};
    }
    // K runs in blocks of `UNROLL` steps, in three phases, so the only test in a
    // block is the loop's own: blocks that also ask L2 for the tile's share of the
    // next B panel, then plain blocks, then (after asking L1 for C) the last
    // `C_NEAR` steps.
    macro_rules! block {
        () => {{
            step!(0);
            step!(1);
            step!(2);
            step!(3);
            step!(4);
            step!(5);
            step!(6);
            step!(7);
            // SAFETY: `kc / UNROLL` blocks run in all, so the pointers advance at most
            // kc·6 and kc·16 floats: to the end of panel 0 of A and of B at most.
            (a, b) = unsafe { (a.add(UNROLL * MR), b.add(UNROLL * NR)) };
        }};
    }
    let blocks = kc / UNROLL;
    let mut next = t.prefetch as *const i8;
    let mut next_left = t.prefetch_lines;
    let per_block = if next_left > 0 {
        next_left.div_ceil(blocks.max(1))
    } else {
        0
    };
    let mut i = 0;
    while next_left > 0 && i < blocks {
        for _ in 0..per_block.min(next_left) {
            _mm_prefetch::<_MM_HINT_T1>(next);
            next = next.wrapping_add(64);
        }
        next_left = next_left.saturating_sub(per_block);
        block!();
        i += 1;
    }
    let far = blocks.saturating_sub(C_NEAR / UNROLL).max(i);
    while i < far {
        block!();
        i += 1;
    }
    prefetch_c!(_MM_HINT_T0);
    while i < blocks {
        block!();
        i += 1;
    }
    for _ in 0..kc % UNROLL {
        step!(0);
        // SAFETY: the `kc % UNROLL` single steps finish the kc steps: the pointers
        // end one past panel 0's last column of A and row of B at most.
        (a, b) = unsafe { (a.add(MR), b.add(NR)) };
    }
    // Row by row, spelled out: LLVM does not unroll a loop this large, and a rolled
    // loop indexes `acc`, which puts all 24 accumulators on the stack.
    // SAFETY: this tile's `t.bias_col`, when non-null, covers its columns (the contract).
    let sm = unsafe { store_masks(NP, t) };
    macro_rules! store_rows {
        ($($r:literal)*) => {$(
            if $r < MP * MR && $r < t.mr {
                store_row!(acc[$r], $r, NP, t, &sm);
            }
        )*};
    }
    store_rows!(0 1 2 3 4 5 6 7 8 9 10 11);
    // Calls only after every row is stored: the accumulators die before them.
    if let (true, Some(act)) = (t.last, t.act) {
        for r in 0..t.mr {
            // SAFETY: row `r < t.mr` of C has the tile's `t.nr` columns, written
            // above and borrowed by nothing else during the call.
            let row = unsafe { std::slice::from_raw_parts_mut(t.c.add(r * t.ldc), t.nr) };
            act.apply(row);
        }
    }
}

/// The tile-wide parts of the store: the lane masks of the (up to two) 16-wide halves
/// and, on the last block, the per-column bias under them.
struct StoreMasks {
    masks: [__mmask16; 2],
    bias_col: [__m512; 2],
}

/// Builds the [`StoreMasks`] for `t`'s columns.
///
/// # Safety
/// The CPU must have AVX-512F; a non-null `t.bias_col` covers the tile's columns.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn store_masks(np: usize, t: &Tile) -> StoreMasks {
    let masks: [__mmask16; 2] = std::array::from_fn(|j| {
        let cols = t.nr.saturating_sub(j * NR).min(NR);
        ((1u32 << cols) - 1) as __mmask16
    });
    let mut bias_col = [_mm512_setzero_ps(); 2];
    if t.last && !t.bias_col.is_null() {
        for j in 0..np {
            // SAFETY: the non-null per-column bias covers the tile's `t.nr` columns
            // (the contract), and `masks[j]` reads only columns `16·j..t.nr` of them.
            bias_col[j] = unsafe { _mm512_maskz_loadu_ps(masks[j], t.bias_col.add(j * NR)) };
        }
    }
    StoreMasks { masks, bias_col }
}

/// Packs one full 16-column micro-panel of a row-major B (row stride `rs`) for `kc`
/// rows: one zmm copy per row.
///
/// # Safety
/// The CPU must have AVX-512F. `b` addresses `kc` rows of 16 floats; `dst` holds
/// `kc·16` floats aligned to 64 bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn pack_b_rows(kc: usize, b: *const f32, rs: usize, dst: *mut f32) {
    for p in 0..kc {
        // SAFETY: `p < kc`: row p's 16 floats of B and of `dst` (at p·16, 64-byte
        // aligned as `dst` is and 16 floats are 64 bytes) lie inside the contract's extents.
        unsafe { _mm512_store_ps(dst.add(p * NR), _mm512_loadu_ps(b.add(p * rs))) };
    }
}

/// Packs one full 16-column micro-panel of a column-major B (column stride `cs`,
/// element (p, j) at `b[p + j·cs]`) for `kc` rows: `dst[p·16 + j] = b[p + j·cs]`,
/// through 16×16 transposes (64 shuffles per 256 floats).
///
/// # Safety
/// The CPU must have AVX-512F. `b` addresses 16 columns of `kc` floats; `dst` holds
/// `kc·16` floats aligned to 64 bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn pack_b_cols(kc: usize, b: *const f32, cs: usize, dst: *mut f32) {
    let mut p = 0;
    while p + 16 <= kc {
        // r[j] = column j, rows p..p+16.
        // SAFETY: `p + 16 <= kc` by the loop bound and `j < 16`: rows p..p+16 of column
        // j lie in the 16 columns of kc floats the contract gives.
        let r: [__m512; 16] =
            std::array::from_fn(|j| unsafe { _mm512_loadu_ps(b.add(j * cs + p)) });
        // Per 128-bit lane l: t[2i] = (r2i[4l], r2i+1[4l], r2i[4l+1], r2i+1[4l+1]), …
        let t: [__m512; 16] = std::array::from_fn(|x| {
            let (i, hi) = (x / 2, x % 2 == 1);
            if hi {
                _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1])
            } else {
                _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1])
            }
        });
        // u[4i + j], lane l = (r4i, r4i+1, r4i+2, r4i+3) at row 4l + j.
        let u: [__m512; 16] = std::array::from_fn(|x| {
            let (i, j) = (x / 4, x % 4);
            let (lo, hi) = (t[4 * i + j / 2], t[4 * i + j / 2 + 2]);
            if j % 2 == 0 {
                _mm512_shuffle_ps::<0x44>(lo, hi)
            } else {
                _mm512_shuffle_ps::<0xEE>(lo, hi)
            }
        });
        for j in 0..4 {
            let v_even = _mm512_shuffle_f32x4::<0x88>(u[j], u[4 + j]);
            let v_odd = _mm512_shuffle_f32x4::<0xDD>(u[j], u[4 + j]);
            let w_even = _mm512_shuffle_f32x4::<0x88>(u[8 + j], u[12 + j]);
            let w_odd = _mm512_shuffle_f32x4::<0xDD>(u[8 + j], u[12 + j]);
            let row = |q: usize| dst.wrapping_add((p + q) * NR);
            // SAFETY: rows p + j, p + 4 + j, p + 8 + j and p + 12 + j (j < 4) are below
            // p + 16 <= kc, so each 16-float row lies in `dst`'s kc·16 floats, 64-byte
            // aligned as `dst` is.
            unsafe {
                _mm512_store_ps(row(j), _mm512_shuffle_f32x4::<0x88>(v_even, w_even));
                _mm512_store_ps(row(4 + j), _mm512_shuffle_f32x4::<0x88>(v_odd, w_odd));
                _mm512_store_ps(row(8 + j), _mm512_shuffle_f32x4::<0xDD>(v_even, w_even));
                _mm512_store_ps(row(12 + j), _mm512_shuffle_f32x4::<0xDD>(v_odd, w_odd));
            }
        }
        p += 16;
    }
    while p < kc {
        for j in 0..NR {
            // SAFETY: `p < kc` and `j < 16`: element (p, j) of B's kc×16 block and of
            // the kc·16 floats of `dst`.
            unsafe { *dst.add(p * NR + j) = *b.add(j * cs + p) };
        }
        p += 1;
    }
}
