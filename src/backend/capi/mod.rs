//! Triton's backend C API: shared-library backends (`libtriton_<name>.so`)
//! loaded at run time, calling back into the server through the
//! `TRITONBACKEND_*` and `TRITONSERVER_*` functions defined here with
//! Triton's names, signatures and enum values (`include/shardserve/` has
//! our header for backend authors).
//!
//! Exporting: the functions are `#[no_mangle] extern "C"` in this library
//! crate; `build.rs` has the `shardserve` binary export every
//! `TRITONSERVER_*`/`TRITONBACKEND_*` symbol in its dynamic symbol table
//! (`--export-dynamic-symbol`), and [`keep_exported`] (called from
//! `main`) references every one of them so the linker keeps the objects
//! that define them. A dlopened backend then binds to them first, also
//! when it links a `libtritonserver.so` of its own: the executable comes
//! first in the global lookup scope.

// The C names are the ABI.
#![allow(non_camel_case_types)]

pub mod error;
pub mod log;
pub mod message;
pub mod parameter;
pub mod server_api;
pub mod types;

/// Every exported function, referenced so that none is dropped by the
/// linker (see the module's doc). New exported functions go here too.
#[used]
static EXPORTED: Exported = Exported(&[
    error::TRITONSERVER_ErrorNew as *const (),
    error::TRITONSERVER_ErrorDelete as *const (),
    error::TRITONSERVER_ErrorCode as *const (),
    error::TRITONSERVER_ErrorCodeString as *const (),
    error::TRITONSERVER_ErrorMessage as *const (),
    message::TRITONSERVER_MessageNewFromSerializedJson as *const (),
    message::TRITONSERVER_MessageDelete as *const (),
    message::TRITONSERVER_MessageSerializeToJson as *const (),
    parameter::TRITONSERVER_ParameterNew as *const (),
    parameter::TRITONSERVER_ParameterBytesNew as *const (),
    parameter::TRITONSERVER_ParameterDelete as *const (),
    parameter::TRITONSERVER_ParameterTypeString as *const (),
    log::TRITONSERVER_ApiVersion as *const (),
    log::TRITONBACKEND_ApiVersion as *const (),
    log::TRITONSERVER_DataTypeString as *const (),
    log::TRITONSERVER_StringToDataType as *const (),
    log::TRITONSERVER_DataTypeByteSize as *const (),
    log::TRITONSERVER_MemoryTypeString as *const (),
    log::TRITONSERVER_InstanceGroupKindString as *const (),
    log::TRITONSERVER_LogIsEnabled as *const (),
    log::TRITONSERVER_LogMessage as *const (),
]);

struct Exported(&'static [*const ()]);

// SAFETY: code addresses, never written or dereferenced.
unsafe impl Sync for Exported {}

/// Keeps every exported C function in the executable; `main` calls it
/// once. Returns the number of functions, which makes the table's use
/// observable to the optimizer.
pub fn keep_exported() -> usize {
    std::hint::black_box(&EXPORTED).0.len() + server_api::keep_exported()
}
