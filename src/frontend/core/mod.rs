//! What the front ends share above their wire codecs, written once: the
//! infer path (`infer`), which HTTP, gRPC and the in-process C API call
//! between their wire decode and their wire encode, and the typed values
//! they answer with (server and model metadata, the repository index);
//! HTTP and the in-process API render those as JSON, gRPC converts them
//! to protobuf. The model configuration and the statistics are typed once
//! elsewhere (`ModelVersion::config` and its JSON text,
//! `metrics::statistics`), so they need no value here.

pub mod index;
pub mod infer;
pub mod metadata;
