use std::time::Instant;

use futures::channel::oneshot;

use super::{decoupled::ResponseTx, sequence::SequenceFlags};
use crate::{
    shard::ShardId,
    types::{InferRequest, InferResponse, InferResult},
};

/// Completes a request; sent back to the shard that decoded it.
pub type Responder = oneshot::Sender<InferResult<InferResponse>>;

/// A validated request on its way to its model's scheduler. Owns
/// everything it needs, so it can cross to another shard; it holds no
/// shared handle whose reference count every shard would write.
pub struct Job {
    pub request: InferRequest,
    pub reply: Responder,
    /// The shard whose connection waits for the answer.
    pub origin: ShardId,
    pub received: Instant,
    /// Leave the queue by then or be answered "Request timeout expired".
    pub deadline: Option<Instant>,
    /// For a sequence model: the request's correlation id and flags,
    /// checked on the shard that received it.
    pub sequence: Option<SequenceFlags>,
    /// For a decoupled model: where its responses go (the final flag or
    /// error still goes through `reply`). `None` for every other model.
    pub responses: Option<ResponseTx>,
}

impl Job {
    /// The client stopped waiting (connection closed, stream reset, or the
    /// server-wide request timeout fired): no work should be spent on it.
    pub fn is_cancelled(&self) -> bool {
        self.reply.is_canceled()
    }
}
