//! Triton's logging extension: `GET/POST /v2/logging` and the gRPC
//! `LogSettings` RPC read and change the log settings at run time.
//!
//! The settings live here; the binary installs a hook (`install`) that
//! turns them into a `tracing` filter and swaps it into the running
//! subscriber. Servers started in-process without that hook (tests) keep
//! and report the settings but their logging does not change.
//! `log_file` (only "" — logs go to standard output) and `log_format`
//! (only "default") are refused otherwise rather than silently ignored.

use std::{
    collections::HashMap,
    sync::{Mutex, OnceLock},
};

use bytes::Bytes;
use http::{header, HeaderValue, Method, StatusCode};
use http_body_util::Full;
use hyper::{body::Incoming, Request, Response};
use serde_json::{json, Value};

use crate::{
    frontend::transport,
    proto::inference::{
        log_settings_request, log_settings_response, LogSettingsRequest, LogSettingsResponse,
    },
    types::{clip, InferError, InferResult},
};

/// Triton's log settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    pub log_file: String,
    pub log_info: bool,
    pub log_warning: bool,
    pub log_error: bool,
    pub log_verbose_level: u32,
    pub log_format: String,
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            log_file: String::new(),
            log_info: true,
            log_warning: true,
            log_error: true,
            log_verbose_level: 0,
            log_format: "default".into(),
        }
    }
}

impl LogSettings {
    /// The `tracing` filter these settings mean: the most verbose level
    /// that is on (verbose 1 = debug, 2 and more = trace).
    pub fn filter_directive(&self) -> &'static str {
        match (
            self.log_verbose_level,
            self.log_info,
            self.log_warning,
            self.log_error,
        ) {
            (v, _, _, _) if v >= 2 => "trace",
            (1, _, _, _) => "debug",
            (_, true, _, _) => "info",
            (_, _, true, _) => "warn",
            (_, _, _, true) => "error",
            _ => "off",
        }
    }
}

/// One setting's new value, whichever protocol sent it.
#[derive(Debug, Clone, PartialEq)]
pub enum SettingValue {
    Bool(bool),
    Uint(u64),
    Str(String),
}

type ApplyHook = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

static SETTINGS: Mutex<Option<LogSettings>> = Mutex::new(None);
static APPLY: OnceLock<ApplyHook> = OnceLock::new();

/// Called once by the binary: the verbose level it started with, and how
/// to apply a new filter directive to the running subscriber.
pub fn install(
    verbose_level: u32,
    apply: impl Fn(&str) -> Result<(), String> + Send + Sync + 'static,
) {
    if let Ok(mut s) = SETTINGS.lock() {
        s.get_or_insert_with(LogSettings::default).log_verbose_level = verbose_level;
    }
    let _ = APPLY.set(Box::new(apply));
}

fn poisoned() -> InferError {
    InferError::internal("the log settings are unusable after a panic")
}

pub fn current() -> InferResult<LogSettings> {
    Ok(SETTINGS
        .lock()
        .map_err(|_| poisoned())?
        .clone()
        .unwrap_or_default())
}

/// Checks every change first (nothing changes when one is bad), then
/// applies them all and returns the new settings.
pub fn update(changes: Vec<(String, SettingValue)>) -> InferResult<LogSettings> {
    let mut guard = SETTINGS.lock().map_err(|_| poisoned())?;
    let mut next = guard.clone().unwrap_or_default();
    for (key, value) in changes {
        let wrong = |what: &str| {
            InferError::invalid(format!(
                "log setting '{}' must be {what}, got {value:?}",
                clip(&key)
            ))
        };
        match (key.as_str(), &value) {
            ("log_info", SettingValue::Bool(b)) => next.log_info = *b,
            ("log_warning", SettingValue::Bool(b)) => next.log_warning = *b,
            ("log_error", SettingValue::Bool(b)) => next.log_error = *b,
            ("log_info" | "log_warning" | "log_error", _) => return Err(wrong("a boolean")),
            ("log_verbose_level", SettingValue::Uint(n)) => {
                next.log_verbose_level =
                    u32::try_from(*n).map_err(|_| wrong("a 32-bit unsigned integer"))?
            }
            ("log_verbose_level", _) => return Err(wrong("an unsigned integer")),
            ("log_file", SettingValue::Str(s)) if s.is_empty() => next.log_file.clear(),
            ("log_file", SettingValue::Str(_)) => {
                return Err(InferError::unsupported(
                    "log_file: shardserve logs to standard output only; redirect it instead",
                ))
            }
            ("log_format", SettingValue::Str(s)) if s == "default" => next.log_format = s.clone(),
            ("log_format", SettingValue::Str(s)) => {
                return Err(InferError::unsupported(format!(
                    "log_format '{}' is not supported; only 'default' is",
                    clip(s)
                )))
            }
            ("log_file" | "log_format", _) => return Err(wrong("a string")),
            _ => {
                return Err(InferError::invalid(format!(
                    "unknown log setting '{}'",
                    clip(&key)
                )))
            }
        }
    }
    if let Some(apply) = APPLY.get() {
        apply(next.filter_directive())
            .map_err(|e| InferError::internal(format!("cannot apply the log settings: {e}")))?;
    }
    tracing::info!(filter = next.filter_directive(), "log settings changed");
    *guard = Some(next.clone());
    Ok(next)
}

fn to_json(s: &LogSettings) -> Value {
    json!({
        "log_file": s.log_file,
        "log_info": s.log_info,
        "log_warning": s.log_warning,
        "log_error": s.log_error,
        "log_verbose_level": s.log_verbose_level,
        "log_format": s.log_format,
    })
}

fn from_json(body: &[u8]) -> InferResult<Vec<(String, SettingValue)>> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Vec::new());
    }
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        InferError::invalid(format!(
            "failed to parse the log settings JSON: {}",
            clip(&e.to_string())
        ))
    })?;
    let Value::Object(map) = v else {
        return Err(InferError::invalid(
            "the log settings must be a JSON object",
        ));
    };
    map.into_iter()
        .map(|(k, v)| {
            let value = match v {
                Value::Bool(b) => SettingValue::Bool(b),
                Value::String(s) => SettingValue::Str(s),
                Value::Number(n) => match n.as_u64() {
                    Some(u) => SettingValue::Uint(u),
                    None => {
                        return Err(InferError::invalid(format!(
                            "log setting '{}' must be an unsigned integer",
                            clip(&k)
                        )))
                    }
                },
                _ => {
                    return Err(InferError::invalid(format!(
                        "log setting '{}' has an unsupported JSON type",
                        clip(&k)
                    )))
                }
            };
            Ok((k, value))
        })
        .collect()
}

/// `GET /v2/logging` and `POST /v2/logging`.
pub async fn http(req: Request<Incoming>) -> InferResult<Response<Full<Bytes>>> {
    let settings = match *req.method() {
        Method::GET => current()?,
        Method::POST => {
            let body = transport::read_body(req.into_body(), 64 * 1024)
                .await
                .map_err(|e| InferError::invalid(e.message))?;
            update(from_json(&body)?)?
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

/// The gRPC `LogSettings` RPC: applies what the request sets (nothing for
/// an empty request) and answers every setting.
pub fn grpc(req: LogSettingsRequest) -> InferResult<LogSettingsResponse> {
    use log_settings_request::setting_value::ParameterChoice as In;
    use log_settings_response::setting_value::ParameterChoice as Out;
    let changes = req
        .settings
        .into_iter()
        .map(|(k, v)| {
            let value = match v.parameter_choice {
                Some(In::BoolParam(b)) => SettingValue::Bool(b),
                Some(In::Uint32Param(n)) => SettingValue::Uint(u64::from(n)),
                Some(In::StringParam(s)) => SettingValue::Str(s),
                None => {
                    return Err(InferError::invalid(format!(
                        "log setting '{}' has no value",
                        clip(&k)
                    )))
                }
            };
            Ok((k, value))
        })
        .collect::<InferResult<Vec<_>>>()?;
    let s = if changes.is_empty() {
        current()?
    } else {
        update(changes)?
    };
    let value = |c: Out| log_settings_response::SettingValue {
        parameter_choice: Some(c),
    };
    let settings: HashMap<String, log_settings_response::SettingValue> = [
        ("log_file", value(Out::StringParam(s.log_file.clone()))),
        ("log_info", value(Out::BoolParam(s.log_info))),
        ("log_warning", value(Out::BoolParam(s.log_warning))),
        ("log_error", value(Out::BoolParam(s.log_error))),
        (
            "log_verbose_level",
            value(Out::Uint32Param(s.log_verbose_level)),
        ),
        ("log_format", value(Out::StringParam(s.log_format.clone()))),
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
    fn filter_follows_the_most_verbose_level_on() {
        let mut s = LogSettings::default();
        assert_eq!(s.filter_directive(), "info");
        s.log_verbose_level = 1;
        assert_eq!(s.filter_directive(), "debug");
        s.log_verbose_level = 0;
        s.log_info = false;
        assert_eq!(s.filter_directive(), "warn");
        s.log_warning = false;
        s.log_error = false;
        assert_eq!(s.filter_directive(), "off");
    }

    #[test]
    fn json_settings_parse_and_refuse_bad_types() {
        let c = from_json(br#"{"log_info": false, "log_verbose_level": 2}"#).unwrap();
        assert_eq!(c.len(), 2);
        assert!(from_json(br#"{"log_verbose_level": -1}"#).is_err());
        assert!(from_json(b"[1]").is_err());
        assert!(from_json(b"  ").unwrap().is_empty());
    }

    #[test]
    fn bad_changes_change_nothing() {
        let before = current().unwrap();
        assert!(update(vec![
            ("log_info".into(), SettingValue::Bool(!before.log_info)),
            ("log_file".into(), SettingValue::Str("/tmp/x".into())),
        ])
        .is_err());
        assert!(update(vec![("log_error".into(), SettingValue::Uint(1))]).is_err());
        assert!(update(vec![("nope".into(), SettingValue::Bool(true))]).is_err());
        assert_eq!(current().unwrap(), before);
    }
}
