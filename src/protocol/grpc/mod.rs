//! gRPC (`inference.GRPCInferenceService`, `grpc.health.v1`).
