//! `TRITONBACKEND_Response`, `TRITONBACKEND_Output` and
//! `TRITONBACKEND_ResponseFactory`. Every response of a request goes to
//! its [`ResponseTarget`], which holds the scheduler's `ResponseSender`:
//! one response then the final flag for an ordinary model, any number
//! for a decoupled one, from any thread, also after the request was
//! released.

use std::{
    ffi::{c_char, c_void},
    sync::{Arc, Mutex},
};

use bytes::Bytes;

use super::memory;
use crate::{
    backend::ResponseSender,
    triton_abi::{
        buffer::TRITONSERVER_BufferAttributes,
        error::{self, c_str, non_null, status, ErrorPtr},
        types::{
            datatype_from_c, datatype_to_c, error_code_to_kind, MemoryType, TritonDataType,
            RESPONSE_COMPLETE_FINAL,
        },
    },
    types::{element_count, DataType, InferError, ParamValue, Parameters, Tensor},
};

/// Where a request's responses go.
pub struct ResponseTarget {
    /// `None` once the request is complete (final flag or error).
    sender: Mutex<Option<ResponseSender>>,
    decoupled: bool,
}

impl ResponseTarget {
    pub fn new(sender: ResponseSender, decoupled: bool) -> Self {
        Self {
            sender: Mutex::new(Some(sender)),
            decoupled,
        }
    }

    fn sender(&self) -> std::sync::MutexGuard<'_, Option<ResponseSender>> {
        self.sender.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn is_cancelled(&self) -> bool {
        self.sender().as_ref().is_none_or(|s| s.is_cancelled())
    }

    /// Ends the request with `e`, unless it is complete already.
    pub fn fail(&self, e: InferError) {
        if let Some(s) = self.sender().take() {
            s.fail(e);
        }
    }

    fn send(
        &self,
        outputs: Vec<Tensor>,
        parameters: Parameters,
        flags: u32,
    ) -> Result<(), ErrorPtr> {
        let mut guard = self.sender();
        let Some(sender) = guard.as_mut() else {
            return Err(error::invalid_arg(
                "the request's final response was already sent",
            ));
        };
        let last = flags & RESPONSE_COMPLETE_FINAL != 0;
        // A decoupled request's empty final response is its final flag
        // alone (what Triton's clients receive for it).
        let skip = self.decoupled && last && outputs.is_empty() && parameters.is_empty();
        let sent = skip || sender.send_with(outputs, parameters).is_ok();
        if last {
            if let Some(s) = guard.take() {
                s.finish();
            }
        } else if !sent {
            // Nobody listens any more; the backend learns it through
            // `IsCancelled`, as with Triton.
            guard.take();
        }
        Ok(())
    }
}

/// Opaque to C.
pub struct TRITONBACKEND_Output {
    name: String,
    datatype: DataType,
    shape: Vec<i64>,
    buffer: Vec<u8>,
    attributes: TRITONSERVER_BufferAttributes,
}

/// Opaque to C.
pub struct TRITONBACKEND_Response {
    target: Arc<ResponseTarget>,
    /// Boxed: the backend keeps output addresses.
    #[allow(clippy::vec_box)]
    outputs: Vec<Box<TRITONBACKEND_Output>>,
    parameters: Parameters,
}

/// Opaque to C.
pub struct TRITONBACKEND_ResponseFactory {
    target: Arc<ResponseTarget>,
}

/// A new response to `target`, owned by the returned pointer (the
/// backend's until sent or deleted). `TRITONBACKEND_ResponseNew` and
/// `TRITONBACKEND_ResponseFactoryNew` take a request, so they are
/// `request`'s.
pub(super) fn new_response(target: Arc<ResponseTarget>) -> *mut TRITONBACKEND_Response {
    Box::into_raw(Box::new(TRITONBACKEND_Response {
        target,
        outputs: Vec::new(),
        parameters: Parameters::new(),
    }))
}

/// A new response factory for `target`, owned by the returned pointer.
pub(super) fn new_factory(target: Arc<ResponseTarget>) -> *mut TRITONBACKEND_ResponseFactory {
    Box::into_raw(Box::new(TRITONBACKEND_ResponseFactory { target }))
}

unsafe fn response<'a>(
    r: *mut TRITONBACKEND_Response,
) -> Result<&'a mut TRITONBACKEND_Response, ErrorPtr> {
    non_null(r, "response")?;
    // SAFETY: checked non-null above; callers pass a response from `TRITONBACKEND_ResponseNew*`,
    // not sent or deleted, which tritonbackend.h has the backend use from one thread at a time (so
    // the `&mut` is unique).
    Ok(unsafe { &mut *r })
}

unsafe fn factory<'a>(
    f: *mut TRITONBACKEND_ResponseFactory,
) -> Result<&'a TRITONBACKEND_ResponseFactory, ErrorPtr> {
    non_null(f, "factory")?;
    // SAFETY: checked non-null above; callers pass a factory from
    // `TRITONBACKEND_ResponseFactoryNew`, not deleted yet; only shared references are made from
    // it.
    Ok(unsafe { &*f })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ResponseFactoryDelete(
    f: *mut TRITONBACKEND_ResponseFactory,
) -> ErrorPtr {
    ffi_entry!({
        if !f.is_null() {
            // SAFETY: `f` is non-null (checked) and came from `Box::into_raw` in the matching New
            // function; the header makes this Delete its one release, so nothing uses it
            // afterwards.
            drop(unsafe { Box::from_raw(f) });
        }
        std::ptr::null_mut()
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ResponseFactoryIsCancelled(
    f: *mut TRITONBACKEND_ResponseFactory,
    is_cancelled: *mut bool,
) -> ErrorPtr {
    ffi_entry!(non_null(f as "factory", is_cancelled) {
        // SAFETY: `f` is null (refused by `factory`) or a factory from
        // `TRITONBACKEND_ResponseFactoryNew` not deleted yet.
        let f = unsafe { factory(f)? };
        // SAFETY: `is_cancelled` is checked non-null above and, by the header's contract, valid
        // for writing one value.
        unsafe { *is_cancelled = f.target.is_cancelled() };
        Ok(())
    })
}

/// A response with flags only (the decoupled final flag).
#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ResponseFactorySendFlags(
    f: *mut TRITONBACKEND_ResponseFactory,
    send_flags: u32,
) -> ErrorPtr {
    ffi_entry!(non_null(f as "factory") {
        // SAFETY: `f` is null (refused by `factory`) or a factory from
        // `TRITONBACKEND_ResponseFactoryNew` not deleted yet.
        let f = unsafe { factory(f)? };
        f.target.send(Vec::new(), Parameters::new(), send_flags)
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ResponseNewFromFactory(
    out: *mut *mut TRITONBACKEND_Response,
    f: *mut TRITONBACKEND_ResponseFactory,
) -> ErrorPtr {
    ffi_entry!(non_null(f as "factory", out as "response") {
        // SAFETY: `f` is null (refused by `factory`) or a factory from
        // `TRITONBACKEND_ResponseFactoryNew` not deleted yet.
        let f = unsafe { factory(f)? };
        // SAFETY: `out` is checked non-null above and, by the header's contract, valid for writing
        // one value.
        unsafe { *out = new_response(f.target.clone()) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ResponseDelete(r: *mut TRITONBACKEND_Response) -> ErrorPtr {
    ffi_entry!({
        if !r.is_null() {
            // SAFETY: `r` is non-null (checked) and came from `Box::into_raw` in the matching New
            // function; the header makes this Delete its one release, so nothing uses it
            // afterwards.
            drop(unsafe { Box::from_raw(r) });
        }
        std::ptr::null_mut()
    })
}

fn set_parameter(
    r: *mut TRITONBACKEND_Response,
    name: *const c_char,
    value: ParamValue,
) -> ErrorPtr {
    status((|| {
        // SAFETY: `r` is null (refused by `response`) or a response from
        // `TRITONBACKEND_ResponseNew*` that is not sent or deleted yet; tritonbackend.h has the
        // backend use a response from one thread at a time, so the `&mut` is unique.
        let r = unsafe { response(r)? };
        // SAFETY: `name` is null (refused by `c_str`) or a NUL-terminated string the caller keeps
        // valid for the call (the header's `const char*` contract); nothing keeps the `&str` past
        // the call.
        let name = unsafe { c_str(name, "name")? };
        r.parameters.insert(name.to_owned(), value);
        Ok(())
    })())
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ResponseSetStringParameter(
    r: *mut TRITONBACKEND_Response,
    name: *const c_char,
    value: *const c_char,
) -> ErrorPtr {
    ffi_entry!({
        // SAFETY: `value` is null (refused by `c_str`) or a NUL-terminated string the caller keeps
        // valid for the call (the header's `const char*` contract); nothing keeps the `&str` past
        // the call.
        match unsafe { c_str(value, "value") } {
            Ok(v) => set_parameter(r, name, ParamValue::String(v.to_owned())),
            Err(e) => e,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ResponseSetIntParameter(
    r: *mut TRITONBACKEND_Response,
    name: *const c_char,
    value: i64,
) -> ErrorPtr {
    ffi_entry!(non_null(r as "response") { set_parameter(r, name, ParamValue::Int(value)) })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ResponseSetBoolParameter(
    r: *mut TRITONBACKEND_Response,
    name: *const c_char,
    value: bool,
) -> ErrorPtr {
    ffi_entry!(non_null(r as "response") { set_parameter(r, name, ParamValue::Bool(value)) })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ResponseSetDoubleParameter(
    r: *mut TRITONBACKEND_Response,
    name: *const c_char,
    value: f64,
) -> ErrorPtr {
    ffi_entry!(non_null(r as "response") { set_parameter(r, name, ParamValue::Double(value)) })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ResponseOutput(
    r: *mut TRITONBACKEND_Response,
    output: *mut *mut TRITONBACKEND_Output,
    name: *const c_char,
    datatype: TritonDataType,
    shape: *const i64,
    dims_count: u32,
) -> ErrorPtr {
    ffi_entry!(non_null(r as "response", output) {
        // SAFETY: `r` is null (refused by `response`) or a response from
        // `TRITONBACKEND_ResponseNew*` that is not sent or deleted yet; tritonbackend.h has the
        // backend use a response from one thread at a time, so the `&mut` is unique.
        let r = unsafe { response(r)? };
        // SAFETY: `name` is null (refused by `c_str`) or a NUL-terminated string the caller keeps
        // valid for the call (the header's `const char*` contract); nothing keeps the `&str` past
        // the call.
        let name = unsafe { c_str(name, "name")? };
        let datatype = datatype_from_c(datatype).ok_or_else(|| {
            error::invalid_arg(format!("output '{name}': invalid datatype {datatype}"))
        })?;
        let shape = if dims_count == 0 {
            Vec::new()
        } else {
            non_null(shape, "shape")?;
            // SAFETY: `shape` is non-null (checked above) and, by the header's contract, points to
            // `dims_count as usize` elements that stay unchanged for the call; they are copied
            // before it returns.
            unsafe { std::slice::from_raw_parts(shape, dims_count as usize) }.to_vec()
        };
        if element_count(&shape).is_none() {
            return Err(error::invalid_arg(format!(
                "output '{name}': invalid shape {shape:?}"
            )));
        }
        if r.outputs.iter().any(|o| o.name == name) {
            return Err(error::invalid_arg(format!(
                "output '{name}' already exists in the response"
            )));
        }
        let mut o = Box::new(TRITONBACKEND_Output {
            name: name.to_owned(),
            datatype,
            shape,
            buffer: Vec::new(),
            attributes: TRITONSERVER_BufferAttributes::host(0),
        });
        // SAFETY: `output` is checked non-null above and valid for writing (tritonbackend.h); the
        // output is boxed, so its address stays valid while the response owns it.
        unsafe { *output = &mut *o };
        r.outputs.push(o);
        Ok(())
    })
}

/// Host memory, whatever the backend prefers (`memory_type` is in/out).
/// For a fixed-size type the size must be the shape's.
#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_OutputBuffer(
    o: *mut TRITONBACKEND_Output,
    buffer: *mut *mut c_void,
    buffer_byte_size: u64,
    memory_type: *mut MemoryType,
    memory_type_id: *mut i64,
) -> ErrorPtr {
    ffi_entry!(non_null(o as "output", buffer) {
        // SAFETY: `o` is checked non-null above and is an output from
        // `TRITONBACKEND_ResponseOutput`, owned (boxed) by its response, which is not sent or
        // deleted yet; the backend fills it from one thread.
        let o = unsafe { &mut *o };
        if let (Some(size), Some(n)) = (o.datatype.element_size(), element_count(&o.shape)) {
            // Checked: a shape whose byte size wraps would otherwise match a
            // small buffer.
            let expected = size.checked_mul(n).map(|b| b as u64);
            if expected != Some(buffer_byte_size) {
                return Err(error::invalid_arg(format!(
                    "output '{}': buffer of {buffer_byte_size} bytes for a {} tensor of shape {:?} ({})",
                    o.name,
                    o.datatype,
                    o.shape,
                    expected.map_or_else(|| "too large".to_owned(), |b| format!("{b} bytes"))
                )));
            }
        }
        // SAFETY: `buffer` is checked non-null above and valid for writing
        // (tritonbackend.h); `memory_type`/`memory_type_id` are null or valid
        // for writing, as `hand_out_host_buffer` requires.
        unsafe {
            memory::hand_out_host_buffer(
                &mut o.buffer,
                &mut o.attributes,
                buffer_byte_size,
                "output",
                buffer,
                memory_type,
                memory_type_id,
            )
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_OutputBufferAttributes(
    o: *mut TRITONBACKEND_Output,
    attributes: *mut *mut TRITONSERVER_BufferAttributes,
) -> ErrorPtr {
    ffi_entry!(non_null(o as "output", attributes as "buffer_attributes") {
        // SAFETY: `attributes` is checked non-null above and, by the header's contract, valid for
        // writing one value; `o` is checked non-null above and is an output from
        // `TRITONBACKEND_ResponseOutput`, owned (boxed) by its response, which is not sent or
        // deleted yet; the backend fills it from one thread.
        unsafe { *attributes = &mut (*o).attributes };
        Ok(())
    })
}

/// Sends (and takes) the response. With an `error` the request ends with
/// it (the backend keeps and frees its error object, as in Triton).
#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ResponseSend(
    r: *mut TRITONBACKEND_Response,
    send_flags: u32,
    err: ErrorPtr,
) -> ErrorPtr {
    ffi_entry!(non_null(r as "response") {
        // SAFETY: a response from `new_response`; sending consumes it.
        let r = unsafe { Box::from_raw(r) };
        if !err.is_null() {
            // SAFETY: `err` is checked non-null above and is the backend's error object, which it
            // keeps (and frees) itself after the call.
            let e = unsafe { &*err };
            r.target.fail(InferError::new(
                error_code_to_kind(e.code),
                e.message_str(),
            ));
            return Ok(());
        }
        let TRITONBACKEND_Response {
            target,
            outputs,
            parameters,
        } = *r;
        let tensors = outputs
            .into_iter()
            .map(|o| {
                let o = *o;
                Tensor::new(o.name, o.datatype, o.shape, Bytes::from(o.buffer))
            })
            .collect();
        target.send(tensors, parameters, send_flags)
    })
}

/// Looks up an output already added to `response`.
#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_InferenceResponseOutputByName(
    r: *mut TRITONBACKEND_Response,
    name: *const c_char,
    datatype: *mut TritonDataType,
    shape: *mut *const i64,
    dim_count: *mut u64,
) -> ErrorPtr {
    ffi_entry!(non_null(r as "response") {
        // SAFETY: `r` is null (refused by `response`) or a response from
        // `TRITONBACKEND_ResponseNew*` that is not sent or deleted yet; tritonbackend.h has the
        // backend use a response from one thread at a time, so the `&mut` is unique.
        let r = unsafe { response(r)? };
        // SAFETY: `name` is null (refused by `c_str`) or a NUL-terminated string the caller keeps
        // valid for the call (the header's `const char*` contract); nothing keeps the `&str` past
        // the call.
        let name = unsafe { c_str(name, "name")? };
        let o = r
            .outputs
            .iter()
            .find(|o| o.name == name)
            .ok_or_else(|| error::not_found(format!("Output name {name} not found")))?;
        // SAFETY: each out-pointer is written only when non-null, and then is
        // the caller's, valid for writing (tritonbackend.h); `shape` points
        // into the output, which lives as long as the response.
        unsafe {
            if !datatype.is_null() {
                *datatype = datatype_to_c(o.datatype);
            }
            if !shape.is_null() {
                *shape = o.shape.as_ptr();
            }
            if !dim_count.is_null() {
                *dim_count = o.shape.len() as u64;
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use std::ffi::CStr;

    use super::*;
    use crate::triton_abi::{
        error::{TRITONSERVER_ErrorCode, TRITONSERVER_ErrorDelete, TRITONSERVER_ErrorMessage},
        types::{ErrorCode, ERROR_INTERNAL, ERROR_INVALID_ARG},
    };

    fn output(datatype: DataType, shape: Vec<i64>) -> TRITONBACKEND_Output {
        TRITONBACKEND_Output {
            name: "OUT".into(),
            datatype,
            shape,
            buffer: Vec::new(),
            attributes: TRITONSERVER_BufferAttributes::host(0),
        }
    }

    /// `TRITONBACKEND_OutputBuffer(o, size)`: the error's code and message
    /// (the error is freed), or the buffer.
    fn output_buffer(
        o: &mut TRITONBACKEND_Output,
        size: u64,
    ) -> Result<*mut c_void, (ErrorCode, String)> {
        let mut buffer = std::ptr::null_mut();
        // SAFETY: test: the output and the out-pointer are locals; the
        // memory type pointers may be null.
        unsafe {
            let e = TRITONBACKEND_OutputBuffer(
                o,
                &mut buffer,
                size,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            );
            if e.is_null() {
                return Ok(buffer);
            }
            let out = (
                TRITONSERVER_ErrorCode(e),
                CStr::from_ptr(TRITONSERVER_ErrorMessage(e))
                    .to_string_lossy()
                    .into_owned(),
            );
            TRITONSERVER_ErrorDelete(e);
            Err(out)
        }
    }

    #[test]
    fn a_buffer_no_memory_can_hold_is_an_error_and_the_output_stays_usable() {
        // A BYTES output has no size to check against: this size used to
        // panic ("capacity overflow") across the C boundary, aborting the
        // server; an allocation the system refuses aborted it too.
        let mut o = output(DataType::Bytes, vec![1]);
        let (code, message) = output_buffer(&mut o, u64::MAX).expect_err("refused");
        assert_eq!(code, ERROR_INTERNAL);
        assert_eq!(
            message,
            "out of memory allocating 18446744073709551615 bytes for the output buffer"
        );
        let buffer = output_buffer(&mut o, 4).expect("a small buffer");
        assert!(!buffer.is_null());
        assert_eq!(o.buffer.len(), 4);
    }

    #[test]
    fn a_shape_whose_byte_size_overflows_is_refused() {
        // 2^62 FP32 elements are 2^64 bytes, which wrapped to 0: an empty
        // buffer was accepted for a tensor that large.
        let mut o = output(DataType::Fp32, vec![1 << 62]);
        let (code, message) = output_buffer(&mut o, 0).expect_err("refused");
        assert_eq!(code, ERROR_INVALID_ARG);
        assert!(message.ends_with("(too large)"), "{message}");
        let mut fine = output(DataType::Fp32, vec![2, 3]);
        assert!(output_buffer(&mut fine, 24).is_ok());
        assert!(output_buffer(&mut fine, 20).is_err_and(|(c, _)| c == ERROR_INVALID_ARG));
    }
}
