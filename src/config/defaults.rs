//! The defaults Triton writes into a loaded model's configuration, so that
//! `/config` and ModelConfig report what the server actually does (tools
//! such as model analyzers read `instance_group` and `version_policy` from
//! there). Runs after validation and the supported-features check;
//! `resolve_instance_kinds` then resolves `KIND_AUTO` against the GPUs.

use crate::proto::inference::{
    model_instance_group::Kind,
    model_version_policy::{Latest, PolicyChoice},
    ModelConfig, ModelInstanceGroup, ModelVersionPolicy,
};

pub fn fill_defaults(config: &mut ModelConfig) {
    // Triton reports pinned memory on for every model but an ensemble
    // (core's NormalizeModelConfig); shardserve stages host tensors the
    // same way whatever the setting, so this only makes `/config` agree.
    let ensemble = matches!(
        config.scheduling_choice,
        Some(crate::proto::inference::model_config::SchedulingChoice::EnsembleScheduling(_))
    );
    if !ensemble {
        let optimization = config.optimization.get_or_insert_with(Default::default);
        let on = || crate::proto::inference::model_optimization_policy::PinnedMemoryBuffer {
            enable: true,
        };
        optimization.input_pinned_memory.get_or_insert_with(on);
        optimization.output_pinned_memory.get_or_insert_with(on);
    }
    if config.version_policy.is_none() {
        config.version_policy = Some(ModelVersionPolicy {
            policy_choice: Some(PolicyChoice::Latest(Latest { num_versions: 1 })),
        });
    }
    if config.instance_group.is_empty() {
        config.instance_group.push(ModelInstanceGroup {
            name: config.name.clone(),
            kind: Kind::Cpu as i32,
            count: 1,
            ..Default::default()
        });
    }
    for (index, group) in config.instance_group.iter_mut().enumerate() {
        if group.name.is_empty() {
            group.name = format!("{}_{index}", config.name);
        }
        group.count = group.count.max(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_support::config;

    #[test]
    fn a_bare_config_gets_tritons_defaults() {
        let mut c = config("");
        fill_defaults(&mut c);
        assert_eq!(
            c.version_policy.and_then(|p| p.policy_choice),
            Some(PolicyChoice::Latest(Latest { num_versions: 1 }))
        );
        assert_eq!(c.instance_group.len(), 1);
        assert_eq!(c.instance_group[0].name, "m");
        assert_eq!(c.instance_group[0].kind, Kind::Cpu as i32);
        assert_eq!(c.instance_group[0].count, 1);
        let o = c.optimization.unwrap();
        assert!(o.input_pinned_memory.unwrap().enable && o.output_pinned_memory.unwrap().enable);
    }

    #[test]
    fn given_groups_are_named_counted_and_resolved_but_kept() {
        let mut c = config(
            "version_policy { all { } }\ninstance_group [ { kind: KIND_AUTO }, { name: \"g\" count: 3 kind: KIND_MODEL } ]",
        );
        fill_defaults(&mut c);
        assert_eq!(
            c.version_policy.and_then(|p| p.policy_choice),
            Some(PolicyChoice::All(Default::default()))
        );
        assert_eq!(c.instance_group[0].name, "m_0");
        assert_eq!(c.instance_group[0].count, 1);
        assert_eq!(
            c.instance_group[0].kind,
            Kind::Auto as i32,
            "resolved later"
        );
        assert_eq!(c.instance_group[1].name, "g");
        assert_eq!(c.instance_group[1].count, 3);
        assert_eq!(c.instance_group[1].kind, Kind::Model as i32);
    }
}
