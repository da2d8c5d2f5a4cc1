//! Shared helpers for the kernels' tests.
use crate::backend::cpu::pool::Pool;

/// `n` deterministic pseudo-random floats in [-scale, scale).
pub(crate) fn lcg_data(n: usize, scale: f32, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// No pool, and a pool of two threads.
pub(crate) fn pools() -> Vec<Option<Pool>> {
    vec![None, Some(Pool::new(2))]
}
