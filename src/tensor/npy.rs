//! NumPy `.npy` files (format versions 1.0, 2.0 and 3.0) for every Kiln dtype.
//!
//! bf16 and the low-bit dtypes have no NumPy dtype of their own; Kiln writes them with
//! the descr `ml_dtypes` registers for them (`'bfloat16'`, `'float8_e4m3fn'`,
//! `'float4_e2m1fn'`, `'int4'`, ...), one byte per element as `ml_dtypes` stores them
//! (a float's bit pattern, an integer's value), and reads those back.
use std::path::Path;

use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};

const MAGIC: &[u8] = b"\x93NUMPY";

fn descr(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        DType::F16 => "<f2",
        DType::BF16 => "bfloat16",
        DType::I8 => "|i1",
        DType::U8 => "|u1",
        DType::I32 => "<i4",
        DType::I64 => "<i8",
        DType::Bool => "|b1",
        DType::I16 => "<i2",
        DType::U16 => "<u2",
        DType::U32 => "<u4",
        DType::U64 => "<u8",
        DType::F8E4M3FN => "float8_e4m3fn",
        DType::F8E4M3FNUZ => "float8_e4m3fnuz",
        DType::F8E5M2 => "float8_e5m2",
        DType::F8E5M2FNUZ => "float8_e5m2fnuz",
        DType::F8E8M0 => "float8_e8m0fnu",
        DType::F4E2M1 => "float4_e2m1fn",
        DType::I4 => "int4",
        DType::U4 => "uint4",
        DType::I2 => "int2",
        DType::U2 => "uint2",
    }
}

/// The dtype of a descr and whether its bytes are big-endian.
fn parse_descr(d: &str) -> std::result::Result<(DType, bool), String> {
    if let Some(&dtype) = DType::ALL
        .iter()
        .find(|&&t| !descr(t).starts_with(['<', '|']) && descr(t) == d)
    {
        return Ok((dtype, false));
    }
    let (order, code) = d.split_at(d.len().min(1));
    let big = match order {
        "<" | "|" | "=" => false,
        ">" => true,
        _ => return Err(format!("unsupported dtype descr '{d}'")),
    };
    let dtype = match code {
        "f4" => DType::F32,
        "f8" => DType::F64,
        "f2" => DType::F16,
        "i1" => DType::I8,
        "u1" => DType::U8,
        "i4" => DType::I32,
        "i8" => DType::I64,
        "b1" => DType::Bool,
        "i2" => DType::I16,
        "u2" => DType::U16,
        "u4" => DType::U32,
        "u8" => DType::U64,
        _ => {
            return Err(format!(
                "unsupported dtype descr '{d}' (Kiln reads f2/f4/f8, i1/i2/i4/i8, u1/u2/u4/u8, b1, and ml_dtypes' bfloat16, float8_*, float4_e2m1fn, int4, uint4, int2, uint2)"
            ))
        }
    };
    Ok((dtype, big))
}

/// Encodes `t` as `.npy` bytes (format 1.0, or 2.0 when the header is too long).
pub(crate) fn to_bytes(t: &Tensor) -> Vec<u8> {
    let dims: Vec<String> = t.shape().iter().map(|d| d.to_string()).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {shape}, }}",
        descr(t.dtype())
    );
    // Pad with spaces so that the data starts on a 64-byte boundary; end with '\n'.
    let (version, len_bytes) = if header.len() + 1 + MAGIC.len() + 4 <= 65535 {
        (1u8, 2)
    } else {
        (2u8, 4)
    };
    let prefix = MAGIC.len() + 2 + len_bytes;
    let total = (prefix + header.len() + 1).div_ceil(64) * 64;
    header.push_str(&" ".repeat(total - prefix - header.len() - 1));
    header.push('\n');
    let mut out = Vec::with_capacity(total + t.len() * t.dtype().size_in_bytes());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[version, 0]);
    if version == 1 {
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    }
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&t.to_le_bytes());
    out
}

/// Decodes `.npy` bytes.
pub(crate) fn from_bytes(bytes: &[u8]) -> std::result::Result<Tensor, String> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err("not a .npy file (bad magic)".into());
    }
    let (hlen, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize,
            12,
        ),
        v => return Err(format!("unsupported .npy format version {v}")),
    };
    let header = bytes
        .get(start..start + hlen)
        .ok_or("truncated .npy header")?;
    let header = std::str::from_utf8(header).map_err(|_| "the .npy header is not text")?;
    let descr = dict_value(header, "descr")?;
    let descr = descr.trim_matches(|c| c == '\'' || c == '"');
    let (dtype, big_endian) = parse_descr(descr)?;
    let fortran = match dict_value(header, "fortran_order")? {
        "True" => true,
        "False" => false,
        v => return Err(format!("bad fortran_order '{v}'")),
    };
    let shape_text = dict_value(header, "shape")?;
    let shape: Vec<usize> = shape_text
        .trim_matches(|c| c == '(' || c == ')')
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<usize>()
                .map_err(|_| format!("bad shape {shape_text}"))
        })
        .collect::<std::result::Result<_, _>>()?;
    let data = &bytes[start + hlen..];
    let width = dtype.size_in_bytes();
    let n: usize = shape.iter().product();
    if data.len() != n * width {
        return Err(format!(
            "the .npy data has {} bytes, {dtype}{shape:?} needs {}",
            data.len(),
            n * width
        ));
    }
    let mut data = data.to_vec();
    if big_endian {
        data.chunks_exact_mut(width).for_each(|c| c.reverse());
    }
    if !fortran {
        return Tensor::from_le_bytes(dtype, &shape, &data);
    }
    // Column-major: read with the shape reversed, then reverse the axes.
    let rev: Vec<usize> = shape.iter().rev().copied().collect();
    let t = Tensor::from_le_bytes(dtype, &rev, &data)?;
    Ok(crate::map_tensor!(t, a => a.reversed_axes().as_standard_layout().into_owned()))
}

/// The text of `key`'s value in the header's Python dict literal.
fn dict_value<'h>(header: &'h str, key: &str) -> std::result::Result<&'h str, String> {
    let pat = format!("'{key}':");
    let at = header
        .find(&pat)
        .ok_or_else(|| format!("the .npy header has no '{key}'"))?;
    let rest = header[at + pat.len()..].trim_start();
    let end = if rest.starts_with('(') {
        rest.find(')').map(|i| i + 1)
    } else {
        rest.find([',', '}'])
    }
    .ok_or_else(|| format!("unterminated '{key}' in the .npy header"))?;
    Ok(rest[..end].trim())
}

pub fn read(path: &Path) -> Result<Tensor> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    from_bytes(&bytes).map_err(|e| Error::io(path, e))
}

pub fn write(path: &Path, t: &Tensor) -> Result<()> {
    std::fs::write(path, to_bytes(t)).map_err(|e| Error::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_round_trips() {
        for dtype in DType::ALL {
            let t = Tensor::from_f64s(dtype, &[2, 3], &[0.0, 1.0, 2.0, 3.0, 1.0, 0.0]).unwrap();
            let back = from_bytes(&to_bytes(&t)).unwrap();
            assert_eq!(back, t, "{dtype}");
            assert_eq!(
                to_bytes(&t).iter().position(|&b| b == b'\n').unwrap() % 64,
                63
            );
        }
        let s = Tensor::scalar(7i64);
        assert_eq!(from_bytes(&to_bytes(&s)).unwrap(), s);
        let e = Tensor::zeros(DType::F32, &[0, 4]);
        assert_eq!(from_bytes(&to_bytes(&e)).unwrap(), e);
    }

    #[test]
    fn fortran_order_and_big_endian_are_read() {
        let mut head = "{'descr': '>i4', 'fortran_order': True, 'shape': (2, 3), }".to_string();
        head.push('\n');
        let mut bytes = MAGIC.to_vec();
        bytes.extend([1, 0]);
        bytes.extend((head.len() as u16).to_le_bytes());
        bytes.extend(head.as_bytes());
        // Column-major [[1,2,3],[4,5,6]] is 1,4,2,5,3,6.
        for v in [1i32, 4, 2, 5, 3, 6] {
            bytes.extend(v.to_be_bytes());
        }
        let t = from_bytes(&bytes).unwrap();
        assert_eq!(
            t,
            Tensor::from_vec(&[2, 3], vec![1i32, 2, 3, 4, 5, 6]).unwrap()
        );
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(from_bytes(b"hello").is_err());
        let mut b = to_bytes(&Tensor::scalar(1.0f32));
        b.pop();
        assert!(from_bytes(&b).unwrap_err().contains("needs"));
    }
}
