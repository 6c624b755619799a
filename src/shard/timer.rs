//! Sleeping to a deadline with microsecond precision on a shard.
//!
//! monoio's timer wheel ticks in whole milliseconds and rounds deadlines up,
//! so a dynamic batcher's `max_queue_delay_microseconds: 100` would become
//! one to two milliseconds. Batcher delays are latency the user chose to
//! the microsecond, so they are waited on a [`PreciseTimer`].
//!
//! On io_uring the timer is a `timerfd` armed for the deadline and read
//! through the ring: the shard parks in `io_uring_enter` like for any other
//! I/O, so it keeps serving sockets and cross-thread wake-ups (the eventfd
//! that unparks it) while it waits, and spends no CPU doing so. An earlier
//! version yielded through the last millisecond instead; on io_uring a
//! runtime that never parks neither reaps completions nor drains remote
//! wake-ups, so arrivals from other shards missed the batch they were
//! waiting for, and a deadline recurring per request kept the shard awake.
//!
//! The epoll driver polls readiness (with a zero timeout) on every
//! scheduling round, so there the last millisecond is still yielded
//! through: a blocking `read` on the timerfd would stall the thread.

use std::{
    cell::{Cell, OnceCell, RefCell},
    future::{poll_fn, Future},
    os::fd::{AsRawFd, FromRawFd, RawFd},
    pin::Pin,
    rc::Rc,
    task::{Context, Poll},
    time::{Duration, Instant},
};

use super::yield_now;

/// The part of a yielded wait left to the coarse timer is shortened by
/// this much, which covers the wheel's rounding.
const TIMER_SLACK: Duration = Duration::from_millis(1);

/// Returns at `deadline` (or just after), never more than a scheduling
/// round late, by yielding through the last millisecond. The fallback of
/// [`PreciseTimer`] where no timerfd can be used.
async fn yield_until(deadline: Instant) {
    let now = Instant::now();
    if let Some(coarse) = deadline
        .checked_duration_since(now)
        .and_then(|left| left.checked_sub(TIMER_SLACK))
        .filter(|d| !d.is_zero())
    {
        monoio::time::sleep(coarse).await;
    }
    while Instant::now() < deadline {
        yield_now().await;
    }
}

/// Returns at `deadline` or up to a couple of milliseconds later, on the
/// timer wheel alone: for housekeeping (idle sequences) that needs no
/// precision.
pub async fn sleep_until_coarse(deadline: Instant) {
    if let Some(left) = deadline.checked_duration_since(Instant::now()) {
        monoio::time::sleep(left).await;
    }
}

type Expiry = Pin<Box<dyn Future<Output = std::io::Result<usize>>>>;

/// A timerfd read through io_uring. One read stays in flight across waits,
/// so a waiter that is dropped (a `select!` won by another branch) cancels
/// nothing and the next wait re-arms the same descriptor with one syscall.
struct TimerFd {
    file: Rc<monoio::fs::File>,
    /// The deadline the descriptor is armed for, until its read completes.
    armed: Cell<Option<Instant>>,
    read: RefCell<Option<Expiry>>,
}

impl TimerFd {
    fn create() -> std::io::Result<Self> {
        // Blocking on purpose: io_uring returns EAGAIN to the submitter for
        // an O_NONBLOCK file, and arms its own poll for a blocking one.
        // SAFETY: plain syscall; the result is checked before use.
        let fd = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        let std_file = unsafe { std::fs::File::from_raw_fd(fd) };
        Ok(Self {
            file: Rc::new(monoio::fs::File::from_std(std_file)?),
            armed: Cell::new(None),
            read: RefCell::new(None),
        })
    }

    fn raw(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Arms the descriptor to expire in `left` (relative, so no clock
    /// conversion between `Instant` and CLOCK_MONOTONIC is needed); a zero
    /// `left` disarms it.
    fn set(&self, left: Duration) -> std::io::Result<()> {
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: left.as_secs().min(i64::MAX as u64) as libc::time_t,
                tv_nsec: left.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: `spec` is a valid itimerspec; the old value is not asked for.
        let rc = unsafe { libc::timerfd_settime(self.raw(), 0, &spec, std::ptr::null_mut()) };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    fn arm(&self, deadline: Instant) -> std::io::Result<()> {
        // A deadline already reached gets the shortest expiry instead of
        // zero, which would disarm.
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_nanos(1));
        self.set(left)?;
        self.armed.set(Some(deadline));
        Ok(())
    }

    fn disarm(&self) {
        if self.armed.take().is_some() {
            // Failing to disarm only costs a spurious wake-up later.
            let _ = self.set(Duration::ZERO);
        }
    }

    /// Ready when the read in flight completes (the armed expiry passed),
    /// starting one if none is.
    fn poll_expiry(&self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        let mut slot = self.read.borrow_mut();
        let read = slot.get_or_insert_with(|| {
            let file = self.file.clone();
            Box::pin(async move { file.read_at(vec![0u8; 8], 0).await.0 })
        });
        let done = read.as_mut().poll(cx);
        if done.is_ready() {
            *slot = None;
            // The expiry count is consumed; the descriptor is disarmed.
            self.armed.set(None);
        }
        done
    }
}

/// A reusable precise sleep, one per task that waits on deadlines (a model
/// scheduler, a load generator's send loop). Must be used on a monoio
/// runtime; the descriptor is made on first use.
#[derive(Default)]
pub struct PreciseTimer {
    /// `None`: the epoll driver, or no timerfd could be made; waits yield.
    fd: OnceCell<Option<TimerFd>>,
    /// Set after an I/O error on the descriptor: later waits yield.
    broken: Cell<bool>,
}

impl PreciseTimer {
    fn fd(&self) -> Option<&TimerFd> {
        if self.broken.get() {
            return None;
        }
        self.fd
            .get_or_init(|| {
                if monoio::utils::is_legacy() {
                    return None;
                }
                TimerFd::create()
                    .map_err(|e| {
                        tracing::warn!("no timerfd for precise waits, yielding instead: {e}")
                    })
                    .ok()
            })
            .as_ref()
    }

    fn give_up(&self, e: &std::io::Error) {
        tracing::warn!("timerfd failed, precise waits yield from now on: {e}");
        self.broken.set(true);
    }

    /// Returns at `deadline` or just after it (never before).
    pub async fn sleep_until(&self, deadline: Instant) {
        let Some(fd) = self.fd() else {
            return yield_until(deadline).await;
        };
        while Instant::now() < deadline {
            if fd.armed.get() != Some(deadline) {
                if let Err(e) = fd.arm(deadline) {
                    self.give_up(&e);
                    return yield_until(deadline).await;
                }
            }
            if let Err(e) = poll_fn(|cx| fd.poll_expiry(cx)).await {
                self.give_up(&e);
                return yield_until(deadline).await;
            }
            // An expiry armed for an earlier deadline may complete first:
            // the loop re-arms for this one.
        }
    }

    /// Stops an armed expiry that nobody waits for any more, so it does
    /// not wake the task for nothing.
    pub fn disarm(&self) {
        if let Some(Some(fd)) = self.fd.get() {
            fd.disarm();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_uring<F: std::future::Future>(f: F) -> F::Output {
        monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
            .enable_timer()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    fn run_epoll<F: std::future::Future>(f: F) -> F::Output {
        monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    async fn never_early(timer: &PreciseTimer) {
        for micros in [0u64, 50, 400, 1_500, 3_200, 120] {
            let deadline = Instant::now() + Duration::from_micros(micros);
            timer.sleep_until(deadline).await;
            assert!(Instant::now() >= deadline, "woke early for {micros} us");
        }
    }

    #[test]
    fn never_returns_before_the_deadline_on_either_driver() {
        run_uring(async { never_early(&PreciseTimer::default()).await });
        run_epoll(async { never_early(&PreciseTimer::default()).await });
    }

    #[test]
    fn a_past_deadline_returns_at_once() {
        run_uring(async {
            let timer = PreciseTimer::default();
            timer.sleep_until(Instant::now()).await;
        });
    }

    #[test]
    fn a_dropped_wait_leaves_the_timer_usable() {
        run_uring(async {
            let timer = PreciseTimer::default();
            let far = Instant::now() + Duration::from_secs(5);
            monoio::select! {
                _ = timer.sleep_until(far) => panic!("a 5 s sleep finished first"),
                _ = monoio::time::sleep(Duration::from_millis(2)) => {}
            }
            // The read for the 5 s expiry is still in flight; re-armed to a
            // near deadline it must complete there, not in 5 s.
            let started = Instant::now();
            let near = started + Duration::from_micros(300);
            timer.sleep_until(near).await;
            assert!(Instant::now() >= near);
            assert!(
                started.elapsed() < Duration::from_secs(4),
                "waited for the old expiry"
            );
            timer.disarm();
        });
    }
}
