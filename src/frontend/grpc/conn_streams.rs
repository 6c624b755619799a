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
//! the connection is polled again while either asked for it, so an answer
//! computed inline is written in the same poll that read its request.
//!
//! Fairness, measured with a unary c=1 call beside a c=64
//! `ModelStreamInfer` load of `simple` on one VM core (p50 54-71 µs with a
//! task per stream):
//! * monoio runs a task woken during its own poll again at the front of
//!   its queue, and h2 wakes the connection whenever a stream hands it a
//!   frame: polled with the task's waker, a busy connection stayed at the
//!   front round after round (neighbour p50 470-630 µs). So the connection
//!   and its streams are polled with a waker ([`Absorb`]) that only notes
//!   wakes from inside the poll (the loop answers them) and passes every
//!   other wake on; work still asked for after the last pass is queued
//!   behind the shard's other tasks through a spawned one-shot task.
//! * Even so, with streaming calls inside too, the neighbour waited far
//!   longer (p50 324-344 µs, though `ModelStreamInfer` served 183-196k/s
//!   against 146k/s). Not because one poll ran long: capping the streams
//!   polled per task poll at 16 or 4 left it at 328-418 µs. Most of it is
//!   monoio's io_uring driver: the poll of its internal epoll instance,
//!   which brings the readiness of every socket (poll-io), is armed only
//!   when the runtime parks, and a connection that is always queued again
//!   keeps the shard from parking, so the other sockets wait for the queue
//!   to drain. With `--io-driver epoll` (whose busy path is an
//!   `epoll_wait(0)` per round) the same build gave 134-147 µs, against
//!   65-70 µs with a task per streaming call. Streaming calls therefore
//!   keep a task each ([`StreamExec::next_apart`]), and unary calls, one
//!   message each, run inside.
//!
//! The streams end with the connection: once hyper's connection future is
//! done, h2 has closed or reset every stream, and what is left of a stream
//! future is dropped (which cancels its request, as a reset does).

use std::{
    cell::{Cell, RefCell},
    future::Future,
    pin::Pin,
    rc::Rc,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    task::{Context, Poll, Wake, Waker},
};

use futures::{
    stream::{FuturesUnordered, StreamExt},
    task::AtomicWaker,
};

type LocalTask = Pin<Box<dyn Future<Output = ()>>>;

/// How often one poll goes back and forth between the connection and its
/// streams before the rest waits behind the shard's other tasks.
const PASSES: usize = 4;

/// The executor hyper's HTTP/2 server is built with: queues each stream
/// for [`WithStreams`] to run, or spawns it as a task of its own when the
/// router said so for the call it just made ([`StreamExec::next_apart`]).
#[derive(Clone, Default)]
pub struct StreamExec {
    /// Started during the connection's poll, not yet in the set (the set
    /// is not borrowed while hyper runs, nor hyper while the set does).
    started: Rc<RefCell<Vec<LocalTask>>>,
    apart: Rc<Cell<bool>>,
}

impl StreamExec {
    /// Whether the stream hyper hands over next (the one whose service
    /// call is being made: hyper calls the service, then at once hands the
    /// stream to this executor; `tests` pins that order) runs as a task of
    /// its own. Streaming calls do: inside the connection's poll they held
    /// the shard's other connections back (see the module's text).
    pub fn next_apart(&self, apart: bool) {
        self.apart.set(apart);
    }
}

impl<F> hyper::rt::Executor<F> for StreamExec
where
    F: Future<Output = ()> + 'static,
{
    fn execute(&self, fut: F) {
        if self.apart.take() {
            monoio::spawn(fut);
        } else {
            self.started.borrow_mut().push(Box::pin(fut));
        }
    }
}

/// The waker the connection and its streams are polled with.
#[derive(Default)]
struct Absorb {
    /// Inside [`WithStreams::poll`]: wakes are noted, not passed on.
    polling: AtomicBool,
    /// Woken since the current pass began.
    woken: AtomicBool,
    /// The connection task's own waker.
    task: AtomicWaker,
}

impl Wake for Absorb {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Noted first, then passed on unless the poll is running: a wake
        // from another thread racing the poll's end is either seen by the
        // poll (which re-queues the task) or passed on here.
        self.woken.store(true, Ordering::SeqCst);
        if !self.polling.load(Ordering::SeqCst) {
            self.task.wake();
        }
    }
}

/// hyper's connection future with its streams: ready when the connection
/// is; polls the streams the connection started or that were woken.
pub struct WithStreams<C> {
    conn: Pin<Box<C>>,
    exec: StreamExec,
    running: FuturesUnordered<LocalTask>,
    absorb: Arc<Absorb>,
    waker: Waker,
}

impl<C: Future> WithStreams<C> {
    /// `conn` must have been built with `exec`.
    pub fn new(conn: C, exec: StreamExec) -> Self {
        let absorb = Arc::new(Absorb::default());
        Self {
            conn: Box::pin(conn),
            exec,
            running: FuturesUnordered::new(),
            waker: Waker::from(absorb.clone()),
            absorb,
        }
    }

    /// The connection itself (for a graceful shutdown).
    pub fn conn(&mut self) -> Pin<&mut C> {
        self.conn.as_mut()
    }

    /// Streams not yet finished.
    #[cfg(test)]
    fn running(&self) -> usize {
        self.running.len() + self.exec.started.borrow().len()
    }

    /// One pass: the connection, then every new or woken stream; whether
    /// they asked for another shows in `absorb.woken`.
    fn pass(&mut self) -> Poll<C::Output> {
        self.absorb.woken.store(false, Ordering::SeqCst);
        let mut cx = Context::from_waker(&self.waker);
        if let Poll::Ready(out) = self.conn.as_mut().poll(&mut cx) {
            return Poll::Ready(out);
        }
        let started = std::mem::take(&mut *self.exec.started.borrow_mut());
        self.running.extend(started);
        #[cfg(test)]
        tests::INSIDE.set(true);
        while let Poll::Ready(Some(())) = self.running.poll_next_unpin(&mut cx) {}
        #[cfg(test)]
        tests::INSIDE.set(false);
        Poll::Pending
    }
}

impl<C: Future> Future for WithStreams<C> {
    type Output = C::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<C::Output> {
        let this = self.get_mut();
        this.absorb.task.register(cx.waker());
        this.absorb.polling.store(true, Ordering::SeqCst);
        let mut out = None;
        for _ in 0..PASSES {
            if let Poll::Ready(done) = this.pass() {
                out = Some(done);
                break;
            }
            // A stream that ran hands h2 answers or window updates (h2
            // then wakes the connection), and a connection poll that read
            // frames wakes their streams.
            if !this.absorb.woken.load(Ordering::SeqCst) {
                break;
            }
        }
        this.absorb.polling.store(false, Ordering::SeqCst);
        if let Some(done) = out {
            return Poll::Ready(done);
        }
        if this.absorb.woken.load(Ordering::SeqCst) {
            // Still busy after the last pass (or woken from another thread
            // as it ended): come back behind the tasks already queued.
            let waker = cx.waker().clone();
            monoio::spawn(async move { waker.wake() });
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::rt::Executor;
    use std::cell::Cell;

    thread_local! {
        /// Set while [`WithStreams::pass`] polls its streams.
        pub(super) static INSIDE: Cell<bool> = const { Cell::new(false) };
    }

    /// A stand-in for h2's shared state: streams hand it frames and wake
    /// the connection, which "writes" them on its next poll.
    #[derive(Default)]
    struct Shared {
        queued: Cell<usize>,
        written: Cell<usize>,
        conn: RefCell<Option<Waker>>,
    }

    impl Shared {
        fn hand_frame(&self) {
            self.queued.set(self.queued.get() + 1);
            if let Some(w) = self.conn.borrow_mut().take() {
                w.wake();
            }
        }
    }

    /// Starts `n` streams on its first poll, each handing one frame; ready
    /// once all frames are written. Counts its polls.
    struct FakeConn {
        exec: StreamExec,
        shared: Rc<Shared>,
        polls: usize,
        n: usize,
    }

    impl Future for FakeConn {
        type Output = usize;
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
            let this = self.get_mut();
            this.polls += 1;
            if this.polls == 1 {
                for _ in 0..this.n {
                    let shared = this.shared.clone();
                    this.exec.execute(async move { shared.hand_frame() });
                }
            }
            this.shared.written.set(this.shared.queued.get());
            if this.shared.written.get() == this.n {
                return Poll::Ready(this.polls);
            }
            *this.shared.conn.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    /// Counts the wakes it gets.
    #[derive(Default)]
    struct CountWakes(std::sync::atomic::AtomicUsize);

    impl Wake for CountWakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn streams_started_by_a_poll_run_in_it_and_their_frames_are_written_in_it() {
        let exec = StreamExec::default();
        let shared = Rc::new(Shared::default());
        let conn = FakeConn {
            exec: exec.clone(),
            shared: shared.clone(),
            polls: 0,
            n: 3,
        };
        let mut fut = std::pin::pin!(WithStreams::new(conn, exec));
        let wakes = Arc::new(CountWakes::default());
        let waker = Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        // One poll of the task: connection, its streams, connection again.
        assert_eq!(fut.as_mut().poll(&mut cx), Poll::Ready(2));
        assert_eq!(shared.written.get(), 3);
        assert_eq!(fut.running(), 0);
        // The wake h2 sent from inside the poll was answered there, not
        // passed on (which would queue the task again at monoio's front).
        assert_eq!(wakes.0.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_pending_stream_runs_again_when_woken_from_outside_and_ends_with_the_connection() {
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
        let wakes = Arc::new(CountWakes::default());
        let waker = Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(fut.as_mut().poll(&mut cx).is_pending());
        assert_eq!(fut.running(), 1);
        assert_eq!(wakes.0.load(Ordering::SeqCst), 0);
        // Woken from outside the poll: passed on to the task.
        tx.send(()).expect("the stream waits");
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
        assert!(!got.get());
        assert!(fut.as_mut().poll(&mut cx).is_pending());
        assert!(got.get());
        assert_eq!(fut.running(), 0);
        open.set(false);
        assert!(fut.as_mut().poll(&mut cx).is_ready());
    }

    #[test]
    fn a_stream_marked_apart_runs_as_its_own_task_and_outlives_the_connection_poll() {
        monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .expect("runtime")
            .block_on(async {
                let exec = StreamExec::default();
                let ran = Rc::new(Cell::new(0));
                exec.next_apart(true);
                let r = ran.clone();
                exec.execute(async move { r.set(r.get() + 1) });
                // The mark is for one stream only.
                let r = ran.clone();
                exec.execute(async move { r.set(r.get() + 10) });
                let fut = WithStreams::new(std::future::pending::<()>(), exec);
                assert_eq!(
                    fut.running(),
                    1,
                    "only the unmarked stream is the connection's"
                );
                let mut fut = std::pin::pin!(fut);
                let waker = futures::task::noop_waker();
                let _ = fut.as_mut().poll(&mut Context::from_waker(&waker));
                assert_eq!(
                    ran.get(),
                    10,
                    "the apart stream has not run inside the poll"
                );
                monoio::time::sleep(std::time::Duration::from_millis(1)).await;
                assert_eq!(ran.get(), 11);
            });
    }

    /// Marks `/apart` calls apart, and notes for each call whether its
    /// response future ran inside the connection's poll.
    #[derive(Clone)]
    struct Probe {
        exec: StreamExec,
        seen: Rc<RefCell<Vec<(String, bool)>>>,
    }

    impl hyper::service::Service<http::Request<hyper::body::Incoming>> for Probe {
        type Response = http::Response<http_body_util::Empty<bytes::Bytes>>;
        type Error = std::convert::Infallible;
        type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>>>>;

        fn call(&self, req: http::Request<hyper::body::Incoming>) -> Self::Future {
            let path = req.uri().path().to_string();
            self.exec.next_apart(path == "/apart");
            let seen = self.seen.clone();
            Box::pin(async move {
                seen.borrow_mut().push((path, INSIDE.get()));
                Ok(http::Response::new(http_body_util::Empty::new()))
            })
        }
    }

    /// `next_apart` relies on hyper's HTTP/2 server calling the service
    /// and then, at once, handing that same stream to the executor (not a
    /// documented contract): with a real hyper client and server, each
    /// marked call must run as a task and each other call inside the
    /// connection's poll, one at a time and several accepted together.
    #[test]
    fn hyper_hands_over_each_stream_right_after_its_service_call() {
        use monoio::io::IntoPollIo;
        use monoio_compat::hyper::{MonoioExecutor, MonoioIo};
        monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .expect("runtime")
            .block_on(async {
                let (server, client) = monoio::net::UnixStream::pair().expect("socket pair");
                let exec = StreamExec::default();
                let seen = Rc::new(RefCell::new(Vec::new()));
                let probe = Probe {
                    exec: exec.clone(),
                    seen: seen.clone(),
                };
                let io = MonoioIo::new(server.into_poll_io().expect("poll io"));
                let conn = hyper::server::conn::http2::Builder::new(exec.clone())
                    .timer(monoio_compat::hyper::MonoioTimer)
                    .serve_connection(io, probe);
                monoio::spawn(WithStreams::new(conn, exec));
                let io = MonoioIo::new(client.into_poll_io().expect("poll io"));
                let (send, conn) = hyper::client::conn::http2::handshake(MonoioExecutor, io)
                    .await
                    .expect("handshake");
                monoio::spawn(conn);
                let call = |path: &'static str| {
                    let mut send = send.clone();
                    async move {
                        let req = http::Request::post(format!("http://probe{path}"))
                            .body(http_body_util::Empty::<bytes::Bytes>::new())
                            .expect("request");
                        let resp = send.send_request(req).await.expect("response");
                        assert_eq!(resp.status(), http::StatusCode::OK);
                    }
                };
                let order = [
                    "/apart", "/inline", "/apart", "/apart", "/inline", "/inline",
                ];
                for path in order {
                    call(path).await;
                }
                let mut expected: Vec<(String, bool)> = order
                    .iter()
                    .map(|p| (p.to_string(), *p == "/inline"))
                    .collect();
                assert_eq!(*seen.borrow(), expected, "one call at a time");
                // Sent together: hyper accepts them in one poll.
                seen.borrow_mut().clear();
                futures::future::join_all(order.map(call)).await;
                let mut got = seen.borrow().clone();
                got.sort();
                expected.sort();
                assert_eq!(got, expected, "calls accepted together");
            });
    }
}
