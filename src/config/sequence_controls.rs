//! The sequence batcher's control inputs (`sequence_batching.control_input`:
//! START, END, READY, CORRID) compiled once into a typed [`SequenceControls`],
//! with Triton's checks and phrasings. The sequence batcher (which feeds the
//! controls), the built-in sequence models and ONNX (which read or declare
//! them) all take this one value, so they cannot disagree on what a
//! configuration means; each keeps only its own requirements (for example
//! "this backend needs a START control").

use anyhow::{anyhow, bail};

use crate::{
    proto::inference::{
        model_config::SchedulingChoice,
        model_sequence_batching::{control::Kind, Control},
        ModelConfig, ModelSequenceBatching,
    },
    types::DataType,
};

/// The false/true pair of a START, END or READY control.
#[derive(Debug, Clone, PartialEq)]
pub enum FlagValues {
    Int32([i32; 2]),
    Fp32([f32; 2]),
    Bool([bool; 2]),
}

impl FlagValues {
    pub fn datatype(&self) -> DataType {
        match self {
            FlagValues::Int32(_) => DataType::Int32,
            FlagValues::Fp32(_) => DataType::Fp32,
            FlagValues::Bool(_) => DataType::Bool,
        }
    }

    /// The configuration field the pair came from, for messages.
    pub fn field(&self) -> &'static str {
        match self {
            FlagValues::Int32(_) => "int32_false_true",
            FlagValues::Fp32(_) => "fp32_false_true",
            FlagValues::Bool(_) => "bool_false_true",
        }
    }

    /// Appends one element (little-endian) for `on`.
    pub fn push(&self, on: bool, out: &mut Vec<u8>) {
        let i = usize::from(on);
        match self {
            FlagValues::Int32(v) => out.extend_from_slice(&v[i].to_le_bytes()),
            FlagValues::Fp32(v) => out.extend_from_slice(&v[i].to_le_bytes()),
            FlagValues::Bool(v) => out.push(u8::from(v[i])),
        }
    }

    /// Whether each element of `data` (little-endian elements of
    /// [`Self::datatype`]) is the pair's true value.
    pub fn read_flags(&self, data: &[u8]) -> Vec<bool> {
        match self {
            FlagValues::Int32([_, t]) => data
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) == *t)
                .collect(),
            FlagValues::Fp32([_, t]) => data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) == *t)
                .collect(),
            FlagValues::Bool([_, t]) => data.iter().map(|&b| (b != 0) == *t).collect(),
        }
    }
}

/// A START, END or READY control: its tensor and encoding.
#[derive(Debug, Clone, PartialEq)]
pub struct FlagControl {
    pub name: String,
    pub values: FlagValues,
}

/// The CORRID control: its tensor and datatype.
#[derive(Debug, Clone, PartialEq)]
pub struct CorridControl {
    pub name: String,
    /// UINT64, INT64, UINT32, INT32 or BYTES (`TYPE_STRING`).
    pub datatype: DataType,
}

/// Every control input of a configuration; all `None` without
/// `sequence_batching` or without control inputs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SequenceControls {
    pub start: Option<FlagControl>,
    pub end: Option<FlagControl>,
    pub ready: Option<FlagControl>,
    pub corrid: Option<CorridControl>,
}

impl SequenceControls {
    /// The controls of `config`'s `sequence_batching` (none without it).
    pub fn from_config(config: &ModelConfig) -> anyhow::Result<Self> {
        match &config.scheduling_choice {
            Some(SchedulingChoice::SequenceBatching(sb)) => {
                Self::from_sequence_batching(sb, &config.name)
            }
            _ => Ok(Self::default()),
        }
    }

    /// The controls of `sb`, checked as Triton checks them; `model` names
    /// the model in errors.
    pub fn from_sequence_batching(sb: &ModelSequenceBatching, model: &str) -> anyhow::Result<Self> {
        Ok(Self {
            start: flag_control(sb, model, Kind::ControlSequenceStart)?,
            end: flag_control(sb, model, Kind::ControlSequenceEnd)?,
            ready: flag_control(sb, model, Kind::ControlSequenceReady)?,
            corrid: corrid_control(sb, model)?,
        })
    }

    /// The START, END or READY control; `None` for CORRID or an absent one.
    pub fn flag(&self, kind: Kind) -> Option<&FlagControl> {
        match kind {
            Kind::ControlSequenceStart => self.start.as_ref(),
            Kind::ControlSequenceEnd => self.end.as_ref(),
            Kind::ControlSequenceReady => self.ready.as_ref(),
            Kind::ControlSequenceCorrid => None,
        }
    }

    /// Each control tensor with the datatype the batcher sends, START, END,
    /// READY then CORRID.
    pub fn tensors(&self) -> impl Iterator<Item = (&str, DataType)> {
        [&self.start, &self.end, &self.ready]
            .into_iter()
            .filter_map(|f| f.as_ref().map(|f| (f.name.as_str(), f.values.datatype())))
            .chain(self.corrid.as_ref().map(|c| (c.name.as_str(), c.datatype)))
    }
}

/// The one control of `kind`, with Triton's checks on names and duplicates.
fn find_control<'a>(
    sb: &'a ModelSequenceBatching,
    model: &str,
    kind: Kind,
) -> anyhow::Result<Option<(&'a str, &'a Control)>> {
    let mut seen_tensors = std::collections::HashSet::new();
    let mut found = None;
    for input in &sb.control_input {
        if input.name.is_empty() {
            bail!("sequence batching control tensor must have a name for {model}");
        }
        if !seen_tensors.insert(input.name.as_str()) {
            bail!(
                "sequence batching control tensor '{}' is specified for multiple control kinds for {model}",
                input.name
            );
        }
        for c in &input.control {
            if c.kind == kind as i32 {
                if found.is_some() {
                    bail!(
                        "sequence batching specifies multiple {} tensors for {model}",
                        kind.as_str_name()
                    );
                }
                found = Some((input.name.as_str(), c));
            }
        }
    }
    Ok(found)
}

fn flag_control(
    sb: &ModelSequenceBatching,
    model: &str,
    kind: Kind,
) -> anyhow::Result<Option<FlagControl>> {
    let Some((name, c)) = find_control(sb, model, kind)? else {
        return Ok(None);
    };
    let k = kind.as_str_name();
    let set = [
        !c.int32_false_true.is_empty(),
        !c.fp32_false_true.is_empty(),
        !c.bool_false_true.is_empty(),
    ];
    match set.iter().filter(|s| **s).count() {
        0 => bail!("sequence batching must specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' for {k} for {model}"),
        1 => {}
        _ => bail!("sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' and 'bool_false_true' for {k} for {model}"),
    }
    let pair_error = |field: &str| {
        anyhow!(
            "sequence batching control '{field}' must have exactly 2 entries for {k} for {model}"
        )
    };
    let values = if set[0] {
        FlagValues::Int32(
            c.int32_false_true
                .as_slice()
                .try_into()
                .map_err(|_| pair_error("int32_false_true"))?,
        )
    } else if set[1] {
        FlagValues::Fp32(
            c.fp32_false_true
                .as_slice()
                .try_into()
                .map_err(|_| pair_error("fp32_false_true"))?,
        )
    } else {
        FlagValues::Bool(
            c.bool_false_true
                .as_slice()
                .try_into()
                .map_err(|_| pair_error("bool_false_true"))?,
        )
    };
    Ok(Some(FlagControl {
        name: name.to_string(),
        values,
    }))
}

fn corrid_control(
    sb: &ModelSequenceBatching,
    model: &str,
) -> anyhow::Result<Option<CorridControl>> {
    let kind = Kind::ControlSequenceCorrid;
    let Some((name, c)) = find_control(sb, model, kind)? else {
        return Ok(None);
    };
    let k = kind.as_str_name();
    if !c.int32_false_true.is_empty()
        || !c.fp32_false_true.is_empty()
        || !c.bool_false_true.is_empty()
    {
        bail!("sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' for {k} for {model}");
    }
    let datatype = match DataType::from_config_i32(c.data_type) {
        Some(
            dt @ (DataType::Uint64
            | DataType::Int64
            | DataType::Uint32
            | DataType::Int32
            | DataType::Bytes),
        ) => dt,
        _ => bail!("unexpected data type for control {k} for {model}. Allowed data types are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING"),
    };
    Ok(Some(CorridControl {
        name: name.to_string(),
        datatype,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_model_config;

    const BASE: &str = r#"name: "m" max_batch_size: 2
        input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]"#;

    fn controls(controls: &str) -> anyhow::Result<SequenceControls> {
        let c = parse_model_config(&format!(
            "{BASE} sequence_batching {{ control_input [ {controls} ] }}"
        ))
        .expect("parses");
        SequenceControls::from_config(&c)
    }

    #[test]
    fn compiles_every_kind_and_lists_tensors_in_order() {
        let c = controls(
            r#"{ name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] },
               { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
               { name: "SE" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] },
                                      { kind: CONTROL_SEQUENCE_END int32_false_true: [ 3, 4 ] } ] }"#,
        )
        .unwrap();
        assert_eq!(
            c.start.as_ref().unwrap().values,
            FlagValues::Fp32([0.0, 1.0])
        );
        assert_eq!(
            c.flag(Kind::ControlSequenceEnd).unwrap().values,
            FlagValues::Int32([3, 4])
        );
        assert_eq!(c.flag(Kind::ControlSequenceCorrid), None);
        assert_eq!(
            c.tensors().collect::<Vec<_>>(),
            [
                ("SE", DataType::Fp32),
                ("SE", DataType::Int32),
                ("READY", DataType::Bool),
                ("CORRID", DataType::Bytes)
            ]
        );
        let end = &c.end.as_ref().unwrap().values;
        let mut bytes = Vec::new();
        end.push(true, &mut bytes);
        end.push(false, &mut bytes);
        assert_eq!(end.read_flags(&bytes), [true, false]);
        let ready = &c.ready.as_ref().unwrap().values;
        assert_eq!(ready.read_flags(&[1, 0]), [true, false]);
        assert_eq!(ready.field(), "bool_false_true");
    }

    #[test]
    fn none_without_sequence_batching() {
        let c = parse_model_config(BASE).unwrap();
        assert_eq!(
            SequenceControls::from_config(&c).unwrap(),
            SequenceControls::default()
        );
    }

    #[test]
    fn tritons_checks_and_texts() {
        let bad = |c: &str| controls(c).unwrap_err().to_string();
        assert_eq!(
            bad(
                r#"{ name: "" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }"#
            ),
            "sequence batching control tensor must have a name for m"
        );
        assert_eq!(
            bad(r#"{ name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_INT64 int32_false_true: [ 0, 1 ] } ] }"#),
            "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' for CONTROL_SEQUENCE_CORRID for m"
        );
        assert_eq!(
            bad(r#"{ name: "S" control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ true, false, true ] } ] }"#),
            "sequence batching control 'bool_false_true' must have exactly 2 entries for CONTROL_SEQUENCE_END for m"
        );
    }
}
