//! Inference response bodies: JSON, with binary outputs appended after it.

use bytes::Bytes;
use serde::Serialize;

use super::{
    json_data::check_layout, json_data::JsonData, json_string_stop, ParamsJson, BINARY_DATA,
    BINARY_DATA_OUTPUT,
};
use crate::types::{InferError, InferResponse, ParamValue, Parameters, RequestedOutput, Tensor};

/// An encoded response body.
#[derive(Debug, Clone, PartialEq)]
pub struct EncodedResponse {
    pub body: Bytes,
    /// `Some(n)`: the body is `n` bytes of JSON followed by binary outputs;
    /// the caller sends `Inference-Header-Content-Length: n` and
    /// `application/octet-stream`. `None`: pure JSON (`application/json`).
    pub json_header_length: Option<usize>,
}

#[derive(Serialize)]
struct ResponseJson<'a> {
    model_name: &'a str,
    model_version: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<ParamsJson<'a>>,
    outputs: Vec<OutputJson<'a>>,
}

#[derive(Serialize)]
struct OutputJson<'a> {
    name: &'a str,
    datatype: &'static str,
    shape: &'a [i64],
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<BinaryParams>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<JsonData<'a>>,
}

#[derive(Serialize)]
struct BinaryParams {
    binary_data_size: usize,
}

/// How the outputs are to be answered: read from the request before the
/// request is handed to the scheduler (which takes it), so its requested
/// outputs and parameters need not be cloned for the encoder.
#[derive(Debug, Default)]
pub struct AnswerForm {
    /// The requested outputs that say something about their own form.
    /// Names are unique: a request naming an output twice is refused
    /// before it is answered.
    named: Vec<(String, OwnForm)>,
    /// The request's `binary_data_output`.
    binary_by_default: bool,
}

#[derive(Debug, Clone, Copy)]
struct OwnForm {
    /// The output's own `binary_data`, when a boolean.
    binary: Option<bool>,
    /// Written into a shared-memory region the request named.
    in_shm: bool,
}

impl AnswerForm {
    pub fn of(requested: &[RequestedOutput], request_parameters: &Parameters) -> Self {
        let named = requested
            .iter()
            .filter_map(|r| {
                let binary = match r.parameters.get(BINARY_DATA) {
                    Some(ParamValue::Bool(b)) => Some(*b),
                    _ => None,
                };
                let in_shm = crate::shm::names_region(&r.parameters);
                (binary.is_some() || in_shm).then(|| (r.name.clone(), OwnForm { binary, in_shm }))
            })
            .collect();
        Self {
            named,
            binary_by_default: matches!(
                request_parameters.get(BINARY_DATA_OUTPUT),
                Some(ParamValue::Bool(true))
            ),
        }
    }

    fn own(&self, name: &str) -> Option<OwnForm> {
        self.named.iter().find(|(n, _)| n == name).map(|(_, f)| *f)
    }

    /// Triton's rule: an output's own `binary_data` parameter decides;
    /// without one, the request's `binary_data_output` does; by default
    /// JSON.
    fn binary(&self, name: &str) -> bool {
        self.own(name)
            .and_then(|f| f.binary)
            .unwrap_or(self.binary_by_default)
    }

    fn in_shm(&self, name: &str) -> bool {
        self.own(name).is_some_and(|f| f.in_shm)
    }
}

/// Checks that an output's data agrees with its shape before any of it is
/// written: a backend bug must give a clean 500, not a malformed body.
fn check_output(t: &Tensor) -> Result<(), InferError> {
    let found = check_layout(t.datatype, &t.data).map_err(|e| {
        InferError::internal(format!("output '{}' has malformed data: {e}", t.name))
    })?;
    if t.element_count() != Some(found) {
        return Err(InferError::internal(format!(
            "output '{}' holds {found} elements, but its shape {:?} declares {}",
            t.name,
            t.shape,
            t.element_count()
                .map_or_else(|| "an invalid count".into(), |n| n.to_string())
        )));
    }
    Ok(())
}

/// Encodes `resp`. `requested` and `request_parameters` are the request's
/// requested outputs and parameters, which pick JSON or binary per output.
pub fn encode_infer_response(
    resp: &InferResponse,
    form: &AnswerForm,
) -> Result<EncodedResponse, InferError> {
    let mut binary: Vec<&Bytes> = Vec::new();
    let mut outputs = Vec::with_capacity(resp.outputs.len());
    // A rough size so typical responses serialize without regrowing.
    let mut estimate = 128usize;
    for t in &resp.outputs {
        if form.in_shm(&t.name) {
            // Written into the client's region: datatype and shape only.
            outputs.push(OutputJson {
                name: &t.name,
                datatype: t.datatype.as_str(),
                shape: &t.shape,
                parameters: None,
                data: None,
            });
            continue;
        }
        check_output(t)?;
        let is_binary = form.binary(&t.name);
        estimate = estimate.saturating_add(64 + t.name.len());
        let (parameters, data) = if is_binary {
            binary.push(&t.data);
            estimate = estimate.saturating_add(t.data.len());
            (
                Some(BinaryParams {
                    binary_data_size: t.data.len(),
                }),
                None,
            )
        } else {
            // Decimal text is a few times the raw size.
            estimate = estimate.saturating_add(t.data.len().saturating_mul(3));
            (
                None,
                Some(JsonData {
                    datatype: t.datatype,
                    data: &t.data,
                }),
            )
        };
        outputs.push(OutputJson {
            name: &t.name,
            datatype: t.datatype.as_str(),
            shape: &t.shape,
            parameters,
            data,
        });
    }
    let header = ResponseJson {
        model_name: &resp.model_name,
        model_version: &resp.model_version,
        id: &resp.id,
        parameters: (!resp.parameters.is_empty()).then_some(ParamsJson(&resp.parameters)),
        outputs,
    };
    let mut body = Vec::with_capacity(estimate);
    write_header(&mut body, &header)
        .map_err(|e| InferError::internal(format!("failed to serialize the response: {e}")))?;
    if binary.is_empty() {
        return Ok(EncodedResponse {
            body: Bytes::from(body),
            json_header_length: None,
        });
    }
    let json_len = body.len();
    for data in binary {
        body.extend_from_slice(data);
    }
    Ok(EncodedResponse {
        body: Bytes::from(body),
        json_header_length: Some(json_len),
    })
}

/// Writes `h` as `serde_json::to_writer` writes its derived form (a test
/// holds the two to the same bytes), but with the keys written whole and
/// each name copied as it is unless it needs escaping: serde_json escapes
/// every key and string byte by byte, which cost a tenth of the shard's
/// instructions on a small request. Parameters and JSON data still go
/// through serde.
fn write_header(out: &mut Vec<u8>, h: &ResponseJson<'_>) -> Result<(), serde_json::Error> {
    let mut number = itoa::Buffer::new();
    out.extend_from_slice(b"{\"model_name\":");
    write_str(out, h.model_name)?;
    out.extend_from_slice(b",\"model_version\":");
    write_str(out, h.model_version)?;
    if !h.id.is_empty() {
        out.extend_from_slice(b",\"id\":");
        write_str(out, h.id)?;
    }
    if let Some(parameters) = &h.parameters {
        out.extend_from_slice(b",\"parameters\":");
        serde_json::to_writer(&mut *out, parameters)?;
    }
    out.extend_from_slice(b",\"outputs\":[");
    for (i, o) in h.outputs.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"name\":");
        write_str(out, o.name)?;
        out.extend_from_slice(b",\"datatype\":");
        write_str(out, o.datatype)?;
        out.extend_from_slice(b",\"shape\":[");
        for (j, dim) in o.shape.iter().enumerate() {
            if j > 0 {
                out.push(b',');
            }
            out.extend_from_slice(number.format(*dim).as_bytes());
        }
        out.push(b']');
        if let Some(p) = &o.parameters {
            out.extend_from_slice(b",\"parameters\":{\"binary_data_size\":");
            out.extend_from_slice(number.format(p.binary_data_size).as_bytes());
            out.push(b'}');
        }
        if let Some(data) = &o.data {
            out.extend_from_slice(b",\"data\":");
            serde_json::to_writer(&mut *out, data)?;
        }
        out.push(b'}');
    }
    out.extend_from_slice(b"]}");
    Ok(())
}

/// A JSON string: copied between quotes, or escaped by serde_json where
/// it holds a quote, a backslash or a control character.
fn write_str(out: &mut Vec<u8>, s: &str) -> Result<(), serde_json::Error> {
    if json_string_stop(s.as_bytes(), 0).is_some() {
        return serde_json::to_writer(&mut *out, s);
    }
    out.push(b'"');
    out.extend_from_slice(s.as_bytes());
    out.push(b'"');
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{json, Value};

    use super::*;
    use crate::types::{encode_bytes_elements, DataType, ErrorKind};

    fn int32(name: &str, values: &[i32]) -> Tensor {
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor::new(
            name,
            DataType::Int32,
            vec![1, values.len() as i64],
            Bytes::from(data),
        )
    }

    fn response(outputs: Vec<Tensor>) -> InferResponse {
        InferResponse {
            model_name: "simple".into(),
            model_version: "1".into(),
            id: String::new(),
            outputs,
            ..Default::default()
        }
    }

    fn requested(name: &str, binary: Option<bool>) -> RequestedOutput {
        let mut parameters = Parameters::new();
        if let Some(b) = binary {
            parameters.insert(BINARY_DATA.into(), ParamValue::Bool(b));
        }
        RequestedOutput {
            name: name.into(),
            parameters,
        }
    }

    fn binary_output_param(on: bool) -> Parameters {
        let mut p = Parameters::new();
        p.insert(BINARY_DATA_OUTPUT.into(), ParamValue::Bool(on));
        p
    }

    fn json_of(e: &EncodedResponse) -> Value {
        let end = e.json_header_length.unwrap_or(e.body.len());
        serde_json::from_slice(&e.body[..end]).unwrap()
    }

    #[test]
    fn pure_json_response_shape() {
        let e = encode_infer_response(
            &response(vec![int32("OUTPUT0", &[1, -2])]),
            &AnswerForm::of(&[], &Parameters::new()),
        )
        .unwrap();
        assert_eq!(e.json_header_length, None);
        assert_eq!(
            json_of(&e),
            json!({"model_name": "simple", "model_version": "1",
                   "outputs": [{"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 2], "data": [1, -2]}]})
        );
    }

    #[test]
    fn id_and_parameters_are_included_when_set() {
        let mut r = response(vec![]);
        r.id = "abc".into();
        r.parameters
            .insert("triton_final_response".into(), ParamValue::Bool(true));
        let v =
            json_of(&encode_infer_response(&r, &AnswerForm::of(&[], &Parameters::new())).unwrap());
        assert_eq!(v["id"], "abc");
        assert_eq!(v["parameters"], json!({"triton_final_response": true}));
    }

    #[test]
    fn per_output_binary_data_true_goes_binary() {
        let r = response(vec![int32("A", &[1, 2]), int32("B", &[3, 4])]);
        let e = encode_infer_response(
            &r,
            &AnswerForm::of(
                &[requested("A", None), requested("B", Some(true))],
                &Parameters::new(),
            ),
        )
        .unwrap();
        let n = e.json_header_length.unwrap();
        let v = json_of(&e);
        assert_eq!(v["outputs"][0]["data"], json!([1, 2]));
        assert_eq!(
            v["outputs"][1]["parameters"],
            json!({"binary_data_size": 8})
        );
        assert!(v["outputs"][1].get("data").is_none());
        assert_eq!(&e.body[n..], &r.outputs[1].data[..]);
    }

    #[test]
    fn request_level_binary_data_output_applies_to_all() {
        let r = response(vec![int32("A", &[1]), int32("B", &[2])]);
        let e =
            encode_infer_response(&r, &AnswerForm::of(&[], &binary_output_param(true))).unwrap();
        let n = e.json_header_length.unwrap();
        assert_eq!(&e.body[n..], &[1, 0, 0, 0, 2, 0, 0, 0]);
    }

    #[test]
    fn per_output_false_overrides_request_level_true() {
        let r = response(vec![int32("A", &[1]), int32("B", &[2])]);
        let e = encode_infer_response(
            &r,
            &AnswerForm::of(&[requested("A", Some(false))], &binary_output_param(true)),
        )
        .unwrap();
        let v = json_of(&e);
        assert_eq!(v["outputs"][0]["data"], json!([1]));
        assert_eq!(v["outputs"][1]["parameters"]["binary_data_size"], 4);
        assert_eq!(e.body.len() - e.json_header_length.unwrap(), 4);
    }

    #[test]
    fn binary_outputs_follow_json_in_output_order() {
        let r = response(vec![int32("A", &[1]), int32("B", &[2]), int32("C", &[3])]);
        let req = [
            requested("C", Some(true)),
            requested("A", Some(true)),
            requested("B", Some(false)),
        ];
        let e = encode_infer_response(&r, &AnswerForm::of(&req, &Parameters::new())).unwrap();
        let n = e.json_header_length.unwrap();
        assert_eq!(&e.body[n..], &[1, 0, 0, 0, 3, 0, 0, 0]);
    }

    #[test]
    fn bytes_output_as_json_strings() {
        let t = Tensor::new(
            "S",
            DataType::Bytes,
            vec![2],
            encode_bytes_elements(["x", "yz"]),
        );
        let v = json_of(
            &encode_infer_response(&response(vec![t]), &AnswerForm::of(&[], &Parameters::new()))
                .unwrap(),
        );
        assert_eq!(v["outputs"][0]["data"], json!(["x", "yz"]));
    }

    #[test]
    fn bytes_output_in_binary_keeps_raw_framing() {
        let raw = encode_bytes_elements([&[0xffu8, 0][..]]);
        let t = Tensor::new("S", DataType::Bytes, vec![1], raw.clone());
        let e = encode_infer_response(
            &response(vec![t]),
            &AnswerForm::of(&[requested("S", Some(true))], &Parameters::new()),
        )
        .unwrap();
        assert_eq!(&e.body[e.json_header_length.unwrap()..], &raw[..]);
    }

    #[test]
    fn fp16_output_as_json_floats() {
        let data: Vec<u8> = [1.5f32, -0.25]
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect();
        let t = Tensor::new("H", DataType::Fp16, vec![2], Bytes::from(data));
        let v = json_of(
            &encode_infer_response(&response(vec![t]), &AnswerForm::of(&[], &Parameters::new()))
                .unwrap(),
        );
        assert_eq!(v["outputs"][0]["data"], json!([1.5, -0.25]));
    }

    #[test]
    fn output_data_not_matching_shape_is_internal_error() {
        let mut t = int32("A", &[1, 2]);
        t.shape = vec![3];
        let err =
            encode_infer_response(&response(vec![t]), &AnswerForm::of(&[], &Parameters::new()))
                .unwrap_err();
        assert_eq!(err.kind, ErrorKind::Internal);
    }

    #[test]
    fn partial_element_is_internal_error() {
        let t = Tensor::new(
            "A",
            DataType::Int32,
            vec![1],
            Bytes::from_static(&[1, 2, 3]),
        );
        let err =
            encode_infer_response(&response(vec![t]), &AnswerForm::of(&[], &Parameters::new()))
                .unwrap_err();
        assert_eq!(err.kind, ErrorKind::Internal);
    }

    fn name() -> impl Strategy<Value = String> {
        prop::collection::vec(
            prop::sample::select(vec![
                'a', 'Z', '0', '_', '"', '\\', '\n', '\u{1}', '\u{7f}', 'é', '€',
            ]),
            0..6,
        )
        .prop_map(|c| c.into_iter().collect())
    }

    proptest! {
        /// The hand-written header is serde_json's, byte for byte.
        #[test]
        fn header_is_written_as_serde_writes_it(
            model in name(),
            version in name(),
            id in name(),
            params in prop::collection::vec((name(), prop_oneof![
                any::<bool>().prop_map(ParamValue::Bool),
                any::<i64>().prop_map(ParamValue::Int),
                any::<f64>().prop_map(ParamValue::Double),
                name().prop_map(ParamValue::String),
            ]), 0..3),
            outputs in prop::collection::vec(
                (name(), prop::collection::vec(any::<i64>(), 0..3), any::<usize>(),
                 prop::collection::vec(any::<i32>(), 0..3), 0..3u8),
                0..3,
            ),
        ) {
            let parameters: Parameters = params.into_iter().collect();
            let data: Vec<Vec<u8>> = outputs
                .iter()
                .map(|o| o.3.iter().flat_map(|v| v.to_le_bytes()).collect())
                .collect();
            let header = ResponseJson {
                model_name: &model,
                model_version: &version,
                id: &id,
                parameters: (!parameters.is_empty()).then_some(ParamsJson(&parameters)),
                outputs: outputs
                    .iter()
                    .zip(&data)
                    .map(|((name, shape, size, _, form), data)| OutputJson {
                        name,
                        datatype: DataType::Int32.as_str(),
                        shape,
                        parameters: (*form == 1).then_some(BinaryParams { binary_data_size: *size }),
                        data: (*form == 2).then_some(JsonData { datatype: DataType::Int32, data }),
                    })
                    .collect(),
            };
            let mut written = Vec::new();
            write_header(&mut written, &header).unwrap();
            let by_serde = serde_json::to_vec(&header).unwrap();
            prop_assert_eq!(String::from_utf8_lossy(&written), String::from_utf8_lossy(&by_serde));
        }
    }
}
