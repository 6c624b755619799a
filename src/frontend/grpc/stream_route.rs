//! `ModelStreamInfer` taken by the router before tonic's generated
//! service, with a codec that hands each request message over as its
//! bytes: `stream::InferStream` reads a plain message straight into the
//! request (`request_wire`, as the direct unary path does) and gives
//! anything else to prost and the conversion, as tonic's codec did. On
//! `simple` over a stream, prost's decode and the conversion were about
//! 12 % of the shard's instructions (callgrind). Answers go out the same
//! way, written from the response itself (`stream_answer`).
//!
//! Everything else is tonic's own call handling, configured as the
//! generated service is: the same compression (`compression`), the same
//! message size limits, the same framing and status mapping.

use std::{
    convert::Infallible,
    future::Ready,
    pin::Pin,
    task::{ready, Context, Poll},
};

use bytes::{Buf, Bytes, BytesMut};
use futures::Stream;
use http::{header, HeaderMap, HeaderValue};
use http_body::{Body, Frame};
use hyper::body::Incoming;
use tonic::{
    codec::{Codec, DecodeBuf, Decoder, EnabledCompressionEncodings, EncodeBuf, Encoder},
    metadata::MetadataMap,
    server::{Grpc, StreamingService},
    Code, Request, Response, Status, Streaming,
};

use super::{
    compression,
    message_reader::MessageReader,
    response_wire::{put_message_header, within_limit, HEADER_LEN},
    service::forwarded_metadata,
    stream::{Inbound, InferStream},
    stream_answer::StreamAnswer,
    unary_infer::DirectInfer,
};
use crate::frontend::transport::PacedBody;

pub(super) const PATH: &str = "/inference.GRPCInferenceService/ModelStreamInfer";

/// The stream method's settings, shared by a shard's connections.
#[derive(Clone, Copy)]
pub(super) struct StreamRoute {
    accept: EnabledCompressionEncodings,
    send: EnabledCompressionEncodings,
    max_message_size: usize,
    /// Whether calls whose messages are not compressed are framed here
    /// (no compressed responses: tonic negotiates those).
    direct: bool,
}

impl StreamRoute {
    pub(super) fn new(max_message_size: usize, compress_responses: bool) -> Self {
        let (accept, send) = compression::encodings(compress_responses);
        Self {
            accept,
            send,
            max_message_size,
            direct: !compress_responses,
        }
    }

    pub(super) async fn call(
        self,
        req: http::Request<PacedBody<Incoming>>,
    ) -> Result<http::Response<tonic::body::Body>, Infallible> {
        if self.direct && DirectInfer::takes(req.headers()) {
            return Ok(self.direct(req));
        }
        let mut grpc = Grpc::new(MessageBytes)
            .apply_compression_config(self.accept, self.send)
            .apply_max_message_size_config(
                Some(self.max_message_size),
                Some(self.max_message_size),
            );
        Ok(grpc.streaming(OpenStream, req).await)
    }

    /// The call without tonic's `Streaming` decoder and `EncodeBody`:
    /// messages split from the body's frames (`message_reader`) and
    /// answers framed into the response body here, with the same
    /// headers, statuses and limits.
    fn direct(self, req: http::Request<PacedBody<Incoming>>) -> http::Response<tonic::body::Body> {
        let (parts, body) = req.into_parts();
        let metadata = MetadataMap::from_headers(parts.headers);
        let inbound = Inbound::Frames(RequestMessages {
            body,
            reader: MessageReader::every(self.max_message_size),
            fault: None,
            ended: false,
        });
        let answers = InferStream::new(inbound, forwarded_metadata(&metadata));
        let mut response = http::Response::new(tonic::body::Body::new(AnswerFrames {
            answers,
            limit: self.max_message_size,
            buf: BytesMut::new(),
            status: None,
            ended: false,
        }));
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        response
    }
}

/// A direct stream's request messages, as tonic's `Streaming` yields
/// them: each message in order; a framing fault or a failed body after
/// the messages before it; the end at the body's end or its trailers.
pub struct RequestMessages {
    body: PacedBody<Incoming>,
    reader: MessageReader,
    fault: Option<Status>,
    ended: bool,
}

impl RequestMessages {
    pub(super) fn poll_next(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Status>>> {
        loop {
            if let Some(message) = self.reader.next() {
                return Poll::Ready(Some(Ok(message)));
            }
            if let Some(status) = self.fault.take() {
                self.ended = true;
                return Poll::Ready(Some(Err(status)));
            }
            if self.ended {
                return Poll::Ready(None);
            }
            match ready!(Pin::new(&mut self.body).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => self.fault = self.reader.push(data).err(),
                    // Trailers end the request stream, as in tonic.
                    Err(_) => self.ended = true,
                },
                Some(Err(e)) => {
                    let status = Status::from_error(Box::new(e));
                    // tonic ends a request stream the client cancelled as
                    // if it had ended there.
                    if status.code() == Code::Cancelled {
                        self.ended = true;
                    } else {
                        self.fault = Some(status);
                    }
                }
                None => {
                    self.ended = true;
                    self.fault = self.reader.end().err();
                }
            }
        }
    }
}

/// Answers framed into data frames as they come, several per frame while
/// they are ready (up to tonic's 32 KiB), then the status as trailers.
struct AnswerFrames {
    answers: InferStream,
    limit: usize,
    buf: BytesMut,
    /// The call's status once known, sent after the framed answers.
    status: Option<Status>,
    ended: bool,
}

/// Framed answers held back while more are ready (tonic's threshold).
const YIELD_BYTES: usize = 32 * 1024;

impl AnswerFrames {
    /// Frames one answer, or the status that ends the call where it is
    /// past the limit (tonic's statuses; `size_limit` rewrites the first).
    fn frame(&mut self, answer: &StreamAnswer) -> Result<(), Status> {
        let answer = answer.measure();
        let len = answer.encoded_len();
        within_limit(len, self.limit)?;
        self.buf.reserve(HEADER_LEN + len);
        put_message_header(&mut self.buf, len, len)?;
        answer.encode(&mut self.buf);
        Ok(())
    }

    fn trailers(status: &Status) -> HeaderMap {
        let mut trailers = HeaderMap::with_capacity(2);
        if status.add_header(&mut trailers).is_err() {
            // A message that cannot be a header value: the code alone.
            trailers.clear();
            trailers.insert(Status::GRPC_STATUS, HeaderValue::from(status.code() as i32));
        }
        trailers
    }
}

impl Body for AnswerFrames {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        while this.status.is_none() && !this.ended && this.buf.len() < YIELD_BYTES {
            match Pin::new(&mut this.answers).poll_next(cx) {
                Poll::Ready(Some(Ok(answer))) => {
                    if let Err(status) = this.frame(&answer) {
                        this.status = Some(status);
                    }
                }
                Poll::Ready(Some(Err(status))) => this.status = Some(status),
                Poll::Ready(None) => this.status = Some(Status::ok("")),
                Poll::Pending => break,
            }
        }
        if !this.buf.is_empty() {
            return Poll::Ready(Some(Ok(Frame::data(this.buf.split().freeze()))));
        }
        match this.status.take() {
            Some(status) => {
                this.ended = true;
                Poll::Ready(Some(Ok(Frame::trailers(Self::trailers(&status)))))
            }
            None if this.ended => Poll::Ready(None),
            None => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.buf.is_empty() && self.status.is_none()
    }
}

/// Requests in as their message bytes, answers written straight into
/// tonic's send buffer.
struct MessageBytes;

impl Codec for MessageBytes {
    type Encode = StreamAnswer;
    type Decode = Bytes;
    type Encoder = AnswerWriter;
    type Decoder = WholeMessage;

    fn encoder(&mut self) -> Self::Encoder {
        AnswerWriter
    }

    fn decoder(&mut self) -> Self::Decoder {
        WholeMessage
    }
}

struct WholeMessage;

impl Decoder for WholeMessage {
    type Item = Bytes;
    type Error = Status;

    /// The message as it is: a slice of tonic's read buffer, not a copy.
    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(buf.copy_to_bytes(buf.remaining())))
    }
}

struct AnswerWriter;

impl Encoder for AnswerWriter {
    type Item = StreamAnswer;
    type Error = Status;

    /// tonic frames, compresses and checks the size limit after this, as
    /// for prost's encoder.
    fn encode(&mut self, item: StreamAnswer, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        let item = item.measure();
        dst.reserve(item.encoded_len());
        item.encode(dst);
        Ok(())
    }
}

struct OpenStream;

impl StreamingService<Bytes> for OpenStream {
    type Response = StreamAnswer;
    type ResponseStream = InferStream;
    type Future = Ready<Result<Response<InferStream>, Status>>;

    fn call(&mut self, req: Request<Streaming<Bytes>>) -> Self::Future {
        let forwarded = forwarded_metadata(req.metadata());
        std::future::ready(Ok(Response::new(InferStream::new(
            Inbound::Wire(req.into_inner()),
            forwarded,
        ))))
    }
}
