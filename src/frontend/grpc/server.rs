//! gRPC over HTTP/2 on a shard: hyper's HTTP/2 server on monoio, with the
//! tonic-generated services behind a small path router. No tokio runtime.

use std::{convert::Infallible, future::Future, pin::Pin, rc::Rc, time::Instant};

use hyper::{body::Incoming, server::conn::http2};
use monoio::{
    io::{
        poll_io::{AsyncRead, AsyncWrite},
        IntoPollIo,
    },
    net::TcpListener,
};
use monoio_compat::hyper::{MonoioIo, MonoioTimer};
use tower_service::Service;

use super::{
    conn_streams::{StreamExec, WithStreams},
    health::HealthService,
    raw_tail::{with_raw_tail, RawTail},
    service::InferenceService,
    size_limit::{self, SizeLimitStatus},
    stream_route::{self, StreamRoute},
    unary_infer::{self, DirectInfer},
};
use crate::{
    frontend::{
        env,
        restricted::{self, Restrictions},
        transport::{
            self,
            tls::{self, TlsAcceptor},
            ActiveRequest, Coalesced, ConnIo, ConnSlot, ConnState, Decision, DeferredFlush,
            KeepAlive, PacedBody, TrackedBody,
        },
    },
    proto::{
        health::health_server::HealthServer,
        inference::grpc_inference_service_server::GrpcInferenceServiceServer,
    },
    shard::{ConnectionGauge, InFlight, Shard},
};

type GrpcResponse = http::Response<TrackedBody<SizeLimitStatus>>;
// Not `Send`: the connection's state is shard-local, and hyper's HTTP/2
// server runs its streams on the connection's own task (`conn_streams`).
type GrpcFuture = Pin<Box<dyn Future<Output = Result<GrpcResponse, Infallible>>>>;

/// Dispatches by service path to the inference or health service;
/// anything else is UNIMPLEMENTED, as gRPC requires. One per connection:
/// it counts the connection's open streams (for the idle timeout) until
/// each response body is sent.
///
/// A hyper service, not a tower one behind `TowerToHyperService`: hyper
/// calls it on the connection task as it accepts the stream, where the
/// tower adapter's `oneshot` would only call it on the stream task's first
/// poll. The request is then in flight from its accept (the shard's
/// spinner holds off from there, rather than taking a round between the
/// read and the stream task), and both tonic services are always ready.
#[derive(Clone)]
struct GrpcRouter {
    inference: GrpcInferenceServiceServer<InferenceService>,
    /// `ModelInfer` without tonic's codec where nothing is compressed;
    /// `None` when responses may be.
    direct_infer: Option<DirectInfer>,
    /// `ModelStreamInfer` with its request messages as bytes.
    stream_route: StreamRoute,
    health: HealthServer<HealthService>,
    conn: Rc<ConnState>,
    /// `--grpc-restricted-protocol`, shared by the shard's connections;
    /// `None` when nothing is restricted.
    restricted: Option<Rc<Restrictions>>,
    /// The executor of this connection's streams, told which of them run
    /// apart.
    streams: StreamExec,
}

impl hyper::service::Service<http::Request<Incoming>> for GrpcRouter {
    type Response = GrpcResponse;
    type Error = Infallible;
    type Future = GrpcFuture;

    fn call(&self, mut req: http::Request<Incoming>) -> GrpcFuture {
        let in_flight = InFlight::enter();
        if env::with_current(|e| e.trace.enabled()).unwrap_or(false) {
            req.extensions_mut()
                .insert(crate::trace::HeadersAt(crate::trace::now_ns()));
        }
        let active = ActiveRequest::begin(&self.conn);
        let path = req.uri().path();
        let unary = !is_streaming(path);
        self.streams.next_apart(!unary);
        let answer = Answer {
            in_flight,
            unary,
            active,
        };
        if let Some(refused) = self
            .restricted
            .as_deref()
            .and_then(|r| r.refuses(restricted::grpc_category(path)?, req.headers()))
        {
            // Before the service, so a refused stream is not opened either.
            let status = tonic::Status::unavailable(refused.message());
            answer.boxed(async move { Ok(status.into_http()) })
        } else if let Some(direct) = self
            .direct_infer
            .filter(|_| path == unary_infer::PATH && DirectInfer::takes(req.headers()))
        {
            answer.boxed(direct.call(req.map(PacedBody::new)))
        } else if path == stream_route::PATH {
            answer.boxed(self.stream_route.call(req.map(PacedBody::new)))
        } else if path.starts_with("/inference.GRPCInferenceService/") {
            answer.boxed(self.inference.clone().call(req.map(PacedBody::new)))
        } else if path.starts_with("/grpc.health.v1.Health/") {
            answer.boxed(self.health.clone().call(req))
        } else {
            let status = tonic::Status::unimplemented(format!("unknown gRPC method {path}"));
            answer.boxed(async move { Ok(status.into_http()) })
        }
    }
}

/// What every call's answer is wrapped in on its way to hyper.
struct Answer {
    /// A unary answer stays in flight until hyper has handed its last
    /// frame to h2: ending it when the service returned re-armed the
    /// shard's spinner, whose round then ran before the connection task
    /// that writes the answer (a `sched_yield` and an `epoll_wait` inside
    /// most c=1 round trips). A stream's body lives as long as the call,
    /// which must not hold the spinner off or keep a drain waiting: a
    /// stream is in flight until its service answered with the head.
    in_flight: InFlight,
    unary: bool,
    active: ActiveRequest,
}

impl Answer {
    /// One box per call, the service's future in it: generic over the
    /// service rather than boxing its future and then this one around it
    /// (the direct `ModelInfer` future is 2.5 KB, copied into each box).
    fn boxed<F>(self, service: F) -> GrpcFuture
    where
        F: Future<Output = Result<http::Response<tonic::body::Body>, Infallible>> + 'static,
    {
        Box::pin(async move {
            let Ok(mut resp) = service.await;
            let in_flight = self.unary.then_some(self.in_flight);
            size_limit::rewrite(resp.headers_mut());
            let tail = resp.extensions_mut().remove::<RawTail>();
            Ok(resp.map(|body| {
                let body = match tail {
                    Some(tail) => with_raw_tail(body, tail),
                    None => body,
                };
                TrackedBody::new(SizeLimitStatus::new(body), self.active).holding(in_flight)
            }))
        })
    }
}

/// The methods whose response body is a stream as long as the call.
fn is_streaming(path: &str) -> bool {
    matches!(path, stream_route::PATH | "/grpc.health.v1.Health/Watch")
}

/// Serves gRPC on this shard until shutdown.
pub async fn serve(listener: TcpListener, shard: Rc<Shard>) {
    let (max, compress, tls) = env::with_current(|e| {
        (
            e.limits.grpc_max_message_size,
            e.limits.grpc_compress_responses,
            e.tls.get().and_then(|t| t.grpc.clone()),
        )
    })
    .unwrap_or((64 << 20, false, None));
    let inference = super::compression::with_compression(
        GrpcInferenceServiceServer::new(InferenceService)
            .max_decoding_message_size(max)
            .max_encoding_message_size(max),
        compress,
    );
    let direct_infer = DirectInfer::new(max, compress);
    let stream_route = StreamRoute::new(max, compress);
    let health = HealthServer::new(HealthService);
    // One copy per shard: connections share it by `Rc`, so a call writes
    // no reference count another shard writes.
    let restricted = env::with_current(|e| e.grpc_restricted_protocol.clone())
        .filter(|r| !r.is_empty())
        .map(Rc::new);
    let gauge_shard = shard.clone();
    transport::accept_loop(listener, shard, "grpc", move |stream, slot| {
        let _ = stream.set_nodelay(true);
        let gauge = ConnectionGauge::open(&gauge_shard);
        let router = GrpcRouter {
            inference: inference.clone(),
            direct_infer,
            stream_route,
            health: health.clone(),
            conn: slot.state().clone(),
            restricted: restricted.clone(),
            streams: StreamExec::default(),
        };
        monoio::spawn(serve_connection(stream, slot, gauge, router, tls.clone()));
    })
    .await;
}

/// HTTP/2's client preface (24 bytes) and the header of the SETTINGS frame
/// that must follow it (9 bytes).
const HANDSHAKE_BYTES: u64 = 24 + 9;

async fn serve_connection(
    stream: monoio::net::TcpStream,
    slot: ConnSlot,
    _gauge: ConnectionGauge,
    router: GrpcRouter,
    tls: Option<TlsAcceptor>,
) {
    let state = slot.state().clone();
    let limits = *slot.limits();
    // Before the first byte: the watch counts frames from the preface on.
    state.watch_h2(transport::H2Watch::new(limits.h2_rules()));
    let io = match stream.into_poll_io() {
        Ok(io) => io,
        Err(e) => {
            tracing::debug!(error = %e, "grpc: connection setup failed");
            return;
        }
    };
    match tls {
        None => {
            let (io, flusher) = Coalesced::new(io);
            serve_http2(
                ConnIo::new(io, state.clone()),
                &state,
                limits,
                router,
                &flusher,
            )
            .await
        }
        // Boxed: the TLS state stays out of the plaintext connection's task.
        Some(acceptor) => {
            Box::pin(async {
                // The TLS handshake and the HTTP/2 preface share one deadline.
                let Some(stream) =
                    tls::accept(&acceptor, io, &state, limits.grpc_handshake_timeout, "grpc").await
                else {
                    return;
                };
                let fd = tls::raw_fd(&stream);
                let (stream, flusher) = Coalesced::new(stream);
                let io = ConnIo::encrypted(stream, fd, state.clone());
                serve_http2(io, &state, limits, router, &flusher).await
            })
            .await
        }
    }
    drop(slot);
}

/// Serves HTTP/2 on `io`, plaintext or TLS (monomorphised for each, so the
/// plaintext path has no indirection).
async fn serve_http2<T>(
    io: ConnIo<T>,
    state: &ConnState,
    limits: transport::TransportLimits,
    router: GrpcRouter,
    flusher: &dyn DeferredFlush,
) where
    T: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let exec = router.streams.clone();
    let mut builder = http2::Builder::new(exec.clone());
    builder
        .timer(MonoioTimer)
        .max_concurrent_streams(1024)
        // gRPC servers send no `date` (Triton's does not); hyper's costs a
        // clock read and a header to encode on every answer.
        .auto_date_header(false)
        // Keepalive is the frame watch's (`transport::H2Watch`): hyper's
        // would ping without gRPC's limits.
        .keep_alive_interval(None);
    let conn = WithStreams::new(builder.serve_connection(MonoioIo::new(io), router), exec);
    let policy = move |s: &ConnState, now: Instant| {
        if s.started() == 0 && s.bytes_read() < HANDSHAKE_BYTES {
            let by = s.born() + limits.grpc_handshake_timeout;
            if now >= by {
                return Decision::Drop(
                    "no HTTP/2 preface and SETTINGS within the handshake timeout",
                );
            }
            // Nothing wakes this loop when the handshake completes (it is
            // read inside the connection's poll), so the deadlines that
            // apply after it must be looked at on time from here: else a
            // connection age or keepalive shorter than the handshake
            // timeout would wait for the handshake timeout.
            let after = [
                limits.grpc_max_connection_age,
                limits.grpc_keepalive_time,
                Some(limits.idle_timeout),
            ];
            let next = after
                .into_iter()
                .flatten()
                .map(|d| s.born() + d)
                .filter(|&t| t > now)
                .fold(by, Instant::min);
            return Decision::WaitUntil(next);
        }
        if let Some(age) = limits.grpc_max_connection_age {
            let by = s.born() + age;
            if now >= by {
                return Decision::CloseWithin(
                    "older than --grpc-max-connection-age (GOAWAY)",
                    limits.grpc_max_connection_age_grace,
                );
            }
        }
        let keepalive = match s.h2().map(|w| w.keepalive(now, s.active() > 0)) {
            Some(KeepAlive::Dead) => {
                return Decision::Drop("keepalive PING not acknowledged in time")
            }
            Some(KeepAlive::Until(t)) => t,
            None => None,
        };
        let age = limits.grpc_max_connection_age.map(|a| s.born() + a);
        let soonest = |by: Instant| {
            [keepalive, age]
                .into_iter()
                .flatten()
                .fold(by, Instant::min)
        };
        if s.active() > 0 {
            return Decision::WaitUntil(soonest(now + limits.idle_timeout));
        }
        let by = s.idle_since() + limits.idle_timeout;
        if now >= by {
            Decision::Close("no open stream within the idle timeout (GOAWAY)")
        } else {
            Decision::WaitUntil(soonest(by))
        }
    };
    transport::drive(
        conn,
        state,
        "grpc",
        policy,
        |c: Pin<&mut WithStreams<_>>| http2::Connection::graceful_shutdown(c.get_mut().conn()),
        flusher,
    )
    .await;
}
