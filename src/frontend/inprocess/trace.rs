//! `TRITONSERVER_InferenceTrace*`: request tracing is not implemented, so
//! no trace object ever exists (`TRITONBACKEND_RequestTrace` gives null
//! and `ServerInferAsync` ignores its trace). These exist so that backends
//! that link them load; called on a trace they say why they cannot work.

use std::ffi::{c_char, c_void};

use crate::triton_abi::{
    error::{invalid_arg, ErrorPtr, TRITONSERVER_Error},
    types::ERROR_UNSUPPORTED,
};

fn no_tracing(trace: *mut c_void) -> ErrorPtr {
    if trace.is_null() {
        return invalid_arg("trace is null");
    }
    TRITONSERVER_Error::boxed(
        ERROR_UNSUPPORTED,
        "inference tracing is not supported by this server",
    )
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceTraceContext(
    trace: *mut c_void,
    _trace_context: *mut *const c_char,
) -> ErrorPtr {
    ffi_entry!({ no_tracing(trace) })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceTraceSpawnChildTrace(
    trace: *mut c_void,
    _child_trace: *mut *mut c_void,
) -> ErrorPtr {
    ffi_entry!({ no_tracing(trace) })
}
