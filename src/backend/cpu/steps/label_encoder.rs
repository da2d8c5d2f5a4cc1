//! ONNX-ML's `LabelEncoder` from numbers to numbers: integer keys for an integer X
//! (compared as i64, as the reference reads X), float keys for a float X (as f64, so
//! NaN matches none), into f32 or i64 values. The first of equal keys wins, as in the
//! reference's linear search; a table built at lowering answers each element. String
//! keys or values are the host program's.
use std::collections::HashMap;

use crate::backend::cpu::program::{Cx, Kernel, Slot};
use crate::ir::ops::strings::{label_encoder, Keys, Values};
use crate::ir::DType;
use crate::tensor::Elem;
use crate::with_dtype;

use super::matmul_elem::{elems, elems_mut};
use super::Build;

/// A key by its exact bits: an i64, or an f64 with -0 as 0 (equal to it, as `==` has it).
fn key_of<T: Elem>(v: T) -> u64 {
    if T::DTYPE.is_float() {
        let f = v.to_f64();
        (if f == 0.0 { 0.0 } else { f }).to_bits()
    } else {
        v.to_i64() as u64
    }
}

struct LabelEncoderStep {
    /// Key bits to the value's index; a NaN key is left out (it matches nothing).
    table: HashMap<u64, usize>,
    /// The values as f64 (f32 output) or i64, the default last.
    floats: Vec<f64>,
    ints: Vec<i64>,
    x: Slot,
    y: Slot,
}

pub(crate) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    if b.node.op != "LabelEncoder" {
        return Ok(None);
    }
    let (Some(x), [y]) = (b.input(0), b.outs) else {
        return Ok(None);
    };
    let (keys, values) = label_encoder(&b.node.attrs)?;
    let mut table = HashMap::new();
    let mut add = |bits: u64, k: usize| {
        table.entry(bits).or_insert(k);
    };
    match keys {
        Keys::Ints(v) if x.dtype.is_int() && !x.dtype.is_low_bit() => {
            v.iter().enumerate().for_each(|(k, &i)| add(i as u64, k))
        }
        Keys::Floats(v) if x.dtype.is_float() && !x.dtype.is_low_bit() => v
            .iter()
            .enumerate()
            .filter(|(_, f)| !f.is_nan())
            .for_each(|(k, &f)| add(key_of(f), k)),
        _ => return Ok(None),
    }
    let (floats, ints) = match values {
        Values::Floats(v, d) if y.dtype == DType::F32 => ([&v[..], &[d]].concat(), vec![]),
        Values::Ints(v, d) if y.dtype == DType::I64 => (vec![], [v, &[d]].concat()),
        _ => return Ok(None),
    };
    Ok(Some(Box::new(LabelEncoderStep {
        table,
        floats,
        ints,
        x: x.clone(),
        y: y.clone(),
    })))
}

/// The encoding of X of `T`.
///
/// # Safety
/// The Kernel::run contract, X holding `T`s, Y f32 or i64 as build chose.
unsafe fn encode<T: Elem>(cx: &Cx, s: &LabelEncoderStep) -> Result<(), String> {
    // SAFETY: X's `T`s, only read.
    let x = unsafe { elems::<T>(cx, &s.x) };
    let at = |v: T| -> usize {
        let default = s.floats.len().max(s.ints.len()) - 1;
        let nan = T::DTYPE.is_float() && v.to_f64().is_nan();
        match nan {
            true => default,
            false => s.table.get(&key_of(v)).copied().unwrap_or(default),
        }
    };
    if s.ints.is_empty() {
        // SAFETY: Y's f32s, its own buffer.
        let y = unsafe { elems_mut::<f32>(cx, &s.y) };
        for (o, &v) in y.iter_mut().zip(x) {
            *o = s.floats[at(v)] as f32;
        }
    } else {
        // SAFETY: Y's i64s, its own buffer.
        let y = unsafe { elems_mut::<i64>(cx, &s.y) };
        for (o, &v) in y.iter_mut().zip(x) {
            *o = s.ints[at(v)];
        }
    }
    Ok(())
}

impl Kernel for LabelEncoderStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: the Kernel::run contract; X holds x.dtype.
        unsafe { with_dtype!(self.x.dtype, encode(cx, self)) }
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        "label-encoder"
    }
}
