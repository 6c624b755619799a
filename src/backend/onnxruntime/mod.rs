//! ONNX Runtime backend (platform `onnxruntime_onnx`). PLACEHOLDER: being
//! written; until then every load fails with this message.

use super::{Backend, InstanceSpec, ModelFiles, ModelInstance};
use crate::proto::inference::ModelConfig;

pub struct OnnxRuntimeBackend;

impl Backend for OnnxRuntimeBackend {
    fn name(&self) -> &'static str {
        "onnxruntime"
    }
    fn auto_complete(&self, _: &mut ModelConfig, _: &ModelFiles) -> anyhow::Result<()> {
        anyhow::bail!("the onnxruntime backend is not built yet")
    }
    fn create_instance(
        &self,
        _: &ModelConfig,
        _: &ModelFiles,
        _: &InstanceSpec,
    ) -> anyhow::Result<Box<dyn ModelInstance>> {
        anyhow::bail!("the onnxruntime backend is not built yet")
    }
}
