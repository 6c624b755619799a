//! A compute worker: one OS thread that owns a piece of work's state (a
//! model instance) and runs what it is handed, in order. It is fed through
//! a bounded SPSC ring; results go back through a second SPSC ring, and the
//! owner is woken through an `AtomicWaker` (a cross-thread wake, which
//! monoio turns into an eventfd write only when the owning shard is parked).
//!
//! The hand-off is built so that a busy worker costs no syscall per item:
//! the worker drains its ring before it sleeps, then polls it for
//! `spin` (yielding the CPU between looks, so on a core it shares with its
//! shard the shard runs and can hand it the next item), and only then
//! parks. The owner unparks it only when it says it is asleep: a
//! `sleeping` flag set before the worker's last look at the ring and read
//! after the owner's push, each behind a SeqCst fence (Dekker), so either
//! the worker sees the item or the owner sees the flag.

use std::{
    io,
    sync::{
        atomic::{fence, AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread::{JoinHandle, Thread},
    time::{Duration, Instant},
};

use futures::task::AtomicWaker;

use super::thread::{set_affinity, set_nice};

/// Where and how a worker thread runs.
#[derive(Debug, Clone)]
pub struct WorkerPlacement {
    /// Logical CPUs it may run on (empty: anywhere).
    pub cpus: Vec<usize>,
    /// Nice value (positive: below the shards, which run at 0).
    pub nice: i32,
    /// How long an idle worker keeps looking at its ring (yielding between
    /// looks) before it parks; zero parks at once.
    pub spin: Duration,
    /// How many items the owner may have handed and not yet taken back
    /// (the rings' capacity; at least 1).
    pub depth: usize,
    /// While more items wait in its ring, how long the worker may keep
    /// finished results before it wakes the owner (zero: wake after each).
    /// One wake then returns several results: on a core the worker shares
    /// with its shard, each wake is a context switch. A result waits at
    /// most this plus one item's run; with the ring empty the owner is
    /// always woken at once.
    pub hold: Duration,
    /// Longest the worker runs items back to back before it announces what
    /// it holds and yields its CPU (zero: never). A shard sharing the core
    /// as `SCHED_BATCH` is not run when a packet wakes it, only at the next
    /// tick (4 ms at HZ=250) or when the worker sleeps; this bounds its
    /// wait to about one slice plus one item instead.
    pub slice: Duration,
}

impl WorkerPlacement {
    /// Anywhere, nice 0, no spinning, one item at a time.
    pub fn unpinned() -> Self {
        Self {
            cpus: Vec::new(),
            nice: 0,
            spin: Duration::ZERO,
            depth: 1,
            hold: Duration::ZERO,
            slice: Duration::ZERO,
        }
    }
}

struct Shared {
    stop: AtomicBool,
    /// The worker is parked or about to park: a submission must unpark it.
    sleeping: AtomicBool,
    /// Times the worker parked (for tests and diagnostics).
    parks: AtomicU64,
    /// Times a submission unparked the worker.
    wakes: AtomicU64,
    /// Times the worker rang `done_bell`.
    announcements: AtomicU64,
    /// Times the worker yielded its CPU at the end of a slice.
    yields: AtomicU64,
    done_bell: Arc<AtomicWaker>,
}

/// The owner's end of a worker. Dropping it lets the thread finish what it
/// was handed and exit; its join handle goes to the reaper (see
/// [`super::join_retired`]), which shutdown waits on.
pub struct ComputeWorker<W, R> {
    name: String,
    work: rtrb::Producer<W>,
    done: rtrb::Consumer<R>,
    capacity: usize,
    thread: Thread,
    join: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
}

impl<W: Send + 'static, R: Send + 'static> ComputeWorker<W, R> {
    /// Starts a worker thread running `body` on each item submitted.
    /// `placement.depth` bounds both rings: the owner must never have more
    /// than that many items outstanding.
    pub fn spawn(
        name: String,
        placement: WorkerPlacement,
        done_bell: Arc<AtomicWaker>,
        mut body: impl FnMut(W) -> R + Send + 'static,
    ) -> io::Result<Self> {
        let capacity = placement.depth.max(1);
        let (work_tx, mut work_rx) = rtrb::RingBuffer::<W>::new(capacity);
        let (mut done_tx, done_rx) = rtrb::RingBuffer::<R>::new(capacity);
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            sleeping: AtomicBool::new(false),
            parks: AtomicU64::new(0),
            wakes: AtomicU64::new(0),
            announcements: AtomicU64::new(0),
            yields: AtomicU64::new(0),
            done_bell,
        });
        let thread_shared = shared.clone();
        let thread_name = name.clone();
        let join = std::thread::Builder::new()
            .name(format!("compute-{name}"))
            .spawn(move || {
                if let Err(e) = set_affinity(&placement.cpus) {
                    tracing::warn!(worker = %thread_name, cpus = ?placement.cpus, error = %e, "cannot set compute thread affinity");
                }
                if let Err(e) = set_nice(placement.nice) {
                    tracing::warn!(worker = %thread_name, nice = placement.nice, error = %e, "cannot lower compute thread priority");
                }
                let shared = thread_shared;
                // Since when results wait unannounced (see `hold`).
                let mut unannounced: Option<Instant> = None;
                // Since when the worker has run without a break (`slice`).
                let mut running_since = Instant::now();
                loop {
                    match work_rx.pop() {
                        Ok(item) => {
                            let mut result = body(item);
                            // The owner has at most `capacity` items out, so
                            // the return ring has room; loop defensively.
                            loop {
                                match done_tx.push(result) {
                                    Ok(()) => break,
                                    Err(rtrb::PushError::Full(back)) => {
                                        result = back;
                                        std::thread::yield_now();
                                    }
                                }
                            }
                            let slice_over = !placement.slice.is_zero()
                                && running_since.elapsed() >= placement.slice;
                            if !slice_over && !placement.hold.is_zero() && !work_rx.is_empty() {
                                let since = *unannounced.get_or_insert_with(Instant::now);
                                if since.elapsed() < placement.hold {
                                    continue;
                                }
                            }
                            // The ring ran dry (or the hold or the slice is
                            // over): a pop that fails next follows this wake,
                            // so no result is ever left unannounced.
                            unannounced = None;
                            shared.announcements.fetch_add(1, Ordering::Relaxed);
                            shared.done_bell.wake();
                            if slice_over {
                                // The shard just woken (or one a packet woke)
                                // runs now if it is waiting for this CPU.
                                shared.yields.fetch_add(1, Ordering::Relaxed);
                                std::thread::yield_now();
                                running_since = Instant::now();
                            }
                        }
                        Err(_) if shared.stop.load(Ordering::Acquire) => break,
                        Err(_) => {
                            if spin_for_work(&work_rx, &shared.stop, placement.spin) {
                                continue;
                            }
                            shared.sleeping.store(true, Ordering::SeqCst);
                            // Pairs with the fence in `submit`: either this
                            // look sees the owner's item, or the owner sees
                            // `sleeping` and unparks.
                            fence(Ordering::SeqCst);
                            if work_rx.is_empty() && !shared.stop.load(Ordering::SeqCst) {
                                shared.parks.fetch_add(1, Ordering::Relaxed);
                                // An unpark that came before this park makes
                                // it return at once; a spurious return just
                                // looks again.
                                std::thread::park();
                            }
                            shared.sleeping.store(false, Ordering::SeqCst);
                            running_since = Instant::now();
                        }
                    }
                }
                tracing::debug!(worker = %thread_name, "compute worker stopped");
            })?;
        Ok(Self {
            name,
            work: work_tx,
            done: done_rx,
            capacity,
            thread: join.thread().clone(),
            join: Some(join),
            shared,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Hands `item` to the worker; a full ring hands it back.
    pub fn submit(&mut self, item: W) -> Result<(), W> {
        match self.work.push(item) {
            Ok(()) => {
                // Pairs with the worker's fence before its last look.
                fence(Ordering::SeqCst);
                if self.shared.sleeping.load(Ordering::SeqCst) {
                    self.shared.wakes.fetch_add(1, Ordering::Relaxed);
                    self.thread.unpark();
                }
                Ok(())
            }
            Err(rtrb::PushError::Full(item)) => Err(item),
        }
    }

    /// How many items may be outstanding (handed and not taken back).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Times the worker thread parked since it started.
    pub fn parks(&self) -> u64 {
        self.shared.parks.load(Ordering::Relaxed)
    }

    /// Times a submission had to unpark the worker.
    pub fn wakes(&self) -> u64 {
        self.shared.wakes.load(Ordering::Relaxed)
    }

    /// Times the worker woke its owner to take results back.
    pub fn announcements(&self) -> u64 {
        self.shared.announcements.load(Ordering::Relaxed)
    }

    /// Times the worker yielded its CPU at the end of a slice.
    pub fn yields(&self) -> u64 {
        self.shared.yields.load(Ordering::Relaxed)
    }

    /// A finished result, if any.
    pub fn take_done(&mut self) -> Option<R> {
        self.done.pop().ok()
    }

    /// Whether a finished result is waiting.
    pub fn has_done(&self) -> bool {
        !self.done.is_empty()
    }

    /// Stops the thread once it has run everything submitted, and waits
    /// for it. Only for places that may block (the control plane, tests).
    pub fn join(mut self) {
        self.stop();
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }

    fn stop(&self) {
        self.shared.stop.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

/// After the ring ran dry: keeps looking at it for `spin`, yielding the CPU
/// between looks (on a core shared with the owner shard, that is what lets
/// the shard run and hand over the next item). Whether work (or a stop)
/// came in.
fn spin_for_work<W>(ring: &rtrb::Consumer<W>, stop: &AtomicBool, spin: Duration) -> bool {
    if spin.is_zero() {
        return false;
    }
    let until = Instant::now() + spin;
    loop {
        if !ring.is_empty() || stop.load(Ordering::Acquire) {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::yield_now();
    }
}

impl<W, R> Drop for ComputeWorker<W, R> {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.thread.unpark();
        // Not joined: a shard must never block on a thread. The worker
        // exits by itself after its last item; shutdown joins it.
        if let Some(j) = self.join.take() {
            super::reaper::retire(self.name.clone(), j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn placement(depth: usize) -> WorkerPlacement {
        WorkerPlacement {
            depth,
            ..WorkerPlacement::unpinned()
        }
    }

    #[test]
    fn runs_items_in_order_and_returns_results() {
        let bell = Arc::new(AtomicWaker::new());
        let mut w =
            ComputeWorker::spawn("t".into(), placement(4), bell, |x: u32| x * 2).expect("spawn");
        let mut got = Vec::new();
        for i in 0..100u32 {
            let mut item = i;
            while let Err(back) = w.submit(item) {
                item = back;
                if let Some(r) = w.take_done() {
                    got.push(r);
                }
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while got.len() < 100 && Instant::now() < deadline {
            match w.take_done() {
                Some(r) => got.push(r),
                None => std::thread::sleep(Duration::from_micros(50)),
            }
        }
        assert_eq!(got, (0..100).map(|i| i * 2).collect::<Vec<_>>());
        w.join();
    }

    /// Four items queued behind a gated first one: with a hold, the owner
    /// is woken once, when the ring runs dry (all four results waiting);
    /// without, once per result. A slice that is over (after the gate,
    /// at once) ends the hold: each result is announced and the worker
    /// yields after it.
    #[test]
    fn a_hold_announces_results_once_the_ring_runs_dry() {
        let long = Duration::from_secs(10);
        let cases = [
            (long, Duration::ZERO, 1, 0),
            (Duration::ZERO, Duration::ZERO, 4, 0),
            (long, Duration::from_nanos(1), 4, 4),
        ];
        for (hold, slice, expected, yields) in cases {
            let bell = Arc::new(AtomicWaker::new());
            let (gate_tx, gate_rx) = std::sync::mpsc::channel::<()>();
            let gate_rx = std::sync::Mutex::new(gate_rx);
            let placement = WorkerPlacement {
                hold,
                slice,
                ..placement(4)
            };
            let mut w = ComputeWorker::spawn("t".into(), placement, bell, move |x: u32| {
                if x == 0 {
                    let _ = gate_rx.lock().expect("gate").recv();
                }
                x
            })
            .expect("spawn");
            for i in 0..4u32 {
                assert!(w.submit(i).is_ok(), "ring of 4 takes 4");
            }
            gate_tx.send(()).expect("open the gate");
            let mut got = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(10);
            while got.len() < 4 && Instant::now() < deadline {
                match w.take_done() {
                    Some(r) => got.push(r),
                    None => std::thread::sleep(Duration::from_micros(50)),
                }
            }
            assert_eq!(got, vec![0, 1, 2, 3]);
            // The last announcement follows the last push: wait for it.
            let deadline = Instant::now() + Duration::from_secs(10);
            while w.announcements() < expected && Instant::now() < deadline {
                std::thread::sleep(Duration::from_micros(50));
            }
            assert_eq!(w.announcements(), expected, "hold {hold:?} slice {slice:?}");
            assert_eq!(w.yields(), yields, "hold {hold:?} slice {slice:?}");
            w.join();
        }
    }

    /// What a dropped worker owned is dropped on its own thread, and
    /// `join_retired` returns only once that is done.
    #[test]
    fn a_dropped_worker_drops_its_state_on_its_thread_and_is_joined() {
        struct Owned(Arc<std::sync::Mutex<Option<std::thread::ThreadId>>>);
        impl Drop for Owned {
            fn drop(&mut self) {
                std::thread::sleep(Duration::from_millis(50));
                *self.0.lock().expect("lock") = Some(std::thread::current().id());
            }
        }
        let dropped_on = Arc::new(std::sync::Mutex::new(None));
        let owned = Owned(dropped_on.clone());
        let bell = Arc::new(AtomicWaker::new());
        let w = ComputeWorker::spawn("reaped".into(), placement(2), bell, move |()| {
            let _keep = &owned;
        })
        .expect("spawn");
        drop(w);
        let running = crate::compute::join_retired(Instant::now() + Duration::from_secs(10));
        assert!(
            !running.contains(&"reaped".to_string()),
            "still running: {running:?}"
        );
        let on = *dropped_on.lock().expect("lock");
        assert!(
            on.is_some(),
            "the worker's state was not dropped by join time"
        );
        assert_ne!(on, Some(std::thread::current().id()));
    }

    #[test]
    fn join_waits_for_submitted_work() {
        let bell = Arc::new(AtomicWaker::new());
        let counter = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let c = counter.clone();
        let mut w = ComputeWorker::spawn("t".into(), placement(2), bell, move |()| {
            std::thread::sleep(Duration::from_millis(20));
            c.fetch_add(1, Ordering::SeqCst);
        })
        .expect("spawn");
        assert!(w.submit(()).is_ok());
        assert!(w.submit(()).is_ok());
        w.join();
        assert_eq!(counter.load(Ordering::SeqCst), 2);
    }

    /// Waits (bounded) for `n` results.
    fn take_n<W: Send + 'static, R: Send + 'static>(
        w: &mut ComputeWorker<W, R>,
        n: usize,
    ) -> Vec<R> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut got = Vec::new();
        while got.len() < n && Instant::now() < deadline {
            match w.take_done() {
                Some(r) => got.push(r),
                None => std::thread::sleep(Duration::from_micros(100)),
            }
        }
        got
    }

    /// Items handed while the worker runs are taken without a wake-up, and
    /// the worker runs them back to back without parking in between.
    #[test]
    fn a_busy_worker_drains_its_ring_without_wakes_or_parks() {
        let bell = Arc::new(AtomicWaker::new());
        let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
        let (gate_tx, gate_rx) = std::sync::mpsc::channel::<()>();
        let mut w = ComputeWorker::spawn("drain".into(), placement(4), bell, move |x: u32| {
            if x == 0 {
                let _ = started_tx.send(());
                let _ = gate_rx.recv_timeout(Duration::from_secs(20));
            }
            x
        })
        .expect("spawn");
        assert!(w.submit(0).is_ok());
        started_rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the first item started");
        // The worker is inside the first item: not asleep.
        let (wakes, parks) = (w.wakes(), w.parks());
        for i in 1..4u32 {
            assert!(w.submit(i).is_ok(), "ring of 4 refused item {i}");
        }
        assert_eq!(w.wakes(), wakes, "a submission woke a busy worker");
        gate_tx.send(()).expect("gate");
        assert_eq!(take_n(&mut w, 4), vec![0, 1, 2, 3]);
        // At most the park after the last item.
        assert!(
            w.parks() <= parks + 1,
            "parked between queued items: {} -> {}",
            parks,
            w.parks()
        );
        w.join();
    }

    /// A worker that is still spinning when the next item comes needs no
    /// unpark; one that parked does get woken (no lost submission).
    #[test]
    fn a_spinning_worker_needs_no_wake_and_a_parked_one_is_woken() {
        let bell = Arc::new(AtomicWaker::new());
        let spinning = WorkerPlacement {
            spin: Duration::from_secs(60),
            ..placement(2)
        };
        let mut w = ComputeWorker::spawn("spin".into(), spinning, bell.clone(), |x: u32| x + 1)
            .expect("spawn");
        for i in 0..20u32 {
            assert!(w.submit(i).is_ok());
            assert_eq!(take_n(&mut w, 1), vec![i + 1]);
        }
        assert_eq!(w.wakes(), 0, "a spinning worker was unparked");
        assert_eq!(w.parks(), 0);
        w.join();

        let mut p =
            ComputeWorker::spawn("park".into(), placement(2), bell, |x: u32| x + 1).expect("spawn");
        for i in 0..20u32 {
            // Wait until it is asleep, so each submission has to wake it.
            let deadline = Instant::now() + Duration::from_secs(20);
            while p.parks() <= u64::from(i) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_micros(200));
            }
            assert!(p.submit(i).is_ok());
            assert_eq!(take_n(&mut p, 1), vec![i + 1], "submission {i} was lost");
        }
        assert!(p.wakes() >= 1, "a parked worker was never unparked");
        p.join();
    }
}
