//! One connection's shared state and the task that drives it.
//!
//! [`ConnIo`] sits between the socket and hyper and counts what is read;
//! [`ActiveRequest`] marks a request (HTTP/1) or stream (HTTP/2) in
//! progress. The protocol's policy reads both to decide, whenever its
//! deadline passes, whether the connection is idle, stuck in a handshake
//! or in a request's headers, and [`drive`] acts on that decision, and on
//! the shard's drain at shutdown, while it polls hyper's connection.
//!
//! Costs per request: a few `Cell` updates and one clock read when a
//! request ends; per read, one `Cell` add. Each connection has one timer
//! armed at its next deadline (not a periodic tick), so ten thousand idle
//! connections cost nothing until their deadlines.

use std::{
    cell::{Cell, OnceCell, RefCell},
    future::{poll_fn, Future},
    io,
    os::fd::RawFd,
    pin::{pin, Pin},
    rc::Rc,
    task::{Context, Poll, Waker},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use monoio::io::poll_io::{AsyncRead, AsyncWrite, ReadBuf};

use super::h2watch::H2Watch;
use crate::shard::InFlight;

/// What the policy wants done with a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Nothing to do before this instant.
    WaitUntil(Instant),
    /// Ask the protocol to finish and close (HTTP/1: close when idle;
    /// HTTP/2: GOAWAY), for the given reason.
    Close(&'static str),
    /// As `Close`, letting open requests or streams run for the grace
    /// (`None`: as long as they take) before the connection is dropped.
    CloseWithin(&'static str, Option<Duration>),
    /// Drop the connection now (a handshake that never came).
    Drop(&'static str),
    /// HTTP/1 request headers too slow: answer 408 and close.
    RequestTimeout,
}

/// How long a connection told to close gracefully (idle GOAWAY) may take
/// before it is dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(10);

/// At shutdown, how long a connection with nothing in flight may stay
/// open after being told to go away.
const DRAIN_IDLE_GRACE: Duration = Duration::from_millis(500);

/// State shared by a connection's I/O wrapper, its service and its driver.
/// Shard-local: never crosses threads.
#[derive(Debug)]
pub struct ConnState {
    born: Instant,
    bytes_read: Cell<u64>,
    /// Requests (HTTP/1) or streams (HTTP/2) in progress.
    active: Cell<u32>,
    /// Requests or streams ever started.
    started: Cell<u64>,
    /// When the last request ended (or the connection opened).
    idle_since: Cell<Instant>,
    /// HTTP/1: when the first byte of a request not yet dispatched arrived.
    head_started: Cell<Option<Instant>>,
    /// A write returned `Pending`: the socket's send buffer is full.
    write_blocked: Cell<bool>,
    fd: Cell<Option<RawFd>>,
    /// A response refused the request body: read and discard what the
    /// client still sends before closing (see `discard_unread_input`).
    linger: Cell<bool>,
    /// TLS runs over the socket: nothing may be written to it raw.
    encrypted: Cell<bool>,
    draining: Cell<bool>,
    waker: RefCell<Option<Waker>>,
    /// gRPC connections: the HTTP/2 frame watch (keepalive, ping abuse).
    h2: OnceCell<H2Watch>,
}

impl ConnState {
    pub(super) fn new() -> Self {
        let now = Instant::now();
        Self {
            born: now,
            bytes_read: Cell::new(0),
            active: Cell::new(0),
            started: Cell::new(0),
            idle_since: Cell::new(now),
            head_started: Cell::new(None),
            write_blocked: Cell::new(false),
            fd: Cell::new(None),
            linger: Cell::new(false),
            encrypted: Cell::new(false),
            draining: Cell::new(false),
            waker: RefCell::new(None),
            h2: OnceCell::new(),
        }
    }

    /// Watches this connection's HTTP/2 frames (before any byte is read).
    pub fn watch_h2(&self, watch: H2Watch) {
        let _ = self.h2.set(watch);
    }

    pub fn h2(&self) -> Option<&H2Watch> {
        self.h2.get()
    }

    pub fn born(&self) -> Instant {
        self.born
    }
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.get()
    }
    pub fn active(&self) -> u32 {
        self.active.get()
    }
    pub fn started(&self) -> u64 {
        self.started.get()
    }
    pub fn idle_since(&self) -> Instant {
        self.idle_since.get()
    }
    pub fn head_started(&self) -> Option<Instant> {
        self.head_started.get()
    }
    pub fn write_blocked(&self) -> bool {
        self.write_blocked.get()
    }
    /// The shard is shutting down: finish in-flight work and close.
    pub fn is_draining(&self) -> bool {
        self.draining.get()
    }

    pub(super) fn begin_drain(&self) {
        self.draining.set(true);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }

    /// Resolves once the shard starts draining.
    pub(super) async fn drained(&self) {
        poll_fn(|cx| {
            if self.draining.get() {
                return Poll::Ready(());
            }
            let mut slot = self.waker.borrow_mut();
            if !slot
                .as_ref()
                .is_some_and(|w| crate::shard::same_task(w, cx.waker()))
            {
                *slot = Some(cx.waker().clone());
            }
            Poll::Pending
        })
        .await
    }

    fn on_read(&self, n: usize) {
        if n == 0 {
            return;
        }
        self.bytes_read.set(self.bytes_read.get() + n as u64);
        if self.active.get() == 0 && self.head_started.get().is_none() {
            self.head_started.set(Some(Instant::now()));
        }
    }

    /// The response being sent refuses the rest of the request body and
    /// closes the connection: linger before closing.
    pub fn set_linger(&self) {
        self.linger.set(true);
    }

    /// Lingering close, as nginx does: closing a socket with unread input
    /// makes the kernel send RST, and a client still sending its body then
    /// loses the 413/503/408 response we wrote (its read fails with
    /// ECONNRESET). Our side has already shut down writing (FIN); read and
    /// drop what arrives until the client closes too, for at most
    /// `LINGER_TIME` or `LINGER_BYTES`.
    async fn discard_unread_input(&self) {
        const LINGER_TIME: Duration = Duration::from_secs(2);
        const LINGER_BYTES: usize = 64 * 1024 * 1024;
        let Some(fd) = self.fd.get() else {
            return;
        };
        let until = Instant::now() + LINGER_TIME;
        let mut buf = vec![0u8; 64 * 1024];
        let mut discarded = 0;
        while discarded < LINGER_BYTES && Instant::now() < until {
            // SAFETY: `fd` is this connection's socket, still owned by the
            // hyper connection that `drive` holds; `buf` is writable for
            // its length.
            let n =
                unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
            match n {
                0 => return,
                n if n > 0 => discarded += n as usize,
                _ => match io::Error::last_os_error().kind() {
                    io::ErrorKind::WouldBlock => {
                        monoio::time::sleep(Duration::from_millis(20)).await
                    }
                    io::ErrorKind::Interrupted => {}
                    _ => return,
                },
            }
        }
    }

    /// HTTP/1: answers `408 Request Timeout` straight on the socket, for a
    /// request whose headers did not arrive in time. hyper has nothing of
    /// its own to write then (it is reading a head); if an earlier
    /// response is still stuck in a full send buffer, nothing is sent, as
    /// the bytes would interleave. Over TLS nothing is sent (a plaintext
    /// response would corrupt the record stream): the connection closes.
    pub fn send_request_timeout(&self) {
        const RESPONSE: &[u8] = b"HTTP/1.1 408 Request Timeout\r\n\
            content-type: application/json\r\n\
            connection: close\r\n\
            content-length: 55\r\n\r\n\
            {\"error\":\"request headers not received within timeout\"}";
        if self.write_blocked.get() || self.encrypted.get() {
            return;
        }
        let Some(fd) = self.fd.get() else {
            return;
        };
        // SAFETY: `fd` is the socket of this connection, whose owner (the
        // hyper connection in `drive`) is still alive while this runs; a
        // non-blocking send of a constant buffer touches nothing else.
        let sent = unsafe {
            libc::send(
                fd,
                RESPONSE.as_ptr().cast(),
                RESPONSE.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if sent < 0 {
            tracing::debug!(error = %io::Error::last_os_error(), "could not send 408");
        }
    }
}

/// Marks a request or stream in progress while alive.
#[derive(Debug)]
pub struct ActiveRequest(Rc<ConnState>);

impl ActiveRequest {
    pub fn begin(state: &Rc<ConnState>) -> Self {
        state.active.set(state.active.get() + 1);
        state.started.set(state.started.get() + 1);
        state.head_started.set(None);
        Self(state.clone())
    }
}

impl Drop for ActiveRequest {
    fn drop(&mut self) {
        let s = &self.0;
        s.active.set(s.active.get().saturating_sub(1));
        if s.active.get() == 0 {
            s.idle_since.set(Instant::now());
        }
    }
}

/// A response body that keeps its stream counted as active until hyper
/// has sent (or abandoned) it: an HTTP/2 stream is open until then. It may
/// also keep its request counted in flight on the shard till then.
#[derive(Debug)]
pub struct TrackedBody<B> {
    inner: B,
    _active: ActiveRequest,
    _in_flight: Option<InFlight>,
}

impl<B> TrackedBody<B> {
    pub fn new(inner: B, active: ActiveRequest) -> Self {
        Self {
            inner,
            _active: active,
            _in_flight: None,
        }
    }

    /// Keeps `in_flight` (if any) until the body is sent or dropped.
    pub fn holding(mut self, in_flight: Option<InFlight>) -> Self {
        self._in_flight = in_flight;
        self
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for TrackedBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The socket as hyper sees it (through `MonoioIo`), counting reads and
/// noting a full send buffer.
#[derive(Debug)]
pub struct ConnIo<T> {
    inner: T,
    state: Rc<ConnState>,
}

impl<T: std::os::fd::AsRawFd> ConnIo<T> {
    pub fn new(inner: T, state: Rc<ConnState>) -> Self {
        state.fd.set(Some(inner.as_raw_fd()));
        Self { inner, state }
    }
}

impl<T> ConnIo<T> {
    /// Over a TLS stream: counts plaintext bytes (so the protocol's
    /// policies see the same bytes as without TLS) and keeps `fd`, the
    /// socket underneath, for the lingering close only.
    pub fn encrypted(inner: T, fd: RawFd, state: Rc<ConnState>) -> Self {
        state.fd.set(Some(fd));
        state.encrypted.set(true);
        Self { inner, state }
    }
}

impl<T: AsyncWrite + Unpin> ConnIo<T> {
    /// Writes the HTTP/2 watch's own frames when hyper's writes are at a
    /// frame boundary. `Ready(Ok)` when nothing (more) can be written now.
    fn poll_inject(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Some(watch) = self.state.h2.get() else {
            return Poll::Ready(Ok(()));
        };
        let mut wrote = false;
        while let Some(frames) = watch.injectable() {
            match Pin::new(&mut self.inner).poll_write(cx, &frames) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => {
                    watch.injected(n);
                    wrote = true;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    self.state.write_blocked.set(true);
                    return Poll::Pending;
                }
            }
        }
        if wrote {
            let r = Pin::new(&mut self.inner).poll_flush(cx);
            self.state.write_blocked.set(r.is_pending());
            return r;
        }
        Poll::Ready(Ok(()))
    }

    fn h2_closed(&self) -> bool {
        self.state.h2.get().is_some_and(H2Watch::is_closed)
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for ConnIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.state.h2.get().is_none() {
            let before = buf.filled().len();
            let r = Pin::new(&mut self.inner).poll_read(cx, buf);
            if let Poll::Ready(Ok(())) = r {
                self.state.on_read(buf.filled().len() - before);
            }
            return r;
        }
        // hyper polls the read side whenever the connection is polled, so
        // our frames go out from here when hyper has nothing to write.
        if let Poll::Ready(Err(e)) = self.poll_inject(cx) {
            return Poll::Ready(Err(e));
        }
        loop {
            if self.h2_closed() {
                // Our GOAWAY ended the connection: hyper sees EOF.
                return Poll::Ready(Ok(()));
            }
            let before = buf.filled().len();
            let r = Pin::new(&mut self.inner).poll_read(cx, buf);
            let Poll::Ready(Ok(())) = r else {
                return r;
            };
            let read = buf.filled().len() - before;
            self.state.on_read(read);
            let Some(watch) = self.state.h2.get() else {
                return Poll::Ready(Ok(()));
            };
            let strip = watch.on_read(&buf.filled()[before..], self.state.active() > 0);
            if let Some((from, to)) = strip {
                // Our ping's ACK is ours alone: h2 never sent that ping.
                let filled = buf.filled_mut();
                filled.copy_within(before + to.., before + from);
                let len = buf.filled().len() - (to - from);
                buf.set_filled(len);
            }
            if let Poll::Ready(Err(e)) = self.poll_inject(cx) {
                return Poll::Ready(Err(e));
            }
            // Nothing left for hyper is not EOF: read again.
            if read == 0 || buf.filled().len() > before {
                return Poll::Ready(Ok(()));
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ConnIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let Some(watch) = self.state.h2.get() else {
            let r = Pin::new(&mut self.inner).poll_write(cx, buf);
            self.state.write_blocked.set(r.is_pending());
            return r;
        };
        let limit = watch.writable(buf.len());
        if limit == 0 && !buf.is_empty() {
            std::task::ready!(self.poll_inject(cx))?;
        }
        if self.h2_closed() {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        let limit = self
            .state
            .h2
            .get()
            .map_or(buf.len(), |w| w.writable(buf.len()));
        let r = Pin::new(&mut self.inner).poll_write(cx, &buf[..limit]);
        self.state.write_blocked.set(r.is_pending());
        if let (Poll::Ready(Ok(n)), Some(watch)) = (&r, self.state.h2.get()) {
            watch.on_written(&buf[..*n]);
        }
        r
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let Some(watch) = self.state.h2.get() else {
            let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
            self.state.write_blocked.set(r.is_pending());
            return r;
        };
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if watch.writable(total) < total {
            // Our frames wait for the end of hyper's current frame: write
            // up to it from the first slice, then ours.
            let first = bufs
                .iter()
                .find(|b| !b.is_empty())
                .map_or(&[][..], |b| &b[..]);
            return self.poll_write(cx, first);
        }
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.state.write_blocked.set(r.is_pending());
        if let (Poll::Ready(Ok(n)), Some(watch)) = (&r, self.state.h2.get()) {
            let mut left = *n;
            for b in bufs {
                if left == 0 {
                    break;
                }
                let take = left.min(b.len());
                watch.on_written(&b[..take]);
                left -= take;
            }
        }
        r
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.state.write_blocked.set(r.is_pending());
        r
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Polls hyper's connection `conn` to completion while applying `policy`
/// (re-evaluated whenever the deadline it last gave passes) and the
/// shard's drain: `graceful` is hyper's `graceful_shutdown` (HTTP/1:
/// keep-alive off, in-flight response sent with `Connection: close`;
/// HTTP/2: GOAWAY, open streams finish).
pub async fn drive<C, E>(
    conn: C,
    state: &ConnState,
    what: &'static str,
    policy: impl Fn(&ConnState, Instant) -> Decision,
    graceful: impl Fn(Pin<&mut C>),
    flush: &dyn super::DeferredFlush,
) where
    C: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    #[derive(Clone, Copy)]
    enum Closing {
        /// Told to close by the policy: dropped if still open by then.
        By(Instant),
        /// Told to close by the policy, with no bound on its streams.
        Unbounded,
        /// Draining for shutdown since then.
        Draining(Instant),
    }
    enum Woke<E> {
        Done(Result<(), E>),
        Drain,
        /// A deadline passed or may have moved: ask the policy again.
        Deadline,
    }
    let mut conn = pin!(conn);
    // Set once the connection was told to close: from then on no policy,
    // only a deadline for the close itself.
    let mut closing: Option<Closing> = None;
    let flush_waited = Cell::new(false);
    loop {
        let now = Instant::now();
        let deadline = match closing {
            Some(Closing::By(by)) => by,
            // Only the drain wakes it; the deadline merely re-arms.
            Some(Closing::Unbounded) => now + Duration::from_secs(3600),
            Some(Closing::Draining(since)) if state.active() == 0 && !state.write_blocked() => {
                // In-flight work is done; give the peer a moment to see the
                // GOAWAY (and answer hyper's PING) rather than depend on it.
                since.max(state.idle_since()) + DRAIN_IDLE_GRACE
            }
            // Requests in flight or a response still being sent: the
            // shard's exit timeout bounds them.
            Some(Closing::Draining(_)) => now + DRAIN_IDLE_GRACE,
            None => match policy(state, now) {
                Decision::WaitUntil(t) => t,
                Decision::Drop(reason) => {
                    tracing::debug!("{what}: closing connection: {reason}");
                    return;
                }
                Decision::RequestTimeout => {
                    tracing::debug!("{what}: request headers timed out; answering 408");
                    state.send_request_timeout();
                    return;
                }
                Decision::Close(reason) => {
                    tracing::debug!("{what}: closing connection: {reason}");
                    graceful(conn.as_mut());
                    closing = Some(Closing::By(now + CLOSE_GRACE));
                    continue;
                }
                Decision::CloseWithin(reason, grace) => {
                    tracing::debug!("{what}: closing connection: {reason}");
                    graceful(conn.as_mut());
                    closing = Some(match grace {
                        Some(grace) => Closing::By(now + grace),
                        None => Closing::Unbounded,
                    });
                    continue;
                }
            },
        };
        if matches!(closing, Some(Closing::By(_) | Closing::Draining(_))) && now >= deadline {
            tracing::debug!("{what}: connection did not close in time; dropped");
            return;
        }
        // The first byte of a request may bring the deadline forward
        // (header timeout shorter than what is left of the idle timeout).
        // It is read inside `conn`'s poll, by this very task: checking
        // right after that poll (`biased`) catches it without a wake-up.
        let planned_head = state.head_started().is_some();
        let woke = monoio::select! {
            biased;
            // What hyper's poll buffered goes out in one write after it.
            r = poll_fn(|cx| {
                let r = conn.as_mut().poll(cx);
                // Blocked while the socket refuses the buffer; cleared
                // here too, since hyper may not write again to clear it.
                let waiting = flush.after_poll(cx);
                if waiting || flush_waited.get() {
                    state.write_blocked.set(waiting);
                    flush_waited.set(waiting);
                }
                r
            }) => Woke::Done(r),
            _ = poll_fn(|_| {
                if closing.is_none() && !planned_head && state.head_started().is_some() {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            }) => Woke::Deadline,
            // A connection already told to close (idle GOAWAY, whose grace
            // may outlast the exit timeout) still drains with the shard.
            _ = state.drained(), if !matches!(closing, Some(Closing::Draining(_))) => Woke::Drain,
            _ = monoio::time::sleep_until(deadline.into()) => Woke::Deadline,
        };
        match woke {
            Woke::Done(r) => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "{what}: connection ended with an error");
                }
                if state.linger.get() {
                    // `conn` (the socket's owner) is still alive here.
                    state.discard_unread_input().await;
                }
                return;
            }
            Woke::Drain => {
                if closing.is_none() {
                    graceful(conn.as_mut());
                }
                closing = Some(Closing::Draining(Instant::now()));
            }
            Woke::Deadline => {}
        }
    }
}
