//! [`CapiBackend`]: the server's `Backend` that loads a model through a
//! backend library, over the layers below (`backend`, `model`,
//! `instance`).
//!
//! Order of a load, as Triton's: the backend library is loaded and
//! initialized (once per process), `TRITONBACKEND_ModelInitialize` runs
//! (in `auto_complete` when auto-complete is on, so `ModelSetConfig`
//! feeds the configuration the server then validates; else with the
//! first instance), then each `TRITONBACKEND_ModelInstanceInitialize`.

use std::sync::{Arc, Mutex};

use anyhow::{bail, Context};

use super::{backend as lib, instance::CapiInstance, model::TRITONBACKEND_Model};
use crate::{
    backend::{Backend, InstanceSpec, ModelFiles, ModelInstance},
    config::model_config_from_json,
    proto::inference::ModelConfig,
};

/// A model served by a backend library. Created per model version load
/// (`backend_for`), so it also carries that version's
/// `TRITONBACKEND_Model` between `auto_complete` and the instances.
pub struct CapiBackend {
    name: &'static str,
    backend_name: String,
    runtime: String,
    model: Mutex<Option<Arc<TRITONBACKEND_Model>>>,
}

impl CapiBackend {
    pub fn new(config: &ModelConfig) -> anyhow::Result<Self> {
        let backend_name = if config.backend.is_empty() {
            config.platform.clone()
        } else {
            config.backend.clone()
        };
        if backend_name.is_empty()
            || !backend_name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
            || backend_name.starts_with('.')
        {
            bail!(
                "model '{}' names backend {backend_name:?}, which is not a valid backend name",
                config.name
            );
        }
        Ok(Self {
            name: intern(&backend_name),
            backend_name,
            runtime: config.runtime.clone(),
            model: Mutex::new(None),
        })
    }

    /// This version's model, initialized on first use.
    fn model(
        &self,
        config: &ModelConfig,
        files: &ModelFiles,
        auto_complete: bool,
    ) -> anyhow::Result<Arc<TRITONBACKEND_Model>> {
        let mut slot = self.model.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = slot.as_ref() {
            return Ok(m.clone());
        }
        python_model_file_exists(&self.backend_name, config, files)?;
        let path = lib::find_library(
            &self.backend_name,
            &self.runtime,
            &files.model_dir,
            &files.version_dir,
        )?;
        let backend = lib::load(&self.backend_name, &path, auto_complete)?;
        let model = TRITONBACKEND_Model::initialize(backend, config, files, auto_complete)
            .with_context(|| format!("backend '{}'", self.backend_name))?;
        *slot = Some(model.clone());
        Ok(model)
    }
}

/// Triton's Python backend (2.51) starts a stub that exits at once when the
/// model file is missing, and then waits for the stub's first message
/// forever. Triton's core checks the file of Python-based backends before
/// the backend runs; so do we, with the stub's own words.
fn python_model_file_exists(
    backend: &str,
    config: &ModelConfig,
    files: &ModelFiles,
) -> anyhow::Result<()> {
    if backend != "python" {
        return Ok(());
    }
    let file = match config.default_model_filename.as_str() {
        "" => "model.py",
        name => name,
    };
    let path = files.version_dir.join(file);
    if !path.is_file() {
        bail!(
            "Failed to preinitialize Python stub: Python model file not found in '{}'",
            path.display()
        );
    }
    Ok(())
}

/// Backend names live as long as the process (a handful of them).
fn intern(name: &str) -> &'static str {
    static NAMES: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut names = NAMES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(n) = names.iter().find(|n| **n == name) {
        return n;
    }
    let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
    names.push(leaked);
    leaked
}

impl Backend for CapiBackend {
    fn name(&self) -> &'static str {
        self.name
    }

    fn needs_worker(&self) -> bool {
        true
    }

    fn auto_complete(&self, config: &mut ModelConfig, files: &ModelFiles) -> anyhow::Result<()> {
        let model = self.model(config, files, true)?;
        let json = model
            .config_json
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let completed = model_config_from_json(&json)
            .context("the configuration the backend set (TRITONBACKEND_ModelSetConfig)")?;
        *config = completed;
        Ok(())
    }

    fn create_instance(
        &self,
        config: &ModelConfig,
        files: &ModelFiles,
        spec: &InstanceSpec,
    ) -> anyhow::Result<Box<dyn ModelInstance>> {
        let model = self.model(config, files, false)?;
        // The backend sees the configuration as served (defaults filled in).
        model.set_config(config);
        Ok(Box::new(CapiInstance::new(model, config, spec)?))
    }
}
