//! One message of a `ModelStreamInfer` response stream, kept as what it
//! answers until it is written: `stream_route`'s codec writes it straight
//! into tonic's send buffer (`response_wire`), where building prost's
//! `ModelStreamInferResponse` first cost a `String` per output, two
//! vectors, a hashed map with the final flag in it, and prost's length
//! pass and encode per answer (about 2k shard instructions of a stream
//! request on `simple`, callgrind).

use bytes::BufMut;
use prost::encoding::{encode_key, encode_varint, WireType};

use super::{
    codec::encode_model_infer_response,
    response_wire::{bytes_field_len, put_str, str_len, ResponseFields, FINAL_RESPONSE},
};
use crate::{
    proto::inference::{
        infer_parameter::ParameterChoice, InferParameter, ModelInferResponse,
        ModelStreamInferResponse,
    },
    types::{InferResponse, Parameters},
};

// Field numbers of `ModelStreamInferResponse` (grpc_service.proto).
const ERROR_MESSAGE: u32 = 1;
const INFER_RESPONSE: u32 = 2;

/// Parameters of an error's response: none but the final flag.
static NO_PARAMETERS: Parameters = Parameters::new();

/// What one message of the stream says. `final_flag` is the
/// `triton_final_response` value, for a request that asked for it.
#[derive(Debug)]
pub enum StreamAnswer {
    /// A response of a request.
    Response {
        response: InferResponse,
        final_flag: Option<bool>,
    },
    /// A request that failed: its error, and who it was for (Triton sends
    /// the failed request's id back so that the client knows which one).
    Failed {
        message: String,
        model_name: String,
        model_version: String,
        id: String,
        final_flag: Option<bool>,
    },
    /// The stream could not go on: an error with no response in it.
    Broken(String),
}

impl StreamAnswer {
    /// The message with its lengths worked out, to be checked against the
    /// size limit and then written without measuring it again.
    pub fn measure(&self) -> Measured<'_> {
        let (error, response) = match self {
            Self::Response {
                response,
                final_flag,
            } => ("", Some(ResponseFields::of(response, *final_flag))),
            Self::Failed {
                message,
                model_name,
                model_version,
                id,
                final_flag,
            } => (
                message.as_str(),
                Some(ResponseFields {
                    model_name,
                    model_version,
                    id,
                    parameters: &NO_PARAMETERS,
                    final_flag: *final_flag,
                    outputs: &[],
                }),
            ),
            Self::Broken(message) => (message.as_str(), None),
        };
        let response = response.map(|r| {
            let len = r.encoded_len();
            (r, len)
        });
        Measured { error, response }
    }

    /// prost's message, for tonic's generated service.
    pub fn into_proto(self) -> ModelStreamInferResponse {
        let with_flag = |mut response: ModelInferResponse, flag: Option<bool>| {
            if let Some(last) = flag {
                response.parameters.insert(
                    FINAL_RESPONSE.to_string(),
                    InferParameter {
                        parameter_choice: Some(ParameterChoice::BoolParam(last)),
                    },
                );
            }
            response
        };
        match self {
            Self::Response {
                response,
                final_flag,
            } => ModelStreamInferResponse {
                error_message: String::new(),
                infer_response: Some(with_flag(encode_model_infer_response(response), final_flag)),
            },
            Self::Failed {
                message,
                model_name,
                model_version,
                id,
                final_flag,
            } => ModelStreamInferResponse {
                error_message: message,
                infer_response: Some(with_flag(
                    ModelInferResponse {
                        model_name,
                        model_version,
                        id,
                        ..Default::default()
                    },
                    final_flag,
                )),
            },
            Self::Broken(message) => ModelStreamInferResponse {
                error_message: message,
                infer_response: None,
            },
        }
    }
}

/// A [`StreamAnswer`] ready to write: its error message, and its response
/// message's fields with their encoded length.
pub struct Measured<'a> {
    error: &'a str,
    response: Option<(ResponseFields<'a>, usize)>,
}

impl Measured<'_> {
    /// The message's length on the wire, as prost would encode it.
    pub fn encoded_len(&self) -> usize {
        str_len(ERROR_MESSAGE, self.error)
            + self
                .response
                .as_ref()
                .map_or(0, |(_, len)| bytes_field_len(INFER_RESPONSE, *len))
    }

    /// The message's bytes, as prost would encode it (the response's map
    /// entries may come in another order).
    pub fn encode(&self, out: &mut impl BufMut) {
        put_str(out, ERROR_MESSAGE, self.error);
        if let Some((r, len)) = &self.response {
            // A present message field is written even when it is empty.
            encode_key(INFER_RESPONSE, WireType::LengthDelimited, out);
            encode_varint(*len as u64, out);
            r.encode(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::{Bytes, BytesMut};
    use proptest::prelude::*;
    use prost::Message;

    use super::*;
    use crate::types::{DataType, ParamValue, Tensor};

    fn param() -> impl Strategy<Value = ParamValue> {
        prop_oneof![
            any::<bool>().prop_map(ParamValue::Bool),
            any::<i64>().prop_map(ParamValue::Int),
            ".{0,6}".prop_map(ParamValue::String),
        ]
    }

    fn answer() -> impl Strategy<Value = StreamAnswer> {
        let flag = prop::option::of(any::<bool>());
        let response = (
            "[a-z_]{0,10}",
            "[0-9]{0,2}",
            ".{0,6}",
            prop::collection::vec(("[A-Z0-9]{0,6}", 0usize..40), 0..3),
            // The final flag's own name among them: the flag replaces it.
            prop::collection::btree_map(
                prop_oneof![Just(FINAL_RESPONSE.to_string()), ".{0,6}"],
                param(),
                0..3,
            ),
            flag.clone(),
        )
            .prop_map(|(name, version, id, outputs, parameters, final_flag)| {
                StreamAnswer::Response {
                    response: InferResponse {
                        model_name: name,
                        model_version: version,
                        id,
                        outputs: outputs
                            .into_iter()
                            .map(|(n, len)| {
                                Tensor::new(
                                    n,
                                    DataType::Uint8,
                                    vec![len as i64],
                                    Bytes::from(vec![3; len]),
                                )
                            })
                            .collect(),
                        parameters,
                        ..Default::default()
                    },
                    final_flag,
                }
            });
        let failed = (".{0,20}", "[a-z]{0,8}", "[0-9]{0,2}", ".{0,6}", flag).prop_map(
            |(message, model_name, model_version, id, final_flag)| StreamAnswer::Failed {
                message,
                model_name,
                model_version,
                id,
                final_flag,
            },
        );
        prop_oneof![response, failed, ".{0,20}".prop_map(StreamAnswer::Broken)]
    }

    fn written(a: &StreamAnswer) -> Bytes {
        let mut out = BytesMut::new();
        a.measure().encode(&mut out);
        out.freeze()
    }

    #[test]
    fn an_empty_response_message_is_still_sent() {
        let a = StreamAnswer::Failed {
            message: String::new(),
            model_name: String::new(),
            model_version: String::new(),
            id: String::new(),
            final_flag: None,
        };
        assert_eq!(&written(&a)[..], &[0x12, 0x00]);
        let read = ModelStreamInferResponse::decode(written(&a)).unwrap();
        assert_eq!(read.infer_response, Some(ModelInferResponse::default()));
    }

    proptest! {
        /// Whatever the answer, prost reads back the message the proto
        /// path builds, of the length prost gives it (so no map entry is
        /// written twice), and the length is that of the bytes.
        #[test]
        fn prost_reads_back_the_proto_paths_message(a in answer()) {
            let bytes = written(&a);
            prop_assert_eq!(bytes.len(), a.measure().encoded_len());
            let read = ModelStreamInferResponse::decode(bytes.clone()).unwrap();
            let proto = a.into_proto();
            prop_assert_eq!(bytes.len(), proto.encoded_len());
            prop_assert_eq!(read, proto);
        }
    }
}
