//! Client connections: hyper 1.x HTTP/1.1 and HTTP/2, and `h2` directly,
//! over monoio TCP streams (monoio-compat), plaintext or TLS; pre-encoded
//! request bodies; and the per-thread connection pool.

use std::{
    cell::{Cell, RefCell},
    convert::Infallible,
    pin::Pin,
    rc::Rc,
    task::{Context, Poll},
    time::Duration,
};

use anyhow::anyhow;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::client::conn::{http1, http2};
use monoio::{
    io::{
        poll_io::{AsyncRead, AsyncWrite, ReadBuf},
        IntoPollIo,
    },
    net::{tcp::stream_poll::TcpStreamPoll, TcpStream},
};
use monoio_compat::hyper::{MonoioExecutor, MonoioIo, MonoioTimer};

use super::{cli::Target, grpc::GrpcStream, request::Prepared};

/// A request body: one pre-encoded buffer (cloned per send, so sending costs
/// no copy), or two.
pub enum BenchBody {
    Once(Option<Bytes>),
    /// A sequence request: the freshly written head (id and flags) and the
    /// shared pre-encoded rest, sent as two frames without a copy.
    Parts(Option<Bytes>, Option<Bytes>),
}

impl Body for BenchBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            BenchBody::Once(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            BenchBody::Parts(head, tail) => Poll::Ready(
                head.take()
                    .or_else(|| tail.take())
                    .map(|b| Ok(Frame::data(b))),
            ),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, BenchBody::Once(None) | BenchBody::Parts(None, None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            BenchBody::Once(Some(b)) => SizeHint::with_exact(b.len() as u64),
            BenchBody::Once(None) => SizeHint::with_exact(0),
            BenchBody::Parts(head, tail) => SizeHint::with_exact(
                [head, tail]
                    .into_iter()
                    .flatten()
                    .map(|b| b.len() as u64)
                    .sum(),
            ),
        }
    }
}

pub type H1 = http1::SendRequest<BenchBody>;
pub type H2 = http2::SendRequest<BenchBody>;
/// Unary gRPC goes over `h2` directly: hyper's HTTP/2 client adds a
/// dispatch task and channel hop per request, which made one generator
/// thread slower than the server it measures.
pub type RawH2 = h2::client::SendRequest<Bytes>;

pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A client connection's byte stream: plain TCP, or TLS over it.
pub enum BenchIo {
    Plain(TcpStreamPoll),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStreamPoll>>),
}

impl AsyncRead for BenchIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            BenchIo::Plain(s) => Pin::new(s).poll_read(cx, buf),
            BenchIo::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for BenchIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            BenchIo::Plain(s) => Pin::new(s).poll_write(cx, buf),
            BenchIo::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            BenchIo::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            BenchIo::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            BenchIo::Plain(s) => s.is_write_vectored(),
            BenchIo::Tls(s) => s.is_write_vectored(),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            BenchIo::Plain(s) => Pin::new(s).poll_flush(cx),
            BenchIo::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            BenchIo::Plain(s) => Pin::new(s).poll_shutdown(cx),
            BenchIo::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// "cannot connect to 127.0.0.1:1: connection refused"; over TLS, the
/// handshake is part of connecting (and of its timeout).
pub async fn connect(target: &Target) -> anyhow::Result<MonoioIo<BenchIo>> {
    let addr = target.addr;
    let stream = match monoio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
        Err(_) => {
            return Err(anyhow!(connect_error(
                addr,
                std::io::ErrorKind::TimedOut.into()
            )))
        }
        Ok(Err(e)) => return Err(anyhow!(connect_error(addr, e))),
        Ok(Ok(s)) => s,
    };
    // Small requests: Nagle would add tens of milliseconds.
    let _ = stream.set_nodelay(true);
    let io = stream
        .into_poll_io()
        .map_err(|e| anyhow!("cannot connect to {addr}: {e}"))?;
    let Some(tls) = &target.tls else {
        return Ok(MonoioIo::new(BenchIo::Plain(io)));
    };
    let connector = tokio_rustls::TlsConnector::from(tls.config.clone());
    match monoio::time::timeout(
        CONNECT_TIMEOUT,
        connector.connect(tls.server_name.clone(), io),
    )
    .await
    {
        Err(_) => Err(anyhow!(
            "cannot connect to {addr}: TLS handshake timed out after {CONNECT_TIMEOUT:?}"
        )),
        Ok(Err(e)) => Err(anyhow!(
            "cannot connect to {addr}: TLS handshake failed: {e}"
        )),
        Ok(Ok(s)) => Ok(MonoioIo::new(BenchIo::Tls(Box::new(s)))),
    }
}

/// "cannot connect to ADDR: connection refused" (or "timed out after 5s",
/// or the OS's words): a failed connect as both load paths report it, and
/// what `closed_loop` and the direct lane recognise to pause before the
/// next try.
pub fn connect_error(addr: std::net::SocketAddr, e: std::io::Error) -> String {
    let why = match e.kind() {
        std::io::ErrorKind::ConnectionRefused => "connection refused".to_string(),
        std::io::ErrorKind::TimedOut => format!("timed out after {CONNECT_TIMEOUT:?}"),
        _ => e.to_string(),
    };
    format!("cannot connect to {addr}: {why}")
}

thread_local! {
    /// This thread's connection tasks, so that a worker can let them end
    /// before its runtime goes: monoio does not drop a pending task with
    /// the runtime, and a connection task waits on a waker its own state
    /// holds, so it (and its socket, maybe with a request half sent)
    /// would stay open for as long as the process runs.
    static CONNECTIONS: RefCell<Vec<monoio::task::JoinHandle<()>>> =
        const { RefCell::new(Vec::new()) };
}

/// Runs a client connection's I/O task on this thread until it ends.
fn drive_connection<E: std::fmt::Display>(
    conn: impl std::future::Future<Output = Result<(), E>> + 'static,
    what: &'static str,
) {
    let task = monoio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "bench: {what} connection ended");
        }
    });
    // Ended ones go as new ones come: a server that closes every
    // connection would otherwise have each ended task kept to the end.
    CONNECTIONS.with_borrow_mut(|c| {
        c.retain(|t| !t.is_finished());
        c.push(task);
    });
}

/// Waits (at most `limit`) for this thread's connection tasks to end;
/// each ends once its last sender is dropped and its requests are done,
/// so call it after dropping every pool. Returns how many are still open.
pub async fn close_connections(limit: Duration) -> usize {
    let tasks = CONNECTIONS.with_borrow_mut(std::mem::take);
    let open = Rc::new(Cell::new(tasks.len()));
    let all = futures::future::join_all(tasks.into_iter().map(|t| {
        let open = open.clone();
        async move {
            t.await;
            open.set(open.get() - 1);
        }
    }));
    let _ = monoio::time::timeout(limit, all).await;
    open.get()
}

pub async fn connect_raw_h2(target: &Target) -> anyhow::Result<RawH2> {
    let addr = target.addr;
    let io = connect(target).await?.inner();
    let (sender, conn) = h2::client::Builder::new()
        .initial_window_size(4 << 20)
        .initial_connection_window_size(16 << 20)
        .handshake::<_, Bytes>(io)
        .await
        .map_err(|e| anyhow!("HTTP/2 handshake with {addr} failed: {e}"))?;
    drive_connection(conn, "HTTP/2");
    Ok(sender)
}

pub async fn connect_h1(target: &Target) -> anyhow::Result<H1> {
    let addr = target.addr;
    let io = connect(target).await?;
    let (sender, conn) = http1::Builder::new()
        .handshake(io)
        .await
        .map_err(|e| anyhow!("HTTP/1.1 handshake with {addr} failed: {e}"))?;
    drive_connection(conn, "HTTP/1.1");
    Ok(sender)
}

pub async fn connect_h2(target: &Target) -> anyhow::Result<H2> {
    let addr = target.addr;
    let io = connect(target).await?;
    let (sender, conn) = http2::Builder::new(MonoioExecutor)
        .timer(MonoioTimer)
        .initial_stream_window_size(4 << 20)
        .initial_connection_window_size(16 << 20)
        .handshake(io)
        .await
        .map_err(|e| anyhow!("HTTP/2 handshake with {addr} failed: {e}"))?;
    drive_connection(conn, "HTTP/2");
    Ok(sender)
}

/// How a request travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    Http1,
    GrpcUnary,
    GrpcStream,
}

/// Something that can carry one outstanding request.
pub enum Lane {
    H1(H1),
    /// A direct `h2` sender, already ready for one more stream.
    Raw(RawH2),
    Stream(GrpcStream),
}

/// One thread's connections to one target. HTTP/1.1: one connection per
/// outstanding request (as perf_analyzer). gRPC: `connections` HTTP/2
/// connections, requests spread round-robin; streaming: one stream per
/// outstanding request, reused.
pub struct Pool {
    target: Target,
    wire: Wire,
    connections: usize,
    idle_h1: RefCell<Vec<H1>>,
    idle_streams: RefCell<Vec<GrpcStream>>,
    /// gRPC goes over `h2` directly, without hyper's client (its dispatch
    /// task and channel hop per request made one generator thread slower
    /// than the server it measures).
    raw: RefCell<Vec<Option<RawH2>>>,
    next: Cell<usize>,
}

impl Pool {
    pub fn new(target: &Target, wire: Wire, connections: usize) -> Self {
        Self {
            target: target.clone(),
            wire,
            connections: connections.max(1),
            idle_h1: RefCell::default(),
            idle_streams: RefCell::default(),
            raw: RefCell::default(),
            next: Cell::new(0),
        }
    }

    /// Opens the HTTP/2 connections up front so the first window does not
    /// pay for handshakes.
    pub async fn warm(&self) -> anyhow::Result<()> {
        if self.wire != Wire::Http1 {
            while self.raw.borrow().len() < self.connections {
                let c = connect_raw_h2(&self.target).await?;
                self.raw.borrow_mut().push(Some(c));
            }
        }
        Ok(())
    }

    /// A ready sender on the next connection, reconnecting a broken one.
    async fn raw_ready(&self) -> anyhow::Result<RawH2> {
        let i = self.next.get();
        self.next.set(i.wrapping_add(1));
        let slot = i % self.connections;
        let existing = self.raw.borrow().get(slot).cloned().flatten();
        if let Some(c) = existing {
            if let Ok(ready) = c.ready().await {
                return Ok(ready);
            }
        }
        let c = connect_raw_h2(&self.target).await?;
        {
            let mut raw = self.raw.borrow_mut();
            if raw.len() <= slot {
                raw.resize(slot + 1, None);
            }
            raw[slot] = Some(c.clone());
        }
        c.ready()
            .await
            .map_err(|e| anyhow!("HTTP/2 connection to {} failed: {e}", self.target.addr))
    }

    pub async fn acquire(&self, prepared: &Prepared) -> anyhow::Result<Lane> {
        match self.wire {
            Wire::Http1 => {
                let idle = self.idle_h1.borrow_mut().pop();
                match idle {
                    Some(c) => Ok(Lane::H1(c)),
                    None => Ok(Lane::H1(connect_h1(&self.target).await?)),
                }
            }
            Wire::GrpcUnary => Ok(Lane::Raw(self.raw_ready().await?)),
            Wire::GrpcStream => {
                let idle = self.idle_streams.borrow_mut().pop();
                match idle {
                    Some(s) => Ok(Lane::Stream(s)),
                    None => {
                        let mut sender = self.raw_ready().await?;
                        let stream =
                            GrpcStream::open(&mut sender, prepared).map_err(anyhow::Error::msg)?;
                        Ok(Lane::Stream(stream))
                    }
                }
            }
        }
    }

    /// Returns a lane that is still usable.
    pub fn release(&self, lane: Lane) {
        match lane {
            Lane::H1(c) if !c.is_closed() => self.idle_h1.borrow_mut().push(c),
            Lane::Stream(s) if !s.is_broken() => self.idle_streams.borrow_mut().push(s),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Connection tasks that ended are not kept: a run against a server
    /// that closes every connection would otherwise hold one per request.
    #[test]
    fn ended_connection_tasks_are_let_go() {
        let mut rt = crate::shard::uring::runtime_builder::<monoio::FusionDriver>()
            .enable_timer()
            .build()
            .expect("a runtime");
        rt.block_on(async {
            for _ in 0..100 {
                drive_connection(async { Ok::<(), Infallible>(()) }, "test");
                // Lets the task just spawned run to its end.
                monoio::time::sleep(Duration::from_millis(1)).await;
            }
            let kept = CONNECTIONS.with_borrow(Vec::len);
            assert!(kept <= 1, "{kept} connection tasks kept");
            assert_eq!(close_connections(Duration::from_secs(1)).await, 0);
        });
    }
}
