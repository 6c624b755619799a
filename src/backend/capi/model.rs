//! `TRITONBACKEND_Model`: one per loaded model version, shared by its
//! instances (see `bridge` for the order of a load).
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

use anyhow::bail;

use super::{backend::TRITONBACKEND_Backend, settings};
use crate::{
    backend::ModelFiles,
    config::{model_config_from_json, model_config_to_json},
    proto::inference::ModelConfig,
    triton_abi::{
        buffer::TRITONSERVER_BufferAttributes,
        error::{self, non_null, status, ErrorPtr},
        ffi::ServerHandle,
        message::TRITONSERVER_Message,
        parameter::lossy_cstring,
        types::{ArtifactType, ARTIFACT_FILESYSTEM},
    },
};

/// Opaque to C.
pub struct TRITONBACKEND_Model {
    pub name: CString,
    version: u64,
    repository: CString,
    /// The configuration as JSON: what `ModelConfig` hands out and
    /// `ModelSetConfig` replaces.
    pub(super) config_json: Mutex<String>,
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

    pub(super) fn set_config(&self, config: &ModelConfig) {
        let json = model_config_to_json(config).to_string();
        *self.config_json.lock().unwrap_or_else(|p| p.into_inner()) = json;
        *self.outputs.lock().unwrap_or_else(|p| p.into_inner()) = config
            .output
            .iter()
            .map(|o| lossy_cstring(&o.name))
            .collect();
    }

    /// Creates the model and runs `TRITONBACKEND_ModelInitialize`.
    pub(super) fn initialize(
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
            if let Some(e) = unsafe { error::take(init(model.as_ptr().cast())) } {
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
            if let Some(e) = unsafe { error::take(finalize((self as *mut Self).cast())) } {
                tracing::error!(
                    "model '{}': TRITONBACKEND_ModelFinalize failed: {}",
                    self.name.to_string_lossy(),
                    e.message
                );
            }
        }
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
    ffi_entry!(non_null(m as "model", name) {
        // SAFETY: `m` is null (refused by `model`) or the model the server passed to the backend's
        // `Model*` callbacks, alive until `TRITONBACKEND_ModelFinalize` returns (tritonbackend.h).
        let m = unsafe { model(m)? };
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
    ffi_entry!(non_null(m as "model", version) {
        // SAFETY: `m` is null (refused by `model`) or the model the server passed to the backend's
        // `Model*` callbacks, alive until `TRITONBACKEND_ModelFinalize` returns (tritonbackend.h).
        let m = unsafe { model(m)? };
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
    ffi_entry!(non_null(m as "model", artifact_type, location) {
        // SAFETY: `m` is null (refused by `model`) or the model the server passed to the backend's
        // `Model*` callbacks, alive until `TRITONBACKEND_ModelFinalize` returns (tritonbackend.h).
        let m = unsafe { model(m)? };
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
    ffi_entry!(non_null(m as "model", config as "model_config") {
        // SAFETY: `m` is null (refused by `model`) or the model the server passed to the backend's
        // `Model*` callbacks, alive until `TRITONBACKEND_ModelFinalize` returns (tritonbackend.h).
        let m = unsafe { model(m)? };
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
    ffi_entry!(non_null(m as "model", auto_complete as "auto_complete_config") {
        // SAFETY: `m` is null (refused by `model`) or the model the server passed to the backend's
        // `Model*` callbacks, alive until `TRITONBACKEND_ModelFinalize` returns (tritonbackend.h).
        let m = unsafe { model(m)? };
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
    ffi_entry!(non_null(m as "model", config as "model_config") {
        // SAFETY: `m` is null (refused by `model`) or the model the server passed to the backend's
        // `Model*` callbacks, alive until `TRITONBACKEND_ModelFinalize` returns (tritonbackend.h).
        let m = unsafe { model(m)? };
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
    server: *mut *mut ServerHandle,
) -> ErrorPtr {
    ffi_entry!(non_null(m as "model", server) {
        // SAFETY: `m` is null (refused by `model`) or the model the server passed to the backend's
        // `Model*` callbacks, alive until `TRITONBACKEND_ModelFinalize` returns (tritonbackend.h).
        unsafe { model(m)? };
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
    ffi_entry!(non_null(m as "model", backend) {
        // SAFETY: `m` is null (refused by `model`) or the model the server passed to the backend's
        // `Model*` callbacks, alive until `TRITONBACKEND_ModelFinalize` returns (tritonbackend.h).
        let m = unsafe { model(m)? };
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
    ffi_entry!(non_null(m as "model", state) {
        // SAFETY: `m` is null (refused by `model`) or the model the server passed to the backend's
        // `Model*` callbacks, alive until `TRITONBACKEND_ModelFinalize` returns (tritonbackend.h).
        let m = unsafe { model(m)? };
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
    ffi_entry!(non_null(m as "model") {
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
    _usage: *mut *mut TRITONSERVER_BufferAttributes,
    _usage_size: u32,
) -> ErrorPtr {
    // SAFETY: `model` refuses a null `m`; otherwise it is the model the server passed to the
    // backend, alive until its finalize returns.
    ffi_entry!(non_null(m as "model") { status(unsafe { model(m) }.map(|_| ())) })
}
