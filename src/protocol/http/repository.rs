//! The model repository extension over HTTP: `POST /v2/repository/index`,
//! `.../models/{m}/load` (with `config` and `file:<path>` parameters) and
//! `.../models/{m}/unload`. The work happens on the repository thread.

use base64::Engine as _;
use bytes::Bytes;
use hyper::{body::Incoming, Request, StatusCode};
use serde_json::{json, Value};

use super::{
    routes::{body_error_response, empty, json_ok},
    server::HttpResponse,
};
use crate::{
    protocol::transport,
    repository::manager::{IndexEntry, LoadRequest, RepositoryClient},
    types::{clip, InferError, InferResult},
};

pub async fn route(req: Request<Incoming>, rest: &[&str]) -> InferResult<HttpResponse> {
    if req.method() != hyper::Method::POST {
        return Err(InferError::invalid(format!(
            "method {} is not allowed on the repository endpoints (use POST)",
            req.method()
        )));
    }
    // The server state is borrowed; the client (a channel sender) is
    // cloned, as it must outlive the borrow across the awaits below.
    let (limit, client) = crate::server::state::with_current(|s| {
        (s.options.http_max_input_size, s.repository.get().cloned())
    })
    .ok_or_else(|| InferError::internal("request handled outside a shard thread"))?;
    let client =
        client.ok_or_else(|| InferError::unavailable("the model repository is not started yet"))?;
    let body = match transport::read_body(req.into_body(), limit).await {
        Ok(b) => b,
        Err(e) => return Ok(body_error_response(&e)),
    };
    let json = parse_body(&body)?;
    match rest {
        ["index"] => index(&client, &json).await,
        ["models", model, "load"] => {
            client.load(model.to_string(), load_request(&json)?).await?;
            Ok(empty(StatusCode::OK))
        }
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
    Ok(json_ok(&Value::Array(
        rows.iter().map(index_json).collect(),
    )))
}

fn index_json(e: &IndexEntry) -> Value {
    let mut o = serde_json::Map::new();
    o.insert("name".into(), json!(e.name));
    if let Some(v) = &e.version {
        o.insert("version".into(), json!(v));
    }
    if let Some(s) = e.state {
        o.insert("state".into(), json!(s));
    }
    if let Some(r) = &e.reason {
        o.insert("reason".into(), json!(r));
    }
    Value::Object(o)
}

/// `config` (a JSON model configuration as a string) and `file:<path>`
/// (base64 file contents) parameters.
fn load_request(json: &Value) -> InferResult<LoadRequest> {
    let mut load = LoadRequest::default();
    let Some(params) = json.get("parameters") else {
        return Ok(load);
    };
    let params = params
        .as_object()
        .ok_or_else(|| InferError::invalid("'parameters' must be a JSON object"))?;
    for (key, value) in params {
        if key == "config" {
            let text = value.as_str().ok_or_else(|| {
                InferError::invalid(
                    "parameter 'config' must be a string holding the model configuration as JSON",
                )
            })?;
            load.config = Some(text.to_string());
        } else if let Some(path) = key.strip_prefix("file:") {
            let encoded = value.as_str().ok_or_else(|| {
                InferError::invalid(format!("parameter '{}' must be a base64 string", clip(key)))
            })?;
            let data = base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .map_err(|e| {
                    InferError::invalid(format!(
                        "parameter '{}' is not valid base64: {e}",
                        clip(key)
                    ))
                })?;
            load.files.push((path.to_string(), Bytes::from(data)));
        }
    }
    Ok(load)
}
