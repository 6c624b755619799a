//! Triton's backend C API: shared-library backends (`libtriton_<name>.so`)
//! loaded at run time, calling back into the server through the
//! `TRITONBACKEND_*` functions defined here (and the `TRITONSERVER_*`
//! ones of `triton_abi` and `frontend::inprocess`) with Triton's names,
//! signatures and enum values (`include/shardserve/` has our header for
//! backend authors).
//!
//! Layers, each importing only those below it (`super::` edges point
//! down): `memory`, `finalizing`, `settings`, `state`, `response` at the
//! bottom; `request` (which hands out responses and states); `backend`
//! (the library and its entry points); `model`; `instance`; `bridge` (the
//! server's `Backend` over all of them).
//!
//! Exporting: the functions are `#[no_mangle] extern "C"` in this library
//! crate; `build.rs` has the `shardserve` binary export every
//! `TRITONSERVER_*`/`TRITONBACKEND_*` symbol in its dynamic symbol table
//! (`--export-dynamic-symbol`), and [`keep_exported`] (called from
//! `main`) references every one of them so the linker keeps the objects
//! that define them. A dlopened backend then binds to them first, also
//! when it links a `libtritonserver.so` of its own: the executable comes
//! first in the global lookup scope.

// The C names are the ABI, and every exported function's safety contract
// is the one tritonbackend.h/tritonserver.h document for its pointers.
#![allow(non_camel_case_types, clippy::missing_safety_doc)]
// Every unsafe operation sits in its own block that says why it is sound.
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

pub mod backend;
pub mod bridge;
pub mod finalizing;
pub mod instance;
pub mod memory;
pub mod model;
pub mod request;
pub mod response;
pub mod settings;
pub mod state;

pub use bridge::CapiBackend;

/// Every exported function, referenced so that none is dropped by the
/// linker (see the module's doc). New exported functions go here too.
#[used]
static EXPORTED: crate::triton_abi::ffi::Exported = crate::triton_abi::ffi::Exported(&[
    backend::TRITONBACKEND_ApiVersion as *const (),
    memory::TRITONBACKEND_MemoryManagerAllocate as *const (),
    memory::TRITONBACKEND_MemoryManagerFree as *const (),
    backend::TRITONBACKEND_BackendName as *const (),
    backend::TRITONBACKEND_BackendConfig as *const (),
    backend::TRITONBACKEND_BackendExecutionPolicy as *const (),
    backend::TRITONBACKEND_BackendSetExecutionPolicy as *const (),
    backend::TRITONBACKEND_BackendArtifacts as *const (),
    backend::TRITONBACKEND_BackendMemoryManager as *const (),
    backend::TRITONBACKEND_BackendState as *const (),
    backend::TRITONBACKEND_BackendSetState as *const (),
    backend::TRITONBACKEND_BackendAttributeAddPreferredInstanceGroup as *const (),
    backend::TRITONBACKEND_BackendAttributeSetParallelModelInstanceLoading as *const (),
    model::TRITONBACKEND_ModelName as *const (),
    model::TRITONBACKEND_ModelVersion as *const (),
    model::TRITONBACKEND_ModelRepository as *const (),
    model::TRITONBACKEND_ModelConfig as *const (),
    model::TRITONBACKEND_ModelAutoCompleteConfig as *const (),
    model::TRITONBACKEND_ModelSetConfig as *const (),
    model::TRITONBACKEND_ModelServer as *const (),
    model::TRITONBACKEND_ModelBackend as *const (),
    model::TRITONBACKEND_ModelState as *const (),
    model::TRITONBACKEND_ModelSetState as *const (),
    model::TRITONBACKEND_ModelReportMemoryUsage as *const (),
    instance::TRITONBACKEND_ModelInstanceName as *const (),
    instance::TRITONBACKEND_ModelInstanceKind as *const (),
    instance::TRITONBACKEND_ModelInstanceDeviceId as *const (),
    instance::TRITONBACKEND_ModelInstanceHostPolicy as *const (),
    instance::TRITONBACKEND_ModelInstanceIsPassive as *const (),
    instance::TRITONBACKEND_ModelInstanceProfileCount as *const (),
    instance::TRITONBACKEND_ModelInstanceProfileName as *const (),
    instance::TRITONBACKEND_ModelInstanceSecondaryDeviceCount as *const (),
    instance::TRITONBACKEND_ModelInstanceSecondaryDeviceProperties as *const (),
    instance::TRITONBACKEND_ModelInstanceModel as *const (),
    instance::TRITONBACKEND_ModelInstanceState as *const (),
    instance::TRITONBACKEND_ModelInstanceSetState as *const (),
    instance::TRITONBACKEND_ModelInstanceReportStatistics as *const (),
    instance::TRITONBACKEND_ModelInstanceReportBatchStatistics as *const (),
    instance::TRITONBACKEND_ModelInstanceReportMemoryUsage as *const (),
    request::TRITONBACKEND_RequestId as *const (),
    request::TRITONBACKEND_RequestIsCancelled as *const (),
    request::TRITONBACKEND_RequestCorrelationId as *const (),
    request::TRITONBACKEND_RequestCorrelationIdString as *const (),
    request::TRITONBACKEND_InferenceRequestTimeoutMicroseconds as *const (),
    request::TRITONBACKEND_RequestFlags as *const (),
    request::TRITONBACKEND_RequestParameterCount as *const (),
    request::TRITONBACKEND_RequestParameter as *const (),
    request::TRITONBACKEND_RequestInputCount as *const (),
    request::TRITONBACKEND_RequestInputName as *const (),
    request::TRITONBACKEND_RequestInput as *const (),
    request::TRITONBACKEND_RequestInputByIndex as *const (),
    request::TRITONBACKEND_RequestOutputCount as *const (),
    request::TRITONBACKEND_RequestOutputName as *const (),
    request::TRITONBACKEND_RequestOutputBufferProperties as *const (),
    request::TRITONBACKEND_RequestRelease as *const (),
    request::TRITONBACKEND_RequestTrace as *const (),
    request::TRITONBACKEND_InputProperties as *const (),
    request::TRITONBACKEND_InputPropertiesForHostPolicy as *const (),
    request::TRITONBACKEND_InputBuffer as *const (),
    request::TRITONBACKEND_InputBufferForHostPolicy as *const (),
    request::TRITONBACKEND_InputBufferAttributes as *const (),
    request::TRITONBACKEND_ResponseFactoryNew as *const (),
    response::TRITONBACKEND_ResponseFactoryDelete as *const (),
    response::TRITONBACKEND_ResponseFactoryIsCancelled as *const (),
    response::TRITONBACKEND_ResponseFactorySendFlags as *const (),
    request::TRITONBACKEND_ResponseNew as *const (),
    response::TRITONBACKEND_ResponseNewFromFactory as *const (),
    response::TRITONBACKEND_ResponseDelete as *const (),
    response::TRITONBACKEND_ResponseSetStringParameter as *const (),
    response::TRITONBACKEND_ResponseSetIntParameter as *const (),
    response::TRITONBACKEND_ResponseSetBoolParameter as *const (),
    response::TRITONBACKEND_ResponseSetDoubleParameter as *const (),
    response::TRITONBACKEND_ResponseOutput as *const (),
    response::TRITONBACKEND_OutputBuffer as *const (),
    response::TRITONBACKEND_OutputBufferAttributes as *const (),
    response::TRITONBACKEND_ResponseSend as *const (),
    response::TRITONBACKEND_InferenceResponseOutputByName as *const (),
    request::TRITONBACKEND_StateNew as *const (),
    state::TRITONBACKEND_StateBuffer as *const (),
    state::TRITONBACKEND_StateBufferAttributes as *const (),
    state::TRITONBACKEND_StateUpdate as *const (),
]);

/// Keeps every exported `TRITONBACKEND_*` function, and the shared
/// `TRITONSERVER_*` ones of `triton_abi`, in the executable; `main` and the
/// server's start call it (with `frontend::inprocess::keep_exported`).
/// Returns the number of functions, which makes the table's use
/// observable to the optimizer.
pub fn keep_exported() -> usize {
    std::hint::black_box(&EXPORTED).0.len() + crate::triton_abi::keep_exported()
}
