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

use super::{
    error::{self, c_str, non_null, status, ErrorPtr},
    memory::{self, TRITONSERVER_BufferAttributes},
    request::TRITONBACKEND_Request,
    types::{datatype_from_c, MemoryType, TritonDataType, RESPONSE_COMPLETE_FINAL},
};
use crate::{
    backend::ResponseSender,
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

fn new_response(target: Arc<ResponseTarget>) -> *mut TRITONBACKEND_Response {
    Box::into_raw(Box::new(TRITONBACKEND_Response {
        target,
        outputs: Vec::new(),
        parameters: Parameters::new(),
    }))
}

unsafe fn response<'a>(
    r: *mut TRITONBACKEND_Response,
) -> Result<&'a mut TRITONBACKEND_Response, ErrorPtr> {
    non_null(r, "response")?;
    Ok(unsafe { &mut *r })
}

unsafe fn factory<'a>(
    f: *mut TRITONBACKEND_ResponseFactory,
) -> Result<&'a TRITONBACKEND_ResponseFactory, ErrorPtr> {
    non_null(f, "factory")?;
    Ok(unsafe { &*f })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ResponseFactoryNew(
    out: *mut *mut TRITONBACKEND_ResponseFactory,
    request: *mut TRITONBACKEND_Request,
) -> ErrorPtr {
    ffi_entry!({
        non_null(out, "factory")?;
        non_null(request, "request")?;
        let target = unsafe { (*request).target.clone() };
        unsafe { *out = Box::into_raw(Box::new(TRITONBACKEND_ResponseFactory { target })) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ResponseFactoryDelete(
    f: *mut TRITONBACKEND_ResponseFactory,
) -> ErrorPtr {
    ffi_entry!({
        if !f.is_null() {
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
    ffi_entry!({
        let f = unsafe { factory(f)? };
        non_null(is_cancelled, "is_cancelled")?;
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
    ffi_entry!({
        let f = unsafe { factory(f)? };
        f.target.send(Vec::new(), Parameters::new(), send_flags)
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ResponseNew(
    out: *mut *mut TRITONBACKEND_Response,
    request: *mut TRITONBACKEND_Request,
) -> ErrorPtr {
    ffi_entry!({
        non_null(out, "response")?;
        non_null(request, "request")?;
        unsafe { *out = new_response((*request).target.clone()) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ResponseNewFromFactory(
    out: *mut *mut TRITONBACKEND_Response,
    f: *mut TRITONBACKEND_ResponseFactory,
) -> ErrorPtr {
    ffi_entry!({
        let f = unsafe { factory(f)? };
        non_null(out, "response")?;
        unsafe { *out = new_response(f.target.clone()) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ResponseDelete(r: *mut TRITONBACKEND_Response) -> ErrorPtr {
    ffi_entry!({
        if !r.is_null() {
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
        let r = unsafe { response(r)? };
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
    ffi_entry!({ set_parameter(r, name, ParamValue::Int(value)) })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ResponseSetBoolParameter(
    r: *mut TRITONBACKEND_Response,
    name: *const c_char,
    value: bool,
) -> ErrorPtr {
    ffi_entry!({ set_parameter(r, name, ParamValue::Bool(value)) })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_ResponseSetDoubleParameter(
    r: *mut TRITONBACKEND_Response,
    name: *const c_char,
    value: f64,
) -> ErrorPtr {
    ffi_entry!({ set_parameter(r, name, ParamValue::Double(value)) })
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
    ffi_entry!({
        let r = unsafe { response(r)? };
        non_null(output, "output")?;
        let name = unsafe { c_str(name, "name")? };
        let datatype = datatype_from_c(datatype).ok_or_else(|| {
            error::invalid_arg(format!("output '{name}': invalid datatype {datatype}"))
        })?;
        let shape = if dims_count == 0 {
            Vec::new()
        } else {
            non_null(shape, "shape")?;
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
    ffi_entry!({
        non_null(o, "output")?;
        non_null(buffer, "buffer")?;
        let o = unsafe { &mut *o };
        if let (Some(size), Some(n)) = (o.datatype.element_size(), element_count(&o.shape)) {
            if (size * n) as u64 != buffer_byte_size {
                return Err(error::invalid_arg(format!(
                    "output '{}': buffer of {buffer_byte_size} bytes for a {} tensor of shape {:?} ({} bytes)",
                    o.name,
                    o.datatype,
                    o.shape,
                    size * n
                )));
            }
        }
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
    ffi_entry!({
        non_null(o, "output")?;
        non_null(attributes, "buffer_attributes")?;
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
    ffi_entry!({
        non_null(r, "response")?;
        // SAFETY: a response from `new_response`; sending consumes it.
        let r = unsafe { Box::from_raw(r) };
        if !err.is_null() {
            let e = unsafe { &*err };
            r.target.fail(InferError::new(
                super::types::error_code_to_kind(e.code),
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
    ffi_entry!({
        let r = unsafe { response(r)? };
        let name = unsafe { c_str(name, "name")? };
        let o = r
            .outputs
            .iter()
            .find(|o| o.name == name)
            .ok_or_else(|| error::not_found(format!("Output name {name} not found")))?;
        unsafe {
            if !datatype.is_null() {
                *datatype = super::types::datatype_to_c(o.datatype);
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
