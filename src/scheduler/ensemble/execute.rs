//! Running one ensemble request on the shard that received it. Each step
//! is an ordinary request to its composing model through
//! [`crate::scheduler::infer`], so it reaches that model's scheduler on
//! its owner shard over the rings, is batched with direct traffic, and is
//! counted in that model's statistics. A step starts as soon as its last
//! input exists; independent steps are in flight together.
//!
//! Tensors move from slot to step by value; a tensor read by several
//! steps is shared by cloning its `Bytes` (a reference count, no copy).

use std::{
    pin::pin,
    sync::Arc,
    time::{Duration, Instant},
};

use futures::{
    future::{select, Either},
    stream::{FuturesUnordered, LocalBoxStream, SelectAll},
    SinkExt, StreamExt,
};

use super::plan::{dims_match, EnsemblePlan, PlanStep};
use crate::{
    scheduler::host::Dispatch,
    scheduler::{batch::batch_rows, decoupled::ResponseTx, infer_stream, Job, Streamed},
    shard,
    types::{
        ComputeTimes, InferError, InferRequest, InferResponse, InferResult, Parameters,
        RequestedOutput, Tensor,
    },
};

/// Starts `job` (a validated request to the ensemble whose statistics
/// live under scheduler `key`) as a task on this shard; its answer goes
/// to the job's responder. When the client stops waiting, the task stops
/// and its in-flight steps are cancelled.
pub fn start(plan: Arc<EnsemblePlan>, key: u64, job: Job) -> Dispatch {
    let Job {
        request,
        mut reply,
        responses,
        ..
    } = job;
    let enqueued = Instant::now();
    monoio::spawn(async move {
        // Triton's ensemble queue time: from being handed to the ensemble
        // scheduler until its steps start being scheduled.
        let queue = enqueued.elapsed();
        let rows = if plan.batching {
            batch_rows(&request).max(1) as usize
        } else {
            1
        };
        let result = {
            // `dispatch` gave a response channel exactly when the ensemble
            // is decoupled (a decoupled step feeds it).
            let run = pin!(async {
                match responses {
                    Some(tx) => run_decoupled(&plan, request, tx).await,
                    None => run(&plan, request).await,
                }
            });
            match select(reply.cancellation(), run).await {
                // Dropping `run` drops the steps' futures: each composing
                // model counts its request as cancelled.
                Either::Left(_) => return,
                Either::Right((result, _)) => result,
            }
        };
        if let Ok(response) = &result {
            record_success(key, rows, queue, response.compute);
        }
        let _ = reply.send(result);
    });
    Dispatch::Queued
}

/// Counts a successful ensemble request as Triton does: its own (short)
/// queue time, the compute phases of every composing request summed, and
/// one "execution" of the request's batch size. The request's success and
/// duration are counted by `dispatch` like any other model's.
fn record_success(key: u64, rows: usize, queue: Duration, compute: ComputeTimes) {
    shard::with_current(|s| {
        s.with_model(key, |m| {
            let counters = m.stats.shard(s.id);
            counters.queue.record(queue);
            counters.compute_input.record(compute.input);
            counters.compute_infer.record(compute.infer);
            counters.compute_output.record(compute.output);
            counters.record_execution(rows, compute.input, compute.infer, compute.output);
        })
    });
}

/// An ensemble tensor that exists, and the batch size it carries when it
/// came from a batching model (or a batching ensemble's request).
struct Value {
    tensor: Tensor,
    batch: Option<i64>,
}

struct Flow<'p> {
    plan: &'p EnsemblePlan,
    values: Vec<Option<Value>>,
    /// Per slot: readers still to come (steps, and the response).
    uses: Vec<usize>,
    /// Per step: inputs not yet available.
    missing: Vec<usize>,
    /// Per slot: already written (or known absent).
    provided: Vec<bool>,
}

impl<'p> Flow<'p> {
    fn new(plan: &'p EnsemblePlan) -> Self {
        let mut uses: Vec<usize> = plan.slots.iter().map(|s| s.consumers.len()).collect();
        for (_, slot, _) in &plan.outputs {
            uses[*slot] += 1;
        }
        Self {
            plan,
            values: plan.slots.iter().map(|_| None).collect(),
            uses,
            missing: plan.steps.iter().map(|s| s.inputs.len()).collect(),
            provided: vec![false; plan.slots.len()],
        }
    }

    /// Marks `slot` available (with a value, or absent: an optional
    /// ensemble input left out) and returns the steps that became ready.
    fn provide(&mut self, slot: usize, value: Option<Value>, ready: &mut Vec<usize>) {
        // A slot is written once: a second tensor of the same name (a
        // backend repeating an output) must not release readers twice.
        if std::mem::replace(&mut self.provided[slot], true) {
            return;
        }
        self.values[slot] = value;
        for &step in &self.plan.slots[slot].consumers {
            // A step reading the same tensor twice is counted per input.
            let times = self.plan.steps[step]
                .inputs
                .iter()
                .filter(|(_, s, _)| *s == slot)
                .count();
            self.missing[step] = self.missing[step].saturating_sub(times);
            if self.missing[step] == 0 {
                ready.push(step);
            }
        }
    }

    /// Takes a slot's tensor for one reader: moved out on its last use,
    /// else shared.
    fn take(&mut self, slot: usize) -> Option<Value> {
        self.uses[slot] = self.uses[slot].saturating_sub(1);
        if self.uses[slot] == 0 {
            self.values[slot].take()
        } else {
            self.values[slot].as_ref().map(|v| Value {
                tensor: v.tensor.clone(),
                batch: v.batch,
            })
        }
    }

    fn step_request(&mut self, step: usize, request: &RequestInfo) -> InferRequest {
        let spec = &self.plan.steps[step];
        let mut inputs = Vec::with_capacity(spec.inputs.len());
        for (name, slot, dims) in &spec.inputs {
            if let Some(Value { mut tensor, batch }) = self.take(*slot) {
                tensor.name.clone_from(name);
                tensor.shape = reshape(dims, spec.batching, batch, tensor.shape);
                inputs.push(tensor);
            }
        }
        InferRequest {
            model_name: spec.model_name.clone(),
            model_version: spec.model_version.clone(),
            id: request.id.clone(),
            inputs,
            outputs: spec
                .outputs
                .iter()
                .map(|(name, _)| crate::types::RequestedOutput {
                    name: name.clone(),
                    parameters: Default::default(),
                })
                .collect(),
            // Correlation id, sequence flags, priority and timeout go to
            // every composing model, as in Triton.
            parameters: request.parameters.clone(),
            // A traced ensemble request traces each step as its child.
            trace: request.trace.child(&spec.model_name),
        }
    }
}

struct RequestInfo {
    id: String,
    parameters: Parameters,
    trace: crate::trace::TraceSlot,
}

impl RequestInfo {
    /// The ensemble request's own details, its inputs and the outputs it
    /// asks for.
    fn split(request: InferRequest) -> (Self, Vec<Tensor>, Vec<RequestedOutput>) {
        let InferRequest {
            id,
            inputs,
            outputs,
            parameters,
            trace,
            ..
        } = request;
        (
            Self {
                id,
                parameters,
                trace,
            },
            inputs,
            outputs,
        )
    }
}

/// Triton's batch/non-batch conversion between a tensor and the model that
/// reads it: a batching reader of an unbatched tensor that matches its
/// dims gets a batch of 1; a non-batching reader of a batch-1 tensor that
/// does not match its dims gets the batch dimension stripped.
fn reshape(
    config_dims: &[i64],
    reader_batches: bool,
    batch: Option<i64>,
    shape: Vec<i64>,
) -> Vec<i64> {
    match (reader_batches, batch) {
        (true, None) if dims_match(config_dims, &shape) => {
            let mut full = Vec::with_capacity(shape.len() + 1);
            full.push(1);
            full.extend(shape);
            full
        }
        (false, Some(1)) if !dims_match(config_dims, &shape) && !shape.is_empty() => {
            shape[1..].to_vec()
        }
        _ => shape,
    }
}

async fn run(plan: &EnsemblePlan, request: InferRequest) -> InferResult<InferResponse> {
    let (info, inputs, wanted) = RequestInfo::split(request);
    let mut flow = Flow::new(plan);
    let mut ready = Vec::new();
    provide_inputs(plan, &mut flow, inputs, &mut ready);

    let mut compute = ComputeTimes::default();
    let mut running = FuturesUnordered::new();
    loop {
        for step in ready.drain(..) {
            let step_request = flow.step_request(step, &info);
            running.push(async move { (step, crate::scheduler::infer(step_request).await) });
        }
        let Some((step, result)) = running.next().await else {
            break;
        };
        let spec = &plan.steps[step];
        let response = result.map_err(|e| step_failed(plan, step, e))?;
        compute += response.compute;
        provide_outputs(spec, &mut flow, response.outputs, &mut ready);
    }

    let selected = selected_outputs(plan, &wanted)?;
    let mut outputs = Vec::with_capacity(selected.len());
    for (name, slot, dims) in selected {
        let Some(Value { mut tensor, batch }) = flow.take(*slot) else {
            return Err(InferError::internal(format!(
                "in ensemble '{}', unexpected deadlock, output '{name}' is not set while no more ensemble steps can be made",
                plan.name
            )));
        };
        tensor.name.clone_from(name);
        tensor.shape = reshape(dims, plan.batching, batch, tensor.shape);
        outputs.push(tensor);
    }
    Ok(InferResponse {
        model_name: plan.name.clone(),
        model_version: plan.version_str.clone(),
        id: info.id,
        outputs,
        parameters: Default::default(),
        trace: info.trace,
        compute,
    })
}

fn step_failed(plan: &EnsemblePlan, step: usize, e: InferError) -> InferError {
    InferError::new(
        e.kind,
        format!(
            "in ensemble '{}', step {step} (model '{}') failed: {}",
            plan.name, plan.steps[step].model_name, e.message
        ),
    )
}

/// The ensemble outputs a request asked for (all of them when it named
/// none), in its order.
fn selected_outputs<'p>(
    plan: &'p EnsemblePlan,
    wanted: &[crate::types::RequestedOutput],
) -> InferResult<Vec<&'p (String, usize, Vec<i64>)>> {
    if wanted.is_empty() {
        return Ok(plan.outputs.iter().collect());
    }
    let mut selected = Vec::with_capacity(wanted.len());
    for w in wanted {
        if w.class_count().is_some() {
            return Err(InferError::unsupported(format!(
                "in ensemble '{}', classification of output '{}' is not supported for ensembles yet",
                plan.name, w.name
            )));
        }
        // validate_request already refused unknown output names.
        if let Some(o) = plan.outputs.iter().find(|(n, _, _)| *n == w.name) {
            selected.push(o);
        }
    }
    Ok(selected)
}

/// One instance of a decoupled ensemble's data flow: the request's own
/// (label 0), or one response of a decoupled step together with what its
/// downstream steps make of it (that step's label).
struct Instance<'p> {
    flow: Flow<'p>,
    label: usize,
    /// Steps of this instance that have not sent their final response.
    running: usize,
    /// Whether this instance already gave its ensemble response.
    answered: bool,
}

/// A step's responses, tagged with its instance and step.
type StepStream = LocalBoxStream<'static, (usize, usize, InferResult<Streamed>)>;

/// Runs a decoupled ensemble request (Triton's `EnsembleContext` for a
/// decoupled ensemble): each response of a decoupled step starts a new
/// instance of the downstream data flow; an instance of the outputs'
/// label whose outputs all exist is one ensemble response, sent into `tx`
/// at once. An empty final response (flag only) starts nothing. The
/// request ends, with the final flag returned here, once every step of
/// every instance has sent its final response; zero responses are not a
/// deadlock, as for any decoupled model. The first failing step ends the
/// request with its error (the other steps are cancelled).
async fn run_decoupled(
    plan: &EnsemblePlan,
    request: InferRequest,
    mut tx: ResponseTx,
) -> InferResult<InferResponse> {
    let (info, inputs, wanted) = RequestInfo::split(request);
    let selected = selected_outputs(plan, &wanted)?;
    let mut root = Instance {
        flow: Flow::new(plan),
        label: 0,
        running: 0,
        answered: false,
    };
    let mut ready = Vec::new();
    provide_inputs(plan, &mut root.flow, inputs, &mut ready);
    // Finished instances leave `None` behind: indices stay valid for the
    // steps still tagged with them.
    let mut instances: Vec<Option<Instance>> = vec![Some(root)];
    let mut running: SelectAll<StepStream> = SelectAll::new();
    let mut compute = ComputeTimes::default();
    // Instances to advance: start their ready steps, answer, or retire.
    let mut touched: Vec<(usize, Vec<usize>)> = vec![(0, ready)];
    loop {
        for (at, ready) in touched.drain(..) {
            let Some(instance) = instances.get_mut(at).and_then(Option::as_mut) else {
                continue;
            };
            for step in ready {
                let step_request = instance.flow.step_request(step, &info);
                instance.running += 1;
                running.push(
                    infer_stream(step_request)
                        .map(move |item| (at, step, item))
                        .boxed_local(),
                );
            }
            if !instance.answered
                && instance.label == plan.output_label
                && selected
                    .iter()
                    .all(|(_, slot, _)| instance.flow.provided[*slot])
            {
                instance.answered = true;
                let response = InferResponse {
                    model_name: plan.name.clone(),
                    model_version: plan.version_str.clone(),
                    id: info.id.clone(),
                    outputs: instance_outputs(plan, &mut instance.flow, &selected),
                    ..Default::default()
                };
                if tx.send(response).await.is_err() {
                    return Err(InferError::unavailable(format!(
                        "in ensemble '{}', the client stopped reading responses",
                        plan.name
                    )));
                }
            }
            if instance.running == 0 {
                if let Some(slot) = instances.get_mut(at) {
                    *slot = None;
                }
            }
        }
        let Some((at, step, item)) = running.next().await else {
            break;
        };
        let spec = &plan.steps[step];
        let (response, last) = match item.map_err(|e| step_failed(plan, step, e))? {
            Streamed::Response { response, last } => (Some(response), last),
            Streamed::Final(_) => (None, true),
        };
        if last {
            if let Some(instance) = instances.get_mut(at).and_then(Option::as_mut) {
                instance.running = instance.running.saturating_sub(1);
            }
        }
        let Some(response) = response else {
            touched.push((at, Vec::new()));
            continue;
        };
        compute += response.compute;
        let target = if spec.decoupled {
            instances.push(Some(Instance {
                flow: Flow::new(plan),
                label: spec.label,
                running: 0,
                answered: false,
            }));
            if last {
                touched.push((at, Vec::new()));
            }
            instances.len() - 1
        } else {
            at
        };
        let mut ready = Vec::new();
        if let Some(instance) = instances.get_mut(target).and_then(Option::as_mut) {
            provide_outputs(spec, &mut instance.flow, response.outputs, &mut ready);
            // An output the step did not send is known absent (Triton
            // treats it as an optional input of the steps that read it).
            for (_, slot) in &spec.outputs {
                instance.flow.provide(*slot, None, &mut ready);
            }
        }
        touched.push((target, ready));
    }
    drop(tx);
    Ok(InferResponse {
        model_name: plan.name.clone(),
        model_version: plan.version_str.clone(),
        id: info.id,
        trace: info.trace,
        compute,
        ..Default::default()
    })
}

/// The ensemble request's inputs into `flow` (an optional input left out
/// is known absent).
fn provide_inputs(
    plan: &EnsemblePlan,
    flow: &mut Flow,
    inputs: Vec<Tensor>,
    ready: &mut Vec<usize>,
) {
    let mut given: Vec<Option<Tensor>> = plan.inputs.iter().map(|_| None).collect();
    for tensor in inputs {
        if let Some(i) = plan.inputs.iter().position(|(n, _)| *n == tensor.name) {
            given[i] = Some(tensor);
        }
    }
    for ((_, slot), tensor) in plan.inputs.iter().zip(given) {
        let value = tensor.map(|tensor| Value {
            batch: plan
                .batching
                .then(|| tensor.shape.first().copied().unwrap_or(1)),
            tensor,
        });
        flow.provide(*slot, value, ready);
    }
}

/// A step's response tensors into the slots its output map names.
fn provide_outputs(spec: &PlanStep, flow: &mut Flow, outputs: Vec<Tensor>, ready: &mut Vec<usize>) {
    for tensor in outputs {
        if let Some((_, slot)) = spec.outputs.iter().find(|(n, _)| *n == tensor.name) {
            let value = Value {
                batch: spec
                    .batching
                    .then(|| tensor.shape.first().copied().unwrap_or(1)),
                tensor,
            };
            flow.provide(*slot, Some(value), ready);
        }
    }
}

/// The selected ensemble outputs of an instance, named and shaped as the
/// ensemble declares them; one a step did not send is left out.
fn instance_outputs(
    plan: &EnsemblePlan,
    flow: &mut Flow,
    selected: &[&(String, usize, Vec<i64>)],
) -> Vec<Tensor> {
    let mut outputs = Vec::with_capacity(selected.len());
    for (name, slot, dims) in selected {
        if let Some(Value { mut tensor, batch }) = flow.take(*slot) {
            tensor.name.clone_from(name);
            tensor.shape = reshape(dims, plan.batching, batch, tensor.shape);
            outputs.push(tensor);
        }
    }
    outputs
}

#[cfg(test)]
mod tests {
    use super::reshape;

    #[test]
    fn batch_dimension_is_added_or_stripped_as_triton_does() {
        assert_eq!(reshape(&[16], true, None, vec![16]), vec![1, 16]);
        assert_eq!(reshape(&[16], true, Some(2), vec![2, 16]), vec![2, 16]);
        assert_eq!(reshape(&[16], false, Some(1), vec![1, 16]), vec![16]);
        assert_eq!(reshape(&[-1, 16], false, Some(1), vec![1, 16]), vec![1, 16]);
        assert_eq!(reshape(&[16], false, Some(3), vec![3, 16]), vec![3, 16]);
    }
}
