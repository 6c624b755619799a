//! Loading models: config → backend → versions → instances placed on
//! shards. A model that fails is recorded with its reason and the others
//! load regardless.

use std::{collections::BTreeMap, path::Path, sync::Arc};

use anyhow::{bail, Context};
use bytes::Bytes;
use futures::channel::oneshot;

use super::{scan::version_folders, select_versions, ModelDir};
use crate::{
    backend::{backend_for, InstanceSpec, ModelFiles},
    compute::WorkerPlacement,
    config,
    metrics::ModelStats,
    model::{
        ExecutionPlace, InstanceInfo, IoSpec, ModelMetadata, ModelState, ModelTable, ModelVersion,
        VersionEntry,
    },
    proto::inference::ModelConfig,
    scheduler::{
        ensemble,
        sequence::{self, SequenceSpec},
        InstanceExecutor,
    },
    shard::{ShardControl, ShardId, Target},
};

#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// `--strict-model-config`: no auto-complete from model files.
    pub strict: bool,
    /// Intra-op threads per instance for backends with a thread pool.
    pub intra_op_threads: usize,
}

/// Chooses the owner shard of each model version's scheduler
/// (round-robin over the compute shards), where its compute workers may
/// run, and hands out scheduler keys unique within the server.
#[derive(Debug)]
pub struct Placement {
    shard_count: usize,
    compute_shards: Vec<ShardId>,
    cursor: usize,
    next_key: u64,
    /// Per shard: the CPUs its models' compute workers may use (the
    /// compute shards' CPUs on its NUMA node); empty = unpinned.
    worker_cpus: Vec<Vec<usize>>,
    worker_nice: i32,
}

impl Placement {
    pub fn new(shard_count: usize, compute_shards: Vec<ShardId>) -> Self {
        Self {
            shard_count,
            compute_shards,
            cursor: 0,
            next_key: 1,
            worker_cpus: Vec::new(),
            worker_nice: 0,
        }
    }

    /// Where compute workers run: `worker_cpus[shard]` for models owned by
    /// `shard`, at nice value `nice`.
    pub fn with_workers(mut self, worker_cpus: Vec<Vec<usize>>, nice: i32) -> Self {
        self.worker_cpus = worker_cpus;
        self.worker_nice = nice;
        self
    }

    pub(crate) fn shard_count(&self) -> usize {
        self.shard_count
    }

    pub(crate) fn next(&mut self) -> Target {
        let shard = self
            .compute_shards
            .get(self.cursor % self.compute_shards.len().max(1))
            .copied()
            .unwrap_or(0);
        self.cursor += 1;
        let key = self.next_key;
        self.next_key += 1;
        Target { shard, key }
    }

    fn worker_placement(&self, owner: ShardId) -> WorkerPlacement {
        WorkerPlacement {
            cpus: self.worker_cpus.get(owner).cloned().unwrap_or_default(),
            nice: self.worker_nice,
        }
    }
}

/// Whether a model's instances run inline on their owner shard: the
/// backend's choice unless the config parameter `shardserve_execution`
/// says "inline" or "worker".
fn execution_place(config: &ModelConfig, backend_inline: bool) -> anyhow::Result<ExecutionPlace> {
    match config
        .parameters
        .get("shardserve_execution")
        .map(|p| p.string_value.as_str())
    {
        None => Ok(if backend_inline {
            ExecutionPlace::Inline
        } else {
            ExecutionPlace::Worker
        }),
        Some("inline") => Ok(ExecutionPlace::Inline),
        Some("worker") => Ok(ExecutionPlace::Worker),
        Some(other) => {
            bail!("parameter shardserve_execution must be \"inline\" or \"worker\", not {other:?}")
        }
    }
}

/// Sends a control message to a shard.
pub type SendControl<'a> = &'a dyn Fn(ShardId, ShardControl) -> anyhow::Result<()>;

/// Sends `msg` to shard `shard` through its control channel.
pub fn send_control(
    control: &[futures::channel::mpsc::UnboundedSender<ShardControl>],
    shard: ShardId,
    msg: ShardControl,
) -> anyhow::Result<()> {
    control
        .get(shard)
        .context("instance placed on a shard that does not exist")?
        .unbounded_send(msg)
        .map_err(|_| anyhow::anyhow!("shard {shard} stopped"))
}

/// Loads every model found (or only `only`, in explicit control mode) and
/// returns the table describing them, failures included.
pub fn load_repository(
    found: &BTreeMap<String, Result<ModelDir, String>>,
    only: Option<&[String]>,
    opts: &LoadOptions,
    placement: &mut Placement,
    send: SendControl<'_>,
) -> ModelTable {
    let mut table = ModelTable::default();
    if let Some(names) = only {
        for name in names.iter().filter(|n| !found.contains_key(*n)) {
            tracing::error!(model = %name, "failed to load: no such model in the repository");
            table.models.insert(
                name.clone(),
                crate::model::ModelEntry {
                    failure: Some(format!(
                        "failed to load '{name}': no such model in the repository"
                    )),
                    ..Default::default()
                },
            );
        }
    }
    let mut ensembles = Vec::new();
    for (name, dir) in found {
        if only.is_some_and(|names| !names.contains(name)) {
            continue;
        }
        let entry = match dir {
            Ok(dir) if ensemble::is_ensemble(dir, opts) => {
                ensembles.push(dir);
                continue;
            }
            Ok(dir) => load_model(dir, opts, placement, send),
            Err(reason) => failed(name, reason),
        };
        table.models.insert(name.clone(), entry);
    }
    // Ensembles need their composing models loaded first.
    ensemble::load_ensembles(&ensembles, opts, &mut table, placement);
    table
}

fn failed(name: &str, reason: &str) -> crate::model::ModelEntry {
    tracing::error!(model = %name, %reason, "failed to load");
    crate::model::ModelEntry {
        failure: Some(format!("failed to load '{name}': {reason}")),
        ..Default::default()
    }
}

/// Loads one model folder; every error becomes the model's failure reason.
pub fn load_model(
    dir: &ModelDir,
    opts: &LoadOptions,
    placement: &mut Placement,
    send: SendControl<'_>,
) -> crate::model::ModelEntry {
    load_model_with(dir, None, opts, placement, send)
}

/// [`load_model`] with a configuration that replaces `config.pbtxt` (the
/// repository API's `config` override).
pub fn load_model_with(
    dir: &ModelDir,
    config_override: Option<ModelConfig>,
    opts: &LoadOptions,
    placement: &mut Placement,
    send: SendControl<'_>,
) -> crate::model::ModelEntry {
    let config = match config_override {
        Some(c) => named(c, dir),
        None => read_config(dir, opts),
    };
    let prepared = config.and_then(|config| {
        let versions =
            select_versions(config.version_policy.as_ref(), &version_folders(&dir.path)?);
        if versions.is_empty() {
            bail!(
                "no version folder matches the version policy in {}",
                dir.path.display()
            );
        }
        Ok((config, versions))
    });
    let (config, versions) = match prepared {
        Ok(p) => p,
        Err(e) => return failed(&dir.name, &format!("{e:#}")),
    };
    let mut entry = crate::model::ModelEntry::default();
    for version in versions {
        let loaded = load_version(dir, &config, version, opts, placement, send);
        if let Ok(model) = &loaded {
            tracing::info!(model = %dir.name, version, instances = model.instances.len(), "loaded");
        }
        entry
            .versions
            .insert(version, version_entry(&dir.name, version, loaded));
    }
    entry
}

/// A version's table entry from its load: READY, or UNAVAILABLE with the
/// reason (logged).
pub(crate) fn version_entry(
    name: &str,
    version: i64,
    loaded: anyhow::Result<Arc<ModelVersion>>,
) -> VersionEntry {
    match loaded {
        Ok(model) => VersionEntry {
            version,
            state: ModelState::Ready,
            loaded: Some(model),
        },
        Err(e) => {
            let reason = format!("failed to load '{name}' version {version}: {e:#}");
            tracing::error!(model = %name, version, %reason, "failed to load");
            VersionEntry {
                version,
                state: ModelState::Unavailable { reason },
                loaded: None,
            }
        }
    }
}

/// Reads and parses `config.pbtxt`; without one (and not strict), an ONNX
/// model gets a minimal config that auto-complete fills in, as in Triton.
pub(crate) fn read_config(dir: &ModelDir, opts: &LoadOptions) -> anyhow::Result<ModelConfig> {
    let path = dir.path.join("config.pbtxt");
    let config = if path.exists() {
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        config::parse_model_config(&text).with_context(|| format!("invalid {}", path.display()))?
    } else if !opts.strict && has_onnx_file(&dir.path) {
        ModelConfig {
            platform: "onnxruntime_onnx".into(),
            ..Default::default()
        }
    } else {
        bail!("{} not found", path.display());
    };
    named(config, dir)
}

/// Names the config after its folder (or checks that it matches), then
/// refuses what this server does not support.
fn named(mut config: ModelConfig, dir: &ModelDir) -> anyhow::Result<ModelConfig> {
    if config.name.is_empty() {
        config.name = dir.name.clone();
    } else if config.name != dir.name {
        bail!(
            "config name '{}' does not match the model folder name '{}'",
            config.name,
            dir.name
        );
    }
    config::check_supported(&config)?;
    Ok(config)
}

fn has_onnx_file(model_dir: &Path) -> bool {
    version_folders(model_dir)
        .unwrap_or_default()
        .iter()
        .any(|v| model_dir.join(v.to_string()).join("model.onnx").is_file())
}

fn load_version(
    dir: &ModelDir,
    base: &ModelConfig,
    version: i64,
    opts: &LoadOptions,
    placement: &mut Placement,
    send: SendControl<'_>,
) -> anyhow::Result<Arc<ModelVersion>> {
    let files = ModelFiles {
        model_dir: dir.path.clone(),
        version_dir: dir.path.join(version.to_string()),
        version,
    };
    let backend = backend_for(base)?;
    let mut config = base.clone();
    if !opts.strict {
        backend
            .auto_complete(&mut config, &files)
            .context("auto-complete")?;
        // Auto-complete may add scheduling (ONNX adds a dynamic batcher):
        // what it adds must be supported too.
        config::check_supported(&config)?;
    }
    config::validate(&config)?;
    config::fill_defaults(&mut config);
    sequence::fill_defaults(&mut config);
    let sequence = SequenceSpec::from_config(&config, &dir.path)?;
    let io = IoSpec::from_config(&config, &dir.path)?;
    let platform = if config.platform.is_empty() {
        config.backend.clone()
    } else {
        config.platform.clone()
    };
    let metadata = ModelMetadata::new(&config.name, &platform, &io);
    let config_json = Bytes::from(serde_json::to_vec(&config::model_config_to_json(&config))?);

    let count = instance_count(&config);
    // A decoupled backend may block on a slow client: never on a shard.
    let inline = backend.runs_inline(&config) && !crate::scheduler::is_decoupled(&config);
    let place = match execution_place(&config, inline)? {
        ExecutionPlace::Inline if backend.needs_worker() => {
            tracing::warn!(
                "model '{}': backend '{}' always runs on a compute worker (shardserve_execution \"inline\" ignored)",
                config.name,
                backend.name()
            );
            ExecutionPlace::Worker
        }
        place => place,
    };
    let max_batch = config.max_batch_size.max(0) as usize;
    let mut created = Vec::with_capacity(count);
    for index in 0..count {
        let spec = InstanceSpec {
            name: format!("{}_{index}", config.name),
            index,
            intra_op_threads: opts.intra_op_threads,
        };
        let instance = backend
            .create_instance(&config, &files, &spec)
            .with_context(|| format!("creating instance {}", spec.name))?;
        created.push((spec.name, instance));
    }
    let target = placement.next();
    let model = Arc::new(ModelVersion {
        name: config.name.clone(),
        version,
        version_str: version.to_string(),
        config: Arc::new(config),
        config_json,
        io,
        metadata,
        scheduler: target,
        instances: created
            .iter()
            .map(|(name, _)| InstanceInfo {
                name: name.clone(),
                place,
            })
            .collect(),
        sequence,
        // One counter block per shard, then one per compute worker.
        stats: Arc::new(ModelStats::new(placement.shard_count + count, max_batch)),
        ensemble: None,
    });
    let done_bell = Arc::new(futures::task::AtomicWaker::new());
    let mut executors = Vec::with_capacity(created.len());
    for (index, (name, instance)) in created.into_iter().enumerate() {
        executors.push(match place {
            ExecutionPlace::Inline => InstanceExecutor::Inline(instance),
            ExecutionPlace::Worker => InstanceExecutor::spawn_worker(
                name.clone(),
                model.clone(),
                placement.shard_count + index,
                instance,
                placement.worker_placement(target.shard),
                done_bell.clone(),
            )
            .with_context(|| format!("starting the compute thread of instance {name}"))?,
        });
    }
    let (installed, ack) = oneshot::channel();
    send(
        target.shard,
        ShardControl::Install {
            key: target.key,
            model: model.clone(),
            executors,
            done_bell,
            installed,
        },
    )?;
    // The table that names this scheduler is published only once its
    // owner has it, so no request can reach a shard before it.
    futures::executor::block_on(ack).context("a shard stopped before installing a model")?;
    Ok(model)
}

/// Total instances over all instance groups; no group means one instance.
fn instance_count(config: &ModelConfig) -> usize {
    if config.instance_group.is_empty() {
        return 1;
    }
    config
        .instance_group
        .iter()
        .map(|g| g.count.max(1) as usize)
        .sum()
}
