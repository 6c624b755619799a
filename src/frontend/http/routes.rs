//! KServe v2 REST routes (plus Triton's config endpoint). Decodes with
//! `codec`, runs through the front ends' one infer path
//! (`frontend::core::infer`), encodes the answer.

use std::borrow::Cow;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use http_body_util::Full;
use hyper::{body::Incoming, Request, Response};

use super::{
    codec::{
        decode_body, decode_request_body, decodes_inline, encode_infer_response, error_body,
        AnswerForm,
    },
    server::HttpResponse,
    status::status_for,
};
use crate::{
    frontend::{
        core::{
            infer as core,
            metadata::{ModelMetadata, ServerMetadata},
        },
        env::{self, FrontendEnv},
        http::compression::{choose_response_encoding, compress},
        restricted, transport,
    },
    metrics::statistics,
    model::ModelTable,
    scheduler,
    shard::{self, InFlight},
    trace::Event,
    types::{InferError, InferResponse, InferResult},
};

/// Built once: looking a header up by `&str` parses and lowercases the
/// name on every request.
pub(super) static HEADER_LENGTH: HeaderName =
    HeaderName::from_static("inference-header-content-length");

/// Entry point for every HTTP request on the HTTP port.
pub async fn handle(req: Request<Incoming>) -> HttpResponse {
    let _in_flight = InFlight::enter();
    route(req).await.unwrap_or_else(|e| error_response(&e))
}

pub fn error_response(e: &InferError) -> HttpResponse {
    respond(
        status_for(e.kind),
        &APPLICATION_JSON,
        error_body(&e.message),
    )
}

/// Content types as built values: `HeaderValue::from_static` checks its
/// text byte by byte when it runs, and a clone of a built one copies a
/// pointer.
static APPLICATION_JSON: HeaderValue = HeaderValue::from_static("application/json");
static OCTET_STREAM: HeaderValue = HeaderValue::from_static("application/octet-stream");

fn respond(status: StatusCode, content_type: &'static HeaderValue, body: Bytes) -> HttpResponse {
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, content_type.clone());
    resp
}

pub(super) fn json_ok(value: &serde_json::Value) -> HttpResponse {
    respond(
        StatusCode::OK,
        &APPLICATION_JSON,
        Bytes::from(value.to_string()),
    )
}

pub(super) fn empty(status: StatusCode) -> HttpResponse {
    let mut resp = Response::new(Full::new(Bytes::new()));
    *resp.status_mut() = status;
    resp
}

// The front ends' environment and the model table are shared by every
// shard: they are borrowed here, never cloned, so a request writes no
// reference count that other cores write too.
fn with_env<R>(f: impl FnOnce(&FrontendEnv) -> R) -> InferResult<R> {
    env::with_current(f).ok_or_else(|| InferError::internal("HTTP request outside a server shard"))
}

fn with_model_table<R>(f: impl FnOnce(&ModelTable) -> R) -> InferResult<R> {
    shard::with_current(|s| s.with_table(f))
        .ok_or_else(|| InferError::internal("HTTP request outside a shard"))
}

async fn route(req: Request<Incoming>) -> InferResult<HttpResponse> {
    let path = req.uri().path().to_string();
    let segments: Vec<Cow<'_, str>> = path
        .trim_matches('/')
        .split('/')
        .map(percent_decode)
        .collect::<InferResult<_>>()?;
    let segs: Vec<&str> = segments.iter().map(|s| s.as_ref()).collect();
    if let Some(refusal) = restricted_refusal(&req, &segs) {
        return Ok(refusal);
    }
    let method = req.method().clone();
    let not_allowed = || {
        InferError::invalid(format!(
            "method {method} is not allowed on {}",
            crate::types::clip(&path)
        ))
    };
    match segs.as_slice() {
        ["v2"] | ["v2", ""] => {
            expect_get(&method).ok_or_else(not_allowed)?;
            Ok(json_ok(&ServerMetadata::current().to_json()))
        }
        ["v2", "health", "live"] => {
            expect_get(&method).ok_or_else(not_allowed)?;
            let live = with_env(|e| e.lifecycle.live())?;
            // Triton answers 400, not 503, when not live/ready
            // (`HandleServerHealth`); probes read any non-2xx alike.
            Ok(empty(if live {
                StatusCode::OK
            } else {
                StatusCode::BAD_REQUEST
            }))
        }
        ["v2", "health", "ready"] => {
            expect_get(&method).ok_or_else(not_allowed)?;
            let ready = with_env(|e| e.lifecycle.ready())?;
            Ok(empty(if ready {
                StatusCode::OK
            } else {
                StatusCode::BAD_REQUEST
            }))
        }
        ["v2", "logging"] => crate::frontend::logging::http(req).await,
        ["v2", "trace", "setting"] => crate::frontend::trace_api::http(req, None).await,
        ["v2", "systemsharedmemory" | "cudasharedmemory", ..] => {
            super::shm_routes::handle(req, &segs[1..]).await
        }
        ["v2", "models", "stats"] => {
            expect_get(&method).ok_or_else(not_allowed)?;
            with_model_table(|table| stats_response(table, "", ""))?
        }
        ["v2", "repository", rest @ ..] => super::repository::route(req, rest).await,
        ["v2", "models", model, rest @ ..] => {
            let (version, action) = match rest {
                ["versions", v, action @ ..] => (*v, action),
                action => ("", action),
            };
            model_route(req, model, version, action).await
        }
        _ => Err(InferError::not_found(format!(
            "no such endpoint: {method} {}",
            crate::types::clip(&path)
        ))),
    }
}

/// Triton's restricted APIs (`--http-restricted-api`): one check at
/// dispatch, before the endpoint looks at the method or the body, as
/// Triton's handlers check first. Unrestricted servers pay one branch.
fn restricted_refusal(req: &Request<Incoming>, segs: &[&str]) -> Option<HttpResponse> {
    env::with_current(|e| {
        let restrictions = &e.http_restricted_api;
        if restrictions.is_empty() {
            return None;
        }
        let refused = restrictions.refuses(restricted::http_category(segs)?, req.headers())?;
        let mut resp = respond(
            StatusCode::FORBIDDEN,
            &APPLICATION_JSON,
            error_body(refused.message()),
        );
        if !hyper::body::Body::is_end_stream(req.body()) {
            // The body stays unread: close after the answer, lingering
            // (see `ConnState::set_linger`) so a client still sending it
            // reads the 403 rather than a reset.
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        Some(resp)
    })
    .flatten()
}

fn expect_get(method: &Method) -> Option<()> {
    (method == Method::GET).then_some(())
}

async fn model_route(
    req: Request<Incoming>,
    model: &str,
    version: &str,
    action: &[&str],
) -> InferResult<HttpResponse> {
    let method = req.method().clone();
    if let ["trace", "setting"] = action {
        return crate::frontend::trace_api::http(req, Some(model)).await;
    }
    match (action, &method) {
        (["infer"], &Method::POST) => return infer(req, model, version).await,
        (["generate"], &Method::POST) => {
            return super::generate::generate(req, model, version, false).await
        }
        (["generate_stream"], &Method::POST) => {
            return super::generate::generate(req, model, version, true).await
        }
        _ => {}
    }
    with_model_table(|table| match (action, &method) {
        ([], &Method::GET) => {
            let m = table.resolve(model, version)?;
            Ok(json_ok(&ModelMetadata::new(table, m).to_json()))
        }
        (["ready"], &Method::GET) => {
            let ready = table.resolve(model, version).is_ok();
            Ok(empty(if ready {
                StatusCode::OK
            } else {
                StatusCode::BAD_REQUEST
            }))
        }
        (["config"], &Method::GET) => {
            let m = table.resolve(model, version)?;
            Ok(respond(
                StatusCode::OK,
                &APPLICATION_JSON,
                m.config_json.clone(),
            ))
        }
        (["stats"], &Method::GET) => stats_response(table, model, version),
        ([] | ["ready"] | ["config"] | ["infer"] | ["stats"], _) => {
            Err(InferError::invalid(format!(
                "method {method} is not allowed on {}",
                crate::types::clip(req.uri().path())
            )))
        }
        _ => Err(InferError::not_found(format!(
            "no such endpoint: {method} {}",
            crate::types::clip(req.uri().path())
        ))),
    })?
}

fn stats_response(table: &ModelTable, model: &str, version: &str) -> InferResult<HttpResponse> {
    let stats = statistics::collect(table, model, version)?;
    Ok(json_ok(&statistics::to_json(&stats)))
}

async fn infer(req: Request<Incoming>, model: &str, version: &str) -> InferResult<HttpResponse> {
    let mut trace = core::trace(model);
    trace.stamp(Event::HttpRecvStart);
    let limit = with_env(|e| e.limits.http_max_input_size)?;
    let (http::request::Parts { headers, .. }, body) = req.into_parts();
    let header_length = parse_header_length(&headers)?;
    let body = match read_body(body, limit).await {
        Ok(body) => body,
        Err(e) => return Ok(body_error_response(&e)),
    };
    trace.stamp(Event::HttpRecvEnd);
    // The model is resolved for the decoder's shape checks only: one that
    // does not resolve is answered by the core path as before.
    let encoding = content_encoding(&headers)?;
    let decoded = if decodes_inline(&body, encoding.is_some(), header_length) {
        // Borrowed from the shard's table for the whole decode.
        with_model_table(|table| -> InferResult<InferResult<_>> {
            let target = table.resolve(model, version).ok();
            if let Some(m) = target {
                scheduler::refuse_decoupled_http(m)?;
            }
            let io = target.map(|m| &m.io);
            Ok(decode_body(
                body,
                encoding.as_deref(),
                header_length,
                model,
                version,
                io,
                limit,
            ))
        })??
    } else {
        // Large bodies decode on the offload pool, which needs its own
        // handle on the model.
        let target = with_model_table(|table| table.resolve(model, version).ok().cloned())?;
        if let Some(m) = &target {
            scheduler::refuse_decoupled_http(m)?;
        }
        decode_request_body(body, encoding, header_length, model, version, target, limit).await
    };
    // A request refused here is counted nowhere, as in Triton (see
    // `frontend::core::infer`).
    let mut request = decoded?;
    // After the body's own parameters, so a forwarded header wins, as in
    // Triton (which sets them last).
    if let Some(Err(e)) = with_env(|e| {
        e.http_header_forward
            .get()
            .map(|f| f.apply_http(&headers, &mut request.parameters))
    })? {
        return Err(e);
    }
    request.trace = trace;
    let form = AnswerForm::of(&request.outputs, &request.parameters);
    let mut response = core::infer(request, core::Protocol::Http).await?;
    let mut trace = response.trace.take();
    let accept = headers
        .get(header::ACCEPT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let wire = encode_answer(response, form, choose_response_encoding(accept)).await?;
    let content_type = if wire.json_header_length.is_some() {
        &OCTET_STREAM
    } else {
        &APPLICATION_JSON
    };
    // As Triton's: the send is the hand-over of the whole response to the
    // HTTP library, not the last byte on the wire.
    trace.stamp(Event::HttpSendStart);
    let mut resp = respond(StatusCode::OK, content_type, wire.body);
    if let Some(len) = wire.json_header_length {
        resp.headers_mut()
            .insert(HEADER_LENGTH.clone(), HeaderValue::from(len));
    }
    if let Some(enc) = wire.encoding {
        resp.headers_mut()
            .insert(header::CONTENT_ENCODING, HeaderValue::from_static(enc));
    }
    trace.stamp(Event::HttpSendEnd);
    Ok(resp)
}

/// An `/infer` answer as it goes on the wire.
struct WireAnswer {
    body: Bytes,
    json_header_length: Option<usize>,
    /// The `Content-Encoding` the body was compressed with.
    encoding: Option<&'static str>,
}

/// Encodes an answer and compresses it when the client asked: inline for
/// small answers, on the offload pool for large ones (tens of MB of JSON
/// text or gzip would stall every connection of the shard), or inline
/// after all when the pool is full, since the answer is already computed.
async fn encode_answer(
    response: InferResponse,
    form: AnswerForm,
    compression: Option<&'static str>,
) -> InferResult<WireAnswer> {
    let large = response.outputs.iter().map(|t| t.data.len()).sum::<usize>()
        > crate::offload::BODY_THRESHOLD;
    let encode = move || -> InferResult<WireAnswer> {
        let encoded = encode_infer_response(&response, &form)?;
        let (body, encoding) =
            match compression.and_then(|c| Some((compress(c, &encoded.body)?, c))) {
                Some((compressed, c)) => (compressed, Some(c)),
                None => (encoded.body, None),
            };
        Ok(WireAnswer {
            body,
            json_header_length: encoded.json_header_length,
            encoding,
        })
    };
    if !large {
        return encode();
    }
    crate::offload::run_or_inline(encode).await?
}

fn parse_header_length(headers: &HeaderMap) -> InferResult<Option<usize>> {
    let Some(v) = headers.get(&HEADER_LENGTH) else {
        return Ok(None);
    };
    v.to_str()
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .map(Some)
        .ok_or_else(|| {
            InferError::invalid(format!(
                "Inference-Header-Content-Length must be a non-negative integer, got {:?}",
                String::from_utf8_lossy(v.as_bytes())
            ))
        })
}

fn content_encoding(headers: &HeaderMap) -> InferResult<Option<String>> {
    let Some(v) = headers.get(header::CONTENT_ENCODING) else {
        return Ok(None);
    };
    let enc = v
        .to_str()
        .map_err(|_| InferError::invalid("Content-Encoding is not ASCII"))?
        .trim()
        .to_ascii_lowercase();
    Ok(match enc.as_str() {
        "" | "identity" => None,
        _ => Some(enc),
    })
}

/// Reads the request body within `--http-max-input-size`, the body
/// timeouts and the shard's body budget (see `frontend::transport::body`).
async fn read_body(body: Incoming, limit: usize) -> Result<Bytes, transport::BodyError> {
    transport::read_body(body, limit).await
}

/// 413, 408, 503 or 400 for a body that was not read; the connection is
/// closed, so the rest of the body is never read.
pub(super) fn body_error_response(e: &transport::BodyError) -> HttpResponse {
    let mut resp = respond(e.status, &APPLICATION_JSON, error_body(&e.message));
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

/// Decodes `%XX` escapes in a path segment (tritonclient quotes model names).
fn percent_decode(segment: &str) -> InferResult<Cow<'_, str>> {
    if !segment.contains('%') {
        return Ok(Cow::Borrowed(segment));
    }
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| {
                    InferError::invalid(format!(
                        "bad percent-escape in URL segment '{}'",
                        crate::types::clip(segment)
                    ))
                })?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map(Cow::Owned).map_err(|_| {
        InferError::invalid(format!(
            "URL segment '{}' is not UTF-8",
            crate::types::clip(segment)
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%20b").unwrap(), "a b");
        assert_eq!(percent_decode("simple").unwrap(), "simple");
        assert!(percent_decode("bad%2").is_err());
        assert!(percent_decode("bad%zz").is_err());
    }
}
