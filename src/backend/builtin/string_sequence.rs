//! `simple_string_dyna_sequence`: Triton QA's per-sequence accumulator
//! whose correlation IDs are strings holding decimal integers. Per ready
//! batch row:
//!
//! * START: `acc = sum(INPUT)`, else `acc = state + sum(INPUT)`;
//! * END: `acc += int(CORRID)` (INT32 wrap, low 32 bits of the id);
//! * `OUTPUT` has INPUT's shape, every element `acc`; the new state is `acc`.
//!
//! Rows with READY = 0 answer 0 and pass their state through unchanged.
//!
//! The model keeps nothing itself: the accumulator is the config's one
//! implicit-state entry (`sequence_batching.state`, TYPE_INT32 dims [1]),
//! which the sequence batcher feeds in as `input_name` and stores from
//! `output_name` per sequence, dropping it when the sequence ends. The
//! CORRID control may be TYPE_STRING (the id as text) or an integer type.

use super::{
    identity::execute_delay,
    sequence_io::{
        complete_int32_io, int32_bytes, int32_rows, required_corrid, required_flag,
        sequence_batching, CorridControl, DataRows, FlagControl, SequenceModel,
    },
};
use crate::{
    backend::{Backend, InstanceSpec, ModelFiles, ModelInstance},
    config::SequenceControls,
    proto::inference::{model_sequence_batching::control::Kind, ModelConfig},
    types::{DataType, InferError, InferResult, Tensor},
};

pub const NAME: &str = "simple_string_dyna_sequence";

pub struct StringDynaSequenceBackend;

impl Backend for StringDynaSequenceBackend {
    fn name(&self) -> &'static str {
        NAME
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
        let sequence = sequence_batching(config, NAME)?;
        let [state] = sequence.state.as_slice() else {
            anyhow::bail!(
                "model '{}': backend '{NAME}' keeps its accumulator in implicit state and needs \
                 exactly one sequence_batching state entry (TYPE_INT32, dims [1]); it has {}",
                config.name,
                sequence.state.len()
            );
        };
        if DataType::from_config_i32(state.data_type) != Some(DataType::Int32)
            || !(state.dims == [1] || state.dims == [-1])
        {
            anyhow::bail!(
                "model '{}': backend '{NAME}' needs its state '{}' to be TYPE_INT32 with dims [1]",
                config.name,
                state.input_name
            );
        }
        if state.input_name.is_empty() || state.output_name.is_empty() {
            anyhow::bail!(
                "model '{}': the sequence_batching state needs an input_name and an output_name",
                config.name
            );
        }
        let base = SequenceModel::from_config(config, NAME, &[state.output_name.as_str()])?;
        let controls = SequenceControls::from_sequence_batching(sequence, &config.name)?;
        let flag = |kind| required_flag(&controls, kind, &config.name, NAME);
        Ok(Box::new(StringDynaSequenceInstance {
            base,
            state_in: state.input_name.clone(),
            state_out: state.output_name.clone(),
            start: flag(Kind::ControlSequenceStart)?,
            end: flag(Kind::ControlSequenceEnd)?,
            ready: flag(Kind::ControlSequenceReady)?,
            corrid: required_corrid(&controls, &config.name, NAME)?,
        }))
    }
}

struct StringDynaSequenceInstance {
    base: SequenceModel,
    state_in: String,
    state_out: String,
    start: FlagControl,
    end: FlagControl,
    ready: FlagControl,
    corrid: CorridControl,
}

impl ModelInstance for StringDynaSequenceInstance {
    fn execute(&mut self, inputs: &[Tensor], _outputs: &[&str]) -> InferResult<Vec<Tensor>> {
        let DataRows {
            input,
            rows,
            values,
            per_row,
        } = self.base.begin(inputs)?;
        let model = self.base.model.as_str();
        let start = self.start.read(inputs, rows, model)?;
        let end = self.end.read(inputs, rows, model)?;
        let ready = self.ready.read(inputs, rows, model)?;
        let corrid = self.corrid.read(inputs, rows, model)?;
        let state_in = inputs
            .iter()
            .find(|t| t.name == self.state_in)
            .ok_or_else(|| {
                InferError::internal(format!(
                    "model '{model}': the sequence batcher gave no state input '{}'",
                    self.state_in
                ))
            })?;
        let (state, state_per_row) = int32_rows(state_in, rows, model)?;
        if state_per_row != 1 || state.len() != rows {
            return Err(InferError::internal(format!(
                "model '{model}': state input '{}' must hold one INT32 per batch row ({rows}); \
                 it has shape {:?}",
                self.state_in, state_in.shape
            )));
        }

        let mut out = Vec::with_capacity(values.len());
        let mut state_out = Vec::with_capacity(rows);
        for row in 0..rows {
            let row_values = &values[row * per_row..(row + 1) * per_row];
            if !ready[row] {
                out.extend(std::iter::repeat_n(0, per_row));
                state_out.push(state[row]);
                continue;
            }
            let sum = row_values.iter().fold(0i32, |a, &x| a.wrapping_add(x));
            let mut acc = if start[row] {
                sum
            } else {
                state[row].wrapping_add(sum)
            };
            if end[row] {
                // `execute` answers for the whole batch, so an id that is
                // no integer fails every request executed with it, not only
                // its own (with the oldest strategy, other sequences' rows).
                let id = corrid[row].low_i32().ok_or_else(|| {
                    InferError::invalid(format!(
                        "model '{model}': correlation ID {} is not an integer; this model adds \
                         the ID of a sequence to its last result",
                        corrid[row]
                    ))
                })?;
                acc = acc.wrapping_add(id);
            }
            out.extend(std::iter::repeat_n(acc, per_row));
            state_out.push(acc);
        }
        let state_shape = if self.base.batched {
            vec![rows as i64, 1]
        } else {
            vec![1]
        };
        Ok(vec![
            Tensor::new(
                self.base.io.output.clone(),
                DataType::Int32,
                input.shape.clone(),
                int32_bytes(out),
            ),
            Tensor::new(
                self.state_out.clone(),
                DataType::Int32,
                state_shape,
                int32_bytes(state_out),
            ),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::{super::sequence_io::test_support::*, *};

    fn instance() -> Box<dyn ModelInstance> {
        let (config, files) = repository_config(NAME);
        StringDynaSequenceBackend
            .create_instance(&config, &files, &spec(0))
            .unwrap()
    }

    struct Row {
        input: i32,
        start: i32,
        end: i32,
        ready: i32,
        id: &'static str,
        state: i32,
    }

    fn inputs(rows: &[Row]) -> Vec<Tensor> {
        let col = |f: fn(&Row) -> i32| rows.iter().map(f).collect::<Vec<i32>>();
        vec![
            i32_col("INPUT", &col(|r| r.input)),
            i32_col("START", &col(|r| r.start)),
            i32_col("END", &col(|r| r.end)),
            i32_col("READY", &col(|r| r.ready)),
            str_col("CORRID", &rows.iter().map(|r| r.id).collect::<Vec<_>>()),
            i32_col("ACC_IN", &col(|r| r.state)),
        ]
    }

    /// Runs one sequence through the model row by row, feeding the state
    /// back as the batcher does.
    #[test]
    fn the_client_example_sequence_accumulates_and_adds_the_id() {
        let mut inst = instance();
        let values = [20, -11, -7, -5, -3, -2, 0, -1];
        let mut state = 0; // zero_data initial state
        let mut results = Vec::new();
        for (i, &v) in values.iter().enumerate() {
            let row = Row {
                input: v,
                start: i32::from(i == 0),
                end: i32::from(i == values.len() - 1),
                ready: 1,
                id: "1002",
                state,
            };
            let out = inst.execute(&inputs(&[row]), &["OUTPUT"]).unwrap();
            assert_eq!(output(&out, "OUTPUT").shape, vec![1, 1]);
            assert_eq!(output(&out, "ACC_OUT").shape, vec![1, 1]);
            let acc = ints(output(&out, "ACC_OUT"))[0];
            results.push(ints(output(&out, "OUTPUT"))[0]);
            state = acc;
        }
        assert_eq!(results, vec![20, 9, 2, -3, -6, -8, -8, -9 + 1002]);
    }

    #[test]
    fn batched_rows_each_use_their_own_state_and_controls() {
        let mut inst = instance();
        let out = inst
            .execute(
                &inputs(&[
                    // start ignores the stale state
                    Row {
                        input: 5,
                        start: 1,
                        end: 0,
                        ready: 1,
                        id: "1",
                        state: 99,
                    },
                    // continues
                    Row {
                        input: 5,
                        start: 0,
                        end: 0,
                        ready: 1,
                        id: "2",
                        state: 10,
                    },
                    // ends: + id
                    Row {
                        input: 1,
                        start: 0,
                        end: 1,
                        ready: 1,
                        id: " 300 ",
                        state: 10,
                    },
                    // start and end at once
                    Row {
                        input: 7,
                        start: 1,
                        end: 1,
                        ready: 1,
                        id: "-8",
                        state: 0,
                    },
                    // not ready: 0, state passes through
                    Row {
                        input: 9,
                        start: 1,
                        end: 1,
                        ready: 0,
                        id: "",
                        state: 42,
                    },
                    // wrap-around, id wraps to its low 32 bits (2^32 + 1)
                    Row {
                        input: 1,
                        start: 0,
                        end: 1,
                        ready: 1,
                        id: "4294967297",
                        state: i32::MAX,
                    },
                ]),
                &["OUTPUT"],
            )
            .unwrap();
        assert_eq!(
            ints(output(&out, "OUTPUT")),
            vec![5, 15, 311, -1, 0, i32::MIN + 1]
        );
        assert_eq!(
            ints(output(&out, "ACC_OUT")),
            vec![5, 15, 311, -1, 42, i32::MIN + 1]
        );
        assert_eq!(output(&out, "ACC_OUT").shape, vec![6, 1]);
    }

    #[test]
    fn an_integer_corrid_control_works_too() {
        let (mut config, files) = repository_config(NAME);
        let Some(crate::proto::inference::model_config::SchedulingChoice::SequenceBatching(s)) =
            config.scheduling_choice.as_mut()
        else {
            panic!("sequence_batching")
        };
        for c in s
            .control_input
            .iter_mut()
            .flat_map(|i| i.control.iter_mut())
        {
            if c.kind == Kind::ControlSequenceCorrid as i32 {
                c.data_type = crate::proto::inference::DataType::TypeUint64 as i32;
            }
        }
        let mut inst = StringDynaSequenceBackend
            .create_instance(&config, &files, &spec(0))
            .unwrap();
        let mut ins = inputs(&[Row {
            input: 1,
            start: 1,
            end: 1,
            ready: 1,
            id: "",
            state: 0,
        }]);
        ins.retain(|t| t.name != "CORRID");
        ins.push(u64_col("CORRID", &[7]));
        let out = inst.execute(&ins, &[]).unwrap();
        assert_eq!(ints(output(&out, "OUTPUT")), vec![8]);
    }

    #[test]
    fn a_non_integer_id_fails_the_request_on_end_only() {
        let mut inst = instance();
        let row = |end| Row {
            input: 3,
            start: 0,
            end,
            ready: 1,
            id: "seq-a",
            state: 4,
        };
        let out = inst.execute(&inputs(&[row(0)]), &[]).unwrap();
        assert_eq!(ints(output(&out, "OUTPUT")), vec![7]);
        let e = inst.execute(&inputs(&[row(1)]), &[]).unwrap_err();
        assert_eq!(e.kind, crate::types::ErrorKind::InvalidArgument);
        assert!(
            e.message
                .contains("correlation ID \"seq-a\" is not an integer"),
            "{e}"
        );
    }

    #[test]
    fn a_missing_state_input_is_an_internal_error() {
        let mut inst = instance();
        let mut ins = inputs(&[Row {
            input: 3,
            start: 1,
            end: 0,
            ready: 1,
            id: "1",
            state: 0,
        }]);
        ins.retain(|t| t.name != "ACC_IN");
        let e = inst.execute(&ins, &[]).unwrap_err();
        assert_eq!(e.kind, crate::types::ErrorKind::Internal);
        assert!(e.message.contains("no state input 'ACC_IN'"), "{e}");
    }

    #[test]
    fn repository_config_loads_and_needs_its_state_and_controls() {
        let (config, files) = repository_config(NAME);
        assert_eq!(crate::backend::backend_for(&config).unwrap().name(), NAME);
        assert!(
            StringDynaSequenceBackend.runs_inline(&config)
                == execute_delay(&config).unwrap().is_zero()
        );

        let mut stateless = config.clone();
        if let Some(crate::proto::inference::model_config::SchedulingChoice::SequenceBatching(s)) =
            stateless.scheduling_choice.as_mut()
        {
            s.state.clear();
        }
        let e = StringDynaSequenceBackend
            .create_instance(&stateless, &files, &spec(0))
            .err()
            .expect("load fails");
        assert!(
            e.to_string()
                .contains("exactly one sequence_batching state entry"),
            "{e}"
        );

        let mut no_end = config.clone();
        if let Some(crate::proto::inference::model_config::SchedulingChoice::SequenceBatching(s)) =
            no_end.scheduling_choice.as_mut()
        {
            s.control_input.retain(|c| c.name != "END");
        }
        let e = StringDynaSequenceBackend
            .create_instance(&no_end, &files, &spec(0))
            .err()
            .expect("load fails");
        assert!(
            e.to_string()
                .contains("needs a sequence_batching control_input of kind CONTROL_SEQUENCE_END"),
            "{e}"
        );
    }
}
