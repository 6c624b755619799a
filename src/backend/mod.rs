//! Backends turn a model's files and configuration into instances that
//! execute tensors. Architecture invariant: backends never see a socket,
//! a protocol type or a shard; they get validated tensors and return tensors.

pub mod builtin;
pub mod capi;
pub mod onnxruntime;
mod request;
mod response_sender;

pub use request::{BackendRequest, SequenceInfo, StateUpdates};
pub use response_sender::{ReceiverGone, ResponseSender, ResponseSink};

use std::{path::PathBuf, sync::Arc};

use crate::{
    proto::inference::ModelConfig,
    types::{InferResult, Tensor},
};

/// Where one version of a model lives on disk.
#[derive(Debug, Clone)]
pub struct ModelFiles {
    /// `<repository>/<model>`
    pub model_dir: PathBuf,
    /// `<repository>/<model>/<version>`
    pub version_dir: PathBuf,
    pub version: i64,
}

impl ModelFiles {
    /// The model file of this version: `default_model_filename` or the
    /// backend's default name (`model.onnx` for ONNX Runtime).
    pub fn model_file(&self, config: &ModelConfig, default_name: &str) -> PathBuf {
        let name = if config.default_model_filename.is_empty() {
            default_name
        } else {
            &config.default_model_filename
        };
        self.version_dir.join(name)
    }
}

/// Identity of one model instance (Triton names them `<model>_<index>`).
#[derive(Debug, Clone)]
pub struct InstanceSpec {
    pub name: String,
    /// Index among all instances of this model version.
    pub index: usize,
    /// Intra-op threads to use where the backend has a thread pool.
    pub intra_op_threads: usize,
    /// Where the instance computes (its instance group's kind and GPU).
    pub device: InstanceDevice,
}

/// The device an instance runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InstanceDevice {
    #[default]
    Cpu,
    /// A CUDA ordinal (the id in `instance_group { gpus: [...] }`).
    Gpu(i32),
}

/// A backend: creates instances of the models that name it.
pub trait Backend: Send + Sync {
    /// The name used in `backend:` (or implied by `platform:`).
    fn name(&self) -> &'static str;

    /// Whether its instances are cheap enough to execute on the owner
    /// shard's own thread (microseconds, no blocking): a thread hop would
    /// cost more than the work. Everything else runs on a compute worker,
    /// so it never blocks a shard's network I/O. A model can override this
    /// with the config parameter `shardserve_execution` ("inline" or
    /// "worker").
    fn runs_inline(&self, _config: &ModelConfig) -> bool {
        false
    }

    /// Whether its instances must run on compute workers whatever the
    /// config says (foreign code that may block: the C API's backends).
    fn needs_worker(&self) -> bool {
        false
    }

    /// Whether its instances can run on a GPU (`KIND_GPU`; `KIND_AUTO`
    /// picks the GPU where one is present only for such backends).
    fn supports_gpu(&self) -> bool {
        false
    }

    /// Fills in what the configuration leaves out (`max_batch_size`,
    /// `input`, `output`) from the model itself, as Triton's auto-complete
    /// does. Called only when `--strict-model-config` is off. Must leave
    /// fields the user did set untouched.
    fn auto_complete(&self, config: &mut ModelConfig, files: &ModelFiles) -> anyhow::Result<()>;

    /// Creates one instance. Runs on the control plane, never on a shard's
    /// request path; the instance is then moved to where it executes: its
    /// own compute worker thread, or (`runs_inline`) the shard that owns
    /// its model's scheduler.
    fn create_instance(
        &self,
        config: &ModelConfig,
        files: &ModelFiles,
        spec: &InstanceSpec,
    ) -> anyhow::Result<Box<dyn ModelInstance>>;
}

/// One executable copy of a model, run by exactly one thread: a compute
/// worker of its own, or for an inline model the shard that owns its
/// scheduler.
pub trait ModelInstance: Send {
    /// Executes once. `inputs` passed validation against the configuration
    /// (datatypes, shapes including the batch dimension when
    /// `max_batch_size > 0`, data sizes). `outputs` names the outputs to
    /// produce; producing others too is allowed (the caller filters).
    fn execute(&mut self, inputs: &[Tensor], outputs: &[&str]) -> InferResult<Vec<Tensor>>;

    /// Executes one request of a decoupled model
    /// (`model_transaction_policy { decoupled: true }`): any number of
    /// responses through `sender`, then its final flag, now or later from
    /// another thread. The next request is handed over once this returns,
    /// whatever `sender` still has to send. Only decoupled models are
    /// called this way, always on a compute worker. The default answers
    /// with `execute`'s one response, so an ordinary backend also serves
    /// a decoupled configuration.
    fn execute_decoupled(
        &mut self,
        inputs: &[Tensor],
        outputs: &[&str],
        mut sender: ResponseSender,
    ) {
        match self.execute(inputs, outputs) {
            Ok(produced) => {
                // A client that went away needs no final flag either.
                if sender.send(produced).is_ok() {
                    sender.finish();
                }
            }
            Err(e) => sender.fail(e),
        }
    }

    /// Whether this instance takes a batch's requests one by one
    /// ([`execute_requests`](Self::execute_requests)) instead of merged
    /// tensors: true for the C API's backends, which batch themselves.
    fn takes_requests(&self) -> bool {
        false
    }

    /// Executes a batch as separate requests, each answered through its
    /// own sender (now or later, from any thread), for ordinary and
    /// decoupled models alike. Called only when `takes_requests`, always
    /// on a compute worker.
    fn execute_requests(&mut self, requests: Vec<BackendRequest>) {
        for r in requests {
            r.sender.fail(crate::types::InferError::internal(
                "this instance does not take requests one by one",
            ));
        }
    }

    /// Gives the instance its model version's statistics and the counter
    /// block it may write, once they exist (after the instance is made):
    /// for backends that report their own executions (the C API's
    /// `TRITONBACKEND_ModelInstanceReport[Batch]Statistics`).
    fn attach_statistics(&mut self, _stats: Arc<crate::metrics::ModelStats>, _block: usize) {}

    /// Whether the backend has reported its executions itself: the
    /// scheduler then leaves execution, inference and compute counts to
    /// those reports, so nothing is counted twice.
    fn reports_statistics(&self) -> bool {
        false
    }
}

/// Picks the backend a configuration names, by `backend` or else `platform`.
pub fn backend_for(config: &ModelConfig) -> anyhow::Result<Arc<dyn Backend>> {
    let key = if !config.backend.is_empty() {
        config.backend.as_str()
    } else {
        config.platform.as_str()
    };
    match key {
        "onnxruntime" | "onnxruntime_onnx" => Ok(Arc::new(onnxruntime::OnnxRuntimeBackend)),
        "" => anyhow::bail!(
            "model '{}' names no backend or platform, and none could be inferred from its files",
            config.name
        ),
        other => match builtin::backend(other) {
            // Built-ins execute merged tensors but were written for fixed
            // request layouts; Triton's own backends of these names take
            // requests one by one, so a flattened ragged batch would differ.
            Some(_) if uses_batch_io(config) => anyhow::bail!(
                "model '{}': allow_ragged_batch, batch_input and batch_output are served for the \
                 onnxruntime backend and C API backends, not for the built-in backend '{other}'",
                config.name
            ),
            Some(b) => Ok(b),
            // Any other name is a shared-library backend (Triton's C API).
            None => Ok(Arc::new(capi::CapiBackend::new(config)?)),
        },
    }
}

/// Whether a configuration asks for ragged batching or batch inputs/outputs.
fn uses_batch_io(config: &ModelConfig) -> bool {
    !config.batch_input.is_empty()
        || !config.batch_output.is_empty()
        || config.input.iter().any(|i| i.allow_ragged_batch)
}
