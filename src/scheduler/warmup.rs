//! Running a model's warmup samples (`model_warmup`) on one instance
//! before the version is published, as Triton's
//! `TritonModelInstance::WarmUp` does: each sample's `batch_size` requests
//! go to the instance together as one execution, `count` times (at least
//! once), and the first sample whose execution answers an error ends the
//! warmup with that error. The executions take the same path as served
//! batches (`execute`, `per_request`, `decoupled`), so they count in the
//! model's statistics as Triton counts them: executions, inferences,
//! successes (with no queue time worth the name) and compute phases.
//!
//! It runs on the control plane, which called it while loading, before
//! the instance is handed to its owner shard or compute worker: nothing
//! else uses the instance yet, and no shard waits on it.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use futures::{
    channel::{mpsc, oneshot},
    StreamExt,
};

use super::{execute::run_batch, per_request::run_requests, sequence::SlotStates, Job};
use crate::{
    backend::ModelInstance,
    config::is_decoupled,
    metrics::{FailureReason, ShardCounters},
    model::ModelVersion,
    types::InferRequest,
};

/// Responses a decoupled warmup request may have unread before its
/// backend's `send` blocks (a reader drains them while it runs).
const WARMUP_RESPONSES: usize = 16;

/// One `model_warmup` entry, ready to run.
#[derive(Debug, Clone)]
pub struct WarmupSample {
    pub name: String,
    /// `batch_size` identical requests of one batch row each.
    pub requests: Vec<InferRequest>,
    /// Executions of the sample (Triton runs a count of 0 once).
    pub count: u32,
}

/// Runs every sample on `instance`, recording in the model's counter
/// block `stats_block` (the instance's own). The error names the sample
/// and what its execution answered, in Triton's words.
pub fn warm_up(
    instance: &mut dyn ModelInstance,
    model: &Arc<ModelVersion>,
    stats_block: usize,
    samples: &[WarmupSample],
) -> anyhow::Result<()> {
    let stats = model.stats.shard(stats_block);
    let mut states = SlotStates::default();
    for sample in samples {
        // A model without batching takes no batch of requests: each of
        // them is an execution of its own.
        let executions: Vec<&[InferRequest]> = if model.config.max_batch_size > 0 {
            vec![&sample.requests[..]]
        } else {
            sample.requests.chunks(1).collect()
        };
        for iteration in 1..=sample.count.max(1) {
            tracing::debug!(model = %model.name, version = model.version, sample = %sample.name, iteration, "running warmup sample");
            for requests in &executions {
                let errors = execute_once(instance, model, stats, &mut states, requests);
                if !errors.is_empty() {
                    let listed: String = errors.iter().map(|e| format!("{e}; ")).collect();
                    anyhow::bail!("failed to run warmup sample '{}': {listed}", sample.name);
                }
            }
        }
    }
    Ok(())
}

/// One execution of `requests`; the error message of every request that
/// was answered with one.
fn execute_once(
    instance: &mut dyn ModelInstance,
    model: &Arc<ModelVersion>,
    stats: &ShardCounters,
    states: &mut SlotStates,
    requests: &[InferRequest],
) -> Vec<String> {
    let received = Instant::now();
    let decoupled = is_decoupled(&model.config);
    let mut answers = Vec::with_capacity(requests.len());
    let mut streams = Vec::new();
    let jobs: Vec<Job> = requests
        .iter()
        .map(|request| {
            let (reply, answer) = oneshot::channel();
            answers.push(answer);
            let responses = decoupled.then(|| {
                let (tx, rx) = mpsc::channel(WARMUP_RESPONSES);
                streams.push(rx);
                tx
            });
            Job {
                request: request.clone(),
                reply,
                // Off a shard, answers complete their oneshot directly.
                origin: 0,
                received,
                deadline: None,
                sequence: None,
                responses,
            }
        })
        .collect();
    std::thread::scope(|scope| {
        // A decoupled backend blocks in `send` once a channel is full (and
        // may send after its call returned): read every stream meanwhile;
        // warmup keeps none of it.
        if !streams.is_empty() {
            scope.spawn(move || {
                futures::executor::block_on(
                    futures::stream::select_all(streams).for_each(|_| async {}),
                )
            });
        }
        if instance.takes_requests() {
            run_requests(instance, states, model, stats, jobs, None);
        } else if decoupled {
            super::decoupled::run_decoupled(instance, states, model, stats, jobs, None);
        } else {
            run_batch(instance, model, stats, jobs);
        }
    });
    let mut errors = Vec::new();
    for answer in answers {
        // A backend may answer later from a thread of its own (the C API's
        // backends): wait for it, as Triton's warmup does.
        match futures::executor::block_on(answer) {
            Ok(Ok(_)) => {
                stats.queue.record(Duration::ZERO);
                stats.success.record(received.elapsed());
            }
            Ok(Err(e)) => {
                stats.record_failure(FailureReason::for_error(&e), received.elapsed());
                errors.push(e.message);
            }
            Err(_) => {
                stats.record_failure(FailureReason::Other, received.elapsed());
                errors.push("the instance dropped the warmup request unanswered".into());
            }
        }
    }
    errors
}
