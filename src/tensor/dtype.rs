//! Element types. A leaf: `tensor` and `ir` both build on it.
use std::fmt;
use std::str::FromStr;

/// The element types Kiln knows. f16/bf16 values are `half::f16`/`half::bf16`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F64,
    F16,
    BF16,
    I8,
    U8,
    I32,
    I64,
    Bool,
    I16,
    U16,
    U32,
    U64,
    /// UTF-8 text; not numeric, so it has no arena representation (a host object).
    String,
}

impl DType {
    /// Every dtype; the position is the C ABI's `kiln_dtype` code, so new ones go last.
    pub const ALL: [DType; 14] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::U8,
        DType::I32,
        DType::I64,
        DType::Bool,
        DType::I16,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::String,
    ];

    /// The spelling used by the text format and the CLI.
    pub(crate) fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Bool => "bool",
            DType::I16 => "i16",
            DType::U16 => "u16",
            DType::U32 => "u32",
            DType::U64 => "u64",
            DType::String => "string",
        }
    }

    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F64 | DType::I64 | DType::U64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::I8 | DType::U8 | DType::Bool => 1,
            // Strings are host objects, never arena bytes (see `is_string`).
            DType::String => 0,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    pub fn is_int(self) -> bool {
        matches!(
            self,
            DType::I8
                | DType::U8
                | DType::I16
                | DType::U16
                | DType::I32
                | DType::U32
                | DType::I64
                | DType::U64
        )
    }

    pub(crate) fn is_signed(self) -> bool {
        !matches!(
            self,
            DType::U8 | DType::U16 | DType::U32 | DType::U64 | DType::Bool | DType::String
        )
    }

    /// Text: a host object with no byte layout, so no kernel or arena buffer takes it.
    pub fn is_string(self) -> bool {
        self == DType::String
    }

    /// Numeric: float or integer (not bool).
    pub(crate) fn is_numeric(self) -> bool {
        self.is_float() || self.is_int()
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<DType, String> {
        DType::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| {
                format!("unknown dtype '{s}' (expected one of f32, f64, f16, bf16, i8, u8, i16, u16, i32, u32, i64, u64, bool, string)")
            })
    }
}
