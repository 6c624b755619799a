//! The state a shard owns, reachable from any task on its thread through a
//! thread-local. Nothing in here is shared with other threads.

use std::{
    cell::{Cell, RefCell},
    rc::Rc,
    sync::Arc,
};

use futures::StreamExt;

use super::{KeyMap, Latch, ShardId};
use crate::{
    metrics::ShardGauges,
    model::{ModelTable, ModelVersion},
};

/// Messages from the control plane (model loads, table updates). Not on
/// the request path, so an unbounded MPSC channel is fine here.
pub enum ShardControl {
    Table(Arc<ModelTable>),
    /// Work from another thread, run on this shard's thread where it may
    /// spawn tasks: installing or removing a model's scheduler (built by
    /// `scheduler::host`), the C API's in-process inference.
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

pub struct Shard {
    pub id: ShardId,
    pub count: usize,
    table: RefCell<Arc<ModelTable>>,
    /// Every loaded model version by scheduler key, refreshed with the
    /// table, so a request can find its model again after an await without
    /// holding (and reference-counting) a shared handle.
    by_key: RefCell<KeyMap<Arc<ModelVersion>>>,
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

impl Shard {
    pub fn new(
        id: ShardId,
        count: usize,
        gauges: Arc<[ShardGauges]>,
        request_timeout: Option<std::time::Duration>,
        max_queue_size: usize,
    ) -> Rc<Self> {
        Rc::new(Self {
            id,
            count,
            table: RefCell::new(Arc::new(ModelTable::default())),
            by_key: RefCell::new(KeyMap::default()),
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
        let mut by_key = KeyMap::default();
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

    /// The control task: applies table updates and runs the tasks sent to
    /// this shard (scheduler installs and removals among them). On
    /// shutdown it sets the latch, then calls `on_shutdown` (the schedulers
    /// start draining their queues).
    pub async fn run_control(
        self: Rc<Self>,
        mut control: futures::channel::mpsc::UnboundedReceiver<ShardControl>,
        on_shutdown: impl FnOnce(),
    ) {
        while let Some(msg) = control.next().await {
            match msg {
                ShardControl::Table(table) => self.set_table(table),
                ShardControl::Run(task) => task(),
                ShardControl::Shutdown => {
                    self.shutdown.set();
                    on_shutdown();
                    return;
                }
            }
        }
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.get()
    }
}

/// Counts a request in flight on the current shard for as long as it
/// lives; graceful shutdown waits for the count to reach zero. Holds no
/// shard reference, so futures holding it stay `Send`.
#[derive(Debug)]
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
        // A request finished: the next one of a client at concurrency 1
        // is about a round trip away, so keep the shard from parking.
        super::spin::note_work();
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
