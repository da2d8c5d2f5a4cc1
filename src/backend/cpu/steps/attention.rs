//! `Attention` on f32 as one step: per batch and head, `softmax(Q Kᵀ·scale + mask) V`
//! with the packed GEMM (the mask added in its epilogue, per key or as a full matrix)
//! and the softmax kernel, the (batch, head) pairs split over the pool. Covers 3-D
//! (`[B, S, H·D]`, heads from the attributes) and 4-D (`[B, H, S, D]`) operands, grouped
//! key/value heads and a float mask whose last axis is the keys'; a past cache, a
//! boolean mask, causal or windowed masking, soft-capping, key padding or a read
//! `present_*` / `qk_matmul_output`, and other dtypes, go to the typed loop of
//! [`super::attention_elem`], as does `RotaryEmbedding`.
use crate::backend::cpu::isa;
use crate::backend::cpu::kernels::gemm::{self, Bias, Epilogue, Mat};
use crate::backend::cpu::kernels::par::for_ranges;
use crate::backend::cpu::kernels::{softmax, Act};
use crate::backend::cpu::program::{Cx, Kernel, Loc, Slot};
use crate::ir::DType;

use super::nn::used;
use super::Build;

/// Where one operand's heads live: head (b, h) starts at `b·batch + h·head` and its
/// rows are `row` floats apart.
#[derive(Debug, Clone, Copy)]
pub(super) struct Heads {
    pub batch: usize,
    pub head: usize,
    pub row: usize,
}

impl Heads {
    /// `shape` ([B, S, H·D] when `three_d`, else [B, H, S, D]) with `heads` heads.
    pub(super) fn of(
        shape: &[usize],
        three_d: bool,
        heads: usize,
    ) -> Option<(Heads, usize, usize)> {
        if three_d {
            let [_, s, hd] = *shape else { return None };
            if heads == 0 || hd % heads != 0 {
                return None;
            }
            let d = hd / heads;
            Some((
                Heads {
                    batch: s * hd,
                    head: d,
                    row: hd,
                },
                s,
                d,
            ))
        } else {
            let [_, h, s, d] = *shape else { return None };
            (h == heads).then_some((
                Heads {
                    batch: h * s * d,
                    head: s * d,
                    row: d,
                },
                s,
                d,
            ))
        }
    }
    pub(super) fn at(&self, b: usize, h: usize) -> usize {
        b * self.batch + h * self.head
    }
}

/// The mask's place for head (b, h) (strides 0 where it broadcasts), and whether it
/// varies by query (a full matrix) or only by key.
#[derive(Debug, Clone)]
struct Mask {
    slot: Slot,
    batch: usize,
    head: usize,
    per_query: bool,
}

struct AttentionStep {
    q: Slot,
    k: Slot,
    v: Slot,
    y: Slot,
    mask: Option<Mask>,
    qh: Heads,
    kh: Heads,
    vh: Heads,
    yh: Heads,
    batch: usize,
    q_heads: usize,
    /// Query heads per key/value head.
    group: usize,
    sq: usize,
    t: usize,
    d: usize,
    dv: usize,
    scale: f32,
    /// Per (batch, head): the scaled queries [sq·d], then the scores [sq·t].
    scratch: Loc,
}

pub(crate) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    match b.node.op.as_str() {
        "Attention" => match build_gemm(b)? {
            Some(k) => Ok(Some(k)),
            None => super::attention_elem::build(b),
        },
        "RotaryEmbedding" => super::attention_elem::build_rotary(b),
        _ => Ok(None),
    }
}

/// The f32 forms the packed GEMM takes.
fn build_gemm(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let (Some(q), Some(k), Some(v)) = (b.input(0), b.input(1), b.input(2)) else {
        return Ok(None);
    };
    if [q, k, v].iter().any(|s| s.dtype != DType::F32) || b.outs[0].dtype != DType::F32 {
        return Ok(None);
    }
    // A past cache or key padding, or a read output beyond Y: the reference's.
    if (4..7).any(|i| b.input(i).is_some()) || (1..b.outs.len() as u32).any(|o| used(b, o)) {
        return Ok(None);
    }
    let a = &b.node.attrs;
    if a.int_or("is_causal", 0)? != 0
        || a.int_or("left_window_size", -1)? != -1
        || a.int_or("right_window_size", -1)? != -1
        || a.float_or("softcap", 0.0)? != 0.0
    {
        return Ok(None);
    }
    let three_d = q.shape.len() == 3;
    let heads = |name: &str, dim: usize| -> Result<Option<usize>, String> {
        Ok(if three_d {
            a.int(name)?.and_then(|h| usize::try_from(h).ok())
        } else {
            q.shape.get(dim).copied()
        })
    };
    let (Some(q_heads), Some(kv_heads)) = (
        heads("q_num_heads", 1)?,
        if three_d {
            heads("kv_num_heads", 1)?
        } else {
            k.shape.get(1).copied()
        },
    ) else {
        return Ok(None);
    };
    let (Some((qh, sq, d)), Some((kh, t, dk)), Some((vh, tv, dv))) = (
        Heads::of(&q.shape, three_d, q_heads),
        Heads::of(&k.shape, three_d, kv_heads),
        Heads::of(&v.shape, three_d, kv_heads),
    ) else {
        return Ok(None);
    };
    let batch = q.shape[0];
    if dk != d || tv != t || k.shape[0] != batch || v.shape[0] != batch {
        return Ok(None);
    }
    if kv_heads == 0 || q_heads % kv_heads != 0 {
        return Ok(None);
    }
    let y = b.outs[0].clone();
    let Some((yh, ys, ydv)) = Heads::of(&y.shape, three_d, q_heads) else {
        return Ok(None);
    };
    if ys != sq || ydv != dv || y.shape[0] != batch {
        return Ok(None);
    }
    let mask = match b.input(3) {
        None => None,
        Some(m) if m.dtype != DType::F32 || m.shape.len() > 4 => return Ok(None),
        Some(m) => {
            let mut dims = [1usize; 4];
            dims[4 - m.shape.len()..].copy_from_slice(&m.shape);
            let full = [batch, q_heads, sq, t];
            // Broadcast dims only, and every key present (a shorter mask pads masked).
            if dims[3] != t || (0..3).any(|i| dims[i] != 1 && dims[i] != full[i]) {
                return Ok(None);
            }
            let stride = |i: usize| -> usize {
                if dims[i] == 1 {
                    0
                } else {
                    dims[i + 1..].iter().product()
                }
            };
            Some(Mask {
                slot: m.clone(),
                batch: stride(0),
                head: stride(1),
                per_query: dims[2] != 1,
            })
        }
    };
    let scale = match a.float("scale")? {
        Some(s) => s as f32,
        None => 1.0 / (d as f32).sqrt(),
    };
    let per_pair = sq
        .checked_mul(d)
        .and_then(|qd| sq.checked_mul(t)?.checked_add(qd))
        .ok_or("attention scratch size overflows")?;
    let bytes = batch
        .checked_mul(q_heads)
        .and_then(|p| p.checked_mul(per_pair)?.checked_mul(4))
        .ok_or("attention scratch size overflows")?;
    let scratch = b.scratch(bytes);
    Ok(Some(Box::new(AttentionStep {
        q: q.clone(),
        k: k.clone(),
        v: v.clone(),
        y,
        mask,
        qh,
        kh,
        vh,
        yh,
        batch,
        q_heads,
        group: q_heads / kv_heads,
        sq,
        t,
        d,
        dv,
        scale,
        scratch,
    })))
}

impl AttentionStep {
    /// Head `pair` (= b·H + h) with `pool` for its products and softmax.
    ///
    /// # Safety
    /// The step's slots and scratch are valid in `cx`; no other call runs this pair.
    unsafe fn head(&self, cx: &Cx, pair: usize, pool: Option<&crate::backend::cpu::pool::Pool>) {
        let (b, h) = (pair / self.q_heads, pair % self.q_heads);
        let hk = h / self.group;
        let (sq, t, d, dv) = (self.sq, self.t, self.d, self.dv);
        let isa = isa::isa();
        // This pair's region of the scratch, which holds one [sq·d + sq·t] region per
        // pair: the scaled queries (sq × d), then the scores (sq × t).
        let scratch = (cx.ptr(self.scratch) as *mut f32).wrapping_add(pair * (sq * d + sq * t));
        let (qs, scores) = (scratch, scratch.wrapping_add(sq * d));
        let q = cx.f32(&self.q).wrapping_add(self.qh.at(b, h));
        for i in 0..sq {
            let (src, dst) = (q.wrapping_add(i * self.qh.row), qs.wrapping_add(i * d));
            for e in 0..d {
                // SAFETY: e < d along query row i < sq of head (b, h), inside Q by the
                // shapes checked at build, into row i of this pair's scaled queries.
                unsafe { *dst.add(e) = *src.add(e) * self.scale };
            }
        }
        let k = cx.f32(&self.k).wrapping_add(self.kh.at(b, hk));
        let kt = Mat {
            ptr: k,
            rs: 1,
            cs: self.kh.row,
        };
        let ep = match &self.mask {
            None => Epilogue::NONE,
            Some(m) => {
                let p = cx.f32(&m.slot).wrapping_add(b * m.batch + h * m.head);
                Epilogue {
                    bias: if m.per_query {
                        Bias::None
                    } else {
                        Bias::PerCol(p)
                    },
                    residual: m.per_query.then_some((p, t)),
                    act: Act::None,
                }
            }
        };
        // SAFETY: the queries are sq × d in this pair's region, Kᵀ of key head hk the
        // d × t view of its t rows (kh.row apart) inside K, the scores sq × t after the
        // queries; the mask's (b, h) block holds t keys per row (sq rows when per query),
        // as build checked its broadcast dims.
        unsafe { gemm::gemm(pool, sq, t, d, Mat::rows(qs, d), kt, scores, t, &ep) };
        // SAFETY: the scores, sq · t floats of this pair's region, written by the GEMM
        // that returned and touched by no other pair.
        let rows = unsafe { std::slice::from_raw_parts_mut(scores, sq * t) };
        softmax::softmax_inplace_isa(isa, rows, sq, t, pool);
        let v = Mat {
            ptr: cx.f32(&self.v).wrapping_add(self.vh.at(b, hk)),
            rs: self.vh.row,
            cs: 1,
        };
        let y = cx.f32_mut(&self.y).wrapping_add(self.yh.at(b, h));
        let (probs, none) = (Mat::rows(scores, t), &Epilogue::NONE);
        // SAFETY: the sq × t probabilities, value head hk's t rows of dv (vh.row apart)
        // inside V, and head (b, h) of Y: sq rows of dv, yh.row apart, which only this
        // pair writes (the caller's contract) and no input overlaps.
        unsafe { gemm::gemm(pool, sq, dv, t, probs, v, y, self.yh.row, none) };
    }
}

impl Kernel for AttentionStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let pairs = self.batch * self.q_heads;
        let threads = cx.pool.map_or(1, |p| p.threads());
        if pairs < threads {
            for pair in 0..pairs {
                // SAFETY: the pairs run one after another.
                unsafe { self.head(cx, pair, cx.pool) };
            }
            return Ok(());
        }
        let work = self.sq * self.t * (self.d + self.dv);
        for_ranges(cx.pool, pairs, work, &|r| {
            for pair in r {
                // SAFETY: each pair is run by one task.
                unsafe { self.head(cx, pair, None) };
            }
        });
        Ok(())
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "attention"
    }
}
