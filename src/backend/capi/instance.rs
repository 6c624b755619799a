//! `TRITONBACKEND_ModelInstance` and [`CapiInstance`], the
//! `ModelInstance` that hands a batch's requests to the backend's
//! `TRITONBACKEND_ModelInstanceExecute`.

use std::{
    ffi::{c_char, c_void, CString},
    sync::{
        atomic::{AtomicBool, AtomicPtr, Ordering},
        Arc, OnceLock,
    },
    time::Duration,
};

use anyhow::bail;

use super::{model::TRITONBACKEND_Model, request::TRITONBACKEND_Request};
use crate::{
    backend::{BackendRequest, InstanceSpec, ModelInstance},
    config::is_decoupled,
    metrics::ModelStats,
    proto::inference::{model_config::SchedulingChoice, ModelConfig},
    triton_abi::{
        buffer::TRITONSERVER_BufferAttributes,
        error::{self, non_null, status, ErrorPtr},
        message::TRITONSERVER_Message,
        parameter::lossy_cstring,
        types::{InstanceGroupKind, INSTANCEGROUPKIND_CPU},
    },
    types::{InferError, InferResult, Tensor},
};

/// Opaque to C.
pub struct TRITONBACKEND_ModelInstance {
    name: CString,
    pub model: Arc<TRITONBACKEND_Model>,
    host_policy: String,
    state: AtomicPtr<c_void>,
    initialized: bool,
    /// Where the backend's statistics reports go: the model version's
    /// counters and this instance's block, set once they exist.
    stats: OnceLock<(Arc<ModelStats>, usize)>,
    /// `max_batch_size > 0`: a request counts its first dimension's rows.
    batching: bool,
    /// The backend has reported statistics: it counts its executions.
    reports: AtomicBool,
}

/// One instance, owned by its compute worker.
pub struct CapiInstance {
    /// Boxed: the backend keeps its address.
    instance: Box<TRITONBACKEND_ModelInstance>,
    decoupled: bool,
    /// The implicit-state outputs the configuration declares.
    state_outputs: Arc<[String]>,
}

// SAFETY: the backend's state pointer is the backend's to synchronize;
// Triton also calls an instance's functions from threads of its choice
// (never two at once, which holds here: one worker owns the instance).
unsafe impl Send for CapiInstance {}
// SAFETY: the instance is shared only as `&` by the C functions above, which read immutable fields
// or atomics; its raw pointers (model, state) are never dereferenced through a shared reference
// here.
unsafe impl Sync for TRITONBACKEND_ModelInstance {}

impl TRITONBACKEND_ModelInstance {
    /// The handle the backend library's entry points take (`backend`
    /// sits below this layer, so they name it untyped).
    fn as_c(&mut self) -> *mut c_void {
        (self as *mut Self).cast()
    }
}

impl CapiInstance {
    pub fn new(
        model: Arc<TRITONBACKEND_Model>,
        config: &ModelConfig,
        spec: &InstanceSpec,
    ) -> anyhow::Result<Self> {
        let mut instance = Box::new(TRITONBACKEND_ModelInstance {
            name: lossy_cstring(&spec.name),
            model,
            host_policy: r#"{"cpu":{}}"#.to_owned(),
            state: AtomicPtr::new(std::ptr::null_mut()),
            initialized: false,
            stats: OnceLock::new(),
            batching: config.max_batch_size > 0,
            reports: AtomicBool::new(false),
        });
        if let Some(init) = instance.model.backend.entry.instance_initialize {
            // SAFETY: the backend's entry point with a live instance.
            if let Some(e) = unsafe { error::take(init(instance.as_c())) } {
                bail!(
                    "TRITONBACKEND_ModelInstanceInitialize failed: {}",
                    e.message
                );
            }
        }
        instance.initialized = true;
        let state_outputs = match &config.scheduling_choice {
            Some(SchedulingChoice::SequenceBatching(s)) => {
                s.state.iter().map(|st| st.output_name.clone()).collect()
            }
            _ => Arc::from(Vec::new()),
        };
        Ok(Self {
            instance,
            decoupled: is_decoupled(config),
            state_outputs,
        })
    }
}

impl Drop for TRITONBACKEND_ModelInstance {
    fn drop(&mut self) {
        if !self.initialized {
            return;
        }
        if let Some(finalize) = self.model.backend.entry.instance_finalize {
            let _running = super::finalizing::Finalizing::enter(format!(
                "TRITONBACKEND_ModelInstanceFinalize (instance '{}')",
                self.name.to_string_lossy()
            ));
            // SAFETY: the instance is whole and no execution is running.
            if let Some(e) = unsafe { error::take(finalize(self.as_c())) } {
                tracing::error!(
                    "instance '{}': TRITONBACKEND_ModelInstanceFinalize failed: {}",
                    self.name.to_string_lossy(),
                    e.message
                );
            }
        }
    }
}

impl ModelInstance for CapiInstance {
    fn execute(&mut self, _inputs: &[Tensor], _outputs: &[&str]) -> InferResult<Vec<Tensor>> {
        Err(InferError::internal(
            "a C API backend instance executes requests, not merged tensors",
        ))
    }

    fn takes_requests(&self) -> bool {
        true
    }

    fn attach_statistics(&mut self, stats: Arc<ModelStats>, block: usize) {
        let _ = self.instance.stats.set((stats, block));
    }

    fn reports_statistics(&self) -> bool {
        self.instance.reports.load(Ordering::Acquire)
    }

    fn execute_requests(&mut self, requests: Vec<BackendRequest>) {
        let model = &self.instance.model;
        let mut handles: Vec<*mut TRITONBACKEND_Request> = requests
            .into_iter()
            .map(|r| {
                TRITONBACKEND_Request::into_raw(
                    r,
                    &model.outputs,
                    self.decoupled,
                    self.state_outputs.clone(),
                )
            })
            .collect();
        let released: Vec<_> = handles
            .iter()
            // SAFETY: just created, not yet handed to the backend.
            .map(|&h| unsafe { (*h).release_flag() })
            .collect();
        let count = handles.len() as u32;
        let execute = model.backend.entry.execute;
        // SAFETY: the backend's entry point; it owns the requests now.
        let result = unsafe { execute(self.instance.as_c(), handles.as_mut_ptr(), count) };
        // SAFETY: the error, if any, is the backend's to give us.
        if let Some(e) = unsafe { error::take(result) } {
            // An error gives every request back to the server, which
            // answers each with it (and releases it).
            for (handle, flag) in handles.into_iter().zip(released) {
                // SAFETY: still allocated unless the backend released it,
                // which `claim` rules out.
                if TRITONBACKEND_Request::claim(&flag) {
                    // SAFETY: `handle` came from `TRITONBACKEND_Request::into_raw` for this
                    // execution, and winning `claim` means the backend has not released it and
                    // never will (the backend's release would lose the same `claim`).
                    unsafe { TRITONBACKEND_Request::fail_and_free(handle, e.clone()) };
                }
            }
        }
    }
}

unsafe fn instance<'a>(
    i: *mut TRITONBACKEND_ModelInstance,
) -> Result<&'a TRITONBACKEND_ModelInstance, ErrorPtr> {
    non_null(i, "instance")?;
    // SAFETY: checked non-null above; callers pass the instance the server gave the backend's
    // `ModelInstance*` callbacks, alive until `TRITONBACKEND_ModelInstanceFinalize` returns, and
    // only shared references are made from it.
    Ok(unsafe { &*i })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ModelInstanceName(
    i: *mut TRITONBACKEND_ModelInstance,
    name: *mut *const c_char,
) -> ErrorPtr {
    ffi_entry!(non_null(i as "instance", name) {
        // SAFETY: `i` is null (refused by `instance`) or the instance the server passed to the
        // backend's `ModelInstance*` callbacks, alive until `TRITONBACKEND_ModelInstanceFinalize`
        // returns (tritonbackend.h).
        let i = unsafe { instance(i)? };
        // SAFETY: `name` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *name = i.name.as_ptr() };
        Ok(())
    })
}

/// Every instance is a CPU instance here (KIND_GPU is refused at load).
#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ModelInstanceKind(
    i: *mut TRITONBACKEND_ModelInstance,
    kind: *mut InstanceGroupKind,
) -> ErrorPtr {
    ffi_entry!(non_null(i as "instance", kind) {
        // SAFETY: `i` is null (refused by `instance`) or the instance the server passed to the
        // backend's `ModelInstance*` callbacks, alive until `TRITONBACKEND_ModelInstanceFinalize`
        // returns (tritonbackend.h).
        unsafe { instance(i)? };
        // SAFETY: `kind` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *kind = INSTANCEGROUPKIND_CPU };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ModelInstanceDeviceId(
    i: *mut TRITONBACKEND_ModelInstance,
    device_id: *mut i32,
) -> ErrorPtr {
    ffi_entry!(non_null(i as "instance", device_id) {
        // SAFETY: `i` is null (refused by `instance`) or the instance the server passed to the
        // backend's `ModelInstance*` callbacks, alive until `TRITONBACKEND_ModelInstanceFinalize`
        // returns (tritonbackend.h).
        unsafe { instance(i)? };
        // SAFETY: `device_id` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *device_id = 0 };
        Ok(())
    })
}

/// Triton's default host policy of a CPU instance: `{"cpu":{}}`.
#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ModelInstanceHostPolicy(
    i: *mut TRITONBACKEND_ModelInstance,
    host_policy: *mut *mut TRITONSERVER_Message,
) -> ErrorPtr {
    ffi_entry!(non_null(i as "instance", host_policy) {
        // SAFETY: `i` is null (refused by `instance`) or the instance the server passed to the
        // backend's `ModelInstance*` callbacks, alive until `TRITONBACKEND_ModelInstanceFinalize`
        // returns (tritonbackend.h).
        let i = unsafe { instance(i)? };
        // SAFETY: `host_policy` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *host_policy = TRITONSERVER_Message::boxed(i.host_policy.clone()) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ModelInstanceIsPassive(
    i: *mut TRITONBACKEND_ModelInstance,
    is_passive: *mut bool,
) -> ErrorPtr {
    ffi_entry!(non_null(i as "instance", is_passive) {
        // SAFETY: `i` is null (refused by `instance`) or the instance the server passed to the
        // backend's `ModelInstance*` callbacks, alive until `TRITONBACKEND_ModelInstanceFinalize`
        // returns (tritonbackend.h).
        unsafe { instance(i)? };
        // SAFETY: `is_passive` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *is_passive = false };
        Ok(())
    })
}

/// No optimization profiles (a TensorRT notion) exist here.
#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ModelInstanceProfileCount(
    i: *mut TRITONBACKEND_ModelInstance,
    count: *mut u32,
) -> ErrorPtr {
    ffi_entry!(non_null(i as "instance", count) {
        // SAFETY: `i` is null (refused by `instance`) or the instance the server passed to the
        // backend's `ModelInstance*` callbacks, alive until `TRITONBACKEND_ModelInstanceFinalize`
        // returns (tritonbackend.h).
        unsafe { instance(i)? };
        // SAFETY: `count` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *count = 0 };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ModelInstanceProfileName(
    i: *mut TRITONBACKEND_ModelInstance,
    index: u32,
    _profile_name: *mut *const c_char,
) -> ErrorPtr {
    ffi_entry!(non_null(i as "instance") {
        // SAFETY: `i` is null (refused by `instance`) or the instance the server passed to the
        // backend's `ModelInstance*` callbacks, alive until `TRITONBACKEND_ModelInstanceFinalize`
        // returns (tritonbackend.h).
        unsafe { instance(i)? };
        Err(error::invalid_arg(format!(
            "out of bounds index {index}: instance has no profiles"
        )))
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ModelInstanceSecondaryDeviceCount(
    i: *mut TRITONBACKEND_ModelInstance,
    count: *mut u32,
) -> ErrorPtr {
    ffi_entry!(non_null(i as "instance", count) {
        // SAFETY: `i` is null (refused by `instance`) or the instance the server passed to the
        // backend's `ModelInstance*` callbacks, alive until `TRITONBACKEND_ModelInstanceFinalize`
        // returns (tritonbackend.h).
        unsafe { instance(i)? };
        // SAFETY: `count` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *count = 0 };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ModelInstanceSecondaryDeviceProperties(
    i: *mut TRITONBACKEND_ModelInstance,
    index: u32,
    _kind: *mut *const c_char,
    _id: *mut i64,
) -> ErrorPtr {
    ffi_entry!(non_null(i as "instance") {
        // SAFETY: `i` is null (refused by `instance`) or the instance the server passed to the
        // backend's `ModelInstance*` callbacks, alive until `TRITONBACKEND_ModelInstanceFinalize`
        // returns (tritonbackend.h).
        unsafe { instance(i)? };
        Err(error::invalid_arg(format!(
            "out of bounds index {index}: instance has no secondary devices"
        )))
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ModelInstanceModel(
    i: *mut TRITONBACKEND_ModelInstance,
    model: *mut *mut TRITONBACKEND_Model,
) -> ErrorPtr {
    ffi_entry!(non_null(i as "instance", model) {
        // SAFETY: `i` is null (refused by `instance`) or the instance the server passed to the
        // backend's `ModelInstance*` callbacks, alive until `TRITONBACKEND_ModelInstanceFinalize`
        // returns (tritonbackend.h).
        let i = unsafe { instance(i)? };
        // SAFETY: `model` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *model = i.model.as_ptr() };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ModelInstanceState(
    i: *mut TRITONBACKEND_ModelInstance,
    state: *mut *mut c_void,
) -> ErrorPtr {
    ffi_entry!(non_null(i as "instance", state) {
        // SAFETY: `i` is null (refused by `instance`) or the instance the server passed to the
        // backend's `ModelInstance*` callbacks, alive until `TRITONBACKEND_ModelInstanceFinalize`
        // returns (tritonbackend.h).
        let i = unsafe { instance(i)? };
        // SAFETY: `state` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *state = i.state.load(Ordering::Acquire) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ModelInstanceSetState(
    i: *mut TRITONBACKEND_ModelInstance,
    state: *mut c_void,
) -> ErrorPtr {
    ffi_entry!(non_null(i as "instance") {
        // SAFETY: `i` is null (refused by `instance`) or the instance the server passed to the
        // backend's `ModelInstance*` callbacks, alive until `TRITONBACKEND_ModelInstanceFinalize`
        // returns (tritonbackend.h).
        let i = unsafe { instance(i)? };
        i.state.store(state, Ordering::Release);
        Ok(())
    })
}

/// The compute input, infer and output durations of a backend's four
/// timestamps (Triton: exec start → compute start → compute end → exec
/// end); a timestamp out of order gives zero, not a wrapped value.
fn phases(exec_start: u64, compute_start: u64, compute_end: u64, exec_end: u64) -> [Duration; 3] {
    [
        compute_start.saturating_sub(exec_start),
        compute_end.saturating_sub(compute_start),
        exec_end.saturating_sub(compute_end),
    ]
    .map(Duration::from_nanos)
}

/// One request's part of an execution, as Triton's `UpdateSuccess`: on
/// success, the request's batch rows count as inferences and its compute
/// phases as the request's. Its success or failure and whole duration are
/// counted when its response reaches the client, and its queue time when
/// it was scheduled, so this adds neither. From the first report on, the
/// scheduler leaves the instance's executions to the backend.
#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ModelInstanceReportStatistics(
    i: *mut TRITONBACKEND_ModelInstance,
    request: *mut TRITONBACKEND_Request,
    success: bool,
    exec_start_ns: u64,
    compute_start_ns: u64,
    compute_end_ns: u64,
    exec_end_ns: u64,
) -> ErrorPtr {
    ffi_entry!(non_null(i as "instance", request) {
        // SAFETY: `instance` refuses a null `i`; otherwise it is the instance the server passed to
        // the backend, alive until its finalize returns.
        let i = unsafe { instance(i)? };
        // SAFETY: `request` is checked non-null above and, by the header's contract, a request of
        // this execution that the backend has not released yet.
        let rows = unsafe { super::request::batch_size_of(request, i.batching)? };
        i.reports.store(true, Ordering::Release);
        if let (true, Some((stats, block))) = (success, i.stats.get()) {
            let c = stats.shard(*block);
            let [input, infer, output] =
                phases(exec_start_ns, compute_start_ns, compute_end_ns, exec_end_ns);
            c.add_inferences(rows);
            c.compute_input.record(input);
            c.compute_infer.record(infer);
            c.compute_output.record(output);
        }
        Ok(())
    })
}

/// One execution of `batch_size` rows, as Triton's `UpdateInferBatchStats`:
/// the execution count, the batch size's statistics and the last
/// inference time.
#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ModelInstanceReportBatchStatistics(
    i: *mut TRITONBACKEND_ModelInstance,
    batch_size: u64,
    exec_start_ns: u64,
    compute_start_ns: u64,
    compute_end_ns: u64,
    exec_end_ns: u64,
) -> ErrorPtr {
    ffi_entry!(non_null(i as "instance") {
        // SAFETY: `instance` refuses a null `i`; otherwise it is the instance the server passed to
        // the backend, alive until its finalize returns.
        let i = unsafe { instance(i)? };
        i.reports.store(true, Ordering::Release);
        if let Some((stats, block)) = i.stats.get() {
            let [input, infer, output] =
                phases(exec_start_ns, compute_start_ns, compute_end_ns, exec_end_ns);
            let rows = usize::try_from(batch_size).unwrap_or(usize::MAX);
            stats.shard(*block).record_batch(rows, input, infer, output);
        }
        Ok(())
    })
}

/// Accepted and ignored: memory usage is not reported by this server.
#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ModelInstanceReportMemoryUsage(
    i: *mut TRITONBACKEND_ModelInstance,
    _usage: *mut *mut TRITONSERVER_BufferAttributes,
    _usage_size: u32,
) -> ErrorPtr {
    // SAFETY: `instance` refuses a null `i`; otherwise it is the instance the server passed to the
    // backend, alive until its finalize returns.
    ffi_entry!(non_null(i as "instance") { status(unsafe { instance(i) }.map(|_| ())) })
}
