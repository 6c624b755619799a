//! The trace extension's endpoints: `GET/POST /v2/trace/setting`,
//! `GET/POST /v2/models/{m}/trace/setting` and the gRPC `TraceSetting`
//! RPC, with Triton's values (every value a string, `trace_level` a list)
//! and Triton's errors. The settings themselves live in `crate::trace`.

use std::collections::HashMap;

use bytes::Bytes;
use http::{header, HeaderValue, Method, StatusCode};
use http_body_util::Full;
use hyper::{body::Incoming, Request, Response};
use serde_json::Value;

use crate::{
    frontend::{env, transport},
    proto::inference::{trace_setting_response, TraceSettingRequest, TraceSettingResponse},
    shard,
    trace::{SettingUpdate, TraceView},
    types::{clip, InferError, InferResult},
};

/// Largest trace setting request body.
const MAX_BODY: usize = 64 * 1024;

/// Triton only takes model settings for a model that is ready.
fn check_model(model: &str) -> InferResult<()> {
    let ready =
        shard::with_current(|s| s.with_table(|t| t.resolve(model, "").is_ok())).unwrap_or(false);
    if ready {
        Ok(())
    } else {
        Err(InferError::invalid(format!(
            "Request for unknown model : {}",
            clip(model)
        )))
    }
}

fn outside() -> InferError {
    InferError::internal("trace settings requested outside a server shard")
}

fn read(model: Option<&str>) -> InferResult<TraceView> {
    env::with_current(|e| e.trace.settings(model)).ok_or_else(outside)?
}

fn write(model: Option<&str>, update: &SettingUpdate) -> InferResult<TraceView> {
    env::with_current(|e| e.trace.update(model, update)).ok_or_else(outside)?
}

/// A JSON request's settings: `null` clears, a string or a list of
/// strings sets (numbers are taken as their decimal text).
fn from_json(body: &[u8]) -> InferResult<Vec<(String, Option<Vec<String>>)>> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Vec::new());
    }
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        InferError::invalid(format!(
            "failed to parse the trace settings JSON: {}",
            clip(&e.to_string())
        ))
    })?;
    let Value::Object(map) = v else {
        return Err(InferError::invalid(
            "the trace settings must be a JSON object",
        ));
    };
    map.into_iter()
        .map(|(k, v)| {
            let scalar = |v: &Value| match v {
                Value::String(s) => Some(s.clone()),
                Value::Number(n) => Some(n.to_string()),
                _ => None,
            };
            let bad = || {
                InferError::invalid(format!(
                    "trace setting '{}' must be a string, a list of strings or null",
                    clip(&k)
                ))
            };
            let values = match &v {
                Value::Null => None,
                Value::Array(items) => Some(
                    items
                        .iter()
                        .map(|i| scalar(i).ok_or_else(bad))
                        .collect::<InferResult<Vec<_>>>()?,
                ),
                other => Some(vec![scalar(other).ok_or_else(bad)?]),
            };
            Ok((k, values))
        })
        .collect()
}

fn to_json(view: &TraceView) -> Value {
    let map = view
        .entries()
        .into_iter()
        .map(|(k, mut v)| {
            let value = if k == "trace_level" {
                Value::from(v)
            } else {
                Value::from(v.pop().unwrap_or_default())
            };
            (k.to_string(), value)
        })
        .collect::<serde_json::Map<_, _>>();
    Value::Object(map)
}

/// `GET` or `POST` on `/v2[/models/{model}]/trace/setting`.
pub async fn http(
    req: Request<Incoming>,
    model: Option<&str>,
) -> InferResult<Response<Full<Bytes>>> {
    if let Some(m) = model {
        check_model(m)?;
    }
    let view = match *req.method() {
        Method::GET => read(model)?,
        Method::POST => {
            let body = transport::read_body(req.into_body(), MAX_BODY)
                .await
                .map_err(|e| InferError::invalid(e.message))?;
            write(model, &SettingUpdate::parse(from_json(&body)?)?)?
        }
        ref m => {
            return Err(InferError::invalid(format!(
                "method {m} is not allowed on the trace setting endpoint"
            )))
        }
    };
    let mut resp = Response::new(Full::new(Bytes::from(to_json(&view).to_string())));
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

/// The gRPC `TraceSetting` RPC: a request with settings updates them
/// (a setting with no values is cleared); every request gets the settings
/// now in force.
pub fn grpc(req: TraceSettingRequest) -> InferResult<TraceSettingResponse> {
    let model = (!req.model_name.is_empty()).then_some(req.model_name.as_str());
    if let Some(m) = model {
        check_model(m)?;
    }
    let view = if req.settings.is_empty() {
        read(model)?
    } else {
        let items = req
            .settings
            .iter()
            .map(|(k, v)| (k.clone(), (!v.value.is_empty()).then(|| v.value.clone())))
            .collect();
        write(model, &SettingUpdate::parse(items)?)?
    };
    let settings: HashMap<String, trace_setting_response::SettingValue> = view
        .entries()
        .into_iter()
        .map(|(k, value)| {
            (
                k.to_string(),
                trace_setting_response::SettingValue { value },
            )
        })
        .collect();
    Ok(TraceSettingResponse { settings })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_settings_read_nulls_strings_lists_and_numbers() {
        let items =
            from_json(br#"{"trace_rate": "5", "trace_count": null, "trace_level": ["TIMESTAMPS"], "log_frequency": 2}"#)
                .unwrap();
        let get = |k: &str| items.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(get("trace_rate"), Some(Some(vec!["5".to_string()])));
        assert_eq!(get("trace_count"), Some(None));
        assert_eq!(
            get("trace_level"),
            Some(Some(vec!["TIMESTAMPS".to_string()]))
        );
        assert_eq!(get("log_frequency"), Some(Some(vec!["2".to_string()])));
        assert!(from_json(br#"{"trace_rate": true}"#).is_err());
        assert!(from_json(br#"[1]"#).is_err());
        assert!(from_json(b"{").is_err());
        assert!(from_json(b" ").unwrap().is_empty());
    }
}
