//! gRPC (`inference.GRPCInferenceService`, `grpc.health.v1`).
pub mod codec;
mod compression;
mod conn_streams;
mod health;
mod message_reader;
mod raw_tail;
mod repository_service;
mod request_wire;
mod response_wire;
mod server;
mod service;
mod shm_service;
mod size_limit;
mod status;
mod stream;
mod stream_answer;
mod stream_order;
mod stream_route;
mod unary_infer;

pub use server::serve;
