//! gRPC over hyper HTTP/2 without tonic's client: 5-byte framing, status
//! from headers (trailers-only) or trailers, unary calls and a
//! ModelStreamInfer stream for the streaming mode.

use std::{future::Future, time::Instant};

use bytes::{Buf, Bytes, BytesMut};
use http::{header, HeaderMap, HeaderValue};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use prost::Message;

use super::{
    request::Prepared,
    sequence::Spliced,
    wire::{BenchBody, RawH2, H2},
};
use crate::proto::inference::{infer_parameter::ParameterChoice, ModelStreamInferResponse};

/// What one request got: its responses (a decoupled model may send many,
/// or none) and when the first of them arrived.
#[derive(Debug, Clone, Copy, Default)]
pub struct Completion {
    pub responses: u64,
    pub first_response: Option<std::time::Duration>,
}

impl Completion {
    /// A unary request: one response, which is also its end.
    pub fn single() -> Self {
        Self {
            responses: 1,
            first_response: None,
        }
    }
}

pub fn request_headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    h.insert(header::TE, HeaderValue::from_static("trailers"));
    h
}

/// `grpc-status` and a readable message, if the map carries a status.
fn status_of(map: &HeaderMap) -> Option<(i32, String)> {
    let code = map.get("grpc-status")?.to_str().ok()?.trim().parse().ok()?;
    let msg = map
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .map(percent_decode)
        .unwrap_or_default();
    Some((code, msg))
}

/// grpc-message is percent-encoded.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub fn code_name(code: i32) -> &'static str {
    match code {
        0 => "OK",
        1 => "CANCELLED",
        2 => "UNKNOWN",
        3 => "INVALID_ARGUMENT",
        4 => "DEADLINE_EXCEEDED",
        5 => "NOT_FOUND",
        6 => "ALREADY_EXISTS",
        7 => "PERMISSION_DENIED",
        8 => "RESOURCE_EXHAUSTED",
        9 => "FAILED_PRECONDITION",
        10 => "ABORTED",
        11 => "OUT_OF_RANGE",
        12 => "UNIMPLEMENTED",
        13 => "INTERNAL",
        14 => "UNAVAILABLE",
        15 => "DATA_LOSS",
        16 => "UNAUTHENTICATED",
        _ => "UNKNOWN_CODE",
    }
}

fn status_error(code: i32, msg: &str) -> String {
    format!("gRPC {}: {msg}", code_name(code))
}

/// Takes one whole length-prefixed message off the front of `buf`.
pub fn take_message(buf: &mut BytesMut) -> Result<Option<Bytes>, String> {
    if buf.len() < 5 {
        return Ok(None);
    }
    if buf[0] != 0 {
        return Err("compressed gRPC messages are not supported".into());
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if buf.len() < 5 + len {
        return Ok(None);
    }
    buf.advance(5);
    Ok(Some(buf.split_to(len).freeze()))
}

/// A unary response's head: HTTP 200, and no failed `grpc-status` when
/// the server answered trailers-only.
pub(super) fn check_head(status: http::StatusCode, headers: &HeaderMap) -> Result<(), String> {
    if status != http::StatusCode::OK {
        return Err(format!("gRPC request failed: HTTP status {status}"));
    }
    check_status(Some(headers))
}

/// A non-zero `grpc-status` in `map` (headers or trailers) as an error.
pub(super) fn check_status(map: Option<&HeaderMap>) -> Result<(), String> {
    match map.and_then(status_of) {
        Some((code, msg)) if code != 0 => Err(status_error(code, &msg)),
        _ => Ok(()),
    }
}

/// Awaits a unary response and returns its message body (unframed).
pub async fn unary_response(
    fut: impl Future<Output = hyper::Result<http::Response<Incoming>>>,
) -> Result<Bytes, String> {
    let resp = fut.await.map_err(|e| format!("gRPC request failed: {e}"))?;
    check_head(resp.status(), resp.headers())?;
    let collected = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("gRPC response failed: {e}"))?;
    check_status(collected.trailers())?;
    let mut buf = BytesMut::from(collected.to_bytes().as_ref());
    take_message(&mut buf)?.ok_or_else(|| "gRPC response without a message".to_string())
}

/// One unary call over a ready `h2` sender: HEADERS + one DATA frame, then
/// the response's DATA and trailers; returns the message (unframed).
pub async fn raw_unary(
    sender: &mut RawH2,
    prepared: &Prepared,
    payload: Spliced,
) -> Result<Bytes, String> {
    let (response, mut send) = sender
        .send_request(prepared.head(), false)
        .map_err(|e| format!("gRPC request failed: {e}"))?;
    let failed = |e: h2::Error| format!("gRPC request failed: {e}");
    match payload.tail {
        None => send.send_data(payload.head, true).map_err(failed)?,
        Some(tail) => {
            send.send_data(payload.head, false).map_err(failed)?;
            send.send_data(tail, true).map_err(failed)?;
        }
    }
    let resp = response
        .await
        .map_err(|e| format!("gRPC request failed: {e}"))?;
    check_head(resp.status(), resp.headers())?;
    let mut recv = resp.into_body();
    let mut buf = BytesMut::new();
    while let Some(chunk) = recv.data().await {
        let chunk = chunk.map_err(|e| format!("gRPC response failed: {e}"))?;
        let _ = recv.flow_control().release_capacity(chunk.len());
        buf.extend_from_slice(&chunk);
    }
    let trailers = recv
        .trailers()
        .await
        .map_err(|e| format!("gRPC response failed: {e}"))?;
    check_status(trailers.as_ref())?;
    take_message(&mut buf)?.ok_or_else(|| "gRPC response without a message".to_string())
}

/// A unary call with typed messages (metadata, config, statistics).
pub async fn call<Req: Message, Resp: Message + Default>(
    sender: &mut H2,
    authority: &str,
    method: &str,
    req: &Req,
) -> anyhow::Result<Resp> {
    let prepared = super::request::grpc_prepared(
        authority,
        method,
        vec![super::input::grpc_frame(req)],
        false,
    )?;
    sender
        .ready()
        .await
        .map_err(|e| anyhow::anyhow!("gRPC connection lost: {e}"))?;
    let body = unary_response(
        sender.send_request(prepared.request(BenchBody::Once(Some(prepared.body(0))))),
    )
    .await
    .map_err(anyhow::Error::msg)?;
    Resp::decode(body).map_err(|e| anyhow::anyhow!("bad {method} response: {e}"))
}

/// One ModelStreamInfer stream carrying one request at a time: send a
/// message, wait for the next response message. Over `h2` directly, as
/// unary calls in the closed loop: the message goes to h2 from the task
/// that sends it, where hyper's client pipes a request body through a task
/// of its own.
pub struct GrpcStream {
    send: h2::SendStream<Bytes>,
    response: Option<h2::client::ResponseFuture>,
    body: Option<h2::RecvStream>,
    buf: BytesMut,
    broken: bool,
}

impl GrpcStream {
    /// Opens the stream on `sender` (ready for one more stream).
    pub fn open(sender: &mut RawH2, prepared: &Prepared) -> Result<Self, String> {
        let (response, send) = sender
            .send_request(prepared.head(), false)
            .map_err(|e| format!("gRPC stream failed: {e}"))?;
        Ok(Self {
            send,
            response: Some(response),
            body: None,
            buf: BytesMut::new(),
            broken: false,
        })
    }

    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// Sends one request and reads its responses up to its final one
    /// (`triton_final_response: true`, or a response without the flag: a
    /// server that does not mark single responses).
    pub async fn call(&mut self, message: Spliced) -> Result<Completion, String> {
        let sent = Instant::now();
        let mut done = Completion::default();
        let mut message = Some(message);
        loop {
            let (last, has_outputs) = self.next_response(message.take()).await?;
            // The empty final response carries no outputs: not counted.
            if has_outputs || last.is_none() {
                done.responses += 1;
                if done.first_response.is_none() {
                    done.first_response = Some(sent.elapsed());
                }
            }
            if last != Some(false) {
                return Ok(done);
            }
        }
    }

    /// Sends `message` (if any) and reads the next response: its
    /// `triton_final_response` flag (`None` when it has none) and whether
    /// it carries outputs.
    async fn next_response(
        &mut self,
        message: Option<Spliced>,
    ) -> Result<(Option<bool>, bool), String> {
        let Some(message) = message else {
            return self.read_response().await;
        };
        for part in std::iter::once(message.head).chain(message.tail) {
            if let Err(e) = self.send.send_data(part, false) {
                return Err(self.broke(format!("gRPC stream failed: {e}")));
            }
        }
        // Servers may send response headers only with the first message.
        if let Some(fut) = self.response.take() {
            let head = match fut.await {
                Ok(resp) => check_head(resp.status(), resp.headers()).map(|()| resp),
                Err(e) => Err(format!("gRPC stream failed: {e}")),
            };
            match head {
                Ok(resp) => self.body = Some(resp.into_body()),
                Err(e) => return Err(self.broke(e)),
            }
        }
        self.read_response().await
    }

    /// A failure of the stream itself (not of one request): the stream is
    /// not reused.
    fn broke(&mut self, error: String) -> String {
        self.broken = true;
        error
    }

    async fn read_response(&mut self) -> Result<(Option<bool>, bool), String> {
        loop {
            let message = take_message(&mut self.buf);
            if let Some(m) = message.map_err(|e| self.broke(e))? {
                let r = ModelStreamInferResponse::decode(m)
                    .map_err(|e| format!("bad stream response: {e}"))?;
                if !r.error_message.is_empty() {
                    return Err(r.error_message);
                }
                let response = r.infer_response.as_ref();
                let last = response
                    .and_then(|i| i.parameters.get("triton_final_response"))
                    .and_then(|p| match p.parameter_choice {
                        Some(ParameterChoice::BoolParam(b)) => Some(b),
                        _ => None,
                    });
                let has_outputs = response.is_some_and(|i| !i.outputs.is_empty());
                return Ok((last, has_outputs));
            }
            let Some(body) = self.body.as_mut() else {
                return Err(self.broke("gRPC stream closed".into()));
            };
            let failed = match body.data().await {
                Some(Ok(chunk)) => {
                    let _ = body.flow_control().release_capacity(chunk.len());
                    self.buf.extend_from_slice(&chunk);
                    continue;
                }
                Some(Err(e)) => format!("gRPC stream failed: {e}"),
                None => match body.trailers().await {
                    Ok(trailers) => check_status(trailers.as_ref())
                        .err()
                        .unwrap_or_else(|| "gRPC stream ended without a response".into()),
                    Err(e) => format!("gRPC stream failed: {e}"),
                },
            };
            return Err(self.broke(failed));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framing() {
        let mut buf = BytesMut::from(&[0u8, 0, 0, 0, 2, 7, 8, 0, 0][..]);
        assert_eq!(take_message(&mut buf).unwrap().unwrap().as_ref(), &[7, 8]);
        assert_eq!(take_message(&mut buf).unwrap(), None);
        assert_eq!(buf.len(), 2);
        let mut compressed = BytesMut::from(&[1u8, 0, 0, 0, 0][..]);
        assert!(take_message(&mut compressed).is_err());
    }

    #[test]
    fn statuses() {
        let mut h = HeaderMap::new();
        h.insert("grpc-status", HeaderValue::from_static("12"));
        h.insert(
            "grpc-message",
            HeaderValue::from_static("unknown%20method%"),
        );
        let (code, msg) = status_of(&h).unwrap();
        assert_eq!(
            status_error(code, &msg),
            "gRPC UNIMPLEMENTED: unknown method%"
        );
    }
}
