//! `identity`: returns every input unchanged as the output at the same
//! position in the configuration (INPUTn -> OUTPUTn). Any datatype and
//! shape; used by `simple_identity` and for measuring server overhead.

use crate::{
    backend::{Backend, InstanceSpec, ModelFiles, ModelInstance},
    proto::inference::ModelConfig,
    types::{InferError, InferResult, Tensor},
};

pub struct IdentityBackend;

impl Backend for IdentityBackend {
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
    model: String,
    pairs: Vec<(String, String)>,
}

impl ModelInstance for IdentityInstance {
    fn execute(&mut self, inputs: &[Tensor], outputs: &[&str]) -> InferResult<Vec<Tensor>> {
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
