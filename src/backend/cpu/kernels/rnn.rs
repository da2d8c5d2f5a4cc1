//! Recurrent layers on f32: RNN, GRU and LSTM as ONNX defines them (forward, reverse or
//! bidirectional, per-row sequence lengths, both layouts, every activation, clipping,
//! peepholes, `input_forget`, GRU's `linear_before_reset`).
//!
//! The input projection of the whole sequence, `X·Wᵀ + biases` for every time step and
//! both directions, is one GEMM over the packed weights. The time loop then runs inside
//! the kernel: per step one recurrent GEMM `H·Rᵀ` over the batch, then the gate math
//! row by row (in parallel over rows when the batch is large), all in step scratch.
use super::gemm::{self, Bias, Epilogue, Mat, PackedB};
use super::par::{for_ranges, SyncPtr};
use super::Act;
use crate::backend::cpu::host;
use crate::backend::cpu::pool::Pool;

/// The kind of cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cell {
    Rnn,
    Gru,
    Lstm,
}

impl Cell {
    /// Gate blocks in W and R.
    pub fn gates(self) -> usize {
        match self {
            Cell::Rnn => 1,
            Cell::Gru => 3,
            Cell::Lstm => 4,
        }
    }
}

/// An activation a recurrent layer may name, with its alpha and beta.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RnnAct {
    Relu,
    Tanh,
    Sigmoid,
    /// alpha·x + beta
    Affine(f32, f32),
    LeakyRelu(f32),
    /// x if x > alpha, else 0
    ThresholdedRelu(f32),
    /// alpha·tanh(beta·x)
    ScaledTanh(f32, f32),
    HardSigmoid(f32, f32),
    Elu(f32),
    Softsign,
    Softplus,
}

impl RnnAct {
    /// The activation ONNX names `kind` (lower case), with its alpha and beta.
    pub fn new(kind: &str, alpha: f32, beta: f32) -> Option<RnnAct> {
        Some(match kind {
            "relu" => RnnAct::Relu,
            "tanh" => RnnAct::Tanh,
            "sigmoid" => RnnAct::Sigmoid,
            "affine" => RnnAct::Affine(alpha, beta),
            "leakyrelu" => RnnAct::LeakyRelu(alpha),
            "thresholdedrelu" => RnnAct::ThresholdedRelu(alpha),
            "scaledtanh" => RnnAct::ScaledTanh(alpha, beta),
            "hardsigmoid" => RnnAct::HardSigmoid(alpha, beta),
            "elu" => RnnAct::Elu(alpha),
            "softsign" => RnnAct::Softsign,
            "softplus" => RnnAct::Softplus,
            _ => return None,
        })
    }

    /// Applies the activation to `x` in place (vectorized where the epilogue activations
    /// have the same function).
    fn apply(self, x: &mut [f32]) {
        match self {
            RnnAct::Relu => Act::Relu.apply(x),
            RnnAct::Tanh => Act::Tanh.apply(x),
            RnnAct::Sigmoid => Act::Sigmoid.apply(x),
            RnnAct::LeakyRelu(a) => Act::LeakyRelu(a).apply(x),
            RnnAct::HardSigmoid(a, b) => Act::HardSigmoid(a, b).apply(x),
            RnnAct::Elu(a) => Act::Elu(a).apply(x),
            RnnAct::Affine(a, b) => x.iter_mut().for_each(|v| *v = a * *v + b),
            RnnAct::ThresholdedRelu(a) => x.iter_mut().for_each(|v| {
                if *v <= a {
                    *v = 0.0
                }
            }),
            RnnAct::ScaledTanh(a, b) => {
                x.iter_mut().for_each(|v| *v *= b);
                Act::Tanh.apply(x);
                x.iter_mut().for_each(|v| *v *= a);
            }
            RnnAct::Softsign => x.iter_mut().for_each(|v| *v /= 1.0 + v.abs()),
            // ln(1 + e^x) without overflow: past 20 it is x to f32 precision.
            RnnAct::Softplus => x.iter_mut().for_each(|v| {
                if *v <= 20.0 {
                    *v = v.exp().ln_1p()
                }
            }),
        }
    }
}

/// A layer's geometry and attributes.
#[derive(Debug, Clone)]
pub struct RnnSpec {
    pub cell: Cell,
    /// 1 or 2 (bidirectional).
    pub dirs: usize,
    /// A single direction running backwards (`direction = reverse`).
    pub reverse: bool,
    pub seq: usize,
    pub batch: usize,
    pub input: usize,
    pub hidden: usize,
    /// `layout = 1`: X, Y and the states are batch-major.
    pub batch_first: bool,
    /// Per direction: the cell's activations (f, g, h for LSTM; f, g for GRU; f for RNN),
    /// unused ones repeated.
    pub acts: Vec<[RnnAct; 3]>,
    pub clip: Option<f32>,
    pub linear_before_reset: bool,
    pub input_forget: bool,
}

impl RnnSpec {
    fn gh(&self) -> usize {
        self.cell.gates() * self.hidden
    }
    /// Gate columns of the per-step recurrent product: all but GRU's candidate when the
    /// reset gate applies before R (that product needs the reset gate first).
    fn main_cols(&self) -> usize {
        if self.gru_reset_first() {
            2 * self.hidden
        } else {
            self.gh()
        }
    }
    fn gru_reset_first(&self) -> bool {
        self.cell == Cell::Gru && !self.linear_before_reset
    }
    /// Floats of one direction's per-step scratch (rounded to whole cache lines).
    fn dir_floats(&self) -> usize {
        let bh = (self.batch * self.hidden).next_multiple_of(16);
        (self.batch * self.main_cols()).next_multiple_of(16) + 4 * bh
    }
    fn proj_floats(&self) -> usize {
        (self.seq * self.batch * self.dirs * self.gh()).next_multiple_of(16)
    }
    /// Floats of scratch [`RnnLayer::run`] needs.
    pub fn scratch_floats(&self) -> usize {
        (self.dirs * self.gh()).next_multiple_of(16)
            + self.proj_floats()
            + self.dirs * self.dir_floats()
    }
    /// Multiply-adds of one run (the two GEMMs), for benchmarks.
    pub fn macs(&self) -> usize {
        let rows = self.seq * self.batch * self.dirs;
        rows * self.gh() * (self.input + self.hidden)
    }
}

/// The weights, packed when constant.
pub struct RnnWeights {
    /// Wᵀ of every direction side by side: input × dirs·gates·hidden.
    w: Option<PackedB>,
    /// Per direction: R's main gate columns (see [`RnnSpec::main_cols`]) and, for GRU
    /// with the reset gate before R, its candidate columns.
    r: Vec<(PackedB, Option<PackedB>)>,
}

/// Where one run's operands are.
#[derive(Clone, Copy)]
pub struct RnnIo {
    pub x: *const f32,
    pub w: *const f32,
    pub r: *const f32,
    pub b: Option<*const f32>,
    pub lens: Option<*const i32>,
    pub h0: Option<*const f32>,
    pub c0: Option<*const f32>,
    pub p: Option<*const f32>,
    pub y: *mut f32,
    pub y_h: *mut f32,
    pub y_c: Option<*mut f32>,
}

// SAFETY: the pointers address buffers the caller keeps alive for the run; tasks write
// disjoint parts of the outputs and scratch.
unsafe impl Send for RnnIo {}
// SAFETY: tasks sharing an `&RnnIo` only read its pointers; through them they read the
// inputs and write disjoint rows of Y, Y_h and Y_c (one batch row, one direction each).
unsafe impl Sync for RnnIo {}

/// A compiled recurrent layer.
pub struct RnnLayer {
    pub spec: RnnSpec,
    weights: RnnWeights,
}

/// Below this many multiply-adds per step and direction, the two directions of a
/// bidirectional layer may run side by side on two threads instead of splitting each
/// GEMM ...
const SIDE_BY_SIDE_MAX_MACS: usize = 1 << 22;

/// ... when one direction's recurrent weights stay in one core's L2 (at most half of it),
/// as each step reads them all. Larger ones split each step's GEMM over the threads, the
/// directions one after the other, so that each core keeps its share of the weights in
/// its cache from step to step: a 512-hidden layer (4 MiB per direction) runs 1.3× faster
/// so on two threads of a 2 MiB-L2 host.
fn side_by_side(spec: &RnnSpec, threads: usize) -> bool {
    let step_macs = spec.batch * spec.gh() * spec.hidden;
    let r_bytes = spec.gh() * spec.hidden * std::mem::size_of::<f32>();
    spec.dirs == 2
        && threads >= 2
        && step_macs <= SIDE_BY_SIDE_MAX_MACS
        && r_bytes <= host::caches().l2 / 2
}

impl RnnLayer {
    /// The layer, with `w` and `r` packed when given (constants).
    ///
    /// # Safety
    /// `w` and `r`, when given, must address W [dirs, gates·hidden, input] and R
    /// [dirs, gates·hidden, hidden].
    pub unsafe fn new(spec: RnnSpec, w: Option<*const f32>, r: Option<*const f32>) -> RnnLayer {
        let (gh, h) = (spec.gh(), spec.hidden);
        let w = w.map(|w| {
            let (rows, wt) = (spec.seq * spec.batch, w_view(w, spec.input));
            // SAFETY: W [dirs, gates·hidden, input] (the caller's contract) read transposed
            // is the input × dirs·gates·hidden matrix packed.
            unsafe { PackedB::new(rows, spec.input, spec.dirs * gh, wt) }
        });
        let r = match r {
            Some(r) => (0..spec.dirs)
                .map(|d| {
                    // Direction d's R block, gates·hidden rows of h (in R by the contract).
                    let rd = r.wrapping_add(d * gh * h);
                    let main_t = Mat::rows(rd, h).t();
                    // SAFETY: the first main_cols rows of direction d's R block, inside R
                    // [dirs, gates·hidden, hidden] by the caller's contract, transposed.
                    let main = unsafe { PackedB::new(spec.batch, h, spec.main_cols(), main_t) };
                    let cand = spec.gru_reset_first().then(|| {
                        let cand_t = Mat::rows(rd.wrapping_add(2 * h * h), h).t();
                        // SAFETY: GRU's candidate rows, the third h×h block of direction
                        // d's R (gates = 3), inside R by the caller's contract.
                        unsafe { PackedB::new(spec.batch, h, h, cand_t) }
                    });
                    (main, cand)
                })
                .collect(),
            None => vec![],
        };
        RnnLayer {
            spec,
            weights: RnnWeights { w, r },
        }
    }

    /// Runs the layer; `scratch` holds [`RnnSpec::scratch_floats`] floats. Fails only on
    /// sequence lengths out of range.
    ///
    /// # Safety
    /// `io`'s pointers must address the ONNX operands of this spec's shapes (outputs
    /// writable and not overlapping the inputs), `scratch` the scratch floats.
    pub unsafe fn run(
        &self,
        pool: Option<&Pool>,
        io: &RnnIo,
        scratch: *mut f32,
    ) -> Result<(), String> {
        let s = &self.spec;
        if let Some(lens) = io.lens {
            for n in 0..s.batch {
                // SAFETY: sequence_lens holds batch entries.
                let l = unsafe { *lens.add(n) };
                if l < 0 || l as usize > s.seq {
                    return Err(format!(
                        "sequence_lens[{n}] is {l}, outside 0..={} (the sequence length)",
                        s.seq
                    ));
                }
            }
        }
        let (gh, dirs) = (s.gh(), s.dirs);
        // The scratch regions, in order: the combined biases (dirs·gh floats rounded up),
        // the input projection (proj_floats) and each direction's dir_floats, which is
        // what scratch_floats adds up.
        let bias = scratch;
        let proj = bias.wrapping_add((dirs * gh).next_multiple_of(16));
        let per_dir = proj.wrapping_add(s.proj_floats());
        // SAFETY: `bias` is the first dirs·gh floats of the scratch (the caller's
        // contract); `io.b`, when given, is B [dirs, 2·gates·hidden].
        unsafe { self.combine_biases(io.b, bias) };
        let ep = Epilogue {
            bias: Bias::PerCol(bias),
            residual: None,
            act: Act::None,
        };
        let (m, n) = (s.seq * s.batch, dirs * gh);
        let x = Mat::rows(io.x, s.input);
        match &self.weights.w {
            // SAFETY: X is (seq·batch) × input, W packed as input × dirs·gh, the
            // projection region holds seq·batch·dirs·gh floats (rows of n) and the bias
            // n floats, all by the caller's contract and the region sizes above.
            Some(pw) => unsafe { gemm::gemm_packed(pool, m, n, s.input, x, pw, proj, n, &ep) },
            // SAFETY: as in the packed arm, with W read in place as the input ×
            // dirs·gh transpose of W [dirs, gh, input].
            None => unsafe {
                gemm::gemm(pool, m, n, s.input, x, w_view(io.w, s.input), proj, n, &ep)
            },
        }
        let threads = pool.map_or(1, |p| p.threads());
        let (io, proj_p) = (*io, SyncPtr(proj));
        let per_dir = SyncPtr(per_dir);
        let dir_scratch = |d: usize| per_dir.get().wrapping_add(d * s.dir_floats());
        match pool {
            // SAFETY: the two directions get disjoint dir_floats regions of the scratch
            // and write disjoint halves (by direction) of Y, Y_h and Y_c; both only read
            // the projection, which is complete.
            Some(p) if side_by_side(s, threads) => p.run(2, &|d| unsafe {
                self.direction(None, &io, d, proj_p.get(), dir_scratch(d))
            }),
            // SAFETY: d < dirs, so direction d's region lies in the scratch; the
            // projection is complete; the operands are the caller's.
            _ => (0..dirs)
                .for_each(|d| unsafe { self.direction(pool, &io, d, proj, dir_scratch(d)) }),
        }
        Ok(())
    }

    /// Wb + Rb per gate column into `out` (dirs × gates·hidden), except GRU's candidate
    /// with `linear_before_reset`, whose Rb is scaled by the reset gate (added per step).
    ///
    /// # Safety
    /// `b` (if given) addresses B [dirs, 2·gates·hidden]; `out` dirs·gates·hidden floats.
    unsafe fn combine_biases(&self, b: Option<*const f32>, out: *mut f32) {
        let s = &self.spec;
        let gh = s.gh();
        // SAFETY: `out` holds dirs·gates·hidden writable floats (the contract).
        let out = unsafe { std::slice::from_raw_parts_mut(out, s.dirs * gh) };
        let Some(b) = b else {
            out.fill(0.0);
            return;
        };
        // SAFETY: B [dirs, 2·gates·hidden] (the contract), an input apart from `out`.
        let b = unsafe { std::slice::from_raw_parts(b, s.dirs * 2 * gh) };
        for d in 0..s.dirs {
            let (wb, rb) = b[d * 2 * gh..(d + 1) * 2 * gh].split_at(gh);
            let o = &mut out[d * gh..(d + 1) * gh];
            for e in 0..gh {
                let separate = s.cell == Cell::Gru && s.linear_before_reset && e >= 2 * s.hidden;
                o[e] = if separate { wb[e] } else { wb[e] + rb[e] };
            }
        }
    }

    /// One direction's time loop.
    ///
    /// # Safety
    /// As for [`RnnLayer::run`]; `proj` holds the input projection, `scratch` this
    /// direction's [`RnnSpec::dir_floats`] floats.
    unsafe fn direction(
        &self,
        pool: Option<&Pool>,
        io: &RnnIo,
        d: usize,
        proj: *mut f32,
        scratch: *mut f32,
    ) {
        let s = &self.spec;
        let (batch, h, gh) = (s.batch, s.hidden, s.gh());
        let cols = s.main_cols();
        let bh = (batch * h).next_multiple_of(16);
        let reverse = s.reverse || d == 1;
        // The scratch regions, which dir_floats adds up: the recurrent product (batch ×
        // cols, rounded up), then the hidden state, the cell state, GRU's r⊙h and its
        // candidate product, bh floats each (batch × h used).
        let rec = scratch;
        let hs = rec.wrapping_add((batch * cols).next_multiple_of(16));
        let cs = hs.wrapping_add(bh);
        let reset = cs.wrapping_add(bh);
        let cand = reset.wrapping_add(bh);
        // Initial states: the layout's [dirs, batch, h] or [batch, dirs, h] rows.
        for n in 0..batch {
            let at = self.state_row(d, n);
            for (dst, src) in [(hs, io.h0), (cs, io.c0)] {
                // SAFETY: row n < batch of the hidden or cell state region (bh ≥ batch·h
                // floats of this direction's scratch); nothing else refers to it yet.
                let dst = unsafe { std::slice::from_raw_parts_mut(dst.add(n * h), h) };
                let Some(p) = src else {
                    dst.fill(0.0);
                    continue;
                };
                // SAFETY: `at` is direction d, row n of initial_h or initial_c, which
                // are [dirs, batch, h] (batch-first: [batch, dirs, h]) by the contract.
                dst.copy_from_slice(unsafe { std::slice::from_raw_parts(p.add(at), h) });
            }
        }
        // SAFETY: every call passes a batch row n < batch, and sequence_lens holds batch
        // entries (`run` checked each is in 0..=seq).
        let len = |n: usize| io.lens.map_or(s.seq, |l| unsafe { *l.add(n) } as usize);
        let bufs = DirBufs {
            proj: SyncPtr(proj),
            rec: SyncPtr(rec),
            hs: SyncPtr(hs),
            cs: SyncPtr(cs),
            reset: SyncPtr(reset),
            cand: SyncPtr(cand),
        };
        let (r_main, r_cand) = match self.weights.r.get(d) {
            Some((m, c)) => (Some(m), c.as_ref()),
            None => (None, None),
        };
        // Direction d's R block read in place (when not packed): its main columns and
        // GRU's candidate block, transposed.
        let rd = io.r.wrapping_add(d * gh * h);
        let r_main_t = Mat::rows(rd, h).t();
        let r_cand_t = Mat::rows(rd.wrapping_add(2 * h * h), h).t();
        let gate_work = gh * 8;
        // With one length for every row, a step's projection rows are one strided
        // block, added in the recurrent GEMMs' store rather than by the gate math
        // (not for GRU with `linear_before_reset`: there r scales R's part alone).
        let proj_in_rec = io.lens.is_none() && (s.cell != Cell::Gru || s.gru_reset_first());
        // Batch rows of one time step lie `seq` projection rows apart batch-first,
        // adjacent otherwise (as `x_row` places them).
        let proj_ld = if s.batch_first { s.seq } else { 1 } * s.dirs * gh;
        for step in 0..s.seq {
            // Each row's time at this step, or None past its length.
            let time = |n: usize| {
                let l = len(n);
                (step < l).then(|| if reverse { l - 1 - step } else { step })
            };
            let ep = match (proj_in_rec, time(0)) {
                (true, Some(t)) => Epilogue {
                    bias: Bias::None,
                    residual: Some((
                        proj.wrapping_add(self.x_row(t, 0) * s.dirs * gh + d * gh),
                        proj_ld,
                    )),
                    act: Act::None,
                },
                _ => Epilogue::NONE,
            };
            let hmat = Mat::rows(hs, h);
            match r_main {
                // SAFETY: H is batch × h in its region, R's main part packed as h × cols,
                // `rec` batch × cols floats of its own region; the residual, when set, is
                // time t's projection rows of direction d (batch of them, proj_ld apart,
                // gh ≥ cols wide): every row has length seq, so time(0) is each row's.
                Some(p) => unsafe {
                    gemm::gemm_packed(pool, batch, cols, h, hmat, p, rec, cols, &ep)
                },
                // SAFETY: as in the packed arm, with direction d's first cols rows of R
                // (inside R [dirs, gh, h] by the contract) read in place.
                None => unsafe { gemm::gemm(pool, batch, cols, h, hmat, r_main_t, rec, cols, &ep) },
            }
            let phase = |first: bool| {
                for_ranges(pool, batch, gate_work, &|range| {
                    for n in range {
                        // SAFETY: n < batch; each task of a phase owns its rows n, whose
                        // parts of the buffers and of Y are disjoint from other rows';
                        // the step's recurrent products are complete.
                        unsafe { self.row(*io, d, n, step, time(n), first, proj_in_rec, bufs) };
                    }
                })
            };
            if s.gru_reset_first() {
                phase(true);
                // The candidate's x part rides in the same way (its columns of the
                // projection rows).
                let ep = Epilogue {
                    residual: ep.residual.map(|(r, ld)| (r.wrapping_add(2 * h), ld)),
                    ..ep
                };
                let rmat = Mat::rows(reset, h);
                match r_cand {
                    // SAFETY: r⊙h is batch × h in its region (phase one wrote every row),
                    // R's candidate block packed as h × h, `cand` batch × h floats of its
                    // own region; the residual is the candidate's h columns (2h..3h) of
                    // the step's projection rows.
                    Some(p) => unsafe {
                        gemm::gemm_packed(pool, batch, h, h, rmat, p, cand, h, &ep)
                    },
                    // SAFETY: as in the packed candidate arm, with R's third h × h block
                    // of direction d (GRU: gates = 3) read in place.
                    None => unsafe { gemm::gemm(pool, batch, h, h, rmat, r_cand_t, cand, h, &ep) },
                }
            }
            phase(false);
        }
        // Final states: each row's last valid step (its initial state if none).
        for n in 0..batch {
            let at = self.state_row(d, n);
            // SAFETY: row n < batch of the hidden state region into direction d, row n
            // of Y_h (shaped like initial_h by the contract), an output apart from it.
            unsafe { std::ptr::copy_nonoverlapping(hs.add(n * h), io.y_h.add(at), h) };
            if let Some(y_c) = io.y_c {
                // SAFETY: row n of the cell state region into the same row of Y_c,
                // shaped like Y_h and not overlapping the scratch.
                unsafe { std::ptr::copy_nonoverlapping(cs.add(n * h), y_c.add(at), h) };
            }
        }
    }

    /// The offset of direction `d`, row `n` in a state tensor.
    fn state_row(&self, d: usize, n: usize) -> usize {
        let s = &self.spec;
        if s.batch_first {
            (n * s.dirs + d) * s.hidden
        } else {
            (d * s.batch + n) * s.hidden
        }
    }

    /// The row of X (and of the projection) holding time `t`, batch row `n`.
    fn x_row(&self, t: usize, n: usize) -> usize {
        let s = &self.spec;
        if s.batch_first {
            n * s.seq + t
        } else {
            t * s.batch + n
        }
    }

    /// The offset of Y[t, d, n] (or Y[n, t, d] batch-first).
    fn y_at(&self, t: usize, d: usize, n: usize) -> usize {
        let s = &self.spec;
        if s.batch_first {
            ((n * s.seq + t) * s.dirs + d) * s.hidden
        } else {
            ((t * s.dirs + d) * s.batch + n) * s.hidden
        }
    }

    /// Row `n`'s gate math at `step` (time `t`, None past its length). GRU with the
    /// reset gate before R runs in two phases around the candidate's product: `first`
    /// computes z, r and r⊙h, the second the rest. `proj_in_rec`: the recurrent GEMM
    /// has added the input projection to the gates already.
    ///
    /// # Safety
    /// As for [`RnnLayer::direction`], whose buffers `bufs` holds; `n < batch`, and no
    /// other call for the same row runs at the same time (rows of different `n` touch
    /// disjoint memory).
    #[allow(clippy::too_many_arguments)]
    unsafe fn row(
        &self,
        io: RnnIo,
        d: usize,
        n: usize,
        step: usize,
        t: Option<usize>,
        first: bool,
        proj_in_rec: bool,
        bufs: DirBufs,
    ) {
        let s = &self.spec;
        let (h, gh, cols) = (s.hidden, s.gh(), s.main_cols());
        let Some(t) = t else {
            if first {
                // SAFETY: row n of the r⊙h region (batch × h floats), this call's alone.
                let rs = unsafe { std::slice::from_raw_parts_mut(bufs.reset.get().add(n * h), h) };
                rs.fill(0.0);
            } else {
                // Past the row's length: Y is zero, the state stays.
                let at = self.y_at(step, d, n);
                // SAFETY: Y[step, d, n] (the layout's order) is h floats inside Y, of
                // shape [seq, dirs, batch, h] by the contract; only this row writes it.
                unsafe { std::slice::from_raw_parts_mut(io.y.add(at), h) }.fill(0.0);
            }
            return;
        };
        // SAFETY: row n of the recurrent product, cols floats at n·cols of its batch ×
        // cols region, written by the GEMM that has returned and now by this row only.
        let g = unsafe { std::slice::from_raw_parts_mut(bufs.rec.get().add(n * cols), cols) };
        let xp_at = self.x_row(t, n) * s.dirs * gh + d * gh;
        // SAFETY: direction d's gh columns of projection row x_row(t, n) < seq·batch, in
        // the seq·batch × dirs·gh projection; nothing writes it during the time loop.
        let xp = unsafe { std::slice::from_raw_parts(bufs.proj.get().add(xp_at), gh) };
        // SAFETY: row n of the hidden state region (batch × h floats), this row's alone
        // while the phase runs (the step's GEMMs have read H and returned).
        let hrow = unsafe { std::slice::from_raw_parts_mut(bufs.hs.get().add(n * h), h) };
        let acts = &s.acts[d];
        let clip = |v: &mut [f32]| {
            if let Some(c) = s.clip {
                v.iter_mut().for_each(|x| *x = x.clamp(-c, c));
            }
        };
        match s.cell {
            Cell::Rnn => {
                if !proj_in_rec {
                    add(g, xp);
                }
                clip(g);
                acts[0].apply(g);
                hrow.copy_from_slice(g);
            }
            Cell::Gru => {
                let (zr, gc) = g.split_at_mut(2 * h);
                if first || !s.gru_reset_first() {
                    if !proj_in_rec {
                        add(zr, &xp[..2 * h]);
                    }
                    clip(zr);
                    acts[0].apply(zr);
                }
                let (z, r) = zr.split_at(h);
                let xc = &xp[2 * h..];
                if s.gru_reset_first() {
                    if first {
                        // SAFETY: row n of the r⊙h region, which the candidate GEMM reads
                        // only after this phase; no other row writes it.
                        let rs = unsafe {
                            std::slice::from_raw_parts_mut(bufs.reset.get().add(n * h), h)
                        };
                        for ((o, r), h) in rs.iter_mut().zip(r).zip(&*hrow) {
                            *o = r * h;
                        }
                        return;
                    }
                    // SAFETY: row n of the candidate product region (batch × h), written
                    // by the candidate GEMM before this second phase.
                    let c =
                        unsafe { std::slice::from_raw_parts_mut(bufs.cand.get().add(n * h), h) };
                    if !proj_in_rec {
                        add(c, xc);
                    }
                    clip(c);
                    acts[1].apply(c);
                    blend(hrow, z, c);
                } else {
                    let rb_at = d * 2 * gh + gh + 2 * h;
                    // SAFETY: direction d's Rb candidate part, h floats at d·2gh + gh + 2h
                    // of B [dirs, 2·gates·hidden] (gates = 3), read only.
                    let rb =
                        io.b.map(|b| unsafe { std::slice::from_raw_parts(b.add(rb_at), h) });
                    for (j, g) in gc.iter_mut().enumerate() {
                        let rh = *g + rb.map_or(0.0, |rb| rb[j]);
                        *g = xc[j] + r[j] * rh;
                    }
                    clip(gc);
                    acts[1].apply(gc);
                    blend(hrow, z, gc);
                }
            }
            Cell::Lstm => {
                if !proj_in_rec {
                    add(g, xp);
                }
                // SAFETY: row n of the cell state region (batch × h), this row's alone.
                let crow = unsafe { std::slice::from_raw_parts_mut(bufs.cs.get().add(n * h), h) };
                // SAFETY: direction d's 3h peepholes of P [dirs, 3·hidden], read only.
                let p =
                    io.p.map(|p| unsafe { std::slice::from_raw_parts(p.add(d * 3 * h), 3 * h) });
                let (gi, rest) = g.split_at_mut(h);
                let (go, rest) = rest.split_at_mut(h);
                let (gf, gc) = rest.split_at_mut(h);
                if let Some(p) = p {
                    for (j, &c) in crow.iter().enumerate() {
                        gi[j] += p[j] * c;
                        gf[j] += p[2 * h + j] * c;
                    }
                }
                clip(gi);
                acts[0].apply(gi);
                if s.input_forget {
                    gf.iter_mut().zip(&*gi).for_each(|(f, i)| *f = 1.0 - i);
                } else {
                    clip(gf);
                    acts[0].apply(gf);
                }
                clip(gc);
                acts[1].apply(gc);
                for (j, c) in crow.iter_mut().enumerate() {
                    *c = gf[j] * *c + gi[j] * gc[j];
                }
                if let Some(p) = p {
                    for (j, &c) in crow.iter().enumerate() {
                        go[j] += p[h + j] * c;
                    }
                }
                clip(go);
                acts[0].apply(go);
                gc.copy_from_slice(crow);
                acts[2].apply(gc);
                for ((hv, o), c) in hrow.iter_mut().zip(&*go).zip(&*gc) {
                    *hv = o * c;
                }
            }
        }
        let y_at = self.y_at(t, d, n);
        // SAFETY: Y[t, d, n] (the layout's order), h floats inside Y of shape [seq, dirs,
        // batch, h] as t < seq; only row n writes it, and Y does not overlap the scratch.
        let y = unsafe { std::slice::from_raw_parts_mut(io.y.add(y_at), h) };
        y.copy_from_slice(hrow);
    }
}

/// One direction's buffers as its row tasks share them: the input projection (read
/// only) and the [`RnnLayer::direction`] scratch regions, of which each row task
/// touches its own rows.
#[derive(Clone, Copy)]
struct DirBufs {
    proj: SyncPtr<f32>,
    rec: SyncPtr<f32>,
    hs: SyncPtr<f32>,
    cs: SyncPtr<f32>,
    reset: SyncPtr<f32>,
    cand: SyncPtr<f32>,
}

/// Wᵀ of every direction side by side (input × dirs·gates·hidden) as a view of W.
fn w_view(w: *const f32, input: usize) -> Mat {
    Mat::rows(w, input).t()
}

fn add(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}

/// GRU's new state: h = (1 - z)·c + z·h.
fn blend(h: &mut [f32], z: &[f32], c: &[f32]) {
    for ((h, z), c) in h.iter_mut().zip(z).zip(c) {
        *h = (1.0 - z) * c + z * *h;
    }
}

/// The geometry and attributes of a `DynamicQuantizeLSTM` (com.microsoft): an LSTM with
/// the default activations whose 8-bit weights multiply activations quantized to u8 on
/// the fly, all of X at once, each step's hidden state as a whole.
#[derive(Debug, Clone)]
pub struct QuantLstmSpec {
    pub dirs: usize,
    pub reverse: bool,
    pub seq: usize,
    pub batch: usize,
    pub input: usize,
    pub hidden: usize,
    /// `f32::MAX` when the layer has no clip, as onnxruntime clamps either way.
    pub clip: f32,
    pub input_forget: bool,
}

use super::qgemm::{padded_k, qgemm, row_terms, AView, PackedB8};
use super::quant::Bytes;

impl QuantLstmSpec {
    /// Byte sizes of the scratch regions [`QuantLstm::run`] uses: the fused bias, X
    /// quantized (rows padded for the integer GEMM) with its row terms, X's and one
    /// step's integer products, the hidden state quantized with its terms, and the state.
    fn regions(&self) -> [usize; 9] {
        let (rows, g4, h) = (self.seq * self.batch, 4 * self.hidden, self.hidden);
        [
            self.dirs * g4 * 4,
            rows * padded_k(self.input),
            2 * rows * 4,
            rows * g4 * 4,
            self.batch * g4 * 4,
            self.batch * padded_k(h),
            2 * self.batch * 4,
            self.batch * h * 4,
            self.batch * h * 4,
        ]
    }

    /// Bytes of scratch [`QuantLstm::run`] needs.
    pub fn scratch_bytes(&self) -> usize {
        self.regions().iter().map(|n| n.next_multiple_of(64)).sum()
    }
}

/// One direction's 8-bit weights `[k, 4·hidden]` packed for the integer GEMM with their
/// zero point, and their scales (one, or one per column).
pub struct QuantMatrix {
    packed: PackedB8,
    scales: Vec<f32>,
}

impl QuantMatrix {
    /// The matrix of `values` (k × n, row-major, 8-bit values of type `kind`) minus
    /// `zero`.
    pub(crate) fn new(
        values: &[i32],
        kind: Bytes,
        k: usize,
        n: usize,
        zero: i32,
        scales: Vec<f32>,
    ) -> Result<QuantMatrix, String> {
        if values.len() != k * n || (scales.len() != 1 && scales.len() != n) {
            return Err(format!("quantized weights are not {k}×{n}"));
        }
        let bytes: Vec<u8> = values.iter().map(|&v| v as u8).collect();
        // SAFETY: `bytes` holds the k×n matrix (checked above).
        let packed = unsafe { PackedB8::new(bytes.as_ptr(), kind, k, n, (n, 1), &|_| zero)? };
        Ok(QuantMatrix { packed, scales })
    }

    fn scale(&self, col: usize) -> f32 {
        if self.scales.len() == 1 {
            self.scales[0]
        } else {
            self.scales[col]
        }
    }
}

/// Where one `DynamicQuantizeLSTM` run's operands are (the weights are compiled in).
#[derive(Clone, Copy)]
pub struct QuantLstmIo {
    pub x: *const f32,
    pub b: Option<*const f32>,
    pub lens: Option<*const i32>,
    pub h0: Option<*const f32>,
    pub c0: Option<*const f32>,
    pub p: Option<*const f32>,
    pub y: *mut f32,
    pub y_h: *mut f32,
    pub y_c: *mut f32,
}

// SAFETY: like `RnnIo`, the pointers address operands the caller of `QuantLstm::run` keeps
// alive for the run, and the pool tasks it spawns end before it returns.
unsafe impl Send for QuantLstmIo {}
// SAFETY: the gate tasks share only the reads of X, B, P and sequence_lens through it;
// the outputs are written by the calling thread alone.
unsafe impl Sync for QuantLstmIo {}

/// A compiled `DynamicQuantizeLSTM`. It computes what the interpreter's reference
/// (onnxruntime's kernel) does, in the same f32 operations: the integer products come
/// exact out of the integer GEMM (X's whole sequence at once, then each step's hidden
/// state), and the gate math uses the same scalar functions.
pub struct QuantLstm {
    pub spec: QuantLstmSpec,
    /// Per direction: W and R.
    weights: Vec<(QuantMatrix, QuantMatrix)>,
}

impl QuantLstm {
    pub fn new(spec: QuantLstmSpec, weights: Vec<(QuantMatrix, QuantMatrix)>) -> QuantLstm {
        QuantLstm { spec, weights }
    }

    /// Runs the layer; `scratch` holds [`QuantLstmSpec::scratch_bytes`] bytes (64-byte
    /// aligned). Fails
    /// only on sequence lengths out of range.
    ///
    /// # Safety
    /// `io`'s pointers must address the operands of this spec's shapes (outputs
    /// writable, not overlapping the inputs), `scratch` the scratch bytes.
    pub unsafe fn run(
        &self,
        pool: Option<&Pool>,
        io: &QuantLstmIo,
        scratch: *mut u8,
    ) -> Result<(), String> {
        use crate::ir::ops::quant::dynamic_quantize_params;
        // The range widened to hold 0, as the interpreter's dynamic quantization takes it.
        let quant_params = |v: &[f32]| {
            let hi = v.iter().copied().fold(0.0f32, f32::max);
            let lo = v.iter().copied().fold(0.0f32, f32::min);
            dynamic_quantize_params(lo, hi)
        };
        let s = &self.spec;
        let (batch, h, g4, dirs) = (s.batch, s.hidden, 4 * s.hidden, s.dirs);
        let len = |n: usize| -> Result<usize, String> {
            let Some(lens) = io.lens else {
                return Ok(s.seq);
            };
            // SAFETY: sequence_lens holds batch entries.
            let l = unsafe { *lens.add(n) };
            if l < 0 || l as usize > s.seq {
                return Err(format!(
                    "sequence_lens[{n}] is {l}, outside 0..={} (the sequence length)",
                    s.seq
                ));
            }
            Ok(l as usize)
        };
        let mut max_len = 0;
        for n in 0..batch {
            max_len = max_len.max(len(n)?);
        }
        // The regions `regions` sizes, each starting on a 64-byte boundary (as the scratch
        // does): the fused bias, X quantized, its row terms, X's products, one step's
        // products, the hidden state quantized, its terms, the hidden and cell states.
        let mut at = [scratch; 9];
        for (i, n) in s.regions().iter().enumerate().take(8) {
            at[i + 1] = at[i].wrapping_add(n.next_multiple_of(64));
        }
        let bias = at[0] as *mut f32;
        let (xq, xterms, xacc) = (at[1], at[2] as *mut i32, at[3] as *mut i32);
        let (racc, hq, hterms) = (at[4] as *mut i32, at[5], at[6] as *mut i32);
        let (hs, cs) = (at[7] as *mut f32, at[8] as *mut f32);
        let (kx, kh) = (padded_k(s.input), padded_k(h));
        let y_len = s.seq * dirs * batch * h;
        // SAFETY: Y is [seq, dirs, batch, hidden] floats by the contract, an output.
        unsafe { std::slice::from_raw_parts_mut(io.y, y_len) }.fill(0.0);
        // SAFETY: Y_h is [dirs, batch, hidden] floats by the contract, an output.
        unsafe { std::slice::from_raw_parts_mut(io.y_h, dirs * batch * h) }.fill(0.0);
        // SAFETY: Y_c has Y_h's shape and is a separate output (the contract).
        unsafe { std::slice::from_raw_parts_mut(io.y_c, dirs * batch * h) }.fill(0.0);
        // SAFETY: the fused bias region, dirs·4h floats (regions()[0]) at the scratch's
        // 64-byte-aligned start; no other reference to it exists.
        let bias_s = unsafe { std::slice::from_raw_parts_mut(bias, dirs * g4) };
        match io.b {
            Some(b) => {
                // SAFETY: B is [dirs, 2·4·hidden] floats by the contract, read only.
                let b = unsafe { std::slice::from_raw_parts(b, dirs * 2 * g4) };
                for d in 0..dirs {
                    for e in 0..g4 {
                        bias_s[d * g4 + e] = b[d * 2 * g4 + e] + b[d * 2 * g4 + g4 + e];
                    }
                }
            }
            None => bias_s.fill(0.0),
        }
        // X's first max_len steps quantized as a whole: every row any step reads.
        let rows = max_len * batch;
        // SAFETY: X's first max_len ≤ seq steps, rows × input floats of X [seq, batch,
        // input] (the contract).
        let x = unsafe { std::slice::from_raw_parts(io.x, rows * s.input) };
        let (x_scale, x_zero) = quant_params(x);
        // SAFETY: the X-quantized region holds seq·batch ≥ rows rows of kx = padded_k(input)
        // ≥ input bytes, and its terms region 2·seq·batch i32 (regions()[1], [2]).
        unsafe { quantize_rows(x, s.input, x_scale, x_zero, xq, kx, xterms) };
        // SAFETY: every call passes n < batch, and sequence_lens holds batch entries (each
        // checked in 0..=seq above).
        let len = |n: usize| io.lens.map_or(s.seq, |l| unsafe { *l.add(n) } as usize);
        for d in 0..dirs {
            let reverse = s.reverse || d == 1;
            let (wq, rq) = &self.weights[d];
            let (xacc_p, racc_p, hs_p, cs_p) =
                (SyncPtr(xacc), SyncPtr(racc), SyncPtr(hs), SyncPtr(cs));
            let xa = AView {
                data: xq,
                ld: kx,
                terms: xterms,
            };
            // SAFETY: `xa` is the rows quantized X rows (kx apart) with their terms, just
            // written; `wq` owns W's packed panels; X's products region holds seq·batch ×
            // 4h ≥ rows × 4h i32, written at row stride 4h.
            unsafe { qgemm(pool, rows, &xa, &wq.packed.view(), xacc, (g4, 1)) };
            for n in 0..batch {
                let at = (d * batch + n) * h;
                for (dst, src) in [(hs, io.h0), (cs, io.c0)] {
                    // SAFETY: row n < batch of the hidden or cell state region (batch × h
                    // floats each, regions()[7], [8]); no other reference to it is live.
                    let dst = unsafe { std::slice::from_raw_parts_mut(dst.add(n * h), h) };
                    let Some(p) = src else {
                        dst.fill(0.0);
                        continue;
                    };
                    // SAFETY: row (d, n) of initial_h or initial_c, [dirs, batch, hidden]
                    // by the contract.
                    dst.copy_from_slice(unsafe { std::slice::from_raw_parts(p.add(at), h) });
                }
            }
            let fused_bias = &bias_s[d * g4..(d + 1) * g4];
            // SAFETY: direction d's 3h peepholes, inside P [dirs, 3·hidden] (the contract).
            let peep =
                io.p.map(|p| unsafe { std::slice::from_raw_parts(p.add(d * 3 * h), 3 * h) });
            for t in 0..max_len {
                // SAFETY: the whole hidden state region (batch × h floats), read before the
                // gate tasks below write it.
                let hstate = unsafe { std::slice::from_raw_parts(hs, batch * h) };
                let (h_scale, h_zero) = quant_params(hstate);
                // SAFETY: the state-quantized region holds batch rows of kh = padded_k(h)
                // ≥ h bytes, its terms region 2·batch i32 (regions()[5], [6]).
                unsafe { quantize_rows(hstate, h, h_scale, h_zero, hq, kh, hterms) };
                let ha = AView {
                    data: hq,
                    ld: kh,
                    terms: hterms,
                };
                // SAFETY: `ha` is the batch quantized state rows with their terms, `rq`
                // owns R's packed panels, and the step's products region holds batch × 4h
                // i32 (regions()[4]).
                unsafe { qgemm(pool, batch, &ha, &rq.packed.view(), racc, (g4, 1)) };
                // Each row's gates in chunks of hidden units: a batch-1 step still
                // spreads its transcendental functions over the threads.
                let chunks = h.div_ceil(GATE_CHUNK);
                for_ranges(pool, batch * chunks, GATE_CHUNK * 256, &|range| {
                    for item in range {
                        let (n, j0) = (item / chunks, (item % chunks) * GATE_CHUNK);
                        let width = GATE_CHUNK.min(h - j0);
                        let l = len(n);
                        let at = n * h + j0;
                        // SAFETY: units j0..j0 + width ≤ h of state row n < batch, inside
                        // the hidden state region; each item (n, chunk) is one task's.
                        let hrow =
                            unsafe { std::slice::from_raw_parts_mut(hs_p.get().add(at), width) };
                        if t >= l {
                            hrow.fill(0.0); // a finished row's state reads as zero
                            continue;
                        }
                        let time = if reverse { l - 1 - t } else { t };
                        let xa_at = (time * batch + n) * g4;
                        // SAFETY: X's products of time < l ≤ max_len, row n: 4h i32 of the
                        // rows × 4h the first qgemm wrote; only read here.
                        let xa = unsafe { std::slice::from_raw_parts(xacc_p.get().add(xa_at), g4) };
                        // SAFETY: row n's 4h products of this step (batch × 4h, complete),
                        // only read here.
                        let ra =
                            unsafe { std::slice::from_raw_parts(racc_p.get().add(n * g4), g4) };
                        // SAFETY: the same units of row n in the cell state region, as
                        // `hrow`'s are this task's alone.
                        let crow =
                            unsafe { std::slice::from_raw_parts_mut(cs_p.get().add(at), width) };
                        let pre = |k: usize, j: usize| {
                            let col = k * h + j;
                            let step = 0.0 + xa[col] as f32 * (x_scale * wq.scale(col));
                            let step = step + ra[col] as f32 * (h_scale * rq.scale(col));
                            (step + fused_bias[col]).clamp(-s.clip, s.clip)
                        };
                        let p = |k: usize, j: usize| peep.map_or(0.0, |p| p[k * h + j]);
                        for (e, (hv, cv)) in hrow.iter_mut().zip(crow.iter_mut()).enumerate() {
                            let j = j0 + e;
                            let c_prev = *cv;
                            let i = std_sigmoid(pre(0, j) + p(0, j) * c_prev);
                            let f = if s.input_forget {
                                1.0 - i
                            } else {
                                std_sigmoid(pre(2, j) + p(2, j) * c_prev)
                            };
                            let cand = pre(3, j).tanh();
                            let cell = (f * c_prev + i * cand).clamp(-s.clip, s.clip);
                            let o = std_sigmoid(pre(1, j) + p(1, j) * cell);
                            *hv = o * cell.tanh();
                            *cv = cell;
                        }
                    }
                });
                for n in 0..batch {
                    let l = len(n);
                    if t >= l {
                        continue;
                    }
                    let time = if reverse { l - 1 - t } else { t };
                    let out = ((time * dirs + d) * batch + n) * h;
                    // SAFETY: state row n < batch (h floats of its region) into Y[time, d,
                    // n], inside Y [seq, dirs, batch, h] as time < l ≤ seq.
                    unsafe { std::ptr::copy_nonoverlapping(hs.add(n * h), io.y.add(out), h) };
                    if t + 1 == l {
                        let at = (d * batch + n) * h;
                        // SAFETY: row n's last hidden state into Y_h[d, n], h floats of
                        // Y_h [dirs, batch, h], which does not overlap the scratch.
                        unsafe { std::ptr::copy_nonoverlapping(hs.add(n * h), io.y_h.add(at), h) };
                        // SAFETY: row n's last cell state (its region's row n) into
                        // Y_c[d, n], shaped like Y_h.
                        unsafe { std::ptr::copy_nonoverlapping(cs.add(n * h), io.y_c.add(at), h) };
                    }
                }
            }
        }
        Ok(())
    }
}

/// Hidden units per parallel task of a step's gate math.
const GATE_CHUNK: usize = 64;

/// `values` (rows of `k`) quantized to u8 with `scale` and `zero_point` into rows `ld`
/// bytes apart (zero-padded), with their terms for the integer GEMM.
///
/// # Safety
/// `out` writable for rows · ld bytes, `terms` for 2 · rows i32, `ld` ≥ k.
unsafe fn quantize_rows(
    values: &[f32],
    k: usize,
    scale: f32,
    zero_point: f32,
    out: *mut u8,
    ld: usize,
    terms: *mut i32,
) {
    let isa = crate::backend::cpu::isa::isa();
    for (r, src) in values.chunks_exact(k.max(1)).enumerate() {
        // SAFETY: row r of out and its terms, inside them by the caller's contract; the
        // ISA's features are present (isa() checked them).
        unsafe {
            let row = std::slice::from_raw_parts_mut(out.add(r * ld), ld);
            super::quant::quantize_range(isa, src.as_ptr(), row.as_mut_ptr(), k, scale, zero_point);
            row[k..].fill(0);
            row_terms(row.as_ptr(), k, zero_point as i32, terms.add(2 * r));
        }
    }
}

/// The sigmoid onnxruntime's quantized LSTM computes (and the reference with it).
fn std_sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}
