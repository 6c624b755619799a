//! The state a shard owns, reachable from any task on its thread through a
//! thread-local. Nothing in here is shared with other threads.

use std::{
    cell::{Cell, RefCell},
    collections::HashMap,
    future::poll_fn,
    rc::Rc,
    sync::{atomic::Ordering, Arc},
};

use futures::{channel::oneshot, StreamExt};

use super::{
    ring::{Inbox, Outbox},
    Latch, ShardId, ShardMsg,
};
use crate::{
    backend::ModelInstance,
    metrics::ShardGauges,
    model::{ModelTable, ModelVersion},
    scheduler::{InstanceSlot, Job, Responder},
    types::{InferError, InferResponse, InferResult},
};

/// Messages from the control plane (model loads, table updates). Not on
/// the request path, so an unbounded MPSC channel is fine here.
pub enum ShardControl {
    Install {
        key: u64,
        model: Arc<ModelVersion>,
        instance: Box<dyn ModelInstance>,
        installed: oneshot::Sender<()>,
    },
    Remove {
        key: u64,
    },
    Table(Arc<ModelTable>),
    Shutdown,
}

/// An instance chosen for a request.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    pub shard: ShardId,
    pub key: u64,
}

/// Outcome of handing a job towards its instance.
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
    instances: RefCell<HashMap<u64, Rc<InstanceSlot>>>,
    round_robin: Cell<usize>,
    pub shutdown: Latch,
    in_flight: Cell<usize>,
    /// Every shard's gauges (this shard writes only its own).
    pub gauges: Arc<[ShardGauges]>,
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
    ) -> Rc<Self> {
        Rc::new(Self {
            id,
            count,
            outbox: RefCell::new(outbox),
            table: RefCell::new(Arc::new(ModelTable::default())),
            instances: RefCell::new(HashMap::new()),
            round_robin: Cell::new(0),
            shutdown: Latch::default(),
            in_flight: Cell::new(0),
            gauges,
        })
    }

    /// Makes `shard` this thread's current shard.
    pub fn install_current(shard: Rc<Shard>) {
        CURRENT.with(|c| *c.borrow_mut() = Some(shard));
    }

    pub fn clear_current() {
        CURRENT.with(|c| c.borrow_mut().take());
    }

    /// The model table snapshot this shard currently serves from.
    pub fn table(&self) -> Arc<ModelTable> {
        self.table.borrow().clone()
    }

    /// Picks an instance for `model`: the least-queued one on this shard if
    /// it hosts any, else the next remote one in round-robin order.
    pub fn pick_instance(&self, model: &ModelVersion) -> InferResult<Target> {
        let instances = self.instances.borrow();
        let local = model
            .instances
            .iter()
            .filter(|r| r.shard == self.id)
            .filter_map(|r| instances.get(&r.key))
            .min_by_key(|slot| slot.queue_len());
        if let Some(slot) = local {
            return Ok(Target {
                shard: self.id,
                key: slot.key,
            });
        }
        if model.instances.is_empty() {
            return Err(InferError::unavailable(format!(
                "model '{}' version {} has no instances",
                model.name, model.version
            )));
        }
        // Least-loaded remote instance; the rotating start breaks ties so
        // equally idle instances share the work.
        let n = self.round_robin.get();
        self.round_robin.set(n.wrapping_add(1));
        let count = model.instances.len();
        let r = (0..count)
            .map(|i| &model.instances[(n + i) % count])
            .min_by_key(|r| r.load.load(Ordering::Relaxed))
            .unwrap_or(&model.instances[n % count]);
        Ok(Target {
            shard: r.shard,
            key: r.key,
        })
    }

    /// Queues `job` on the target instance, locally or across the ring.
    pub fn dispatch(&self, target: Target, job: Job) -> Dispatch {
        if target.shard == self.id {
            self.enqueue_local(target.key, job);
            return Dispatch::Queued;
        }
        let msg = ShardMsg::Infer {
            instance: target.key,
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
        let slot = self.instances.borrow().get(&key).cloned();
        match slot {
            Some(slot) => slot.enqueue(job),
            None => {
                let _ = job.reply.send(Err(InferError::unavailable(format!(
                    "model '{}' version {} is no longer loaded",
                    job.model.name, job.model.version
                ))));
            }
        }
    }

    fn handle(&self, msg: ShardMsg) {
        match msg {
            ShardMsg::Infer { instance, job } => self.enqueue_local(instance, job),
            ShardMsg::Reply { reply, result } => {
                let _ = reply.send(result);
            }
        }
    }

    /// The drainer task: takes messages from every incoming ring as they
    /// arrive, sleeping on the doorbell when all are empty.
    pub async fn drain_rings(self: Rc<Self>, mut inbox: Inbox<ShardMsg>) {
        loop {
            let drained = poll_fn(|cx| inbox.poll_drain(cx, |m| self.handle(m)));
            monoio::select! {
                _ = drained => {}
                _ = self.shutdown.wait() => {
                    // Answer whatever is still in flight towards us.
                    inbox.drain(|m| self.handle(m));
                    return;
                }
            }
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
                    instance,
                    installed,
                } => {
                    let slot =
                        InstanceSlot::new(key, model, instance, self.id, self.gauges.clone());
                    monoio::spawn(slot.clone().run());
                    self.instances.borrow_mut().insert(key, slot);
                    let _ = installed.send(());
                }
                ShardControl::Remove { key } => {
                    if let Some(slot) = self.instances.borrow_mut().remove(&key) {
                        slot.stop();
                    }
                }
                ShardControl::Table(table) => *self.table.borrow_mut() = table,
                ShardControl::Shutdown => {
                    self.shutdown.set();
                    for slot in self.instances.borrow().values() {
                        slot.stop();
                    }
                    return;
                }
            }
        }
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.get()
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

/// Counts an open connection in its shard's gauges while it lives.
pub struct ConnectionGauge {
    gauges: Arc<[ShardGauges]>,
    shard: ShardId,
}

impl ConnectionGauge {
    pub fn open(shard: &Shard) -> Self {
        if let Some(g) = shard.gauges.get(shard.id) {
            g.add_connection(1);
        }
        Self {
            gauges: shard.gauges.clone(),
            shard: shard.id,
        }
    }
}

impl Drop for ConnectionGauge {
    fn drop(&mut self) {
        if let Some(g) = self.gauges.get(self.shard) {
            g.add_connection(-1);
        }
    }
}
