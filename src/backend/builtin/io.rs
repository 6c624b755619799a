//! Shared helpers for built-in backends: auto-completing the fixed I/O of
//! the `simple*` contracts and finding tensors by name.

use crate::{
    proto::inference::{ModelConfig, ModelInput, ModelOutput},
    types::{DataType, InferError, InferResult, Tensor},
};

/// Default `max_batch_size` of the `simple*` contracts.
pub const SIMPLE_MAX_BATCH: i32 = 8;

/// Completes a `simple`-shaped config: two inputs and two outputs of
/// `dtype` with dims [16]. Fields the user set stay as they are.
pub fn complete_two_by_two(config: &mut ModelConfig, dtype: DataType) {
    if config.input.is_empty() && config.output.is_empty() && config.max_batch_size == 0 {
        config.max_batch_size = SIMPLE_MAX_BATCH;
    }
    if config.input.is_empty() {
        config.input = ["INPUT0", "INPUT1"]
            .iter()
            .map(|n| ModelInput {
                name: (*n).to_string(),
                data_type: dtype.to_config() as i32,
                dims: vec![16],
                ..Default::default()
            })
            .collect();
    }
    if config.output.is_empty() {
        config.output = ["OUTPUT0", "OUTPUT1"]
            .iter()
            .map(|n| ModelOutput {
                name: (*n).to_string(),
                data_type: dtype.to_config() as i32,
                dims: vec![16],
                ..Default::default()
            })
            .collect();
    }
}

/// The input called `name`, or an error naming the model.
pub fn input<'a>(inputs: &'a [Tensor], name: &str, model: &str) -> InferResult<&'a Tensor> {
    inputs
        .iter()
        .find(|t| t.name == name)
        .ok_or_else(|| InferError::invalid(format!("model '{model}' expects input '{name}'")))
}

/// A decoupled built-in model's load check: its config must say so.
pub fn require_decoupled(config: &ModelConfig, backend: &str) -> anyhow::Result<()> {
    if !crate::config::is_decoupled(config) {
        anyhow::bail!(
            "model '{}': the {backend} backend needs model_transaction_policy {{ decoupled: true }}",
            config.name
        );
    }
    Ok(())
}

/// A decoupled built-in model's answer to a unary execution.
pub fn stream_only(model: &str) -> InferError {
    InferError::unsupported(format!(
        "model '{model}' is decoupled: it answers only through a stream"
    ))
}

/// Checks that a built-in model's configured I/O uses the datatype its code computes in.
pub fn require_dtype(config: &ModelConfig, dtype: DataType) -> anyhow::Result<()> {
    let bad = config
        .input
        .iter()
        .map(|i| (&i.name, i.data_type))
        .chain(config.output.iter().map(|o| (&o.name, o.data_type)))
        .find(|(_, dt)| DataType::from_config_i32(*dt) != Some(dtype));
    if let Some((name, _)) = bad {
        anyhow::bail!(
            "backend '{}' computes in {dtype}, but model '{}' declares '{name}' with another datatype",
            config.backend,
            config.name
        );
    }
    Ok(())
}
