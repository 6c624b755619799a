//! Instance executors. Each instance hosted by a shard has a queue and an
//! executor task there. Without `dynamic_batching` the queue is FIFO and
//! every execution runs one request (Triton's default scheduler); with it,
//! the dynamic batcher picks batches that run as one backend call.

use std::{
    cell::{Cell, RefCell},
    collections::VecDeque,
    future::poll_fn,
    rc::Rc,
    sync::atomic::Ordering::Relaxed,
    sync::Arc,
    task::{Poll, Waker},
    time::{Duration, Instant},
};

use super::{
    batch::{batch_rows, compatible, merge_inputs, split_outputs},
    dynamic_batcher::{BatchQueue, BatcherPolicy, Decision, Pending},
    output::build_response,
    Job,
};
use crate::{
    backend::ModelInstance,
    metrics::ShardGauges,
    model::ModelVersion,
    proto::inference::model_config::SchedulingChoice,
    shard::{self, yield_now},
    types::{InferError, InferResult, Tensor},
};

enum Queue {
    Fifo(VecDeque<Job>),
    Batched(BatchQueue<Job>),
}

impl Queue {
    fn len(&self) -> usize {
        match self {
            Queue::Fifo(q) => q.len(),
            Queue::Batched(q) => q.len(),
        }
    }
}

/// An instance hosted by this shard, with its queue. Shard-local: only
/// the owning shard's tasks touch it, so plain `RefCell`s suffice.
pub struct InstanceSlot {
    pub key: u64,
    pub model: Arc<ModelVersion>,
    shard: usize,
    gauges: Arc<[ShardGauges]>,
    instance: RefCell<Box<dyn ModelInstance>>,
    queue: RefCell<Queue>,
    waker: Cell<Option<Waker>>,
    /// Set by `enqueue`/`stop`, cleared when the executor looks at the queue.
    notified: Cell<bool>,
    stopped: Cell<bool>,
}

impl InstanceSlot {
    pub fn new(
        key: u64,
        model: Arc<ModelVersion>,
        instance: Box<dyn ModelInstance>,
        shard: usize,
        gauges: Arc<[ShardGauges]>,
    ) -> Rc<Self> {
        let queue = match &model.config.scheduling_choice {
            Some(SchedulingChoice::DynamicBatching(db)) if model.config.max_batch_size > 0 => {
                Queue::Batched(BatchQueue::new(BatcherPolicy::from_config(
                    model.config.max_batch_size,
                    db,
                )))
            }
            _ => Queue::Fifo(VecDeque::new()),
        };
        Rc::new(Self {
            key,
            model,
            shard,
            gauges,
            instance: RefCell::new(instance),
            queue: RefCell::new(queue),
            waker: Cell::new(None),
            notified: Cell::new(false),
            stopped: Cell::new(false),
        })
    }

    pub fn queue_len(&self) -> usize {
        self.queue.borrow().len()
    }

    /// Answers `job` with `error`. The origin shard records the failure
    /// (with `FailureReason::for_error`), so nothing is counted twice.
    fn reject(&self, job: Job, error: InferError) {
        shard::reply(job.origin, job.reply, Err(error));
    }

    fn gauge(&self) -> Option<&ShardGauges> {
        self.gauges.get(self.shard)
    }

    pub fn enqueue(&self, job: Job) {
        if self.stopped.get() {
            let e = InferError::unavailable(format!(
                "model '{}' version {} is being unloaded",
                self.model.name, self.model.version
            ));
            return self.reject(job, e);
        }
        let mut queue = self.queue.borrow_mut();
        match &mut *queue {
            Queue::Fifo(q) => q.push_back(job),
            Queue::Batched(q) => {
                let (level, timeout) = match q.policy().classify(&job.request.parameters) {
                    Ok(c) => c,
                    Err(e) => {
                        drop(queue);
                        return self.reject(job, e);
                    }
                };
                let pending = Pending {
                    rows: batch_rows(&job.request),
                    enqueued: job.received,
                    deadline: timeout.map(|t| job.received + t),
                    item: job,
                };
                if let Err(full) = q.push(level, pending) {
                    drop(queue);
                    let e = InferError::unavailable(format!(
                        "Exceeds maximum queue size for model '{}' (priority level {})",
                        self.model.name,
                        level + 1
                    ));
                    return self.reject(full.0, e);
                }
            }
        }
        drop(queue);
        self.model.stats.shard(self.shard).pending_add(1);
        if let Some(load) = self.load_gauge() {
            load.fetch_add(1, Relaxed);
        }
        if let Some(g) = self.gauge() {
            g.add_queue_depth(1);
        }
        self.notify();
    }

    fn notify(&self) {
        self.notified.set(true);
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    /// Stops the executor after the queued requests are answered.
    pub fn stop(&self) {
        self.stopped.set(true);
        self.notify();
    }

    /// Waits until there is something to run; `None` once stopped and drained.
    async fn next_batch(&self) -> Option<Vec<Job>> {
        loop {
            self.notified.set(false);
            let now = Instant::now();
            let wait_until = {
                let mut queue = self.queue.borrow_mut();
                match &mut *queue {
                    Queue::Fifo(q) => match q.pop_front() {
                        Some(job) => return Some(vec![job]),
                        None => None,
                    },
                    Queue::Batched(q) => {
                        let expired = q.expire(now);
                        let decision = if self.stopped.get() {
                            // Unloading: run what is left without waiting.
                            match q.decide(now + Duration::from_secs(3600), |a, b| {
                                compatible(&a.request, &b.request)
                            }) {
                                Decision::WaitUntil(_) => Decision::Idle,
                                d => d,
                            }
                        } else {
                            q.decide(now, |a, b| compatible(&a.request, &b.request))
                        };
                        let next_deadline = q.next_deadline();
                        drop(queue);
                        for job in expired {
                            self.dequeued(1);
                            let e = InferError::unavailable(format!(
                                "Request timeout expired for model '{}'",
                                self.model.name
                            ));
                            self.reject(job, e);
                        }
                        match decision {
                            Decision::Execute(batch) => {
                                return Some(batch.into_iter().map(|p| p.item).collect())
                            }
                            Decision::WaitUntil(t) => Some(next_deadline.map_or(t, |d| d.min(t))),
                            Decision::Idle => next_deadline,
                        }
                    }
                }
            };
            if self.stopped.get() && self.queue_len() == 0 {
                return None;
            }
            self.wait_for_arrival(wait_until).await;
        }
    }

    /// Sleeps until a new request is queued, the slot is stopped, or `until`.
    async fn wait_for_arrival(&self, until: Option<Instant>) {
        let arrival = poll_fn(|cx| {
            if self.stopped.get() || self.notified.get() {
                return Poll::Ready(());
            }
            self.waker.set(Some(cx.waker().clone()));
            Poll::Pending
        });
        match until {
            Some(t) => {
                let sleep = shard::sleep_until(t);
                monoio::select! {
                    _ = arrival => {}
                    _ = sleep => {}
                }
            }
            None => arrival.await,
        }
    }

    fn load_gauge(&self) -> Option<&std::sync::atomic::AtomicUsize> {
        self.model
            .instances
            .iter()
            .find(|r| r.key == self.key)
            .map(|r| &*r.load)
    }

    fn dequeued(&self, n: usize) {
        if let Some(load) = self.load_gauge() {
            let _ = load.fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(n)));
        }
        self.model.stats.shard(self.shard).pending_sub(n as u64);
        if let Some(g) = self.gauge() {
            g.add_queue_depth(-(n as i64));
        }
    }

    /// The executor task: runs until the slot is stopped and drained.
    pub async fn run(self: Rc<Self>) {
        while let Some(batch) = self.next_batch().await {
            self.execute(batch);
            // Executions are synchronous: give the shard's network tasks a
            // turn between them so one busy model cannot starve its I/O.
            yield_now().await;
        }
    }

    fn execute(&self, jobs: Vec<Job>) {
        let stats = self.model.stats.shard(self.shard);
        let start = Instant::now();
        self.dequeued(jobs.len());
        for job in &jobs {
            stats
                .queue
                .record(start.saturating_duration_since(job.received));
        }
        let rows: Vec<i64> = jobs.iter().map(|j| batch_rows(&j.request)).collect();
        let requested = requested_outputs(&jobs);
        let merged;
        let inputs: &[Tensor] = if jobs.len() == 1 {
            &jobs[0].request.inputs
        } else {
            let refs: Vec<_> = jobs.iter().map(|j| &j.request).collect();
            merged = merge_inputs(&refs);
            &merged
        };
        let input_done = Instant::now();
        let produced = self.instance.borrow_mut().execute(inputs, &requested);
        let infer_done = Instant::now();
        let per_job: InferResult<Vec<Vec<Tensor>>> = produced.and_then(|outputs| {
            if jobs.len() == 1 {
                Ok(vec![outputs])
            } else {
                split_outputs(outputs, &rows)
            }
        });
        let results: Vec<InferResult<_>> = match per_job {
            Ok(outs) => jobs
                .iter()
                .zip(outs)
                .map(|(j, o)| build_response(&j.model, &j.request, o))
                .collect(),
            Err(e) => jobs.iter().map(|_| Err(e.clone())).collect(),
        };
        let output_done = Instant::now();
        let total_rows: i64 = rows.iter().sum();
        stats.record_execution(
            total_rows.max(0) as usize,
            input_done - start,
            infer_done - input_done,
            output_done - infer_done,
        );
        for (job, result) in jobs.into_iter().zip(results) {
            stats.compute_input.record(input_done - start);
            stats.compute_infer.record(infer_done - input_done);
            stats.compute_output.record(output_done - infer_done);
            shard::reply(job.origin, job.reply, result);
        }
    }
}

/// Outputs to produce for a batch: the union of what its requests asked
/// for, or all (empty) if any request wants all.
fn requested_outputs(jobs: &[Job]) -> Vec<&str> {
    if jobs.iter().any(|j| j.request.outputs.is_empty()) {
        return Vec::new();
    }
    let mut names: Vec<&str> = Vec::new();
    for j in jobs {
        for o in &j.request.outputs {
            if !names.contains(&o.name.as_str()) {
                names.push(&o.name);
            }
        }
    }
    names
}
