//! Per-shard statistics counters of one model version. Each shard writes
//! only its own cache-line-aligned block (uncontended relaxed atomics),
//! and readers sum the blocks when statistics or metrics are requested,
//! so scraping never touches the request path's data structures.

use std::{
    collections::BTreeMap,
    sync::{
        atomic::{
            AtomicU64,
            Ordering::{Acquire, Relaxed, Release},
        },
        Mutex,
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use crate::padded::PaddedSlice;

/// Batch sizes up to this have their own counters from the start.
const DENSE_BATCH_SIZES: usize = 1024;
/// Distinct batch sizes above [`DENSE_BATCH_SIZES`] counted per size, for
/// models with a larger `max_batch_size`; sizes beyond that still count in
/// the totals. Memory stays fixed whatever `max_batch_size` says.
const LARGE_BATCH_SLOTS: usize = 64;

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

/// A request-level latency counter that, when the model keeps latency
/// summaries (`--metrics-config summary_latencies=true`), also observes
/// each value in microseconds into a sliding window.
#[derive(Debug, Default)]
pub struct ObservedCounter {
    counter: DurationCounter,
    /// Sum of the observed whole microseconds (a summary's `_sum`, as
    /// Triton adds `ns / 1000` per observation).
    sum_us: AtomicU64,
    window: Option<Box<Window>>,
}

impl ObservedCounter {
    fn new(summary: bool) -> Self {
        Self {
            window: summary.then(|| Box::new(Window::default())),
            ..Self::default()
        }
    }

    pub fn record(&self, d: Duration) {
        self.counter.record(d);
        if let Some(w) = &self.window {
            let us = d.as_micros().min(u128::from(u64::MAX)) as u64;
            self.sum_us.fetch_add(us, Relaxed);
            w.observe(us, Instant::now());
        }
    }

    fn read(&self) -> DurationTotal {
        self.counter.read()
    }

    fn add_summary_to(&self, total: &mut SummaryTotal, now: Instant) {
        if let Some(w) = &self.window {
            total.count += self.counter.count.load(Relaxed);
            total.sum_us += self.sum_us.load(Relaxed);
            w.samples_into(&mut total.samples, now);
        }
    }
}

/// How long an observation counts in a summary's quantiles, and in how
/// many steps it ages out: prometheus-cpp's defaults, which Triton uses.
const WINDOW_AGE: Duration = Duration::from_secs(60);
const WINDOW_BUCKETS: usize = 5;
/// Observations kept per bucket: past this, a uniform sample of the
/// bucket's observations (reservoir sampling), so memory stays fixed
/// whatever the request rate.
const RESERVOIR: usize = 1024;

#[derive(Debug, Default)]
struct Bucket {
    seen: u64,
    samples: Vec<u64>,
}

#[derive(Debug)]
struct WindowState {
    buckets: [Bucket; WINDOW_BUCKETS],
    current: usize,
    rotated_at: Instant,
    rng: u64,
}

impl WindowState {
    /// Clears the buckets that have aged out since the last rotation.
    fn rotate(&mut self, now: Instant) {
        let step = WINDOW_AGE / WINDOW_BUCKETS as u32;
        let elapsed = now.saturating_duration_since(self.rotated_at);
        if elapsed < step {
            return;
        }
        let steps = (elapsed.as_nanos() / step.as_nanos()).min(WINDOW_BUCKETS as u128) as usize;
        for _ in 0..steps {
            self.current = (self.current + 1) % WINDOW_BUCKETS;
            self.buckets[self.current] = Bucket::default();
        }
        self.rotated_at = now;
    }

    fn next_random(&mut self) -> u64 {
        // xorshift64: enough to pick reservoir slots.
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        x
    }
}

/// The recent observations of one latency on one shard. Only that shard
/// (or its compute worker) writes it, so the lock is uncontended but for
/// a scrape.
#[derive(Debug)]
struct Window {
    state: Mutex<WindowState>,
}

impl Default for Window {
    fn default() -> Self {
        Self {
            state: Mutex::new(WindowState {
                buckets: Default::default(),
                current: 0,
                rotated_at: Instant::now(),
                rng: 0x9E37_79B9_7F4A_7C15,
            }),
        }
    }
}

impl Window {
    fn observe(&self, us: u64, now: Instant) {
        let Ok(mut st) = self.state.lock() else {
            return;
        };
        st.rotate(now);
        let slot = st.next_random();
        let current = st.current;
        let b = &mut st.buckets[current];
        b.seen += 1;
        if b.samples.len() < RESERVOIR {
            b.samples.push(us);
        } else if let Some(s) = b.samples.get_mut((slot % b.seen) as usize) {
            *s = us;
        }
    }

    /// Appends the window's samples, each weighted by how many
    /// observations it stands for.
    fn samples_into(&self, out: &mut Vec<(u64, f64)>, now: Instant) {
        let Ok(mut st) = self.state.lock() else {
            return;
        };
        st.rotate(now);
        for b in &st.buckets {
            if b.samples.is_empty() {
                continue;
            }
            let weight = b.seen as f64 / b.samples.len() as f64;
            out.extend(b.samples.iter().map(|&v| (v, weight)));
        }
    }
}

/// A latency summary summed over shards: cumulative count and sum, and
/// the weighted samples of the last minute for the quantiles.
#[derive(Debug, Default, Clone)]
pub struct SummaryTotal {
    pub count: u64,
    pub sum_us: u64,
    samples: Vec<(u64, f64)>,
}

impl SummaryTotal {
    /// The value at quantile `q` of the window (nearest rank), `None`
    /// when nothing was observed in it (prometheus shows NaN).
    pub fn quantile(&mut self, q: f64) -> Option<u64> {
        if self.samples.is_empty() {
            return None;
        }
        self.samples.sort_unstable_by_key(|&(v, _)| v);
        let total: f64 = self.samples.iter().map(|&(_, w)| w).sum();
        let rank = q.clamp(0.0, 1.0) * total;
        let mut seen = 0.0;
        for &(v, w) in &self.samples {
            seen += w;
            if seen >= rank {
                return Some(v);
            }
        }
        self.samples.last().map(|&(v, _)| v)
    }
}

/// The five latency summaries of one model version, in Triton's order:
/// request, queue, compute input, compute infer, compute output.
pub type Summaries = [SummaryTotal; 5];

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

impl BatchCounters {
    fn record(&self, input: Duration, infer: Duration, output: Duration) {
        self.compute_input.record(input);
        self.compute_infer.record(infer);
        self.compute_output.record(output);
    }

    fn add_to(&self, total: &mut BatchTotal) {
        total.compute_input += self.compute_input.read();
        total.compute_infer += self.compute_infer.read();
        total.compute_output += self.compute_output.read();
    }
}

/// The counters of one batch size above [`DENSE_BATCH_SIZES`]; `size` 0
/// marks a free slot. Only the owning shard claims slots, so claiming
/// needs no compare-and-swap.
#[derive(Debug, Default)]
struct LargeBatch {
    size: AtomicU64,
    counters: BatchCounters,
}

/// One shard's block. 128-byte alignment keeps two shards' blocks off the
/// same cache line (adjacent-line prefetch included).
#[derive(Debug)]
#[repr(align(128))]
pub struct ShardCounters {
    pub success: ObservedCounter,
    pub fail: DurationCounter,
    fail_by_reason: [AtomicU64; 4],
    pub queue: ObservedCounter,
    pub compute_input: ObservedCounter,
    pub compute_infer: ObservedCounter,
    pub compute_output: ObservedCounter,
    inference_count: AtomicU64,
    execution_count: AtomicU64,
    last_inference_ms: AtomicU64,
    /// Requests queued on this shard's instances, not yet executing.
    pending: AtomicU64,
    /// Indexed by batch size (0 unused), up to [`DENSE_BATCH_SIZES`].
    /// Padded: a plain boxed slice could end in the cache line where the
    /// next allocation (another shard's block) begins.
    batches: PaddedSlice<BatchCounters, 8>,
    /// Open addressing by batch size, for larger sizes; empty unless
    /// `max_batch_size` exceeds [`DENSE_BATCH_SIZES`].
    large_batches: PaddedSlice<LargeBatch, 16>,
    // issue 24: response cache
    /// Requests answered from the response cache, with their lookup time.
    pub cache_hit: DurationCounter,
    /// Responses stored after a cache miss, with lookup + insert time.
    pub cache_miss: DurationCounter,
}

impl ShardCounters {
    fn new(max_batch_size: usize, summaries: bool) -> Self {
        let dense = max_batch_size.clamp(1, DENSE_BATCH_SIZES);
        let large = if max_batch_size > DENSE_BATCH_SIZES {
            LARGE_BATCH_SLOTS
        } else {
            0
        };
        Self {
            success: ObservedCounter::new(summaries),
            fail: DurationCounter::default(),
            fail_by_reason: Default::default(),
            queue: ObservedCounter::new(summaries),
            compute_input: ObservedCounter::new(summaries),
            compute_infer: ObservedCounter::new(summaries),
            compute_output: ObservedCounter::new(summaries),
            inference_count: AtomicU64::default(),
            execution_count: AtomicU64::default(),
            last_inference_ms: AtomicU64::default(),
            pending: AtomicU64::default(),
            batches: PaddedSlice::new(dense + 1),
            large_batches: PaddedSlice::new(large),
            cache_hit: DurationCounter::default(),
            cache_miss: DurationCounter::default(),
        }
    }

    /// The counters of batch size `rows`; `None` when it is larger than
    /// the dense range and every large slot holds another size.
    fn batch(&self, rows: usize) -> Option<&BatchCounters> {
        if let Some(b) = self.batches.get(rows) {
            return Some(b);
        }
        let slots = self.large_batches.len();
        let size = rows as u64;
        (0..slots)
            .filter_map(|i| self.large_batches.get((rows + i) % slots))
            .find_map(|slot| match slot.size.load(Acquire) {
                s if s == size => Some(&slot.counters),
                0 => {
                    slot.size.store(size, Release);
                    Some(&slot.counters)
                }
                _ => None,
            })
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
        self.add_inferences(rows as u64);
        self.record_batch(rows, input, infer, output);
    }

    /// Inferences (batch rows) done, apart from the executions that did
    /// them: a C API backend reports them per request.
    pub fn add_inferences(&self, rows: u64) {
        self.inference_count.fetch_add(rows, Relaxed);
    }

    /// One execution of a batch of `rows` (its execution count, batch
    /// statistics and last-inference time), without its inferences.
    pub fn record_batch(&self, rows: usize, input: Duration, infer: Duration, output: Duration) {
        self.execution_count.fetch_add(1, Relaxed);
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.last_inference_ms.fetch_max(now_ms, Relaxed);
        if let Some(b) = self.batch(rows) {
            b.record(input, infer, output);
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
        Self::with_summaries(shards, max_batch_size, false)
    }

    /// As `new`, keeping latency summaries when `summaries` is set
    /// (`--metrics-config summary_latencies=true`).
    pub fn with_summaries(shards: usize, max_batch_size: usize, summaries: bool) -> Self {
        Self {
            shards: (0..shards.max(1))
                .map(|_| ShardCounters::new(max_batch_size, summaries))
                .collect(),
        }
    }

    /// The latency summaries summed over shards, `None` when the model
    /// keeps none. Only a scrape calls this.
    pub fn summaries(&self) -> Option<Summaries> {
        let first = self.shards.first()?;
        first.success.window.as_ref()?;
        let now = Instant::now();
        let mut out: Summaries = Default::default();
        for b in self.shards.iter() {
            let counters = [
                &b.success,
                &b.queue,
                &b.compute_input,
                &b.compute_infer,
                &b.compute_output,
            ];
            for (total, c) in out.iter_mut().zip(counters) {
                c.add_summary_to(total, now);
            }
        }
        Some(out)
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
        let mut large: BTreeMap<u64, BatchTotal> = BTreeMap::new();
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
            s.cache_hit += b.cache_hit.read();
            s.cache_miss += b.cache_miss.read();
            for (total, c) in s.batches.iter_mut().zip(b.batches.iter()) {
                c.add_to(total);
            }
            for slot in b.large_batches.iter() {
                match slot.size.load(Acquire) {
                    0 => {}
                    size => slot.counters.add_to(large.entry(size).or_default()),
                }
            }
        }
        s.large_batches = large.into_iter().collect();
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
    /// Indexed by batch size, up to 1024.
    pub batches: Vec<BatchTotal>,
    /// Larger batch sizes that ran, ascending.
    pub large_batches: Vec<(u64, BatchTotal)>,
    // issue 24: response cache
    pub cache_hit: DurationTotal,
    pub cache_miss: DurationTotal,
}

impl StatsSnapshot {
    /// Every batch size that has counters, ascending, with its totals.
    pub fn batch_sizes(&self) -> impl Iterator<Item = (u64, &BatchTotal)> {
        self.batches
            .iter()
            .enumerate()
            .map(|(size, b)| (size as u64, b))
            .chain(self.large_batches.iter().map(|(size, b)| (*size, b)))
    }
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
    fn a_huge_max_batch_size_allocates_a_fixed_amount() {
        // 2e9 once meant 96 GB of counters; now a dense 1024 plus 64 slots.
        let stats = ModelStats::new(2, 2_000_000_000);
        assert_eq!(stats.shard(0).batches.len(), DENSE_BATCH_SIZES + 1);
        assert_eq!(stats.shard(0).large_batches.len(), LARGE_BATCH_SLOTS);
        assert!(ModelStats::new(1, 8).shard(0).large_batches.is_empty());
    }

    #[test]
    fn large_batch_sizes_are_counted_per_size() {
        let stats = ModelStats::new(2, 1 << 20);
        let d = Duration::from_nanos(3);
        stats.shard(0).record_execution(5000, d, d, d);
        stats.shard(1).record_execution(5000, d, d, d);
        stats.shard(1).record_execution(70_000, d, d, d);
        stats.shard(0).record_execution(2, d, d, d);
        let s = stats.snapshot();
        assert_eq!(s.large_batches.len(), 2);
        assert_eq!(s.large_batches[0].0, 5000);
        assert_eq!(s.large_batches[0].1.compute_infer.count, 2);
        let sizes: Vec<u64> = s
            .batch_sizes()
            .filter(|(_, b)| b.compute_infer.count > 0)
            .map(|(n, _)| n)
            .collect();
        assert_eq!(sizes, vec![2, 5000, 70_000]);
        assert_eq!(s.inference_count, 5000 * 2 + 70_000 + 2);
    }

    #[test]
    fn sizes_beyond_the_slots_still_count_in_totals() {
        let stats = ModelStats::new(1, 1 << 20);
        let d = Duration::from_nanos(1);
        for rows in 0..(LARGE_BATCH_SLOTS + 10) {
            stats.shard(0).record_execution(2000 + rows, d, d, d);
        }
        let s = stats.snapshot();
        assert_eq!(s.large_batches.len(), LARGE_BATCH_SLOTS);
        assert_eq!(s.execution_count, (LARGE_BATCH_SLOTS + 10) as u64);
    }

    #[test]
    fn summaries_exist_only_when_asked_for() {
        let plain = ModelStats::new(2, 8);
        plain.shard(0).success.record(Duration::from_micros(5));
        assert!(plain.summaries().is_none());

        let stats = ModelStats::with_summaries(2, 8, true);
        for us in 1..=100u64 {
            stats
                .shard((us % 2) as usize)
                .success
                .record(Duration::from_micros(us));
        }
        stats.shard(1).queue.record(Duration::from_nanos(2500));
        let [mut request, mut queue, mut input, ..] = stats.summaries().unwrap();
        assert_eq!((request.count, request.sum_us), (100, 5050));
        assert_eq!(request.quantile(0.5), Some(50));
        assert_eq!(request.quantile(0.9), Some(90));
        assert_eq!(request.quantile(1.0), Some(100));
        assert_eq!((queue.count, queue.sum_us), (1, 2));
        assert_eq!(queue.quantile(0.99), Some(2));
        assert_eq!(input.count, 0);
        assert_eq!(input.quantile(0.5), None);
    }

    #[test]
    fn a_window_keeps_a_fixed_sample_and_ages_out() {
        let w = Window::default();
        let t0 = Instant::now();
        for v in 0..(RESERVOIR as u64 * 4) {
            w.observe(v, t0);
        }
        let mut out = Vec::new();
        w.samples_into(&mut out, t0);
        assert_eq!(out.len(), RESERVOIR);
        let weight: f64 = out.iter().map(|&(_, w)| w).sum();
        assert!((weight - (RESERVOIR * 4) as f64).abs() < 1e-6);
        out.clear();
        w.samples_into(&mut out, t0 + WINDOW_AGE + Duration::from_secs(1));
        assert!(out.is_empty(), "a minute later nothing is left");
    }

    #[test]
    fn inferences_and_batches_count_apart() {
        let stats = ModelStats::new(1, 8);
        let d = Duration::from_nanos(4);
        stats.shard(0).add_inferences(3);
        stats.shard(0).add_inferences(2);
        stats.shard(0).record_batch(5, d, d, d);
        let s = stats.snapshot();
        assert_eq!((s.inference_count, s.execution_count), (5, 1));
        assert_eq!(s.batches[5].compute_infer.count, 1);
    }

    #[test]
    fn blocks_do_not_share_cache_lines() {
        assert!(std::mem::align_of::<ShardCounters>() >= 128);
        // The chunk sizes of the padded batch arrays waste no bytes.
        assert_eq!(std::mem::size_of::<[BatchCounters; 8]>() % 128, 0);
        assert_eq!(std::mem::size_of::<[LargeBatch; 16]>() % 128, 0);
    }
}
