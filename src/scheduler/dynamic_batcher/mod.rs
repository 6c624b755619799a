//! The dynamic batcher (`dynamic_batching { }`): requests queued on an
//! instance are merged into one execution, following Triton's rules for
//! preferred sizes, queue delay, priorities and queue policies.

pub mod policy;
pub mod queue;

pub use policy::BatcherPolicy;
pub use queue::{BatchQueue, BatchScan, Decision, Pending};
