//! Prometheus text exposition with Triton's metric names and labels, plus
//! our per-shard gauges under `shardserve_`.

use std::fmt::Write;

use super::{
    counters::FailureReason,
    host::{cpu_utilization, meminfo},
    ShardGauges,
};
use crate::model::{ModelState, ModelTable};

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

/// Renders every metric. Reads only atomics, the table snapshot and the
/// GPU collector's latest readings.
pub fn render(table: &ModelTable, shards: &[ShardGauges]) -> String {
    let mut out = String::with_capacity(8192);
    let mut f = Family { out: &mut out };
    let versions: Vec<_> = table
        .models
        .values()
        .flat_map(|e| e.versions.values())
        .filter(|v| v.state == ModelState::Ready)
        .filter_map(|v| v.loaded.clone())
        .map(|m| {
            let labels = format!("model=\"{}\",version=\"{}\"", escape(&m.name), m.version);
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
    for (name, help, pick) in counters {
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
    f.header(
        "nv_inference_pending_request_count",
        "gauge",
        "Instantaneous number of pending requests awaiting execution per-model.",
    );
    for (labels, s) in &versions {
        f.sample("nv_inference_pending_request_count", labels, s.pending);
    }

    if let Some(u) = cpu_utilization() {
        f.header(
            "nv_cpu_utilization",
            "gauge",
            "CPU utilization rate [0.0 - 1.0]",
        );
        f.sample("nv_cpu_utilization", "", format!("{u:.6}"));
    }
    if let Some((total, available)) = meminfo() {
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
        f.sample(
            "nv_cpu_memory_used_bytes",
            "",
            total.saturating_sub(available),
        );
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
    if let Some(readings) = super::gpu::latest() {
        out.push_str(&super::gpu::render(&readings));
    }
    out
}
