//! HTTP/REST (KServe v2 + Triton extensions).
mod cloud;
pub mod codec;
pub mod compression;
mod generate;
mod metrics;
mod repository;
mod routes;
pub mod sagemaker;
mod server;
mod shm_routes;
mod status;
pub mod vertex;

use std::rc::Rc;

use monoio::net::TcpListener;

use crate::shard::Shard;

/// Serves the KServe v2 REST API on this shard until shutdown.
pub async fn serve(listener: TcpListener, shard: Rc<Shard>) {
    let tls =
        crate::frontend::env::with_current(|e| e.tls.get().and_then(|t| t.http.clone())).flatten();
    server::accept_loop(listener, shard, "http", tls, routes::handle).await;
}

/// Serves `/metrics` on this shard until shutdown; plaintext, as Triton's.
pub async fn serve_metrics(listener: TcpListener, shard: Rc<Shard>) {
    server::accept_loop(listener, shard, "metrics", None, metrics::handle).await;
}

/// Serves the SageMaker service (`--allow-sagemaker`) on this shard until
/// shutdown; plaintext, as Triton's.
pub async fn serve_sagemaker(listener: TcpListener, shard: Rc<Shard>) {
    server::accept_loop(listener, shard, "sagemaker", None, sagemaker::handle).await;
}

/// Serves the Vertex AI service (`--allow-vertex-ai`) on this shard until
/// shutdown; plaintext, as Triton's.
pub async fn serve_vertex(listener: TcpListener, shard: Rc<Shard>) {
    server::accept_loop(listener, shard, "vertex-ai", None, vertex::handle).await;
}
