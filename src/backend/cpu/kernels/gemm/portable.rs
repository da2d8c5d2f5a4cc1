//! The portable 6×16 micro-kernel: plain Rust over the same packed panels, which the
//! compiler vectorizes for the baseline target.
use super::{store_tile_scalar, Tile, MR, NR};

/// `C tile (op)= Ap[6×kc]·Bp[kc×16]`, then the tile's store rules (see [`Tile`]).
///
/// # Safety
/// `ap` addresses `kc·6` packed floats, `bp` `kc·16`, and `t` a valid tile of C.
pub(super) unsafe fn kernel(kc: usize, ap: *const f32, bp: *const f32, t: &Tile) {
    // SAFETY: the caller guarantees both packed panels' extents.
    let (a, b) = unsafe {
        (
            std::slice::from_raw_parts(ap, kc * MR),
            std::slice::from_raw_parts(bp, kc * NR),
        )
    };
    let mut acc = [[0f32; NR]; MR];
    for (ac, br) in a.chunks_exact(MR).zip(b.chunks_exact(NR)) {
        for (row, &x) in acc.iter_mut().zip(ac) {
            for (o, &y) in row.iter_mut().zip(br) {
                *o += x * y;
            }
        }
    }
    // SAFETY: `t` is a valid tile (the caller's contract).
    unsafe { store_tile_scalar(&acc, t) };
}
