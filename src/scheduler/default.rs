//! The default scheduler: each instance runs its queued requests one at a
//! time, in arrival order, on the shard that owns it.

use std::{
    cell::{Cell, RefCell},
    collections::VecDeque,
    future::poll_fn,
    rc::Rc,
    sync::Arc,
    task::{Poll, Waker},
};

use super::{output::build_response, Job};
use crate::{
    backend::ModelInstance,
    model::ModelVersion,
    shard::{self, yield_now},
    types::InferError,
};

/// An instance hosted by this shard, with its queue. Shard-local: only
/// the owning shard's tasks touch it, so plain `RefCell`s suffice.
pub struct InstanceSlot {
    pub key: u64,
    pub model: Arc<ModelVersion>,
    instance: RefCell<Box<dyn ModelInstance>>,
    queue: RefCell<VecDeque<Job>>,
    waker: Cell<Option<Waker>>,
    stopped: Cell<bool>,
}

impl InstanceSlot {
    pub fn new(key: u64, model: Arc<ModelVersion>, instance: Box<dyn ModelInstance>) -> Rc<Self> {
        Rc::new(Self {
            key,
            model,
            instance: RefCell::new(instance),
            queue: RefCell::new(VecDeque::new()),
            waker: Cell::new(None),
            stopped: Cell::new(false),
        })
    }

    pub fn queue_len(&self) -> usize {
        self.queue.borrow().len()
    }

    pub fn enqueue(&self, job: Job) {
        if self.stopped.get() {
            let _ = job.reply.send(Err(InferError::unavailable(format!(
                "model '{}' version {} is being unloaded",
                self.model.name, self.model.version
            ))));
            return;
        }
        self.queue.borrow_mut().push_back(job);
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    /// Stops the executor after the queued requests are answered.
    pub fn stop(&self) {
        self.stopped.set(true);
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    async fn next_job(&self) -> Option<Job> {
        poll_fn(|cx| {
            if let Some(job) = self.queue.borrow_mut().pop_front() {
                return Poll::Ready(Some(job));
            }
            if self.stopped.get() {
                return Poll::Ready(None);
            }
            self.waker.set(Some(cx.waker().clone()));
            Poll::Pending
        })
        .await
    }

    /// The executor task: runs until the slot is stopped and drained.
    pub async fn run(self: Rc<Self>) {
        while let Some(job) = self.next_job().await {
            let Job {
                model,
                request,
                reply,
                origin,
                ..
            } = job;
            let requested: Vec<&str> = request.outputs.iter().map(|o| o.name.as_str()).collect();
            let result = self
                .instance
                .borrow_mut()
                .execute(&request.inputs, &requested)
                .and_then(|produced| build_response(&model, &request, produced));
            shard::reply(origin, reply, result);
            // Executions are synchronous: give the shard's network tasks a
            // turn between them so one busy model cannot starve its I/O.
            yield_now().await;
        }
    }
}
