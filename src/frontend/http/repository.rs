//! The model repository extension over HTTP: `POST /v2/repository/index`,
//! `.../models/{m}/load` (with `config` and `file:<path>` parameters) and
//! `.../models/{m}/unload`. The work happens on the repository thread.

use std::{borrow::Cow, collections::BTreeMap};

use base64::Engine as _;
use bytes::Bytes;
use hyper::{body::Incoming, Request, StatusCode};
use serde_json::{json, value::RawValue, Value};

use super::{
    routes::{body_error_response, empty, json_ok},
    server::HttpResponse,
};
use crate::{
    frontend::{core, transport},
    repository::manager::{LoadRequest, RepositoryClient},
    types::{clip, InferError, InferResult},
};

pub async fn route(req: Request<Incoming>, rest: &[&str]) -> InferResult<HttpResponse> {
    if req.method() != hyper::Method::POST {
        return Err(InferError::invalid(format!(
            "method {} is not allowed on the repository endpoints (use POST)",
            req.method()
        )));
    }
    // The environment is borrowed; the client (a channel sender) is
    // cloned, as it must outlive the borrow across the awaits below.
    let (limit, client) = crate::frontend::env::with_current(|e| {
        (e.limits.http_max_input_size, e.repository.get().cloned())
    })
    .ok_or_else(|| InferError::internal("request handled outside a shard thread"))?;
    let client =
        client.ok_or_else(|| InferError::unavailable("the model repository is not started yet"))?;
    let body = match transport::read_body(req.into_body(), limit).await {
        Ok(b) => b,
        Err(e) => return Ok(body_error_response(&e)),
    };
    if let ["models", model, "load"] = rest {
        // The body goes once its files are decoded (into the shard's body
        // budget); the decoded files are released once written.
        let load = load_request(body)?;
        client.load(model.to_string(), load).await?;
        return Ok(empty(StatusCode::OK));
    }
    let json = parse_body(&body)?;
    match rest {
        ["index"] => index(&client, &json).await,
        ["models", model, "unload"] => {
            let unload_dependents = match json.pointer("/parameters/unload_dependents") {
                None => false,
                Some(v) => v.as_bool().ok_or_else(|| {
                    InferError::invalid("parameter 'unload_dependents' must be a boolean")
                })?,
            };
            client.unload(model.to_string(), unload_dependents).await?;
            Ok(empty(StatusCode::OK))
        }
        _ => Err(InferError::not_found(format!(
            "no such endpoint: POST /v2/repository/{}",
            clip(&rest.join("/"))
        ))),
    }
}

fn parse_body(body: &Bytes) -> InferResult<Value> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| InferError::invalid(format!("failed to parse the request JSON: {e}")))?;
    if !v.is_object() {
        return Err(InferError::invalid(
            "the request body must be a JSON object",
        ));
    }
    Ok(v)
}

async fn index(client: &RepositoryClient, json: &Value) -> InferResult<HttpResponse> {
    let ready = match json.get("ready") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(InferError::invalid("'ready' must be a boolean")),
    };
    let rows = client.index(ready).await?;
    Ok(json_ok(&core::index::to_json(&rows)))
}

/// `config` (a JSON model configuration as a string) and `file:<path>`
/// (base64 file contents) parameters. The base64 text is read where it
/// lies in the body (no copy of it is made), and each decoded file is
/// counted in the shard's body budget before it is allocated: the
/// request holds its body and its decoded files at once, and both count.
fn load_request(body: Bytes) -> InferResult<LoadRequest> {
    let mut load = LoadRequest::default();
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(load);
    }
    let bad_json = |e: serde_json::Error| {
        InferError::invalid(format!("failed to parse the request JSON: {e}"))
    };
    let top: BTreeMap<Cow<'_, str>, &RawValue> = serde_json::from_slice(&body).map_err(|e| {
        if e.is_data() {
            InferError::invalid("the request body must be a JSON object")
        } else {
            bad_json(e)
        }
    })?;
    let Some(params) = top.get("parameters") else {
        return Ok(load);
    };
    let params: BTreeMap<Cow<'_, str>, &RawValue> = serde_json::from_str(params.get())
        .map_err(|_| InferError::invalid("'parameters' must be a JSON object"))?;
    for (key, value) in &params {
        if key == "config" {
            let text: String = serde_json::from_str(value.get()).map_err(|_| {
                InferError::invalid(
                    "parameter 'config' must be a string holding the model configuration as JSON",
                )
            })?;
            load.config = Some(text);
        } else if let Some(path) = key.strip_prefix("file:") {
            let not_string = || {
                InferError::invalid(format!("parameter '{}' must be a base64 string", clip(key)))
            };
            let raw = value.get();
            // Base64 needs no JSON escapes: the text between the quotes is
            // the string, unless the client escaped something anyway.
            let encoded: Cow<'_, str> =
                match raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
                    Some(inner) if !inner.contains('\\') => Cow::Borrowed(inner),
                    Some(_) => {
                        Cow::Owned(serde_json::from_str::<String>(raw).map_err(|_| not_string())?)
                    }
                    None => return Err(not_string()),
                };
            let engine = &base64::engine::general_purpose::STANDARD;
            let estimate = base64::decoded_len_estimate(encoded.len());
            let hold = transport::reserve_buffered(estimate)
                .map_err(|e| InferError::unavailable(e.message))?;
            let mut data = Vec::with_capacity(estimate);
            engine
                .decode_vec(encoded.as_bytes(), &mut data)
                .map_err(|e| {
                    InferError::invalid(format!(
                        "parameter '{}' is not valid base64: {e}",
                        clip(key)
                    ))
                })?;
            load.files.push((path.to_string(), hold.into_bytes(data)));
        }
    }
    Ok(load)
}
