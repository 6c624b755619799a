//! Routing a request to its model's scheduler: on this shard if it owns
//! it, else through the ring to the owner. The returned future is `Send`
//! (tonic demands it) because it touches shard state only synchronously
//! through the thread-local context, never holding it across an await.
//!
//! The request path clones no `Arc` that other shards share: the model is
//! looked up in the shard's table by borrow, and found again by its
//! scheduler key when the outcome is recorded.

use std::{
    future::Future,
    pin::{pin, Pin},
    time::{Duration, Instant},
};

use futures::{
    channel::oneshot,
    future::{select, Either},
};
use hyper::rt::Timer;
use monoio_compat::hyper::MonoioTimer;

use super::{
    batch::batch_rows,
    cache_path::{probe, Miss, Probe},
    decoupled::{ResponseTx, DECOUPLED_ON_MODEL_INFER},
    sequence::{sequence_flags, SequenceFlags},
    Job,
};
use crate::{
    config::is_decoupled,
    metrics::FailureReason,
    model::{validate_request, ModelVersion},
    scheduler::host::Dispatch,
    shard::{self, Target},
    trace::Event,
    types::{InferError, InferRequest, InferResponse, InferResult},
};

/// How long a request waits for room in a full ring before it is refused.
const RING_FULL_PATIENCE: Duration = Duration::from_millis(500);
const RING_FULL_RETRY: Duration = Duration::from_micros(50);

/// Validates `request`, queues it on its model's scheduler and waits for
/// the answer, at most the server's request timeout. Dropping the future
/// (the client went away) cancels the queued work and counts the request
/// as cancelled. A decoupled model is refused with Triton's error: its
/// responses only travel on a stream (`infer_stream`).
pub async fn infer(request: InferRequest) -> InferResult<InferResponse> {
    // `submit`'s two steps, not an await of it: its future inside this one
    // made this one 784 bytes instead of 376.
    let (mut submitted, pending) = queue(request, None)?;
    if let Some(wait) = room(pending, &mut submitted.outcome) {
        wait.await?;
    }
    let Submitted {
        answer: rx,
        mut outcome,
        timeout,
        cache_miss,
    } = submitted;
    let answer = match timeout {
        None => rx.await,
        Some(t) => match select(rx, pin!(MonoioTimer.sleep(t))).await {
            Either::Left((answer, _)) => answer,
            Either::Right(((), rx)) => {
                // Dropping the receiver marks the queued job cancelled.
                drop(rx);
                let e = timeout_error(t);
                outcome.record(Err(&e));
                return Err(e);
            }
        },
    };
    let mut result = answer.unwrap_or_else(|_| Err(scheduler_gone()));
    if let (Some(miss), Ok(response)) = (cache_miss, &result) {
        super::cache_path::store(outcome.key, miss, response);
    }
    outcome.record(result.as_ref().map(|_| ()));
    if let Ok(response) = &mut result {
        response.trace.stamp(Event::RequestEnd);
    }
    result
}

/// A request handed to its scheduler: where its answer (for a decoupled
/// model: its final flag) arrives, and its outcome still to record.
pub(super) struct Submitted {
    pub answer: oneshot::Receiver<InferResult<InferResponse>>,
    pub outcome: Outcome,
    pub timeout: Option<Duration>,
    /// A response-cache miss whose answer is to be stored.
    pub cache_miss: Option<Miss>,
}

/// Validates `request` and sends it to its model's scheduler. `responses`
/// is the channel of a decoupled request's responses: a decoupled model
/// needs one, any other model must not get one.
pub(super) async fn submit(
    request: InferRequest,
    responses: Option<ResponseTx>,
) -> InferResult<Submitted> {
    let (mut submitted, pending) = queue(request, responses)?;
    if let Some(wait) = room(pending, &mut submitted.outcome) {
        wait.await?;
    }
    Ok(submitted)
}

/// The wait for room in a ring that refused the dispatch, if it did.
/// Boxed, and `pending` consumed before any await: a job and a timer held
/// in the awaiting futures made every request's futures larger (`infer`'s
/// was 1,264 bytes, moved at each level of the call).
fn room(
    pending: Dispatch,
    outcome: &mut Outcome,
) -> Option<Pin<Box<impl Future<Output = InferResult<()>> + '_>>> {
    match pending {
        Dispatch::Queued => None,
        Dispatch::RingFull(target, job) => Some(Box::pin(wait_for_room(target, job, outcome))),
    }
}

/// `submit`'s work up to the dispatch, which a full ring may have refused
/// (then the job comes back in the `Dispatch`).
fn queue(
    mut request: InferRequest,
    responses: Option<ResponseTx>,
) -> InferResult<(Submitted, Dispatch)> {
    let received = Instant::now();
    request.trace.stamp(Event::RequestStart);
    let (tx, rx) = oneshot::channel();
    let streaming = responses.is_some();
    let (pending, target, timeout, cache_miss) = shard::with_current(|s| {
        s.with_table(|table| {
            let model = table.resolve(&request.model_name, &request.model_version)?;
            request.trace.identify(model.version, &request.id);
            let checked = check_transaction_policy(model, streaming)
                .and_then(|()| validate_request(&model.io, &model.name, &mut request))
                .and_then(|()| sequence_of(model, &request));
            // A request refused here never reached its scheduler: as in
            // Triton (whose `TRITONSERVER_ServerInferAsync` returns such
            // errors before the request counts), it is in no statistics.
            checked.map(|sequence| {
                let cache = probe(s.id, model, &request, received);
                (
                    model.scheduler_for(s.id),
                    sequence,
                    model.ensemble.clone(),
                    cache,
                )
            })
        })
        .map(|(target, sequence, ensemble, cache)| {
            // A hit skips the queue and the model (and the ring).
            let cache_miss = match cache {
                Probe::Hit(cached, version) => {
                    let _ = tx.send(Ok(cached.answer(request, &version)));
                    return (Dispatch::Queued, target, s.request_timeout, None);
                }
                Probe::Miss(miss) => Some(miss),
                Probe::Off => None,
            };
            // A decoupled request's responses flow for as long as its model
            // sends them, so the server's request timeout bounds only its
            // wait in the queue (where Triton applies request timeouts).
            // Every other request is bounded as a whole by `infer`.
            let deadline = match (&responses, s.request_timeout) {
                (Some(_), Some(t)) => Some(received + t),
                _ => None,
            };
            let job = Job {
                request,
                reply: tx,
                origin: s.id,
                received,
                deadline,
                sequence,
                responses,
            };
            // An ensemble runs here, on the receiving shard; its steps go
            // to their models' schedulers.
            let pending = match ensemble {
                Some(plan) => super::ensemble::start(plan, target.key, job),
                // A shard always has its host; were it missing, the job is
                // dropped and its answer reads "scheduler gone".
                None => super::host::dispatch(target, job).unwrap_or(Dispatch::Queued),
            };
            (pending, target, s.request_timeout, cache_miss)
        })
    })
    .ok_or_else(not_on_shard)??;
    let outcome = Outcome {
        key: target.key,
        received,
        recorded: false,
    };
    let submitted = Submitted {
        answer: rx,
        outcome,
        timeout,
        cache_miss,
    };
    Ok((submitted, pending))
}

/// Retries a dispatch refused by a full ring until it is queued, or
/// refuses the request once the ring stayed full for `RING_FULL_PATIENCE`.
async fn wait_for_room(mut target: Target, mut job: Job, outcome: &mut Outcome) -> InferResult<()> {
    let patience = outcome.received + RING_FULL_PATIENCE;
    loop {
        if Instant::now() >= patience {
            let e = InferError::unavailable(format!(
                "server overloaded: the ring to shard {} stayed full for {:?}; retry later",
                target.shard, RING_FULL_PATIENCE
            ));
            outcome.record(Err(&e));
            return Err(e);
        }
        MonoioTimer.sleep(RING_FULL_RETRY).await;
        match super::host::dispatch(target, job).ok_or_else(not_on_shard)? {
            Dispatch::RingFull(t, j) => (target, job) = (t, j),
            _ => return Ok(()),
        }
    }
}

/// A decoupled model answers only on a stream; the unary paths get
/// Triton's gRPC refusal (HTTP `/infer` words it its own way before
/// calling `infer`, see `refuse_decoupled_http`).
fn check_transaction_policy(model: &ModelVersion, streaming: bool) -> InferResult<()> {
    match (is_decoupled(&model.config), streaming) {
        (true, false) => Err(InferError::unsupported(DECOUPLED_ON_MODEL_INFER)),
        (false, true) => Err(InferError::internal(format!(
            "model '{}' is not decoupled but was sent a response channel",
            model.name
        ))),
        _ => Ok(()),
    }
}

pub(super) fn scheduler_gone() -> InferError {
    InferError::unavailable(
        "the model's scheduler stopped before answering (model unloaded or server shutting down)",
    )
}

/// A sequence model's request: batch size 1 and a correlation id, read
/// here on the receiving shard so bad requests never cross a ring.
fn sequence_of(model: &ModelVersion, request: &InferRequest) -> InferResult<Option<SequenceFlags>> {
    let Some(spec) = &model.sequence else {
        return Ok(None);
    };
    if spec.batched && batch_rows(request) > 1 {
        return Err(InferError::invalid(format!(
            "inference request to model '{}' must specify batch-size 1 due to requirements of sequence batcher",
            model.name
        )));
    }
    sequence_flags(&model.name, spec, &request.parameters).map(Some)
}

fn timeout_error(t: Duration) -> InferError {
    InferError::unavailable(format!(
        "Request timeout expired: no answer within the server's request timeout of {} ms",
        t.as_millis()
    ))
}

/// Records a request's end exactly once on the shard that received it; if
/// the request's future is dropped first, it counts as cancelled.
pub(super) struct Outcome {
    key: u64,
    received: Instant,
    recorded: bool,
}

impl Outcome {
    pub fn record(&mut self, outcome: Result<(), &InferError>) {
        self.recorded = true;
        let (key, received) = (self.key, self.received);
        shard::with_current(|s| s.with_model(key, |m| record_outcome(s.id, m, received, outcome)));
    }
}

impl Drop for Outcome {
    fn drop(&mut self) {
        if self.recorded {
            return;
        }
        let (key, received) = (self.key, self.received);
        shard::with_current(|s| {
            s.with_model(key, |m| {
                m.stats
                    .shard(s.id)
                    .record_failure(FailureReason::Canceled, received.elapsed())
            })
        });
    }
}

/// Counts a request's end on the shard that received it: success with its
/// whole duration, or a failure under Triton's reason label.
fn record_outcome(
    shard: usize,
    model: &ModelVersion,
    received: Instant,
    outcome: Result<(), &InferError>,
) {
    let counters = model.stats.shard(shard);
    match outcome {
        Ok(()) => counters.success.record(received.elapsed()),
        Err(e) => counters.record_failure(FailureReason::for_error(e), received.elapsed()),
    }
}

fn not_on_shard() -> InferError {
    InferError::internal("request handled outside a shard thread")
}
