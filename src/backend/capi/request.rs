//! `TRITONBACKEND_Request` and `TRITONBACKEND_Input`: one request of an
//! execution as the backend sees it. Owned by the backend from
//! `ModelInstanceExecute` until `TRITONBACKEND_RequestRelease` (or given
//! back when execute fails); its responses go through a shared
//! [`ResponseTarget`] that outlives it. The entry points that take a
//! request to make a response, a response factory or a state
//! (`TRITONBACKEND_ResponseNew`, `..ResponseFactoryNew`, `..StateNew`)
//! are here, above `response` and `state`.

use std::{
    ffi::{c_char, c_void, CString},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
};

use bytes::Bytes;

use super::{
    response::{self, ResponseTarget, TRITONBACKEND_Response, TRITONBACKEND_ResponseFactory},
    state::{RequestStates, TRITONBACKEND_State},
};
use crate::{
    backend::BackendRequest,
    triton_abi::{
        buffer::TRITONSERVER_BufferAttributes,
        error::{self, c_str, non_null, out_if_asked, ErrorPtr},
        parameter::{lossy_cstring, ParamValue, TRITONSERVER_Parameter},
        types::{
            datatype_to_c, MemoryType, ParameterType, TritonDataType, MEMORY_CPU,
            REQUEST_FLAG_SEQUENCE_END, REQUEST_FLAG_SEQUENCE_START, REQUEST_RELEASE_ALL,
            REQUEST_RELEASE_RESCHEDULE,
        },
    },
    types::{self, InferError},
};

/// Request parameters the protocols consume themselves (sequence,
/// scheduling, response format); Triton does not hand them to backends.
const PROTOCOL_PARAMETERS: [&str; 7] = [
    "sequence_id",
    "sequence_start",
    "sequence_end",
    "priority",
    "timeout",
    "binary_data_output",
    "triton_enable_empty_final_response",
];

/// Opaque to C.
pub struct TRITONBACKEND_Input {
    name: CString,
    datatype: TritonDataType,
    shape: Vec<i64>,
    data: Bytes,
    attributes: TRITONSERVER_BufferAttributes,
}

/// Opaque to C.
pub struct TRITONBACKEND_Request {
    id: CString,
    correlation_id: u64,
    /// `Some` when the sequence uses a string id.
    correlation_str: Option<CString>,
    flags: u32,
    inputs: Vec<TRITONBACKEND_Input>,
    /// Requested outputs (all of the model's when the client named none).
    outputs: Vec<CString>,
    parameters: Vec<TRITONSERVER_Parameter>,
    target: Arc<ResponseTarget>,
    /// The request's implicit state and the states created for it.
    states: RequestStates,
    /// Set by whoever frees the request (the backend's release, or the
    /// server when execute fails), so it is freed once.
    released: Arc<AtomicBool>,
}

impl TRITONBACKEND_Request {
    /// Builds the C form of `r`, owned by the returned pointer;
    /// `model_outputs` are the model's outputs, for a request that names
    /// none.
    pub fn into_raw(
        r: BackendRequest,
        model_outputs: &Mutex<Vec<CString>>,
        decoupled: bool,
        state_outputs: Arc<[String]>,
    ) -> *mut Self {
        let BackendRequest {
            request,
            sender,
            sequence,
            states,
        } = r;
        let outputs = if request.outputs.is_empty() {
            model_outputs
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
        } else {
            request
                .outputs
                .iter()
                .map(|o| lossy_cstring(&o.name))
                .collect()
        };
        let inputs = request
            .inputs
            .into_iter()
            .map(|t| TRITONBACKEND_Input {
                name: lossy_cstring(&t.name),
                datatype: datatype_to_c(t.datatype),
                attributes: TRITONSERVER_BufferAttributes::host(t.data.len()),
                shape: t.shape,
                data: t.data,
            })
            .collect();
        let parameters = request
            .parameters
            .iter()
            .filter(|(k, _)| !PROTOCOL_PARAMETERS.contains(&k.as_str()))
            .filter_map(|(k, v)| {
                let value = match v {
                    types::ParamValue::Bool(b) => ParamValue::Bool(*b),
                    types::ParamValue::Int(i) => ParamValue::Int(*i),
                    types::ParamValue::Uint(u) => ParamValue::Int(i64::try_from(*u).ok()?),
                    types::ParamValue::Double(d) => ParamValue::Double(*d),
                    types::ParamValue::String(s) => ParamValue::String(lossy_cstring(s)),
                };
                Some(TRITONSERVER_Parameter::new(k, value))
            })
            .collect();
        let seq = sequence.unwrap_or_default();
        let flags = if seq.start {
            REQUEST_FLAG_SEQUENCE_START
        } else {
            0
        } | if seq.end {
            REQUEST_FLAG_SEQUENCE_END
        } else {
            0
        };
        Box::into_raw(Box::new(Self {
            id: lossy_cstring(&request.id),
            correlation_id: seq.id,
            correlation_str: seq.id_str.as_deref().map(lossy_cstring),
            flags,
            inputs,
            outputs,
            parameters,
            target: Arc::new(ResponseTarget::new(sender, decoupled)),
            states: RequestStates::new(states, state_outputs),
            released: Arc::new(AtomicBool::new(false)),
        }))
    }

    pub fn release_flag(&self) -> Arc<AtomicBool> {
        self.released.clone()
    }

    /// Whether the caller won the right to free the request.
    pub fn claim(flag: &AtomicBool) -> bool {
        flag.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Fails the request's response (if not answered yet) and frees it.
    ///
    /// # Safety
    /// `request` came from `into_raw`, and the caller won `claim`.
    pub unsafe fn fail_and_free(request: *mut Self, e: InferError) {
        // SAFETY: per this function's contract, `request` came from `into_raw` (a `Box`) and the
        // caller won `claim`, so this is its only free.
        let request = unsafe { Box::from_raw(request) };
        request.target.fail(e);
    }

    fn input(&self, name: &str) -> Option<&TRITONBACKEND_Input> {
        self.inputs
            .iter()
            .find(|i| i.name.as_bytes() == name.as_bytes())
    }

    fn input_at(&self, index: u32) -> Result<&TRITONBACKEND_Input, ErrorPtr> {
        self.inputs.get(index as usize).ok_or_else(|| {
            error::invalid_arg(format!(
                "out of bounds index {index}: request has {} inputs",
                self.inputs.len()
            ))
        })
    }
}

/// The batch size a request counts for in the statistics: its first
/// input's first dimension when the model batches, else 1 (Triton's
/// `std::max(1U, batch_size_)`).
///
/// # Safety
/// `r` is null (refused) or a request the server gave the backend and the
/// backend has not released.
pub(super) unsafe fn batch_size_of(
    r: *mut TRITONBACKEND_Request,
    batching: bool,
) -> Result<u64, ErrorPtr> {
    // SAFETY: per this function's contract.
    let r = unsafe { request(r)? };
    if !batching {
        return Ok(1);
    }
    Ok(r.inputs
        .first()
        .and_then(|i| i.shape.first())
        .map_or(1, |&rows| rows.max(1) as u64))
}

unsafe fn request<'a>(
    r: *mut TRITONBACKEND_Request,
) -> Result<&'a TRITONBACKEND_Request, ErrorPtr> {
    non_null(r, "request")?;
    // SAFETY: checked non-null above; callers pass a request the server gave the backend's execute
    // and the backend has not released (tritonbackend.h), and only shared references are made from
    // it.
    Ok(unsafe { &*r })
}

unsafe fn input<'a>(i: *mut TRITONBACKEND_Input) -> Result<&'a TRITONBACKEND_Input, ErrorPtr> {
    non_null(i, "input")?;
    // SAFETY: checked non-null above; callers pass an input handed out by
    // `TRITONBACKEND_RequestInput*`, which lives inside its request until that is released.
    Ok(unsafe { &*i })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_RequestId(
    r: *mut TRITONBACKEND_Request,
    id: *mut *const c_char,
) -> ErrorPtr {
    ffi_entry!(non_null(r as "request", id) {
        // SAFETY: `r` is null (refused by `request`) or a request the server gave this backend's
        // `ModelInstanceExecute` that it has not released yet (tritonbackend.h: valid until
        // `TRITONBACKEND_RequestRelease`).
        let r = unsafe { request(r)? };
        // SAFETY: `id` is checked non-null above and, by the header's contract, valid for writing
        // one value.
        unsafe { *id = r.id.as_ptr() };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_RequestIsCancelled(
    r: *mut TRITONBACKEND_Request,
    is_cancelled: *mut bool,
) -> ErrorPtr {
    ffi_entry!(non_null(r as "request", is_cancelled) {
        // SAFETY: `r` is null (refused by `request`) or a request the server gave this backend's
        // `ModelInstanceExecute` that it has not released yet (tritonbackend.h: valid until
        // `TRITONBACKEND_RequestRelease`).
        let r = unsafe { request(r)? };
        // SAFETY: `is_cancelled` is checked non-null above and, by the header's contract, valid
        // for writing one value.
        unsafe { *is_cancelled = r.target.is_cancelled() };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_RequestCorrelationId(
    r: *mut TRITONBACKEND_Request,
    id: *mut u64,
) -> ErrorPtr {
    ffi_entry!(non_null(r as "request", id) {
        // SAFETY: `r` is null (refused by `request`) or a request the server gave this backend's
        // `ModelInstanceExecute` that it has not released yet (tritonbackend.h: valid until
        // `TRITONBACKEND_RequestRelease`).
        let r = unsafe { request(r)? };
        if r.correlation_str.is_some() {
            return Err(error::invalid_arg(
                "correlation ID in request is not an unsigned int",
            ));
        }
        // SAFETY: `id` is checked non-null above and, by the header's contract, valid for writing
        // one value.
        unsafe { *id = r.correlation_id };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_RequestCorrelationIdString(
    r: *mut TRITONBACKEND_Request,
    id: *mut *const c_char,
) -> ErrorPtr {
    ffi_entry!(non_null(r as "request", id) {
        // SAFETY: `r` is null (refused by `request`) or a request the server gave this backend's
        // `ModelInstanceExecute` that it has not released yet (tritonbackend.h: valid until
        // `TRITONBACKEND_RequestRelease`).
        let r = unsafe { request(r)? };
        match &r.correlation_str {
            // SAFETY: `id` is checked non-null above and, by the header's contract, valid for
            // writing one value.
            Some(s) => unsafe { *id = s.as_ptr() },
            None => {
                return Err(error::invalid_arg(
                    "correlation ID in request is not a string",
                ))
            }
        }
        Ok(())
    })
}

/// No per-request timeout is passed to backends: 0 (none), as Triton
/// reports for a request without one.
#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_InferenceRequestTimeoutMicroseconds(
    r: *mut TRITONBACKEND_Request,
    timeout: *mut u64,
) -> ErrorPtr {
    ffi_entry!(non_null(r as "request", timeout) {
        // SAFETY: `r` is null (refused by `request`) or a request the server gave this backend's
        // `ModelInstanceExecute` that it has not released yet (tritonbackend.h: valid until
        // `TRITONBACKEND_RequestRelease`).
        unsafe { request(r)? };
        // SAFETY: `timeout` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *timeout = 0 };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_RequestFlags(
    r: *mut TRITONBACKEND_Request,
    flags: *mut u32,
) -> ErrorPtr {
    ffi_entry!(non_null(r as "request", flags) {
        // SAFETY: `r` is null (refused by `request`) or a request the server gave this backend's
        // `ModelInstanceExecute` that it has not released yet (tritonbackend.h: valid until
        // `TRITONBACKEND_RequestRelease`).
        let r = unsafe { request(r)? };
        // SAFETY: `flags` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *flags = r.flags };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_RequestParameterCount(
    r: *mut TRITONBACKEND_Request,
    count: *mut u32,
) -> ErrorPtr {
    ffi_entry!(non_null(r as "request", count) {
        // SAFETY: `r` is null (refused by `request`) or a request the server gave this backend's
        // `ModelInstanceExecute` that it has not released yet (tritonbackend.h: valid until
        // `TRITONBACKEND_RequestRelease`).
        let r = unsafe { request(r)? };
        // SAFETY: `count` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *count = r.parameters.len() as u32 };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_RequestParameter(
    r: *mut TRITONBACKEND_Request,
    index: u32,
    key: *mut *const c_char,
    kind: *mut ParameterType,
    vvalue: *mut *const c_void,
) -> ErrorPtr {
    ffi_entry!(non_null(r as "request") {
        // SAFETY: `r` is null (refused by `request`) or a request the server gave this backend's
        // `ModelInstanceExecute` that it has not released yet (tritonbackend.h: valid until
        // `TRITONBACKEND_RequestRelease`).
        let r = unsafe { request(r)? };
        let p = r.parameters.get(index as usize).ok_or_else(|| {
            error::invalid_arg(format!(
                "out of bounds index {index}: request has {} parameters",
                r.parameters.len()
            ))
        })?;
        // SAFETY: each out-pointer is null (then `put` skips it) or the caller's, valid for
        // writing one value (tritonbackend.h).
        unsafe {
            out_if_asked(key, p.name.as_ptr());
            out_if_asked(kind, p.kind());
            out_if_asked(vvalue, p.value_ptr());
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_RequestInputCount(
    r: *mut TRITONBACKEND_Request,
    count: *mut u32,
) -> ErrorPtr {
    ffi_entry!(non_null(r as "request", count) {
        // SAFETY: `r` is null (refused by `request`) or a request the server gave this backend's
        // `ModelInstanceExecute` that it has not released yet (tritonbackend.h: valid until
        // `TRITONBACKEND_RequestRelease`).
        let r = unsafe { request(r)? };
        // SAFETY: `count` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *count = r.inputs.len() as u32 };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_RequestInputName(
    r: *mut TRITONBACKEND_Request,
    index: u32,
    input_name: *mut *const c_char,
) -> ErrorPtr {
    ffi_entry!(non_null(r as "request", input_name) {
        // SAFETY: `r` is null (refused by `request`) or a request the server gave this backend's
        // `ModelInstanceExecute` that it has not released yet (tritonbackend.h: valid until
        // `TRITONBACKEND_RequestRelease`).
        let r = unsafe { request(r)? };
        let i = r.input_at(index)?;
        // SAFETY: `input_name` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *input_name = i.name.as_ptr() };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_RequestInput(
    r: *mut TRITONBACKEND_Request,
    name: *const c_char,
    out: *mut *mut TRITONBACKEND_Input,
) -> ErrorPtr {
    ffi_entry!(non_null(r as "request") {
        // SAFETY: `r` is null (refused by `request`) or a request the server gave this backend's
        // `ModelInstanceExecute` that it has not released yet (tritonbackend.h: valid until
        // `TRITONBACKEND_RequestRelease`).
        let r = unsafe { request(r)? };
        // SAFETY: `name` is null (refused by `c_str`) or a NUL-terminated string the caller keeps
        // valid for the call (the header's `const char*` contract); nothing keeps the `&str` past
        // the call.
        let name = unsafe { c_str(name, "name")? };
        non_null(out, "input")?;
        let i = r
            .input(name)
            .ok_or_else(|| error::invalid_arg(format!("unknown request input name {name}")))?;
        // SAFETY: `out` is checked non-null above and, by the header's contract, valid for writing
        // one value.
        unsafe { *out = (i as *const TRITONBACKEND_Input).cast_mut() };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_RequestInputByIndex(
    r: *mut TRITONBACKEND_Request,
    index: u32,
    out: *mut *mut TRITONBACKEND_Input,
) -> ErrorPtr {
    ffi_entry!(non_null(r as "request", out as "input") {
        // SAFETY: `r` is null (refused by `request`) or a request the server gave this backend's
        // `ModelInstanceExecute` that it has not released yet (tritonbackend.h: valid until
        // `TRITONBACKEND_RequestRelease`).
        let r = unsafe { request(r)? };
        let i = r.input_at(index)?;
        // SAFETY: `out` is checked non-null above and, by the header's contract, valid for writing
        // one value.
        unsafe { *out = (i as *const TRITONBACKEND_Input).cast_mut() };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_RequestOutputCount(
    r: *mut TRITONBACKEND_Request,
    count: *mut u32,
) -> ErrorPtr {
    ffi_entry!(non_null(r as "request", count) {
        // SAFETY: `r` is null (refused by `request`) or a request the server gave this backend's
        // `ModelInstanceExecute` that it has not released yet (tritonbackend.h: valid until
        // `TRITONBACKEND_RequestRelease`).
        let r = unsafe { request(r)? };
        // SAFETY: `count` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *count = r.outputs.len() as u32 };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_RequestOutputName(
    r: *mut TRITONBACKEND_Request,
    index: u32,
    output_name: *mut *const c_char,
) -> ErrorPtr {
    ffi_entry!(non_null(r as "request", output_name) {
        // SAFETY: `r` is null (refused by `request`) or a request the server gave this backend's
        // `ModelInstanceExecute` that it has not released yet (tritonbackend.h: valid until
        // `TRITONBACKEND_RequestRelease`).
        let r = unsafe { request(r)? };
        let o = r.outputs.get(index as usize).ok_or_else(|| {
            error::invalid_arg(format!(
                "out of bounds index {index}: request has {} requested outputs",
                r.outputs.len()
            ))
        })?;
        // SAFETY: `output_name` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *output_name = o.as_ptr() };
        Ok(())
    })
}

/// Outputs are always host memory here; the size is not known ahead
/// (UNAVAILABLE is Triton's answer for "properties not available" only
/// when it cannot say anything; host memory it can say).
#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_RequestOutputBufferProperties(
    r: *mut TRITONBACKEND_Request,
    _name: *const c_char,
    byte_size: *mut usize,
    memory_type: *mut MemoryType,
    memory_type_id: *mut i64,
) -> ErrorPtr {
    ffi_entry!(non_null(r as "request") {
        // SAFETY: `r` is null (refused by `request`) or a request the server gave this backend's
        // `ModelInstanceExecute` that it has not released yet (tritonbackend.h: valid until
        // `TRITONBACKEND_RequestRelease`).
        unsafe { request(r)? };
        // SAFETY: each out-pointer is null (then `put` skips it) or the caller's, valid for
        // writing one value (tritonbackend.h).
        unsafe {
            out_if_asked(byte_size, 0);
            out_if_asked(memory_type, MEMORY_CPU);
            out_if_asked(memory_type_id, 0);
        }
        Ok(())
    })
}

/// RELEASE_ALL frees the request. RESCHEDULE (run it again in a later
/// execution) is not supported: an UNSUPPORTED error, and the request
/// stays the backend's.
#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_RequestRelease(
    r: *mut TRITONBACKEND_Request,
    release_flags: u32,
) -> ErrorPtr {
    ffi_entry!(non_null(r as "request") {
        // SAFETY: `r` is null (refused by `request`) or a request the server gave this backend's
        // `ModelInstanceExecute` that it has not released yet (tritonbackend.h: valid until
        // `TRITONBACKEND_RequestRelease`).
        let req = unsafe { request(r)? };
        if release_flags & REQUEST_RELEASE_RESCHEDULE != 0 {
            return Err(error::unsupported(
                "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE is not supported by this server",
            ));
        }
        if release_flags & REQUEST_RELEASE_ALL == 0 {
            return Err(error::invalid_arg(format!(
                "unknown request release flags {release_flags}"
            )));
        }
        if !TRITONBACKEND_Request::claim(&req.released) {
            return Err(error::invalid_arg("request was already released"));
        }
        // SAFETY: allocated by `into_raw`; `claim` makes this the only free.
        drop(unsafe { Box::from_raw(r) });
        Ok(())
    })
}

/// Tracing is not supported: no trace (null), as for an untraced request.
#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_RequestTrace(
    r: *mut TRITONBACKEND_Request,
    trace: *mut *mut c_void,
) -> ErrorPtr {
    ffi_entry!(non_null(r as "request", trace) {
        // SAFETY: `r` is null (refused by `request`) or a request the server gave this backend's
        // `ModelInstanceExecute` that it has not released yet (tritonbackend.h: valid until
        // `TRITONBACKEND_RequestRelease`).
        unsafe { request(r)? };
        // SAFETY: `trace` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *trace = std::ptr::null_mut() };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_InputProperties(
    i: *mut TRITONBACKEND_Input,
    name: *mut *const c_char,
    datatype: *mut TritonDataType,
    shape: *mut *const i64,
    dims_count: *mut u32,
    byte_size: *mut u64,
    buffer_count: *mut u32,
) -> ErrorPtr {
    ffi_entry!(non_null(i as "input") {
        // SAFETY: `i` is null (refused by `input`) or an input handed out by
        // `TRITONBACKEND_RequestInput*`; it lives inside its request, which the backend has not
        // released yet.
        let i = unsafe { input(i)? };
        // SAFETY: each out-pointer is null (then `put` skips it) or the caller's, valid for
        // writing one value (tritonbackend.h).
        unsafe {
            out_if_asked(name, i.name.as_ptr());
            out_if_asked(datatype, i.datatype);
            out_if_asked(shape, i.shape.as_ptr());
            out_if_asked(dims_count, i.shape.len() as u32);
            out_if_asked(byte_size, i.data.len() as u64);
            out_if_asked(buffer_count, 1);
        }
        Ok(())
    })
}

/// One host policy (the default) exists: the same as `InputProperties`.
#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_InputPropertiesForHostPolicy(
    i: *mut TRITONBACKEND_Input,
    _host_policy_name: *const c_char,
    name: *mut *const c_char,
    datatype: *mut TritonDataType,
    shape: *mut *const i64,
    dims_count: *mut u32,
    byte_size: *mut u64,
    buffer_count: *mut u32,
) -> ErrorPtr {
    ffi_entry!({
        // SAFETY: this forwards the caller's pointers unchanged to the function above, whose
        // contract they meet by the same header contract.
        unsafe {
            TRITONBACKEND_InputProperties(
                i,
                name,
                datatype,
                shape,
                dims_count,
                byte_size,
                buffer_count,
            )
        }
    })
}

/// The data is one contiguous host buffer (index 0), whatever memory
/// type the backend prefers (`memory_type` is in/out, as in Triton).
#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_InputBuffer(
    i: *mut TRITONBACKEND_Input,
    index: u32,
    buffer: *mut *const c_void,
    buffer_byte_size: *mut u64,
    memory_type: *mut MemoryType,
    memory_type_id: *mut i64,
) -> ErrorPtr {
    ffi_entry!(non_null(i as "input", buffer, buffer_byte_size) {
        // SAFETY: `i` is null (refused by `input`) or an input handed out by
        // `TRITONBACKEND_RequestInput*`; it lives inside its request, which the backend has not
        // released yet.
        let i = unsafe { input(i)? };
        if index != 0 {
            return Err(error::invalid_arg(format!(
                "out of bounds index {index}: input '{}' has 1 buffer",
                i.name.to_string_lossy()
            )));
        }
        // SAFETY: `buffer`, `buffer_byte_size` are checked non-null above and, by the header's
        // contract, valid for writing one value.
        unsafe {
            *buffer = i.data.as_ptr().cast();
            *buffer_byte_size = i.data.len() as u64;
            out_if_asked(memory_type, MEMORY_CPU);
            out_if_asked(memory_type_id, 0);
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_InputBufferForHostPolicy(
    i: *mut TRITONBACKEND_Input,
    _host_policy_name: *const c_char,
    index: u32,
    buffer: *mut *const c_void,
    buffer_byte_size: *mut u64,
    memory_type: *mut MemoryType,
    memory_type_id: *mut i64,
) -> ErrorPtr {
    ffi_entry!({
        // SAFETY: this forwards the caller's pointers unchanged to the function above, whose
        // contract they meet by the same header contract.
        unsafe {
            TRITONBACKEND_InputBuffer(
                i,
                index,
                buffer,
                buffer_byte_size,
                memory_type,
                memory_type_id,
            )
        }
    })
}

/// The attributes object belongs to the input (not to be deleted).
#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_InputBufferAttributes(
    i: *mut TRITONBACKEND_Input,
    index: u32,
    buffer: *mut *const c_void,
    attributes: *mut *mut TRITONSERVER_BufferAttributes,
) -> ErrorPtr {
    ffi_entry!(non_null(i as "input", buffer, attributes as "buffer_attributes") {
        // SAFETY: `i` is null (refused by `input`) or an input handed out by
        // `TRITONBACKEND_RequestInput*`; it lives inside its request, which the backend has not
        // released yet.
        let i = unsafe { input(i)? };
        if index != 0 {
            return Err(error::invalid_arg(format!(
                "out of bounds index {index}: input '{}' has 1 buffer",
                i.name.to_string_lossy()
            )));
        }
        // SAFETY: `buffer`, `attributes` are checked non-null above and, by the header's contract,
        // valid for writing one value.
        unsafe {
            *buffer = i.data.as_ptr().cast();
            *attributes = (&i.attributes as *const TRITONSERVER_BufferAttributes).cast_mut();
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ResponseFactoryNew(
    factory: *mut *mut TRITONBACKEND_ResponseFactory,
    request: *mut TRITONBACKEND_Request,
) -> ErrorPtr {
    ffi_entry!(non_null(factory, request) {
        // SAFETY: `request` is checked non-null by the guard and is a request the server gave this
        // backend's `ModelInstanceExecute` that it has not released yet (tritonbackend.h);
        // `factory` is checked non-null by the guard and, by the header's contract, valid for
        // writing one value.
        unsafe { factory.write(response::new_factory((*request).target.clone())) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ResponseNew(
    out: *mut *mut TRITONBACKEND_Response,
    request: *mut TRITONBACKEND_Request,
) -> ErrorPtr {
    ffi_entry!(non_null(out as "response", request) {
        // SAFETY: `out` is checked non-null by the guard and, by the header's contract, valid
        // for writing one value; `request` is checked non-null by the guard and is a request the
        // server gave this backend's `ModelInstanceExecute` that it has not released yet
        // (tritonbackend.h).
        unsafe { out.write(response::new_response((*request).target.clone())) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_StateNew(
    state: *mut *mut TRITONBACKEND_State,
    request: *mut TRITONBACKEND_Request,
    name: *const c_char,
    datatype: TritonDataType,
    shape: *const i64,
    dims_count: u32,
) -> ErrorPtr {
    ffi_entry!(non_null(state, request) {
        // SAFETY: `request` is checked non-null by the guard and is a request the server gave this
        // backend's `ModelInstanceExecute` that it has not released yet (tritonbackend.h).
        let request = unsafe { &*request };
        // SAFETY: `name` is null (refused by `c_str`) or a NUL-terminated string the caller keeps
        // valid for the call (the header's `const char*` contract); nothing keeps the `&str` past
        // the call.
        let name = unsafe { c_str(name, "name")? };
        // SAFETY: `shape` is null or points to `dims_count` elements (tritonbackend.h).
        let created = unsafe { request.states.create(name, datatype, shape, dims_count)? };
        // SAFETY: `state` is checked non-null by the guard and valid for writing (tritonbackend.h).
        unsafe { state.write(created) };
        Ok(())
    })
}
