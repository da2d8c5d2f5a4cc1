//! A `Fused` elementwise chain as one loop over the output: the output is walked in
//! tiles of [`TILE`] floats, and every step of the chain runs over the tile before the
//! next tile starts, so intermediate results live in a few small stack buffers (in L1)
//! and never in memory. Each step is one of the vectorized elementwise kernels, rounding
//! where the unfused graph rounds.
//!
//! A loop may also export earlier steps' results (a multi-output `Fused`): those stay in
//! their tile buffers until the tile's last step has run, then are copied out, so every
//! output may take over the buffer of an input of its shape without a later step of the
//! tile reading what an output wrote.
//!
//! The inputs broadcast to the output (numpy rules) as [`Runs`] walks them: size-1 axes
//! dropped and axes merged where every input's strides continue, so each tile reads
//! every input either contiguously or as one repeated value.
use super::activation::Act;
use super::binary::{self, BinOp, UnaryOp};
use super::broadcast::Runs;
use super::math;
use super::par::SyncPtr;
use crate::backend::cpu::isa::Isa;
use crate::backend::cpu::pool::Pool;

/// Floats per tile: every live step buffer is one tile, and a few of them fit in L1.
pub(crate) const TILE: usize = 256;
/// At most this many step results are live at once (a chain that needs more runs
/// through the fallback).
pub(crate) const MAX_BUFFERS: usize = 8;
/// At most this many inputs.
pub(crate) const MAX_INPUTS: usize = 16;

/// A step's operation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StepOp {
    Binary(BinOp),
    Unary(UnaryOp),
    /// An activation with its parameters (LeakyRelu, Clip with constant bounds, …).
    Act(Act),
}

/// A step's operand as the chain names it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Operand {
    Input(usize),
    Step(usize),
}

/// Where an instruction reads from.
#[derive(Debug, Clone, Copy)]
enum Src {
    Input(usize),
    Buffer(usize),
}

/// Where an instruction writes.
#[derive(Debug, Clone, Copy)]
enum Dst {
    Buffer(usize),
    Output,
}

#[derive(Debug, Clone, Copy)]
struct Instr {
    op: StepOp,
    args: [Src; 2],
    dst: Dst,
}

/// A chain compiled for fixed input and output shapes.
#[derive(Debug, Clone)]
pub struct FusedLoop {
    instrs: Vec<Instr>,
    #[cfg(test)]
    buffers: usize,
    /// How the inputs broadcast to the output (boxed: it holds arrays for every input a
    /// loop may have).
    runs: Box<Runs<MAX_INPUTS>>,
    /// Whether each input runs along a run of the output (else it repeats one value).
    contiguous: Vec<bool>,
    /// The tile buffer of each exported step, in output order (outputs 1, 2, …).
    exports: Vec<usize>,
}

impl FusedLoop {
    /// Compiles `steps` (each an operation and its operands; the last step's result is
    /// output 0, the results of the `exported` steps outputs 1, 2, …, all of
    /// `out_shape`) over inputs of `input_shapes` into one loop. `None` when the chain
    /// does not fit: more inputs or live results than the loop holds, an operand count
    /// the operation does not take, an exported step that is not an earlier one, or a
    /// shape that does not broadcast.
    pub(crate) fn new(
        steps: &[(StepOp, Vec<Operand>)],
        exported: &[usize],
        input_shapes: &[&[usize]],
        out_shape: &[usize],
    ) -> Option<FusedLoop> {
        let n = input_shapes.len();
        if steps.is_empty() || n > MAX_INPUTS || exported.iter().any(|&k| k + 1 >= steps.len()) {
            return None;
        }
        // The last step reading each step's result.
        let mut last_use = vec![0; steps.len()];
        for (i, (_, args)) in steps.iter().enumerate() {
            for a in args {
                match *a {
                    Operand::Step(k) if k < i => last_use[k] = i,
                    Operand::Input(k) if k < n => {}
                    _ => return None,
                }
            }
        }
        // An exported result is read at the end of the tile.
        for &k in exported {
            last_use[k] = usize::MAX;
        }
        // Buffers by liveness: a step may write over an operand that dies at it (every
        // kernel reads element k before it writes element k).
        let mut free: Vec<usize> = vec![];
        let mut buffers = 0;
        let mut home = vec![0; steps.len()];
        let mut instrs = vec![];
        for (i, (op, args)) in steps.iter().enumerate() {
            let arity = if matches!(op, StepOp::Binary(_)) {
                2
            } else {
                1
            };
            if args.len() != arity {
                return None;
            }
            let src = |a: &Operand| match *a {
                Operand::Input(k) => Src::Input(k),
                Operand::Step(k) => Src::Buffer(home[k]),
            };
            let srcs = [src(&args[0]), src(args.last().expect("arity ≥ 1"))];
            for a in args {
                if let Operand::Step(k) = *a {
                    if last_use[k] == i && !free.contains(&home[k]) {
                        free.push(home[k]);
                    }
                }
            }
            let dst = if i + 1 == steps.len() {
                Dst::Output
            } else {
                let b = free.pop().unwrap_or_else(|| {
                    buffers += 1;
                    buffers - 1
                });
                home[i] = b;
                Dst::Buffer(b)
            };
            if buffers > MAX_BUFFERS {
                return None;
            }
            instrs.push(Instr {
                op: *op,
                args: srcs,
                dst,
            });
        }
        let runs = Runs::new(input_shapes, out_shape)?;
        Some(FusedLoop {
            instrs,
            #[cfg(test)]
            buffers,
            contiguous: runs.inner_strides()[..n].iter().map(|&s| s == 1).collect(),
            runs: Box::new(runs),
            exports: exported.iter().map(|&k| home[k]).collect(),
        })
    }

    /// How many tile buffers the loop keeps live.
    #[cfg(test)]
    pub(crate) fn buffers(&self) -> usize {
        self.buffers
    }

    /// How many outputs the loop writes (1 + the exported steps).
    pub(crate) fn outputs(&self) -> usize {
        1 + self.exports.len()
    }

    /// Runs the loop: `outs` (one per output, [`FusedLoop::outputs`]) each have the
    /// output's elements and may be an input of the same shape (the planner's in-place
    /// reuse).
    ///
    /// # Safety
    /// `inputs[k]` points to as many readable floats as input `k`'s shape has and each of
    /// `outs` to the output's writable floats; the outputs are disjoint, and no input
    /// overlaps an output unless it is that output itself.
    pub(crate) unsafe fn run(
        &self,
        isa: Isa,
        inputs: &[*const f32],
        outs: &[*mut f32],
        pool: Option<&Pool>,
    ) {
        assert_eq!(inputs.len(), self.runs.lens().len());
        assert_eq!(outs.len(), self.outputs());
        let ins = SyncPtr(inputs.as_ptr() as *mut *const f32);
        let o = SyncPtr(outs.as_ptr() as *mut *mut f32);
        self.runs
            .for_each(pool, self.instrs.len(), |base, at, len| {
                // SAFETY: `run`'s own contract covers the inputs and outputs, and each call
                // gets its own piece `at..at + len` of the outputs.
                unsafe { self.run_piece(isa, ins.get(), o.get(), &base, at, len) }
            });
    }

    /// The loop over one piece of a run: `len` output elements from `at`, the inputs'
    /// offsets at its start being `base`.
    ///
    /// # Safety
    /// As for [`FusedLoop::run`].
    unsafe fn run_piece(
        &self,
        isa: Isa,
        inputs: *const *const f32,
        outs: *const *mut f32,
        base: &[usize; MAX_INPUTS],
        at: usize,
        len: usize,
    ) {
        // Every buffer is written by its step before a later step reads it.
        let mut bufs = std::mem::MaybeUninit::<[[f32; TILE]; MAX_BUFFERS]>::uninit();
        let bufs = bufs.as_mut_ptr() as *mut f32;
        let mut j = 0;
        while j < len {
            let n = TILE.min(len - j);
            // Buffer `b`'s tile: `new` hands out buffers below `MAX_BUFFERS` only, so the
            // offset stays inside `bufs` (computed with `wrapping_add`: it is no access).
            let tile = |b: usize| bufs.wrapping_add(b * TILE);
            let at_src = |s: Src| -> (*const f32, usize) {
                match s {
                    Src::Input(k) if self.contiguous[k] => {
                        // SAFETY: `new` admits inputs `k < n` only and `run` asserted one
                        // pointer per input, so `inputs + k` is read in bounds; input k runs
                        // along the output, so its run of this piece starts at `base[k] + j`.
                        let p = unsafe { inputs.add(k).read().add(base[k] + j) };
                        (p, 1)
                    }
                    // SAFETY: `k < n` indexes `inputs` as in the arm above; this input
                    // repeats one value, at offset `base[k]` inside it.
                    Src::Input(k) => (unsafe { inputs.add(k).read().add(base[k]) }, 0),
                    Src::Buffer(b) => (tile(b) as *const f32, 1),
                }
            };
            for ins in &self.instrs {
                let a = at_src(ins.args[0]);
                let b = at_src(ins.args[1]);
                let dst = match ins.dst {
                    // SAFETY: `outs` holds `outputs()` pointers (asserted by `run`), output
                    // 0 first; `at + j + n <= at + len`, inside this piece of it.
                    Dst::Output => unsafe { outs.read().add(at + j) },
                    Dst::Buffer(b) => tile(b),
                };
                // SAFETY: each operand is a tile buffer (`n <= TILE` floats, written by an
                // earlier instruction) or an input readable for this piece at its stride;
                // `dst` is a tile or output 0's piece, which no input overlaps unless it
                // is that input itself (the contract), and `step` reads before it writes.
                unsafe { step(isa, ins.op, a, b, dst, n) };
            }
            for (k, &b) in self.exports.iter().enumerate() {
                // SAFETY: output `k + 1` is export `k` (`outputs()` = 1 + exports, asserted
                // by `run`); its piece `at + j..at + j + n` is writable and disjoint from
                // the tile buffer copied, a stack local of `n <= TILE` floats.
                unsafe {
                    let dst = outs.add(k + 1).read().add(at + j);
                    std::ptr::copy_nonoverlapping(tile(b), dst, n);
                }
            }
            j += n;
        }
    }
}

/// One instruction over `len` floats: operands as (pointer, stride 0 or 1).
///
/// # Safety
/// Operands readable for `len` floats at stride 1 (else 1 float); `dst` writable for
/// `len` floats, disjoint from the operands or equal to one of them.
unsafe fn step(
    isa: Isa,
    op: StepOp,
    a: (*const f32, usize),
    b: (*const f32, usize),
    dst: *mut f32,
    len: usize,
) {
    match op {
        StepOp::Binary(op) if a.1 == 0 && b.1 == 0 => {
            // SAFETY: `dst` is writable for `len` floats, and two stride-0 operands are
            // readable for one float each (the contract).
            unsafe { std::slice::from_raw_parts_mut(dst, len).fill(op.scalar(*a.0, *b.0)) }
        }
        StepOp::Binary(op) => {
            // SAFETY: the contract makes `dst` writable for `len` floats.
            let d = unsafe { std::slice::from_raw_parts_mut(dst, len) };
            #[cfg(target_arch = "x86_64")]
            if math::use_avx512(isa) && op != BinOp::Pow {
                // SAFETY: `use_avx512` found AVX-512F on this CPU; operands readable for
                // `len` = `d.len()` floats at stride 1 (else one), as `run_avx512` asks.
                unsafe { binary::run_avx512(op, a.0, a.1, b.0, b.1, d) };
                return;
            }
            #[cfg(target_arch = "x86_64")]
            if math::use_avx2(isa) && op != BinOp::Pow {
                // SAFETY: `use_avx2` detected AVX2 and FMA; each operand covers `d.len()`
                // floats at stride 1 or one float at stride 0, as `run_avx2` asks.
                unsafe { binary::run_avx2(op, a.0, a.1, b.0, b.1, d) };
                return;
            }
            for (k, y) in d.iter_mut().enumerate() {
                // SAFETY: `k < len`: a stride-1 operand holds `len` floats, a stride-0 one
                // is read at offset 0.
                *y = unsafe { op.scalar(*a.0.add(k * a.1), *b.0.add(k * b.1)) };
            }
        }
        StepOp::Unary(op) if a.1 == 0 => {
            // SAFETY: a stride-0 `a` is one readable float, `dst` `len` writable ones.
            unsafe { std::slice::from_raw_parts_mut(dst, len).fill(op.scalar(*a.0)) }
        }
        #[cfg(target_arch = "x86_64")]
        StepOp::Unary(op) if math::use_avx512(isa) && binary::unary_has_avx512(op) => {
            // SAFETY: the guard's `use_avx512` saw AVX-512F; `a.0` (stride 1) and `dst`
            // hold `len` floats, the same buffer or disjoint (contract).
            unsafe { binary::unary_avx512(op, a.0, dst, len) }
        }
        // SAFETY: `a.0` is readable and `dst` writable for `len` floats (stride 1 here),
        // equal or disjoint, as `unary_ptr` needs.
        StepOp::Unary(op) => unsafe { binary::unary_ptr(isa, op, a.0, dst, len) },
        StepOp::Act(act) => {
            if a.1 == 0 {
                // SAFETY: stride 0: `a.0` holds one float; `dst` is writable for `len`.
                unsafe { std::slice::from_raw_parts_mut(dst, len).fill(*a.0) };
            } else if !std::ptr::eq(a.0, dst) {
                // SAFETY: `a.0` is readable and `dst` writable for `len` floats, and being
                // unequal they are disjoint (the contract allows nothing in between).
                unsafe { std::ptr::copy_nonoverlapping(a.0, dst, len) };
            }
            // SAFETY: `dst` is writable for `len` floats and nothing else refers to it now.
            act.apply_isa(isa, unsafe { std::slice::from_raw_parts_mut(dst, len) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::kernels::math::tests::isas;
    use crate::backend::cpu::kernels::testutil::{lcg_data, pools};

    /// The chain step by step over whole tensors with the separate kernels.
    fn unfused(
        isa: Isa,
        steps: &[(StepOp, Vec<Operand>)],
        ins: &[(Vec<f32>, Vec<usize>)],
        out_shape: &[usize],
    ) -> Vec<f32> {
        let total: usize = out_shape.iter().product();
        let mut results: Vec<(Vec<f32>, Vec<usize>)> = vec![];
        for (op, args) in steps {
            let get = |a: &Operand| match *a {
                Operand::Input(k) => ins[k].clone(),
                Operand::Step(k) => results[k].clone(),
            };
            let (x, xs) = get(&args[0]);
            let r = match op {
                StepOp::Binary(op) => {
                    let (y, ys) = get(&args[1]);
                    let mut z = vec![0.0; total];
                    binary::binary_isa(isa, *op, &x, &xs, &y, &ys, &mut z, out_shape, None);
                    (z, out_shape.to_vec())
                }
                StepOp::Unary(op) => {
                    let mut y = x.clone();
                    binary::unary_inplace_isa(isa, *op, &mut y);
                    (y, xs)
                }
                StepOp::Act(act) => {
                    let mut y = x.clone();
                    act.apply_isa(isa, &mut y);
                    (y, xs)
                }
            };
            results.push(r);
        }
        let (y, ys) = results.pop().unwrap();
        assert_eq!(ys, out_shape);
        y
    }

    /// An Adam-like update exporting two earlier results (m', v'), each output written
    /// over an input of its shape or into fresh memory: the same as each exported step
    /// computed by the loop as its own output, bit for bit.
    #[test]
    fn exported_steps_are_written_like_outputs() {
        use Operand::{Input as I, Step as S};
        let b = |op| StepOp::Binary(op);
        // Inputs: g, m, v, w, then scalars 0.9, 0.999, 1e-3.
        let steps = vec![
            (b(BinOp::Mul), vec![I(1), I(4)]),          // 0: 0.9 m
            (b(BinOp::Add), vec![S(0), I(0)]),          // 1: m' = 0.9 m + g
            (b(BinOp::Mul), vec![I(0), I(0)]),          // 2: g²
            (b(BinOp::Mul), vec![I(2), I(5)]),          // 3
            (b(BinOp::Add), vec![S(3), S(2)]),          // 4: v'
            (StepOp::Unary(UnaryOp::Sqrt), vec![S(4)]), // 5
            (b(BinOp::Div), vec![S(1), S(5)]),          // 6
            (b(BinOp::Mul), vec![S(6), I(6)]),          // 7
            (b(BinOp::Sub), vec![I(3), S(7)]),          // 8: w'
        ];
        let n = 5000;
        let shapes: [&[usize]; 7] = [&[n], &[n], &[n], &[n], &[], &[], &[]];
        let data: Vec<Vec<f32>> = (0..7)
            .map(|k| match k {
                4 => vec![0.9],
                5 => vec![0.999],
                6 => vec![1e-3],
                2 => lcg_data(n, 1.0, 3).iter().map(|x| x.abs()).collect(),
                _ => lcg_data(n, 1.0, k as u64 + 11),
            })
            .collect();
        let lp = FusedLoop::new(&steps, &[1, 4], &shapes, &[n]).unwrap();
        assert_eq!(lp.outputs(), 3);
        for pool in pools() {
            for isa in isas() {
                // Each output alone, from a loop ending at that step.
                let want: Vec<Vec<f32>> = [8, 1, 4]
                    .iter()
                    .map(|&last| {
                        let one = FusedLoop::new(&steps[..=last], &[], &shapes, &[n]).unwrap();
                        let mut y = vec![0.0; n];
                        let ptrs: Vec<*const f32> = data.iter().map(|d| d.as_ptr()).collect();
                        // SAFETY: each input holds n floats (or is broadcast as its shape says), y holds n.
                        unsafe { one.run(isa, &ptrs, &[y.as_mut_ptr()], pool.as_ref()) };
                        y
                    })
                    .collect();
                // Fresh outputs.
                let mut got = vec![vec![0.0; n]; 3];
                let ptrs: Vec<*const f32> = data.iter().map(|d| d.as_ptr()).collect();
                let outs: Vec<*mut f32> = got.iter_mut().map(|o| o.as_mut_ptr()).collect();
                // SAFETY: inputs and the three outputs hold n floats each.
                unsafe { lp.run(isa, &ptrs, &outs, pool.as_ref()) };
                assert_eq!(got, want, "{}", isa.name());
                // w' over w, m' over g, v' over v (what the planner does for Adam).
                let mut ins = data.clone();
                let ptrs: Vec<*mut f32> = ins.iter_mut().map(|d| d.as_mut_ptr()).collect();
                let consts: Vec<*const f32> = ptrs.iter().map(|&p| p as *const f32).collect();
                // SAFETY: as above; each output overwrites the input it is planned over, element for element.
                unsafe { lp.run(isa, &consts, &[ptrs[3], ptrs[0], ptrs[2]], pool.as_ref()) };
                assert_eq!([&ins[3], &ins[0], &ins[2]], [&want[0], &want[1], &want[2]]);
            }
        }
        // Only earlier steps can be exported.
        assert!(FusedLoop::new(&steps, &[8], &shapes, &[n]).is_none());
    }

    /// Chains with broadcasts, steps reused, buffers recycled, long rows split, against
    /// the step-by-step result of the same kernels: bit for bit.
    #[test]
    fn fused_loops_match_the_steps_one_by_one() {
        use Operand::{Input as I, Step as S};
        let b = |op| StepOp::Binary(op);
        let u = |op| StepOp::Unary(op);
        let gelu_ish = vec![
            (b(BinOp::Mul), vec![I(0), I(1)]),
            (u(UnaryOp::Tanh), vec![S(0)]),
            (b(BinOp::Add), vec![S(1), I(2)]),
            (b(BinOp::Mul), vec![S(2), S(0)]),
            (StepOp::Act(Act::LeakyRelu(0.1)), vec![S(3)]),
            (b(BinOp::Max), vec![S(4), S(1)]),
        ];
        let cases: Vec<(Vec<usize>, Vec<Vec<usize>>)> = vec![
            (vec![7], vec![vec![7], vec![7], vec![]]),
            (vec![3, 300], vec![vec![3, 300], vec![300], vec![3, 1]]),
            (
                vec![2, 3, 5, 9],
                vec![vec![2, 3, 5, 9], vec![3, 1, 9], vec![1]],
            ),
            (
                vec![2, 1, 33],
                vec![vec![33], vec![2, 1, 1], vec![2, 1, 33]],
            ),
            (vec![70000], vec![vec![70000], vec![1], vec![70000]]),
            (vec![4, 0, 3], vec![vec![4, 0, 3], vec![3], vec![]]),
        ];
        for pool in pools() {
            for isa in isas() {
                for (out, shapes) in &cases {
                    let ins: Vec<(Vec<f32>, Vec<usize>)> = shapes
                        .iter()
                        .enumerate()
                        .map(|(k, s)| {
                            let mut d = lcg_data(s.iter().product(), 2.0, k as u64 + 5);
                            if d.len() > 4 {
                                d[4] = f32::NAN;
                            }
                            (d, s.clone())
                        })
                        .collect();
                    let refs: Vec<&[usize]> = shapes.iter().map(Vec::as_slice).collect();
                    let lp = FusedLoop::new(&gelu_ish, &[], &refs, out).unwrap();
                    assert!(lp.buffers() <= 3, "{} buffers", lp.buffers());
                    let want = unfused(isa, &gelu_ish, &ins, out);
                    let mut got = vec![0.0; want.len()];
                    let ptrs: Vec<*const f32> = ins.iter().map(|i| i.0.as_ptr()).collect();
                    // SAFETY: inputs hold their shapes' floats, got holds the output's.
                    unsafe { lp.run(isa, &ptrs, &[got.as_mut_ptr()], pool.as_ref()) };
                    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                        let ok = (g.is_nan() && w.is_nan()) || g.to_bits() == w.to_bits();
                        assert!(ok, "{out:?} {} at {k}: {g} vs {w}", isa.name());
                    }
                }
            }
        }
    }

    /// The output may be an input of its shape (in-place reuse): same result.
    #[test]
    fn fused_loops_may_write_over_an_input() {
        use Operand::{Input as I, Step as S};
        let steps = vec![
            (StepOp::Unary(UnaryOp::Exp), vec![I(0)]),
            (StepOp::Binary(BinOp::Sub), vec![I(0), S(0)]),
            (StepOp::Binary(BinOp::Mul), vec![S(1), I(1)]),
        ];
        let x = lcg_data(1000, 3.0, 1);
        let s = lcg_data(10, 3.0, 2);
        let lp = FusedLoop::new(&steps, &[], &[&[100, 10], &[10]], &[100, 10]).unwrap();
        for isa in isas() {
            let mut separate = vec![0.0; 1000];
            let mut inplace = x.clone();
            // SAFETY: x and both outputs hold 1000 floats; in place is allowed element for element.
            unsafe {
                lp.run(
                    isa,
                    &[x.as_ptr(), s.as_ptr()],
                    &[separate.as_mut_ptr()],
                    None,
                );
                let p = inplace.as_mut_ptr();
                lp.run(isa, &[p, s.as_ptr()], &[p], None);
            }
            assert_eq!(separate, inplace);
        }
    }

    #[test]
    fn chains_that_do_not_fit_are_refused() {
        use Operand::{Input as I, Step as S};
        let relu = StepOp::Unary(UnaryOp::Relu);
        let add = StepOp::Binary(BinOp::Add);
        // An operand from the future, a missing input, the wrong arity, a bad broadcast.
        assert!(FusedLoop::new(&[(relu, vec![S(0)])], &[], &[&[3]], &[3]).is_none());
        assert!(FusedLoop::new(&[(relu, vec![I(1)])], &[], &[&[3]], &[3]).is_none());
        assert!(FusedLoop::new(&[(add, vec![I(0)])], &[], &[&[3]], &[3]).is_none());
        assert!(FusedLoop::new(&[(relu, vec![I(0)])], &[], &[&[4]], &[3]).is_none());
        // Ten results all live until the end need ten buffers.
        let mut steps: Vec<_> = (0..10).map(|k| (relu, vec![I(k % 2)])).collect();
        steps.push((add, vec![S(0), S(1)]));
        for k in 2..10 {
            steps.push((add, vec![S(steps.len() - 1), S(k)]));
        }
        assert!(FusedLoop::new(&steps, &[], &[&[3], &[3]], &[3]).is_none());
    }
}
