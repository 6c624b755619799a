//! The data flow of an `ensemble_scheduling` block on its own, before any
//! composing model is looked at: Triton's `ValidateEnsembleSchedulingConfig`
//! (every step complete, each tensor produced once, every ensemble input
//! used, every ensemble output written, no dangling tensor), with Triton's
//! messages. A cycle shows up as an output that is never written; the
//! message then says so.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::bail;

use crate::proto::inference::{
    model_config::SchedulingChoice, model_ensembling::Step, ModelConfig,
};

/// The steps of an ensemble config; an error if it has none.
pub fn steps(config: &ModelConfig) -> anyhow::Result<&[Step]> {
    match &config.scheduling_choice {
        Some(SchedulingChoice::EnsembleScheduling(e)) if !e.step.is_empty() => Ok(&e.step),
        _ => bail!("must specify 'step' for ensemble '{}'", config.name),
    }
}

/// A step's map sorted by key: prost gives a `HashMap`, and errors and
/// plans must not depend on its iteration order.
pub fn sorted(map: &std::collections::HashMap<String, String>) -> Vec<(&str, &str)> {
    let mut pairs: Vec<_> = map.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    pairs.sort_unstable();
    pairs
}

/// Checks the ensemble's own configuration (Triton's order and phrasing).
pub fn validate(config: &ModelConfig) -> anyhow::Result<()> {
    let name = &config.name;
    if !config.instance_group.is_empty() {
        bail!("instance group should not be specified for ensemble '{name}'");
    }
    if config.optimization.is_some() {
        bail!("optimization should not be specified for ensemble '{name}'");
    }
    if !config.model_warmup.is_empty() {
        bail!("model_warmup can not be specified for ensemble '{name}'");
    }
    let steps = steps(config)?;

    // Which step writes each ensemble tensor.
    let mut producer: BTreeMap<&str, usize> = BTreeMap::new();
    for (index, step) in steps.iter().enumerate() {
        for (field, empty) in [
            ("model_name", step.model_name.is_empty()),
            ("input_map", step.input_map.is_empty()),
            ("output_map", step.output_map.is_empty()),
        ] {
            if empty {
                bail!("must specify '{field}' in step {index} of ensemble '{name}'");
            }
        }
        for (_, tensor) in sorted(&step.output_map) {
            if producer.insert(tensor, index).is_some() {
                bail!(
                    "ensemble tensor '{tensor}' can appear in an output map only once for ensemble '{name}' step {index}"
                );
            }
        }
    }
    let consumed: BTreeSet<&str> = steps
        .iter()
        .flat_map(|s| s.input_map.values().map(String::as_str))
        .collect();
    for input in &config.input {
        if !consumed.contains(input.name.as_str()) {
            bail!(
                "ensemble input '{}' for ensemble '{name}' is not used",
                input.name
            );
        }
    }

    // Tensors that can exist: the ensemble's inputs, then the outputs of
    // every step whose inputs all can (a fixed point; steps in a cycle or
    // fed by a tensor nobody writes never get there).
    let mut ready: BTreeSet<&str> = config.input.iter().map(|i| i.name.as_str()).collect();
    let mut ran = vec![false; steps.len()];
    loop {
        let mut progress = false;
        for (index, step) in steps.iter().enumerate() {
            if !ran[index] && step.input_map.values().all(|t| ready.contains(t.as_str())) {
                ran[index] = true;
                progress = true;
                ready.extend(step.output_map.values().map(String::as_str));
            }
        }
        if !progress {
            break;
        }
    }

    for output in &config.output {
        let out = output.name.as_str();
        if !producer.contains_key(out) && !consumed.contains(out) {
            bail!("ensemble output '{out}' for ensemble '{name}' is not used");
        }
        if !ready.contains(out) {
            bail!(
                "output '{out}' for ensemble '{name}' is not written{}",
                why_not_written(out, steps, &producer, &ready)
            );
        }
    }
    let outputs: BTreeSet<&str> = config.output.iter().map(|o| o.name.as_str()).collect();
    for tensor in producer.keys().chain(consumed.iter()) {
        if outputs.contains(tensor) {
            continue;
        }
        if !ready.contains(tensor) || !consumed.contains(tensor) {
            bail!("ensemble tensor '{tensor}' is unused in ensemble '{name}'");
        }
    }
    Ok(())
}

/// Walks back from an unwritten tensor through its producers' missing
/// inputs to the source of the problem: a tensor nobody writes (Triton's
/// "is not connected") or a cycle of steps.
fn why_not_written(
    tensor: &str,
    steps: &[Step],
    producer: &BTreeMap<&str, usize>,
    ready: &BTreeSet<&str>,
) -> String {
    let mut seen = BTreeSet::from([tensor]);
    let mut current = tensor;
    loop {
        let Some(&step) = producer.get(current) else {
            return if current == tensor {
                String::new()
            } else {
                format!(": at least one of its depending tensors, '{current}', is not connected")
            };
        };
        let missing = sorted(&steps[step].input_map)
            .into_iter()
            .map(|(_, t)| t)
            .find(|t| !ready.contains(t));
        let Some(next) = missing else {
            return String::new();
        };
        if !seen.insert(next) {
            return format!(
                ": its steps form a cycle through ensemble tensor '{next}' (step {step}, model '{}')",
                steps[step].model_name
            );
        }
        current = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ensemble(body: &str) -> ModelConfig {
        crate::config::parse_model_config(&format!(
            "name: \"e\" max_batch_size: 8 platform: \"ensemble\" {body}"
        ))
        .unwrap()
    }

    fn err(body: &str) -> String {
        format!("{:#}", validate(&ensemble(body)).unwrap_err())
    }

    const IO: &str = r#"
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ 4 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 4 ] } ]"#;

    fn with_steps(steps: &str) -> String {
        format!("{IO} ensemble_scheduling {{ step [ {steps} ] }}")
    }

    #[test]
    fn a_chain_is_valid() {
        let body = with_steps(
            r#"{ model_name: "a" input_map { key: "X" value: "IN" } output_map { key: "Y" value: "mid" } },
               { model_name: "b" input_map { key: "X" value: "mid" } output_map { key: "Y" value: "OUT" } }"#,
        );
        validate(&ensemble(&body)).unwrap();
    }

    #[test]
    fn a_tensor_nobody_writes_is_named() {
        let e = err(&with_steps(
            r#"{ model_name: "a" input_map [ { key: "X" value: "IN" }, { key: "Z" value: "ghost" } ] output_map { key: "Y" value: "OUT" } }"#,
        ));
        assert!(e.contains("output 'OUT' for ensemble"), "{e}");
        assert!(e.contains("'ghost', is not connected"), "{e}");
    }

    #[test]
    fn a_cycle_is_named() {
        let e = err(&with_steps(
            r#"{ model_name: "a" input_map [ { key: "X" value: "IN" }, { key: "Z" value: "back" } ] output_map { key: "Y" value: "fwd" } },
               { model_name: "b" input_map { key: "X" value: "fwd" } output_map [ { key: "Y" value: "back" }, { key: "W" value: "OUT" } ] }"#,
        ));
        assert!(e.contains("is not written"), "{e}");
        assert!(e.contains("cycle"), "{e}");
    }

    #[test]
    fn incomplete_steps_and_double_writers_are_refused() {
        assert!(err(IO).contains("must specify 'step'"));
        let e = err(&with_steps(
            r#"{ model_name: "a" output_map { key: "Y" value: "OUT" } }"#,
        ));
        assert!(e.contains("must specify 'input_map' in step 0"), "{e}");
        let e = err(&with_steps(
            r#"{ model_name: "a" input_map { key: "X" value: "IN" } output_map { key: "Y" value: "OUT" } },
               { model_name: "b" input_map { key: "X" value: "IN" } output_map { key: "Y" value: "OUT" } }"#,
        ));
        assert!(e.contains("can appear in an output map only once"), "{e}");
    }

    #[test]
    fn unused_inputs_outputs_and_tensors_are_refused() {
        let e = err(&with_steps(
            r#"{ model_name: "a" input_map { key: "X" value: "other" } output_map { key: "Y" value: "OUT" } }"#,
        ));
        assert!(e.contains("ensemble input 'IN'"), "{e}");
        let e = err(&with_steps(
            r#"{ model_name: "a" input_map { key: "X" value: "IN" } output_map { key: "Y" value: "elsewhere" } }"#,
        ));
        assert!(e.contains("ensemble output 'OUT'"), "{e}");
        let e = err(&with_steps(
            r#"{ model_name: "a" input_map { key: "X" value: "IN" } output_map [ { key: "Y" value: "OUT" }, { key: "W" value: "spare" } ] }"#,
        ));
        assert!(e.contains("ensemble tensor 'spare' is unused"), "{e}");
    }

    #[test]
    fn instance_groups_are_refused() {
        let mut c = ensemble(&with_steps(
            r#"{ model_name: "a" input_map { key: "X" value: "IN" } output_map { key: "Y" value: "OUT" } }"#,
        ));
        c.instance_group.push(Default::default());
        let e = validate(&c).unwrap_err().to_string();
        assert!(e.contains("instance group should not be specified"), "{e}");
    }
}
