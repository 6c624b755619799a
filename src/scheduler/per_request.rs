//! Executions of instances that take a batch's requests one by one (the
//! C API's backends, which batch inputs themselves): each request gets
//! its own `ResponseSender`, the same way for ordinary and decoupled
//! models. An ordinary request's answer is held until the execution has
//! been recorded (so a client that reads the statistics right after its
//! answer sees its execution, as with built-in backends); one answered
//! later, from another thread, goes out directly.

use std::{
    sync::{Arc, Mutex},
    time::Instant,
};

use super::{
    decoupled::ChannelSink,
    output::build_response,
    sequence::{build_inputs, CorrelationId, RowControl, SequenceSpec, SlotStates},
    Job, Responder,
};
use crate::{
    backend::{
        BackendRequest, ModelInstance, ReceiverGone, ResponseSender, ResponseSink, SequenceInfo,
        StateUpdates,
    },
    config::is_decoupled,
    metrics::ShardCounters,
    model::ModelVersion,
    shard::ShardId,
    types::{InferError, InferRequest, InferResponse, InferResult, Parameters, Tensor},
};

/// Runs `jobs` as one `execute_requests` call. `rows` is a sequence
/// execution's slot per job.
pub(super) fn run_requests(
    instance: &mut dyn ModelInstance,
    states: &mut SlotStates,
    model: &Arc<ModelVersion>,
    stats: &ShardCounters,
    jobs: Vec<Job>,
    rows: Option<&[RowControl]>,
) {
    let start = Instant::now();
    let hold = Hold::default();
    let decoupled = is_decoupled(&model.config);
    let spec = model.sequence.as_ref();
    let mut requests = Vec::with_capacity(jobs.len());
    let mut slots = Vec::new();
    for (index, job) in jobs.into_iter().enumerate() {
        let row = rows.and_then(|rows| rows.iter().find(|r| r.job == Some(index)));
        let Job {
            mut request,
            reply,
            origin,
            responses,
            ..
        } = job;
        let mut sequence = None;
        let mut state_updates = None;
        if let (Some(spec), Some(row)) = (spec, row) {
            match sequence_inputs(spec, row, &request, states) {
                Ok(inputs) => request.inputs = inputs,
                Err(e) => {
                    super::host::reply(origin, reply, Err(e));
                    continue;
                }
            }
            sequence = Some(sequence_info(row));
            if !spec.states.is_empty() {
                let updates = StateUpdates::default();
                slots.push((row.slot, row.end, updates.clone()));
                state_updates = Some(updates);
            }
        }
        let bare = InferRequest {
            inputs: Vec::new(),
            ..request.clone()
        };
        let sink: Box<dyn ResponseSink> = match (decoupled, responses) {
            (true, Some(tx)) => Box::new(ChannelSink::new(model.clone(), bare, tx, reply, origin)),
            (true, None) => {
                let e = InferError::internal(format!(
                    "a request to decoupled model '{}' reached its instance without a response channel",
                    model.name
                ));
                super::host::reply(origin, reply, Err(e));
                continue;
            }
            (false, _) => Box::new(HeldSink {
                model: model.clone(),
                request: bare,
                reply: Some(reply),
                origin,
                answer: None,
                hold: hold.clone(),
            }),
        };
        requests.push(BackendRequest {
            request,
            sender: ResponseSender::new(sink),
            sequence,
            states: state_updates,
        });
    }
    let count = requests.len();
    if count == 0 {
        return;
    }
    let input_done = Instant::now();
    instance.execute_requests(requests);
    let infer_done = Instant::now();
    if let Some(spec) = spec {
        keep_states(spec, states, slots);
    }
    // A backend that reports its statistics (Triton's Python backend does,
    // within execute) has counted this execution and its rows already.
    if !instance.reports_statistics() {
        let (input, infer) = (input_done - start, infer_done - input_done);
        stats.record_execution(count, input, infer, Default::default());
        for _ in 0..count {
            stats.compute_input.record(input);
            stats.compute_infer.record(infer);
            stats.compute_output.record(Default::default());
        }
    }
    hold.release();
}

/// A sequence request's inputs as Triton gives them to a backend: its
/// own, the configured control tensors and its slot's implicit states.
pub(super) fn sequence_inputs(
    spec: &SequenceSpec,
    row: &RowControl,
    request: &InferRequest,
    states: &SlotStates,
) -> InferResult<Vec<Tensor>> {
    let own = RowControl {
        job: Some(0),
        ..row.clone()
    };
    build_inputs(spec, std::slice::from_ref(&own), &[request], states)
}

fn sequence_info(row: &RowControl) -> SequenceInfo {
    let (id, id_str) = match &row.id {
        Some(CorrelationId::Uint(v)) => (*v, None),
        Some(CorrelationId::Str(s)) => (0, Some(s.to_string())),
        None => (0, None),
    };
    SequenceInfo {
        id,
        id_str,
        start: row.start,
        end: row.end,
    }
}

/// Keeps the states each request updated for its slot's next request.
fn keep_states(
    spec: &SequenceSpec,
    states: &mut SlotStates,
    slots: Vec<(usize, bool, StateUpdates)>,
) {
    for (slot, ended, updates) in slots {
        for mut state in updates.take() {
            // Kept without the batch dimension of this one-row execution.
            if spec.batched && state.shape.first() == Some(&1) {
                state.shape.remove(0);
            }
            if let Err(e) = states.keep(spec, slot, state, ended) {
                tracing::error!("implicit state not kept: {}", e.message);
            }
        }
        if ended {
            states.forget(slot);
        }
    }
}

/// Answers of ordinary requests given while their execution runs
/// (`Some`), sent once it has been recorded; `None` after that.
#[derive(Clone)]
struct Hold(Arc<Mutex<Option<Vec<Answer>>>>);

type Answer = (ShardId, Responder, InferResult<InferResponse>);

impl Default for Hold {
    fn default() -> Self {
        Self(Arc::new(Mutex::new(Some(Vec::new()))))
    }
}

impl Hold {
    /// Holds `answer` while the execution runs; otherwise sends it.
    fn deliver(&self, answer: Answer) {
        let late = {
            let mut held = self.0.lock().unwrap_or_else(|p| p.into_inner());
            match held.as_mut() {
                Some(open) => {
                    open.push(answer);
                    None
                }
                None => Some(answer),
            }
        };
        if let Some((origin, reply, result)) = late {
            super::host::reply(origin, reply, result);
        }
    }

    fn release(&self) {
        let held = self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .unwrap_or_default();
        for (origin, reply, result) in held {
            super::host::reply(origin, reply, result);
        }
    }
}

/// An ordinary (non-decoupled) request: exactly one response, then the
/// final flag.
struct HeldSink {
    model: Arc<ModelVersion>,
    /// Without its inputs: ids and requested outputs.
    request: InferRequest,
    reply: Option<Responder>,
    origin: ShardId,
    answer: Option<InferResult<InferResponse>>,
    hold: Hold,
}

impl ResponseSink for HeldSink {
    fn send_with(
        &mut self,
        outputs: Vec<Tensor>,
        parameters: Parameters,
    ) -> Result<(), ReceiverGone> {
        if self.answer.is_some() || self.reply.is_none() {
            // Triton's rule for a non-decoupled model: one response.
            self.answer = Some(Err(InferError::internal(format!(
                "model '{}' sent more than one response to a request of a non-decoupled model",
                self.model.name
            ))));
            return Err(ReceiverGone);
        }
        self.answer = Some(
            build_response(&self.model, &self.request, outputs)
                .map(|r| InferResponse { parameters, ..r }),
        );
        Ok(())
    }

    fn is_cancelled(&self) -> bool {
        self.reply.as_ref().is_none_or(|r| r.is_canceled())
    }

    fn complete(&mut self, outcome: InferResult<()>) {
        let Some(reply) = self.reply.take() else {
            return;
        };
        let result = match (outcome, self.answer.take()) {
            (Err(e), _) => Err(e),
            (Ok(()), Some(answer)) => answer,
            (Ok(()), None) => Err(InferError::internal(format!(
                "model '{}' completed a request without sending its response",
                self.model.name
            ))),
        };
        self.hold.deliver((self.origin, reply, result));
    }
}
