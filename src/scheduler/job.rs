use std::{sync::Arc, time::Instant};

use futures::channel::oneshot;

use crate::{
    model::ModelVersion,
    shard::ShardId,
    types::{InferRequest, InferResponse, InferResult},
};

/// Completes a request; sent back to the shard that decoded it.
pub type Responder = oneshot::Sender<InferResult<InferResponse>>;

/// A validated request on its way to an instance. Owns everything it
/// needs, so it can cross to another shard.
pub struct Job {
    pub model: Arc<ModelVersion>,
    pub request: InferRequest,
    pub reply: Responder,
    /// The shard whose connection waits for the answer.
    pub origin: ShardId,
    pub received: Instant,
}
