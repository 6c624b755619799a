//! Model configuration (`config.pbtxt`): parsing, printing, validation.
//! WORK IN PROGRESS (being written): API surface only.

use crate::proto::inference::ModelConfig;

pub fn parse_model_config(_text: &str) -> anyhow::Result<ModelConfig> {
    anyhow::bail!("config parsing is being written")
}

pub fn model_config_to_json(_config: &ModelConfig) -> serde_json::Value {
    serde_json::Value::Null
}

pub fn validate(_config: &ModelConfig) -> anyhow::Result<()> {
    Ok(())
}

pub fn check_supported(_config: &ModelConfig) -> anyhow::Result<()> {
    Ok(())
}
