//! `TensorView`: a dense tensor borrowed from its owner's memory, the input a run can
//! read in place (from NumPy through the Python package, or a C caller's buffer).
use super::{DType, Tensor};

/// A borrowed dense tensor: a dtype, dims, and its elements' bytes in row-major order
/// as they lie in memory (little-endian), aligned to the element size. Made by
/// [`TensorView::new`], which checks all of that, or [`Tensor::bytes_view`].
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    dtype: DType,
    shape: &'a [usize],
    bytes: &'a [u8],
}

impl<'a> TensorView<'a> {
    /// A view of `bytes` as a `dtype` tensor of `shape`: the length must be the
    /// elements' size, the address aligned to one element, and a bool byte 0 or 1.
    pub fn new(dtype: DType, shape: &'a [usize], bytes: &'a [u8]) -> Result<Self, String> {
        if dtype.is_string() {
            return Err("a string tensor has no byte encoding".into());
        }
        let size = dtype.size_in_bytes();
        let want = (shape.iter())
            .try_fold(size, |n, &d| n.checked_mul(d))
            .ok_or_else(|| format!("{dtype}{shape:?} is too many elements"))?;
        if bytes.len() != want {
            return Err(format!(
                "{} bytes given, {dtype}{shape:?} needs {want}",
                bytes.len()
            ));
        }
        if !(bytes.as_ptr() as usize).is_multiple_of(size) {
            return Err(format!("the {dtype} data is not aligned to {size} bytes"));
        }
        if dtype == DType::Bool {
            if let Some(b) = bytes.iter().find(|&&b| b > 1) {
                return Err(format!("byte {b} is not a bool (0 or 1)"));
            }
        }
        Ok(TensorView {
            dtype,
            shape,
            bytes,
        })
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn shape(&self) -> &'a [usize] {
        self.shape
    }

    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// An owned copy (low-bit codes normalized as [`Tensor::from_le_bytes`] does).
    pub fn to_tensor(&self) -> Result<Tensor, String> {
        Tensor::from_le_bytes(self.dtype, self.shape, self.bytes)
    }

    /// True when kernels may read the bytes as the tensor's own elements: every dtype
    /// but the low-bit ones, whose in-memory codes are normalized on the way in.
    pub fn readable_in_place(&self) -> bool {
        !self.dtype.is_low_bit()
    }
}

impl Tensor {
    /// A view of this tensor's elements, when they are contiguous in row-major order
    /// (a dense tensor of any dtype but strings).
    pub fn bytes_view(&self) -> Option<TensorView<'_>> {
        let bytes = crate::match_tensor!(self, a => {
            let s = a.as_slice()?;
            // SAFETY: the elements are plain bytes in memory, `size_of_val` of them.
            unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
        }, _ => return None);
        Some(TensorView {
            dtype: self.dtype(),
            shape: self.shape(),
            bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_checks_length_alignment_and_bools() {
        let data = [0u32; 4];
        // SAFETY: four u32 are 16 initialized bytes.
        let bytes = unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), 16) };
        let v = TensorView::new(DType::F32, &[2, 2], bytes).unwrap();
        assert_eq!(v.to_tensor().unwrap(), Tensor::zeros(DType::F32, &[2, 2]));
        assert!(TensorView::new(DType::F32, &[3], bytes)
            .unwrap_err()
            .contains("needs 12"));
        assert!(TensorView::new(DType::F32, &[3], &bytes[1..13])
            .unwrap_err()
            .contains("aligned"));
        assert!(TensorView::new(DType::Bool, &[2], &[1, 2])
            .unwrap_err()
            .contains("byte 2"));
        assert!(TensorView::new(DType::F32, &[usize::MAX, 2], bytes).is_err());
        assert!(TensorView::new(DType::String, &[0], &[]).is_err());
    }

    #[test]
    fn a_tensor_views_its_own_elements() {
        let t = Tensor::from_vec(&[3], vec![1i64, -2, 3]).unwrap();
        let v = t.bytes_view().unwrap();
        assert_eq!(
            (v.dtype(), v.shape(), v.bytes().len()),
            (DType::I64, &[3][..], 24)
        );
        assert_eq!(v.to_tensor().unwrap(), t);
        assert!(Tensor::from_strings(&[1], vec!["a".into()])
            .unwrap()
            .bytes_view()
            .is_none());
    }
}
