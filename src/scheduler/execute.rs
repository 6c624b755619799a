//! One execution of a batch on an instance, wherever it runs (inline on
//! the owner shard or on a compute worker): merge inputs, call the
//! backend, split outputs, record the execution, then send every response
//! (so a client that reads the statistics right after its answer sees its
//! execution). Each compute worker records in a counter block of its own:
//! a worker never writes a line a shard writes.

use std::{sync::Arc, time::Instant};

use super::{
    batch::{batch_rows, merge_inputs, split_outputs},
    decoupled::run_decoupled,
    output::build_response,
    per_request::run_requests,
    ragged,
    sequence::{absorb_states, build_inputs, RowControl, SequenceSpec, SlotStates},
    Job,
};
use crate::{
    backend::ModelInstance,
    config::is_decoupled,
    metrics::ShardCounters,
    model::ModelVersion,
    trace::{instants_ns, Event},
    types::{ComputeTimes, InferError, InferRequest, InferResult, Tensor},
};

/// One execution's worth of requests. `rows` is set for a sequence
/// model: one entry per batch row (slot), padding rows included.
pub struct Batch {
    pub jobs: Vec<Job>,
    pub rows: Option<Vec<RowControl>>,
}

impl From<Vec<Job>> for Batch {
    fn from(jobs: Vec<Job>) -> Self {
        Self { jobs, rows: None }
    }
}

/// An instance together with what it keeps between executions: the
/// implicit states of its sequence slots.
pub struct Runner {
    instance: Box<dyn ModelInstance>,
    states: SlotStates,
}

impl Runner {
    pub fn new(instance: Box<dyn ModelInstance>, model: &ModelVersion) -> Self {
        let states = model
            .sequence
            .as_ref()
            .map(SlotStates::new)
            .unwrap_or_default();
        Self { instance, states }
    }

    /// Runs `batch` as one execution, records it in `stats` and answers
    /// each of its requests.
    pub fn run(&mut self, model: &Arc<ModelVersion>, stats: &ShardCounters, batch: Batch) {
        if self.instance.takes_requests() {
            return run_requests(
                self.instance.as_mut(),
                &mut self.states,
                model,
                stats,
                batch.jobs,
                batch.rows.as_deref(),
            );
        }
        if is_decoupled(&model.config) {
            return run_decoupled(
                self.instance.as_mut(),
                &self.states,
                model,
                stats,
                batch.jobs,
                batch.rows.as_deref(),
            );
        }
        match (batch.rows, &model.sequence) {
            (Some(rows), Some(spec)) => run_sequence_batch(
                self.instance.as_mut(),
                &mut self.states,
                spec,
                model,
                stats,
                batch.jobs,
                &rows,
            ),
            _ => run_batch(self.instance.as_mut(), model, stats, batch.jobs),
        }
    }
}

/// Runs `jobs` as one execution, records it in `stats` and answers each
/// of them.
pub fn run_batch(
    instance: &mut dyn ModelInstance,
    model: &ModelVersion,
    stats: &ShardCounters,
    jobs: Vec<Job>,
) {
    let start = Instant::now();
    let rows: Vec<i64> = jobs.iter().map(|j| batch_rows(&j.request)).collect();
    let requested = requested_outputs(&jobs);
    // Ragged inputs, batch inputs and batch outputs change what the model
    // is given and how its outputs go back (`ragged`).
    let ragged_io = ragged::applies(&model.config);
    // A lone ordinary request needs no list (no allocation on that path).
    let refs: Vec<&InferRequest> = if ragged_io || jobs.len() > 1 {
        jobs.iter().map(|j| &j.request).collect()
    } else {
        Vec::new()
    };
    let merged: InferResult<Vec<Tensor>>;
    let inputs: InferResult<&[Tensor]> = if ragged_io {
        merged = ragged::merge(&model.config, &refs);
        merged.as_deref().map_err(Clone::clone)
    } else if jobs.len() == 1 {
        Ok(&jobs[0].request.inputs)
    } else {
        merged = Ok(merge_inputs(&refs));
        merged.as_deref().map_err(Clone::clone)
    };
    let input_done = Instant::now();
    let produced = inputs.and_then(|inputs| instance.execute(inputs, &requested));
    let infer_done = Instant::now();
    let per_job: InferResult<Vec<Vec<Tensor>>> = produced.and_then(|outputs| {
        if ragged_io {
            ragged::split(&model.config, outputs, &refs)
        } else if jobs.len() == 1 {
            Ok(vec![outputs])
        } else {
            split_outputs(outputs, &rows)
        }
    });
    drop(refs);
    let total_rows = rows.iter().sum::<i64>().max(0) as usize;
    finish(
        model,
        stats,
        jobs,
        per_job,
        total_rows,
        [start, input_done, infer_done],
    );
}

/// A sequence execution: every slot row with its control and state
/// tensors; state outputs are kept for each slot's next request.
fn run_sequence_batch(
    instance: &mut dyn ModelInstance,
    states: &mut SlotStates,
    spec: &SequenceSpec,
    model: &ModelVersion,
    stats: &ShardCounters,
    jobs: Vec<Job>,
    rows: &[RowControl],
) {
    let start = Instant::now();
    let requests: Vec<&InferRequest> = jobs.iter().map(|j| &j.request).collect();
    let mut requested = requested_outputs(&jobs);
    if !spec.states.is_empty() {
        if requested.is_empty() {
            requested = model.io.outputs.iter().map(|o| o.name.as_str()).collect();
        }
        for s in &spec.states {
            if !requested.contains(&s.output.as_str()) {
                requested.push(&s.output);
            }
        }
    }
    let inputs = build_inputs(spec, rows, &requests, states);
    let input_done = Instant::now();
    let produced = inputs.and_then(|inputs| instance.execute(&inputs, &requested));
    let infer_done = Instant::now();
    let per_job = produced.and_then(|outputs| {
        absorb_states(spec, rows, &outputs, states)?;
        let per_row = if spec.batched {
            split_outputs(outputs, &vec![1; rows.len()])?
        } else {
            vec![outputs]
        };
        let mut per_job: Vec<Option<Vec<Tensor>>> = vec![None; jobs.len()];
        for (row, outputs) in rows.iter().zip(per_row) {
            if let Some(slot) = row.job.and_then(|j| per_job.get_mut(j)) {
                *slot = Some(outputs);
            }
        }
        per_job
            .into_iter()
            .map(|o| {
                o.ok_or_else(|| {
                    InferError::internal("a sequence request had no row in its execution")
                })
            })
            .collect::<InferResult<Vec<_>>>()
    });
    let total_rows = jobs.len();
    finish(
        model,
        stats,
        jobs,
        per_job,
        total_rows,
        [start, input_done, infer_done],
    );
}

/// Builds the responses, records the execution, then answers.
fn finish(
    model: &ModelVersion,
    stats: &ShardCounters,
    mut jobs: Vec<Job>,
    per_job: InferResult<Vec<Vec<Tensor>>>,
    total_rows: usize,
    [start, input_done, infer_done]: [Instant; 3],
) {
    let mut results: Vec<InferResult<_>> = match per_job {
        Ok(outs) => jobs
            .iter()
            .zip(outs)
            .map(|(j, o)| build_response(model, &j.request, o))
            .collect(),
        Err(e) => jobs.iter().map(|_| Err(e.clone())).collect(),
    };
    let output_done = Instant::now();
    stamp_compute(&mut jobs, [start, input_done, infer_done, output_done]);
    let (input, infer, output) = (
        input_done - start,
        infer_done - input_done,
        output_done - infer_done,
    );
    // Every request of the batch took the whole execution, as Triton counts
    // it; an ensemble adds these to its own compute statistics.
    let compute = ComputeTimes {
        input,
        infer,
        output,
    };
    for response in results.iter_mut().flatten() {
        response.compute = compute;
    }
    stats.record_execution(total_rows, input, infer, output);
    for _ in 0..jobs.len() {
        stats.compute_input.record(input);
        stats.compute_infer.record(infer);
        stats.compute_output.record(output);
    }
    for (mut job, mut result) in jobs.into_iter().zip(results) {
        if let Ok(response) = &mut result {
            response.trace = job.request.trace.take();
        }
        super::host::reply(job.origin, job.reply, result);
    }
}

/// Gives each traced request of the batch the execution's timestamps
/// (Triton stamps every request of a batch with its batch's).
fn stamp_compute(jobs: &mut [Job], at: [Instant; 4]) {
    if !jobs.iter().any(|j| j.request.trace.is_traced()) {
        return;
    }
    let events = [
        Event::ComputeStart,
        Event::ComputeInputEnd,
        Event::ComputeOutputStart,
        Event::ComputeEnd,
    ];
    let ns = instants_ns(at);
    for job in jobs {
        for (event, ns) in events.iter().zip(ns) {
            job.request.trace.stamp_at(*event, ns);
        }
    }
}

/// Outputs to produce for a batch: the union of what its requests asked
/// for, or all (empty) if any request wants all.
fn requested_outputs(jobs: &[Job]) -> Vec<&str> {
    if jobs.iter().any(|j| j.request.outputs.is_empty()) {
        return Vec::new();
    }
    let mut names: Vec<&str> = Vec::new();
    for j in jobs {
        for o in &j.request.outputs {
            if !names.contains(&o.name.as_str()) {
                names.push(&o.name);
            }
        }
    }
    names
}
