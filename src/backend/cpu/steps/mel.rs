//! `MelWeightMatrix` with constant sizes (so a static output), its sample rate and edge
//! frequencies read at run time: the reference's filters ([`mel_filters`]) written into
//! the output in its dtype.
use crate::backend::cpu::program::{Cx, Kernel, Slot};
use crate::ir::ops::signal::{mel_check, mel_filters};
use crate::tensor::Elem;
use crate::with_dtype;

use super::matmul_elem::elems_mut;
use super::Build;

struct MelStep {
    /// num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz.
    ins: [Slot; 5],
    y: Slot,
}

pub(crate) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    if b.node.op != "MelWeightMatrix" {
        return Ok(None);
    }
    let (Some(ins), [y]) = (
        (0..5)
            .map(|k| b.input(k).cloned())
            .collect::<Option<Vec<Slot>>>(),
        b.outs,
    ) else {
        return Ok(None);
    };
    let scalar = |s: &Slot| s.elements() == 1;
    if !ins.iter().all(scalar)
        || !ins[..3].iter().all(|s| s.dtype.is_int())
        || !ins[3..].iter().all(|s| s.dtype.is_float())
        || !(y.dtype.is_float() || y.dtype.is_int())
    {
        return Ok(None);
    }
    let ins: [Slot; 5] = ins.try_into().expect("five");
    Ok(Some(Box::new(MelStep { ins, y: y.clone() })))
}

/// The one element of `s` (a `T` scalar) as f64.
///
/// # Safety
/// `s` holds one `T` under `cx`.
unsafe fn first<T: Elem>(cx: &Cx, s: &Slot) -> Result<f64, String> {
    // SAFETY: the caller's one `T`.
    Ok(unsafe { *(cx.ptr(s.loc) as *const T) }.to_f64())
}

/// The matrix into Y of `T`.
///
/// # Safety
/// The Kernel::run contract, Y holding `T`s.
unsafe fn run_mel<T: Elem>(cx: &Cx, s: &MelStep, v: [f64; 5]) -> Result<(), String> {
    let (rows, mels) = mel_check(v[0] as i64, v[1] as i64, v[2] as i64, v[3], v[4])?;
    if [rows, mels] != s.y.shape[..] {
        return Err(format!("the matrix is {rows}×{mels}, Y {:?}", s.y.shape));
    }
    // SAFETY: Y's `T`s, its own buffer.
    let y = unsafe { elems_mut::<T>(cx, &s.y) };
    y.fill(T::from_f64(0.0));
    mel_filters(mels, v[1] as i64, v[2] as i64, v[3], v[4], |row, i, w| {
        y[row * mels + i] = T::from_f64(w)
    })
}

impl Kernel for MelStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        let mut v = [0.0; 5];
        for (v, s) in v.iter_mut().zip(&self.ins) {
            // SAFETY: each input is one element of its dtype (build checked).
            *v = unsafe { with_dtype!(s.dtype, first(cx, s)) }?;
        }
        // SAFETY: Y holds y.dtype.
        unsafe { with_dtype!(self.y.dtype, run_mel(cx, self, v)) }
    }
    fn kind(&self) -> &'static str {
        "mel-weights"
    }
}
