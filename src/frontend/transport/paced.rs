//! Pacing of large request bodies on a shard.
//!
//! A client that sends faster than the shard copies keeps the body's task
//! runnable: every poll finds another frame. monoio reaps io_uring
//! completions (the readiness of the shard's *other* sockets) only when
//! it parks, and a runtime with a runnable task never parks, so a 60 MB
//! body held every other connection of its shard for tens of
//! milliseconds. Every [`PAUSE_EVERY_BYTES`] a paced body hands the shard
//! back for [`PAUSE`] on a timer: the runtime then finds nothing to run,
//! parks, and serves the other sockets.
//!
//! One timer per shard serves every paused body (a body only holds
//! counters, so it stays `Send` as tonic's request bodies must be; all of
//! it runs on the shard's thread).

use std::{
    cell::RefCell,
    pin::Pin,
    rc::Rc,
    task::{Context, Poll, Waker},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::shard::PreciseTimer;

/// Bytes of body taken between two pauses: about 50 µs of copying and
/// page faults.
pub const PAUSE_EVERY_BYTES: usize = 1024 * 1024;

/// How long the shard is handed back for: long enough that the runtime
/// finds nothing to run and parks (a timer that has already fired when it
/// looks again keeps it spinning through its queue instead), short enough
/// to cost a 60 MB body a few milliseconds in all.
pub const PAUSE: Duration = Duration::from_micros(50);

#[derive(Default)]
struct Pauser {
    /// Completed pauses; a waiter resumes once this passes its ticket.
    generation: u64,
    waiting: Vec<Waker>,
    armed: bool,
    timer: Option<Rc<PreciseTimer>>,
}

thread_local! {
    static PAUSER: RefCell<Pauser> = RefCell::new(Pauser::default());
}

/// Registers `cx` to be woken after the shard's next pause and returns
/// the ticket to compare with [`pause_over`]. `None` off a shard, where
/// there is no runtime to pause.
fn request_pause(cx: &Context<'_>) -> Option<u64> {
    crate::shard::with_current(|_| ())?;
    PAUSER.with(|p| {
        let mut p = p.borrow_mut();
        p.waiting.push(cx.waker().clone());
        if !p.armed {
            p.armed = true;
            let timer = p
                .timer
                .get_or_insert_with(|| Rc::new(PreciseTimer::default()))
                .clone();
            monoio::spawn(async move {
                timer.sleep_until(Instant::now() + PAUSE).await;
                let waiting = PAUSER.with(|p| {
                    let mut p = p.borrow_mut();
                    p.generation += 1;
                    p.armed = false;
                    std::mem::take(&mut p.waiting)
                });
                waiting.into_iter().for_each(Waker::wake);
            });
        }
        Some(p.generation)
    })
}

/// Whether the pause `ticket` waited for has ended; if not, `cx` is
/// registered (again) for its end.
fn pause_over(ticket: u64, cx: &Context<'_>) -> bool {
    PAUSER.with(|p| {
        let mut p = p.borrow_mut();
        if p.generation > ticket {
            return true;
        }
        p.waiting.push(cx.waker().clone());
        false
    })
}

/// The pacing state of one body: bytes since its last pause, and the
/// pause it waits for.
#[derive(Default)]
pub struct Pacer {
    since_pause: usize,
    paused: Option<u64>,
}

impl Pacer {
    /// Ready unless a pause requested by [`Pacer::account`] is still on.
    pub fn poll_ready(&mut self, cx: &Context<'_>) -> Poll<()> {
        if let Some(ticket) = self.paused {
            if !pause_over(ticket, cx) {
                return Poll::Pending;
            }
            self.paused = None;
        }
        Poll::Ready(())
    }

    /// Counts `bytes` passed on; every [`PAUSE_EVERY_BYTES`] the next
    /// [`Pacer::poll_ready`] waits for a pause of the shard.
    pub fn account(&mut self, bytes: usize, cx: &Context<'_>) {
        self.since_pause += bytes;
        if self.since_pause >= PAUSE_EVERY_BYTES {
            self.since_pause = 0;
            self.paused = request_pause(cx);
        }
    }
}

/// A request body that pauses its shard every [`PAUSE_EVERY_BYTES`].
pub struct PacedBody<B> {
    inner: B,
    pacer: Pacer,
}

impl<B> PacedBody<B> {
    pub fn new(inner: B) -> Self {
        Self {
            inner,
            pacer: Pacer::default(),
        }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for PacedBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        if this.pacer.poll_ready(cx).is_pending() {
            return Poll::Pending;
        }
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                // The pause takes effect before the next frame.
                this.pacer.account(data.len(), cx);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
