//! gRPC over HTTP/2 on a shard: hyper's HTTP/2 server on monoio, with the
//! tonic-generated services behind a small path router. No tokio runtime.

use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    rc::Rc,
    task::{Context, Poll},
};

use hyper::{body::Incoming, server::conn::http2};
use hyper_util::service::TowerToHyperService;
use monoio::{io::IntoPollIo, net::TcpListener};
use monoio_compat::hyper::{MonoioExecutor, MonoioIo, MonoioTimer};
use tower_service::Service;

use super::{health::HealthService, service::InferenceService};
use crate::{
    proto::{
        health::health_server::HealthServer,
        inference::grpc_inference_service_server::GrpcInferenceServiceServer,
    },
    server::state,
    shard::{ConnectionGauge, InFlight, Shard},
};

type GrpcResponse = http::Response<tonic::body::Body>;
type GrpcFuture = Pin<Box<dyn Future<Output = Result<GrpcResponse, Infallible>> + Send>>;

/// Dispatches by service path to the inference or health service;
/// anything else is UNIMPLEMENTED, as gRPC requires.
#[derive(Clone)]
struct GrpcRouter {
    inference: GrpcInferenceServiceServer<InferenceService>,
    health: HealthServer<HealthService>,
}

impl Service<http::Request<Incoming>> for GrpcRouter {
    type Response = GrpcResponse;
    type Error = Infallible;
    type Future = GrpcFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Incoming>) -> GrpcFuture {
        let in_flight = InFlight::enter();
        let path = req.uri().path();
        let fut: GrpcFuture = if path.starts_with("/inference.GRPCInferenceService/") {
            Box::pin(self.inference.call(req))
        } else if path.starts_with("/grpc.health.v1.Health/") {
            Box::pin(self.health.call(req))
        } else {
            let status = tonic::Status::unimplemented(format!("unknown gRPC method {path}"));
            Box::pin(async move { Ok(status.into_http()) })
        };
        Box::pin(async move {
            let out = fut.await;
            drop(in_flight);
            out
        })
    }
}

/// Serves gRPC on this shard until shutdown.
pub async fn serve(listener: TcpListener, shard: Rc<Shard>) {
    let max = state::current().map_or(i32::MAX as usize, |s| s.options.grpc_max_message_size);
    let router = GrpcRouter {
        inference: GrpcInferenceServiceServer::new(InferenceService)
            .max_decoding_message_size(max)
            .max_encoding_message_size(max),
        health: HealthServer::new(HealthService),
    };
    loop {
        let accepted = monoio::select! {
            r = listener.accept() => r,
            _ = shard.shutdown.wait() => return,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!(shard = shard.id, error = %e, "grpc: accept failed");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let connection = ConnectionGauge::open(&shard);
        let service = TowerToHyperService::new(router.clone());
        monoio::spawn(async move {
            let _connection = connection;
            let io = match stream.into_poll_io() {
                Ok(io) => MonoioIo::new(io),
                Err(e) => {
                    tracing::debug!(error = %e, "grpc: connection setup failed");
                    return;
                }
            };
            if let Err(e) = http2::Builder::new(MonoioExecutor)
                .timer(MonoioTimer)
                .max_concurrent_streams(1024)
                .serve_connection(io, service)
                .await
            {
                tracing::debug!(error = %e, "grpc: connection ended with an error");
            }
        });
    }
}
