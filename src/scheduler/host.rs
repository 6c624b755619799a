//! The schedulers a shard hosts, and the request path between shards: the
//! ring messages (a job to a scheduler, an answer back to its origin), the
//! drainer of this shard's incoming rings, and the control tasks that
//! install and remove schedulers.
//!
//! It lives here, not in `shard`, so that the shard runtime knows nothing
//! of schedulers: `shard` gives the thread, its table, lifecycle and the
//! generic ring mesh; this module fills the rings with jobs. Per-shard
//! state sits in a thread-local of its own (one borrow per request, like
//! the shard's), so the request path pays no dynamic dispatch.

use std::{
    cell::RefCell,
    future::poll_fn,
    rc::Rc,
    sync::Arc,
    time::{Duration, Instant},
};

use futures::{channel::oneshot, task::AtomicWaker};

use super::{InstanceExecutor, Job, ModelScheduler, Responder};
use crate::{
    model::ModelVersion,
    shard::{
        ring::{Inbox, Outbox},
        KeyMap, Shard, ShardId, ShardTask, Target,
    },
    types::{InferError, InferResponse, InferResult},
};

/// What crosses the ring from one shard to another.
pub enum ShardMsg {
    /// Queue `job` on the receiving shard's scheduler `scheduler`.
    Infer { scheduler: u64, job: Job },
    /// Complete a request on the shard that decoded it.
    Reply {
        reply: Responder,
        result: InferResult<InferResponse>,
    },
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

/// This shard's schedulers and its ends of the ring mesh.
pub struct SchedulerHost {
    shard: Rc<Shard>,
    outbox: RefCell<Outbox<ShardMsg>>,
    schedulers: RefCell<KeyMap<Rc<ModelScheduler>>>,
}

thread_local! {
    static HOST: RefCell<Option<Rc<SchedulerHost>>> = const { RefCell::new(None) };
}

/// Runs `f` with this thread's scheduler host; `None` off shard threads.
fn with_host<R>(f: impl FnOnce(&SchedulerHost) -> R) -> Option<R> {
    HOST.with(|h| h.borrow().as_deref().map(f))
}

thread_local! {
    /// On a compute worker's thread while it executes a batch: the answers
    /// held for the scheduler's shard to send (see [`hold_replies`]).
    static HELD: RefCell<Option<Vec<HeldReply>>> = const { RefCell::new(None) };
}

/// An answer a compute worker produced, sent by the scheduler's shard when
/// it takes the batch back.
pub struct HeldReply {
    origin: ShardId,
    reply: Responder,
    result: InferResult<InferResponse>,
}

impl HeldReply {
    /// Sends the answer; on the scheduler's shard (a local completion, or
    /// the ring to the origin shard).
    pub fn send(self) {
        reply(self.origin, self.reply, self.result);
    }
}

/// Runs `execute` (a compute worker's batch) holding the answers it gives
/// through [`reply`] rather than sending them from the worker thread, and
/// returns them. Sent from the worker, each answer is a cross-thread wake
/// of its shard (an eventfd write and, on a core the two share, a context
/// switch); handed back with the batch, they cost the one wake that returns
/// the batch, and none while the worker holds finished batches back (see
/// `compute::WorkerPlacement::hold`).
pub fn hold_replies(execute: impl FnOnce()) -> Vec<HeldReply> {
    struct Release;
    impl Drop for Release {
        // Also on unwinding: answers left here would never be sent, and a
        // later batch on this thread must start empty.
        fn drop(&mut self) {
            HELD.with(|h| h.borrow_mut().take());
        }
    }
    HELD.with(|h| *h.borrow_mut() = Some(Vec::new()));
    let release = Release;
    execute();
    let held = HELD.with(|h| h.borrow_mut().take()).unwrap_or_default();
    drop(release);
    held
}

/// Answers a request on the shard that decoded it: directly if that is
/// this shard, else through the ring back to it. Inside [`hold_replies`]
/// (a compute worker) the answer is held instead.
pub fn reply(origin: ShardId, reply: Responder, result: InferResult<InferResponse>) {
    let unheld = HELD.with(|h| match h.borrow_mut().as_mut() {
        Some(held) => {
            held.push(HeldReply {
                origin,
                reply,
                result,
            });
            None
        }
        None => Some((reply, result)),
    });
    let Some((reply, result)) = unheld else {
        return;
    };
    let mut msg = Some(ShardMsg::Reply { reply, result });
    with_host(|h| {
        if origin != h.shard.id {
            if let Some(m) = msg.take() {
                msg = h.outbox.borrow_mut().send(origin, m).err();
            }
        }
    });
    // Local answer, a full return ring, or a compute worker's thread:
    // complete the oneshot directly. A cross-thread completion wakes the
    // origin through monoio's remote wake-up, so an executing shard never
    // blocks on a full return ring.
    if let Some(ShardMsg::Reply { reply, result }) = msg {
        let _ = reply.send(result);
    }
}

/// Queues `job` on the scheduler `target`, locally or across the ring;
/// `None` (the job dropped, so its answer is "scheduler gone") off a shard.
pub(super) fn dispatch(target: Target, job: Job) -> Option<Dispatch> {
    with_host(|h| h.dispatch(target, job))
}

impl SchedulerHost {
    /// Makes a host for `shard` this thread's, sending through `outbox`.
    pub fn install(shard: Rc<Shard>, outbox: Outbox<ShardMsg>) -> Rc<Self> {
        let host = Rc::new(Self {
            shard,
            outbox: RefCell::new(outbox),
            schedulers: RefCell::new(KeyMap::default()),
        });
        HOST.with(|h| *h.borrow_mut() = Some(host.clone()));
        host
    }

    fn dispatch(&self, target: Target, job: Job) -> Dispatch {
        if target.shard == self.shard.id {
            self.enqueue_local(target.key, job, true);
            return Dispatch::Queued;
        }
        let msg = ShardMsg::Infer {
            scheduler: target.key,
            job,
        };
        let mut outbox = self.outbox.borrow_mut();
        match outbox.send(target.shard, msg) {
            Ok(()) => {
                if let Some(g) = self.shard.gauges.get(self.shard.id) {
                    g.set_ring_occupancy(target.shard, outbox.occupancy(target.shard));
                    g.count_forwarded(target.shard);
                }
                Dispatch::Queued
            }
            Err(ShardMsg::Infer { job, .. }) => Dispatch::RingFull(target, job),
            Err(ShardMsg::Reply { .. }) => Dispatch::Queued,
        }
    }

    /// `run_here`: the calling task carries this one request, so an inline
    /// batch may run in it (`ModelScheduler::enqueue_and_run`).
    fn enqueue_local(&self, key: u64, job: Job, run_here: bool) {
        let scheduler = self.schedulers.borrow().get(&key).cloned();
        match scheduler {
            Some(s) if run_here => s.enqueue_and_run(job),
            Some(s) => s.enqueue(job),
            None => self.redispatch(key, job),
        }
    }

    /// A job whose version was replaced while it crossed a ring (a reload
    /// publishes the new table, then stops the old scheduler): it goes to
    /// the version this shard's table names now, validated again against
    /// it. Only a model that is gone altogether answers "no longer loaded".
    fn redispatch(&self, old_key: u64, mut job: Job) {
        let target = self.shard.with_table(|table| {
            let model = table
                .resolve(&job.request.model_name, &job.request.model_version)
                .ok()?;
            Some(
                crate::model::validate_request(&model.io, &model.name, &mut job.request)
                    .map(|()| model.scheduler_for(self.shard.id)),
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
            ShardMsg::Infer { scheduler, job } => self.enqueue_local(scheduler, job, false),
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

    /// Shutdown begins: every scheduler runs what it has queued without
    /// batching delays.
    pub fn drain(&self) {
        for s in self.schedulers.borrow().values() {
            s.drain();
        }
    }

    /// Whether a scheduler this shard owns has requests queued or an
    /// instance executing (on a compute worker, whose completion wakes this
    /// shard from another thread).
    pub fn busy(&self) -> bool {
        self.schedulers.borrow().values().any(|s| s.is_busy())
    }

    /// Requests queued in the schedulers this shard owns.
    pub fn queued(&self) -> usize {
        self.schedulers
            .borrow()
            .values()
            .map(|s| s.queue_len())
            .sum()
    }

    /// Shutdown, after the drain: stops every scheduler this shard owns
    /// and waits, until `deadline`, for their tasks to end. The schedulers
    /// are then dropped here: inline instances on this thread, compute
    /// workers told to stop (their threads drop, and so finalize, their
    /// instance; shutdown joins them). Returns the models whose scheduler
    /// was still running at the deadline (an execution that did not end),
    /// left to be dropped with the runtime.
    pub async fn retire_all(&self, deadline: Instant) -> Vec<String> {
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
        let floor = Instant::now() + Duration::from_millis(20);
        while schedulers.iter().any(running) && Instant::now() < deadline.max(floor) {
            monoio::time::sleep(Duration::from_millis(1)).await;
        }
        let stuck = schedulers
            .iter()
            .filter(|s| running(s))
            .map(|s| s.model.name.clone())
            .collect();
        drop(schedulers);
        stuck
    }
}

/// A control task (for [`crate::shard::ShardControl::Run`]) that hosts the
/// scheduler of a model version with its instances on the shard that runs
/// it. `done_bell` is rung by the model's compute workers when a batch is
/// done; `installed` is answered once the scheduler runs.
pub fn install_task(
    key: u64,
    model: Arc<ModelVersion>,
    executors: Vec<InstanceExecutor>,
    done_bell: Arc<AtomicWaker>,
    limits: Option<super::rate_limiter::ModelLimits>,
    installed: oneshot::Sender<()>,
) -> ShardTask {
    Box::new(move || {
        let hosted = with_host(|h| {
            let scheduler = ModelScheduler::new(
                key,
                model,
                executors,
                done_bell,
                super::model_scheduler::OwnerShard {
                    id: h.shard.id,
                    gauges: h.shard.gauges.clone(),
                    default_max_queue: h.shard.max_queue_size,
                },
                limits,
            );
            monoio::spawn(scheduler.clone().run());
            h.schedulers.borrow_mut().insert(key, scheduler);
        });
        // Dropped unanswered off a shard: the loader sees the failure.
        if hosted.is_some() {
            let _ = installed.send(());
        }
    })
}

/// A control task that stops and removes the scheduler `key`.
pub fn remove_task(key: u64) -> ShardTask {
    Box::new(move || {
        with_host(|h| {
            if let Some(s) = h.schedulers.borrow_mut().remove(&key) {
                s.stop();
            }
        });
    })
}
