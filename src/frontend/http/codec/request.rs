//! `POST /v2/models/<m>[/versions/<v>]/infer` request bodies.
//!
//! The JSON is read in two steps. First the envelope ([`envelope`]), with
//! each input's `data` kept as unparsed text (a slice of the body): every
//! input's name, datatype and shape is checked (against the model's
//! [`IoSpec`] when the caller has it) before any tensor is sized. Then
//! each `data` is streamed straight into its tensor's buffer
//! ([`json_data::decode`]), and each binary input becomes a slice of the
//! body.

use bytes::Bytes;

use super::{
    envelope::{self, InputJson, OutputJson},
    json_data, show_param, BINARY_DATA, BINARY_DATA_OUTPUT, BINARY_DATA_SIZE, CLASSIFICATION,
    SHARED_MEMORY_REGION,
};
use crate::{
    model::IoSpec,
    types::{
        bytes_elements, clip, element_count, show_shape, DataType, InferError, InferRequest,
        ParamValue, RequestedOutput, Tensor,
    },
};

/// An input whose header has been checked, its data not yet read.
struct CheckedInput<'a> {
    name: String,
    datatype: DataType,
    shape: Vec<i64>,
    /// Elements the shape declares.
    count: usize,
    source: Source<'a>,
}

enum Source<'a> {
    /// JSON `data` text.
    Json(&'a str),
    /// The next `binary_data_size` bytes after the JSON header.
    Binary(usize),
    /// A registered system shared memory region.
    Shm(crate::shm::ShmRef),
}

/// Decodes an inference request body.
///
/// `header_length` is the parsed `Inference-Header-Content-Length`: when
/// present the body is that many bytes of JSON followed by the binary
/// inputs (each input with `binary_data_size` takes the next chunk, in
/// input order); when absent the whole body is JSON. Binary tensors are
/// `Bytes::slice`s of `body`, never copies.
pub fn decode_infer_request(
    body: Bytes,
    header_length: Option<usize>,
    model_name: &str,
    model_version: &str,
) -> Result<InferRequest, InferError> {
    decode_infer_request_for(body, header_length, model_name, model_version, None)
}

/// [`decode_infer_request`], with each input's name, datatype and shape
/// checked against `io` (the addressed model's inputs, when the caller
/// could resolve it) before any data is decoded: a request the model
/// would refuse costs no more than parsing its envelope.
pub fn decode_infer_request_for(
    body: Bytes,
    header_length: Option<usize>,
    model_name: &str,
    model_version: &str,
    io: Option<&IoSpec>,
) -> Result<InferRequest, InferError> {
    let model = clip(model_name);
    let json_len = match header_length {
        None => body.len(),
        Some(0) => return decode_raw_request(body, model_name, model_version, io),
        // Triton's range check, and its wording.
        Some(n) if n > body.len() => {
            return Err(InferError::invalid(format!(
                "inference header size should be in range (0, {}), got: {n}",
                body.len()
            )))
        }
        Some(n) => n,
    };
    let header = envelope::read(&body[..json_len]).map_err(|e| {
        let hint = match header_length {
            Some(n) => format!(
                " (Inference-Header-Content-Length is {n}: \
                 it must be the exact byte length of the JSON header)"
            ),
            None => String::new(),
        };
        // serde quotes offending values whole: clip them.
        InferError::invalid(format!(
            "failed to parse the request JSON buffer: {}{hint}",
            clip(&e.to_string())
        ))
    })?;

    let mut batch = None;
    let checked = header
        .inputs
        .into_iter()
        .map(|input| check_input(input, header_length.is_some(), &model, io, &mut batch))
        .collect::<Result<Vec<_>, _>>()?;

    let mut cursor = json_len;
    let mut inputs = Vec::with_capacity(checked.len());
    for input in checked {
        inputs.push(decode_data(input, &body, &mut cursor, &model)?);
    }
    if cursor != body.len() {
        return Err(InferError::invalid(format!(
            // cursor never passes body.len(): every chunk end was checked.
            "unexpected additional input data for model '{model}': \
             {} bytes follow the last binary input",
            body.len() - cursor
        )));
    }

    let outputs = header
        .outputs
        .unwrap_or_default()
        .into_iter()
        .map(|o| decode_output(o, &model))
        .collect::<Result<Vec<_>, _>>()?;

    Ok(InferRequest {
        model_name: model_name.to_string(),
        model_version: model_version.to_string(),
        id: header.id.unwrap_or_default(),
        inputs,
        outputs,
        parameters: header.parameters.0,
        trace: Default::default(),
    })
}

/// A raw binary request (`Inference-Header-Content-Length: 0`): the whole
/// body is the data of the model's one input, its datatype and shape taken
/// from the configuration (a batch of 1 where the model batches, the one
/// `-1` dimension deduced from the body's size), every output answered in
/// binary. As Triton's core `InferenceRequest::Normalize`: a BYTES input
/// must be of one element, and its body is that element (the length prefix
/// is added here).
fn decode_raw_request(
    body: Bytes,
    model_name: &str,
    model_version: &str,
    io: Option<&IoSpec>,
) -> Result<InferRequest, InferError> {
    let request = |inputs| InferRequest {
        model_name: model_name.to_string(),
        model_version: model_version.to_string(),
        id: String::new(),
        inputs,
        outputs: Vec::new(),
        parameters: [(BINARY_DATA_OUTPUT.to_string(), ParamValue::Bool(true))]
            .into_iter()
            .collect(),
        trace: Default::default(),
    };
    // A model that did not resolve: the core path gives its answer
    // (unknown, unavailable), as for any other request to it.
    let Some(io) = io else {
        return Ok(request(Vec::new()));
    };
    let [spec] = io.inputs.as_slice() else {
        return Err(crate::error_texts::raw_request_input_count(
            model_name,
            io.inputs.len(),
        ));
    };
    let mut shape = Vec::with_capacity(spec.dims.len() + 1);
    if io.max_batch_size != 0 {
        shape.push(1);
    }
    let mut variable = None;
    // Elements of the fixed dimensions; saturating, as a shape that large
    // cannot match any body and is refused by the size check.
    let mut fixed: usize = 1;
    for &dim in &spec.dims {
        if dim < 0 {
            if variable.is_some() {
                return Err(crate::error_texts::raw_input_shape_ambiguous(&spec.name));
            }
            variable = Some(shape.len());
        } else {
            fixed = fixed.saturating_mul(usize::try_from(dim).unwrap_or(usize::MAX));
        }
        shape.push(dim);
    }
    let data = match spec.datatype.element_size() {
        None => {
            if variable.is_some() || fixed != 1 {
                return Err(crate::error_texts::raw_bytes_input_shape(&spec.name));
            }
            let len = u32::try_from(body.len()).map_err(|_| {
                crate::error_texts::input_byte_size_mismatch(
                    &spec.name,
                    model_name,
                    u64::from(u32::MAX),
                    body.len() as u64,
                )
            })?;
            let mut data = Vec::with_capacity(body.len() + 4);
            data.extend_from_slice(&len.to_le_bytes());
            data.extend_from_slice(&body);
            Bytes::from(data)
        }
        Some(elem) => {
            if let Some(axis) = variable {
                // Triton divides and lets the size check refuse a remainder.
                let per_row = fixed.saturating_mul(elem);
                // A zero-sized row (a 0 dimension) deduces 0 rows.
                let rows = body.len().checked_div(per_row).unwrap_or(0);
                shape[axis] = i64::try_from(rows).unwrap_or(i64::MAX);
            }
            let expected = fixed.checked_mul(elem).and_then(|n| {
                let rows = variable.map_or(Some(1), |axis| usize::try_from(shape[axis]).ok())?;
                n.checked_mul(rows)
            });
            if expected != Some(body.len()) {
                return Err(crate::error_texts::input_byte_size_mismatch(
                    &spec.name,
                    model_name,
                    expected.map_or(u64::MAX, |n| n as u64),
                    body.len() as u64,
                ));
            }
            body
        }
    };
    Ok(request(vec![Tensor {
        name: spec.name.clone(),
        datatype: spec.datatype,
        shape,
        data,
    }]))
}

/// Checks an input's header: datatype, shape, where its data is, and
/// (with `io`) that the model takes it in this datatype and shape.
fn check_input<'a>(
    input: InputJson<'a>,
    has_header_length: bool,
    model: &str,
    io: Option<&IoSpec>,
    batch: &mut Option<i64>,
) -> Result<CheckedInput<'a>, InferError> {
    let name = clip(&input.name);
    let invalid =
        |msg: String| InferError::invalid(format!("input '{name}' for model '{model}': {msg}"));
    let shape = &input.shape;

    let datatype = DataType::from_wire(&input.datatype)
        .ok_or_else(|| invalid(format!("unknown datatype '{}'", clip(&input.datatype))))?;
    if let Some(d) = shape.iter().find(|&&d| d < 0) {
        return Err(invalid(format!(
            "shape {} has a negative dimension {d}",
            show_shape(shape)
        )));
    }
    // Only a count: nothing is sized from the shape until the data that
    // backs it has been found to agree.
    let count = element_count(shape).ok_or_else(|| {
        invalid(format!(
            "shape {} has more elements than can be addressed",
            show_shape(shape)
        ))
    })?;

    let params = &input.parameters;
    let binary_size = params.binary_data_size.as_ref();
    let shm = crate::shm::names_region(&params.shared_memory);
    let has_data = input.data.is_some();
    if usize::from(has_data) + usize::from(binary_size.is_some()) + usize::from(shm) != 1 {
        let mut set = String::new();
        for (flag, field) in [
            (has_data, "data"),
            (binary_size.is_some(), BINARY_DATA_SIZE),
            (shm, SHARED_MEMORY_REGION),
        ] {
            if flag {
                set.push_str(&format!(" '{field}'"));
            }
        }
        let but = if set.is_empty() {
            " no field is set".to_string()
        } else {
            format!(" set{set}")
        };
        // Triton's wording, with the input named.
        return Err(invalid(format!(
            "Input must set only one of the following fields: 'data', \
             'binary_data_size' in 'parameters', 'shared_memory_region' in 'parameters'. But{but}"
        )));
    }
    // The context string is only built for an input that names a region.
    let shm_ref = if shm {
        crate::shm::shm_ref(
            &params.shared_memory,
            &format!("input '{name}' for model '{model}'"),
        )?
    } else {
        None
    };
    if let Some(io) = io {
        io.check_input(model, &input.name, datatype, shape, batch)?;
    }

    let source = match (input.data, binary_size) {
        _ if shm_ref.is_some() => match shm_ref {
            Some(r) => Source::Shm(r),
            None => Source::Binary(0),
        },
        (Some(data), _) => Source::Json(data.0),
        (None, Some(size)) => {
            let size = match size {
                ParamValue::Int(n) => usize::try_from(*n).ok(),
                ParamValue::Uint(n) => usize::try_from(*n).ok(),
                _ => None,
            }
            .ok_or_else(|| {
                invalid(format!(
                    "'{BINARY_DATA_SIZE}' must be a non-negative integer, got {}",
                    show_param(size)
                ))
            })?;
            if size > 0 && !has_header_length {
                return Err(invalid(
                    "must specify valid 'Inference-Header-Content-Length' in request header and \
                     'binary_data_size' when passing inputs in binary data format"
                        .into(),
                ));
            }
            if let Some(elem) = datatype.element_size() {
                // Checked against the shape before touching the body.
                let needed = count.checked_mul(elem);
                if needed != Some(size) {
                    // Triton's text; a size past u64 cannot be addressed anyway.
                    let needed = needed.map_or(u64::MAX, |n| n as u64);
                    return Err(crate::error_texts::input_byte_size_mismatch(
                        &input.name,
                        model,
                        needed,
                        size as u64,
                    ));
                }
            }
            Source::Binary(size)
        }
        // Excluded by the one-of check above.
        (None, None) => Source::Binary(0),
    };
    Ok(CheckedInput {
        name: input.name,
        datatype,
        shape: input.shape,
        count,
        source,
    })
}

/// Reads a checked input's data: decodes its JSON, or slices its binary
/// chunk at `cursor` (advanced past it).
fn decode_data(
    input: CheckedInput<'_>,
    body: &Bytes,
    cursor: &mut usize,
    model: &str,
) -> Result<Tensor, InferError> {
    let CheckedInput {
        name,
        datatype,
        shape,
        count,
        source,
    } = input;
    let shown = clip(&name);
    let invalid =
        |msg: String| InferError::invalid(format!("input '{shown}' for model '{model}': {msg}"));
    let data = match source {
        Source::Json(data) => json_data::decode(datatype, data, count)
            .map_err(|e| invalid(format!("Unable to parse 'data': {}", e.describe(datatype))))?,
        Source::Shm(r) => crate::shm::read_input(&r, datatype, count, &shape, &name, model)?,
        Source::Binary(size) => {
            let start = *cursor;
            let end = start
                .checked_add(size)
                .filter(|&e| e <= body.len())
                .ok_or_else(|| {
                    InferError::invalid(format!(
                        "unexpected size for input '{shown}', expecting {} additional bytes \
                         for model '{model}'",
                        // The chunk runs past the body: size > what is left after start.
                        size - (body.len() - start)
                    ))
                })?;
            *cursor = end;
            let data = body.slice(start..end);
            if datatype == DataType::Bytes {
                let n = bytes_elements(&data)
                    .map_err(|e| invalid(format!("malformed BYTES binary data: {e}")))?
                    .count();
                if n != count {
                    return Err(invalid(format!(
                        "BYTES binary data holds {n} elements, but shape {} declares {count}",
                        show_shape(&shape)
                    )));
                }
            }
            data
        }
    };
    Ok(Tensor {
        name,
        datatype,
        shape,
        data,
    })
}

fn decode_output(o: OutputJson, model: &str) -> Result<RequestedOutput, InferError> {
    let parameters = o.parameters.0;
    if let Some(v) = parameters.get(BINARY_DATA) {
        if !matches!(v, ParamValue::Bool(_)) {
            return Err(InferError::invalid(format!(
                "'{BINARY_DATA}' of requested output '{}' for model '{model}' must be a boolean",
                clip(&o.name)
            )));
        }
    }
    if let Some(v) = parameters.get(CLASSIFICATION) {
        if !matches!(v, ParamValue::Int(0..) | ParamValue::Uint(_)) {
            return Err(InferError::invalid(format!(
                "Unable to set '{CLASSIFICATION}' of requested output '{}' for model '{model}': \
                 it must be a non-negative integer",
                clip(&o.name)
            )));
        }
    }
    Ok(RequestedOutput {
        name: o.name,
        parameters,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::types::{encode_bytes_elements, ErrorKind};

    fn decode_json(v: Value) -> Result<InferRequest, InferError> {
        decode_infer_request(Bytes::from(v.to_string()), None, "simple", "")
    }

    /// A body of JSON header + binary chunks, and its header length.
    fn binary_body(header: Value, chunks: &[&[u8]]) -> (Bytes, usize) {
        let mut body = header.to_string().into_bytes();
        let n = body.len();
        for c in chunks {
            body.extend_from_slice(c);
        }
        (Bytes::from(body), n)
    }

    fn err_of(r: Result<InferRequest, InferError>) -> String {
        let e = r.unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{}", e.message);
        e.message
    }

    fn int32_input(name: &str, data: Value) -> Value {
        json!({"name": name, "datatype": "INT32", "shape": [1, 2], "data": data})
    }

    fn simple_io() -> IoSpec {
        let input = |n: &str| crate::model::InputSpec {
            name: n.into(),
            datatype: DataType::Int32,
            dims: vec![2],
            reshape: None,
            optional: false,
        };
        IoSpec {
            max_batch_size: 8,
            inputs: vec![input("X"), input("Y")],
            outputs: Vec::new(),
        }
    }

    fn decode_for(v: Value) -> Result<InferRequest, InferError> {
        decode_infer_request_for(
            Bytes::from(v.to_string()),
            None,
            "simple",
            "",
            Some(&simple_io()),
        )
    }

    #[test]
    fn checks_inputs_against_the_model_before_their_data() {
        // The data is bad too, but the shape is what the model refuses.
        let msg = err_of(decode_for(json!({"inputs": [
            {"name": "X", "datatype": "INT32", "shape": [1, 3], "data": ["not", "ints", 0]}
        ]})));
        assert!(msg.contains("unexpected shape for input 'X'"), "{msg}");
        let msg = err_of(decode_for(json!({"inputs": [
            {"name": "X", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}
        ]})));
        assert!(msg.contains("data-type is 'FP32'"), "{msg}");
        let msg = err_of(decode_for(json!({"inputs": [
            {"name": "Z", "datatype": "INT32", "shape": [1, 2], "data": [1, 2]}
        ]})));
        assert!(msg.contains("unexpected inference input 'Z'"), "{msg}");
    }

    #[test]
    fn every_header_is_checked_before_any_data() {
        // X's data is wrong, but Y's header is what fails first.
        let msg = err_of(decode_for(json!({"inputs": [
            {"name": "X", "datatype": "INT32", "shape": [1, 2], "data": [1]},
            {"name": "Y", "datatype": "INT32", "shape": [9, 2], "data": [1, 2]}
        ]})));
        assert!(msg.contains("batch-size must be <= 8"), "{msg}");
    }

    #[test]
    fn a_huge_batch_is_refused_by_the_model_check() {
        let msg = err_of(decode_for(json!({"inputs": [
            {"name": "X", "datatype": "INT32", "shape": [1u64 << 40, 2], "data": [1, 2]}
        ]})));
        assert!(msg.contains("batch-size must be <= 8"), "{msg}");
    }

    #[test]
    fn a_valid_request_decodes_against_the_model() {
        let r = decode_for(json!({"inputs": [
            {"name": "X", "datatype": "INT32", "shape": [2, 2], "data": [[1, 2], [3, 4]]},
            {"name": "Y", "datatype": "INT32", "shape": [2, 2], "data": [1, 2, 3, 4]}
        ]}))
        .unwrap();
        assert_eq!(r.inputs[0].data, r.inputs[1].data);
    }

    #[test]
    fn client_names_are_clipped_in_errors() {
        let long = "n".repeat(1 << 20);
        let msg = err_of(decode_infer_request(
            Bytes::from(
                json!({"inputs": [{"name": long, "datatype": long, "shape": [1], "data": [1]}]})
                    .to_string(),
            ),
            None,
            &long,
            "",
        ));
        assert!(msg.len() < 1024, "{} bytes", msg.len());
        assert!(
            msg.contains(&format!("({} bytes)", 1 << 20)),
            "{}",
            &msg[..200]
        );
        let msg = err_of(decode_for(json!({"inputs": [
            {"name": long, "datatype": "INT32", "shape": [1, 2], "data": [1, 2]}
        ]})));
        assert!(msg.len() < 1024, "{} bytes", msg.len());
        let msg = err_of(decode_json(json!({"inputs": [
            {"name": "X", "datatype": "INT32", "shape": [long], "data": [1]}
        ]})));
        assert!(msg.len() < 1024, "{} bytes", msg.len());
    }

    #[test]
    fn long_shapes_are_clipped_in_errors() {
        let msg = err_of(decode_json(json!({"inputs": [
            {"name": "X", "datatype": "INT32", "shape": vec![-1; 100_000], "data": [1]}
        ]})));
        assert!(msg.len() < 1024, "{} bytes", msg.len());
    }

    #[test]
    fn decodes_json_request_fields() {
        let r = decode_infer_request(
            Bytes::from(
                json!({
                    "id": "42",
                    "parameters": {"sequence_id": 7, "custom": "kept"},
                    "inputs": [int32_input("INPUT0", json!([1, 2]))],
                    "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": true}}]
                })
                .to_string(),
            ),
            None,
            "simple",
            "1",
        )
        .unwrap();
        assert_eq!(
            (
                r.model_name.as_str(),
                r.model_version.as_str(),
                r.id.as_str()
            ),
            ("simple", "1", "42")
        );
        assert_eq!(r.parameters["sequence_id"], ParamValue::Int(7));
        assert_eq!(r.parameters["custom"], ParamValue::String("kept".into()));
        let t = &r.inputs[0];
        assert_eq!(
            (t.name.as_str(), t.datatype, &t.shape[..]),
            ("INPUT0", DataType::Int32, &[1, 2][..])
        );
        assert_eq!(&t.data[..], &[1, 0, 0, 0, 2, 0, 0, 0]);
        assert_eq!(r.outputs[0].name, "OUTPUT0");
        assert_eq!(r.outputs[0].parameters[BINARY_DATA], ParamValue::Bool(true));
    }

    #[test]
    fn accepts_nested_json_data() {
        let r = decode_json(json!({"inputs": [int32_input("X", json!([[1, 2]]))]})).unwrap();
        assert_eq!(r.inputs[0].data.len(), 8);
    }

    #[test]
    fn missing_id_and_outputs_default_to_empty() {
        let r = decode_json(json!({"inputs": [int32_input("X", json!([1, 2]))]})).unwrap();
        assert!(r.id.is_empty() && r.outputs.is_empty() && r.parameters.is_empty());
    }

    #[test]
    fn rejects_malformed_json() {
        let r = decode_infer_request(Bytes::from_static(b"{\"inputs\": ["), None, "simple", "");
        assert!(err_of(r).contains("failed to parse the request JSON"));
    }

    #[test]
    fn rejects_missing_inputs() {
        assert!(err_of(decode_json(json!({"id": "1"}))).contains("inputs"));
    }

    fn one_input_io(datatype: DataType, dims: Vec<i64>, max_batch_size: i64) -> IoSpec {
        IoSpec {
            max_batch_size,
            inputs: vec![crate::model::InputSpec {
                name: "INPUT0".into(),
                datatype,
                dims,
                reshape: None,
                optional: false,
            }],
            outputs: Vec::new(),
        }
    }

    fn decode_raw(body: &[u8], io: Option<&IoSpec>) -> Result<InferRequest, InferError> {
        decode_infer_request_for(Bytes::copy_from_slice(body), Some(0), "m", "", io)
    }

    #[test]
    fn raw_request_deduces_the_variable_dimension() {
        let data: Vec<u8> = (0..8f32 as i32)
            .flat_map(|i| (i as f32).to_le_bytes())
            .collect();
        let io = one_input_io(DataType::Fp32, vec![-1], 8);
        let r = decode_raw(&data, Some(&io)).unwrap();
        assert_eq!(r.inputs.len(), 1);
        let t = &r.inputs[0];
        assert_eq!((t.name.as_str(), t.datatype), ("INPUT0", DataType::Fp32));
        assert_eq!(t.shape, vec![1, 8]);
        assert_eq!(&t.data[..], &data[..]);
        assert_eq!(
            r.parameters.get(BINARY_DATA_OUTPUT),
            Some(&ParamValue::Bool(true))
        );
        // Without batching, no batch dimension; fixed dims as configured.
        let io = one_input_io(DataType::Fp32, vec![2, -1], 0);
        assert_eq!(
            decode_raw(&data, Some(&io)).unwrap().inputs[0].shape,
            vec![2, 4]
        );
        let io = one_input_io(DataType::Fp32, vec![8], 0);
        assert_eq!(
            decode_raw(&data, Some(&io)).unwrap().inputs[0].shape,
            vec![8]
        );
    }

    #[test]
    fn raw_request_of_the_wrong_size_is_refused_as_triton() {
        let io = one_input_io(DataType::Fp32, vec![-1], 8);
        assert_eq!(
            err_of(decode_raw(&[0; 10], Some(&io))),
            "input byte size mismatch for input 'INPUT0' for model 'm'. Expected 8, got 10"
        );
        let io = one_input_io(DataType::Int32, vec![4], 0);
        assert_eq!(
            err_of(decode_raw(&[0; 12], Some(&io))),
            "input byte size mismatch for input 'INPUT0' for model 'm'. Expected 16, got 12"
        );
    }

    #[test]
    fn raw_bytes_request_is_one_element() {
        let io = one_input_io(DataType::Bytes, vec![1], 8);
        let r = decode_raw(b"427", Some(&io)).unwrap();
        let t = &r.inputs[0];
        assert_eq!(t.shape, vec![1, 1]);
        assert_eq!(&t.data[..], &encode_bytes_elements(["427"])[..]);
        for dims in [vec![-1], vec![2], vec![1, -1]] {
            let io = one_input_io(DataType::Bytes, dims, 8);
            assert_eq!(
                err_of(decode_raw(b"427", Some(&io))),
                "For BYTE datatype raw input 'INPUT0', the model must have input shape [1]"
            );
        }
    }

    #[test]
    fn raw_request_needs_one_input_and_one_variable_dimension() {
        assert_eq!(
            err_of(decode_raw(&[0; 16], Some(&simple_io()))),
            "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in \
             'm' model configuration"
        );
        let io = one_input_io(DataType::Fp16, vec![-1, -1], 8);
        assert_eq!(
            err_of(decode_raw(&[0; 8], Some(&io))),
            "The shape of the raw input 'INPUT0' can not be deduced because there are more \
             than one variable-sized dimension"
        );
        // A model that did not resolve is left to the core path's answer.
        assert!(decode_raw(&[0; 8], None).unwrap().inputs.is_empty());
    }

    #[test]
    fn rejects_header_length_beyond_body() {
        let r = decode_infer_request(Bytes::from_static(b"{}"), Some(3), "simple", "");
        assert!(err_of(r).contains("inference header size should be in range (0, 2), got: 3"));
    }

    #[test]
    fn header_length_cutting_the_json_is_explained() {
        let body = json!({"inputs": [int32_input("X", json!([1, 2]))]}).to_string();
        let r = decode_infer_request(
            Bytes::from(body.clone()),
            Some(body.len() - 1),
            "simple",
            "",
        );
        let msg = err_of(r);
        assert!(msg.contains("Inference-Header-Content-Length is"), "{msg}");
    }

    #[test]
    fn rejects_unknown_datatype() {
        let r = decode_json(
            json!({"inputs": [{"name": "X", "datatype": "INT33", "shape": [1], "data": [1]}]}),
        );
        let msg = err_of(r);
        assert!(
            msg.contains("'X'") && msg.contains("unknown datatype 'INT33'"),
            "{msg}"
        );
    }

    #[test]
    fn rejects_negative_dimension() {
        let r = decode_json(
            json!({"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, -2], "data": [1]}]}),
        );
        assert!(err_of(r).contains("negative dimension -2"));
    }

    #[test]
    fn rejects_overflowing_shape() {
        let r = decode_json(json!({"inputs": [{"name": "X", "datatype": "INT32",
            "shape": [i64::MAX, i64::MAX], "data": [1]}]}));
        assert!(err_of(r).contains("more elements than can be addressed"));
    }

    #[test]
    fn rejects_huge_shape_against_json_data_without_allocating() {
        let r = decode_json(json!({"inputs": [{"name": "X", "datatype": "FP64",
            "shape": [1, 1u64 << 40], "data": [1.0, 2.0]}]}));
        let msg = err_of(r);
        assert!(
            msg.contains("Shape does not match true shape of 'data' field"),
            "{msg}"
        );
        assert!(
            msg.contains("'X'") && msg.contains("1099511627776"),
            "{msg}"
        );
    }

    #[test]
    fn rejects_huge_shape_against_binary_size() {
        let header = json!({"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 1u64 << 40],
            "parameters": {"binary_data_size": 8}}]});
        let (body, n) = binary_body(header, &[&[0; 8]]);
        let msg = err_of(decode_infer_request(body, Some(n), "simple", ""));
        assert!(
            msg.contains(
                "input byte size mismatch for input 'X' for model 'simple'. \
                 Expected 4398046511104, got 8"
            ),
            "{msg}"
        );
    }

    #[test]
    fn rejects_huge_bytes_shape_against_binary_elements() {
        let raw = encode_bytes_elements(["a"]);
        let header = json!({"inputs": [{"name": "S", "datatype": "BYTES", "shape": [1, 1u64 << 40],
            "parameters": {"binary_data_size": raw.len()}}]});
        let (body, n) = binary_body(header, &[&raw]);
        assert!(
            err_of(decode_infer_request(body, Some(n), "simple", "")).contains("holds 1 elements")
        );
    }

    #[test]
    fn rejects_json_count_mismatch() {
        let msg = err_of(decode_json(
            json!({"inputs": [int32_input("X", json!([1, 2, 3]))]}),
        ));
        assert!(
            msg.contains("Unable to parse 'data': Shape does not match true shape of 'data' field"),
            "{msg}"
        );
    }

    #[test]
    fn rejects_string_for_int32() {
        let msg = err_of(decode_json(
            json!({"inputs": [int32_input("X", json!([1, "2"]))]}),
        ));
        assert!(
            msg.contains("'X'") && msg.contains("element 1") && msg.contains("integer"),
            "{msg}"
        );
    }

    #[test]
    fn rejects_out_of_range_uint8() {
        let r = decode_json(
            json!({"inputs": [{"name": "U", "datatype": "UINT8", "shape": [2], "data": [1, 300]}]}),
        );
        let msg = err_of(r);
        assert!(
            msg.contains("300") && msg.contains("out of range for UINT8"),
            "{msg}"
        );
    }

    #[test]
    fn rejects_2_pow_31_for_int32() {
        let msg = err_of(decode_json(
            json!({"inputs": [int32_input("X", json!([1, 2147483648i64]))]}),
        ));
        assert!(msg.contains("out of range for INT32"), "{msg}");
    }

    #[test]
    fn json_bytes_are_utf8_strings() {
        let r = decode_json(json!({"inputs": [{"name": "S", "datatype": "BYTES", "shape": [2], "data": ["hé", ""]}]}))
            .unwrap();
        assert_eq!(r.inputs[0].data, encode_bytes_elements(["hé", ""]));
    }

    #[test]
    fn json_bool_and_fp16_inputs() {
        let r = decode_json(json!({"inputs": [
            {"name": "B", "datatype": "BOOL", "shape": [2], "data": [true, false]},
            {"name": "H", "datatype": "FP16", "shape": [1], "data": [0.5]}
        ]}))
        .unwrap();
        assert_eq!(&r.inputs[0].data[..], &[1, 0]);
        assert_eq!(
            &r.inputs[1].data[..],
            &half::f16::from_f32(0.5).to_le_bytes()
        );
    }

    #[test]
    fn empty_tensor_with_empty_data() {
        let r = decode_json(
            json!({"inputs": [{"name": "X", "datatype": "INT32", "shape": [0], "data": []}]}),
        )
        .unwrap();
        assert!(r.inputs[0].data.is_empty());
    }

    #[test]
    fn rejects_both_data_and_binary_size() {
        let r = decode_json(
            json!({"inputs": [{"name": "X", "datatype": "INT32", "shape": [1], "data": [1],
            "parameters": {"binary_data_size": 4}}]}),
        );
        let msg = err_of(r);
        assert!(
            msg.contains("Input must set only one of the following fields"),
            "{msg}"
        );
        assert!(msg.contains("But set 'data' 'binary_data_size'"), "{msg}");
    }

    #[test]
    fn rejects_neither_data_nor_binary_size() {
        let r = decode_json(json!({"inputs": [{"name": "X", "datatype": "INT32", "shape": [1]}]}));
        assert!(err_of(r).contains("But no field is set"));
    }

    #[test]
    fn shared_memory_input_names_an_unknown_region() {
        let r = decode_json(
            json!({"inputs": [{"name": "X", "datatype": "INT32", "shape": [1],
            "parameters": {"shared_memory_region": "no_such_region_anywhere", "shared_memory_byte_size": 4}}]}),
        );
        let e = r.unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotFound);
        assert_eq!(
            e.message,
            "Unable to find shared memory region: 'no_such_region_anywhere'"
        );
    }

    #[test]
    fn decodes_binary_inputs_in_order_zero_copy() {
        let a: Vec<u8> = (0..8).collect();
        let b: Vec<u8> = (8..16).collect();
        let header = json!({"inputs": [
            {"name": "A", "datatype": "INT32", "shape": [1, 2], "parameters": {"binary_data_size": 8}},
            int32_input("J", json!([5, 6])),
            {"name": "B", "datatype": "INT32", "shape": [1, 2], "parameters": {"binary_data_size": 8}}
        ]});
        let (body, n) = binary_body(header, &[&a, &b]);
        let r = decode_infer_request(body.clone(), Some(n), "simple", "").unwrap();
        assert_eq!(&r.inputs[0].data[..], &a[..]);
        assert_eq!(&r.inputs[2].data[..], &b[..]);
        // Zero copy: the tensor points into the body's own buffer.
        assert_eq!(r.inputs[0].data.as_ptr(), body[n..].as_ptr());
        assert_eq!(r.inputs[2].data.as_ptr(), body[n + 8..].as_ptr());
    }

    #[test]
    fn rejects_truncated_binary_body() {
        let header = json!({"inputs": [{"name": "A", "datatype": "INT32", "shape": [1, 2],
            "parameters": {"binary_data_size": 8}}]});
        let (body, n) = binary_body(header, &[&[0; 5]]);
        let msg = err_of(decode_infer_request(body, Some(n), "simple", ""));
        assert!(
            msg.contains(
                "unexpected size for input 'A', expecting 3 additional bytes for model 'simple'"
            ),
            "{msg}"
        );
    }

    #[test]
    fn rejects_trailing_bytes_after_last_binary_input() {
        let header = json!({"inputs": [{"name": "A", "datatype": "INT32", "shape": [1, 2],
            "parameters": {"binary_data_size": 8}}]});
        let (body, n) = binary_body(header, &[&[0; 9]]);
        let msg = err_of(decode_infer_request(body, Some(n), "simple", ""));
        assert!(
            msg.contains("unexpected additional input data for model 'simple'"),
            "{msg}"
        );
    }

    #[test]
    fn rejects_trailing_bytes_after_json_only_inputs() {
        let (body, n) = binary_body(
            json!({"inputs": [int32_input("X", json!([1, 2]))]}),
            &[b"junk"],
        );
        assert!(err_of(decode_infer_request(body, Some(n), "simple", ""))
            .contains("unexpected additional input data"));
    }

    #[test]
    fn rejects_binary_size_not_matching_shape() {
        let header = json!({"inputs": [{"name": "A", "datatype": "INT32", "shape": [1, 2],
            "parameters": {"binary_data_size": 4}}]});
        let (body, n) = binary_body(header, &[&[0; 4]]);
        assert_eq!(
            err_of(decode_infer_request(body, Some(n), "simple", "")),
            "input byte size mismatch for input 'A' for model 'simple'. Expected 8, got 4"
        );
    }

    #[test]
    fn rejects_binary_input_without_header_length() {
        let body = json!({"inputs": [{"name": "A", "datatype": "INT32", "shape": [1],
            "parameters": {"binary_data_size": 4}}]})
        .to_string();
        let r = decode_infer_request(Bytes::from(body), None, "simple", "");
        assert!(err_of(r).contains("Inference-Header-Content-Length"));
    }

    #[test]
    fn rejects_non_integer_binary_size() {
        let header = json!({"inputs": [{"name": "A", "datatype": "INT32", "shape": [1],
            "parameters": {"binary_data_size": -4}}]});
        let (body, n) = binary_body(header, &[]);
        assert!(err_of(decode_infer_request(body, Some(n), "simple", ""))
            .contains("non-negative integer"));
    }

    #[test]
    fn rejects_huge_binary_size_without_overflow() {
        let header = json!({"inputs": [{"name": "S", "datatype": "BYTES", "shape": [1],
            "parameters": {"binary_data_size": u64::MAX}}]});
        let (body, n) = binary_body(header, &[&[0; 4]]);
        assert!(
            err_of(decode_infer_request(body, Some(n), "simple", "")).contains("additional bytes")
        );
    }

    #[test]
    fn decodes_binary_bytes_input() {
        let raw = encode_bytes_elements(["ab", "\u{0}\u{1}"]);
        let header = json!({"inputs": [{"name": "S", "datatype": "BYTES", "shape": [2],
            "parameters": {"binary_data_size": raw.len()}}]});
        let (body, n) = binary_body(header, &[&raw]);
        let r = decode_infer_request(body, Some(n), "simple", "").unwrap();
        assert_eq!(r.inputs[0].data, raw);
    }

    #[test]
    fn rejects_broken_bytes_framing() {
        // Declares a 9-byte element but only 2 bytes follow.
        let raw = [9u8, 0, 0, 0, b'a', b'b'];
        let header = json!({"inputs": [{"name": "S", "datatype": "BYTES", "shape": [1],
            "parameters": {"binary_data_size": raw.len()}}]});
        let (body, n) = binary_body(header, &[&raw]);
        let msg = err_of(decode_infer_request(body, Some(n), "simple", ""));
        assert!(
            msg.contains("'S'") && msg.contains("malformed BYTES"),
            "{msg}"
        );
    }

    #[test]
    fn rejects_bytes_element_count_mismatch() {
        let raw = encode_bytes_elements(["a", "b", "c"]);
        let header = json!({"inputs": [{"name": "S", "datatype": "BYTES", "shape": [2],
            "parameters": {"binary_data_size": raw.len()}}]});
        let (body, n) = binary_body(header, &[&raw]);
        assert!(
            err_of(decode_infer_request(body, Some(n), "simple", "")).contains("holds 3 elements")
        );
    }

    #[test]
    fn zero_size_binary_input_for_empty_tensor() {
        let header = json!({"inputs": [{"name": "A", "datatype": "INT32", "shape": [0],
            "parameters": {"binary_data_size": 0}}]});
        let (body, n) = binary_body(header, &[]);
        assert!(decode_infer_request(body, Some(n), "simple", "")
            .unwrap()
            .inputs[0]
            .data
            .is_empty());
    }

    #[test]
    fn rejects_non_scalar_request_parameter() {
        let r = decode_json(json!({"parameters": {"p": [1]}, "inputs": []}));
        assert!(err_of(r).contains("parameter 'p'"));
    }

    #[test]
    fn input_parameters_are_checked_read_and_the_rest_dropped() {
        // Not a scalar: refused, naming the parameter.
        let r = decode_json(
            json!({"inputs": [{"name": "X", "datatype": "INT32", "shape": [1],
            "data": [1], "parameters": {"p": {"q": 1}}}]}),
        );
        assert!(err_of(r).contains("parameter 'p'"));
        // Unknown scalars are accepted.
        let r = decode_json(
            json!({"inputs": [{"name": "X", "datatype": "INT32", "shape": [1],
            "data": [1], "parameters": {"p": "x", "q": 2}}]}),
        );
        assert_eq!(r.unwrap().inputs[0].data.len(), 4);
        // A name with an escape, and a repeated name (the last counts).
        let header = r#"{"inputs":[{"name":"A","datatype":"INT32","shape":[1],
            "parameters":{"binary_data_size":99,"binary_data_size":4}}]}"#;
        let mut body = header.as_bytes().to_vec();
        body.extend_from_slice(&7i32.to_le_bytes());
        let r = decode_infer_request(Bytes::from(body), Some(header.len()), "m", "").unwrap();
        assert_eq!(r.inputs[0].data.as_ref(), &7i32.to_le_bytes());
        assert_eq!(r.inputs[0].datatype, DataType::Int32);
        // `null` parameters are none.
        let r = decode_json(
            json!({"inputs": [{"name": "X", "datatype": "INT32", "shape": [1],
            "data": [1], "parameters": null}]}),
        );
        assert!(r.is_ok());
    }

    #[test]
    fn keeps_unknown_output_parameters() {
        let r = decode_json(json!({"inputs": [], "outputs": [{"name": "O", "parameters": {"classification": 3, "x": "y"}}]}))
            .unwrap();
        assert_eq!(r.outputs[0].class_count(), Some(3));
        assert_eq!(r.outputs[0].parameters["x"], ParamValue::String("y".into()));
    }

    #[test]
    fn rejects_non_boolean_binary_data() {
        let r = decode_json(
            json!({"inputs": [], "outputs": [{"name": "O", "parameters": {"binary_data": 1}}]}),
        );
        assert!(err_of(r).contains("must be a boolean"));
    }

    #[test]
    fn rejects_negative_classification() {
        let r = decode_json(
            json!({"inputs": [], "outputs": [{"name": "O", "parameters": {"classification": -1}}]}),
        );
        assert!(err_of(r).contains("Unable to set 'classification'"));
    }
}
