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

use std::{convert::Infallible, future::Ready};

use bytes::{Buf, Bytes};
use hyper::body::Incoming;
use tonic::{
    codec::{Codec, DecodeBuf, Decoder, EnabledCompressionEncodings, EncodeBuf, Encoder},
    server::{Grpc, StreamingService},
    Request, Response, Status, Streaming,
};

use super::{
    compression,
    service::forwarded_metadata,
    stream::{Inbound, InferStream},
    stream_answer::StreamAnswer,
};
use crate::frontend::transport::PacedBody;

pub(super) const PATH: &str = "/inference.GRPCInferenceService/ModelStreamInfer";

/// The stream method's settings, shared by a shard's connections.
#[derive(Clone, Copy)]
pub(super) struct StreamRoute {
    accept: EnabledCompressionEncodings,
    send: EnabledCompressionEncodings,
    max_message_size: usize,
}

impl StreamRoute {
    pub(super) fn new(max_message_size: usize, compress_responses: bool) -> Self {
        let (accept, send) = compression::encodings(compress_responses);
        Self {
            accept,
            send,
            max_message_size,
        }
    }

    pub(super) async fn call(
        self,
        req: http::Request<PacedBody<Incoming>>,
    ) -> Result<http::Response<tonic::body::Body>, Infallible> {
        let mut grpc = Grpc::new(MessageBytes)
            .apply_compression_config(self.accept, self.send)
            .apply_max_message_size_config(
                Some(self.max_message_size),
                Some(self.max_message_size),
            );
        Ok(grpc.streaming(OpenStream, req).await)
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
