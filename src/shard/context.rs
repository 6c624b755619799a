//! The state a shard owns, reachable from any task on its thread through a
//! thread-local. Nothing in here is shared with other threads.

use std::{
    cell::{Cell, RefCell},
    collections::HashMap,
    future::poll_fn,
    rc::Rc,
    sync::Arc,
};

use futures::{channel::oneshot, StreamExt};

use super::{
    ring::{Inbox, Outbox},
    Latch, ShardId, ShardMsg,
};
use crate::{
    metrics::ShardGauges,
    model::{ModelTable, ModelVersion},
    scheduler::{InstanceExecutor, Job, ModelScheduler, Responder},
    types::{InferError, InferResponse, InferResult},
};

/// Messages from the control plane (model loads, table updates). Not on
/// the request path, so an unbounded MPSC channel is fine here.
pub enum ShardControl {
    /// Host the scheduler of a model version with its instances.
    Install {
        key: u64,
        model: Arc<ModelVersion>,
        executors: Vec<InstanceExecutor>,
        /// Rung by the model's compute workers when a batch is done.
        done_bell: Arc<futures::task::AtomicWaker>,
        installed: oneshot::Sender<()>,
    },
    Remove {
        key: u64,
    },
    Table(Arc<ModelTable>),
    /// Work from a thread that is not a shard (the C API's in-process
    /// inference): run on this shard's thread, where it may spawn tasks.
    Run(ShardTask),
    Shutdown,
}

/// A closure sent to a shard with [`ShardControl::Run`].
pub type ShardTask = Box<dyn FnOnce() + Send>;

/// The scheduler of a model version: the shard that owns it and its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    pub shard: ShardId,
    pub key: u64,
}

/// Outcome of handing a job towards its scheduler.
// The job comes back by value on the rare full-ring path so the common
// path allocates nothing; the size difference is deliberate.
#[allow(clippy::large_enum_variant)]
pub enum Dispatch {
    Queued,
    /// The ring to the owning shard is full: back-pressure; try again later.
    RingFull(Target, Job),
}

pub struct Shard {
    pub id: ShardId,
    pub count: usize,
    outbox: RefCell<Outbox<ShardMsg>>,
    table: RefCell<Arc<ModelTable>>,
    /// Every loaded model version by scheduler key, refreshed with the
    /// table, so a request can find its model again after an await without
    /// holding (and reference-counting) a shared handle.
    by_key: RefCell<HashMap<u64, Arc<ModelVersion>>>,
    schedulers: RefCell<HashMap<u64, Rc<ModelScheduler>>>,
    pub shutdown: Latch,
    in_flight: Cell<usize>,
    /// Every shard's gauges (this shard writes only its own).
    pub gauges: Arc<[ShardGauges]>,
    /// `--request-timeout-ms`: the longest a request waits for its answer.
    pub request_timeout: Option<std::time::Duration>,
    /// `--max-queue-size`: the bound of queues the config leaves unbounded.
    pub max_queue_size: usize,
    /// Called as each request enters ([`InFlight::enter`]); `None` except in
    /// `benches/shard_sharing.rs`, which plants deliberate work here.
    request_probe: Cell<Option<fn()>>,
}

thread_local! {
    static CURRENT: RefCell<Option<Rc<Shard>>> = const { RefCell::new(None) };
}

/// Runs `f` with this thread's shard; `None` off shard threads.
pub fn with_current<R>(f: impl FnOnce(&Shard) -> R) -> Option<R> {
    let shard = CURRENT.with(|c| c.borrow().clone())?;
    Some(f(&shard))
}

/// Answers a request on the shard that decoded it: directly if that is
/// this shard, else through the ring back to it.
pub fn reply(origin: ShardId, reply: Responder, result: InferResult<InferResponse>) {
    let mut msg = Some(ShardMsg::Reply { reply, result });
    with_current(|s| {
        if origin != s.id {
            if let Some(m) = msg.take() {
                msg = s.outbox.borrow_mut().send(origin, m).err();
            }
        }
    });
    // Local answer, or a full return ring: complete the oneshot directly.
    // A cross-thread completion wakes the origin through monoio's remote
    // wake-up, so an executing shard never blocks on a full return ring.
    if let Some(ShardMsg::Reply { reply, result }) = msg {
        let _ = reply.send(result);
    }
}

impl Shard {
    pub fn new(
        id: ShardId,
        count: usize,
        outbox: Outbox<ShardMsg>,
        gauges: Arc<[ShardGauges]>,
        request_timeout: Option<std::time::Duration>,
        max_queue_size: usize,
    ) -> Rc<Self> {
        Rc::new(Self {
            id,
            count,
            outbox: RefCell::new(outbox),
            table: RefCell::new(Arc::new(ModelTable::default())),
            by_key: RefCell::new(HashMap::new()),
            schedulers: RefCell::new(HashMap::new()),
            shutdown: Latch::default(),
            in_flight: Cell::new(0),
            gauges,
            request_timeout,
            max_queue_size,
            request_probe: Cell::new(None),
        })
    }

    /// Installs (or with `None` removes) a function this shard calls as
    /// each request enters. For benchmarks that need to plant work on the
    /// request path (`benches/shard_sharing.rs`); nothing else sets it.
    #[doc(hidden)]
    pub fn set_request_probe(&self, probe: Option<fn()>) {
        self.request_probe.set(probe);
    }

    /// Makes `shard` this thread's current shard.
    pub fn install_current(shard: Rc<Shard>) {
        CURRENT.with(|c| *c.borrow_mut() = Some(shard));
    }

    pub fn clear_current() {
        CURRENT.with(|c| c.borrow_mut().take());
    }

    /// Runs `f` on the current table without touching its reference count
    /// (the request path: other shards hold the same `Arc`). There is
    /// deliberately no accessor that clones the table's `Arc`.
    pub fn with_table<R>(&self, f: impl FnOnce(&ModelTable) -> R) -> R {
        f(&self.table.borrow())
    }

    /// Runs `f` on the model version whose scheduler has `key`, if loaded.
    pub fn with_model<R>(&self, key: u64, f: impl FnOnce(&ModelVersion) -> R) -> Option<R> {
        self.by_key.borrow().get(&key).map(|m| f(m))
    }

    fn set_table(&self, table: Arc<ModelTable>) {
        let mut by_key = HashMap::new();
        for entry in table.models.values() {
            for v in entry.versions.values() {
                if let Some(m) = &v.loaded {
                    by_key.insert(m.scheduler.key, m.clone());
                }
            }
        }
        *self.by_key.borrow_mut() = by_key;
        *self.table.borrow_mut() = table;
    }

    /// Queues `job` on the scheduler `target`, locally or across the ring.
    pub fn dispatch(&self, target: Target, job: Job) -> Dispatch {
        if target.shard == self.id {
            self.enqueue_local(target.key, job);
            return Dispatch::Queued;
        }
        let msg = ShardMsg::Infer {
            scheduler: target.key,
            job,
        };
        let mut outbox = self.outbox.borrow_mut();
        match outbox.send(target.shard, msg) {
            Ok(()) => {
                if let Some(g) = self.gauges.get(self.id) {
                    g.set_ring_occupancy(target.shard, outbox.occupancy(target.shard));
                    g.count_forwarded(target.shard);
                }
                Dispatch::Queued
            }
            Err(ShardMsg::Infer { job, .. }) => Dispatch::RingFull(target, job),
            Err(ShardMsg::Reply { .. }) => Dispatch::Queued,
        }
    }

    fn enqueue_local(&self, key: u64, job: Job) {
        let scheduler = self.schedulers.borrow().get(&key).cloned();
        match scheduler {
            Some(s) => s.enqueue(job),
            None => self.redispatch(key, job),
        }
    }

    /// A job whose version was replaced while it crossed a ring (a reload
    /// publishes the new table, then stops the old scheduler): it goes to
    /// the version this shard's table names now, validated again against
    /// it. Only a model that is gone altogether answers "no longer loaded".
    fn redispatch(&self, old_key: u64, mut job: Job) {
        let target = self.with_table(|table| {
            let model = table
                .resolve(&job.request.model_name, &job.request.model_version)
                .ok()?;
            Some(
                crate::model::validate_request(&model.io, &model.name, &mut job.request)
                    .map(|()| model.scheduler),
            )
        });
        let outcome = match target {
            Some(Ok(target)) if target.key != old_key => match self.dispatch(target, job) {
                Dispatch::Queued => return,
                Dispatch::RingFull(_, job) => (
                    job,
                    InferError::unavailable(
                        "server overloaded: the ring to the model's shard is full; retry later",
                    ),
                ),
            },
            Some(Err(e)) => (job, e),
            _ => (
                job,
                InferError::unavailable(
                    "the model version this request was sent to is no longer loaded",
                ),
            ),
        };
        let (job, error) = outcome;
        let _ = job.reply.send(Err(error));
    }

    fn handle(&self, msg: ShardMsg) {
        match msg {
            ShardMsg::Infer { scheduler, job } => self.enqueue_local(scheduler, job),
            ShardMsg::Reply { reply, result } => {
                let _ = reply.send(result);
            }
        }
    }

    /// The drainer task: takes messages from every incoming ring as they
    /// arrive, sleeping on the doorbell when all are empty. It runs for the
    /// shard's whole life, shutdown included: requests forwarded to this
    /// shard and their replies must still be served while the server
    /// drains.
    pub async fn drain_rings(self: Rc<Self>, mut inbox: Inbox<ShardMsg>) {
        loop {
            poll_fn(|cx| inbox.poll_drain(cx, |m| self.handle(m))).await;
        }
    }

    /// The control task: applies installs, removals and table updates.
    pub async fn run_control(
        self: Rc<Self>,
        mut control: futures::channel::mpsc::UnboundedReceiver<ShardControl>,
    ) {
        while let Some(msg) = control.next().await {
            match msg {
                ShardControl::Install {
                    key,
                    model,
                    executors,
                    done_bell,
                    installed,
                } => {
                    let scheduler = ModelScheduler::new(
                        key,
                        model,
                        executors,
                        done_bell,
                        self.id,
                        self.gauges.clone(),
                        self.max_queue_size,
                    );
                    monoio::spawn(scheduler.clone().run());
                    self.schedulers.borrow_mut().insert(key, scheduler);
                    let _ = installed.send(());
                }
                ShardControl::Remove { key } => {
                    if let Some(s) = self.schedulers.borrow_mut().remove(&key) {
                        s.stop();
                    }
                }
                ShardControl::Table(table) => self.set_table(table),
                ShardControl::Run(task) => task(),
                ShardControl::Shutdown => {
                    self.shutdown.set();
                    for s in self.schedulers.borrow().values() {
                        s.drain();
                    }
                    return;
                }
            }
        }
    }

    /// Shutdown, after the drain: stops every scheduler this shard owns
    /// and waits, until `deadline`, for their tasks to end. The schedulers
    /// are then dropped here: inline instances on this thread, compute
    /// workers told to stop (their threads drop, and so finalize, their
    /// instance; shutdown joins them). Returns the models whose scheduler
    /// was still running at the deadline (an execution that did not end),
    /// left to be dropped with the runtime.
    pub async fn retire_all(&self, deadline: std::time::Instant) -> Vec<String> {
        let schedulers: Vec<Rc<ModelScheduler>> = self
            .schedulers
            .borrow_mut()
            .drain()
            .map(|(_, s)| s)
            .collect();
        for s in &schedulers {
            s.stop();
        }
        // The scheduler task holds the other reference until it returns.
        let running = |s: &Rc<ModelScheduler>| Rc::strong_count(s) > 1;
        // An idle scheduler returns at its next poll: give every one that
        // chance even when draining the connections used up the deadline,
        // so that only real executions are reported as outliving it.
        let floor = std::time::Instant::now() + std::time::Duration::from_millis(20);
        while schedulers.iter().any(running) && std::time::Instant::now() < deadline.max(floor) {
            monoio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        let stuck = schedulers
            .iter()
            .filter(|s| running(s))
            .map(|s| s.model.name.clone())
            .collect();
        drop(schedulers);
        stuck
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.get()
    }

    /// Requests queued in the schedulers this shard owns.
    pub fn queued(&self) -> usize {
        self.schedulers
            .borrow()
            .values()
            .map(|s| s.queue_len())
            .sum()
    }

    pub fn ring_occupancy(&self, to: ShardId) -> usize {
        self.outbox.borrow().occupancy(to)
    }
}

/// Counts a request in flight on the current shard for as long as it
/// lives; graceful shutdown waits for the count to reach zero. Holds no
/// shard reference, so futures holding it stay `Send`.
pub struct InFlight(());

impl InFlight {
    pub fn enter() -> Self {
        with_current(|s| {
            s.in_flight.set(s.in_flight.get() + 1);
            if let Some(g) = s.gauges.get(s.id) {
                g.add_in_flight(1);
            }
            if let Some(probe) = s.request_probe.get() {
                probe();
            }
        });
        InFlight(())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        with_current(|s| {
            s.in_flight.set(s.in_flight.get().saturating_sub(1));
            if let Some(g) = s.gauges.get(s.id) {
                g.add_in_flight(-1);
            }
        });
    }
}

/// Counts an open connection in its shard's gauges while it lives. Holds
/// the shard by `Rc` (a count only this thread writes), not the gauges'
/// `Arc`, whose count every shard would bump per connection.
pub struct ConnectionGauge {
    shard: Rc<Shard>,
}

impl ConnectionGauge {
    pub fn open(shard: &Rc<Shard>) -> Self {
        if let Some(g) = shard.gauges.get(shard.id) {
            g.add_connection(1);
        }
        Self {
            shard: shard.clone(),
        }
    }
}

impl Drop for ConnectionGauge {
    fn drop(&mut self) {
        if let Some(g) = self.shard.gauges.get(self.shard.id) {
            g.add_connection(-1);
        }
    }
}
