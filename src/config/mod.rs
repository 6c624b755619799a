//! Model configuration (`config.pbtxt`): parsing, printing, validation.
//!
//! The configuration is Triton's `inference.ModelConfig` message. It is read
//! from protobuf text format ([`parse_model_config`]), printed as the JSON
//! Triton serves on `GET /v2/models/{m}/config` ([`model_config_to_json`]),
//! checked for structural mistakes after auto-complete ([`validate`]), and
//! checked against the features this server implements ([`check_supported`]).
//!
//! Everything goes through the message descriptor compiled into the binary
//! (`crate::proto::DESCRIPTOR_SET`), so field names, enum names and the JSON
//! mapping always match `proto/model_config.proto`.

mod backend_fields;
mod defaults;
mod descriptor;
mod instance_kind;
mod json;
pub mod sequence_controls;
mod supported;
mod text_format;
mod validate;

pub use backend_fields::{backend_of_platform, complete_backend_fields};
pub use defaults::fill_defaults;
pub use instance_kind::resolve_instance_kinds;
pub use json::{model_config_from_json, model_config_to_json};
pub use sequence_controls::SequenceControls;
pub use supported::{check_supported, unsupported_features, Unsupported};
pub use text_format::{model_config_to_text, parse_model_config, ConfigSyntaxError};
pub use validate::validate;

use crate::proto::inference::ModelConfig;

/// Whether the model is decoupled (`model_transaction_policy { decoupled:
/// true }`): it answers each request with any number of responses, then a
/// final flag.
pub fn is_decoupled(config: &ModelConfig) -> bool {
    config
        .model_transaction_policy
        .as_ref()
        .is_some_and(|p| p.decoupled)
}

/// A small valid configuration with `extra` appended, for the tests of
/// validation and of the refused-features list.
#[cfg(test)]
pub(crate) mod test_support {
    use crate::proto::inference::ModelConfig;

    const BASE: &str = r#"
        name: "m"
        max_batch_size: 8
        input [ { name: "IN" data_type: TYPE_FP32 dims: [ 16 ] } ]
        output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 16 ] } ]
    "#;

    pub fn config(extra: &str) -> ModelConfig {
        super::parse_model_config(&format!("{BASE}\n{extra}")).unwrap()
    }
}
