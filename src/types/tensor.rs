use bytes::Bytes;

use super::{clip, show_shape, DataType, InferError};

/// A named tensor. `data` is the Triton raw layout: little-endian elements
/// in row-major order, and for `BYTES` each element as a 4-byte
/// little-endian length followed by its bytes. Every protocol's binary form
/// is this layout already, so decoding a binary body is a zero-copy slice.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub name: String,
    pub datatype: DataType,
    pub shape: Vec<i64>,
    pub data: Bytes,
}

impl Tensor {
    pub fn new(name: impl Into<String>, datatype: DataType, shape: Vec<i64>, data: Bytes) -> Self {
        Self {
            name: name.into(),
            datatype,
            shape,
            data,
        }
    }

    /// Number of elements the shape declares; `None` on a negative dim or overflow.
    pub fn element_count(&self) -> Option<usize> {
        element_count(&self.shape)
    }

    /// Checks that `data` holds exactly what `shape` and `datatype` declare.
    pub fn check_size(&self) -> Result<(), InferError> {
        let count = self.element_count().ok_or_else(|| {
            InferError::invalid(format!(
                "invalid shape {} for input '{}'",
                show_shape(&self.shape),
                clip(&self.name)
            ))
        })?;
        match self.datatype.element_size() {
            Some(size) => {
                let expected = count.checked_mul(size);
                if expected != Some(self.data.len()) {
                    return Err(InferError::invalid(format!(
                        "input '{}' has {} bytes of data, but shape {} of {} needs {}",
                        clip(&self.name),
                        self.data.len(),
                        show_shape(&self.shape),
                        self.datatype,
                        expected
                            .map_or_else(|| "more than addressable".to_string(), |e| e.to_string())
                    )));
                }
            }
            None => {
                let n = bytes_elements(&self.data)
                    .map_err(|e| InferError::invalid(format!("input '{}': {e}", clip(&self.name))))?
                    .count();
                if n != count {
                    return Err(InferError::invalid(format!(
                        "input '{}' holds {n} BYTES elements, but shape {} needs {count}",
                        clip(&self.name),
                        show_shape(&self.shape)
                    )));
                }
            }
        }
        Ok(())
    }
}

/// Product of `shape`, or `None` for a negative dim or an overflow.
pub fn element_count(shape: &[i64]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| {
        usize::try_from(d).ok().and_then(|d| acc.checked_mul(d))
    })
}

/// Iterates the elements of a length-prefixed BYTES buffer, checking its
/// framing up front: a truncated length or element is an error.
pub fn bytes_elements(data: &[u8]) -> Result<impl Iterator<Item = &[u8]> + '_, String> {
    let mut pos = 0usize;
    while pos < data.len() {
        let len_end = pos + 4;
        let Some(len_bytes) = data.get(pos..len_end) else {
            return Err(format!("truncated BYTES element length at offset {pos}"));
        };
        let len =
            u32::from_le_bytes([len_bytes[0], len_bytes[1], len_bytes[2], len_bytes[3]]) as usize;
        let end = len_end
            .checked_add(len)
            .filter(|&e| e <= data.len())
            .ok_or_else(|| {
                format!(
                    "BYTES element at offset {pos} declares {len} bytes past the end of the data"
                )
            })?;
        pos = end;
    }
    let mut pos = 0usize;
    Ok(std::iter::from_fn(move || {
        let len_bytes = data.get(pos..pos + 4)?;
        let len =
            u32::from_le_bytes([len_bytes[0], len_bytes[1], len_bytes[2], len_bytes[3]]) as usize;
        let elem = &data[pos + 4..pos + 4 + len];
        pos += 4 + len;
        Some(elem)
    }))
}

/// Serializes byte strings into the length-prefixed BYTES layout.
pub fn encode_bytes_elements<I, T>(elements: I) -> Bytes
where
    I: IntoIterator<Item = T>,
    T: AsRef<[u8]>,
{
    let mut out = Vec::new();
    for e in elements {
        let e = e.as_ref();
        out.extend_from_slice(&(e.len() as u32).to_le_bytes());
        out.extend_from_slice(e);
    }
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_elements_round_trip_including_empty_and_nul() {
        let raw = encode_bytes_elements([&b""[..], b"a\0b", b"xyz"]);
        let elems: Vec<&[u8]> = bytes_elements(&raw).unwrap().collect();
        assert_eq!(elems, vec![&b""[..], b"a\0b", b"xyz"]);
    }

    #[test]
    fn bytes_elements_rejects_truncation() {
        assert!(bytes_elements(&[1, 0, 0]).is_err());
        assert!(bytes_elements(&[5, 0, 0, 0, b'a']).is_err());
    }

    #[test]
    fn check_size_catches_mismatch() {
        let t = Tensor::new("X", DataType::Int32, vec![2, 2], Bytes::from(vec![0u8; 12]));
        assert!(t.check_size().is_err());
        let t = Tensor::new("X", DataType::Int32, vec![2, 2], Bytes::from(vec![0u8; 16]));
        assert!(t.check_size().is_ok());
        let t = Tensor::new("X", DataType::Int32, vec![1, 1 << 62], Bytes::new());
        assert!(t.check_size().is_err());
    }
}
