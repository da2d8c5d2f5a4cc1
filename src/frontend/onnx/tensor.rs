//! ONNX `TensorProto` to `Tensor`: element types, raw and typed data, external data
//! files (which must stay inside the model's folder).

use super::proto::{tensor_proto, TensorProto};
use crate::ir::text::weights::WeightsFiles;
use crate::ir::{Container, DType, TensorType};
use crate::tensor::{lowbit, Optional, Sequence, Tensor};

/// The Kiln dtype of an ONNX `TensorProto.DataType` code.
pub(crate) fn dtype(code: i32) -> Result<DType, String> {
    use tensor_proto::DataType as D;
    Ok(match D::try_from(code) {
        Ok(D::Float) => DType::F32,
        Ok(D::Double) => DType::F64,
        Ok(D::Float16) => DType::F16,
        Ok(D::Bfloat16) => DType::BF16,
        Ok(D::Int8) => DType::I8,
        Ok(D::Uint8) => DType::U8,
        Ok(D::Int32) => DType::I32,
        Ok(D::Int64) => DType::I64,
        Ok(D::Int16) => DType::I16,
        Ok(D::Uint16) => DType::U16,
        Ok(D::Uint32) => DType::U32,
        Ok(D::Uint64) => DType::U64,
        Ok(D::Bool) => DType::Bool,
        Ok(D::String) => DType::String,
        Ok(D::Float8e4m3fn) => DType::F8E4M3FN,
        Ok(D::Float8e4m3fnuz) => DType::F8E4M3FNUZ,
        Ok(D::Float8e5m2) => DType::F8E5M2,
        Ok(D::Float8e5m2fnuz) => DType::F8E5M2FNUZ,
        Ok(D::Float8e8m0) => DType::F8E8M0,
        Ok(D::Float4e2m1) => DType::F4E2M1,
        Ok(D::Int4) => DType::I4,
        Ok(D::Uint4) => DType::U4,
        Ok(D::Int2) => DType::I2,
        Ok(D::Uint2) => DType::U2,
        Ok(other) => {
            return Err(format!(
                "ONNX element type {} is not supported",
                other.as_str_name()
            ))
        }
        Err(_) => return Err(format!("unknown ONNX element type {code}")),
    })
}

/// Kiln's text name of an ONNX element type (for `Cast`'s `to`).
pub(crate) fn dtype_name(code: i64) -> Result<&'static str, String> {
    let code = i32::try_from(code).map_err(|_| format!("unknown ONNX element type {code}"))?;
    Ok(dtype(code)?.name())
}

/// The bytes of an external initializer: its range of the file named by `location`,
/// a relative path that stays inside the model's folder (each file read once per import).
fn external(t: &TensorProto, weights: &WeightsFiles) -> Result<Vec<u8>, String> {
    let get = |key: &str| {
        t.external_data
            .iter()
            .find(|e| e.key() == key)
            .map(|e| e.value().to_string())
    };
    let location = get("location").ok_or("external data without a location")?;
    let bytes = weights
        .get(&location, "the model's folder")
        .map_err(|e| format!("external data: {e}"))?;
    let offset: usize = get("offset")
        .map_or(Ok(0), |v| v.parse())
        .map_err(|_| "bad external data offset")?;
    let end = match get("length") {
        Some(v) => offset.checked_add(v.parse::<usize>().map_err(|_| "bad external data length")?),
        None => Some(bytes.len()),
    };
    match end {
        Some(end) if offset <= end && end <= bytes.len() => Ok(bytes[offset..end].to_vec()),
        _ => Err(format!(
            "external data range is outside '{location}' ({} bytes)",
            bytes.len()
        )),
    }
}

/// The tensor a `TensorProto` holds; `what` names it in errors.
pub(crate) fn tensor(t: &TensorProto, weights: &WeightsFiles) -> Result<Tensor, String> {
    let dtype = dtype(t.data_type())?;
    let shape: Vec<usize> = t
        .dims
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("dim {d} is negative")))
        .collect::<Result<_, _>>()?;
    let n = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or("too many elements")?;
    let external_data = t.data_location() == tensor_proto::DataLocation::External;
    if dtype.is_string() {
        // ONNX keeps strings in string_data only, never in raw or external bytes.
        if t.string_data.len() != n {
            return Err(format!(
                "{} strings for {n} elements of string{shape:?}",
                t.string_data.len()
            ));
        }
        let strings = t
            .string_data
            .iter()
            .enumerate()
            .map(|(i, b)| {
                String::from_utf8(b.clone()).map_err(|_| format!("string {i} is not UTF-8"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        return Tensor::from_strings(&shape, strings);
    }
    let from_bytes = |bytes: &[u8]| {
        if dtype.is_low_bit() {
            // Float8 is one byte per element; 4- and 2-bit types are packed.
            Tensor::from_le_bytes(dtype, &shape, &lowbit::unpack(dtype, bytes, n)?)
        } else {
            Tensor::from_le_bytes(dtype, &shape, bytes)
        }
    };
    if external_data || t.raw_data.is_some() {
        return if external_data {
            from_bytes(&external(t, weights)?)
        } else {
            from_bytes(t.raw_data())
        };
    }
    if dtype.is_low_bit() {
        // int32_data holds one byte per entry: a float8 code, or packed 4-/2-bit codes.
        let bytes: Vec<u8> = t.int32_data.iter().map(|&v| v as u8).collect();
        return from_bytes(&bytes);
    }
    // Typed fields: float_data for f32; int32_data for every type of 32 bits or fewer
    // (f16/bf16 as their bit patterns); int64_data; double_data.
    let check = |len: usize| {
        if len == n {
            Ok(())
        } else {
            Err(format!("{len} values for {n} elements of {dtype}{shape:?}"))
        }
    };
    match dtype {
        DType::F32 => {
            check(t.float_data.len())?;
            Tensor::from_vec(&shape, t.float_data.clone())
        }
        DType::F64 => {
            check(t.double_data.len())?;
            Tensor::from_vec(&shape, t.double_data.clone())
        }
        DType::I64 => {
            check(t.int64_data.len())?;
            Tensor::from_vec(&shape, t.int64_data.clone())
        }
        DType::U32 | DType::U64 => {
            check(t.uint64_data.len())?;
            let bytes: Vec<u8> = match dtype {
                DType::U32 => t
                    .uint64_data
                    .iter()
                    .flat_map(|&v| (v as u32).to_le_bytes())
                    .collect(),
                _ => t
                    .uint64_data
                    .iter()
                    .flat_map(|&v| v.to_le_bytes())
                    .collect(),
            };
            Tensor::from_le_bytes(dtype, &shape, &bytes)
        }
        DType::F16 | DType::BF16 => {
            check(t.int32_data.len())?;
            let bytes: Vec<u8> = t
                .int32_data
                .iter()
                .flat_map(|&v| (v as u16).to_le_bytes())
                .collect();
            Tensor::from_le_bytes(dtype, &shape, &bytes)
        }
        _ => {
            check(t.int32_data.len())?;
            let v: Vec<i64> = t.int32_data.iter().map(|&v| v as i64).collect();
            Tensor::from_i64s(dtype, &shape, &v)
        }
    }
}

/// ONNX's `SequenceProto` (from `onnx-data.proto`, which `onnx.proto` does not include):
/// the fields Kiln reads.
#[derive(Clone, PartialEq, prost::Message)]
struct SequenceProto {
    #[prost(message, repeated, tag = "3")]
    tensor_values: Vec<TensorProto>,
    #[prost(message, repeated, tag = "5")]
    sequence_values: Vec<SequenceProto>,
    #[prost(message, repeated, tag = "7")]
    optional_values: Vec<OptionalProto>,
}

/// ONNX's `OptionalProto`: the fields Kiln reads.
#[derive(Clone, PartialEq, prost::Message)]
struct OptionalProto {
    /// 0 (undefined) for an empty optional.
    #[prost(int32, optional, tag = "2")]
    elem_type: Option<i32>,
    #[prost(message, optional, tag = "3")]
    tensor_value: Option<TensorProto>,
    #[prost(message, optional, boxed, tag = "5")]
    sequence_value: Option<Box<SequenceProto>>,
    #[prost(message, optional, boxed, tag = "7")]
    optional_value: Option<Box<OptionalProto>>,
}

/// A serialized value of type `ty`: a `TensorProto`, `SequenceProto` or `OptionalProto`
/// (the `.pb` files of the ONNX test suites), checked against the type's containers.
pub(crate) fn value_pb(bytes: &[u8], ty: &TensorType) -> Result<Tensor, String> {
    use prost::Message;
    match ty.container() {
        None => {
            let t = TensorProto::decode(bytes).map_err(|e| format!("not a TensorProto: {e}"))?;
            tensor(&t, &WeightsFiles::new(None))
        }
        Some(Container::Seq) => {
            let s =
                SequenceProto::decode(bytes).map_err(|e| format!("not a SequenceProto: {e}"))?;
            sequence_value(&s, ty)
        }
        Some(Container::Opt) => {
            let o =
                OptionalProto::decode(bytes).map_err(|e| format!("not an OptionalProto: {e}"))?;
            let has_value = o.tensor_value.is_some()
                || o.sequence_value.is_some()
                || o.optional_value.is_some();
            // The ONNX test suites store a full optional as its value's own proto (which
            // decodes as an OptionalProto with a nonzero elem_type and no value).
            if !has_value && o.elem_type.unwrap_or(0) != 0 {
                let inner = ty.unwrapped();
                let value = value_pb(bytes, &inner)?;
                return Ok(Tensor::Optional(Optional {
                    dtype: ty.dtype,
                    inner: inner.containers,
                    value: Some(Box::new(value)),
                }));
            }
            optional_value(&o, ty)
        }
    }
}

fn sequence_value(s: &SequenceProto, ty: &TensorType) -> Result<Tensor, String> {
    let item_ty = ty.unwrapped();
    let items = match item_ty.container() {
        None => s
            .tensor_values
            .iter()
            .map(|t| tensor(t, &WeightsFiles::new(None)))
            .collect::<Result<Vec<_>, _>>()?,
        Some(Container::Seq) => s
            .sequence_values
            .iter()
            .map(|v| sequence_value(v, &item_ty))
            .collect::<Result<Vec<_>, _>>()?,
        Some(Container::Opt) => s
            .optional_values
            .iter()
            .map(|v| optional_value(v, &item_ty))
            .collect::<Result<Vec<_>, _>>()?,
    };
    if let Some(bad) = items.iter().find(|t| t.dtype() != ty.dtype) {
        return Err(format!(
            "a sequence of {} holds a {}",
            ty.dtype,
            bad.kind_name()
        ));
    }
    Ok(Tensor::Sequence(Sequence {
        dtype: ty.dtype,
        inner: item_ty.containers,
        items,
    }))
}

fn optional_value(o: &OptionalProto, ty: &TensorType) -> Result<Tensor, String> {
    let inner_ty = ty.unwrapped();
    let value = match inner_ty.container() {
        None => o
            .tensor_value
            .as_ref()
            .map(|t| tensor(t, &WeightsFiles::new(None)))
            .transpose()?,
        Some(Container::Seq) => o
            .sequence_value
            .as_deref()
            .map(|s| sequence_value(s, &inner_ty))
            .transpose()?,
        Some(Container::Opt) => o
            .optional_value
            .as_deref()
            .map(|v| optional_value(v, &inner_ty))
            .transpose()?,
    };
    if let Some(v) = &value {
        if v.dtype() != ty.dtype {
            return Err(format!("an {ty} holds a {}", v.kind_name()));
        }
    }
    Ok(Tensor::Optional(Optional {
        dtype: ty.dtype,
        inner: inner_ty.containers,
        value: value.map(Box::new),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::lowbit::{F8E5M2, I4, U2};

    fn proto(code: tensor_proto::DataType, dims: &[i64]) -> TensorProto {
        TensorProto {
            data_type: Some(code as i32),
            dims: dims.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn low_bit_tensors_unpack_from_raw_and_int32_data() {
        use tensor_proto::DataType as D;
        // int4 [1, -2, 7]: low nibble first, the odd element padded.
        let mut t = proto(D::Int4, &[3]);
        t.raw_data = Some(vec![0xE1u8, 0x07].into());
        let want = Tensor::from_vec(&[3], vec![I4(1), I4(-2), I4(7)]).unwrap();
        assert_eq!(tensor(&t, &WeightsFiles::new(None)).unwrap(), want);
        let mut t = proto(D::Int4, &[3]);
        t.int32_data = vec![0xE1, 0x07];
        assert_eq!(tensor(&t, &WeightsFiles::new(None)).unwrap(), want);
        // uint2: four to a byte.
        let mut t = proto(D::Uint2, &[5]);
        t.raw_data = Some(vec![0b1001_0011u8, 0b01].into());
        let want: Vec<U2> = [3, 0, 1, 2, 1].map(U2).to_vec();
        assert_eq!(
            tensor(&t, &WeightsFiles::new(None)).unwrap(),
            Tensor::from_vec(&[5], want).unwrap()
        );
        // float8: one code per byte (0x3C is 1.0 in e5m2).
        let mut t = proto(D::Float8e5m2, &[2]);
        t.int32_data = vec![0x3C, 0xBC];
        let got = tensor(&t, &WeightsFiles::new(None)).unwrap();
        assert_eq!(
            got,
            Tensor::from_vec(&[2], vec![F8E5M2(0x3C), F8E5M2(0xBC)]).unwrap()
        );
        assert_eq!(got.to_f64_vec(), vec![1.0, -1.0]);
        // A short buffer names what it needed.
        let mut t = proto(D::Uint4, &[5]);
        t.raw_data = Some(vec![0u8, 0].into());
        let e = tensor(&t, &WeightsFiles::new(None)).unwrap_err();
        assert!(
            e.contains("2 bytes given, 5 elements of u4 pack into 3"),
            "{e}"
        );
    }
}
