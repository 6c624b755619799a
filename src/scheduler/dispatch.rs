//! Routing a request to an instance: on this shard if it hosts one, else
//! through the ring to the owning shard. The returned future is `Send`
//! (tonic demands it) because it touches shard state only synchronously
//! through the thread-local context, never holding it across an await.

use std::time::{Duration, Instant};

use futures::channel::oneshot;
use hyper::rt::Timer;
use monoio_compat::hyper::MonoioTimer;

use super::Job;
use crate::{
    metrics::FailureReason,
    model::{validate_request, ModelVersion},
    shard::{self, Dispatch},
    types::{InferError, InferRequest, InferResponse, InferResult},
};

/// How long a request waits for room in a full ring before it is refused.
const RING_FULL_PATIENCE: Duration = Duration::from_millis(500);
const RING_FULL_RETRY: Duration = Duration::from_micros(50);

/// Validates `request`, queues it on an instance of its model and waits
/// for the answer.
pub async fn infer(mut request: InferRequest) -> InferResult<InferResponse> {
    let received = Instant::now();
    let (tx, rx) = oneshot::channel();
    let (mut pending, model) = shard::with_current(|s| {
        let table = s.table();
        let model = table
            .resolve(&request.model_name, &request.model_version)?
            .clone();
        let checked = validate_request(&model.io, &model.name, &mut request)
            .and_then(|()| s.pick_instance(&model));
        let target = match checked {
            Ok(t) => t,
            Err(e) => {
                record_outcome(s.id, &model, received, Err(&e));
                return Err(e);
            }
        };
        let job = Job {
            model: model.clone(),
            request,
            reply: tx,
            origin: s.id,
            received,
        };
        Ok::<_, InferError>((s.dispatch(target, job), model))
    })
    .ok_or_else(not_on_shard)??;

    let deadline = received + RING_FULL_PATIENCE;
    while let Dispatch::RingFull(target, job) = pending {
        if Instant::now() >= deadline {
            let e = InferError::unavailable(format!(
                "server overloaded: the ring to shard {} stayed full for {:?}; retry later",
                target.shard, RING_FULL_PATIENCE
            ));
            shard::with_current(|s| record_outcome(s.id, &job.model, received, Err(&e)));
            return Err(e);
        }
        MonoioTimer.sleep(RING_FULL_RETRY).await;
        pending = shard::with_current(|s| s.dispatch(target, job)).ok_or_else(not_on_shard)?;
    }
    let result = rx.await.unwrap_or_else(|_| {
        Err(InferError::internal(
            "the instance executing the request went away without answering",
        ))
    });
    shard::with_current(|s| record_outcome(s.id, &model, received, result.as_ref().map(|_| ())));
    result
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
