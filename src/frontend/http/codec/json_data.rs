//! JSON `data` arrays ↔ Triton's raw tensor layout.
//!
//! Decoding streams the (possibly nested) JSON array through serde's
//! visitor straight into a little-endian buffer sized once from the
//! declared shape: no tree of JSON values is ever built, so a body costs
//! about its tensor's size on top of itself. The shape is first checked
//! against the length of the `data` text (every element takes at least one
//! byte of it), so a shape declaring 2**40 elements is refused before a
//! byte is reserved, whatever the body holds.
//! Encoding streams elements straight out of the raw layout through serde,
//! without building an intermediate `serde_json::Value`.

use std::fmt;

use bytes::Bytes;
use half::{bf16, f16};
use serde::{
    de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor},
    ser::{Error as _, Serialize, SerializeSeq, Serializer},
};

use crate::types::{bytes_elements, DataType};

/// Why a JSON `data` array could not be turned into a tensor. The caller
/// adds the input and model names.
#[derive(Debug, PartialEq)]
pub(crate) enum DataError {
    /// Leaf count differs from what the shape declares.
    Count { expected: usize, found: usize },
    /// The shape declares more elements than `bytes` of JSON text can hold.
    TooShort { expected: usize, bytes: usize },
    /// A leaf of the wrong JSON type (string for INT32, float for INT8...).
    Type { index: usize, value: String },
    /// A number outside the datatype's range (300 for UINT8).
    Range { index: usize, value: String },
    /// Not JSON (only reachable when the caller hands over unchecked text).
    Syntax(String),
}

impl DataError {
    pub(crate) fn describe(&self, datatype: DataType) -> String {
        match self {
            DataError::Count { expected, found } => format!(
                "Shape does not match true shape of 'data' field: \
                 the shape declares {expected} elements, 'data' holds {found}"
            ),
            DataError::TooShort { expected, bytes } => format!(
                "Shape does not match true shape of 'data' field: \
                 the shape declares {expected} elements, more than {bytes} bytes of 'data' can hold"
            ),
            DataError::Type { index, value } => {
                let want = expected_json(datatype);
                format!("element {index} of 'data' is {value}, expected {want}")
            }
            DataError::Range { index, value } => {
                format!("element {index} of 'data' is {value}, out of range for {datatype}")
            }
            DataError::Syntax(e) => format!("'data' is not valid JSON: {e}"),
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

/// The most elements `len` bytes of JSON can hold: each takes a byte and
/// all but the last a separator (`[1,2]`), or one bare scalar (`5`).
fn most_elements(len: usize) -> usize {
    len / 2 + 1
}

/// Longest rendering of an offending value in an error message.
const SHOWN: usize = 64;

/// Short rendering of an offending string for an error message: a huge
/// string must not be echoed back whole.
fn show_str(s: &str) -> String {
    let mut cut = s.len().min(SHOWN);
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut q = serde_json::to_string(&s[..cut]).unwrap_or_default();
    if cut < s.len() || q.len() > SHOWN {
        let mut keep = q.len().min(SHOWN - 3);
        while !q.is_char_boundary(keep) {
            keep -= 1;
        }
        q.truncate(keep);
        q.push_str("...");
    }
    q
}

/// JSON rendering of a float leaf, as serde_json prints numbers.
fn show_f64(v: f64) -> String {
    serde_json::Number::from_f64(v).map_or_else(|| "null".into(), |n| n.to_string())
}

/// Converts JSON `data` text (nested or flat array, row-major; a bare
/// scalar is one element) into the raw layout of `datatype`, checking it
/// holds exactly `expected` elements. Reports the element count first
/// (a shape disagreeing with the data), then the first element of the
/// wrong type or out of range.
pub(crate) fn decode(datatype: DataType, json: &str, expected: usize) -> Result<Bytes, DataError> {
    if expected > most_elements(json.len()) {
        return Err(DataError::TooShort {
            expected,
            bytes: json.len(),
        });
    }
    // `expected` is at most half the text's length, so these capacities
    // are bounded by the body size, whatever the shape declared.
    let capacity = match datatype.element_size() {
        Some(size) => expected * size,
        // Each string's bytes are in the text; add its 4-byte length.
        None => expected * 4 + json.len(),
    };
    let mut sink = Sink {
        datatype,
        expected,
        found: 0,
        out: Vec::with_capacity(capacity),
        error: None,
    };
    let mut de = serde_json::Deserializer::from_str(json);
    Leaves(&mut sink)
        .deserialize(&mut de)
        .and_then(|()| de.end())
        .map_err(|e| DataError::Syntax(e.to_string()))?;
    if sink.found != expected {
        return Err(DataError::Count {
            expected,
            found: sink.found,
        });
    }
    match sink.error {
        Some(e) => Err(e),
        None => Ok(Bytes::from(sink.out)),
    }
}

/// Where decoded elements go. After the first bad element (or past the
/// expected count) it only counts, so the count error wins as it should.
struct Sink {
    datatype: DataType,
    expected: usize,
    found: usize,
    out: Vec<u8>,
    error: Option<DataError>,
}

/// One JSON leaf as the parser delivered it.
enum Leaf<'a> {
    Bool(bool),
    /// A non-negative integer.
    U64(u64),
    /// A negative integer.
    I64(i64),
    F64(f64),
    Str(&'a str),
    Null,
    Object,
}

impl Leaf<'_> {
    fn show(&self) -> String {
        match self {
            Leaf::Bool(b) => b.to_string(),
            Leaf::U64(v) => v.to_string(),
            Leaf::I64(v) => v.to_string(),
            Leaf::F64(v) => show_f64(*v),
            Leaf::Str(s) => show_str(s),
            Leaf::Null => "null".into(),
            Leaf::Object => "an object".into(),
        }
    }

    /// The leaf as an integer in `min..=max`: Err(Type) when it is no JSON
    /// integer, Err(Range) when it does not fit.
    fn integer(&self, min: i64, max: u64) -> Result<i128, Fault> {
        let v = match *self {
            Leaf::U64(v) => i128::from(v),
            Leaf::I64(v) => i128::from(v),
            _ => return Err(Fault::Type),
        };
        if v < i128::from(min) || v > i128::from(max) {
            return Err(Fault::Range);
        }
        Ok(v)
    }

    fn float(&self) -> Result<f64, Fault> {
        match *self {
            Leaf::U64(v) => Ok(v as f64),
            Leaf::I64(v) => Ok(v as f64),
            Leaf::F64(v) => Ok(v),
            _ => Err(Fault::Type),
        }
    }
}

enum Fault {
    Type,
    Range,
}

/// A finite value that becomes infinite in a narrower float type was out
/// of range; silently sending inf to the model would hide the bug.
fn narrowed(wide: f64, narrow_is_inf: bool) -> Result<(), Fault> {
    if wide.is_finite() && narrow_is_inf {
        Err(Fault::Range)
    } else {
        Ok(())
    }
}

impl Sink {
    fn leaf(&mut self, leaf: Leaf<'_>) {
        let index = self.found;
        self.found += 1;
        if index >= self.expected || self.error.is_some() {
            return;
        }
        if let Err(fault) = self.push(&leaf) {
            let value = leaf.show();
            self.error = Some(match fault {
                Fault::Type => DataError::Type { index, value },
                Fault::Range => DataError::Range { index, value },
            });
        }
    }

    // The `as` casts narrow values `integer` has range-checked.
    #[allow(clippy::cast_possible_truncation)]
    fn push(&mut self, leaf: &Leaf<'_>) -> Result<(), Fault> {
        let out = &mut self.out;
        match self.datatype {
            DataType::Bool => match leaf {
                Leaf::Bool(b) => out.push(u8::from(*b)),
                _ => return Err(Fault::Type),
            },
            DataType::Uint8 => out.push(leaf.integer(0, u8::MAX.into())? as u8),
            DataType::Uint16 => {
                out.extend_from_slice(&(leaf.integer(0, u16::MAX.into())? as u16).to_le_bytes())
            }
            DataType::Uint32 => {
                out.extend_from_slice(&(leaf.integer(0, u32::MAX.into())? as u32).to_le_bytes())
            }
            DataType::Uint64 => {
                out.extend_from_slice(&(leaf.integer(0, u64::MAX)? as u64).to_le_bytes())
            }
            DataType::Int8 => out.extend_from_slice(
                &(leaf.integer(i8::MIN.into(), i8::MAX as u64)? as i8).to_le_bytes(),
            ),
            DataType::Int16 => out.extend_from_slice(
                &(leaf.integer(i16::MIN.into(), i16::MAX as u64)? as i16).to_le_bytes(),
            ),
            DataType::Int32 => out.extend_from_slice(
                &(leaf.integer(i32::MIN.into(), i32::MAX as u64)? as i32).to_le_bytes(),
            ),
            DataType::Int64 => out.extend_from_slice(
                &(leaf.integer(i64::MIN, i64::MAX as u64)? as i64).to_le_bytes(),
            ),
            DataType::Fp16 => {
                let x = leaf.float()?;
                let h = f16::from_f64(x);
                narrowed(x, h.is_infinite())?;
                out.extend_from_slice(&h.to_le_bytes());
            }
            DataType::Bf16 => {
                let x = leaf.float()?;
                let h = bf16::from_f64(x);
                narrowed(x, h.is_infinite())?;
                out.extend_from_slice(&h.to_le_bytes());
            }
            DataType::Fp32 => {
                let x = leaf.float()?;
                narrowed(x, (x as f32).is_infinite())?;
                out.extend_from_slice(&(x as f32).to_le_bytes());
            }
            DataType::Fp64 => out.extend_from_slice(&leaf.float()?.to_le_bytes()),
            DataType::Bytes => {
                let Leaf::Str(s) = leaf else {
                    return Err(Fault::Type);
                };
                // A JSON string longer than 4 GiB cannot be framed.
                let len = u32::try_from(s.len()).map_err(|_| Fault::Range)?;
                out.extend_from_slice(&len.to_le_bytes());
                out.extend_from_slice(s.as_bytes());
            }
        }
        Ok(())
    }
}

/// Seed and visitor for any value of `data` at any depth: arrays recurse,
/// everything else is a leaf. Depth is bounded by serde_json's own
/// nesting limit (128), so this cannot overflow the stack.
struct Leaves<'s>(&'s mut Sink);

impl<'de> DeserializeSeed<'de> for Leaves<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Leaves<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("tensor data")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Leaves(&mut *self.0))?.is_some() {}
        Ok(())
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.0.leaf(Leaf::Bool(v));
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.0.leaf(Leaf::U64(v));
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        // serde_json reports non-negative integers through visit_u64, but
        // other deserializers may not.
        self.0.leaf(match u64::try_from(v) {
            Ok(u) => Leaf::U64(u),
            Err(_) => Leaf::I64(v),
        });
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.0.leaf(Leaf::F64(v));
        Ok(())
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.0.leaf(Leaf::Str(v));
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.0.leaf(Leaf::Null);
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        self.0.leaf(Leaf::Object);
        Ok(())
    }
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

    /// Decodes `data` given as a JSON value (rendered to text first).
    fn decode(
        datatype: DataType,
        data: &serde_json::Value,
        expected: usize,
    ) -> Result<Bytes, DataError> {
        super::decode(datatype, &data.to_string(), expected)
    }

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
        assert!(matches!(err, DataError::TooShort { .. }));
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
    fn a_bare_scalar_is_one_element() {
        assert_eq!(&decode(DataType::Int8, &json!(-3), 1).unwrap()[..], &[0xfd]);
    }

    #[test]
    fn extra_elements_are_counted_exactly() {
        assert_eq!(
            decode(DataType::Int32, &json!([[1, 2], [3, "x"]]), 2).unwrap_err(),
            DataError::Count {
                expected: 2,
                found: 4
            }
        );
    }

    #[test]
    fn null_and_object_leaves_are_type_errors() {
        let err = decode(DataType::Fp32, &json!([1.0, null]), 2).unwrap_err();
        assert!(matches!(err, DataError::Type { index: 1, ref value } if value == "null"));
        let err = decode(DataType::Int32, &json!([{"a": [1, 2]}]), 1).unwrap_err();
        assert!(matches!(err, DataError::Type { index: 0, ref value } if value == "an object"));
    }

    #[test]
    fn escaped_strings_are_unescaped_for_bytes() {
        let b = super::decode(DataType::Bytes, r#"["a\"b\u00e9", "\n"]"#, 2).unwrap();
        assert_eq!(b, encode_bytes_elements(["a\"bé", "\n"]));
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        let deep = format!("{}1{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(matches!(
            super::decode(DataType::Int32, &deep, 1),
            Err(DataError::Syntax(_))
        ));
    }

    #[test]
    fn shape_is_checked_against_the_text_length_first() {
        // 3 bytes hold at most 2 elements.
        assert_eq!(
            super::decode(DataType::Int64, "[1]", 3).unwrap_err(),
            DataError::TooShort {
                expected: 3,
                bytes: 3
            }
        );
        assert!(DataError::TooShort {
            expected: 3,
            bytes: 3
        }
        .describe(DataType::Int64)
        .contains("Shape does not match true shape of 'data' field"));
    }

    #[test]
    fn the_buffer_is_sized_once_for_fixed_size_types() {
        let b = super::decode(DataType::Fp32, "[1, 2, 3, 4]", 4).unwrap();
        assert_eq!(b.len(), 16);
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
