//! One scheduler per loaded model version, owned by one shard (Triton's
//! rule: one queue per model, feeding whichever instance is free).
//! Requests reach it locally or through the rings; it forms batches (FIFO
//! for the default scheduler, the dynamic batcher otherwise) only when an
//! instance is free, so queued requests keep accumulating into larger
//! batches while every instance is busy. Instances run inline on the
//! shard (light built-in backends) or on their own compute worker thread.
//! Shard-local: only the owner shard's tasks touch it, so plain `Cell`s
//! and `RefCell`s suffice.

use std::{
    cell::{Cell, RefCell},
    collections::VecDeque,
    future::poll_fn,
    rc::Rc,
    sync::Arc,
    task::{Poll, Waker},
    time::{Duration, Instant},
};

use futures::task::AtomicWaker;

use super::{
    batch::{batch_rows, compatible},
    dynamic_batcher::{BatchQueue, BatcherPolicy, Decision, Pending},
    execute::{Batch, Runner},
    host, ragged,
    rate_limiter::ModelLimits,
    reorder::Reorder,
    sequence::{Entry, RowControl, SeqDecision, SequenceBatcher, Strategy},
    timeout::requested_timeout,
    Job,
};
use crate::{
    backend::ModelInstance,
    compute::{ComputeWorker, WorkerPlacement},
    metrics::ShardGauges,
    model::ModelVersion,
    proto::inference::model_config::SchedulingChoice,
    shard::{self, yield_now},
    types::InferError,
};

/// Default of `--max-queue-size`: the queue bound applied where the
/// configuration leaves `max_queue_size` at 0 (Triton's "unbounded"), so
/// memory stays bounded under overload.
pub const DEFAULT_MAX_QUEUE_SIZE: usize = 4096;

/// A compute worker takes batches and gives back their answers, which the
/// scheduler's shard sends (see [`host::hold_replies`]).
pub type InstanceWorker = ComputeWorker<Batch, Vec<host::HeldReply>>;

/// An instance as handed to its owner shard.
pub enum InstanceExecutor {
    /// Executed synchronously on the owner shard (light built-in models:
    /// cheaper than a thread hop, measured).
    Inline(Box<dyn ModelInstance>),
    /// Executed on its own compute thread.
    Worker(InstanceWorker),
}

impl InstanceExecutor {
    /// Starts a compute worker that owns `instance` and records its
    /// executions in the model's counter block `stats_block`.
    pub fn spawn_worker(
        name: String,
        model: Arc<ModelVersion>,
        stats_block: usize,
        instance: Box<dyn ModelInstance>,
        placement: WorkerPlacement,
        bell: Arc<AtomicWaker>,
    ) -> std::io::Result<Self> {
        // The runner (and a sequence model's implicit states) lives on the
        // worker thread. `placement.depth` is how many batches the
        // scheduler may hand it before the first comes back (see
        // `ModelScheduler::may_queue_behind`).
        let mut runner = Runner::new(instance, &model);
        let worker = ComputeWorker::spawn(name, placement, bell, move |mut batch: Batch| {
            // A request handed ahead waited in the ring, where the queue's
            // sweep (`expire`) no longer sees it: one whose client went
            // away meanwhile (its origin counted it) is dropped here, as
            // the queue would have. Sequence rows keep their slots.
            if batch.rows.is_none() {
                batch.jobs.retain(|j| !j.is_cancelled());
                if batch.jobs.is_empty() {
                    return Vec::new();
                }
            }
            host::hold_replies(|| runner.run(&model, model.stats.shard(stats_block), batch))
        })?;
        Ok(Self::Worker(worker))
    }
}

/// Whether a model asks for its responses in queue order across more
/// than one instance (`dynamic_batching` or the sequence batcher's
/// `oldest` strategy with `preserve_ordering`); one instance answers in
/// order by construction.
fn wants_reorder(model: &ModelVersion) -> bool {
    if model.instances.len() < 2 {
        return false;
    }
    match &model.sequence {
        Some(spec) => matches!(
            spec.strategy,
            Strategy::Oldest {
                preserve_ordering: true,
                ..
            }
        ),
        None => matches!(
            &model.config.scheduling_choice,
            Some(SchedulingChoice::DynamicBatching(db)) if db.preserve_ordering
        ),
    }
}

enum Exec {
    Inline(RefCell<Runner>),
    Worker(RefCell<InstanceWorker>),
}

struct Instance {
    exec: Exec,
    /// Batches handed and not yet finished (at most `depth`).
    in_flight: Cell<usize>,
    /// How many batches it may hold: its worker's ring capacity (1 inline).
    depth: usize,
    /// Arrival times of the batches handed to the busy worker behind the
    /// one it runs, oldest first. As in Triton, they are still pending and
    /// still queueing until the worker starts them, which the shard learns
    /// when the batch before finishes (`collect_done`): pending and queue
    /// time are recorded then, not at the hand-over.
    ahead: RefCell<VecDeque<Vec<Instant>>>,
}

impl Instance {
    fn busy(&self) -> bool {
        self.in_flight.get() > 0
    }
}

enum Queue {
    Fifo {
        jobs: VecDeque<Job>,
        max: usize,
    },
    Batched(BatchQueue<Job>),
    /// Sequence batcher: slots per instance, a backlog, idle release.
    Sequence {
        batcher: Box<SequenceBatcher<Job>>,
        /// When the next sequence may go idle.
        idle_check: Option<Instant>,
    },
}

impl Queue {
    fn len(&self) -> usize {
        match self {
            Queue::Fifo { jobs, .. } => jobs.len(),
            Queue::Batched(q) => q.len(),
            Queue::Sequence { batcher, .. } => batcher.len(),
        }
    }
}

enum Next {
    Run(Batch),
    WaitUntil(Instant),
    Nothing,
}

pub struct ModelScheduler {
    pub key: u64,
    pub model: Arc<ModelVersion>,
    shard: usize,
    gauges: Arc<[ShardGauges]>,
    queue: RefCell<Queue>,
    instances: Vec<Instance>,
    done_bell: Arc<AtomicWaker>,
    waker: Cell<Option<Waker>>,
    /// Set by `enqueue`/`stop`/`drain`, cleared when the task looks again.
    notified: Cell<bool>,
    /// Unloading: refuse new requests, exit once drained.
    stopped: Cell<bool>,
    /// Shutting down: accept, but run what is queued without waiting for
    /// batching delays.
    draining: Cell<bool>,
    /// Batching delays are waited on it (sub-millisecond, reactor parked).
    timer: shard::PreciseTimer,
    /// `preserve_ordering` across instances: answers leave in dispatch order.
    reorder: Option<Reorder>,
    /// `--rate-limit execution_count`: what each instance must hold to
    /// execute. `None` (the default) costs one check per batch.
    limits: Option<ModelLimits>,
    /// An input with `allow_ragged_batch`: requests batch without equal
    /// shapes in it (read once from the config, not per batch).
    ragged_inputs: bool,
    /// The default scheduler over inline instances only, with no rate
    /// limiter and no `preserve_ordering`: a connection's task may run its
    /// batch (`dispatch_in_caller`). Fixed by the config, so read once.
    runs_in_caller: bool,
    /// `dispatch` is running: an `enqueue` from inside it only queues.
    dispatching: Cell<bool>,
}

/// What the owner shard gives each scheduler it hosts.
pub struct OwnerShard {
    pub id: usize,
    pub gauges: Arc<[ShardGauges]>,
    /// `--max-queue-size`, for configs that leave `max_queue_size` at 0.
    pub default_max_queue: usize,
}

impl ModelScheduler {
    pub fn new(
        key: u64,
        model: Arc<ModelVersion>,
        executors: Vec<InstanceExecutor>,
        done_bell: Arc<AtomicWaker>,
        owner: OwnerShard,
        limits: Option<ModelLimits>,
    ) -> Rc<Self> {
        let OwnerShard {
            id: shard,
            gauges,
            default_max_queue,
        } = owner;
        let queue = match &model.config.scheduling_choice {
            _ if model.sequence.is_some() => {
                let spec = model.sequence.as_ref().expect("checked");
                Queue::Sequence {
                    batcher: Box::new(SequenceBatcher::new(
                        spec.strategy.clone(),
                        executors.len(),
                        spec.slots_per_instance,
                        spec.max_batch_size,
                        spec.idle,
                        default_max_queue,
                    )),
                    idle_check: None,
                }
            }
            Some(SchedulingChoice::DynamicBatching(db)) if model.config.max_batch_size > 0 => {
                let mut policy = BatcherPolicy::from_config(model.config.max_batch_size, db);
                for level in &mut policy.levels {
                    if level.max_queue_size == 0 {
                        level.max_queue_size = default_max_queue;
                    }
                }
                let mut queue = BatchQueue::new(policy);
                if let Some(count) = delay_scheduler_count() {
                    tracing::info!(
                        model = %model.name,
                        "TRITONSERVER_DELAY_SCHEDULER: the dynamic batcher waits for {count} queued requests before its first batch"
                    );
                    queue.hold_until_queued(count);
                }
                Queue::Batched(queue)
            }
            _ => Queue::Fifo {
                jobs: VecDeque::new(),
                max: default_max_queue,
            },
        };
        let instances: Vec<Instance> = executors
            .into_iter()
            .map(|e| {
                let (exec, depth) = match e {
                    InstanceExecutor::Inline(instance) => {
                        (Exec::Inline(RefCell::new(Runner::new(instance, &model))), 1)
                    }
                    InstanceExecutor::Worker(w) => {
                        let depth = w.capacity().max(1);
                        (Exec::Worker(RefCell::new(w)), depth)
                    }
                };
                Instance {
                    exec,
                    in_flight: Cell::new(0),
                    depth,
                    ahead: RefCell::new(VecDeque::new()),
                }
            })
            .collect();
        let reorder = wants_reorder(&model).then(|| Reorder::new(super::host::reply));
        let runs_in_caller = matches!(queue, Queue::Fifo { .. })
            && instances.iter().all(|i| matches!(i.exec, Exec::Inline(_)))
            && limits.is_none()
            && reorder.is_none();
        Rc::new(Self {
            key,
            shard,
            gauges,
            queue: RefCell::new(queue),
            instances,
            done_bell,
            waker: Cell::new(None),
            notified: Cell::new(false),
            stopped: Cell::new(false),
            draining: Cell::new(false),
            timer: shard::PreciseTimer::default(),
            reorder,
            ragged_inputs: ragged::has_ragged_inputs(&model.config),
            runs_in_caller,
            dispatching: Cell::new(false),
            model,
            limits,
        })
    }

    pub fn queue_len(&self) -> usize {
        self.queue.borrow().len()
    }

    fn reject(&self, job: Job, error: InferError) {
        super::host::reply(job.origin, job.reply, Err(error));
    }

    /// Queues `job`, or answers it at once when the queue is full, the
    /// request's parameters are invalid, or the model is being unloaded.
    pub fn enqueue(&self, job: Job) {
        if self.queue_job(job) {
            self.notify();
        }
    }

    /// As `enqueue`, from a task that carries this one request (a
    /// connection's): where the default scheduler feeds inline instances,
    /// the batch runs here (see `dispatch_in_caller`). Not for a task that
    /// enqueues many in one poll (the ring drainer): it would run them all
    /// without letting the shard's other tasks in between.
    pub fn enqueue_and_run(&self, job: Job) {
        if self.queue_job(job) && !self.dispatch_in_caller() {
            self.notify();
        }
    }

    /// `true` when `job` was queued; `false` when it was answered.
    fn queue_job(&self, mut job: Job) -> bool {
        job.request.trace.stamp(crate::trace::Event::QueueStart);
        if self.stopped.get() {
            let e = InferError::unavailable(format!(
                "model '{}' version {} is being unloaded",
                self.model.name, self.model.version
            ));
            self.reject(job, e);
            return false;
        }
        let mut queue = self.queue.borrow_mut();
        let refused = match &mut *queue {
            Queue::Fifo { jobs, max } => {
                if jobs.len() + self.waiting_ahead() >= *max {
                    Some((job, 1))
                } else {
                    match request_timeout(&job) {
                        Ok(deadline) => {
                            let mut job = job;
                            job.deadline = deadline;
                            jobs.push_back(job);
                            None
                        }
                        Err(e) => {
                            drop(queue);
                            self.reject(job, e);
                            return false;
                        }
                    }
                }
            }
            Queue::Sequence { batcher, .. } => {
                let mut job = match request_timeout(&job) {
                    Ok(deadline) => Job { deadline, ..job },
                    Err(e) => {
                        drop(queue);
                        self.reject(job, e);
                        return false;
                    }
                };
                let Some(flags) = job.sequence.take() else {
                    drop(queue);
                    let e = InferError::internal(
                        "a sequence model's request reached its scheduler without sequence flags",
                    );
                    self.reject(job, e);
                    return false;
                };
                let entry = Entry {
                    id: flags.id,
                    start: flags.start,
                    end: flags.end,
                    enqueued: job.received,
                    item: job,
                };
                if let Err(refused) = batcher.enqueue(entry, &self.model.name, Instant::now()) {
                    drop(queue);
                    self.reject(refused.item, refused.error);
                    return false;
                }
                None
            }
            Queue::Batched(q) => {
                let (level, timeout) = match q.policy().classify(&job.request.parameters) {
                    Ok(c) => c,
                    Err(e) => {
                        drop(queue);
                        self.reject(job, e);
                        return false;
                    }
                };
                // The job's own deadline (a decoupled request's server
                // timeout) holds in the batcher's queue too, whatever the
                // level's timeout action.
                let pending = Pending {
                    rows: batch_rows(&job.request),
                    enqueued: job.received,
                    deadline: timeout.map(|t| job.received + t),
                    cutoff: job.deadline,
                    item: job,
                };
                q.push(level, pending).err().map(|full| (full.0, level + 1))
            }
        };
        drop(queue);
        if let Some((job, level)) = refused {
            let e = InferError::unavailable(format!(
                "Exceeds maximum queue size for model '{}' (priority level {level})",
                self.model.name
            ));
            self.reject(job, e);
            return false;
        }
        self.model.stats.shard(self.shard).pending_add(1);
        if let Some(g) = self.gauges.get(self.shard) {
            g.add_queue_depth(1);
        }
        true
    }

    /// The default scheduler over inline instances (`runs_in_caller`): runs
    /// the queue's front batch in the enqueuing connection's task instead
    /// of waking the scheduler task for it. The same `dispatch`
    /// runs, so order, statistics, timeouts and traces are the scheduler
    /// task's; what goes is a task hop each way (the scheduler task woken,
    /// the connection woken by its answer) and the scheduler's yield. `true`
    /// when nothing is left for the scheduler task; else it is notified.
    fn dispatch_in_caller(&self) -> bool {
        let eligible = self.runs_in_caller
            && !self.dispatching.get()
            && !self.stopped.get()
            && !self.draining.get();
        if !eligible {
            return false;
        }
        self.dispatch(Instant::now());
        self.queue_len() == 0
    }

    fn notify(&self) {
        self.notified.set(true);
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    /// Unload: refuse new requests, answer the queued ones, then stop.
    pub fn stop(&self) {
        self.stopped.set(true);
        self.notify();
    }

    /// Shutdown: keep accepting what was already sent our way, and run
    /// everything queued without waiting for batching delays.
    pub fn drain(&self) {
        self.draining.set(true);
        self.notify();
    }

    fn dequeued(&self, n: usize) {
        self.left_queue(n);
        self.model.stats.shard(self.shard).pending_sub(n as u64);
    }

    /// The shard's queue gauge counts what waits in its scheduler queues,
    /// so a batch handed ahead leaves it at the hand-over; Triton's pending
    /// count waits for the execution to start (`dequeued`).
    fn left_queue(&self, n: usize) {
        if let Some(g) = self.gauges.get(self.shard) {
            g.add_queue_depth(-(n as i64));
        }
    }

    /// Requests queued or an instance executing.
    pub fn is_busy(&self) -> bool {
        self.queue_len() > 0 || self.instances.iter().any(|i| i.busy())
    }

    fn busy_count(&self) -> usize {
        self.instances.iter().filter(|i| i.busy()).count()
    }

    /// The scheduler task: runs until the model is unloaded and drained.
    pub async fn run(self: Rc<Self>) {
        let forwarder = self
            .reorder
            .as_ref()
            .and_then(Reorder::forwarder)
            .map(monoio::spawn);
        loop {
            self.notified.set(false);
            self.collect_done();
            let (ran_inline, wait_until) = self.dispatch(Instant::now());
            if ran_inline {
                // An inline execution is synchronous: let the shard's
                // network tasks run before the next one.
                yield_now().await;
                continue;
            }
            if self.stopped.get() && self.queue_len() == 0 && self.busy_count() == 0 {
                break;
            }
            self.wait(wait_until, self.housekeeping_deadline()).await;
        }
        // Unloaded: the held answers are all in (every instance is idle);
        // the forwarder hands them out, then ends.
        if let Some(reorder) = &self.reorder {
            reorder.close();
        }
        if let Some(forwarder) = forwarder {
            forwarder.await;
        }
    }

    /// Frees the instances whose worker finished a batch (the worker
    /// already recorded it).
    fn collect_done(&self) {
        for (index, inst) in self.instances.iter().enumerate() {
            if let Exec::Worker(w) = &inst.exec {
                loop {
                    let Some(answers) = w.borrow_mut().take_done() else {
                        break;
                    };
                    inst.in_flight.set(inst.in_flight.get().saturating_sub(1));
                    // The worker takes its batches in order: the oldest
                    // handed ahead started as this one finished (with a
                    // reply hold, a little before `now`).
                    let next = inst.ahead.borrow_mut().pop_front();
                    if let Some(received) = next {
                        self.began(received.into_iter(), Instant::now());
                    }
                    self.release_resources(index);
                    self.completed(index);
                    for answer in answers {
                        answer.send();
                    }
                }
            }
        }
    }

    /// The rate limiter: takes what instance `index` needs to execute, if
    /// anything is queued for it (else there is nothing to hold it for).
    fn acquire_resources(&self, index: usize) -> bool {
        match &self.limits {
            None => true,
            Some(l) => self.queue_len() > 0 && l.try_acquire(index),
        }
    }

    fn release_resources(&self, index: usize) {
        if let Some(l) = &self.limits {
            l.release(index);
        }
    }

    /// A sequence batcher's slots executing on `instance` take new requests.
    fn completed(&self, instance: usize) {
        if let Queue::Sequence { batcher, .. } = &mut *self.queue.borrow_mut() {
            batcher.completed(instance);
        }
    }

    /// Hands batches to free instances. Returns whether an inline instance
    /// ran (the caller yields), and when to look again if nothing arrives.
    fn dispatch(&self, now: Instant) -> (bool, Option<Instant>) {
        self.dispatching.set(true);
        let out = self.dispatch_once(now);
        self.dispatching.set(false);
        out
    }

    fn dispatch_once(&self, now: Instant) -> (bool, Option<Instant>) {
        self.expire(now);
        let mut wait: Option<Instant> = None;
        let mut earliest = |t: Instant| wait = Some(wait.map_or(t, |w: Instant| w.min(t)));
        // An instance the rate limiter holds back: the others (other
        // resources) may still run, and the queue is not idle.
        let mut held_back = false;
        // First every idle instance gets a batch (Triton's rule: the queue
        // feeds whichever instance is free); then, where allowed, each
        // worker gets up to `depth` so it starts the next batch without
        // waiting for this shard to turn around.
        let deepest = self.instances.iter().map(|i| i.depth).max().unwrap_or(1);
        'passes: for limit in 1..=deepest {
            if limit > 1 && !self.may_queue_behind() {
                break;
            }
            for (index, inst) in self.instances.iter().enumerate() {
                let cap = limit.min(inst.depth);
                // Sequence models batch per instance (their slots); the other
                // queues feed whichever instance is free.
                loop {
                    if inst.in_flight.get() >= cap {
                        break;
                    }
                    if inst.busy() && !self.may_queue_behind() {
                        break;
                    }
                    if !self.acquire_resources(index) {
                        held_back |= self.queue_len() > 0;
                        break;
                    }
                    match self.next_batch(index, now) {
                        Next::Run(mut batch) => {
                            // Behind a busy worker the batch waits in its
                            // ring: it starts when the one before finishes.
                            let behind = matches!(inst.exec, Exec::Worker(_)) && inst.busy();
                            if behind {
                                self.left_queue(batch.jobs.len());
                                inst.ahead
                                    .borrow_mut()
                                    .push_back(batch.jobs.iter().map(|j| j.received).collect());
                            } else {
                                self.started(&batch.jobs, now);
                            }
                            if let Some(reorder) = &self.reorder {
                                for job in &mut batch.jobs {
                                    reorder.hold(
                                        &mut job.reply,
                                        &mut job.origin,
                                        &mut job.responses,
                                        self.shard,
                                    );
                                }
                            }
                            match &inst.exec {
                                Exec::Inline(runner) => {
                                    runner.borrow_mut().run(
                                        &self.model,
                                        self.model.stats.shard(self.shard),
                                        batch,
                                    );
                                    self.release_resources(index);
                                    self.completed(index);
                                    return (true, None);
                                }
                                Exec::Worker(w) => {
                                    inst.in_flight.set(inst.in_flight.get() + 1);
                                    if let Err(batch) = w.borrow_mut().submit(batch) {
                                        // Cannot happen with at most `depth`
                                        // batches in flight; answer rather
                                        // than lose them.
                                        inst.in_flight.set(inst.in_flight.get() - 1);
                                        // Refused like a batch started
                                        // now (it left the queue already).
                                        let ahead = behind
                                            .then(|| inst.ahead.borrow_mut().pop_back())
                                            .flatten();
                                        if let Some(received) = ahead {
                                            self.began(received.into_iter(), Instant::now());
                                        }
                                        self.release_resources(index);
                                        self.completed(index);
                                        for job in batch.jobs {
                                            self.reject(
                                                job,
                                                InferError::internal(format!(
                                                    "model '{}': compute worker refused a batch",
                                                    self.model.name
                                                )),
                                            );
                                        }
                                    }
                                }
                            }
                        }
                        Next::WaitUntil(t) => {
                            self.release_resources(index);
                            earliest(t);
                            break;
                        }
                        Next::Nothing => {
                            self.release_resources(index);
                            break;
                        }
                    }
                }
                if !self.per_instance_queues() && inst.in_flight.get() < cap && !held_back {
                    // A shared queue that gave this instance nothing has
                    // nothing for the others either.
                    break 'passes;
                }
            }
        }
        if let Some(d) = self.next_deadline() {
            earliest(d);
        }
        self.reject_stranded(wait.is_none() && !held_back);
        (false, wait)
    }

    /// Unloading or shutting down, a sequence waiting in the backlog for
    /// a slot that no END will free would hold the drain forever: once
    /// nothing runs or waits, what is left is answered.
    fn reject_stranded(&self, nothing_pending: bool) {
        let flush = self.stopped.get() || self.draining.get();
        if !flush || !nothing_pending || self.busy_count() > 0 {
            return;
        }
        let stranded = match &mut *self.queue.borrow_mut() {
            Queue::Sequence { batcher, .. } if !batcher.is_empty() => {
                batcher.remove_where(|_| true)
            }
            _ => return,
        };
        self.dequeued(stranded.len());
        for job in stranded {
            let e = InferError::unavailable(format!(
                "model '{}' is unloading or the server is shutting down: the sequence never got a batch slot",
                self.model.name
            ));
            self.reject(job, e);
        }
    }

    /// Whether a busy worker may be handed another batch now, to start as
    /// soon as its current one ends (no wait for this shard to notice the
    /// end and turn around). Only where a client cannot tell it from
    /// Triton's queue but by timing: the default scheduler (FIFO, one
    /// request per batch, no priorities), for a front request without a
    /// queue timeout (one with a deadline waits in the queue, where it can
    /// expire), and with the handed-ahead requests still counted against
    /// the queue bound (`waiting_ahead`). Not for the dynamic batcher (a
    /// batch formed early is a smaller batch, and priorities and queue
    /// policies decide late), the rate limiter (resources are held per
    /// execution) or sequence slots.
    fn may_queue_behind(&self) -> bool {
        if self.limits.is_some() {
            return false;
        }
        match &*self.queue.borrow() {
            Queue::Fifo { jobs, .. } => jobs
                .front()
                .is_some_and(|j| j.deadline.is_none() && !j.is_cancelled()),
            Queue::Batched(_) | Queue::Sequence { .. } => false,
        }
    }

    /// Requests handed to a worker behind the batch it runs: still queued
    /// as far as the queue bound is concerned.
    fn waiting_ahead(&self) -> usize {
        self.instances
            .iter()
            .map(|i| i.in_flight.get().saturating_sub(1))
            .sum()
    }

    fn per_instance_queues(&self) -> bool {
        matches!(&*self.queue.borrow(), Queue::Sequence { .. })
    }

    fn started(&self, jobs: &[Job], now: Instant) {
        self.left_queue(jobs.len());
        self.began(jobs.iter().map(|j| j.received), now);
    }

    /// A batch's execution began at `now`: its requests, by arrival time,
    /// stop being pending and record their queue time.
    fn began(&self, received: impl ExactSizeIterator<Item = Instant>, now: Instant) {
        let stats = self.model.stats.shard(self.shard);
        stats.pending_sub(received.len() as u64);
        for r in received {
            stats.queue.record(now.saturating_duration_since(r));
        }
    }

    /// Answers queued requests whose timeout passed, and drops those whose
    /// client went away (their origin already counted them as cancelled).
    fn expire(&self, now: Instant) {
        let mut queue = self.queue.borrow_mut();
        let (expired, cancelled) = match &mut *queue {
            Queue::Fifo { jobs, .. }
                if !jobs
                    .iter()
                    .any(|j| j.is_cancelled() || j.deadline.is_some_and(|d| d <= now)) =>
            {
                (Vec::new(), 0)
            }
            Queue::Fifo { jobs, .. } => {
                let before = jobs.len();
                let mut expired = Vec::new();
                let mut kept = VecDeque::with_capacity(jobs.len());
                for job in jobs.drain(..) {
                    if job.is_cancelled() {
                        continue;
                    }
                    if job.deadline.is_some_and(|d| d <= now) {
                        expired.push(job);
                    } else {
                        kept.push_back(job);
                    }
                }
                *jobs = kept;
                let cancelled = before - jobs.len() - expired.len();
                (expired, cancelled)
            }
            Queue::Batched(q) => {
                let cancelled = q.remove_where(Job::is_cancelled).len();
                (q.expire(now), cancelled)
            }
            Queue::Sequence {
                batcher,
                idle_check,
            } => {
                if idle_check.is_none_or(|t| t <= now) {
                    *idle_check = batcher.reap_idle(now);
                }
                let gone = batcher
                    .remove_where(|j| j.is_cancelled() || j.deadline.is_some_and(|d| d <= now));
                let (cancelled, expired): (Vec<Job>, Vec<Job>) =
                    gone.into_iter().partition(Job::is_cancelled);
                (expired, cancelled.len())
            }
        };
        drop(queue);
        if cancelled > 0 {
            self.dequeued(cancelled);
        }
        for job in expired {
            self.dequeued(1);
            let e = InferError::unavailable(format!(
                "Request timeout expired for model '{}'",
                self.model.name
            ));
            self.reject(job, e);
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        match &*self.queue.borrow() {
            Queue::Fifo { jobs, .. } => jobs.iter().filter_map(|j| j.deadline).min(),
            Queue::Batched(q) => q.next_deadline(),
            // Idle release waits on the coarse timer (see
            // `housekeeping_deadline`); only request timeouts here.
            Queue::Sequence { batcher, .. } => batcher.items().filter_map(|j| j.deadline).min(),
        }
    }

    fn next_batch(&self, instance: usize, now: Instant) -> Next {
        let mut queue = self.queue.borrow_mut();
        match &mut *queue {
            Queue::Fifo { jobs, .. } => jobs
                .pop_front()
                .map_or(Next::Nothing, |j| Next::Run(vec![j].into())),
            Queue::Sequence { batcher, .. } => {
                let flush = self.stopped.get() || self.draining.get();
                match batcher.next_batch(instance, now, flush, |a, b| {
                    compatible(&a.request, &b.request)
                }) {
                    SeqDecision::Execute(rows) => Next::Run(sequence_batch(rows)),
                    SeqDecision::WaitUntil(t) => Next::WaitUntil(t),
                    SeqDecision::Idle => Next::Nothing,
                }
            }
            Queue::Batched(q) => {
                let flush = self.stopped.get() || self.draining.get();
                // Unloading or shutting down: run what is left at once.
                let at = if flush {
                    q.release_hold();
                    now + Duration::from_secs(3600)
                } else {
                    now
                };
                // Ragged inputs need no equal shapes (`ragged::compatible`).
                let config = &self.model.config;
                match q.decide(at, |a, b| {
                    if self.ragged_inputs {
                        ragged::compatible(config, &a.request, &b.request)
                    } else {
                        compatible(&a.request, &b.request)
                    }
                }) {
                    Decision::Execute(batch) => {
                        Next::Run(batch.into_iter().map(|p| p.item).collect::<Vec<_>>().into())
                    }
                    Decision::WaitUntil(_) if flush => Next::Nothing,
                    Decision::WaitUntil(t) => Next::WaitUntil(t),
                    Decision::Idle => Next::Nothing,
                }
            }
        }
    }

    fn done_pending(&self) -> bool {
        self.instances.iter().any(|i| match &i.exec {
            Exec::Worker(w) => w.borrow().has_done(),
            Exec::Inline(_) => false,
        })
    }

    /// When idle sequences are next due for release: waited on the coarse
    /// timer. Putting it among the precise deadlines would keep the shard
    /// yielding through the last millisecond before each of them — with a
    /// new idle deadline per request, nearly all the time.
    fn housekeeping_deadline(&self) -> Option<Instant> {
        match &*self.queue.borrow() {
            Queue::Sequence { idle_check, .. } => *idle_check,
            _ => None,
        }
    }

    /// Sleeps until a request is queued, a worker finishes, the scheduler
    /// is stopped, or `until`.
    async fn wait(&self, until: Option<Instant>, coarse: Option<Instant>) {
        let woken = poll_fn(|cx| {
            // `stop` notifies; a stopped scheduler whose instances are still
            // busy waits for them here like any other (returning at once
            // on `stopped` spun the shard until the execution ended).
            if self.notified.get() {
                return Poll::Ready(());
            }
            self.waker.set(Some(cx.waker().clone()));
            self.done_bell.register(cx.waker());
            // A worker may have finished between the last look and the
            // registration.
            if self.done_pending() {
                return Poll::Ready(());
            }
            // Resources this scheduler waited for came back (the limiter
            // rang `done_bell` after setting this).
            if self.limits.as_ref().is_some_and(ModelLimits::woken) {
                return Poll::Ready(());
            }
            Poll::Pending
        });
        if until.is_none() {
            self.timer.disarm();
        }
        let precise = async {
            match until {
                Some(t) => self.timer.sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        let coarse = async {
            match coarse {
                Some(t) => shard::sleep_until_coarse(t).await,
                None => std::future::pending().await,
            }
        };
        monoio::select! {
            _ = woken => {}
            _ = precise => {}
            _ = coarse => {}
        }
    }
}

/// Turns a sequence batcher's rows into the executor's batch: the jobs in
/// row order, and each row's slot and controls.
fn sequence_batch(rows: Vec<crate::scheduler::sequence::Row<Job>>) -> Batch {
    let mut jobs = Vec::with_capacity(rows.len());
    let controls = rows
        .into_iter()
        .map(|row| match row.entry {
            Some(e) => {
                jobs.push(e.item);
                RowControl {
                    job: Some(jobs.len() - 1),
                    slot: row.slot,
                    start: e.start,
                    end: e.end,
                    id: Some(e.id),
                }
            }
            None => RowControl {
                job: None,
                slot: row.slot,
                start: false,
                end: false,
                id: None,
            },
        })
        .collect();
    Batch {
        jobs,
        rows: Some(controls),
    }
}

/// The queue deadline of `job`: the earlier of the one it came with (the
/// server's request timeout, for a decoupled request) and the one its
/// `timeout` parameter asks for.
fn request_timeout(job: &Job) -> Result<Option<Instant>, InferError> {
    let own = requested_timeout(&job.request.parameters)?.map(|t| job.received + t);
    Ok(earliest(job.deadline, own))
}

/// The earlier of two optional deadlines.
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Triton's test hook `TRITONSERVER_DELAY_SCHEDULER=N`: a dynamic batcher
/// forms no batch until N requests are queued (its QA tests line requests
/// up this way). Read once per model load; unset, empty or 0 means off.
fn delay_scheduler_count() -> Option<usize> {
    std::env::var("TRITONSERVER_DELAY_SCHEDULER")
        .ok()?
        .trim()
        .parse::<usize>()
        .ok()
        .filter(|&n| n > 0)
}
