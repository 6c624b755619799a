//! A compute worker: one OS thread that owns a piece of work's state (a
//! model instance) and runs what it is handed, in order. It is fed through
//! a bounded SPSC ring and parks when the ring is empty; results go back
//! through a second SPSC ring, and the owner is woken through an
//! `AtomicWaker` (a cross-thread wake, which monoio turns into an eventfd
//! write only when the owning shard is parked).

use std::{
    io,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::{JoinHandle, Thread},
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
}

struct Shared {
    stop: AtomicBool,
    done_bell: Arc<AtomicWaker>,
}

/// The owner's end of a worker. Dropping it lets the thread finish what it
/// was handed and exit; its join handle goes to the reaper (see
/// [`super::join_retired`]), which shutdown waits on.
pub struct ComputeWorker<W, R> {
    name: String,
    work: rtrb::Producer<W>,
    done: rtrb::Consumer<R>,
    thread: Thread,
    join: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
}

impl<W: Send + 'static, R: Send + 'static> ComputeWorker<W, R> {
    /// Starts a worker thread running `body` on each item submitted.
    /// `capacity` bounds both rings: the owner must never have more than
    /// `capacity` items outstanding (it hands out one batch at a time).
    pub fn spawn(
        name: String,
        placement: WorkerPlacement,
        capacity: usize,
        done_bell: Arc<AtomicWaker>,
        mut body: impl FnMut(W) -> R + Send + 'static,
    ) -> io::Result<Self> {
        let (work_tx, mut work_rx) = rtrb::RingBuffer::<W>::new(capacity.max(1));
        let (mut done_tx, done_rx) = rtrb::RingBuffer::<R>::new(capacity.max(1));
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
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
                            thread_shared.done_bell.wake();
                        }
                        Err(_) if thread_shared.stop.load(Ordering::Acquire) => break,
                        // An unpark that came before this park makes it
                        // return at once, so no submission is missed.
                        Err(_) => std::thread::park(),
                    }
                }
                tracing::debug!(worker = %thread_name, "compute worker stopped");
            })?;
        Ok(Self {
            name,
            work: work_tx,
            done: done_rx,
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
                self.thread.unpark();
                Ok(())
            }
            Err(rtrb::PushError::Full(item)) => Err(item),
        }
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

    fn placement() -> WorkerPlacement {
        WorkerPlacement {
            cpus: Vec::new(),
            nice: 0,
        }
    }

    #[test]
    fn runs_items_in_order_and_returns_results() {
        let bell = Arc::new(AtomicWaker::new());
        let mut w =
            ComputeWorker::spawn("t".into(), placement(), 4, bell, |x: u32| x * 2).expect("spawn");
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
        let w = ComputeWorker::spawn("reaped".into(), placement(), 2, bell, move |()| {
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
        let mut w = ComputeWorker::spawn("t".into(), placement(), 2, bell, move |()| {
            std::thread::sleep(Duration::from_millis(20));
            c.fetch_add(1, Ordering::SeqCst);
        })
        .expect("spawn");
        assert!(w.submit(()).is_ok());
        assert!(w.submit(()).is_ok());
        w.join();
        assert_eq!(counter.load(Ordering::SeqCst), 2);
    }
}
