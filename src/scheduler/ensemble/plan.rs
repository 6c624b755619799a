//! An ensemble compiled at load time against the composing models that are
//! loaded: each step's model and version checked, every ensemble tensor
//! given one datatype and a shape its producer and consumers agree on
//! (Triton's `ValidateEnsembleConfig`, with its messages), and the data
//! flow turned into indices so that a request only moves tensors between
//! slots.

use std::collections::BTreeMap;

use anyhow::{anyhow, bail};

use super::graph::{self, sorted};
use crate::{
    model::{ModelState, ModelTable, ModelVersion},
    proto::inference::{model_ensembling::Step, DataType as ConfigDataType, ModelConfig},
};

/// One step: which model runs, and which slots it reads and writes.
#[derive(Debug)]
pub struct PlanStep {
    pub model_name: String,
    /// Empty: the model's latest ready version, as `model_version: -1` asks.
    pub model_version: String,
    /// Whether the composing model batches (its `max_batch_size > 0`).
    pub batching: bool,
    /// Model input name, ensemble tensor slot, the input's configured dims.
    pub inputs: Vec<(String, usize, Vec<i64>)>,
    /// Model output name, ensemble tensor slot.
    pub outputs: Vec<(String, usize)>,
    /// Whether the composing model is decoupled: each of its responses
    /// starts a new instance of the downstream data flow.
    pub decoupled: bool,
    /// The decoupled label of the step's outputs (see [`EnsemblePlan::decoupled`]).
    pub label: usize,
}

/// An ensemble tensor: its name and the steps that read it.
#[derive(Debug)]
pub struct Slot {
    pub name: String,
    pub consumers: Vec<usize>,
}

/// The compiled data flow of one ensemble version.
#[derive(Debug)]
pub struct EnsemblePlan {
    pub name: String,
    pub version_str: String,
    pub batching: bool,
    pub slots: Vec<Slot>,
    /// Ensemble input name → slot.
    pub inputs: Vec<(String, usize)>,
    /// Ensemble output name, slot, configured dims (reshape applied).
    pub outputs: Vec<(String, usize, Vec<i64>)>,
    pub steps: Vec<PlanStep>,
    /// Whether a decoupled step feeds the outputs: the ensemble is then
    /// decoupled itself (Triton sets its `model_transaction_policy`).
    pub decoupled: bool,
    /// The decoupled label of the ensemble outputs: 0 for the request's
    /// own data flow, else the decoupled step whose every response (and
    /// what downstream steps make of it) gives one ensemble response.
    pub output_label: usize,
}

/// What the ensemble's tensor is known to be, and from which model.
struct TensorNode {
    model: String,
    datatype: i32,
    dims: Vec<i64>,
    full_dims: Vec<i64>,
}

impl TensorNode {
    fn new(model: &str, batching: bool, datatype: i32, dims: &[i64]) -> Self {
        let mut full_dims = Vec::with_capacity(dims.len() + 1);
        if batching {
            full_dims.push(-1);
        }
        full_dims.extend_from_slice(dims);
        Self {
            model: model.to_string(),
            datatype,
            dims: dims.to_vec(),
            full_dims,
        }
    }
}

/// Equal dims where `-1` matches anything (Triton's CompareDimsWithWildcard).
pub fn dims_match(a: &[i64], b: &[i64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y || *x == -1 || *y == -1)
}

fn type_name(datatype: i32) -> &'static str {
    ConfigDataType::try_from(datatype).map_or("TYPE_INVALID", |d| d.as_str_name())
}

fn show_dims(dims: &[i64]) -> String {
    let parts: Vec<String> = dims.iter().map(i64::to_string).collect();
    format!("[{}]", parts.join(","))
}

fn check_consistent(known: &TensorNode, other: &TensorNode, prefix: &str) -> anyhow::Result<()> {
    if known.datatype != other.datatype {
        bail!(
            "{prefix}inconsistent data type: {} is inferred from model {} while {} is inferred from model {}",
            type_name(known.datatype),
            known.model,
            type_name(other.datatype),
            other.model
        );
    }
    if !dims_match(&known.dims, &other.dims) && !dims_match(&known.full_dims, &other.full_dims) {
        bail!(
            "{prefix}inconsistent shape: {} is inferred from model {} while {} is inferred from model {}",
            show_dims(&known.full_dims),
            known.model,
            show_dims(&other.full_dims),
            other.model
        );
    }
    Ok(())
}

/// The composing model version a step names, if it is loaded and ready.
/// Errors use Triton's phrase for an ensemble whose models are missing.
pub fn composing_model<'t>(
    ensemble: &str,
    step: &Step,
    table: &'t ModelTable,
) -> anyhow::Result<&'t ModelVersion> {
    let missing = |why: String| {
        anyhow!(
            "ensemble {ensemble} contains models that are not available or ambiguous: {} ({why})",
            step.model_name
        )
    };
    let entry = table
        .models
        .get(&step.model_name)
        .ok_or_else(|| missing("no such model in the repository".into()))?;
    let ready = |v: &&crate::model::VersionEntry| v.state == ModelState::Ready;
    let found = if step.model_version < 0 {
        entry.versions.values().rev().find(ready)
    } else {
        entry.versions.get(&step.model_version).filter(ready)
    };
    let state_of = |version: i64| match entry.versions.get(&version).map(|v| &v.state) {
        Some(ModelState::Unavailable { reason }) => reason.clone(),
        Some(state) => format!("version {version} is {}", state.as_str()),
        None => format!("version {version} is not served"),
    };
    found.and_then(|v| v.loaded.as_deref()).ok_or_else(|| {
        missing(match (&entry.failure, step.model_version) {
            (Some(failure), _) => failure.clone(),
            (None, v) if v < 0 => "no version is ready".into(),
            (None, v) => state_of(v),
        })
    })
}

/// Compiles `config` (already checked by [`graph::validate`]) against the
/// composing models in `table`.
pub fn compile(
    config: &ModelConfig,
    version: i64,
    table: &ModelTable,
) -> anyhow::Result<EnsemblePlan> {
    let name = &config.name;
    let batching = config.max_batch_size > 0;
    let steps = graph::steps(config)?;
    let mut nodes: BTreeMap<String, TensorNode> = BTreeMap::new();
    for input in &config.input {
        let dims = input.reshape.as_ref().map_or(&input.dims, |r| &r.shape);
        nodes.insert(
            input.name.clone(),
            TensorNode::new(name, batching, input.data_type, dims),
        );
    }
    for output in &config.output {
        let dims = output.reshape.as_ref().map_or(&output.dims, |r| &r.shape);
        nodes.insert(
            output.name.clone(),
            TensorNode::new(name, batching, output.data_type, dims),
        );
    }

    let mut slot_of: BTreeMap<String, usize> = BTreeMap::new();
    let mut slots: Vec<Slot> = Vec::new();
    let mut slot = |tensor: &str, slots: &mut Vec<Slot>| -> usize {
        *slot_of.entry(tensor.to_string()).or_insert_with(|| {
            slots.push(Slot {
                name: tensor.to_string(),
                consumers: Vec::new(),
            });
            slots.len() - 1
        })
    };
    let mut plan_steps = Vec::with_capacity(steps.len());
    for (index, step) in steps.iter().enumerate() {
        let model = composing_model(name, step, table)?;
        let composing = &model.config;
        let step_batching = composing.max_batch_size > 0;
        if composing.max_batch_size != 0 && composing.max_batch_size < config.max_batch_size {
            bail!(
                "ensemble {name} allows maximum batch size {}, but it contains model {} which only allows maximum batch size to be {}",
                config.max_batch_size,
                step.model_name,
                composing.max_batch_size
            );
        }
        let mut inputs = Vec::new();
        for (model_input, tensor) in sorted(&step.input_map) {
            let spec = composing
                .input
                .iter()
                .find(|i| i.name == model_input)
                .ok_or_else(|| {
                    anyhow!(
                        "in ensemble {name}, ensemble tensor {tensor} is mapping to non-existing input {model_input} in model {}",
                        step.model_name
                    )
                })?;
            let node = TensorNode::new(&step.model_name, step_batching, spec.data_type, &spec.dims);
            link(&mut nodes, tensor, node, name)?;
            inputs.push((
                model_input.to_string(),
                slot(tensor, &mut slots),
                spec.dims.clone(),
            ));
        }
        if let Some(unmapped) = composing
            .input
            .iter()
            .find(|i| !i.optional && !step.input_map.contains_key(&i.name))
        {
            bail!(
                "in ensemble {name}, input {} in model {} is not mapped to any ensemble tensors",
                unmapped.name,
                step.model_name
            );
        }
        let mut outputs = Vec::new();
        for (model_output, tensor) in sorted(&step.output_map) {
            let spec = composing
                .output
                .iter()
                .find(|o| o.name == model_output)
                .ok_or_else(|| {
                    anyhow!(
                        "in ensemble {name}, ensemble tensor {tensor} is mapped from non-existing output {model_output} in model {}",
                        step.model_name
                    )
                })?;
            let node = TensorNode::new(&step.model_name, step_batching, spec.data_type, &spec.dims);
            link(&mut nodes, tensor, node, name)?;
            outputs.push((model_output.to_string(), slot(tensor, &mut slots)));
        }
        for (_, id, _) in &inputs {
            slots[*id].consumers.push(index);
        }
        plan_steps.push(PlanStep {
            model_name: step.model_name.clone(),
            model_version: if step.model_version < 0 {
                String::new()
            } else {
                step.model_version.to_string()
            },
            batching: step_batching,
            inputs,
            outputs,
            decoupled: crate::config::is_decoupled(composing),
            label: 0,
        });
    }
    let inputs: Vec<(String, usize)> = config
        .input
        .iter()
        .map(|i| (i.name.clone(), slot(&i.name, &mut slots)))
        .collect();
    let outputs: Vec<(String, usize, Vec<i64>)> = config
        .output
        .iter()
        .map(|o| {
            let dims = o.reshape.as_ref().map_or(&o.dims, |r| &r.shape).clone();
            (o.name.clone(), slot(&o.name, &mut slots), dims)
        })
        .collect();
    let output_label =
        label_decoupled_flows(name, &mut plan_steps, slots.len(), &inputs, &outputs)?;
    Ok(EnsemblePlan {
        name: name.clone(),
        version_str: version.to_string(),
        batching,
        slots,
        inputs,
        outputs,
        decoupled: plan_steps.iter().any(|s| s.decoupled),
        steps: plan_steps,
        output_label,
    })
}

/// Triton's check of the decoupled data flow (`ValidateEnsembleConfig`):
/// every tensor carries the label of the decoupled step it descends from
/// (0: the request itself), a decoupled step's outputs get a new label,
/// and a step (or the ensemble's outputs) may only read tensors of one
/// label, so each response of a decoupled step flows through its
/// downstream steps on its own. Sets each step's label and returns the
/// outputs' label.
fn label_decoupled_flows(
    name: &str,
    steps: &mut [PlanStep],
    slot_count: usize,
    inputs: &[(String, usize)],
    outputs: &[(String, usize, Vec<i64>)],
) -> anyhow::Result<usize> {
    let mut label: Vec<Option<usize>> = vec![None; slot_count];
    for (_, slot) in inputs {
        label[*slot] = Some(0);
    }
    let mut done = vec![false; steps.len()];
    let mut decoupled_steps = 0;
    // graph::validate already ensured every step's inputs can exist, so
    // this reaches every step in at most one pass per step.
    loop {
        let mut progressed = false;
        for (index, step) in steps.iter_mut().enumerate() {
            if done[index] {
                continue;
            }
            let Some(input_label) = one_label(
                name,
                &step.model_name,
                step.inputs.iter().map(|(_, slot, _)| *slot),
                &label,
            )?
            else {
                continue;
            };
            step.label = if step.decoupled {
                decoupled_steps += 1;
                decoupled_steps
            } else {
                input_label
            };
            for (_, slot) in &step.outputs {
                label[*slot] = Some(step.label);
            }
            done[index] = true;
            progressed = true;
        }
        if !progressed {
            break;
        }
    }
    Ok(one_label(name, name, outputs.iter().map(|(_, slot, _)| *slot), &label)?.unwrap_or(0))
}

/// The one label of `slots` (0 for none); `None` while one has none yet.
fn one_label(
    ensemble: &str,
    model: &str,
    slots: impl Iterator<Item = usize>,
    label: &[Option<usize>],
) -> anyhow::Result<Option<usize>> {
    let mut found: Option<usize> = None;
    for slot in slots {
        let Some(l) = label[slot] else {
            return Ok(None);
        };
        match found {
            Some(f) if f != l => bail!(
                "in ensemble {ensemble}, step of model '{model}' receives inputs originated from different decoupled models"
            ),
            _ => found = Some(l),
        }
    }
    Ok(Some(found.unwrap_or(0)))
}

/// Records what a step says about an ensemble tensor, or checks it
/// against what is already known.
fn link(
    nodes: &mut BTreeMap<String, TensorNode>,
    tensor: &str,
    node: TensorNode,
    ensemble: &str,
) -> anyhow::Result<()> {
    match nodes.get(tensor) {
        Some(known) => check_consistent(
            known,
            &node,
            &format!("in ensemble {ensemble}, ensemble tensor {tensor}: "),
        ),
        None => {
            nodes.insert(tensor.to_string(), node);
            Ok(())
        }
    }
}
