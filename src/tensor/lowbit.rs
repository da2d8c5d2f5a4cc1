//! The low-bit storage dtypes of quantized models: the float8 formats (e4m3fn,
//! e4m3fnuz, e5m2, e5m2fnuz, e8m0), float4 e2m1, and int4/uint4/int2/uint2.
//!
//! In memory every element takes one byte (a float's bit pattern in the low bits, an
//! integer's value); packing two or four to a byte happens only at the ONNX boundary.
//! The minifloats share one codec, [`MiniFloat`], parameterised by their bit widths,
//! bias and NaN/infinity conventions; e8m0 (a bare exponent) has its own.
use ndarray::ArrayD;

use super::{DType, Elem, Tensor};

/// How a minifloat spends its special encodings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Specials {
    /// IEEE-like: the all-ones exponent holds ±infinity (mantissa 0) and NaNs.
    Ieee,
    /// Finite: only all-ones exponent and mantissa (either sign) is NaN; no infinity.
    Fn,
    /// Finite, unsigned zero: the negative-zero pattern is the one NaN; no infinity.
    Fnuz,
    /// Finite with neither NaN nor infinity.
    None,
}

/// A sign-magnitude binary float of at most 8 bits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MiniFloat {
    exp_bits: u32,
    man_bits: u32,
    bias: i32,
    specials: Specials,
}

pub(crate) const E4M3FN: MiniFloat = MiniFloat::new(4, 3, 7, Specials::Fn);
pub(crate) const E4M3FNUZ: MiniFloat = MiniFloat::new(4, 3, 8, Specials::Fnuz);
pub(crate) const E5M2: MiniFloat = MiniFloat::new(5, 2, 15, Specials::Ieee);
pub(crate) const E5M2FNUZ: MiniFloat = MiniFloat::new(5, 2, 16, Specials::Fnuz);
pub(crate) const E2M1: MiniFloat = MiniFloat::new(2, 1, 1, Specials::None);

impl MiniFloat {
    const fn new(exp_bits: u32, man_bits: u32, bias: i32, specials: Specials) -> MiniFloat {
        MiniFloat {
            exp_bits,
            man_bits,
            bias,
            specials,
        }
    }

    fn sign_bit(self) -> u8 {
        1 << (self.exp_bits + self.man_bits)
    }

    fn exp_max(self) -> u32 {
        (1 << self.exp_bits) - 1
    }

    fn man_max(self) -> u32 {
        (1 << self.man_bits) - 1
    }

    /// The code of the largest finite value.
    fn max_code(self) -> u8 {
        let (e, m) = match self.specials {
            Specials::Ieee => (self.exp_max() - 1, self.man_max()),
            Specials::Fn => (self.exp_max(), self.man_max() - 1),
            Specials::Fnuz | Specials::None => (self.exp_max(), self.man_max()),
        };
        ((e << self.man_bits) | m) as u8
    }

    fn nan_code(self, negative: bool) -> u8 {
        let sign = if negative { self.sign_bit() } else { 0 };
        match self.specials {
            // The quiet NaN: the top mantissa bit set.
            Specials::Ieee => {
                sign | ((self.exp_max() << self.man_bits) | (1 << (self.man_bits - 1))) as u8
            }
            Specials::Fn => sign | ((self.exp_max() << self.man_bits) | self.man_max()) as u8,
            Specials::Fnuz => self.sign_bit(),
            // No NaN: a zero whose sign is flipped, as ml_dtypes encodes it.
            Specials::None => {
                if negative {
                    0
                } else {
                    self.sign_bit()
                }
            }
        }
    }

    /// The value of `code` (its low `1 + exp_bits + man_bits` bits).
    pub(crate) fn decode(self, code: u8) -> f64 {
        let code = code & (self.sign_bit() | (self.sign_bit() - 1));
        let negative = code & self.sign_bit() != 0;
        let e = (code as u32 >> self.man_bits) & self.exp_max();
        let m = code as u32 & self.man_max();
        let special = match self.specials {
            Specials::Ieee if e == self.exp_max() => {
                Some(if m == 0 { f64::INFINITY } else { f64::NAN })
            }
            Specials::Fn if e == self.exp_max() && m == self.man_max() => Some(f64::NAN),
            Specials::Fnuz if code == self.sign_bit() => Some(f64::NAN),
            _ => None,
        };
        let magnitude = special.unwrap_or_else(|| {
            let scale = |p: i32| 2f64.powi(p);
            if e == 0 {
                m as f64 * scale(1 - self.bias - self.man_bits as i32)
            } else {
                (1.0 + m as f64 * scale(-(self.man_bits as i32))) * scale(e as i32 - self.bias)
            }
        });
        if negative {
            -magnitude
        } else {
            magnitude
        }
    }

    /// The code nearest `v` (ties to even). Out of range, `saturate` gives the largest
    /// finite value of the sign; otherwise infinity where the format has one, else NaN
    /// (formats with neither always saturate).
    pub(crate) fn encode(self, v: f64, saturate: bool) -> u8 {
        let negative = v.is_sign_negative();
        if v.is_nan() {
            return self.nan_code(negative);
        }
        let sign = if negative { self.sign_bit() } else { 0 };
        let overflow = || {
            if saturate || self.specials == Specials::None {
                sign | self.max_code()
            } else if self.specials == Specials::Ieee {
                sign | (self.exp_max() << self.man_bits) as u8
            } else {
                self.nan_code(negative)
            }
        };
        let a = v.abs();
        if a.is_infinite() {
            return overflow();
        }
        // The spacing of representable values around `a`, subnormals included.
        let min_exp = 1 - self.bias;
        let exp = if a == 0.0 {
            min_exp
        } else {
            (a.log2().floor() as i32).max(min_exp)
        };
        // log2 may be off by one near powers of two; fix the exponent exactly.
        let exp = if a != 0.0 && exp > min_exp && a < 2f64.powi(exp) {
            exp - 1
        } else if a >= 2f64.powi(exp + 1) {
            exp + 1
        } else {
            exp
        };
        let quantum = 2f64.powi(exp - self.man_bits as i32);
        let steps = (a / quantum).round_ties_even();
        let rounded = steps * quantum;
        if rounded > self.decode(self.max_code()) {
            return overflow();
        }
        if rounded == 0.0 {
            return if self.specials == Specials::Fnuz {
                0
            } else {
                sign
            };
        }
        // `steps` counts quanta of 2^(exp - man_bits): below 2^man_bits it is subnormal
        // (only at the minimum exponent); 2^(man_bits+1) means rounding carried over.
        let steps = steps as u32;
        let (e, m) = if steps < (1 << self.man_bits) {
            (0, steps)
        } else if steps >= (2 << self.man_bits) {
            ((exp + 1 + self.bias) as u32, 0)
        } else {
            ((exp + self.bias) as u32, steps - (1 << self.man_bits))
        };
        sign | ((e << self.man_bits) | m) as u8
    }
}

/// How a value rounds to e8m0, a power of two: `round_mode` of ONNX's Cast.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum E8M0Rounding {
    Up,
    Down,
    Nearest,
}

impl std::str::FromStr for E8M0Rounding {
    type Err = String;
    fn from_str(s: &str) -> Result<E8M0Rounding, String> {
        match s {
            "up" => Ok(E8M0Rounding::Up),
            "down" => Ok(E8M0Rounding::Down),
            "nearest" => Ok(E8M0Rounding::Nearest),
            _ => Err(format!("round_mode '{s}' is not one of up, down, nearest")),
        }
    }
}

/// e8m0's value: 2^(code - 127); 0xFF is NaN.
pub(crate) fn e8m0_decode(code: u8) -> f64 {
    if code == 0xFF {
        f64::NAN
    } else {
        2f64.powi(code as i32 - 127)
    }
}

/// e8m0 from `v` as ONNX defines it: from the f32 exponent field (the sign is ignored),
/// rounded by `mode`; NaN and infinity give NaN; `saturate` keeps finite values from
/// rounding up into NaN.
pub(crate) fn e8m0_encode(v: f64, saturate: bool, mode: E8M0Rounding) -> u8 {
    let bits = (v as f32).to_bits();
    let exp = (bits >> 23) & 0xFF;
    if exp == 0xFF {
        return 0xFF;
    }
    let fraction = bits & 0x7F_FFFF;
    let up = match mode {
        E8M0Rounding::Down => false,
        E8M0Rounding::Up => fraction != 0,
        E8M0Rounding::Nearest => {
            let guard = bits & 0x40_0000 != 0;
            let rest = bits & 0x3F_FFFF != 0;
            // ONNX's reference counts a nonzero exponent as an odd last bit.
            guard && (rest || exp > 0)
        }
    };
    if up && !(saturate && exp == 0xFE) {
        (exp + 1) as u8
    } else {
        exp as u8
    }
}

/// `t` converted to `to` as ONNX's Cast does with its `saturate` and `round_mode`
/// attributes, which only the float8 targets read (float4 always saturates).
pub fn cast(t: &Tensor, to: DType, saturate: bool, mode: E8M0Rounding) -> Result<Tensor, String> {
    let special = to == DType::F8E8M0
        || (!saturate
            && matches!(
                to,
                DType::F8E4M3FN | DType::F8E4M3FNUZ | DType::F8E5M2 | DType::F8E5M2FNUZ
            ));
    if to == t.dtype() || !special {
        return t.try_cast(to);
    }
    let values = t.try_cast(DType::F64)?.to_f64_vec();
    macro_rules! encode_each {
        ($elem:ident, $encode:expr) => {
            Tensor::from_vec(
                t.shape(),
                values.iter().map(|&v| $elem($encode(v))).collect(),
            )
        };
    }
    match to {
        DType::F8E8M0 => encode_each!(F8E8M0, |v| e8m0_encode(v, saturate, mode)),
        DType::F8E4M3FN => encode_each!(F8E4M3FN, |v| E4M3FN.encode(v, false)),
        DType::F8E4M3FNUZ => encode_each!(F8E4M3FNUZ, |v| E4M3FNUZ.encode(v, false)),
        DType::F8E5M2 => encode_each!(F8E5M2, |v| E5M2.encode(v, false)),
        _ => encode_each!(F8E5M2FNUZ, |v| E5M2FNUZ.encode(v, false)),
    }
}

/// A float8/float4 tensor from values as the text format writes them: every value
/// the dtype holds (infinities and e8m0's 2^-127 included) reads back to its own code;
/// others round to nearest even (e8m0: up) without saturating.
pub(crate) fn minifloat_from_f64s(
    dtype: DType,
    shape: &[usize],
    v: &[f64],
) -> Result<Tensor, String> {
    let t = Tensor::from_vec(shape, v.to_vec())?;
    let mut out = cast(&t, dtype, false, E8M0Rounding::Up)?;
    if let Tensor::F8E8M0(a) = &mut out {
        for (code, &v) in a.iter_mut().zip(v) {
            if v == e8m0_decode(0) {
                *code = F8E8M0(0);
            }
        }
    }
    Ok(out)
}

/// Integer `v` wrapped into `bits` bits (two's complement when `signed`), like a C cast.
fn wrap_int(v: i64, bits: u32, signed: bool) -> i64 {
    let m = v & ((1 << bits) - 1);
    if signed && m >= 1 << (bits - 1) {
        m - (1 << bits)
    } else {
        m
    }
}

/// Float to a sub-byte integer: truncate toward zero, then saturate to the type's range;
/// NaN gives 0. The ONNX spec leaves a float cast to a fixed-point type undefined when
/// the value is out of range (Cast: "fixed point: undefined if OOR"), and its generators
/// disagree (ml_dtypes 0.5 wraps, 0.7 gives 0, onnxruntime rounds and wraps), so Kiln
/// keeps the one rule `Elem::from_f64` states for every integer width.
fn float_to_int(v: f64, bits: u32, signed: bool) -> i64 {
    let (min, max) = match signed {
        true => (-(1i64 << (bits - 1)), (1i64 << (bits - 1)) - 1),
        false => (0, (1i64 << bits) - 1),
    };
    if v.is_nan() {
        0
    } else {
        (v.trunc().clamp(min as f64, max as f64)) as i64
    }
}

/// `Elem::wrap` and `Elem::view` for the `Tensor` variant `$variant`.
macro_rules! wrap_and_view {
    ($variant:ident) => {
        fn wrap(a: ArrayD<Self>) -> Tensor {
            Tensor::$variant(a)
        }
        fn view(t: &Tensor) -> Option<&ArrayD<Self>> {
            if let Tensor::$variant(a) = t {
                Some(a)
            } else {
                None
            }
        }
    };
}

/// A float8/float4 element: its code, and the codec's decoding and its default
/// encoding (ONNX Cast's: saturating, e8m0 rounding up).
macro_rules! minifloat_elem {
    ($name:ident, $decode:expr, $encode:expr, $doc:literal) => {
        #[doc = $doc]
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
        pub struct $name(pub u8);

        impl PartialOrd for $name {
            fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
                self.to_f64().partial_cmp(&other.to_f64())
            }
        }

        impl Elem for $name {
            const DTYPE: DType = DType::$name;
            fn to_f64(self) -> f64 {
                $decode(self.0)
            }
            fn from_f64(v: f64) -> Self {
                $name($encode(v))
            }
            fn to_i64(self) -> i64 {
                self.to_f64() as i64
            }
            fn from_i64(v: i64) -> Self {
                Self::from_f64(v as f64)
            }
            wrap_and_view!($name);
        }
    };
}

minifloat_elem!(
    F8E4M3FN,
    |c| E4M3FN.decode(c),
    |v| E4M3FN.encode(v, true),
    "float8 e4m3fn: bias 7, NaN but no infinity."
);
minifloat_elem!(
    F8E4M3FNUZ,
    |c| E4M3FNUZ.decode(c),
    |v| E4M3FNUZ.encode(v, true),
    "float8 e4m3fnuz: bias 8, one NaN (0x80), no infinity or negative zero."
);
minifloat_elem!(
    F8E5M2,
    |c| E5M2.decode(c),
    |v| E5M2.encode(v, true),
    "float8 e5m2: bias 15, IEEE infinities and NaNs."
);
minifloat_elem!(
    F8E5M2FNUZ,
    |c| E5M2FNUZ.decode(c),
    |v| E5M2FNUZ.encode(v, true),
    "float8 e5m2fnuz: bias 16, one NaN (0x80), no infinity or negative zero."
);
minifloat_elem!(
    F4E2M1,
    |c| E2M1.decode(c),
    |v| E2M1.encode(v, true),
    "float4 e2m1: bias 1, finite only (±6 at most)."
);
minifloat_elem!(
    F8E8M0,
    e8m0_decode,
    |v| e8m0_encode(v, true, E8M0Rounding::Up),
    "float8 e8m0: an unsigned power of two 2^(code - 127); 0xFF is NaN."
);

macro_rules! subbyte_int_elem {
    ($name:ident, $variant:ident, $inner:ty, $bits:expr, $signed:expr, $doc:literal) => {
        #[doc = $doc]
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(pub $inner);

        impl $name {
            pub const MIN: i64 = if $signed { -(1 << ($bits - 1)) } else { 0 };
            pub const MAX: i64 = if $signed {
                (1 << ($bits - 1)) - 1
            } else {
                (1 << $bits) - 1
            };
        }

        impl Elem for $name {
            const DTYPE: DType = DType::$variant;
            fn to_f64(self) -> f64 {
                self.0 as f64
            }
            fn from_f64(v: f64) -> Self {
                $name(float_to_int(v, $bits, $signed) as $inner)
            }
            fn to_i64(self) -> i64 {
                self.0 as i64
            }
            fn from_i64(v: i64) -> Self {
                $name(wrap_int(v, $bits, $signed) as $inner)
            }
            wrap_and_view!($variant);
        }
    };
}

subbyte_int_elem!(I4, I4, i8, 4, true, "int4: -8..=7, one per byte in memory.");
subbyte_int_elem!(
    U4,
    U4,
    u8,
    4,
    false,
    "uint4: 0..=15, one per byte in memory."
);
subbyte_int_elem!(I2, I2, i8, 2, true, "int2: -2..=1, one per byte in memory.");
subbyte_int_elem!(
    U2,
    U2,
    u8,
    2,
    false,
    "uint2: 0..=3, one per byte in memory."
);

/// How many elements of `dtype` ONNX packs into one byte (1 for the float8s).
pub(crate) fn per_byte(dtype: DType) -> usize {
    match dtype {
        DType::I4 | DType::U4 | DType::F4E2M1 => 2,
        DType::I2 | DType::U2 => 4,
        _ => 1,
    }
}

/// The in-memory bytes of `n` elements of `dtype` from ONNX's packed form (the first
/// element in the lowest bits); each code is sign-extended for the signed integers.
pub(crate) fn unpack(dtype: DType, packed: &[u8], n: usize) -> Result<Vec<u8>, String> {
    let per = per_byte(dtype);
    let need = n.div_ceil(per);
    if packed.len() != need {
        return Err(format!(
            "{} bytes given, {n} elements of {dtype} pack into {need}",
            packed.len()
        ));
    }
    let bits = 8 / per as u32;
    let mask = ((1u16 << bits) - 1) as u8;
    let signed = matches!(dtype, DType::I4 | DType::I2);
    Ok((0..n)
        .map(|i| {
            let code = (packed[i / per] >> ((i % per) as u32 * bits)) & mask;
            if signed {
                wrap_int(code as i64, bits, true) as u8
            } else {
                code
            }
        })
        .collect())
}

/// ONNX's packed form of in-memory bytes of `dtype` (the inverse of [`unpack`]; Kiln
/// writes no ONNX tensors, so only tests pack).
#[cfg(test)]
pub(crate) fn pack(dtype: DType, bytes: &[u8]) -> Vec<u8> {
    let per = per_byte(dtype);
    let bits = 8 / per as u32;
    let mask = ((1u16 << bits) - 1) as u8;
    let mut out = vec![0u8; bytes.len().div_ceil(per)];
    for (i, &b) in bytes.iter().enumerate() {
        out[i / per] |= (b & mask) << ((i % per) as u32 * bits);
    }
    out
}

/// The element a byte holds: a float's code in the low bits, or an integer, which for
/// int4/int2 may be in the low bits (as `ml_dtypes` stores it) or sign-extended. Returns
/// the byte the `Tensor` variant stores (the integer's value).
pub(crate) fn element_byte(dtype: DType, b: u8) -> Result<u8, String> {
    let signed_low_bits = |bits: u32| {
        let v = b as i8 as i64;
        if (b as i64) < 1 << bits {
            Some(wrap_int(b as i64, bits, true) as u8)
        } else if v >= -(1 << (bits - 1)) {
            Some(b)
        } else {
            None
        }
    };
    let element = match dtype {
        DType::I4 => signed_low_bits(4),
        DType::I2 => signed_low_bits(2),
        DType::U4 | DType::F4E2M1 => Some(b).filter(|&b| b < 16),
        DType::U2 => Some(b).filter(|&b| b < 4),
        _ => Some(b),
    };
    element.ok_or_else(|| format!("byte {b:#04x} is not a {dtype} element"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minifloat_specials_and_extremes() {
        assert_eq!(E4M3FN.decode(0x7E), 448.0);
        assert!(E4M3FN.decode(0x7F).is_nan() && E4M3FN.decode(0xFF).is_nan());
        assert_eq!(E4M3FN.decode(0x01), 2f64.powi(-9));
        assert_eq!(E4M3FNUZ.decode(0x7F), 240.0);
        assert!(E4M3FNUZ.decode(0x80).is_nan());
        assert_eq!(E5M2.decode(0x7B), 57344.0);
        assert_eq!(E5M2.decode(0x7C), f64::INFINITY);
        assert_eq!(E5M2.decode(0xFC), f64::NEG_INFINITY);
        assert!(E5M2.decode(0x7D).is_nan());
        assert_eq!(E5M2FNUZ.decode(0x7F), 57344.0);
        assert_eq!(E2M1.decode(0x7), 6.0);
        assert_eq!(E2M1.decode(0x1), 0.5);
        assert_eq!(E2M1.decode(0xF), -6.0);
        assert_eq!(e8m0_decode(127), 1.0);
        assert_eq!(e8m0_decode(0), 2f64.powi(-127));
    }

    #[test]
    fn encoding_rounds_ties_to_even_and_saturates() {
        // 1.0625 is halfway between 1.0 (even) and 1.125 in e4m3.
        assert_eq!(E4M3FN.decode(E4M3FN.encode(1.0625, true)), 1.0);
        assert_eq!(E4M3FN.decode(E4M3FN.encode(1.1875, true)), 1.25);
        // 464 is halfway between 448 (mantissa 110, even) and 480 (111, the NaN code):
        // it rounds to 448, but anything above overflows.
        assert_eq!(E4M3FN.encode(464.0, false), 0x7E);
        assert!(E4M3FN.decode(E4M3FN.encode(465.0, false)).is_nan());
        assert_eq!(E4M3FN.encode(465.0, true), 0x7E);
        // The tie at 248 in e4m3fnuz goes to the even 256, which overflows.
        assert_eq!(E4M3FNUZ.encode(248.0, false), 0x80);
        assert_eq!(E5M2.encode(61440.0, false), 0x7C);
        assert_eq!(E4M3FN.encode(f64::NEG_INFINITY, true), 0xFE);
        assert_eq!(E5M2.encode(1e6, false), 0x7C);
        assert_eq!(E5M2.encode(-1e6, true), 0xFB);
        assert_eq!(E4M3FNUZ.encode(1e6, false), 0x80);
        assert_eq!(E4M3FNUZ.encode(-0.0, true), 0);
        assert_eq!(E4M3FNUZ.encode(-1e-9, true), 0);
        assert_eq!(E4M3FN.encode(-1e-9, true), 0x80);
        // Subnormal halfway cases: 2^-10 lies between 0 and 2^-9.
        assert_eq!(E4M3FN.encode(2f64.powi(-10), true), 0);
        assert_eq!(E4M3FN.encode(3.0 * 2f64.powi(-10), true), 0x02);
        assert_eq!(E2M1.encode(0.25, true), 0);
        assert_eq!(E2M1.encode(0.75, true), 0x2);
        assert_eq!(E2M1.encode(100.0, false), 0x7);
        assert_eq!(E2M1.encode(f64::INFINITY, false), 0x7);
    }

    #[test]
    fn every_code_round_trips() {
        for f in [E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ, E2M1] {
            let n = 1u16 << (1 + f.exp_bits + f.man_bits);
            for code in 0..n {
                let code = code as u8;
                let v = f.decode(code);
                if v.is_nan() {
                    continue;
                }
                assert_eq!(f.encode(v, false), code, "{f:?} {code:#04x} ({v})");
            }
        }
    }

    #[test]
    fn e8m0_rounding_modes() {
        use E8M0Rounding::*;
        assert_eq!(e8m0_encode(1.0, true, Up), 127);
        assert_eq!(e8m0_encode(1.5, true, Up), 128);
        assert_eq!(e8m0_encode(1.5, true, Down), 127);
        assert_eq!(e8m0_encode(1.5, true, Nearest), 128);
        assert_eq!(e8m0_encode(1.25, true, Nearest), 127);
        assert_eq!(e8m0_encode(-4.0, true, Up), 129);
        assert_eq!(e8m0_encode(f64::INFINITY, true, Up), 0xFF);
        assert_eq!(e8m0_encode(f32::MAX as f64, true, Up), 0xFE);
        assert_eq!(e8m0_encode(f32::MAX as f64, false, Up), 0xFF);
        assert_eq!("nearest".parse::<E8M0Rounding>(), Ok(Nearest));
        assert!("zero".parse::<E8M0Rounding>().is_err());
    }

    #[test]
    fn subbyte_ints_wrap_and_pack() {
        assert_eq!(I4::from_i64(9), I4(-7));
        assert_eq!(U4::from_i64(-1), U4(15));
        // Integers wrap (ONNX: "discard higher bits"); floats truncate and saturate,
        // as every other integer width does (`Elem::from_f64`).
        assert_eq!(I2::from_f64(-9.7), I2(-2));
        assert_eq!(I4::from_f64(7.9), I4(7));
        assert_eq!(I4::from_f64(8.0), I4(7));
        assert_eq!(I4::from_f64(-8.5), I4(-8));
        assert_eq!(I4::from_f64(f64::NEG_INFINITY), I4(-8));
        assert_eq!(U4::from_f64(-1.5), U4(0));
        assert_eq!(U4::from_f64(1e9), U4(15));
        assert_eq!(U2::from_f64(f64::NAN), U2(0));
        assert_eq!(i8::from_f64(300.0), 127);
        let bytes = [1u8, (-2i8) as u8, 7];
        let packed = pack(DType::I4, &bytes);
        assert_eq!(packed, vec![0xE1, 0x07]);
        assert_eq!(unpack(DType::I4, &packed, 3).unwrap(), bytes);
        let u2 = [3u8, 0, 1, 2, 1];
        let packed = pack(DType::U2, &u2);
        assert_eq!(packed, vec![0b1001_0011, 0b01]);
        assert_eq!(unpack(DType::U2, &packed, 5).unwrap(), u2);
        assert!(unpack(DType::U2, &packed, 9)
            .unwrap_err()
            .contains("pack into 3"));
        assert_eq!(element_byte(DType::I4, 0x08), Ok(0xF8));
        assert_eq!(element_byte(DType::I4, 0xF8), Ok(0xF8));
        assert!(element_byte(DType::I4, 0x80).is_err());
        assert!(element_byte(DType::U2, 4).unwrap_err().contains("not a u2"));
        let t = Tensor::from_vec(&[2], vec![I4(-8), I4(7)]).unwrap();
        assert_eq!(t.to_le_bytes(), vec![0x08, 0x07]);
        assert_eq!(Tensor::from_le_bytes(DType::I4, &[2], &[0x08, 0x07]), Ok(t));
    }

    /// Every code's value and chosen values' codes, as ml_dtypes and ONNX's reference
    /// have them (`scripts/lowbit-reference.py` writes the file).
    #[test]
    fn agrees_with_ml_dtypes_and_the_onnx_reference() {
        let text = include_str!("../../tests/onnx/lowbit_reference.txt");
        let (mut section, mut checked) = (Vec::<&str>::new(), 0);
        for line in text.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            if matches!(words[0], "decode" | "encode") {
                section = words;
                continue;
            }
            let value = f32::from_bits(u32::from_str_radix(words[0], 16).unwrap()) as f64;
            let code: u8 = words[1].parse().unwrap();
            let dtype: DType = section[1].parse().unwrap();
            // The in-memory byte as ml_dtypes stores it (int4/int2: the low bits).
            let one = |t: Tensor| t.to_le_bytes()[0];
            if section[0] == "decode" {
                let got = Tensor::from_le_bytes(dtype, &[1], &[code])
                    .unwrap()
                    .to_f64_vec()[0];
                let same = (got.is_nan() && value.is_nan()) || got == value;
                assert!(same, "{dtype} code {code}: {got}, ml_dtypes says {value}");
            } else {
                let (saturate, mode) = (section[2] == "1", section[3].parse().unwrap());
                let got = one(cast(&Tensor::scalar(value as f32), dtype, saturate, mode).unwrap());
                assert_eq!(
                    got, code,
                    "{value:e} to {dtype} (saturate {saturate}, {mode:?}): {got:#04x}, ONNX says {code:#04x}"
                );
            }
            checked += 1;
        }
        assert!(checked > 10_000, "only {checked} reference lines");
    }
}
