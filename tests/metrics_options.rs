//! The metrics port as the metrics options shape it: `--metrics-address`,
//! `--allow-cpu-metrics`, `--metrics-config` (latency counters and
//! summaries, refused settings) and the pinned memory pool families.

mod common;

use std::net::{IpAddr, SocketAddr};

use common::{get, post_json, repo_path, simple_json_request, start_with};
use shardserve::server::{self, ServerOptions};

fn options() -> ServerOptions {
    ServerOptions::for_tests(repo_path("models"))
}

fn scrape(addr: SocketAddr) -> String {
    let reply = get(addr, "/metrics");
    assert_eq!(reply.status, 200);
    String::from_utf8(reply.body).expect("utf-8 metrics")
}

/// The value of the one sample named exactly `series` (name and labels).
fn sample(page: &str, series: &str) -> Option<String> {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(str::to_string)
}

fn infer_simple(addr: SocketAddr, times: usize) {
    for b in 0..times {
        let reply = post_json(
            addr,
            "/v2/models/simple/infer",
            &simple_json_request(b as i32),
        );
        assert_eq!(reply.status, 200, "{}", reply.error());
    }
}

#[test]
fn pinned_pool_and_cpu_families_are_shown_by_default() {
    let server = start_with(options());
    let page = scrape(server.metrics_addr());
    for family in [
        "# HELP nv_pinned_memory_pool_total_bytes Pinned memory pool total memory size, in bytes",
        "# TYPE nv_pinned_memory_pool_total_bytes gauge",
        "# HELP nv_pinned_memory_pool_used_bytes Pinned memory pool used memory size, in bytes",
        "# TYPE nv_pinned_memory_pool_used_bytes gauge",
        "# TYPE nv_cpu_utilization gauge",
        "# TYPE nv_cpu_memory_total_bytes gauge",
        "# TYPE nv_cpu_memory_used_bytes gauge",
        "# TYPE nv_inference_request_duration_us counter",
    ] {
        assert!(page.contains(family), "no '{family}' in:\n{page}");
    }
    // Triton's default --pinned-memory-pool-byte-size, nothing taken on a
    // machine without GPUs.
    assert_eq!(
        sample(&page, "nv_pinned_memory_pool_total_bytes").as_deref(),
        Some("268435456")
    );
    assert_eq!(
        sample(&page, "nv_pinned_memory_pool_used_bytes").as_deref(),
        Some("0")
    );
    let util: f64 = sample(&page, "nv_cpu_utilization")
        .and_then(|v| v.parse().ok())
        .expect("nv_cpu_utilization value");
    assert!((0.0..=1.0).contains(&util));
    let total: u64 = sample(&page, "nv_cpu_memory_total_bytes")
        .and_then(|v| v.parse().ok())
        .expect("total");
    let used: u64 = sample(&page, "nv_cpu_memory_used_bytes")
        .and_then(|v| v.parse().ok())
        .expect("used");
    assert!(total > 0 && used <= total);
    assert!(
        !page.contains("_summary_us"),
        "summaries are off by default"
    );
    server.shutdown().expect("shutdown");
}

#[test]
fn cpu_metrics_can_be_turned_off() {
    let mut opts = options();
    opts.allow_cpu_metrics = false;
    let server = start_with(opts);
    let page = scrape(server.metrics_addr());
    assert!(!page.contains("nv_cpu_"), "CPU families shown:\n{page}");
    assert!(page.contains("nv_pinned_memory_pool_total_bytes "));
    server.shutdown().expect("shutdown");
}

#[test]
fn summaries_replace_the_latency_counters_when_configured() {
    let mut opts = options();
    opts.metrics_config = vec![
        "summary_latencies=true".into(),
        "summary_quantiles=0.5:0.05,0.9:0.01".into(),
        "counter_latencies=false".into(),
    ];
    let server = start_with(opts);
    infer_simple(server.http_addr(), 3);
    let page = scrape(server.metrics_addr());
    for (name, kind) in [
        ("nv_inference_request_summary_us", "summary"),
        ("nv_inference_queue_summary_us", "summary"),
        ("nv_inference_compute_input_summary_us", "summary"),
        ("nv_inference_compute_infer_summary_us", "summary"),
        ("nv_inference_compute_output_summary_us", "summary"),
    ] {
        assert!(
            page.contains(&format!("# TYPE {name} {kind}\n")),
            "no {name} in:\n{page}"
        );
    }
    let labels = r#"{model="simple",version="1"}"#;
    assert_eq!(
        sample(
            &page,
            &format!("nv_inference_request_summary_us_count{labels}")
        )
        .as_deref(),
        Some("3")
    );
    assert_eq!(
        sample(
            &page,
            &format!("nv_inference_compute_infer_summary_us_count{labels}")
        )
        .as_deref(),
        Some("3")
    );
    let sum: u64 = sample(
        &page,
        &format!("nv_inference_request_summary_us_sum{labels}"),
    )
    .and_then(|v| v.parse().ok())
    .expect("sum");
    let q = |quantile: &str| {
        sample(
            &page,
            &format!(
                r#"nv_inference_request_summary_us{{model="simple",version="1",quantile="{quantile}"}}"#
            ),
        )
    };
    let median: u64 = q("0.5").and_then(|v| v.parse().ok()).expect("p50");
    let p90: u64 = q("0.9").and_then(|v| v.parse().ok()).expect("p90");
    assert!(
        median <= p90 && p90 <= sum,
        "p50 {median} p90 {p90} sum {sum}"
    );
    assert_eq!(q("0.99"), None, "only the configured quantiles");
    // A model that served nothing in the window has no quantile value.
    assert_eq!(
        sample(
            &page,
            r#"nv_inference_request_summary_us{model="simple_int8",version="1",quantile="0.5"}"#
        )
        .as_deref(),
        Some("Nan")
    );
    assert!(
        !page.contains("nv_inference_request_duration_us"),
        "counter_latencies=false drops the latency counters"
    );
    assert_eq!(
        sample(&page, &format!("nv_inference_request_success{labels}")).as_deref(),
        Some("3"),
        "the request counters stay"
    );
    server.shutdown().expect("shutdown");
}

#[test]
fn a_bad_metrics_config_stops_the_start() {
    for (setting, needle) in [
        ("summary_latencies", "<setting>=<value>"),
        ("bogus_setting=1", "bogus_setting"),
        ("summary_quantiles=0.5", "summary_quantiles"),
    ] {
        let mut opts = options();
        opts.metrics_config = vec![setting.to_string()];
        let e = match server::start(opts) {
            Ok(s) => {
                let _ = s.shutdown();
                panic!("'{setting}' was accepted")
            }
            Err(e) => format!("{e:#}"),
        };
        assert!(
            e.contains("--metrics-config") && e.contains(needle),
            "{setting}: {e}"
        );
    }
}

#[test]
fn the_metrics_port_binds_its_own_address() {
    let mut opts = options();
    let other: IpAddr = [127, 0, 0, 2].into();
    opts.metrics_address = Some(other);
    let server = start_with(opts);
    assert_eq!(server.metrics_addr().ip(), other);
    assert_eq!(server.http_addr().ip(), IpAddr::from([127, 0, 0, 1]));
    infer_simple(server.http_addr(), 1);
    let page = scrape(server.metrics_addr());
    assert_eq!(
        sample(
            &page,
            r#"nv_inference_request_success{model="simple",version="1"}"#
        )
        .as_deref(),
        Some("1")
    );
    server.shutdown().expect("shutdown");
}
