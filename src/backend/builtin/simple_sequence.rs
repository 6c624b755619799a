//! `simple_sequence` and `simple_dyna_sequence`: Triton's stateless example
//! sequence models, computing per batch row
//!
//! * `simple_sequence`: `OUTPUT = READY * (INPUT + START)`
//! * `simple_dyna_sequence`: `OUTPUT = READY * (INPUT + START + END * int32(CORRID))`
//!
//! where a control counts 1 when it holds its configured true value, and
//! `int32(CORRID)` is the low 32 bits of the correlation ID as a
//! two's-complement INT32 (ONNX `Cast`); INT32 arithmetic wraps. Neither
//! keeps state: the sequence batcher's controls carry everything. Both
//! honour `execute_delay_ms` (sleep per execution), and then run on a
//! compute worker instead of inline.

use super::{
    identity::execute_delay,
    sequence_io::{
        complete_int32_io, int32_bytes, required_corrid, required_flag, sequence_batching,
        CorridControl, DataRows, FlagControl, SequenceModel,
    },
};
use crate::{
    backend::{Backend, InstanceSpec, ModelFiles, ModelInstance},
    config::SequenceControls,
    proto::inference::{model_sequence_batching::control::Kind, ModelConfig},
    types::{InferError, InferResult, Tensor},
};

pub struct SimpleSequenceBackend {
    name: &'static str,
    /// `simple_dyna_sequence`: also reads END and CORRID.
    dyna: bool,
}

impl SimpleSequenceBackend {
    /// `simple_sequence`: START and READY.
    pub fn direct() -> Self {
        Self {
            name: "simple_sequence",
            dyna: false,
        }
    }

    /// `simple_dyna_sequence`: START, END, READY and CORRID.
    pub fn dyna() -> Self {
        Self {
            name: "simple_dyna_sequence",
            dyna: true,
        }
    }
}

impl Backend for SimpleSequenceBackend {
    fn name(&self) -> &'static str {
        self.name
    }

    fn runs_inline(&self, config: &ModelConfig) -> bool {
        execute_delay(config).is_ok_and(|d| d.is_zero())
    }

    fn auto_complete(&self, config: &mut ModelConfig, _: &ModelFiles) -> anyhow::Result<()> {
        complete_int32_io(config);
        Ok(())
    }

    fn create_instance(
        &self,
        config: &ModelConfig,
        _: &ModelFiles,
        _: &InstanceSpec,
    ) -> anyhow::Result<Box<dyn ModelInstance>> {
        let sequence = sequence_batching(config, self.name)?;
        let base = SequenceModel::from_config(config, self.name, &[])?;
        let controls = SequenceControls::from_sequence_batching(sequence, &config.name)?;
        let flag = |kind| required_flag(&controls, kind, &config.name, self.name);
        let end_corrid = if self.dyna {
            Some((
                flag(Kind::ControlSequenceEnd)?,
                required_corrid(&controls, &config.name, self.name)?,
            ))
        } else {
            None
        };
        Ok(Box::new(SimpleSequenceInstance {
            base,
            start: flag(Kind::ControlSequenceStart)?,
            ready: flag(Kind::ControlSequenceReady)?,
            end_corrid,
        }))
    }
}

struct SimpleSequenceInstance {
    base: SequenceModel,
    start: FlagControl,
    ready: FlagControl,
    end_corrid: Option<(FlagControl, CorridControl)>,
}

impl ModelInstance for SimpleSequenceInstance {
    fn execute(&mut self, inputs: &[Tensor], _outputs: &[&str]) -> InferResult<Vec<Tensor>> {
        let DataRows {
            input,
            rows,
            values,
            per_row,
        } = self.base.begin(inputs)?;
        let model = self.base.model.as_str();
        let start = self.start.read(inputs, rows, model)?;
        let ready = self.ready.read(inputs, rows, model)?;
        let end_corrid = match &self.end_corrid {
            Some((end, corrid)) => Some((
                end.read(inputs, rows, model)?,
                corrid.read(inputs, rows, model)?,
            )),
            None => None,
        };
        let mut out = Vec::with_capacity(values.len());
        for row in 0..rows {
            let mut add = 0i32;
            if ready[row] {
                add = i32::from(start[row]);
                if let Some((end, corrid)) = &end_corrid {
                    if end[row] {
                        // Only an ending row reads its id, so a text id
                        // that is no integer fails only then (and, as
                        // `execute` answers for the whole batch, fails
                        // every request executed with it).
                        let id = corrid[row].low_i32().ok_or_else(|| {
                            InferError::invalid(format!(
                                "model '{model}': correlation ID {} is not an integer",
                                corrid[row]
                            ))
                        })?;
                        add = add.wrapping_add(id);
                    }
                }
            }
            let row_values = &values[row * per_row..(row + 1) * per_row];
            out.extend(row_values.iter().map(
                |&x| {
                    if ready[row] {
                        x.wrapping_add(add)
                    } else {
                        0
                    }
                },
            ));
        }
        Ok(vec![Tensor::new(
            self.base.io.output.clone(),
            input.datatype,
            input.shape.clone(),
            int32_bytes(out),
        )])
    }
}

#[cfg(test)]
mod tests {
    use super::{super::sequence_io::test_support::*, *};

    const DIRECT_CONTROLS: &str = r#"
        sequence_batching {
          control_input [
            { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
            { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }
          ]
        }"#;

    fn instance(backend: &SimpleSequenceBackend, config: &ModelConfig) -> Box<dyn ModelInstance> {
        let (_, files) = repository_config(backend.name);
        backend.create_instance(config, &files, &spec(0)).unwrap()
    }

    #[test]
    fn simple_sequence_adds_start_on_ready_rows() {
        let b = SimpleSequenceBackend::direct();
        let mut inst = instance(&b, &config_with("simple_sequence", DIRECT_CONTROLS));
        let out = inst
            .execute(
                &[
                    i32_col("INPUT", &[0, 11, 7, i32::MAX, 9]),
                    i32_col("START", &[1, 0, 0, 1, 1]),
                    i32_col("READY", &[1, 1, 1, 1, 0]),
                ],
                &["OUTPUT"],
            )
            .unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].name, "OUTPUT");
        assert_eq!(out[0].shape, vec![5, 1]);
        assert_eq!(ints(&out[0]), vec![1, 11, 7, i32::MIN, 0]);
    }

    #[test]
    fn simple_sequence_reads_controls_by_their_configured_names() {
        let b = SimpleSequenceBackend::direct();
        let config = config_with(
            "simple_sequence",
            r#"sequence_batching {
                 control_input [
                   { name: "GO" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
                   { name: "OK" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] }
                 ]
               }"#,
        );
        let mut inst = instance(&b, &config);
        let fp: Vec<u8> = [1.0f32, 0.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let out = inst
            .execute(
                &[
                    i32_col("INPUT", &[5, 6]),
                    Tensor::new("GO", crate::types::DataType::Fp32, vec![2, 1], fp.into()),
                    Tensor::new(
                        "OK",
                        crate::types::DataType::Bool,
                        vec![2, 1],
                        vec![1u8, 1].into(),
                    ),
                ],
                &[],
            )
            .unwrap();
        assert_eq!(ints(&out[0]), vec![6, 6]);
    }

    #[test]
    fn simple_sequence_without_batching_takes_shape_1_controls() {
        let b = SimpleSequenceBackend::direct();
        let mut config = config_with("simple_sequence", DIRECT_CONTROLS);
        config.max_batch_size = 0;
        let mut inst = instance(&b, &config);
        let t = |n: &str, v: i32| {
            Tensor::new(n, crate::types::DataType::Int32, vec![1], int32_bytes([v]))
        };
        let out = inst
            .execute(&[t("INPUT", 41), t("START", 1), t("READY", 1)], &[])
            .unwrap();
        assert_eq!(out[0].shape, vec![1]);
        assert_eq!(ints(&out[0]), vec![42]);
    }

    fn dyna_inputs(
        input: &[i32],
        start: &[i32],
        end: &[i32],
        ready: &[i32],
        corrid: &[u64],
    ) -> Vec<Tensor> {
        vec![
            i32_col("INPUT", input),
            i32_col("START", start),
            i32_col("END", end),
            i32_col("READY", ready),
            u64_col("CORRID", corrid),
        ]
    }

    #[test]
    fn simple_dyna_sequence_adds_start_and_the_id_on_end() {
        let (config, files) = repository_config("simple_dyna_sequence");
        let b = SimpleSequenceBackend::dyna();
        let mut inst = b.create_instance(&config, &files, &spec(0)).unwrap();
        let out = inst
            .execute(
                &dyna_inputs(
                    &[10, 10, 10, 10, 10, 10, 10],
                    &[1, 0, 0, 1, 0, 0, 1],
                    &[0, 0, 1, 1, 1, 1, 1],
                    &[1, 1, 1, 1, 1, 1, 0],
                    &[1000, 1001, 1002, 1003, u64::MAX, 0x1_0000_0005, 77],
                ),
                &["OUTPUT"],
            )
            .unwrap();
        assert_eq!(
            ints(&out[0]),
            // first, middle, last (+id), both (+1+id), last with id
            // 2^64-1 (int32 -1), last with id 2^32+5 (low bits 5), not ready
            vec![11, 10, 1012, 1014, 9, 15, 0]
        );
        // INT32 wrap-around: INPUT + id past i32::MAX.
        let out = inst
            .execute(
                &dyna_inputs(&[i32::MAX], &[0], &[1], &[1], &[1]),
                &["OUTPUT"],
            )
            .unwrap();
        assert_eq!(ints(&out[0]), vec![i32::MIN]);
        // An id of 2^31 is INT32 MIN after the cast.
        let out = inst
            .execute(&dyna_inputs(&[0], &[0], &[1], &[1], &[0x8000_0000]), &[])
            .unwrap();
        assert_eq!(ints(&out[0]), vec![i32::MIN]);
    }

    #[test]
    fn simple_dyna_sequence_with_a_string_corrid_parses_it_on_end() {
        let b = SimpleSequenceBackend::dyna();
        let config = config_with(
            "simple_dyna_sequence",
            &format!(
                r#"sequence_batching {{
                     oldest {{ max_candidate_sequences: 4 }}
                     control_input [ {}, {}, {},
                       {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING }} ] }} ]
                   }}"#,
                flag("START", "CONTROL_SEQUENCE_START"),
                flag("END", "CONTROL_SEQUENCE_END"),
                flag("READY", "CONTROL_SEQUENCE_READY")
            ),
        );
        let mut inst = instance(&b, &config);
        let input = |corrid: &[&str]| {
            vec![
                i32_col("INPUT", &[1, 2]),
                i32_col("START", &[0, 0]),
                i32_col("END", &[1, 0]),
                i32_col("READY", &[1, 1]),
                str_col("CORRID", corrid),
            ]
        };
        let out = inst.execute(&input(&["1002", "x"]), &[]).unwrap();
        assert_eq!(ints(&out[0]), vec![1003, 2]);
        let e = inst.execute(&input(&["seq-a", "1"]), &[]).unwrap_err();
        assert_eq!(e.kind, crate::types::ErrorKind::InvalidArgument);
        assert!(e.message.contains("\"seq-a\" is not an integer"), "{e}");
    }

    #[test]
    fn simple_dyna_sequence_honours_execute_delay() {
        let (config, _) = repository_config("simple_dyna_sequence");
        let b = SimpleSequenceBackend::dyna();
        assert!(!b.runs_inline(&config), "a 3 ms model runs on a worker");
        let mut inst = instance(&b, &config);
        let t0 = std::time::Instant::now();
        inst.execute(&dyna_inputs(&[1], &[1], &[0], &[1], &[5]), &[])
            .unwrap();
        assert!(t0.elapsed() >= std::time::Duration::from_millis(3));
        assert!(
            SimpleSequenceBackend::direct().runs_inline(&repository_config("simple_sequence").0)
        );
    }

    #[test]
    fn repository_configs_load() {
        for (name, backend) in [
            ("simple_sequence", SimpleSequenceBackend::direct()),
            ("simple_dyna_sequence", SimpleSequenceBackend::dyna()),
        ] {
            let (config, files) = repository_config(name);
            assert_eq!(config.backend, name);
            assert_eq!(crate::backend::backend_for(&config).unwrap().name(), name);
            let mut inst = backend.create_instance(&config, &files, &spec(0)).unwrap();
            let mut inputs = dyna_inputs(&[4], &[1], &[0], &[1], &[9]);
            if name == "simple_sequence" {
                inputs.retain(|t| t.name != "END" && t.name != "CORRID");
            }
            assert_eq!(ints(&inst.execute(&inputs, &[]).unwrap()[0]), vec![5]);
        }
    }

    #[test]
    fn a_missing_control_fails_the_load() {
        let (mut config, files) = repository_config("simple_dyna_sequence");
        let Some(crate::proto::inference::model_config::SchedulingChoice::SequenceBatching(s)) =
            config.scheduling_choice.as_mut()
        else {
            panic!("sequence_batching")
        };
        s.control_input.retain(|c| c.name != "CORRID");
        let e = SimpleSequenceBackend::dyna()
            .create_instance(&config, &files, &spec(0))
            .err()
            .expect("load fails");
        assert_eq!(
            e.to_string(),
            "model 'simple_dyna_sequence': backend 'simple_dyna_sequence' needs a \
             sequence_batching control_input of kind CONTROL_SEQUENCE_CORRID"
        );
        let (mut config, files) = repository_config("simple_sequence");
        config.scheduling_choice = None;
        let e = SimpleSequenceBackend::direct()
            .create_instance(&config, &files, &spec(0))
            .err()
            .expect("load fails");
        assert!(e.to_string().contains("needs sequence_batching"), "{e}");
    }
}
