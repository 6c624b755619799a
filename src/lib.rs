//! shardserve: a thread-per-core inference server speaking Triton's KServe v2
//! HTTP/REST and gRPC protocols. See ARCHITECTURE.md for the map.

// First, so that its `ffi_entry!` macro is in scope in the modules below.
#[macro_use]
pub mod triton_abi;

pub mod backend;
pub mod bench;
pub mod cli;
pub mod compute;
pub mod config;
pub mod error_texts;
pub mod frontend;
pub mod gpu;
pub mod logs;
pub mod metrics;
pub mod model;
pub mod offload;
pub mod padded;
pub mod proto;
pub mod repository;
pub mod scheduler;
pub mod server;
pub mod shard;
pub mod shm;
pub mod trace;
pub mod tuning;
pub mod types;
