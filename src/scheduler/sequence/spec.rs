//! `sequence_batching` compiled once at load time: strategy, control
//! tensors (parsed by `config::sequence_controls`, which the backends read
//! too) and implicit states, checked as Triton checks them (same
//! phrasings), so the request path never re-reads the configuration.

use std::{path::Path, time::Duration};

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;

pub use crate::config::sequence_controls::FlagControl;
use crate::{
    config::SequenceControls,
    proto::inference::{
        model_sequence_batching::{initial_state::StateData, StrategyChoice},
        ModelConfig, ModelSequenceBatching,
    },
    types::DataType,
};

/// Triton's default `max_sequence_idle_microseconds`.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(1);

/// How sequences share an instance's batch slots.
#[derive(Debug, Clone, PartialEq)]
pub enum Strategy {
    /// Each sequence owns one batch slot of one instance for its life;
    /// empty slots below the highest ready one run as not-ready padding.
    Direct {
        max_queue_delay: Duration,
        /// Fraction of an instance's slots that must be ready before it
        /// executes without waiting out `max_queue_delay` (0: never wait).
        minimum_slot_utilization: f32,
    },
    /// Up to `max_candidates` sequences per instance, each with at most one
    /// request in flight, batched dynamically.
    Oldest {
        max_candidates: usize,
        preferred_batch_sizes: Vec<usize>,
        max_queue_delay: Duration,
        preserve_ordering: bool,
    },
}

/// One implicit state: the model's `output` of one request becomes its
/// `input` on the next request of the same sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct StateSpec {
    pub input: String,
    pub output: String,
    pub datatype: DataType,
    /// Per-item dims (`-1` = variable).
    pub dims: Vec<i64>,
    /// What a starting request gets: the configured initial state, else
    /// zeros with every variable dim 1 (Triton leaves it uninitialised;
    /// zeros are what a model can rely on).
    pub initial: InitialState,
}

#[derive(Debug, Clone, PartialEq)]
pub struct InitialState {
    /// Per-item dims of the initial value.
    pub dims: Vec<i64>,
    /// Raw data of one item (row).
    pub data: Bytes,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SequenceSpec {
    pub strategy: Strategy,
    pub idle: Duration,
    pub controls: SequenceControls,
    pub states: Vec<StateSpec>,
    /// `max_batch_size > 0`: tensors carry a batch dimension.
    pub batched: bool,
    pub max_batch_size: usize,
    /// Slots of one instance: `max_batch_size` (1 when 0) for direct,
    /// `max_candidate_sequences` for oldest.
    pub slots_per_instance: usize,
}

impl SequenceSpec {
    /// Compiles the configuration's `sequence_batching`, if any.
    /// `model_dir` is where `initial_state/<data_file>` is read from.
    pub fn from_config(config: &ModelConfig, model_dir: &Path) -> anyhow::Result<Option<Self>> {
        let Some(sb) = sequence_batching(config) else {
            return Ok(None);
        };
        let name = &config.name;
        if sb.iterative_sequence {
            bail!("model '{name}': sequence_batching iterative_sequence is not supported yet by shardserve");
        }
        let controls = SequenceControls::from_sequence_batching(sb, name)?;
        let max_batch_size = config.max_batch_size.max(0) as usize;
        let strategy = match &sb.strategy_choice {
            None => Strategy::Direct {
                max_queue_delay: Duration::ZERO,
                minimum_slot_utilization: 0.0,
            },
            Some(StrategyChoice::Direct(d)) => {
                let u = d.minimum_slot_utilization;
                if !(0.0..=1.0).contains(&u) {
                    bail!("sequence batching minimum slot utilization must be in range (0.0, 1.0] for {name}");
                }
                Strategy::Direct {
                    max_queue_delay: Duration::from_micros(d.max_queue_delay_microseconds),
                    minimum_slot_utilization: u,
                }
            }
            Some(StrategyChoice::Oldest(o)) => {
                let mut preferred = Vec::with_capacity(o.preferred_batch_size.len());
                for &size in &o.preferred_batch_size {
                    if size <= 0 {
                        bail!("sequence batching preferred batch size must be positive for {name}");
                    }
                    if size as usize > max_batch_size.max(1) {
                        bail!("sequence batching preferred batch size must be <= max batch size for {name}");
                    }
                    preferred.push(size as usize);
                }
                preferred.sort_unstable();
                preferred.dedup();
                if o.max_candidate_sequences < 0 {
                    bail!(
                        "sequence batching max_candidate_sequences must not be negative for {name}"
                    );
                }
                Strategy::Oldest {
                    max_candidates: o.max_candidate_sequences as usize,
                    preferred_batch_sizes: preferred,
                    max_queue_delay: Duration::from_micros(o.max_queue_delay_microseconds),
                    preserve_ordering: o.preserve_ordering,
                }
            }
        };
        let slots_per_instance = match &strategy {
            Strategy::Direct { .. } => max_batch_size.max(1),
            // Filled in by `fill_defaults` when 0; guard anyway.
            Strategy::Oldest { max_candidates, .. } => (*max_candidates).max(1),
        };
        // Bounded so a hostile config cannot size a huge slot table.
        if slots_per_instance > MAX_SLOTS {
            bail!("model '{name}': sequence batching asks for {slots_per_instance} slots per instance; at most {MAX_SLOTS} are supported");
        }
        let mut states = Vec::with_capacity(sb.state.len());
        for s in &sb.state {
            states.push(state_spec(s, config, model_dir)?);
        }
        let idle = match sb.max_sequence_idle_microseconds {
            0 => DEFAULT_IDLE,
            us => Duration::from_micros(us),
        };
        Ok(Some(Self {
            strategy,
            idle,
            controls,
            states,
            batched: max_batch_size > 0,
            max_batch_size,
            slots_per_instance,
        }))
    }

    /// Names of the tensors the batcher supplies (controls and state
    /// inputs): a client must not send them and the config's `input`
    /// list does not hold them.
    pub fn supplied_inputs(&self) -> impl Iterator<Item = &str> {
        self.controls
            .tensors()
            .map(|(name, _)| name)
            .chain(self.states.iter().map(|s| s.input.as_str()))
    }
}

/// The largest slot table one instance may have.
pub const MAX_SLOTS: usize = 65_536;

fn sequence_batching(config: &ModelConfig) -> Option<&ModelSequenceBatching> {
    match &config.scheduling_choice {
        Some(crate::proto::inference::model_config::SchedulingChoice::SequenceBatching(sb)) => {
            Some(sb)
        }
        _ => None,
    }
}

/// Largest initial state accepted (one item), so a config cannot make the
/// server allocate without bound.
const MAX_INITIAL_STATE_BYTES: usize = 64 << 20;

fn state_spec(
    s: &crate::proto::inference::model_sequence_batching::State,
    config: &ModelConfig,
    model_dir: &Path,
) -> anyhow::Result<StateSpec> {
    let model = &config.name;
    if s.input_name.is_empty() || s.output_name.is_empty() {
        bail!("model '{model}': sequence batching state must name both input_name and output_name");
    }
    let datatype = DataType::from_config_i32(s.data_type).ok_or_else(|| {
        anyhow!(
            "model '{model}': sequence batching state '{}' has no valid data_type",
            s.input_name
        )
    })?;
    if s.dims.iter().any(|&d| d == 0 || d < -1) {
        bail!(
            "model '{model}': sequence batching state '{}' has invalid dims {:?}",
            s.input_name,
            s.dims
        );
    }
    if config.input.iter().any(|i| i.name == s.input_name) {
        bail!(
            "model '{model}': state input '{}' must not also be listed in 'input' (the sequence batcher supplies it)",
            s.input_name
        );
    }
    if let Some(o) = config.output.iter().find(|o| o.name == s.output_name) {
        if o.data_type != s.data_type {
            bail!(
                "model '{model}': state output '{}' is listed in 'output' with a different data_type than the state",
                s.output_name
            );
        }
    }
    let initial = match s.initial_state.as_slice() {
        [] => {
            // Triton: every variable dim is 1 on the starting request.
            let dims: Vec<i64> = s.dims.iter().map(|&d| if d < 0 { 1 } else { d }).collect();
            zero_state(&dims, datatype, model, &s.input_name)?
        }
        [init] => initial_state(init, s, datatype, model, model_dir)?,
        _ => bail!(
            "model '{model}': sequence batching state '{}' has more than one initial_state",
            s.input_name
        ),
    };
    Ok(StateSpec {
        input: s.input_name.clone(),
        output: s.output_name.clone(),
        datatype,
        dims: s.dims.clone(),
        initial,
    })
}

fn item_bytes(dims: &[i64], datatype: DataType, model: &str, state: &str) -> anyhow::Result<usize> {
    let elements = crate::types::element_count(dims)
        .ok_or_else(|| anyhow!("model '{model}': state '{state}' has invalid dims {dims:?}"))?;
    // BYTES state: each element at least its 4-byte length.
    let size = datatype.element_size().unwrap_or(4);
    elements
        .checked_mul(size)
        .filter(|&n| n <= MAX_INITIAL_STATE_BYTES)
        .ok_or_else(|| anyhow!("model '{model}': initial state of '{state}' would exceed {MAX_INITIAL_STATE_BYTES} bytes"))
}

fn zero_state(
    dims: &[i64],
    datatype: DataType,
    model: &str,
    state: &str,
) -> anyhow::Result<InitialState> {
    // A zero BYTES element is an empty string: a 4-byte zero length.
    let bytes = item_bytes(dims, datatype, model, state)?;
    Ok(InitialState {
        dims: dims.to_vec(),
        data: Bytes::from(vec![0u8; bytes]),
    })
}

fn initial_state(
    init: &crate::proto::inference::model_sequence_batching::InitialState,
    s: &crate::proto::inference::model_sequence_batching::State,
    datatype: DataType,
    model: &str,
    model_dir: &Path,
) -> anyhow::Result<InitialState> {
    let state = &s.input_name;
    if init.data_type != s.data_type {
        bail!(
            "model '{model}': the initial_state of state '{state}' must have the state's data_type"
        );
    }
    if init.dims.iter().any(|&d| d < 0) {
        bail!(
            "model '{model}': the initial_state of state '{state}' must have fixed dims, got {:?}",
            init.dims
        );
    }
    if init.dims.len() != s.dims.len()
        || init
            .dims
            .iter()
            .zip(&s.dims)
            .any(|(&i, &d)| d >= 0 && i != d)
    {
        bail!(
            "model '{model}': the initial_state dims {:?} of state '{state}' do not match the state dims {:?}",
            init.dims,
            s.dims
        );
    }
    match &init.state_data {
        Some(StateData::ZeroData(true)) => zero_state(&init.dims, datatype, model, state),
        Some(StateData::DataFile(file)) => {
            let rel = Path::new(file);
            if rel.is_absolute()
                || rel.components().any(|c| !matches!(c, std::path::Component::Normal(_)))
            {
                bail!("model '{model}': initial_state data_file '{file}' must be a plain path inside the model's initial_state folder");
            }
            let path = model_dir.join("initial_state").join(rel);
            let expected = item_bytes(&init.dims, datatype, model, state)?;
            let meta = std::fs::metadata(&path)
                .with_context(|| format!("model '{model}': reading initial state file {}", path.display()))?;
            if meta.len() > MAX_INITIAL_STATE_BYTES as u64 {
                bail!("model '{model}': initial state file {} is larger than {MAX_INITIAL_STATE_BYTES} bytes", path.display());
            }
            let data = std::fs::read(&path)
                .with_context(|| format!("model '{model}': reading initial state file {}", path.display()))?;
            if datatype != DataType::Bytes && data.len() != expected {
                bail!(
                    "model '{model}': initial state file {} holds {} bytes, but dims {:?} of {datatype} need {expected}",
                    path.display(),
                    data.len(),
                    init.dims
                );
            }
            if datatype == DataType::Bytes {
                let n = crate::types::bytes_elements(&data)
                    .map_err(|e| anyhow!("model '{model}': initial state file {}: {e}", path.display()))?
                    .count();
                let want = crate::types::element_count(&init.dims).unwrap_or(usize::MAX);
                if n != want {
                    bail!("model '{model}': initial state file {} holds {n} strings, dims {:?} need {want}", path.display(), init.dims);
                }
            }
            Ok(InitialState {
                dims: init.dims.clone(),
                data: Bytes::from(data),
            })
        }
        _ => bail!("model '{model}': the initial_state of state '{state}' must set zero_data: true or data_file"),
    }
}

/// Triton's defaults for a loaded config (shown by `/config`): the idle
/// timeout, and for `oldest` the preferred batch size and candidates.
pub fn fill_defaults(config: &mut ModelConfig) {
    let max_batch = config.max_batch_size;
    if let Some(crate::proto::inference::model_config::SchedulingChoice::SequenceBatching(sb)) =
        &mut config.scheduling_choice
    {
        if sb.max_sequence_idle_microseconds == 0 {
            sb.max_sequence_idle_microseconds = DEFAULT_IDLE.as_micros() as u64;
        }
        if let Some(StrategyChoice::Oldest(o)) = &mut sb.strategy_choice {
            if o.preferred_batch_size.is_empty() && max_batch > 0 {
                o.preferred_batch_size.push(max_batch);
            }
            if o.max_candidate_sequences == 0 {
                o.max_candidate_sequences = max_batch.max(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{parse_model_config, sequence_controls::FlagValues};

    fn spec(text: &str) -> anyhow::Result<Option<SequenceSpec>> {
        let c = parse_model_config(text).expect("parses");
        SequenceSpec::from_config(&c, Path::new("/nonexistent"))
    }

    const BASE: &str = r#"name: "m" max_batch_size: 2
        input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]"#;

    #[test]
    fn direct_with_controls_compiles() {
        let s = spec(&format!(
            r#"{BASE} sequence_batching {{ max_sequence_idle_microseconds: 5000000 direct {{ }}
              control_input [
                {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] }} ] }},
                {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }},
                {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING }} ] }}
              ] }}"#
        ))
        .unwrap()
        .unwrap();
        assert_eq!(s.slots_per_instance, 2);
        assert_eq!(s.idle, Duration::from_secs(5));
        assert_eq!(
            s.controls.start.as_ref().unwrap().values,
            FlagValues::Fp32([0.0, 1.0])
        );
        assert_eq!(
            s.controls.ready.as_ref().unwrap().values,
            FlagValues::Int32([0, 1])
        );
        assert!(s.controls.end.is_none());
        assert_eq!(
            s.controls.corrid.as_ref().unwrap().datatype,
            DataType::Bytes
        );
        assert_eq!(
            s.supplied_inputs().collect::<Vec<_>>(),
            ["START", "READY", "CORRID"]
        );
    }

    #[test]
    fn tritons_control_checks() {
        let bad = |controls: &str| {
            spec(&format!(
                "{BASE} sequence_batching {{ control_input [ {controls} ] }}"
            ))
            .unwrap_err()
            .to_string()
        };
        assert_eq!(
            bad(r#"{ name: "S" control [ { kind: CONTROL_SEQUENCE_START } ] }"#),
            "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' for CONTROL_SEQUENCE_START for m"
        );
        assert_eq!(
            bad(r#"{ name: "S" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0 ] } ] }"#),
            "sequence batching control 'int32_false_true' must have exactly 2 entries for CONTROL_SEQUENCE_START for m"
        );
        assert_eq!(
            bad(r#"{ name: "S" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] fp32_false_true: [ 0, 1 ] } ] }"#),
            "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' and 'bool_false_true' for CONTROL_SEQUENCE_START for m"
        );
        assert_eq!(
            bad(
                r#"{ name: "S" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }, { name: "S" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] }"#
            ),
            "sequence batching control tensor 'S' is specified for multiple control kinds for m"
        );
        assert_eq!(
            bad(
                r#"{ name: "A" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }, { name: "B" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }"#
            ),
            "sequence batching specifies multiple CONTROL_SEQUENCE_READY tensors for m"
        );
        assert_eq!(
            bad(r#"{ name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 } ] }"#),
            "unexpected data type for control CONTROL_SEQUENCE_CORRID for m. Allowed data types are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING"
        );
    }

    #[test]
    fn oldest_checks_and_defaults() {
        let e = spec(&format!(
            "{BASE} sequence_batching {{ oldest {{ preferred_batch_size: [ 4 ] }} }}"
        ))
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "sequence batching preferred batch size must be <= max batch size for m"
        );
        let mut c =
            parse_model_config(&format!("{BASE} sequence_batching {{ oldest {{ }} }}")).unwrap();
        fill_defaults(&mut c);
        let s = SequenceSpec::from_config(&c, Path::new("/"))
            .unwrap()
            .unwrap();
        assert_eq!(s.idle, DEFAULT_IDLE);
        assert_eq!(
            s.strategy,
            Strategy::Oldest {
                max_candidates: 2,
                preferred_batch_sizes: vec![2],
                max_queue_delay: Duration::ZERO,
                preserve_ordering: false
            }
        );
    }

    #[test]
    fn states_and_initial_values() {
        let s = spec(&format!(
            r#"{BASE} sequence_batching {{ state [ {{ input_name: "IS" output_name: "OS" data_type: TYPE_INT32 dims: [ -1 ] }},
                {{ input_name: "IS2" output_name: "OS2" data_type: TYPE_FP32 dims: [ 2 ]
                   initial_state {{ data_type: TYPE_FP32 dims: [ 2 ] zero_data: true name: "z" }} }} ] }}"#
        ))
        .unwrap()
        .unwrap();
        assert_eq!(s.states[0].initial.dims, vec![1]);
        assert_eq!(s.states[0].initial.data.len(), 4);
        assert_eq!(s.states[1].initial.dims, vec![2]);
        assert_eq!(s.states[1].initial.data.len(), 8);
        let e = spec(&format!(
            r#"{BASE} sequence_batching {{ state [ {{ input_name: "IS" output_name: "OS" data_type: TYPE_INT32 dims: [ 1 ]
                   initial_state {{ data_type: TYPE_INT32 dims: [ 1 ] data_file: "../../etc/passwd" }} }} ] }}"#
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("must be a plain path"), "{e}");
        let e = spec(&format!(
            r#"{BASE} sequence_batching {{ state [ {{ input_name: "IS" output_name: "OS" data_type: TYPE_INT32 dims: [ 1 ]
                   initial_state {{ data_type: TYPE_INT32 dims: [ 1 ] data_file: "missing" }} }} ] }}"#
        ))
        .unwrap_err();
        assert!(format!("{e:#}").contains("initial_state/missing"), "{e:#}");
    }
}
