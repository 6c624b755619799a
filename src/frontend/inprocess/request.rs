//! `TRITONSERVER_InferenceRequest`: a request a backend (or any in-process
//! caller) builds to run another model of this server. Input data is
//! copied when appended, so the caller's buffers are free again as soon as
//! the call returns; the request itself stays the caller's until its
//! release callback (after its final response) hands it back.

use std::{
    ffi::{c_char, c_void, CString},
    ptr,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
};

use bytes::{Bytes, BytesMut};
use futures::task::AtomicWaker;

use super::{
    allocator::TRITONSERVER_ResponseAllocator, response::TRITONSERVER_InferenceResponse,
    server::TRITONSERVER_Server,
};
use crate::triton_abi::{
    error::{c_str, invalid_arg, non_null, not_found, out, status, unsupported, ErrorPtr},
    parameter::{lossy_cstring, ParamValue as CParam, TRITONSERVER_Parameter},
    types::{
        datatype_from_c, MemoryType, TritonDataType, MEMORY_CPU, MEMORY_CPU_PINNED,
        REQUEST_FLAG_SEQUENCE_END, REQUEST_FLAG_SEQUENCE_START,
    },
};
use crate::types::{DataType, InferRequest, ParamValue, RequestedOutput, Tensor};

pub type RequestReleaseFn = unsafe extern "C" fn(
    request: *mut TRITONSERVER_InferenceRequest,
    flags: u32,
    userp: *mut c_void,
);

pub type ResponseCompleteFn = unsafe extern "C" fn(
    response: *mut TRITONSERVER_InferenceResponse,
    flags: u32,
    userp: *mut c_void,
);

/// A correlation id as set by the caller (Triton keeps one of the two).
#[derive(Debug, Clone, Default)]
pub enum Correlation {
    #[default]
    None,
    Uint(u64),
    Str(CString),
}

pub struct Input {
    pub name: CString,
    pub datatype: DataType,
    pub shape: Vec<i64>,
    /// The appended buffers, each copied when appended.
    pub chunks: Vec<Bytes>,
}

impl Input {
    fn data(&self) -> Bytes {
        match self.chunks.as_slice() {
            [] => Bytes::new(),
            [one] => one.clone(),
            many => {
                let mut all = BytesMut::with_capacity(many.iter().map(Bytes::len).sum());
                for c in many {
                    all.extend_from_slice(c);
                }
                all.freeze()
            }
        }
    }
}

/// Where a request's responses go: the caller's allocator and callback.
#[derive(Clone, Copy)]
pub struct ResponseCallback {
    pub allocator: *mut TRITONSERVER_ResponseAllocator,
    pub allocator_userp: *mut c_void,
    pub response_fn: ResponseCompleteFn,
    pub response_userp: *mut c_void,
}

/// Set by `TRITONSERVER_InferenceRequestCancel`, watched by the request's
/// task on the shard (dropping its future cancels the queued work).
#[derive(Default)]
pub struct Cancel {
    pub cancelled: AtomicBool,
    pub waker: AtomicWaker,
}

impl Cancel {
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
        self.waker.wake();
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }
}

/// Opaque to C.
pub struct TRITONSERVER_InferenceRequest {
    pub server: Arc<TRITONSERVER_Server>,
    pub model_name: String,
    pub model_version: i64,
    pub id: CString,
    pub flags: u32,
    pub correlation: Correlation,
    pub priority: u64,
    pub timeout_us: u64,
    pub inputs: Vec<Input>,
    pub outputs: Vec<CString>,
    pub parameters: Vec<TRITONSERVER_Parameter>,
    pub release: Option<(RequestReleaseFn, *mut c_void)>,
    pub response: Option<ResponseCallback>,
    /// Replaced by each `ServerInferAsync`, so a reused request starts
    /// uncancelled.
    pub cancel: Arc<Cancel>,
}

impl TRITONSERVER_InferenceRequest {
    /// The version string our table resolves: empty (the version policy
    /// chooses) for Triton's -1 ("latest").
    pub fn version_str(&self) -> String {
        if self.model_version < 0 {
            String::new()
        } else {
            self.model_version.to_string()
        }
    }

    /// Our request, as every protocol builds it: the correlation id and
    /// sequence flags, priority and timeout become the KServe parameters
    /// the schedulers read.
    pub fn to_infer_request(&self) -> Result<InferRequest, ErrorPtr> {
        let mut parameters = crate::types::Parameters::new();
        for p in &self.parameters {
            let name = p.name.to_string_lossy().into_owned();
            let value = match &p.value {
                CParam::String(s) => ParamValue::String(s.to_string_lossy().into_owned()),
                CParam::Int(v) => ParamValue::Int(*v),
                CParam::Bool(v) => ParamValue::Bool(*v),
                CParam::Double(v) => ParamValue::Double(*v),
                CParam::Bytes { .. } => {
                    return Err(unsupported(format!(
                        "request parameter '{name}': BYTES parameters are not supported on inference requests"
                    )))
                }
            };
            parameters.insert(name, value);
        }
        match &self.correlation {
            Correlation::None => {}
            Correlation::Uint(v) => {
                parameters.insert("sequence_id".into(), ParamValue::Uint(*v));
            }
            Correlation::Str(s) => {
                parameters.insert(
                    "sequence_id".into(),
                    ParamValue::String(s.to_string_lossy().into_owned()),
                );
            }
        }
        if self.flags & REQUEST_FLAG_SEQUENCE_START != 0 {
            parameters.insert("sequence_start".into(), ParamValue::Bool(true));
        }
        if self.flags & REQUEST_FLAG_SEQUENCE_END != 0 {
            parameters.insert("sequence_end".into(), ParamValue::Bool(true));
        }
        if self.priority != 0 {
            parameters.insert("priority".into(), ParamValue::Uint(self.priority));
        }
        if self.timeout_us != 0 {
            parameters.insert("timeout".into(), ParamValue::Uint(self.timeout_us));
        }
        Ok(InferRequest {
            model_name: self.model_name.clone(),
            model_version: self.version_str(),
            id: self.id.to_string_lossy().into_owned(),
            inputs: self
                .inputs
                .iter()
                .map(|i| {
                    Tensor::new(
                        i.name.to_string_lossy().into_owned(),
                        i.datatype,
                        i.shape.clone(),
                        i.data(),
                    )
                })
                .collect(),
            outputs: self
                .outputs
                .iter()
                .map(|name| RequestedOutput {
                    name: name.to_string_lossy().into_owned(),
                    parameters: Default::default(),
                })
                .collect(),
            parameters,
            trace: Default::default(),
        })
    }

    fn input_mut(&mut self, name: &str) -> Result<&mut Input, ErrorPtr> {
        let model = &self.model_name;
        self.inputs
            .iter_mut()
            .find(|i| i.name.as_bytes() == name.as_bytes())
            .ok_or_else(|| {
                invalid_arg(format!(
                    "input '{name}' does not exist in the inference request for model '{model}'"
                ))
            })
    }
}

/// Runs `f` on the request behind `request`, or fails for a null pointer.
unsafe fn with_request(
    request: *mut TRITONSERVER_InferenceRequest,
    f: impl FnOnce(&mut TRITONSERVER_InferenceRequest) -> Result<(), ErrorPtr>,
) -> ErrorPtr {
    if request.is_null() {
        return invalid_arg("inference_request is null");
    }
    // SAFETY: `request` is checked non-null above and is a request the server gave this backend's
    // `ModelInstanceExecute` that it has not released yet (tritonbackend.h).
    status(f(unsafe { &mut *request }))
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestNew(
    inference_request: *mut *mut TRITONSERVER_InferenceRequest,
    server: *mut TRITONSERVER_Server,
    model_name: *const c_char,
    model_version: i64,
) -> ErrorPtr {
    ffi_entry!(non_null(inference_request) {
        // SAFETY: `server` is null (refused by `from_c`) or the server `TRITONBACKEND_ModelServer`
        // handed out, which a backend may use while its model lives; `from_c` takes a reference of
        // its own.
        let server = unsafe { TRITONSERVER_Server::from_c(server) }?;
        // SAFETY: `model_name` is null (refused by `c_str`) or a NUL-terminated string the caller
        // keeps valid for the call (the header's `const char*` contract); nothing keeps the `&str`
        // past the call.
        let name = unsafe { c_str(model_name, "model_name") }?;
        // As Triton: the model must be known when the request is made.
        let version = if model_version < 0 {
            String::new()
        } else {
            model_version.to_string()
        };
        server
            .with_model(name, &version, |_| ())
            .map_err(|e| not_found(e.message))?;
        let request = Box::new(TRITONSERVER_InferenceRequest {
            server,
            model_name: name.to_string(),
            model_version,
            id: CString::default(),
            flags: 0,
            correlation: Correlation::None,
            priority: 0,
            timeout_us: 0,
            inputs: Vec::new(),
            outputs: Vec::new(),
            parameters: Vec::new(),
            release: None,
            response: None,
            cancel: Arc::default(),
        });
        // SAFETY: `inference_request` is checked non-null above and, by the header's contract,
        // valid for writing one value.
        unsafe { *inference_request = Box::into_raw(request) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestDelete(
    inference_request: *mut TRITONSERVER_InferenceRequest,
) -> ErrorPtr {
    ffi_entry!({
        if !inference_request.is_null() {
            // SAFETY: `inference_request` is non-null (checked) and came from `Box::into_raw` in
            // the matching New function; the header makes this Delete its one release, so nothing
            // uses it afterwards.
            drop(unsafe { Box::from_raw(inference_request) });
        }
        ptr::null_mut()
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestId(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    id: *mut *const c_char,
) -> ErrorPtr {
    // SAFETY: `inference_request` is null (refused by `with_request`) or a request from
    // `TRITONSERVER_InferenceRequestNew` that the caller has not deleted and does not use from
    // another thread meanwhile (tritonserver.h), so the `&mut` is unique; other pointers are
    // checked inside.
    ffi_entry!(non_null(inference_request) { unsafe { with_request(inference_request, |r| out(id, "id", r.id.as_ptr())) } })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestSetId(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    id: *const c_char,
) -> ErrorPtr {
    ffi_entry!(non_null(inference_request) {
        // SAFETY: `inference_request` is null (refused by `with_request`) or a request from
        // `TRITONSERVER_InferenceRequestNew` that the caller has not deleted and does not use from
        // another thread meanwhile (tritonserver.h), so the `&mut` is unique; other pointers are
        // checked inside.
        unsafe {
            with_request(inference_request, |r| {
                r.id = lossy_cstring(c_str(id, "id")?);
                Ok(())
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestFlags(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    flags: *mut u32,
) -> ErrorPtr {
    // SAFETY: `inference_request` is null (refused by `with_request`) or a request from
    // `TRITONSERVER_InferenceRequestNew` that the caller has not deleted and does not use from
    // another thread meanwhile (tritonserver.h), so the `&mut` is unique; other pointers are
    // checked inside.
    ffi_entry!(non_null(inference_request) { unsafe { with_request(inference_request, |r| out(flags, "flags", r.flags)) } })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestSetFlags(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    flags: u32,
) -> ErrorPtr {
    ffi_entry!(non_null(inference_request) {
        // SAFETY: `inference_request` is null (refused by `with_request`) or a request from
        // `TRITONSERVER_InferenceRequestNew` that the caller has not deleted and does not use from
        // another thread meanwhile (tritonserver.h), so the `&mut` is unique; other pointers are
        // checked inside.
        unsafe {
            with_request(inference_request, |r| {
                r.flags = flags;
                Ok(())
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestCorrelationId(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    correlation_id: *mut u64,
) -> ErrorPtr {
    ffi_entry!(non_null(inference_request) {
        // SAFETY: `inference_request` is null (refused by `with_request`) or a request from
        // `TRITONSERVER_InferenceRequestNew` that the caller has not deleted and does not use from
        // another thread meanwhile (tritonserver.h), so the `&mut` is unique; other pointers are
        // checked inside.
        unsafe {
            with_request(inference_request, |r| match &r.correlation {
                Correlation::Str(_) => Err(invalid_arg(
                    "given request's correlation id is not an unsigned int",
                )),
                Correlation::Uint(v) => out(correlation_id, "correlation_id", *v),
                Correlation::None => out(correlation_id, "correlation_id", 0),
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestCorrelationIdString(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    correlation_id: *mut *const c_char,
) -> ErrorPtr {
    ffi_entry!(non_null(inference_request) {
        // SAFETY: `inference_request` is null (refused by `with_request`) or a request from
        // `TRITONSERVER_InferenceRequestNew` that the caller has not deleted and does not use from
        // another thread meanwhile (tritonserver.h), so the `&mut` is unique; other pointers are
        // checked inside.
        unsafe {
            with_request(inference_request, |r| match &r.correlation {
                Correlation::Str(s) => out(correlation_id, "correlation_id", s.as_ptr()),
                _ => Err(invalid_arg(
                    "given request's correlation id is not a string",
                )),
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestSetCorrelationId(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    correlation_id: u64,
) -> ErrorPtr {
    ffi_entry!(non_null(inference_request) {
        // SAFETY: `inference_request` is null (refused by `with_request`) or a request from
        // `TRITONSERVER_InferenceRequestNew` that the caller has not deleted and does not use from
        // another thread meanwhile (tritonserver.h), so the `&mut` is unique; other pointers are
        // checked inside.
        unsafe {
            with_request(inference_request, |r| {
                r.correlation = Correlation::Uint(correlation_id);
                Ok(())
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestSetCorrelationIdString(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    correlation_id: *const c_char,
) -> ErrorPtr {
    ffi_entry!(non_null(inference_request) {
        // SAFETY: `inference_request` is null (refused by `with_request`) or a request from
        // `TRITONSERVER_InferenceRequestNew` that the caller has not deleted and does not use from
        // another thread meanwhile (tritonserver.h), so the `&mut` is unique; other pointers are
        // checked inside.
        unsafe {
            with_request(inference_request, |r| {
                let id = c_str(correlation_id, "correlation_id")?;
                // An empty string is "no correlation id", as in Triton.
                r.correlation = if id.is_empty() {
                    Correlation::None
                } else {
                    Correlation::Str(lossy_cstring(id))
                };
                Ok(())
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestCancel(
    inference_request: *mut TRITONSERVER_InferenceRequest,
) -> ErrorPtr {
    ffi_entry!(non_null(inference_request) {
        // SAFETY: `inference_request` is null (refused by `with_request`) or a request from
        // `TRITONSERVER_InferenceRequestNew` that the caller has not deleted and does not use from
        // another thread meanwhile (tritonserver.h), so the `&mut` is unique; other pointers are
        // checked inside.
        unsafe {
            with_request(inference_request, |r| {
                r.cancel.cancel();
                Ok(())
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestIsCancelled(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    is_cancelled: *mut bool,
) -> ErrorPtr {
    ffi_entry!(non_null(inference_request) {
        // SAFETY: `inference_request` is null (refused by `with_request`) or a request from
        // `TRITONSERVER_InferenceRequestNew` that the caller has not deleted and does not use from
        // another thread meanwhile (tritonserver.h), so the `&mut` is unique; other pointers are
        // checked inside.
        unsafe {
            with_request(inference_request, |r| {
                out(is_cancelled, "is_cancelled", r.cancel.is_cancelled())
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestPriority(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    priority: *mut u32,
) -> ErrorPtr {
    ffi_entry!(non_null(inference_request) {
        // SAFETY: `inference_request` is null (refused by `with_request`) or a request from
        // `TRITONSERVER_InferenceRequestNew` that the caller has not deleted and does not use from
        // another thread meanwhile (tritonserver.h), so the `&mut` is unique; other pointers are
        // checked inside.
        unsafe {
            with_request(inference_request, |r| {
                out(
                    priority,
                    "priority",
                    u32::try_from(r.priority).unwrap_or(u32::MAX),
                )
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestPriorityUInt64(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    priority: *mut u64,
) -> ErrorPtr {
    ffi_entry!(non_null(inference_request) {
        // SAFETY: `inference_request` is null (refused by `with_request`) or a request from
        // `TRITONSERVER_InferenceRequestNew` that the caller has not deleted and does not use from
        // another thread meanwhile (tritonserver.h), so the `&mut` is unique; other pointers are
        // checked inside.
        unsafe { with_request(inference_request, |r| out(priority, "priority", r.priority)) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestSetPriority(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    priority: u32,
) -> ErrorPtr {
    ffi_entry!(non_null(inference_request) {
        // SAFETY: `inference_request` is null (refused by `with_request`) or a request from
        // `TRITONSERVER_InferenceRequestNew` that the caller has not deleted and does not use from
        // another thread meanwhile (tritonserver.h), so the `&mut` is unique; other pointers are
        // checked inside.
        unsafe {
            with_request(inference_request, |r| {
                r.priority = u64::from(priority);
                Ok(())
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestSetPriorityUInt64(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    priority: u64,
) -> ErrorPtr {
    ffi_entry!(non_null(inference_request) {
        // SAFETY: `inference_request` is null (refused by `with_request`) or a request from
        // `TRITONSERVER_InferenceRequestNew` that the caller has not deleted and does not use from
        // another thread meanwhile (tritonserver.h), so the `&mut` is unique; other pointers are
        // checked inside.
        unsafe {
            with_request(inference_request, |r| {
                r.priority = priority;
                Ok(())
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestTimeoutMicroseconds(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    timeout_us: *mut u64,
) -> ErrorPtr {
    ffi_entry!(non_null(inference_request) {
        // SAFETY: `inference_request` is null (refused by `with_request`) or a request from
        // `TRITONSERVER_InferenceRequestNew` that the caller has not deleted and does not use from
        // another thread meanwhile (tritonserver.h), so the `&mut` is unique; other pointers are
        // checked inside.
        unsafe {
            with_request(inference_request, |r| {
                out(timeout_us, "timeout_us", r.timeout_us)
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestSetTimeoutMicroseconds(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    timeout_us: u64,
) -> ErrorPtr {
    ffi_entry!(non_null(inference_request) {
        // SAFETY: `inference_request` is null (refused by `with_request`) or a request from
        // `TRITONSERVER_InferenceRequestNew` that the caller has not deleted and does not use from
        // another thread meanwhile (tritonserver.h), so the `&mut` is unique; other pointers are
        // checked inside.
        unsafe {
            with_request(inference_request, |r| {
                r.timeout_us = timeout_us;
                Ok(())
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestAddInput(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    name: *const c_char,
    datatype: TritonDataType,
    shape: *const i64,
    dim_count: u64,
) -> ErrorPtr {
    ffi_entry!(non_null(inference_request) {
        // SAFETY: `inference_request` is null (refused by `with_request`) or a request from
        // `TRITONSERVER_InferenceRequestNew` that the caller has not deleted and does not use from
        // another thread meanwhile (tritonserver.h), so the `&mut` is unique; other pointers are
        // checked inside.
        unsafe {
            with_request(inference_request, |r| {
                let name = c_str(name, "input name")?;
                let dt = datatype_from_c(datatype).ok_or_else(|| {
                    invalid_arg(format!("input '{name}': invalid datatype {datatype}"))
                })?;
                let dims = usize::try_from(dim_count)
                    .map_err(|_| invalid_arg(format!("input '{name}': dim_count too large")))?;
                let shape = if dims == 0 {
                    Vec::new()
                } else {
                    non_null(shape, "shape")?;
                    std::slice::from_raw_parts(shape, dims).to_vec()
                };
                if r.inputs
                    .iter()
                    .any(|i| i.name.as_bytes() == name.as_bytes())
                {
                    return Err(invalid_arg(format!(
                        "input '{name}' already exists in request"
                    )));
                }
                r.inputs.push(Input {
                    name: lossy_cstring(name),
                    datatype: dt,
                    shape,
                    chunks: Vec::new(),
                });
                Ok(())
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestAddRawInput(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    name: *const c_char,
) -> ErrorPtr {
    ffi_entry!(non_null(inference_request) {
        // SAFETY: `inference_request` is null (refused by `with_request`) or a request from
        // `TRITONSERVER_InferenceRequestNew` that the caller has not deleted and does not use from
        // another thread meanwhile (tritonserver.h), so the `&mut` is unique; other pointers are
        // checked inside.
        unsafe {
            with_request(inference_request, |_| {
                let name = c_str(name, "input name")?;
                Err(unsupported(format!(
                    "raw input '{name}': raw (shape-less) inputs are not supported; use TRITONSERVER_InferenceRequestAddInput"
                )))
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestRemoveInput(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    name: *const c_char,
) -> ErrorPtr {
    ffi_entry!(non_null(inference_request) {
        // SAFETY: `inference_request` is null (refused by `with_request`) or a request from
        // `TRITONSERVER_InferenceRequestNew` that the caller has not deleted and does not use from
        // another thread meanwhile (tritonserver.h), so the `&mut` is unique; other pointers are
        // checked inside.
        unsafe {
            with_request(inference_request, |r| {
                let name = c_str(name, "input name")?;
                let before = r.inputs.len();
                r.inputs.retain(|i| i.name.as_bytes() != name.as_bytes());
                if r.inputs.len() == before {
                    return Err(invalid_arg(format!(
                        "input '{name}' does not exist in the inference request"
                    )));
                }
                Ok(())
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestRemoveAllInputs(
    inference_request: *mut TRITONSERVER_InferenceRequest,
) -> ErrorPtr {
    ffi_entry!(non_null(inference_request) {
        // SAFETY: `inference_request` is null (refused by `with_request`) or a request from
        // `TRITONSERVER_InferenceRequestNew` that the caller has not deleted and does not use from
        // another thread meanwhile (tritonserver.h), so the `&mut` is unique; other pointers are
        // checked inside.
        unsafe {
            with_request(inference_request, |r| {
                r.inputs.clear();
                Ok(())
            })
        }
    })
}

unsafe fn append(
    r: &mut TRITONSERVER_InferenceRequest,
    name: *const c_char,
    base: *const c_void,
    byte_size: usize,
    memory_type: MemoryType,
) -> Result<(), ErrorPtr> {
    // SAFETY: `name` is null (refused by `c_str`) or a NUL-terminated string the caller keeps
    // valid for the call (the header's `const char*` contract); nothing keeps the `&str` past the
    // call.
    let name = unsafe { c_str(name, "input name") }?;
    if memory_type != MEMORY_CPU && memory_type != MEMORY_CPU_PINNED {
        return Err(unsupported(format!(
            "input '{name}': only CPU memory is supported for input data (memory type {memory_type})"
        )));
    }
    let input = r.input_mut(name)?;
    if byte_size > 0 {
        non_null(base, "base")?;
        // SAFETY: `base` is non-null (checked above) and, by the header's contract, points to
        // `byte_size` elements that stay unchanged for the call; they are copied before it
        // returns.
        let data = unsafe { std::slice::from_raw_parts(base.cast::<u8>(), byte_size) };
        input.chunks.push(Bytes::copy_from_slice(data));
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestAppendInputData(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    name: *const c_char,
    base: *const c_void,
    byte_size: usize,
    memory_type: MemoryType,
    _memory_type_id: i64,
) -> ErrorPtr {
    ffi_entry!(non_null(inference_request) {
        // SAFETY: `inference_request` is null (refused by `with_request`) or a request from
        // `TRITONSERVER_InferenceRequestNew` that the caller has not deleted and does not use from
        // another thread meanwhile (tritonserver.h), so the `&mut` is unique; other pointers are
        // checked inside.
        unsafe {
            with_request(inference_request, |r| {
                append(r, name, base, byte_size, memory_type)
            })
        }
    })
}

/// Host policies only matter for placing data near a device; our data is
/// copied to ordinary memory, so the policy name is accepted and unused.
#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestAppendInputDataWithHostPolicy(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    name: *const c_char,
    base: *const c_void,
    byte_size: usize,
    memory_type: MemoryType,
    _memory_type_id: i64,
    _host_policy_name: *const c_char,
) -> ErrorPtr {
    ffi_entry!(non_null(inference_request) {
        // SAFETY: `inference_request` is null (refused by `with_request`) or a request from
        // `TRITONSERVER_InferenceRequestNew` that the caller has not deleted and does not use from
        // another thread meanwhile (tritonserver.h), so the `&mut` is unique; other pointers are
        // checked inside.
        unsafe {
            with_request(inference_request, |r| {
                append(r, name, base, byte_size, memory_type)
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestRemoveAllInputData(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    name: *const c_char,
) -> ErrorPtr {
    ffi_entry!(non_null(inference_request) {
        // SAFETY: `inference_request` is null (refused by `with_request`) or a request from
        // `TRITONSERVER_InferenceRequestNew` that the caller has not deleted and does not use from
        // another thread meanwhile (tritonserver.h), so the `&mut` is unique; other pointers are
        // checked inside.
        unsafe {
            with_request(inference_request, |r| {
                let name = c_str(name, "input name")?;
                r.input_mut(name)?.chunks.clear();
                Ok(())
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestAddRequestedOutput(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    name: *const c_char,
) -> ErrorPtr {
    ffi_entry!(non_null(inference_request) {
        // SAFETY: `inference_request` is null (refused by `with_request`) or a request from
        // `TRITONSERVER_InferenceRequestNew` that the caller has not deleted and does not use from
        // another thread meanwhile (tritonserver.h), so the `&mut` is unique; other pointers are
        // checked inside.
        unsafe {
            with_request(inference_request, |r| {
                let name = c_str(name, "output name")?;
                if !r.outputs.iter().any(|o| o.as_bytes() == name.as_bytes()) {
                    r.outputs.push(lossy_cstring(name));
                }
                Ok(())
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestRemoveRequestedOutput(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    name: *const c_char,
) -> ErrorPtr {
    ffi_entry!(non_null(inference_request) {
        // SAFETY: `inference_request` is null (refused by `with_request`) or a request from
        // `TRITONSERVER_InferenceRequestNew` that the caller has not deleted and does not use from
        // another thread meanwhile (tritonserver.h), so the `&mut` is unique; other pointers are
        // checked inside.
        unsafe {
            with_request(inference_request, |r| {
                let name = c_str(name, "output name")?;
                let before = r.outputs.len();
                r.outputs.retain(|o| o.as_bytes() != name.as_bytes());
                if r.outputs.len() == before {
                    return Err(invalid_arg(format!(
                        "output '{name}' does not exist in the inference request"
                    )));
                }
                Ok(())
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestRemoveAllRequestedOutputs(
    inference_request: *mut TRITONSERVER_InferenceRequest,
) -> ErrorPtr {
    ffi_entry!(non_null(inference_request) {
        // SAFETY: `inference_request` is null (refused by `with_request`) or a request from
        // `TRITONSERVER_InferenceRequestNew` that the caller has not deleted and does not use from
        // another thread meanwhile (tritonserver.h), so the `&mut` is unique; other pointers are
        // checked inside.
        unsafe {
            with_request(inference_request, |r| {
                r.outputs.clear();
                Ok(())
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestSetReleaseCallback(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    request_release_fn: Option<RequestReleaseFn>,
    request_release_userp: *mut c_void,
) -> ErrorPtr {
    ffi_entry!(non_null(inference_request) {
        // SAFETY: `inference_request` is null (refused by `with_request`) or a request from
        // `TRITONSERVER_InferenceRequestNew` that the caller has not deleted and does not use from
        // another thread meanwhile (tritonserver.h), so the `&mut` is unique; other pointers are
        // checked inside.
        unsafe {
            with_request(inference_request, |r| {
                r.release = request_release_fn.map(|f| (f, request_release_userp));
                Ok(())
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestSetResponseCallback(
    inference_request: *mut TRITONSERVER_InferenceRequest,
    response_allocator: *mut TRITONSERVER_ResponseAllocator,
    response_allocator_userp: *mut c_void,
    response_fn: Option<ResponseCompleteFn>,
    response_userp: *mut c_void,
) -> ErrorPtr {
    ffi_entry!(non_null(inference_request) {
        // SAFETY: `inference_request` is null (refused by `with_request`) or a request from
        // `TRITONSERVER_InferenceRequestNew` that the caller has not deleted and does not use from
        // another thread meanwhile (tritonserver.h), so the `&mut` is unique; other pointers are
        // checked inside.
        unsafe {
            with_request(inference_request, |r| {
                let response_fn = response_fn.ok_or_else(|| invalid_arg("response_fn is null"))?;
                // A null allocator is allowed for requests whose responses
                // carry no outputs; one with outputs then fails with an error.
                r.response = Some(ResponseCallback {
                    allocator: response_allocator,
                    allocator_userp: response_allocator_userp,
                    response_fn,
                    response_userp,
                });
                Ok(())
            })
        }
    })
}

unsafe fn set_parameter(
    request: *mut TRITONSERVER_InferenceRequest,
    key: *const c_char,
    value: CParam,
) -> ErrorPtr {
    // SAFETY: `request` is null (refused by `with_request`) or a request from
    // `TRITONSERVER_InferenceRequestNew` that the caller has not deleted and does not use from
    // another thread meanwhile (tritonserver.h), so the `&mut` is unique; other pointers are
    // checked inside.
    unsafe {
        with_request(request, |r| {
            let key = c_str(key, "parameter key")?;
            r.parameters.retain(|p| p.name.as_bytes() != key.as_bytes());
            r.parameters.push(TRITONSERVER_Parameter::new(key, value));
            Ok(())
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestSetStringParameter(
    request: *mut TRITONSERVER_InferenceRequest,
    key: *const c_char,
    value: *const c_char,
) -> ErrorPtr {
    ffi_entry!({
        // SAFETY: `value` is null (refused by `c_str`) or a NUL-terminated string the caller keeps
        // valid for the call (the header's `const char*` contract); nothing keeps the `&str` past
        // the call.
        let value = match unsafe { c_str(value, "parameter value") } {
            Ok(v) => lossy_cstring(v),
            Err(e) => return e,
        };
        // SAFETY: `request` is null (refused by `with_request`) or a request from
        // `TRITONSERVER_InferenceRequestNew` that the caller has not deleted and does not use from
        // another thread meanwhile (tritonserver.h), so the `&mut` is unique; other pointers are
        // checked inside.
        unsafe { set_parameter(request, key, CParam::String(value)) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestSetIntParameter(
    request: *mut TRITONSERVER_InferenceRequest,
    key: *const c_char,
    value: i64,
) -> ErrorPtr {
    // SAFETY: `request` is null (refused by `with_request`) or a request from
    // `TRITONSERVER_InferenceRequestNew` that the caller has not deleted and does not use from
    // another thread meanwhile (tritonserver.h), so the `&mut` is unique; other pointers are
    // checked inside.
    ffi_entry!(non_null(request as "inference_request") { unsafe { set_parameter(request, key, CParam::Int(value)) } })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestSetBoolParameter(
    request: *mut TRITONSERVER_InferenceRequest,
    key: *const c_char,
    value: bool,
) -> ErrorPtr {
    // SAFETY: `request` is null (refused by `with_request`) or a request from
    // `TRITONSERVER_InferenceRequestNew` that the caller has not deleted and does not use from
    // another thread meanwhile (tritonserver.h), so the `&mut` is unique; other pointers are
    // checked inside.
    ffi_entry!(non_null(request as "inference_request") { unsafe { set_parameter(request, key, CParam::Bool(value)) } })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceRequestSetDoubleParameter(
    request: *mut TRITONSERVER_InferenceRequest,
    key: *const c_char,
    value: f64,
) -> ErrorPtr {
    // SAFETY: `request` is null (refused by `with_request`) or a request from
    // `TRITONSERVER_InferenceRequestNew` that the caller has not deleted and does not use from
    // another thread meanwhile (tritonserver.h), so the `&mut` is unique; other pointers are
    // checked inside.
    ffi_entry!(non_null(request as "inference_request") { unsafe { set_parameter(request, key, CParam::Double(value)) } })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> Box<TRITONSERVER_InferenceRequest> {
        Box::new(TRITONSERVER_InferenceRequest {
            server: TRITONSERVER_Server::new(
                crate::frontend::env::FrontendEnv::for_tests(),
                crate::frontend::core::infer::ThreadEntry::start(&[]),
            ),
            model_name: "simple".into(),
            model_version: -1,
            id: CString::default(),
            flags: 0,
            correlation: Correlation::None,
            priority: 0,
            timeout_us: 0,
            inputs: Vec::new(),
            outputs: Vec::new(),
            parameters: Vec::new(),
            release: None,
            response: None,
            cancel: Arc::default(),
        })
    }

    #[test]
    fn the_c_setters_build_our_request_with_kserve_parameters() {
        let r = Box::into_raw(request());
        // SAFETY: test: `r` is a request boxed just above and deleted once at the end; the other
        // pointers are locals.
        unsafe {
            assert!(TRITONSERVER_InferenceRequestSetId(r, c"req-7".as_ptr()).is_null());
            assert!(
                TRITONSERVER_InferenceRequestSetCorrelationIdString(r, c"seq-a".as_ptr()).is_null()
            );
            assert!(TRITONSERVER_InferenceRequestSetFlags(
                r,
                REQUEST_FLAG_SEQUENCE_START | REQUEST_FLAG_SEQUENCE_END
            )
            .is_null());
            assert!(TRITONSERVER_InferenceRequestSetPriority(r, 2).is_null());
            assert!(
                TRITONSERVER_InferenceRequestSetIntParameter(r, c"custom".as_ptr(), 5).is_null()
            );
            let shape = [1i64, 2];
            assert!(TRITONSERVER_InferenceRequestAddInput(
                r,
                c"INPUT0".as_ptr(),
                crate::triton_abi::types::TYPE_INT32,
                shape.as_ptr(),
                2
            )
            .is_null());
            let duplicate = TRITONSERVER_InferenceRequestAddInput(
                r,
                c"INPUT0".as_ptr(),
                crate::triton_abi::types::TYPE_INT32,
                shape.as_ptr(),
                2,
            );
            assert!(!duplicate.is_null());
            crate::triton_abi::error::TRITONSERVER_ErrorDelete(duplicate);
            // Two appended chunks become one tensor; the caller's buffers
            // are copied at once.
            let first = [1u8, 0, 0, 0];
            let second = [2u8, 0, 0, 0];
            for chunk in [&first, &second] {
                assert!(TRITONSERVER_InferenceRequestAppendInputData(
                    r,
                    c"INPUT0".as_ptr(),
                    chunk.as_ptr().cast(),
                    4,
                    MEMORY_CPU,
                    0
                )
                .is_null());
            }
            let gpu = TRITONSERVER_InferenceRequestAppendInputData(
                r,
                c"INPUT0".as_ptr(),
                first.as_ptr().cast(),
                4,
                crate::triton_abi::types::MEMORY_GPU,
                0,
            );
            assert!(!gpu.is_null());
            crate::triton_abi::error::TRITONSERVER_ErrorDelete(gpu);
            assert!(
                TRITONSERVER_InferenceRequestAddRequestedOutput(r, c"OUTPUT1".as_ptr()).is_null()
            );

            let ours = (*r).to_infer_request().map_err(|_| "conversion failed");
            let ours = ours.expect("converts");
            assert_eq!(ours.model_name, "simple");
            assert_eq!(ours.model_version, "");
            assert_eq!(ours.id, "req-7");
            assert_eq!(ours.inputs.len(), 1);
            assert_eq!(ours.inputs[0].shape, vec![1, 2]);
            assert_eq!(&ours.inputs[0].data[..], &[1, 0, 0, 0, 2, 0, 0, 0]);
            assert_eq!(ours.outputs.len(), 1);
            assert_eq!(ours.outputs[0].name, "OUTPUT1");
            let p = &ours.parameters;
            assert_eq!(
                p.get("sequence_id"),
                Some(&ParamValue::String("seq-a".into()))
            );
            assert_eq!(p.get("sequence_start"), Some(&ParamValue::Bool(true)));
            assert_eq!(p.get("sequence_end"), Some(&ParamValue::Bool(true)));
            assert_eq!(p.get("priority"), Some(&ParamValue::Uint(2)));
            assert_eq!(p.get("custom"), Some(&ParamValue::Int(5)));
            assert_eq!(p.get("timeout"), None);

            let mut id: u64 = 0;
            let not_uint = TRITONSERVER_InferenceRequestCorrelationId(r, &mut id);
            assert!(!not_uint.is_null());
            crate::triton_abi::error::TRITONSERVER_ErrorDelete(not_uint);
            assert!(TRITONSERVER_InferenceRequestSetCorrelationId(r, 42).is_null());
            assert!(TRITONSERVER_InferenceRequestCorrelationId(r, &mut id).is_null());
            assert_eq!(id, 42);
            assert!(TRITONSERVER_InferenceRequestRemoveInput(r, c"INPUT0".as_ptr()).is_null());
            assert!(TRITONSERVER_InferenceRequestDelete(r).is_null());
        }
    }
}
