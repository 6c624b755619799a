//! `/v2/systemsharedmemory/...` and `/v2/cudasharedmemory/...`:
//! register, status and unregister, as Triton serves them. Without a
//! usable GPU, CUDA register answers as Triton built without GPU support.

use bytes::Bytes;
use http::{header, HeaderValue, Method, StatusCode};
use http_body_util::Full;
use hyper::{body::Incoming, Request, Response};
use serde::Deserialize;
use serde_json::json;

use super::server::HttpResponse;
use crate::{
    error_texts,
    frontend::transport,
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
        || (action == "register" && name.is_empty() && kind == "systemsharedmemory")
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
            let regions = shm::global().system_status(name)?;
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
            shm::global().register_system(name, &r.key, r.offset, r.byte_size)?;
            Ok(ok(Bytes::new()))
        }
        ("systemsharedmemory", "unregister") => {
            if name.is_empty() {
                shm::global().unregister_all(shm::Kind::System)?;
            } else {
                shm::global().unregister(name, shm::Kind::System)?;
            }
            Ok(ok(Bytes::new()))
        }
        (_, "status") => {
            let regions = shm::global().cuda_status(name)?;
            let list: Vec<_> = regions
                .iter()
                .map(
                    |r| json!({"name": r.name, "device_id": r.device_id, "byte_size": r.byte_size}),
                )
                .collect();
            Ok(ok(Bytes::from(serde_json::Value::from(list).to_string())))
        }
        (_, "register") => {
            // Triton's order: the name, then (built without GPU support)
            // the refusal, before the body is read.
            if name.is_empty() {
                return Err(error_texts::cuda_shm_register_no_name());
            }
            if shm::cuda::unavailable().is_some() {
                return Err(error_texts::cuda_shm_register_no_gpu(name));
            }
            let body = transport::read_body(req.into_body(), MAX_REGISTER_BODY)
                .await
                .map_err(|e| InferError::invalid(e.message))?;
            let r = parse_cuda_register(&body)?;
            shm::global().register_cuda(name, &r.handle, r.device_id, r.byte_size)?;
            Ok(ok(Bytes::new()))
        }
        _ => {
            if name.is_empty() {
                shm::global().unregister_all(shm::Kind::Cuda)?;
            } else {
                shm::global().unregister(name, shm::Kind::Cuda)?;
            }
            Ok(ok(Bytes::new()))
        }
    }
}

/// A CUDA register body: `{"raw_handle": {"b64": ...}, "device_id": n,
/// "byte_size": n}`.
struct CudaRegister {
    handle: Vec<u8>,
    device_id: i64,
    byte_size: u64,
}

fn parse_cuda_register(body: &[u8]) -> InferResult<CudaRegister> {
    #[derive(Deserialize)]
    struct RawHandle {
        b64: String,
    }
    #[derive(Deserialize)]
    struct Body {
        raw_handle: Option<RawHandle>,
        byte_size: u64,
        device_id: u64,
    }
    let b: Body = serde_json::from_slice(body).map_err(|e| {
        InferError::invalid(format!(
            "failed to parse the CUDA shared memory register request: {} \
             (expected {{\"raw_handle\": {{\"b64\": string}}, \"device_id\": integer, \
             \"byte_size\": integer}})",
            clip(&e.to_string())
        ))
    })?;
    let raw = b.raw_handle.ok_or_else(|| {
        InferError::invalid("Shared memory register request has no 'raw_handle' field")
    })?;
    use base64::Engine as _;
    // Triton's decoder is lenient and then checks the size; either way a
    // handle that is not 64 bytes of base64 gets its size error.
    let handle = base64::engine::general_purpose::STANDARD
        .decode(raw.b64.trim())
        .map_err(|_| error_texts::cuda_shm_bad_handle())?;
    if handle.len() != shm::cuda::IPC_HANDLE_SIZE {
        return Err(error_texts::cuda_shm_bad_handle());
    }
    Ok(CudaRegister {
        handle,
        device_id: i64::try_from(b.device_id)
            .map_err(|_| InferError::invalid("'device_id' is out of range"))?,
        byte_size: b.byte_size,
    })
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

    #[test]
    fn cuda_register_body() {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD.encode([7u8; 64]);
        let body =
            format!(r#"{{"raw_handle": {{"b64": "{b64}"}}, "device_id": 1, "byte_size": 256}}"#);
        let r = parse_cuda_register(body.as_bytes()).unwrap();
        assert_eq!((r.handle.len(), r.device_id, r.byte_size), (64, 1, 256));

        let short = base64::engine::general_purpose::STANDARD.encode([7u8; 63]);
        let body =
            format!(r#"{{"raw_handle": {{"b64": "{short}"}}, "device_id": 0, "byte_size": 1}}"#);
        assert_eq!(
            parse_cuda_register(body.as_bytes())
                .err()
                .map(|e| e.message),
            Some("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t".to_string())
        );
        let body = r#"{"raw_handle": {"b64": "!!"}, "device_id": 0, "byte_size": 1}"#;
        assert!(parse_cuda_register(body.as_bytes()).is_err());
        let body = r#"{"device_id": 0, "byte_size": 1}"#;
        assert_eq!(
            parse_cuda_register(body.as_bytes())
                .err()
                .map(|e| e.message),
            Some("Shared memory register request has no 'raw_handle' field".to_string())
        );
        assert!(parse_cuda_register(br#"{"raw_handle": {"b64": ""}}"#).is_err());
    }
}
