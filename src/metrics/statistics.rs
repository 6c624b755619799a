//! The statistics extension: `ModelStatistics` messages (gRPC) and their
//! JSON form (`GET /v2/models[/{m}[/versions/{v}]]/stats`), built from
//! the summed per-shard counters.

use serde_json::{json, Value};

use super::counters::{DurationTotal, StatsSnapshot};
use crate::{
    model::{ModelState, ModelTable, ModelVersion},
    proto::inference::{InferBatchStatistics, InferStatistics, ModelStatistics, StatisticDuration},
    types::InferResult,
};

fn duration(d: DurationTotal) -> Option<StatisticDuration> {
    Some(StatisticDuration {
        count: d.count,
        ns: d.ns,
    })
}

pub fn model_statistics(m: &ModelVersion) -> ModelStatistics {
    let s: StatsSnapshot = m.stats.snapshot();
    ModelStatistics {
        name: m.name.clone(),
        version: m.version_str.clone(),
        last_inference: s.last_inference_ms,
        inference_count: s.inference_count,
        execution_count: s.execution_count,
        inference_stats: Some(InferStatistics {
            success: duration(s.success),
            fail: duration(s.fail),
            queue: duration(s.queue),
            compute_input: duration(s.compute_input),
            compute_infer: duration(s.compute_infer),
            compute_output: duration(s.compute_output),
            cache_hit: duration(s.cache_hit),
            cache_miss: duration(s.cache_miss),
        }),
        batch_stats: s
            .batch_sizes()
            .filter(|(_, b)| b.compute_infer.count > 0)
            .map(|(size, b)| InferBatchStatistics {
                batch_size: size,
                compute_input: duration(b.compute_input),
                compute_infer: duration(b.compute_infer),
                compute_output: duration(b.compute_output),
            })
            .collect(),
        memory_usage: Vec::new(),
        response_stats: Default::default(),
    }
}

/// Statistics of the ready versions of `name` (every model when empty),
/// or of one version.
pub fn collect(table: &ModelTable, name: &str, version: &str) -> InferResult<Vec<ModelStatistics>> {
    if !name.is_empty() && !version.is_empty() {
        return Ok(vec![model_statistics(table.resolve(name, version)?)]);
    }
    if !name.is_empty() && !table.models.contains_key(name) {
        return Err(table.unknown(name));
    }
    let mut out = Vec::new();
    for (model_name, entry) in &table.models {
        if !name.is_empty() && model_name != name {
            continue;
        }
        for v in entry.versions.values() {
            if let (ModelState::Ready, Some(loaded)) = (&v.state, &v.loaded) {
                out.push(model_statistics(loaded));
            }
        }
    }
    Ok(out)
}

fn duration_json(d: &Option<StatisticDuration>) -> Value {
    let d = d.unwrap_or_default();
    json!({"count": d.count, "ns": d.ns})
}

/// Triton's JSON form of a statistics response.
pub fn to_json(stats: &[ModelStatistics]) -> Value {
    let models: Vec<Value> = stats
        .iter()
        .map(|m| {
            let i = m.inference_stats.unwrap_or_default();
            json!({
                "name": m.name,
                "version": m.version,
                "last_inference": m.last_inference,
                "inference_count": m.inference_count,
                "execution_count": m.execution_count,
                "inference_stats": {
                    "success": duration_json(&i.success),
                    "fail": duration_json(&i.fail),
                    "queue": duration_json(&i.queue),
                    "compute_input": duration_json(&i.compute_input),
                    "compute_infer": duration_json(&i.compute_infer),
                    "compute_output": duration_json(&i.compute_output),
                    "cache_hit": duration_json(&i.cache_hit),
                    "cache_miss": duration_json(&i.cache_miss),
                },
                "batch_stats": m.batch_stats.iter().map(|b| json!({
                    "batch_size": b.batch_size,
                    "compute_input": duration_json(&b.compute_input),
                    "compute_infer": duration_json(&b.compute_infer),
                    "compute_output": duration_json(&b.compute_output),
                })).collect::<Vec<_>>(),
                "memory_usage": [],
                "response_stats": {},
            })
        })
        .collect();
    json!({ "model_stats": models })
}
