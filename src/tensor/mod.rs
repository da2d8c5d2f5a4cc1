//! `Tensor`: a dense, row-major n-dimensional array of one of Kiln's dtypes.
//!
//! It is the value the interpreter computes with and the payload of `Constant` and
//! `Variable` nodes. Each dtype is an `ndarray::ArrayD` of its Rust element type; generic
//! code is written over [`Elem`] and dispatched with [`match_tensor!`] / [`map_tensor!`].
use half::{bf16, f16};
use ndarray::{ArrayD, IxDyn};

pub mod dtype;
pub mod lowbit;
pub mod npy;

pub use dtype::DType;
use lowbit::{F4E2M1, F8E4M3FN, F8E4M3FNUZ, F8E5M2, F8E5M2FNUZ, F8E8M0, I2, I4, U2, U4};

/// A dense tensor. The variant is the dtype.
#[derive(Debug, Clone, PartialEq)]
pub enum Tensor {
    F32(ArrayD<f32>),
    F64(ArrayD<f64>),
    F16(ArrayD<f16>),
    BF16(ArrayD<bf16>),
    I8(ArrayD<i8>),
    U8(ArrayD<u8>),
    I32(ArrayD<i32>),
    I64(ArrayD<i64>),
    Bool(ArrayD<bool>),
    I16(ArrayD<i16>),
    U16(ArrayD<u16>),
    U32(ArrayD<u32>),
    U64(ArrayD<u64>),
    F8E4M3FN(ArrayD<F8E4M3FN>),
    F8E4M3FNUZ(ArrayD<F8E4M3FNUZ>),
    F8E5M2(ArrayD<F8E5M2>),
    F8E5M2FNUZ(ArrayD<F8E5M2FNUZ>),
    F8E8M0(ArrayD<F8E8M0>),
    F4E2M1(ArrayD<F4E2M1>),
    I4(ArrayD<I4>),
    U4(ArrayD<U4>),
    I2(ArrayD<I2>),
    U2(ArrayD<U2>),
}

/// Runs `$body` with `$a` bound to the inner `&ArrayD<T>` whatever the dtype; the arms
/// must all produce the same (non-tensor) type. Usually `$body` calls a generic fn.
#[macro_export]
macro_rules! match_tensor {
    ($t:expr, $a:ident => $body:expr) => {
        match $t {
            $crate::tensor::Tensor::F32($a) => $body,
            $crate::tensor::Tensor::F64($a) => $body,
            $crate::tensor::Tensor::F16($a) => $body,
            $crate::tensor::Tensor::BF16($a) => $body,
            $crate::tensor::Tensor::I8($a) => $body,
            $crate::tensor::Tensor::U8($a) => $body,
            $crate::tensor::Tensor::I32($a) => $body,
            $crate::tensor::Tensor::I64($a) => $body,
            $crate::tensor::Tensor::Bool($a) => $body,
            $crate::tensor::Tensor::I16($a) => $body,
            $crate::tensor::Tensor::U16($a) => $body,
            $crate::tensor::Tensor::U32($a) => $body,
            $crate::tensor::Tensor::U64($a) => $body,
            $crate::tensor::Tensor::F8E4M3FN($a) => $body,
            $crate::tensor::Tensor::F8E4M3FNUZ($a) => $body,
            $crate::tensor::Tensor::F8E5M2($a) => $body,
            $crate::tensor::Tensor::F8E5M2FNUZ($a) => $body,
            $crate::tensor::Tensor::F8E8M0($a) => $body,
            $crate::tensor::Tensor::F4E2M1($a) => $body,
            $crate::tensor::Tensor::I4($a) => $body,
            $crate::tensor::Tensor::U4($a) => $body,
            $crate::tensor::Tensor::I2($a) => $body,
            $crate::tensor::Tensor::U2($a) => $body,
        }
    };
}

/// Like [`match_tensor!`], but `$body` yields an `ArrayD` of the same element type and the
/// result is re-wrapped as a `Tensor` of the same dtype.
#[macro_export]
macro_rules! map_tensor {
    ($t:expr, $a:ident => $body:expr) => {
        match $t {
            $crate::tensor::Tensor::F32($a) => $crate::tensor::Tensor::F32($body),
            $crate::tensor::Tensor::F64($a) => $crate::tensor::Tensor::F64($body),
            $crate::tensor::Tensor::F16($a) => $crate::tensor::Tensor::F16($body),
            $crate::tensor::Tensor::BF16($a) => $crate::tensor::Tensor::BF16($body),
            $crate::tensor::Tensor::I8($a) => $crate::tensor::Tensor::I8($body),
            $crate::tensor::Tensor::U8($a) => $crate::tensor::Tensor::U8($body),
            $crate::tensor::Tensor::I32($a) => $crate::tensor::Tensor::I32($body),
            $crate::tensor::Tensor::I64($a) => $crate::tensor::Tensor::I64($body),
            $crate::tensor::Tensor::Bool($a) => $crate::tensor::Tensor::Bool($body),
            $crate::tensor::Tensor::I16($a) => $crate::tensor::Tensor::I16($body),
            $crate::tensor::Tensor::U16($a) => $crate::tensor::Tensor::U16($body),
            $crate::tensor::Tensor::U32($a) => $crate::tensor::Tensor::U32($body),
            $crate::tensor::Tensor::U64($a) => $crate::tensor::Tensor::U64($body),
            $crate::tensor::Tensor::F8E4M3FN($a) => $crate::tensor::Tensor::F8E4M3FN($body),
            $crate::tensor::Tensor::F8E4M3FNUZ($a) => $crate::tensor::Tensor::F8E4M3FNUZ($body),
            $crate::tensor::Tensor::F8E5M2($a) => $crate::tensor::Tensor::F8E5M2($body),
            $crate::tensor::Tensor::F8E5M2FNUZ($a) => $crate::tensor::Tensor::F8E5M2FNUZ($body),
            $crate::tensor::Tensor::F8E8M0($a) => $crate::tensor::Tensor::F8E8M0($body),
            $crate::tensor::Tensor::F4E2M1($a) => $crate::tensor::Tensor::F4E2M1($body),
            $crate::tensor::Tensor::I4($a) => $crate::tensor::Tensor::I4($body),
            $crate::tensor::Tensor::U4($a) => $crate::tensor::Tensor::U4($body),
            $crate::tensor::Tensor::I2($a) => $crate::tensor::Tensor::I2($body),
            $crate::tensor::Tensor::U2($a) => $crate::tensor::Tensor::U2($body),
        }
    };
}

/// An element type of a [`Tensor`].
///
/// Conversions go through `f64` for floats and `i64` for integers so that int64 values
/// above 2^53 survive integer-to-integer casts.
pub trait Elem:
    Copy + Default + PartialEq + PartialOrd + std::fmt::Debug + Send + Sync + 'static
{
    const DTYPE: DType;
    fn to_f64(self) -> f64;
    /// Float to this type: ints truncate toward zero and saturate (NaN → 0), bool is `!= 0`.
    fn from_f64(v: f64) -> Self;
    fn to_i64(self) -> i64;
    /// Integer to this type, wrapping like a C cast; bool is `!= 0`.
    fn from_i64(v: i64) -> Self;
    fn wrap(a: ArrayD<Self>) -> Tensor;
    fn view(t: &Tensor) -> Option<&ArrayD<Self>>;
}

macro_rules! impl_elem_num {
    ($t:ty, $variant:ident) => {
        impl Elem for $t {
            const DTYPE: DType = DType::$variant;
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            fn to_i64(self) -> i64 {
                self as i64
            }
            fn from_i64(v: i64) -> Self {
                v as $t
            }
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
        }
    };
}
impl_elem_num!(f32, F32);
impl_elem_num!(f64, F64);
impl_elem_num!(i8, I8);
impl_elem_num!(u8, U8);
impl_elem_num!(i32, I32);
impl_elem_num!(i64, I64);
impl_elem_num!(i16, I16);
impl_elem_num!(u16, U16);
impl_elem_num!(u32, U32);
impl_elem_num!(u64, U64);

macro_rules! impl_elem_half {
    ($t:ty, $variant:ident) => {
        impl Elem for $t {
            const DTYPE: DType = DType::$variant;
            fn to_f64(self) -> f64 {
                self.to_f64()
            }
            fn from_f64(v: f64) -> Self {
                <$t>::from_f64(v)
            }
            fn to_i64(self) -> i64 {
                self.to_f64() as i64
            }
            fn from_i64(v: i64) -> Self {
                <$t>::from_f64(v as f64)
            }
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
        }
    };
}
impl_elem_half!(f16, F16);
impl_elem_half!(bf16, BF16);

impl Elem for bool {
    const DTYPE: DType = DType::Bool;
    fn to_f64(self) -> f64 {
        self as u8 as f64
    }
    fn from_f64(v: f64) -> Self {
        v != 0.0
    }
    fn to_i64(self) -> i64 {
        self as i64
    }
    fn from_i64(v: i64) -> Self {
        v != 0
    }
    fn wrap(a: ArrayD<Self>) -> Tensor {
        Tensor::Bool(a)
    }
    fn view(t: &Tensor) -> Option<&ArrayD<Self>> {
        if let Tensor::Bool(a) = t {
            Some(a)
        } else {
            None
        }
    }
}

fn convert<S: Elem, D: Elem>(a: &ArrayD<S>) -> ArrayD<D> {
    let floating = |d: DType| d.is_float() || d.is_minifloat();
    if floating(S::DTYPE) || floating(D::DTYPE) {
        a.mapv(|v| D::from_f64(v.to_f64()))
    } else {
        a.mapv(|v| D::from_i64(v.to_i64()))
    }
}

/// Calls `$f::<T>` with the element type `T` of `$dtype` (a runtime `DType`).
#[macro_export]
macro_rules! with_dtype {
    ($dtype:expr, $f:ident ( $($arg:expr),* )) => {
        match $dtype {
            $crate::tensor::DType::F32 => $f::<f32>($($arg),*),
            $crate::tensor::DType::F64 => $f::<f64>($($arg),*),
            $crate::tensor::DType::F16 => $f::<half::f16>($($arg),*),
            $crate::tensor::DType::BF16 => $f::<half::bf16>($($arg),*),
            $crate::tensor::DType::I8 => $f::<i8>($($arg),*),
            $crate::tensor::DType::U8 => $f::<u8>($($arg),*),
            $crate::tensor::DType::I32 => $f::<i32>($($arg),*),
            $crate::tensor::DType::I64 => $f::<i64>($($arg),*),
            $crate::tensor::DType::Bool => $f::<bool>($($arg),*),
            $crate::tensor::DType::I16 => $f::<i16>($($arg),*),
            $crate::tensor::DType::U16 => $f::<u16>($($arg),*),
            $crate::tensor::DType::U32 => $f::<u32>($($arg),*),
            $crate::tensor::DType::U64 => $f::<u64>($($arg),*),
            $crate::tensor::DType::F8E4M3FN => $f::<$crate::tensor::lowbit::F8E4M3FN>($($arg),*),
            $crate::tensor::DType::F8E4M3FNUZ => $f::<$crate::tensor::lowbit::F8E4M3FNUZ>($($arg),*),
            $crate::tensor::DType::F8E5M2 => $f::<$crate::tensor::lowbit::F8E5M2>($($arg),*),
            $crate::tensor::DType::F8E5M2FNUZ => $f::<$crate::tensor::lowbit::F8E5M2FNUZ>($($arg),*),
            $crate::tensor::DType::F8E8M0 => $f::<$crate::tensor::lowbit::F8E8M0>($($arg),*),
            $crate::tensor::DType::F4E2M1 => $f::<$crate::tensor::lowbit::F4E2M1>($($arg),*),
            $crate::tensor::DType::I4 => $f::<$crate::tensor::lowbit::I4>($($arg),*),
            $crate::tensor::DType::U4 => $f::<$crate::tensor::lowbit::U4>($($arg),*),
            $crate::tensor::DType::I2 => $f::<$crate::tensor::lowbit::I2>($($arg),*),
            $crate::tensor::DType::U2 => $f::<$crate::tensor::lowbit::U2>($($arg),*),
        }
    };
}

fn zeros_of<T: Elem>(shape: &[usize]) -> Tensor {
    T::wrap(ArrayD::from_elem(IxDyn(shape), T::default()))
}

fn from_f64s<T: Elem>(shape: &[usize], v: &[f64]) -> Result<Tensor, String> {
    Tensor::from_vec(shape, v.iter().map(|&x| T::from_f64(x)).collect::<Vec<T>>())
}

fn from_i64s<T: Elem>(shape: &[usize], v: &[i64]) -> Result<Tensor, String> {
    Tensor::from_vec(shape, v.iter().map(|&x| T::from_i64(x)).collect::<Vec<T>>())
}

fn cast_to<D: Elem>(t: &Tensor) -> Tensor {
    D::wrap(match_tensor!(t, a => convert::<_, D>(a)))
}

impl Tensor {
    /// A tensor of `shape` from row-major `data`.
    pub fn from_vec<T: Elem>(shape: &[usize], data: Vec<T>) -> Result<Tensor, String> {
        let n: usize = shape.iter().product();
        if n != data.len() {
            return Err(format!(
                "{} values do not fill shape {shape:?} ({n} elements)",
                data.len()
            ));
        }
        Ok(T::wrap(
            ArrayD::from_shape_vec(IxDyn(shape), data).map_err(|e| e.to_string())?,
        ))
    }

    /// A rank-0 tensor.
    pub fn scalar<T: Elem>(v: T) -> Tensor {
        T::wrap(ArrayD::from_elem(IxDyn(&[]), v))
    }

    pub fn zeros(dtype: DType, shape: &[usize]) -> Tensor {
        with_dtype!(dtype, zeros_of(shape))
    }

    /// Values given as f64, converted to `dtype` (ints truncate, bool is `!= 0`).
    pub fn from_f64s(dtype: DType, shape: &[usize], v: &[f64]) -> Result<Tensor, String> {
        with_dtype!(dtype, from_f64s(shape, v))
    }

    /// Values given as i64, converted to `dtype`.
    pub fn from_i64s(dtype: DType, shape: &[usize], v: &[i64]) -> Result<Tensor, String> {
        with_dtype!(dtype, from_i64s(shape, v))
    }

    pub fn dtype(&self) -> DType {
        match self {
            Tensor::F32(_) => DType::F32,
            Tensor::F64(_) => DType::F64,
            Tensor::F16(_) => DType::F16,
            Tensor::BF16(_) => DType::BF16,
            Tensor::I8(_) => DType::I8,
            Tensor::U8(_) => DType::U8,
            Tensor::I32(_) => DType::I32,
            Tensor::I64(_) => DType::I64,
            Tensor::Bool(_) => DType::Bool,
            Tensor::I16(_) => DType::I16,
            Tensor::U16(_) => DType::U16,
            Tensor::U32(_) => DType::U32,
            Tensor::U64(_) => DType::U64,
            Tensor::F8E4M3FN(_) => DType::F8E4M3FN,
            Tensor::F8E4M3FNUZ(_) => DType::F8E4M3FNUZ,
            Tensor::F8E5M2(_) => DType::F8E5M2,
            Tensor::F8E5M2FNUZ(_) => DType::F8E5M2FNUZ,
            Tensor::F8E8M0(_) => DType::F8E8M0,
            Tensor::F4E2M1(_) => DType::F4E2M1,
            Tensor::I4(_) => DType::I4,
            Tensor::U4(_) => DType::U4,
            Tensor::I2(_) => DType::I2,
            Tensor::U2(_) => DType::U2,
        }
    }

    pub fn shape(&self) -> &[usize] {
        match_tensor!(self, a => a.shape())
    }

    pub fn rank(&self) -> usize {
        self.shape().len()
    }

    pub fn len(&self) -> usize {
        self.shape().iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The inner array, if the dtype is `T`.
    pub(crate) fn view<T: Elem>(&self) -> Option<&ArrayD<T>> {
        T::view(self)
    }

    /// The inner array of dtype `T`, or an error naming both dtypes.
    pub(crate) fn expect<T: Elem>(&self) -> Result<&ArrayD<T>, String> {
        T::view(self).ok_or_else(|| format!("expected a {} tensor, got {}", T::DTYPE, self.dtype()))
    }

    /// Converted to `dtype` (ONNX `Cast` semantics: float→int truncates, →bool is `!= 0`).
    pub fn cast(&self, dtype: DType) -> Tensor {
        if dtype == self.dtype() {
            return self.clone();
        }
        with_dtype!(dtype, cast_to(self))
    }

    /// All values in row-major order as f64.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        match_tensor!(self, a => a.iter().map(|v| v.to_f64()).collect())
    }

    /// All values in row-major order as i64 (floats truncate).
    pub fn to_i64_vec(&self) -> Vec<i64> {
        match_tensor!(self, a => a.iter().map(|v| v.to_i64()).collect())
    }

    /// The raw little-endian bytes, row-major.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len() * self.dtype().size_in_bytes());
        match self {
            Tensor::F32(a) => a.iter().for_each(|v| out.extend(v.to_le_bytes())),
            Tensor::F64(a) => a.iter().for_each(|v| out.extend(v.to_le_bytes())),
            Tensor::F16(a) => a.iter().for_each(|v| out.extend(v.to_le_bytes())),
            Tensor::BF16(a) => a.iter().for_each(|v| out.extend(v.to_le_bytes())),
            Tensor::I8(a) => a.iter().for_each(|v| out.extend(v.to_le_bytes())),
            Tensor::U8(a) => out.extend(a.iter()),
            Tensor::I32(a) => a.iter().for_each(|v| out.extend(v.to_le_bytes())),
            Tensor::I64(a) => a.iter().for_each(|v| out.extend(v.to_le_bytes())),
            Tensor::Bool(a) => a.iter().for_each(|&v| out.push(v as u8)),
            Tensor::I16(a) => a.iter().for_each(|v| out.extend(v.to_le_bytes())),
            Tensor::U16(a) => a.iter().for_each(|v| out.extend(v.to_le_bytes())),
            Tensor::U32(a) => a.iter().for_each(|v| out.extend(v.to_le_bytes())),
            Tensor::U64(a) => a.iter().for_each(|v| out.extend(v.to_le_bytes())),
            Tensor::F8E4M3FN(a) => out.extend(a.iter().map(|v| v.0)),
            Tensor::F8E4M3FNUZ(a) => out.extend(a.iter().map(|v| v.0)),
            Tensor::F8E5M2(a) => out.extend(a.iter().map(|v| v.0)),
            Tensor::F8E5M2FNUZ(a) => out.extend(a.iter().map(|v| v.0)),
            Tensor::F8E8M0(a) => out.extend(a.iter().map(|v| v.0)),
            Tensor::F4E2M1(a) => out.extend(a.iter().map(|v| v.0)),
            // The signed sub-byte integers as ml_dtypes stores them: the low bits only.
            Tensor::I4(a) => out.extend(a.iter().map(|v| v.0 as u8 & 0x0F)),
            Tensor::U4(a) => out.extend(a.iter().map(|v| v.0)),
            Tensor::I2(a) => out.extend(a.iter().map(|v| v.0 as u8 & 0x03)),
            Tensor::U2(a) => out.extend(a.iter().map(|v| v.0)),
        }
        out
    }

    /// A tensor from raw little-endian bytes, row-major.
    pub fn from_le_bytes(dtype: DType, shape: &[usize], bytes: &[u8]) -> Result<Tensor, String> {
        let n: usize = shape.iter().product();
        let want = n * dtype.size_in_bytes();
        if bytes.len() != want {
            return Err(format!(
                "{} bytes given, {dtype}{shape:?} needs {want}",
                bytes.len()
            ));
        }
        macro_rules! decode {
            ($t:ty, $w:expr) => {
                bytes
                    .chunks_exact($w)
                    .map(|c| <$t>::from_le_bytes(c.try_into().unwrap()))
                    .collect::<Vec<$t>>()
            };
        }
        match dtype {
            DType::F32 => Tensor::from_vec(shape, decode!(f32, 4)),
            DType::F64 => Tensor::from_vec(shape, decode!(f64, 8)),
            DType::F16 => Tensor::from_vec(shape, decode!(f16, 2)),
            DType::BF16 => Tensor::from_vec(shape, decode!(bf16, 2)),
            DType::I8 => Tensor::from_vec(shape, decode!(i8, 1)),
            DType::U8 => Tensor::from_vec(shape, bytes.to_vec()),
            DType::I32 => Tensor::from_vec(shape, decode!(i32, 4)),
            DType::I64 => Tensor::from_vec(shape, decode!(i64, 8)),
            DType::I16 => Tensor::from_vec(shape, decode!(i16, 2)),
            DType::U16 => Tensor::from_vec(shape, decode!(u16, 2)),
            DType::U32 => Tensor::from_vec(shape, decode!(u32, 4)),
            DType::U64 => Tensor::from_vec(shape, decode!(u64, 8)),
            DType::Bool => {
                if let Some(b) = bytes.iter().find(|&&b| b > 1) {
                    return Err(format!("byte {b} is not a bool (0 or 1)"));
                }
                Tensor::from_vec(shape, bytes.iter().map(|&b| b == 1).collect::<Vec<_>>())
            }
            _ => {
                // A low-bit dtype: one byte per element.
                let bytes = bytes
                    .iter()
                    .map(|&b| lowbit::element_byte(dtype, b))
                    .collect::<Result<Vec<u8>, String>>()?;
                macro_rules! bytes_as {
                    ($t:ident) => {
                        Tensor::from_vec(shape, bytes.iter().map(|&b| $t(b as _)).collect())
                    };
                }
                match dtype {
                    DType::F8E4M3FN => bytes_as!(F8E4M3FN),
                    DType::F8E4M3FNUZ => bytes_as!(F8E4M3FNUZ),
                    DType::F8E5M2 => bytes_as!(F8E5M2),
                    DType::F8E5M2FNUZ => bytes_as!(F8E5M2FNUZ),
                    DType::F8E8M0 => bytes_as!(F8E8M0),
                    DType::F4E2M1 => bytes_as!(F4E2M1),
                    DType::I4 => bytes_as!(I4),
                    DType::U4 => bytes_as!(U4),
                    DType::I2 => bytes_as!(I2),
                    _ => bytes_as!(U2),
                }
            }
        }
    }

    /// Same dtype and shape, and every value within `atol + rtol * |expected|`
    /// (NaN matches NaN, equal infinities match). Err says where the first miss is.
    pub fn check_close(&self, expected: &Tensor, atol: f64, rtol: f64) -> Result<(), String> {
        if self.dtype() != expected.dtype() || self.shape() != expected.shape() {
            return Err(format!(
                "got {}{:?}, expected {}{:?}",
                self.dtype(),
                self.shape(),
                expected.dtype(),
                expected.shape()
            ));
        }
        let (a, b) = (self.to_f64_vec(), expected.to_f64_vec());
        for (i, (&x, &y)) in a.iter().zip(&b).enumerate() {
            let ok = (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= atol + rtol * y.abs();
            if !ok {
                return Err(format!(
                    "value {i} (flat index) is {x}, expected {y} (atol {atol}, rtol {rtol})"
                ));
            }
        }
        Ok(())
    }
}

/// Arrays in the three computation domains the reference kernels use: every float dtype
/// computes in f64 (then rounds once to its own type), every integer dtype in i64 (then
/// wraps like a C cast), bool as bool.
impl Tensor {
    pub fn to_f64_array(&self) -> ArrayD<f64> {
        match_tensor!(self, a => a.mapv(|v| v.to_f64()))
    }

    pub(crate) fn to_i64_array(&self) -> ArrayD<i64> {
        match_tensor!(self, a => a.mapv(|v| v.to_i64()))
    }

    pub(crate) fn to_bool_array(&self) -> ArrayD<bool> {
        match_tensor!(self, a => a.mapv(|v| v.to_f64() != 0.0))
    }

    /// `a` converted to `dtype`.
    pub fn from_f64_array(dtype: DType, a: ArrayD<f64>) -> Tensor {
        Tensor::F64(a).cast(dtype)
    }

    /// `a` converted to `dtype`.
    pub(crate) fn from_i64_array(dtype: DType, a: ArrayD<i64>) -> Tensor {
        Tensor::I64(a).cast(dtype)
    }
}
