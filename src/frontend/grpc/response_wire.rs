//! A `ModelInferResponse` written straight from an [`InferResponse`]: into
//! its gRPC frame for the direct `ModelInfer` path (`unary_infer`), and
//! inside a `ModelStreamInferResponse` for the stream (`stream_answer`).
//!
//! The bytes are those prost writes for the message
//! `codec::encode_model_infer_response` builds (fields in number order,
//! empty strings left out, shapes packed), without building that message
//! first: it costs a `String` per output for its datatype, two vectors and
//! a map per answer, each allocated and then freed on the shard.
//! Large raw outputs are left out of the frame as a [`RawTail`], as
//! `service::take_raw_tail` does for tonic's path.

use std::borrow::Cow;

use bytes::{BufMut, Bytes, BytesMut};
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};
use tonic::Status;

use super::raw_tail::{raw_output_field_len, RawTail, MIN_TAIL_BYTES};
use crate::types::{InferResponse, ParamValue, Parameters, Tensor};

/// gRPC's message header: compressed flag and length.
pub(super) const HEADER_LEN: usize = 5;

// Field numbers of `ModelInferResponse`, its `InferOutputTensor`, a map
// entry and `InferParameter` (grpc_service.proto).
const MODEL_NAME: u32 = 1;
const MODEL_VERSION: u32 = 2;
const ID: u32 = 3;
const PARAMETERS: u32 = 4;
const OUTPUTS: u32 = 5;
const RAW_OUTPUT_CONTENTS: u32 = 6;
const TENSOR_NAME: u32 = 1;
const TENSOR_DATATYPE: u32 = 2;
const TENSOR_SHAPE: u32 = 3;
const ENTRY_KEY: u32 = 1;
const ENTRY_VALUE: u32 = 2;
const BOOL_PARAM: u32 = 1;
const INT64_PARAM: u32 = 2;
const STRING_PARAM: u32 = 3;
const DOUBLE_PARAM: u32 = 4;
const UINT64_PARAM: u32 = 5;

/// Request parameter: every response of the request carries
/// [`FINAL_RESPONSE`] (`ModelStreamInfer`).
pub(super) const ENABLE_EMPTY_FINAL_RESPONSE: &str = "triton_enable_empty_final_response";
/// Response parameter: whether this is the request's last response.
pub(super) const FINAL_RESPONSE: &str = "triton_final_response";

/// The fields of one `ModelInferResponse`, borrowed from where they are.
pub(super) struct ResponseFields<'a> {
    pub model_name: &'a str,
    pub model_version: &'a str,
    pub id: &'a str,
    pub parameters: &'a Parameters,
    /// [`FINAL_RESPONSE`] with this value, over an entry of that name in
    /// `parameters` (as a map insert into prost's message replaces it).
    pub final_flag: Option<bool>,
    /// Written as the message's outputs and, in the same order, its raw
    /// output contents.
    pub outputs: &'a [Tensor],
}

impl<'a> ResponseFields<'a> {
    pub(super) fn of(r: &'a InferResponse, final_flag: Option<bool>) -> Self {
        Self {
            model_name: &r.model_name,
            model_version: &r.model_version,
            id: &r.id,
            parameters: &r.parameters,
            final_flag,
            outputs: &r.outputs,
        }
    }

    /// Everything but the raw outputs.
    fn head_len(&self) -> usize {
        str_len(MODEL_NAME, self.model_name)
            + str_len(MODEL_VERSION, self.model_version)
            + str_len(ID, self.id)
            + self
                .params()
                .map(|(k, v)| param_field_len(k, &v))
                .sum::<usize>()
            + self
                .outputs
                .iter()
                .map(|t| bytes_field_len(OUTPUTS, tensor_len(t)))
                .sum::<usize>()
    }

    fn raw_field_len(&self) -> usize {
        self.outputs
            .iter()
            .map(|t| raw_output_field_len(t.data.len()))
            .sum()
    }

    /// The message's length on the wire.
    pub(super) fn encoded_len(&self) -> usize {
        self.head_len() + self.raw_field_len()
    }

    /// The parameters as they go out: the final flag last, in place of
    /// any parameter of its name.
    fn params(&self) -> impl Iterator<Item = (&str, Cow<'_, ParamValue>)> + '_ {
        let flag = self.final_flag;
        self.parameters
            .iter()
            .filter(move |(k, _)| flag.is_none() || k.as_str() != FINAL_RESPONSE)
            .map(|(k, v)| (k.as_str(), Cow::Borrowed(v)))
            .chain(flag.map(|last| (FINAL_RESPONSE, Cow::Owned(ParamValue::Bool(last)))))
    }

    fn put_head(&self, out: &mut impl BufMut) {
        put_str(out, MODEL_NAME, self.model_name);
        put_str(out, MODEL_VERSION, self.model_version);
        put_str(out, ID, self.id);
        for (k, v) in self.params() {
            put_param_field(out, k, &v);
        }
        for t in self.outputs {
            encode_key(OUTPUTS, WireType::LengthDelimited, out);
            encode_varint(tensor_len(t) as u64, out);
            put_tensor(out, t);
        }
    }

    fn put_raw(&self, out: &mut impl BufMut) {
        for t in self.outputs {
            encode_key(RAW_OUTPUT_CONTENTS, WireType::LengthDelimited, out);
            encode_varint(t.data.len() as u64, out);
            out.put_slice(&t.data);
        }
    }

    /// The whole message, raw outputs included.
    pub(super) fn encode(&self, out: &mut impl BufMut) {
        self.put_head(out);
        self.put_raw(out);
    }
}

/// `response` framed for the wire: the gRPC header and the message, and
/// the raw outputs to send after it when they are large. Refused past
/// `limit` (the whole message, raw outputs included) with tonic's status,
/// which `size_limit` rewrites as for tonic's own answers.
pub(super) fn frame_response(
    response: &InferResponse,
    limit: usize,
) -> Result<(Bytes, Option<RawTail>), Status> {
    let fields = ResponseFields::of(response, None);
    let raw: usize = response.outputs.iter().map(|t| t.data.len()).sum();
    let head_len = fields.head_len();
    let len = head_len + fields.raw_field_len();
    within_limit(len, limit)?;
    let tail = raw >= MIN_TAIL_BYTES;
    let framed_len = if tail { head_len } else { len };
    let mut out = BytesMut::with_capacity(HEADER_LEN + framed_len);
    put_message_header(&mut out, framed_len, len)?;
    fields.put_head(&mut out);
    if tail {
        let raws = response.outputs.iter().map(|t| t.data.clone()).collect();
        return Ok((out.freeze(), Some(RawTail(raws))));
    }
    fields.put_raw(&mut out);
    debug_assert_eq!(out.len(), HEADER_LEN + framed_len);
    Ok((out.freeze(), None))
}

/// tonic's refusal of an answer of `len` bytes past the message size
/// limit.
pub(super) fn within_limit(len: usize, limit: usize) -> Result<(), Status> {
    if len > limit {
        return Err(Status::out_of_range(format!(
            "Error, encoded message length too large: found {len} bytes, the limit is: {limit} bytes"
        )));
    }
    Ok(())
}

/// The header of an uncompressed message whose first `framed_len` bytes
/// follow it (all of them but a raw tail), or tonic's refusal past 4 GiB,
/// naming the whole message's `len`.
pub(super) fn put_message_header(
    out: &mut BytesMut,
    framed_len: usize,
    len: usize,
) -> Result<(), Status> {
    let framed_len = u32::try_from(framed_len).map_err(|_| {
        Status::resource_exhausted(format!(
            "Cannot return body with more than 4GB of data but got {len} bytes"
        ))
    })?;
    out.put_u8(0);
    out.put_u32(framed_len);
    Ok(())
}

pub(super) fn bytes_field_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

/// A string field; proto3 leaves an empty one out.
pub(super) fn str_len(tag: u32, s: &str) -> usize {
    if s.is_empty() {
        0
    } else {
        bytes_field_len(tag, s.len())
    }
}

pub(super) fn put_str(out: &mut impl BufMut, tag: u32, s: &str) {
    if !s.is_empty() {
        encode_key(tag, WireType::LengthDelimited, out);
        encode_varint(s.len() as u64, out);
        out.put_slice(s.as_bytes());
    }
}

/// An `InferOutputTensor`: name, datatype, packed shape (no parameters or
/// typed contents: outputs go back raw).
fn tensor_len(t: &Tensor) -> usize {
    str_len(TENSOR_NAME, &t.name)
        + str_len(TENSOR_DATATYPE, t.datatype.as_str())
        + match shape_len(&t.shape) {
            0 => 0,
            n => bytes_field_len(TENSOR_SHAPE, n),
        }
}

fn shape_len(shape: &[i64]) -> usize {
    shape.iter().map(|&d| encoded_len_varint(d as u64)).sum()
}

fn put_tensor(out: &mut impl BufMut, t: &Tensor) {
    put_str(out, TENSOR_NAME, &t.name);
    put_str(out, TENSOR_DATATYPE, t.datatype.as_str());
    let n = shape_len(&t.shape);
    if n > 0 {
        encode_key(TENSOR_SHAPE, WireType::LengthDelimited, out);
        encode_varint(n as u64, out);
        for &d in &t.shape {
            // int64 is the two's complement as a varint.
            encode_varint(d as u64, out);
        }
    }
}

/// One entry of the map field: an entry message (key, `InferParameter`).
fn param_field_len(k: &str, v: &ParamValue) -> usize {
    bytes_field_len(PARAMETERS, entry_len(k, v))
}

fn entry_len(k: &str, v: &ParamValue) -> usize {
    str_len(ENTRY_KEY, k) + bytes_field_len(ENTRY_VALUE, param_len(v))
}

fn put_param_field(out: &mut impl BufMut, k: &str, v: &ParamValue) {
    encode_key(PARAMETERS, WireType::LengthDelimited, out);
    encode_varint(entry_len(k, v) as u64, out);
    put_str(out, ENTRY_KEY, k);
    encode_key(ENTRY_VALUE, WireType::LengthDelimited, out);
    encode_varint(param_len(v) as u64, out);
    put_param(out, v);
}

/// An `InferParameter`: its oneof field is written even when it holds the
/// default value.
fn param_len(v: &ParamValue) -> usize {
    match v {
        ParamValue::Bool(_) => key_len(BOOL_PARAM) + 1,
        ParamValue::Int(i) => key_len(INT64_PARAM) + encoded_len_varint(*i as u64),
        ParamValue::String(s) => bytes_field_len(STRING_PARAM, s.len()),
        ParamValue::Double(_) => key_len(DOUBLE_PARAM) + 8,
        ParamValue::Uint(u) => key_len(UINT64_PARAM) + encoded_len_varint(*u),
    }
}

fn put_param(out: &mut impl BufMut, v: &ParamValue) {
    match v {
        ParamValue::Bool(b) => {
            encode_key(BOOL_PARAM, WireType::Varint, out);
            encode_varint(u64::from(*b), out);
        }
        ParamValue::Int(i) => {
            encode_key(INT64_PARAM, WireType::Varint, out);
            encode_varint(*i as u64, out);
        }
        ParamValue::String(s) => {
            encode_key(STRING_PARAM, WireType::LengthDelimited, out);
            encode_varint(s.len() as u64, out);
            out.put_slice(s.as_bytes());
        }
        ParamValue::Double(d) => {
            encode_key(DOUBLE_PARAM, WireType::SixtyFourBit, out);
            out.put_f64_le(*d);
        }
        ParamValue::Uint(u) => {
            encode_key(UINT64_PARAM, WireType::Varint, out);
            encode_varint(*u, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use prost::Message;

    use super::*;
    use crate::{
        frontend::grpc::codec::encode_model_infer_response, proto::inference::ModelInferResponse,
        types::DataType,
    };

    fn response(outputs: Vec<Tensor>, parameters: Parameters) -> InferResponse {
        InferResponse {
            model_name: "simple".into(),
            model_version: "1".into(),
            id: "r1".into(),
            outputs,
            parameters,
            ..Default::default()
        }
    }

    fn tensor(name: &str, dt: DataType, shape: Vec<i64>, len: usize) -> Tensor {
        Tensor::new(name, dt, shape, Bytes::from(vec![7u8; len]))
    }

    fn unframe(framed: &Bytes) -> Bytes {
        assert_eq!(framed[0], 0, "not compressed");
        let len = u32::from_be_bytes([framed[1], framed[2], framed[3], framed[4]]) as usize;
        assert_eq!(
            len,
            framed.len() - HEADER_LEN,
            "the header gives the message's length"
        );
        framed.slice(HEADER_LEN..)
    }

    #[test]
    fn the_bytes_are_prosts() {
        let r = response(
            vec![
                tensor("OUTPUT0", DataType::Int32, vec![1, 16], 64),
                tensor("OUTPUT1", DataType::Fp32, vec![-1, 0, 300], 0),
                tensor("", DataType::Bytes, vec![], 3),
            ],
            [("sequence_end".to_string(), ParamValue::Bool(true))].into(),
        );
        let (framed, tail) = frame_response(&r, 1 << 20).unwrap();
        assert!(tail.is_none());
        let prost = encode_model_infer_response(r.clone()).encode_to_vec();
        assert_eq!(unframe(&framed), prost);
        // The empty answer too (no fields at all).
        let (framed, _) = frame_response(&InferResponse::default(), 64).unwrap();
        assert_eq!(&framed[..], &[0, 0, 0, 0, 0]);
    }

    #[test]
    fn large_outputs_follow_as_a_tail() {
        let big = MIN_TAIL_BYTES;
        let r = response(
            vec![
                tensor("A", DataType::Uint8, vec![big as i64], big),
                tensor("B", DataType::Uint8, vec![2], 2),
            ],
            Parameters::new(),
        );
        let (framed, tail) = frame_response(&r, 1 << 20).unwrap();
        let tail = tail.expect("a tail");
        assert_eq!(tail.0.len(), 2);
        assert_eq!(tail.0[0].as_ptr(), r.outputs[0].data.as_ptr(), "not copied");
        // The head plus the tail's own framing is the whole message.
        let mut whole = unframe(&framed).to_vec();
        for chunk in &tail.0 {
            encode_key(RAW_OUTPUT_CONTENTS, WireType::LengthDelimited, &mut whole);
            encode_varint(chunk.len() as u64, &mut whole);
            whole.extend_from_slice(chunk);
        }
        assert_eq!(whole, encode_model_infer_response(r).encode_to_vec());
    }

    #[test]
    fn the_limit_counts_the_whole_message() {
        let r = response(
            vec![tensor("A", DataType::Uint8, vec![100], 100)],
            Parameters::new(),
        );
        let len = encode_model_infer_response(r.clone()).encoded_len();
        assert!(frame_response(&r, len).is_ok());
        let e = frame_response(&r, len - 1).unwrap_err();
        assert_eq!(e.code(), tonic::Code::OutOfRange);
        assert!(e.message().contains("message length too large"), "{e:?}");
    }

    fn param() -> impl Strategy<Value = ParamValue> {
        prop_oneof![
            any::<bool>().prop_map(ParamValue::Bool),
            any::<i64>().prop_map(ParamValue::Int),
            any::<u64>().prop_map(ParamValue::Uint),
            any::<f64>()
                .prop_filter("NaN never equals itself", |d| !d.is_nan())
                .prop_map(ParamValue::Double),
            ".{0,12}".prop_map(ParamValue::String),
        ]
    }

    fn output() -> impl Strategy<Value = Tensor> {
        (
            ".{0,10}",
            prop::sample::select(vec![
                DataType::Bool,
                DataType::Int8,
                DataType::Int64,
                DataType::Fp16,
                DataType::Fp64,
                DataType::Bytes,
            ]),
            prop::collection::vec(any::<i64>(), 0..5),
            0usize..300,
        )
            .prop_map(|(name, dt, shape, len)| {
                Tensor::new(name, dt, shape, Bytes::from(vec![1; len]))
            })
    }

    proptest! {
        /// Whatever the answer, prost reads back the message tonic's path
        /// would have sent (map entries may come in another order, so the
        /// messages are compared, not the bytes).
        #[test]
        fn prost_reads_back_the_same_message(
            name in ".{0,16}",
            version in "[0-9]{0,3}",
            id in ".{0,8}",
            outputs in prop::collection::vec(output(), 0..4),
            params in prop::collection::btree_map(".{0,8}", param(), 0..4),
        ) {
            let r = InferResponse {
                model_name: name,
                model_version: version,
                id,
                outputs,
                parameters: params,
                ..Default::default()
            };
            let (framed, tail) = frame_response(&r, usize::MAX).unwrap();
            prop_assert!(tail.is_none());
            let read = ModelInferResponse::decode(unframe(&framed)).unwrap();
            prop_assert_eq!(read, encode_model_infer_response(r));
        }
    }
}
