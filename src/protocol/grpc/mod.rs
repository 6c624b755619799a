//! gRPC (`inference.GRPCInferenceService`, `grpc.health.v1`).
pub mod codec;
mod health;
mod server;
mod service;
mod status;

pub use server::serve;
