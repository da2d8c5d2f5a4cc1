//! `Attention` in every form the op takes, on any float dtype, as a typed loop that
//! computes what the reference does (in f64, rounded once): 3-D or 4-D operands, grouped
//! key/value heads, a past key/value cache (and the `present_*` outputs), boolean or
//! additive masks of any broadcast rank (a mask shorter than the keys pads masked),
//! causal and sliding-window masking, per-batch key padding (`nonpad_kv_seqlen`),
//! soft-capping and every `qk_matmul_output_mode`. The f32 GEMM step in
//! [`super::attention`] takes the plain forms first.
use crate::backend::cpu::kernels::par::{for_ranges, SyncPtr};
use crate::backend::cpu::program::{Cx, Kernel, Loc, Slot};
use crate::ir::DType;
use crate::tensor::Elem;
use crate::with_dtype;

use super::attention::Heads;
use super::matmul_elem::{elems, elems_mut, scratch_f64};
use super::nn::used;
use super::Build;

/// Where the mask's element for (b, h, i, j) is: strides per axis (0 where it
/// broadcasts), and the keys it has (`j` at or past `keys`: masked).
#[derive(Debug, Clone)]
struct MaskPlan {
    slot: Slot,
    strides: [usize; 4],
    keys: usize,
    boolean: bool,
}

struct AttentionElem {
    dtype: DType,
    q: Slot,
    k: Slot,
    v: Slot,
    past: Option<(Slot, Slot)>,
    past_len: usize,
    nonpad: Option<Slot>,
    mask: Option<MaskPlan>,
    y: Slot,
    present: [Option<Slot>; 2],
    qk: Option<Slot>,
    qh: Heads,
    kh: Heads,
    vh: Heads,
    yh: Heads,
    batch: usize,
    hq: usize,
    hkv: usize,
    sq: usize,
    /// Keys: the past's and the new ones.
    t: usize,
    d: usize,
    dv: usize,
    causal: bool,
    left: i64,
    right: i64,
    scale: f64,
    softcap: f64,
    mode: i64,
    /// The mask as f64 biases (mask elements), then per batch the row buffers: scores,
    /// biased scores, probabilities (t each) and the output row (dv).
    scratch: Loc,
}

/// An `Attention` node the GEMM step declined; `None` for shapes it cannot take.
pub(super) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let (Some(q), Some(k), Some(v)) = (b.input(0), b.input(1), b.input(2)) else {
        return Ok(None);
    };
    let dtype = q.dtype;
    let floats = [DType::F32, DType::F64, DType::F16, DType::BF16];
    if !floats.contains(&dtype) || k.dtype != dtype || v.dtype != dtype || b.outs.len() != 4 {
        return Ok(None);
    }
    if b.outs.iter().any(|o| o.dtype != dtype) {
        return Ok(None);
    }
    let rank = q.shape.len();
    if !(rank == 3 || rank == 4) || k.shape.len() != rank || v.shape.len() != rank {
        return Ok(None);
    }
    let three_d = rank == 3;
    let a = &b.node.attrs;
    let attr_heads = |name: &str| -> Result<Option<usize>, String> {
        Ok(a.int(name)?.filter(|&h| h >= 1).map(|h| h as usize))
    };
    let (hq, hkv) = if three_d {
        match (attr_heads("q_num_heads")?, attr_heads("kv_num_heads")?) {
            (Some(x), Some(y)) => (x, y),
            _ => return Ok(None),
        }
    } else {
        (q.shape[1], k.shape[1])
    };
    let (Some((qh, sq, d)), Some((kh, tk, dk)), Some((vh, tv, dv))) = (
        Heads::of(&q.shape, three_d, hq),
        Heads::of(&k.shape, three_d, hkv),
        Heads::of(&v.shape, three_d, hkv),
    ) else {
        return Ok(None);
    };
    let batch = q.shape[0];
    if dk != d || tv != tk || k.shape[0] != batch || v.shape[0] != batch {
        return Ok(None);
    }
    if hkv == 0 || hq % hkv != 0 {
        return Ok(None);
    }
    let past = match (b.input(4), b.input(5)) {
        (None, None) => None,
        (Some(pk), Some(pv)) => Some((pk.clone(), pv.clone())),
        _ => return Ok(None),
    };
    let past_len = match &past {
        None => 0,
        Some((pk, pv)) => {
            let p = pk.shape.get(2).copied().unwrap_or(0);
            if pk.shape != [batch, hkv, p, d] || pv.shape != [batch, hkv, p, dv] {
                return Ok(None);
            }
            if pk.dtype != dtype || pv.dtype != dtype {
                return Ok(None);
            }
            p
        }
    };
    let t = past_len + tk;
    let nonpad = b.input(6).cloned();
    if let Some(n) = &nonpad {
        if past.is_some() || n.dtype != DType::I64 || n.shape != [batch] {
            return Ok(None);
        }
    }
    let mask = match b.input(3) {
        None => None,
        Some(m) if m.dtype != DType::Bool && m.dtype != dtype => return Ok(None),
        Some(m) if m.shape.len() > 4 => return Ok(None),
        Some(m) => {
            let ms = &m.shape;
            let r = ms.len();
            let want = [batch, hq, sq, t];
            let mut strides = [0usize; 4];
            let mut step = 1;
            for x in (0..r).rev() {
                let full = want[4 - r + x];
                let last = x + 1 == r;
                let ok = if last {
                    ms[x] <= full
                } else {
                    ms[x] == 1 || ms[x] == full
                };
                if !ok {
                    return Err(format!("attn_mask {ms:?} does not broadcast to {want:?}"));
                }
                if last || ms[x] != 1 {
                    strides[4 - r + x] = step;
                }
                step *= ms[x];
            }
            Some(MaskPlan {
                slot: m.clone(),
                strides,
                keys: ms.last().copied().unwrap_or(usize::MAX),
                boolean: m.dtype == DType::Bool,
            })
        }
    };
    let y = b.outs[0].clone();
    let Some((yh, ys, ydv)) = Heads::of(&y.shape, three_d, hq) else {
        return Ok(None);
    };
    if ys != sq || ydv != dv || y.shape[0] != batch {
        return Ok(None);
    }
    let output = |o: usize, shape: [usize; 4]| -> Result<Option<Slot>, String> {
        if !used(b, o as u32) {
            return Ok(None);
        }
        if b.outs[o].shape != shape {
            return Err(format!(
                "Attention output {o} is {:?}, not {shape:?}",
                b.outs[o].shape
            ));
        }
        Ok(Some(b.outs[o].clone()))
    };
    let present = [
        output(1, [batch, hkv, t, d])?,
        output(2, [batch, hkv, t, dv])?,
    ];
    let qk = output(3, [batch, hq, sq, t])?;
    let mode = a.int_or("qk_matmul_output_mode", 0)?;
    if !(0..=3).contains(&mode) {
        return Err(format!("qk_matmul_output_mode must be 0 to 3, got {mode}"));
    }
    let scale = match a.float("scale")? {
        Some(s) => s,
        None => 1.0 / (d as f64).sqrt(),
    };
    let mask_len = mask.as_ref().map_or(0, |m| m.slot.elements());
    let floats = t
        .checked_mul(3)
        .and_then(|x| x.checked_add(dv)?.checked_mul(batch)?.checked_add(mask_len))
        .ok_or("attention scratch size overflows")?;
    let scratch = b.scratch(floats.checked_mul(8).ok_or("attention scratch overflows")?);
    Ok(Some(Box::new(AttentionElem {
        dtype,
        q: q.clone(),
        k: k.clone(),
        v: v.clone(),
        past,
        past_len,
        nonpad,
        mask,
        y,
        present,
        qk,
        qh,
        kh,
        vh,
        yh,
        batch,
        hq,
        hkv,
        sq,
        t,
        d,
        dv,
        causal: a.int_or("is_causal", 0)? != 0,
        left: a.int_or("left_window_size", -1)?,
        right: a.int_or("right_window_size", -1)?,
        scale,
        softcap: a.float_or("softcap", 0.0)?,
        mode,
        scratch,
    })))
}

/// The mask's elements as additive biases: a boolean's false is -inf, true 0.
///
/// # Safety
/// The mask slot holds `M`s of its shape in `cx`.
unsafe fn mask_bias<M: Elem>(cx: &Cx, m: &MaskPlan, out: &mut [f64]) -> Result<(), String> {
    // SAFETY: the mask input, `M`s of its shape (the contract), only read.
    let src = unsafe { elems::<M>(cx, &m.slot) };
    for (o, v) in out.iter_mut().zip(src) {
        let v = v.to_f64();
        *o = if !m.boolean {
            v
        } else if v != 0.0 {
            0.0
        } else {
            f64::NEG_INFINITY
        };
    }
    Ok(())
}

/// The `width` elements of key/value row `j` of head (b, hk): from the past cache
/// (`[B, Hkv, past, width]`) below `past_len`, else from the new operand.
#[allow(clippy::too_many_arguments)]
fn kv_row<'a, T>(
    past: Option<&'a [T]>,
    cur: &'a [T],
    heads: Heads,
    (past_len, hkv, width): (usize, usize, usize),
    b: usize,
    hk: usize,
    j: usize,
) -> &'a [T] {
    match past {
        Some(p) if j < past_len => {
            let at = ((b * hkv + hk) * past_len + j) * width;
            &p[at..at + width]
        }
        _ => {
            let at = heads.at(b, hk) + (j - past_len) * heads.row;
            &cur[at..at + width]
        }
    }
}

impl AttentionElem {
    /// # Safety
    /// Every slot holds its dtype's elements of its shape in `cx`; the outputs are
    /// buffers of their own; the scratch is this step's.
    unsafe fn run_as<T: Elem>(&self, cx: &Cx) -> Result<(), String> {
        let (t, d, dv, sq) = (self.t, self.d, self.dv, self.sq);
        let mask_len = self.mask.as_ref().map_or(0, |m| m.slot.elements());
        let per_batch = 3 * t + dv;
        // SAFETY: the scratch build sized for the mask's biases and the row buffers.
        let scratch = unsafe { scratch_f64(cx, self.scratch, mask_len + self.batch * per_batch) };
        let (bias_of, rows) = scratch.split_at_mut(mask_len);
        if let Some(m) = &self.mask {
            // SAFETY: the mask holds its dtype's elements (bool or the operands').
            unsafe { with_dtype!(m.slot.dtype, mask_bias(cx, m, bias_of))? };
        }
        // SAFETY: Q, K, V and the past cache are this step's `T` inputs, only read.
        let (q, k, v) = unsafe {
            (
                elems::<T>(cx, &self.q),
                elems::<T>(cx, &self.k),
                elems::<T>(cx, &self.v),
            )
        };
        // SAFETY: as for Q: the past cache's `T` inputs, only read.
        let past = self
            .past
            .as_ref()
            .map(|(pk, pv)| unsafe { (elems::<T>(cx, pk), elems::<T>(cx, pv)) });
        // SAFETY: nonpad_kv_seqlen, an i64 input of B values, only read.
        let nonpad = self.nonpad.as_ref().map(|n| unsafe { elems::<i64>(cx, n) });
        let kdims = (self.past_len, self.hkv, d);
        let vdims = (self.past_len, self.hkv, dv);
        let (pk, pv) = (past.map(|p| p.0), past.map(|p| p.1));
        // present_key / present_value: the past then the new keys, [B, Hkv, T, D].
        let operands = [(k, pk, self.kh, kdims), (v, pv, self.vh, vdims)];
        for (o, (src, pst, heads, dims)) in self.present.iter().zip(operands) {
            let Some(o) = o else { continue };
            // SAFETY: a present_* output, a buffer of its own that only this loop writes.
            let out = unsafe { elems_mut::<T>(cx, o) };
            let width = dims.2;
            let rows = self.batch * self.hkv * t;
            for (row, dst) in out.chunks_exact_mut(width.max(1)).enumerate().take(rows) {
                let (bh, j) = (row / t, row % t);
                let (b, hk) = (bh / self.hkv, bh % self.hkv);
                dst.copy_from_slice(kv_row(pst, src, heads, dims, b, hk, j));
            }
        }
        // SAFETY: Y, the output, a buffer of its own.
        let y = unsafe { elems_mut::<T>(cx, &self.y) };
        let qk_len = self.hq * sq * t;
        // SAFETY: qk_matmul_output, a buffer of its own.
        let qk = self.qk.as_ref().map(|s| unsafe { elems_mut::<T>(cx, s) });
        let y_len = y.len() / self.batch.max(1);
        let (yp, rp) = (SyncPtr(y.as_mut_ptr()), SyncPtr(rows.as_mut_ptr()));
        let qkp = qk.map(|q| SyncPtr(q.as_mut_ptr()));
        let bias_of = &*bias_of;
        let work = self.hq * sq * t * (d + dv);
        for_ranges(cx.pool, self.batch, work, &|r| {
            for b in r {
                // SAFETY: batch b's blocks of Y, of qk_matmul_output and of the row scratch
                // (each buffer holds batch such blocks), which only this task touches.
                let (y, bufs, qk) = unsafe {
                    (
                        std::slice::from_raw_parts_mut(yp.get().add(b * y_len), y_len),
                        std::slice::from_raw_parts_mut(rp.get().add(b * per_batch), per_batch),
                        qkp.map(|p| {
                            std::slice::from_raw_parts_mut(p.get().add(b * qk_len), qk_len)
                        }),
                    )
                };
                self.one_batch(b, [q, k, v], [pk, pv], nonpad, bias_of, y, qk, bufs);
            }
        });
        Ok(())
    }

    /// Batch `b` of Y (its block `y`) and of qk_matmul_output, with `bufs` its row buffers.
    #[allow(clippy::too_many_arguments)]
    fn one_batch<T: Elem>(
        &self,
        b: usize,
        [q, k, v]: [&[T]; 3],
        [pk, pv]: [Option<&[T]>; 2],
        nonpad: Option<&[i64]>,
        bias_of: &[f64],
        y: &mut [T],
        mut qk: Option<&mut [T]>,
        bufs: &mut [f64],
    ) {
        let (t, d, dv, sq) = (self.t, self.d, self.dv, self.sq);
        let kdims = (self.past_len, self.hkv, d);
        let vdims = (self.past_len, self.hkv, dv);
        let (scores, rest) = bufs.split_at_mut(t);
        let (biased, rest) = rest.split_at_mut(t);
        let (probs, acc) = rest.split_at_mut(t);
        let group = self.hq / self.hkv;
        {
            let offset = match (self.past.is_some(), nonpad) {
                (true, _) => self.past_len as i64,
                (false, Some(n)) => n[b] - sq as i64,
                _ => 0,
            };
            for h in 0..self.hq {
                let hk = h / group;
                for i in 0..sq {
                    let qa = self.qh.at(b, h) + i * self.qh.row;
                    let qrow = &q[qa..qa + d];
                    let mut row_masked = true;
                    for j in 0..t {
                        let krow = kv_row(pk, k, self.kh, kdims, b, hk, j);
                        let mut s: f64 = qrow
                            .iter()
                            .zip(krow)
                            .map(|(x, y)| x.to_f64() * y.to_f64())
                            .sum::<f64>()
                            * self.scale;
                        if self.softcap > 0.0 {
                            s = (s / self.softcap).tanh() * self.softcap;
                        }
                        scores[j] = s;
                        let mut bias = 0.0;
                        if let Some(m) = &self.mask {
                            bias += if j >= m.keys {
                                f64::NEG_INFINITY
                            } else {
                                let st = m.strides;
                                bias_of[b * st[0] + h * st[1] + i * st[2] + j * st[3]]
                            };
                        }
                        let diff = i as i64 + offset - j as i64;
                        if self.causal && diff < 0 {
                            bias = f64::NEG_INFINITY;
                        }
                        if (self.left >= 0 && diff > self.left)
                            || (self.right >= 0 && -diff > self.right)
                        {
                            bias = f64::NEG_INFINITY;
                        }
                        if nonpad.is_some_and(|n| j as i64 >= n[b]) {
                            bias = f64::NEG_INFINITY;
                        }
                        row_masked &= bias == f64::NEG_INFINITY;
                        biased[j] = s + bias;
                    }
                    // A softmax that survives a row of -inf, and zeroes masked rows.
                    let max = biased.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let max = if max == f64::NEG_INFINITY { 0.0 } else { max };
                    let mut sum = 0.0;
                    for (p, x) in probs.iter_mut().zip(biased.iter()) {
                        *p = (x - max).exp();
                        sum += *p;
                    }
                    let sum = if sum == 0.0 { 1.0 } else { sum };
                    for p in probs.iter_mut() {
                        *p = if row_masked { 0.0 } else { *p / sum };
                    }
                    if let Some(qk) = qk.as_deref_mut() {
                        let at = (h * sq + i) * t;
                        let src = match self.mode {
                            2 => &*biased,
                            3 => &*probs,
                            _ => &*scores,
                        };
                        for (o, x) in qk[at..at + t].iter_mut().zip(src) {
                            *o = T::from_f64(*x);
                        }
                    }
                    acc.fill(0.0);
                    for (j, p) in probs.iter().enumerate() {
                        let vrow = kv_row(pv, v, self.vh, vdims, b, hk, j);
                        for (s, x) in acc.iter_mut().zip(vrow) {
                            *s += p * x.to_f64();
                        }
                    }
                    let ya = h * self.yh.head + i * self.yh.row;
                    for (o, s) in y[ya..ya + dv].iter_mut().zip(acc.iter()) {
                        *o = T::from_f64(*s);
                    }
                }
            }
        }
    }
}

/// [`AttentionElem::run_as`] as a free fn, for `with_dtype!`.
///
/// # Safety
/// As for [`AttentionElem::run_as`].
unsafe fn run_attention<T: Elem>(s: &AttentionElem, cx: &Cx) -> Result<(), String> {
    // SAFETY: the caller's contract, passed on.
    unsafe { s.run_as::<T>(cx) }
}

impl Kernel for AttentionElem {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: every slot holds `dtype` (the mask: bool or `dtype`), checked at build.
        unsafe { with_dtype!(self.dtype, run_attention(self, cx)) }
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "attention-elem"
    }
}

/// `RotaryEmbedding` on any float dtype, in f64 like the reference.
struct Rotary {
    dtype: DType,
    x: Slot,
    cos: Slot,
    sin: Slot,
    /// position_ids [B, S] and the caches' rows; without it the caches are [B', S', half]
    /// with these row strides (batch, position).
    positions: Option<(Slot, usize)>,
    cache_strides: (usize, usize),
    y: Slot,
    /// (batch, sequence, heads, head size).
    dims: [usize; 4],
    four_d: bool,
    half: usize,
    interleaved: bool,
}

pub(super) fn build_rotary(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let (Some(x), Some(cos), Some(sin), [y]) = (b.input(0), b.input(1), b.input(2), b.outs) else {
        return Ok(None);
    };
    let dtype = x.dtype;
    let floats = [DType::F32, DType::F64, DType::F16, DType::BF16];
    if !floats.contains(&dtype) || cos.dtype != dtype || sin.dtype != dtype || y.dtype != dtype {
        return Ok(None);
    }
    if cos.shape != sin.shape || y.shape != x.shape {
        return Ok(None);
    }
    let a = &b.node.attrs;
    let s = &x.shape;
    let dims = match s.len() {
        4 => [s[0], s[2], s[1], s[3]],
        3 => {
            let Some(h) = a.int("num_heads")?.filter(|&h| h >= 1).map(|h| h as usize) else {
                return Ok(None);
            };
            if s[2] % h != 0 {
                return Err(format!(
                    "hidden size {} is not a multiple of {h} heads",
                    s[2]
                ));
            }
            [s[0], s[1], h, s[2] / h]
        }
        _ => return Ok(None),
    };
    let d = dims[3];
    let dim = match a.int("rotary_embedding_dim")? {
        None | Some(0) => d,
        Some(r) if r > 0 && (r as usize) <= d && r % 2 == 0 => r as usize,
        Some(r) => {
            return Err(format!(
                "rotary_embedding_dim {r} must be even and at most {d}"
            ))
        }
    };
    let half = dim / 2;
    if cos.shape.last() != Some(&half) {
        return Err(format!(
            "the caches' last axis is {:?}, not rotary_embedding_dim / 2 = {half}",
            cos.shape.last()
        ));
    }
    let (positions, cache_strides) = match b.input(3) {
        Some(p) => {
            if p.dtype != DType::I64 || p.shape != [dims[0], dims[1]] || cos.shape.len() != 2 {
                return Ok(None);
            }
            (Some((p.clone(), cos.shape[0])), (0, 0))
        }
        None => {
            let c = &cos.shape;
            if c.len() != 3 || c[0] < dims[0] || c[1] < dims[1] {
                return Ok(None);
            }
            (None, (c[1] * half, half))
        }
    };
    Ok(Some(Box::new(Rotary {
        dtype,
        x: x.clone(),
        cos: cos.clone(),
        sin: sin.clone(),
        positions,
        cache_strides,
        y: y.clone(),
        dims,
        four_d: s.len() == 4,
        half,
        interleaved: a.int_or("interleaved", 0)? != 0,
    })))
}

impl Rotary {
    /// # Safety
    /// The slots hold their dtypes' elements of their shapes in `cx`, Y a buffer of its own.
    unsafe fn run_as<T: Elem>(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: X and the two caches, this step's `T` inputs, only read.
        let (x, cos, sin) = unsafe {
            (
                elems::<T>(cx, &self.x),
                elems::<T>(cx, &self.cos),
                elems::<T>(cx, &self.sin),
            )
        };
        // SAFETY: position_ids, an i64 input of B·S values, only read.
        let pos = self
            .positions
            .as_ref()
            .map(|(p, _)| unsafe { elems::<i64>(cx, p) });
        // SAFETY: Y, the output, in a buffer apart from X (no in-place for this op).
        let y = unsafe { elems_mut::<T>(cx, &self.y) };
        y.copy_from_slice(x);
        let [b_n, s_n, h_n, d] = self.dims;
        let half = self.half;
        for b in 0..b_n {
            for t in 0..s_n {
                let row = match (pos, &self.positions) {
                    (Some(p), Some((_, rows))) => {
                        let at = p[b * s_n + t];
                        if at < 0 || at >= *rows as i64 {
                            return Err(format!("position {at} is outside a cache of {rows} rows"));
                        }
                        at as usize * half
                    }
                    _ => b * self.cache_strides.0 + t * self.cache_strides.1,
                };
                let (c, sn) = (&cos[row..row + half], &sin[row..row + half]);
                for h in 0..h_n {
                    let base = if self.four_d {
                        ((b * h_n + h) * s_n + t) * d
                    } else {
                        (b * s_n + t) * h_n * d + h * d
                    };
                    for kk in 0..half {
                        let (i, j) = if self.interleaved {
                            (2 * kk, 2 * kk + 1)
                        } else {
                            (kk, kk + half)
                        };
                        let (x1, x2) = (x[base + i].to_f64(), x[base + j].to_f64());
                        let (ck, sk) = (c[kk].to_f64(), sn[kk].to_f64());
                        y[base + i] = T::from_f64(ck * x1 - sk * x2);
                        y[base + j] = T::from_f64(sk * x1 + ck * x2);
                    }
                }
            }
        }
        Ok(())
    }
}

/// [`Rotary::run_as`] as a free fn, for `with_dtype!`.
///
/// # Safety
/// As for [`Rotary::run_as`].
unsafe fn run_rotary<T: Elem>(s: &Rotary, cx: &Cx) -> Result<(), String> {
    // SAFETY: the caller's contract for the rotary step, passed on.
    unsafe { s.run_as::<T>(cx) }
}

impl Kernel for Rotary {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: X, the caches and Y hold `dtype`, position_ids i64 (checked at build).
        unsafe { with_dtype!(self.dtype, run_rotary(self, cx)) }
    }
    fn can_fail(&self) -> bool {
        self.positions.is_some()
    }
    fn kind(&self) -> &'static str {
        "rotary-embedding"
    }
}
