//! Adam's update of one variable as one register-resident loop.
//!
//! The optimizer builder (`optim.rs`) writes the update as thirteen elementwise ops,
//! which `fuse-elementwise` turns into one `Fused` node with the body [`BODY`]. The
//! generic [`super::fused::FusedLoop`] runs each step as a pass over a tile buffer in
//! L1; for this body that is 13 vector stores per 16 elements, which bound the update by
//! those stores rather than by memory. This loop keeps every intermediate in registers
//! and performs the same IEEE operations in the same order (Rust never contracts a
//! multiply and an add), so it gives the fused loop's results bit for bit, in about half
//! the time (`bench/RESULTS.md`).

use super::par::{for_ranges, SyncPtr};
use crate::backend::cpu::isa::Isa;
use crate::backend::cpu::pool::Pool;

/// The `Fused` body of one variable's Adam update (without weight decay), as
/// `fuse-elementwise` writes it for the optimizer builder's ops; exported steps
/// [`EXPORTS`] are m' and v'. Inputs: i0 m, i1 β₁, i2 g, i3 1 − β₁, i4 lr/(1 − β₁ᵗ),
/// i5 v, i6 β₂, i7 1 − β₂, i8 1/(1 − β₂ᵗ), i9 ε, i10 w.
pub(crate) const BODY: [&str; 13] = [
    "Mul(i0, i1)",
    "Mul(i2, i3)",
    "Add(t0, t1)",
    "Mul(t2, i4)",
    "Mul(i5, i6)",
    "Mul(i2, i2)",
    "Mul(t5, i7)",
    "Add(t4, t6)",
    "Mul(t7, i8)",
    "Sqrt(t8)",
    "Add(t9, i9)",
    "Div(t3, t10)",
    "Sub(i10, t11)",
];
/// The steps [`BODY`] exports (m', v').
pub(crate) const EXPORTS: [i64; 2] = [2, 7];
/// The inputs of [`BODY`] that are tensors of the output's shape (m, g, v, w); the
/// others are scalars.
pub(crate) const TENSOR_INPUTS: [usize; 4] = [0, 2, 5, 10];

/// Elements per parallel task.
const CHUNK: usize = 8192;

/// Whether [`run`] can run on this CPU for `isa` (else the generic loop runs the body).
pub fn available(isa: Isa) -> bool {
    super::math::use_avx512(isa)
}

/// Runs [`BODY`] over `n` elements: `ins` are its 11 inputs (tensors of n elements
/// at [`TENSOR_INPUTS`], one-element scalars elsewhere), `outs` w', m', v'.
///
/// # Safety
/// [`available`] must hold. The tensors hold `n` floats, the scalars one; each output
/// holds `n` floats and may be one of the tensor inputs (each element is read before
/// it is written) but the outputs are disjoint.
pub(crate) unsafe fn run(
    isa: Isa,
    ins: &[*const f32; 11],
    outs: &[*mut f32; 3],
    n: usize,
    pool: Option<&Pool>,
) {
    assert!(available(isa), "the Adam loop needs AVX-512F");
    // SAFETY: the scalars hold one float each (the caller's contract).
    let s: [f32; 11] = std::array::from_fn(|k| unsafe { *ins[k] });
    let ins = SyncPtr(ins.as_ptr() as *mut *const f32);
    let outs = SyncPtr(outs.as_ptr() as *mut *mut f32);
    for_ranges(pool, n.div_ceil(CHUNK), CHUNK * BODY.len(), &|r| {
        let (start, end) = (r.start * CHUNK, (r.end * CHUNK).min(n));
        // SAFETY: the caller's contract; tasks cover disjoint element ranges.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            let at = |k: usize| ins.get().add(k).read().add(start);
            let out = |k: usize| outs.get().add(k).read().add(start);
            avx512(
                [at(0), at(2), at(5), at(10)],
                &s,
                [out(0), out(1), out(2)],
                end - start,
            )
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (start, end, &s);
    });
}

/// The loop over `len` elements: `t` = m, g, v, w; `s` the 11 inputs' scalar values
/// (those at tensor positions unused); `o` = w', m', v'.
///
/// # Safety
/// AVX-512F; the pointers cover `len` floats as in [`run`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn avx512(t: [*const f32; 4], s: &[f32; 11], o: [*mut f32; 3], len: usize) {
    use std::arch::x86_64::*;
    let c = |k: usize| _mm512_set1_ps(s[k]);
    let (b1, c1, s1, b2, c2, s2, eps) = (c(1), c(3), c(4), c(6), c(7), c(8), c(9));
    let mut k = 0;
    while k < len {
        let mask: __mmask16 = if len - k >= 16 {
            0xffff
        } else {
            (1u16 << (len - k)) - 1
        };
        // SAFETY: `p` is one of `t`, each readable for `len` floats (contract); `k < len`
        // and the mask keeps lanes `k..min(k + 16, len)` only.
        let ld = |p: *const f32| unsafe { _mm512_maskz_loadu_ps(mask, p.add(k)) };
        let (m, g, v, w) = (ld(t[0]), ld(t[1]), ld(t[2]), ld(t[3]));
        let m1 = _mm512_add_ps(_mm512_mul_ps(m, b1), _mm512_mul_ps(g, c1));
        let step = _mm512_mul_ps(m1, s1);
        let v1 = _mm512_add_ps(_mm512_mul_ps(v, b2), _mm512_mul_ps(_mm512_mul_ps(g, g), c2));
        let den = _mm512_add_ps(_mm512_sqrt_ps(_mm512_mul_ps(v1, s2)), eps);
        let w1 = _mm512_sub_ps(w, _mm512_div_ps(step, den));
        // SAFETY: the outputs `o` are writable for `len` floats (contract) and `mask`
        // stores only lanes below `len`; this element's inputs were loaded above.
        unsafe {
            _mm512_mask_storeu_ps(o[0].add(k), mask, w1);
            _mm512_mask_storeu_ps(o[1].add(k), mask, m1);
            _mm512_mask_storeu_ps(o[2].add(k), mask, v1);
        }
        k += 16;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::kernels::binary::{BinOp, UnaryOp};
    use crate::backend::cpu::kernels::fused::{FusedLoop, Operand, StepOp};
    use crate::backend::cpu::kernels::testutil::{lcg_data, pools};
    use crate::ir::ops::fused::{body, Arg};
    use crate::ir::{Attr, Attrs};

    /// [`BODY`] as the generic loop's steps.
    fn generic(n: usize) -> FusedLoop {
        let attrs = Attrs::new().with(
            "body",
            Attr::Strings(BODY.iter().map(|s| s.to_string()).collect()),
        );
        let steps: Vec<(StepOp, Vec<Operand>)> = body(&attrs, 11)
            .unwrap()
            .iter()
            .map(|st| {
                let op = match st.op.as_str() {
                    "Mul" => StepOp::Binary(BinOp::Mul),
                    "Add" => StepOp::Binary(BinOp::Add),
                    "Sub" => StepOp::Binary(BinOp::Sub),
                    "Div" => StepOp::Binary(BinOp::Div),
                    "Sqrt" => StepOp::Unary(UnaryOp::Sqrt),
                    op => panic!("{op}"),
                };
                let args = st
                    .args
                    .iter()
                    .map(|a| match a.unwrap() {
                        Arg::Input(k) => Operand::Input(k),
                        Arg::Step(k) => Operand::Step(k),
                    })
                    .collect();
                (op, args)
            })
            .collect();
        let full = [n];
        let shapes: Vec<&[usize]> = (0..11)
            .map(|k| {
                if TENSOR_INPUTS.contains(&k) {
                    &full[..]
                } else {
                    &[][..]
                }
            })
            .collect();
        FusedLoop::new(&steps, &[2, 7], &shapes, &[n]).unwrap()
    }

    /// Bit for bit the generic loop's results, in fresh outputs and written over the
    /// inputs (w' over w, m' over g, v' over v), for ragged lengths, with and without a
    /// pool.
    #[test]
    fn the_adam_loop_matches_the_generic_fused_loop() {
        let isa = crate::backend::cpu::isa::isa();
        if !available(isa) {
            eprintln!("skipped: this CPU has no AVX-512F, which the Adam loop needs");
            return;
        }
        for n in [1, 15, 16, 17, 1000, 3 * CHUNK + 5] {
            let data: Vec<Vec<f32>> = (0..11)
                .map(|k| match k {
                    5 => lcg_data(n, 1.0, 3).iter().map(|x| x * x).collect(),
                    1 => vec![0.9],
                    3 => vec![0.1],
                    4 => vec![1e-3],
                    6 => vec![0.999],
                    7 => vec![1e-3],
                    8 => vec![1.5],
                    9 => vec![1e-8],
                    _ => lcg_data(n, 1.0, k as u64 + 11),
                })
                .collect();
            let ptrs: [*const f32; 11] = std::array::from_fn(|k| data[k].as_ptr());
            let mut want = vec![vec![0.0; n]; 3];
            let outs: Vec<*mut f32> = want.iter_mut().map(|o| o.as_mut_ptr()).collect();
            // SAFETY: the buffers hold n floats each; isa is one this CPU has.
            unsafe { generic(n).run(isa, &ptrs, &outs, None) };
            for pool in pools() {
                let mut got = vec![vec![0.0; n]; 3];
                let outs: [*mut f32; 3] = std::array::from_fn(|k| got[k].as_mut_ptr());
                // SAFETY: as above: n floats per buffer, a supported isa.
                unsafe { run(isa, &ptrs, &outs, n, pool.as_ref()) };
                assert_eq!(got, want, "n = {n}");
                let mut io = data.clone();
                let p: Vec<*mut f32> = io.iter_mut().map(|d| d.as_mut_ptr()).collect();
                let ins: [*const f32; 11] = std::array::from_fn(|k| p[k] as *const f32);
                // SAFETY: as above; the outputs alias their inputs element for element, which run allows.
                unsafe { run(isa, &ins, &[p[10], p[2], p[5]], n, pool.as_ref()) };
                assert_eq!([&io[10], &io[2], &io[5]], [&want[0], &want[1], &want[2]]);
            }
        }
    }
}
