//! Recurrent layers: `RNN`, `GRU` and `LSTM` on f32 lower to [`RnnLayer`] (weights packed
//! at compile time when constant), com.microsoft `DynamicQuantizeLSTM` to [`QuantLstm`].
use crate::backend::cpu::kernels::quant::Bytes;
use crate::backend::cpu::kernels::rnn::{
    Cell, QuantLstm, QuantLstmIo, QuantLstmSpec, QuantMatrix, RnnAct, RnnIo, RnnLayer, RnnSpec,
};
use crate::backend::cpu::program::{Cx, Kernel, Loc, Slot};
use crate::ir::ops::quant_rnn::QuantWeights;
use crate::ir::ops::rnn::{activations, directions, Cell as IrCell};
use crate::ir::DType;

use super::Build;

pub struct RnnStep {
    layer: RnnLayer,
    /// X, W, R, B, sequence_lens, initial_h, initial_c, P.
    ins: Vec<Option<Slot>>,
    outs: Vec<Slot>,
    scratch: Loc,
}

pub(crate) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let cell = match b.node.op.as_str() {
        "RNN" => Cell::Rnn,
        "GRU" => Cell::Gru,
        "LSTM" => Cell::Lstm,
        _ => return Ok(None),
    };
    let f32_or_absent = |k: usize| b.input(k).is_none_or(|s| s.dtype == DType::F32);
    let floats_ok = [0, 1, 2, 3, 5, 6, 7].into_iter().all(f32_or_absent)
        && b.outs.iter().all(|s| s.dtype == DType::F32)
        && b.input(4).is_none_or(|s| s.dtype == DType::I32);
    let (Some(x), Some(w), Some(r)) = (b.input(0), b.input(1), b.input(2)) else {
        return Ok(None);
    };
    if !floats_ok || x.shape.len() != 3 || w.shape.len() != 3 || r.shape.len() != 3 {
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
    let hidden = r.shape[2];
    let gh = cell.gates() * hidden;
    // Shapes the interpreter would refuse fall back to it, which says why.
    let state = if batch_first {
        [batch, dirs, hidden]
    } else {
        [dirs, batch, hidden]
    };
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
    let mut acts = vec![];
    let ir_cell = match cell {
        Cell::Rnn => IrCell::Rnn,
        Cell::Gru => IrCell::Gru,
        Cell::Lstm => IrCell::Lstm,
    };
    for per_dir in activations(ir_cell, a, dirs)? {
        let mut three = [RnnAct::Tanh; 3];
        for (slot, act) in three.iter_mut().zip(per_dir.iter().cycle()) {
            *slot = RnnAct::new(act.kind, act.alpha as f32, act.beta as f32)
                .ok_or_else(|| format!("unknown activation '{}'", act.kind))?;
        }
        acts.push(three);
    }
    let spec = RnnSpec {
        cell,
        dirs,
        reverse: a.string_or("direction", "forward")? == "reverse",
        seq,
        batch,
        input,
        hidden,
        batch_first,
        acts,
        clip: a.float("clip")?.map(|c| c as f32),
        linear_before_reset: a.int_or("linear_before_reset", 0)? != 0,
        input_forget: cell == Cell::Lstm && a.int_or("input_forget", 0)? != 0,
    };
    let constant = |k: usize| match (b.constant(k), b.input(k).map(|s| s.loc)) {
        (Some(_), Some(Loc::Const(p))) => Some(p as *const f32),
        _ => None,
    };
    let scratch = b.scratch(spec.scratch_floats() * 4);
    // SAFETY: constants W and R hold the shapes checked above.
    let layer = unsafe { RnnLayer::new(spec, constant(1), constant(2)) };
    Ok(Some(Box::new(RnnStep {
        layer,
        ins: (0..8).map(|k| b.input(k).cloned()).collect(),
        outs: b.outs.to_vec(),
        scratch,
    })))
}

impl Kernel for RnnStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let f = |k: usize| self.ins[k].as_ref().map(|s| cx.f32(s));
        let io = RnnIo {
            x: cx.f32(self.ins[0].as_ref().expect("X")),
            w: cx.f32(self.ins[1].as_ref().expect("W")),
            r: cx.f32(self.ins[2].as_ref().expect("R")),
            b: f(3),
            lens: self.ins[4].as_ref().map(|s| cx.ptr(s.loc) as *const i32),
            h0: f(5),
            c0: f(6),
            p: f(7),
            y: cx.f32_mut(&self.outs[0]),
            y_h: cx.f32_mut(&self.outs[1]),
            y_c: self.outs.get(2).map(|s| cx.f32_mut(s)),
        };
        // SAFETY: lowering checked the operands' shapes against the spec; the scratch
        // region holds `scratch_floats`.
        unsafe {
            self.layer
                .run(cx.pool, &io, cx.ptr(self.scratch) as *mut f32)
                .map_err(|e| format!("{}: {e}", self.kind()))
        }
    }
    fn kind(&self) -> &'static str {
        match self.layer.spec.cell {
            Cell::Rnn => "rnn",
            Cell::Gru => "gru",
            Cell::Lstm => "lstm",
        }
    }
}

pub struct QuantLstmStep {
    layer: QuantLstm,
    /// X, B, sequence_lens, initial_h, initial_c, P.
    ins: [Option<Slot>; 6],
    outs: Vec<Slot>,
    scratch: Loc,
}

/// `DynamicQuantizeLSTM` with constant 8-bit weights, scales and zero points (else the
/// interpreter runs it): the weights packed once for the integer GEMM.
pub(crate) fn build_quant_lstm(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    if b.node.op != "DynamicQuantizeLSTM" {
        return Ok(None);
    }
    let f32_or_absent = |k: usize| b.input(k).is_none_or(|s| s.dtype == DType::F32);
    let (Some(x), Some(w), Some(r)) = (b.input(0), b.input(1), b.input(2)) else {
        return Ok(None);
    };
    let consts = (8..12).map(|k| b.constant(k)).collect::<Option<Vec<_>>>();
    let (Some(wt), Some(rt), Some(consts)) = (b.constant(1), b.constant(2), consts) else {
        return Ok(None);
    };
    if ![0, 3, 5, 6, 7].into_iter().all(f32_or_absent)
        || b.outs.len() != 3
        || b.outs.iter().any(|s| s.dtype != DType::F32)
        || b.input(4).is_some_and(|s| s.dtype != DType::I32)
        || x.shape.len() != 3
        || w.shape.len() != 3
        || r.shape.len() != 3
    {
        return Ok(None);
    }
    let a = &b.node.attrs;
    let direction = a.string_or("direction", "forward")?;
    let dirs = match direction {
        "forward" | "reverse" => 1,
        "bidirectional" => 2,
        _ => return Ok(None),
    };
    let (seq, batch, input, hidden) = (x.shape[0], x.shape[1], x.shape[2], r.shape[1]);
    let g4 = 4 * hidden;
    let state = [dirs, batch, hidden];
    let fits = |k: usize, shape: &[usize]| b.input(k).is_none_or(|s| s.shape == shape);
    if w.shape != [dirs, input, g4]
        || r.shape != [dirs, hidden, g4]
        || !fits(3, &[dirs, 2 * g4])
        || !fits(4, &[batch])
        || !fits(5, &state)
        || !fits(6, &state)
        || !fits(7, &[dirs, 3 * hidden])
    {
        return Ok(None);
    }
    let kind = |d: DType| match d {
        DType::U8 => Some(Bytes::U8),
        DType::I8 => Some(Bytes::I8),
        _ => None,
    };
    let (Some(w_kind), Some(r_kind)) = (kind(w.dtype), kind(r.dtype)) else {
        return Ok(None);
    };
    let mut weights = vec![];
    for d in 0..dirs {
        let matrix = |t, scale, zero, what, k, kind| -> Result<QuantMatrix, String> {
            let q = QuantWeights::new(t, scale, zero, d, what)?;
            QuantMatrix::new(&q.values, kind, k, q.n, q.zero, q.scales)
        };
        let wm = matrix(wt, consts[0], consts[1], "W", input, w_kind)?;
        let rm = matrix(rt, consts[2], consts[3], "R", hidden, r_kind)?;
        weights.push((wm, rm));
    }
    let spec = QuantLstmSpec {
        dirs,
        reverse: direction == "reverse",
        seq,
        batch,
        input,
        hidden,
        clip: a.float("clip")?.map_or(f32::MAX, |c| c as f32),
        input_forget: a.int_or("input_forget", 0)? != 0,
    };
    let scratch = b.scratch(spec.scratch_bytes());
    Ok(Some(Box::new(QuantLstmStep {
        layer: QuantLstm::new(spec, weights),
        ins: [0, 3, 4, 5, 6, 7].map(|k| b.input(k).cloned()),
        outs: b.outs.to_vec(),
        scratch,
    })))
}

impl Kernel for QuantLstmStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let f = |k: usize| self.ins[k].as_ref().map(|s| cx.f32(s));
        let io = QuantLstmIo {
            x: cx.f32(self.ins[0].as_ref().expect("X")),
            b: f(1),
            lens: self.ins[2].as_ref().map(|s| cx.ptr(s.loc) as *const i32),
            h0: f(3),
            c0: f(4),
            p: f(5),
            y: cx.f32_mut(&self.outs[0]),
            y_h: cx.f32_mut(&self.outs[1]),
            y_c: cx.f32_mut(&self.outs[2]),
        };
        // SAFETY: lowering checked the operands' shapes against the spec; the scratch
        // region holds `scratch_floats`.
        unsafe {
            self.layer
                .run(cx.pool, &io, cx.ptr(self.scratch))
                .map_err(|e| format!("{}: {e}", self.kind()))
        }
    }
    fn kind(&self) -> &'static str {
        "lstm-quant"
    }
}
