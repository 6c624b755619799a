//! The execution side of decoupled models: each request's response
//! channel, and the [`ChannelSink`] behind the `ResponseSender` an instance
//! answers through (see the module above for the whole path).

use std::{sync::Arc, time::Instant};

use futures::{channel::mpsc, SinkExt};

use crate::{
    backend::{ModelInstance, ReceiverGone, ResponseSender, ResponseSink},
    metrics::ShardCounters,
    model::ModelVersion,
    scheduler::{
        output::build_response,
        per_request::sequence_inputs,
        sequence::{RowControl, SlotStates},
        Job, Responder,
    },
    shard::ShardId,
    types::{InferError, InferRequest, InferResponse, InferResult, Parameters, Tensor},
};

/// The sending half of a decoupled request's response channel.
pub type ResponseTx = mpsc::Sender<InferResponse>;

/// Runs each job of a decoupled model's batch as its own
/// `execute_decoupled` call (the backend answers per request anyway) and
/// records one execution per call. `rows` is a sequence execution's slot
/// per job: the request then gets its control tensors, as Triton gives a
/// stateful model. Implicit state is refused: it is taken from an
/// execution's outputs, which a decoupled model streams to its client.
pub(in crate::scheduler) fn run_decoupled(
    instance: &mut dyn ModelInstance,
    states: &SlotStates,
    model: &Arc<ModelVersion>,
    stats: &ShardCounters,
    jobs: Vec<Job>,
    rows: Option<&[RowControl]>,
) {
    for (index, job) in jobs.into_iter().enumerate() {
        if job.is_cancelled() {
            continue;
        }
        let Job {
            mut request,
            reply,
            origin,
            responses,
            ..
        } = job;
        let row = rows.and_then(|rows| rows.iter().find(|r| r.job == Some(index)));
        if let (Some(spec), Some(row)) = (&model.sequence, row) {
            let inputs = if spec.states.is_empty() {
                sequence_inputs(spec, row, &request, states)
            } else {
                Err(InferError::unsupported(format!(
                    "model '{}': implicit state (sequence_batching state) is not supported for a decoupled model of a built-in backend",
                    model.name
                )))
            };
            match inputs {
                Ok(inputs) => request.inputs = inputs,
                Err(e) => {
                    crate::scheduler::host::reply(origin, reply, Err(e));
                    continue;
                }
            }
        }
        let Some(tx) = responses else {
            let e = InferError::internal(format!(
                "a request to decoupled model '{}' reached its instance without a response channel",
                model.name
            ));
            crate::scheduler::host::reply(origin, reply, Err(e));
            continue;
        };
        let start = Instant::now();
        let inputs = std::mem::take(&mut request.inputs);
        let requested: Vec<String> = request.outputs.iter().map(|o| o.name.clone()).collect();
        let requested: Vec<&str> = requested.iter().map(String::as_str).collect();
        let sink = ChannelSink::new(model.clone(), request, tx, reply, origin);
        instance.execute_decoupled(&inputs, &requested, ResponseSender::new(Box::new(sink)));
        let infer = start.elapsed();
        stats.record_execution(1, Default::default(), infer, Default::default());
        stats.compute_input.record(Default::default());
        stats.compute_infer.record(infer);
        stats.compute_output.record(Default::default());
    }
}

/// Delivers a decoupled request's responses into its channel and its end
/// through its `reply`.
pub(in crate::scheduler) struct ChannelSink {
    model: Arc<ModelVersion>,
    /// The request without its inputs: ids and requested outputs.
    request: InferRequest,
    tx: Option<ResponseTx>,
    reply: Option<Responder>,
    origin: ShardId,
    /// A response that could not be built ends the request with this.
    failed: Option<InferError>,
}

impl ChannelSink {
    /// `request` without its inputs (ids and requested outputs).
    pub(in crate::scheduler) fn new(
        model: Arc<ModelVersion>,
        request: InferRequest,
        tx: ResponseTx,
        reply: Responder,
        origin: ShardId,
    ) -> Self {
        Self {
            model,
            request,
            tx: Some(tx),
            reply: Some(reply),
            origin,
            failed: None,
        }
    }
}

impl ResponseSink for ChannelSink {
    fn send_with(
        &mut self,
        outputs: Vec<Tensor>,
        parameters: Parameters,
    ) -> Result<(), ReceiverGone> {
        let Some(tx) = &mut self.tx else {
            return Err(ReceiverGone);
        };
        let response = match build_response(&self.model, &self.request, outputs) {
            Ok(r) => InferResponse { parameters, ..r },
            Err(e) => {
                self.failed = Some(e);
                self.tx = None;
                return Err(ReceiverGone);
            }
        };
        // Off the shards (see `ResponseSink::send`): waiting here is the
        // back-pressure a slow client puts on its model.
        if futures::executor::block_on(tx.send(response)).is_err() {
            self.tx = None;
            return Err(ReceiverGone);
        }
        Ok(())
    }

    fn is_cancelled(&self) -> bool {
        self.tx.as_ref().is_none_or(|tx| tx.is_closed())
            || self.reply.as_ref().is_none_or(|r| r.is_canceled())
    }

    fn complete(&mut self, outcome: InferResult<()>) {
        // Closing the channel first: the receiver reads every response
        // before the final flag.
        self.tx = None;
        let Some(reply) = self.reply.take() else {
            return;
        };
        let result = match (self.failed.take(), outcome) {
            (Some(e), _) | (None, Err(e)) => Err(e),
            (None, Ok(())) => Ok(InferResponse {
                model_name: self.model.name.clone(),
                model_version: self.model.version_str.clone(),
                id: self.request.id.clone(),
                ..Default::default()
            }),
        };
        crate::scheduler::host::reply(self.origin, reply, result);
    }
}
