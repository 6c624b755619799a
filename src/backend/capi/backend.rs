//! `TRITONBACKEND_Backend`: one loaded backend library, shared by every
//! model that names it, initialized once (`TRITONBACKEND_Initialize`)
//! and kept until shutdown, as in Triton. At shutdown, once every model
//! instance and model is finalized (their compute workers joined),
//! [`finalize_all`] calls each backend's `TRITONBACKEND_Finalize` and
//! unloads its library (dlclose). A backend some model still holds (one
//! left running past the exit timeout) is neither finalized nor unloaded.
use std::{
    collections::HashMap,
    ffi::{c_char, c_void, CString},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicPtr, AtomicU32, Ordering},
        Arc, Mutex,
    },
};

use anyhow::{bail, Context};
use libloading::os::unix::{Library, Symbol, RTLD_LOCAL, RTLD_NOW};

use super::{memory::TRITONBACKEND_MemoryManager, request::TRITONBACKEND_Request, settings};
use crate::triton_abi::{
    error::{self, non_null, ErrorPtr},
    log::write_version,
    message::TRITONSERVER_Message,
    parameter::lossy_cstring,
    types::{
        ArtifactType, ExecutionPolicy, ARTIFACT_FILESYSTEM, EXECUTION_BLOCKING,
        EXECUTION_DEVICE_BLOCKING, INSTANCEGROUPKIND_MODEL,
    },
};

/// The version of `tritonbackend.h` this server implements (Triton 2.5x).
pub const BACKEND_API_VERSION: (u32, u32) = (1, 19);

// The model and instance entry points take a `TRITONBACKEND_Model*` or
// `TRITONBACKEND_ModelInstance*`: those types live in the layers above
// this one (`model`, `instance`), which cast their handles to `c_void` at
// the call.
type LifecycleFn<T> = unsafe extern "C" fn(*mut T) -> ErrorPtr;
type ExecuteFn =
    unsafe extern "C" fn(*mut c_void, *mut *mut TRITONBACKEND_Request, u32) -> ErrorPtr;
type AttributeFn = unsafe extern "C" fn(
    *mut TRITONBACKEND_Backend,
    *mut TRITONBACKEND_BackendAttribute,
) -> ErrorPtr;

/// The entry points a backend library may define; only `execute` is
/// required.
pub struct EntryPoints {
    pub initialize: Option<LifecycleFn<TRITONBACKEND_Backend>>,
    pub attribute: Option<AttributeFn>,
    pub finalize: Option<LifecycleFn<TRITONBACKEND_Backend>>,
    pub model_initialize: Option<LifecycleFn<c_void>>,
    pub model_finalize: Option<LifecycleFn<c_void>>,
    pub instance_initialize: Option<LifecycleFn<c_void>>,
    pub instance_finalize: Option<LifecycleFn<c_void>>,
    pub execute: ExecuteFn,
}

/// Opaque to C.
pub struct TRITONBACKEND_Backend {
    pub name: CString,
    /// The folder the library was found in (`BackendArtifacts`).
    artifacts: CString,
    config: String,
    policy: AtomicU32,
    state: AtomicPtr<c_void>,
    pub entry: EntryPoints,
    pub attributes: Mutex<TRITONBACKEND_BackendAttribute>,
    memory: TRITONBACKEND_MemoryManager,
    /// Unloaded (dlclose) when the backend is dropped, after
    /// `TRITONBACKEND_Finalize` ([`finalize_all`]).
    _library: Library,
}

/// `TRITONBACKEND_BackendAttribute`: what a backend said in
/// `TRITONBACKEND_GetBackendAttribute`. Recorded; preferred instance
/// groups are not applied (instances are CPU instances here anyway).
#[derive(Debug, Default)]
pub struct TRITONBACKEND_BackendAttribute {
    pub preferred_groups: Vec<(u32, u64, Vec<u64>)>,
    pub parallel_instance_loading: bool,
}

/// Loaded backends by canonical library path.
static LOADED: Mutex<Option<HashMap<PathBuf, Arc<TRITONBACKEND_Backend>>>> = Mutex::new(None);

impl TRITONBACKEND_Backend {
    pub fn as_ptr(self: &Arc<Self>) -> *mut TRITONBACKEND_Backend {
        Arc::as_ptr(self).cast_mut()
    }
}

/// Shutdown: for each loaded backend no model holds any more,
/// `TRITONBACKEND_Finalize` (if defined), then dlclose. Returns the names
/// of the backends left loaded because a model still holds them.
pub fn finalize_all() -> Vec<String> {
    let mut loaded = LOADED.lock().unwrap_or_else(|p| p.into_inner());
    let Some(map) = loaded.as_mut() else {
        return Vec::new();
    };
    let mut kept = Vec::new();
    // Held under the lock: `load` clones a backend only under it, so a
    // count of 1 stays 1 until the backend is gone.
    let paths: Vec<PathBuf> = map.keys().cloned().collect();
    for path in paths {
        let Some(backend) = map.remove(&path) else {
            continue;
        };
        let name = backend.name.to_string_lossy().into_owned();
        if Arc::strong_count(&backend) > 1 {
            tracing::warn!(
                backend = %name,
                "a model still holds the backend at shutdown: not finalized"
            );
            kept.push(name);
            map.insert(path, backend);
            continue;
        }
        if let Some(finalize) = backend.entry.finalize {
            let _running = super::finalizing::Finalizing::enter(format!(
                "TRITONBACKEND_Finalize (backend '{name}')"
            ));
            // SAFETY: the backend's own entry point with the handle it was
            // initialized with; no model of it is left.
            if let Some(e) = unsafe { error::take(finalize(backend.as_ptr())) } {
                tracing::error!(backend = %name, "TRITONBACKEND_Finalize failed: {}", e.message);
            }
        }
        // Drops the library: dlclose.
        drop(backend);
        tracing::debug!(backend = %name, "backend finalized and unloaded");
    }
    kept
}

/// Where a model's backend library is, in Triton's order: the version
/// folder, the model folder, then `<backend-directory>/<name>/`. The
/// file name is `libtriton_<name>.so`, or the config's `runtime` when it
/// names a `.so`. A model folder made of uploaded files (a load request's
/// `file:` parameters) is never searched: backend libraries come only
/// from folders the operator filled.
pub fn find_library(
    backend: &str,
    runtime: &str,
    model_dir: &Path,
    version_dir: &Path,
) -> anyhow::Result<PathBuf> {
    let file = if runtime.ends_with(".so") {
        runtime.to_owned()
    } else {
        format!("libtriton_{backend}.so")
    };
    let global = settings::backend_directory().join(backend);
    let uploaded = crate::repository::uploads::is_upload_path(model_dir)
        || crate::repository::uploads::is_upload_path(version_dir);
    let candidates: Vec<PathBuf> = if uploaded {
        vec![global]
    } else {
        vec![version_dir.to_path_buf(), model_dir.to_path_buf(), global]
    };
    candidates
        .iter()
        .map(|dir| dir.join(&file))
        .find(|p| p.is_file())
        .with_context(|| {
            let places: Vec<String> = candidates.iter().map(|d| d.display().to_string()).collect();
            format!(
                "unable to find backend library '{file}' for backend '{backend}' (looked in {}{})",
                places.join(", "),
                if uploaded {
                    "; never in a model folder sent with a load request"
                } else {
                    ""
                }
            )
        })
}

/// The backend in `library`, loaded and initialized on first use.
pub fn load(
    name: &str,
    library: &Path,
    auto_complete: bool,
) -> anyhow::Result<Arc<TRITONBACKEND_Backend>> {
    // $ORIGIN in the library's RPATH is taken from the path given to
    // dlopen, so a symlinked library finds its dependencies next to its
    // real file (the Python backend's wheel layout).
    let canonical = library
        .canonicalize()
        .with_context(|| format!("backend library {}", library.display()))?;
    let mut loaded = LOADED.lock().unwrap_or_else(|p| p.into_inner());
    let loaded = loaded.get_or_insert_with(HashMap::new);
    if let Some(b) = loaded.get(&canonical) {
        return Ok(b.clone());
    }
    let backend = Arc::new(open(name, library, &canonical, auto_complete)?);
    initialize(&backend)?;
    loaded.insert(canonical, backend.clone());
    Ok(backend)
}

fn open(
    name: &str,
    library: &Path,
    canonical: &Path,
    auto_complete: bool,
) -> anyhow::Result<TRITONBACKEND_Backend> {
    // SAFETY: loading a backend runs its initializers; that is what
    // configuring a model with this backend asks for.
    let lib = unsafe { Library::open(Some(canonical), RTLD_NOW | RTLD_LOCAL) }
        .with_context(|| format!("unable to load backend library {}", canonical.display()))?;
    let optional = |sym: &[u8]| -> Option<*const c_void> {
        // SAFETY: only the address is read here; each is called with the
        // signature tritonbackend.h gives it.
        unsafe { lib.get::<*const c_void>(sym) }
            .ok()
            .map(|s: Symbol<*const c_void>| s.into_raw().cast_const())
    };
    let Some(execute) = optional(b"TRITONBACKEND_ModelInstanceExecute\0") else {
        bail!(
            "backend library {} does not define TRITONBACKEND_ModelInstanceExecute",
            canonical.display()
        );
    };
    // SAFETY: the symbols are functions with tritonbackend.h's signatures.
    let entry = unsafe {
        EntryPoints {
            initialize: optional(b"TRITONBACKEND_Initialize\0").map(|p| std::mem::transmute(p)),
            attribute: optional(b"TRITONBACKEND_GetBackendAttribute\0")
                .map(|p| std::mem::transmute(p)),
            finalize: optional(b"TRITONBACKEND_Finalize\0").map(|p| std::mem::transmute(p)),
            model_initialize: optional(b"TRITONBACKEND_ModelInitialize\0")
                .map(|p| std::mem::transmute(p)),
            model_finalize: optional(b"TRITONBACKEND_ModelFinalize\0")
                .map(|p| std::mem::transmute(p)),
            instance_initialize: optional(b"TRITONBACKEND_ModelInstanceInitialize\0")
                .map(|p| std::mem::transmute(p)),
            instance_finalize: optional(b"TRITONBACKEND_ModelInstanceFinalize\0")
                .map(|p| std::mem::transmute(p)),
            execute: std::mem::transmute::<*const c_void, ExecuteFn>(execute),
        }
    };
    let artifacts = library.parent().unwrap_or(Path::new("."));
    let backend = TRITONBACKEND_Backend {
        name: lossy_cstring(name),
        artifacts: lossy_cstring(&artifacts.to_string_lossy()),
        config: backend_config_json(name, auto_complete),
        policy: AtomicU32::new(EXECUTION_BLOCKING),
        state: AtomicPtr::new(std::ptr::null_mut()),
        entry,
        attributes: Mutex::new(TRITONBACKEND_BackendAttribute::default()),
        memory: TRITONBACKEND_MemoryManager::default(),
        _library: lib,
    };
    Ok(backend)
}

fn initialize(backend: &Arc<TRITONBACKEND_Backend>) -> anyhow::Result<()> {
    let (init, attribute) = (backend.entry.initialize, backend.entry.attribute);
    let name = backend.name.to_string_lossy();
    if let Some(init) = init {
        // SAFETY: a backend's own entry point with its own handle.
        if let Some(e) = unsafe { error::take(init(backend.as_ptr())) } {
            bail!(
                "backend '{name}': TRITONBACKEND_Initialize failed: {}",
                e.message
            );
        }
    }
    if let Some(attribute) = attribute {
        let mut attrs = TRITONBACKEND_BackendAttribute::default();
        // SAFETY: as above; `attrs` outlives the call.
        if let Some(e) = unsafe { error::take(attribute(backend.as_ptr(), &mut attrs)) } {
            bail!(
                "backend '{name}': TRITONBACKEND_GetBackendAttribute failed: {}",
                e.message
            );
        }
        *backend.attributes.lock().unwrap_or_else(|p| p.into_inner()) = attrs;
    }
    Ok(())
}

/// The backend config message, as tritonserver builds it: the
/// `--backend-config` entries for this backend, plus the global ones,
/// under `cmdline`.
fn backend_config_json(name: &str, auto_complete: bool) -> String {
    let s = settings::get();
    let mut cmdline = serde_json::Map::new();
    let dir = settings::backend_directory();
    let globals = [
        ("backend-directory", dir.to_string_lossy().into_owned()),
        ("min-compute-capability", "6.000000".to_owned()),
        ("auto-complete-config", auto_complete.to_string()),
        ("default-max-batch-size", "4".to_owned()),
    ];
    for (k, v) in globals {
        cmdline.insert(k.to_owned(), v.into());
    }
    for scope in ["", name] {
        for (k, v) in s.backend_config.get(scope).into_iter().flatten() {
            cmdline.insert(k.clone(), v.clone().into());
        }
    }
    serde_json::json!({ "cmdline": cmdline }).to_string()
}

unsafe fn backend<'a>(
    b: *mut TRITONBACKEND_Backend,
) -> Result<&'a TRITONBACKEND_Backend, ErrorPtr> {
    non_null(b, "backend")?;
    // SAFETY: checked non-null above; the caller (every exported function taking a backend) passes
    // the pointer the server gave `TRITONBACKEND_Initialize`, alive until `TRITONBACKEND_Finalize`
    // returns, and only shared references are made from it.
    Ok(unsafe { &*b })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_BackendName(
    b: *mut TRITONBACKEND_Backend,
    name: *mut *const c_char,
) -> ErrorPtr {
    ffi_entry!(non_null(b as "backend", name) {
        // SAFETY: `b` is null (refused by `backend`) or the backend the server passed to
        // `TRITONBACKEND_Initialize`, alive until `TRITONBACKEND_Finalize` returns
        // (tritonbackend.h).
        let b = unsafe { backend(b)? };
        // SAFETY: `name` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *name = b.name.as_ptr() };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_BackendConfig(
    b: *mut TRITONBACKEND_Backend,
    config: *mut *mut TRITONSERVER_Message,
) -> ErrorPtr {
    ffi_entry!(non_null(b as "backend", config as "backend_config") {
        // SAFETY: `b` is null (refused by `backend`) or the backend the server passed to
        // `TRITONBACKEND_Initialize`, alive until `TRITONBACKEND_Finalize` returns
        // (tritonbackend.h).
        let b = unsafe { backend(b)? };
        // SAFETY: `config` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *config = TRITONSERVER_Message::boxed(b.config.clone()) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_BackendExecutionPolicy(
    b: *mut TRITONBACKEND_Backend,
    policy: *mut ExecutionPolicy,
) -> ErrorPtr {
    ffi_entry!(non_null(b as "backend", policy) {
        // SAFETY: `b` is null (refused by `backend`) or the backend the server passed to
        // `TRITONBACKEND_Initialize`, alive until `TRITONBACKEND_Finalize` returns
        // (tritonbackend.h).
        let b = unsafe { backend(b)? };
        // SAFETY: `policy` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *policy = b.policy.load(Ordering::Relaxed) };
        Ok(())
    })
}

/// Recorded only: every instance has a compute worker of its own, which
/// is what both policies ask for on CPU.
#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_BackendSetExecutionPolicy(
    b: *mut TRITONBACKEND_Backend,
    policy: ExecutionPolicy,
) -> ErrorPtr {
    ffi_entry!(non_null(b as "backend") {
        // SAFETY: `b` is null (refused by `backend`) or the backend the server passed to
        // `TRITONBACKEND_Initialize`, alive until `TRITONBACKEND_Finalize` returns
        // (tritonbackend.h).
        let b = unsafe { backend(b)? };
        if policy > EXECUTION_DEVICE_BLOCKING {
            return Err(error::invalid_arg(format!(
                "unknown execution policy {policy}"
            )));
        }
        b.policy.store(policy, Ordering::Relaxed);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_BackendArtifacts(
    b: *mut TRITONBACKEND_Backend,
    artifact_type: *mut ArtifactType,
    location: *mut *const c_char,
) -> ErrorPtr {
    ffi_entry!(non_null(b as "backend", artifact_type, location) {
        // SAFETY: `b` is null (refused by `backend`) or the backend the server passed to
        // `TRITONBACKEND_Initialize`, alive until `TRITONBACKEND_Finalize` returns
        // (tritonbackend.h).
        let b = unsafe { backend(b)? };
        // SAFETY: `artifact_type`, `location` are checked non-null above and, by the header's
        // contract, valid for writing one value.
        unsafe {
            *artifact_type = ARTIFACT_FILESYSTEM;
            *location = b.artifacts.as_ptr();
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_BackendMemoryManager(
    b: *mut TRITONBACKEND_Backend,
    manager: *mut *mut TRITONBACKEND_MemoryManager,
) -> ErrorPtr {
    ffi_entry!(non_null(b as "backend", manager) {
        // SAFETY: `b` is null (refused by `backend`) or the backend the server passed to
        // `TRITONBACKEND_Initialize`, alive until `TRITONBACKEND_Finalize` returns
        // (tritonbackend.h).
        let b = unsafe { backend(b)? };
        // SAFETY: `manager` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *manager = (&b.memory as *const TRITONBACKEND_MemoryManager).cast_mut() };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_BackendState(
    b: *mut TRITONBACKEND_Backend,
    state: *mut *mut c_void,
) -> ErrorPtr {
    ffi_entry!(non_null(b as "backend", state) {
        // SAFETY: `b` is null (refused by `backend`) or the backend the server passed to
        // `TRITONBACKEND_Initialize`, alive until `TRITONBACKEND_Finalize` returns
        // (tritonbackend.h).
        let b = unsafe { backend(b)? };
        // SAFETY: `state` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *state = b.state.load(Ordering::Acquire) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_BackendSetState(
    b: *mut TRITONBACKEND_Backend,
    state: *mut c_void,
) -> ErrorPtr {
    ffi_entry!(non_null(b as "backend") {
        // SAFETY: `b` is null (refused by `backend`) or the backend the server passed to
        // `TRITONBACKEND_Initialize`, alive until `TRITONBACKEND_Finalize` returns
        // (tritonbackend.h).
        let b = unsafe { backend(b)? };
        b.state.store(state, Ordering::Release);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_BackendAttributeAddPreferredInstanceGroup(
    attributes: *mut TRITONBACKEND_BackendAttribute,
    kind: u32,
    count: u64,
    device_ids: *const u64,
    id_count: u64,
) -> ErrorPtr {
    ffi_entry!(non_null(attributes as "backend_attributes") {
        if kind > INSTANCEGROUPKIND_MODEL {
            return Err(error::invalid_arg(format!(
                "unknown instance group kind {kind}"
            )));
        }
        let ids = if id_count == 0 || device_ids.is_null() {
            Vec::new()
        } else {
            // SAFETY: `device_ids` is non-null (checked above) and, by the header's contract,
            // points to `id_count as usize` elements that stay unchanged for the call; they are
            // copied before it returns.
            unsafe { std::slice::from_raw_parts(device_ids, id_count as usize) }.to_vec()
        };
        // SAFETY: `attributes` is checked non-null above and is the attribute object the server
        // passed to `TRITONBACKEND_GetBackendAttribute`, which it owns and does not touch until
        // that call returns (the backend may only use it during the call).
        unsafe { (*attributes).preferred_groups.push((kind, count, ids)) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_BackendAttributeSetParallelModelInstanceLoading(
    attributes: *mut TRITONBACKEND_BackendAttribute,
    enabled: bool,
) -> ErrorPtr {
    ffi_entry!(non_null(attributes as "backend_attributes") {
        // SAFETY: `attributes` is checked non-null above and is the attribute object the server
        // passed to `TRITONBACKEND_GetBackendAttribute`, which it owns and does not touch until
        // that call returns (the backend may only use it during the call).
        unsafe { (*attributes).parallel_instance_loading = enabled };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ApiVersion(major: *mut u32, minor: *mut u32) -> ErrorPtr {
    // SAFETY: `write_version` refuses null pointers; otherwise `major` and `minor` are the
    // caller's out-parameters, valid for writing a `uint32_t` (tritonbackend.h).
    ffi_entry!(non_null(major, minor) { unsafe { write_version(major, minor, BACKEND_API_VERSION) } })
}
