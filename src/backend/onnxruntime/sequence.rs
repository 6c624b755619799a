//! The tensors a stateful model exchanges with the sequence batcher beyond
//! its configuration's `input` and `output` lists: control inputs
//! (`sequence_batching.control_input`) and implicit state
//! (`sequence_batching.state`). As in Triton's onnxruntime backend, they are
//! graph inputs/outputs that the configuration does not list; auto-complete
//! leaves them out and the load-time check accepts them, but checks that the
//! graph has each one with the datatype the batcher will send. Controls come
//! from `config::SequenceControls`, the parser the sequence batcher uses.

use crate::{
    config::SequenceControls,
    proto::inference::{model_config::SchedulingChoice, ModelConfig},
    types::DataType,
};

/// What a sequence-batched graph input or output is for; named in errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    Control,
    StateInput,
    StateOutput,
}

impl Role {
    pub(super) fn describe(self) -> &'static str {
        match self {
            Role::Control => "sequence control input",
            Role::StateInput => "implicit state input",
            Role::StateOutput => "implicit state output",
        }
    }
}

/// One tensor the sequence batcher feeds or reads.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct SequenceTensor {
    pub name: String,
    pub role: Role,
    /// The datatype the batcher uses; `None` for a state whose data_type
    /// is invalid (left for the sequence batcher's checks to refuse).
    pub dtype: Option<DataType>,
    /// Dims without the batch dimension (`-1` variable): `[1]` for controls,
    /// the state's `dims` for state tensors.
    pub dims: Vec<i64>,
    /// Where the configuration says so, for error messages: "(int32_false_true)".
    pub dtype_source: &'static str,
}

/// The control and state tensors of a configuration; empty without
/// `sequence_batching`.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct SequenceTensors {
    pub tensors: Vec<SequenceTensor>,
}

impl SequenceTensors {
    /// Errors where the configuration's control inputs break Triton's
    /// rules (the same check, and text, as the sequence batcher's).
    pub(super) fn from_config(config: &ModelConfig) -> anyhow::Result<Self> {
        let Some(SchedulingChoice::SequenceBatching(seq)) = &config.scheduling_choice else {
            return Ok(Self::default());
        };
        let controls = SequenceControls::from_sequence_batching(seq, &config.name)?;
        let mut tensors: Vec<SequenceTensor> =
            Vec::with_capacity(seq.control_input.len() + 2 * seq.state.len());
        let flags = [&controls.start, &controls.end, &controls.ready];
        let flag_tensors = flags
            .into_iter()
            .flatten()
            .map(|f| (f.name.as_str(), f.values.datatype(), f.values.field()));
        let corrid_tensor = controls
            .corrid
            .as_ref()
            .map(|c| (c.name.as_str(), c.datatype, "CORRID data_type"));
        for (name, dtype, dtype_source) in flag_tensors.chain(corrid_tensor) {
            // One tensor may carry several flag kinds; the batcher sends it once.
            if tensors.iter().any(|t| t.name == name) {
                continue;
            }
            tensors.push(SequenceTensor {
                name: name.to_string(),
                role: Role::Control,
                dtype: Some(dtype),
                dims: vec![1],
                dtype_source,
            });
        }
        for state in &seq.state {
            let dtype = DataType::from_config_i32(state.data_type);
            for (name, role) in [
                (&state.input_name, Role::StateInput),
                (&state.output_name, Role::StateOutput),
            ] {
                tensors.push(SequenceTensor {
                    name: name.clone(),
                    role,
                    dtype,
                    dims: state.dims.clone(),
                    dtype_source: "state data_type",
                });
            }
        }
        Ok(Self { tensors })
    }

    /// The graph input `name` is fed by the sequence batcher (a control or
    /// a state input).
    pub(super) fn feeds(&self, name: &str) -> Option<&SequenceTensor> {
        self.tensors
            .iter()
            .find(|t| t.name == name && t.role != Role::StateOutput)
    }

    /// The graph output `name` is an implicit state output.
    pub(super) fn is_state_output(&self, name: &str) -> bool {
        self.tensors
            .iter()
            .any(|t| t.name == name && t.role == Role::StateOutput)
    }
}
