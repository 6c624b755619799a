//! Where model computation runs. Shards never execute a heavy model on
//! their reactor thread: each such instance gets a [`ComputeWorker`], an OS
//! thread pinned to the CPUs of its owner shard's NUMA node, at the
//! profile's nice value (0 by default), fed and answered through SPSC rings. Light
//! built-in backends may still run inline on the shard (see
//! `backend::Backend::runs_inline`).
//!
//! Knows nothing of requests, models or protocols: a worker runs a closure
//! over whatever it is handed.

mod reaper;
pub mod thread;
mod worker;

pub use reaper::join_retired;
pub use worker::{ComputeWorker, WorkerPlacement};
