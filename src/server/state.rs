use std::{
    cell::RefCell,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    time::Instant,
};

use super::ServerOptions;
use crate::metrics::ShardGauges;

/// Server-wide facts every shard reads: set rarely by the control plane,
/// read with plain atomic loads on the request path.
#[derive(Debug)]
pub struct ServerState {
    pub options: ServerOptions,
    /// Per-shard gauges, indexed by shard id.
    pub gauges: Arc<[ShardGauges]>,
    ready: AtomicBool,
    shutting_down: AtomicBool,
    shards: usize,
    /// Shards whose own requests are all answered (shutdown only).
    drained_shards: AtomicUsize,
    /// Set by `begin_shutdown`.
    shutdown_deadline: std::sync::OnceLock<Instant>,
    /// The repository thread (load, unload, index), once started.
    pub repository: std::sync::OnceLock<crate::repository::manager::RepositoryClient>,
    /// The trace extension's settings, sampling and writer thread.
    pub trace: crate::trace::Tracer,
    /// The listeners' TLS, loaded at start before any shard accepts.
    pub tls: std::sync::OnceLock<crate::frontend::transport::ServerTls>,
}

/// Extensions advertised by `GET /v2` and ServerMetadata: only those that work.
pub const EXTENSIONS: &[&str] = &[
    "classification",
    "model_configuration",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "system_shared_memory",
    "model_repository",
    "model_repository(unload_dependents)",
    "logging",
    "trace",
];

impl ServerState {
    pub fn new(options: ServerOptions, shards: usize) -> Arc<Self> {
        let trace = crate::trace::Tracer::new(&options.trace);
        Arc::new(Self {
            trace,
            options,
            gauges: (0..shards).map(|_| ShardGauges::new(shards)).collect(),
            ready: AtomicBool::new(false),
            shutting_down: AtomicBool::new(false),
            shards,
            drained_shards: AtomicUsize::new(0),
            shutdown_deadline: std::sync::OnceLock::new(),
            repository: std::sync::OnceLock::new(),
            tls: std::sync::OnceLock::new(),
        })
    }

    pub fn live(&self) -> bool {
        true
    }

    /// Ready: initial load finished and not shutting down.
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::Acquire) && !self.shutting_down.load(Ordering::Acquire)
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    /// Starts shutdown; the exit timeout runs from here (the signal).
    pub fn begin_shutdown(&self) {
        let _ = self
            .shutdown_deadline
            .set(Instant::now() + self.options.exit_timeout);
        self.shutting_down.store(true, Ordering::Release);
    }

    /// When drain and teardown must be over: the exit timeout after
    /// `begin_shutdown` (from now if it was not called).
    pub fn shutdown_deadline(&self) -> Instant {
        *self
            .shutdown_deadline
            .get_or_init(|| Instant::now() + self.options.exit_timeout)
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }

    /// Called once by each shard when its own requests are answered.
    pub fn shard_drained(&self) {
        self.drained_shards.fetch_add(1, Ordering::AcqRel);
    }

    pub fn all_shards_drained(&self) -> bool {
        self.drained_shards.load(Ordering::Acquire) >= self.shards
    }
}

thread_local! {
    static STATE: RefCell<Option<Arc<ServerState>>> = const { RefCell::new(None) };
}

/// The server this shard thread belongs to.
pub fn current() -> Option<Arc<ServerState>> {
    STATE.with(|s| s.borrow().clone())
}

/// Runs `f` on the server this shard thread belongs to without touching
/// the `Arc`'s count, which every shard shares (the request path).
pub fn with_current<R>(f: impl FnOnce(&ServerState) -> R) -> Option<R> {
    STATE.with(|s| s.borrow().as_deref().map(f))
}

/// Samples a request to `model` for tracing (an empty slot off a shard
/// or when tracing is off).
#[inline]
pub fn sample_trace(model: &str) -> crate::trace::TraceSlot {
    with_current(|s| s.trace.sample(model)).unwrap_or_default()
}

pub(super) fn install(state: Arc<ServerState>) {
    STATE.with(|s| *s.borrow_mut() = Some(state));
}
