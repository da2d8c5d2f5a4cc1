//! Blocked layouts. `NCHW16c` stores [N, C, H, W] as [N, ceil(C/16), H, W, 16]: the
//! channels of one pixel in groups of 16, so that a vector of 16 f32 lanes loads the
//! same pixel of 16 channels. The `layout` pass inserts `Reorder`s where a backend
//! asks for blocks, and blocked `FusedConv`s and pools (`block` > 0) read and write
//! them (a `FusedConv` with `plain_x` reads a plain X and writes blocks).
//!
//! When C is not a multiple of the block, the last block has pad lanes. Their values
//! are unspecified: `Reorder` to plain and blocked convs ignore them, so an op that
//! maps 0 to nonzero (Sigmoid) may leave anything there, and a blocked pool pools them
//! like channels.
use super::{leak, AttrSpec, EvalCtx, InferCtx, Op, OpSchema};
use crate::ir::ops::{InPlace, Origin};
use crate::ir::{AttrKind, Dim, Shape, TensorType};
use crate::match_tensor;
use crate::tensor::{Elem, Tensor};

/// The type of `t` ([N, C, spatial...]) in blocks of `b` channels.
pub(crate) fn blocked_type(t: &TensorType, b: usize) -> Result<TensorType, String> {
    if t.rank() < 3 || b == 0 {
        return Err(format!(
            "a blocked layout needs [N, C, spatial...] and a block, got {t}"
        ));
    }
    let c = t
        .shape
        .dim(1)
        .fixed()
        .ok_or("the channel count must be static")?;
    let mut axes = t.shape.axes.clone();
    axes[1].dim = Dim::Fixed(c.div_ceil(b));
    axes.push(crate::ir::Axis {
        dim: Dim::Fixed(b),
        name: None,
    });
    Ok(TensorType::new(t.dtype, Shape { axes }))
}

/// The plain type of a blocked `t` ([N, CB, spatial..., b]) with `c` channels.
pub(crate) fn plain_type(t: &TensorType, b: usize, c: usize) -> Result<TensorType, String> {
    let r = t.rank();
    let bad = || format!("{t} is not [N, CB, spatial..., {b}] holding {c} channels");
    if r < 4 || t.shape.dim(r - 1).fixed() != Some(b) {
        return Err(bad());
    }
    if t.shape.dim(1).fixed() != Some(c.div_ceil(b)) {
        return Err(bad());
    }
    let mut axes = t.shape.axes[..r - 1].to_vec();
    axes[1].dim = Dim::Fixed(c);
    Ok(TensorType::new(t.dtype, Shape { axes }))
}

fn block_array<T: Elem>(a: &ndarray::ArrayD<T>, b: usize) -> Tensor {
    let s = a.shape();
    let (n, c) = (s[0], s[1]);
    let spatial: usize = s[2..].iter().product();
    let cb = c.div_ceil(b);
    let src = a.as_standard_layout();
    let src = src.as_slice().expect("standard layout");
    let mut out = vec![T::default(); n * cb * spatial * b];
    for ni in 0..n {
        for ci in 0..c {
            for p in 0..spatial {
                let dst = ((ni * cb + ci / b) * spatial + p) * b + ci % b;
                out[dst] = src[(ni * c + ci) * spatial + p];
            }
        }
    }
    let mut dims = vec![n, cb];
    dims.extend_from_slice(&s[2..]);
    dims.push(b);
    Tensor::from_vec(&dims, out).expect("sizes agree")
}

fn unblock_array<T: Elem>(a: &ndarray::ArrayD<T>, c: usize) -> Tensor {
    let s = a.shape();
    let r = s.len();
    let (n, cb, b) = (s[0], s[1], s[r - 1]);
    let spatial: usize = s[2..r - 1].iter().product();
    let src = a.as_standard_layout();
    let src = src.as_slice().expect("standard layout");
    let mut out = vec![T::default(); n * c * spatial];
    for ni in 0..n {
        for ci in 0..c {
            for p in 0..spatial {
                out[(ni * c + ci) * spatial + p] =
                    src[((ni * cb + ci / b) * spatial + p) * b + ci % b];
            }
        }
    }
    let mut dims = vec![n, c];
    dims.extend_from_slice(&s[2..r - 1]);
    Tensor::from_vec(&dims, out).expect("sizes agree")
}

/// `x` [N, C, spatial...] in blocks of `b` channels (pad lanes zero).
pub(crate) fn block(x: &Tensor, b: usize) -> Result<Tensor, String> {
    if x.rank() < 3 || b == 0 {
        return Err(format!("cannot block a tensor of shape {:?}", x.shape()));
    }
    Ok(match_tensor!(x, a => block_array(a, b)))
}

/// Blocked `x` [N, CB, spatial..., b] back to [N, c, spatial...].
pub(crate) fn unblock(x: &Tensor, b: usize, c: usize) -> Result<Tensor, String> {
    let s = x.shape();
    if s.len() < 4 || s[s.len() - 1] != b || s[1] != c.div_ceil(b) {
        return Err(format!(
            "{:?} is not blocked by {b} holding {c} channels",
            s
        ));
    }
    Ok(match_tensor!(x, a => unblock_array(a, c)))
}

struct Reorder;

const REORDER: OpSchema = OpSchema {
    name: "Reorder",
    family: "layout",
    inputs: &["input"],
    outputs: &["output"],
    attrs: &[
        AttrSpec::req("to", AttrKind::String),
        AttrSpec::req("block", AttrKind::Int),
        AttrSpec::opt("channels", AttrKind::Int, "required when to = plain"),
    ],
    doc: "Kiln-only, made by the layout pass: to = blocked turns [N, C, spatial...] into \
          [N, ceil(C/block), spatial..., block] (NCHW16c for block 16); to = plain turns \
          it back, keeping `channels` channels. Pad lanes are unspecified.",
    in_place: InPlace::No,
    origin: Origin::Kiln,
};

/// (to blocked?, block, channels) from a Reorder's attributes.
fn reorder_attrs(attrs: &crate::ir::Attrs) -> Result<(bool, usize, Option<usize>), String> {
    let to_blocked = match attrs.string_or("to", "")? {
        "blocked" => true,
        "plain" => false,
        other => return Err(format!("to must be blocked or plain, got '{other}'")),
    };
    let b = attrs.req_int("block")?;
    if !(1..=1024).contains(&b) {
        return Err(format!("block must be 1 to 1024, got {b}"));
    }
    let c = match attrs.int("channels")? {
        Some(c) if c >= 0 => Some(c as usize),
        Some(c) => return Err(format!("channels must be >= 0, got {c}")),
        None if to_blocked => None,
        None => return Err("to = plain needs the channel count (channels)".into()),
    };
    Ok((to_blocked, b as usize, c))
}

impl Op for Reorder {
    fn schema(&self) -> &OpSchema {
        &REORDER
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        let (to_blocked, b, c) = reorder_attrs(cx.attrs)?;
        Ok(vec![match (to_blocked, c) {
            (true, _) => blocked_type(x, b)?,
            (false, Some(c)) => plain_type(x, b, c)?,
            (false, None) => unreachable!("checked"),
        }])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let (to_blocked, b, c) = reorder_attrs(cx.attrs)?;
        Ok(vec![match (to_blocked, c) {
            (true, _) => block(x, b)?,
            (false, Some(c)) => unblock(x, b, c)?,
            (false, None) => unreachable!("checked"),
        }])
    }
}

pub(crate) fn ops() -> Vec<&'static dyn Op> {
    vec![leak(Reorder)]
}
