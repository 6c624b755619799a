//! Spin before park: keeps a thread's monoio runtime polling its ring for a
//! short window after work instead of sleeping in `io_uring_enter`.
//!
//! monoio's `block_on` parks (a blocking `io_uring_enter`) whenever its task
//! queue is empty. On a VM an idle vCPU then halts, and the wake-up for the
//! next request costs tens of microseconds: at concurrency 1 that is paid
//! on every request, on both sides of the connection. A task that is woken
//! for every round keeps the queue non-empty, so the runtime does a
//! non-blocking submit + completion reap instead and the next request is
//! picked up without a sleep. (It is woken by a relay task, not by itself:
//! see [`Relay`].) After the window the spinner stops asking for rounds
//! (the thread parks as before, ~0 CPU at idle) and waits to be re-armed by
//! [`note_work`].
//!
//! Three things only happen when monoio's io_uring driver parks, never in
//! the submit-only rounds a spinner causes: timers are fired; wakes sent
//! from other threads (a compute worker's completion, another shard's
//! doorbell) are taken from the runtime's remote queue; and the epoll
//! instance behind poll-based I/O (`into_poll_io`: every HTTP and gRPC
//! connection) is re-armed in the ring once it has fired. So the spinner
//! (a) arms a 1 ms timer and lets the runtime park once it is due (monoio's
//! timers have millisecond ticks, and a due timer makes that park
//! non-blocking); (b) checks the epoll instance itself each round (a
//! zero-timeout `poll(2)`, which consumes nothing) and lets the runtime
//! park once it is readable (the park re-arms it and returns at once); and
//! (c) asks its gate before every round whether work is running on another
//! thread (then it stops: spinning would take the core from a compute
//! worker sharing it, and that work's completion re-arms it) or a foreign
//! wake is pending (then it lets the runtime park once, which takes the
//! wake without blocking). After such a park the spinner waits for
//! [`note_work`]: what the park woke is a request, whose end re-arms it.
//!
//! Spinning only pays on a core nobody else wants. Where other threads
//! compete for it (other processes, a compute worker, a build), a spinning
//! thread spends its fair share of the core and the scheduler then makes it
//! wait milliseconds, where a sleeping thread would have been run at once
//! on its wake-up. So the spinner watches its own thread's run-queue wait
//! (`/proc/thread-self/schedstat`) about every millisecond; when the thread
//! waited for the CPU for more than a quarter of that time, it stops
//! spinning for a while (the thread parks as with a zero window): for
//! [`BACKOFF_MIN`] after a calm spell, doubling up to [`BACKOFF`] while the
//! contention is still there each time it looks again. A single burst of
//! another thread (a softirq thread, a metrics sampler) costs a couple of
//! milliseconds of parked c=1 requests instead of a tenth of a second;
//! a lasting competitor is left alone about 99 % of the time within a
//! few hundred milliseconds.
//! A thread woken on the core without preempting it (a `SCHED_BATCH`
//! shard) is not seen that way, so the spinner also offers the core
//! (`sched_yield`) every 20 µs (`YIELD_EVERY`).

use std::{
    cell::{Cell, RefCell},
    future::Future,
    io,
    os::{
        fd::{AsRawFd, RawFd},
        unix::fs::MetadataExt,
    },
    pin::Pin,
    rc::Rc,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    task::{Context, Poll, Waker},
    time::{Duration, Instant},
};

/// What the spinner may do this round, as its owner sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Nothing runs elsewhere: spin while the window lasts.
    Spin,
    /// Work for this thread runs on another thread: stop until re-armed.
    Hold,
    /// A wake from another thread is waiting in the runtime's remote
    /// queue: let the runtime park once (it will not block) to take it.
    Yield,
}

/// Counters a spinner publishes, readable from any thread (tests,
/// diagnostics): whether it is spinning now, rounds spun, windows opened.
#[derive(Debug, Default)]
pub struct SpinStats {
    spinning: AtomicBool,
    rounds: AtomicU64,
    windows: AtomicU64,
    backoffs: AtomicU64,
    yields: AtomicU64,
    /// Why the spinner stopped: [hold, yield, window over, socket ready, backing off].
    stops: [AtomicU64; 5],
}

impl SpinStats {
    pub fn spinning(&self) -> bool {
        self.spinning.load(Ordering::Relaxed)
    }

    /// Rounds in which the spinner kept the runtime from parking.
    pub fn rounds(&self) -> u64 {
        self.rounds.load(Ordering::Relaxed)
    }

    /// Times the spinner was re-armed after it had stopped.
    pub fn windows(&self) -> u64 {
        self.windows.load(Ordering::Relaxed)
    }

    /// Times the spinner stopped, by reason: the gate held it, the gate
    /// yielded, the window ended, a socket was ready, a back-off.
    pub fn stops(&self) -> [u64; 5] {
        std::array::from_fn(|i| self.stops[i].load(Ordering::Relaxed))
    }

    /// Times the spinner backed off because its core was contended.
    pub fn backoffs(&self) -> u64 {
        self.backoffs.load(Ordering::Relaxed)
    }

    /// Times the spinner offered its core to other threads (`YIELD_EVERY`).
    pub fn yields(&self) -> u64 {
        self.yields.load(Ordering::Relaxed)
    }
}

struct State {
    window: Duration,
    last_work: Cell<Instant>,
    /// The spinner's waker while it is stopped; `None` while it spins.
    stopped: RefCell<Option<Waker>>,
    stats: Arc<SpinStats>,
}

thread_local! {
    static CURRENT: RefCell<Option<Rc<State>>> = const { RefCell::new(None) };
}

/// Marks work done on this thread: the spin window restarts now, and a
/// stopped spinner starts again. A no-op on a thread without a spinner.
pub fn note_work() {
    CURRENT.with(|c| {
        if let Some(state) = c.borrow().as_ref() {
            state.last_work.set(Instant::now());
            let parked = state.stopped.borrow_mut().take();
            if let Some(waker) = parked {
                state.stats.windows.fetch_add(1, Ordering::Relaxed);
                waker.wake();
            }
        }
    });
}

/// Removes this thread's spinner state (the runtime is going away).
pub fn clear() {
    CURRENT.with(|c| c.borrow_mut().take());
}

/// Which monoio driver the spinner's runtime uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    /// io_uring: its epoll instance is re-armed only when it parks, so the
    /// spinner watches it.
    IoUring,
    /// epoll: every submit-only round is a zero-timeout `epoll_wait` that
    /// also takes foreign wakes, so there is nothing to watch.
    Epoll,
}

/// Builds this thread's spinner; `None` when `window` is zero (off: the
/// runtime parks as soon as it has nothing to run) or when, on io_uring,
/// the runtime's epoll instance cannot be found (spinning would then hide
/// socket readiness until the window ends). Call from inside the runtime;
/// spawn the returned future on it; `gate` is asked before every round.
pub fn install(
    window: Duration,
    driver: Driver,
    gate: impl Fn() -> Gate + 'static,
) -> Option<(Spinner, Arc<SpinStats>)> {
    if window.is_zero() {
        return None;
    }
    let poller = match driver {
        Driver::Epoll => None,
        Driver::IoUring => match find_poller() {
            Ok(fd) => Some(fd),
            Err(e) => {
                tracing::warn!(error = %e, "spin-before-park off: cannot find the runtime's epoll instance");
                return None;
            }
        },
    };
    let stats = Arc::new(SpinStats::default());
    let state = Rc::new(State {
        window,
        last_work: Cell::new(Instant::now()),
        stopped: RefCell::new(None),
        stats: stats.clone(),
    });
    CURRENT.with(|c| *c.borrow_mut() = Some(state.clone()));
    Some((
        Spinner {
            state,
            gate: Box::new(gate),
            tick: None,
            poller,
            contention: Contention::new(),
            relay: None,
            courtesy: Courtesy::default(),
        },
        stats,
    ))
}

/// Awaits `future` with a spinner beside it (none when `window` is zero)
/// that always may spin: for a load generator, whose thread has nothing
/// else to give its core to and whose requests' completions call
/// [`note_work`].
pub async fn alongside<F: Future>(window: Duration, driver: Driver, future: F) -> F::Output {
    if let Some((spinner, _)) = install(window, driver, || Gate::Spin) {
        monoio::spawn(spinner);
    }
    let out = future.await;
    clear();
    out
}

/// The millisecond timer that lets the runtime fire timers while spinning.
struct Tick {
    armed: Instant,
    sleep: Pin<Box<monoio::time::Sleep>>,
}

/// The spinner task; never completes (it ends with its runtime).
pub struct Spinner {
    state: Rc<State>,
    gate: Box<dyn Fn() -> Gate>,
    tick: Option<Tick>,
    /// The epoll instance of this runtime's poll-based I/O (io_uring only).
    poller: Option<RawFd>,
    contention: Contention,
    /// Shared with the relay task that queues the next round (spawned on
    /// the first round).
    relay: Option<Rc<RefCell<Relay>>>,
    courtesy: Courtesy,
}

/// How often a spinning thread offers its core to a thread waiting for it.
/// A `SCHED_BATCH` shard (the default) woken on the core of a spinning
/// thread does not preempt it, so without this a generator spinning on a
/// server's core held each answer back for its whole window (c=1 p99 1 ms
/// on the 2-core VM). A yield per round cost 1-3 us of c=1 p50 with both
/// ends spinning; one per 20 us bounds that wait at about 20 us for next to
/// nothing.
const YIELD_EVERY: Duration = Duration::from_micros(20);

/// A spinning thread's offers of its core ([`YIELD_EVERY`]); the shard's
/// spinner and the bench's direct lane both spin this way.
#[derive(Debug, Default)]
pub(crate) struct Courtesy {
    /// When the core was last offered.
    yielded: Option<Instant>,
}

impl Courtesy {
    /// Offers the core (`sched_yield`) if [`YIELD_EVERY`] has passed since
    /// the last offer; whether it did. With nothing else runnable on the
    /// core the yield returns at once.
    pub(crate) fn offer(&mut self, now: Instant) -> bool {
        if self
            .yielded
            .is_some_and(|at| now.duration_since(at) < YIELD_EVERY)
        {
            return false;
        }
        self.yielded = Some(now);
        std::thread::yield_now();
        true
    }
}

/// The wakers of the spinner and of its relay task. monoio queues a task
/// that wakes itself while it runs at the *front* of its run queue, so a
/// spinner that woke itself for its next round ran again before any task
/// woken in the meantime, round after round: a task woken by another task
/// (a connection task a request's answer or message was handed to) waited
/// out the whole window. Each wakes the other instead, while the other is
/// not running, which monoio queues at the back: every task woken meanwhile
/// runs between two rounds.
#[derive(Default)]
struct Relay {
    spinner: Option<Waker>,
    relay: Option<Waker>,
}

/// The relay task: wakes the spinner each time the spinner wakes it.
async fn relay(shared: Rc<RefCell<Relay>>) {
    std::future::poll_fn(|cx| {
        let mut r = shared.borrow_mut();
        r.relay = Some(cx.waker().clone());
        if let Some(spinner) = r.spinner.take() {
            spinner.wake();
        }
        Poll::<()>::Pending
    })
    .await
}

/// The longest a spinner whose core is contended parks like a zero window.
pub const BACKOFF: Duration = Duration::from_millis(100);

/// The first back-off after a calm spell. On the 2-core VM a fixed 100 ms
/// back-off, set off by a few hundred µs of `ksoftirqd` or another
/// process on the shard's core, kept a c=1 server parked for about a fifth
/// of a run (8-11 back-offs in 4 s, p90 33 µs against a p50 of 13 µs).
pub const BACKOFF_MIN: Duration = Duration::from_millis(2);

/// Contention seen again within this long after a back-off ended doubles
/// the next one; after a longer calm the next is [`BACKOFF_MIN`] again.
const CALM: Duration = Duration::from_millis(50);

/// How often the run-queue wait is sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(1);

/// Watches the thread's run-queue wait (second field of its schedstat:
/// nanoseconds runnable but not running).
pub(crate) struct Contention {
    /// `None` where the kernel does not provide schedstat: never backs off.
    file: Option<std::fs::File>,
    last: Option<(Instant, u64)>,
    backoff_until: Option<Instant>,
    /// The last back-off's length and when it ended (or ends).
    previous: Option<(Duration, Instant)>,
}

impl Contention {
    pub(crate) fn new() -> Self {
        Self {
            file: std::fs::File::open("/proc/thread-self/schedstat").ok(),
            last: None,
            backoff_until: None,
            previous: None,
        }
    }

    fn wait_ns(&self) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 96];
        let n = self.file.as_ref()?.read_at(&mut buf, 0).ok()?;
        let text = std::str::from_utf8(buf.get(..n)?).ok()?;
        text.split_whitespace().nth(1)?.parse().ok()
    }

    /// Whether spinning is off for now: in a back-off, or the last
    /// interval showed the thread waiting for its CPU.
    pub(crate) fn backing_off(&mut self, now: Instant, stats: &SpinStats) -> bool {
        if let Some(answer) = self.without_sample(now) {
            return answer;
        }
        let Some(wait) = self.wait_ns() else {
            return false;
        };
        let contended = self.sample(now, wait);
        if contended {
            stats.backoffs.fetch_add(1, Ordering::Relaxed);
        }
        contended
    }

    /// The answer when no reading is due: true within a back-off, false
    /// less than [`SAMPLE_EVERY`] after the last reading.
    fn without_sample(&mut self, now: Instant) -> Option<bool> {
        if let Some(until) = self.backoff_until {
            if now < until {
                return Some(true);
            }
            self.backoff_until = None;
            self.last = None;
        }
        let due = self
            .last
            .is_none_or(|(at, _)| now.duration_since(at) >= SAMPLE_EVERY);
        (!due).then_some(false)
    }

    /// Takes one reading of the run-queue wait (ns, cumulative); true when
    /// the time since the last reading was contended, which starts a
    /// back-off (see [`BACKOFF_MIN`]).
    fn sample(&mut self, now: Instant, wait: u64) -> bool {
        let contended = self.last.is_some_and(|(at, before)| {
            let waited = wait.saturating_sub(before);
            let span = now.duration_since(at).as_nanos() as u64;
            waited.saturating_mul(4) > span
        });
        self.last = Some((now, wait));
        if contended {
            let length = match self.previous {
                Some((length, ended)) if now.saturating_duration_since(ended) < CALM => {
                    (length * 2).min(BACKOFF)
                }
                _ => BACKOFF_MIN,
            };
            self.backoff_until = Some(now + length);
            self.previous = Some((length, now + length));
        }
        contended
    }
}

/// Finds the epoll instance monoio's driver keeps for poll-based I/O on
/// this thread (monoio does not expose it): registers a probe socket with
/// it, then looks for the one epoll instance of the process that watches
/// exactly that descriptor and inode (`/proc/self/fdinfo` lists what each
/// epoll instance watches). Deterministic: the probe's descriptor number
/// is unique in the process while it is open, and the inode tells a stale
/// entry of a reused number apart.
fn find_poller() -> io::Result<RawFd> {
    let (probe, _peer) = monoio::net::UnixStream::pair()?;
    let fd = probe.as_raw_fd();
    let ino = std::fs::metadata(format!("/proc/self/fd/{fd}"))?.ino();
    let _registered = monoio::io::IntoPollIo::into_poll_io(probe)?;
    let watches = |line: &str| {
        let mut t = line.split_whitespace();
        let tfd = (t.next() == Some("tfd:")).then(|| t.next()).flatten();
        tfd.and_then(|n| n.parse::<RawFd>().ok()) == Some(fd)
            && t.any(|w| {
                w.strip_prefix("ino:")
                    .and_then(|h| u64::from_str_radix(h, 16).ok())
                    == Some(ino)
            })
    };
    for entry in std::fs::read_dir("/proc/self/fd")? {
        let Ok(entry) = entry else { continue };
        let Some(n) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<RawFd>().ok())
        else {
            continue;
        };
        let is_epoll = std::fs::read_link(entry.path())
            .is_ok_and(|t| t.as_os_str() == "anon_inode:[eventpoll]");
        if !is_epoll {
            continue;
        }
        let Ok(info) = std::fs::read_to_string(format!("/proc/self/fdinfo/{n}")) else {
            continue;
        };
        if info.lines().any(watches) {
            return Ok(n);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        "no epoll instance in /proc/self/fdinfo watches the probe socket",
    ))
}

/// Whether `fd` (an epoll instance) has events ready, without taking them.
fn readable(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout; the descriptor belongs to the
    // runtime this spinner runs on, which outlives it.
    unsafe { libc::poll(&mut p, 1, 0) > 0 }
}

impl Spinner {
    /// Queues the next round behind the tasks already queued (see
    /// [`Relay`]).
    fn next_round(&mut self, cx: &Context<'_>) -> Poll<()> {
        let shared = self.relay.get_or_insert_with(|| {
            let shared = Rc::new(RefCell::new(Relay::default()));
            // Its first poll wakes the spinner.
            monoio::spawn(relay(shared.clone()));
            shared
        });
        let mut r = shared.borrow_mut();
        r.spinner = Some(cx.waker().clone());
        if let Some(relay) = r.relay.take() {
            relay.wake();
        }
        Poll::Pending
    }

    fn stop(&mut self, cx: &Context<'_>, why: usize) -> Poll<()> {
        if let Some(c) = self.state.stats.stops.get(why) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        self.tick = None;
        self.state.stats.spinning.store(false, Ordering::Relaxed);
        *self.state.stopped.borrow_mut() = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl Future for Spinner {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        match (this.gate)() {
            Gate::Spin => {}
            // Yield stops too: what the foreign wake runs is work and
            // re-arms through `note_work`; if it is not, the next park is an
            // ordinary one.
            Gate::Hold => return this.stop(cx, 0),
            Gate::Yield => return this.stop(cx, 1),
        }
        let now = Instant::now();
        if now.duration_since(this.state.last_work.get()) >= this.state.window {
            return this.stop(cx, 2);
        }
        if this.contention.backing_off(now, &this.state.stats) {
            return this.stop(cx, 4);
        }
        if this.poller.is_some_and(readable) {
            // A socket is ready: the park that follows re-arms the epoll
            // instance in the ring, which completes at once.
            return this.stop(cx, 3);
        }
        this.state.stats.spinning.store(true, Ordering::Relaxed);
        let tick = this.tick.get_or_insert_with(|| Tick {
            armed: now,
            sleep: Box::pin(monoio::time::sleep(Duration::from_millis(1))),
        });
        if tick.sleep.as_mut().poll(cx).is_ready() {
            // The runtime parked and fired timers since the tick was armed.
            this.tick = None;
        } else if now.duration_since(tick.armed) >= Duration::from_millis(2) {
            // The tick is due in monoio's millisecond wheel: the park this
            // allows does not block, fires every due timer (ours wakes us)
            // and takes the wakes other threads sent.
            return Poll::Pending;
        }
        this.state.stats.rounds.fetch_add(1, Ordering::Relaxed);
        if this.courtesy.offer(now) {
            this.state.stats.yields.fetch_add(1, Ordering::Relaxed);
        }
        this.next_round(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drives a contention watch on a made-up clock: every 100 µs, with
    /// the thread waiting for its CPU `share` of the time while `busy`
    /// says so. Returns the back-offs it started, as (start ms, length ms).
    fn run(busy: impl Fn(u64) -> bool, share: f64, until_ms: u64) -> Vec<(u64, u64)> {
        let mut c = Contention {
            file: None,
            last: None,
            backoff_until: None,
            previous: None,
        };
        let t0 = Instant::now();
        let (mut wait, mut started) = (0u64, Vec::new());
        for step in 0..until_ms * 10 {
            let us = step * 100;
            if busy(us) {
                wait += (100_000.0 * share) as u64;
            }
            let now = t0 + Duration::from_micros(us);
            if c.without_sample(now).is_none() && c.sample(now, wait) {
                let until = c.backoff_until.expect("a back-off");
                started.push((us / 1000, (until - now).as_millis() as u64));
            }
        }
        started
    }

    #[test]
    fn a_short_burst_costs_the_shortest_back_off() {
        // 400 µs of another thread from 1 ms on, then nothing: seen at the
        // 2 ms reading.
        let b = run(|us| (1_000..1_400).contains(&us), 1.0, 300);
        assert_eq!(b, vec![(2, 2)], "{b:?}");
    }

    #[test]
    fn lasting_contention_doubles_the_back_off_up_to_its_bound() {
        let b = run(|_| true, 0.5, 1_000);
        let lengths: Vec<u64> = b.iter().map(|&(_, l)| l).collect();
        assert_eq!(&lengths[..7], &[2, 4, 8, 16, 32, 64, 100], "{b:?}");
        assert!(lengths[7..].iter().all(|&l| l == 100), "{b:?}");
        // Spinning between back-offs is about a millisecond each time.
        let spun: u64 = b.windows(2).map(|w| w[1].0 - (w[0].0 + w[0].1)).sum();
        assert!(spun <= 2 * b.len() as u64, "spun {spun} ms over {b:?}");
    }

    #[test]
    fn a_calm_spell_resets_the_back_off() {
        // Contended for 40 ms, calm for 200 ms, contended again.
        let b = run(|us| !(40_000..240_000).contains(&us), 0.5, 300);
        let again = b
            .iter()
            .find(|&&(at, _)| at >= 240)
            .expect("a back-off after the calm");
        assert_eq!(again.1, 2, "{b:?}");
    }

    #[test]
    fn waiting_under_a_quarter_of_the_time_is_no_contention() {
        assert!(run(|_| true, 0.2, 300).is_empty());
    }
}
