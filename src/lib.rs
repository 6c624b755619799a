//! shardserve: a thread-per-core inference server speaking Triton's KServe v2
//! HTTP/REST and gRPC protocols. See ARCHITECTURE.md for the map.

pub mod backend;
pub mod config;
pub mod proto;
pub mod protocol;
pub mod types;
pub mod model;
pub mod scheduler;
pub mod shard;
pub mod repository;
pub mod server;
pub mod metrics;
pub mod tuning;
pub mod bench;
