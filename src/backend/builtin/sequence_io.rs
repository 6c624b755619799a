//! What the built-in sequence models share: requiring the sequence
//! batcher's control inputs (START, END, READY, CORRID), as
//! `config::SequenceControls` compiled them, and reading those tensors row
//! by row.
//!
//! The batcher passes each control as an extra input: shape `[b, 1]` when
//! `max_batch_size > 0`, `[1]` otherwise. START/END/READY are INT32, FP32 or
//! BOOL holding the control's false/true pair; CORRID has the control's
//! `data_type` (UINT64, INT64, UINT32, INT32, or TYPE_STRING as BYTES holding
//! the id as text). Control tensors never come from a client, so a missing
//! or malformed one is an internal error, not the client's.

use bytes::Bytes;

use crate::{
    config::{sequence_controls, SequenceControls},
    proto::inference::{
        model_config::SchedulingChoice,
        model_sequence_batching::{control::Kind, StrategyChoice},
        ModelConfig, ModelInput, ModelOutput, ModelSequenceBatching,
    },
    types::{bytes_elements, DataType, InferError, InferResult, Tensor},
};

/// The config's `sequence_batching`, or a load error naming the backend.
pub fn sequence_batching<'a>(
    config: &'a ModelConfig,
    backend: &str,
) -> anyhow::Result<&'a ModelSequenceBatching> {
    match &config.scheduling_choice {
        Some(SchedulingChoice::SequenceBatching(s)) => Ok(s),
        _ => anyhow::bail!(
            "model '{}': backend '{backend}' is a stateful sequence model and needs \
             sequence_batching in its configuration",
            config.name
        ),
    }
}

/// Whether the config uses the direct strategy (the default when none is named).
pub fn is_direct(sequence: &ModelSequenceBatching) -> bool {
    !matches!(sequence.strategy_choice, Some(StrategyChoice::Oldest(_)))
}

/// The control of `kind` (START, END or READY) that `backend` cannot run
/// without, from the configuration's compiled controls.
pub fn required_flag(
    controls: &SequenceControls,
    kind: Kind,
    model: &str,
    backend: &str,
) -> anyhow::Result<FlagControl> {
    controls
        .flag(kind)
        .map(|c| FlagControl(c.clone()))
        .ok_or_else(|| missing(kind, model, backend))
}

/// The CORRID control that `backend` cannot run without.
pub fn required_corrid(
    controls: &SequenceControls,
    model: &str,
    backend: &str,
) -> anyhow::Result<CorridControl> {
    controls
        .corrid
        .clone()
        .map(CorridControl)
        .ok_or_else(|| missing(Kind::ControlSequenceCorrid, model, backend))
}

fn missing(kind: Kind, model: &str, backend: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "model '{model}': backend '{backend}' needs a sequence_batching control_input of kind {}",
        kind.as_str_name()
    )
}

/// A boolean control (START, END or READY) as a model reads it.
#[derive(Debug, Clone)]
pub struct FlagControl(sequence_controls::FlagControl);

impl FlagControl {
    /// One flag per batch row: true where the element equals the control's true value.
    pub fn read(&self, inputs: &[Tensor], rows: usize, model: &str) -> InferResult<Vec<bool>> {
        let values = &self.0.values;
        let t = control_tensor(inputs, &self.0.name, values.datatype(), rows, model)?;
        Ok(values.read_flags(&t.data))
    }
}

/// The correlation ID of one batch row, as the CORRID control carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CorrId {
    /// UINT64 / UINT32 controls.
    Unsigned(u64),
    /// INT64 / INT32 controls.
    Signed(i64),
    /// TYPE_STRING controls: the id's text (an integer id as decimal text).
    Text(Bytes),
}

impl CorrId {
    /// The id as a two's-complement 64-bit integer (a UINT64 id above
    /// `i64::MAX` keeps its bits). Text must be a decimal integer in the
    /// INT64 or UINT64 range, optionally signed and surrounded by ASCII
    /// whitespace; `None` otherwise.
    pub fn to_i64(&self) -> Option<i64> {
        match self {
            CorrId::Unsigned(v) => Some(*v as i64),
            CorrId::Signed(v) => Some(*v),
            CorrId::Text(bytes) => {
                let text = std::str::from_utf8(bytes).ok()?.trim_ascii();
                text.parse::<i64>()
                    .ok()
                    .or_else(|| text.parse::<u64>().ok().map(|v| v as i64))
            }
        }
    }

    /// The low 32 bits of the id as a two's-complement INT32 (ONNX `Cast`
    /// of the 64-bit id), or `None` for text that is not an integer.
    pub fn low_i32(&self) -> Option<i32> {
        self.to_i64().map(|v| v as i32)
    }
}

impl std::fmt::Display for CorrId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CorrId::Unsigned(v) => write!(f, "{v}"),
            CorrId::Signed(v) => write!(f, "{v}"),
            CorrId::Text(bytes) => {
                let text = String::from_utf8_lossy(bytes);
                write!(f, "{:?}", crate::types::clip(&text))
            }
        }
    }
}

/// The CORRID control as a model reads it.
#[derive(Debug, Clone)]
pub struct CorridControl(sequence_controls::CorridControl);

impl CorridControl {
    /// One correlation ID per batch row.
    pub fn read(&self, inputs: &[Tensor], rows: usize, model: &str) -> InferResult<Vec<CorrId>> {
        let sequence_controls::CorridControl { name, datatype } = &self.0;
        let t = control_tensor(inputs, name, *datatype, rows, model)?;
        let le8 = |c: &[u8]| [c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]];
        let le4 = |c: &[u8]| [c[0], c[1], c[2], c[3]];
        Ok(match datatype {
            DataType::Uint64 => t
                .data
                .chunks_exact(8)
                .map(|c| CorrId::Unsigned(u64::from_le_bytes(le8(c))))
                .collect(),
            DataType::Int64 => t
                .data
                .chunks_exact(8)
                .map(|c| CorrId::Signed(i64::from_le_bytes(le8(c))))
                .collect(),
            DataType::Uint32 => t
                .data
                .chunks_exact(4)
                .map(|c| CorrId::Unsigned(u32::from_le_bytes(le4(c)).into()))
                .collect(),
            DataType::Int32 => t
                .data
                .chunks_exact(4)
                .map(|c| CorrId::Signed(i32::from_le_bytes(le4(c)).into()))
                .collect(),
            // `control_tensor` checked the framing and the element count.
            _ => bytes_elements(&t.data)
                .map_err(|e| bad_control(model, name, &e))?
                .map(|e| CorrId::Text(t.data.slice_ref(e)))
                .collect(),
        })
    }
}

fn bad_control(model: &str, name: &str, problem: &str) -> InferError {
    InferError::internal(format!(
        "model '{model}': sequence control input '{name}' {problem}"
    ))
}

/// The control tensor `name`, checked to hold `rows` elements of `datatype`.
fn control_tensor<'a>(
    inputs: &'a [Tensor],
    name: &str,
    datatype: DataType,
    rows: usize,
    model: &str,
) -> InferResult<&'a Tensor> {
    let t = inputs
        .iter()
        .find(|t| t.name == name)
        .ok_or_else(|| bad_control(model, name, "was not given by the sequence batcher"))?;
    if t.datatype != datatype {
        return Err(bad_control(
            model,
            name,
            &format!("is {}, the configuration makes it {datatype}", t.datatype),
        ));
    }
    let count = match datatype.element_size() {
        Some(size) => (t.data.len() % size == 0).then_some(t.data.len() / size),
        None => bytes_elements(&t.data).ok().map(Iterator::count),
    };
    if count != Some(rows) || t.element_count() != Some(rows) {
        return Err(bad_control(
            model,
            name,
            &format!(
                "must hold one element per batch row ({rows}); it has shape {:?} and {} bytes",
                t.shape,
                t.data.len()
            ),
        ));
    }
    Ok(t)
}

/// The model's data tensors: its one INT32 input and its one INT32 output
/// (outputs named in `state_outputs` — implicit state a client may ask
/// for — do not count).
#[derive(Debug, Clone)]
pub struct DataIo {
    pub input: String,
    pub output: String,
    /// The input's per-request dims (without the batch dimension).
    pub input_dims: Vec<i64>,
}

impl DataIo {
    pub fn from_config(
        config: &ModelConfig,
        backend: &str,
        state_outputs: &[&str],
    ) -> anyhow::Result<Self> {
        let outputs: Vec<&ModelOutput> = config
            .output
            .iter()
            .filter(|o| !state_outputs.contains(&o.name.as_str()))
            .collect();
        let (input, output) = match (config.input.as_slice(), outputs.as_slice()) {
            ([input], [output]) => (input, *output),
            _ => anyhow::bail!(
                "model '{}': backend '{backend}' takes exactly one input and one output \
                 (INPUT and OUTPUT, TYPE_INT32); the configuration has {} inputs and {} outputs",
                config.name,
                config.input.len(),
                outputs.len()
            ),
        };
        for (name, dt) in [
            (&input.name, input.data_type),
            (&output.name, output.data_type),
        ] {
            if DataType::from_config_i32(dt) != Some(DataType::Int32) {
                anyhow::bail!(
                    "model '{}': backend '{backend}' computes in INT32, but '{name}' has another datatype",
                    config.name
                );
            }
        }
        Ok(Self {
            input: input.name.clone(),
            output: output.name.clone(),
            input_dims: input.dims.clone(),
        })
    }
}

/// What every built-in sequence model's instance starts from, read once
/// at load: its name, its data tensors, whether it batches, and its
/// `execute_delay_ms`.
#[derive(Debug, Clone)]
pub struct SequenceModel {
    pub model: String,
    pub io: DataIo,
    pub batched: bool,
    pub delay: std::time::Duration,
}

/// One execution's data input, read by [`SequenceModel::begin`].
pub struct DataRows<'a> {
    pub input: &'a Tensor,
    pub rows: usize,
    pub values: Vec<i32>,
    /// INT32 elements in each row.
    pub per_row: usize,
}

impl SequenceModel {
    /// `state_outputs` are outputs that are implicit state, not data.
    pub fn from_config(
        config: &ModelConfig,
        backend: &str,
        state_outputs: &[&str],
    ) -> anyhow::Result<Self> {
        Ok(Self {
            model: config.name.clone(),
            io: DataIo::from_config(config, backend, state_outputs)?,
            batched: config.max_batch_size > 0,
            delay: super::identity::execute_delay(config)?,
        })
    }

    /// The preamble of every execution: waits out the execute delay (a
    /// compute worker's thread, never a shard's: such a model does not run
    /// inline), then reads the data input's rows.
    pub fn begin<'a>(&self, inputs: &'a [Tensor]) -> InferResult<DataRows<'a>> {
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        let input = super::io::input(inputs, &self.io.input, &self.model)?;
        let rows = batch_rows(input, self.batched, &self.model)?;
        let (values, per_row) = int32_rows(input, rows, &self.model)?;
        Ok(DataRows {
            input,
            rows,
            values,
            per_row,
        })
    }
}

/// Auto-complete for the sequence contracts: `INPUT` → `OUTPUT`, TYPE_INT32
/// dims [1], and `max_batch_size: 8` when the config gives no I/O at all.
pub fn complete_int32_io(config: &mut ModelConfig) {
    if config.input.is_empty() && config.output.is_empty() && config.max_batch_size == 0 {
        config.max_batch_size = super::io::SIMPLE_MAX_BATCH;
    }
    if config.input.is_empty() {
        config.input = vec![ModelInput {
            name: "INPUT".to_string(),
            data_type: DataType::Int32.to_config() as i32,
            dims: vec![1],
            ..Default::default()
        }];
    }
    if config.output.is_empty() {
        config.output = vec![ModelOutput {
            name: "OUTPUT".to_string(),
            data_type: DataType::Int32.to_config() as i32,
            dims: vec![1],
            ..Default::default()
        }];
    }
}

/// Rows in this execution: the batch dimension when the model batches, else 1.
pub fn batch_rows(input: &Tensor, batched: bool, model: &str) -> InferResult<usize> {
    if !batched {
        return Ok(1);
    }
    input
        .shape
        .first()
        .and_then(|&b| usize::try_from(b).ok())
        .ok_or_else(|| {
            InferError::invalid(format!(
                "model '{model}': input '{}' has no batch dimension",
                input.name
            ))
        })
}

/// The INT32 elements of `t`, with the count of elements in each of `rows` rows.
pub fn int32_rows(t: &Tensor, rows: usize, model: &str) -> InferResult<(Vec<i32>, usize)> {
    if t.datatype != DataType::Int32 || t.data.len() % 4 != 0 {
        return Err(InferError::invalid(format!(
            "model '{model}': input '{}' must be INT32 data",
            t.name
        )));
    }
    let values: Vec<i32> = t
        .data
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let per_row = match rows {
        0 => 0,
        _ if values.len() % rows == 0 => values.len() / rows,
        _ => {
            return Err(InferError::invalid(format!(
                "model '{model}': input '{}' has {} elements, not a whole number per batch row ({rows})",
                t.name,
                values.len()
            )))
        }
    };
    Ok((values, per_row))
}

/// Serializes INT32 values.
pub fn int32_bytes(values: impl IntoIterator<Item = i32>) -> Bytes {
    Bytes::from(
        values
            .into_iter()
            .flat_map(i32::to_le_bytes)
            .collect::<Vec<u8>>(),
    )
}

#[cfg(test)]
pub(crate) mod test_support {
    //! Hand-built control tensors and configs for the sequence models' tests.

    use super::*;
    use crate::{
        backend::{InstanceSpec, ModelFiles},
        config::parse_model_config,
    };

    pub fn i32_col(name: &str, v: &[i32]) -> Tensor {
        Tensor::new(
            name,
            DataType::Int32,
            vec![v.len() as i64, 1],
            int32_bytes(v.iter().copied()),
        )
    }

    pub fn u64_col(name: &str, v: &[u64]) -> Tensor {
        let data: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        Tensor::new(
            name,
            DataType::Uint64,
            vec![v.len() as i64, 1],
            Bytes::from(data),
        )
    }

    pub fn str_col(name: &str, v: &[&str]) -> Tensor {
        Tensor::new(
            name,
            DataType::Bytes,
            vec![v.len() as i64, 1],
            crate::types::encode_bytes_elements(v),
        )
    }

    pub fn ints(t: &Tensor) -> Vec<i32> {
        t.data
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    pub fn output<'a>(out: &'a [Tensor], name: &str) -> &'a Tensor {
        out.iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("no output {name}"))
    }

    /// The model's committed `models/<name>/config.pbtxt`, parsed and validated.
    pub fn repository_config(name: &str) -> (ModelConfig, ModelFiles) {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("models")
            .join(name);
        let text = std::fs::read_to_string(dir.join("config.pbtxt")).expect("config.pbtxt");
        let config = parse_model_config(&text).expect("config parses");
        crate::config::validate(&config).expect("config validates");
        assert_eq!(config.name, name);
        assert!(dir.join("1").is_dir(), "version folder 1/ of {name}");
        let files = ModelFiles {
            model_dir: dir.clone(),
            version_dir: dir.join("1"),
            version: 1,
        };
        (config, files)
    }

    pub fn spec(index: usize) -> InstanceSpec {
        InstanceSpec {
            name: format!("m_{index}"),
            index,
            intra_op_threads: 1,
            device: crate::backend::InstanceDevice::Cpu,
        }
    }

    /// A config of `backend` with `extra` (the sequence_batching block, parameters…).
    pub fn config_with(backend: &str, extra: &str) -> ModelConfig {
        parse_model_config(&format!(
            r#"
            name: "m"
            backend: "{backend}"
            max_batch_size: 8
            input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
            output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
            {extra}
            "#
        ))
        .expect("test config parses")
    }

    /// A `control_input` entry with an int32 0/1 pair.
    pub fn flag(name: &str, kind: &str) -> String {
        format!(r#"{{ name: "{name}" control [ {{ kind: {kind} int32_false_true: [ 0, 1 ] }} ] }}"#)
    }
}

#[cfg(test)]
mod tests {
    use super::{test_support::*, *};

    fn sequence(extra: &str) -> ModelConfig {
        config_with(
            "simple_sequence",
            &format!("sequence_batching {{ {extra} }}"),
        )
    }

    fn controls(config: &ModelConfig) -> anyhow::Result<SequenceControls> {
        SequenceControls::from_sequence_batching(sequence_batching(config, "t")?, "m")
    }

    fn flag_of(config: &ModelConfig, kind: Kind) -> anyhow::Result<FlagControl> {
        required_flag(&controls(config)?, kind, "m", "t")
    }

    fn corrid_of(config: &ModelConfig) -> anyhow::Result<CorridControl> {
        required_corrid(&controls(config)?, "m", "t")
    }

    #[test]
    fn flags_read_int32_fp32_and_bool_pairs() {
        let c = sequence(
            r#"control_input [
                 { name: "S" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 5, 7 ] } ] },
                 { name: "E" control [ { kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0, 1 ] } ] },
                 { name: "R" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] }
               ]"#,
        );
        let s = flag_of(&c, Kind::ControlSequenceStart).unwrap();
        let e = flag_of(&c, Kind::ControlSequenceEnd).unwrap();
        let r = flag_of(&c, Kind::ControlSequenceReady).unwrap();
        let fp: Vec<u8> = [1.0f32, 0.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let inputs = [
            i32_col("S", &[7, 5]),
            Tensor::new("E", DataType::Fp32, vec![2, 1], Bytes::from(fp)),
            Tensor::new("R", DataType::Bool, vec![2, 1], Bytes::from(vec![0u8, 1])),
        ];
        assert_eq!(s.read(&inputs, 2, "m").unwrap(), vec![true, false]);
        assert_eq!(e.read(&inputs, 2, "m").unwrap(), vec![true, false]);
        assert_eq!(r.read(&inputs, 2, "m").unwrap(), vec![false, true]);
        // A control of the wrong type or size is the batcher's fault: internal.
        let err = s.read(&inputs, 3, "m").unwrap_err();
        assert_eq!(err.kind, crate::types::ErrorKind::Internal);
        assert!(err.message.contains("one element per batch row"), "{err}");
        let err = r.read(&[i32_col("R", &[1, 1])], 2, "m").unwrap_err();
        assert!(err.message.contains("'R' is INT32"), "{err}");
        let err = r.read(&[], 2, "m").unwrap_err();
        assert!(err.message.contains("not given"), "{err}");
    }

    #[test]
    fn flag_controls_need_exactly_one_false_true_pair() {
        let c = sequence(
            r#"control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START } ] } ]"#,
        );
        let e = flag_of(&c, Kind::ControlSequenceStart).unwrap_err();
        assert!(
            e.to_string()
                .contains("must specify either 'int32_false_true', 'fp32_false_true'"),
            "{e}"
        );
        let c = sequence(
            r#"control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 1 ] } ] } ]"#,
        );
        let e = flag_of(&c, Kind::ControlSequenceStart).unwrap_err();
        assert!(
            e.to_string()
                .contains("'int32_false_true' must have exactly 2 entries"),
            "{e}"
        );
        let c = sequence(&format!(
            "control_input [ {}, {} ]",
            flag("A", "CONTROL_SEQUENCE_START"),
            flag("B", "CONTROL_SEQUENCE_START")
        ));
        let e = flag_of(&c, Kind::ControlSequenceStart).unwrap_err();
        assert!(
            e.to_string()
                .contains("specifies multiple CONTROL_SEQUENCE_START tensors"),
            "{e}"
        );
        // The backend's own requirement: a control it reads must be there.
        let c = sequence(&format!(
            "control_input [ {} ]",
            flag("A", "CONTROL_SEQUENCE_START")
        ));
        assert!(flag_of(&c, Kind::ControlSequenceStart).is_ok());
        let e = flag_of(&c, Kind::ControlSequenceReady).unwrap_err();
        assert!(
            e.to_string()
                .contains("needs a sequence_batching control_input of kind CONTROL_SEQUENCE_READY"),
            "{e}"
        );
    }

    #[test]
    fn corrid_reads_every_supported_datatype() {
        for (dt, tensor, expect) in [
            (
                "TYPE_UINT64",
                u64_col("C", &[u64::MAX, 7]),
                vec![CorrId::Unsigned(u64::MAX), CorrId::Unsigned(7)],
            ),
            (
                "TYPE_INT32",
                i32_col("C", &[-3, 4]),
                vec![CorrId::Signed(-3), CorrId::Signed(4)],
            ),
            (
                "TYPE_STRING",
                str_col("C", &["1002", "abc"]),
                vec![
                    CorrId::Text(Bytes::from_static(b"1002")),
                    CorrId::Text(Bytes::from_static(b"abc")),
                ],
            ),
        ] {
            let c = sequence(&format!(
                r#"control_input [ {{ name: "C" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {dt} }} ] }} ]"#
            ));
            let corrid = corrid_of(&c).unwrap();
            assert_eq!(corrid.read(&[tensor], 2, "m").unwrap(), expect, "{dt}");
        }
        let c = sequence(
            r#"control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 } ] } ]"#,
        );
        let e = corrid_of(&c).unwrap_err();
        assert!(
            e.to_string()
                .contains("unexpected data type for control CONTROL_SEQUENCE_CORRID"),
            "{e}"
        );
        let e = corrid_of(&sequence("")).unwrap_err();
        assert!(
            e.to_string().contains(
                "needs a sequence_batching control_input of kind CONTROL_SEQUENCE_CORRID"
            ),
            "{e}"
        );
    }

    #[test]
    fn corrid_integer_views() {
        assert_eq!(CorrId::Unsigned(u64::MAX).low_i32(), Some(-1));
        assert_eq!(CorrId::Unsigned(0x1_0000_0005).low_i32(), Some(5));
        assert_eq!(CorrId::Unsigned(0x8000_0000).low_i32(), Some(i32::MIN));
        assert_eq!(CorrId::Signed(-2).low_i32(), Some(-2));
        let text = |s: &'static str| CorrId::Text(Bytes::from_static(s.as_bytes()));
        assert_eq!(text(" 1002 ").to_i64(), Some(1002));
        assert_eq!(text("-5").to_i64(), Some(-5));
        assert_eq!(text("18446744073709551615").to_i64(), Some(-1));
        assert_eq!(text("abc").to_i64(), None);
        assert_eq!(text("").to_i64(), None);
        assert_eq!(text("99999999999999999999").to_i64(), None);
        assert_eq!(text("abc").to_string(), "\"abc\"");
    }

    #[test]
    fn a_config_without_sequence_batching_is_refused() {
        let c = config_with("simple_sequence", "");
        let e = sequence_batching(&c, "simple_sequence").unwrap_err();
        assert!(e.to_string().contains("needs sequence_batching"), "{e}");
    }
}
