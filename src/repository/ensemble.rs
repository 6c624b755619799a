//! Wiring ensembles at load (control plane; the scheduler only runs the
//! compiled plan), after every other model of the repository: an
//! ensemble has no backend and no instances, and its plan is compiled
//! against the composing models already in the table. Ensembles made of
//! ensembles load in dependency order; a circular dependency fails every
//! ensemble on it, with Triton's message.

use std::{collections::BTreeSet, sync::Arc};

use bytes::Bytes;

use super::{
    read_config, select_versions, version_entry, version_folders, LoadOptions, ModelDir, Placement,
};
use crate::{
    config,
    metrics::ModelStats,
    model::{IoSpec, ModelEntry, ModelMetadata, ModelTable, ModelVersion},
    proto::inference::{model_config::SchedulingChoice, ModelConfig},
    scheduler::ensemble::{graph, plan},
};

/// Whether the folder holds an ensemble (its config says so). A config that
/// cannot be read is not one: the ordinary loader reports it.
pub fn is_ensemble(dir: &ModelDir, opts: &LoadOptions) -> bool {
    read_config(dir, opts).is_ok_and(|c| is_ensemble_config(&c))
}

fn is_ensemble_config(config: &ModelConfig) -> bool {
    config.platform == "ensemble"
        || matches!(
            config.scheduling_choice,
            Some(crate::proto::inference::model_config::SchedulingChoice::EnsembleScheduling(_))
        )
}

/// The models an ensemble folder's steps name; `None` when the folder is
/// not an ensemble (or its config cannot be read).
pub fn composing_of(dir: &ModelDir, opts: &LoadOptions) -> Option<BTreeSet<String>> {
    read_config(dir, opts)
        .ok()
        .filter(is_ensemble_config)
        .map(|c| composing_names(&c))
}

fn composing_names(config: &ModelConfig) -> BTreeSet<String> {
    graph::steps(config)
        .map(|steps| steps.iter().map(|s| s.model_name.clone()).collect())
        .unwrap_or_default()
}

/// Loads `dirs` (ensembles) into `table`, each after the ensembles it
/// uses.
pub fn load_ensembles(
    dirs: &[&ModelDir],
    opts: &LoadOptions,
    table: &mut ModelTable,
    placement: &mut Placement,
) {
    let mut pending = Vec::new();
    for dir in dirs {
        match read_config(dir, opts) {
            Ok(config) => pending.push((*dir, config)),
            Err(e) => {
                let entry = failed(&dir.name, &format!("{e:#}"));
                table.models.insert(dir.name.clone(), entry);
            }
        }
    }
    while !pending.is_empty() {
        let waiting: BTreeSet<String> = pending.iter().map(|(d, _)| d.name.clone()).collect();
        let (now, later): (Vec<_>, Vec<_>) = pending
            .into_iter()
            .partition(|(_, c)| composing_names(c).is_disjoint(&waiting));
        if now.is_empty() {
            for (dir, config) in later {
                let uses: Vec<String> = composing_names(&config)
                    .intersection(&waiting)
                    .cloned()
                    .collect();
                let reason = format!(
                    "circular dependency between ensembles: {} -> ... -> {} -> {}",
                    dir.name,
                    uses.join(", "),
                    dir.name
                );
                table
                    .models
                    .insert(dir.name.clone(), failed(&dir.name, &reason));
            }
            break;
        }
        for (dir, config) in now {
            let entry = load_ensemble(dir, config, opts, table, placement);
            table.models.insert(dir.name.clone(), entry);
        }
        pending = later;
    }
}

fn failed(name: &str, reason: &str) -> ModelEntry {
    tracing::error!(model = %name, %reason, "failed to load");
    ModelEntry {
        failure: Some(format!("failed to load '{name}': {reason}")),
        ..Default::default()
    }
}

fn load_ensemble(
    dir: &ModelDir,
    mut config: ModelConfig,
    opts: &LoadOptions,
    table: &ModelTable,
    placement: &mut Placement,
) -> ModelEntry {
    let checked = graph::validate(&config)
        .and_then(|()| config::validate(&config))
        .and_then(|()| {
            let versions =
                select_versions(config.version_policy.as_ref(), &version_folders(&dir.path)?);
            if versions.is_empty() {
                anyhow::bail!(
                    "no version folder matches the version policy in {}",
                    dir.path.display()
                );
            }
            Ok(versions)
        });
    let versions = match checked {
        Ok(v) => v,
        Err(e) => return failed(&dir.name, &format!("{e:#}")),
    };
    // Triton's defaults, less the instance group an ensemble cannot have.
    config::fill_defaults(&mut config);
    config.instance_group.clear();
    let mut entry = ModelEntry::default();
    for version in versions {
        let version_dir = dir.path.join(version.to_string());
        let loaded = match super::broken_link(&version_dir) {
            Some(reason) => Err(anyhow::anyhow!(reason)),
            None => load_version(dir, &config, version, opts, table, placement),
        };
        if let Ok(model) = &loaded {
            tracing::info!(model = %dir.name, version, steps = model.ensemble.as_ref().map_or(0, |p| p.steps.len()), "loaded ensemble");
        }
        entry
            .versions
            .insert(version, version_entry(&dir.name, version, loaded));
    }
    entry
}

/// The ensemble's configuration with each step naming, where the
/// ensemble's own repository holds a copy of a name several repositories
/// hold (namespacing on), that copy's table key: as in Triton, a step
/// resolves in its ensemble's namespace first.
fn in_namespace(config: &ModelConfig, dir: &ModelDir, table: &ModelTable) -> ModelConfig {
    let mut config = config.clone();
    let Some(namespace) = dir.namespace.as_deref() else {
        return config;
    };
    if let Some(SchedulingChoice::EnsembleScheduling(scheduling)) =
        config.scheduling_choice.as_mut()
    {
        for step in &mut scheduling.step {
            let key = super::namespaced_key(&step.model_name, namespace);
            if table.models.contains_key(&key) {
                step.model_name = key;
            }
        }
    }
    config
}

fn load_version(
    dir: &ModelDir,
    config: &ModelConfig,
    version: i64,
    opts: &LoadOptions,
    table: &ModelTable,
    placement: &mut Placement,
) -> anyhow::Result<Arc<ModelVersion>> {
    let plan = plan::compile(&in_namespace(config, dir, table), version, table)?;
    // As Triton: the ensemble is decoupled exactly when a decoupled step
    // feeds it, whatever its own config said.
    let mut config = config.clone();
    if plan.decoupled || config.model_transaction_policy.is_some() {
        config
            .model_transaction_policy
            .get_or_insert_with(Default::default)
            .decoupled = plan.decoupled;
    }
    let config = &config;
    let io = IoSpec::from_config(config, &dir.path)?;
    let metadata = ModelMetadata::new(&config.name, "ensemble", &io);
    let config_json = Bytes::from(serde_json::to_vec(&config::model_config_to_json(config))?);
    let max_batch = config.max_batch_size.max(0) as usize;
    Ok(Arc::new(ModelVersion {
        name: config.name.clone(),
        version,
        version_str: version.to_string(),
        config: Arc::new(config.clone()),
        config_json,
        io,
        metadata,
        // Only the key is used: requests find the ensemble's statistics by
        // it; no scheduler is installed (the receiving shard runs the plan).
        scheduler: placement.next(),
        spread: Vec::new(),
        instances: Vec::new(),
        sequence: None,
        stats: Arc::new(ModelStats::new(placement.shard_count(), max_batch)),
        ensemble: Some(Arc::new(plan)),
        // An ensemble enabling the cache is cached whole, at the top level.
        response_cache: crate::scheduler::response_cache::for_model(
            config,
            opts.response_cache.as_ref(),
        ),
        namespace: dir.namespace.clone(),
    }))
}
