//! The C ABI leaf that the backend API (`backend::capi`, `TRITONBACKEND_*`)
//! and the in-process server API (`frontend::inprocess`, `TRITONSERVER_*`)
//! share: errors, messages, parameters, buffer attributes, Triton's enum
//! values, the basic `TRITONSERVER_*` string, version and log functions,
//! the argument and out-parameter helpers, the opaque server handle, and
//! the `ffi_entry!` guard every exported function runs under. Imports
//! nothing above `types`.

#![allow(non_camel_case_types, clippy::missing_safety_doc)]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

// First, so that `ffi_entry!` is in scope in every module below.
#[macro_use]
pub mod ffi;

pub mod buffer;
pub mod error;
pub mod log;
pub mod message;
pub mod parameter;
pub mod types;

/// Every function exported here, referenced so the linker keeps them (see
/// `backend::capi`'s module doc on exporting).
#[used]
static EXPORTED: ffi::Exported = ffi::Exported(&[
    error::TRITONSERVER_ErrorNew as *const (),
    error::TRITONSERVER_ErrorDelete as *const (),
    error::TRITONSERVER_ErrorCode as *const (),
    error::TRITONSERVER_ErrorCodeString as *const (),
    error::TRITONSERVER_ErrorMessage as *const (),
    log::TRITONSERVER_ApiVersion as *const (),
    log::TRITONSERVER_DataTypeString as *const (),
    log::TRITONSERVER_StringToDataType as *const (),
    log::TRITONSERVER_DataTypeByteSize as *const (),
    log::TRITONSERVER_MemoryTypeString as *const (),
    log::TRITONSERVER_InstanceGroupKindString as *const (),
    log::TRITONSERVER_LogIsEnabled as *const (),
    log::TRITONSERVER_LogMessage as *const (),
    message::TRITONSERVER_MessageNewFromSerializedJson as *const (),
    message::TRITONSERVER_MessageDelete as *const (),
    message::TRITONSERVER_MessageSerializeToJson as *const (),
    parameter::TRITONSERVER_ParameterNew as *const (),
    parameter::TRITONSERVER_ParameterBytesNew as *const (),
    parameter::TRITONSERVER_ParameterDelete as *const (),
    parameter::TRITONSERVER_ParameterTypeString as *const (),
    buffer::TRITONSERVER_BufferAttributesNew as *const (),
    buffer::TRITONSERVER_BufferAttributesDelete as *const (),
    buffer::TRITONSERVER_BufferAttributesMemoryType as *const (),
    buffer::TRITONSERVER_BufferAttributesMemoryTypeId as *const (),
    buffer::TRITONSERVER_BufferAttributesByteSize as *const (),
    buffer::TRITONSERVER_BufferAttributesCudaIpcHandle as *const (),
    buffer::TRITONSERVER_BufferAttributesSetMemoryType as *const (),
    buffer::TRITONSERVER_BufferAttributesSetMemoryTypeId as *const (),
    buffer::TRITONSERVER_BufferAttributesSetByteSize as *const (),
    buffer::TRITONSERVER_BufferAttributesSetCudaIpcHandle as *const (),
]);

/// Referenced from `backend::capi::keep_exported` and
/// `frontend::inprocess::keep_exported`.
pub fn keep_exported() -> usize {
    std::hint::black_box(&EXPORTED).0.len()
}
