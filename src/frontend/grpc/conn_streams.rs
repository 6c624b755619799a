//! A connection's HTTP/2 streams, run by the connection's own task.
//!
//! hyper hands each accepted stream (the service call and the response it
//! pipes into h2) to an executor. Spawning each as a monoio task cost a task
//! hop per call and, at concurrency 1, often a runtime round between the
//! request's read and its answer's write: monoio runs at most twice as many
//! tasks per round as were queued when the round began, then polls its
//! driver (a zero-timeout `epoll_wait` or a submit-only `io_uring_enter`)
//! before it runs the stream task. Here the streams live beside the
//! connection instead ([`WithStreams`]): after each poll of hyper's
//! connection, the streams it started or that were woken are polled, and
//! the connection is polled again if they ran, so an answer computed inline
//! is written in the same poll that read its request.
//!
//! The streams end with the connection: once hyper's connection future is
//! done, h2 has closed or reset every stream, and what is left of a stream
//! future is dropped (which cancels its request, as a reset does).

use std::{
    cell::{Cell, RefCell},
    future::Future,
    pin::Pin,
    rc::Rc,
    task::{Context, Poll},
};

use futures::stream::{FuturesUnordered, StreamExt};

type LocalTask = Pin<Box<dyn Future<Output = ()>>>;

/// How often one poll goes back and forth between the connection and its
/// streams before it yields to the shard's other tasks.
const PASSES: usize = 4;

/// The executor hyper's HTTP/2 server is built with: queues each stream
/// for [`WithStreams`] to run.
#[derive(Clone, Default)]
pub struct StreamExec {
    shared: Rc<Shared>,
}

#[derive(Default)]
struct Shared {
    /// Started during the connection's poll, not yet in the set (the set
    /// is not borrowed while hyper runs, nor hyper while the set does).
    started: RefCell<Vec<LocalTask>>,
    /// Set by every poll of a stream; taken by [`WithStreams`].
    ran: Cell<bool>,
}

impl<F> hyper::rt::Executor<F> for StreamExec
where
    F: Future<Output = ()> + 'static,
{
    fn execute(&self, fut: F) {
        let ran = Rc::clone(&self.shared);
        self.shared.started.borrow_mut().push(Box::pin(async move {
            let mut fut = std::pin::pin!(fut);
            std::future::poll_fn(|cx| {
                ran.ran.set(true);
                fut.as_mut().poll(cx)
            })
            .await
        }));
    }
}

/// hyper's connection future with its streams: ready when the connection
/// is; polls the streams the connection started or that were woken.
pub struct WithStreams<C> {
    conn: Pin<Box<C>>,
    exec: StreamExec,
    running: FuturesUnordered<LocalTask>,
}

impl<C: Future> WithStreams<C> {
    /// `conn` must have been built with `exec`.
    pub fn new(conn: C, exec: StreamExec) -> Self {
        Self {
            conn: Box::pin(conn),
            exec,
            running: FuturesUnordered::new(),
        }
    }

    /// The connection itself (for a graceful shutdown).
    pub fn conn(&mut self) -> Pin<&mut C> {
        self.conn.as_mut()
    }

    /// Streams not yet finished.
    #[cfg(test)]
    fn running(&self) -> usize {
        self.running.len() + self.exec.shared.started.borrow().len()
    }

    /// Polls every new or woken stream; whether any of them ran.
    fn poll_streams(&mut self, cx: &mut Context<'_>) -> bool {
        let started = std::mem::take(&mut *self.exec.shared.started.borrow_mut());
        self.running.extend(started);
        self.exec.shared.ran.set(false);
        while let Poll::Ready(Some(())) = self.running.poll_next_unpin(cx) {}
        self.exec.shared.ran.take()
    }
}

impl<C: Future> Future for WithStreams<C> {
    type Output = C::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<C::Output> {
        let this = self.get_mut();
        for _ in 0..PASSES {
            if let Poll::Ready(out) = this.conn.as_mut().poll(cx) {
                return Poll::Ready(out);
            }
            // A stream that ran may have handed h2 an answer or a window
            // update that only the connection's poll writes.
            if !this.poll_streams(cx) {
                return Poll::Pending;
            }
        }
        // Still busy: let the shard's other tasks run first.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::rt::Executor;

    /// A connection stand-in: starts `n` streams on its first poll, each
    /// bumping `done` when polled and then finishing; ready once all are
    /// done.
    struct FakeConn {
        exec: StreamExec,
        polls: Rc<Cell<usize>>,
        done: Rc<Cell<usize>>,
        n: usize,
    }

    impl Future for FakeConn {
        type Output = usize;
        fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<usize> {
            let this = self.get_mut();
            this.polls.set(this.polls.get() + 1);
            if this.polls.get() == 1 {
                for _ in 0..this.n {
                    let done = this.done.clone();
                    this.exec.execute(async move { done.set(done.get() + 1) });
                }
            }
            if this.done.get() == this.n {
                Poll::Ready(this.polls.get())
            } else {
                Poll::Pending
            }
        }
    }

    #[test]
    fn streams_started_by_a_poll_run_in_it_and_the_connection_sees_them_at_once() {
        let exec = StreamExec::default();
        let done = Rc::new(Cell::new(0));
        let conn = FakeConn {
            exec: exec.clone(),
            polls: Rc::default(),
            done: done.clone(),
            n: 3,
        };
        let mut fut = std::pin::pin!(WithStreams::new(conn, exec));
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        // One poll of the task: connection, its streams, connection again.
        assert_eq!(fut.as_mut().poll(&mut cx), Poll::Ready(2));
        assert_eq!(done.get(), 3);
        assert_eq!(fut.running(), 0);
    }

    #[test]
    fn a_pending_stream_is_polled_again_only_when_woken_and_ends_with_the_connection() {
        let exec = StreamExec::default();
        let (tx, rx) = futures::channel::oneshot::channel::<()>();
        let got = Rc::new(Cell::new(false));
        let got2 = got.clone();
        exec.execute(async move {
            let _ = rx.await;
            got2.set(true);
        });
        let open = Rc::new(Cell::new(true));
        let open2 = open.clone();
        let conn = std::future::poll_fn(move |_| {
            if open2.get() {
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        });
        let mut fut = std::pin::pin!(WithStreams::new(conn, exec));
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(fut.as_mut().poll(&mut cx).is_pending());
        assert_eq!(fut.running(), 1);
        // Not woken: polling again does not run it (and does not loop).
        assert!(fut.as_mut().poll(&mut cx).is_pending());
        assert!(!got.get());
        tx.send(()).expect("the stream waits");
        assert!(fut.as_mut().poll(&mut cx).is_pending());
        assert!(got.get());
        assert_eq!(fut.running(), 0);
        open.set(false);
        assert!(fut.as_mut().poll(&mut cx).is_ready());
    }
}
