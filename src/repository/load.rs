//! Loading models: config → backend → versions → instances placed on
//! shards. A model that fails is recorded with its reason and the others
//! load regardless.

use std::{
    collections::BTreeMap,
    path::Path,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc,
    },
};

use anyhow::{bail, Context};
use bytes::Bytes;
use futures::channel::oneshot;

use super::{ensemble, scan::version_folders, select_versions, ModelDir};
use crate::{
    backend::{backend_for, InstanceDevice, InstanceSpec, ModelFiles},
    compute::WorkerPlacement,
    config,
    metrics::ModelStats,
    model::{
        ExecutionPlace, InstanceInfo, IoSpec, ModelMetadata, ModelState, ModelTable, ModelVersion,
        VersionEntry,
    },
    proto::inference::{model_config::SchedulingChoice, model_instance_group::Kind, ModelConfig},
    scheduler::{
        self, host,
        sequence::{self, SequenceSpec},
        InstanceExecutor,
    },
    shard::{ShardControl, ShardId, Target},
    tuning::GpuPlacement,
};

#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// `--strict-model-config`: no auto-complete from model files.
    pub strict: bool,
    /// Intra-op threads per instance for backends with a thread pool.
    pub intra_op_threads: usize,
    /// `--model-load-allow-uploaded-python`: Python sent with a load
    /// request may run (native code in an upload never does).
    pub allow_uploaded_python: bool,
    /// `--model-load-retry-count`: a version whose load fails is loaded
    /// again this many times, at once (as Triton's load pool does).
    pub retry_count: u32,
    /// `--model-config-name`: `configs/<name>.pbtxt` replaces
    /// `config.pbtxt` in the model folders that have it.
    pub config_name: Option<String>,
    /// `--metrics-config summary_latencies=true`: models keep latency
    /// windows for the summary metrics.
    pub latency_summaries: bool,
    // issue 24: response cache
    /// The server's response cache (`--cache-config local,size=N`).
    pub response_cache: Option<Arc<crate::scheduler::ResponseCache>>,
    /// `--rate-limit execution_count`: the server's one limiter, which
    /// every loaded model registers its instances with.
    pub rate_limiter: Option<Arc<crate::scheduler::rate_limiter::RateLimiter>>,
    // issue 24: several repositories + namespacing
    /// `--model-namespacing`: models are kept apart by repository.
    pub namespacing: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            strict: false,
            intra_op_threads: 1,
            allow_uploaded_python: false,
            retry_count: 0,
            config_name: None,
            latency_summaries: false,
            response_cache: None,
            rate_limiter: None,
            namespacing: false,
        }
    }
}

/// The configuration file a model folder is loaded from: Triton's custom
/// configuration (`configs/<name>.pbtxt`) where `--model-config-name`
/// names one the folder has, else `config.pbtxt`.
pub fn config_path(model_dir: &Path, opts: &LoadOptions) -> std::path::PathBuf {
    if let Some(name) = &opts.config_name {
        let custom = model_dir.join("configs").join(format!("{name}.pbtxt"));
        if custom.is_file() {
            return custom;
        }
    }
    model_dir.join("config.pbtxt")
}

/// Chooses the owner shard of each model version's scheduler
/// (round-robin over the compute shards), where its compute workers may
/// run, and hands out scheduler keys unique within the server. Clones
/// share the cursor and the keys: loads running on threads of their own
/// each hold one.
#[derive(Debug, Clone)]
pub struct Placement {
    shard_count: usize,
    compute_shards: Vec<ShardId>,
    cursor: Arc<AtomicUsize>,
    next_key: Arc<AtomicU64>,
    /// Per shard: the CPUs its models' compute workers may use (the
    /// compute shards' CPUs on its NUMA node); empty = unpinned.
    worker_cpus: Vec<Vec<usize>>,
    worker_nice: i32,
    /// Compute workers' spin before parking, pipeline depth and reply hold
    /// (profile `[compute] spin_us`, `pipeline_depth`, `reply_hold_us`).
    worker_spin: std::time::Duration,
    worker_depth: usize,
    worker_hold: std::time::Duration,
    worker_slice: std::time::Duration,
    /// Where each usable GPU's instances go; empty without GPUs.
    gpus: Vec<GpuPlacement>,
}

impl Placement {
    pub fn new(shard_count: usize, compute_shards: Vec<ShardId>) -> Self {
        Self {
            shard_count,
            compute_shards,
            cursor: Arc::new(AtomicUsize::new(0)),
            next_key: Arc::new(AtomicU64::new(1)),
            worker_cpus: Vec::new(),
            worker_nice: 0,
            worker_spin: std::time::Duration::from_micros(
                crate::tuning::ComputeSection::DEFAULT_SPIN_US,
            ),
            worker_depth: crate::tuning::ComputeSection::DEFAULT_PIPELINE_DEPTH,
            worker_hold: std::time::Duration::from_micros(
                crate::tuning::ComputeSection::DEFAULT_REPLY_HOLD_US,
            ),
            worker_slice: std::time::Duration::from_micros(
                crate::tuning::ComputeSection::DEFAULT_SLICE_US,
            ),
            gpus: Vec::new(),
        }
    }

    /// The GPUs instances may use and where each one's instances go.
    pub fn with_gpus(mut self, gpus: Vec<GpuPlacement>) -> Self {
        self.gpus = gpus;
        self
    }

    /// The ids of the usable GPUs (CUDA ordinals).
    pub fn gpu_ids(&self) -> Vec<i32> {
        self.gpus.iter().map(|g| g.gpu).collect()
    }

    /// Where compute workers run: `worker_cpus[shard]` for models owned by
    /// `shard`, at nice value `nice`.
    pub fn with_workers(mut self, worker_cpus: Vec<Vec<usize>>, nice: i32) -> Self {
        self.worker_cpus = worker_cpus;
        self.worker_nice = nice;
        self
    }

    /// How compute workers take their work: `spin` before parking, up to
    /// `depth` batches handed ahead.
    pub fn with_worker_handoff(
        mut self,
        spin: std::time::Duration,
        depth: usize,
        hold: std::time::Duration,
    ) -> Self {
        self.worker_spin = spin;
        self.worker_depth = depth.max(1);
        self.worker_hold = hold;
        self
    }

    /// Compute workers yield their CPU after running `slice` back to back.
    pub fn with_worker_slice(mut self, slice: std::time::Duration) -> Self {
        self.worker_slice = slice;
        self
    }

    pub(crate) fn shard_count(&self) -> usize {
        self.shard_count
    }

    pub(crate) fn next(&mut self) -> Target {
        let shards = self.compute_shards.clone();
        self.next_among(&shards)
    }

    /// The next owner shard, round-robin over `shards` (the compute shards
    /// near a model's GPU, or all of them).
    fn next_among(&mut self, shards: &[ShardId]) -> Target {
        let turn = self.cursor.fetch_add(1, Ordering::Relaxed);
        let shard = shards.get(turn % shards.len().max(1)).copied().unwrap_or(0);
        let key = self.next_key.fetch_add(1, Ordering::Relaxed);
        Target { shard, key }
    }

    /// `owner` and the compute shards after it (wrapping), at most `width`
    /// in all: the shards of a version spread over several, each serving
    /// the same scheduler key.
    fn spread_from(&self, owner: Target, width: usize) -> Vec<Target> {
        let n = self.compute_shards.len();
        let Some(at) = self.compute_shards.iter().position(|&s| s == owner.shard) else {
            return vec![owner];
        };
        (0..width.min(n))
            .map(|i| Target {
                shard: self.compute_shards[(at + i) % n],
                key: owner.key,
            })
            .collect()
    }

    /// Where an instance's compute worker runs: near its GPU, else on the
    /// compute CPUs of its owner shard's NUMA node.
    fn worker_placement(&self, owner: ShardId, device: InstanceDevice) -> WorkerPlacement {
        let cpus = match device {
            InstanceDevice::Gpu(id) => self
                .gpus
                .iter()
                .find(|g| g.gpu == id)
                .map(|g| g.worker_cpus.clone()),
            InstanceDevice::Cpu => self.worker_cpus.get(owner).cloned(),
        };
        WorkerPlacement {
            cpus: cpus.unwrap_or_default(),
            nice: self.worker_nice,
            spin: self.worker_spin,
            depth: self.worker_depth,
            hold: self.worker_hold,
            slice: self.worker_slice,
        }
    }

    /// The owner shard of a model whose instances are on `devices`: near
    /// its first GPU, else any compute shard.
    fn owner_for(&mut self, devices: &[InstanceDevice]) -> Target {
        let near = devices.iter().find_map(|d| match d {
            InstanceDevice::Gpu(id) => self
                .gpus
                .iter()
                .find(|g| g.gpu == *id)
                .map(|g| g.shards.clone()),
            InstanceDevice::Cpu => None,
        });
        match near {
            Some(shards) if !shards.is_empty() => self.next_among(&shards),
            _ => self.next(),
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
            Err(reason) if reason == super::scan::DUPLICATE => {
                tracing::error!(
                    model = %name,
                    "failed to poll model: not unique across all model repositories"
                );
                table.not_polled.push(name.clone());
                continue;
            }
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
        let version_dir = dir.path.join(version.to_string());
        let mut loaded = match super::scan::broken_link(&version_dir) {
            Some(reason) => Err(anyhow::anyhow!(reason)),
            None => load_version(dir, &config, version, opts, placement, send),
        };
        for attempt in 1..=opts.retry_count {
            let Err(e) = &loaded else { break };
            tracing::warn!(model = %dir.name, version, attempt, error = %format!("{e:#}"), "load failed; retrying (--model-load-retry-count)");
            loaded = load_version(dir, &config, version, opts, placement, send);
        }
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
    let path = config_path(&dir.path, opts);
    if let Some(reason) = super::scan::broken_link(&path) {
        bail!("{reason}");
    }
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
    config::complete_backend_fields(&mut config, &dir.path);
    if config.name.is_empty() {
        config.name = dir.model_name().to_string();
    } else if config.name != dir.model_name() {
        bail!(
            "config name '{}' does not match the model folder name '{}'",
            config.name,
            dir.model_name()
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
    config::resolve_instance_kinds(
        &mut config,
        &placement.gpu_ids(),
        backend.supports_gpu(),
        backend.name(),
    )?;
    sequence::fill_defaults(&mut config);
    let sequence = SequenceSpec::from_config(&config, &dir.path)?;
    let io = IoSpec::from_config(&config, &dir.path)?;
    let warmup = super::warmup::samples(&config, &dir.path, &io, sequence.is_some())?;
    let platform = if config.platform.is_empty() {
        config.backend.clone()
    } else {
        config.platform.clone()
    };
    let metadata = ModelMetadata::new(&config.name, &platform, &io);
    let config_json = Bytes::from(serde_json::to_vec(&config::model_config_to_json(&config))?);

    let devices = instance_devices(&config);
    let count = devices.len();
    // A decoupled backend may block on a slow client: never on a shard.
    let inline = backend.runs_inline(&config) && !config::is_decoupled(&config);
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
    let on_gpu = devices.iter().any(|d| matches!(d, InstanceDevice::Gpu(_)));
    if on_gpu && place == ExecutionPlace::Inline {
        bail!("GPU instances run on compute workers: shardserve_execution \"inline\" is refused");
    }
    let max_batch = config.max_batch_size.max(0) as usize;
    let done_bell = Arc::new(futures::task::AtomicWaker::new());
    // Refused before any instance is created; with `--rate-limit off` the
    // `rate_limiter` of the instance groups is ignored, as in Triton.
    let limits = match &opts.rate_limiter {
        Some(limiter) => Some(
            limiter
                .register(&config, done_bell.clone())
                .map_err(anyhow::Error::msg)?,
        ),
        None => None,
    };
    let mut created = Vec::with_capacity(count);
    for (index, &device) in devices.iter().enumerate() {
        let spec = InstanceSpec {
            name: format!("{}_{index}", config.name),
            index,
            intra_op_threads: opts.intra_op_threads,
            device,
        };
        let instance = backend
            .create_instance(&config, &files, &spec)
            .with_context(|| format!("creating instance {}", spec.name))?;
        created.push((spec.name, instance));
    }
    let target = placement.owner_for(&devices);
    let spread = match spread_width(&config, place, count, sequence.is_some(), limits.is_some())? {
        Some(width) => placement.spread_from(target, width),
        None => Vec::new(),
    };
    if spread.len() > 1 {
        tracing::info!(
            model = %config.name,
            version,
            shards = ?spread.iter().map(|t| t.shard).collect::<Vec<_>>(),
            "{count} inline instances spread over {} shards, each with its own queue",
            spread.len()
        );
    }
    let response_cache =
        crate::scheduler::response_cache::for_model(&config, opts.response_cache.as_ref());
    let model = Arc::new(ModelVersion {
        name: config.name.clone(),
        version,
        version_str: version.to_string(),
        config: Arc::new(config),
        config_json,
        io,
        metadata,
        scheduler: target,
        spread: if spread.len() > 1 { spread } else { Vec::new() },
        instances: created
            .iter()
            .map(|(name, _)| InstanceInfo {
                name: name.clone(),
                place,
            })
            .collect(),
        sequence,
        // One counter block per shard, then one per compute worker.
        stats: Arc::new(ModelStats::with_summaries(
            placement.shard_count + count,
            max_batch,
            opts.latency_summaries,
        )),
        ensemble: None,
        response_cache,
        namespace: dir.namespace.clone(),
    });
    let mut executors = Vec::with_capacity(created.len());
    for (index, (name, mut instance)) in created.into_iter().enumerate() {
        instance.attach_statistics(model.stats.clone(), placement.shard_count + index);
        if !warmup.is_empty() {
            // Before the instance serves: the version is published READY
            // only once every instance has run every sample.
            scheduler::warmup::warm_up(
                instance.as_mut(),
                &model,
                placement.shard_count + index,
                &warmup,
            )
            .with_context(|| format!("warming up instance {name}"))?;
        }
        executors.push(match place {
            ExecutionPlace::Inline => InstanceExecutor::Inline(instance),
            ExecutionPlace::Worker => InstanceExecutor::spawn_worker(
                name.clone(),
                model.clone(),
                placement.shard_count + index,
                instance,
                placement.worker_placement(target.shard, devices[index]),
                done_bell.clone(),
            )
            .with_context(|| format!("starting the compute thread of instance {name}"))?,
        });
    }
    // One scheduler per target: the owner's with every instance (and the
    // rate limiter's grant), or instance i on the i-th spread shard, each
    // the default scheduler over its own inline instances (`spread_width`
    // refuses rate-limited models).
    let targets = model.schedulers();
    let mut shares: Vec<Vec<InstanceExecutor>> = targets.iter().map(|_| Vec::new()).collect();
    for (index, executor) in executors.into_iter().enumerate() {
        shares[index % targets.len()].push(executor);
    }
    let mut limits = limits;
    let mut acks = Vec::with_capacity(targets.len());
    for (i, (to, share)) in targets.iter().zip(shares).enumerate() {
        let (installed, ack) = oneshot::channel();
        // The owner's keeps the bell its workers and the limiter ring.
        let bell = match i {
            0 => done_bell.clone(),
            _ => Arc::new(futures::task::AtomicWaker::new()),
        };
        send(
            to.shard,
            ShardControl::Run(host::install_task(
                to.key,
                model.clone(),
                share,
                bell,
                limits.take(),
                installed,
            )),
        )?;
        acks.push(ack);
    }
    // The table that names these schedulers is published only once their
    // shards have them, so no request can reach a shard before them.
    for ack in acks {
        futures::executor::block_on(ack).context("a shard stopped before installing a model")?;
    }
    Ok(model)
}

/// Over how many shards a version's instances spread (`None`: all on the
/// owner). Only inline instances under the default scheduler qualify:
/// requests there need no queue shared across instances. The dynamic
/// batcher (batches formed from one queue), the sequence batcher (a
/// sequence's state lives with its slot), the rate limiter (one count of
/// resources) and compute workers (threads of their own already) keep
/// Triton's one queue. The config parameter `shardserve_instance_placement`
/// says "spread" (the default) or "owner".
fn spread_width(
    config: &ModelConfig,
    place: ExecutionPlace,
    count: usize,
    sequence: bool,
    rate_limited: bool,
) -> anyhow::Result<Option<usize>> {
    let wanted = match config
        .parameters
        .get("shardserve_instance_placement")
        .map(|p| p.string_value.as_str())
    {
        None | Some("spread") => true,
        Some("owner") => false,
        Some(other) => bail!(
            "parameter shardserve_instance_placement must be \"spread\" or \"owner\", not {other:?}"
        ),
    };
    let default_scheduler = !sequence
        && !matches!(
            config.scheduling_choice,
            Some(SchedulingChoice::DynamicBatching(_))
        );
    Ok((wanted
        && place == ExecutionPlace::Inline
        && count > 1
        && default_scheduler
        && !rate_limited)
        .then_some(count))
}

/// The device of every instance, group by group: `count` instances of a
/// CPU group, `count` per listed GPU of a GPU group (Triton's rule); no
/// group means one CPU instance. Kinds are resolved by then.
pub(crate) fn instance_devices(config: &ModelConfig) -> Vec<InstanceDevice> {
    if config.instance_group.is_empty() {
        return vec![InstanceDevice::Cpu];
    }
    let mut devices = Vec::new();
    for group in &config.instance_group {
        let count = group.count.max(1) as usize;
        if group.kind == Kind::Gpu as i32 {
            for _ in 0..count {
                devices.extend(group.gpus.iter().map(|&g| InstanceDevice::Gpu(g)));
            }
        } else {
            devices.extend(std::iter::repeat_n(InstanceDevice::Cpu, count));
        }
    }
    devices
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_support::config;

    #[test]
    fn gpu_groups_make_count_instances_per_gpu() {
        let mut c = config(
            "instance_group [ { count: 2 kind: KIND_GPU gpus: [ 0, 1 ] }, { count: 1 kind: KIND_CPU } ]",
        );
        crate::config::fill_defaults(&mut c);
        use InstanceDevice::*;
        assert_eq!(
            instance_devices(&c),
            vec![Gpu(0), Gpu(1), Gpu(0), Gpu(1), Cpu]
        );
        assert_eq!(instance_devices(&config("")), vec![Cpu]);
    }

    #[test]
    fn inline_instances_spread_from_their_owner_over_the_compute_shards() {
        let p = Placement::new(4, vec![1, 2, 3]);
        let owner = Target { shard: 3, key: 7 };
        let shards = |w| {
            p.spread_from(owner, w)
                .iter()
                .map(|t: &Target| (t.shard, t.key))
                .collect::<Vec<_>>()
        };
        assert_eq!(shards(2), vec![(3, 7), (1, 7)]);
        assert_eq!(
            shards(8),
            vec![(3, 7), (1, 7), (2, 7)],
            "one per shard at most"
        );

        let inline = ExecutionPlace::Inline;
        let width = |c: &str, place, count, seq, limited| {
            spread_width(&config(c), place, count, seq, limited).unwrap()
        };
        assert_eq!(width("", inline, 4, false, false), Some(4));
        assert_eq!(width("", inline, 1, false, false), None);
        assert_eq!(width("", ExecutionPlace::Worker, 4, false, false), None);
        assert_eq!(width("", inline, 4, true, false), None, "sequence batcher");
        assert_eq!(width("", inline, 4, false, true), None, "rate limiter");
        assert_eq!(width("dynamic_batching { }", inline, 4, false, false), None);
        let owner = r#"parameters { key: "shardserve_instance_placement" value: { string_value: "owner" } }"#;
        assert_eq!(width(owner, inline, 4, false, false), None);
        let bad =
            r#"parameters { key: "shardserve_instance_placement" value: { string_value: "x" } }"#;
        assert!(spread_width(&config(bad), inline, 4, false, false).is_err());
    }

    #[test]
    fn gpu_instances_are_owned_and_run_near_their_gpu() {
        let gpus = vec![
            GpuPlacement {
                gpu: 0,
                shards: vec![1],
                worker_cpus: vec![1, 2],
            },
            GpuPlacement {
                gpu: 1,
                shards: vec![4, 5],
                worker_cpus: vec![4, 5],
            },
        ];
        let mut p = Placement::new(6, vec![0, 1, 2, 3, 4, 5])
            .with_workers(vec![vec![0, 1, 2]; 6], 10)
            .with_gpus(gpus);
        assert_eq!(p.gpu_ids(), vec![0, 1]);
        let t = p.owner_for(&[InstanceDevice::Gpu(1), InstanceDevice::Gpu(0)]);
        assert!([4, 5].contains(&t.shard), "{t:?}");
        assert_eq!(
            p.worker_placement(t.shard, InstanceDevice::Gpu(0)).cpus,
            vec![1, 2]
        );
        assert_eq!(
            p.worker_placement(3, InstanceDevice::Cpu).cpus,
            vec![0, 1, 2]
        );
        let cpu_owner = p.owner_for(&[InstanceDevice::Cpu]);
        assert!(cpu_owner.shard < 6);
    }
}
