//! One step (a target at one load): start the workers, warm up, then
//! measure windows until the last three agree within the tolerance or
//! --max-trials windows have passed; summarise the last three.

use std::{
    io::Write,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::anyhow;
use serde::Serialize;

use super::{
    cli::{Distribution, Load, MeasurementMode, Protocol, Target},
    direct,
    load::{self, Recorder, RequestRecord, WorkerSequences, WorkerSpec},
    metrics::{MetricsSummary, MetricsUrl, Scraper},
    probe::{self, ServerCounters},
    request::Prepared,
    sequence::{share, SequenceGen, SequenceOptions},
    stats::{us, LatencySummary},
};

/// Windows the stability rule looks at (perf_analyzer's choice).
const STABLE_WINDOWS: usize = 3;

/// How to measure; the same for every step.
#[derive(Debug, Clone)]
pub struct Plan {
    pub mode: MeasurementMode,
    pub interval: Duration,
    pub request_count: u64,
    pub warmup: Duration,
    pub warmup_requests: u64,
    pub stability_percent: f64,
    pub max_trials: u32,
    pub percentile: Option<u8>,
    pub distribution: Distribution,
    pub seed: u64,
    pub max_outstanding: usize,
    pub connections: usize,
    pub cpus: Option<Vec<usize>>,
    /// --busy-poll-us.
    pub busy_poll: Duration,
    /// --no-direct turns the direct lane off (`direct`).
    pub direct: bool,
    pub workers: usize,
    pub progress: bool,
    /// Sequence models, open loop: sequences live at once (--num-of-sequences).
    pub num_of_sequences: u32,
    /// Sequence models, open loop: one request in flight per sequence.
    pub serial_sequences: bool,
    /// --request-intervals: the open loop's gaps, cycled.
    pub intervals: Option<Arc<[Duration]>>,
    /// --profile-export-file: keep every measured request's times.
    pub profile: bool,
    /// --collect-metrics: between scrapes.
    pub metrics_interval: Duration,
}

/// --profile-export-file's data for one step: the requests that completed
/// in the measured windows (exactly those `requests` counts), and the
/// windows' edges.
#[derive(Debug, Clone, Default)]
pub struct StepProfile {
    pub requests: Vec<RequestRecord>,
    /// Each measured window's start, then the last one's end.
    pub window_boundaries: Vec<Instant>,
}

/// What a target needs besides the load: its request and, when it has the
/// statistics extension, the model to read statistics of.
pub struct TargetRun {
    pub index: usize,
    pub target: Target,
    pub prepared: Arc<Prepared>,
    pub stats_model: Option<(String, String)>,
    /// The model uses the sequence batcher.
    pub sequence: Option<SequenceOptions>,
    /// Next id ordinal per worker: steps continue through the id range
    /// instead of reusing the ids the previous step just ended.
    pub next_ordinal: Arc<AtomicU64>,
    /// --collect-metrics: the server's metrics page.
    pub metrics_url: Option<MetricsUrl>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LatencyUs {
    pub avg: f64,
    pub min: f64,
    pub p50: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
    /// The --percentile value, if one was asked for.
    pub percentile: Option<f64>,
}

/// Server-side averages per request over the measured windows, µs.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ServerBreakdown {
    pub requests: u64,
    pub executions: u64,
    pub queue_us: f64,
    pub compute_input_us: f64,
    pub compute_infer_us: f64,
    pub compute_output_us: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct StepResult {
    pub target: String,
    pub target_index: usize,
    pub protocol: Protocol,
    /// "concurrency" or "request_rate".
    pub mode: &'static str,
    pub load: f64,
    /// Successful inferences per second (requests × batch for batched models).
    pub throughput: f64,
    pub requests_per_second: f64,
    pub requests: u64,
    /// Sequence models: sequences completed (their last request succeeded)
    /// in the measured windows, and per second (perf_analyzer's seq/sec).
    pub sequences: u64,
    pub sequences_per_second: Option<f64>,
    pub errors: u64,
    pub first_error: Option<String>,
    pub measured_seconds: f64,
    pub windows: u32,
    pub stable: bool,
    pub latency_us: LatencyUs,
    /// Responses of the successful requests: more than `requests` for a
    /// decoupled model sending several per request (`--streaming`).
    pub responses: u64,
    pub responses_per_second: f64,
    /// `--streaming`: from sending a request to its first response (the
    /// latency above runs to its final one).
    pub first_response_us: Option<LatencyUs>,
    pub server: Option<ServerBreakdown>,
    /// --profile-export-file only; written to its own file, not the JSON.
    #[serde(skip)]
    pub profile: Option<StepProfile>,
    /// --collect-metrics: the server's metrics over the measured windows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<MetricsSummary>,
}

struct Window {
    start: Instant,
    duration: Duration,
    records: Vec<RequestRecord>,
    latencies: Vec<u64>,
    responses: u64,
    first_response: Vec<u64>,
    errors: u64,
    first_error: Option<String>,
    sequences: u64,
    server: Option<ServerCounters>,
    summary: LatencySummary,
}

impl Window {
    fn throughput(&self) -> f64 {
        self.latencies.len() as f64 / self.duration.as_secs_f64().max(1e-9)
    }
}

fn within(values: &[f64], percent: f64) -> bool {
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    values
        .iter()
        .all(|v| (v - mean).abs() <= mean.abs() * percent / 100.0)
}

fn stable(windows: &[Window], percent: f64) -> bool {
    if windows.len() < STABLE_WINDOWS {
        return false;
    }
    let last = &windows[windows.len() - STABLE_WINDOWS..];
    let thr: Vec<f64> = last.iter().map(Window::throughput).collect();
    let lat: Vec<f64> = last.iter().map(|w| w.summary.headline_ns()).collect();
    within(&thr, percent) && within(&lat, percent)
}

fn progress(plan: &Plan, run: &TargetRun, load: Load, window: u32, thr: f64) {
    if plan.progress {
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\r\x1b[2K[{}] {} {}: window {}/{} {:.0} infer/s",
            run.target.label,
            match load {
                Load::Concurrency(_) => "concurrency",
                Load::Rate(_) => "rate",
            },
            load.value(),
            window,
            plan.max_trials,
            thr
        );
        let _ = err.flush();
    }
}

pub async fn run_step(
    plan: &Plan,
    run: &TargetRun,
    load: Load,
    batch: u32,
) -> anyhow::Result<StepResult> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut n = plan.workers.max(1);
    // Threads with nothing to do are not started: with fewer concurrent
    // requests (or open-loop sequences) than threads, one each.
    match (load, &run.sequence) {
        (Load::Concurrency(c), _) => n = n.min(c.max(1) as usize),
        (Load::Rate(_), Some(_)) => n = n.min(plan.num_of_sequences.max(1) as usize),
        (Load::Rate(_), None) => {}
    }
    let base_ordinal = run.next_ordinal.load(Ordering::Relaxed);
    let mut recorders = Vec::with_capacity(n);
    let mut threads = Vec::with_capacity(n);
    for i in 0..n {
        let worker_load = match load {
            Load::Concurrency(c) => Load::Concurrency(share(u64::from(c), i, n) as u32),
            Load::Rate(r) => Load::Rate(r / n as f64),
        };
        let seed = plan
            .seed
            .wrapping_add(i as u64)
            .wrapping_add(load.value().to_bits());
        let sequence = run.sequence.as_ref().map(|o| WorkerSequences {
            gen: SequenceGen::new(o, i, n, base_ordinal, seed),
            fixed_length: o.fixed_length,
            live: share(u64::from(plan.num_of_sequences), i, n) as usize,
            serial: plan.serial_sequences,
            next_ordinal: run.next_ordinal.clone(),
        });
        let phase = match (load, &plan.intervals) {
            // Worker i sends requests i, i + n, ...: its first at the sum
            // of the gaps before request i.
            (Load::Rate(_), Some(gaps)) => (0..i).map(|k| gaps[k % gaps.len()]).sum(),
            (Load::Rate(r), None) => Duration::from_secs_f64(i as f64 / r),
            (Load::Concurrency(_), _) => Duration::ZERO,
        };
        let recorder = Arc::new(Recorder::new(plan.profile));
        recorders.push(recorder.clone());
        let spec = WorkerSpec {
            index: i,
            target: run.target.clone(),
            prepared: run.prepared.clone(),
            load: worker_load,
            phase,
            distribution: plan.distribution,
            seed,
            max_outstanding: plan.max_outstanding,
            connections: plan.connections,
            cpu: plan.cpus.as_ref().map(|c| c[i % c.len()]),
            busy_poll: plan.busy_poll,
            direct: plan.direct,
            stop: stop.clone(),
            recorder,
            sequence,
            intervals: plan.intervals.clone().map(|gaps| (gaps, n)),
        };
        let spawned = if direct::applies(&spec) {
            direct::spawn(spec)
        } else {
            load::spawn(spec)
        };
        match spawned {
            Ok(t) => threads.push(t),
            Err(e) => {
                stop.store(true, Ordering::Relaxed);
                return Err(anyhow!("cannot start a load thread: {e}"));
            }
        }
    }
    let result = measure(plan, run, load, batch, &recorders).await;
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        if t.join().is_err() {
            tracing::warn!("bench: a load thread panicked");
        }
    }
    if plan.progress {
        eprint!("\r\x1b[2K");
    }
    result
}

async fn measure(
    plan: &Plan,
    run: &TargetRun,
    load: Load,
    batch: u32,
    recorders: &[Arc<Recorder>],
) -> anyhow::Result<StepResult> {
    let completed = || recorders.iter().map(|r| r.completed()).sum::<u64>();
    monoio::time::sleep(plan.warmup).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while completed() < plan.warmup_requests && Instant::now() < deadline {
        monoio::time::sleep(Duration::from_millis(5)).await;
    }
    let counters = || async {
        match &run.stats_model {
            Some((m, v)) => probe::server_counters(&run.target, m, v).await,
            None => None,
        }
    };
    let mut before = counters().await;
    // Its first scrape is in before the windows start, its last after they
    // end, so its deltas cover every measured window.
    let scraper = match &run.metrics_url {
        Some(url) => Some(Scraper::start(url, plan.metrics_interval)?),
        None => None,
    };
    recorders.iter().for_each(|r| drop(r.take()));
    let mut windows: Vec<Window> = Vec::new();
    let mut t0 = Instant::now();
    while windows.len() < plan.max_trials as usize {
        match plan.mode {
            MeasurementMode::TimeWindows => monoio::time::sleep(plan.interval).await,
            MeasurementMode::CountWindows => {
                let base = completed();
                // At least one interval, and a cap so a dead server cannot stall the step.
                let cap = t0 + plan.interval.max(Duration::from_secs(1)) * 20;
                monoio::time::sleep(Duration::from_millis(1)).await;
                while completed() - base < plan.request_count && Instant::now() < cap {
                    monoio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        }
        let t1 = Instant::now();
        let mut latencies = Vec::new();
        let mut responses = 0;
        let mut first_response = Vec::new();
        let mut errors = 0;
        let mut sequences = 0;
        let mut first_error = None;
        let mut records = Vec::new();
        for r in recorders {
            let b = r.take();
            latencies.extend_from_slice(&b.latencies);
            records.extend_from_slice(&b.records);
            responses += b.responses;
            first_response.extend_from_slice(&b.first_response);
            errors += b.errors;
            sequences += b.sequences;
            if first_error.is_none() {
                first_error = b.first_error;
            }
        }
        let after = counters().await;
        let server = match (&before, &after) {
            (Some(b), Some(a)) => Some(a.delta(b)),
            _ => None,
        };
        before = after;
        let summary = LatencySummary::from_samples(&mut latencies, plan.percentile);
        let w = Window {
            start: t0,
            duration: t1 - t0,
            records,
            latencies,
            responses,
            first_response,
            errors,
            first_error,
            sequences,
            server,
            summary,
        };
        t0 = Instant::now();
        // A window in which nothing succeeded measures nothing: perf_analyzer
        // stops at a failed request with the server's reason, and so do we
        // rather than report zeros that look stable.
        if w.latencies.is_empty() && w.errors > 0 {
            return Err(anyhow!(
                "{} at {} {}: all {} requests of a {:.0} ms window failed; first error: {}",
                run.target.label,
                match load {
                    Load::Concurrency(_) => "concurrency",
                    Load::Rate(_) => "request rate",
                },
                load.value(),
                w.errors,
                w.duration.as_secs_f64() * 1000.0,
                w.first_error.as_deref().unwrap_or("(no reason given)")
            ));
        }
        progress(plan, run, load, windows.len() as u32 + 1, w.throughput());
        windows.push(w);
        if stable(&windows, plan.stability_percent) {
            break;
        }
    }
    let metrics = scraper.map(Scraper::finish);
    let is_stable = stable(&windows, plan.stability_percent);
    let used = &windows[windows.len().saturating_sub(STABLE_WINDOWS)..];
    let mut result = summarise(
        run,
        load,
        batch,
        used,
        windows.len() as u32,
        is_stable,
        plan.percentile,
    );
    if plan.profile {
        result.profile = Some(step_profile(used));
    }
    result.metrics = metrics;
    Ok(result)
}

fn step_profile(used: &[Window]) -> StepProfile {
    let mut requests: Vec<RequestRecord> = used
        .iter()
        .flat_map(|w| w.records.iter().copied())
        .collect();
    // Completion order interleaves the worker threads; the export lists
    // requests as sent.
    requests.sort_by_key(|r| r.sent);
    let mut window_boundaries: Vec<Instant> = used.iter().map(|w| w.start).collect();
    if let Some(last) = used.last() {
        window_boundaries.push(last.start + last.duration);
    }
    StepProfile {
        requests,
        window_boundaries,
    }
}

fn summarise(
    run: &TargetRun,
    load: Load,
    batch: u32,
    used: &[Window],
    windows: u32,
    stable: bool,
    percentile: Option<u8>,
) -> StepResult {
    let mut latencies: Vec<u64> = used
        .iter()
        .flat_map(|w| w.latencies.iter().copied())
        .collect();
    let s = LatencySummary::from_samples(&mut latencies, percentile);
    let secs: f64 = used.iter().map(|w| w.duration.as_secs_f64()).sum();
    let responses: u64 = used.iter().map(|w| w.responses).sum();
    let mut first: Vec<u64> = used
        .iter()
        .flat_map(|w| w.first_response.iter().copied())
        .collect();
    let first_response_us = (!first.is_empty())
        .then(|| latency_us(&LatencySummary::from_samples(&mut first, percentile)));
    let requests = s.count;
    let rps = requests as f64 / secs.max(1e-9);
    let server = if used.iter().all(|w| w.server.is_some()) {
        let mut total = ServerCounters::default();
        used.iter()
            .filter_map(|w| w.server.as_ref())
            .for_each(|c| total.add(c));
        let per = |ns: u64| {
            if total.success_count == 0 {
                0.0
            } else {
                us(ns as f64 / total.success_count as f64)
            }
        };
        Some(ServerBreakdown {
            requests: total.success_count,
            executions: total.execution_count,
            queue_us: per(total.queue_ns),
            compute_input_us: per(total.compute_input_ns),
            compute_infer_us: per(total.compute_infer_ns),
            compute_output_us: per(total.compute_output_ns),
        })
    } else {
        None
    };
    StepResult {
        target: run.target.label.clone(),
        target_index: run.index,
        protocol: run.target.protocol,
        mode: match load {
            Load::Concurrency(_) => "concurrency",
            Load::Rate(_) => "request_rate",
        },
        load: load.value(),
        throughput: rps * f64::from(batch),
        requests_per_second: rps,
        requests,
        sequences: used.iter().map(|w| w.sequences).sum(),
        sequences_per_second: run
            .sequence
            .as_ref()
            .map(|_| used.iter().map(|w| w.sequences).sum::<u64>() as f64 / secs.max(1e-9)),
        errors: used.iter().map(|w| w.errors).sum(),
        first_error: used.iter().find_map(|w| w.first_error.clone()),
        measured_seconds: secs,
        windows,
        stable,
        latency_us: latency_us(&s),
        responses,
        responses_per_second: responses as f64 / secs.max(1e-9),
        first_response_us,
        server,
        profile: None,
        metrics: None,
    }
}

fn latency_us(s: &LatencySummary) -> LatencyUs {
    LatencyUs {
        avg: us(s.avg_ns),
        min: us(s.min_ns as f64),
        p50: us(s.p50_ns as f64),
        p90: us(s.p90_ns as f64),
        p95: us(s.p95_ns as f64),
        p99: us(s.p99_ns as f64),
        max: us(s.max_ns as f64),
        percentile: s.custom.map(|(_, v)| us(v as f64)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(thr: usize, lat: u64) -> Window {
        let mut latencies = vec![lat; thr];
        let summary = LatencySummary::from_samples(&mut latencies, None);
        Window {
            start: Instant::now(),
            duration: Duration::from_secs(1),
            records: Vec::new(),
            latencies,
            responses: thr as u64,
            first_response: Vec::new(),
            errors: 0,
            first_error: None,
            sequences: 0,
            server: None,
            summary,
        }
    }

    #[test]
    fn stability_rule() {
        let w = vec![
            window(100, 10),
            window(1000, 10),
            window(1000, 10),
            window(1050, 11),
        ];
        assert!(stable(&w, 10.0));
        assert!(!stable(&w[..3], 10.0), "first window is far off");
        assert!(!stable(&w[1..3], 10.0), "needs three windows");
        let noisy = vec![window(1000, 10), window(1000, 20), window(1000, 10)];
        assert!(!stable(&noisy, 10.0));
        let dead = vec![window(0, 0), window(0, 0), window(0, 0)];
        assert!(stable(&dead, 10.0));
    }
}
