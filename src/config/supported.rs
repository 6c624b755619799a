//! The single list of configuration features shardserve refuses until they
//! are implemented.

use std::fmt;

use crate::proto::inference::{
    model_config::SchedulingChoice, model_optimization_policy::execution_accelerators::Accelerator,
    ModelConfig,
};

/// Refuses a configuration that asks for something this server does not do
/// yet, naming every such feature, rather than loading a model that would
/// behave differently from Triton.
///
/// Refused (each changes what a client observes, so ignoring it would be
/// wrong):
///
/// - an ensemble's `step` with a `model_namespace` (Triton 2.51 overwrites
///   it: a step resolves in its ensemble's own repository under
///   `--model-namespacing`, as here; a namespace named by hand is not
///   honoured, so it is refused rather than silently replaced);
/// - `model_transaction_policy { decoupled: true }` together with
///   `shardserve_execution: "inline"` (a decoupled backend may block while
///   its client is slow, which must never happen on a shard);
/// - `instance_group` `secondary_devices`, TensorRT `profile`s, and
///   `passive` instances (`KIND_GPU` is served: see
///   `config::resolve_instance_kinds` for its checks against the GPUs);
/// - `model_repository_agents`;
/// - `batch_input`, `batch_output` or `allow_ragged_batch` together with
///   `sequence_batching` or a decoupled model (batch inputs are built for
///   the dynamic batcher's and the default scheduler's executions only);
/// - inputs with `is_shape_tensor` or
///   `is_non_linear_format_io`, outputs with `is_shape_tensor` or
///   `is_non_linear_format_io`;
/// - `optimization.cuda` with `graphs` or `graph_spec` (CUDA graphs);
/// - `optimization.execution_accelerators` (GPU ones such as TensorRT: the
///   ONNX Runtime backend registers the CUDA provider only; CPU ones such
///   as OpenVINO: not wired into the ONNX Runtime backend);
/// - `model_operations` (custom operator libraries).
///
/// Accepted: the default scheduler, `dynamic_batching` with all of its
/// fields (`preserve_ordering` across instances: `scheduler::reorder`),
/// `model_warmup` (`repository::warmup`), `ensemble_scheduling` with `platform: "ensemble"` (checked by
/// `scheduler::ensemble` at load), `sequence_batching` (checked by `scheduler::sequence::spec`,
/// which refuses `iterative_sequence`), `instance_group` of every kind (`KIND_MODEL` runs on CPU), `version_policy`, `reshape`, `optional` inputs,
/// `parameters`, `label_filename`, and fields that are purely advisory
/// here: input `format`, `optimization.priority`, `optimization.graph`,
/// pinned-memory settings, `rate_limiter` (honoured with `--rate-limit
/// execution_count` by `scheduler::rate_limiter`, ignored with it off, as
/// in Triton), `host_policy`, `metric_tags`,
/// `model_metrics`, `cc_model_filenames`.
pub fn check_supported(config: &ModelConfig) -> anyhow::Result<()> {
    let refused = unsupported_features(config);
    match refused.as_slice() {
        [] => Ok(()),
        [only] => anyhow::bail!(
            "model '{}': {} is not supported yet by shardserve{}",
            config.name,
            only.feature,
            only.reason.map(|r| format!(" ({r})")).unwrap_or_default()
        ),
        all => anyhow::bail!(
            "model '{}': these configuration features are not supported yet by shardserve: {}",
            config.name,
            all.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        ),
    }
}

/// A configuration feature that [`check_supported`] refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsupported {
    /// The field as written in `config.pbtxt`, with the offending value.
    pub feature: String,
    /// What it is or what to do instead, when the name alone does not say.
    pub reason: Option<&'static str>,
}

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.reason {
            Some(reason) => write!(f, "{} ({reason})", self.feature),
            None => f.write_str(&self.feature),
        }
    }
}

/// Every refused feature the configuration uses (see [`check_supported`]).
pub fn unsupported_features(config: &ModelConfig) -> Vec<Unsupported> {
    let mut refused = Vec::new();
    let mut refuse = |feature: String, reason: Option<&'static str>| {
        refused.push(Unsupported { feature, reason })
    };

    match &config.scheduling_choice {
        Some(SchedulingChoice::SequenceBatching(_)) => {}
        Some(SchedulingChoice::EnsembleScheduling(e)) => {
            // Ensembles are served (`scheduler::ensemble`, which checks the
            // data flow against the composing models at load).
            if let Some(step) = e.step.iter().find(|s| !s.model_namespace.is_empty()) {
                refuse(
                    format!(
                        "ensemble_scheduling step model_namespace {:?}",
                        step.model_namespace
                    ),
                    Some("a step resolves in its ensemble's own repository (--model-namespacing); naming another namespace is not supported"),
                );
            }
        }
        Some(SchedulingChoice::DynamicBatching(_)) | None => {}
    }
    if config
        .model_transaction_policy
        .as_ref()
        .is_some_and(|p| p.decoupled)
    {
        let inline = config
            .parameters
            .get("shardserve_execution")
            .is_some_and(|p| p.string_value == "inline");
        if inline {
            refuse(
                "model_transaction_policy decoupled: true with shardserve_execution \"inline\""
                    .into(),
                Some("decoupled models run on compute workers"),
            );
        }
    }

    for (index, group) in config.instance_group.iter().enumerate() {
        let label = if group.name.is_empty() {
            format!("instance_group #{index}")
        } else {
            format!("instance_group '{}'", group.name)
        };
        if !group.secondary_devices.is_empty() {
            refuse(format!("{label} secondary_devices"), None);
        }
        if !group.profile.is_empty() {
            refuse(
                format!("{label} profile"),
                Some("TensorRT optimization profiles"),
            );
        }
        if group.passive {
            refuse(format!("{label} passive: true"), None);
        }
    }

    if config
        .model_repository_agents
        .as_ref()
        .is_some_and(|a| !a.agents.is_empty())
    {
        refuse("model_repository_agents".into(), None);
    }
    // Ragged batching and batch inputs/outputs are served
    // (`scheduler::ragged`), but not where executions are not formed by the
    // dynamic batcher or the default scheduler.
    let ragged = !config.batch_input.is_empty()
        || !config.batch_output.is_empty()
        || config.input.iter().any(|i| i.allow_ragged_batch);
    if ragged {
        if matches!(
            config.scheduling_choice,
            Some(SchedulingChoice::SequenceBatching(_))
        ) {
            refuse(
                "batch_input, batch_output or allow_ragged_batch with sequence_batching".into(),
                Some("ragged batching is served with dynamic_batching or the default scheduler"),
            );
        }
        if config
            .model_transaction_policy
            .as_ref()
            .is_some_and(|p| p.decoupled)
        {
            refuse(
                "batch_input, batch_output or allow_ragged_batch with model_transaction_policy decoupled: true".into(),
                Some("ragged batching is served for models that answer once per request"),
            );
        }
    }

    for input in &config.input {
        let flags = [
            ("is_shape_tensor", input.is_shape_tensor),
            ("is_non_linear_format_io", input.is_non_linear_format_io),
        ];
        for (flag, _) in flags.iter().filter(|(_, on)| *on) {
            refuse(format!("input '{}' {flag}: true", input.name), None);
        }
    }
    for output in &config.output {
        let flags = [
            ("is_shape_tensor", output.is_shape_tensor),
            ("is_non_linear_format_io", output.is_non_linear_format_io),
        ];
        for (flag, _) in flags.iter().filter(|(_, on)| *on) {
            refuse(format!("output '{}' {flag}: true", output.name), None);
        }
    }

    if let Some(opt) = &config.optimization {
        if opt
            .cuda
            .as_ref()
            .is_some_and(|c| c.graphs || !c.graph_spec.is_empty())
        {
            refuse(
                "optimization.cuda graphs".into(),
                Some("CUDA graphs are not captured by the ONNX Runtime backend"),
            );
        }
        if let Some(acc) = &opt.execution_accelerators {
            let names =
                |list: &[Accelerator]| list.iter().map(|a| a.name.clone()).collect::<Vec<_>>();
            if !acc.gpu_execution_accelerator.is_empty() {
                refuse(
                    format!(
                        "optimization.execution_accelerators gpu_execution_accelerator {:?}",
                        names(&acc.gpu_execution_accelerator)
                    ),
                    Some("the ONNX Runtime backend registers the CUDA execution provider only"),
                );
            }
            if !acc.cpu_execution_accelerator.is_empty() {
                refuse(
                    format!(
                        "optimization.execution_accelerators cpu_execution_accelerator {:?}",
                        names(&acc.cpu_execution_accelerator)
                    ),
                    Some("the ONNX Runtime backend runs its default CPU provider only"),
                );
            }
        }
    }
    if config
        .model_operations
        .as_ref()
        .is_some_and(|o| !o.op_library_filename.is_empty())
    {
        refuse("model_operations".into(), Some("custom operator libraries"));
    }

    refused
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{parse_model_config, test_support::config};

    fn refusal(extra: &str) -> String {
        format!("{:#}", check_supported(&config(extra)).unwrap_err())
    }

    #[test]
    fn every_config_in_the_models_folder_is_supported() {
        let models = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
        for entry in std::fs::read_dir(&models).unwrap() {
            let path = entry.unwrap().path().join("config.pbtxt");
            if path.is_file() {
                let c = parse_model_config(&std::fs::read_to_string(&path).unwrap()).unwrap();
                check_supported(&c).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
            }
        }
    }

    #[test]
    fn implemented_features_are_accepted() {
        check_supported(&config(
            r#"
            version_policy { latest { num_versions: 2 } }
            dynamic_batching {
              preferred_batch_size: [ 4 ] priority_levels: 2 default_priority_level: 1
              default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 10 }
            }
            instance_group [ { count: 2 kind: KIND_CPU }, { kind: KIND_AUTO }, { kind: KIND_MODEL } ]
            parameters { key: "k" value: { string_value: "v" } }
            optimization { priority: PRIORITY_MAX graph { level: 1 } input_pinned_memory { enable: true } }
            model_transaction_policy { decoupled: false }
            response_cache { enable: false }
            "#,
        ))
        .unwrap();
    }

    #[test]
    fn sequence_batching_is_accepted() {
        assert!(check_supported(&config(
            "sequence_batching { max_sequence_idle_microseconds: 10 }"
        ))
        .is_ok());
    }

    #[test]
    fn ensembles_are_accepted_without_namespaces() {
        check_supported(&config(
            "platform: \"ensemble\" ensemble_scheduling { step [ { model_name: \"a\" } ] }",
        ))
        .unwrap();
        assert!(refusal(
            "platform: \"ensemble\" ensemble_scheduling { step [ { model_name: \"a\" model_namespace: \"n\" } ] }"
        )
        .contains("model_namespace"));
    }

    #[test]
    fn decoupled_models_are_accepted_stateful_but_not_inline() {
        check_supported(&config("model_transaction_policy { decoupled: true }")).unwrap();
        check_supported(&config(
            "model_transaction_policy { decoupled: true } sequence_batching { }",
        ))
        .unwrap();
        assert!(refusal(
            "model_transaction_policy { decoupled: true } \
             parameters { key: \"shardserve_execution\" value: { string_value: \"inline\" } }"
        )
        .contains("inline"));
    }

    #[test]
    fn gpu_instance_groups_pass_this_check() {
        // Checked against the machine's GPUs at load (resolve_instance_kinds).
        check_supported(&config(
            "instance_group [ { name: \"g\" kind: KIND_GPU gpus: [ 0 ] count: 2 } ]",
        ))
        .unwrap();
    }

    #[test]
    fn passive_instances_are_refused() {
        assert!(refusal("instance_group [ { passive: true } ]").contains("passive"));
    }

    #[test]
    fn warmup_and_preserve_ordering_across_instances_are_accepted() {
        let c = config(
            "dynamic_batching { preserve_ordering: true }\ninstance_group [ { count: 2 kind: KIND_CPU } ]\nmodel_warmup [ { name: \"w\" batch_size: 1 } ]",
        );
        assert!(check_supported(&c).is_ok());
    }

    #[test]
    fn repository_agents_are_refused() {
        assert!(
            refusal("model_repository_agents { agents [ { name: \"checksum\" } ] }")
                .contains("model_repository_agents")
        );
    }

    #[test]
    fn batch_inputs_and_outputs_are_served_but_not_with_sequences_or_decoupled() {
        let bi =
            "batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: \"x\" source_input: \"IN\" } ]";
        check_supported(&config(bi)).unwrap();
        check_supported(&config(
            "batch_output [ { target_name: \"OUT\" source_input: \"IN\" } ]",
        ))
        .unwrap();
        let mut c = config("dynamic_batching { }");
        c.input[0].allow_ragged_batch = true;
        check_supported(&c).unwrap();
        assert!(
            refusal(&format!("{bi} sequence_batching {{ }}")).contains("with sequence_batching")
        );
        assert!(refusal(&format!(
            "{bi} model_transaction_policy {{ decoupled: true }}"
        ))
        .contains("decoupled: true"));
    }

    #[test]
    fn shape_tensors_are_refused() {
        let mut c = config("");
        c.input[0].is_shape_tensor = true;
        let e = format!("{:#}", check_supported(&c).unwrap_err());
        assert!(e.contains("input 'IN' is_shape_tensor: true"), "{e}");
    }

    #[test]
    fn cuda_graphs_and_accelerators_are_refused() {
        assert!(refusal("optimization { cuda { graphs: true } }").contains("CUDA graphs"));
        let e = refusal("optimization { execution_accelerators { gpu_execution_accelerator [ { name: \"tensorrt\" } ] } }");
        assert!(
            e.contains("[\"tensorrt\"]") && e.contains("CUDA execution provider only"),
            "{e}"
        );
        assert!(
            refusal("optimization { execution_accelerators { cpu_execution_accelerator [ { name: \"openvino\" } ] } }")
                .contains("openvino")
        );
    }

    #[test]
    fn custom_operator_libraries_are_refused() {
        assert!(
            refusal("model_operations { op_library_filename: [ \"libcustom.so\" ] }")
                .contains("model_operations")
        );
    }

    #[test]
    fn every_refused_feature_is_named_in_one_message() {
        let e = refusal("model_operations { op_library_filename: [ \"x.so\" ] } model_repository_agents { agents [ { name: \"c\" } ] } optimization { cuda { graphs: true } }");
        assert!(
            e.starts_with(
                "model 'm': these configuration features are not supported yet by shardserve: "
            ),
            "{e}"
        );
        assert!(
            e.contains("model_operations")
                && e.contains("model_repository_agents")
                && e.contains("CUDA graphs"),
            "{e}"
        );
        assert_eq!(
            unsupported_features(&config(
                "optimization { cuda { graphs: true } } model_operations { op_library_filename: [ \"x.so\" ] }"
            ))
            .len(),
            2
        );
    }
}
