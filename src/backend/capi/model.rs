//! `TRITONBACKEND_Model` (one per loaded model version, shared by its
//! instances) and [`CapiBackend`], the `Backend` that loads a model
//! through a backend library.
//!
//! Order of a load, as Triton's: the backend library is loaded and
//! initialized (once per process), `TRITONBACKEND_ModelInitialize` runs
//! (in `auto_complete` when auto-complete is on, so `ModelSetConfig`
//! feeds the configuration the server then validates; else with the
//! first instance), then each `TRITONBACKEND_ModelInstanceInitialize`.
//! `TRITONBACKEND_ModelFinalize` runs when the last instance is gone: the
//! instances hold the model, so it runs after every instance's finalizer,
//! on the thread that dropped the last one (its compute worker).

use std::{
    ffi::{c_char, c_void, CString},
    sync::{
        atomic::{AtomicPtr, Ordering},
        Arc, Mutex,
    },
};

use anyhow::{bail, Context};

use super::{
    backend::{self as lib, TRITONBACKEND_Backend},
    error::{self, non_null, status, ErrorPtr},
    instance::CapiInstance,
    message::TRITONSERVER_Message,
    parameter::lossy_cstring,
    settings,
    types::{ArtifactType, ARTIFACT_FILESYSTEM},
};
use crate::{
    backend::{Backend, InstanceSpec, ModelFiles, ModelInstance},
    config::{model_config_from_json, model_config_to_json},
    proto::inference::ModelConfig,
};

/// Opaque to C.
pub struct TRITONBACKEND_Model {
    pub name: CString,
    version: u64,
    repository: CString,
    /// The configuration as JSON: what `ModelConfig` hands out and
    /// `ModelSetConfig` replaces.
    config_json: Mutex<String>,
    /// Output names, for requests that asked for none (all are produced).
    pub outputs: Mutex<Vec<CString>>,
    auto_complete: bool,
    pub backend: Arc<TRITONBACKEND_Backend>,
    state: AtomicPtr<c_void>,
    /// `ModelInitialize` succeeded: `ModelFinalize` is owed.
    initialized: bool,
}

// SAFETY: the state pointer belongs to the backend, which must make it
// thread-safe (Triton calls model functions from any thread); everything
// else is owned data behind locks or atomics.
unsafe impl Send for TRITONBACKEND_Model {}
// SAFETY: as for `Send` above: the shared C functions read owned data behind locks or atomics, and
// the backend's state pointer is only stored and handed back, never dereferenced here.
unsafe impl Sync for TRITONBACKEND_Model {}

impl TRITONBACKEND_Model {
    pub fn as_ptr(self: &Arc<Self>) -> *mut TRITONBACKEND_Model {
        Arc::as_ptr(self).cast_mut()
    }

    fn set_config(&self, config: &ModelConfig) {
        let json = model_config_to_json(config).to_string();
        *self.config_json.lock().unwrap_or_else(|p| p.into_inner()) = json;
        *self.outputs.lock().unwrap_or_else(|p| p.into_inner()) = config
            .output
            .iter()
            .map(|o| lossy_cstring(&o.name))
            .collect();
    }

    /// Creates the model and runs `TRITONBACKEND_ModelInitialize`.
    fn initialize(
        backend: Arc<TRITONBACKEND_Backend>,
        config: &ModelConfig,
        files: &ModelFiles,
        auto_complete: bool,
    ) -> anyhow::Result<Arc<Self>> {
        let model = Self {
            name: lossy_cstring(&config.name),
            version: files.version.max(0) as u64,
            repository: lossy_cstring(&files.model_dir.to_string_lossy()),
            config_json: Mutex::new(String::new()),
            outputs: Mutex::new(Vec::new()),
            auto_complete,
            backend,
            state: AtomicPtr::new(std::ptr::null_mut()),
            initialized: false,
        };
        model.set_config(config);
        let mut model = Arc::new(model);
        if let Some(init) = model.backend.entry.model_initialize {
            // SAFETY: the backend's entry point with a live model handle.
            if let Some(e) = unsafe { error::take(init(model.as_ptr())) } {
                bail!("TRITONBACKEND_ModelInitialize failed: {}", e.message);
            }
        }
        match Arc::get_mut(&mut model) {
            Some(m) => m.initialized = true,
            None => bail!("TRITONBACKEND_ModelInitialize kept no reference; internal error"),
        }
        Ok(model)
    }
}

impl Drop for TRITONBACKEND_Model {
    fn drop(&mut self) {
        if !self.initialized {
            return;
        }
        if let Some(finalize) = self.backend.entry.model_finalize {
            let _running = super::finalizing::Finalizing::enter(format!(
                "TRITONBACKEND_ModelFinalize (model '{}')",
                self.name.to_string_lossy()
            ));
            // SAFETY: the model is still whole; no instance is left.
            if let Some(e) = unsafe { error::take(finalize(self)) } {
                tracing::error!(
                    "model '{}': TRITONBACKEND_ModelFinalize failed: {}",
                    self.name.to_string_lossy(),
                    e.message
                );
            }
        }
    }
}

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

unsafe fn model<'a>(m: *mut TRITONBACKEND_Model) -> Result<&'a TRITONBACKEND_Model, ErrorPtr> {
    non_null(m, "model")?;
    // SAFETY: checked non-null above; callers pass the model the server gave the backend's
    // `Model*` callbacks, alive until `TRITONBACKEND_ModelFinalize` returns, and only shared
    // references are made from it.
    Ok(unsafe { &*m })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ModelName(
    m: *mut TRITONBACKEND_Model,
    name: *mut *const c_char,
) -> ErrorPtr {
    ffi_entry!({
        // SAFETY: `m` is null (refused by `model`) or the model the server passed to the backend's
        // `Model*` callbacks, alive until `TRITONBACKEND_ModelFinalize` returns (tritonbackend.h).
        let m = unsafe { model(m)? };
        non_null(name, "name")?;
        // SAFETY: `name` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *name = m.name.as_ptr() };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ModelVersion(
    m: *mut TRITONBACKEND_Model,
    version: *mut u64,
) -> ErrorPtr {
    ffi_entry!({
        // SAFETY: `m` is null (refused by `model`) or the model the server passed to the backend's
        // `Model*` callbacks, alive until `TRITONBACKEND_ModelFinalize` returns (tritonbackend.h).
        let m = unsafe { model(m)? };
        non_null(version, "version")?;
        // SAFETY: `version` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *version = m.version };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ModelRepository(
    m: *mut TRITONBACKEND_Model,
    artifact_type: *mut ArtifactType,
    location: *mut *const c_char,
) -> ErrorPtr {
    ffi_entry!({
        // SAFETY: `m` is null (refused by `model`) or the model the server passed to the backend's
        // `Model*` callbacks, alive until `TRITONBACKEND_ModelFinalize` returns (tritonbackend.h).
        let m = unsafe { model(m)? };
        non_null(artifact_type, "artifact_type")?;
        non_null(location, "location")?;
        // SAFETY: `artifact_type`, `location` are checked non-null above and, by the header's
        // contract, valid for writing one value.
        unsafe {
            *artifact_type = ARTIFACT_FILESYSTEM;
            *location = m.repository.as_ptr();
        }
        Ok(())
    })
}

/// Only config version 1 exists (Triton's rule).
#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ModelConfig(
    m: *mut TRITONBACKEND_Model,
    config_version: u32,
    config: *mut *mut TRITONSERVER_Message,
) -> ErrorPtr {
    ffi_entry!({
        // SAFETY: `m` is null (refused by `model`) or the model the server passed to the backend's
        // `Model*` callbacks, alive until `TRITONBACKEND_ModelFinalize` returns (tritonbackend.h).
        let m = unsafe { model(m)? };
        non_null(config, "model_config")?;
        if config_version != 1 {
            return Err(error::unsupported(format!(
                "model configuration version {config_version} not supported, supported versions are: 1"
            )));
        }
        let json = m
            .config_json
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        // SAFETY: `config` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *config = TRITONSERVER_Message::boxed(json) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ModelAutoCompleteConfig(
    m: *mut TRITONBACKEND_Model,
    auto_complete: *mut bool,
) -> ErrorPtr {
    ffi_entry!({
        // SAFETY: `m` is null (refused by `model`) or the model the server passed to the backend's
        // `Model*` callbacks, alive until `TRITONBACKEND_ModelFinalize` returns (tritonbackend.h).
        let m = unsafe { model(m)? };
        non_null(auto_complete, "auto_complete_config")?;
        // SAFETY: `auto_complete` is checked non-null above and, by the header's contract, valid
        // for writing one value.
        unsafe { *auto_complete = m.auto_complete };
        Ok(())
    })
}

/// The configuration is checked when the server reads it back (after
/// `ModelInitialize`); here only that it parses.
#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ModelSetConfig(
    m: *mut TRITONBACKEND_Model,
    config_version: u32,
    config: *mut TRITONSERVER_Message,
) -> ErrorPtr {
    ffi_entry!({
        // SAFETY: `m` is null (refused by `model`) or the model the server passed to the backend's
        // `Model*` callbacks, alive until `TRITONBACKEND_ModelFinalize` returns (tritonbackend.h).
        let m = unsafe { model(m)? };
        non_null(config, "model_config")?;
        if config_version != 1 {
            return Err(error::unsupported(format!(
                "model configuration version {config_version} not supported, supported versions are: 1"
            )));
        }
        // SAFETY: `config` is checked non-null above and is a message from
        // `TRITONSERVER_MessageNewFromSerializedJson` that the backend keeps for the call.
        let json = unsafe { (*config).json() }.to_owned();
        let parsed =
            model_config_from_json(&json).map_err(|e| error::invalid_arg(format!("{e:#}")))?;
        if parsed.name != m.name.to_string_lossy() {
            return Err(error::invalid_arg(format!(
                "the model configuration's name '{}' is not the model's ('{}')",
                parsed.name,
                m.name.to_string_lossy()
            )));
        }
        *m.config_json.lock().unwrap_or_else(|p| p.into_inner()) = json;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ModelServer(
    m: *mut TRITONBACKEND_Model,
    server: *mut *mut crate::frontend::inprocess::TRITONSERVER_Server,
) -> ErrorPtr {
    ffi_entry!({
        // SAFETY: `m` is null (refused by `model`) or the model the server passed to the backend's
        // `Model*` callbacks, alive until `TRITONBACKEND_ModelFinalize` returns (tritonbackend.h).
        unsafe { model(m)? };
        non_null(server, "server")?;
        let s = settings::server();
        if s.is_null() {
            return Err(error::unavailable("no server is running in this process"));
        }
        // SAFETY: `server` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *server = s };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ModelBackend(
    m: *mut TRITONBACKEND_Model,
    backend: *mut *mut TRITONBACKEND_Backend,
) -> ErrorPtr {
    ffi_entry!({
        // SAFETY: `m` is null (refused by `model`) or the model the server passed to the backend's
        // `Model*` callbacks, alive until `TRITONBACKEND_ModelFinalize` returns (tritonbackend.h).
        let m = unsafe { model(m)? };
        non_null(backend, "backend")?;
        // SAFETY: `backend` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *backend = m.backend.as_ptr() };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ModelState(
    m: *mut TRITONBACKEND_Model,
    state: *mut *mut c_void,
) -> ErrorPtr {
    ffi_entry!({
        // SAFETY: `m` is null (refused by `model`) or the model the server passed to the backend's
        // `Model*` callbacks, alive until `TRITONBACKEND_ModelFinalize` returns (tritonbackend.h).
        let m = unsafe { model(m)? };
        non_null(state, "state")?;
        // SAFETY: `state` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *state = m.state.load(Ordering::Acquire) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ModelSetState(
    m: *mut TRITONBACKEND_Model,
    state: *mut c_void,
) -> ErrorPtr {
    ffi_entry!({
        // SAFETY: `m` is null (refused by `model`) or the model the server passed to the backend's
        // `Model*` callbacks, alive until `TRITONBACKEND_ModelFinalize` returns (tritonbackend.h).
        let m = unsafe { model(m)? };
        m.state.store(state, Ordering::Release);
        Ok(())
    })
}

/// Accepted and ignored: memory usage is not reported by this server.
#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ModelReportMemoryUsage(
    m: *mut TRITONBACKEND_Model,
    _usage: *mut *mut super::memory::TRITONSERVER_BufferAttributes,
    _usage_size: u32,
) -> ErrorPtr {
    // SAFETY: `model` refuses a null `m`; otherwise it is the model the server passed to the
    // backend, alive until its finalize returns.
    ffi_entry!({ status(unsafe { model(m) }.map(|_| ())) })
}
