//! KServe v2 HTTP/REST inference bodies: JSON, and Triton's binary tensor
//! extension (a JSON header of `Inference-Header-Content-Length` bytes,
//! followed by the raw tensors in input/output order).
//!
//! - [`decode_infer_request`]: request body → [`InferRequest`]; binary
//!   inputs are zero-copy slices of the body.
//! - [`encode_infer_response`]: [`InferResponse`] → body, JSON or binary
//!   per output as Triton decides.
//! - [`error_body`]: `{"error": "..."}`.

mod envelope;
mod json_data;
mod request;
mod response;

use std::{borrow::Cow, fmt, sync::Arc};

use bytes::Bytes;
use serde::{
    de::{self, Error as _, MapAccess, Visitor},
    ser::{Serialize, SerializeMap, Serializer},
    Deserialize, Deserializer,
};

pub use request::{decode_infer_request, decode_infer_request_for};
pub use response::{encode_infer_response, AnswerForm, EncodedResponse};

use crate::{
    frontend::http::compression::decompress,
    model::{IoSpec, ModelVersion},
    offload, shm,
    types::{clip, clip_to, InferRequest, InferResult, ParamValue, Parameters, MESSAGE_BYTES},
};

/// Compressed bodies up to this size are inflated inline: deflate expands
/// at most ~1032:1, so they inflate to about [`offload::BODY_THRESHOLD`].
const INLINE_COMPRESSED_MAX: usize = 256;

/// Whether an `/infer` body is decoded on the shard ([`decode_body`]) or
/// on the [`offload`] pool ([`decode_request_body`]): bodies whose JSON is
/// larger than [`offload::BODY_THRESHOLD`], and compressed bodies beyond a
/// few hundred bytes, go to the pool so the shard keeps serving.
pub fn decodes_inline(body: &Bytes, compressed: bool, header_length: Option<usize>) -> bool {
    if compressed {
        body.len() <= INLINE_COMPRESSED_MAX
    } else {
        header_length.unwrap_or(body.len()) <= offload::BODY_THRESHOLD
    }
}

/// An `/infer` body as it arrived → [`InferRequest`]: inflated first when
/// `encoding` (a `Content-Encoding` other than identity) says so, never
/// past `limit` bytes; each input checked against `model` (the addressed
/// model's I/O, when it could be resolved) before its data is decoded.
pub fn decode_body(
    body: Bytes,
    encoding: Option<&str>,
    header_length: Option<usize>,
    model_name: &str,
    model_version: &str,
    model: Option<&IoSpec>,
    limit: usize,
) -> InferResult<InferRequest> {
    let body = match encoding {
        Some(enc) => decompress(enc, &body, limit)?,
        None => body,
    };
    decode_infer_request_for(body, header_length, model_name, model_version, model)
}

/// [`decode_body`] on the [`offload`] pool, for bodies that
/// [`decodes_inline`] keeps off the shard; a full pool answers UNAVAILABLE.
/// The model is owned here because the decode runs on another thread.
pub async fn decode_request_body(
    body: Bytes,
    encoding: Option<String>,
    header_length: Option<usize>,
    model_name: &str,
    model_version: &str,
    model: Option<Arc<ModelVersion>>,
    limit: usize,
) -> InferResult<InferRequest> {
    let (model_name, model_version) = (model_name.to_string(), model_version.to_string());
    offload::run(move || {
        decode_body(
            body,
            encoding.as_deref(),
            header_length,
            &model_name,
            &model_version,
            model.as_deref().map(|m| &m.io),
            limit,
        )
    })
    .await?
}

/// Request parameter: send every output in binary unless the output says otherwise.
pub const BINARY_DATA_OUTPUT: &str = "binary_data_output";
/// Requested-output parameter: this output in binary (true) or JSON (false).
pub const BINARY_DATA: &str = "binary_data";
/// Input/output parameter: size in bytes of the tensor's binary chunk.
pub const BINARY_DATA_SIZE: &str = "binary_data_size";
/// Requested-output parameter of the classification extension.
pub const CLASSIFICATION: &str = "classification";
/// Input/output parameter of the shared-memory extension.
pub const SHARED_MEMORY_REGION: &str = "shared_memory_region";

/// `{"error": "<message>"}`, the body of every HTTP error answer.
/// The message is kept to [`MESSAGE_BYTES`] whatever it quotes.
pub fn error_body(message: &str) -> Bytes {
    // serde_json escapes quotes, backslashes and control characters.
    Bytes::from(serde_json::json!({ "error": clip_to(message, MESSAGE_BYTES) }).to_string())
}

/// Whether `b` cannot stand for itself inside a JSON string: a quote, a
/// backslash or a control character.
const fn ends_json_string(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\'
}

/// The index of the first byte of `s` from `i` on that
/// [`ends_json_string`], eight bytes at a time: a byte of a word is
/// flagged where it is a quote, a backslash or below 0x20. The tricks
/// flag a byte above a true one wrongly at times, never one below, so the
/// lowest flag is exact. The request reader finds a string's end with
/// it; the response writer, whether a name needs escaping.
fn json_string_stop(s: &[u8], mut i: usize) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = ONES * 0x80;
    let zero_bytes = |v: u64| v.wrapping_sub(ONES) & !v & HIGH;
    while let Some(word) = s.get(i..i + 8) {
        let x = u64::from_le_bytes(word.try_into().ok()?);
        let stop = zero_bytes(x ^ (ONES * u64::from(b'"')))
            | zero_bytes(x ^ (ONES * u64::from(b'\\')))
            | (x.wrapping_sub(ONES * 0x20) & !x & HIGH);
        if stop != 0 {
            return Some(i + (stop.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    s.get(i..)?
        .iter()
        .position(|&b| ends_json_string(b))
        .map(|n| i + n)
}

/// A JSON `parameters` object, deserialized straight into [`Parameters`]
/// (no intermediate `serde_json::Value`). Values must be scalars, as in
/// Triton: booleans, integers (`Int`, or `Uint` above `i64::MAX`), doubles
/// and strings; unknown names are kept. A non-scalar is an error that
/// names the parameter.
#[derive(Default)]
#[cfg_attr(test, derive(Debug, PartialEq))]
struct JsonParams(Parameters);

impl ParamSink for JsonParams {
    fn keep(&mut self, name: Cow<'_, str>, value: ParamValue) {
        self.0.insert(name.into_owned(), value);
    }
}

/// An input's `parameters`, of which the server reads only the binary
/// chunk's size and the shared-memory fields: those are kept, every other
/// one is checked to be a scalar (as in [`JsonParams`], with the same
/// error) and dropped. Names are borrowed from the body where they have no
/// escapes, so an input's parameters cost no allocation unless they name a
/// shared-memory region.
#[derive(Default)]
#[cfg_attr(test, derive(Debug, PartialEq))]
struct InputParams {
    binary_data_size: Option<ParamValue>,
    /// The shared-memory fields, as [`crate::shm::shm_ref`] reads them.
    shared_memory: Parameters,
}

impl ParamSink for InputParams {
    fn keep(&mut self, name: Cow<'_, str>, value: ParamValue) {
        // A repeated name: the last one counts, as in a map.
        if name == BINARY_DATA_SIZE {
            self.binary_data_size = Some(value);
        } else if matches!(&*name, shm::REGION | shm::OFFSET | shm::BYTE_SIZE) {
            self.shared_memory.insert(name.into_owned(), value);
        }
    }
}

/// What a `parameters` object is read into, one checked scalar at a time.
trait ParamSink: Default {
    fn keep(&mut self, name: Cow<'_, str>, value: ParamValue);
}

impl<'de> Deserialize<'de> for JsonParams {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ParamsVisitor::<Self>(std::marker::PhantomData))
    }
}

impl<'de> Deserialize<'de> for InputParams {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ParamsVisitor::<Self>(std::marker::PhantomData))
    }
}

/// Reads a `parameters` object into any [`ParamSink`]: an object of
/// scalars, or `null` for none; a non-scalar is an error that names the
/// parameter.
struct ParamsVisitor<S>(std::marker::PhantomData<S>);

impl<'de, S: ParamSink> Visitor<'de> for ParamsVisitor<S> {
    type Value = S;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a parameters object")
    }

    /// `"parameters": null` reads as no parameters.
    fn visit_unit<E: de::Error>(self) -> Result<S, E> {
        Ok(S::default())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<S, A::Error> {
        let mut out = S::default();
        while let Some(ParamName(name)) = map.next_key()? {
            let value = map
                .next_value::<ScalarParam>()
                .map_err(|e| A::Error::custom(format!("parameter '{}': {e}", clip(&name))))?;
            out.keep(name, value.0);
        }
        Ok(out)
    }
}

/// A parameter's name, borrowed from the body unless it has escapes.
struct ParamName<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for ParamName<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct NameVisitor;
        impl<'de> Visitor<'de> for NameVisitor {
            type Value = ParamName<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a parameter name")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<ParamName<'de>, E> {
                Ok(ParamName(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ParamName<'de>, E> {
                Ok(ParamName(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(NameVisitor)
    }
}

/// A parameter value as JSON text, for error messages.
fn show_param(v: &ParamValue) -> String {
    match v {
        ParamValue::Bool(b) => b.to_string(),
        ParamValue::Int(i) => i.to_string(),
        ParamValue::Uint(u) => u.to_string(),
        ParamValue::Double(d) => d.to_string(),
        ParamValue::String(s) => format!("{:?}", clip(s)),
    }
}

struct ScalarParam(ParamValue);

impl<'de> Deserialize<'de> for ScalarParam {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ScalarVisitor)
    }
}

struct ScalarVisitor;

impl Visitor<'_> for ScalarVisitor {
    type Value = ScalarParam;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a boolean, an integer, a double or a string")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<ScalarParam, E> {
        Ok(ScalarParam(ParamValue::Bool(v)))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<ScalarParam, E> {
        Ok(ScalarParam(ParamValue::Int(v)))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<ScalarParam, E> {
        // Integers are `Int` whenever they fit, whatever their sign.
        Ok(ScalarParam(
            i64::try_from(v).map_or(ParamValue::Uint(v), ParamValue::Int),
        ))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<ScalarParam, E> {
        Ok(ScalarParam(ParamValue::Double(v)))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<ScalarParam, E> {
        Ok(ScalarParam(ParamValue::String(v.to_string())))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<ScalarParam, E> {
        Ok(ScalarParam(ParamValue::String(v)))
    }
}

/// Serializes [`Parameters`] as a JSON object without cloning it into a
/// `serde_json::Value`. Non-finite doubles become `null` (JSON has no NaN).
struct ParamsJson<'a>(&'a Parameters);

impl Serialize for ParamsJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (k, v) in self.0 {
            match v {
                ParamValue::Bool(b) => map.serialize_entry(k, b)?,
                ParamValue::Int(i) => map.serialize_entry(k, i)?,
                ParamValue::Uint(u) => map.serialize_entry(k, u)?,
                ParamValue::Double(d) => map.serialize_entry(k, d)?,
                ParamValue::String(s) => map.serialize_entry(k, s)?,
            }
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{json, Value};

    use super::*;

    proptest! {
        /// The word-at-a-time scan finds what a byte-at-a-time one finds.
        #[test]
        fn json_string_stop_finds_the_first_stop_byte(
            bytes in prop::collection::vec(
                prop_oneof![4 => 0x20u8..0x7f, 1 => any::<u8>(), 1 => Just(b'"'), 1 => Just(b'\\')],
                0..40,
            ),
            from in any::<prop::sample::Index>(),
        ) {
            let from = from.index(bytes.len() + 1);
            let bytewise = bytes[from..]
                .iter()
                .position(|&b| b < 0x20 || b == b'"' || b == b'\\')
                .map(|n| from + n);
            prop_assert_eq!(json_string_stop(&bytes, from), bytewise);
        }
    }

    fn params(v: Value) -> Result<Parameters, serde_json::Error> {
        serde_json::from_value::<JsonParams>(v).map(|p| p.0)
    }

    #[test]
    fn error_body_escapes_quotes_and_newlines() {
        let body = error_body("bad \"x\"\nnext \\ end");
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v, json!({"error": "bad \"x\"\nnext \\ end"}));
        assert!(!body.contains(&b'\n'));
    }

    #[test]
    fn json_parameters_map_to_param_values() {
        let p =
            params(json!({"b": true, "i": -3, "p": 5, "u": u64::MAX, "d": 0.5, "s": "x"})).unwrap();
        assert_eq!(p["b"], ParamValue::Bool(true));
        assert_eq!(p["i"], ParamValue::Int(-3));
        assert_eq!(p["p"], ParamValue::Int(5));
        assert_eq!(p["u"], ParamValue::Uint(u64::MAX));
        assert_eq!(p["d"], ParamValue::Double(0.5));
        assert_eq!(p["s"], ParamValue::String("x".into()));
    }

    #[test]
    fn json_parameters_reject_non_scalars_naming_them() {
        let err = params(json!({"nested": {"a": 1}})).unwrap_err().to_string();
        assert!(
            err.contains("parameter 'nested'") && err.contains("map"),
            "{err}"
        );
        assert!(params(json!({"n": null})).is_err());
        assert!(params(json!(null)).unwrap().is_empty());
        assert!(params(json!({"l": [1]})).is_err());
    }

    #[test]
    fn parameters_serialize_as_an_object() {
        let mut p = Parameters::new();
        p.insert("a".into(), ParamValue::Int(1));
        p.insert("n".into(), ParamValue::Double(f64::NAN));
        assert_eq!(
            serde_json::to_string(&ParamsJson(&p)).unwrap(),
            r#"{"a":1,"n":null}"#
        );
    }
}
