//! Compute threads whose owner let go of them. A shard never blocks on a
//! thread, so a dropped [`super::ComputeWorker`] only tells its thread to
//! stop; the thread then finishes its last item and drops what it owns
//! (a model instance, whose finalizer runs there, on the thread that ran
//! its executions). Its join handle lands here, so that shutdown can wait
//! for every such thread, finalizers included, before the process exits.

use std::{
    sync::Mutex,
    thread::JoinHandle,
    time::{Duration, Instant},
};

struct Retired {
    name: String,
    join: JoinHandle<()>,
}

/// Taken only when a worker is dropped (unload, shutdown) or at exit.
static RETIRED: Mutex<Vec<Retired>> = Mutex::new(Vec::new());

/// Keeps `join` until the thread is joined by [`join_retired`]. Threads
/// already finished are joined on the way, so repeated loads and unloads
/// keep the list short.
pub(super) fn retire(name: String, join: JoinHandle<()>) {
    let mut retired = RETIRED.lock().unwrap_or_else(|p| p.into_inner());
    let (done, running): (Vec<_>, Vec<_>) = std::mem::take(&mut *retired)
        .into_iter()
        .partition(|r| r.join.is_finished());
    *retired = running;
    retired.push(Retired { name, join });
    drop(retired);
    for r in done {
        join_one(r);
    }
}

fn join_one(r: Retired) {
    if r.join.join().is_err() {
        tracing::error!(worker = %r.name, "a compute worker panicked while stopping");
    }
}

/// Joins every retired compute thread, waiting until `deadline` at most.
/// Returns the names of the threads still running then (executing or in a
/// finalizer); they are left detached.
pub fn join_retired(deadline: Instant) -> Vec<String> {
    loop {
        let running = {
            let mut retired = RETIRED.lock().unwrap_or_else(|p| p.into_inner());
            let (done, running): (Vec<_>, Vec<_>) = std::mem::take(&mut *retired)
                .into_iter()
                .partition(|r| r.join.is_finished());
            *retired = running;
            let names: Vec<String> = retired.iter().map(|r| r.name.clone()).collect();
            drop(retired);
            for r in done {
                join_one(r);
            }
            names
        };
        if running.is_empty() || Instant::now() >= deadline {
            return running;
        }
        // `JoinHandle` has no timed join: poll, this is the exit path only.
        std::thread::sleep(Duration::from_millis(2));
    }
}
