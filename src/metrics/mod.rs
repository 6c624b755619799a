//! Observability: per-shard statistics counters (summed when read), the
//! statistics extension, Prometheus exposition, and per-shard gauges.

pub mod config;
pub mod counters;
pub mod custom;
pub mod gpu;
pub mod host;
pub mod prometheus;
pub mod statistics;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::padded::PaddedSlice;

pub use counters::{FailureReason, ModelStats, ShardCounters, StatsSnapshot};

/// Per-destination gauges, 16 to a 128-byte line.
type PerShard = PaddedSlice<AtomicU64, 16>;

/// Gauges one shard updates about itself; any thread may read them. The
/// block and its per-destination arrays are padded, so no other shard's
/// writes share their cache lines.
#[derive(Debug)]
#[repr(align(128))]
pub struct ShardGauges {
    connections: AtomicU64,
    in_flight: AtomicU64,
    queue_depth: AtomicU64,
    ring_occupancy: PerShard,
    /// Requests this shard received and handed to an instance on another
    /// shard, per destination (a counter; only this shard writes it).
    forwarded: PerShard,
}

impl ShardGauges {
    pub fn new(shards: usize) -> Self {
        Self {
            connections: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            queue_depth: AtomicU64::new(0),
            ring_occupancy: PerShard::new(shards),
            forwarded: PerShard::new(shards),
        }
    }
    pub fn connections(&self) -> u64 {
        self.connections.load(Relaxed)
    }
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Relaxed)
    }
    pub fn queue_depth(&self) -> u64 {
        self.queue_depth.load(Relaxed)
    }
    pub fn ring_occupancy(&self) -> Vec<u64> {
        self.ring_occupancy
            .iter()
            .map(|a| a.load(Relaxed))
            .collect()
    }
    pub fn add_connection(&self, delta: i64) {
        add(&self.connections, delta);
    }
    pub fn add_in_flight(&self, delta: i64) {
        add(&self.in_flight, delta);
    }
    pub fn add_queue_depth(&self, delta: i64) {
        add(&self.queue_depth, delta);
    }
    pub fn forwarded(&self) -> Vec<u64> {
        self.forwarded.iter().map(|a| a.load(Relaxed)).collect()
    }
    pub fn count_forwarded(&self, to: usize) {
        if let Some(a) = self.forwarded.get(to) {
            a.fetch_add(1, Relaxed);
        }
    }
    pub fn set_ring_occupancy(&self, to: usize, n: usize) {
        if let Some(a) = self.ring_occupancy.get(to) {
            a.store(n as u64, Relaxed);
        }
    }
}

fn add(a: &AtomicU64, delta: i64) {
    if delta >= 0 {
        a.fetch_add(delta as u64, Relaxed);
    } else {
        let d = delta.unsigned_abs();
        let _ = a.fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(d)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gauges_are_padded_per_shard() {
        assert!(std::mem::align_of::<ShardGauges>() >= crate::padded::LINE);
        let g = ShardGauges::new(3);
        g.count_forwarded(2);
        g.count_forwarded(7); // out of range: ignored
        g.set_ring_occupancy(1, 5);
        assert_eq!(g.forwarded(), vec![0, 0, 1]);
        assert_eq!(g.ring_occupancy(), vec![0, 5, 0]);
    }
}
