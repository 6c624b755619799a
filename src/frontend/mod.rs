//! Wire protocols: the only place that knows JSON, the binary tensor
//! extension or protobuf. Decodes into `types::InferRequest`, encodes
//! `types::InferResponse`.

pub mod core;
pub mod grpc;
pub mod http;
pub mod identity;
pub mod inprocess;
pub mod logging;
pub mod restricted;
pub mod trace_api;
pub mod transport;
