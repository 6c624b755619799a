//! One execution of a batch on an instance, wherever it runs (inline on
//! the owner shard or on a compute worker): merge inputs, call the
//! backend, split outputs, record the execution, then send every response
//! (so a client that reads the statistics right after its answer sees its
//! execution). Each compute worker records in a counter block of its own:
//! a worker never writes a line a shard writes.

use std::time::Instant;

use super::{
    batch::{batch_rows, merge_inputs, split_outputs},
    output::build_response,
    Job,
};
use crate::{
    backend::ModelInstance,
    metrics::ShardCounters,
    model::ModelVersion,
    shard,
    types::{InferResult, Tensor},
};

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
    let merged;
    let inputs: &[Tensor] = if jobs.len() == 1 {
        &jobs[0].request.inputs
    } else {
        let refs: Vec<_> = jobs.iter().map(|j| &j.request).collect();
        merged = merge_inputs(&refs);
        &merged
    };
    let input_done = Instant::now();
    let produced = instance.execute(inputs, &requested);
    let infer_done = Instant::now();
    let per_job: InferResult<Vec<Vec<Tensor>>> = produced.and_then(|outputs| {
        if jobs.len() == 1 {
            Ok(vec![outputs])
        } else {
            split_outputs(outputs, &rows)
        }
    });
    let results: Vec<InferResult<_>> = match per_job {
        Ok(outs) => jobs
            .iter()
            .zip(outs)
            .map(|(j, o)| build_response(model, &j.request, o))
            .collect(),
        Err(e) => jobs.iter().map(|_| Err(e.clone())).collect(),
    };
    let output_done = Instant::now();
    let (input, infer, output) = (
        input_done - start,
        infer_done - input_done,
        output_done - infer_done,
    );
    let total_rows = rows.iter().sum::<i64>().max(0) as usize;
    stats.record_execution(total_rows, input, infer, output);
    for _ in 0..jobs.len() {
        stats.compute_input.record(input);
        stats.compute_infer.record(infer);
        stats.compute_output.record(output);
    }
    for (job, result) in jobs.into_iter().zip(results) {
        shard::reply(job.origin, job.reply, result);
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
