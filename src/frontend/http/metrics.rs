//! The metrics port: `/metrics` in Prometheus text format.

use bytes::Bytes;
use http::{header, HeaderValue, StatusCode};
use http_body_util::Full;
use hyper::{body::Incoming, Request, Response};

use super::server::HttpResponse;
use crate::{frontend::transport::ShardTransport, metrics::prometheus, shard};

pub async fn handle(req: Request<Incoming>) -> HttpResponse {
    let (status, body) = if req.uri().path() == "/metrics" {
        // Table and gauges borrowed, not cloned: their `Arc`s are shared
        // by every shard.
        let show = crate::frontend::env::with_current(|e| e.metrics.clone()).unwrap_or_default();
        let mut text = shard::with_current(|s| {
            s.with_table(|table| prometheus::render(table, &s.gauges, &show))
        })
        .unwrap_or_else(|| prometheus::render(&Default::default(), &[], &show));
        if let Some(t) = ShardTransport::current() {
            text.push_str(&t.stats().render_prometheus());
        }
        (StatusCode::OK, text)
    } else {
        (
            StatusCode::NOT_FOUND,
            "not found: the metrics are at /metrics\n".to_string(),
        )
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    resp
}
