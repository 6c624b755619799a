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
    model::validate_request,
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
    let mut pending = shard::with_current(|s| {
        let table = s.table();
        let model = table.resolve(&request.model_name, &request.model_version)?.clone();
        validate_request(&model.io, &model.name, &mut request)?;
        let target = s.pick_instance(&model)?;
        let job = Job {
            model,
            request,
            reply: tx,
            origin: s.id,
            received,
        };
        Ok::<_, InferError>(s.dispatch(target, job))
    })
    .ok_or_else(not_on_shard)??;

    let deadline = received + RING_FULL_PATIENCE;
    while let Dispatch::RingFull(target, job) = pending {
        if Instant::now() >= deadline {
            return Err(InferError::unavailable(format!(
                "server overloaded: the ring to shard {} stayed full for {:?}; retry later",
                target.shard, RING_FULL_PATIENCE
            )));
        }
        MonoioTimer.sleep(RING_FULL_RETRY).await;
        pending = shard::with_current(|s| s.dispatch(target, job)).ok_or_else(not_on_shard)?;
    }
    rx.await.map_err(|_| {
        InferError::internal("the instance executing the request went away without answering")
    })?
}

fn not_on_shard() -> InferError {
    InferError::internal("request handled outside a shard thread")
}
