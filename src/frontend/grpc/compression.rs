//! gRPC message compression (`grpc-encoding` / `grpc-accept-encoding`):
//! gzip and deflate, as Triton accepts them (`tritonclient.grpc`'s
//! `compression_algorithm`, `simple_grpc_infer_client.py -C`). A request
//! in either is decompressed by tonic within `--grpc-max-message-size`
//! (the limit applies to the decompressed message). Responses are
//! compressed only with `--grpc-infer-response-compression-level` other
//! than `none` (Triton's default is none too), and then only for a client
//! that listed the encoding in `grpc-accept-encoding`: grpc-core clients
//! (Python, C++) list gzip and deflate on every call, so compressing by
//! default cost every response CPU time — 4 MB took ~0.3 s.

use tonic::codec::{CompressionEncoding, EnabledCompressionEncodings};

use crate::proto::inference::grpc_inference_service_server::GrpcInferenceServiceServer;

/// What the server accepts, and offers for responses when asked to.
const ENCODINGS: [CompressionEncoding; 2] =
    [CompressionEncoding::Gzip, CompressionEncoding::Deflate];

/// The encodings accepted, and offered for responses, when a method is
/// served with tonic's `Grpc` directly (`stream_route`): the same as
/// [`with_compression`] gives the generated service.
pub(super) fn encodings(
    compress_responses: bool,
) -> (EnabledCompressionEncodings, EnabledCompressionEncodings) {
    let mut accept = EnabledCompressionEncodings::default();
    let mut send = EnabledCompressionEncodings::default();
    for encoding in ENCODINGS {
        accept.enable(encoding);
        if compress_responses {
            send.enable(encoding);
        }
    }
    (accept, send)
}

/// Accepts gzip and deflate on the inference service, and offers them
/// for responses when `compress_responses`.
pub(super) fn with_compression<S>(
    mut server: GrpcInferenceServiceServer<S>,
    compress_responses: bool,
) -> GrpcInferenceServiceServer<S>
where
    S: crate::proto::inference::grpc_inference_service_server::GrpcInferenceService,
{
    for encoding in ENCODINGS {
        server = server.accept_compressed(encoding);
        if compress_responses {
            server = server.send_compressed(encoding);
        }
    }
    server
}
