//! Load generation: one pinned thread per --cpu entry, each a monoio
//! runtime. Closed loop: N tasks, each sending its next request as soon as
//! the previous one completes. Open loop: a schedule of intended send
//! times; latency counts from the intended time (no coordinated omission).

use std::{
    cell::{Cell, RefCell},
    rc::Rc,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use futures::{channel::mpsc, StreamExt};
use monoio::FusionDriver;

use crate::shard::PreciseTimer;

use super::{
    cli::{Distribution, Load, Target},
    grpc::Completion,
    request::{send, Prepared},
    sequence::{SeqStep, SequenceGen, Slot},
    stats::{dur_ns, SplitMix64},
    wire::{self, Pool},
};

/// What completed since the coordinator last took it.
#[derive(Debug, Default)]
pub struct WindowBuf {
    /// Latencies of successful requests, ns.
    pub latencies: Vec<u64>,
    pub errors: u64,
    pub first_error: Option<String>,
    /// Sequences whose last request succeeded (perf_analyzer's count).
    pub sequences: u64,
    /// Responses of the successful requests (a decoupled model's many).
    pub responses: u64,
    /// Time from send to the first response, ns, of the successful
    /// requests on a stream that got any.
    pub first_response: Vec<u64>,
    /// --profile-export-file: the successful requests, in completion
    /// order; empty without the flag.
    pub records: Vec<RequestRecord>,
}

/// One successful request for --profile-export-file.
#[derive(Debug, Clone, Copy)]
pub struct RequestRecord {
    /// Closed loop: the send; open loop: the intended send, which latency
    /// counts from.
    pub sent: Instant,
    /// 0 for a model without the sequence batcher.
    pub sequence_id: u64,
    /// From `sent` to the final response, ns.
    pub latency_ns: u64,
    /// From the send to the first response, where a stream had several.
    pub first_response: Option<Duration>,
}

/// Shared by one worker (writer) and the coordinator (takes per window).
/// One uncontended lock per completed request: tens of nanoseconds.
#[derive(Debug, Default)]
pub struct Recorder {
    buf: Mutex<WindowBuf>,
    completed: AtomicU64,
    /// --profile-export-file: keep a RequestRecord per success.
    profile: bool,
}

impl Recorder {
    pub fn new(profile: bool) -> Self {
        Self {
            profile,
            ..Self::default()
        }
    }

    pub fn record(&self, result: Result<u64, String>) {
        self.record_request(
            Instant::now(),
            0,
            result.map(|ns| (ns, Completion::single())),
            false,
        );
    }

    /// Records a request sent at `sent`: its latency to its final response
    /// and what it got; `ends_sequence` when it carried `sequence_end`.
    pub fn record_request(
        &self,
        sent: Instant,
        sequence_id: u64,
        result: Result<(u64, Completion), String>,
        ends_sequence: bool,
    ) {
        crate::shard::spin::note_work();
        let mut b = self.buf.lock().unwrap_or_else(|e| e.into_inner());
        match result {
            Ok((ns, done)) => {
                b.latencies.push(ns);
                if self.profile {
                    b.records.push(RequestRecord {
                        sent,
                        sequence_id,
                        latency_ns: ns,
                        first_response: done.first_response.filter(|_| done.responses > 1),
                    });
                }
                b.sequences += u64::from(ends_sequence);
                b.responses += done.responses;
                if let Some(first) = done.first_response {
                    b.first_response.push(dur_ns(first));
                }
            }
            Err(e) => {
                b.errors += 1;
                if b.first_error.is_none() {
                    b.first_error = Some(e);
                }
            }
        }
        drop(b);
        self.completed.fetch_add(1, Ordering::Relaxed);
    }

    pub fn take(&self) -> WindowBuf {
        let mut b = self.buf.lock().unwrap_or_else(|e| e.into_inner());
        // The next window's records get the last one's room here, on the
        // coordinator, so the worker's push rarely allocates.
        let room = if self.profile { b.records.len() } else { 0 };
        let out = std::mem::take(&mut *b);
        b.records.reserve(room);
        out
    }

    pub fn completed(&self) -> u64 {
        self.completed.load(Ordering::Relaxed)
    }
}

pub struct WorkerSpec {
    pub index: usize,
    pub target: Target,
    pub prepared: Arc<Prepared>,
    pub load: Load,
    /// Open loop: this worker's first intended send, as an offset from the
    /// common start, so workers interleave rather than send in bursts.
    pub phase: Duration,
    pub distribution: Distribution,
    pub seed: u64,
    pub max_outstanding: usize,
    pub connections: usize,
    pub cpu: Option<usize>,
    /// How long the thread polls after a completion before it sleeps.
    pub busy_poll: Duration,
    /// A thread with one plaintext HTTP/1.1 or unary gRPC request at a
    /// time may drive its socket itself (`direct`); false with --no-direct.
    pub direct: bool,
    pub stop: Arc<AtomicBool>,
    pub recorder: Arc<Recorder>,
    /// Sequence models: this worker's sequences.
    pub sequence: Option<WorkerSequences>,
    /// --request-intervals: the gaps, and the number of workers sharing
    /// them (this one sends every n-th request, from its `index`).
    pub intervals: Option<(Arc<[Duration]>, usize)>,
}

impl WorkerSpec {
    /// This worker's open-loop send times, from `rate` or the intervals.
    fn schedule(&self, rate: f64) -> Schedule {
        let start = Instant::now() + self.phase;
        match &self.intervals {
            Some((gaps, stride)) => {
                Schedule::from_intervals(start, gaps.clone(), self.index, *stride)
            }
            None => Schedule::new(start, rate, self.distribution, self.seed),
        }
    }
}

/// A worker's part of a sequence run.
pub struct WorkerSequences {
    pub gen: SequenceGen,
    /// Requests per sequence when the input data fixes it.
    pub fixed_length: Option<u64>,
    /// Open loop: sequences this worker keeps live.
    pub live: usize,
    /// Open loop: one request in flight per sequence (--serial-sequences).
    pub serial: bool,
    /// Where the worker leaves its next id ordinal, so the next step
    /// continues after the ids this one used.
    pub next_ordinal: Arc<AtomicU64>,
}

/// The sequences of one worker thread, shared by its tasks (one thread:
/// a `RefCell` never borrowed across an await).
struct Sequences {
    gen: RefCell<SequenceGen>,
    fixed_length: Option<u64>,
}

impl Sequences {
    fn next(&self, slot: &mut Slot) -> Result<SeqStep, String> {
        slot.next_step(&mut self.gen.borrow_mut(), self.fixed_length)
            .ok_or_else(|| {
                "no free sequence id: --sequence-id-range is smaller than the live sequences"
                    .to_string()
            })
    }
}

/// Pins the calling worker thread to `cpu`, where one is given.
pub fn pin(cpu: Option<usize>) {
    if let Some(cpu) = cpu {
        if !core_affinity::set_for_current(core_affinity::CoreId { id: cpu }) {
            tracing::warn!(cpu, "bench: cannot pin worker thread");
        }
    }
}

/// Starts a worker thread; it runs until `stop` is set.
pub fn spawn(spec: WorkerSpec) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("bench-{}", spec.index))
        .spawn(move || {
            pin(spec.cpu);
            let mut rt = match crate::shard::uring::runtime_builder::<FusionDriver>()
                .enable_timer()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    spec.recorder
                        .record(Err(format!("cannot start a runtime: {e}")));
                    return;
                }
            };
            let (busy_poll, driver) = (spec.busy_poll, spin_driver(&rt));
            rt.block_on(crate::shard::spin::alongside(busy_poll, driver, run(spec)));
        })
}

fn spin_driver<L, R>(rt: &monoio::FusionRuntime<L, R>) -> crate::shard::spin::Driver {
    match rt {
        monoio::FusionRuntime::Uring(_) => crate::shard::spin::Driver::IoUring,
        monoio::FusionRuntime::Legacy(_) => crate::shard::spin::Driver::Epoll,
    }
}

async fn run(mut spec: WorkerSpec) {
    let seq_spec = spec.sequence.take();
    let next_ordinal = seq_spec.as_ref().map(|s| s.next_ordinal.clone());
    let (live, serial) = seq_spec.as_ref().map_or((0, false), |s| (s.live, s.serial));
    let sequences = seq_spec.map(|s| {
        Rc::new(Sequences {
            gen: RefCell::new(s.gen),
            fixed_length: s.fixed_length,
        })
    });
    let spec = Rc::new(spec);
    let pool = Rc::new(Pool::new(
        &spec.target,
        spec.prepared.wire,
        spec.connections,
    ));
    if let Err(e) = pool.warm().await {
        spec.recorder.record(Err(format!("{e:#}")));
    }
    let handles = match spec.load {
        Load::Concurrency(n) => (0..n)
            .map(|i| {
                monoio::spawn(closed_loop(
                    pool.clone(),
                    spec.prepared.clone(),
                    spec.stop.clone(),
                    spec.recorder.clone(),
                    i as usize,
                    sequences.clone(),
                ))
            })
            .collect::<Vec<_>>(),
        Load::Rate(_) => match &sequences {
            Some(seq) => vec![monoio::spawn(open_loop_sequences(
                pool.clone(),
                spec.clone(),
                seq.clone(),
                live.max(1),
                serial,
            ))],
            None => vec![monoio::spawn(open_loop(pool.clone(), spec.clone()))],
        },
    };
    while !spec.stop.load(Ordering::Relaxed) {
        monoio::time::sleep(Duration::from_millis(2)).await;
    }
    // A request stuck on a hung server must not keep the step from ending
    // (this bound also covers ending the open sequences).
    let _ = monoio::time::timeout(Duration::from_secs(2), futures::future::join_all(handles)).await;
    if let (Some(seq), Some(out)) = (sequences, next_ordinal) {
        out.fetch_max(seq.gen.borrow().next_ordinal(), Ordering::Relaxed);
    }
    // Requests cut off by the bound above still hold the pool; the
    // connections of the rest close here, not at process exit.
    drop(pool);
    let open = wire::close_connections(Duration::from_millis(500)).await;
    if open > 0 {
        tracing::debug!(open, "bench: connections still open as the worker stops");
    }
}

async fn closed_loop(
    pool: Rc<Pool>,
    prepared: Arc<Prepared>,
    stop: Arc<AtomicBool>,
    recorder: Arc<Recorder>,
    task: usize,
    sequences: Option<Rc<Sequences>>,
) {
    let mut i = task;
    // A sequence model: this task runs its sequences back to back.
    let mut slot = Slot::default();
    while !stop.load(Ordering::Relaxed) {
        let step = match &sequences {
            Some(seq) => match seq.next(&mut slot) {
                Ok(step) => Some(step),
                Err(e) => {
                    recorder.record(Err(e));
                    return;
                }
            },
            None => None,
        };
        let t0 = Instant::now();
        let r = send(&pool, &prepared, i, step.as_ref()).await;
        let elapsed = dur_ns(t0.elapsed());
        let failed_to_connect = matches!(&r, Err(e) if e.starts_with("cannot connect"));
        recorder.record_request(
            t0,
            step.as_ref().map_or(0, |s| s.id),
            r.map(|c| (elapsed, c)),
            step.is_some_and(|s| s.end),
        );
        if failed_to_connect {
            // Do not spin on a refused connection.
            monoio::time::sleep(Duration::from_millis(10)).await;
        }
        i = i.wrapping_add(1);
    }
    // As perf_analyzer: end the open sequence so the server frees its
    // state now rather than at its idle timeout. Not measured.
    if let Some(end) = slot.finish() {
        let _ = send(&pool, &prepared, i, Some(&end)).await;
    }
}

/// Returns the intended send times of an open loop.
pub struct Schedule {
    next: Instant,
    mean: Duration,
    rng: Option<SplitMix64>,
    gaps: Option<Gaps>,
}

/// --request-intervals: a worker's walk through the cycled gaps.
struct Gaps {
    gaps: Arc<[Duration]>,
    /// The request this worker sends next (an index into the cycle).
    pos: usize,
    /// Workers sharing the gaps: the next request of this one is `stride` later.
    stride: usize,
}

impl Schedule {
    pub fn new(start: Instant, rate: f64, distribution: Distribution, seed: u64) -> Self {
        let mean = Duration::from_secs_f64(1.0 / rate);
        let rng = (distribution == Distribution::Poisson).then(|| SplitMix64::new(seed));
        let mut s = Self {
            next: start,
            mean,
            rng,
            gaps: None,
        };
        if s.rng.is_some() {
            let g = s.gap();
            s.next += g;
        }
        s
    }

    /// Send times from `gaps` (non-empty), cycled: this worker sends
    /// requests `first`, `first + stride`, ... starting at `start`.
    pub fn from_intervals(
        start: Instant,
        gaps: Arc<[Duration]>,
        first: usize,
        stride: usize,
    ) -> Self {
        Self {
            next: start,
            mean: Duration::ZERO,
            rng: None,
            gaps: Some(Gaps {
                gaps,
                pos: first,
                stride: stride.max(1),
            }),
        }
    }

    fn gap(&mut self) -> Duration {
        if let Some(g) = self.gaps.as_mut() {
            let len = g.gaps.len().max(1);
            let sum = (0..g.stride)
                .map(|k| g.gaps.get((g.pos + k) % len).copied().unwrap_or_default())
                .sum();
            g.pos = (g.pos + g.stride) % len;
            return sum;
        }
        match self.rng.as_mut() {
            Some(rng) => Duration::from_secs_f64(rng.exp(self.mean.as_secs_f64())),
            None => self.mean,
        }
    }

    pub fn next_send(&mut self) -> Instant {
        let t = self.next;
        let g = self.gap();
        self.next += g;
        t
    }
}

async fn open_loop(pool: Rc<Pool>, spec: Rc<WorkerSpec>) {
    let Load::Rate(rate) = spec.load else { return };
    let mut schedule = spec.schedule(rate);
    // Sub-millisecond gaps on a parked runtime. Yielding through them (the
    // first version) kept the runtime from parking, and on io_uring the
    // sockets' readiness is only re-armed in a park: at 500 req/s and more
    // (gaps under 2 ms) no answer was ever read.
    let timer = PreciseTimer::default();
    let outstanding = Rc::new(Cell::new(0usize));
    let mut i = 0usize;
    while !spec.stop.load(Ordering::Relaxed) {
        let intended = schedule.next_send();
        timer.sleep_until(intended).await;
        if outstanding.get() >= spec.max_outstanding {
            spec.recorder.record(Err(format!(
                "dropped: {} requests outstanding (--max-outstanding)",
                spec.max_outstanding
            )));
            continue;
        }
        outstanding.set(outstanding.get() + 1);
        let (pool, prepared, recorder, outstanding) = (
            pool.clone(),
            spec.prepared.clone(),
            spec.recorder.clone(),
            outstanding.clone(),
        );
        monoio::spawn(async move {
            let r = send(&pool, &prepared, i, None).await;
            // From the intended time: a late send is latency the user would see.
            recorder.record_request(
                intended,
                0,
                r.map(|c| (dur_ns(intended.elapsed()), c)),
                false,
            );
            outstanding.set(outstanding.get() - 1);
        });
        i = i.wrapping_add(1);
    }
    // The requests still out get their answers (the caller bounds the
    // wait): a worker that left them pending would leave them half sent.
    none_outstanding(&outstanding).await;
}

/// Resolves once an open loop's spawned requests have all completed.
async fn none_outstanding(outstanding: &Cell<usize>) {
    while outstanding.get() > 0 {
        monoio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The open loop for a sequence model: `live` sequences stay open; each
/// arrival goes to one of them, picked at random (perf_analyzer's default,
/// several requests of a sequence may be in flight), or with `serial` to
/// the sequence that has waited longest with nothing in flight, the
/// arrival waiting for one if all are busy. Latency still counts from the
/// intended time, so that wait shows as latency.
async fn open_loop_sequences(
    pool: Rc<Pool>,
    spec: Rc<WorkerSpec>,
    seq: Rc<Sequences>,
    live: usize,
    serial: bool,
) {
    let Load::Rate(rate) = spec.load else { return };
    let mut schedule = spec.schedule(rate);
    let slots = Rc::new(RefCell::new(vec![Slot::default(); live]));
    // Serial mode: sequences with nothing in flight, oldest first.
    let (free_tx, mut free_rx) = mpsc::unbounded::<usize>();
    if serial {
        for s in 0..live {
            let _ = free_tx.unbounded_send(s);
        }
    }
    // Its own stream, so the arrivals (Poisson) and the picks do not correlate.
    let mut pick = SplitMix64::new(spec.seed ^ 0x5e9_5e9_5e9);
    let timer = PreciseTimer::default();
    let outstanding = Rc::new(Cell::new(0usize));
    'arrivals: while !spec.stop.load(Ordering::Relaxed) {
        let intended = schedule.next_send();
        timer.sleep_until(intended).await;
        if outstanding.get() >= spec.max_outstanding {
            spec.recorder.record(Err(format!(
                "dropped: {} requests outstanding (--max-outstanding)",
                spec.max_outstanding
            )));
            continue;
        }
        let s = if serial {
            loop {
                if spec.stop.load(Ordering::Relaxed) {
                    break 'arrivals;
                }
                // Bounded waits so a stop is noticed while all are busy.
                match monoio::time::timeout(Duration::from_millis(5), free_rx.next()).await {
                    Ok(Some(s)) => break s,
                    Ok(None) => break 'arrivals,
                    Err(_) => {}
                }
            }
        } else {
            (pick.next_u64() % live as u64) as usize
        };
        let step = match seq.next(&mut slots.borrow_mut()[s]) {
            Ok(step) => step,
            Err(e) => {
                spec.recorder.record(Err(e));
                return;
            }
        };
        outstanding.set(outstanding.get() + 1);
        let (pool, prepared, recorder, outstanding, free_tx) = (
            pool.clone(),
            spec.prepared.clone(),
            spec.recorder.clone(),
            outstanding.clone(),
            free_tx.clone(),
        );
        monoio::spawn(async move {
            let r = send(&pool, &prepared, 0, Some(&step)).await;
            recorder.record_request(
                intended,
                step.id,
                r.map(|c| (dur_ns(intended.elapsed()), c)),
                step.end,
            );
            outstanding.set(outstanding.get() - 1);
            if serial {
                let _ = free_tx.unbounded_send(s);
            }
        });
    }
    // End the open sequences once nothing is in flight (the caller bounds
    // the whole wait), as perf_analyzer does at the end of a step.
    none_outstanding(&outstanding).await;
    let ends: Vec<SeqStep> = slots
        .borrow_mut()
        .iter_mut()
        .filter_map(Slot::finish)
        .collect();
    let sends = ends
        .iter()
        .map(|end| send(&pool, &spec.prepared, 0, Some(end)));
    futures::future::join_all(sends).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_schedule_is_evenly_spaced() {
        let start = Instant::now();
        let mut s = Schedule::new(start, 1000.0, Distribution::Constant, 0);
        let times: Vec<_> = (0..4).map(|_| s.next_send() - start).collect();
        assert_eq!(times, [0, 1, 2, 3].map(Duration::from_millis));
    }

    #[test]
    fn interval_schedules_cycle_and_share_the_gaps() {
        let start = Instant::now();
        let gaps: Arc<[Duration]> = [100, 300, 600].map(Duration::from_micros).into();
        let mut one = Schedule::from_intervals(start, gaps.clone(), 0, 1);
        let times: Vec<_> = (0..5)
            .map(|_| (one.next_send() - start).as_micros())
            .collect();
        assert_eq!(times, [0, 100, 400, 1000, 1100]);
        // Two workers: the second starts after the first gap (its phase)
        // and each steps over the other's requests; together they make the
        // single worker's times.
        let mut a = Schedule::from_intervals(start, gaps.clone(), 0, 2);
        let mut b = Schedule::from_intervals(start + Duration::from_micros(100), gaps, 1, 2);
        let mut all: Vec<_> = (0..3)
            .flat_map(|_| [a.next_send(), b.next_send()])
            .map(|t| (t - start).as_micros())
            .collect();
        all.sort_unstable();
        assert_eq!(all, [0, 100, 400, 1000, 1100, 1400]);
    }

    #[test]
    fn poisson_schedule_has_the_rate() {
        let start = Instant::now();
        let mut s = Schedule::new(start, 10_000.0, Distribution::Poisson, 7);
        let mut last = start;
        for _ in 0..100_000 {
            let t = s.next_send();
            assert!(t >= last);
            last = t;
        }
        let secs = (last - start).as_secs_f64();
        assert!((secs - 10.0).abs() < 0.3, "{secs}");
    }

    #[test]
    fn recorder_counts() {
        let r = Recorder::default();
        r.record(Ok(5));
        r.record(Err("boom".into()));
        r.record(Err("later".into()));
        assert_eq!(r.completed(), 3);
        let w = r.take();
        assert_eq!(
            (w.latencies, w.errors, w.first_error.as_deref()),
            (vec![5], 2, Some("boom"))
        );
        assert_eq!(r.take().errors, 0);
    }
}
