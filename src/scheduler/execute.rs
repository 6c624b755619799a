//! One execution of a batch on an instance, wherever it runs (inline on
//! the owner shard or on a compute worker): merge inputs, call the
//! backend, split outputs, record the execution, then send every response
//! (so a client that reads the statistics right after its answer sees its
//! execution). Each compute worker records in a counter block of its own:
//! a worker never writes a line a shard writes.

use std::time::{Duration, Instant};

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

/// What one execution cost, for the statistics.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExecReport {
    pub rows: usize,
    pub requests: usize,
    pub input: Duration,
    pub infer: Duration,
    pub output: Duration,
}

/// Runs `jobs` as one execution, records it in `stats` and answers each
/// of them.
pub fn run_batch(
    instance: &mut dyn ModelInstance,
    model: &ModelVersion,
    stats: &ShardCounters,
    jobs: Vec<Job>,
) -> ExecReport {
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
    let report = ExecReport {
        rows: rows.iter().sum::<i64>().max(0) as usize,
        requests: jobs.len(),
        input: input_done - start,
        infer: infer_done - input_done,
        output: output_done - infer_done,
    };
    stats.record_execution(report.rows, report.input, report.infer, report.output);
    for _ in 0..report.requests {
        stats.compute_input.record(report.input);
        stats.compute_infer.record(report.infer);
        stats.compute_output.record(report.output);
    }
    for (job, result) in jobs.into_iter().zip(results) {
        shard::reply(job.origin, job.reply, result);
    }
    report
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
