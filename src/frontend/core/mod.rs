//! What the front ends share above their wire codecs: the typed values
//! they answer with (server and model metadata, the repository index),
//! built once here; HTTP and the in-process API render them as JSON,
//! gRPC converts them to protobuf. The model configuration and the
//! statistics are typed once elsewhere (`ModelVersion::config` and its
//! JSON text, `metrics::statistics`), so they need no value here.

pub mod index;
pub mod metadata;
