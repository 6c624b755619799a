//! Triton's generate extension: `POST .../generate` (one JSON response)
//! and `POST .../generate_stream` (Server-Sent Events, one `data: {...}`
//! event per response), for any model whose inputs and outputs can be
//! written as JSON, decoupled ones included.
//!
//! Request: a JSON object. A top-level key naming a model input becomes
//! that input (a scalar or a flat array; its shape is the model's, with
//! the element count spread over the fixed dims and the innermost dynamic
//! dim, other dynamic dims 1 — Triton's rule); `parameters` (an object)
//! and any other key become request parameters. Response: `model_name`,
//! `model_version`, `id` (when set) and each output by name (a single
//! element as a scalar, else a flat array).
//!
//! `/generate` needs exactly one response (Triton's error otherwise).
//! `/generate_stream` takes its HTTP status from the first response, as
//! Triton does; a later error arrives as a `data: {"error": ...}` event.
//! The event stream rides on the connection as a streaming body (see
//! [`into_wire`]). Until its last event is sent (or the client goes away)
//! it counts in flight on the shard, so graceful shutdown waits for it up
//! to the exit timeout, and as an active request on its connection, so
//! the idle timeout never cuts it.

use std::{
    convert::Infallible,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
};

use bytes::Bytes;
use futures::StreamExt;
use http::{header, HeaderValue, StatusCode};
use http_body_util::{Either, Full};
use hyper::{
    body::{Body, Frame, Incoming},
    Request,
};
use serde_json::{Map, Number, Value};

use super::{codec::error_body, server::HttpResponse, status::status_for};
use crate::{
    frontend::{
        core::infer as core,
        transport::{read_body, ActiveRequest, TrackedBody},
    },
    model::ModelVersion,
    scheduler::{ResponseStream, Streamed},
    shard,
    types::{
        bytes_elements, encode_bytes_elements, DataType, InferError, InferRequest, InferResponse,
        InferResult, ParamValue, Tensor,
    },
};

/// Triton's words when `/generate` gets other than one response.
pub const NOT_ONE_RESPONSE: &str = "generate expects model to produce exactly 1 response, use \
     generate stream for model that generates various number of responses";

/// Handles `/generate` (`streaming` false) and `/generate_stream`.
pub async fn generate(
    req: Request<Incoming>,
    model: &str,
    version: &str,
    streaming: bool,
) -> InferResult<HttpResponse> {
    let limit = crate::frontend::env::with_current(|e| e.limits.http_max_input_size)
        .ok_or_else(|| InferError::internal("HTTP request outside a server shard"))?;
    let body = match read_body(req.into_body(), limit).await {
        Ok(body) => body,
        Err(e) => {
            // The rest of the body is never read: close the connection.
            let mut resp = http::Response::new(Full::new(error_body(&e.message)));
            *resp.status_mut() = e.status;
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            return Ok(resp);
        }
    };
    // Decoded against the shard's table by borrow: cloning the table's
    // `Arc` would write a count every shard writes.
    let request = shard::with_current(|s| {
        s.with_table(|table| decode(&body, table.resolve(model, version)?))
    })
    .ok_or_else(|| InferError::internal("HTTP request outside a shard"))??;
    let mut responses = core::infer_stream(request, core::Protocol::Http);
    if !streaming {
        return one_response(&mut responses).await;
    }
    // The status comes from the first event, as in Triton.
    let first = next_event(&mut responses).await;
    let status = match &first {
        Some(Err(e)) => status_for(e.kind),
        _ => StatusCode::OK,
    };
    let first = first.map(|r| sse_event(&r));
    let mut resp = http::Response::new(Full::new(Bytes::new()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    let body = SseBody {
        first,
        rest: Some(responses),
        _in_flight: shard::InFlight::enter(),
    };
    resp.extensions_mut()
        .insert(PendingStream(Arc::new(Mutex::new(Some(body)))));
    Ok(resp)
}

async fn one_response(responses: &mut ResponseStream) -> InferResult<HttpResponse> {
    let mut only = None;
    let mut count = 0usize;
    while let Some(item) = next_event(responses).await {
        let response = item?;
        count += 1;
        only = Some(response);
    }
    match only {
        Some(json) if count == 1 => {
            let mut resp = http::Response::new(Full::new(Bytes::from(json.to_string())));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            Ok(resp)
        }
        _ => Err(InferError::internal(NOT_ONE_RESPONSE)),
    }
}

/// The next response that is sent to the client, as JSON: a decoupled
/// request's final flag alone is not one (Triton sends nothing for it).
async fn next_event(responses: &mut ResponseStream) -> Option<InferResult<Value>> {
    loop {
        match responses.next().await? {
            Ok(Streamed::Final(_)) => continue,
            Ok(Streamed::Response { response, .. }) => return Some(response_json(&response)),
            Err(e) => return Some(Err(e)),
        }
    }
}

fn sse_event(item: &InferResult<Value>) -> Bytes {
    let json = match item {
        Ok(v) => v.to_string(),
        Err(e) => String::from_utf8_lossy(&error_body(&e.message)).into_owned(),
    };
    Bytes::from(format!("data: {json}\n\n"))
}

/// The event stream of a `/generate_stream` response, handed from the
/// route to the connection in the response's extensions (routes return
/// full bodies; [`into_wire`] swaps this one in).
#[derive(Clone)]
struct PendingStream(Arc<Mutex<Option<SseBody>>>);

/// What the HTTP connection sends: a full body, or an event stream that
/// keeps its request active on the connection while it lasts.
pub type WireBody = Either<Full<Bytes>, TrackedBody<SseBody>>;

/// Turns a route's response into what goes on the wire: the event stream
/// a `/generate_stream` response carries (holding `active` until it ends),
/// else its full body (`active` ends now).
pub fn into_wire(mut resp: HttpResponse, active: ActiveRequest) -> http::Response<WireBody> {
    let stream = resp
        .extensions_mut()
        .remove::<PendingStream>()
        .and_then(|p| p.0.lock().ok().and_then(|mut s| s.take()));
    match stream {
        Some(body) => resp.map(|_| Either::Right(TrackedBody::new(body, active))),
        None => resp.map(Either::Left),
    }
}

pub struct SseBody {
    first: Option<Bytes>,
    /// `None` once the last event was sent.
    rest: Option<ResponseStream>,
    /// Graceful shutdown waits for the stream as for any request, until
    /// its last event has left (the response stream counts only until it
    /// produced it).
    _in_flight: shard::InFlight,
}

impl Body for SseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if let Some(first) = this.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        loop {
            let Some(rest) = &mut this.rest else {
                return Poll::Ready(None);
            };
            let event = match rest.as_mut().poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    this.rest = None;
                    return Poll::Ready(None);
                }
                Poll::Ready(Some(Ok(Streamed::Final(_)))) => continue,
                Poll::Ready(Some(Ok(Streamed::Response { response, .. }))) => {
                    sse_event(&response_json(&response))
                }
                Poll::Ready(Some(Err(e))) => {
                    // An error ends the request's stream.
                    this.rest = None;
                    sse_event(&Err(e))
                }
            };
            return Poll::Ready(Some(Ok(Frame::data(event))));
        }
    }
}

/// A generate request body → the model's request.
fn decode(body: &[u8], model: &ModelVersion) -> InferResult<InferRequest> {
    let root: Value = serde_json::from_slice(body)
        .map_err(|e| InferError::invalid(format!("failed to parse the request JSON: {e}")))?;
    let Value::Object(fields) = root else {
        return Err(InferError::invalid(
            "a generate request must be a JSON object",
        ));
    };
    let mut request = InferRequest {
        model_name: model.name.clone(),
        model_version: model.version_str.clone(),
        id: String::new(),
        inputs: Vec::new(),
        outputs: Vec::new(),
        parameters: Default::default(),
        trace: Default::default(),
    };
    for (key, value) in fields {
        if let Some(spec) = model.metadata.inputs.iter().find(|i| i.name == key) {
            let datatype = DataType::from_wire(spec.datatype).ok_or_else(|| {
                InferError::invalid(format!(
                    "input '{key}' has unsupported datatype {}",
                    spec.datatype
                ))
            })?;
            request
                .inputs
                .push(input_tensor(&key, datatype, &spec.shape, &value)?);
        } else if key == "parameters" {
            let Value::Object(params) = value else {
                return Err(InferError::invalid(
                    "'parameters' of a generate request must be a JSON object",
                ));
            };
            for (name, v) in params {
                let p = parameter(&name, &v)?;
                request.parameters.insert(name, p);
            }
        } else if key == "id" && value.is_string() {
            request.id = value.as_str().unwrap_or_default().to_string();
        } else {
            let p = parameter(&key, &value)?;
            request.parameters.insert(key, p);
        }
    }
    Ok(request)
}

fn parameter(name: &str, v: &Value) -> InferResult<ParamValue> {
    Ok(match v {
        Value::Bool(b) => ParamValue::Bool(*b),
        Value::String(s) => ParamValue::String(s.clone()),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => ParamValue::Int(i),
            (None, Some(u), _) => ParamValue::Uint(u),
            (None, None, Some(f)) => ParamValue::Double(f),
            _ => return Err(bad_parameter(name)),
        },
        _ => return Err(bad_parameter(name)),
    })
}

fn bad_parameter(name: &str) -> InferError {
    InferError::invalid(format!(
        "parameter '{name}' of the generate request must be a boolean, number or string"
    ))
}

/// One input from a scalar or flat array, shaped as Triton's generate
/// endpoint shapes it from the model's metadata shape.
fn input_tensor(
    name: &str,
    datatype: DataType,
    dims: &[i64],
    value: &Value,
) -> InferResult<Tensor> {
    let elements: Vec<&Value> = match value {
        Value::Array(a) => a.iter().collect(),
        v => vec![v],
    };
    let shape = spread_shape(name, dims, elements.len())?;
    let data = if datatype == DataType::Bytes {
        let strings = elements
            .iter()
            .map(|v| {
                v.as_str()
                    .map(|s| s.as_bytes().to_vec())
                    .ok_or_else(|| element_error(name, datatype))
            })
            .collect::<InferResult<Vec<_>>>()?;
        encode_bytes_elements(strings)
    } else {
        let mut out = Vec::with_capacity(elements.len() * 8);
        for v in elements {
            write_element(&mut out, datatype, v).ok_or_else(|| element_error(name, datatype))?;
        }
        Bytes::from(out)
    };
    Ok(Tensor::new(name, datatype, shape, data))
}

fn element_error(name: &str, datatype: DataType) -> InferError {
    InferError::invalid(format!(
        "unable to parse input '{name}': expected {} elements",
        datatype.as_str()
    ))
}

/// Triton's two passes: the fixed dims take their share of the element
/// count, the innermost dynamic dim the rest, other dynamic dims 1.
fn spread_shape(name: &str, dims: &[i64], count: usize) -> InferResult<Vec<i64>> {
    let cannot = || {
        InferError::invalid(format!(
            "The schema can not convert input '{name}' to tensor with proper shape"
        ))
    };
    let mut left = i64::try_from(count).map_err(|_| cannot())?;
    if left == 0 {
        // An empty array: the innermost dynamic dim is 0.
        let mut shape = dims.to_vec();
        let mut zeroed = false;
        for d in shape.iter_mut().rev() {
            if *d == -1 {
                *d = if zeroed { 1 } else { 0 };
                zeroed = true;
            }
        }
        return if zeroed { Ok(shape) } else { Err(cannot()) };
    }
    for &d in dims.iter().rev() {
        if d != -1 {
            if d == 0 || left % d != 0 {
                return Err(cannot());
            }
            left /= d;
        }
    }
    let mut shape = dims.to_vec();
    for d in shape.iter_mut().rev() {
        if *d == -1 {
            *d = left;
            left = 1;
        }
    }
    if left != 1 {
        return Err(cannot());
    }
    Ok(shape)
}

fn write_element(out: &mut Vec<u8>, datatype: DataType, v: &Value) -> Option<()> {
    match datatype {
        DataType::Bool => out.push(u8::from(v.as_bool()?)),
        DataType::Uint8 => out.extend(u8::try_from(v.as_u64()?).ok()?.to_le_bytes()),
        DataType::Uint16 => out.extend(u16::try_from(v.as_u64()?).ok()?.to_le_bytes()),
        DataType::Uint32 => out.extend(u32::try_from(v.as_u64()?).ok()?.to_le_bytes()),
        DataType::Uint64 => out.extend(v.as_u64()?.to_le_bytes()),
        DataType::Int8 => out.extend(i8::try_from(v.as_i64()?).ok()?.to_le_bytes()),
        DataType::Int16 => out.extend(i16::try_from(v.as_i64()?).ok()?.to_le_bytes()),
        DataType::Int32 => out.extend(i32::try_from(v.as_i64()?).ok()?.to_le_bytes()),
        DataType::Int64 => out.extend(v.as_i64()?.to_le_bytes()),
        DataType::Fp32 => out.extend((v.as_f64()? as f32).to_le_bytes()),
        DataType::Fp64 => out.extend(v.as_f64()?.to_le_bytes()),
        // FP16/BF16 have no JSON form here (partial).
        _ => return None,
    }
    Some(())
}

/// A response as Triton's generate endpoint writes it.
fn response_json(response: &InferResponse) -> InferResult<Value> {
    let mut obj = Map::new();
    if !response.id.is_empty() {
        obj.insert("id".into(), Value::String(response.id.clone()));
    }
    obj.insert(
        "model_name".into(),
        Value::String(response.model_name.clone()),
    );
    obj.insert(
        "model_version".into(),
        Value::String(response.model_version.clone()),
    );
    for t in &response.outputs {
        let mut values = output_values(t)?;
        let v = if values.len() == 1 {
            values.remove(0)
        } else {
            Value::Array(values)
        };
        obj.insert(t.name.clone(), v);
    }
    Ok(Value::Object(obj))
}

fn output_values(t: &Tensor) -> InferResult<Vec<Value>> {
    let unsupported = || {
        InferError::unsupported(format!(
            "output '{}' of datatype {} has no JSON form in the generate extension",
            t.name,
            t.datatype.as_str()
        ))
    };
    if t.datatype == DataType::Bytes {
        let elements = bytes_elements(&t.data).map_err(|e| InferError::internal(e.to_string()))?;
        return Ok(elements
            .map(|b| Value::String(String::from_utf8_lossy(b).into_owned()))
            .collect());
    }
    let size = t.datatype.element_size().ok_or_else(unsupported)?;
    let mut values = Vec::with_capacity(t.data.len() / size.max(1));
    for c in t.data.chunks_exact(size) {
        let v = match t.datatype {
            DataType::Bool => Value::Bool(c[0] != 0),
            DataType::Uint8 => Value::from(c[0]),
            DataType::Uint16 => Value::from(u16::from_le_bytes([c[0], c[1]])),
            DataType::Uint32 => Value::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            DataType::Uint64 => {
                Value::from(u64::from_le_bytes(c.try_into().map_err(|_| unsupported())?))
            }
            DataType::Int8 => Value::from(c[0] as i8),
            DataType::Int16 => Value::from(i16::from_le_bytes([c[0], c[1]])),
            DataType::Int32 => Value::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            DataType::Int64 => {
                Value::from(i64::from_le_bytes(c.try_into().map_err(|_| unsupported())?))
            }
            DataType::Fp32 => {
                Number::from_f64(f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                    .map_or(Value::Null, Value::Number)
            }
            DataType::Fp64 => {
                Number::from_f64(f64::from_le_bytes(c.try_into().map_err(|_| unsupported())?))
                    .map_or(Value::Null, Value::Number)
            }
            _ => return Err(unsupported()),
        };
        values.push(v);
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_spread_like_triton() {
        assert_eq!(spread_shape("x", &[-1], 3).unwrap(), vec![3]);
        assert_eq!(spread_shape("x", &[1], 1).unwrap(), vec![1]);
        assert_eq!(spread_shape("x", &[-1, -1], 4).unwrap(), vec![1, 4]);
        assert_eq!(spread_shape("x", &[-1, 2], 4).unwrap(), vec![2, 2]);
        assert_eq!(spread_shape("x", &[-1], 0).unwrap(), vec![0]);
        assert!(spread_shape("x", &[2], 3).is_err());
        assert!(spread_shape("x", &[1], 0).is_err());
    }

    #[test]
    fn scalars_and_arrays_become_tensors() {
        let t = input_tensor("IN", DataType::Int32, &[-1], &serde_json::json!([1, 2])).unwrap();
        assert_eq!(t.shape, vec![2]);
        assert_eq!(&t.data[..], &[1, 0, 0, 0, 2, 0, 0, 0]);
        let t = input_tensor("W", DataType::Uint32, &[1], &serde_json::json!(7)).unwrap();
        assert_eq!(t.shape, vec![1]);
        assert!(input_tensor("W", DataType::Uint32, &[1], &serde_json::json!(-7)).is_err());
        let t = input_tensor("S", DataType::Bytes, &[-1], &serde_json::json!("hi")).unwrap();
        assert_eq!(&t.data[..], &[2, 0, 0, 0, b'h', b'i']);
    }
}
