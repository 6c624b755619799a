//! The `inference.ModelConfig` descriptor and conversions between the prost
//! struct and prost-reflect's `DynamicMessage`.

use std::sync::OnceLock;

use anyhow::{anyhow, Context};
use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor};

use crate::proto::{inference::ModelConfig, DESCRIPTOR_SET};

const MODEL_CONFIG: &str = "inference.ModelConfig";

/// The descriptor pool, decoded once. A failure here means the binary was
/// built with a broken descriptor set, so it is kept as a message and
/// reported by every call rather than panicking.
fn pool() -> anyhow::Result<&'static DescriptorPool> {
    static POOL: OnceLock<Result<DescriptorPool, String>> = OnceLock::new();
    POOL.get_or_init(|| {
        DescriptorPool::decode(DESCRIPTOR_SET)
            .map_err(|e| format!("the built-in protobuf descriptor set is invalid: {e}"))
    })
    .as_ref()
    .map_err(|e| anyhow!("{e}"))
}

pub(super) fn model_config() -> anyhow::Result<MessageDescriptor> {
    pool()?
        .get_message_by_name(MODEL_CONFIG)
        .ok_or_else(|| anyhow!("the built-in descriptor set has no {MODEL_CONFIG}"))
}

/// Any message of the descriptor pool, by full name (for error hints).
pub(super) fn message(full_name: &str) -> Option<MessageDescriptor> {
    pool().ok()?.get_message_by_name(full_name)
}

/// Any enum of the descriptor pool, by full name (for error hints).
pub(super) fn enum_names(full_name: &str) -> Option<Vec<String>> {
    let e = pool().ok()?.get_enum_by_name(full_name)?;
    Some(e.values().map(|v| v.name().to_string()).collect())
}

pub(super) fn to_dynamic(config: &ModelConfig) -> anyhow::Result<DynamicMessage> {
    let mut message = DynamicMessage::new(model_config()?);
    message
        .transcode_from(config)
        .context("cannot convert the model configuration to its reflective form")?;
    Ok(message)
}

pub(super) fn from_dynamic(message: &DynamicMessage) -> anyhow::Result<ModelConfig> {
    message
        .transcode_to::<ModelConfig>()
        .context("cannot convert the parsed model configuration")
}
