//! JSON `data` arrays ↔ Triton's raw tensor layout.
//!
//! Decoding walks the (possibly nested) JSON array twice: once to count the
//! leaves, so that a shape that disagrees with the data is refused before a
//! single byte is reserved, and once to write little-endian elements.
//! Encoding streams elements straight out of the raw layout through serde,
//! without building an intermediate `serde_json::Value`.

use bytes::Bytes;
use half::{bf16, f16};
use serde::ser::{Error as _, Serialize, SerializeSeq, Serializer};
use serde_json::Value;

use crate::types::{bytes_elements, DataType};

/// Why a JSON `data` array could not be turned into a tensor. The caller
/// adds the input and model names.
#[derive(Debug, PartialEq)]
pub(crate) enum DataError {
    /// Leaf count differs from what the shape declares.
    Count { expected: usize, found: usize },
    /// A leaf of the wrong JSON type (string for INT32, float for INT8...).
    Type { index: usize, value: String },
    /// A number outside the datatype's range (300 for UINT8).
    Range { index: usize, value: String },
}

impl DataError {
    pub(crate) fn describe(&self, datatype: DataType) -> String {
        match self {
            DataError::Count { expected, found } => format!(
                "Shape does not match true shape of 'data' field: \
                 the shape declares {expected} elements, 'data' holds {found}"
            ),
            DataError::Type { index, value } => {
                let want = expected_json(datatype);
                format!("element {index} of 'data' is {value}, expected {want}")
            }
            DataError::Range { index, value } => {
                format!("element {index} of 'data' is {value}, out of range for {datatype}")
            }
        }
    }
}

fn expected_json(datatype: DataType) -> &'static str {
    match datatype {
        DataType::Bool => "a JSON boolean for BOOL",
        DataType::Bytes => "a JSON string for BYTES",
        DataType::Fp16 | DataType::Fp32 | DataType::Fp64 | DataType::Bf16 => "a JSON number",
        _ => "a JSON integer",
    }
}

/// Number of non-array leaves. Recursion depth is bounded by serde_json's
/// own nesting limit (128), so this cannot overflow the stack.
fn count_leaves(v: &Value) -> usize {
    match v {
        Value::Array(items) => items.iter().map(count_leaves).sum(),
        _ => 1,
    }
}

/// Calls `f` on every leaf in row-major order, stopping at the first error.
fn for_each_leaf<E>(v: &Value, f: &mut impl FnMut(&Value) -> Result<(), E>) -> Result<(), E> {
    match v {
        Value::Array(items) => items.iter().try_for_each(|item| for_each_leaf(item, f)),
        leaf => f(leaf),
    }
}

/// Short rendering of an offending value for an error message: a huge
/// string must not be echoed back whole.
fn show(v: &Value) -> String {
    let mut s = v.to_string();
    if s.len() > 64 {
        let mut cut = 61;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

/// Converts JSON `data` (nested or flat, row-major) into the raw layout of
/// `datatype`, checking it holds exactly `expected` elements first.
pub(crate) fn decode(
    datatype: DataType,
    data: &Value,
    expected: usize,
) -> Result<Bytes, DataError> {
    let found = count_leaves(data);
    if found != expected {
        return Err(DataError::Count { expected, found });
    }
    // `found` leaves each took at least one byte of JSON, so this capacity
    // is bounded by the body size, whatever the declared shape said.
    let capacity = match datatype.element_size() {
        Some(size) => found.saturating_mul(size),
        None => found.saturating_mul(4),
    };
    let mut out = Vec::with_capacity(capacity);
    let mut index = 0usize;
    for_each_leaf(data, &mut |v: &Value| {
        push_element(datatype, v, index, &mut out)?;
        index += 1;
        Ok(())
    })?;
    Ok(Bytes::from(out))
}

fn push_element(
    datatype: DataType,
    v: &Value,
    index: usize,
    out: &mut Vec<u8>,
) -> Result<(), DataError> {
    let type_err = || DataError::Type {
        index,
        value: show(v),
    };
    let range_err = || DataError::Range {
        index,
        value: show(v),
    };
    // An integer leaf: Err(type) when not a JSON integer at all,
    // Err(range) when an integer that does not fit.
    let signed = |min: i64, max: i64| -> Result<i64, DataError> {
        match v {
            Value::Number(n) if n.is_i64() => n
                .as_i64()
                .filter(|x| (min..=max).contains(x))
                .ok_or_else(range_err),
            Value::Number(n) if n.is_u64() => Err(range_err()),
            _ => Err(type_err()),
        }
    };
    let unsigned = |max: u64| -> Result<u64, DataError> {
        match v {
            Value::Number(n) if n.is_u64() => {
                n.as_u64().filter(|x| *x <= max).ok_or_else(range_err)
            }
            Value::Number(n) if n.is_i64() => Err(range_err()),
            _ => Err(type_err()),
        }
    };
    let float = || -> Result<f64, DataError> {
        match v {
            Value::Number(n) => n.as_f64().ok_or_else(type_err),
            _ => Err(type_err()),
        }
    };
    // A finite value that becomes infinite in a narrower float type was
    // out of range; silently sending inf to the model would hide the bug.
    let narrowed = |wide: f64, narrow_is_inf: bool| -> Result<(), DataError> {
        if wide.is_finite() && narrow_is_inf {
            Err(range_err())
        } else {
            Ok(())
        }
    };
    match datatype {
        DataType::Bool => out.push(u8::from(v.as_bool().ok_or_else(type_err)?)),
        DataType::Uint8 => out.push(unsigned(u8::MAX.into())? as u8),
        DataType::Uint16 => {
            out.extend_from_slice(&(unsigned(u16::MAX.into())? as u16).to_le_bytes())
        }
        DataType::Uint32 => {
            out.extend_from_slice(&(unsigned(u32::MAX.into())? as u32).to_le_bytes())
        }
        DataType::Uint64 => out.extend_from_slice(&unsigned(u64::MAX)?.to_le_bytes()),
        DataType::Int8 => {
            out.extend_from_slice(&(signed(i8::MIN.into(), i8::MAX.into())? as i8).to_le_bytes())
        }
        DataType::Int16 => {
            out.extend_from_slice(&(signed(i16::MIN.into(), i16::MAX.into())? as i16).to_le_bytes())
        }
        DataType::Int32 => {
            out.extend_from_slice(&(signed(i32::MIN.into(), i32::MAX.into())? as i32).to_le_bytes())
        }
        DataType::Int64 => out.extend_from_slice(&signed(i64::MIN, i64::MAX)?.to_le_bytes()),
        DataType::Fp16 => {
            let x = float()?;
            let h = f16::from_f64(x);
            narrowed(x, h.is_infinite())?;
            out.extend_from_slice(&h.to_le_bytes());
        }
        DataType::Bf16 => {
            let x = float()?;
            let h = bf16::from_f64(x);
            narrowed(x, h.is_infinite())?;
            out.extend_from_slice(&h.to_le_bytes());
        }
        DataType::Fp32 => {
            let x = float()?;
            narrowed(x, (x as f32).is_infinite())?;
            out.extend_from_slice(&(x as f32).to_le_bytes());
        }
        DataType::Fp64 => out.extend_from_slice(&float()?.to_le_bytes()),
        DataType::Bytes => {
            let s = v.as_str().ok_or_else(type_err)?;
            // A JSON string longer than 4 GiB cannot be framed.
            let len = u32::try_from(s.len()).map_err(|_| range_err())?;
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        }
    }
    Ok(())
}

/// Serializes a raw tensor as a flat JSON array. The caller must have
/// checked with [`check_layout`] that `data` is well formed; a malformed
/// buffer still fails cleanly here rather than panicking.
pub(crate) struct JsonData<'a> {
    pub datatype: DataType,
    pub data: &'a [u8],
}

/// Verifies that `data` is whole elements of `datatype` (and well-framed
/// for BYTES) and returns the element count.
pub(crate) fn check_layout(datatype: DataType, data: &[u8]) -> Result<usize, String> {
    match datatype.element_size() {
        Some(size) if data.len() % size == 0 => Ok(data.len() / size),
        Some(size) => Err(format!(
            "{} bytes is not a whole number of {datatype} elements of {size} bytes",
            data.len()
        )),
        None => Ok(bytes_elements(data)?.count()),
    }
}

macro_rules! le_chunks {
    ($seq:ident, $data:expr, $ty:ty, $conv:expr) => {{
        for c in $data.chunks_exact(std::mem::size_of::<$ty>()) {
            let mut a = [0u8; std::mem::size_of::<$ty>()];
            a.copy_from_slice(c);
            $seq.serialize_element(&$conv(<$ty>::from_le_bytes(a)))?;
        }
    }};
}

impl Serialize for JsonData<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let count = check_layout(self.datatype, self.data).map_err(S::Error::custom)?;
        let mut seq = serializer.serialize_seq(Some(count))?;
        let d = self.data;
        match self.datatype {
            DataType::Bool => le_chunks!(seq, d, u8, |x: u8| x != 0),
            DataType::Uint8 => le_chunks!(seq, d, u8, |x| x),
            DataType::Uint16 => le_chunks!(seq, d, u16, |x| x),
            DataType::Uint32 => le_chunks!(seq, d, u32, |x| x),
            DataType::Uint64 => le_chunks!(seq, d, u64, |x| x),
            DataType::Int8 => le_chunks!(seq, d, i8, |x| x),
            DataType::Int16 => le_chunks!(seq, d, i16, |x| x),
            DataType::Int32 => le_chunks!(seq, d, i32, |x| x),
            DataType::Int64 => le_chunks!(seq, d, i64, |x| x),
            // Half floats go out as their exact f32 value; serde_json writes
            // the shortest representation that round-trips.
            DataType::Fp16 => le_chunks!(seq, d, u16, |x| f16::from_bits(x).to_f32()),
            DataType::Bf16 => le_chunks!(seq, d, u16, |x| bf16::from_bits(x).to_f32()),
            DataType::Fp32 => le_chunks!(seq, d, f32, |x| x),
            DataType::Fp64 => le_chunks!(seq, d, f64, |x| x),
            DataType::Bytes => {
                // JSON strings must be Unicode: non-UTF-8 elements are sent
                // lossily (U+FFFD). Clients needing exact bytes ask for the
                // output with `binary_data: true`.
                for e in bytes_elements(d).map_err(S::Error::custom)? {
                    seq.serialize_element(&String::from_utf8_lossy(e))?;
                }
            }
        }
        seq.end()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::types::encode_bytes_elements;

    fn enc(datatype: DataType, data: &[u8]) -> String {
        serde_json::to_string(&JsonData { datatype, data }).unwrap()
    }

    #[test]
    fn nested_and_flat_data_give_the_same_bytes() {
        let nested = decode(DataType::Int32, &json!([[1, 2], [3, 4]]), 4).unwrap();
        let flat = decode(DataType::Int32, &json!([1, 2, 3, 4]), 4).unwrap();
        assert_eq!(nested, flat);
        assert_eq!(&flat[..8], &[1, 0, 0, 0, 2, 0, 0, 0]);
    }

    #[test]
    fn count_mismatch_is_reported_before_conversion() {
        let err = decode(DataType::Int32, &json!([1, "x"]), 3).unwrap_err();
        assert_eq!(
            err,
            DataError::Count {
                expected: 3,
                found: 2
            }
        );
    }

    #[test]
    fn huge_expected_count_allocates_nothing() {
        // 2**40 elements declared, two given: refused on the count alone.
        let err = decode(DataType::Fp64, &json!([1.0, 2.0]), 1 << 40).unwrap_err();
        assert!(matches!(err, DataError::Count { .. }));
    }

    #[test]
    fn bool_accepts_only_booleans() {
        assert_eq!(
            &decode(DataType::Bool, &json!([true, false]), 2).unwrap()[..],
            &[1, 0]
        );
        assert!(matches!(
            decode(DataType::Bool, &json!([1]), 1),
            Err(DataError::Type { .. })
        ));
    }

    #[test]
    fn uint8_rejects_300() {
        assert!(matches!(
            decode(DataType::Uint8, &json!([300]), 1),
            Err(DataError::Range { index: 0, .. })
        ));
    }

    #[test]
    fn uint_rejects_negative() {
        assert!(matches!(
            decode(DataType::Uint32, &json!([-1]), 1),
            Err(DataError::Range { .. })
        ));
    }

    #[test]
    fn int32_rejects_2_pow_31() {
        assert!(matches!(
            decode(DataType::Int32, &json!([1, 2147483648i64]), 2),
            Err(DataError::Range { index: 1, .. })
        ));
        assert!(decode(DataType::Int32, &json!([-2147483648i64]), 1).is_ok());
    }

    #[test]
    fn int64_rejects_u64_only_values() {
        assert!(matches!(
            decode(DataType::Int64, &json!([u64::MAX]), 1),
            Err(DataError::Range { .. })
        ));
    }

    #[test]
    fn uint64_accepts_full_range() {
        let b = decode(DataType::Uint64, &json!([u64::MAX]), 1).unwrap();
        assert_eq!(&b[..], &u64::MAX.to_le_bytes());
    }

    #[test]
    fn int_rejects_string_and_float() {
        assert!(matches!(
            decode(DataType::Int32, &json!(["1"]), 1),
            Err(DataError::Type { .. })
        ));
        assert!(matches!(
            decode(DataType::Int8, &json!([1.5]), 1),
            Err(DataError::Type { .. })
        ));
    }

    #[test]
    fn float_accepts_integers() {
        let b = decode(DataType::Fp32, &json!([1, 2.5]), 2).unwrap();
        assert_eq!(&b[..4], &1.0f32.to_le_bytes());
        assert_eq!(&b[4..], &2.5f32.to_le_bytes());
    }

    #[test]
    fn float_rejects_string() {
        assert!(matches!(
            decode(DataType::Fp64, &json!(["1.0"]), 1),
            Err(DataError::Type { .. })
        ));
    }

    #[test]
    fn fp32_rejects_overflowing_value() {
        assert!(matches!(
            decode(DataType::Fp32, &json!([1e300]), 1),
            Err(DataError::Range { .. })
        ));
    }

    #[test]
    fn fp16_and_bf16_are_converted_with_half() {
        let h = decode(DataType::Fp16, &json!([1.5]), 1).unwrap();
        assert_eq!(&h[..], &f16::from_f32(1.5).to_le_bytes());
        let b = decode(DataType::Bf16, &json!([-2.0]), 1).unwrap();
        assert_eq!(&b[..], &bf16::from_f32(-2.0).to_le_bytes());
    }

    #[test]
    fn fp16_rejects_values_above_65504() {
        assert!(matches!(
            decode(DataType::Fp16, &json!([70000.0]), 1),
            Err(DataError::Range { .. })
        ));
    }

    #[test]
    fn bytes_strings_are_length_prefixed() {
        let b = decode(DataType::Bytes, &json!(["ab", ""]), 2).unwrap();
        assert_eq!(b, encode_bytes_elements(["ab", ""]));
    }

    #[test]
    fn bytes_rejects_numbers() {
        assert!(matches!(
            decode(DataType::Bytes, &json!([1]), 1),
            Err(DataError::Type { .. })
        ));
    }

    #[test]
    fn long_offending_values_are_truncated_in_messages() {
        let long = "é".repeat(100);
        let err = decode(DataType::Int32, &json!([long]), 1).unwrap_err();
        let DataError::Type { value, .. } = err else {
            panic!("expected a type error")
        };
        assert!(value.len() <= 64 && value.ends_with("..."));
    }

    #[test]
    fn encodes_ints_and_bools() {
        let mut raw = Vec::new();
        raw.extend_from_slice(&(-1i32).to_le_bytes());
        raw.extend_from_slice(&7i32.to_le_bytes());
        assert_eq!(enc(DataType::Int32, &raw), "[-1,7]");
        assert_eq!(enc(DataType::Bool, &[1, 0]), "[true,false]");
    }

    #[test]
    fn encodes_half_floats_as_numbers() {
        let raw = f16::from_f32(0.5).to_le_bytes();
        assert_eq!(enc(DataType::Fp16, &raw), "[0.5]");
        let raw = bf16::from_f32(-3.0).to_le_bytes();
        assert_eq!(enc(DataType::Bf16, &raw), "[-3.0]");
    }

    #[test]
    fn encodes_nan_as_null() {
        assert_eq!(enc(DataType::Fp32, &f32::NAN.to_le_bytes()), "[null]");
    }

    #[test]
    fn encodes_non_utf8_bytes_lossily() {
        let raw = encode_bytes_elements([&b"ok"[..], &[0xff, b'a']]);
        assert_eq!(enc(DataType::Bytes, &raw), "[\"ok\",\"\u{fffd}a\"]");
    }

    #[test]
    fn encoding_a_partial_element_fails_without_panicking() {
        assert!(serde_json::to_string(&JsonData {
            datatype: DataType::Int32,
            data: &[1, 2, 3]
        })
        .is_err());
        assert!(serde_json::to_string(&JsonData {
            datatype: DataType::Bytes,
            data: &[9, 0, 0, 0]
        })
        .is_err());
    }
}
