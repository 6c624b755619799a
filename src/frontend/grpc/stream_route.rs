//! `ModelStreamInfer` taken by the router before tonic's generated
//! service, with a codec that hands each request message over as its
//! bytes: `stream::InferStream` reads a plain message straight into the
//! request (`request_wire`, as the direct unary path does) and gives
//! anything else to prost and the conversion, as tonic's codec did. On
//! `simple` over a stream, prost's decode and the conversion were about
//! 12 % of the shard's instructions (callgrind).
//!
//! Everything else is tonic's own call handling, configured as the
//! generated service is: the same compression (`compression`), the same
//! message size limits, the same framing and status mapping.

use std::{convert::Infallible, future::Ready};

use bytes::{Buf, Bytes};
use hyper::body::Incoming;
use tonic::{
    codec::{Codec, DecodeBuf, Decoder, EnabledCompressionEncodings},
    server::{Grpc, StreamingService},
    Request, Response, Status, Streaming,
};
use tonic_prost::ProstEncoder;

use super::{
    compression,
    service::forwarded_metadata,
    stream::{Inbound, InferStream},
};
use crate::{frontend::transport::PacedBody, proto::inference::ModelStreamInferResponse};

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

/// Requests in as their message bytes, responses out through prost.
struct MessageBytes;

impl Codec for MessageBytes {
    type Encode = ModelStreamInferResponse;
    type Decode = Bytes;
    type Encoder = ProstEncoder<ModelStreamInferResponse>;
    type Decoder = WholeMessage;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
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

struct OpenStream;

impl StreamingService<Bytes> for OpenStream {
    type Response = ModelStreamInferResponse;
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
