//! Triton's logging extension: `GET/POST /v2/logging` and the gRPC
//! `LogSettings` RPC read and change the log settings at run time.
//!
//! The settings and their effect live in `crate::logs`; this is the wire
//! side, with tritonserver 2.51's validation and error texts (its HTTP
//! `HandleLogging` and gRPC `LogSettings` handlers): settings are read in
//! its order (`log_file`, `log_info`, `log_warning`, `log_error`,
//! `log_verbose_level`, `log_format`), the first bad one is the error,
//! unknown keys (and, over HTTP, JSON nulls) are ignored, and `log_file`
//! cannot be set over the network. Unlike Triton, a request with a bad
//! setting changes nothing (Triton keeps the changes it made before the
//! bad one), and `log_format` also takes `json`, our format beyond
//! Triton's.

use std::collections::HashMap;

use bytes::Bytes;
use http::{header, HeaderValue, Method, StatusCode};
use http_body_util::Full;
use hyper::{body::Incoming, Request, Response};
use serde_json::{json, Value};

use crate::{
    frontend::transport,
    logs::{self, LogChanges, LogFormat, LogSettings},
    proto::inference::{
        log_settings_request, log_settings_response, LogSettingsRequest, LogSettingsResponse,
    },
    types::{clip, InferError, InferResult},
};

const NO_LOG_FILE: &str = "log file location can not be updated through network protocol";

fn apply(changes: &LogChanges) -> InferResult<LogSettings> {
    if *changes == LogChanges::default() {
        return Ok(logs::settings());
    }
    let next = logs::update(changes)
        .map_err(|e| InferError::internal(format!("cannot apply the log settings: {e:#}")))?;
    tracing::info!(
        log_info = next.info,
        log_warning = next.warning,
        log_error = next.error,
        log_verbose_level = next.verbose,
        log_format = %next.format,
        "log settings changed"
    );
    Ok(next)
}

fn log_file_text(s: &LogSettings) -> String {
    s.file
        .as_deref()
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

fn to_json(s: &LogSettings) -> Value {
    json!({
        "log_file": log_file_text(s),
        "log_info": s.info,
        "log_warning": s.warning,
        "log_error": s.error,
        "log_verbose_level": s.verbose,
        "log_format": s.format.to_string(),
    })
}

/// The changes a POST body asks for, checked as tritonserver checks them
/// (its TritonJson texts and its status codes: a type error is INTERNAL,
/// a bad format UNAVAILABLE, the file UNSUPPORTED).
fn from_json(body: &[u8]) -> InferResult<LogChanges> {
    let mut changes = LogChanges::default();
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(changes);
    }
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        InferError::internal(format!(
            "failed to parse the request JSON buffer: {}",
            clip(&e.to_string())
        ))
    })?;
    let Value::Object(map) = v else {
        // Triton finds no setting in a body that is not an object.
        return Ok(changes);
    };
    let get = |key: &str| map.get(key).filter(|v| !v.is_null());
    if get("log_file").is_some() {
        return Err(InferError::unsupported(NO_LOG_FILE));
    }
    let boolean = |key: &str| -> InferResult<Option<bool>> {
        get(key)
            .map(|v| {
                v.as_bool().ok_or_else(|| {
                    InferError::internal("attempt to access JSON non-boolean as boolean")
                })
            })
            .transpose()
    };
    changes.info = boolean("log_info")?;
    changes.warning = boolean("log_warning")?;
    changes.error = boolean("log_error")?;
    if let Some(v) = get("log_verbose_level") {
        let n = v.as_u64().ok_or_else(|| {
            InferError::internal("attempt to access JSON non-unsigned-integer as unsigned-integer")
        })?;
        changes.verbose = Some(u32::try_from(n).map_err(|_| {
            InferError::invalid(format!(
                "log_verbose_level must be at most {}, got {n}",
                u32::MAX
            ))
        })?);
    }
    if let Some(v) = get("log_format") {
        let s = v
            .as_str()
            .ok_or_else(|| InferError::internal("attempt to access JSON non-string as string"))?;
        changes.format = Some(s.parse::<LogFormat>().map_err(|_| {
            InferError::unavailable(format!(
                "invalid argument for --log_format, got: {}",
                clip(s)
            ))
        })?);
    }
    Ok(changes)
}

/// `GET /v2/logging` and `POST /v2/logging`.
pub async fn http(req: Request<Incoming>) -> InferResult<Response<Full<Bytes>>> {
    let settings = match *req.method() {
        Method::GET => logs::settings(),
        Method::POST => {
            let body = transport::read_body(req.into_body(), 64 * 1024)
                .await
                .map_err(|e| InferError::invalid(e.message))?;
            apply(&from_json(&body)?)?
        }
        ref m => {
            return Err(InferError::invalid(format!(
                "method {m} is not allowed on /v2/logging"
            )))
        }
    };
    let mut resp = Response::new(Full::new(Bytes::from(to_json(&settings).to_string())));
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

/// The changes a gRPC request asks for, with the gRPC handler's texts (all
/// INVALID_ARGUMENT but the file, UNIMPLEMENTED whatever its value).
fn from_grpc(req: &LogSettingsRequest) -> InferResult<LogChanges> {
    use log_settings_request::setting_value::ParameterChoice as In;
    let mut changes = LogChanges::default();
    let settings = &req.settings;
    if settings.contains_key("log_file") {
        return Err(InferError::unsupported(NO_LOG_FILE));
    }
    let get = |key: &str| settings.get(key).map(|v| v.parameter_choice.as_ref());
    let boolean = |key: &str| -> InferResult<Option<bool>> {
        match get(key) {
            None => Ok(None),
            Some(Some(In::BoolParam(b))) => Ok(Some(*b)),
            Some(_) => Err(InferError::invalid(format!("expect boolean for '{key}'"))),
        }
    };
    changes.info = boolean("log_info")?;
    changes.warning = boolean("log_warning")?;
    changes.error = boolean("log_error")?;
    changes.verbose = match get("log_verbose_level") {
        None => None,
        Some(Some(In::Uint32Param(n))) => Some(*n),
        Some(_) => return Err(InferError::invalid("expect int32 for 'log_verbose_level'")),
    };
    changes.format = match get("log_format") {
        None => None,
        Some(Some(In::StringParam(s))) => Some(s.parse::<LogFormat>().map_err(|_| {
            InferError::invalid(format!("invalid argument for log_format, got: {}", clip(s)))
        })?),
        Some(_) => return Err(InferError::invalid("expect string for 'log_format'")),
    };
    Ok(changes)
}

/// The gRPC `LogSettings` RPC: applies what the request sets (nothing for
/// an empty request) and answers every setting.
pub fn grpc(req: LogSettingsRequest) -> InferResult<LogSettingsResponse> {
    use log_settings_response::setting_value::ParameterChoice as Out;
    let s = apply(&from_grpc(&req)?)?;
    let value = |c: Out| log_settings_response::SettingValue {
        parameter_choice: Some(c),
    };
    let settings: HashMap<String, log_settings_response::SettingValue> = [
        ("log_file", value(Out::StringParam(log_file_text(&s)))),
        ("log_info", value(Out::BoolParam(s.info))),
        ("log_warning", value(Out::BoolParam(s.warning))),
        ("log_error", value(Out::BoolParam(s.error))),
        ("log_verbose_level", value(Out::Uint32Param(s.verbose))),
        ("log_format", value(Out::StringParam(s.format.to_string()))),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    Ok(LogSettingsResponse { settings })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_settings_parse_as_triton_checks_them() {
        let c = from_json(br#"{"log_info": false, "log_verbose_level": 2, "x": 1}"#).unwrap();
        assert_eq!(c.info, Some(false));
        assert_eq!(c.verbose, Some(2));
        assert_eq!(
            from_json(br#"{"log_format": "ISO8601", "log_error": null}"#).unwrap(),
            LogChanges {
                format: Some(LogFormat::Iso8601),
                ..LogChanges::default()
            }
        );
        assert!(from_json(b"[1]").unwrap() == LogChanges::default());
        assert!(from_json(b"  ").unwrap() == LogChanges::default());
        let err = |body: &[u8]| from_json(body).unwrap_err();
        let e = err(br#"{"log_verbose_level": -1}"#);
        assert_eq!(
            e.message,
            "attempt to access JSON non-unsigned-integer as unsigned-integer"
        );
        assert_eq!(e.kind, crate::types::ErrorKind::Internal);
        let e = err(br#"{"log_info": "yes"}"#);
        assert_eq!(e.message, "attempt to access JSON non-boolean as boolean");
        let e = err(br#"{"log_format": 1}"#);
        assert_eq!(e.message, "attempt to access JSON non-string as string");
        let e = err(br#"{"log_format": "xml"}"#);
        assert_eq!(e.message, "invalid argument for --log_format, got: xml");
        assert_eq!(e.kind, crate::types::ErrorKind::Unavailable);
        let e = err(br#"{"log_file": "", "log_info": "bad"}"#);
        assert_eq!(e.message, NO_LOG_FILE);
        assert_eq!(e.kind, crate::types::ErrorKind::Unsupported);
        let e = err(b"{");
        assert!(e
            .message
            .starts_with("failed to parse the request JSON buffer: "));
    }

    #[test]
    fn grpc_settings_parse_as_triton_checks_them() {
        use log_settings_request::{setting_value::ParameterChoice as In, SettingValue};
        let req = |pairs: &[(&str, In)]| LogSettingsRequest {
            settings: pairs
                .iter()
                .map(|(k, v)| {
                    (
                        k.to_string(),
                        SettingValue {
                            parameter_choice: Some(v.clone()),
                        },
                    )
                })
                .collect(),
        };
        let c = from_grpc(&req(&[
            ("log_warning", In::BoolParam(false)),
            ("log_format", In::StringParam("json".into())),
        ]))
        .unwrap();
        assert_eq!(c.warning, Some(false));
        assert_eq!(c.format, Some(LogFormat::Json));
        let msg = |pairs: &[(&str, In)]| from_grpc(&req(pairs)).unwrap_err().message;
        assert_eq!(
            msg(&[("log_info", In::Uint32Param(1))]),
            "expect boolean for 'log_info'"
        );
        assert_eq!(
            msg(&[("log_verbose_level", In::BoolParam(true))]),
            "expect int32 for 'log_verbose_level'"
        );
        assert_eq!(
            msg(&[("log_format", In::StringParam("ISO".into()))]),
            "invalid argument for log_format, got: ISO"
        );
        assert_eq!(
            msg(&[("log_file", In::StringParam(String::new()))]),
            NO_LOG_FILE
        );
    }
}
