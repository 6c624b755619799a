//! ONNX Runtime backend (platform `onnxruntime_onnx`, backend
//! `onnxruntime`), through `ort` with the library loaded at run time
//! (see [`runtime`]).
//!
//! One ORT session per instance: `Session::run` takes `&mut self`, and an
//! instance runs on one thread only, its own compute worker (a shard's
//! thread only where the config asks for `shardserve_execution: "inline"`),
//! so no lock is ever taken.
//!
//! Configuration, following Triton's onnxruntime backend:
//! * `parameters { key: "intra_op_thread_count" value: { string_value: "N" } }`
//!   (0 = ORT's default, one per core); without it, the server's
//!   per-instance thread count (1 by default: thread-per-core).
//! * `inter_op_thread_count`, and `execution_mode` ("0" sequential, the
//!   default; "1" parallel).
//! * `optimization { graph { level } }`: -1 basic, 1 extended, anything
//!   else (0, the default) all optimizations.
//!
//! Auto-complete (Triton's rule, simplified): when the configuration lists
//! no inputs, no outputs and no `max_batch_size`, and every model input and
//! output has a dynamic leading dimension, `max_batch_size` becomes 4
//! (Triton's `default-max-batch-size`) and, as in Triton, a default
//! `dynamic_batching {}` is added unless a scheduler is configured. A
//! configuration that lists I/O but no `max_batch_size` is taken literally:
//! its dims are full shapes and the model is not batched.
//!
//! Stateful models (`sequence_batching`): the control inputs and implicit
//! state inputs/outputs are graph tensors the configuration does not list
//! (see [`sequence`]); auto-complete leaves them out, the load-time check
//! requires them in the graph with the batcher's datatypes, and `execute`
//! feeds every tensor it is given by name and returns the state outputs the
//! batcher asks for like any other output.

mod convert;
pub mod runtime;
mod sequence;
mod staging;

use std::{borrow::Cow, path::PathBuf};

use anyhow::{bail, Context};
use ort::{
    session::{builder::GraphOptimizationLevel, Session, SessionInputValue},
    value::{Outlet, ValueType},
};

use self::sequence::{Role, SequenceTensors};
use super::{Backend, InstanceDevice, InstanceSpec, ModelFiles, ModelInstance};
use crate::{
    gpu::pinned::{self, StagingPool},
    proto::inference::{
        model_config::SchedulingChoice, ModelConfig, ModelDynamicBatching, ModelInput, ModelOutput,
    },
    types::{DataType, InferError, InferResult, Tensor},
};

/// ONNX Runtime's default model file name in a version folder.
pub const DEFAULT_MODEL_FILENAME: &str = "model.onnx";

/// Triton's `--backend-config=onnxruntime,default-max-batch-size` default.
pub const DEFAULT_MAX_BATCH_SIZE: i32 = 4;

pub struct OnnxRuntimeBackend;

impl Backend for OnnxRuntimeBackend {
    fn name(&self) -> &'static str {
        "onnxruntime"
    }

    /// Through ONNX Runtime's CUDA execution provider, which only the GPU
    /// build of the library has (checked when the instance is created).
    fn supports_gpu(&self) -> bool {
        true
    }

    fn auto_complete(&self, config: &mut ModelConfig, files: &ModelFiles) -> anyhow::Result<()> {
        // Metadata only: skip graph optimization, which can be the slowest
        // part of loading a big model.
        let settings = SessionSettings {
            intra_threads: 1,
            inter_threads: None,
            parallel: false,
            level: GraphOptimizationLevel::Disable,
            device: InstanceDevice::Cpu,
        };
        let session = open_session(config, files, &settings)?;
        let model =
            ModelIo::from_session(&session).with_context(|| model_context(config, files))?;
        complete(config, &model)?;
        check(config, &model)
    }

    fn create_instance(
        &self,
        config: &ModelConfig,
        files: &ModelFiles,
        spec: &InstanceSpec,
    ) -> anyhow::Result<Box<dyn ModelInstance>> {
        Ok(Box::new(OnnxInstance::create(config, files, spec)?))
    }
}

impl OnnxInstance {
    fn create(
        config: &ModelConfig,
        files: &ModelFiles,
        spec: &InstanceSpec,
    ) -> anyhow::Result<Self> {
        let settings = SessionSettings::from_config(config, spec)?;
        let session = open_session(config, files, &settings)?;
        // Strict mode skips auto-complete, so the configuration is checked
        // against the model here too; a mismatch would otherwise surface as
        // an ORT error on every request.
        let model =
            ModelIo::from_session(&session).with_context(|| model_context(config, files))?;
        check(config, &model)?;
        let sequence = SequenceTensors::from_config(config)?;
        let graph_inputs = model
            .inputs
            .iter()
            .map(|io| GraphInput {
                name: io.name.clone(),
                role: sequence.feeds(&io.name).map(|t| t.role),
            })
            .collect();
        tracing::debug!(
            instance = %spec.name,
            device = ?settings.device,
            intra_threads = settings.intra_threads,
            "ONNX Runtime session created"
        );
        Ok(OnnxInstance {
            session,
            model: config.name.clone(),
            graph_inputs,
            staging: InputStaging::for_device(settings.device),
        })
    }
}

fn model_path(config: &ModelConfig, files: &ModelFiles) -> PathBuf {
    files.model_file(config, DEFAULT_MODEL_FILENAME)
}

fn model_context(config: &ModelConfig, files: &ModelFiles) -> String {
    format!("ONNX model {}", model_path(config, files).display())
}

/// How one session is built.
#[derive(Debug, Clone, PartialEq)]
struct SessionSettings {
    intra_threads: usize,
    inter_threads: Option<usize>,
    parallel: bool,
    level: GraphOptimizationLevel,
    device: InstanceDevice,
}

impl SessionSettings {
    fn from_config(config: &ModelConfig, spec: &InstanceSpec) -> anyhow::Result<Self> {
        let count = |key: &str| -> anyhow::Result<Option<usize>> {
            parameter(config, key)
                .map(|v| {
                    v.trim().parse::<usize>().with_context(|| {
                        format!(
                            "model '{}': parameter {key} must be a thread count, not '{v}'",
                            config.name
                        )
                    })
                })
                .transpose()
        };
        let parallel = match parameter(config, "execution_mode").map(str::trim) {
            None | Some("0") => false,
            Some("1") => true,
            Some(other) => bail!(
                "model '{}': parameter execution_mode must be 0 (sequential) or 1 (parallel), not '{other}'",
                config.name
            ),
        };
        let level = match config
            .optimization
            .as_ref()
            .and_then(|o| o.graph.as_ref())
            .map(|g| g.level)
        {
            Some(-1) => GraphOptimizationLevel::Level1,
            Some(1) => GraphOptimizationLevel::Level2,
            _ => GraphOptimizationLevel::All,
        };
        Ok(Self {
            intra_threads: count("intra_op_thread_count")?.unwrap_or(spec.intra_op_threads),
            inter_threads: count("inter_op_thread_count")?,
            parallel,
            level,
            device: spec.device,
        })
    }
}

fn parameter<'a>(config: &'a ModelConfig, key: &str) -> Option<&'a str> {
    config.parameters.get(key).map(|p| p.string_value.as_str())
}

fn open_session(
    config: &ModelConfig,
    files: &ModelFiles,
    settings: &SessionSettings,
) -> anyhow::Result<Session> {
    let env = runtime::environment()?;
    let path = model_path(config, files);
    if !path.is_file() {
        bail!("model file {} not found", path.display());
    }
    let ort_err = |e: ort::Error<ort::session::builder::SessionBuilder>| anyhow::anyhow!("{e}");
    let mut builder = Session::builder(env)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .with_optimization_level(settings.level)
        .map_err(ort_err)?
        .with_intra_threads(settings.intra_threads)
        .map_err(ort_err)?
        .with_parallel_execution(settings.parallel)
        .map_err(ort_err)?;
    if let Some(n) = settings.inter_threads {
        builder = builder.with_inter_threads(n).map_err(ort_err)?;
    }
    if let InstanceDevice::Gpu(id) = settings.device {
        register_cuda(&mut builder, id)?;
    }
    builder
        .commit_from_file(&path)
        .map_err(|e| anyhow::anyhow!("ONNX Runtime cannot load {}: {e}", path.display()))
}

/// Puts the session on GPU `id` through the CUDA execution provider, or
/// fails: a `KIND_GPU` instance never falls back to the CPU silently. Each
/// instance has its own session, and ONNX Runtime gives each session's
/// provider its own CUDA stream.
///
/// Not run on this project's CI machines (no GPU): there the GPU path
/// ends earlier, at `resolve_instance_kinds` ("no GPUs are available").
fn register_cuda(
    builder: &mut ort::session::builder::SessionBuilder,
    id: i32,
) -> anyhow::Result<()> {
    use ort::ep::ExecutionProvider;
    ort::ep::CUDA::default()
        .with_device_id(id)
        .register(builder)
        .map_err(|e| {
            anyhow::anyhow!(
                "ONNX Runtime's CUDA execution provider cannot run on GPU {id} ({e}); the GPU \
                 build of ONNX Runtime (PyPI onnxruntime-gpu) and CUDA 12 libraries are needed"
            )
        })
}

/// One input or output as the model declares it; `-1` marks a dynamic dim.
#[derive(Debug, Clone, PartialEq)]
struct IoInfo {
    name: String,
    dtype: DataType,
    dims: Vec<i64>,
}

#[derive(Debug, Clone, PartialEq)]
struct ModelIo {
    inputs: Vec<IoInfo>,
    outputs: Vec<IoInfo>,
}

impl ModelIo {
    fn from_session(session: &Session) -> anyhow::Result<Self> {
        let read = |outlets: &[Outlet], kind: &str| -> anyhow::Result<Vec<IoInfo>> {
            outlets
                .iter()
                .map(|o| match o.dtype() {
                    ValueType::Tensor { ty, shape, .. } => {
                        let dtype = convert::kserve_type(*ty).with_context(|| {
                            format!(
                                "{kind} '{}' has element type {ty}, which KServe cannot carry",
                                o.name()
                            )
                        })?;
                        // ORT reports symbolic and unknown dims as -1 already;
                        // anything else negative means the same to us.
                        let dims = shape.iter().map(|&d| if d < 0 { -1 } else { d }).collect();
                        Ok(IoInfo {
                            name: o.name().to_string(),
                            dtype,
                            dims,
                        })
                    }
                    other => bail!(
                        "{kind} '{}' is a {other:?}; only tensors are supported",
                        o.name()
                    ),
                })
                .collect()
        };
        Ok(Self {
            inputs: read(session.inputs(), "input")?,
            outputs: read(session.outputs(), "output")?,
        })
    }

    /// Whether every input and output has a dynamic leading dim, so a batch
    /// dimension can be put in front.
    fn supports_batching(&self) -> bool {
        self.inputs
            .iter()
            .chain(&self.outputs)
            .all(|io| io.dims.first() == Some(&-1))
    }
}

/// Fills in what the configuration leaves out from the model's own
/// description, leaving whatever the user set untouched.
///
/// Sequence control and implicit state inputs, and state outputs, are not
/// added to `input`/`output`: the sequence batcher provides and consumes
/// them (a state output the user wants clients to see is listed by hand).
fn complete(config: &mut ModelConfig, model: &ModelIo) -> anyhow::Result<()> {
    let sequence = SequenceTensors::from_config(config)?;
    if config.max_batch_size == 0
        && config.input.is_empty()
        && config.output.is_empty()
        && model.supports_batching()
    {
        config.max_batch_size = DEFAULT_MAX_BATCH_SIZE;
        if config.scheduling_choice.is_none() {
            config.scheduling_choice = Some(SchedulingChoice::DynamicBatching(
                ModelDynamicBatching::default(),
            ));
        }
    }
    let batched = config.max_batch_size > 0;
    if batched && !model.supports_batching() {
        bail!(
            "model '{}' has max_batch_size {}, but not every input and output of the ONNX model has a \
             dynamic first dimension to batch along; set max_batch_size: 0 and give full shapes",
            config.name,
            config.max_batch_size
        );
    }
    let config_dims = |io: &IoInfo| -> Vec<i64> {
        if batched {
            io.dims.get(1..).unwrap_or_default().to_vec()
        } else {
            io.dims.clone()
        }
    };
    if config.input.is_empty() {
        config.input = model
            .inputs
            .iter()
            .filter(|io| sequence.feeds(&io.name).is_none() && !is_batch_input(config, &io.name))
            .map(|io| ModelInput {
                name: io.name.clone(),
                data_type: io.dtype.to_config() as i32,
                dims: config_dims(io),
                ..Default::default()
            })
            .collect();
    } else {
        for input in &mut config.input {
            if let Some(io) = model.inputs.iter().find(|io| io.name == input.name) {
                fill_missing(&mut input.data_type, &mut input.dims, io, config_dims(io));
            }
        }
    }
    if config.output.is_empty() {
        config.output = model
            .outputs
            .iter()
            .filter(|io| !sequence.is_state_output(&io.name))
            .map(|io| ModelOutput {
                name: io.name.clone(),
                data_type: io.dtype.to_config() as i32,
                dims: config_dims(io),
                ..Default::default()
            })
            .collect();
    } else {
        for output in &mut config.output {
            if let Some(io) = model.outputs.iter().find(|io| io.name == output.name) {
                fill_missing(&mut output.data_type, &mut output.dims, io, config_dims(io));
            }
        }
    }
    Ok(())
}

/// A listed tensor with no datatype (`TYPE_INVALID`) or no dims gets the
/// model's; one the user spelled out is left for [`check`] to judge.
fn fill_missing(data_type: &mut i32, dims: &mut Vec<i64>, io: &IoInfo, model_dims: Vec<i64>) {
    if DataType::from_config_i32(*data_type).is_none() {
        *data_type = io.dtype.to_config() as i32;
    }
    if dims.is_empty() {
        *dims = model_dims;
    }
}

/// Checks the configuration against the model: every configured tensor
/// exists with the same datatype and compatible dims, every model input is
/// configured or fed by the sequence batcher, every sequence control and
/// state tensor exists with the datatype the batcher uses, and batching is
/// possible where asked for.
fn check(config: &ModelConfig, model: &ModelIo) -> anyhow::Result<()> {
    let name = &config.name;
    let sequence = SequenceTensors::from_config(config)?;
    let batched = config.max_batch_size > 0;
    if batched && !model.supports_batching() {
        bail!(
            "model '{name}' has max_batch_size {}, but not every input and output of the ONNX model has a \
             dynamic first dimension",
            config.max_batch_size
        );
    }
    let names = |ios: &[IoInfo]| {
        ios.iter()
            .map(|io| io.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let configured = config
        .input
        .iter()
        .map(|i| ("input", &i.name, i.data_type, &i.dims, i.reshape.is_some()))
        .chain(
            config
                .output
                .iter()
                .map(|o| ("output", &o.name, o.data_type, &o.dims, o.reshape.is_some())),
        );
    for (kind, tensor, data_type, dims, reshaped) in configured {
        let ios = if kind == "input" {
            &model.inputs
        } else {
            &model.outputs
        };
        let Some(io) = ios.iter().find(|io| &io.name == tensor) else {
            bail!(
                "model '{name}': configuration {kind} '{tensor}' is not an {kind} of the ONNX model \
                 (its {kind}s: {})",
                names(ios)
            );
        };
        let configured_type = DataType::from_config_i32(data_type);
        if configured_type != Some(io.dtype) {
            bail!(
                "model '{name}': configuration {kind} '{tensor}' has datatype {}, but the ONNX model's is {}",
                configured_type.map_or_else(|| "TYPE_INVALID".to_string(), |d| d.to_config().as_str_name().to_string()),
                io.dtype.to_config().as_str_name()
            );
        }
        let ragged = kind == "input"
            && config
                .input
                .iter()
                .any(|i| &i.name == tensor && i.allow_ragged_batch);
        // A batch output's shape is its source input's, not the model's.
        let batch_output = kind == "output"
            && config
                .batch_output
                .iter()
                .any(|b| b.target_name.contains(tensor));
        if ragged {
            // The batch arrives flattened into one 1-D tensor (Triton's
            // text, double space included).
            if io.dims != [-1] {
                bail!(
                    "unable to load model '{name}', configuration expects model provides input with \
                     shape [-1]  for ragged input '{tensor}', model provides {:?}",
                    io.dims
                );
            }
        } else if !reshaped && !batch_output {
            // With a reshape the configured dims are the client's view; the
            // model's shape is the reshape's, which ORT itself will check.
            let model_dims = without_batch(io, batched);
            if !dims_compatible(model_dims, dims) {
                bail!(
                    "model '{name}': configuration {kind} '{tensor}' has dims {dims:?}, but the ONNX model's \
                     are {model_dims:?}{}",
                    if batched { " (without the batch dimension)" } else { "" }
                );
            }
        }
    }
    for b in &config.batch_input {
        let dtype = DataType::from_config_i32(b.data_type);
        for target in &b.target_name {
            let Some(io) = model.inputs.iter().find(|io| &io.name == target) else {
                bail!(
                    "model '{name}': batch_input target '{target}' is not an input of the ONNX model \
                     (its inputs: {})",
                    names(&model.inputs)
                );
            };
            if dtype != Some(io.dtype) {
                bail!(
                    "model '{name}': batch_input target '{target}' is {}, but the ONNX model's input is {}",
                    dtype.map_or("TYPE_INVALID", |d| d.to_config().as_str_name()),
                    io.dtype.to_config().as_str_name()
                );
            }
        }
    }
    if let Some(missing) = model.inputs.iter().find(|io| {
        !config.input.iter().any(|i| i.name == io.name)
            && sequence.feeds(&io.name).is_none()
            && !is_batch_input(config, &io.name)
    }) {
        bail!(
            "model '{name}': the ONNX model's input '{}' is missing from the configuration",
            missing.name
        );
    }
    for tensor in &sequence.tensors {
        let role = tensor.role.describe();
        let (ios, kind) = if tensor.role == Role::StateOutput {
            (&model.outputs, "output")
        } else {
            (&model.inputs, "input")
        };
        let Some(io) = ios.iter().find(|io| io.name == tensor.name) else {
            bail!(
                "model '{name}': sequence_batching {role} '{}' is not an {kind} of the ONNX model \
                 (its {kind}s: {})",
                tensor.name,
                names(ios)
            );
        };
        if let Some(dtype) = tensor.dtype {
            if dtype != io.dtype {
                bail!(
                    "model '{name}': sequence_batching {role} '{}' is {} ({}), but the ONNX model's \
                     {kind} is {}",
                    tensor.name,
                    dtype.to_config().as_str_name(),
                    tensor.dtype_source,
                    io.dtype.to_config().as_str_name()
                );
            }
        }
        let model_dims = without_batch(io, batched);
        if !dims_compatible(model_dims, &tensor.dims) {
            bail!(
                "model '{name}': sequence_batching {role} '{}' has dims {:?}, but the ONNX model's \
                 {kind} has {model_dims:?}{}",
                tensor.name,
                tensor.dims,
                if batched {
                    " (without the batch dimension)"
                } else {
                    ""
                }
            );
        }
    }
    Ok(())
}

/// Whether the server feeds `name` as a batch input's target.
fn is_batch_input(config: &ModelConfig, name: &str) -> bool {
    config
        .batch_input
        .iter()
        .any(|b| b.target_name.iter().any(|t| t == name))
}

/// A model tensor's dims as the configuration states them: without the
/// batch dimension when the model is batched.
fn without_batch(io: &IoInfo, batched: bool) -> &[i64] {
    if batched {
        io.dims.get(1..).unwrap_or_default()
    } else {
        &io.dims
    }
}

/// Same rank, and equal wherever neither side is variable (`-1`).
fn dims_compatible(model_dims: &[i64], dims: &[i64]) -> bool {
    model_dims.len() == dims.len()
        && model_dims
            .iter()
            .zip(dims)
            .all(|(&m, &c)| m == -1 || c == -1 || m == c)
}

struct OnnxInstance {
    session: Session,
    model: String,
    /// The graph's inputs, each of which `execute` must be given.
    graph_inputs: Vec<GraphInput>,
    /// GPU instances: the pinned pool inputs are staged through. `None` for
    /// CPU instances, which ORT reads in place (a staging copy would only
    /// cost). Tests set it on CPU sessions to check that ORT accepts views
    /// over staging buffers; it is not a user option.
    staging: Option<InputStaging>,
}

/// A GPU instance's input staging ([`staging`]) and its running totals.
struct InputStaging {
    pool: StagingPool,
    /// Tensors staged, and tensors the pool had no buffer for, since the
    /// instance was made.
    staged: u64,
    fallback: u64,
}

impl InputStaging {
    /// The pool of the GPU's NUMA node for GPU instances. The GPU's node is
    /// also its owner shard's and its compute worker's (see
    /// `repository::load`'s placement), and it is where DMA from host
    /// memory is cheapest; an unknown node gets the unbound pool.
    fn for_device(device: InstanceDevice) -> Option<Self> {
        let InstanceDevice::Gpu(id) = device else {
            return None;
        };
        let node = crate::gpu::GpuInventory::shared()
            .get(id)
            .and_then(|g| g.numa_node);
        Some(Self::new(pinned::pool_for_node(node)))
    }

    fn new(pool: StagingPool) -> Self {
        Self {
            pool,
            staged: 0,
            fallback: 0,
        }
    }

    fn stage<'a>(&mut self, model: &str, inputs: &'a [Tensor]) -> Vec<Cow<'a, Tensor>> {
        let (staged, stats) = staging::stage_inputs(&self.pool, inputs);
        self.staged += stats.staged as u64;
        if stats.fallback > 0 {
            self.fallback += stats.fallback as u64;
            // Not an error: the tensors go to ORT from request memory, as
            // without staging (only the host → device copy is slower).
            tracing::debug!(
                model,
                node = ?self.pool.node(),
                fallback = stats.fallback,
                total_fallback = self.fallback,
                pool = ?self.pool.stats(),
                "staging pool had no buffer; inputs given from request memory"
            );
        }
        staged
    }
}

impl Drop for InputStaging {
    fn drop(&mut self) {
        tracing::debug!(
            node = ?self.pool.node(),
            staged = self.staged,
            fallback = self.fallback,
            pool = ?self.pool.stats(),
            "input staging totals"
        );
    }
}

struct GraphInput {
    name: String,
    /// Set for the inputs the sequence batcher feeds.
    role: Option<Role>,
}

impl OnnxInstance {
    /// A graph input missing from `inputs` is a caller's bug (validation
    /// and the sequence batcher supply them all), reported by name rather
    /// than as ORT's generic failure.
    fn check_all_inputs_given(&self, inputs: &[Tensor]) -> InferResult<()> {
        let Some(missing) = self
            .graph_inputs
            .iter()
            .find(|g| !inputs.iter().any(|t| t.name == g.name))
        else {
            return Ok(());
        };
        Err(InferError::internal(match missing.role {
            Some(role) => format!(
                "model '{}': {} '{}' was not given; the sequence batcher must supply it",
                self.model,
                role.describe(),
                missing.name
            ),
            None => format!(
                "model '{}': input '{}' was not given",
                self.model, missing.name
            ),
        }))
    }
}

impl OnnxInstance {
    /// Runs the session on `inputs` (the request's tensors or their staged
    /// copies) and converts the outputs asked for.
    ///
    /// Outputs: ORT allocates them in its own (pageable) CPU memory and the
    /// CUDA provider copies device → host into it; they are not bound to
    /// ORT's `CUDA_PINNED` allocator through `IoBinding`. In ort rc.15 that
    /// would mean `run_binding` with `bind_output_to_device`, whose output
    /// buffers ORT reuses on the next run (the returned values must be
    /// cloned, a copy, before the response may keep them, while today the
    /// response owns ORT's buffer with no copy), `bind_input` cloning
    /// borrowed inputs whenever the session wants them on the CPU, and an
    /// allocator that only a CUDA session has, so none of it could be run
    /// here (no GPU). Left out until it can be measured on a GPU.
    fn run<'t>(
        &mut self,
        inputs: impl Iterator<Item = &'t Tensor>,
        outputs: &[&str],
    ) -> InferResult<Vec<Tensor>> {
        let (len, _) = inputs.size_hint();
        let mut feeds: Vec<(Cow<'_, str>, SessionInputValue<'_>)> = Vec::with_capacity(len);
        for t in inputs {
            let value = convert::to_ort(t).map_err(|e| {
                InferError::invalid(format!("model '{}': input '{}': {e}", self.model, t.name))
            })?;
            feeds.push((Cow::Borrowed(t.name.as_str()), value));
        }
        let produced = self.session.run(feeds).map_err(|e| {
            InferError::internal(format!("model '{}': ONNX Runtime failed: {e}", self.model))
        })?;
        let mut result = Vec::with_capacity(produced.len());
        for (name, value) in produced {
            if !outputs.is_empty() && !outputs.contains(&name) {
                continue;
            }
            let tensor = convert::from_ort(name, value)
                .map_err(|e| InferError::internal(format!("model '{}': {e}", self.model)))?;
            result.push(tensor);
        }
        Ok(result)
    }
}

impl ModelInstance for OnnxInstance {
    fn execute(&mut self, inputs: &[Tensor], outputs: &[&str]) -> InferResult<Vec<Tensor>> {
        self.check_all_inputs_given(inputs)?;
        let Some(staging) = self.staging.as_mut() else {
            return self.run(inputs.iter(), outputs);
        };
        // GPU instance: ORT gets views over pinned staging buffers. They
        // must outlive `run` (ORT reads them during it: the CUDA provider
        // copies them to the device), and go back to the pool when
        // `staged` is dropped after it. Outputs never alias them: ORT
        // allocates its outputs itself.
        //
        // Never run on a GPU in this project. The views carry ORT's plain
        // CPU memory info, so ORT does not know the buffer is pinned; the
        // CUDA driver does (the range is registered, PORTABLE), which is
        // what lets its copy DMA straight from it. Whether ORT's copy is
        // then also asynchronous on the session's stream is unmeasured.
        let staged = staging.stage(&self.model, inputs);
        let result = self.run(staged.iter().map(|t| &**t), outputs);
        drop(staged);
        result
    }
}

#[cfg(test)]
mod tests;
