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
mod view;

pub use dtype::DType;
use lowbit::{F4E2M1, F8E4M3FN, F8E4M3FNUZ, F8E5M2, F8E5M2FNUZ, F8E8M0, I2, I4, U2, U4};
pub use view::TensorView;

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
    /// Text. Not an [`Elem`]: the numeric dispatch macros refuse it (their error path),
    /// and shape ops move strings by moving indices (`ir::ops::util::on_string_indices`).
    String(ArrayD<String>),
    /// A sequence of values (not an array: no shape, no elements of its own).
    Sequence(Sequence),
    /// A value or nothing.
    Optional(Optional),
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

/// A sequence at run time: its items, and what an empty one still says of its type.
#[derive(Debug, Clone, PartialEq)]
pub struct Sequence {
    /// The dtype of the tensors inside.
    pub dtype: DType,
    /// The containers each item is (outermost first): none for a sequence of tensors.
    pub inner: Vec<Container>,
    pub items: Vec<Tensor>,
}

/// An optional at run time: a value or none, and what an empty one says of its type.
#[derive(Debug, Clone, PartialEq)]
pub struct Optional {
    pub dtype: DType,
    /// The containers the value is (outermost first): none for an optional tensor.
    pub inner: Vec<Container>,
    pub value: Option<Box<Tensor>>,
}

/// A container around tensors: the value kinds besides dense tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Container {
    /// An ordered list of values of one type (ONNX `sequence`).
    Seq,
    /// A value or nothing (ONNX `optional`).
    Opt,
}

impl std::fmt::Display for Container {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Container::Seq => "seq",
            Container::Opt => "opt",
        })
    }
}

/// The error the dispatch macros give for a value that has no numeric elements.
pub fn not_numeric(t: &Tensor) -> String {
    format!("a {} value has no numeric elements here", t.kind_name())
}

/// Runs `$body` with `$a` bound to the inner `&ArrayD<T>` whatever the numeric dtype; the
/// arms must all produce the same (non-tensor) type. Usually `$body` calls a generic fn.
/// A value with no numeric elements (strings) returns `Err(not_numeric(..))` from the
/// enclosing function, or runs `$fallback` with `$other` bound to it when one is given.
#[macro_export]
macro_rules! match_tensor {
    ($t:expr, $a:ident => $body:expr) => {
        $crate::match_tensor!($t, $a => $body, other => return Err(
            ::core::convert::From::from($crate::tensor::not_numeric(&other))
        ))
    };
    ($t:expr, $a:ident => $body:expr, $other:pat => $fallback:expr) => {
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
            $other => $fallback,
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
            other => {
                return Err(::core::convert::From::from($crate::tensor::not_numeric(
                    &other,
                )))
            }
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

/// Calls `$f::<T>` with the element type `T` of `$dtype` (a runtime `DType`); a dtype with
/// no [`Elem`] type (string) returns an error from the enclosing function.
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
            other => return Err(::core::convert::From::from(format!(
                "{other} is not a numeric dtype here"
            ))),
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

fn cast_to<D: Elem>(t: &Tensor) -> Result<Tensor, String> {
    Ok(D::wrap(match_tensor!(t, a => convert::<_, D>(a))))
}

/// A string's number as ONNX `Cast` reads it: decimal or scientific, `inf`/`nan` in any
/// case, optionally signed.
pub(crate) fn parse_number(s: &str) -> Option<f64> {
    let t = s.trim();
    t.parse::<f64>().ok().or_else(|| {
        let (sign, body) = match t.strip_prefix('-') {
            Some(rest) => (-1.0, rest),
            None => (1.0, t.strip_prefix('+').unwrap_or(t)),
        };
        match body.to_ascii_lowercase().as_str() {
            "inf" | "infinity" => Some(sign * f64::INFINITY),
            "nan" => Some(f64::NAN),
            _ => None,
        }
    })
}

/// A number's text as ONNX `Cast` writes it: the shortest round-trip form, `INF`, `-INF`
/// and `NaN` for the specials.
fn format_number(v: f64, float: bool) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "INF" } else { "-INF" }.into()
    } else if float {
        format!("{v}")
    } else {
        format!("{}", v as i64)
    }
}

fn to_strings<T: Elem>(a: &ArrayD<T>) -> ArrayD<String> {
    if T::DTYPE.is_float() {
        a.mapv(|v| format_number(v.to_f64(), true))
    } else if T::DTYPE == DType::Bool {
        a.mapv(|v| (v.to_i64() != 0).to_string())
    } else {
        a.mapv(|v| v.to_i64().to_string())
    }
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

    /// A string tensor of `shape` from row-major `data`.
    pub fn from_strings(shape: &[usize], data: Vec<String>) -> Result<Tensor, String> {
        Ok(Tensor::String(
            ArrayD::from_shape_vec(IxDyn(shape), data).map_err(|e| e.to_string())?,
        ))
    }

    /// A rank-0 tensor.
    pub fn scalar<T: Elem>(v: T) -> Tensor {
        T::wrap(ArrayD::from_elem(IxDyn(&[]), v))
    }

    /// Zeros (empty strings for the string dtype).
    pub fn zeros(dtype: DType, shape: &[usize]) -> Tensor {
        let zeros = || -> Result<Tensor, String> { Ok(with_dtype!(dtype, zeros_of(shape))) };
        zeros().unwrap_or_else(|_| Tensor::String(ArrayD::from_elem(IxDyn(shape), String::new())))
    }

    /// Values given as f64, converted to `dtype` (ints truncate, bool is `!= 0`).
    pub fn from_f64s(dtype: DType, shape: &[usize], v: &[f64]) -> Result<Tensor, String> {
        with_dtype!(dtype, from_f64s(shape, v))
    }

    /// Values given as i64, converted to `dtype`.
    pub fn from_i64s(dtype: DType, shape: &[usize], v: &[i64]) -> Result<Tensor, String> {
        with_dtype!(dtype, from_i64s(shape, v))
    }

    /// What the value is, for messages: `f32`, `string`, `seq<f32>`, `opt<seq<i64>>`.
    pub fn kind_name(&self) -> String {
        let cs = self.containers();
        let mut s = String::new();
        for c in &cs {
            s.push_str(&format!("{c}<"));
        }
        s.push_str(self.dtype().name());
        s.push_str(&">".repeat(cs.len()));
        s
    }

    /// The containers this value is, outermost first; none for a tensor.
    pub fn containers(&self) -> Vec<Container> {
        let (c, inner) = match self {
            Tensor::Sequence(s) => (Container::Seq, &s.inner),
            Tensor::Optional(o) => (Container::Opt, &o.inner),
            _ => return vec![],
        };
        std::iter::once(c).chain(inner.iter().copied()).collect()
    }

    /// Whether this is a dense tensor (numeric or string), not a sequence or optional.
    pub fn is_tensor(&self) -> bool {
        !matches!(self, Tensor::Sequence(_) | Tensor::Optional(_))
    }

    /// An empty sequence or optional of `containers` (outermost first) around `dtype`
    /// tensors; `None` if `containers` is empty.
    pub fn empty_container(dtype: DType, containers: &[Container]) -> Option<Tensor> {
        let (&first, inner) = containers.split_first()?;
        let inner = inner.to_vec();
        Some(match first {
            Container::Seq => Tensor::Sequence(Sequence {
                dtype,
                inner,
                items: vec![],
            }),
            Container::Opt => Tensor::Optional(Optional {
                dtype,
                inner,
                value: None,
            }),
        })
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
            Tensor::String(_) => DType::String,
            Tensor::Sequence(s) => s.dtype,
            Tensor::Optional(o) => o.dtype,
        }
    }

    pub fn shape(&self) -> &[usize] {
        match_tensor!(self, a => a.shape(), other => match other {
            Tensor::String(a) => a.shape(),
            // A container is not an array.
            _ => &[],
        })
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
    /// A string that is not a number becomes NaN (0 for integers); [`Tensor::try_cast`]
    /// refuses it instead.
    pub fn cast(&self, dtype: DType) -> Tensor {
        self.cast_with(dtype, false)
            .unwrap_or_else(|_| Tensor::zeros(dtype, self.shape()))
    }

    /// As [`Tensor::cast`], but a string that is not a number is an error naming it.
    pub fn try_cast(&self, dtype: DType) -> Result<Tensor, String> {
        self.cast_with(dtype, true)
    }

    fn cast_with(&self, dtype: DType, strict: bool) -> Result<Tensor, String> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        match self {
            Tensor::String(a) => {
                let mut bad = None;
                let v = a.mapv(|s| {
                    parse_number(&s).unwrap_or_else(|| {
                        bad.get_or_insert(s);
                        f64::NAN
                    })
                });
                if let (true, Some(s)) = (strict, bad) {
                    return Err(format!(
                        "cannot cast the string {s:?} to {dtype}: not a number"
                    ));
                }
                // Integers parse exactly, not through f64, so large int64 text survives.
                if dtype.is_int() && a.iter().all(|s| s.trim().parse::<i64>().is_ok()) {
                    let ints = a.mapv(|s| s.trim().parse::<i64>().unwrap_or(0));
                    return Tensor::I64(ints).cast_with(dtype, strict);
                }
                Tensor::F64(v).cast_with(dtype, strict)
            }
            _ if dtype == DType::String => {
                Ok(Tensor::String(match_tensor!(self, a => to_strings(a))))
            }
            _ => with_dtype!(dtype, cast_to(self)),
        }
    }

    /// The value as a numeric tensor: strings are parsed (NaN where not a number).
    fn numeric(&self) -> std::borrow::Cow<'_, Tensor> {
        match self {
            Tensor::String(_) => std::borrow::Cow::Owned(self.cast(DType::F64)),
            _ => std::borrow::Cow::Borrowed(self),
        }
    }

    /// All values in row-major order as f64.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        match_tensor!(&*self.numeric(), a => a.iter().map(|v| v.to_f64()).collect(), _ => Vec::new())
    }

    /// All values in row-major order as i64 (floats truncate).
    pub fn to_i64_vec(&self) -> Vec<i64> {
        match_tensor!(&*self.numeric(), a => a.iter().map(|v| v.to_i64()).collect(), _ => Vec::new())
    }

    /// The raw little-endian bytes, row-major; none for strings, which have no byte
    /// layout (their `size_in_bytes` is 0).
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
            Tensor::String(_) | Tensor::Sequence(_) | Tensor::Optional(_) => {}
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
            DType::String => Err("a string tensor has no byte encoding".into()),
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
        if self.containers() != expected.containers() {
            return Err(format!(
                "got {}, expected {}",
                self.kind_name(),
                expected.kind_name()
            ));
        }
        match (self, expected) {
            (Tensor::Sequence(a), Tensor::Sequence(b)) => {
                if a.items.len() != b.items.len() {
                    return Err(format!(
                        "got a sequence of {}, expected {}",
                        a.items.len(),
                        b.items.len()
                    ));
                }
                for (i, (x, y)) in a.items.iter().zip(&b.items).enumerate() {
                    x.check_close(y, atol, rtol)
                        .map_err(|e| format!("item {i}: {e}"))?;
                }
                return Ok(());
            }
            (Tensor::Optional(a), Tensor::Optional(b)) => {
                return match (&a.value, &b.value) {
                    (Some(x), Some(y)) => x.check_close(y, atol, rtol),
                    (None, None) => Ok(()),
                    (x, _) => Err(format!(
                        "got {} optional, expected {}",
                        if x.is_some() { "a full" } else { "an empty" },
                        if x.is_some() {
                            "an empty one"
                        } else {
                            "a full one"
                        }
                    )),
                };
            }
            _ => {}
        }
        if let (Tensor::String(a), Tensor::String(b)) = (self, expected) {
            return match a.iter().zip(b).position(|(x, y)| x != y) {
                Some(i) => Err(format!(
                    "value {i} (flat index) is {:?}, expected {:?}",
                    a.iter().nth(i).map_or("", |s| s),
                    b.iter().nth(i).map_or("", |s| s)
                )),
                None => Ok(()),
            };
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
        let n = self.numeric();
        match_tensor!(&*n, a => a.mapv(|v| v.to_f64()), _ => ArrayD::zeros(IxDyn(&[0])))
    }

    pub(crate) fn to_i64_array(&self) -> ArrayD<i64> {
        let n = self.numeric();
        match_tensor!(&*n, a => a.mapv(|v| v.to_i64()), _ => ArrayD::zeros(IxDyn(&[0])))
    }

    pub(crate) fn to_bool_array(&self) -> ArrayD<bool> {
        let n = self.numeric();
        match_tensor!(&*n, a => a.mapv(|v| v.to_f64() != 0.0), _ => ArrayD::from_elem(IxDyn(&[0]), false))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_cast_both_ways_like_onnx() {
        let s = Tensor::from_strings(
            &[5],
            ["1.5", "-inf", "NaN", "+2", "1e3"]
                .map(String::from)
                .to_vec(),
        )
        .unwrap();
        let f = s.try_cast(DType::F32).unwrap().to_f64_vec();
        assert_eq!(f[0], 1.5);
        assert_eq!(f[1], f64::NEG_INFINITY);
        assert!(f[2].is_nan());
        assert_eq!(&f[3..], &[2.0, 1000.0]);
        let big = Tensor::from_strings(&[1], vec!["9007199254740993".into()]).unwrap();
        assert_eq!(
            big.try_cast(DType::I64).unwrap().to_i64_vec(),
            [9007199254740993]
        );
        let bad = Tensor::from_strings(&[1], vec!["one".into()]).unwrap();
        assert!(bad.try_cast(DType::F32).unwrap_err().contains("\"one\""));
        let back = Tensor::from_vec(&[3], vec![1.5f32, f32::INFINITY, -2.0])
            .unwrap()
            .cast(DType::String);
        assert_eq!(
            back,
            Tensor::from_strings(&[3], ["1.5", "INF", "-2"].map(String::from).to_vec()).unwrap()
        );
        let ints = Tensor::from_vec(&[2], vec![-3i8, 7])
            .unwrap()
            .cast(DType::String);
        assert_eq!(
            ints,
            Tensor::from_strings(&[2], vec!["-3".into(), "7".into()]).unwrap()
        );
    }

    #[test]
    fn the_dispatch_macros_refuse_strings_with_an_error() {
        fn first(t: &Tensor) -> Result<f64, String> {
            match_tensor!(t, a => Ok(a.iter().next().map_or(0.0, |v| v.to_f64())))
        }
        fn zeros(d: DType) -> Result<Tensor, String> {
            Ok(with_dtype!(d, zeros_of(&[1])))
        }
        let s = Tensor::from_strings(&[1], vec!["x".into()]).unwrap();
        assert!(first(&s).unwrap_err().contains("string"));
        assert!(zeros(DType::String).unwrap_err().contains("string"));
        assert_eq!(s.to_le_bytes(), Vec::<u8>::new());
        assert!(Tensor::from_le_bytes(DType::String, &[0], &[]).is_err());
        assert_eq!(Tensor::zeros(DType::String, &[2]).shape(), &[2]);
    }
}
