use std::{collections::BTreeMap, sync::Arc};

use bytes::Bytes;

use super::{IoSpec, ModelMetadata};
use crate::{
    metrics::ModelStats,
    proto::inference::ModelConfig,
    shard::{ShardId, Target},
    types::InferError,
};

/// The reason of a version unloaded on purpose (Triton's text); such a
/// version does not make the server unready.
pub const UNLOADED: &str = "unloaded";

/// Lifecycle state of one model version, as the repository index reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelState {
    Loading,
    Ready,
    Unloading,
    Unavailable { reason: String },
}

impl ModelState {
    /// Triton's state names (`READY`, `UNAVAILABLE`, ...).
    pub fn as_str(&self) -> &'static str {
        match self {
            ModelState::Loading => "LOADING",
            ModelState::Ready => "READY",
            ModelState::Unloading => "UNLOADING",
            ModelState::Unavailable { .. } => "UNAVAILABLE",
        }
    }

    pub fn reason(&self) -> &str {
        match self {
            ModelState::Unavailable { reason } => reason,
            _ => "",
        }
    }
}

/// How an instance executes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutionPlace {
    /// On the owner shard's thread (light built-in backends).
    Inline,
    /// On its own compute worker thread.
    Worker,
}

/// One instance of a model version, for reporting.
#[derive(Debug, Clone)]
pub struct InstanceInfo {
    pub name: String,
    pub place: ExecutionPlace,
}

/// A loaded model version: immutable, shared by every shard.
#[derive(Debug)]
pub struct ModelVersion {
    pub name: String,
    pub version: i64,
    pub version_str: String,
    pub config: Arc<ModelConfig>,
    /// `GET .../config` body, rendered once at load time.
    pub config_json: Bytes,
    pub io: IoSpec,
    pub metadata: ModelMetadata,
    /// The scheduler every request of this version goes to (one queue
    /// per model, as in Triton), on its owner shard.
    pub scheduler: Target,
    /// Empty, or the schedulers of a version whose inline instances are
    /// spread over several shards (`scheduler` first): each holds some of
    /// the instances and queues the requests of the shards it serves
    /// (`scheduler_for`). A shard runs inline instances one at a time, so
    /// instances on one shard would never run in parallel.
    pub spread: Vec<Target>,
    pub instances: Vec<InstanceInfo>,
    /// The sequence batcher's configuration, for a stateful model.
    pub sequence: Option<crate::scheduler::sequence::SequenceSpec>,
    /// Statistics counters, one block per shard.
    pub stats: Arc<ModelStats>,
    /// For an ensemble: its compiled steps (it has no scheduler).
    pub ensemble: Option<Arc<crate::scheduler::ensemble::EnsemblePlan>>,
    // issue 24: response cache
    /// The server's response cache when this version enables it (and the
    /// server has one): requests look up and store their answers there.
    pub response_cache: Option<Arc<crate::scheduler::ResponseCache>>,
    // issue 24: several repositories + namespacing
    /// Under `--model-namespacing`: the model's repository (metrics label
    /// it `namespace`).
    pub namespace: Option<Arc<str>>,
}

impl ModelVersion {
    /// Every scheduler of this version: the owner's alone, or the spread.
    pub fn schedulers(&self) -> &[Target] {
        match self.spread.as_slice() {
            [] => std::slice::from_ref(&self.scheduler),
            spread => spread,
        }
    }

    /// The scheduler a request received on `shard` goes to: the owner's,
    /// or for a spread version the one on `shard` itself, else the one the
    /// spread list assigns to `shard` (always the same, so the receiving
    /// shards divide evenly over the schedulers).
    pub fn scheduler_for(&self, shard: ShardId) -> Target {
        if self.spread.is_empty() {
            return self.scheduler;
        }
        self.spread
            .iter()
            .find(|t| t.shard == shard)
            .or_else(|| self.spread.get(shard % self.spread.len()))
            .copied()
            .unwrap_or(self.scheduler)
    }
}

#[derive(Debug, Clone)]
pub struct VersionEntry {
    pub version: i64,
    pub state: ModelState,
    pub loaded: Option<Arc<ModelVersion>>,
}

/// A model in the repository, whatever its versions' states.
#[derive(Debug, Clone, Default)]
pub struct ModelEntry {
    pub versions: BTreeMap<i64, VersionEntry>,
    /// Why the model as a whole is unavailable (bad config, no versions).
    pub failure: Option<String>,
}

/// A snapshot of every model the server knows. Shards hold an `Arc` of the
/// current one and read it without locks; the control plane replaces it.
#[derive(Debug, Clone, Default)]
pub struct ModelTable {
    pub models: BTreeMap<String, ModelEntry>,
    /// Names the start-up load could not poll because they are found in
    /// two or more repositories. They have no entry (requests find no such
    /// model and readiness ignores them, as in Triton), but they fail the
    /// start-up under `--exit-on-error` ("failed to load all models").
    pub not_polled: Vec<String>,
    /// Under `--model-namespacing`: the names several repositories hold,
    /// with how many. Their models sit under namespaced keys (reached by
    /// the ensembles of their own repository), and a direct request for
    /// the bare name is refused as ambiguous.
    pub ambiguous: BTreeMap<String, usize>,
}

/// Triton's text for a direct request naming a model that `count`
/// namespaces hold.
pub fn ambiguous_model(name: &str, count: usize) -> String {
    format!(
        "There are {count} identifiers of model '{name}' in global map, model namespace must be provided to resolve ambiguity."
    )
}

impl ModelTable {
    /// The version a request addresses: the given one, or the highest
    /// ready one when `version` is empty. Errors use Triton's phrasing,
    /// which clients search for.
    pub fn resolve(&self, name: &str, version: &str) -> Result<&Arc<ModelVersion>, InferError> {
        let entry = self.models.get(name).ok_or_else(|| self.unknown(name))?;
        if version.is_empty() {
            return entry
                .versions
                .values()
                .rev()
                .find(|v| v.state == ModelState::Ready)
                .and_then(|v| v.loaded.as_ref())
                .ok_or_else(|| {
                    let why = entry.failure.as_deref().or_else(|| {
                        entry.versions.values().rev().find_map(|v| match &v.state {
                            ModelState::Unavailable { reason } => Some(reason.as_str()),
                            _ => None,
                        })
                    });
                    InferError::unavailable(match why {
                        Some(why) => format!(
                            "Request for unknown model: '{name}' has no available versions ({why})"
                        ),
                        None => {
                            format!("Request for unknown model: '{name}' has no available versions")
                        }
                    })
                });
        }
        let not_found = || {
            let version = crate::types::clip(version);
            InferError::not_found(format!(
                "Request for unknown model: '{name}' version {version} is not found"
            ))
        };
        // Triton's texts for a version that is not a non-negative integer.
        let v = crate::error_texts::parse_model_version(version)?.ok_or_else(not_found)?;
        let entry = entry.versions.get(&v).ok_or_else(not_found)?;
        match (&entry.state, &entry.loaded) {
            (ModelState::Ready, Some(loaded)) => Ok(loaded),
            (ModelState::Unavailable { reason }, _) => Err(InferError::unavailable(format!(
                "Request for unknown model: '{name}' version {version} is not at ready state ({reason})"
            ))),
            _ => Err(InferError::unavailable(format!(
                "Request for unknown model: '{name}' version {version} is not at ready state"
            ))),
        }
    }

    /// Why a name with no entry is refused: ambiguous under namespacing
    /// (Triton's INVALID_ARG), else not found.
    pub fn unknown(&self, name: &str) -> InferError {
        let clipped = crate::types::clip(name);
        match self.ambiguous.get(name) {
            Some(&count) => InferError::invalid(ambiguous_model(&clipped, count)),
            None => InferError::not_found(format!(
                "Request for unknown model: '{clipped}' is not found"
            )),
        }
    }

    /// Versions of `name` that are ready, ascending.
    pub fn ready_versions(&self, name: &str) -> Vec<i64> {
        self.models.get(name).map_or_else(Vec::new, |m| {
            m.versions
                .values()
                .filter(|v| v.state == ModelState::Ready)
                .map(|v| v.version)
                .collect()
        })
    }

    /// Triton's strict readiness: every model known has versions, each
    /// READY or unloaded on purpose (a failed load, a model still loading
    /// or an ensemble missing a composing model is not ready).
    pub fn strictly_ready(&self) -> bool {
        self.not_ready().is_empty()
    }

    /// The models that keep [`Self::strictly_ready`] false, by name.
    pub fn not_ready(&self) -> Vec<String> {
        self.models
            .iter()
            .filter(|(_, m)| {
                m.failure.is_some()
                    || m.versions.is_empty()
                    || m.versions.values().any(|v| match &v.state {
                        ModelState::Ready => false,
                        ModelState::Unavailable { reason } => reason != UNLOADED,
                        _ => true,
                    })
            })
            .map(|(n, _)| n.clone())
            .collect()
    }
}
