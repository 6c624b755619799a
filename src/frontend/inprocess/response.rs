//! `TRITONSERVER_InferenceResponse`: one response handed to an in-process
//! caller's response callback. Its outputs live in buffers the caller's
//! allocator gave (`alloc_fn`, CPU memory) and are released through the
//! same allocator when the caller deletes the response.

use std::{
    ffi::{c_char, c_void, CString},
    ptr,
};

use super::{allocator::TRITONSERVER_ResponseAllocator, request::ResponseCallback};
use crate::triton_abi::{
    error::{out, status, ErrorPtr, TRITONSERVER_Error},
    parameter::{lossy_cstring, ParamValue as CParam, TRITONSERVER_Parameter},
    types::{
        datatype_to_c, error_kind_to_code, ErrorCode, MemoryType, ParameterType, TritonDataType,
        ERROR_INTERNAL, ERROR_INVALID_ARG, MEMORY_CPU, MEMORY_CPU_PINNED,
    },
};
use crate::types::{InferError, InferResponse, ParamValue};

struct Output {
    name: CString,
    datatype: TritonDataType,
    shape: Vec<i64>,
    buffer: *mut c_void,
    buffer_userp: *mut c_void,
    byte_size: usize,
    memory_type: MemoryType,
    memory_type_id: i64,
}

/// Opaque to C.
pub struct TRITONSERVER_InferenceResponse {
    error: Option<(ErrorCode, String)>,
    model_name: CString,
    model_version: i64,
    id: CString,
    outputs: Vec<Output>,
    parameters: Vec<TRITONSERVER_Parameter>,
    /// Releases the output buffers when the response is deleted.
    allocator: *mut TRITONSERVER_ResponseAllocator,
}

impl TRITONSERVER_InferenceResponse {
    fn empty(model_name: &str, model_version: &str, id: &str) -> Self {
        Self {
            error: None,
            model_name: lossy_cstring(model_name),
            model_version: model_version.parse().unwrap_or(-1),
            id: lossy_cstring(id),
            outputs: Vec::new(),
            parameters: Vec::new(),
            allocator: ptr::null_mut(),
        }
    }

    /// A response that carries only an error (Triton's way to fail a
    /// request after `ServerInferAsync` accepted it).
    pub fn failed(model_name: &str, model_version: &str, id: &str, e: &InferError) -> Box<Self> {
        let mut r = Self::empty(model_name, model_version, id);
        r.error = Some((error_kind_to_code(e.kind), e.message.clone()));
        Box::new(r)
    }

    /// Builds the C response for `response`, writing each output into a
    /// buffer from the caller's allocator. An allocation the allocator
    /// refuses makes the whole response an error response, as in Triton.
    ///
    /// # Safety
    /// The callback's allocator (if any) is alive, as the API requires of
    /// an allocator named by a request in flight.
    pub unsafe fn build(response: InferResponse, callback: &ResponseCallback) -> Box<Self> {
        let mut r = Self::empty(&response.model_name, &response.model_version, &response.id);
        r.allocator = callback.allocator;
        r.parameters = response
            .parameters
            .iter()
            .map(|(name, v)| {
                let value = match v {
                    ParamValue::Bool(b) => CParam::Bool(*b),
                    ParamValue::Int(i) => CParam::Int(*i),
                    // Triton's parameters have no unsigned type.
                    ParamValue::Uint(u) => CParam::Int(*u as i64),
                    ParamValue::Double(d) => CParam::Double(*d),
                    ParamValue::String(s) => CParam::String(lossy_cstring(s)),
                };
                TRITONSERVER_Parameter::new(name, value)
            })
            .collect();
        // SAFETY: the allocator is alive, which is this function's own contract.
        if let Err(e) = unsafe { r.allocate_outputs(response, callback) } {
            r.release_buffers();
            r.outputs.clear();
            r.error = Some(e);
        }
        Box::new(r)
    }

    unsafe fn allocate_outputs(
        &mut self,
        response: InferResponse,
        callback: &ResponseCallback,
    ) -> Result<(), (ErrorCode, String)> {
        if response.outputs.is_empty() {
            return Ok(());
        }
        let allocator = callback.allocator;
        if allocator.is_null() {
            return Err((
                ERROR_INVALID_ARG,
                "the response has outputs but the request named no response allocator".into(),
            ));
        }
        // SAFETY: `allocator` is checked non-null above and is an allocator from
        // `TRITONSERVER_ResponseAllocatorNew`, not deleted yet.
        let alloc = unsafe { &*allocator };
        if let Some(start) = alloc.start_fn {
            // SAFETY: the caller's start callback, called with its allocator and userp as
            // tritonserver.h specifies; the error it returns (if any) is ours to free, which
            // `taken` does.
            unsafe { taken(start(allocator, callback.allocator_userp)) }?;
        }
        for tensor in response.outputs {
            let name = lossy_cstring(&tensor.name);
            let byte_size = tensor.data.len();
            let mut buffer: *mut c_void = ptr::null_mut();
            let mut buffer_userp: *mut c_void = ptr::null_mut();
            let mut memory_type = MEMORY_CPU;
            let mut memory_type_id = 0i64;
            // SAFETY: the caller's alloc callback with its own allocator and
            // userp, as tritonserver.h specifies; the out-pointers are locals
            // and the name outlives the call.
            unsafe {
                taken((alloc.alloc_fn)(
                    allocator,
                    name.as_ptr(),
                    byte_size,
                    MEMORY_CPU,
                    0,
                    callback.allocator_userp,
                    &mut buffer,
                    &mut buffer_userp,
                    &mut memory_type,
                    &mut memory_type_id,
                ))
            }?;
            let writable = memory_type == MEMORY_CPU || memory_type == MEMORY_CPU_PINNED;
            // Recorded before any check so that it is released either way.
            self.outputs.push(Output {
                name,
                datatype: datatype_to_c(tensor.datatype),
                shape: tensor.shape,
                buffer,
                buffer_userp,
                byte_size,
                memory_type,
                memory_type_id,
            });
            if byte_size == 0 {
                continue;
            }
            if !writable {
                return Err((
                    ERROR_INTERNAL,
                    format!(
                        "output '{}': the allocator returned memory type {memory_type}; only CPU memory can be written here",
                        tensor.name
                    ),
                ));
            }
            if buffer.is_null() {
                return Err((
                    ERROR_INTERNAL,
                    format!("output '{}': the allocator returned no buffer", tensor.name),
                ));
            }
            // SAFETY: the allocator gave `byte_size` writable CPU bytes.
            unsafe {
                ptr::copy_nonoverlapping(tensor.data.as_ptr(), buffer.cast::<u8>(), byte_size)
            };
        }
        Ok(())
    }

    fn release_buffers(&mut self) {
        if self.allocator.is_null() {
            return;
        }
        // SAFETY: non-null (checked above); the allocator outlives every request that names it and
        // so this response (tritonserver.h), as `build` requires.
        let release = unsafe { (*self.allocator).release_fn };
        for o in self.outputs.drain(..) {
            // SAFETY: each buffer came from this allocator's alloc_fn.
            let err = unsafe {
                release(
                    self.allocator,
                    o.buffer,
                    o.buffer_userp,
                    o.byte_size,
                    o.memory_type,
                    o.memory_type_id,
                )
            };
            // SAFETY: the release callback returns null or an error from `TRITONSERVER_ErrorNew`
            // that becomes ours.
            if let Some(e) = unsafe { crate::triton_abi::error::take(err) } {
                tracing::warn!(output = ?o.name, error = %e.message, "response allocator failed to release an output buffer");
            }
        }
    }
}

impl Drop for TRITONSERVER_InferenceResponse {
    fn drop(&mut self) {
        self.release_buffers();
    }
}

/// An allocator callback's error as a (code, message) pair.
unsafe fn taken(err: ErrorPtr) -> Result<(), (ErrorCode, String)> {
    if err.is_null() {
        return Ok(());
    }
    // SAFETY: non-null (checked); an allocator callback's error from `TRITONSERVER_ErrorNew` (a
    // `Box::into_raw`), whose ownership passes to us.
    let boxed = unsafe { Box::from_raw(err) };
    Err((boxed.code, boxed.message_str()))
}

unsafe fn with_response(
    response: *mut TRITONSERVER_InferenceResponse,
    f: impl FnOnce(&TRITONSERVER_InferenceResponse) -> Result<(), ErrorPtr>,
) -> ErrorPtr {
    if response.is_null() {
        return crate::triton_abi::error::invalid_arg("inference_response is null");
    }
    // SAFETY: checked non-null above; callers pass a response the C caller got in its response
    // callback and has not deleted (tritonserver.h); only shared references are made from it.
    status(f(unsafe { &*response }))
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceResponseDelete(
    inference_response: *mut TRITONSERVER_InferenceResponse,
) -> ErrorPtr {
    ffi_entry!({
        if !inference_response.is_null() {
            // SAFETY: `inference_response` is non-null (checked) and came from `Box::into_raw` in
            // the matching New function; the header makes this Delete its one release, so nothing
            // uses it afterwards.
            drop(unsafe { Box::from_raw(inference_response) });
        }
        ptr::null_mut()
    })
}

/// As Triton's implementation does (whatever its header says), each call
/// returns a new error object that the caller deletes.
#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceResponseError(
    inference_response: *mut TRITONSERVER_InferenceResponse,
) -> ErrorPtr {
    ffi_entry!({
        if inference_response.is_null() {
            return crate::triton_abi::error::invalid_arg("inference_response is null");
        }
        // SAFETY: `inference_response` is checked non-null above and is a response the caller got
        // in its response callback and has not deleted yet (tritonserver.h).
        match unsafe { &(*inference_response).error } {
            None => ptr::null_mut(),
            Some((code, message)) => TRITONSERVER_Error::boxed(*code, message.clone()),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceResponseModel(
    inference_response: *mut TRITONSERVER_InferenceResponse,
    model_name: *mut *const c_char,
    model_version: *mut i64,
) -> ErrorPtr {
    ffi_entry!(non_null(inference_response) {
        // SAFETY: `inference_response` is null (refused by `with_response`) or a response the
        // caller got in its response callback and has not deleted (tritonserver.h); out-pointers
        // are checked by `out`.
        unsafe {
            with_response(inference_response, |r| {
                out(model_name, "model_name", r.model_name.as_ptr())?;
                out(model_version, "model_version", r.model_version)
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceResponseId(
    inference_response: *mut TRITONSERVER_InferenceResponse,
    request_id: *mut *const c_char,
) -> ErrorPtr {
    ffi_entry!(non_null(inference_response) {
        // SAFETY: `inference_response` is null (refused by `with_response`) or a response the
        // caller got in its response callback and has not deleted (tritonserver.h); out-pointers
        // are checked by `out`.
        unsafe {
            with_response(inference_response, |r| {
                out(request_id, "request_id", r.id.as_ptr())
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceResponseParameterCount(
    inference_response: *mut TRITONSERVER_InferenceResponse,
    count: *mut u32,
) -> ErrorPtr {
    ffi_entry!(non_null(inference_response) {
        // SAFETY: `inference_response` is null (refused by `with_response`) or a response the
        // caller got in its response callback and has not deleted (tritonserver.h); out-pointers
        // are checked by `out`.
        unsafe {
            with_response(inference_response, |r| {
                out(
                    count,
                    "count",
                    u32::try_from(r.parameters.len()).unwrap_or(u32::MAX),
                )
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceResponseParameter(
    inference_response: *mut TRITONSERVER_InferenceResponse,
    index: u32,
    name: *mut *const c_char,
    kind: *mut ParameterType,
    vvalue: *mut *const c_void,
) -> ErrorPtr {
    ffi_entry!(non_null(inference_response) {
        // SAFETY: `inference_response` is null (refused by `with_response`) or a response the
        // caller got in its response callback and has not deleted (tritonserver.h); out-pointers
        // are checked by `out`.
        unsafe {
            with_response(inference_response, |r| {
                let p = r.parameters.get(index as usize).ok_or_else(|| {
                    crate::triton_abi::error::invalid_arg(format!(
                        "out of bounds index {index}: response has {} parameters",
                        r.parameters.len()
                    ))
                })?;
                out(name, "name", p.name.as_ptr())?;
                out(kind, "type", p.kind())?;
                out(vvalue, "vvalue", p.value_ptr())
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceResponseOutputCount(
    inference_response: *mut TRITONSERVER_InferenceResponse,
    count: *mut u32,
) -> ErrorPtr {
    ffi_entry!(non_null(inference_response) {
        // SAFETY: `inference_response` is null (refused by `with_response`) or a response the
        // caller got in its response callback and has not deleted (tritonserver.h); out-pointers
        // are checked by `out`.
        unsafe {
            with_response(inference_response, |r| {
                out(
                    count,
                    "count",
                    u32::try_from(r.outputs.len()).unwrap_or(u32::MAX),
                )
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceResponseOutput(
    inference_response: *mut TRITONSERVER_InferenceResponse,
    index: u32,
    name: *mut *const c_char,
    datatype: *mut TritonDataType,
    shape: *mut *const i64,
    dim_count: *mut u64,
    base: *mut *const c_void,
    byte_size: *mut usize,
    memory_type: *mut MemoryType,
    memory_type_id: *mut i64,
    userp: *mut *mut c_void,
) -> ErrorPtr {
    ffi_entry!(non_null(inference_response) {
        // SAFETY: `inference_response` is null (refused by `with_response`) or a response the
        // caller got in its response callback and has not deleted (tritonserver.h); out-pointers
        // are checked by `out`.
        unsafe {
            with_response(inference_response, |r| {
                let o = r.outputs.get(index as usize).ok_or_else(|| {
                    crate::triton_abi::error::invalid_arg(format!(
                        "out of bounds index {index}: response has {} outputs",
                        r.outputs.len()
                    ))
                })?;
                out(name, "name", o.name.as_ptr())?;
                out(datatype, "datatype", o.datatype)?;
                out(shape, "shape", o.shape.as_ptr())?;
                out(dim_count, "dim_count", o.shape.len() as u64)?;
                out(base, "base", o.buffer.cast_const())?;
                out(byte_size, "byte_size", o.byte_size)?;
                out(memory_type, "memory_type", o.memory_type)?;
                out(memory_type_id, "memory_type_id", o.memory_type_id)?;
                out(userp, "userp", o.buffer_userp)
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_InferenceResponseOutputClassificationLabel(
    inference_response: *mut TRITONSERVER_InferenceResponse,
    _index: u32,
    _class_index: usize,
    label: *mut *const c_char,
) -> ErrorPtr {
    ffi_entry!(non_null(inference_response) {
        // Labels are applied by the protocol layer's classification
        // extension; in-process responses carry raw outputs, so no label.
        // SAFETY: `inference_response` is null (refused by `with_response`) or a response the
        // caller got in its response callback and has not deleted (tritonserver.h); out-pointers
        // are checked by `out`.
        unsafe { with_response(inference_response, |_| out(label, "label", ptr::null())) }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use bytes::Bytes;

    use super::*;
    use crate::types::{DataType, Tensor};

    static RELEASED: AtomicUsize = AtomicUsize::new(0);

    /// Allocates with `malloc`-like Vec storage, handing the Vec back as
    /// the buffer's userp so release can free it.
    unsafe extern "C" fn alloc(
        _allocator: *mut TRITONSERVER_ResponseAllocator,
        _name: *const c_char,
        byte_size: usize,
        _memory_type: MemoryType,
        _memory_type_id: i64,
        _userp: *mut c_void,
        buffer: *mut *mut c_void,
        buffer_userp: *mut *mut c_void,
        actual_memory_type: *mut MemoryType,
        actual_memory_type_id: *mut i64,
    ) -> ErrorPtr {
        let mut storage = Box::new(vec![0u8; byte_size]);
        // SAFETY: test: the server passes out-pointers valid for writing.
        unsafe {
            *buffer = storage.as_mut_ptr().cast();
            *buffer_userp = Box::into_raw(storage).cast();
            *actual_memory_type = MEMORY_CPU;
            *actual_memory_type_id = 0;
        }
        ptr::null_mut()
    }

    unsafe extern "C" fn release(
        _allocator: *mut TRITONSERVER_ResponseAllocator,
        _buffer: *mut c_void,
        buffer_userp: *mut c_void,
        _byte_size: usize,
        _memory_type: MemoryType,
        _memory_type_id: i64,
    ) -> ErrorPtr {
        // SAFETY: test: `buffer_userp` is the boxed Vec that `alloc` above leaked for this buffer;
        // released once.
        drop(unsafe { Box::from_raw(buffer_userp.cast::<Vec<u8>>()) });
        RELEASED.fetch_add(1, Ordering::SeqCst);
        ptr::null_mut()
    }

    unsafe extern "C" fn refuse(
        _allocator: *mut TRITONSERVER_ResponseAllocator,
        _name: *const c_char,
        _byte_size: usize,
        _memory_type: MemoryType,
        _memory_type_id: i64,
        _userp: *mut c_void,
        _buffer: *mut *mut c_void,
        _buffer_userp: *mut *mut c_void,
        _actual_memory_type: *mut MemoryType,
        _actual_memory_type_id: *mut i64,
    ) -> ErrorPtr {
        crate::triton_abi::error::internal("out of memory")
    }

    unsafe extern "C" fn ignore(
        _response: *mut TRITONSERVER_InferenceResponse,
        _flags: u32,
        _userp: *mut c_void,
    ) {
    }

    fn callback(allocator: *mut TRITONSERVER_ResponseAllocator) -> ResponseCallback {
        ResponseCallback {
            allocator,
            allocator_userp: ptr::null_mut(),
            response_fn: ignore,
            response_userp: ptr::null_mut(),
        }
    }

    fn response() -> InferResponse {
        let mut r = InferResponse {
            model_name: "simple".into(),
            model_version: "1".into(),
            id: "req-1".into(),
            ..Default::default()
        };
        r.outputs.push(Tensor::new(
            "OUTPUT0",
            DataType::Int32,
            vec![1, 2],
            Bytes::from_static(&[1, 0, 0, 0, 2, 0, 0, 0]),
        ));
        r.parameters
            .insert("count".into(), crate::types::ParamValue::Int(7));
        r
    }

    #[test]
    fn outputs_are_written_into_the_callers_buffers_and_released_on_delete() {
        let mut allocator: *mut TRITONSERVER_ResponseAllocator = ptr::null_mut();
        // SAFETY: `shape` is non-null (checked above) and, by the header's contract, points to
        // `dims as usize` elements that stay unchanged for the call; they are copied before it
        // returns.
        unsafe {
            assert!(super::super::allocator::TRITONSERVER_ResponseAllocatorNew(
                &mut allocator,
                Some(alloc),
                Some(release),
                None
            )
            .is_null());
            let r = Box::into_raw(TRITONSERVER_InferenceResponse::build(
                response(),
                &callback(allocator),
            ));
            assert!(TRITONSERVER_InferenceResponseError(r).is_null());
            let mut count = 0;
            assert!(TRITONSERVER_InferenceResponseOutputCount(r, &mut count).is_null());
            assert_eq!(count, 1);
            let (mut name, mut dt, mut shape, mut dims) = (ptr::null(), 0, ptr::null(), 0);
            let (mut base, mut size, mut mt, mut mid, mut userp) =
                (ptr::null(), 0, 9, 9, ptr::null_mut());
            assert!(TRITONSERVER_InferenceResponseOutput(
                r, 0, &mut name, &mut dt, &mut shape, &mut dims, &mut base, &mut size, &mut mt,
                &mut mid, &mut userp,
            )
            .is_null());
            assert_eq!(std::ffi::CStr::from_ptr(name).to_str(), Ok("OUTPUT0"));
            assert_eq!(dt, crate::triton_abi::types::TYPE_INT32);
            assert_eq!(std::slice::from_raw_parts(shape, dims as usize), &[1, 2]);
            assert_eq!(
                std::slice::from_raw_parts(base.cast::<u8>(), size),
                &[1, 0, 0, 0, 2, 0, 0, 0]
            );
            assert_eq!(mt, MEMORY_CPU);
            assert!(!userp.is_null());
            let (mut pname, mut pkind, mut pvalue) = (ptr::null(), 9, ptr::null());
            assert!(TRITONSERVER_InferenceResponseParameter(
                r,
                0,
                &mut pname,
                &mut pkind,
                &mut pvalue
            )
            .is_null());
            assert_eq!(pkind, crate::triton_abi::types::PARAMETER_INT);
            assert_eq!(*pvalue.cast::<i64>(), 7);
            let out_of_range = TRITONSERVER_InferenceResponseOutput(
                r, 1, &mut name, &mut dt, &mut shape, &mut dims, &mut base, &mut size, &mut mt,
                &mut mid, &mut userp,
            );
            assert!(!out_of_range.is_null());
            crate::triton_abi::error::TRITONSERVER_ErrorDelete(out_of_range);
            let before = RELEASED.load(Ordering::SeqCst);
            assert!(TRITONSERVER_InferenceResponseDelete(r).is_null());
            assert_eq!(RELEASED.load(Ordering::SeqCst), before + 1);
            super::super::allocator::TRITONSERVER_ResponseAllocatorDelete(allocator);
        }
    }

    #[test]
    fn a_refused_allocation_makes_an_error_response() {
        let mut allocator: *mut TRITONSERVER_ResponseAllocator = ptr::null_mut();
        // SAFETY: test: every pointer is a local or an object created here
        // through the C API and deleted once.
        unsafe {
            super::super::allocator::TRITONSERVER_ResponseAllocatorNew(
                &mut allocator,
                Some(refuse),
                Some(release),
                None,
            );
            let r = Box::into_raw(TRITONSERVER_InferenceResponse::build(
                response(),
                &callback(allocator),
            ));
            let e = TRITONSERVER_InferenceResponseError(r);
            assert!(!e.is_null());
            assert_eq!((*e).message_str(), "out of memory");
            crate::triton_abi::error::TRITONSERVER_ErrorDelete(e);
            let mut count = 9;
            TRITONSERVER_InferenceResponseOutputCount(r, &mut count);
            assert_eq!(count, 0);
            TRITONSERVER_InferenceResponseDelete(r);
            super::super::allocator::TRITONSERVER_ResponseAllocatorDelete(allocator);
        }
    }
}
