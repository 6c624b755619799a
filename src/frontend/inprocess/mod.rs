//! The server side of Triton's C API that backends call to use the server
//! itself: the in-process inference API (`TRITONSERVER_InferenceRequest*`,
//! `TRITONSERVER_InferenceResponse*`, `TRITONSERVER_ResponseAllocator*`,
//! `TRITONSERVER_ServerInferAsync`), which business-logic scripting (the
//! Python backend's BLS) runs on, the `TRITONSERVER_Server*` queries, custom
//! metrics and the (unsupported) trace functions.
//!
//! Requests enter the scheduler exactly where a network request does (see
//! `infer`); a `TRITONSERVER_Server` is created per running server and
//! handed to backends by `TRITONBACKEND_ModelServer`.

// Every exported function takes C pointers under the contract Triton's
// `tritonserver.h` states for it (valid, not freed, used as documented);
// repeating that on each one would say nothing more.
#![allow(non_camel_case_types, clippy::missing_safety_doc)]
// Every unsafe operation sits in its own block that says why it is sound.
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

pub mod allocator;
pub mod infer;
pub mod metrics;
pub mod request;
pub mod response;
pub mod server;
pub mod trace;

pub use server::TRITONSERVER_Server;

/// Every function exported here, referenced so the linker keeps them (see
/// `capi::keep_exported`).
#[used]
static EXPORTED: crate::triton_abi::ffi::Exported = crate::triton_abi::ffi::Exported(&[
    allocator::TRITONSERVER_ResponseAllocatorNew as *const (),
    allocator::TRITONSERVER_ResponseAllocatorSetQueryFunction as *const (),
    allocator::TRITONSERVER_ResponseAllocatorSetBufferAttributesFunction as *const (),
    allocator::TRITONSERVER_ResponseAllocatorDelete as *const (),
    request::TRITONSERVER_InferenceRequestNew as *const (),
    request::TRITONSERVER_InferenceRequestDelete as *const (),
    request::TRITONSERVER_InferenceRequestId as *const (),
    request::TRITONSERVER_InferenceRequestSetId as *const (),
    request::TRITONSERVER_InferenceRequestFlags as *const (),
    request::TRITONSERVER_InferenceRequestSetFlags as *const (),
    request::TRITONSERVER_InferenceRequestCorrelationId as *const (),
    request::TRITONSERVER_InferenceRequestCorrelationIdString as *const (),
    request::TRITONSERVER_InferenceRequestSetCorrelationId as *const (),
    request::TRITONSERVER_InferenceRequestSetCorrelationIdString as *const (),
    request::TRITONSERVER_InferenceRequestCancel as *const (),
    request::TRITONSERVER_InferenceRequestIsCancelled as *const (),
    request::TRITONSERVER_InferenceRequestPriority as *const (),
    request::TRITONSERVER_InferenceRequestPriorityUInt64 as *const (),
    request::TRITONSERVER_InferenceRequestSetPriority as *const (),
    request::TRITONSERVER_InferenceRequestSetPriorityUInt64 as *const (),
    request::TRITONSERVER_InferenceRequestTimeoutMicroseconds as *const (),
    request::TRITONSERVER_InferenceRequestSetTimeoutMicroseconds as *const (),
    request::TRITONSERVER_InferenceRequestAddInput as *const (),
    request::TRITONSERVER_InferenceRequestAddRawInput as *const (),
    request::TRITONSERVER_InferenceRequestRemoveInput as *const (),
    request::TRITONSERVER_InferenceRequestRemoveAllInputs as *const (),
    request::TRITONSERVER_InferenceRequestAppendInputData as *const (),
    request::TRITONSERVER_InferenceRequestAppendInputDataWithHostPolicy as *const (),
    request::TRITONSERVER_InferenceRequestRemoveAllInputData as *const (),
    request::TRITONSERVER_InferenceRequestAddRequestedOutput as *const (),
    request::TRITONSERVER_InferenceRequestRemoveRequestedOutput as *const (),
    request::TRITONSERVER_InferenceRequestRemoveAllRequestedOutputs as *const (),
    request::TRITONSERVER_InferenceRequestSetReleaseCallback as *const (),
    request::TRITONSERVER_InferenceRequestSetResponseCallback as *const (),
    request::TRITONSERVER_InferenceRequestSetStringParameter as *const (),
    request::TRITONSERVER_InferenceRequestSetIntParameter as *const (),
    request::TRITONSERVER_InferenceRequestSetBoolParameter as *const (),
    request::TRITONSERVER_InferenceRequestSetDoubleParameter as *const (),
    response::TRITONSERVER_InferenceResponseDelete as *const (),
    response::TRITONSERVER_InferenceResponseError as *const (),
    response::TRITONSERVER_InferenceResponseModel as *const (),
    response::TRITONSERVER_InferenceResponseId as *const (),
    response::TRITONSERVER_InferenceResponseParameterCount as *const (),
    response::TRITONSERVER_InferenceResponseParameter as *const (),
    response::TRITONSERVER_InferenceResponseOutputCount as *const (),
    response::TRITONSERVER_InferenceResponseOutput as *const (),
    response::TRITONSERVER_InferenceResponseOutputClassificationLabel as *const (),
    server::TRITONSERVER_ServerIsLive as *const (),
    server::TRITONSERVER_ServerIsReady as *const (),
    server::TRITONSERVER_ServerModelIsReady as *const (),
    server::TRITONSERVER_ServerModelBatchProperties as *const (),
    server::TRITONSERVER_ServerModelTransactionProperties as *const (),
    server::TRITONSERVER_ServerMetadata as *const (),
    server::TRITONSERVER_ServerModelMetadata as *const (),
    server::TRITONSERVER_ServerModelConfig as *const (),
    server::TRITONSERVER_ServerModelIndex as *const (),
    server::TRITONSERVER_ServerLoadModel as *const (),
    server::TRITONSERVER_ServerLoadModelWithParameters as *const (),
    server::TRITONSERVER_ServerUnloadModel as *const (),
    server::TRITONSERVER_ServerUnloadModelAndDependents as *const (),
    infer::TRITONSERVER_ServerInferAsync as *const (),
    metrics::TRITONSERVER_MetricFamilyNew as *const (),
    metrics::TRITONSERVER_MetricFamilyDelete as *const (),
    metrics::TRITONSERVER_GetMetricFamilyKind as *const (),
    metrics::TRITONSERVER_MetricArgsNew as *const (),
    metrics::TRITONSERVER_MetricArgsSetHistogram as *const (),
    metrics::TRITONSERVER_MetricArgsDelete as *const (),
    metrics::TRITONSERVER_MetricNew as *const (),
    metrics::TRITONSERVER_MetricNewWithArgs as *const (),
    metrics::TRITONSERVER_MetricDelete as *const (),
    metrics::TRITONSERVER_MetricValue as *const (),
    metrics::TRITONSERVER_MetricIncrement as *const (),
    metrics::TRITONSERVER_MetricSet as *const (),
    metrics::TRITONSERVER_MetricObserve as *const (),
    metrics::TRITONSERVER_GetMetricKind as *const (),
    trace::TRITONSERVER_InferenceTraceContext as *const (),
    trace::TRITONSERVER_InferenceTraceSpawnChildTrace as *const (),
]);

/// Referenced from `capi::keep_exported`.
pub fn keep_exported() -> usize {
    std::hint::black_box(&EXPORTED).0.len()
}
