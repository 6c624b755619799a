use crate::{
    scheduler::{Job, Responder},
    types::{InferResponse, InferResult},
};

/// What crosses the ring from one shard to another.
pub enum ShardMsg {
    /// Queue `job` on the receiving shard's scheduler `scheduler`.
    Infer { scheduler: u64, job: Job },
    /// Complete a request on the shard that decoded it.
    Reply {
        reply: Responder,
        result: InferResult<InferResponse>,
    },
}
