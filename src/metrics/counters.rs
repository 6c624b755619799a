//! Per-shard statistics counters of one model version. Each shard writes
//! only its own cache-line-aligned block (uncontended relaxed atomics),
//! and readers sum the blocks when statistics or metrics are requested,
//! so scraping never touches the request path's data structures.

use std::{
    sync::atomic::{AtomicU64, Ordering::Relaxed},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

/// A count and a cumulative duration (Triton's `StatisticDuration`).
#[derive(Debug, Default)]
pub struct DurationCounter {
    count: AtomicU64,
    ns: AtomicU64,
}

impl DurationCounter {
    pub fn record(&self, d: Duration) {
        self.count.fetch_add(1, Relaxed);
        self.ns
            .fetch_add(d.as_nanos().min(u128::from(u64::MAX)) as u64, Relaxed);
    }
    fn read(&self) -> DurationTotal {
        DurationTotal {
            count: self.count.load(Relaxed),
            ns: self.ns.load(Relaxed),
        }
    }
}

/// Why a request failed, as Triton labels `nv_inference_request_failure`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureReason {
    Rejected,
    Canceled,
    Backend,
    Other,
}

impl FailureReason {
    pub const ALL: [FailureReason; 4] =
        [Self::Rejected, Self::Canceled, Self::Backend, Self::Other];
    /// The reason an error answered to a client counts under.
    pub fn for_error(e: &crate::types::InferError) -> Self {
        use crate::types::ErrorKind;
        match e.kind {
            ErrorKind::Unavailable => Self::Rejected,
            ErrorKind::Internal => Self::Backend,
            _ => Self::Other,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::Rejected => "REJECTED",
            Self::Canceled => "CANCELED",
            Self::Backend => "BACKEND",
            Self::Other => "OTHER",
        }
    }
}

#[derive(Debug, Default)]
pub struct BatchCounters {
    pub compute_input: DurationCounter,
    pub compute_infer: DurationCounter,
    pub compute_output: DurationCounter,
}

/// One shard's block. 128-byte alignment keeps two shards' blocks off the
/// same cache line (adjacent-line prefetch included).
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct ShardCounters {
    pub success: DurationCounter,
    pub fail: DurationCounter,
    fail_by_reason: [AtomicU64; 4],
    pub queue: DurationCounter,
    pub compute_input: DurationCounter,
    pub compute_infer: DurationCounter,
    pub compute_output: DurationCounter,
    inference_count: AtomicU64,
    execution_count: AtomicU64,
    last_inference_ms: AtomicU64,
    /// Requests queued on this shard's instances, not yet executing.
    pending: AtomicU64,
    /// Indexed by batch size (0 unused).
    batches: Box<[BatchCounters]>,
}

impl ShardCounters {
    fn new(max_batch_size: usize) -> Self {
        Self {
            batches: (0..=max_batch_size.max(1))
                .map(|_| BatchCounters::default())
                .collect(),
            ..Default::default()
        }
    }

    pub fn record_failure(&self, reason: FailureReason, d: Duration) {
        self.fail.record(d);
        self.fail_by_reason[reason as usize].fetch_add(1, Relaxed);
    }

    /// One execution of `rows` batch rows with its phase durations.
    pub fn record_execution(
        &self,
        rows: usize,
        input: Duration,
        infer: Duration,
        output: Duration,
    ) {
        self.inference_count.fetch_add(rows as u64, Relaxed);
        self.execution_count.fetch_add(1, Relaxed);
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.last_inference_ms.fetch_max(now_ms, Relaxed);
        if let Some(b) = self.batches.get(rows) {
            b.compute_input.record(input);
            b.compute_infer.record(infer);
            b.compute_output.record(output);
        }
    }

    pub fn pending_add(&self, n: u64) {
        self.pending.fetch_add(n, Relaxed);
    }

    pub fn pending_sub(&self, n: u64) {
        // Saturating: a racing reader never sees a wrapped value.
        let _ = self
            .pending
            .fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(n)));
    }
}

/// The counters of one model version: one block per shard.
#[derive(Debug)]
pub struct ModelStats {
    shards: Box<[ShardCounters]>,
}

impl ModelStats {
    pub fn new(shards: usize, max_batch_size: usize) -> Self {
        Self {
            shards: (0..shards.max(1))
                .map(|_| ShardCounters::new(max_batch_size))
                .collect(),
        }
    }

    /// The block the given shard writes. Out-of-range ids fold into the
    /// last block rather than panicking.
    pub fn shard(&self, id: usize) -> &ShardCounters {
        &self.shards[id.min(self.shards.len() - 1)]
    }

    /// Sums every shard's block.
    pub fn snapshot(&self) -> StatsSnapshot {
        let mut s = StatsSnapshot::default();
        let batch_len = self.shards.first().map_or(0, |b| b.batches.len());
        s.batches = vec![BatchTotal::default(); batch_len];
        for b in self.shards.iter() {
            s.success += b.success.read();
            s.fail += b.fail.read();
            s.queue += b.queue.read();
            s.compute_input += b.compute_input.read();
            s.compute_infer += b.compute_infer.read();
            s.compute_output += b.compute_output.read();
            for (i, r) in b.fail_by_reason.iter().enumerate() {
                s.fail_by_reason[i] += r.load(Relaxed);
            }
            s.inference_count += b.inference_count.load(Relaxed);
            s.execution_count += b.execution_count.load(Relaxed);
            s.last_inference_ms = s.last_inference_ms.max(b.last_inference_ms.load(Relaxed));
            s.pending += b.pending.load(Relaxed);
            for (total, c) in s.batches.iter_mut().zip(b.batches.iter()) {
                total.compute_input += c.compute_input.read();
                total.compute_infer += c.compute_infer.read();
                total.compute_output += c.compute_output.read();
            }
        }
        s
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DurationTotal {
    pub count: u64,
    pub ns: u64,
}

impl std::ops::AddAssign for DurationTotal {
    fn add_assign(&mut self, o: Self) {
        self.count += o.count;
        self.ns += o.ns;
    }
}

#[derive(Debug, Default, Clone, Copy)]
pub struct BatchTotal {
    pub compute_input: DurationTotal,
    pub compute_infer: DurationTotal,
    pub compute_output: DurationTotal,
}

/// Summed statistics of a model version at one moment.
#[derive(Debug, Default, Clone)]
pub struct StatsSnapshot {
    pub success: DurationTotal,
    pub fail: DurationTotal,
    pub fail_by_reason: [u64; 4],
    pub queue: DurationTotal,
    pub compute_input: DurationTotal,
    pub compute_infer: DurationTotal,
    pub compute_output: DurationTotal,
    pub inference_count: u64,
    pub execution_count: u64,
    pub last_inference_ms: u64,
    pub pending: u64,
    /// Indexed by batch size.
    pub batches: Vec<BatchTotal>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_summed_when_read() {
        let stats = ModelStats::new(2, 8);
        stats.shard(0).success.record(Duration::from_nanos(10));
        stats.shard(1).success.record(Duration::from_nanos(5));
        stats
            .shard(1)
            .record_execution(3, Duration::ZERO, Duration::from_nanos(7), Duration::ZERO);
        stats
            .shard(0)
            .record_failure(FailureReason::Rejected, Duration::from_nanos(1));
        let s = stats.snapshot();
        assert_eq!(s.success, DurationTotal { count: 2, ns: 15 });
        assert_eq!(s.inference_count, 3);
        assert_eq!(s.execution_count, 1);
        assert_eq!(
            s.batches[3].compute_infer,
            DurationTotal { count: 1, ns: 7 }
        );
        assert_eq!(s.fail_by_reason, [1, 0, 0, 0]);
        assert!(s.last_inference_ms > 0);
    }

    #[test]
    fn blocks_do_not_share_cache_lines() {
        assert!(std::mem::align_of::<ShardCounters>() >= 128);
    }
}
