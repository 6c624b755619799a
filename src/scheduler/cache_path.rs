//! The response cache on the request path, where Triton's dynamic batch
//! scheduler puts it (before the queue), but on the shard that received
//! the request: a hit never crosses a ring or reaches the owner shard's
//! scheduler, and an ensemble (run from the receiving shard too) is looked
//! up whole before any of its steps.
//!
//! Statistics as Triton 2.51 keeps them: a hit counts as a success with its
//! queue time (up to the lookup) and in `cache_hit` (the lookup), never in
//! execution or inference counts; a stored miss counts in `cache_miss` (the
//! lookup plus the insert), a response a concurrent identical request
//! stored first counts in neither.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use super::response_cache::{CacheKey, CachedResponse, Inserted};
use crate::{
    model::ModelVersion,
    shard,
    types::{InferRequest, InferResponse},
};

/// What the lookup found.
pub(super) enum Probe {
    /// The model does not use the cache.
    Off,
    /// The cached answer and the version string it answers for.
    Hit(Arc<CachedResponse>, String),
    /// Not cached: the key and the lookup's time, to store the answer.
    Miss(Miss),
}

pub(super) struct Miss {
    key: CacheKey,
    lookup: Duration,
}

/// Looks `request` up in its model's cache; a hit is counted here, on
/// shard `shard`'s statistics block.
pub(super) fn probe(
    shard: usize,
    model: &ModelVersion,
    request: &InferRequest,
    received: Instant,
) -> Probe {
    let Some(cache) = &model.response_cache else {
        return Probe::Off;
    };
    let start = Instant::now();
    let key = cache.key(&model.name, model.version, request);
    match cache.lookup(&key) {
        Some(hit) => {
            let counters = model.stats.shard(shard);
            counters
                .queue
                .record(start.saturating_duration_since(received));
            counters.cache_hit.record(start.elapsed());
            Probe::Hit(hit, model.version_str.clone())
        }
        None => Probe::Miss(Miss {
            key,
            lookup: start.elapsed(),
        }),
    }
}

/// Stores the answer to a missed request (scheduler key `model_key`) and
/// counts the miss on this shard.
pub(super) fn store(model_key: u64, miss: Miss, response: &InferResponse) {
    shard::with_current(|s| {
        s.with_model(model_key, |m| {
            let Some(cache) = &m.response_cache else {
                return;
            };
            let start = Instant::now();
            let inserted = cache.insert(miss.key, response);
            if inserted == Inserted::AlreadyExists {
                return;
            }
            m.stats
                .shard(s.id)
                .cache_miss
                .record(miss.lookup + start.elapsed());
            if let Inserted::TooLarge { bytes, limit } = inserted {
                tracing::error!(
                    model = %m.name,
                    version = m.version,
                    bytes,
                    limit,
                    "Failed to insert key into response cache: the response needs more bytes than the cache (or its segment) holds"
                );
            }
        })
    });
}
