//! Outputs: the terminal table, perf_analyzer's CSV, JSON, an SVG plot of
//! latency against throughput, and the ratios between targets.

use std::{fmt::Write as _, path::Path};

use anyhow::Context;
use serde::Serialize;
use serde_json::json;

use super::measure::StepResult;

pub const CSV_COLUMNS: [&str; 16] = [
    "Concurrency",
    "Inferences/Second",
    "Client Send",
    "Network+Server Send/Recv",
    "Server Queue",
    "Server Compute Input",
    "Server Compute Infer",
    "Server Compute Output",
    "Client Recv",
    "p50 latency",
    "p90 latency",
    "p95 latency",
    "p99 latency",
    "Avg latency",
    "request/response",
    "response wait",
];

/// `sequences`: a sequence model, with a Seq/s column after Infer/s.
pub fn table_header(multi: bool, rate: bool, sequences: bool) -> String {
    format!(
        "{}{:>11} {:>11}{} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>9} {:>9}  {}",
        if multi {
            format!("{:<24}", "Target")
        } else {
            String::new()
        },
        if rate { "Rate" } else { "Concurrency" },
        "Infer/s",
        if sequences {
            format!(" {:>9}", "Seq/s")
        } else {
            String::new()
        },
        "Avg us",
        "p50 us",
        "p90 us",
        "p95 us",
        "p99 us",
        "Errors",
        "Srv queue",
        "Srv infer",
        "Stable"
    )
}

pub fn table_row(r: &StepResult, multi: bool) -> String {
    let l = &r.latency_us;
    let (q, inf) = r.server.as_ref().map_or(("-".into(), "-".into()), |s| {
        (
            format!("{:.1}", s.queue_us),
            format!("{:.1}", s.compute_infer_us),
        )
    });
    let mut row = format!(
        "{}{:>11} {:>11.1}{} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>8} {:>9} {:>9}  {}",
        if multi {
            format!("{:<24}", truncate(&r.target, 23))
        } else {
            String::new()
        },
        fmt_load(r.load),
        r.throughput,
        r.sequences_per_second
            .map_or(String::new(), |s| format!(" {s:>9.1}")),
        l.avg,
        l.p50,
        l.p90,
        l.p95,
        l.p99,
        r.errors,
        q,
        inf,
        if r.stable { "yes" } else { "no" }
    );
    if let Some(first) = &r.first_response_us {
        // A stream's requests end at their final response (the latencies
        // above); a decoupled model may send many responses per request.
        let _ = write!(
            row,
            "\n    stream: {:.1} requests/s, {:.1} responses/s ({:.2} per request), first response p50 {:.1} us p99 {:.1} us",
            r.requests_per_second,
            r.responses_per_second,
            r.responses as f64 / r.requests.max(1) as f64,
            first.p50,
            first.p99
        );
    }
    if let Some(e) = &r.first_error {
        let _ = write!(row, "\n    first error: {}", truncate(e, 200));
    }
    row
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars()
            .take(n.saturating_sub(1))
            .chain(std::iter::once('…'))
            .collect()
    }
}

pub fn fmt_load(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// perf_analyzer's CSV (latencies in µs). With `server_column` (several
/// targets, `--compare`) every row ends with a "Server" column naming its
/// target, so one file holds every server's rows and the first 16 columns
/// keep perf_analyzer's positions.
pub fn csv(results: &[&StepResult], rate: bool, server_column: bool) -> String {
    let mut out = String::new();
    let mut cols = CSV_COLUMNS;
    if rate {
        cols[0] = "Request Rate";
    }
    out.push_str(&cols.join(","));
    if server_column {
        out.push_str(",Server");
    }
    // --collect-metrics: perf_analyzer's GPU columns where the server
    // reports GPUs, and the CPU's where it reports that; after the others,
    // so their positions do not move.
    let gpu = results
        .iter()
        .any(|r| r.metrics.as_ref().is_some_and(|m| !m.gpus.is_empty()));
    let cpu = results.iter().any(|r| {
        r.metrics
            .as_ref()
            .is_some_and(|m| m.avg_cpu_utilization.is_some())
    });
    if gpu {
        out.push_str(
            ",Avg GPU Utilization,Avg GPU Power Usage,Max GPU Memory Usage,Total GPU Memory",
        );
    }
    if cpu {
        out.push_str(",Avg CPU Utilization");
    }
    out.push('\n');
    for r in results {
        let l = &r.latency_us;
        let (q, ci, inf, co, net) = match &r.server {
            Some(s) => {
                let server =
                    s.queue_us + s.compute_input_us + s.compute_infer_us + s.compute_output_us;
                (
                    s.queue_us,
                    s.compute_input_us,
                    s.compute_infer_us,
                    s.compute_output_us,
                    (l.avg - server).max(0.0),
                )
            }
            None => (0.0, 0.0, 0.0, 0.0, 0.0),
        };
        let i = |v: f64| format!("{}", v.round() as u64);
        let fields = [
            fmt_load(r.load),
            format!("{:.2}", r.throughput),
            "0".into(),
            i(net),
            i(q),
            i(ci),
            i(inf),
            i(co),
            "0".into(),
            i(l.p50),
            i(l.p90),
            i(l.p95),
            i(l.p99),
            i(l.avg),
            "0".into(),
            "0".into(),
        ];
        out.push_str(&fields.join(","));
        if server_column {
            out.push(',');
            out.push_str(&csv_field(&r.target));
        }
        if gpu {
            // perf_analyzer's form: `uuid:value;` for each GPU.
            let per_gpu = |pick: fn(&crate::bench::metrics::GpuMetrics) -> Option<f64>| {
                let mut f = String::new();
                for g in r.metrics.iter().flat_map(|m| &m.gpus) {
                    if let Some(v) = pick(g) {
                        let _ = write!(f, "{}:{v};", g.uuid);
                    }
                }
                csv_field(&f)
            };
            for field in [
                per_gpu(|g| g.avg_utilization),
                per_gpu(|g| g.avg_power_watts),
                per_gpu(|g| g.max_memory_used_bytes),
                per_gpu(|g| g.total_memory_bytes),
            ] {
                out.push(',');
                out.push_str(&field);
            }
        }
        if cpu {
            out.push(',');
            if let Some(u) = r.metrics.as_ref().and_then(|m| m.avg_cpu_utilization) {
                let _ = write!(out, "{u:.4}");
            }
        }
        out.push('\n');
    }
    out
}

/// One target's result at one step relative to the first target's.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    pub load: f64,
    pub target: String,
    pub baseline: String,
    pub throughput: f64,
    pub p50: f64,
    pub p99: f64,
}

pub fn ratios(results: &[StepResult]) -> Vec<Ratio> {
    let div = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
    let mut out = Vec::new();
    for base in results.iter().filter(|r| r.target_index == 0) {
        for other in results
            .iter()
            .filter(|r| r.target_index != 0 && r.load == base.load)
        {
            out.push(Ratio {
                load: base.load,
                target: other.target.clone(),
                baseline: base.target.clone(),
                throughput: div(other.throughput, base.throughput),
                p50: div(other.latency_us.p50, base.latency_us.p50),
                p99: div(other.latency_us.p99, base.latency_us.p99),
            });
        }
    }
    out
}

pub fn ratio_table(ratios: &[Ratio]) -> String {
    let mut out = String::new();
    if let Some(first) = ratios.first() {
        let _ = writeln!(
            out,
            "\nRatios to {} (throughput higher is better, latency lower is better):",
            first.baseline
        );
        let _ = writeln!(
            out,
            "{:<24}{:>11} {:>9} {:>9} {:>9}",
            "Target", "Load", "Infer/s", "p50", "p99"
        );
        for r in ratios {
            let _ = writeln!(
                out,
                "{:<24}{:>11} {:>8.2}x {:>8.2}x {:>8.2}x",
                truncate(&r.target, 23),
                fmt_load(r.load),
                r.throughput,
                r.p50,
                r.p99
            );
        }
    }
    out
}

#[derive(Serialize)]
pub struct RunInfo<'a> {
    pub model: &'a str,
    pub model_version: &'a str,
    pub batch_size: u32,
    pub mode: &'a str,
    pub measurement_interval_ms: u64,
    pub measurement_mode: &'a str,
    pub stability_percentage: f64,
    pub max_trials: u32,
    pub threads: usize,
}

pub fn json_report(
    info: &RunInfo,
    targets: &[serde_json::Value],
    results: &[StepResult],
    ratios: &[Ratio],
) -> serde_json::Value {
    json!({
        "tool": "shardserve-bench",
        "version": env!("CARGO_PKG_VERSION"),
        "run": info,
        "targets": targets,
        "steps": results,
        "ratios": ratios,
    })
}

const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];

/// Latency (p50 solid, p99 dashed) against throughput, one colour per target.
pub fn svg(results: &[StepResult], labels: &[String]) -> String {
    let (w, h, ml, mr, mt, mb) = (820.0, 520.0, 80.0, 30.0, 40.0, 60.0);
    let max_x = results
        .iter()
        .map(|r| r.throughput)
        .fold(0.0, f64::max)
        .max(1.0)
        * 1.05;
    let max_y = results
        .iter()
        .map(|r| r.latency_us.p99)
        .fold(0.0, f64::max)
        .max(1.0)
        * 1.05;
    let x = |v: f64| ml + v / max_x * (w - ml - mr);
    let y = |v: f64| h - mb - v / max_y * (h - mt - mb);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">Latency vs throughput (p50 solid, p99 dashed)</text>"#,
        w / 2.0
    );
    for i in 0..=5 {
        let fx = max_x * f64::from(i) / 5.0;
        let fy = max_y * f64::from(i) / 5.0;
        let _ = writeln!(
            s,
            r##"<line x1="{0}" y1="{1}" x2="{0}" y2="{2}" stroke="#ddd"/><text x="{0}" y="{3}" text-anchor="middle">{4:.0}</text>"##,
            x(fx),
            mt,
            h - mb,
            h - mb + 18.0,
            fx
        );
        let _ = writeln!(
            s,
            r##"<line x1="{0}" y1="{1}" x2="{2}" y2="{1}" stroke="#ddd"/><text x="{3}" y="{4}" text-anchor="end">{5:.0}</text>"##,
            ml,
            y(fy),
            w - mr,
            ml - 6.0,
            y(fy) + 4.0,
            fy
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">throughput (infer/s)</text>"#,
        (ml + w - mr) / 2.0,
        h - 15.0
    );
    let _ = writeln!(
        s,
        r#"<text x="18" y="{}" text-anchor="middle" transform="rotate(-90 18 {})">latency (µs)</text>"#,
        (mt + h - mb) / 2.0,
        (mt + h - mb) / 2.0
    );
    for (t, label) in labels.iter().enumerate() {
        let color = COLORS[t % COLORS.len()];
        let mut pts: Vec<&StepResult> = results.iter().filter(|r| r.target_index == t).collect();
        pts.sort_by(|a, b| a.load.total_cmp(&b.load));
        for (dash, get) in [
            (
                "",
                (|r: &StepResult| r.latency_us.p50) as fn(&StepResult) -> f64,
            ),
            ("6,4", |r: &StepResult| r.latency_us.p99),
        ] {
            let line: Vec<String> = pts
                .iter()
                .map(|r| format!("{:.1},{:.1}", x(r.throughput), y(get(r))))
                .collect();
            let _ = writeln!(
                s,
                r#"<polyline fill="none" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}" points="{}"/>"#,
                line.join(" ")
            );
            for r in &pts {
                let _ = writeln!(
                    s,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"><title>{} {}: {:.0} infer/s, {:.0} µs</title></circle>"#,
                    x(r.throughput),
                    y(get(r)),
                    r.mode,
                    r.load,
                    r.throughput,
                    get(r)
                );
            }
        }
        let ly = mt + 10.0 + 18.0 * t as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="2"/><text x="{}" y="{}">{}</text>"#,
            ml + 10.0,
            ml + 35.0,
            ml + 40.0,
            ly + 4.0,
            xml_escape(label)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

pub fn write_file(path: &Path, content: &str) -> anyhow::Result<()> {
    std::fs::write(path, content).with_context(|| format!("cannot write '{}'", path.display()))
}

/// A CSV field, quoted when it holds a separator or a quote (a target
/// label such as `host:8001,grpc` does).
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::{
        cli::Protocol,
        measure::{LatencyUs, ServerBreakdown},
    };

    fn result(target_index: usize, load: f64, thr: f64, p50: f64) -> StepResult {
        StepResult {
            target: format!("t{target_index}"),
            target_index,
            protocol: Protocol::Http,
            mode: "concurrency",
            load,
            throughput: thr,
            requests_per_second: thr,
            requests: 10,
            sequences: 0,
            sequences_per_second: None,
            responses: 10,
            responses_per_second: thr,
            first_response_us: None,
            errors: 0,
            first_error: None,
            measured_seconds: 1.0,
            windows: 3,
            stable: true,
            latency_us: LatencyUs {
                avg: 100.0,
                min: 1.0,
                p50,
                p90: 120.0,
                p95: 130.0,
                p99: 200.0,
                max: 300.0,
                percentile: None,
            },
            server: Some(ServerBreakdown {
                requests: 10,
                executions: 10,
                queue_us: 5.0,
                compute_input_us: 1.0,
                compute_infer_us: 10.0,
                compute_output_us: 2.0,
            }),
            profile: None,
            metrics: None,
        }
    }

    #[test]
    fn csv_has_perf_analyzer_columns() {
        let r = result(0, 4.0, 1234.5, 90.0);
        let text = csv(&[&r], false, false);
        let mut lines = text.lines();
        assert_eq!(lines.next().unwrap(), CSV_COLUMNS.join(","));
        let row: Vec<&str> = lines.next().unwrap().split(',').collect();
        assert_eq!(row.len(), 16);
        assert_eq!(row[0], "4");
        assert_eq!(row[1], "1234.50");
        assert_eq!(row[3], "82", "avg minus server-side total");
        assert_eq!(row[4], "5");
        assert_eq!(row[9], "90");
        assert_eq!(row[13], "100");
        assert!(csv(&[&r], true, false).starts_with("Request Rate,Inferences/Second,"));
    }

    #[test]
    fn compare_csv_holds_every_servers_rows() {
        let mut a = result(0, 1.0, 100.0, 50.0);
        a.target = "127.0.0.1:8000".into();
        let mut b = result(1, 1.0, 300.0, 25.0);
        b.target = "127.0.0.1:8001,grpc".into();
        let text = csv(&[&a, &b], false, true);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].ends_with(",Avg latency,request/response,response wait,Server"));
        assert!(lines[1].ends_with(",127.0.0.1:8000"), "{}", lines[1]);
        assert!(
            lines[2].ends_with(",\"127.0.0.1:8001,grpc\""),
            "{}",
            lines[2]
        );
        assert_eq!(csv_field("a\"b"), "\"a\"\"b\"");
    }

    #[test]
    fn ratios_and_plot() {
        let rs = vec![result(0, 1.0, 100.0, 50.0), result(1, 1.0, 300.0, 25.0)];
        let r = ratios(&rs);
        assert_eq!(r.len(), 1);
        assert!((r[0].throughput - 3.0).abs() < 1e-9);
        assert!((r[0].p50 - 0.5).abs() < 1e-9);
        assert!(ratio_table(&r).contains("3.00x"));
        let svg = svg(&rs, &["a<b".into(), "c".into()]);
        assert!(
            svg.starts_with("<svg")
                && svg.contains("a&lt;b")
                && svg.matches("<polyline").count() == 4
        );
    }
}
