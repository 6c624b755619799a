//! Inputs and outputs of a model version in the form validation and
//! execution use, derived once from the configuration at load time.

use std::path::Path;

use crate::{proto::inference::ModelConfig, types::DataType};

#[derive(Debug, Clone)]
pub struct InputSpec {
    pub name: String,
    pub datatype: DataType,
    /// Per-item dims as configured (`-1` = any).
    pub dims: Vec<i64>,
    /// What the backend sees instead of `dims`, if the config reshapes.
    pub reshape: Option<Vec<i64>>,
    pub optional: bool,
}

#[derive(Debug, Clone)]
pub struct OutputSpec {
    pub name: String,
    pub datatype: DataType,
    pub dims: Vec<i64>,
    pub reshape: Option<Vec<i64>>,
    /// Class labels from `label_filename`, one per line.
    pub labels: Option<Vec<String>>,
}

#[derive(Debug, Clone)]
pub struct IoSpec {
    pub max_batch_size: i64,
    pub inputs: Vec<InputSpec>,
    pub outputs: Vec<OutputSpec>,
}

impl IoSpec {
    /// Derives the spec from a validated configuration; `model_dir` is
    /// where `label_filename`s are resolved.
    pub fn from_config(config: &ModelConfig, model_dir: &Path) -> anyhow::Result<Self> {
        let dtype = |dt: i32, name: &str| {
            DataType::from_config_i32(dt).ok_or_else(|| {
                anyhow::anyhow!("model '{}': '{name}' has an invalid data_type", config.name)
            })
        };
        let inputs = config
            .input
            .iter()
            .map(|i| {
                Ok(InputSpec {
                    name: i.name.clone(),
                    datatype: dtype(i.data_type, &i.name)?,
                    dims: i.dims.clone(),
                    reshape: i.reshape.as_ref().map(|r| r.shape.clone()),
                    optional: i.optional,
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let outputs = config
            .output
            .iter()
            .map(|o| {
                let labels = if o.label_filename.is_empty() {
                    None
                } else {
                    let rel = Path::new(&o.label_filename);
                    if rel.is_absolute() || rel.components().any(|c| c.as_os_str() == "..") {
                        anyhow::bail!(
                            "model '{}': label_filename '{}' must stay inside the model folder",
                            config.name,
                            o.label_filename
                        );
                    }
                    let path = model_dir.join(rel);
                    let text = std::fs::read_to_string(&path).map_err(|e| {
                        anyhow::anyhow!(
                            "model '{}': cannot read labels {}: {e}",
                            config.name,
                            path.display()
                        )
                    })?;
                    Some(text.lines().map(str::to_string).collect())
                };
                Ok(OutputSpec {
                    name: o.name.clone(),
                    datatype: dtype(o.data_type, &o.name)?,
                    dims: o.dims.clone(),
                    reshape: o.reshape.as_ref().map(|r| r.shape.clone()),
                    labels,
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Self {
            max_batch_size: i64::from(config.max_batch_size),
            inputs,
            outputs,
        })
    }

    pub fn input(&self, name: &str) -> Option<&InputSpec> {
        self.inputs.iter().find(|i| i.name == name)
    }

    pub fn output(&self, name: &str) -> Option<&OutputSpec> {
        self.outputs.iter().find(|o| o.name == name)
    }

    pub fn batching(&self) -> bool {
        self.max_batch_size > 0
    }

    /// The shape clients see for a tensor: `-1` batch dim in front when batching.
    pub fn client_shape(&self, dims: &[i64]) -> Vec<i64> {
        let mut shape = Vec::with_capacity(dims.len() + 1);
        if self.batching() {
            shape.push(-1);
        }
        shape.extend_from_slice(dims);
        shape
    }
}
