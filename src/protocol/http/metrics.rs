//! The metrics port (`/metrics`, Prometheus text format).
//!
//! PARTIAL: only host memory gauges so far; the per-model inference
//! metrics (`nv_inference_*`) come with the statistics work (issue 3).

use bytes::Bytes;
use http::{header, HeaderValue, StatusCode};
use http_body_util::Full;
use hyper::{body::Incoming, Request, Response};

use super::server::HttpResponse;

pub async fn handle(req: Request<Incoming>) -> HttpResponse {
    let (status, body) = if req.uri().path() == "/metrics" {
        (StatusCode::OK, render())
    } else {
        (StatusCode::NOT_FOUND, "not found: the metrics are at /metrics\n".to_string())
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    resp
}

fn render() -> String {
    let mut out = String::new();
    if let Some((total, available)) = meminfo() {
        out.push_str("# HELP nv_cpu_memory_total_bytes CPU total memory (RAM), in bytes\n");
        out.push_str("# TYPE nv_cpu_memory_total_bytes gauge\n");
        out.push_str(&format!("nv_cpu_memory_total_bytes {total}\n"));
        out.push_str("# HELP nv_cpu_memory_used_bytes CPU used memory (RAM), in bytes\n");
        out.push_str("# TYPE nv_cpu_memory_used_bytes gauge\n");
        out.push_str(&format!("nv_cpu_memory_used_bytes {}\n", total.saturating_sub(available)));
    }
    out
}

/// (MemTotal, MemAvailable) in bytes from /proc/meminfo.
fn meminfo() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    };
    Some((field("MemTotal:")?, field("MemAvailable:")?))
}
