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

use bytes::{Buf, Bytes, BytesMut};
use http::{header, HeaderMap, HeaderValue};
use http_body::Body;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use prost::Message;
use tonic::{metadata::MetadataMap, Code, Status};

use super::{
    raw_tail::with_raw_tail,
    request_wire::decode_plain,
    response_wire::{frame_response, HEADER_LEN},
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
        headers
            .get("grpc-encoding")
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
    let mut reader = MessageReader::new(limit);
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

/// Frames smaller than this are copied together while a message is read.
const SMALL_PART: usize = 4096;

/// Splits a request body into gRPC messages as its frames arrive, keeping
/// the first. A message that arrives within one frame is a slice of it;
/// one spread over frames keeps their bytes until it is whole, then is
/// copied once into a buffer of its own length. So memory grows with what
/// arrived, not with the length a header announces (tonic reserves that
/// at once). Frames under [`SMALL_PART`] are copied together as they
/// come: kept as handles, a message sent a byte a frame would cost a
/// handle (32 bytes) and a pinned read buffer per byte.
#[derive(Debug)]
struct MessageReader {
    limit: usize,
    /// A message header begun in an earlier frame.
    head: [u8; HEADER_LEN],
    head_len: usize,
    /// Length of the first message once its header is read.
    reading: Option<usize>,
    /// The first message's bytes so far: frames of [`SMALL_PART`] or
    /// more as they came, smaller ones gathered in `small` (which comes
    /// after `parts`), and their total.
    parts: Vec<Bytes>,
    small: BytesMut,
    have: usize,
    /// Bytes of a later message still to drop.
    skipping: usize,
    first: Option<Bytes>,
}

impl MessageReader {
    fn new(limit: usize) -> Self {
        Self {
            limit,
            head: [0; HEADER_LEN],
            head_len: 0,
            reading: None,
            parts: Vec::new(),
            small: BytesMut::new(),
            have: 0,
            skipping: 0,
            first: None,
        }
    }

    fn push(&mut self, mut data: Bytes) -> Result<(), Status> {
        loop {
            if self.skipping > 0 {
                let n = self.skipping.min(data.len());
                data.advance(n);
                self.skipping -= n;
            }
            if data.is_empty() {
                return Ok(());
            }
            let Some(len) = self.reading else {
                let n = (HEADER_LEN - self.head_len).min(data.len());
                self.head[self.head_len..self.head_len + n].copy_from_slice(&data[..n]);
                self.head_len += n;
                data.advance(n);
                if self.head_len < HEADER_LEN {
                    return Ok(());
                }
                self.head_len = 0;
                let len = self.checked_len()?;
                if self.first.is_some() {
                    self.skipping = len;
                } else if len == 0 {
                    self.first = Some(Bytes::new());
                } else {
                    self.reading = Some(len);
                }
                continue;
            };
            let part = data.split_to((len - self.have).min(data.len()));
            if self.have == 0 && part.len() == len {
                self.take_first(part);
                continue;
            }
            self.have += part.len();
            if part.len() < SMALL_PART {
                self.small.extend_from_slice(&part);
                if self.small.len() >= SMALL_PART {
                    self.parts.push(self.small.split().freeze());
                }
            } else {
                if !self.small.is_empty() {
                    self.parts.push(self.small.split().freeze());
                }
                self.parts.push(part);
            }
            if self.have == len {
                let mut whole = BytesMut::with_capacity(len);
                for part in self.parts.drain(..) {
                    whole.extend_from_slice(&part);
                }
                whole.extend_from_slice(&self.small);
                self.small = BytesMut::new();
                self.take_first(whole.freeze());
            }
        }
    }

    fn take_first(&mut self, message: Bytes) {
        self.first = Some(message);
        self.reading = None;
        self.have = 0;
    }

    /// The length in a complete header, checked as tonic checks it.
    fn checked_len(&self) -> Result<usize, Status> {
        match self.head[0] {
            0 => {}
            1 => {
                return Err(Status::internal(
                    "protocol error: received message with compressed-flag but no grpc-encoding was specified",
                ))
            }
            f => {
                return Err(Status::internal(format!(
                    "protocol error: received message with invalid compression flag: {f} (valid flags are 0 and 1), while sending request"
                )))
            }
        }
        let h = &self.head;
        let len = u32::from_be_bytes([h[1], h[2], h[3], h[4]]) as usize;
        if len > self.limit {
            return Err(Status::out_of_range(format!(
                "Error, decoded message length too large: found {len} bytes, the limit is: {} bytes",
                self.limit
            )));
        }
        Ok(len)
    }

    fn finish(self) -> Result<Bytes, Status> {
        if self.reading.is_some() || self.head_len > 0 || self.skipping > 0 {
            return Err(Status::internal("Unexpected EOF decoding stream."));
        }
        self.first
            .ok_or_else(|| Status::internal("Missing request message."))
    }
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

    fn framed(flag: u8, message: &[u8]) -> Vec<u8> {
        let mut out = vec![flag];
        out.extend_from_slice(&(message.len() as u32).to_be_bytes());
        out.extend_from_slice(message);
        out
    }

    /// Feeds `body` to a reader in frames of `chunk` bytes.
    fn read(body: &[u8], chunk: usize, limit: usize) -> Result<Bytes, Status> {
        let mut reader = MessageReader::new(limit);
        for part in body.chunks(chunk.max(1)) {
            reader.push(Bytes::copy_from_slice(part))?;
        }
        reader.finish()
    }

    /// Cut into frames of any one size, `body` reads as `expected`.
    fn reads_at_every_cut(body: &[u8], expected: &[u8]) {
        for chunk in 1..=body.len() {
            assert_eq!(read(body, chunk, 64).unwrap(), expected, "chunk {chunk}");
        }
    }

    #[test]
    fn a_message_is_read_whatever_the_frames() {
        reads_at_every_cut(&framed(0, b"hello, world"), b"hello, world");
    }

    #[test]
    fn a_message_within_one_frame_is_not_copied() {
        let body = Bytes::from(framed(0, b"abcdef"));
        let mut reader = MessageReader::new(64);
        reader.push(body.clone()).unwrap();
        let message = reader.finish().unwrap();
        assert_eq!(message.as_ptr(), body[HEADER_LEN..].as_ptr());
    }

    #[test]
    fn a_message_in_pieces_holds_only_what_arrived() {
        // A header announcing 512 MiB, then ten bytes of it.
        let mut reader = MessageReader::new(1 << 30);
        let mut body = vec![0u8];
        body.extend_from_slice(&(1u32 << 29).to_be_bytes());
        body.extend_from_slice(b"0123456789");
        reader.push(Bytes::from(body)).unwrap();
        assert_eq!(reader.have, 10);
        assert_eq!(reader.small.len(), 10);
        assert!(reader.parts.is_empty());
        assert_eq!(
            reader.finish().unwrap_err().message(),
            "Unexpected EOF decoding stream."
        );
    }

    #[test]
    fn small_frames_are_gathered_not_kept_one_by_one() {
        let message: Vec<u8> = (0..20_000u32).map(|i| i as u8).collect();
        let body = framed(0, &message);
        let mut reader = MessageReader::new(1 << 20);
        reader
            .push(Bytes::copy_from_slice(&body[..HEADER_LEN]))
            .unwrap();
        for (i, byte) in body[HEADER_LEN..].iter().enumerate() {
            reader.push(Bytes::copy_from_slice(&[*byte])).unwrap();
            if i + 1 < message.len() {
                assert!(reader.parts.len() <= (i + 1) / SMALL_PART, "byte {i}");
            }
        }
        assert_eq!(reader.finish().unwrap(), message);
        // Large frames between small ones keep their place.
        let mut reader = MessageReader::new(1 << 20);
        reader
            .push(Bytes::copy_from_slice(&body[..HEADER_LEN + 3]))
            .unwrap();
        let rest = &body[HEADER_LEN + 3..];
        reader
            .push(Bytes::copy_from_slice(&rest[..SMALL_PART]))
            .unwrap();
        reader
            .push(Bytes::copy_from_slice(&rest[SMALL_PART..SMALL_PART + 5]))
            .unwrap();
        reader
            .push(Bytes::copy_from_slice(&rest[SMALL_PART + 5..]))
            .unwrap();
        assert_eq!(reader.finish().unwrap(), message);
    }

    #[test]
    fn later_messages_are_dropped_and_the_first_kept() {
        let mut body = framed(0, b"first");
        body.extend(framed(0, b"second message"));
        body.extend(framed(0, b""));
        reads_at_every_cut(&body, b"first");
    }

    #[test]
    fn an_empty_message_is_a_message() {
        assert_eq!(read(&framed(0, b""), 5, 64).unwrap(), Bytes::new());
    }

    #[test]
    fn framing_faults_get_tonics_statuses() {
        let err = |body: &[u8], limit| read(body, 3, limit).unwrap_err();
        let e = err(&[], 64);
        assert_eq!(
            (e.code(), e.message()),
            (Code::Internal, "Missing request message.")
        );
        for cut in [1, 4, 5, 9] {
            let e = err(&framed(0, b"truncated")[..cut], 64);
            assert_eq!(
                (e.code(), e.message()),
                (Code::Internal, "Unexpected EOF decoding stream."),
                "cut at {cut}"
            );
        }
        let mut two = framed(0, b"ok");
        two.extend(&framed(0, b"cut short")[..7]);
        assert_eq!(err(&two, 64).message(), "Unexpected EOF decoding stream.");
        let e = err(&framed(1, b"x"), 64);
        assert_eq!(e.code(), Code::Internal);
        assert!(
            e.message().contains("compressed-flag but no grpc-encoding"),
            "{e:?}"
        );
        let e = err(&framed(7, b"x"), 64);
        assert!(e.message().contains("invalid compression flag: 7"), "{e:?}");
        let e = err(&framed(0, &[0; 65]), 64);
        assert_eq!(e.code(), Code::OutOfRange);
        assert!(e.message().contains("message length too large"), "{e:?}");
        // A later message is held to the limit as well.
        let mut body = framed(0, b"ok");
        body.extend(framed(0, &[0; 65]));
        assert_eq!(err(&body, 64).code(), Code::OutOfRange);
    }

    #[test]
    fn the_size_refusal_comes_before_the_message_is_read() {
        // Only the header: the refusal needs none of the 1 GiB it announces.
        let mut reader = MessageReader::new(1 << 20);
        let mut head = vec![0u8];
        head.extend_from_slice(&(1u32 << 30).to_be_bytes());
        assert_eq!(
            reader.push(Bytes::from(head)).unwrap_err().code(),
            Code::OutOfRange
        );
    }

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
