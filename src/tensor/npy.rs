//! NumPy `.npy` files (format versions 1.0, 2.0 and 3.0) for every Kiln dtype.
//!
//! Strings are NumPy unicode arrays (`<U<n>`: UTF-32LE, `n` code points per element,
//! shorter ones padded with NUL), the width being the longest element's.
//!
//! bf16 and the low-bit dtypes have no NumPy dtype of their own; Kiln writes them with
//! the descr `ml_dtypes` registers for them (`'bfloat16'`, `'float8_e4m3fn'`,
//! `'float4_e2m1fn'`, `'int4'`, ...), one byte per element as `ml_dtypes` stores them
//! (a float's bit pattern, an integer's low bits), and reads those back.
use std::path::Path;

use crate::error::{Error, Result};
use crate::tensor::{Container, DType, Optional, Sequence, Tensor};

const MAGIC: &[u8] = b"\x93NUMPY";

fn descr(t: &Tensor) -> String {
    let name = match t {
        Tensor::String(a) => {
            let width = a.iter().map(|s| s.chars().count()).max().unwrap_or(0);
            // NumPy has no zero-width unicode dtype: '<U0' reads back as '<U1'.
            return format!("<U{}", width.max(1));
        }
        t => t.dtype(),
    };
    match name {
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        DType::F16 => "<f2",
        DType::I8 => "|i1",
        DType::U8 => "|u1",
        DType::I32 => "<i4",
        DType::I64 => "<i8",
        DType::Bool => "|b1",
        DType::I16 => "<i2",
        DType::U16 => "<u2",
        DType::U32 => "<u4",
        DType::U64 => "<u8",
        DType::String => "<U1",
        // Every other dtype has an ml_dtypes name.
        d => ml_dtypes_name(d).unwrap_or("|u1"),
    }
    .to_string()
}

/// The descr `ml_dtypes` registers for the dtypes NumPy lacks.
fn ml_dtypes_name(d: DType) -> Option<&'static str> {
    Some(match d {
        DType::BF16 => "bfloat16",
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
        _ => return None,
    })
}

/// What a descr says the data holds.
enum Layout {
    /// Fixed-width numbers of a dtype, big-endian or not.
    Numeric(DType, bool),
    /// UTF-32 strings of this many code points, big-endian or not.
    Unicode(usize, bool),
}

/// The dtype of a descr and whether its bytes are big-endian.
fn parse_descr(d: &str) -> std::result::Result<Layout, String> {
    if let Some(&dtype) = DType::ALL.iter().find(|&&t| ml_dtypes_name(t) == Some(d)) {
        return Ok(Layout::Numeric(dtype, false));
    }
    let (order, code) = d.split_at(d.len().min(1));
    let big = match order {
        "<" | "|" | "=" => false,
        ">" => true,
        _ => return Err(format!("unsupported dtype descr '{d}'")),
    };
    if let Some(width) = code.strip_prefix('U') {
        let width = width
            .parse::<usize>()
            .map_err(|_| format!("bad unicode dtype descr '{d}'"))?;
        return Ok(Layout::Unicode(width, big));
    }
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
                "unsupported dtype descr '{d}' (Kiln reads f2/f4/f8, i1/i2/i4/i8, u1/u2/u4/u8, b1, U<n>, and ml_dtypes' bfloat16, float8_*, float4_e2m1fn, int4, uint4, int2, uint2)"
            ))
        }
    };
    Ok(Layout::Numeric(dtype, big))
}

/// Fixed-width UTF-32LE: each string padded with NUL to `width` code points.
fn encode_unicode(a: &ndarray::ArrayD<String>, width: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(a.len() * width * 4);
    for s in a.iter() {
        let mut n = 0;
        for c in s.chars() {
            out.extend((c as u32).to_le_bytes());
            n += 1;
        }
        out.extend(std::iter::repeat_n(0u8, (width - n) * 4));
    }
    out
}

/// Fixed-width UTF-32 strings, trailing NULs dropped (as NumPy does).
fn decode_unicode(
    data: &[u8],
    width: usize,
    big: bool,
    shape: &[usize],
) -> std::result::Result<Tensor, String> {
    let n = shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or("the .npy shape is too large")?;
    let need = n
        .checked_mul(width)
        .and_then(|x| x.checked_mul(4))
        .ok_or("the .npy shape is too large")?;
    if data.len() != need {
        return Err(format!(
            "the .npy data has {} bytes, {n} strings of width {width} need {need}",
            data.len()
        ));
    }
    let mut strings = Vec::with_capacity(n);
    for item in data.chunks_exact(4 * width.max(1)).take(n) {
        let mut s = String::new();
        for unit in item.chunks_exact(4) {
            let bytes = [unit[0], unit[1], unit[2], unit[3]];
            let code = if big {
                u32::from_be_bytes(bytes)
            } else {
                u32::from_le_bytes(bytes)
            };
            s.push(char::from_u32(code).ok_or_else(|| {
                format!("the .npy string data holds {code:#x}, not a Unicode code point")
            })?);
        }
        strings.push(s.trim_end_matches('\0').to_string());
    }
    // Width 0: every string is empty.
    strings.resize(n, String::new());
    Tensor::from_strings(shape, strings)
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
        descr(t)
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
    match t {
        Tensor::String(a) => {
            let width = a
                .iter()
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
                .max(1);
            out.extend(encode_unicode(a, width));
        }
        t => out.extend_from_slice(&t.to_le_bytes()),
    }
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
    let layout = parse_descr(descr)?;
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
    let (dtype, big_endian) = match layout {
        Layout::Numeric(dtype, big) => (dtype, big),
        Layout::Unicode(width, big) => {
            let t = if fortran {
                let rev: Vec<usize> = shape.iter().rev().copied().collect();
                match decode_unicode(data, width, big, &rev)? {
                    Tensor::String(a) => {
                        Tensor::String(a.reversed_axes().as_standard_layout().into_owned())
                    }
                    t => t,
                }
            } else {
                decode_unicode(data, width, big, &shape)?
            };
            return Ok(t);
        }
    };
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

/// Writes a dense tensor (numeric or string); a sequence or optional is no `.npy` file
/// (see [`write_value`]).
pub fn write(path: &Path, t: &Tensor) -> Result<()> {
    if !t.is_tensor() {
        return Err(Error::io(
            path,
            format!("a {} is not a tensor: write it as a folder", t.kind_name()),
        ));
    }
    std::fs::write(path, to_bytes(t)).map_err(|e| Error::io(path, e))
}

/// Reads a value of `containers` (outermost first) around `dtype` tensors: a tensor
/// from the `.npy` file `path`; a sequence from the folder `path` holding `0.npy`,
/// `1.npy`, … (folders `0/`, `1/`, … for a sequence of sequences); a full optional as
/// its value, an empty one from an empty `path`.
pub fn read_value(path: &Path, dtype: DType, containers: &[Container]) -> Result<Tensor> {
    let Some((&outer, inner)) = containers.split_first() else {
        if path.as_os_str().is_empty() {
            return Err(Error::InvalidArgument(
                "an empty path is an absent value, but this input is not optional".into(),
            ));
        }
        let t = read(path)?;
        if t.dtype() != dtype {
            return Err(Error::io(
                path,
                format!("holds {}, expected {dtype}", t.dtype()),
            ));
        }
        return Ok(t);
    };
    match outer {
        Container::Opt => Ok(Tensor::Optional(Optional {
            dtype,
            inner: inner.to_vec(),
            value: if path.as_os_str().is_empty() {
                None
            } else {
                Some(Box::new(read_value(path, dtype, inner)?))
            },
        })),
        Container::Seq => {
            if !path.is_dir() {
                return Err(Error::io(
                    path,
                    "a sequence is a folder of 0.npy, 1.npy, ... (not found)",
                ));
            }
            let mut items = vec![];
            for k in 0usize.. {
                let item = match inner.first() {
                    Some(Container::Seq) => path.join(k.to_string()),
                    _ => path.join(format!("{k}.npy")),
                };
                if !item.exists() {
                    break;
                }
                items.push(read_value(&item, dtype, inner)?);
            }
            Ok(Tensor::Sequence(Sequence {
                dtype,
                inner: inner.to_vec(),
                items,
            }))
        }
    }
}

/// Writes `t` at `base` (a path without extension) as [`read_value`] reads it back:
/// `base.npy` for a tensor, a folder `base/` for a sequence, nothing for an empty
/// optional. Returns the paths written (a sequence's folder, not each item).
pub fn write_value(base: &Path, t: &Tensor) -> Result<Vec<std::path::PathBuf>> {
    match t {
        Tensor::Optional(o) => match &o.value {
            Some(v) => write_value(base, v),
            None => Ok(vec![]),
        },
        Tensor::Sequence(s) => {
            std::fs::create_dir_all(base).map_err(|e| Error::io(base, e))?;
            for (k, item) in s.items.iter().enumerate() {
                write_value(&base.join(k.to_string()), item)?;
            }
            Ok(vec![base.to_path_buf()])
        }
        t => {
            let mut name = base.as_os_str().to_owned();
            name.push(".npy");
            let path = std::path::PathBuf::from(name);
            write(&path, t)?;
            Ok(vec![path])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_round_trips() {
        for dtype in DType::ALL.into_iter().filter(|d| !d.is_string()) {
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
    fn strings_are_numpy_unicode() {
        let t = Tensor::from_strings(&[2], vec!["ab".into(), "ü€".into()]).unwrap();
        let bytes = to_bytes(&t);
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains("'descr': '<U2'"), "{text}");
        // 'a' then 'b', UTF-32LE, then 'ü' '€'.
        let data = &bytes[bytes.len() - 16..];
        assert_eq!(&data[..8], &[b'a', 0, 0, 0, b'b', 0, 0, 0]);
        assert_eq!(&data[12..16], &0x20acu32.to_le_bytes());
        assert_eq!(from_bytes(&bytes).unwrap(), t);
        // Shorter strings are NUL-padded and read back without the padding.
        let t = Tensor::from_strings(&[3], vec!["".into(), "x".into(), "xyz".into()]).unwrap();
        assert_eq!(from_bytes(&to_bytes(&t)).unwrap(), t);
        let empty = Tensor::from_strings(&[0], vec![]).unwrap();
        assert_eq!(from_bytes(&to_bytes(&empty)).unwrap(), empty);
        // Big-endian and a code point that is no char are read and refused.
        let mut head = "{'descr': '>U1', 'fortran_order': False, 'shape': (1,), }".to_string();
        head.push('\n');
        let mut b = MAGIC.to_vec();
        b.extend([1, 0]);
        b.extend((head.len() as u16).to_le_bytes());
        b.extend(head.as_bytes());
        let at = b.len();
        b.extend(0x41u32.to_be_bytes());
        assert_eq!(
            from_bytes(&b).unwrap(),
            Tensor::from_strings(&[1], vec!["A".into()]).unwrap()
        );
        b[at..].copy_from_slice(&0xD800u32.to_be_bytes());
        assert!(from_bytes(&b).unwrap_err().contains("not a Unicode"));
    }

    #[test]
    fn sequences_are_folders_and_empty_optionals_are_nothing() {
        let dir = std::env::temp_dir().join(format!("kiln-npy-seq-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let a = Tensor::from_vec(&[2], vec![1.0f32, 2.0]).unwrap();
        let b = Tensor::from_vec(&[1, 3], vec![3.0f32, 4.0, 5.0]).unwrap();
        let inner = Tensor::Sequence(Sequence {
            dtype: DType::F32,
            inner: vec![],
            items: vec![a.clone(), b.clone()],
        });
        let nested = Tensor::Sequence(Sequence {
            dtype: DType::F32,
            inner: vec![Container::Seq],
            items: vec![inner.clone(), inner.clone()],
        });
        let written = write_value(&dir.join("s"), &nested).unwrap();
        assert_eq!(written, vec![dir.join("s")]);
        assert!(dir.join("s/1/0.npy").is_file());
        let back = read_value(
            &dir.join("s"),
            DType::F32,
            &[Container::Seq, Container::Seq],
        );
        assert_eq!(back.unwrap(), nested);
        let empty = Tensor::Optional(Optional {
            dtype: DType::F32,
            inner: vec![Container::Seq],
            value: None,
        });
        assert!(write_value(&dir.join("o"), &empty).unwrap().is_empty());
        let read = read_value(Path::new(""), DType::F32, &[Container::Opt, Container::Seq]);
        assert_eq!(read.unwrap(), empty);
        let wrong = read_value(&dir.join("s/0/0.npy"), DType::I64, &[]).unwrap_err();
        assert!(wrong.to_string().contains("expected i64"), "{wrong}");
        assert!(read_value(Path::new(""), DType::F32, &[]).is_err());
        assert!(write(&dir.join("x.npy"), &nested).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(from_bytes(b"hello").is_err());
        let mut b = to_bytes(&Tensor::scalar(1.0f32));
        b.pop();
        assert!(from_bytes(&b).unwrap_err().contains("needs"));
    }
}
