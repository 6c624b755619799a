//! The runtime view of loaded models: an immutable [`ModelTable`] snapshot
//! that the control plane publishes to every shard, and the per-version
//! [`ModelVersion`] with everything the request path needs precomputed.

mod io_spec;
pub mod metadata;
mod table;
mod validate;
pub(crate) use validate::client_output_shape;

pub use io_spec::{InputSpec, IoSpec, OutputSpec};
pub use metadata::ModelMetadata;
pub use table::{
    ambiguous_model, ExecutionPlace, InstanceInfo, ModelEntry, ModelState, ModelTable,
    ModelVersion, VersionEntry, UNLOADED,
};
pub use validate::validate_request;
