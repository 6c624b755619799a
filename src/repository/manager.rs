//! The model repository extension at run time: one `repository` thread
//! owns the model table and answers the repository API, and each load
//! runs on a thread of its own, so a load that hangs (a backend that never
//! returns from its initialization) blocks neither the index, nor
//! unloads, nor other loads: it shows as LOADING until it ends. Shards
//! ask through [`RepositoryClient`] and await the answer on a oneshot.
//!
//! A (re)load builds the new versions with their own schedulers, publishes
//! a table naming them, and only then stops the old versions' schedulers:
//! requests already queued finish on the old version, new ones go to the
//! new. A failed load leaves whatever was serving in place.
//!
//! While loads run, the repository thread also watches the processes each
//! load's thread forked (`children`): a child that has exited while its
//! load still waits (Triton's Python backend waits forever for a stub that
//! died before its first message) fails the load after
//! [`CHILD_EXIT_GRACE`], and the child is reaped.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    panic::AssertUnwindSafe,
    path::{Component, Path, PathBuf},
    sync::{
        atomic::{AtomicI32, AtomicU64, Ordering},
        mpsc, Arc, Mutex,
    },
    time::{Duration, Instant, SystemTime},
};

use anyhow::{bail, Context};
use bytes::Bytes;
use futures::channel::{mpsc::UnboundedSender, oneshot};

use super::{
    children,
    load::{load_model_with, send_control, LoadOptions, Placement},
    scan::{is_namespaced_key, key_name, namespaced_key, scan_repositories, ModelDir, DUPLICATE},
    uploads,
};
use crate::{
    config,
    model::{ModelEntry, ModelState, ModelTable},
    proto::inference::ModelConfig,
    repository::ensemble,
    shard::{ShardControl, ShardId},
    types::{clip, InferError, InferResult},
};

/// How the repository's models are chosen for loading (`--model-control-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelControlMode {
    /// Load everything at start-up; no changes afterwards.
    None,
    /// Load only `--load-model` models at start-up (`*`: all); load and
    /// unload through the repository API afterwards.
    Explicit,
    /// Load everything at start-up, then follow the repository's changes
    /// every `--repository-poll-secs`.
    Poll,
}

/// One row of the repository index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    pub name: String,
    pub version: Option<String>,
    pub state: Option<&'static str>,
    pub reason: Option<String>,
}

/// A load request: an optional JSON config override, and model files sent
/// in the request (`file:<path>` parameters) keyed by their relative path.
#[derive(Debug, Default)]
pub struct LoadRequest {
    pub config: Option<String>,
    pub files: Vec<(String, Bytes)>,
}

enum Request {
    Index {
        ready_only: bool,
        reply: oneshot::Sender<Vec<IndexEntry>>,
    },
    Load {
        name: String,
        load: LoadRequest,
        reply: oneshot::Sender<InferResult<()>>,
    },
    Unload {
        name: String,
        unload_dependents: bool,
        reply: oneshot::Sender<InferResult<()>>,
    },
    /// The start-up load: every model found (or only these, in explicit
    /// mode); answered with the table once every one of them has settled.
    Initial {
        only: Option<Vec<String>>,
        reply: mpsc::Sender<ModelTable>,
    },
    /// A load thread is done.
    Loaded {
        id: u64,
        entry: ModelEntry,
    },
    Stop,
}

/// Loads whose threads are running, shared by the repository thread (which
/// adds them), the load threads (which remove themselves when they end)
/// and shutdown (which waits for them).
#[derive(Debug, Default)]
struct Running {
    loads: Mutex<BTreeMap<u64, RunningLoad>>,
}

#[derive(Debug)]
struct RunningLoad {
    model: String,
    /// Failed by the watchdog: its thread is stuck in the backend for good,
    /// and shutdown does not wait for it.
    abandoned: bool,
}

impl Running {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, RunningLoad>> {
        self.loads.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The shards' handle on the repository thread.
#[derive(Debug, Clone)]
pub struct RepositoryClient {
    tx: mpsc::Sender<Request>,
    running: Arc<Running>,
}

fn gone() -> InferError {
    InferError::unavailable("the model repository is shutting down")
}

impl RepositoryClient {
    pub async fn index(&self, ready_only: bool) -> InferResult<Vec<IndexEntry>> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Request::Index { ready_only, reply })
            .map_err(|_| gone())?;
        rx.await.map_err(|_| gone())
    }

    pub async fn load(&self, name: String, load: LoadRequest) -> InferResult<()> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Request::Load { name, load, reply })
            .map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }

    /// Unloads `name`; with `unload_dependents`, the ensembles that use
    /// it are unloaded too (else they wait, not ready, for it to return).
    pub async fn unload(&self, name: String, unload_dependents: bool) -> InferResult<()> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Request::Unload {
                name,
                unload_dependents,
                reply,
            })
            .map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }

    /// Starts the start-up load (every model found, or `only`); the table
    /// arrives on the returned channel once every one has settled.
    pub fn load_initial(
        &self,
        only: Option<Vec<String>>,
    ) -> anyhow::Result<mpsc::Receiver<ModelTable>> {
        let (reply, rx) = mpsc::channel();
        self.tx
            .send(Request::Initial { only, reply })
            .map_err(|_| anyhow::anyhow!("the repository thread has stopped"))?;
        Ok(rx)
    }

    /// Ends the repository thread (server shutdown). Loads already running
    /// go on until [`Self::wait_loads`] gives up on them.
    pub fn stop(&self) {
        let _ = self.tx.send(Request::Stop);
    }

    /// The models whose loads are running (not counting loads failed for
    /// a dead child, whose threads never return).
    pub fn loading(&self) -> Vec<String> {
        self.running
            .lock()
            .values()
            .filter(|l| !l.abandoned)
            .map(|l| l.model.clone())
            .collect()
    }

    /// Waits until no load runs or `deadline` passes; returns the models
    /// still loading then.
    pub fn wait_loads(&self, deadline: Instant) -> Vec<String> {
        loop {
            let loading = self.loading();
            if loading.is_empty() || Instant::now() >= deadline {
                return loading;
            }
            // The exit path only: polling keeps load threads free of any
            // notification duty.
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Who else reads the published model table besides the shards.
pub type TableListener = Arc<dyn Fn(Arc<ModelTable>) + Send + Sync>;

/// What the repository thread needs to load models.
pub struct Manager {
    pub repositories: Vec<PathBuf>,
    pub mode: ModelControlMode,
    pub poll_interval: Option<Duration>,
    pub load: LoadOptions,
    pub placement: Placement,
    pub control: Vec<UnboundedSender<ShardControl>>,
    pub table: ModelTable,
    /// Told of every table published, after the shards (the in-process
    /// C API, which C API backends call, reads it); installed by `server`.
    pub on_publish: TableListener,
    /// `--model-load-thread-count`: start-up loads running at once.
    pub load_threads: usize,
}

/// How an ensemble's unavailability names a missing composing model.
const COMPOSING_GONE: &str = "composing model ";

/// Largest model file accepted in a load request.
pub const MAX_OVERRIDE_FILE: usize = 1 << 30;
/// Most files in one load request.
pub const MAX_OVERRIDE_FILES: usize = 1024;

/// How long a load may go on after a process its thread forked has exited
/// before the load is failed: a backend that notices its child died
/// reports it itself (and reaps it) well within this.
pub const CHILD_EXIT_GRACE: Duration = Duration::from_secs(1);

/// How often the repository thread looks at running loads' children.
const WATCH_EVERY: Duration = Duration::from_millis(100);

static OVERRIDE_DIRS: AtomicU64 = AtomicU64::new(0);

/// A load whose thread is running.
struct InFlight {
    id: u64,
    name: String,
    /// The load thread's kernel id, 0 until it has started.
    tid: Arc<AtomicI32>,
    reply: Option<oneshot::Sender<InferResult<()>>>,
    initial: bool,
    /// A child of the load thread seen dead, and since when.
    dead_child: Option<(i32, Instant)>,
}

/// A load given up on (its model was unloaded, or its child died): what
/// it brings, if it ever ends, is retired.
struct Abandoned {
    id: u64,
    tid: i32,
    /// Failed for a dead child: its thread waits in the backend for good,
    /// so what else it forks and leaves dead is reaped here.
    reap: bool,
}

/// An ensemble load through the API waiting for the composing models it
/// brought (explicit mode loads them with it, as Triton does).
struct EnsembleWait {
    name: String,
    /// The ensembles to wire once `loads` are done: the one asked for and
    /// the ensembles among its steps.
    ensembles: Vec<ModelDir>,
    loads: BTreeSet<String>,
    reply: Option<oneshot::Sender<InferResult<()>>>,
}

/// The start-up load in progress.
struct Initial {
    reply: mpsc::Sender<ModelTable>,
    queue: VecDeque<ModelDir>,
    ensembles: Vec<ModelDir>,
}

/// What a load needs once its request has been checked.
enum Prepared {
    Ensemble(ModelDir),
    Model {
        dir: ModelDir,
        config: Option<Box<ModelConfig>>,
        files: Option<OverrideDir>,
    },
}

/// The repository thread's state.
struct Repository {
    m: Manager,
    tx: mpsc::Sender<Request>,
    running: Arc<Running>,
    in_flight: Vec<InFlight>,
    abandoned: Vec<Abandoned>,
    next_id: u64,
    initial: Option<Initial>,
    waits: Vec<EnsembleWait>,
    /// Models loaded only because an ensemble needed them (explicit mode):
    /// unloading that ensemble with `unload_dependents` unloads them too.
    implicit: BTreeSet<String>,
}

impl Manager {
    /// Starts the repository thread.
    pub fn spawn(self) -> anyhow::Result<RepositoryClient> {
        let (tx, rx) = mpsc::channel();
        let running = Arc::new(Running::default());
        let repository = Repository {
            m: self,
            tx: tx.clone(),
            running: running.clone(),
            in_flight: Vec::new(),
            abandoned: Vec::new(),
            next_id: 1,
            initial: None,
            waits: Vec::new(),
            implicit: BTreeSet::new(),
        };
        std::thread::Builder::new()
            .name("repository".into())
            .spawn(move || repository.run(rx))
            .context("cannot spawn the repository thread")?;
        Ok(RepositoryClient { tx, running })
    }
}

impl Repository {
    fn run(mut self, rx: mpsc::Receiver<Request>) {
        let poll_interval = self.m.poll_interval;
        let mut last_poll = poll_interval.map(|_| self.m.fingerprints());
        let mut next_poll = poll_interval.map(|every| Instant::now() + every);
        loop {
            // A steady stream of requests must not starve the poll or the
            // watch of running loads: wait until one is due, not for a
            // full interval per request.
            let watching = !self.in_flight.is_empty() || self.abandoned.iter().any(|a| a.reap);
            let now = Instant::now();
            let watch_due = watching.then(|| now + WATCH_EVERY);
            let due = match (next_poll, watch_due) {
                (Some(p), Some(w)) => Some(p.min(w)),
                (p, w) => p.or(w),
            };
            let next = match due {
                Some(due) if now >= due => None,
                Some(due) => match rx.recv_timeout(due - now) {
                    Ok(r) => Some(r),
                    Err(mpsc::RecvTimeoutError::Timeout) => None,
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                },
                None => match rx.recv() {
                    Ok(r) => Some(r),
                    Err(_) => return,
                },
            };
            match next {
                Some(Request::Index { ready_only, reply }) => {
                    let _ = reply.send(self.index(ready_only));
                }
                Some(Request::Load { name, load, reply }) => {
                    if let Err(e) = self.m.explicit() {
                        let _ = reply.send(Err(e));
                    } else if let Err(e) = validate_name(&name) {
                        // A client names a model, never a namespaced key.
                        let _ = reply.send(Err(load_failed(&name, &format!("{e:#}"))));
                    } else {
                        self.implicit.remove(&name);
                        self.start_load(&name, load, Some(reply), false);
                    }
                }
                Some(Request::Unload {
                    name,
                    unload_dependents,
                    reply,
                }) => {
                    let done = self
                        .m
                        .explicit()
                        .and_then(|()| self.m.not_ambiguous(&name))
                        .map(|()| {
                            // A client names a model, never a namespaced
                            // key: such a name is unknown (success).
                            if !is_namespaced_key(&name) {
                                self.unload(&name, unload_dependents);
                            }
                        });
                    let _ = reply.send(done);
                }
                Some(Request::Initial { only, reply }) => self.start_initial(only, reply),
                Some(Request::Loaded { id, entry }) => self.loaded(id, entry),
                Some(Request::Stop) => return,
                None => {}
            }
            if watching {
                self.watch_children();
            }
            if let (Some(every), Some(due)) = (poll_interval, next_poll) {
                if Instant::now() >= due {
                    next_poll = Some(Instant::now() + every);
                    if let Some(previous) = last_poll.take() {
                        last_poll = Some(self.poll(previous));
                    }
                }
            }
        }
    }

    fn index(&self, ready_only: bool) -> Vec<IndexEntry> {
        let mut rows = self.m.index(ready_only);
        if ready_only {
            return display_names(rows);
        }
        // A model loading for the first time has no table entry yet.
        for f in &self.in_flight {
            let row = IndexEntry {
                name: f.name.clone(),
                version: None,
                state: Some(ModelState::Loading.as_str()),
                reason: None,
            };
            match rows.iter().position(|r| r.name == f.name) {
                Some(i) if rows[i].version.is_none() => rows[i] = row,
                Some(_) => {}
                None => rows.push(row),
            }
        }
        let mut rows = display_names(rows);
        rows.sort_by(|a, b| a.name.cmp(&b.name));
        rows
    }

    /// Starts loading `name`: on a thread of its own, or here for an
    /// ensemble (it only resolves its steps against the table). The
    /// outcome goes to `reply`, or to the log when there is none.
    fn start_load(
        &mut self,
        name: &str,
        load: LoadRequest,
        reply: Option<oneshot::Sender<InferResult<()>>>,
        initial: bool,
    ) {
        if self.in_flight.iter().any(|f| f.name == name) {
            let e = InferError::unavailable(format!(
                "failed to load '{}', a load of this model is already in progress",
                clip(name)
            ));
            answer(name, reply, Err(e));
            return;
        }
        match self.m.prepare(name, load) {
            Err(e) => answer(name, reply, Err(e)),
            Ok(Prepared::Ensemble(dir)) if self.m.mode == ModelControlMode::Explicit => {
                self.load_with_composing(dir, reply)
            }
            Ok(Prepared::Ensemble(dir)) => {
                let done = self.m.load_ensemble(&dir);
                // Dependents load here too: they are back when this answers.
                self.reload_dependents(name);
                answer(name, reply, done);
            }
            Ok(Prepared::Model { dir, config, files }) => {
                self.spawn_load(dir, config.map(|c| *c), files, reply, initial)
            }
        }
    }

    /// Explicit mode: an ensemble brings the composing models that are not
    /// loaded (recursively through ensembles of ensembles), loaded in
    /// parallel; it is wired once they have settled.
    fn load_with_composing(
        &mut self,
        dir: ModelDir,
        reply: Option<oneshot::Sender<InferResult<()>>>,
    ) {
        let found = match scan_repositories(&self.m.repositories, self.m.load.namespacing) {
            Ok(found) => found,
            Err(e) => {
                let e = load_failed(&dir.name, &format!("{e:#}"));
                answer(&dir.name, reply, Err(e));
                return;
            }
        };
        let (models, mut ensembles) =
            closure(&found, std::slice::from_ref(&dir.name), &self.m.load);
        let mut loads = BTreeSet::new();
        for model in models {
            if model.name == dir.name {
                continue;
            }
            let loading = self.in_flight.iter().any(|f| f.name == model.name);
            if !self.m.serving(&model.name) && !loading {
                // Not asked for itself: it goes when the ensemble goes.
                self.implicit.insert(model.name.clone());
            }
            if loading {
                loads.insert(model.name.clone());
            } else if !self.m.serving(&model.name) {
                loads.insert(model.name.clone());
                self.spawn_load(model, None, None, None, false);
            }
        }
        if !ensembles.iter().any(|e| e.name == dir.name) {
            ensembles.push(dir.clone());
        }
        for e in ensembles.iter().filter(|e| e.name != dir.name) {
            if !self.m.serving(&e.name) {
                self.implicit.insert(e.name.clone());
            }
        }
        self.waits.push(EnsembleWait {
            name: dir.name,
            ensembles,
            loads,
            reply,
        });
        self.settle_waits(None);
    }

    /// Wires the waiting ensembles whose composing loads are all done
    /// (`done`: the load that just settled).
    fn settle_waits(&mut self, done: Option<&str>) {
        if let Some(name) = done {
            for w in &mut self.waits {
                w.loads.remove(name);
            }
        }
        while let Some(at) = self.waits.iter().position(|w| w.loads.is_empty()) {
            let w = self.waits.swap_remove(at);
            // Ensembles already serving stay as they are, except the one
            // asked for, which is (re)loaded as any explicit load is.
            let dirs: Vec<&ModelDir> = w
                .ensembles
                .iter()
                .filter(|e| e.name == w.name || !self.m.serving(&e.name))
                .collect();
            let done = self.m.load_ensembles_now(&dirs, &w.name);
            self.reload_dependents(&w.name);
            answer(&w.name, w.reply, done);
        }
    }

    fn spawn_load(
        &mut self,
        dir: ModelDir,
        config: Option<ModelConfig>,
        files: Option<OverrideDir>,
        reply: Option<oneshot::Sender<InferResult<()>>>,
        initial: bool,
    ) {
        let id = self.next_id;
        self.next_id += 1;
        let name = dir.name.clone();
        let tid = Arc::new(AtomicI32::new(0));
        let thread_tid = tid.clone();
        let tx = self.tx.clone();
        let running = self.running.clone();
        let opts = self.m.load.clone();
        let mut placement = self.m.placement.clone();
        let control = self.m.control.clone();
        self.running.lock().insert(
            id,
            RunningLoad {
                model: name.clone(),
                abandoned: false,
            },
        );
        let spawned = std::thread::Builder::new()
            .name(format!("load-{}", clip(&name)))
            .spawn(move || {
                thread_tid.store(children::current_tid(), Ordering::Release);
                let send = |shard: ShardId, msg: ShardControl| send_control(&control, shard, msg);
                let loaded = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    load_model_with(&dir, config, &opts, &mut placement, &send)
                }));
                drop(files);
                let entry = loaded.unwrap_or_else(|_| {
                    tracing::error!(model = %dir.name, "the load panicked");
                    failure_entry(&dir.name, "the load panicked (a bug: please report it)")
                });
                running.lock().remove(&id);
                // The repository thread may have stopped (shutdown): the
                // entry is dropped, its schedulers go with their shards.
                let _ = tx.send(Request::Loaded { id, entry });
            });
        if let Err(e) = spawned {
            self.running.lock().remove(&id);
            let why = format!("cannot start a load thread: {e}");
            self.m.record_failure(&name, &why);
            answer(&name, reply, Err(load_failed(&name, &why)));
            return;
        }
        self.in_flight.push(InFlight {
            id,
            name,
            tid,
            reply,
            initial,
            dead_child: None,
        });
    }

    /// A load thread's outcome.
    fn loaded(&mut self, id: u64, entry: ModelEntry) {
        let Some(at) = self.in_flight.iter().position(|f| f.id == id) else {
            // Given up on earlier (its child died), yet it did return.
            if let Some(at) = self.abandoned.iter().position(|a| a.id == id) {
                self.abandoned.swap_remove(at);
            }
            self.m.retire(&entry);
            return;
        };
        let f = self.in_flight.swap_remove(at);
        let done = self.m.install(&f.name, entry);
        // Ensembles reload here, synchronously: back when this answers.
        self.reload_dependents(&f.name);
        answer(&f.name, f.reply, done);
        self.settle_waits(Some(&f.name));
        if f.initial {
            self.pump_initial();
        }
    }

    /// Fails the loads whose thread forked a process that has exited while
    /// the load still waits, and reaps what abandoned loads left behind.
    fn watch_children(&mut self) {
        let now = Instant::now();
        let mut give_up = Vec::new();
        for (at, f) in self.in_flight.iter_mut().enumerate() {
            let tid = f.tid.load(Ordering::Acquire);
            if tid == 0 {
                continue;
            }
            if f.dead_child.is_none() {
                f.dead_child = children::of_thread(tid)
                    .into_iter()
                    .find(|&pid| children::peek_exit(pid).is_some())
                    .map(|pid| (pid, now));
            }
            if let Some((pid, since)) = f.dead_child {
                if children::peek_exit(pid).is_none() {
                    // The backend reaped it: it noticed, and will answer.
                    f.dead_child = None;
                } else if now.duration_since(since) >= CHILD_EXIT_GRACE {
                    give_up.push((at, pid));
                }
            }
        }
        // Highest index first, so the others stay valid.
        for (at, pid) in give_up.into_iter().rev() {
            let f = self.in_flight.swap_remove(at);
            self.abandon(f, pid);
        }
        for a in self.abandoned.iter().filter(|a| a.reap) {
            for pid in children::of_thread(a.tid) {
                if children::peek_exit(pid).is_some() {
                    children::reap(pid);
                }
            }
        }
    }

    fn abandon(&mut self, f: InFlight, pid: i32) {
        let comm = children::comm(pid);
        let exit = children::peek_exit(pid).map_or_else(|| "ended".to_string(), |e| e.to_string());
        // The load's thread waits for this child for good: nothing else
        // will ever take its exit status.
        children::reap(pid);
        let why = if comm.starts_with("triton_python") {
            format!(
                "Failed to preinitialize Python stub: the stub process (pid {pid}) {exit} \
                 before it answered the backend, which kept waiting for it"
            )
        } else {
            format!(
                "process {pid} ('{comm}') started by the backend {exit} while the backend \
                 kept waiting for it"
            )
        };
        tracing::error!(
            model = %f.name,
            pid,
            "{why}; the load is failed and its thread left in the backend"
        );
        if let Some(r) = self.running.lock().get_mut(&f.id) {
            r.abandoned = true;
        }
        self.abandoned.push(Abandoned {
            id: f.id,
            tid: f.tid.load(Ordering::Acquire),
            reap: true,
        });
        let e = load_failed(&f.name, &why);
        self.m.record_failure(&f.name, &e.message);
        answer(&f.name, f.reply, Err(e));
        self.settle_waits(Some(&f.name));
        if f.initial {
            self.pump_initial();
        }
    }

    fn start_initial(&mut self, only: Option<Vec<String>>, reply: mpsc::Sender<ModelTable>) {
        let found = match scan_repositories(&self.m.repositories, self.m.load.namespacing) {
            Ok(found) => found,
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "cannot scan the model repositories");
                BTreeMap::new()
            }
        };
        if let Some(names) = &only {
            for name in names.iter().filter(|n| !found.contains_key(*n)) {
                tracing::error!(model = %name, "failed to load: no such model in the repository");
                self.m.table.models.insert(
                    name.clone(),
                    failure_entry(name, "no such model in the repository"),
                );
            }
        }
        // `--load-model=<ensemble>` brings its composing models, as in
        // Triton; those not named themselves go when it is unloaded with
        // `unload_dependents`.
        let only = only.map(|names| {
            let (models, ensembles) = closure(&found, &names, &self.m.load);
            let all: BTreeSet<String> = models
                .iter()
                .chain(ensembles.iter())
                .map(|d| d.name.clone())
                .chain(names.iter().cloned())
                .collect();
            for name in all.iter().filter(|n| !names.contains(n)) {
                self.implicit.insert(name.clone());
            }
            all
        });
        let mut queue = VecDeque::new();
        let mut ensembles = Vec::new();
        for (name, dir) in found {
            if only.as_ref().is_some_and(|names| !names.contains(&name)) {
                continue;
            }
            match dir {
                Ok(dir) if ensemble::is_ensemble(&dir, &self.m.load) => ensembles.push(dir),
                Ok(dir) => queue.push_back(dir),
                // As Triton: no copy loads, the name stays out of the table
                // (the index shows the reason) and the start-up fails.
                Err(reason) if reason == DUPLICATE => {
                    tracing::error!(
                        model = %name,
                        "failed to poll model: not unique across all model repositories"
                    );
                    self.m.table.not_polled.push(name);
                }
                Err(reason) => {
                    tracing::error!(model = %name, %reason, "failed to load");
                    self.m
                        .table
                        .models
                        .insert(name.clone(), failure_entry(&name, &reason));
                }
            }
        }
        self.initial = Some(Initial {
            reply,
            queue,
            ensembles,
        });
        self.pump_initial();
    }

    /// Starts queued start-up loads while fewer than
    /// `--model-load-thread-count` run; once all have settled, loads the
    /// ensembles (they need their composing models) and answers.
    fn pump_initial(&mut self) {
        let Some(mut initial) = self.initial.take() else {
            return;
        };
        let threads = self.m.load_threads.max(1);
        while self.in_flight.iter().filter(|f| f.initial).count() < threads {
            let Some(dir) = initial.queue.pop_front() else {
                break;
            };
            self.spawn_load(dir, None, None, None, true);
        }
        if !initial.queue.is_empty() || self.in_flight.iter().any(|f| f.initial) {
            self.initial = Some(initial);
            return;
        }
        let dirs: Vec<&ModelDir> = initial.ensembles.iter().collect();
        let Manager {
            load,
            placement,
            table,
            ..
        } = &mut self.m;
        ensemble::load_ensembles(&dirs, load, table, placement);
        self.m.publish();
        let _ = initial.reply.send(published(&self.m.table));
    }

    /// Unloads `name` (see [`Manager::unload`]); a load of it still running
    /// is answered now, and what it brings retired when it ends.
    fn unload(&mut self, name: &str, dependents: bool) {
        // Triton's cascading removal: the composing models this ensemble
        // brought, used by no other loaded ensemble, go with it.
        let upstream: Vec<String> = if dependents {
            self.m.composing_loaded(name)
        } else {
            Vec::new()
        };
        self.unload_one(name, dependents);
        self.implicit.remove(name);
        for model in upstream {
            if self.implicit.contains(&model) && self.m.dependents(&model).is_empty() {
                self.unload(&model, true);
            }
        }
    }

    fn unload_one(&mut self, name: &str, dependents: bool) {
        let mut initial = false;
        while let Some(at) = self.in_flight.iter().position(|f| f.name == name) {
            let f = self.in_flight.swap_remove(at);
            initial |= f.initial;
            self.abandoned.push(Abandoned {
                id: f.id,
                tid: f.tid.load(Ordering::Acquire),
                reap: false,
            });
            let e = load_failed(name, "the model was unloaded while it was loading");
            answer(name, f.reply, Err(e));
            self.settle_waits(Some(name));
        }
        self.m.unload(name, dependents);
        if initial {
            self.pump_initial();
        }
    }

    /// A model came (back): ensembles made unavailable by its absence are
    /// loaded again, as Triton reloads dependents.
    fn reload_dependents(&mut self, name: &str) {
        if !self.m.serving(name) {
            return;
        }
        let marker = format!("{COMPOSING_GONE}'{name}'");
        let waiting: Vec<String> = self
            .m
            .table
            .models
            .iter()
            .filter(|(_, e)| {
                e.versions
                    .values()
                    .any(|v| v.state.reason().starts_with(&marker))
            })
            .map(|(n, _)| n.clone())
            .collect();
        for ensemble in waiting {
            self.start_load(&ensemble, LoadRequest::default(), None, false);
        }
    }

    /// Poll mode: loads added or changed models, unloads removed ones.
    fn poll(
        &mut self,
        previous: BTreeMap<String, Vec<(PathBuf, Option<SystemTime>)>>,
    ) -> BTreeMap<String, Vec<(PathBuf, Option<SystemTime>)>> {
        let now = self.m.fingerprints();
        for (name, marks) in &now {
            if previous.get(name) != Some(marks) {
                tracing::info!(model = %name, "repository changed: (re)loading");
                self.start_load(name, LoadRequest::default(), None, false);
            }
        }
        for name in previous.keys().filter(|n| !now.contains_key(*n)) {
            tracing::info!(model = %name, "removed from the repository: unloading");
            self.unload(name, false);
            self.m.table.models.remove(name);
            self.m.publish();
        }
        now
    }
}

/// `roots` and, through the steps of the ensembles among them
/// (recursively), every model they use: the non-ensembles and the
/// ensembles, each once. Names not in the repository are left out (the
/// ensemble's wiring names them).
fn closure(
    found: &BTreeMap<String, Result<ModelDir, String>>,
    roots: &[String],
    opts: &LoadOptions,
) -> (Vec<ModelDir>, Vec<ModelDir>) {
    let mut seen = BTreeSet::new();
    let mut todo: Vec<String> = roots.to_vec();
    let (mut models, mut ensembles) = (Vec::new(), Vec::new());
    while let Some(name) = todo.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        let Some(Ok(dir)) = found.get(&name) else {
            continue;
        };
        match ensemble::composing_of(dir, opts) {
            Some(steps) => {
                // Under namespacing a step is the ensemble's own
                // repository's copy where it has one.
                todo.extend(steps.into_iter().map(|step| {
                    match dir.namespace.as_deref().map(|ns| namespaced_key(&step, ns)) {
                        Some(key) if found.contains_key(&key) => key,
                        _ => step,
                    }
                }));
                ensembles.push(dir.clone());
            }
            None => models.push(dir.clone()),
        }
    }
    (models, ensembles)
}

/// Sends a load's outcome, or logs a failure nobody asked to hear about.
fn answer(name: &str, reply: Option<oneshot::Sender<InferResult<()>>>, done: InferResult<()>) {
    match reply {
        Some(reply) => {
            let _ = reply.send(done);
        }
        None => {
            if let Err(e) = done {
                tracing::warn!(model = %name, error = %e.message, "load failed");
            }
        }
    }
}

/// Triton reports a failed load as INTERNAL (HTTP 500).
fn load_failed(name: &str, why: &str) -> InferError {
    InferError::internal(format!("failed to load '{}', {why}", clip(name)))
}

/// Index rows name models, not table keys: the copies of a name several
/// repositories hold (namespacing on) are listed under that name each.
fn display_names(mut rows: Vec<IndexEntry>) -> Vec<IndexEntry> {
    for row in &mut rows {
        if is_namespaced_key(&row.name) {
            row.name = key_name(&row.name).to_string();
        }
    }
    rows
}

/// The table as published: with the names several repositories hold
/// (namespacing on) counted, for the request path's ambiguity error.
fn published(table: &ModelTable) -> ModelTable {
    let mut table = table.clone();
    let mut ambiguous = BTreeMap::new();
    for key in table.models.keys().filter(|k| is_namespaced_key(k)) {
        *ambiguous.entry(key_name(key).to_string()).or_insert(0) += 1;
    }
    ambiguous.retain(|_, count| *count > 1);
    table.ambiguous = ambiguous;
    table
}

fn failure_entry(name: &str, reason: &str) -> ModelEntry {
    ModelEntry {
        failure: Some(format!("failed to load '{}': {reason}", clip(name))),
        ..Default::default()
    }
}

impl Manager {
    fn explicit(&self) -> InferResult<()> {
        if self.mode != ModelControlMode::Explicit {
            return Err(InferError::unavailable(
                "explicit model load / unload is not allowed if polling is enabled",
            ));
        }
        Ok(())
    }

    /// Refuses a load or unload naming a model that several repositories
    /// hold (namespacing on), with Triton's ambiguity text: the repository
    /// API has no way to name the namespace.
    fn not_ambiguous(&self, name: &str) -> InferResult<()> {
        if !self.load.namespacing {
            return Ok(());
        }
        let found = scan_repositories(&self.repositories, true)
            .map_err(|e| load_failed(name, &format!("{e:#}")))?;
        let count = found
            .keys()
            .filter(|k| is_namespaced_key(k) && key_name(k) == name)
            .count();
        if count > 1 {
            return Err(InferError::invalid(crate::model::ambiguous_model(
                &clip(name),
                count,
            )));
        }
        Ok(())
    }

    fn index(&self, ready_only: bool) -> Vec<IndexEntry> {
        // Per name, why its folder cannot be used (a broken link, a
        // duplicate), if it cannot.
        let mut names: BTreeMap<String, Option<String>> =
            match scan_repositories(&self.repositories, self.load.namespacing) {
                Ok(found) => found.into_iter().map(|(n, d)| (n, d.err())).collect(),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot scan the model repositories for the index");
                    BTreeMap::new()
                }
            };
        for name in self.table.models.keys() {
            names.entry(name.clone()).or_default();
        }
        let mut rows = Vec::new();
        for (name, unusable) in names {
            // Triton lists a duplicated name once, with no version, even
            // for `ready: true`, whatever a copy loaded earlier does.
            if unusable.as_deref() == Some(DUPLICATE) {
                rows.push(IndexEntry {
                    name,
                    version: None,
                    state: Some("UNAVAILABLE"),
                    reason: unusable,
                });
                continue;
            }
            let Some(entry) = self.table.models.get(&name) else {
                if !ready_only {
                    rows.push(IndexEntry {
                        name,
                        version: None,
                        state: unusable.is_some().then_some("UNAVAILABLE"),
                        reason: unusable,
                    });
                }
                continue;
            };
            if let Some(failure) = &entry.failure {
                if !ready_only {
                    rows.push(IndexEntry {
                        name: name.clone(),
                        version: None,
                        state: Some("UNAVAILABLE"),
                        reason: Some(failure.clone()),
                    });
                }
                continue;
            }
            for v in entry.versions.values() {
                if ready_only && v.state != ModelState::Ready {
                    continue;
                }
                rows.push(IndexEntry {
                    name: name.clone(),
                    version: Some(v.version.to_string()),
                    state: Some(v.state.as_str()),
                    reason: match v.state.reason() {
                        "" => None,
                        r => Some(r.to_string()),
                    },
                });
            }
        }
        rows
    }

    fn send(&self, shard: ShardId, msg: ShardControl) -> anyhow::Result<()> {
        send_control(&self.control, shard, msg)
    }

    fn publish(&self) {
        let table = Arc::new(published(&self.table));
        for c in &self.control {
            let _ = c.unbounded_send(ShardControl::Table(table.clone()));
        }
        (self.on_publish)(table);
    }

    /// Stops the schedulers of every loaded version in `entry` (after a
    /// table without them was published).
    fn retire(&self, entry: &ModelEntry) {
        for v in entry.versions.values() {
            if let Some(loaded) = &v.loaded {
                for target in loaded.schedulers() {
                    if let Err(e) = self.send(
                        target.shard,
                        ShardControl::Run(crate::scheduler::host::remove_task(target.key)),
                    ) {
                        tracing::warn!(model = %loaded.name, error = %e, "cannot stop a retired scheduler");
                    }
                }
            }
        }
    }

    /// A load that failed before it built anything: the model shows the
    /// reason unless an earlier version still serves.
    fn record_failure(&mut self, name: &str, message: &str) {
        if self.serving(name) || validate_name(key_name(name)).is_err() {
            return;
        }
        self.table.models.insert(
            name.to_string(),
            ModelEntry {
                failure: Some(message.to_string()),
                ..Default::default()
            },
        );
        self.publish();
    }

    /// Checks a load request and finds (or writes) the model's folder.
    fn prepare(&self, name: &str, mut load: LoadRequest) -> InferResult<Prepared> {
        let failed = |why: String| load_failed(name, &why);
        // Uploads that would become code are the client's error (400 /
        // INVALID_ARGUMENT), worded as a failed load for clients that
        // look for that text.
        let refused =
            |why: String| InferError::invalid(format!("failed to load '{}', {why}", clip(name)));
        let allow_python = self.load.allow_uploaded_python;
        let with_files = !load.files.is_empty();
        // `name` is a table key: a namespaced one when the repository
        // thread reloads a copy of a name several repositories hold.
        validate_name(key_name(name)).map_err(|e| failed(format!("{e:#}")))?;
        let override_config = match &load.config {
            None => None,
            Some(json) => Some(config::model_config_from_json(json).map_err(|e| {
                failed(format!(
                    "the config override is not a valid model configuration: {e:#}"
                ))
            })?),
        };
        let (dir, tmp) = if load.files.is_empty() {
            self.not_ambiguous(name)?;
            let found = scan_repositories(&self.repositories, self.load.namespacing)
                .map_err(|e| failed(format!("{e:#}")))?;
            match found.get(name) {
                Some(Ok(dir)) => (dir.clone(), None),
                Some(Err(reason)) if reason == DUPLICATE => {
                    tracing::error!(
                        model = %clip(name),
                        "failed to poll model: not unique across all model repositories"
                    );
                    return Err(failed("failed to poll from model repository".into()));
                }
                Some(Err(reason)) => return Err(failed(reason.clone())),
                None => {
                    return Err(failed(
                        "failed to poll from model repository: no such model in any repository"
                            .into(),
                    ))
                }
            }
        } else {
            if override_config.is_none() {
                return Err(failed(
                    "model files were sent without a 'config' parameter".into(),
                ));
            }
            uploads::check_files(&load.files, allow_python).map_err(refused)?;
            let tmp = OverrideDir::write(name, &load.files)
                .map_err(|e| failed(format!("failed to poll from model repository: {e:#}")))?;
            // Written: the request's copies (counted in the shard's body
            // budget) are released now, not when the model has loaded.
            load.files = Vec::new();
            (
                ModelDir {
                    name: name.to_string(),
                    path: tmp.model_dir(),
                    // Triton's namespace of a model sent in a request.
                    namespace: self.load.namespacing.then(|| Arc::from("")),
                },
                Some(tmp),
            )
        };
        let override_config = override_config.map(|c| inherit_backend(c, &dir, &self.load));
        if let Some(config) = &override_config {
            uploads::check_config(config, with_files, allow_python).map_err(refused)?;
        }
        if override_config.is_none() && ensemble::is_ensemble(&dir, &self.load) {
            return Ok(Prepared::Ensemble(dir));
        }
        Ok(Prepared::Model {
            dir,
            config: override_config.map(Box::new),
            files: tmp,
        })
    }

    /// Wires `dirs` (ensembles, in any order) against the table now and
    /// installs each; the outcome of `asked`'s is returned.
    fn load_ensembles_now(&mut self, dirs: &[&ModelDir], asked: &str) -> InferResult<()> {
        let mut scratch = ModelTable {
            models: self.table.models.clone(),
            ..Default::default()
        };
        ensemble::load_ensembles(dirs, &self.load, &mut scratch, &mut self.placement);
        let mut outcome = Ok(());
        for dir in dirs {
            let entry = scratch.models.remove(&dir.name).unwrap_or_default();
            let done = self.install(&dir.name, entry);
            if dir.name == asked {
                outcome = done;
            }
        }
        outcome
    }

    /// The models the loaded ensemble `name`'s steps use.
    fn composing_loaded(&self, name: &str) -> Vec<String> {
        let Some(entry) = self.table.models.get(name) else {
            return Vec::new();
        };
        let names: BTreeSet<String> = entry
            .versions
            .values()
            .filter_map(|v| v.loaded.as_ref()?.ensemble.as_ref())
            .flat_map(|plan| plan.steps.iter().map(|s| s.model_name.clone()))
            .collect();
        names.into_iter().collect()
    }

    /// An ensemble resolves its steps against the models loaded now.
    fn load_ensemble(&mut self, dir: &ModelDir) -> InferResult<()> {
        let mut scratch = ModelTable {
            models: self.table.models.clone(),
            ..Default::default()
        };
        ensemble::load_ensembles(&[dir], &self.load, &mut scratch, &mut self.placement);
        let entry = scratch.models.remove(&dir.name).unwrap_or_default();
        self.install(&dir.name, entry)
    }

    /// Puts a load's outcome in the table: a ready model replaces what
    /// served (retired after the new table is out); a failed one leaves
    /// what served in place.
    fn install(&mut self, name: &str, entry: ModelEntry) -> InferResult<()> {
        let all_ready = entry.failure.is_none()
            && !entry.versions.is_empty()
            && entry
                .versions
                .values()
                .all(|v| v.state == ModelState::Ready);
        if !all_ready {
            let why = entry
                .failure
                .clone()
                .or_else(|| {
                    entry.versions.values().find_map(|v| match &v.state {
                        ModelState::Unavailable { reason } => Some(reason.clone()),
                        _ => None,
                    })
                })
                .unwrap_or_else(|| "no version is available".into());
            // What did load of this attempt goes away; what served stays.
            self.retire(&entry);
            if !self.serving(name) {
                self.table.models.insert(name.to_string(), entry);
                self.publish();
            }
            return Err(InferError::internal(why));
        }
        let old = self.table.models.insert(name.to_string(), entry);
        self.publish();
        if let Some(old) = old {
            self.retire(&old);
        }
        Ok(())
    }

    /// Ensembles whose steps use `name`, by name.
    fn dependents(&self, name: &str) -> Vec<String> {
        self.table
            .models
            .iter()
            .filter(|(_, e)| {
                e.versions.values().any(|v| {
                    v.loaded
                        .as_ref()
                        .and_then(|m| m.ensemble.as_ref())
                        .is_some_and(|plan| plan.steps.iter().any(|step| step.model_name == name))
                })
            })
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// A composing model went away: its ensembles stop being ready, with
    /// the reason in their readiness and the index (recursively for
    /// ensembles of ensembles).
    fn disable_dependents(&mut self, name: &str) {
        for ensemble in self.dependents(name) {
            let reason = format!("{COMPOSING_GONE}'{name}' is not available");
            if let Some(entry) = self.table.models.get_mut(&ensemble) {
                for v in entry.versions.values_mut() {
                    v.state = ModelState::Unavailable {
                        reason: reason.clone(),
                    };
                    v.loaded = None;
                }
            }
            tracing::warn!(model = %ensemble, composing = %name, "ensemble not ready: a composing model was unloaded");
            self.disable_dependents(&ensemble);
        }
    }

    fn serving(&self, name: &str) -> bool {
        self.table
            .models
            .get(name)
            .is_some_and(|e| e.versions.values().any(|v| v.state == ModelState::Ready))
    }

    /// Unloads every version of `name`; unknown models unload fine, as in
    /// Triton. With `dependents`, the ensembles using `name` (and theirs)
    /// are unloaded first, so they stay unloaded when `name` comes back;
    /// without, they become unavailable and return with it.
    fn unload(&mut self, name: &str, dependents: bool) {
        if dependents {
            for ensemble in self.dependents(name) {
                self.unload(&ensemble, true);
            }
        }
        let Some(entry) = self.table.models.get_mut(name) else {
            return;
        };
        let old = std::mem::take(entry);
        entry.versions = old
            .versions
            .iter()
            .map(|(&version, _)| {
                (
                    version,
                    crate::model::VersionEntry {
                        version,
                        state: ModelState::Unavailable {
                            reason: crate::model::UNLOADED.into(),
                        },
                        loaded: None,
                    },
                )
            })
            .collect();
        self.disable_dependents(name);
        self.publish();
        self.retire(&old);
        tracing::info!(model = %name, "unloaded");
    }

    /// What poll mode compares: each model folder's config and version
    /// folders with their modification times.
    fn fingerprints(&self) -> BTreeMap<String, Vec<(PathBuf, Option<SystemTime>)>> {
        let Ok(found) = scan_repositories(&self.repositories, self.load.namespacing) else {
            return BTreeMap::new();
        };
        found
            .into_iter()
            // A duplicated name counts as gone: Triton unloads it and
            // loads it again once a single repository holds it.
            .filter(|(_, dir)| !matches!(dir, Err(reason) if reason == DUPLICATE))
            .map(|(name, dir)| {
                let mut marks = Vec::new();
                if let Ok(dir) = dir {
                    if let Ok(read) = std::fs::read_dir(&dir.path) {
                        for e in read.flatten() {
                            let path = e.path();
                            let modified = modified_deep(&path);
                            marks.push((path, modified));
                        }
                    }
                    marks.sort();
                }
                (name, marks)
            })
            .collect()
    }
}

/// Latest modification time under `path` (one level into version folders).
fn modified_deep(path: &Path) -> Option<SystemTime> {
    let own = std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let inner = std::fs::read_dir(path)
        .ok()
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.metadata().and_then(|m| m.modified()).ok());
    own.into_iter().chain(inner).max()
}

/// An override that names neither backend nor platform (the model-control
/// examples send only `max_batch_size`) keeps the ones of the model's own
/// `config.pbtxt`, as Triton's auto-complete finds them from the model's
/// files; inputs and outputs are then auto-completed by the backend.
fn inherit_backend(
    mut config: crate::proto::inference::ModelConfig,
    dir: &ModelDir,
    opts: &LoadOptions,
) -> crate::proto::inference::ModelConfig {
    if !config.backend.is_empty() || !config.platform.is_empty() {
        return config;
    }
    let on_disk = std::fs::read_to_string(super::config_path(&dir.path, opts))
        .ok()
        .and_then(|text| config::parse_model_config(&text).ok());
    if let Some(base) = on_disk {
        config.backend = base.backend;
        config.platform = base.platform;
    }
    config
}

fn validate_name(name: &str) -> anyhow::Result<()> {
    if name.is_empty() || name.len() > 255 {
        bail!("model name must be 1 to 255 bytes");
    }
    if name == "." || name == ".." || name.contains(['/', '\\', '\0']) {
        bail!("model name '{}' is not a plain folder name", clip(name));
    }
    Ok(())
}

/// A temporary model folder holding the files of a load request; removed
/// when the load is done (the instances have read what they need).
struct OverrideDir {
    root: PathBuf,
    name: String,
}

impl OverrideDir {
    fn write(name: &str, files: &[(String, Bytes)]) -> anyhow::Result<Self> {
        if files.len() > MAX_OVERRIDE_FILES {
            bail!("at most {MAX_OVERRIDE_FILES} files may be sent in one load request");
        }
        let id = OVERRIDE_DIRS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let root = uploads::create_upload_root(id)
            .context("creating a temporary folder for the uploaded files")?;
        let dir = Self {
            root,
            name: name.to_string(),
        };
        let model_dir = dir.model_dir();
        std::fs::create_dir_all(&model_dir)
            .with_context(|| format!("creating {}", model_dir.display()))?;
        for (rel, data) in files {
            let path = safe_relative(rel)?;
            if data.len() > MAX_OVERRIDE_FILE {
                bail!(
                    "file '{}' is larger than {MAX_OVERRIDE_FILE} bytes",
                    clip(rel)
                );
            }
            let target = model_dir.join(path);
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)
                    .with_context(|| format!("creating {}", parent.display()))?;
            }
            std::fs::write(&target, data)
                .with_context(|| format!("writing {}", target.display()))?;
        }
        Ok(dir)
    }

    fn model_dir(&self) -> PathBuf {
        self.root.join(&self.name)
    }
}

impl Drop for OverrideDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// A `file:` path must stay inside the model folder (Triton has had
/// path-traversal CVEs here): relative, plain components only.
fn safe_relative(rel: &str) -> anyhow::Result<PathBuf> {
    let path = Path::new(rel);
    if rel.is_empty() || rel.len() > 4096 || rel.contains('\0') {
        bail!(
            "file name '{}' is empty, too long or contains NUL",
            clip(rel)
        );
    }
    if path.components().any(|c| c.as_os_str().len() > 255) {
        bail!(
            "file '{}' has a path component longer than 255 bytes",
            clip(rel)
        );
    }
    if path.is_absolute()
        || path
            .components()
            .any(|c| !matches!(c, Component::Normal(_)))
    {
        bail!(
            "file '{}' must be a relative path inside the model folder",
            clip(rel)
        );
    }
    Ok(path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_paths_cannot_escape() {
        assert!(safe_relative("1/model.onnx").is_ok());
        for bad in [
            "../x",
            "1/../../x",
            "/etc/passwd",
            "",
            "a\0b",
            "./1/model.onnx",
        ] {
            assert!(safe_relative(bad).is_err(), "{bad:?}");
        }
        for bad in ["", "..", "a/b", "."] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn override_files_land_in_a_temporary_model_folder_and_go_away() {
        let files = vec![("1/model.bin".to_string(), Bytes::from_static(b"abc"))];
        let dir = OverrideDir::write("m", &files).unwrap();
        let path = dir.model_dir().join("1/model.bin");
        assert_eq!(std::fs::read(&path).unwrap(), b"abc");
        drop(dir);
        assert!(!path.exists());
    }
}
