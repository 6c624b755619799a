//! `identity`: returns every input unchanged as the output at the same
//! position in the configuration (INPUTn -> OUTPUTn). Any datatype and
//! shape; used by `simple_identity` and for measuring server overhead.
//! Like Triton's QA identity backend, the config parameter
//! `execute_delay_ms` makes every execution take that long (a stand-in for
//! a heavy model in tests of scheduling, cancellation and shutdown); such
//! a model runs on a compute worker, never inline.

use std::time::Duration;

use crate::{
    backend::{Backend, InstanceSpec, ModelFiles, ModelInstance},
    proto::inference::ModelConfig,
    types::{InferError, InferResult, Tensor},
};

pub struct IdentityBackend;

/// The `execute_delay_ms` parameter of a config (0 when absent). The
/// sequence models honour it too.
pub(super) fn execute_delay(config: &ModelConfig) -> anyhow::Result<Duration> {
    let Some(p) = config.parameters.get("execute_delay_ms") else {
        return Ok(Duration::ZERO);
    };
    let ms: u64 = p.string_value.trim().parse().map_err(|_| {
        anyhow::anyhow!(
            "parameter execute_delay_ms must be a whole number of milliseconds, not {:?}",
            p.string_value
        )
    })?;
    if ms > 600_000 {
        anyhow::bail!("parameter execute_delay_ms is above the 600000 ms limit");
    }
    Ok(Duration::from_millis(ms))
}

impl Backend for IdentityBackend {
    fn runs_inline(&self, config: &ModelConfig) -> bool {
        execute_delay(config).is_ok_and(|d| d.is_zero())
    }

    fn name(&self) -> &'static str {
        "identity"
    }

    fn auto_complete(&self, _: &mut ModelConfig, _: &ModelFiles) -> anyhow::Result<()> {
        // The identity has no I/O of its own: the configuration must list it.
        Ok(())
    }

    fn create_instance(
        &self,
        config: &ModelConfig,
        _: &ModelFiles,
        _: &InstanceSpec,
    ) -> anyhow::Result<Box<dyn ModelInstance>> {
        if config.input.len() != config.output.len() {
            anyhow::bail!(
                "identity model '{}' needs as many outputs as inputs ({} inputs, {} outputs)",
                config.name,
                config.input.len(),
                config.output.len()
            );
        }
        for (i, o) in config.input.iter().zip(&config.output) {
            if i.data_type != o.data_type {
                anyhow::bail!(
                    "identity model '{}': input '{}' and output '{}' have different datatypes",
                    config.name,
                    i.name,
                    o.name
                );
            }
        }
        Ok(Box::new(IdentityInstance {
            delay: execute_delay(config)?,
            model: config.name.clone(),
            pairs: config
                .input
                .iter()
                .zip(&config.output)
                .map(|(i, o)| (i.name.clone(), o.name.clone()))
                .collect(),
        }))
    }
}

struct IdentityInstance {
    delay: Duration,
    model: String,
    pairs: Vec<(String, String)>,
}

impl ModelInstance for IdentityInstance {
    fn execute(&mut self, inputs: &[Tensor], outputs: &[&str]) -> InferResult<Vec<Tensor>> {
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        let mut result = Vec::with_capacity(outputs.len());
        for (input_name, output_name) in &self.pairs {
            if !outputs.is_empty() && !outputs.contains(&output_name.as_str()) {
                continue;
            }
            // Optional inputs may be absent; their outputs are then absent too.
            let Some(t) = inputs.iter().find(|t| &t.name == input_name) else {
                continue;
            };
            result.push(Tensor::new(
                output_name.clone(),
                t.datatype,
                t.shape.clone(),
                t.data.clone(),
            ));
        }
        if result.is_empty() && !self.pairs.is_empty() {
            return Err(InferError::invalid(format!(
                "identity model '{}' produced no output for the inputs given",
                self.model
            )));
        }
        Ok(result)
    }
}
