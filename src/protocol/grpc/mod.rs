//! gRPC (`inference.GRPCInferenceService`, `grpc.health.v1`).
pub mod codec;
