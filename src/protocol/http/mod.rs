//! HTTP/REST (KServe v2 + Triton extensions).
pub mod codec;
mod generate;
mod metrics;
mod repository;
mod routes;
mod server;
mod shm_routes;
mod status;

use std::rc::Rc;

use monoio::net::TcpListener;

use crate::shard::Shard;

/// Serves the KServe v2 REST API on this shard until shutdown.
pub async fn serve(listener: TcpListener, shard: Rc<Shard>) {
    server::accept_loop(listener, shard, "http", routes::handle).await;
}

/// Serves `/metrics` on this shard until shutdown.
pub async fn serve_metrics(listener: TcpListener, shard: Rc<Shard>) {
    server::accept_loop(listener, shard, "metrics", metrics::handle).await;
}
