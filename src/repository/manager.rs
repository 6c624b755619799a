//! The model repository extension at run time: one `repository` thread
//! owns the model table and does every load and unload (Triton serialises
//! them too), so shards never block on a model's creation. A shard asks
//! through [`RepositoryClient`] and awaits the answer on a oneshot.
//!
//! A (re)load builds the new versions with their own schedulers, publishes
//! a table naming them, and only then stops the old versions' schedulers:
//! requests already queued finish on the old version, new ones go to the
//! new. A failed load leaves whatever was serving in place.

use std::{
    collections::BTreeMap,
    path::{Component, Path, PathBuf},
    sync::{atomic::AtomicU64, mpsc, Arc},
    time::{Duration, Instant, SystemTime},
};

use anyhow::{bail, Context};
use bytes::Bytes;
use futures::channel::{mpsc::UnboundedSender, oneshot};

use super::{
    load::{load_model_with, send_control, LoadOptions, Placement},
    scan::{scan_repositories, ModelDir},
    uploads,
};
use crate::{
    config,
    model::{ModelEntry, ModelState, ModelTable},
    scheduler::ensemble,
    server::ModelControlMode,
    shard::{ShardControl, ShardId},
    types::{clip, InferError, InferResult},
};

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
    Stop,
}

/// The shards' handle on the repository thread.
#[derive(Debug, Clone)]
pub struct RepositoryClient {
    tx: mpsc::Sender<Request>,
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

    /// Ends the repository thread (server shutdown).
    pub fn stop(&self) {
        let _ = self.tx.send(Request::Stop);
    }
}

/// What the repository thread needs to load models.
pub struct Manager {
    pub repositories: Vec<PathBuf>,
    pub mode: ModelControlMode,
    pub poll_interval: Option<Duration>,
    pub load: LoadOptions,
    pub placement: Placement,
    pub control: Vec<UnboundedSender<ShardControl>>,
    pub table: ModelTable,
    /// Told of every table published (C API backends read it).
    pub capi_server: Arc<crate::backend::capi::server_api::TRITONSERVER_Server>,
}

/// How an ensemble's unavailability names a missing composing model.
const COMPOSING_GONE: &str = "composing model ";

/// Largest model file accepted in a load request.
pub const MAX_OVERRIDE_FILE: usize = 1 << 30;
/// Most files in one load request.
pub const MAX_OVERRIDE_FILES: usize = 1024;

static OVERRIDE_DIRS: AtomicU64 = AtomicU64::new(0);

impl Manager {
    /// Starts the repository thread.
    pub fn spawn(self) -> anyhow::Result<RepositoryClient> {
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("repository".into())
            .spawn(move || self.run(rx))
            .context("cannot spawn the repository thread")?;
        Ok(RepositoryClient { tx })
    }

    fn run(mut self, rx: mpsc::Receiver<Request>) {
        let mut last_poll = self.poll_interval.map(|_| self.fingerprints());
        let mut next_poll = self.poll_interval.map(|every| Instant::now() + every);
        loop {
            // A steady stream of requests must not starve the poll: wait
            // until the poll is due, not for a full interval per request.
            let next = match (self.poll_interval, next_poll) {
                (Some(every), Some(due)) => {
                    let now = Instant::now();
                    if now >= due {
                        next_poll = Some(now + every);
                        None
                    } else {
                        match rx.recv_timeout(due - now) {
                            Ok(r) => Some(r),
                            Err(mpsc::RecvTimeoutError::Timeout) => {
                                next_poll = Some(Instant::now() + every);
                                None
                            }
                            Err(mpsc::RecvTimeoutError::Disconnected) => return,
                        }
                    }
                }
                _ => match rx.recv() {
                    Ok(r) => Some(r),
                    Err(_) => return,
                },
            };
            match next {
                Some(Request::Index { ready_only, reply }) => {
                    let _ = reply.send(self.index(ready_only));
                }
                Some(Request::Load { name, load, reply }) => {
                    let _ = reply.send(self.explicit(|m| m.load(&name, load)));
                }
                Some(Request::Unload {
                    name,
                    unload_dependents,
                    reply,
                }) => {
                    let _ = reply.send(self.explicit(|m| {
                        m.unload(&name, unload_dependents);
                        Ok(())
                    }));
                }
                Some(Request::Stop) => return,
                None => {
                    if let Some(previous) = last_poll.take() {
                        last_poll = Some(self.poll(previous));
                    }
                }
            }
        }
    }

    fn explicit(&mut self, f: impl FnOnce(&mut Self) -> InferResult<()>) -> InferResult<()> {
        if self.mode != ModelControlMode::Explicit {
            return Err(InferError::unavailable(
                "explicit model load / unload is not allowed if polling is enabled",
            ));
        }
        f(self)
    }

    fn index(&self, ready_only: bool) -> Vec<IndexEntry> {
        // Per name, why its folder cannot be used (a broken link, a
        // duplicate), if it cannot.
        let mut names: BTreeMap<String, Option<String>> =
            match scan_repositories(&self.repositories) {
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
        let table = Arc::new(self.table.clone());
        for c in &self.control {
            let _ = c.unbounded_send(ShardControl::Table(table.clone()));
        }
        self.capi_server.publish(table);
    }

    /// Stops the schedulers of every loaded version in `entry` (after a
    /// table without them was published).
    fn retire(&self, entry: &ModelEntry) {
        for v in entry.versions.values() {
            if let Some(loaded) = &v.loaded {
                let target = loaded.scheduler;
                if let Err(e) = self.send(target.shard, ShardControl::Remove { key: target.key }) {
                    tracing::warn!(model = %loaded.name, error = %e, "cannot stop a retired scheduler");
                }
            }
        }
    }

    fn load(&mut self, name: &str, mut load: LoadRequest) -> InferResult<()> {
        // Triton reports a failed load as INTERNAL (HTTP 500).
        let failed =
            |why: String| InferError::internal(format!("failed to load '{}', {why}", clip(name)));
        // Uploads that would become code are the client's error (400 /
        // INVALID_ARGUMENT), worded as a failed load for clients that
        // look for that text.
        let refused =
            |why: String| InferError::invalid(format!("failed to load '{}', {why}", clip(name)));
        let allow_python = self.load.allow_uploaded_python;
        let with_files = !load.files.is_empty();
        validate_name(name).map_err(|e| failed(format!("{e:#}")))?;
        let override_config = match &load.config {
            None => None,
            Some(json) => Some(config::model_config_from_json(json).map_err(|e| {
                failed(format!(
                    "the config override is not a valid model configuration: {e:#}"
                ))
            })?),
        };
        let (dir, _tmp) = if load.files.is_empty() {
            let found =
                scan_repositories(&self.repositories).map_err(|e| failed(format!("{e:#}")))?;
            match found.get(name) {
                Some(Ok(dir)) => (dir.clone(), None),
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
                },
                Some(tmp),
            )
        };
        let override_config = override_config.map(|c| inherit_backend(c, &dir));
        if let Some(config) = &override_config {
            uploads::check_config(config, with_files, allow_python).map_err(refused)?;
        }
        let Self {
            load: opts,
            placement,
            control,
            ..
        } = self;
        let send = |shard: ShardId, msg: ShardControl| send_control(control, shard, msg);
        let entry = if override_config.is_none() && ensemble::is_ensemble(&dir, opts) {
            // An ensemble resolves its steps against the models loaded now.
            let mut scratch = ModelTable {
                models: self.table.models.clone(),
            };
            ensemble::load_ensembles(&[&dir], opts, &mut scratch, placement);
            scratch.models.remove(name).unwrap_or_default()
        } else {
            load_model_with(&dir, override_config, opts, placement, &send)
        };
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
        self.reload_dependents(name);
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

    /// A model came (back): ensembles made unavailable by its absence are
    /// loaded again, as Triton reloads dependents.
    fn reload_dependents(&mut self, name: &str) {
        let marker = format!("{COMPOSING_GONE}'{name}'");
        let waiting: Vec<String> = self
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
            if let Err(e) = self.load(&ensemble, LoadRequest::default()) {
                tracing::warn!(model = %ensemble, error = %e.message, "could not reload an ensemble");
            }
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
                            reason: "unloaded".into(),
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
        let Ok(found) = scan_repositories(&self.repositories) else {
            return BTreeMap::new();
        };
        found
            .into_iter()
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

    /// Poll mode: loads added or changed models, unloads removed ones.
    fn poll(
        &mut self,
        previous: BTreeMap<String, Vec<(PathBuf, Option<SystemTime>)>>,
    ) -> BTreeMap<String, Vec<(PathBuf, Option<SystemTime>)>> {
        let now = self.fingerprints();
        for (name, marks) in &now {
            if previous.get(name) != Some(marks) {
                tracing::info!(model = %name, "repository changed: (re)loading");
                if let Err(e) = self.load(name, LoadRequest::default()) {
                    tracing::error!(model = %name, error = %e.message, "poll: failed to load");
                }
            }
        }
        for name in previous.keys().filter(|n| !now.contains_key(*n)) {
            tracing::info!(model = %name, "removed from the repository: unloading");
            self.unload(name, false);
            self.table.models.remove(name);
            self.publish();
        }
        now
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
) -> crate::proto::inference::ModelConfig {
    if !config.backend.is_empty() || !config.platform.is_empty() {
        return config;
    }
    let on_disk = std::fs::read_to_string(dir.path.join("config.pbtxt"))
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
