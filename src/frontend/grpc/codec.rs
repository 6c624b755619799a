//! `ModelInferRequest` → [`InferRequest`] and [`InferResponse`] →
//! `ModelInferResponse`.
//!
//! Inputs arrive either as `raw_input_contents` (one entry per input, in
//! order, already in Triton's raw layout: moved into the tensor without a
//! copy) or as typed `contents`, never both. Outputs always go back in
//! `raw_output_contents`, as Triton does.

use std::collections::HashMap;

use bytes::Bytes;

use crate::{
    model::IoSpec,
    proto::inference::{
        infer_parameter::ParameterChoice, model_infer_request::InferInputTensor,
        model_infer_response, InferParameter, InferTensorContents, ModelInferRequest,
        ModelInferResponse,
    },
    types::{
        bytes_elements, clip, element_count, show_shape, DataType, InferError, InferRequest,
        InferResponse, ParamValue, Parameters, RequestedOutput, Tensor,
    },
};

/// Input/output parameter of the shared-memory extension.
const SHARED_MEMORY_REGION: &str = "shared_memory_region";

/// Converts protobuf parameters. A parameter whose oneof is unset carries
/// no value and is dropped.
pub fn params_from_proto(map: HashMap<String, InferParameter>) -> Parameters {
    map.into_iter()
        .filter_map(|(k, p)| {
            let v = match p.parameter_choice? {
                ParameterChoice::BoolParam(b) => ParamValue::Bool(b),
                ParameterChoice::Int64Param(i) => ParamValue::Int(i),
                ParameterChoice::StringParam(s) => ParamValue::String(s),
                ParameterChoice::DoubleParam(d) => ParamValue::Double(d),
                ParameterChoice::Uint64Param(u) => ParamValue::Uint(u),
            };
            Some((k, v))
        })
        .collect()
}

pub fn params_to_proto(params: Parameters) -> HashMap<String, InferParameter> {
    params
        .into_iter()
        .map(|(k, v)| {
            let choice = match v {
                ParamValue::Bool(b) => ParameterChoice::BoolParam(b),
                ParamValue::Int(i) => ParameterChoice::Int64Param(i),
                ParamValue::Uint(u) => ParameterChoice::Uint64Param(u),
                ParamValue::Double(d) => ParameterChoice::DoubleParam(d),
                ParamValue::String(s) => ParameterChoice::StringParam(s),
            };
            (
                k,
                InferParameter {
                    parameter_choice: Some(choice),
                },
            )
        })
        .collect()
}

/// Decodes a gRPC inference request.
pub fn decode_model_infer_request(req: ModelInferRequest) -> Result<InferRequest, InferError> {
    decode_model_infer_request_for(req, None)
}

/// Elements in the typed `contents` of a request's inputs (bytes for
/// `bytes_contents`): the work [`decode_model_infer_request`] does beyond
/// moving `raw_input_contents`, which costs nothing.
pub fn typed_contents_size(req: &ModelInferRequest) -> usize {
    req.inputs
        .iter()
        .filter_map(|i| i.contents.as_ref())
        .map(|c| {
            c.bool_contents.len()
                + c.int_contents.len()
                + c.int64_contents.len()
                + c.uint_contents.len()
                + c.uint64_contents.len()
                + c.fp32_contents.len()
                + c.fp64_contents.len()
                + c.bytes_contents.iter().map(|b| b.len() + 4).sum::<usize>()
        })
        .sum()
}

/// [`decode_model_infer_request`], with each input's name, datatype and
/// shape checked against `io` (the addressed model's inputs, when the
/// caller resolved it) before any typed contents are packed.
pub fn decode_model_infer_request_for(
    req: ModelInferRequest,
    io: Option<&IoSpec>,
) -> Result<InferRequest, InferError> {
    let ModelInferRequest {
        model_name,
        model_version,
        id,
        parameters,
        inputs,
        outputs,
        raw_input_contents,
    } = req;
    let model = clip(&model_name);
    let use_raw = !raw_input_contents.is_empty();

    // Per-input checks first, in Triton's order: its client tests expect
    // the "contents field must not be specified" message even when the
    // raw count is also wrong.
    for input in &inputs {
        if use_raw && input.contents.is_some() {
            return Err(InferError::invalid(format!(
                // Triton's exact wording: client code searches for it.
                "contents field must not be specified when using raw_input_contents \
                 for '{}' for model '{model}'",
                clip(&input.name)
            )));
        }
    }
    if let Some(io) = io {
        let mut batch = None;
        for input in &inputs {
            // An unknown datatype is reported by `decode_input`.
            if let Some(dt) = DataType::from_wire(&input.datatype) {
                io.check_input(&model, &input.name, dt, &input.shape, &mut batch)?;
            }
        }
    }
    // Inputs in shared memory have no raw contents (tritonclient sends
    // raw contents for the other inputs only, in order).
    let in_memory = inputs
        .iter()
        .filter(|i| !i.parameters.contains_key(SHARED_MEMORY_REGION))
        .count();
    if use_raw && raw_input_contents.len() != in_memory {
        return Err(InferError::invalid(format!(
            "expected {in_memory} raw_input_contents (one per input not in shared memory) \
             but got {} for model '{model}'",
            raw_input_contents.len()
        )));
    }

    let mut raw = raw_input_contents.into_iter();
    let mut tensors = Vec::with_capacity(inputs.len());
    for input in inputs {
        if input.parameters.contains_key(SHARED_MEMORY_REGION) {
            tensors.push(decode_shm_input(input, &model)?);
        } else {
            tensors.push(decode_input(input, raw.next(), &model)?);
        }
    }

    let outputs = outputs
        .into_iter()
        .map(|o| RequestedOutput {
            name: o.name,
            parameters: params_from_proto(o.parameters),
        })
        .collect();

    Ok(InferRequest {
        model_name,
        model_version,
        id,
        inputs: tensors,
        outputs,
        parameters: params_from_proto(parameters),
        trace: Default::default(),
    })
}

/// An input whose data is in a registered system shared memory region.
fn decode_shm_input(input: InferInputTensor, model: &str) -> Result<Tensor, InferError> {
    let what = format!("input '{}' for model '{model}'", clip(&input.name));
    let params = params_from_proto(input.parameters);
    let Some(shm) = crate::shm::shm_ref(&params, &what)? else {
        return Err(InferError::internal(format!(
            "{what}: no shared memory region"
        )));
    };
    if input.contents.is_some() {
        return Err(InferError::invalid(format!(
            "{what}: contents field must not be specified when using shared memory"
        )));
    }
    let datatype = DataType::from_wire(&input.datatype).ok_or_else(|| {
        InferError::invalid(format!(
            "{what}: unknown datatype '{}'",
            clip(&input.datatype)
        ))
    })?;
    if let Some(d) = input.shape.iter().find(|&&d| d < 0) {
        return Err(InferError::invalid(format!(
            "{what}: shape {} has a negative dimension {d}",
            show_shape(&input.shape)
        )));
    }
    let count = element_count(&input.shape).ok_or_else(|| {
        InferError::invalid(format!(
            "{what}: shape {} has more elements than can be addressed",
            show_shape(&input.shape)
        ))
    })?;
    let data = crate::shm::read_input(&shm, datatype, count, &input.shape, &input.name, model)?;
    Ok(Tensor {
        name: input.name,
        datatype,
        shape: input.shape,
        data,
    })
}

fn decode_input(
    input: InferInputTensor,
    raw: Option<Bytes>,
    model: &str,
) -> Result<Tensor, InferError> {
    let InferInputTensor {
        name,
        datatype,
        shape,
        contents,
        ..
    } = input;
    let shown = clip(&name);
    let invalid =
        |msg: String| InferError::invalid(format!("input '{shown}' for model '{model}': {msg}"));

    let dt = DataType::from_wire(&datatype)
        .ok_or_else(|| invalid(format!("unknown datatype '{}'", clip(&datatype))))?;
    if let Some(d) = shape.iter().find(|&&d| d < 0) {
        return Err(invalid(format!(
            "shape {} has a negative dimension {d}",
            show_shape(&shape)
        )));
    }
    // A count only: nothing is sized from the shape before the data agrees.
    let count = element_count(&shape).ok_or_else(|| {
        invalid(format!(
            "shape {} has more elements than can be addressed",
            show_shape(&shape)
        ))
    })?;

    let data = match raw {
        Some(data) => {
            check_raw(dt, &data, count)
                .map_err(|m| invalid(format!("{m} (shape {})", show_shape(&shape))))?;
            data
        }
        None => typed_contents(dt, contents.unwrap_or_default(), count).map_err(invalid)?,
    };
    Ok(Tensor {
        name,
        datatype: dt,
        shape,
        data,
    })
}

/// Checks a raw input against its shape: exact byte size for fixed-size
/// types, framing and element count for BYTES.
pub(super) fn check_raw(dt: DataType, data: &[u8], count: usize) -> Result<(), String> {
    match dt.element_size() {
        Some(size) => match count.checked_mul(size) {
            Some(n) if n == data.len() => Ok(()),
            need => Err(format!(
                "unexpected size {} of raw_input_contents, expecting {} bytes",
                data.len(),
                need.map_or_else(|| "more than addressable".into(), |n| n.to_string())
            )),
        },
        None => {
            let n = bytes_elements(data)
                .map_err(|e| format!("malformed BYTES raw_input_contents: {e}"))?
                .count();
            if n == count {
                Ok(())
            } else {
                Err(format!(
                    "raw_input_contents holds {n} BYTES elements, expecting {count}"
                ))
            }
        }
    }
}

/// Names of the non-empty typed fields, to refuse data in a field that
/// does not belong to the datatype.
fn filled_fields(c: &InferTensorContents) -> Vec<&'static str> {
    [
        ("bool_contents", c.bool_contents.is_empty()),
        ("int_contents", c.int_contents.is_empty()),
        ("int64_contents", c.int64_contents.is_empty()),
        ("uint_contents", c.uint_contents.is_empty()),
        ("uint64_contents", c.uint64_contents.is_empty()),
        ("fp32_contents", c.fp32_contents.is_empty()),
        ("fp64_contents", c.fp64_contents.is_empty()),
        ("bytes_contents", c.bytes_contents.is_empty()),
    ]
    .into_iter()
    .filter_map(|(name, empty)| (!empty).then_some(name))
    .collect()
}

/// The typed field that carries `dt`; `None` for FP16/BF16, which have none.
fn field_for(dt: DataType) -> Option<&'static str> {
    Some(match dt {
        DataType::Bool => "bool_contents",
        DataType::Int8 | DataType::Int16 | DataType::Int32 => "int_contents",
        DataType::Int64 => "int64_contents",
        DataType::Uint8 | DataType::Uint16 | DataType::Uint32 => "uint_contents",
        DataType::Uint64 => "uint64_contents",
        DataType::Fp32 => "fp32_contents",
        DataType::Fp64 => "fp64_contents",
        DataType::Bytes => "bytes_contents",
        DataType::Fp16 | DataType::Bf16 => return None,
    })
}

/// Packs values into LE bytes, narrowing each with `narrow`; the first
/// value that does not fit is reported by index.
fn pack<T: Copy + std::fmt::Display, const N: usize>(
    values: &[T],
    dt: DataType,
    narrow: impl Fn(T) -> Option<[u8; N]>,
) -> Result<Bytes, String> {
    let mut out = Vec::with_capacity(values.len().saturating_mul(N));
    for (i, &v) in values.iter().enumerate() {
        let b = narrow(v).ok_or_else(|| {
            format!("element {i} of the typed contents is {v}, out of range for {dt}")
        })?;
        out.extend_from_slice(&b);
    }
    Ok(Bytes::from(out))
}

fn typed_contents(dt: DataType, c: InferTensorContents, count: usize) -> Result<Bytes, String> {
    let filled = filled_fields(&c);
    let Some(field) = field_for(dt) else {
        if filled.is_empty() && count == 0 {
            return Ok(Bytes::new());
        }
        return Err(format!(
            "{dt} has no typed contents field: send it in raw_input_contents"
        ));
    };
    if let Some(other) = filled.iter().find(|f| **f != field) {
        return Err(format!(
            "unexpected explicit tensor data in {other} for datatype {dt}, expected {field}"
        ));
    }
    let found = match dt {
        DataType::Bool => c.bool_contents.len(),
        DataType::Int8 | DataType::Int16 | DataType::Int32 => c.int_contents.len(),
        DataType::Int64 => c.int64_contents.len(),
        DataType::Uint8 | DataType::Uint16 | DataType::Uint32 => c.uint_contents.len(),
        DataType::Uint64 => c.uint64_contents.len(),
        DataType::Fp32 => c.fp32_contents.len(),
        DataType::Fp64 => c.fp64_contents.len(),
        DataType::Bytes => c.bytes_contents.len(),
        DataType::Fp16 | DataType::Bf16 => 0,
    };
    // Compared before anything is allocated from the shape.
    if found != count {
        return Err(format!(
            "{field} holds {found} elements, but the shape declares {count}"
        ));
    }
    match dt {
        DataType::Bool => Ok(Bytes::from(
            c.bool_contents
                .iter()
                .map(|&b| u8::from(b))
                .collect::<Vec<u8>>(),
        )),
        DataType::Int8 => pack(&c.int_contents, dt, |v| {
            i8::try_from(v).ok().map(i8::to_le_bytes)
        }),
        DataType::Int16 => pack(&c.int_contents, dt, |v| {
            i16::try_from(v).ok().map(i16::to_le_bytes)
        }),
        DataType::Int32 => pack(&c.int_contents, dt, |v| Some(v.to_le_bytes())),
        DataType::Int64 => pack(&c.int64_contents, dt, |v| Some(v.to_le_bytes())),
        DataType::Uint8 => pack(&c.uint_contents, dt, |v| {
            u8::try_from(v).ok().map(u8::to_le_bytes)
        }),
        DataType::Uint16 => pack(&c.uint_contents, dt, |v| {
            u16::try_from(v).ok().map(u16::to_le_bytes)
        }),
        DataType::Uint32 => pack(&c.uint_contents, dt, |v| Some(v.to_le_bytes())),
        DataType::Uint64 => pack(&c.uint64_contents, dt, |v| Some(v.to_le_bytes())),
        DataType::Fp32 => pack(&c.fp32_contents, dt, |v| Some(v.to_le_bytes())),
        DataType::Fp64 => pack(&c.fp64_contents, dt, |v| Some(v.to_le_bytes())),
        DataType::Bytes => {
            let total = c.bytes_contents.iter().fold(0usize, |acc, e| {
                acc.saturating_add(e.len()).saturating_add(4)
            });
            let mut out = Vec::with_capacity(total);
            for (i, e) in c.bytes_contents.iter().enumerate() {
                let len = u32::try_from(e.len())
                    .map_err(|_| format!("element {i} of bytes_contents exceeds 4 GiB"))?;
                out.extend_from_slice(&len.to_le_bytes());
                out.extend_from_slice(e);
            }
            Ok(Bytes::from(out))
        }
        DataType::Fp16 | DataType::Bf16 => Ok(Bytes::new()),
    }
}

/// Encodes a response: every output's data is moved (not copied) into
/// `raw_output_contents`; `contents` stays unset.
pub fn encode_model_infer_response(resp: InferResponse) -> ModelInferResponse {
    let InferResponse {
        model_name,
        model_version,
        id,
        outputs,
        parameters,
        ..
    } = resp;
    let mut raw_output_contents = Vec::with_capacity(outputs.len());
    let outputs = outputs
        .into_iter()
        .map(|t| {
            raw_output_contents.push(t.data);
            model_infer_response::InferOutputTensor {
                name: t.name,
                datatype: t.datatype.as_str().to_string(),
                shape: t.shape,
                parameters: HashMap::new(),
                contents: None,
            }
        })
        .collect();
    ModelInferResponse {
        model_name,
        model_version,
        id,
        parameters: params_to_proto(parameters),
        outputs,
        raw_output_contents,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        proto::inference::model_infer_request::InferRequestedOutputTensor,
        types::{encode_bytes_elements, ErrorKind},
    };

    fn input(
        name: &str,
        datatype: &str,
        shape: Vec<i64>,
        contents: Option<InferTensorContents>,
    ) -> InferInputTensor {
        InferInputTensor {
            name: name.into(),
            datatype: datatype.into(),
            shape,
            parameters: HashMap::new(),
            contents,
        }
    }

    fn simple_raw() -> ModelInferRequest {
        let a: Vec<u8> = (0..16i32).flat_map(|v| v.to_le_bytes()).collect();
        ModelInferRequest {
            model_name: "simple".into(),
            inputs: vec![
                input("INPUT0", "INT32", vec![1, 16], None),
                input("INPUT1", "INT32", vec![1, 16], None),
            ],
            raw_input_contents: vec![Bytes::from(a.clone()), Bytes::from(a)],
            ..Default::default()
        }
    }

    fn typed(name: &str, dt: &str, shape: Vec<i64>, c: InferTensorContents) -> ModelInferRequest {
        ModelInferRequest {
            model_name: "m".into(),
            inputs: vec![input(name, dt, shape, Some(c))],
            ..Default::default()
        }
    }

    fn err_of(r: Result<InferRequest, InferError>) -> String {
        let e = r.unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{}", e.message);
        e.message
    }

    fn param(c: ParameterChoice) -> InferParameter {
        InferParameter {
            parameter_choice: Some(c),
        }
    }

    #[test]
    fn raw_contents_are_moved_without_copy() {
        let req = simple_raw();
        let ptr = req.raw_input_contents[1].as_ptr();
        let r = decode_model_infer_request(req).unwrap();
        assert_eq!(r.inputs.len(), 2);
        assert_eq!(r.inputs[1].data.as_ptr(), ptr);
        assert_eq!(r.inputs[1].datatype, DataType::Int32);
    }

    #[test]
    fn rejects_contents_with_raw_using_triton_message() {
        let mut req = simple_raw();
        req.inputs[0].contents = Some(InferTensorContents {
            int_contents: vec![1; 16],
            ..Default::default()
        });
        // A third raw entry too: the contents message must still win, as in Triton.
        req.raw_input_contents.push(Bytes::from_static(b"x"));
        let msg = err_of(decode_model_infer_request(req));
        assert_eq!(
            msg,
            "contents field must not be specified when using raw_input_contents for 'INPUT0' for model 'simple'"
        );
    }

    #[test]
    fn rejects_raw_count_mismatch() {
        let mut req = simple_raw();
        req.raw_input_contents.pop();
        assert!(err_of(decode_model_infer_request(req)).contains("expected 2 raw_input_contents"));
    }

    #[test]
    fn rejects_raw_size_mismatch() {
        let mut req = simple_raw();
        req.raw_input_contents[1] = Bytes::from_static(&[0; 60]);
        let msg = err_of(decode_model_infer_request(req));
        assert!(
            msg.contains("'INPUT1'") && msg.contains("expecting 64 bytes"),
            "{msg}"
        );
    }

    #[test]
    fn rejects_huge_shape_with_raw_contents() {
        let mut req = simple_raw();
        req.inputs[0].shape = vec![1, 1 << 40];
        assert!(err_of(decode_model_infer_request(req)).contains("expecting 4398046511104 bytes"));
    }

    #[test]
    fn rejects_overflowing_shape() {
        let mut req = simple_raw();
        req.inputs[0].shape = vec![i64::MAX, 4];
        assert!(
            err_of(decode_model_infer_request(req)).contains("more elements than can be addressed")
        );
    }

    #[test]
    fn rejects_negative_dimension() {
        let mut req = simple_raw();
        req.inputs[0].shape = vec![-1, 16];
        assert!(err_of(decode_model_infer_request(req)).contains("negative dimension"));
    }

    #[test]
    fn rejects_unknown_datatype() {
        let mut req = simple_raw();
        req.inputs[0].datatype = "TYPE_INT32".into();
        assert!(err_of(decode_model_infer_request(req)).contains("unknown datatype 'TYPE_INT32'"));
    }

    #[test]
    fn raw_bytes_input_framing_checked() {
        let req = ModelInferRequest {
            model_name: "m".into(),
            inputs: vec![input("S", "BYTES", vec![1], None)],
            raw_input_contents: vec![Bytes::from_static(&[5, 0, 0, 0, b'a'])],
            ..Default::default()
        };
        assert!(err_of(decode_model_infer_request(req)).contains("malformed BYTES"));
    }

    #[test]
    fn raw_bytes_input_count_checked() {
        let req = ModelInferRequest {
            model_name: "m".into(),
            inputs: vec![input("S", "BYTES", vec![3], None)],
            raw_input_contents: vec![encode_bytes_elements(["a", "b"])],
            ..Default::default()
        };
        assert!(
            err_of(decode_model_infer_request(req)).contains("holds 2 BYTES elements, expecting 3")
        );
    }

    #[test]
    fn int8_and_int16_come_from_int_contents() {
        let c = InferTensorContents {
            int_contents: vec![-1, 2],
            ..Default::default()
        };
        let r = decode_model_infer_request(typed("X", "INT8", vec![2], c.clone())).unwrap();
        assert_eq!(&r.inputs[0].data[..], &[0xff, 2]);
        let r = decode_model_infer_request(typed("X", "INT16", vec![2], c)).unwrap();
        assert_eq!(&r.inputs[0].data[..], &[0xff, 0xff, 2, 0]);
    }

    #[test]
    fn rejects_300_for_int8() {
        let c = InferTensorContents {
            int_contents: vec![1, 300],
            ..Default::default()
        };
        let msg = err_of(decode_model_infer_request(typed("X", "INT8", vec![2], c)));
        assert!(
            msg.contains("element 1") && msg.contains("300") && msg.contains("INT8"),
            "{msg}"
        );
    }

    #[test]
    fn rejects_70000_for_uint16() {
        let c = InferTensorContents {
            uint_contents: vec![70000],
            ..Default::default()
        };
        assert!(
            err_of(decode_model_infer_request(typed("X", "UINT16", vec![1], c)))
                .contains("out of range for UINT16")
        );
    }

    #[test]
    fn typed_contents_of_every_field() {
        let cases: Vec<(&str, InferTensorContents, Vec<u8>)> = vec![
            (
                "BOOL",
                InferTensorContents {
                    bool_contents: vec![true, false],
                    ..Default::default()
                },
                vec![1, 0],
            ),
            (
                "INT32",
                InferTensorContents {
                    int_contents: vec![7],
                    ..Default::default()
                },
                7i32.to_le_bytes().into(),
            ),
            (
                "INT64",
                InferTensorContents {
                    int64_contents: vec![-7],
                    ..Default::default()
                },
                (-7i64).to_le_bytes().into(),
            ),
            (
                "UINT8",
                InferTensorContents {
                    uint_contents: vec![255],
                    ..Default::default()
                },
                vec![255],
            ),
            (
                "UINT32",
                InferTensorContents {
                    uint_contents: vec![9],
                    ..Default::default()
                },
                9u32.to_le_bytes().into(),
            ),
            (
                "UINT64",
                InferTensorContents {
                    uint64_contents: vec![u64::MAX],
                    ..Default::default()
                },
                u64::MAX.to_le_bytes().into(),
            ),
            (
                "FP32",
                InferTensorContents {
                    fp32_contents: vec![1.5],
                    ..Default::default()
                },
                1.5f32.to_le_bytes().into(),
            ),
            (
                "FP64",
                InferTensorContents {
                    fp64_contents: vec![-2.5],
                    ..Default::default()
                },
                (-2.5f64).to_le_bytes().into(),
            ),
        ];
        for (dt, c, want) in cases {
            let n = match dt {
                "BOOL" => 2,
                _ => 1,
            };
            let r = decode_model_infer_request(typed("X", dt, vec![n], c)).unwrap();
            assert_eq!(&r.inputs[0].data[..], &want[..], "{dt}");
        }
    }

    #[test]
    fn bytes_contents_are_length_prefixed() {
        let c = InferTensorContents {
            bytes_contents: vec![b"ab".to_vec(), vec![]],
            ..Default::default()
        };
        let r = decode_model_infer_request(typed("S", "BYTES", vec![2], c)).unwrap();
        assert_eq!(r.inputs[0].data, encode_bytes_elements(["ab", ""]));
    }

    #[test]
    fn rejects_typed_count_mismatch() {
        let c = InferTensorContents {
            int_contents: vec![1, 2, 3],
            ..Default::default()
        };
        let msg = err_of(decode_model_infer_request(typed(
            "X",
            "INT32",
            vec![1, 2],
            c,
        )));
        assert!(
            msg.contains("int_contents holds 3 elements, but the shape declares 2"),
            "{msg}"
        );
    }

    #[test]
    fn rejects_huge_shape_with_typed_contents() {
        let c = InferTensorContents {
            fp32_contents: vec![1.0],
            ..Default::default()
        };
        assert!(err_of(decode_model_infer_request(typed(
            "X",
            "FP32",
            vec![1, 1 << 40],
            c
        )))
        .contains("declares 1099511627776"));
    }

    #[test]
    fn rejects_data_in_the_wrong_field() {
        let c = InferTensorContents {
            fp32_contents: vec![1.0],
            ..Default::default()
        };
        let msg = err_of(decode_model_infer_request(typed("X", "INT32", vec![1], c)));
        assert!(
            msg.contains("fp32_contents") && msg.contains("expected int_contents"),
            "{msg}"
        );
    }

    #[test]
    fn rejects_fp16_typed_contents() {
        let c = InferTensorContents {
            fp32_contents: vec![1.0],
            ..Default::default()
        };
        let msg = err_of(decode_model_infer_request(typed("H", "FP16", vec![1], c)));
        assert!(msg.contains("FP16 has no typed contents field"), "{msg}");
    }

    #[test]
    fn missing_contents_for_nonempty_shape_is_an_error() {
        let req = ModelInferRequest {
            model_name: "m".into(),
            inputs: vec![input("X", "INT32", vec![2], None)],
            ..Default::default()
        };
        assert!(err_of(decode_model_infer_request(req)).contains("holds 0 elements"));
    }

    #[test]
    fn shared_memory_inputs_take_no_raw_contents_and_name_their_region() {
        let mut req = simple_raw();
        req.inputs[0].parameters.insert(
            SHARED_MEMORY_REGION.into(),
            param(ParameterChoice::StringParam("no_such_region_grpc".into())),
        );
        // Two raw contents for one input outside shared memory.
        assert!(err_of(decode_model_infer_request(req.clone()))
            .contains("expected 1 raw_input_contents"));
        req.raw_input_contents.remove(0);
        let e = decode_model_infer_request(req).unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotFound);
        assert_eq!(
            e.message,
            "Unable to find shared memory region: 'no_such_region_grpc'"
        );
    }

    #[test]
    fn parameters_of_every_kind_are_kept() {
        let mut req = simple_raw();
        req.id = "7".into();
        req.parameters
            .insert("b".into(), param(ParameterChoice::BoolParam(true)));
        req.parameters
            .insert("i".into(), param(ParameterChoice::Int64Param(-1)));
        req.parameters
            .insert("s".into(), param(ParameterChoice::StringParam("x".into())));
        req.parameters
            .insert("d".into(), param(ParameterChoice::DoubleParam(0.5)));
        req.parameters
            .insert("u".into(), param(ParameterChoice::Uint64Param(u64::MAX)));
        req.parameters.insert(
            "unset".into(),
            InferParameter {
                parameter_choice: None,
            },
        );
        let r = decode_model_infer_request(req).unwrap();
        assert_eq!(r.id, "7");
        assert_eq!(r.parameters["b"], ParamValue::Bool(true));
        assert_eq!(r.parameters["i"], ParamValue::Int(-1));
        assert_eq!(r.parameters["s"], ParamValue::String("x".into()));
        assert_eq!(r.parameters["d"], ParamValue::Double(0.5));
        assert_eq!(r.parameters["u"], ParamValue::Uint(u64::MAX));
        assert!(!r.parameters.contains_key("unset"));
    }

    #[test]
    fn requested_output_class_count_is_kept() {
        let mut req = simple_raw();
        let mut parameters = HashMap::new();
        parameters.insert(
            "class_count".to_string(),
            param(ParameterChoice::Int64Param(3)),
        );
        req.outputs.push(InferRequestedOutputTensor {
            name: "OUTPUT0".into(),
            parameters,
        });
        let r = decode_model_infer_request(req).unwrap();
        assert_eq!(r.outputs[0].name, "OUTPUT0");
        assert_eq!(r.outputs[0].class_count(), Some(3));
    }

    #[test]
    fn response_outputs_go_to_raw_output_contents_without_copy() {
        let data = Bytes::from(vec![1u8, 0, 0, 0]);
        let ptr = data.as_ptr();
        let mut parameters = Parameters::new();
        parameters.insert("triton_final_response".into(), ParamValue::Bool(true));
        let resp = InferResponse {
            model_name: "simple".into(),
            model_version: "1".into(),
            id: "x".into(),
            outputs: vec![Tensor::new("OUTPUT0", DataType::Int32, vec![1, 1], data)],
            parameters,
            ..Default::default()
        };
        let m = encode_model_infer_response(resp);
        assert_eq!(
            (
                m.model_name.as_str(),
                m.model_version.as_str(),
                m.id.as_str()
            ),
            ("simple", "1", "x")
        );
        assert_eq!(m.outputs[0].datatype, "INT32");
        assert_eq!(m.outputs[0].shape, vec![1, 1]);
        assert!(m.outputs[0].contents.is_none());
        assert_eq!(m.raw_output_contents[0].as_ptr(), ptr);
        assert_eq!(
            m.parameters["triton_final_response"].parameter_choice,
            Some(ParameterChoice::BoolParam(true))
        );
    }
}
