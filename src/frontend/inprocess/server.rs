//! `TRITONSERVER_Server`: what a backend's `TRITONBACKEND_ModelServer`
//! hands out, and the `TRITONSERVER_Server*` functions a backend calls on
//! it: model readiness, properties, config and metadata (answered from the
//! published model table, from any thread, without asking a shard), and
//! model loads and unloads (through the repository thread).

use std::{
    ffi::c_char,
    ptr,
    sync::{Arc, RwLock},
};

use crate::triton_abi::{
    error::{c_str, invalid_arg, non_null, out, status, ErrorPtr, TRITONSERVER_Error},
    message::TRITONSERVER_Message,
    parameter::TRITONSERVER_Parameter,
    types::{error_kind_to_code, ERROR_UNAVAILABLE, ERROR_UNSUPPORTED},
};
use crate::{
    config::is_decoupled,
    frontend::{
        core::{
            self,
            infer::{Consumer, Refused, ThreadEntry},
            metadata::{ModelMetadata, ServerMetadata},
        },
        env::FrontendEnv,
    },
    model::{ModelTable, ModelVersion},
    types::{InferError, InferRequest, InferResult},
};

/// `TRITONSERVER_ModelBatchFlag`.
pub const BATCH_UNKNOWN: u32 = 1;
pub const BATCH_FIRST_DIM: u32 = 2;
/// `TRITONSERVER_ModelTxnPropertyFlag`.
pub const TXN_ONE_TO_ONE: u32 = 1;
pub const TXN_DECOUPLED: u32 = 2;
/// `TRITONSERVER_ModelIndexFlag`.
pub const INDEX_FLAG_READY: u32 = 1;

/// Opaque to C. One per running server; backends get `Arc::as_ptr` of it.
pub struct TRITONSERVER_Server {
    /// Where `TRITONSERVER_ServerInferAsync` hands its requests to the
    /// shards.
    entry: ThreadEntry,
    /// The table the shards serve from, as last published.
    table: RwLock<Arc<ModelTable>>,
    /// The front ends' environment of the server (the in-process API runs
    /// on backend threads, where none is installed).
    env: Arc<FrontendEnv>,
}

impl std::fmt::Debug for TRITONSERVER_Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TRITONSERVER_Server")
            .field("shards", &self.entry.shards())
            .finish_non_exhaustive()
    }
}

impl TRITONSERVER_Server {
    pub fn new(env: Arc<FrontendEnv>, entry: ThreadEntry) -> Arc<Self> {
        Arc::new(Self {
            entry,
            table: RwLock::new(Arc::new(ModelTable::default())),
            env,
        })
    }

    /// Called wherever the model table is published to the shards.
    pub fn publish(&self, table: Arc<ModelTable>) {
        match self.table.write() {
            Ok(mut t) => *t = table,
            Err(poisoned) => *poisoned.into_inner() = table,
        }
    }

    pub fn table(&self) -> Arc<ModelTable> {
        match self.table.read() {
            Ok(t) => t.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub fn with_model<R>(
        &self,
        name: &str,
        version: &str,
        f: impl FnOnce(&Arc<ModelVersion>) -> R,
    ) -> InferResult<R> {
        let table = self.table();
        table.resolve(name, version).map(f)
    }

    /// Takes a new reference to the server behind a pointer a backend got
    /// from `TRITONBACKEND_ModelServer`.
    ///
    /// # Safety
    /// `server` is null or `Arc::as_ptr` of a live server.
    pub unsafe fn from_c(server: *mut TRITONSERVER_Server) -> Result<Arc<Self>, ErrorPtr> {
        non_null(server, "server")?;
        let p = server.cast_const();
        // SAFETY: p comes from an Arc that is alive (the caller's contract).
        unsafe {
            Arc::increment_strong_count(p);
            Ok(Arc::from_raw(p))
        }
    }

    pub fn shards(&self) -> usize {
        self.entry.shards()
    }

    /// Checks `request` against the published table and queues it for
    /// its shard (see `ThreadEntry::submit`).
    pub fn submit(&self, request: InferRequest, consume: Consumer) -> Result<(), Refused> {
        self.entry.submit(&self.table(), request, consume)
    }

    pub fn env(&self) -> &Arc<FrontendEnv> {
        &self.env
    }
}

fn error_from(e: &InferError) -> ErrorPtr {
    TRITONSERVER_Error::boxed(error_kind_to_code(e.kind), e.message.clone())
}

fn version_str(v: i64) -> String {
    if v < 0 {
        String::new()
    } else {
        v.to_string()
    }
}

/// Resolves the model a `TRITONSERVER_Server*` function names.
unsafe fn model_of(
    server: *mut TRITONSERVER_Server,
    model_name: *const c_char,
    model_version: i64,
) -> Result<(Arc<TRITONSERVER_Server>, Arc<ModelVersion>), ErrorPtr> {
    // SAFETY: `server` is null (refused by `from_c`) or the server `TRITONBACKEND_ModelServer`
    // handed out, which a backend may use while its model lives; `from_c` takes a reference of its
    // own.
    let server = unsafe { TRITONSERVER_Server::from_c(server) }?;
    // SAFETY: `model_name` is null (refused by `c_str`) or a NUL-terminated string the caller
    // keeps valid for the call (the header's `const char*` contract); nothing keeps the `&str`
    // past the call.
    let name = unsafe { c_str(model_name, "model_name") }?;
    let model = server
        .with_model(name, &version_str(model_version), Arc::clone)
        .map_err(|e| error_from(&e))?;
    Ok((server, model))
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerIsLive(
    server: *mut TRITONSERVER_Server,
    live: *mut bool,
) -> ErrorPtr {
    ffi_entry!({
        // SAFETY: `server` is null (refused by `from_c`) or the server `TRITONBACKEND_ModelServer`
        // handed out, which a backend may use while its model lives; `from_c` takes a reference of
        // its own.
        let server = unsafe { TRITONSERVER_Server::from_c(server) }?;
        // SAFETY: `live` is null (refused by `out`) or the caller's out-parameter, valid for
        // writing one value (tritonserver.h).
        unsafe { out(live, "live", server.env.lifecycle.live()) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerIsReady(
    server: *mut TRITONSERVER_Server,
    ready: *mut bool,
) -> ErrorPtr {
    ffi_entry!({
        // SAFETY: `server` is null (refused by `from_c`) or the server `TRITONBACKEND_ModelServer`
        // handed out, which a backend may use while its model lives; `from_c` takes a reference of
        // its own.
        let server = unsafe { TRITONSERVER_Server::from_c(server) }?;
        // SAFETY: `ready` is null (refused by `out`) or the caller's out-parameter, valid for
        // writing one value (tritonserver.h).
        unsafe { out(ready, "ready", server.env.lifecycle.ready()) }
    })
}

/// An unknown model is an error (as Triton's `GetModel`); a known one that
/// is not ready answers `false`.
#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerModelIsReady(
    server: *mut TRITONSERVER_Server,
    model_name: *const c_char,
    model_version: i64,
    ready: *mut bool,
) -> ErrorPtr {
    ffi_entry!({
        non_null(ready, "ready")?;
        // SAFETY: `server` is null (refused by `from_c`) or the server `TRITONBACKEND_ModelServer`
        // handed out, which a backend may use while its model lives; `from_c` takes a reference of
        // its own.
        let server = unsafe { TRITONSERVER_Server::from_c(server) }?;
        // SAFETY: `model_name` is null (refused by `c_str`) or a NUL-terminated string the caller
        // keeps valid for the call (the header's `const char*` contract); nothing keeps the `&str`
        // past the call.
        let name = unsafe { c_str(model_name, "model_name") }?;
        let table = server.table();
        let is_ready = match table.resolve(name, &version_str(model_version)) {
            Ok(_) => !server.env.lifecycle.is_shutting_down(),
            Err(e) if table.models.contains_key(name) => {
                tracing::debug!(model = name, error = %e.message, "model is not ready");
                false
            }
            Err(e) => return Err(error_from(&e)),
        };
        // SAFETY: `ready` is null (refused by `out`) or the caller's out-parameter, valid for
        // writing one value (tritonserver.h).
        unsafe { out(ready, "ready", is_ready) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerModelBatchProperties(
    server: *mut TRITONSERVER_Server,
    model_name: *const c_char,
    model_version: i64,
    flags: *mut u32,
    voidp: *mut *mut std::ffi::c_void,
) -> ErrorPtr {
    ffi_entry!({
        if !voidp.is_null() {
            // SAFETY: `voidp` is checked non-null above and, by the header's contract, valid for
            // writing one value.
            unsafe { *voidp = ptr::null_mut() };
        }
        // SAFETY: `model_of` refuses a null server or name; otherwise they are the server from
        // `TRITONBACKEND_ModelServer` and a NUL-terminated name the caller keeps valid for the
        // call.
        let (_, model) = unsafe { model_of(server, model_name, model_version) }?;
        let f = if model.config.max_batch_size > 0 {
            BATCH_FIRST_DIM
        } else {
            BATCH_UNKNOWN
        };
        // SAFETY: `flags` is null (refused by `out`) or the caller's out-parameter, valid for
        // writing one value (tritonserver.h).
        unsafe { out(flags, "flags", f) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerModelTransactionProperties(
    server: *mut TRITONSERVER_Server,
    model_name: *const c_char,
    model_version: i64,
    txn_flags: *mut u32,
    voidp: *mut *mut std::ffi::c_void,
) -> ErrorPtr {
    ffi_entry!({
        if !voidp.is_null() {
            // SAFETY: `voidp` is checked non-null above and, by the header's contract, valid for
            // writing one value.
            unsafe { *voidp = ptr::null_mut() };
        }
        // SAFETY: `model_of` refuses a null server or name; otherwise they are the server from
        // `TRITONBACKEND_ModelServer` and a NUL-terminated name the caller keeps valid for the
        // call.
        let (_, model) = unsafe { model_of(server, model_name, model_version) }?;
        let f = if is_decoupled(&model.config) {
            TXN_DECOUPLED
        } else {
            TXN_ONE_TO_ONE
        };
        // SAFETY: `txn_flags` is null (refused by `out`) or the caller's out-parameter, valid for
        // writing one value (tritonserver.h).
        unsafe { out(txn_flags, "txn_flags", f) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerMetadata(
    server: *mut TRITONSERVER_Server,
    server_metadata: *mut *mut TRITONSERVER_Message,
) -> ErrorPtr {
    ffi_entry!({
        // SAFETY: `server` is null (refused by `from_c`) or the server `TRITONBACKEND_ModelServer`
        // handed out, which a backend may use while its model lives; `from_c` takes a reference of
        // its own.
        let server = unsafe { TRITONSERVER_Server::from_c(server) }?;
        let doc = ServerMetadata::of(&server.env).to_json();
        // SAFETY: `server_metadata` is null (refused by `out`) or the caller's
        // out-parameter, valid for writing one pointer (tritonserver.h).
        unsafe {
            out(
                server_metadata,
                "server_metadata",
                TRITONSERVER_Message::boxed(doc.to_string()),
            )
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerModelMetadata(
    server: *mut TRITONSERVER_Server,
    model_name: *const c_char,
    model_version: i64,
    model_metadata: *mut *mut TRITONSERVER_Message,
) -> ErrorPtr {
    ffi_entry!({
        // SAFETY: `model_of` refuses a null server or name; otherwise they are the server from
        // `TRITONBACKEND_ModelServer` and a NUL-terminated name the caller keeps valid for the
        // call.
        let (server, m) = unsafe { model_of(server, model_name, model_version) }?;
        let doc = ModelMetadata::new(&server.table(), &m).to_json();
        // SAFETY: `model_metadata` is null (refused by `out`) or the caller's
        // out-parameter, valid for writing one pointer (tritonserver.h).
        unsafe {
            out(
                model_metadata,
                "model_metadata",
                TRITONSERVER_Message::boxed(doc.to_string()),
            )
        }
    })
}

/// The served configuration, as `GET .../config` returns it. Triton knows
/// only `config_version` 1.
#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerModelConfig(
    server: *mut TRITONSERVER_Server,
    model_name: *const c_char,
    model_version: i64,
    config_version: u32,
    model_config: *mut *mut TRITONSERVER_Message,
) -> ErrorPtr {
    ffi_entry!({
        if config_version != 1 {
            return Err(invalid_arg(format!(
                "model configuration version {config_version} not supported, supported versions are: 1"
            )));
        }
        // SAFETY: `model_of` refuses a null server or name; otherwise they are the server from
        // `TRITONBACKEND_ModelServer` and a NUL-terminated name the caller keeps valid for the
        // call.
        let (_, m) = unsafe { model_of(server, model_name, model_version) }?;
        let json = String::from_utf8_lossy(&m.config_json).into_owned();
        // SAFETY: `model_config` is null (refused by `out`) or the caller's
        // out-parameter, valid for writing one pointer (tritonserver.h).
        unsafe {
            out(
                model_config,
                "model_config",
                TRITONSERVER_Message::boxed(json),
            )
        }
    })
}

/// The repository index, as the repository API's index returns it.
#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerModelIndex(
    server: *mut TRITONSERVER_Server,
    flags: u32,
    model_index: *mut *mut TRITONSERVER_Message,
) -> ErrorPtr {
    ffi_entry!({
        non_null(model_index, "model_index")?;
        // SAFETY: `server` is null (refused by `from_c`) or the server `TRITONBACKEND_ModelServer`
        // handed out, which a backend may use while its model lives; `from_c` takes a reference of
        // its own.
        let server = unsafe { TRITONSERVER_Server::from_c(server) }?;
        let repository = repository(&server)?;
        let rows = block_on_repository(repository.index(flags & INDEX_FLAG_READY != 0))?;
        let json = core::index::to_json(&rows).to_string();
        // SAFETY: `model_index` is null (refused by `out`) or the caller's
        // out-parameter, valid for writing one pointer (tritonserver.h).
        unsafe {
            out(
                model_index,
                "model_index",
                TRITONSERVER_Message::boxed(json),
            )
        }
    })
}

fn repository(
    server: &TRITONSERVER_Server,
) -> Result<crate::repository::manager::RepositoryClient, ErrorPtr> {
    server.env.repository.get().cloned().ok_or_else(|| {
        TRITONSERVER_Error::boxed(
            ERROR_UNAVAILABLE,
            "the model repository is not started yet (the server is still loading its initial models)",
        )
    })
}

/// Waits for the repository thread's answer on the calling (backend)
/// thread. The repository thread itself must not wait for itself: a
/// backend loading or unloading a model from inside a model load is
/// refused.
fn block_on_repository<T>(
    fut: impl std::future::Future<Output = InferResult<T>>,
) -> Result<T, ErrorPtr> {
    if std::thread::current().name() == Some("repository") {
        return Err(TRITONSERVER_Error::boxed(
            ERROR_UNAVAILABLE,
            "models cannot be loaded or unloaded from inside a model's load",
        ));
    }
    if crate::shard::with_current(|_| ()).is_some() {
        return Err(TRITONSERVER_Error::boxed(
            ERROR_UNAVAILABLE,
            "model repository calls cannot block a shard thread",
        ));
    }
    futures::executor::block_on(fut).map_err(|e| error_from(&e))
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerLoadModel(
    server: *mut TRITONSERVER_Server,
    model_name: *const c_char,
) -> ErrorPtr {
    ffi_entry!({
        // SAFETY: the caller's pointers are passed on unchanged under the same contract; no
        // parameters (null with a zero count) is allowed there.
        unsafe { TRITONSERVER_ServerLoadModelWithParameters(server, model_name, ptr::null(), 0) }
    })
}

/// Parameters: `config` (a JSON model config override) is honoured;
/// `file:` parameters (model files sent with the load) are refused here.
#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerLoadModelWithParameters(
    server: *mut TRITONSERVER_Server,
    model_name: *const c_char,
    parameters: *const *const TRITONSERVER_Parameter,
    parameter_count: u64,
) -> ErrorPtr {
    ffi_entry!({
        // SAFETY: `server` is null (refused by `from_c`) or the server `TRITONBACKEND_ModelServer`
        // handed out, which a backend may use while its model lives; `from_c` takes a reference of
        // its own.
        let server = unsafe { TRITONSERVER_Server::from_c(server) }?;
        // SAFETY: `model_name` is null (refused by `c_str`) or a NUL-terminated string the caller
        // keeps valid for the call (the header's `const char*` contract); nothing keeps the `&str`
        // past the call.
        let name = unsafe { c_str(model_name, "model_name") }?.to_string();
        let mut load = crate::repository::manager::LoadRequest::default();
        let count = usize::try_from(parameter_count)
            .map_err(|_| invalid_arg("parameter_count too large"))?;
        if count > 0 {
            non_null(parameters, "parameters")?;
        }
        for i in 0..count {
            // SAFETY: `parameters` is non-null (checked above) and, per tritonserver.h, an array
            // of `parameter_count` parameter pointers; `i < count`.
            let p = unsafe { *parameters.add(i) };
            non_null(p, "parameter")?;
            // SAFETY: checked non-null just above; a parameter from `TRITONSERVER_ParameterNew`
            // the caller keeps for the call.
            let p = unsafe { &*p };
            let key = p.name.to_string_lossy();
            match (key.as_ref(), &p.value) {
                ("config", crate::triton_abi::parameter::ParamValue::String(s)) => {
                    load.config = Some(s.to_string_lossy().into_owned());
                }
                (k, _) if k.starts_with("file:") => {
                    return Err(TRITONSERVER_Error::boxed(
                        ERROR_UNSUPPORTED,
                        format!("load parameter '{k}': model files cannot be sent through the C API here; use the repository API"),
                    ))
                }
                (k, _) => {
                    return Err(invalid_arg(format!(
                        "unrecognized load parameter '{k}'"
                    )))
                }
            }
        }
        let repository = repository(&server)?;
        block_on_repository(repository.load(name, load))
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerUnloadModel(
    server: *mut TRITONSERVER_Server,
    model_name: *const c_char,
) -> ErrorPtr {
    // SAFETY: the caller's pointers go to `unload_model`, which checks them, under the same
    // tritonserver.h contract.
    ffi_entry!({ unsafe { unload_model(server, model_name, false) } })
}

/// Also unloads the ensembles that use the model, as the repository API's
/// `unload_dependents` does.
#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ServerUnloadModelAndDependents(
    server: *mut TRITONSERVER_Server,
    model_name: *const c_char,
) -> ErrorPtr {
    // SAFETY: the caller's pointers go to `unload_model`, which checks them, under the same
    // tritonserver.h contract.
    ffi_entry!({ unsafe { unload_model(server, model_name, true) } })
}

unsafe fn unload_model(
    server: *mut TRITONSERVER_Server,
    model_name: *const c_char,
    unload_dependents: bool,
) -> ErrorPtr {
    status((|| {
        // SAFETY: `server` is null (refused by `from_c`) or the server `TRITONBACKEND_ModelServer`
        // handed out, which a backend may use while its model lives; `from_c` takes a reference of
        // its own.
        let server = unsafe { TRITONSERVER_Server::from_c(server) }?;
        // SAFETY: `model_name` is null (refused by `c_str`) or a NUL-terminated string the caller
        // keeps valid for the call (the header's `const char*` contract); nothing keeps the `&str`
        // past the call.
        let name = unsafe { c_str(model_name, "model_name") }?.to_string();
        let repository = repository(&server)?;
        block_on_repository(repository.unload(name, unload_dependents))
    })())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The in-process API renders the same typed value HTTP does.
    #[test]
    fn server_metadata_is_the_core_value() {
        let mut env = FrontendEnv::new(crate::trace::Tracer::new(&Default::default()));
        env.server_name = "inprocess".into();
        let env = Arc::new(env);
        let server = TRITONSERVER_Server::new(
            env.clone(),
            crate::frontend::core::infer::ThreadEntry::start(&[]),
        );
        let mut message: *mut TRITONSERVER_Message = ptr::null_mut();
        // SAFETY: a live server and a valid out-parameter.
        let err =
            unsafe { TRITONSERVER_ServerMetadata(Arc::as_ptr(&server).cast_mut(), &mut message) };
        assert!(err.is_null());
        assert!(!message.is_null());
        // SAFETY: the server just wrote a boxed message here; it is
        // reclaimed once, below.
        let message = unsafe { Box::from_raw(message) };
        let json: serde_json::Value = serde_json::from_str(message.json()).unwrap();
        assert_eq!(json, ServerMetadata::of(&env).to_json());
        assert_eq!(json["name"], "inprocess");
        // A null out-parameter is an error, not a crash.
        // SAFETY: a live server; the null out-parameter is refused.
        let err = unsafe {
            TRITONSERVER_ServerMetadata(Arc::as_ptr(&server).cast_mut(), ptr::null_mut())
        };
        assert!(!err.is_null());
        // SAFETY: the error was just returned boxed and is reclaimed once.
        drop(unsafe { Box::from_raw(err) });
    }
}
