//! Schedulers: how requests reach a model instance and how its results go
//! back. `infer` is the entry point every protocol calls after decoding.
//!
//! Each loaded model version has one [`ModelScheduler`] on one owner shard
//! (FIFO for the default scheduler, the dynamic batcher otherwise) feeding
//! its instances, which run inline (light built-in backends) or on compute
//! worker threads. A sequence model's scheduler runs the sequence batcher
//! (`sequence`) in the same place. An ensemble has no scheduler of its own:
//! `ensemble` runs its steps from the receiving shard.

mod batch;
mod cache_path;
pub mod classification;
pub mod decoupled;
mod dispatch;
pub mod dynamic_batcher;
pub mod ensemble;
mod execute;
pub mod host;
mod job;
mod model_scheduler;
mod output;
mod per_request;
mod ragged;
pub mod rate_limiter;
mod reorder;
pub mod response_cache;
pub mod sequence;
mod timeout;
pub mod warmup;

pub use decoupled::{infer_stream, refuse_decoupled_http, ResponseStream, Streamed};
pub use dispatch::infer;
pub use host::{reply, SchedulerHost, ShardMsg};
pub use job::{Job, Responder};
pub use model_scheduler::{InstanceExecutor, ModelScheduler, DEFAULT_MAX_QUEUE_SIZE};
pub use response_cache::ResponseCache;
