//! `/v2/systemsharedmemory/...` and `/v2/cudasharedmemory/...`:
//! register, status and unregister, as Triton serves them. CUDA regions
//! are answered as Triton built without GPU support answers them.

use bytes::Bytes;
use http::{header, HeaderValue, Method, StatusCode};
use http_body_util::Full;
use hyper::{body::Incoming, Request, Response};
use serde::Deserialize;
use serde_json::json;

use super::server::HttpResponse;
use crate::{
    error_texts,
    protocol::transport,
    shm,
    types::{clip, InferError, InferResult},
};

/// The largest register body we read: a name, a key and two numbers.
const MAX_REGISTER_BODY: usize = 64 * 1024;

fn ok(body: Bytes) -> HttpResponse {
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// `segs` starts after `v2`: `[kind, ...]` with kind `systemsharedmemory`
/// or `cudasharedmemory`.
pub async fn handle(req: Request<Incoming>, segs: &[&str]) -> InferResult<HttpResponse> {
    let method = req.method().clone();
    let (kind, name, action) = match segs {
        [kind, action] => (*kind, "", *action),
        [kind, "region", name, action] => (*kind, *name, *action),
        _ => {
            return Err(InferError::not_found(format!(
                "no such endpoint: {method} /v2/{}",
                clip(&segs.join("/"))
            )))
        }
    };
    let expected = if action == "status" {
        Method::GET
    } else {
        Method::POST
    };
    if !matches!(action, "status" | "register" | "unregister")
        || (action == "register" && name.is_empty())
    {
        return Err(InferError::not_found(format!(
            "no such endpoint: {method} /v2/{}",
            clip(&segs.join("/"))
        )));
    }
    if method != expected {
        return Err(InferError::invalid(format!(
            "method {method} is not allowed on /v2/{}",
            clip(&segs.join("/"))
        )));
    }
    match (kind, action) {
        ("systemsharedmemory", "status") => {
            let regions = shm::global().status(name)?;
            let list: Vec<_> = regions
                .iter()
                .map(|r| {
                    json!({"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size})
                })
                .collect();
            Ok(ok(Bytes::from(serde_json::Value::from(list).to_string())))
        }
        ("systemsharedmemory", "register") => {
            let body = transport::read_body(req.into_body(), MAX_REGISTER_BODY)
                .await
                .map_err(|e| InferError::invalid(e.message))?;
            let r = parse_register(&body)?;
            shm::global().register(name, &r.key, r.offset, r.byte_size)?;
            Ok(ok(Bytes::new()))
        }
        ("systemsharedmemory", "unregister") => {
            if name.is_empty() {
                shm::global().unregister_all()?;
            } else {
                shm::global().unregister(name)?;
            }
            Ok(ok(Bytes::new()))
        }
        (_, "status") => {
            if name.is_empty() {
                Ok(ok(Bytes::from_static(b"[]")))
            } else {
                Err(error_texts::cuda_shm_unknown_region(name))
            }
        }
        (_, "register") => Err(error_texts::cuda_shm_register_no_gpu(name)),
        // No CUDA region can exist; Triton answers OK for unknown names.
        _ => Ok(ok(Bytes::new())),
    }
}

#[derive(Deserialize)]
struct RegisterJson {
    key: String,
    #[serde(default)]
    offset: u64,
    byte_size: u64,
}

fn parse_register(body: &[u8]) -> InferResult<RegisterJson> {
    serde_json::from_slice(body).map_err(|e| {
        InferError::invalid(format!(
            "failed to parse the shared memory register request: {} \
             (expected {{\"key\": string, \"offset\": integer, \"byte_size\": integer}})",
            clip(&e.to_string())
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_body() {
        let r = parse_register(br#"{"key": "/k", "offset": 8, "byte_size": 64}"#).unwrap();
        assert_eq!((r.key.as_str(), r.offset, r.byte_size), ("/k", 8, 64));
        assert!(parse_register(br#"{"key": "/k"}"#).is_err());
        assert!(parse_register(br#"{"key": "/k", "byte_size": -1}"#).is_err());
        assert!(parse_register(b"not json").is_err());
    }
}
