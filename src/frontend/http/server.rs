//! Accept loop and per-connection HTTP/1.1 serving on a shard (hyper over
//! monoio). Each connection lives on the shard that accepted it.
//!
//! Timeouts (see `frontend::transport`): hyper's own header read timeout
//! is turned off, because hyper (1.x) arms it as soon as it starts waiting
//! for a request head — keep-alive idle time included — and on expiry
//! closes the connection without a response. Instead the connection's
//! driver measures:
//! - header timeout: from a request's first byte to its dispatch; expiry
//!   answers `408 Request Timeout` with `Connection: close`;
//! - idle timeout: from the end of the last request (or the accept) with no
//!   byte of a new one; expiry closes the connection quietly, as any
//!   keep-alive server may.
//!
//! Body timeouts are applied where the body is read (`routes`).

use std::{future::Future, pin::Pin, rc::Rc, time::Instant};

use bytes::Bytes;
use http::{header, HeaderValue};
use http_body_util::Full;
use hyper::{body::Incoming, server::conn::http1, service::service_fn, Request, Response};
use monoio::{
    io::{
        poll_io::{AsyncRead, AsyncWrite},
        IntoPollIo,
    },
    net::TcpListener,
};
use monoio_compat::hyper::{MonoioIo, MonoioTimer};

use crate::{
    frontend::transport::{
        self,
        tls::{self, TlsAcceptor},
        ActiveRequest, ConnIo, ConnSlot, ConnState, Decision, TransportLimits,
    },
    shard::{ConnectionGauge, Shard},
};

pub type HttpResponse = Response<Full<Bytes>>;

/// Accepts connections until the shard shuts down, serving each with
/// `handler`, over TLS when `tls` is given.
pub async fn accept_loop<H, F>(
    listener: TcpListener,
    shard: Rc<Shard>,
    what: &'static str,
    tls: Option<TlsAcceptor>,
    handler: H,
) where
    H: Fn(Request<Incoming>) -> F + Clone + 'static,
    F: Future<Output = HttpResponse> + 'static,
{
    let gauge_shard = shard.clone();
    transport::accept_loop(listener, shard, what, move |stream, slot| {
        let _ = stream.set_nodelay(true);
        let gauge = ConnectionGauge::open(&gauge_shard);
        monoio::spawn(serve_connection(
            stream,
            slot,
            gauge,
            what,
            tls.clone(),
            handler.clone(),
        ));
    })
    .await;
}

async fn serve_connection<H, F>(
    stream: monoio::net::TcpStream,
    slot: ConnSlot,
    _gauge: ConnectionGauge,
    what: &'static str,
    tls: Option<TlsAcceptor>,
    handler: H,
) where
    H: Fn(Request<Incoming>) -> F + Clone + 'static,
    F: Future<Output = HttpResponse> + 'static,
{
    let state = slot.state().clone();
    let limits = *slot.limits();
    let io = match stream.into_poll_io() {
        Ok(io) => io,
        Err(e) => {
            tracing::debug!(error = %e, "{what}: connection setup failed");
            return;
        }
    };
    match tls {
        None => {
            serve_http1(
                ConnIo::new(io, state.clone()),
                &state,
                limits,
                what,
                handler,
            )
            .await
        }
        // Boxed: the TLS connection state stays out of the plaintext
        // connection's task.
        Some(acceptor) => {
            Box::pin(async {
                // A client that connects and stalls the handshake is held to
                // the header timeout, as one that stalls its request head.
                let Some(stream) =
                    tls::accept(&acceptor, io, &state, limits.http_header_timeout, what).await
                else {
                    return;
                };
                let fd = tls::raw_fd(&stream);
                let io = ConnIo::encrypted(stream, fd, state.clone());
                serve_http1(io, &state, limits, what, handler).await
            })
            .await
        }
    }
    drop(slot);
}

/// Serves HTTP/1.1 on `io`, plaintext or TLS (monomorphised for each, so
/// the plaintext path has no indirection).
async fn serve_http1<T, H, F>(
    io: ConnIo<T>,
    state: &Rc<ConnState>,
    limits: TransportLimits,
    what: &'static str,
    handler: H,
) where
    T: AsyncRead + AsyncWrite + Unpin + 'static,
    H: Fn(Request<Incoming>) -> F + Clone + 'static,
    F: Future<Output = HttpResponse> + 'static,
{
    let io = MonoioIo::new(io);
    let service_state = state.clone();
    let service = service_fn(move |req| {
        let active = ActiveRequest::begin(&service_state);
        let state = service_state.clone();
        let fut = handler(req);
        async move {
            let mut resp = fut.await;
            if resp.status().is_client_error() || resp.status().is_server_error() {
                // A refusal that closes the connection (body too large,
                // over budget, too slow) leaves the body unread.
                let closes = resp
                    .headers()
                    .get(header::CONNECTION)
                    .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
                if closes {
                    state.set_linger();
                }
            }
            if state.is_draining() {
                resp.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            resp.headers_mut()
                .insert(header::SERVER, crate::frontend::identity::server_header());
            // A `/generate_stream` response streams its events and stays
            // active until the last one; any other response ends here.
            Ok::<_, std::convert::Infallible>(super::generate::into_wire(resp, active))
        }
    });
    let conn = http1::Builder::new()
        .timer(MonoioTimer)
        .keep_alive(true)
        .header_read_timeout(None)
        .serve_connection(io, service);
    let policy = move |s: &ConnState, now: Instant| {
        if s.active() > 0 {
            // The request's own body timeouts apply; look again later.
            return Decision::WaitUntil(now + limits.idle_timeout);
        }
        match s.head_started() {
            Some(first_byte) => {
                let by = first_byte + limits.http_header_timeout;
                if now >= by {
                    Decision::RequestTimeout
                } else {
                    Decision::WaitUntil(by)
                }
            }
            None => {
                let by = s.idle_since() + limits.idle_timeout;
                if now >= by {
                    Decision::Close("idle keep-alive timeout")
                } else {
                    Decision::WaitUntil(by)
                }
            }
        }
    };
    transport::drive(
        conn,
        state,
        what,
        policy,
        |c: Pin<&mut _>| http1::Connection::graceful_shutdown(c),
        // One answer at a time: nothing to gather.
        &(),
    )
    .await;
}
