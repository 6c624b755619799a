//! gRPC (`inference.GRPCInferenceService`, `grpc.health.v1`).
pub mod codec;
mod health;
mod server;
mod service;
mod status;
mod stream;

pub use server::serve;
