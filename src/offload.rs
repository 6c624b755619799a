//! CPU-heavy request work (decoding a large JSON body, inflating a gzip
//! body) moved off the shard threads.
//!
//! A shard that spends 100 ms parsing one 60 MB body stalls every other
//! connection and instance it owns. [`run`] hands the closure to a small
//! pool of `offload-N` threads instead, which run at a lower scheduling
//! priority than the shards (nice 10), so under load the shards' network
//! and model work goes first. The shard awaits the result on a
//! `futures` oneshot, which wakes its monoio runtime from the worker
//! thread. The queue is bounded: when it is full, [`run`] fails at once
//! with [`OffloadError::Busy`] (answered 503 / UNAVAILABLE) instead of
//! queueing without limit.
//!
//! **Invariant:** a closure run here owns everything it touches (`Send +
//! 'static`): no shard state, no thread-locals.

use std::{
    panic::{catch_unwind, AssertUnwindSafe},
    sync::{
        mpsc::{self, Receiver, SyncSender, TrySendError},
        Arc, Mutex, OnceLock,
    },
    thread,
};

use futures::channel::oneshot;

use crate::types::InferError;

/// Worker threads of the process-wide pool.
pub const THREADS: usize = 2;
/// Jobs waiting for a worker before [`run`] refuses more. Each holds a
/// request body already in memory, so this also bounds how many bodies
/// wait here: `QUEUE * http_max_input_size` at worst.
pub const QUEUE: usize = 64;
/// Niceness of the workers: below the shards (nice 0), above idle work.
const NICE: libc::c_int = 10;

/// Request bodies larger than this are decoded on the pool; smaller ones
/// are decoded inline, where a thread hop would cost more than it saves.
pub const BODY_THRESHOLD: usize = 256 * 1024;

/// Why [`run`] returned no result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OffloadError {
    /// The queue is full: the server has more heavy requests than workers.
    #[error(
        "server overloaded: {QUEUE} large requests are already waiting to be decoded; retry later"
    )]
    Busy,
    /// The pool could not be started or has gone.
    #[error("the decoding threads are not running")]
    Stopped,
    /// The closure panicked (a bug); the worker survives it.
    #[error("decoding the request failed unexpectedly")]
    Panicked,
}

impl From<OffloadError> for InferError {
    fn from(e: OffloadError) -> Self {
        match e {
            OffloadError::Busy | OffloadError::Stopped => InferError::unavailable(e.to_string()),
            OffloadError::Panicked => InferError::internal(e.to_string()),
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// A fixed set of worker threads fed through one bounded queue.
pub struct Pool {
    queue: SyncSender<Job>,
}

impl Pool {
    /// Starts `threads` workers (named `offload-<i>`, at nice 10) sharing a
    /// queue of `capacity` jobs. The workers end when the pool is dropped.
    pub fn new(threads: usize, capacity: usize) -> std::io::Result<Self> {
        let (queue, jobs) = mpsc::sync_channel::<Job>(capacity);
        let jobs = Arc::new(Mutex::new(jobs));
        for i in 0..threads.max(1) {
            let jobs = Arc::clone(&jobs);
            thread::Builder::new()
                .name(format!("offload-{i}"))
                .spawn(move || worker(&jobs))?;
        }
        Ok(Self { queue })
    }

    /// Runs `f` on a worker and waits for its result without blocking the
    /// calling thread. Fails at once with [`OffloadError::Busy`] when the
    /// queue is full.
    pub async fn run<T, F>(&self, f: F) -> Result<T, OffloadError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let (job, rx) = job_for(f);
        self.queue.try_send(job).map_err(|e| match e {
            TrySendError::Full(_) => OffloadError::Busy,
            TrySendError::Disconnected(_) => OffloadError::Stopped,
        })?;
        rx.await.unwrap_or(Err(OffloadError::Stopped))
    }

    /// As [`Pool::run`], but runs `f` on the calling thread when the queue
    /// is full or the workers are gone: for work whose result must not be
    /// lost (an answer already computed), where stalling the caller once
    /// beats failing the request.
    pub async fn run_or_inline<T, F>(&self, f: F) -> Result<T, OffloadError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let (job, rx) = job_for(f);
        match self.queue.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(job) | TrySendError::Disconnected(job)) => job(),
        }
        rx.await.unwrap_or(Err(OffloadError::Stopped))
    }
}

type JobResult<T> = oneshot::Receiver<Result<T, OffloadError>>;

/// `f` as a job that answers through the returned receiver.
fn job_for<T, F>(f: F) -> (Job, JobResult<T>)
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (tx, rx) = oneshot::channel();
    let job: Job = Box::new(move || {
        let result = catch_unwind(AssertUnwindSafe(f)).map_err(|_| OffloadError::Panicked);
        // The caller may have gone (connection closed): nothing to do.
        let _ = tx.send(result);
    });
    (job, rx)
}

fn worker(jobs: &Mutex<Receiver<Job>>) {
    lower_priority();
    loop {
        // Only an idle worker waits on the lock; a poisoned one still
        // holds a usable receiver (jobs never panic while it is held).
        let next = {
            let guard = jobs.lock().unwrap_or_else(|p| p.into_inner());
            guard.recv()
        };
        match next {
            Ok(job) => job(),
            Err(_) => return, // the pool was dropped
        }
    }
}

/// Nice 10 for the calling thread only (on Linux `PRIO_PROCESS` with a
/// thread id addresses one thread). Failure only costs priority.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid and setpriority take no pointers and only
        // affect the calling thread's scheduling.
        let rc = unsafe {
            let tid = libc::gettid();
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, NICE)
        };
        if rc != 0 {
            tracing::debug!(
                error = %std::io::Error::last_os_error(),
                "offload: could not lower the worker's priority"
            );
        }
    }
}

/// The process-wide pool, started on first use.
fn global() -> Result<&'static Pool, OffloadError> {
    static POOL: OnceLock<Option<Pool>> = OnceLock::new();
    POOL.get_or_init(|| match Pool::new(THREADS, QUEUE) {
        Ok(pool) => Some(pool),
        Err(e) => {
            tracing::error!(error = %e, "offload: cannot start the decoding threads");
            None
        }
    })
    .as_ref()
    .ok_or(OffloadError::Stopped)
}

/// Runs `f` on the process-wide pool (see the module docs).
pub async fn run<T, F>(f: F) -> Result<T, OffloadError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    global()?.run(f).await
}

/// Runs `f` on the process-wide pool, or on the calling thread when the
/// pool is full or could not be started (see [`Pool::run_or_inline`]).
pub async fn run_or_inline<T, F>(f: F) -> Result<T, OffloadError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    match global() {
        Ok(pool) => pool.run_or_inline(f).await,
        Err(_) => catch_unwind(AssertUnwindSafe(f)).map_err(|_| OffloadError::Panicked),
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{Arc, Barrier},
        time::Duration,
    };

    use futures::{executor::block_on, FutureExt};

    use super::*;

    #[test]
    fn runs_the_closure_on_a_named_worker() {
        let name = block_on(run(|| thread::current().name().map(str::to_string))).unwrap();
        assert!(name.unwrap().starts_with("offload-"));
    }

    #[test]
    fn workers_run_at_a_lower_priority() {
        let nice = block_on(run(|| {
            // SAFETY: reads the calling thread's niceness.
            unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
        }))
        .unwrap();
        assert_eq!(nice, NICE);
    }

    #[test]
    fn a_full_queue_refuses_at_once() {
        let pool = Pool::new(1, 1).unwrap();
        let (started_tx, started) = mpsc::channel();
        let gate = Arc::new(Barrier::new(2));
        let held = Arc::clone(&gate);
        // The only worker takes the first job and holds it...
        let mut first = Box::pin(pool.run(move || {
            let _ = started_tx.send(());
            held.wait();
            1
        }));
        assert!(first.as_mut().now_or_never().is_none());
        started.recv().unwrap();
        // ... one more job fits in the queue ...
        let mut second = Box::pin(pool.run(|| 2));
        assert!(second.as_mut().now_or_never().is_none());
        // ... and the next is refused without waiting.
        assert_eq!(block_on(pool.run(|| 3)), Err(OffloadError::Busy));
        gate.wait();
        assert_eq!(block_on(first), Ok(1));
        assert_eq!(block_on(second), Ok(2));
    }

    #[test]
    fn a_full_queue_runs_must_finish_work_on_the_caller() {
        let pool = Pool::new(1, 1).unwrap();
        let (started_tx, started) = mpsc::channel();
        let gate = Arc::new(Barrier::new(2));
        let held = Arc::clone(&gate);
        let mut first = Box::pin(pool.run(move || {
            let _ = started_tx.send(());
            held.wait();
            thread::current().name().map(str::to_string)
        }));
        assert!(first.as_mut().now_or_never().is_none());
        started.recv().unwrap();
        let mut second = Box::pin(pool.run(|| thread::current().name().map(str::to_string)));
        assert!(second.as_mut().now_or_never().is_none());
        // The queue is full: this one runs here, at once.
        let here = thread::current().name().map(str::to_string);
        assert_eq!(
            block_on(pool.run_or_inline(|| thread::current().name().map(str::to_string))),
            Ok(here)
        );
        gate.wait();
        assert!(block_on(first).unwrap().unwrap().starts_with("offload-"));
        assert!(block_on(second).unwrap().unwrap().starts_with("offload-"));
        // With room in the queue it goes to a worker.
        let name = block_on(pool.run_or_inline(|| thread::current().name().map(str::to_string)));
        assert!(name.unwrap().unwrap().starts_with("offload-"));
    }

    #[test]
    fn a_panicking_closure_is_an_error_and_the_worker_survives() {
        let pool = Pool::new(1, 4).unwrap();
        assert_eq!(
            block_on(pool.run(|| -> u8 { panic!("boom") })),
            Err(OffloadError::Panicked)
        );
        assert_eq!(block_on(pool.run(|| 7)), Ok(7));
    }

    #[test]
    fn wakes_a_monoio_runtime_from_the_worker() {
        let mut rt = crate::shard::uring::runtime_builder::<monoio::FusionDriver>()
            .enable_timer()
            .build()
            .unwrap();
        let got = rt.block_on(async {
            run(|| {
                thread::sleep(Duration::from_millis(20));
                42
            })
            .await
        });
        assert_eq!(got, Ok(42));
    }
}
