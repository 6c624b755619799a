//! Prometheus text exposition with Triton's metric names and labels, plus
//! our per-shard gauges under `shardserve_`.

use std::fmt::Write;

use super::{
    config::{MetricsConfig, Quantile},
    counters::{FailureReason, Summaries},
    ShardGauges,
};
use crate::model::{ModelState, ModelTable};

/// What one server's metrics port shows (`--allow-cpu-metrics`,
/// `--allow-gpu-metrics`, `--metrics-config`).
#[derive(Debug, Clone, PartialEq)]
pub struct Exposition {
    pub cpu: bool,
    pub gpu: bool,
    pub config: MetricsConfig,
}

impl Default for Exposition {
    fn default() -> Self {
        Self {
            cpu: true,
            gpu: true,
            config: MetricsConfig::default(),
        }
    }
}

/// The summary families, in the order of [`Summaries`].
const SUMMARY_FAMILIES: [(&str, &str); 5] = [
    ("nv_inference_request_summary_us", "Summary of inference request duration in microseconds (includes cached requests)"),
    ("nv_inference_queue_summary_us", "Summary of inference queuing duration in microseconds (includes cached requests)"),
    ("nv_inference_compute_input_summary_us", "Cumulative compute input duration in microseconds (does not include cached requests)"),
    ("nv_inference_compute_infer_summary_us", "Cumulative compute inference duration in microseconds (does not include cached requests)"),
    ("nv_inference_compute_output_summary_us", "Cumulative inference compute output duration in microseconds (does not include cached requests)"),
];

struct Family<'a> {
    out: &'a mut String,
}

impl Family<'_> {
    fn header(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }
    fn sample(&mut self, name: &str, labels: &str, value: impl std::fmt::Display) {
        if labels.is_empty() {
            let _ = writeln!(self.out, "{name} {value}");
        } else {
            let _ = writeln!(self.out, "{name}{{{labels}}} {value}");
        }
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Renders every metric. Reads only atomics, the table snapshot, the
/// latest host and GPU readings and (with summaries on) each model's
/// latency windows.
pub fn render(table: &ModelTable, shards: &[ShardGauges], show: &Exposition) -> String {
    let mut out = String::with_capacity(8192);
    let mut f = Family { out: &mut out };
    let loaded: Vec<_> = table
        .models
        .values()
        .flat_map(|e| e.versions.values())
        .filter(|v| v.state == ModelState::Ready)
        .filter_map(|v| v.loaded.clone())
        .collect();
    let versions: Vec<_> = loaded
        .iter()
        .map(|m| {
            // Under namespacing Triton labels each model family with the
            // model's repository.
            let labels = match &m.namespace {
                Some(ns) => format!(
                    "model=\"{}\",namespace=\"{}\",version=\"{}\"",
                    escape(&m.name),
                    escape(ns),
                    m.version
                ),
                None => format!("model=\"{}\",version=\"{}\"", escape(&m.name), m.version),
            };
            (labels, m.stats.snapshot())
        })
        .collect();

    type Pick = fn(&super::counters::StatsSnapshot) -> u64;
    let counters: [(&str, &str, Pick); 8] = [
        ("nv_inference_request_success", "Number of successful inference requests, all batch sizes", |s| s.success.count),
        ("nv_inference_count", "Number of inferences performed (does not include cached requests)", |s| s.inference_count),
        ("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)", |s| s.execution_count),
        ("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds (includes cached requests)", |s| (s.success.ns + s.fail.ns) / 1000),
        ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds (includes cached requests)", |s| s.queue.ns / 1000),
        ("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds (does not include cached requests)", |s| s.compute_input.ns / 1000),
        ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds (does not include cached requests)", |s| s.compute_infer.ns / 1000),
        ("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds (does not include cached requests)", |s| s.compute_output.ns / 1000),
    ];
    // `counter_latencies=false` drops the five latency counters.
    let latency = |name: &str| name.ends_with("_duration_us");
    for (name, help, pick) in counters {
        if latency(name) && !show.config.counter_latencies {
            continue;
        }
        f.header(name, "counter", help);
        for (labels, s) in &versions {
            f.sample(name, labels, pick(s));
        }
        if name == "nv_inference_request_success" {
            f.header(
                "nv_inference_request_failure",
                "counter",
                "Number of failed inference requests, all batch sizes",
            );
            for (labels, s) in &versions {
                for r in FailureReason::ALL {
                    let l = format!("{labels},reason=\"{}\"", r.label());
                    f.sample(
                        "nv_inference_request_failure",
                        &l,
                        s.fail_by_reason[r as usize],
                    );
                }
            }
        }
    }
    // issue 24: response cache. As Triton, only the versions that use the
    // cache have these, and only with the latency counters on.
    let cached: Vec<_> = loaded
        .iter()
        .zip(&versions)
        .filter(|(m, _)| m.response_cache.is_some())
        .map(|(_, v)| v)
        .collect();
    if show.config.counter_latencies && !cached.is_empty() {
        type CachePick = fn(&super::counters::StatsSnapshot) -> u64;
        let families: [(&str, &str, CachePick); 4] = [
            (
                "nv_cache_num_hits_per_model",
                "Number of cache hits per model",
                |s| s.cache_hit.count,
            ),
            (
                "nv_cache_hit_duration_per_model",
                "Total cache hit duration per model, in microseconds",
                |s| s.cache_hit.ns / 1000,
            ),
            (
                "nv_cache_num_misses_per_model",
                "Number of cache misses per model",
                |s| s.cache_miss.count,
            ),
            (
                "nv_cache_miss_duration_per_model",
                "Total cache miss (insert+lookup) duration per model, in microseconds",
                |s| s.cache_miss.ns / 1000,
            ),
        ];
        for (name, help, pick) in families {
            f.header(name, "counter", help);
            for (labels, s) in &cached {
                f.sample(name, labels, pick(s));
            }
        }
    }
    f.header(
        "nv_inference_pending_request_count",
        "gauge",
        "Instantaneous number of pending requests awaiting execution per-model.",
    );
    for (labels, s) in &versions {
        f.sample("nv_inference_pending_request_count", labels, s.pending);
    }

    let host = super::host::latest();
    f.header(
        "nv_pinned_memory_pool_total_bytes",
        "gauge",
        "Pinned memory pool total memory size, in bytes",
    );
    f.sample("nv_pinned_memory_pool_total_bytes", "", host.pinned.0);
    f.header(
        "nv_pinned_memory_pool_used_bytes",
        "gauge",
        "Pinned memory pool used memory size, in bytes",
    );
    f.sample("nv_pinned_memory_pool_used_bytes", "", host.pinned.1);
    if show.cpu {
        if let Some(u) = host.cpu_utilization {
            f.header(
                "nv_cpu_utilization",
                "gauge",
                "CPU utilization rate [0.0 - 1.0]",
            );
            f.sample("nv_cpu_utilization", "", format!("{u:.6}"));
        }
        if let Some((total, used)) = host.memory {
            f.header(
                "nv_cpu_memory_total_bytes",
                "gauge",
                "CPU total memory (RAM), in bytes",
            );
            f.sample("nv_cpu_memory_total_bytes", "", total);
            f.header(
                "nv_cpu_memory_used_bytes",
                "gauge",
                "CPU used memory (RAM), in bytes",
            );
            f.sample("nv_cpu_memory_used_bytes", "", used);
        }
    }
    if show.config.summary_latencies {
        let summaries: Vec<(String, Summaries)> = loaded
            .iter()
            .zip(&versions)
            .filter_map(|(m, (labels, _))| Some((labels.clone(), m.stats.summaries()?)))
            .collect();
        render_summaries(&mut f, summaries, &show.config.summary_quantiles);
    }

    f.header(
        "shardserve_shard_connections",
        "gauge",
        "Open client connections owned by the shard",
    );
    for (i, g) in shards.iter().enumerate() {
        f.sample(
            "shardserve_shard_connections",
            &format!("shard=\"{i}\""),
            g.connections(),
        );
    }
    f.header(
        "shardserve_shard_in_flight_requests",
        "gauge",
        "Requests received by the shard and not yet answered",
    );
    for (i, g) in shards.iter().enumerate() {
        f.sample(
            "shardserve_shard_in_flight_requests",
            &format!("shard=\"{i}\""),
            g.in_flight(),
        );
    }
    f.header(
        "shardserve_shard_queue_depth",
        "gauge",
        "Requests queued on the shard's model instances",
    );
    for (i, g) in shards.iter().enumerate() {
        f.sample(
            "shardserve_shard_queue_depth",
            &format!("shard=\"{i}\""),
            g.queue_depth(),
        );
    }
    f.header(
        "shardserve_ring_occupancy",
        "gauge",
        "Messages in the ring from one shard to another, as of the last push",
    );
    for (from, g) in shards.iter().enumerate() {
        for (to, occ) in g.ring_occupancy().iter().enumerate() {
            if from != to {
                f.sample(
                    "shardserve_ring_occupancy",
                    &format!("from=\"{from}\",to=\"{to}\""),
                    occ,
                );
            }
        }
    }
    f.header(
        "shardserve_forwarded_requests_total",
        "counter",
        "Requests received by one shard and executed by an instance on another",
    );
    for (from, g) in shards.iter().enumerate() {
        for (to, n) in g.forwarded().iter().enumerate() {
            if from != to {
                f.sample(
                    "shardserve_forwarded_requests_total",
                    &format!("from=\"{from}\",to=\"{to}\""),
                    n,
                );
            }
        }
    }
    super::custom::render(&mut out);
    let readings = super::gpu::latest();
    out.push_str(&gpu_families(
        show.gpu,
        readings.as_deref().map(Vec::as_slice),
    ));
    out
}

/// The GPU families of the collector's latest readings, if shown.
fn gpu_families(show: bool, readings: Option<&[super::gpu::GpuReading]>) -> String {
    match readings {
        Some(r) if show => super::gpu::render(r),
        _ => String::new(),
    }
}

/// The `nv_inference_*_summary_us` families as prometheus-cpp writes a
/// summary: `_count`, `_sum`, then one sample per quantile (`Nan` when the
/// last minute saw nothing).
fn render_summaries(
    f: &mut Family<'_>,
    mut models: Vec<(String, Summaries)>,
    quantiles: &[Quantile],
) {
    for (i, (name, help)) in SUMMARY_FAMILIES.iter().enumerate() {
        f.header(name, "summary", help);
        for (labels, summaries) in &mut models {
            let s = &mut summaries[i];
            f.sample(&format!("{name}_count"), labels, s.count);
            f.sample(&format!("{name}_sum"), labels, s.sum_us);
            for q in quantiles {
                let l = format!("{labels},quantile=\"{}\"", q.quantile);
                match s.quantile(q.quantile) {
                    Some(v) => f.sample(name, &l, v),
                    None => f.sample(name, &l, "Nan"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::gpu::GpuReading;

    #[test]
    fn gpu_and_cpu_families_follow_their_switches() {
        let readings = [GpuReading {
            uuid: "GPU-test".into(),
            utilization: Some(0.25),
            memory_total_bytes: Some(1 << 30),
            memory_used_bytes: Some(1 << 20),
            power_watts: None,
            power_limit_watts: None,
            energy_joules: None,
        }];
        let gpus = gpu_families(true, Some(&readings));
        assert!(
            gpus.contains("nv_gpu_utilization{gpu_uuid=\"GPU-test\"}"),
            "{gpus}"
        );
        assert_eq!(gpu_families(false, Some(&readings)), "");
        let table = ModelTable::default();
        let all = render(&table, &[], &Exposition::default());
        assert!(all.contains("nv_cpu_memory_total_bytes "));
        assert!(all.contains("nv_pinned_memory_pool_total_bytes "));
        let none = render(
            &table,
            &[],
            &Exposition {
                cpu: false,
                gpu: false,
                config: MetricsConfig::default(),
            },
        );
        assert!(!none.contains("nv_cpu_"), "{none}");
        assert!(none.contains("nv_pinned_memory_pool_used_bytes "));
    }
}
