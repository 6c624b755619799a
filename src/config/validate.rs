//! Structural validation of a configuration after auto-complete, following
//! the checks Triton makes when it loads a model (`ValidateModelConfig`,
//! `ValidateIOShape`). Features this server does not implement are not
//! judged here: that is `check_supported`.

use std::collections::HashSet;

use anyhow::bail;

use crate::proto::inference::{
    batch_input, batch_output, model_config::SchedulingChoice, model_instance_group::Kind,
    model_queue_policy::TimeoutAction, model_version_policy::PolicyChoice, DataType, ModelConfig,
    ModelDynamicBatching, ModelTensorReshape,
};

/// Wildcard dimension: any size.
const WILDCARD: i64 = -1;

// Bounds Triton does not have. Each refuses values that are typos or
// nonsense in practice but would make loading (or the first request)
// allocate without limit, and each fails only the model that has it.

/// Largest `max_batch_size`. Per-batch-size state (statistics, batch
/// assembly) and batch-row arithmetic scale with it; 2e9 once aborted the
/// whole server allocating 96 GB. Real models use at most a few thousand.
pub const MAX_BATCH_SIZE: i32 = 1 << 20;
/// Most model instances across a model's instance groups: each is an
/// executor (and for ONNX a session with its own memory arena).
pub const MAX_INSTANCES: i64 = 1024;
/// Most `dynamic_batching.priority_levels`: each level is a queue that
/// the batcher scans on every decision. Deployments use a handful.
pub const MAX_PRIORITY_LEVELS: u64 = 1024;
/// Most entries in a `preferred_batch_size` list (each is between 1 and
/// `max_batch_size`, so a longer list only repeats values).
pub const MAX_PREFERRED_SIZES: usize = 1024;
/// Most dimensions of a tensor (numpy allows 64).
pub const MAX_DIMS: usize = 64;
/// Largest single dimension: 32-bit, as most backends index them.
pub const MAX_DIM: i64 = i32::MAX as i64;
/// Most elements of one batch item (the product of the fixed dims): with
/// 8-byte elements and the largest batch, sizes stay far from overflow.
pub const MAX_ITEM_ELEMENTS: i64 = 1 << 32;

/// Checks a configuration for mistakes Triton would refuse to load, with a
/// message naming the model and the offending field.
pub fn validate(config: &ModelConfig) -> anyhow::Result<()> {
    let model = &config.name;
    if config.max_batch_size < 0 {
        bail!(
            "model '{model}': max_batch_size must be 0 (no batching) or positive, not {}",
            config.max_batch_size
        );
    }
    if config.max_batch_size > MAX_BATCH_SIZE {
        bail!(
            "model '{model}': max_batch_size {} is above this server's limit of {MAX_BATCH_SIZE}",
            config.max_batch_size
        );
    }
    if config.input.is_empty() {
        bail!("model '{model}': the configuration declares no input");
    }
    if config.output.is_empty() {
        bail!("model '{model}': the configuration declares no output");
    }

    let mut names = HashSet::new();
    for input in &config.input {
        let io = Io {
            model,
            what: "input",
            name: &input.name,
            data_type: input.data_type,
            dims: &input.dims,
            reshape: input.reshape.as_ref(),
        };
        io.check(config.max_batch_size, &mut names)?;
    }
    names.clear();
    for output in &config.output {
        let io = Io {
            model,
            what: "output",
            name: &output.name,
            data_type: output.data_type,
            dims: &output.dims,
            reshape: output.reshape.as_ref(),
        };
        io.check(config.max_batch_size, &mut names)?;
    }

    check_batch_io(config)?;
    check_version_policy(config)?;
    check_response_cache(config)?;
    check_scheduling(config)?;
    check_instance_groups(config)?;
    Ok(())
}

/// Triton 2.51 refuses the response cache on the models it cannot cache
/// (`ValidateModelConfig`), whether or not the server has a cache.
fn check_response_cache(config: &ModelConfig) -> anyhow::Result<()> {
    if !config.response_cache.as_ref().is_some_and(|c| c.enable) {
        return Ok(());
    }
    let model = &config.name;
    if matches!(
        config.scheduling_choice,
        Some(SchedulingChoice::SequenceBatching(_))
    ) {
        bail!(
            "Response Cache does not currently support model {model} with sequence batching scheduler. Please disable the response cache."
        );
    }
    if super::is_decoupled(config) {
        bail!(
            "Response Cache does not currently support model {model} with 'decoupled' transaction policy. Please disable the response cache."
        );
    }
    Ok(())
}

/// What input and output checks share.
struct Io<'a> {
    model: &'a str,
    what: &'static str,
    name: &'a str,
    data_type: i32,
    dims: &'a [i64],
    reshape: Option<&'a ModelTensorReshape>,
}

impl Io<'_> {
    fn check(&self, max_batch_size: i32, seen: &mut HashSet<String>) -> anyhow::Result<()> {
        let Io {
            model, what, name, ..
        } = *self;
        if name.is_empty() {
            bail!("model '{model}': an {what} has an empty name");
        }
        if !seen.insert(name.to_string()) {
            bail!("model '{model}': {what} '{name}' is declared more than once");
        }
        match DataType::try_from(self.data_type) {
            Ok(DataType::TypeInvalid) => {
                bail!("model '{model}': {what} '{name}' must specify data_type")
            }
            Ok(_) => {}
            Err(_) => bail!(
                "model '{model}': {what} '{name}' has unknown data_type {}",
                self.data_type
            ),
        }
        if self.dims.is_empty() {
            bail!(
                "model '{model}': {what} '{name}' must specify dims \
                 (a scalar is written dims: [ 1 ] with reshape: {{ shape: [ ] }})"
            );
        }
        check_dims(self.dims).map_err(|bad| {
            anyhow::anyhow!(
                "model '{model}': {what} '{name}' has dimension {bad} in dims {:?}: \
                 each dimension must be >= 1, or -1 for a variable size",
                self.dims
            )
        })?;
        self.check_size("dims", self.dims)?;
        if let Some(reshape) = self.reshape {
            self.check_reshape(&reshape.shape, max_batch_size)?;
        }
        Ok(())
    }

    fn check_reshape(&self, shape: &[i64], max_batch_size: i32) -> anyhow::Result<()> {
        let Io {
            model, what, name, ..
        } = *self;
        if shape.is_empty() && max_batch_size == 0 {
            bail!(
                "model '{model}': {what} '{name}' cannot have an empty reshape in a model without batching \
                 (max_batch_size: 0), as that tensor would hold no data"
            );
        }
        check_dims(shape).map_err(|bad| {
            anyhow::anyhow!(
                "model '{model}': {what} '{name}' has dimension {bad} in reshape {shape:?}: \
                 each dimension must be >= 1, or -1 for a variable size"
            )
        })?;
        self.check_size("reshape", shape)?;
        if !reshape_compatible(self.dims, shape) {
            bail!(
                "model '{model}': {what} '{name}' has dims {:?} and reshape {shape:?}, which do not hold \
                 the same number of elements",
                self.dims
            );
        }
        Ok(())
    }

    /// The bounds on rank, dimensions and elements per item.
    fn check_size(&self, field: &str, dims: &[i64]) -> anyhow::Result<()> {
        let Io {
            model, what, name, ..
        } = *self;
        if dims.len() > MAX_DIMS {
            bail!(
                "model '{model}': {what} '{name}' has {} dimensions in {field}, above the limit of {MAX_DIMS}",
                dims.len()
            );
        }
        if let Some(big) = dims.iter().find(|&&d| d > MAX_DIM) {
            bail!(
                "model '{model}': {what} '{name}' has dimension {big} in {field}, above the limit of {MAX_DIM}"
            );
        }
        let elements = dims
            .iter()
            .filter(|&&d| d != WILDCARD)
            .try_fold(1i64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n <= MAX_ITEM_ELEMENTS);
        if elements.is_none() {
            bail!(
                "model '{model}': {what} '{name}' has {field} {dims:?}, more than \
                 {MAX_ITEM_ELEMENTS} elements per batch item"
            );
        }
        Ok(())
    }
}

/// The first dimension that is neither a wildcard nor positive.
fn check_dims(dims: &[i64]) -> Result<(), i64> {
    match dims.iter().find(|&&d| d != WILDCARD && d < 1) {
        Some(&bad) => Err(bad),
        None => Ok(()),
    }
}

/// Element counts of the runs of fixed dimensions between wildcards
/// (`[2, 4, -1, 6]` → `[8, 6]`); `None` on overflow.
fn fixed_runs(dims: &[i64]) -> Option<Vec<i64>> {
    let mut runs = vec![1i64];
    for &d in dims {
        if d == WILDCARD {
            runs.push(1);
        } else if let Some(last) = runs.last_mut() {
            *last = last.checked_mul(d)?;
        }
    }
    Some(runs)
}

/// Triton's rule: dims and reshape agree run by run between wildcards
/// (`[2, 4, -1, 6]` may become `[8, -1, 1, 6]`), and an empty reshape (a
/// scalar) needs exactly one element.
fn reshape_compatible(dims: &[i64], shape: &[i64]) -> bool {
    if shape.is_empty() {
        return fixed_runs(dims).is_some_and(|runs| runs == [1]);
    }
    match (fixed_runs(dims), fixed_runs(shape)) {
        (Some(a), Some(b)) => a == b,
        // Absurdly large products: leave the verdict to the backend.
        _ => true,
    }
}

/// Triton's `ValidateBatchIO`: each batch input and output names exactly
/// one configured source input, batch inputs are INT32 or FP32, and batch
/// output targets are configured outputs named once. Texts are Triton's,
/// which ends them with " for <model>".
fn check_batch_io(config: &ModelConfig) -> anyhow::Result<()> {
    let model = &config.name;
    let is_input = |name: &String| config.input.iter().any(|i| &i.name == name);
    for b in &config.batch_input {
        let kind = batch_input::Kind::try_from(b.kind)
            .map_err(|_| anyhow::anyhow!("unknown batch input kind '{}' for {model}", b.kind))?;
        if b.source_input.len() != 1 {
            bail!(
                "batch input kind '{}' expects 1 source input, got {} for {model}",
                kind.as_str_name(),
                b.source_input.len()
            );
        }
        if b.data_type != DataType::TypeInt32 as i32 && b.data_type != DataType::TypeFp32 as i32 {
            bail!("batch input data type must be TYPE_INT32 or TYPE_FP32 for {model}");
        }
        if let Some(unknown) = b.source_input.iter().find(|s| !is_input(s)) {
            bail!("unknown source input name '{unknown}' for {model}");
        }
    }
    for b in &config.batch_output {
        let kind = batch_output::Kind::try_from(b.kind)
            .map_err(|_| anyhow::anyhow!("unknown batch output kind '{}' for {model}", b.kind))?;
        if b.source_input.len() != 1 {
            bail!(
                "batch output kind '{}' expects 1 source input, got {} for {model}",
                kind.as_str_name(),
                b.source_input.len()
            );
        }
        if let Some(unknown) = b.source_input.iter().find(|s| !is_input(s)) {
            bail!("unknown source input name '{unknown}' for {model}");
        }
        let mut targets = HashSet::new();
        for target in &b.target_name {
            if !config.output.iter().any(|o| &o.name == target) {
                bail!("unknown target output name '{target}' for {model}");
            }
            if !targets.insert(target) {
                bail!("target output name '{target}' can only be specified once for {model}");
            }
        }
    }
    Ok(())
}

fn check_version_policy(config: &ModelConfig) -> anyhow::Result<()> {
    let model = &config.name;
    match config
        .version_policy
        .as_ref()
        .and_then(|p| p.policy_choice.as_ref())
    {
        Some(PolicyChoice::Latest(latest)) if latest.num_versions < 1 => {
            bail!("model '{model}': version_policy latest must serve at least 1 version (num_versions >= 1)")
        }
        Some(PolicyChoice::Specific(specific)) => {
            if let Some(v) = specific.versions.iter().find(|&&v| v < 0) {
                bail!("model '{model}': version_policy specific lists version {v}, versions are non-negative")
            }
        }
        _ => {}
    }
    Ok(())
}

fn check_scheduling(config: &ModelConfig) -> anyhow::Result<()> {
    let model = &config.name;
    match &config.scheduling_choice {
        Some(SchedulingChoice::DynamicBatching(d)) => check_dynamic_batching(config, d),
        Some(SchedulingChoice::SequenceBatching(s)) => {
            if let Some(oldest) = s.strategy_choice.as_ref().and_then(|c| match c {
                crate::proto::inference::model_sequence_batching::StrategyChoice::Oldest(o) => {
                    Some(o)
                }
                _ => None,
            }) {
                check_preferred_sizes(
                    config,
                    "sequence_batching oldest",
                    &oldest.preferred_batch_size,
                )?;
            }
            Ok(())
        }
        Some(SchedulingChoice::EnsembleScheduling(e)) => {
            if config.platform != "ensemble" {
                bail!(
                    "model '{model}': ensemble_scheduling is only valid with platform \"ensemble\", not {:?}",
                    config.platform
                );
            }
            if e.step.is_empty() {
                bail!("model '{model}': ensemble_scheduling must list at least one step");
            }
            if e.step.iter().any(|s| s.model_name.is_empty()) {
                bail!("model '{model}': every ensemble_scheduling step must name a model (model_name)");
            }
            Ok(())
        }
        None => {
            if config.platform == "ensemble" {
                bail!("model '{model}': platform \"ensemble\" requires ensemble_scheduling");
            }
            Ok(())
        }
    }
}

fn check_preferred_sizes(config: &ModelConfig, what: &str, sizes: &[i32]) -> anyhow::Result<()> {
    let model = &config.name;
    if sizes.len() > MAX_PREFERRED_SIZES {
        bail!(
            "model '{model}': {what} lists {} preferred_batch_size values, above the limit of \
             {MAX_PREFERRED_SIZES}",
            sizes.len()
        );
    }
    for &size in sizes {
        if size < 1 || size > config.max_batch_size {
            bail!(
                "model '{model}': {what} preferred_batch_size {size} must be between 1 and \
                 max_batch_size ({})",
                config.max_batch_size
            );
        }
    }
    Ok(())
}

fn check_dynamic_batching(config: &ModelConfig, d: &ModelDynamicBatching) -> anyhow::Result<()> {
    let model = &config.name;
    if config.max_batch_size == 0 {
        bail!(
            "model '{model}': dynamic_batching requires batching: set max_batch_size > 0 \
             (it is 0, which means the model takes no batch dimension)"
        );
    }
    check_preferred_sizes(config, "dynamic_batching", &d.preferred_batch_size)?;

    let levels = d.priority_levels;
    if levels > MAX_PRIORITY_LEVELS {
        bail!(
            "model '{model}': dynamic_batching priority_levels {levels} is above this server's \
             limit of {MAX_PRIORITY_LEVELS}"
        );
    }
    if levels > 0 {
        if d.default_priority_level < 1 || d.default_priority_level > levels {
            bail!(
                "model '{model}': dynamic_batching default_priority_level is {}, it must be between 1 and \
                 priority_levels ({levels})",
                d.default_priority_level
            );
        }
        let mut keys: Vec<u64> = d.priority_queue_policy.keys().copied().collect();
        keys.sort_unstable();
        if let Some(bad) = keys.iter().find(|&&k| k < 1 || k > levels) {
            bail!(
                "model '{model}': dynamic_batching priority_queue_policy has priority level {bad}, it must be \
                 between 1 and priority_levels ({levels})"
            );
        }
    } else if !d.priority_queue_policy.is_empty() {
        bail!("model '{model}': dynamic_batching priority_queue_policy needs priority_levels > 0");
    }

    if d.preserve_ordering {
        if levels > 1 {
            bail!("model '{model}': dynamic_batching allows only one priority level when preserve_ordering is true");
        }
        let delays = d
            .default_queue_policy
            .iter()
            .chain(d.priority_queue_policy.values())
            .any(|p| {
                p.default_timeout_microseconds != 0
                    && p.timeout_action == TimeoutAction::Delay as i32
            });
        if delays {
            bail!(
                "model '{model}': a dynamic_batching queue policy cannot use timeout_action DELAY when \
                 preserve_ordering is true"
            );
        }
    }
    Ok(())
}

fn check_instance_groups(config: &ModelConfig) -> anyhow::Result<()> {
    let model = &config.name;
    // Triton runs count instances per listed GPU, and count 0 as 1.
    let total: i64 = config
        .instance_group
        .iter()
        .map(|g| i64::from(g.count.max(1)).saturating_mul(g.gpus.len().max(1) as i64))
        .fold(0, i64::saturating_add);
    if total > MAX_INSTANCES {
        bail!(
            "model '{model}': instance_group asks for {total} instances, above this server's \
             limit of {MAX_INSTANCES}"
        );
    }
    for (index, group) in config.instance_group.iter().enumerate() {
        let label = if group.name.is_empty() {
            format!("instance_group #{index}")
        } else {
            format!("instance_group '{}'", group.name)
        };
        // Triton turns a count of 0 into 1; a negative count is a typo.
        if group.count < 0 {
            bail!(
                "model '{model}': {label} has count {}, it must be >= 1",
                group.count
            );
        }
        match Kind::try_from(group.kind) {
            Ok(Kind::Cpu | Kind::Model) if !group.gpus.is_empty() => bail!(
                "model '{model}': {label} has kind {} but lists gpus {:?}",
                Kind::try_from(group.kind).map_or("?", |k| k.as_str_name()),
                group.gpus
            ),
            Ok(_) => {}
            Err(_) => bail!("model '{model}': {label} has unknown kind {}", group.kind),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{parse_model_config, test_support::config};

    fn err(config: &ModelConfig) -> String {
        format!("{:#}", validate(config).unwrap_err())
    }

    #[test]
    fn the_response_cache_is_refused_where_triton_refuses_it() {
        validate(&config("response_cache { enable: true }")).unwrap();
        let seq = config("sequence_batching { } response_cache { enable: true }");
        assert!(
            err(&seq).contains("with sequence batching scheduler"),
            "{}",
            err(&seq)
        );
        let dec =
            config("model_transaction_policy { decoupled: true } response_cache { enable: true }");
        assert!(
            err(&dec).contains("with 'decoupled' transaction policy"),
            "{}",
            err(&dec)
        );
    }

    #[test]
    fn valid_config_passes() {
        validate(&config("instance_group [ { count: 2 kind: KIND_CPU } ]")).unwrap();
    }

    #[test]
    fn every_config_in_the_models_folder_is_valid() {
        let models = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
        for entry in std::fs::read_dir(&models).unwrap() {
            let path = entry.unwrap().path().join("config.pbtxt");
            if path.is_file() {
                let c = parse_model_config(&std::fs::read_to_string(&path).unwrap()).unwrap();
                validate(&c).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
            }
        }
    }

    #[test]
    fn max_batch_size_above_the_limit_is_rejected() {
        let mut c = config("");
        c.max_batch_size = MAX_BATCH_SIZE;
        validate(&c).unwrap();
        c.max_batch_size = 2_000_000_000;
        let e = err(&c);
        assert!(
            e.contains("max_batch_size 2000000000 is above this server's limit"),
            "{e}"
        );
    }

    #[test]
    fn too_many_instances_are_rejected() {
        validate(&config("instance_group [ { count: 1024 } ]")).unwrap();
        let e = err(&config("instance_group [ { count: 1000 }, { count: 25 } ]"));
        assert!(e.contains("asks for 1025 instances"), "{e}");
        let e = err(&config("instance_group [ { count: 2147483647 } ]"));
        assert!(e.contains("above this server's limit of 1024"), "{e}");
    }

    #[test]
    fn too_many_priority_levels_are_rejected() {
        let e = err(&config(
            "dynamic_batching { priority_levels: 18446744073709551615 default_priority_level: 1 }",
        ));
        assert!(e.contains("priority_levels 18446744073709551615"), "{e}");
        validate(&config(
            "dynamic_batching { priority_levels: 1024 default_priority_level: 1 }",
        ))
        .unwrap();
    }

    #[test]
    fn too_many_preferred_batch_sizes_are_rejected() {
        let mut c = config("dynamic_batching { }");
        if let Some(SchedulingChoice::DynamicBatching(d)) = &mut c.scheduling_choice {
            d.preferred_batch_size = vec![4; MAX_PREFERRED_SIZES + 1];
        }
        assert!(err(&c).contains("1025 preferred_batch_size values"));
    }

    #[test]
    fn oversized_dims_are_rejected() {
        let mut c = config("");
        c.input[0].dims = vec![1; MAX_DIMS + 1];
        assert!(err(&c).contains("65 dimensions in dims"));
        let mut c = config("");
        c.input[0].dims = vec![i64::from(i32::MAX) + 1];
        assert!(err(&c).contains("dimension 2147483648 in dims, above the limit"));
        let mut c = config("");
        c.output[0].dims = vec![1 << 20, -1, 1 << 20];
        assert!(err(&c).contains("elements per batch item"));
        let mut c = config("");
        c.output[0].dims = vec![1 << 16, -1, 1 << 16];
        validate(&c).unwrap();
    }

    #[test]
    fn oversized_reshape_is_rejected() {
        let mut c = config("");
        c.input[0].dims = vec![-1];
        c.input[0].reshape = Some(ModelTensorReshape {
            shape: vec![-1, i64::MAX],
        });
        assert!(err(&c).contains("in reshape, above the limit"));
    }

    #[test]
    fn negative_max_batch_size_is_rejected() {
        let mut c = config("");
        c.max_batch_size = -1;
        let e = err(&c);
        assert!(
            e.contains("model 'm'") && e.contains("max_batch_size"),
            "{e}"
        );
    }

    #[test]
    fn missing_inputs_or_outputs_are_rejected() {
        let mut c = config("");
        c.input.clear();
        assert!(err(&c).contains("no input"));
        let mut c = config("");
        c.output.clear();
        assert!(err(&c).contains("no output"));
    }

    #[test]
    fn empty_tensor_name_is_rejected() {
        let mut c = config("");
        c.output[0].name.clear();
        assert!(err(&c).contains("empty name"));
    }

    #[test]
    fn duplicate_input_name_is_rejected() {
        let mut c = config("");
        c.input.push(c.input[0].clone());
        let e = err(&c);
        assert!(e.contains("input 'IN' is declared more than once"), "{e}");
    }

    #[test]
    fn same_name_for_an_input_and_an_output_is_allowed() {
        let mut c = config("");
        c.output[0].name = "IN".into();
        validate(&c).unwrap();
    }

    #[test]
    fn missing_data_type_is_rejected() {
        let mut c = config("");
        c.input[0].data_type = 0;
        let e = err(&c);
        assert!(e.contains("input 'IN' must specify data_type"), "{e}");
    }

    #[test]
    fn unknown_data_type_number_is_rejected() {
        let mut c = config("");
        c.output[0].data_type = 99;
        assert!(err(&c).contains("unknown data_type 99"));
    }

    #[test]
    fn empty_dims_are_rejected() {
        let mut c = config("");
        c.input[0].dims.clear();
        assert!(err(&c).contains("must specify dims"));
    }

    #[test]
    fn wildcard_dims_are_accepted() {
        let mut c = config("");
        c.input[0].dims = vec![-1, 3];
        validate(&c).unwrap();
    }

    #[test]
    fn dims_below_minus_one_or_zero_are_rejected() {
        for bad in [-2, 0] {
            let mut c = config("");
            c.input[0].dims = vec![4, bad];
            let e = err(&c);
            assert!(e.contains(&format!("dimension {bad}")), "{e}");
        }
    }

    #[test]
    fn reshape_with_the_same_element_count_is_accepted() {
        let mut c = config("");
        c.input[0].dims = vec![2, 4, -1, 6];
        c.input[0].reshape = Some(ModelTensorReshape {
            shape: vec![8, -1, 1, 6],
        });
        validate(&c).unwrap();
    }

    #[test]
    fn reshape_with_a_different_element_count_is_rejected() {
        let mut c = config("");
        c.input[0].reshape = Some(ModelTensorReshape { shape: vec![4, 5] });
        let e = err(&c);
        assert!(e.contains("do not hold the same number of elements"), "{e}");
    }

    #[test]
    fn reshape_with_misplaced_wildcards_is_rejected() {
        let mut c = config("");
        c.input[0].dims = vec![2, -1, 3];
        c.input[0].reshape = Some(ModelTensorReshape { shape: vec![-1, 6] });
        assert!(err(&c).contains("same number of elements"));
    }

    #[test]
    fn empty_reshape_of_one_element_is_accepted_when_batching() {
        let mut c = config("");
        c.output[0].dims = vec![1];
        c.output[0].reshape = Some(ModelTensorReshape { shape: vec![] });
        validate(&c).unwrap();
    }

    #[test]
    fn empty_reshape_without_batching_is_rejected() {
        let mut c = config("");
        c.max_batch_size = 0;
        c.output[0].dims = vec![1];
        c.output[0].reshape = Some(ModelTensorReshape { shape: vec![] });
        assert!(err(&c).contains("empty reshape"));
    }

    #[test]
    fn preferred_batch_size_above_max_is_rejected() {
        let c = config("dynamic_batching { preferred_batch_size: [ 4, 16 ] }");
        let e = err(&c);
        assert!(
            e.contains("preferred_batch_size 16") && e.contains("(8)"),
            "{e}"
        );
    }

    #[test]
    fn zero_preferred_batch_size_is_rejected() {
        assert!(
            err(&config("dynamic_batching { preferred_batch_size: [ 0 ] }"))
                .contains("preferred_batch_size 0")
        );
    }

    #[test]
    fn dynamic_batching_without_batching_is_rejected() {
        let mut c = config("dynamic_batching { }");
        c.max_batch_size = 0;
        assert!(err(&c).contains("requires batching"));
    }

    #[test]
    fn default_priority_level_out_of_range_is_rejected() {
        let e = err(&config(
            "dynamic_batching { priority_levels: 2 default_priority_level: 3 }",
        ));
        assert!(e.contains("default_priority_level is 3"), "{e}");
        let e = err(&config("dynamic_batching { priority_levels: 2 }"));
        assert!(e.contains("default_priority_level is 0"), "{e}");
    }

    #[test]
    fn priority_queue_policy_key_out_of_range_is_rejected() {
        let e = err(&config(
            "dynamic_batching { priority_levels: 2 default_priority_level: 1 \
             priority_queue_policy { key: 3 value: { max_queue_size: 1 } } }",
        ));
        assert!(e.contains("priority level 3"), "{e}");
    }

    #[test]
    fn valid_priorities_are_accepted() {
        validate(&config(
            "dynamic_batching { priority_levels: 3 default_priority_level: 2 \
             priority_queue_policy { key: 1 value: { timeout_action: DELAY default_timeout_microseconds: 10 } } }",
        ))
        .unwrap();
    }

    #[test]
    fn preserve_ordering_with_delay_policy_is_rejected() {
        let e = err(&config(
            "dynamic_batching { preserve_ordering: true \
             default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 10 } }",
        ));
        assert!(e.contains("DELAY"), "{e}");
    }

    #[test]
    fn negative_instance_count_is_rejected() {
        let e = err(&config("instance_group [ { name: \"g\" count: -1 } ]"));
        assert!(e.contains("instance_group 'g' has count -1"), "{e}");
    }

    #[test]
    fn zero_instance_count_is_accepted() {
        validate(&config("instance_group [ { count: 0 } ]")).unwrap();
    }

    #[test]
    fn unknown_instance_kind_is_rejected() {
        let mut c = config("instance_group [ { count: 1 } ]");
        c.instance_group[0].kind = 9;
        assert!(err(&c).contains("unknown kind 9"));
    }

    #[test]
    fn cpu_instance_group_listing_gpus_is_rejected() {
        let e = err(&config("instance_group [ { kind: KIND_CPU gpus: [ 0 ] } ]"));
        assert!(e.contains("KIND_CPU") && e.contains("gpus"), "{e}");
    }

    #[test]
    fn latest_policy_with_zero_versions_is_rejected() {
        let e = err(&config("version_policy { latest { num_versions: 0 } }"));
        assert!(e.contains("num_versions"), "{e}");
    }

    #[test]
    fn ensemble_platform_without_scheduling_is_rejected() {
        let mut c = config("");
        c.platform = "ensemble".into();
        assert!(err(&c).contains("requires ensemble_scheduling"));
    }

    #[test]
    fn ensemble_without_outputs_is_rejected() {
        let mut c =
            config("platform: \"ensemble\" ensemble_scheduling { step [ { model_name: \"a\" } ] }");
        validate(&c).unwrap();
        c.output.clear();
        assert!(err(&c).contains("no output"));
    }
    #[test]
    fn batch_inputs_need_one_known_source_and_int32_or_fp32() {
        let bi = |body: &str| err(&config(&format!("batch_input [ {{ {body} }} ]")));
        assert!(
            bi("kind: BATCH_ELEMENT_COUNT target_name: \"B\" data_type: TYPE_FP32").contains(
                "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, got 0 for m"
            )
        );
        assert!(bi("kind: BATCH_ITEM_SHAPE target_name: \"B\" data_type: TYPE_FP32 source_input: [\"IN\", \"IN\"]")
            .contains("batch input kind 'BATCH_ITEM_SHAPE' expects 1 source input, got 2"));
        assert!(bi("kind: BATCH_ELEMENT_COUNT target_name: \"B\" data_type: TYPE_FP32 source_input: \"NOPE\"")
            .contains("unknown source input name 'NOPE'"));
        assert!(bi("kind: BATCH_ELEMENT_COUNT target_name: \"B\" data_type: TYPE_INT64 source_input: \"IN\"")
            .contains("batch input data type must be TYPE_INT32 or TYPE_FP32"));
        validate(&config(
            "batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: \"B\" data_type: TYPE_INT32 source_input: \"IN\" } ]",
        ))
        .unwrap();
    }

    #[test]
    fn batch_outputs_need_one_known_source_and_known_targets_once() {
        let bo = |body: &str| err(&config(&format!("batch_output [ {{ {body} }} ]")));
        assert!(
            bo("target_name: \"OUT\" kind: BATCH_SCATTER_WITH_INPUT_SHAPE").contains(
                "batch output kind 'BATCH_SCATTER_WITH_INPUT_SHAPE' expects 1 source input, got 0"
            )
        );
        assert!(bo("target_name: \"OUT\" source_input: \"X\"")
            .contains("unknown source input name 'X'"));
        assert!(bo("target_name: \"NOPE\" source_input: \"IN\"")
            .contains("unknown target output name 'NOPE'"));
        assert!(bo("target_name: [\"OUT\", \"OUT\"] source_input: \"IN\"")
            .contains("target output name 'OUT' can only be specified once"));
        validate(&config(
            "batch_output [ { target_name: \"OUT\" source_input: \"IN\" } ]",
        ))
        .unwrap();
    }
}
