//! The AVX2+FMA 6×16 micro-kernel: 12 ymm accumulators, per k step two aligned loads of
//! the packed B row and six broadcasts of the packed A column.
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::{store_tile_scalar, Tile, MR, NR};

/// `C tile (op)= Ap[6×kc]·Bp[kc×16]`, then the tile's store rules (see [`Tile`]).
///
/// # Safety
/// The CPU must have AVX2 and FMA. `ap` addresses `kc·6` packed floats, `bp` `kc·16`
/// packed floats aligned to 32 bytes, and `t` a valid tile of C (see [`Tile`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn kernel(kc: usize, ap: *const f32, bp: *const f32, t: &Tile) {
    let mut c00 = _mm256_setzero_ps();
    let mut c01 = _mm256_setzero_ps();
    let mut c10 = _mm256_setzero_ps();
    let mut c11 = _mm256_setzero_ps();
    let mut c20 = _mm256_setzero_ps();
    let mut c21 = _mm256_setzero_ps();
    let mut c30 = _mm256_setzero_ps();
    let mut c31 = _mm256_setzero_ps();
    let mut c40 = _mm256_setzero_ps();
    let mut c41 = _mm256_setzero_ps();
    let mut c50 = _mm256_setzero_ps();
    let mut c51 = _mm256_setzero_ps();

    // Pull the C tile towards L1 while the product is computed.
    if t.mr == MR && t.nr == NR {
        for r in 0..MR {
            // A prefetch never faults: wrapping arithmetic suffices for its address.
            let p = t.c.wrapping_add(r * t.ldc) as *const i8;
            _mm_prefetch::<_MM_HINT_T0>(p);
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(60));
        }
    }

    let mut a = ap;
    let mut b = bp;
    // Element `$i` of packed A's column `$off` steps past `a`, borrowed for a broadcast.
    macro_rules! a_elem {
        ($off:expr, $i:expr) => {
            // SAFETY: `a` sits at a step of the kc the loops below count down, at least
            // `$off + 1` steps before the end, so column `$off` (6 floats, `$i < 6`) lies
            // in the caller's kc·6 packed floats.
            unsafe { &*a.add($off * MR + $i) }
        };
    }
    macro_rules! step {
        ($off:expr) => {{
            // SAFETY: as for `a_elem`, row `$off` of the packed B panel (its 16 floats,
            // 32-byte aligned as the panel is) lies in the caller's kc·16 floats.
            let (b0, b1) = unsafe {
                (
                    _mm256_load_ps(b.add($off * NR)),
                    _mm256_load_ps(b.add($off * NR + 8)),
                )
            };
            let x = _mm256_broadcast_ss(a_elem!($off, 0));
            c00 = _mm256_fmadd_ps(x, b0, c00);
            c01 = _mm256_fmadd_ps(x, b1, c01);
            let x = _mm256_broadcast_ss(a_elem!($off, 1));
            c10 = _mm256_fmadd_ps(x, b0, c10);
            c11 = _mm256_fmadd_ps(x, b1, c11);
            let x = _mm256_broadcast_ss(a_elem!($off, 2));
            c20 = _mm256_fmadd_ps(x, b0, c20);
            c21 = _mm256_fmadd_ps(x, b1, c21);
            let x = _mm256_broadcast_ss(a_elem!($off, 3));
            c30 = _mm256_fmadd_ps(x, b0, c30);
            c31 = _mm256_fmadd_ps(x, b1, c31);
            let x = _mm256_broadcast_ss(a_elem!($off, 4));
            c40 = _mm256_fmadd_ps(x, b0, c40);
            c41 = _mm256_fmadd_ps(x, b1, c41);
            let x = _mm256_broadcast_ss(a_elem!($off, 5));
            c50 = _mm256_fmadd_ps(x, b0, c50);
            c51 = _mm256_fmadd_ps(x, b1, c51);
        }};
    }
    let mut p = kc;
    while p >= 4 {
        // 64 floats ahead in packed A (maybe past its end: a prefetch never faults).
        _mm_prefetch::<_MM_HINT_T0>(a.wrapping_add(64) as *const i8);
        step!(0);
        step!(1);
        step!(2);
        step!(3);
        // SAFETY: `p >= 4` steps were left, so 4 columns of A and rows of B advance
        // to at most the ends of the kc·6 and kc·16 floats.
        (a, b) = unsafe { (a.add(4 * MR), b.add(4 * NR)) };
        p -= 4;
    }
    while p > 0 {
        step!(0);
        // SAFETY: `p > 0` steps were left: one column and row on, still at most the end.
        (a, b) = unsafe { (a.add(MR), b.add(NR)) };
        p -= 1;
    }

    let acc = [
        [c00, c01],
        [c10, c11],
        [c20, c21],
        [c30, c31],
        [c40, c41],
        [c50, c51],
    ];
    if t.mr == MR && t.nr == NR {
        // SAFETY: the tile is full (6×16), which `store_full` asks, and valid (the contract).
        unsafe { store_full(&acc, t) };
    } else {
        let mut tmp = [[0f32; NR]; MR];
        for (row, v) in tmp.iter_mut().zip(&acc) {
            // SAFETY: `row` is a local [f32; 16]: floats 0..8 and 8..16 of it.
            unsafe {
                _mm256_storeu_ps(row.as_mut_ptr(), v[0]);
                _mm256_storeu_ps(row.as_mut_ptr().add(8), v[1]);
            }
        }
        // SAFETY: `t` is a valid tile of C with its epilogue extents (the contract).
        unsafe { store_tile_scalar(&tmp, t) };
    }
}

/// Stores a full 6×16 tile: accumulate or overwrite, then (last block) bias, residual
/// and ReLU in registers; other activations run on each finished row segment.
///
/// # Safety
/// The CPU must have AVX2; `t` is a valid tile of 6 rows × 16 columns (see [`Tile`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn store_full(acc: &[[__m256; 2]; MR], t: &Tile) {
    let zero = _mm256_setzero_ps();
    let (bc0, bc1) = if t.bias_col.is_null() {
        (zero, zero)
    } else {
        // SAFETY: a non-null per-column bias covers the tile's 16 columns.
        unsafe {
            (
                _mm256_loadu_ps(t.bias_col),
                _mm256_loadu_ps(t.bias_col.add(8)),
            )
        }
    };
    for (r, v) in acc.iter().enumerate() {
        // SAFETY: `r < 6`: row r of the full tile lies in C.
        let c = unsafe { t.c.add(r * t.ldc) };
        let (mut v0, mut v1) = (v[0], v[1]);
        if t.accumulate {
            // SAFETY: row r of C has the tile's 16 columns: floats 0..8 and 8..16.
            unsafe {
                v0 = _mm256_add_ps(v0, _mm256_loadu_ps(c));
                v1 = _mm256_add_ps(v1, _mm256_loadu_ps(c.add(8)));
            }
        }
        if t.last {
            if !t.bias_row.is_null() {
                // SAFETY: a non-null per-row bias covers the tile's 6 rows, r among them.
                let x = _mm256_broadcast_ss(unsafe { &*t.bias_row.add(r) });
                v0 = _mm256_add_ps(v0, x);
                v1 = _mm256_add_ps(v1, x);
            }
            if !t.bias_col.is_null() {
                v0 = _mm256_add_ps(v0, bc0);
                v1 = _mm256_add_ps(v1, bc1);
            }
            if !t.res.is_null() {
                // SAFETY: the residual covers the tile like C: row r's 16 columns.
                unsafe {
                    let rp = t.res.add(r * t.ldr);
                    v0 = _mm256_add_ps(v0, _mm256_loadu_ps(rp));
                    v1 = _mm256_add_ps(v1, _mm256_loadu_ps(rp.add(8)));
                }
            }
            if t.relu {
                v0 = _mm256_max_ps(zero, v0);
                v1 = _mm256_max_ps(zero, v1);
            }
        }
        // SAFETY: row r of C, columns 0..8 and 8..16 (read above when accumulating).
        unsafe {
            _mm256_storeu_ps(c, v0);
            _mm256_storeu_ps(c.add(8), v1);
        }
        if t.last {
            if let Some(act) = t.act {
                // SAFETY: row r's 16 floats of C, just stored and not otherwise borrowed.
                act.apply(unsafe { std::slice::from_raw_parts_mut(c, NR) });
            }
        }
    }
}

/// Packs one full 6-row micro-panel of a row-major A (row stride `rs`) for `kc` columns:
/// `dst[p·6 + r] = a[r·rs + p]`, eight columns at a time through an 8×8 transpose.
///
/// # Safety
/// The CPU must have AVX2. `a` addresses 6 rows of `kc` floats; `dst` holds `kc·6`
/// floats plus 2 of slack past the end (the last 8-wide store spills 2 floats, which
/// the next column group or panel overwrites).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn pack_a_rows(kc: usize, a: *const f32, rs: usize, dst: *mut f32) {
    let zero = _mm256_setzero_ps();
    let mut p = 0;
    while p + 8 <= kc {
        // SAFETY: `p + 8 <= kc` by the loop bound: columns p..p+8 of each of A's 6 rows
        // (row stride `rs`) lie in the 6×kc block the contract gives.
        let (r0, r1, r2, r3, r4, r5) = unsafe {
            (
                _mm256_loadu_ps(a.add(p)),
                _mm256_loadu_ps(a.add(rs + p)),
                _mm256_loadu_ps(a.add(2 * rs + p)),
                _mm256_loadu_ps(a.add(3 * rs + p)),
                _mm256_loadu_ps(a.add(4 * rs + p)),
                _mm256_loadu_ps(a.add(5 * rs + p)),
            )
        };
        let t0 = _mm256_unpacklo_ps(r0, r1);
        let t1 = _mm256_unpackhi_ps(r0, r1);
        let t2 = _mm256_unpacklo_ps(r2, r3);
        let t3 = _mm256_unpackhi_ps(r2, r3);
        let t4 = _mm256_unpacklo_ps(r4, r5);
        let t5 = _mm256_unpackhi_ps(r4, r5);
        let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let u4 = _mm256_shuffle_ps::<0x44>(t4, zero);
        let u5 = _mm256_shuffle_ps::<0xEE>(t4, zero);
        let u6 = _mm256_shuffle_ps::<0x44>(t5, zero);
        let u7 = _mm256_shuffle_ps::<0xEE>(t5, zero);
        // SAFETY: `p + 8 <= kc`: float p·6 of the panel's kc·6.
        let d = unsafe { dst.add(p * MR) };
        // SAFETY: columns p..p+8 of the panel are floats p·6..(p+8)·6 of `dst`; the
        // 8-wide store of column p+7 spills 2 floats past them, into the next column
        // group or the 2 floats of slack the contract gives.
        unsafe {
            _mm256_storeu_ps(d, _mm256_permute2f128_ps::<0x20>(u0, u4));
            _mm256_storeu_ps(d.add(MR), _mm256_permute2f128_ps::<0x20>(u1, u5));
            _mm256_storeu_ps(d.add(2 * MR), _mm256_permute2f128_ps::<0x20>(u2, u6));
            _mm256_storeu_ps(d.add(3 * MR), _mm256_permute2f128_ps::<0x20>(u3, u7));
            _mm256_storeu_ps(d.add(4 * MR), _mm256_permute2f128_ps::<0x31>(u0, u4));
            _mm256_storeu_ps(d.add(5 * MR), _mm256_permute2f128_ps::<0x31>(u1, u5));
            _mm256_storeu_ps(d.add(6 * MR), _mm256_permute2f128_ps::<0x31>(u2, u6));
            _mm256_storeu_ps(d.add(7 * MR), _mm256_permute2f128_ps::<0x31>(u3, u7));
        }
        p += 8;
    }
    while p < kc {
        for r in 0..MR {
            // SAFETY: `p < kc`, `r < 6`: element (r, p) of A's 6×kc block, and float
            // p·6 + r of the panel's kc·6.
            unsafe { *dst.add(p * MR + r) = *a.add(r * rs + p) };
        }
        p += 1;
    }
}

/// Transposes the 8×8 block whose rows are `r`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(u0, u4),
        _mm256_permute2f128_ps::<0x20>(u1, u5),
        _mm256_permute2f128_ps::<0x20>(u2, u6),
        _mm256_permute2f128_ps::<0x20>(u3, u7),
        _mm256_permute2f128_ps::<0x31>(u0, u4),
        _mm256_permute2f128_ps::<0x31>(u1, u5),
        _mm256_permute2f128_ps::<0x31>(u2, u6),
        _mm256_permute2f128_ps::<0x31>(u3, u7),
    ]
}

/// Packs one full 16-column micro-panel of a column-major B (column stride `cs`,
/// element (p, j) at `b[p + j·cs]`, e.g. a transposed weight matrix) for `kc` rows:
/// `dst[p·16 + j] = b[p + j·cs]`, through 8×8 transposes.
///
/// # Safety
/// The CPU must have AVX2. `b` addresses 16 columns of `kc` floats; `dst` holds `kc·16`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn pack_b_cols(kc: usize, b: *const f32, cs: usize, dst: *mut f32) {
    let mut p = 0;
    while p + 8 <= kc {
        for half in 0..2 {
            // SAFETY: column half·8 + i (< 16) of B, rows p..p+8 with `p + 8 <= kc` by
            // the loop bound: inside the 16 columns of kc floats the contract gives.
            let col = |i: usize| unsafe { _mm256_loadu_ps(b.add((half * 8 + i) * cs + p)) };
            let rows = transpose8(std::array::from_fn(col));
            for (i, v) in rows.iter().enumerate() {
                // SAFETY: row p + i < kc of the panel, its columns half·8..half·8+8:
                // inside `dst`'s kc·16 floats.
                unsafe { _mm256_storeu_ps(dst.add((p + i) * NR + half * 8), *v) };
            }
        }
        p += 8;
    }
    while p < kc {
        for j in 0..NR {
            // SAFETY: `p < kc`, `j < 16`: element (p, j) of B (column stride `cs`) and
            // float p·16 + j of `dst`.
            unsafe { *dst.add(p * NR + j) = *b.add(j * cs + p) };
        }
        p += 1;
    }
}

/// Packs one full 6-row micro-panel of a column-major A (column stride `cs`, element
/// (r, p) at `a[r + p·cs]`, e.g. a transposed activation gradient) for `kc` columns:
/// `dst[p·6 + r] = a[r + p·cs]`, six contiguous floats per column.
///
/// # Safety
/// The CPU must have AVX2. `a` addresses `kc` columns of 6 floats; `dst` holds `kc·6`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn pack_a_cols(kc: usize, a: *const f32, cs: usize, dst: *mut f32) {
    let six = _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, 0, 0);
    for p in 0..kc {
        // SAFETY: `p < kc`; the mask `six` keeps the load and the store to the 6 floats
        // of column p of A and of the panel (at p·6 of its kc·6), masked lanes untouched.
        unsafe {
            let v = _mm256_maskload_ps(a.add(p * cs), six);
            _mm256_maskstore_ps(dst.add(p * MR), six, v);
        }
    }
}

/// Packs one full 16-column micro-panel of a row-major B (row stride `rs`) for `kc`
/// rows: two ymm copies per row.
///
/// # Safety
/// The CPU must have AVX2. `b` addresses `kc` rows of 16 floats; `dst` holds `kc·16`
/// floats aligned to 32 bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn pack_b_rows(kc: usize, b: *const f32, rs: usize, dst: *mut f32) {
    for p in 0..kc {
        // SAFETY: `p < kc`: row p's 16 floats of B, and of `dst` at p·16 (32-byte
        // aligned for the aligned stores, as `dst` is and 8 floats are 32 bytes).
        unsafe {
            let (s, d) = (b.add(p * rs), dst.add(p * NR));
            _mm256_store_ps(d, _mm256_loadu_ps(s));
            _mm256_store_ps(d.add(8), _mm256_loadu_ps(s.add(8)));
        }
    }
}
