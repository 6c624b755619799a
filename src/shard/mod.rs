//! Per-core shards: the thread-local [`Shard`] context (table, lifecycle,
//! gauges) and the SPSC ring mesh between shards, generic over what
//! crosses it. Architecture invariant: `shard/` knows nothing of the front
//! ends or of schedulers (`scheduler::host` hosts a shard's schedulers and
//! fills its rings with jobs), and nothing here takes a lock; the only way
//! to reach another shard is a message.

mod context;
mod key_map;
mod latch;
pub mod ring;
pub mod spin;
mod timer;
pub mod uring;

pub use context::{
    with_current, ConnectionGauge, InFlight, Shard, ShardControl, ShardTask, Target,
};
pub use key_map::KeyMap;
pub use latch::{same_task, yield_now, Latch};
pub use ring::ShardId;
pub use timer::{sleep_until_coarse, PreciseTimer};
