//! The tensors a stateful model exchanges with the sequence batcher beyond
//! its configuration's `input` and `output` lists: control inputs
//! (`sequence_batching.control_input`) and implicit state
//! (`sequence_batching.state`). As in Triton's onnxruntime backend, they are
//! graph inputs/outputs that the configuration does not list; auto-complete
//! leaves them out and the load-time check accepts them, but checks that the
//! graph has each one with the datatype the batcher will send.

use crate::{
    proto::inference::{
        model_config::SchedulingChoice,
        model_sequence_batching::{control::Kind, ControlInput},
        ModelConfig,
    },
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
    /// The datatype the batcher uses; `None` where the configuration does
    /// not say (left for the configuration's own validation to refuse).
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
    pub(super) fn from_config(config: &ModelConfig) -> Self {
        let Some(SchedulingChoice::SequenceBatching(seq)) = &config.scheduling_choice else {
            return Self::default();
        };
        let mut tensors = Vec::with_capacity(seq.control_input.len() + 2 * seq.state.len());
        for control in &seq.control_input {
            let (dtype, dtype_source) = control_dtype(control);
            tensors.push(SequenceTensor {
                name: control.name.clone(),
                role: Role::Control,
                dtype,
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
        Self { tensors }
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

/// The datatype the sequence batcher sends for a control input, from its
/// first control (Triton allows several kinds on one tensor only for
/// START/END/READY, which share the false/true encoding).
fn control_dtype(control: &ControlInput) -> (Option<DataType>, &'static str) {
    let Some(first) = control.control.first() else {
        return (None, "no control");
    };
    if Kind::try_from(first.kind) == Ok(Kind::ControlSequenceCorrid) {
        return (
            DataType::from_config_i32(first.data_type),
            "CORRID data_type",
        );
    }
    if !first.int32_false_true.is_empty() {
        (Some(DataType::Int32), "int32_false_true")
    } else if !first.fp32_false_true.is_empty() {
        (Some(DataType::Fp32), "fp32_false_true")
    } else if !first.bool_false_true.is_empty() {
        (Some(DataType::Bool), "bool_false_true")
    } else {
        (None, "no false/true values")
    }
}
