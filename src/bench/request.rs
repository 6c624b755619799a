//! The pre-built request a worker sends over and over, and one send.

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Request, Uri};
use http_body_util::BodyExt;

use super::{
    grpc::{self, Completion},
    sequence::{SeqStep, Spliced, Template},
    wire::{BenchBody, Lane, Pool, Wire},
};

/// Everything but the body's `Bytes` handle is built once per step; bodies
/// are pre-encoded and cycled (several when --input-data has several entries).
pub struct Prepared {
    pub wire: Wire,
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
    pub bodies: Vec<Bytes>,
    /// Sequence models: `bodies` split for splicing in each request's id
    /// and flags.
    pub template: Option<Template>,
    /// Sequence ids go out as strings (the model's correlation id is TYPE_STRING).
    pub string_ids: bool,
}

impl Prepared {
    pub fn request(&self, body: BenchBody) -> Request<BenchBody> {
        self.head().map(|()| body)
    }

    /// The request line and headers, for `h2` directly (its body is sent
    /// frame by frame).
    pub fn head(&self) -> Request<()> {
        let mut req = Request::new(());
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = self.uri.clone();
        *req.headers_mut() = self.headers.clone();
        req
    }

    pub fn body(&self, i: usize) -> Bytes {
        self.bodies[i % self.bodies.len()].clone()
    }

    /// The bytes of request `i`, or of a sequence request.
    pub fn payload(&self, i: usize, step: Option<&SeqStep>) -> Spliced {
        match (step, &self.template) {
            (Some(step), Some(t)) => t.encode(step, self.string_ids),
            _ => Spliced {
                head: self.body(i),
                tail: None,
                header_len: None,
            },
        }
    }

    /// The request carrying `payload` (its own header length where the
    /// spliced JSON header changed it).
    pub fn request_with(&self, payload: Spliced) -> Request<BenchBody> {
        let mut req = self.request(BenchBody::Parts(Some(payload.head), payload.tail));
        if let Some(n) = payload.header_len {
            req.headers_mut()
                .insert("inference-header-content-length", HeaderValue::from(n));
        }
        req
    }
}

pub fn header_value(s: &str) -> anyhow::Result<HeaderValue> {
    HeaderValue::from_str(s).map_err(|e| anyhow::anyhow!("bad header value '{s}': {e}"))
}

/// HTTP/1.1 POST (or GET for bodies that are empty) with the Host header.
pub fn http_prepared(
    authority: &str,
    path: &str,
    bodies: Vec<Bytes>,
    header_len: Option<usize>,
    json: bool,
) -> anyhow::Result<Prepared> {
    let mut headers = HeaderMap::new();
    headers.insert(header::HOST, header_value(authority)?);
    let get = bodies.iter().all(Bytes::is_empty);
    if !get {
        let ct = if json && header_len.is_none() {
            "application/json"
        } else {
            "application/octet-stream"
        };
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    }
    if let Some(n) = header_len {
        headers.insert("inference-header-content-length", HeaderValue::from(n));
    }
    Ok(Prepared {
        wire: Wire::Http1,
        method: if get { Method::GET } else { Method::POST },
        uri: path
            .parse()
            .map_err(|e| anyhow::anyhow!("bad path '{path}': {e}"))?,
        headers,
        bodies,
        template: None,
        string_ids: false,
    })
}

pub fn grpc_prepared(
    authority: &str,
    method: &str,
    bodies: Vec<Bytes>,
    streaming: bool,
) -> anyhow::Result<Prepared> {
    let uri = format!("http://{authority}/inference.GRPCInferenceService/{method}");
    Ok(Prepared {
        wire: if streaming {
            Wire::GrpcStream
        } else {
            Wire::GrpcUnary
        },
        method: Method::POST,
        uri: uri
            .parse()
            .map_err(|e| anyhow::anyhow!("bad URI '{uri}': {e}"))?,
        headers: grpc::request_headers(),
        bodies,
        template: None,
        string_ids: false,
    })
}

/// Sends one request (a sequence request when `step` is given) and waits
/// for its whole response (on a stream: up to its final response). The
/// error string is what the report shows (the server's message where
/// there is one).
pub async fn send(
    pool: &Pool,
    prepared: &Prepared,
    i: usize,
    step: Option<&SeqStep>,
) -> Result<Completion, String> {
    let mut lane = pool.acquire(prepared).await.map_err(|e| format!("{e:#}"))?;
    let payload = prepared.payload(i, step);
    let result = match &mut lane {
        Lane::H1(sender) => {
            if let Err(e) = sender.ready().await {
                return Err(format!("connection lost: {e}"));
            }
            send_http(sender.send_request(prepared.request_with(payload)))
                .await
                .map(|()| Completion::single())
        }
        Lane::Raw(sender) => grpc::raw_unary(sender, prepared, payload)
            .await
            .map(|_| Completion::single()),
        Lane::Stream(stream) => stream.call(payload).await,
    };
    pool.release(lane);
    result
}

async fn send_http(
    fut: impl std::future::Future<Output = hyper::Result<http::Response<hyper::body::Incoming>>>,
) -> Result<(), String> {
    let resp = fut.await.map_err(|e| format!("HTTP request failed: {e}"))?;
    let status = resp.status();
    // Read the whole body: the connection is reusable only after it.
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("HTTP response body failed: {e}"))?
        .to_bytes();
    if status.is_success() {
        Ok(())
    } else {
        Err(http_error(status, &body))
    }
}

/// `HTTP 400: <the server's "error" field>`.
pub fn http_error(status: http::StatusCode, body: &[u8]) -> String {
    let msg = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(body).chars().take(200).collect());
    format!("HTTP {}: {msg}", status.as_u16())
}
