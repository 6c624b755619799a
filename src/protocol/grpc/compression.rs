//! gRPC message compression (`grpc-encoding` / `grpc-accept-encoding`):
//! gzip and deflate, as Triton accepts them (`tritonclient.grpc`'s
//! `compression_algorithm`, `simple_grpc_infer_client.py -C`). A request
//! in either is decompressed by tonic within `--grpc-max-message-size`
//! (the limit applies to the decompressed message); a response is
//! compressed only when the client listed the encoding in
//! `grpc-accept-encoding`, so plain clients see no change.

use tonic::codec::CompressionEncoding;

use crate::proto::inference::grpc_inference_service_server::GrpcInferenceServiceServer;

/// Accepts and offers gzip and deflate on the inference service.
pub(super) fn with_compression<S>(
    server: GrpcInferenceServiceServer<S>,
) -> GrpcInferenceServiceServer<S>
where
    S: crate::proto::inference::grpc_inference_service_server::GrpcInferenceService,
{
    server
        .accept_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Deflate)
        .send_compressed(CompressionEncoding::Gzip)
        .send_compressed(CompressionEncoding::Deflate)
}
