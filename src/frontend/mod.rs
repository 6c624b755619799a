//! The front ends: every way a request enters the server. `http` (KServe v2
//! REST: JSON, the binary tensor extension, generate, the metrics port),
//! `grpc` (`inference.GRPCInferenceService`, `grpc.health.v1`) and
//! `inprocess` (Triton's in-process `TRITONSERVER_*` C API, which backends
//! use for BLS) turn their input into `types::InferRequest`, hand it to
//! `scheduler`, and turn `types::InferResponse` and `InferError` back into
//! their own form (HTTP status, gRPC code, `TRITONSERVER_Error`).
//! `transport` is the connection plumbing HTTP and gRPC share (accept loop,
//! timeouts, body budget, TLS); `identity`, `logging`, `restricted` and
//! `trace_api` serve both network protocols.
//!
//! The only place that knows JSON or protobuf on the wire. Nothing below
//! imports it: backend, scheduler, shard, repository and the other core
//! rooms never name `frontend` (`tests/architecture.rs` enforces it).

pub mod core;
pub mod env;
pub mod grpc;
pub mod http;
pub mod identity;
pub mod inprocess;
pub mod logging;
pub mod restricted;
pub mod trace_api;
pub mod transport;
