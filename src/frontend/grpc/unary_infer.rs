//! `ModelInfer` served straight from hyper, without tonic's server codec.
//!
//! tonic's generic unary path costs per call: a `Streaming` decoder with
//! its own buffer the body is copied into, the request and response
//! wrapped and unwrapped through its `Request`/`Response` types, an
//! encoder stream with a buffer of its own and a body built from it, and
//! two boxed futures. For `simple` over one connection at concurrency 64
//! that was about 0.8 µs of the shard's 6.4 µs per call (measured on the
//! 2-core VM with `scripts/bench_shard_cpu.sh`, see CHANGELOG). Here the
//! message is sliced out of the body's own frame when it arrives whole,
//! decoded, handed to the handler tonic's path also runs
//! (`service::model_infer_call`), and the answer is written straight into
//! its frame (`response_wire`) and goes out as one data frame and the
//! trailers.
//!
//! Only for what needs none of tonic's negotiation: a request without
//! `grpc-encoding` (or `identity`) on a server that does not compress
//! responses. Everything else, and every other method, stays on tonic.
//! What a client sees is tonic's: the same statuses and messages for bad
//! framing (so `size_limit` rewrites the size refusal as before), the
//! first message of a body used and later ones read and dropped, and
//! request trailers merged into the metadata.

use std::{convert::Infallible, pin::pin};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderName, HeaderValue};
use http_body::Body;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use prost::Message;
use tonic::{metadata::MetadataMap, Code, Status};

use super::{
    message_reader::MessageReader,
    raw_tail::with_raw_tail,
    request_wire::decode_plain,
    response_wire::frame_response,
    service::{model_infer_call, sent, InferMessage},
};
use crate::{
    frontend::transport::PacedBody, proto::inference::ModelInferRequest, types::InferResponse,
};

/// The method's path.
pub(super) const PATH: &str = "/inference.GRPCInferenceService/ModelInfer";

/// A call's body as the router hands it over (paced like tonic's).
type RequestBody = PacedBody<Incoming>;

/// The direct path, with the server's message limit (tonic's inference
/// service has it for both directions).
#[derive(Clone, Copy, Debug)]
pub(super) struct DirectInfer {
    max_message_size: usize,
}

impl DirectInfer {
    /// `None` where responses may be compressed: tonic negotiates that.
    pub(super) fn new(max_message_size: usize, compress_responses: bool) -> Option<Self> {
        (!compress_responses).then_some(Self { max_message_size })
    }

    /// Whether a call with these headers is served here: its messages are
    /// not compressed.
    pub(super) fn takes(headers: &HeaderMap) -> bool {
        // A built name: looked up by `&str`, the name is parsed and hashed
        // on every call.
        static GRPC_ENCODING: HeaderName = HeaderName::from_static("grpc-encoding");
        headers
            .get(&GRPC_ENCODING)
            .is_none_or(|v| v.as_bytes() == b"identity")
    }

    /// Serves one call; every failure is a gRPC status (trailers-only).
    ///
    /// One future for the whole call, the handler's awaited inside it:
    /// each nested async fn is built and then moved into its caller's
    /// state, and this one is copied into the router's box.
    pub(super) async fn call(
        self,
        req: http::Request<RequestBody>,
    ) -> Result<http::Response<tonic::body::Body>, Infallible> {
        let (parts, body) = req.into_parts();
        let mut headers = parts.headers;
        let answer = match read_first_message(body, self.max_message_size, &mut headers).await {
            Ok(message) => match decode(message) {
                Ok(message) => {
                    let metadata = MetadataMap::from_headers(headers);
                    model_infer_call(&metadata, &parts.extensions, message).await
                }
                Err(status) => Err(status),
            },
            Err(status) => Err(status),
        };
        Ok(answer
            .and_then(|answer| self.respond(answer))
            .unwrap_or_else(Status::into_http))
    }

    /// The answer as its HTTP/2 response: one data frame (and a raw tail
    /// where outputs are large), then the trailers.
    fn respond(self, answer: InferResponse) -> Result<http::Response<tonic::body::Body>, Status> {
        let (framed, tail) = sent(answer, |answer| {
            frame_response(&answer, self.max_message_size)
        })?;
        let body = tonic::body::Body::new(OneMessage {
            message: Some(framed),
            trailers: Some(ok_trailers()),
        });
        let body = match tail {
            Some(tail) => with_raw_tail(body, tail),
            None => body,
        };
        let mut response = http::Response::new(body);
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        Ok(response)
    }
}

/// The message as the handler takes it: read straight into the request
/// where it is plain, else through prost (with tonic_prost's mapping of a
/// decode error) and the conversion tonic's path runs.
fn decode(message: Bytes) -> Result<InferMessage, Status> {
    if let Some(request) = decode_plain(&message) {
        return Ok(InferMessage::Plain(request));
    }
    ModelInferRequest::decode(message)
        .map(InferMessage::Proto)
        .map_err(|e| Status::internal(e.to_string()))
}

fn ok_trailers() -> HeaderMap {
    let mut trailers = HeaderMap::with_capacity(1);
    trailers.insert(Status::GRPC_STATUS, HeaderValue::from_static("0"));
    trailers
}

/// The body's first gRPC message; later ones are read and dropped, the
/// body's trailers are added to `headers` (tonic merges them into the
/// request's metadata).
async fn read_first_message(
    body: RequestBody,
    limit: usize,
    headers: &mut HeaderMap,
) -> Result<Bytes, Status> {
    let mut body = pin!(body);
    let mut reader = MessageReader::first(limit);
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(e) => {
                let status = Status::from_error(Box::new(e));
                // tonic ends a request stream the client cancelled as if
                // it had ended there.
                if status.code() == Code::Cancelled {
                    break;
                }
                return Err(status);
            }
        };
        match frame.into_data() {
            Ok(data) => reader.push(data)?,
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    headers.extend(trailers);
                }
            }
        }
    }
    reader.finish()
}

/// A unary answer: the framed message, then the trailers.
struct OneMessage {
    message: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl Body for OneMessage {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Status>>> {
        let frame = match self.message.take() {
            Some(message) => Some(http_body::Frame::data(message)),
            None => self.trailers.take().map(http_body::Frame::trailers),
        };
        std::task::Poll::Ready(frame.map(Ok))
    }

    fn is_end_stream(&self) -> bool {
        self.message.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        // The trailers follow, so the data's length is not the end.
        http_body::SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_uncompressed_calls_are_taken() {
        let mut headers = HeaderMap::new();
        assert!(DirectInfer::takes(&headers));
        headers.insert("grpc-encoding", HeaderValue::from_static("identity"));
        assert!(DirectInfer::takes(&headers));
        headers.insert("grpc-encoding", HeaderValue::from_static("gzip"));
        assert!(!DirectInfer::takes(&headers));
        assert!(DirectInfer::new(1 << 20, true).is_none());
        assert!(DirectInfer::new(1 << 20, false).is_some());
    }
}
