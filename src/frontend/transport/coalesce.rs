//! Write coalescing for HTTP/2 connections.
//!
//! h2 hands a DATA frame of 256 bytes or more to the socket as its own
//! chained buffer, and must flush it before it can encode the next frame:
//! every answer over 256 bytes became one `writev` (and one TCP segment
//! through the loopback's whole receive path), even when a batch of 30
//! answers was ready at once. `Coalesced` takes hyper's small writes into
//! one buffer, its flushes are deferred, and the connection's driver writes
//! the buffer once hyper's poll is over ([`DeferredFlush::after_poll`]), so
//! everything a poll produced leaves in one `write`. Writes of
//! [`WRITE_THROUGH`] bytes or more (large tensors) go out at once, the
//! buffer ahead of them in the same `writev`, never copied.

use std::{
    cell::{Cell, RefCell},
    io,
    os::fd::{AsRawFd, RawFd},
    pin::Pin,
    rc::Rc,
    task::{ready, Context, Poll},
};

use monoio::io::poll_io::{AsyncRead, AsyncWrite, ReadBuf};

/// A write at least this large is not copied into the buffer.
pub const WRITE_THROUGH: usize = 8 * 1024;
/// The buffer holds at most this much; past it, writes wait for the socket.
pub const BUFFER_LIMIT: usize = 64 * 1024;

struct Shared<T> {
    io: RefCell<T>,
    pending: RefCell<Vec<u8>>,
    /// Bytes of `pending` already written.
    sent: Cell<usize>,
    /// A deferred write's failure, returned by hyper's next write or flush.
    failed: Cell<Option<io::ErrorKind>>,
}

/// The stream hyper writes to (see the module's text).
pub struct Coalesced<T>(Rc<Shared<T>>);

/// The driver's handle on a [`Coalesced`] stream's buffer.
pub struct Flusher<T>(Rc<Shared<T>>);

/// What the connection's driver does after each poll of hyper's
/// connection: write what that poll left buffered.
pub trait DeferredFlush {
    /// Writes the buffer out, as far as the socket takes it (registering
    /// `cx` for writability when it takes no more). Returns whether bytes
    /// are still waiting.
    fn after_poll(&self, cx: &mut Context<'_>) -> bool;
}

/// For connections that write through (HTTP/1).
impl DeferredFlush for () {
    fn after_poll(&self, _: &mut Context<'_>) -> bool {
        false
    }
}

impl<T> Coalesced<T> {
    pub fn new(io: T) -> (Self, Flusher<T>) {
        let shared = Rc::new(Shared {
            io: RefCell::new(io),
            pending: RefCell::new(Vec::new()),
            sent: Cell::new(0),
            failed: Cell::new(None),
        });
        (Self(shared.clone()), Flusher(shared))
    }
}

impl<T: AsyncWrite + Unpin> Shared<T> {
    fn unsent(&self) -> usize {
        self.pending.borrow().len() - self.sent.get()
    }

    fn check(&self) -> io::Result<()> {
        match self.failed.get() {
            Some(kind) => Err(kind.into()),
            None => Ok(()),
        }
    }

    /// Writes the buffer (then `extra`, in the same `writev`, when given).
    /// `Ready(Ok(n))`: the buffer is out and `n` bytes of `extra` with it.
    fn poll_write_out(
        &self,
        cx: &mut Context<'_>,
        extra: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let mut io = self.io.borrow_mut();
        let mut pending = self.pending.borrow_mut();
        loop {
            let sent = self.sent.get();
            if sent == pending.len() {
                pending.clear();
                self.sent.set(0);
                if extra.iter().all(|b| b.is_empty()) {
                    return Poll::Ready(Ok(0));
                }
                return Pin::new(&mut *io).poll_write_vectored(cx, extra);
            }
            let mut slices = Vec::with_capacity(1 + extra.len());
            slices.push(io::IoSlice::new(&pending[sent..]));
            slices.extend(extra.iter().map(|b| io::IoSlice::new(b)));
            let n = match Pin::new(&mut *io).poll_write_vectored(cx, &slices) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => n,
                other => return other,
            };
            let left = pending.len() - sent;
            if n < left {
                self.sent.set(sent + n);
                continue;
            }
            pending.clear();
            self.sent.set(0);
            if n > left {
                return Poll::Ready(Ok(n - left));
            }
        }
    }

    fn poll_write(
        &self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.check()?;
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if total >= WRITE_THROUGH {
            return self.poll_write_out(cx, bufs);
        }
        if self.unsent() + total > BUFFER_LIMIT {
            ready!(self.poll_write_out(cx, &[]))?;
        }
        let mut pending = self.pending.borrow_mut();
        for b in bufs {
            pending.extend_from_slice(b);
        }
        Poll::Ready(Ok(total))
    }
}

impl<T: AsyncWrite + Unpin> DeferredFlush for Flusher<T> {
    fn after_poll(&self, cx: &mut Context<'_>) -> bool {
        let s = &self.0;
        if s.unsent() == 0 || s.failed.get().is_some() {
            return false;
        }
        match s.poll_write_out(cx, &[]) {
            Poll::Ready(Ok(_)) => {
                // TLS: the records are written only when flushed.
                if let Poll::Ready(Err(e)) = Pin::new(&mut *s.io.borrow_mut()).poll_flush(cx) {
                    s.failed.set(Some(e.kind()));
                }
                false
            }
            Poll::Ready(Err(e)) => {
                s.failed.set(Some(e.kind()));
                s.pending.borrow_mut().clear();
                s.sent.set(0);
                false
            }
            Poll::Pending => true,
        }
    }
}

impl<T: AsRawFd> AsRawFd for Coalesced<T> {
    fn as_raw_fd(&self) -> RawFd {
        self.0.io.borrow().as_raw_fd()
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Coalesced<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0.io.borrow_mut()).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Coalesced<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.0.poll_write(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.0.poll_write(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    /// Deferred: the driver writes the buffer after hyper's poll. A buffer
    /// the socket does not take holds hyper back through `poll_write`
    /// ([`BUFFER_LIMIT`]), not here.
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.0.check()?;
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.0.check()?;
        ready!(self.0.poll_write_out(cx, &[]))?;
        let mut io = self.0.io.borrow_mut();
        ready!(Pin::new(&mut *io).poll_flush(cx))?;
        Pin::new(&mut *io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A socket that records what it was given, takes at most `per_call`
    /// bytes per write, and can refuse (`blocked`) or fail.
    #[derive(Default)]
    struct Sink {
        bytes: Vec<u8>,
        writes: usize,
        per_call: usize,
        blocked: bool,
        fail: bool,
        shut: bool,
    }

    #[derive(Clone, Default)]
    struct Socket(Rc<RefCell<Sink>>);

    impl AsyncWrite for Socket {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
        }
        fn poll_write_vectored(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[io::IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let mut s = self.0.borrow_mut();
            if s.fail {
                return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
            }
            if s.blocked {
                return Poll::Pending;
            }
            s.writes += 1;
            let mut room = if s.per_call == 0 {
                usize::MAX
            } else {
                s.per_call
            };
            let mut n = 0;
            for b in bufs {
                let take = b.len().min(room);
                s.bytes.extend_from_slice(&b[..take]);
                room -= take;
                n += take;
            }
            Poll::Ready(Ok(n))
        }
        fn is_write_vectored(&self) -> bool {
            true
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.0.borrow_mut().shut = true;
            Poll::Ready(Ok(()))
        }
    }

    fn cx() -> Context<'static> {
        Context::from_waker(futures::task::noop_waker_ref())
    }

    fn write(c: &mut Coalesced<Socket>, data: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(c).poll_write(&mut cx(), data)
    }

    #[test]
    fn small_writes_leave_in_one_write_after_the_poll() {
        let socket = Socket::default();
        let (mut c, flusher) = Coalesced::new(socket.clone());
        for i in 0..30u8 {
            assert!(matches!(write(&mut c, &[i; 1081]), Poll::Ready(Ok(1081))));
            assert!(matches!(
                Pin::new(&mut c).poll_flush(&mut cx()),
                Poll::Ready(Ok(()))
            ));
        }
        assert_eq!(
            socket.0.borrow().writes,
            0,
            "nothing written during the poll"
        );
        assert!(!flusher.after_poll(&mut cx()));
        let s = socket.0.borrow();
        assert_eq!(s.writes, 1);
        let expected: Vec<u8> = (0..30u8).flat_map(|i| [i; 1081]).collect();
        assert_eq!(s.bytes, expected);
    }

    #[test]
    fn large_writes_go_through_with_the_buffer_ahead_in_order() {
        let socket = Socket::default();
        let (mut c, flusher) = Coalesced::new(socket.clone());
        assert!(matches!(write(&mut c, b"head"), Poll::Ready(Ok(4))));
        let big = vec![7u8; WRITE_THROUGH];
        assert!(matches!(write(&mut c, &big), Poll::Ready(Ok(n)) if n == big.len()));
        assert_eq!(
            socket.0.borrow().writes,
            1,
            "buffer and large write in one writev"
        );
        assert!(!flusher.after_poll(&mut cx()));
        let s = socket.0.borrow();
        assert_eq!(s.writes, 1, "nothing left for after the poll");
        assert_eq!(&s.bytes[..4], b"head");
        assert_eq!(&s.bytes[4..], &big[..]);
    }

    #[test]
    fn partial_and_refused_writes_keep_the_order_and_hold_hyper_back() {
        let socket = Socket::default();
        socket.0.borrow_mut().per_call = 1000;
        let (mut c, flusher) = Coalesced::new(socket.clone());
        let mut expected = Vec::new();
        for i in 0..10u8 {
            assert!(write(&mut c, &[i; 700]).is_ready());
            expected.extend_from_slice(&[i; 700]);
        }
        assert!(!flusher.after_poll(&mut cx()));
        assert_eq!(
            socket.0.borrow().bytes,
            expected,
            "partial writes looped to the end"
        );

        // The socket takes nothing: the buffer fills to its limit, then
        // hyper's writes wait; once it takes again, all of it arrives.
        socket.0.borrow_mut().blocked = true;
        let chunk = [9u8; 4096];
        let mut accepted = 0;
        while let Poll::Ready(Ok(n)) = write(&mut c, &chunk) {
            accepted += n;
            expected.extend_from_slice(&chunk[..n]);
            assert!(accepted <= BUFFER_LIMIT);
        }
        assert!(accepted > BUFFER_LIMIT - chunk.len());
        assert!(flusher.after_poll(&mut cx()), "bytes still waiting");
        socket.0.borrow_mut().blocked = false;
        assert!(!flusher.after_poll(&mut cx()));
        assert_eq!(socket.0.borrow().bytes, expected);
    }

    #[test]
    fn a_failed_deferred_write_fails_hyper_next_call_and_shutdown_flushes_first() {
        let socket = Socket::default();
        let (mut c, flusher) = Coalesced::new(socket.clone());
        assert!(write(&mut c, b"answer").is_ready());
        assert!(matches!(
            Pin::new(&mut c).poll_shutdown(&mut cx()),
            Poll::Ready(Ok(()))
        ));
        {
            let s = socket.0.borrow();
            assert_eq!(s.bytes, b"answer");
            assert!(s.shut);
        }
        assert!(write(&mut c, b"more").is_ready());
        socket.0.borrow_mut().fail = true;
        assert!(!flusher.after_poll(&mut cx()));
        assert!(
            matches!(write(&mut c, b"x"), Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::BrokenPipe)
        );
        assert!(matches!(
            Pin::new(&mut c).poll_flush(&mut cx()),
            Poll::Ready(Err(_))
        ));
    }
}
