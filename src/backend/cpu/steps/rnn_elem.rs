//! `RNN`, `GRU` and `LSTM` on the float dtypes the f32 [`super::rnn`] layer does not take
//! (f64, f16, bf16): one batch row at a time in f64, as the reference steps them, its
//! activations the reference's ([`Activation::apply`]).
use crate::backend::cpu::program::{Cx, Kernel, Loc, Slot};
use crate::ir::ops::rnn::{activations, directions, Activation, Cell};
use crate::ir::DType;
use crate::tensor::Elem;
use crate::with_dtype;

use super::conv_elem::is_elem_float;
use super::matmul_elem::{elems, elems_mut, scratch_f64};
use super::Build;

struct RnnElem {
    cell: Cell,
    dirs: usize,
    reverse: bool,
    seq: usize,
    batch: usize,
    input: usize,
    hidden: usize,
    batch_first: bool,
    acts: Vec<Vec<Activation>>,
    clip: Option<f64>,
    linear_before_reset: bool,
    input_forget: bool,
    /// X, W, R, B, sequence_lens, initial_h, initial_c, P.
    ins: Vec<Option<Slot>>,
    /// Y, Y_h, Y_c (each may be absent).
    outs: [Option<Slot>; 3],
    /// h, c, three gate rows of hidden f64, then X's row of input f64.
    scratch: Loc,
}

pub(crate) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let cell = match b.node.op.as_str() {
        "RNN" => Cell::Rnn,
        "GRU" => Cell::Gru,
        "LSTM" => Cell::Lstm,
        _ => return Ok(None),
    };
    let (Some(x), Some(w), Some(r)) = (b.input(0), b.input(1), b.input(2)) else {
        return Ok(None);
    };
    let dtype = x.dtype;
    let same = |k: usize| b.input(k).is_none_or(|s| s.dtype == dtype);
    if !is_elem_float(dtype)
        || ![1, 2, 3, 5, 6, 7].into_iter().all(same)
        || b.outs.iter().any(|s| s.dtype != dtype)
        || b.input(4).is_some_and(|s| s.dtype != DType::I32)
        || x.shape.len() != 3
    {
        return Ok(None);
    }
    let a = &b.node.attrs;
    let dirs = directions(a)?;
    let batch_first = a.int_or("layout", 0)? != 0;
    let (seq, batch, input) = if batch_first {
        (x.shape[1], x.shape[0], x.shape[2])
    } else {
        (x.shape[0], x.shape[1], x.shape[2])
    };
    let Some(&hidden) = r.shape.get(2) else {
        return Ok(None);
    };
    let gh = cell.gates() * hidden;
    let state = if batch_first {
        [batch, dirs, hidden]
    } else {
        [dirs, batch, hidden]
    };
    // Shapes the interpreter would refuse are not this family's.
    let fits = |k: usize, shape: &[usize]| b.input(k).is_none_or(|s| s.shape == shape);
    if w.shape != [dirs, gh, input]
        || r.shape != [dirs, gh, hidden]
        || !fits(3, &[dirs, 2 * gh])
        || !fits(4, &[batch])
        || !fits(5, &state)
        || (cell == Cell::Lstm && (!fits(6, &state) || !fits(7, &[dirs, 3 * hidden])))
    {
        return Ok(None);
    }
    let outs = [0, 1, 2].map(|k| b.outs.get(k).cloned());
    Ok(Some(Box::new(RnnElem {
        cell,
        dirs,
        reverse: a.string_or("direction", "forward")? == "reverse",
        seq,
        batch,
        input,
        hidden,
        batch_first,
        acts: activations(cell, a, dirs)?,
        clip: a.float("clip")?,
        linear_before_reset: a.int_or("linear_before_reset", 0)? != 0,
        input_forget: cell == Cell::Lstm && a.int_or("input_forget", 0)? != 0,
        ins: (0..8).map(|k| b.input(k).cloned()).collect(),
        outs,
        scratch: b.scratch((5 * hidden + input) * 8),
    })))
}

/// `Σ m[row, e] · v[e]` of the row-major matrix `m` with `v.len()` columns.
fn dot<T: Elem>(m: &[T], row: usize, v: &[f64]) -> f64 {
    let r = &m[row * v.len()..][..v.len()];
    r.iter().zip(v).map(|(a, &b)| a.to_f64() * b).sum()
}

/// The layer on `T`.
///
/// # Safety
/// The Kernel::run contract: the operands hold `T`s (sequence_lens i32s) of the shapes
/// build checked, the scratch 5 · hidden + input f64.
unsafe fn run_rnn<T: Elem>(cx: &Cx, s: &RnnElem) -> Result<(), String> {
    let input = |k: usize| {
        s.ins[k]
            .as_ref()
            // SAFETY: the layer's inputs, `T`s of their shapes, only read.
            .map(|slot| unsafe { elems::<T>(cx, slot) })
    };
    let (x, w, r) = (
        input(0).expect("X"),
        input(1).expect("W"),
        input(2).expect("R"),
    );
    let (bias, h0, c0, peep) = (input(3), input(5), input(6), input(7));
    // SAFETY: sequence_lens, `batch` i32s, only read.
    let lens = s.ins[4]
        .as_ref()
        .map(|slot| unsafe { elems::<i32>(cx, slot) });
    // SAFETY: the outputs, never planned in place over the inputs, each its own buffer.
    let mut outs = s
        .outs
        .each_ref()
        .map(|o| o.as_ref().map(|o| unsafe { elems_mut::<T>(cx, o) }));
    // SAFETY: this step's scratch of 5 · hidden + input f64.
    let scratch = unsafe { scratch_f64(cx, s.scratch, 5 * s.hidden + s.input) };
    let (hid, g) = (s.hidden, s.cell.gates());
    let (h, rest) = scratch.split_at_mut(hid);
    let (c, rest) = rest.split_at_mut(hid);
    let (z, rest) = rest.split_at_mut(hid);
    let (rs, rest) = rest.split_at_mut(hid);
    let (reset, xt_buf) = rest.split_at_mut(hid);
    if let Some(y) = outs[0].as_deref_mut() {
        y.fill(T::from_f64(0.0));
    }
    let clip = |v: f64| s.clip.map_or(v, |c| v.clamp(-c, c));
    // Offsets of state [d, n, j] and of Y [t, d, n, j] in the layer's layout.
    let state_at = |d: usize, n: usize| {
        if s.batch_first {
            (n * s.dirs + d) * hid
        } else {
            (d * s.batch + n) * hid
        }
    };
    let y_at = |t: usize, d: usize, n: usize| {
        if s.batch_first {
            ((n * s.seq + t) * s.dirs + d) * hid
        } else {
            ((t * s.dirs + d) * s.batch + n) * hid
        }
    };
    for d in 0..s.dirs {
        let reverse = s.reverse || d == 1;
        let act = &s.acts[d];
        let (w, r) = (&w[d * g * hid * s.input..], &r[d * g * hid * hid..]);
        let b = |k: usize, j: usize| bias.map_or(0.0, |b| b[(d * 2 * g + k) * hid + j].to_f64());
        let rb = |k: usize, j: usize| b(g + k, j);
        let p = |k: usize, j: usize| peep.map_or(0.0, |p| p[(d * 3 + k) * hid + j].to_f64());
        for n in 0..s.batch {
            let len = lens.map_or(Ok(s.seq), |l| usize::try_from(l[n]));
            let Some(len) = len.ok().filter(|&l| l <= s.seq) else {
                return Err(format!("sequence_lens must lie in 0..={}", s.seq));
            };
            for j in 0..hid {
                h[j] = h0.map_or(0.0, |h0| h0[state_at(d, n) + j].to_f64());
                c[j] = c0.map_or(0.0, |c0| c0[state_at(d, n) + j].to_f64());
            }
            for step in 0..len {
                let t = if reverse { len - 1 - step } else { step };
                let x_at = if s.batch_first {
                    (n * s.seq + t) * s.input
                } else {
                    (t * s.batch + n) * s.input
                };
                for (v, e) in xt_buf.iter_mut().zip(&x[x_at..x_at + s.input]) {
                    *v = e.to_f64();
                }
                let xt = &xt_buf[..];
                // Gate k's pre-activation for unit j: W x + R h + biases.
                let pre = |k: usize, j: usize, h: &[f64]| {
                    dot(w, k * hid + j, xt) + dot(r, k * hid + j, h) + b(k, j) + rb(k, j)
                };
                match s.cell {
                    Cell::Rnn => {
                        for (j, z) in z.iter_mut().enumerate() {
                            *z = act[0].apply(clip(pre(0, j, h)));
                        }
                        h.copy_from_slice(z);
                    }
                    Cell::Gru => {
                        // Gates z, r, h; the candidate resets h before or after R.
                        for j in 0..hid {
                            z[j] = act[0].apply(clip(pre(0, j, h)));
                            rs[j] = act[0].apply(clip(pre(1, j, h)));
                            reset[j] = h[j] * rs[j];
                        }
                        // The new h goes to `c` (unused by GRU) until every unit is done.
                        for j in 0..hid {
                            let row = 2 * hid + j;
                            let wx = dot(w, row, xt) + b(2, j);
                            let rh = if s.linear_before_reset {
                                rs[j] * (dot(r, row, h) + rb(2, j))
                            } else {
                                dot(r, row, reset) + rb(2, j)
                            };
                            let cand = act[1].apply(clip(wx + rh));
                            c[j] = (1.0 - z[j]) * cand + z[j] * h[j];
                        }
                        h.copy_from_slice(c);
                    }
                    Cell::Lstm => {
                        // Gates i, o, f, c; peepholes i, o, f.
                        for j in 0..hid {
                            let i = act[0].apply(clip(pre(0, j, h) + p(0, j) * c[j]));
                            let f = if s.input_forget {
                                1.0 - i
                            } else {
                                act[0].apply(clip(pre(2, j, h) + p(2, j) * c[j]))
                            };
                            let cand = act[1].apply(clip(pre(3, j, h)));
                            let cell = f * c[j] + i * cand;
                            let o = act[0].apply(clip(pre(1, j, h) + p(1, j) * cell));
                            z[j] = o * act[2].apply(cell);
                            rs[j] = cell;
                        }
                        h.copy_from_slice(z);
                        c.copy_from_slice(rs);
                    }
                }
                if let Some(y) = outs[0].as_deref_mut() {
                    for (o, &v) in y[y_at(t, d, n)..][..hid].iter_mut().zip(h.iter()) {
                        *o = T::from_f64(v);
                    }
                }
            }
            for (k, state) in [(1, &*h), (2, &*c)] {
                if let Some(o) = outs[k].as_deref_mut() {
                    for (o, &v) in o[state_at(d, n)..][..hid].iter_mut().zip(state) {
                        *o = T::from_f64(v);
                    }
                }
            }
        }
    }
    Ok(())
}

impl Kernel for RnnElem {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: the Kernel::run contract; the operands hold x's dtype (build checked).
        unsafe { with_dtype!(self.ins[0].as_ref().expect("X").dtype, run_rnn(cx, self)) }
    }
    fn kind(&self) -> &'static str {
        match self.cell {
            Cell::Rnn => "rnn-elem",
            Cell::Gru => "gru-elem",
            Cell::Lstm => "lstm-elem",
        }
    }
}
