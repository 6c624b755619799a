//! Per-core shards: the thread-local [`Shard`] context, the SPSC ring mesh
//! between shards, and the messages that cross it. Architecture
//! invariant: `shard/` knows nothing of HTTP or gRPC, and nothing here
//! takes a lock; the only way to reach another shard is a message.

mod context;
mod latch;
mod message;
pub mod ring;
mod timer;

pub use context::{
    reply, with_current, ConnectionGauge, Dispatch, InFlight, Shard, ShardControl, ShardTask,
    Target,
};
pub use latch::{yield_now, Latch};
pub use message::ShardMsg;
pub use ring::ShardId;
pub use timer::{sleep_until_coarse, PreciseTimer};
