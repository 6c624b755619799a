//! `sequence_accumulator`: the classic direct-strategy stateful model. The
//! instance keeps one INT32 accumulator per batch slot (row index), which is
//! sound only because the direct sequence batcher keeps a sequence in the
//! same slot of the same instance for its whole life. Per row:
//!
//! * READY = 0: OUTPUT 0, the slot is left untouched (another sequence's
//!   state may live there between its requests);
//! * START: `acc[slot] = INPUT`, else `acc[slot] += INPUT` (INT32 wrap);
//! * `OUTPUT = acc[slot]`; END resets the slot after answering.
//!
//! Slots: `max_batch_size` (1 when the model does not batch).

use super::{
    identity::execute_delay,
    sequence_io::{
        complete_int32_io, int32_bytes, is_direct, required_flag, sequence_batching, DataRows,
        FlagControl, SequenceModel,
    },
};
use crate::{
    backend::{Backend, InstanceSpec, ModelFiles, ModelInstance},
    config::SequenceControls,
    proto::inference::{model_sequence_batching::control::Kind, ModelConfig},
    types::{DataType, InferError, InferResult, Tensor},
};

pub const NAME: &str = "sequence_accumulator";

pub struct SequenceAccumulatorBackend;

impl Backend for SequenceAccumulatorBackend {
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
        if !is_direct(sequence) {
            anyhow::bail!(
                "model '{}': backend '{NAME}' keeps state per batch slot and needs the direct \
                 sequence batching strategy, not oldest",
                config.name
            );
        }
        let base = SequenceModel::from_config(config, NAME, &[])?;
        if base.io.input_dims != [1] {
            anyhow::bail!(
                "model '{}': backend '{NAME}' accumulates one INT32 per request; input '{}' \
                 must have dims [1]",
                config.name,
                base.io.input
            );
        }
        let slots = usize::try_from(config.max_batch_size.max(1))?;
        let controls = SequenceControls::from_sequence_batching(sequence, &config.name)?;
        let flag = |kind| required_flag(&controls, kind, &config.name, NAME);
        Ok(Box::new(SequenceAccumulatorInstance {
            base,
            start: flag(Kind::ControlSequenceStart)?,
            end: flag(Kind::ControlSequenceEnd)?,
            ready: flag(Kind::ControlSequenceReady)?,
            acc: vec![0; slots],
        }))
    }
}

struct SequenceAccumulatorInstance {
    base: SequenceModel,
    start: FlagControl,
    end: FlagControl,
    ready: FlagControl,
    /// One accumulator per batch slot.
    acc: Vec<i32>,
}

impl ModelInstance for SequenceAccumulatorInstance {
    fn execute(&mut self, inputs: &[Tensor], _outputs: &[&str]) -> InferResult<Vec<Tensor>> {
        let DataRows {
            input,
            rows,
            values,
            per_row,
        } = self.base.begin(inputs)?;
        let model = self.base.model.as_str();
        if rows > self.acc.len() {
            return Err(InferError::internal(format!(
                "model '{model}': {rows} batch rows, but the instance has {} slots",
                self.acc.len()
            )));
        }
        if rows > 0 && per_row != 1 {
            return Err(InferError::invalid(format!(
                "model '{model}': input '{}' must hold one INT32 per batch row",
                self.base.io.input
            )));
        }
        let start = self.start.read(inputs, rows, model)?;
        let end = self.end.read(inputs, rows, model)?;
        let ready = self.ready.read(inputs, rows, model)?;
        // Controls and data are all checked: from here the slots change.
        let mut out = Vec::with_capacity(rows);
        for (slot, (acc, &x)) in self.acc.iter_mut().zip(&values).enumerate() {
            if !ready[slot] {
                out.push(0);
                continue;
            }
            *acc = if start[slot] { x } else { acc.wrapping_add(x) };
            out.push(*acc);
            if end[slot] {
                *acc = 0;
            }
        }
        Ok(vec![Tensor::new(
            self.base.io.output.clone(),
            DataType::Int32,
            input.shape.clone(),
            int32_bytes(out),
        )])
    }
}

#[cfg(test)]
mod tests {
    use super::{super::sequence_io::test_support::*, *};

    fn instance() -> Box<dyn ModelInstance> {
        let (config, files) = repository_config(NAME);
        SequenceAccumulatorBackend
            .create_instance(&config, &files, &spec(0))
            .unwrap()
    }

    /// One execution: (INPUT, START, END, READY) per row → OUTPUT.
    fn run(inst: &mut Box<dyn ModelInstance>, rows: &[(i32, i32, i32, i32)]) -> Vec<i32> {
        let col = |f: fn(&(i32, i32, i32, i32)) -> i32| rows.iter().map(f).collect::<Vec<_>>();
        let out = inst
            .execute(
                &[
                    i32_col("INPUT", &col(|r| r.0)),
                    i32_col("START", &col(|r| r.1)),
                    i32_col("END", &col(|r| r.2)),
                    i32_col("READY", &col(|r| r.3)),
                ],
                &["OUTPUT"],
            )
            .unwrap();
        assert_eq!(out[0].shape, vec![rows.len() as i64, 1]);
        ints(&out[0])
    }

    #[test]
    fn slots_accumulate_independently_and_survive_not_ready_rows() {
        let mut inst = instance();
        // slot 0 starts with 10; slot 1 starts with 1.
        assert_eq!(run(&mut inst, &[(10, 1, 0, 1), (1, 1, 0, 1)]), vec![10, 1]);
        // slot 0 idle (READY 0, zero input), slot 1 continues.
        assert_eq!(run(&mut inst, &[(0, 0, 0, 0), (2, 0, 0, 1)]), vec![0, 3]);
        // slot 0 continues untouched by the idle row; slot 2 starts.
        assert_eq!(
            run(&mut inst, &[(5, 0, 0, 1), (0, 0, 0, 0), (7, 1, 0, 1)]),
            vec![15, 0, 7]
        );
        // slot 1 ends: answers the sum, then resets.
        assert_eq!(run(&mut inst, &[(0, 0, 0, 0), (4, 0, 1, 1)]), vec![0, 7]);
        // a new sequence in slot 1 without START would see the reset slot.
        assert_eq!(run(&mut inst, &[(1, 0, 0, 1), (6, 0, 0, 1)]), vec![16, 6]);
        // a START on an active slot starts it afresh.
        assert_eq!(run(&mut inst, &[(3, 1, 0, 1)]), vec![3]);
    }

    #[test]
    fn start_and_end_in_one_request_and_wraparound() {
        let mut inst = instance();
        assert_eq!(run(&mut inst, &[(9, 1, 1, 1)]), vec![9]);
        assert_eq!(
            run(&mut inst, &[(1, 0, 0, 1)]),
            vec![1],
            "END reset the slot"
        );
        assert_eq!(run(&mut inst, &[(i32::MAX, 1, 0, 1)]), vec![i32::MAX]);
        assert_eq!(run(&mut inst, &[(1, 0, 0, 1)]), vec![i32::MIN]);
    }

    #[test]
    fn all_eight_slots_and_no_more() {
        let mut inst = instance();
        let rows: Vec<_> = (0..8).map(|i| (i, 1, 0, 1)).collect();
        assert_eq!(run(&mut inst, &rows), (0..8).collect::<Vec<_>>());
        let rows: Vec<_> = (0..8).map(|i| (i, 0, 0, 1)).collect();
        assert_eq!(
            run(&mut inst, &rows),
            (0..8).map(|i| 2 * i).collect::<Vec<_>>()
        );
        let nine = vec![1; 9];
        let e = inst
            .execute(
                &[
                    i32_col("INPUT", &nine),
                    i32_col("START", &nine),
                    i32_col("END", &nine),
                    i32_col("READY", &nine),
                ],
                &[],
            )
            .unwrap_err();
        assert!(
            e.message
                .contains("9 batch rows, but the instance has 8 slots"),
            "{e}"
        );
    }

    #[test]
    fn a_bad_control_leaves_every_slot_untouched() {
        let mut inst = instance();
        assert_eq!(run(&mut inst, &[(10, 1, 0, 1)]), vec![10]);
        let e = inst
            .execute(
                &[
                    i32_col("INPUT", &[5]),
                    i32_col("START", &[0]),
                    i32_col("READY", &[1]),
                ],
                &[],
            )
            .unwrap_err();
        assert!(e.message.contains("'END' was not given"), "{e}");
        assert_eq!(run(&mut inst, &[(1, 0, 0, 1)]), vec![11]);
    }

    #[test]
    fn repository_config_loads_and_the_load_checks_its_needs() {
        let (config, files) = repository_config(NAME);
        assert_eq!(crate::backend::backend_for(&config).unwrap().name(), NAME);
        assert!(SequenceAccumulatorBackend.runs_inline(&config));

        let mut no_ready = config.clone();
        let mut oldest = config.clone();
        use crate::proto::inference::{
            model_config::SchedulingChoice, model_sequence_batching::StrategyChoice,
        };
        if let Some(SchedulingChoice::SequenceBatching(s)) = no_ready.scheduling_choice.as_mut() {
            s.control_input.retain(|c| c.name != "READY");
        }
        if let Some(SchedulingChoice::SequenceBatching(s)) = oldest.scheduling_choice.as_mut() {
            s.strategy_choice = Some(StrategyChoice::Oldest(Default::default()));
        }
        let e = SequenceAccumulatorBackend
            .create_instance(&no_ready, &files, &spec(0))
            .err()
            .expect("load fails");
        assert_eq!(
            e.to_string(),
            "model 'sequence_accumulator': backend 'sequence_accumulator' needs a \
             sequence_batching control_input of kind CONTROL_SEQUENCE_READY"
        );
        let e = SequenceAccumulatorBackend
            .create_instance(&oldest, &files, &spec(0))
            .err()
            .expect("load fails");
        assert!(e.to_string().contains("needs the direct"), "{e}");
    }

    #[test]
    fn without_batching_there_is_one_slot() {
        let (mut config, files) = repository_config(NAME);
        config.max_batch_size = 0;
        let mut inst = SequenceAccumulatorBackend
            .create_instance(&config, &files, &spec(0))
            .unwrap();
        let t = |n: &str, v: i32| Tensor::new(n, DataType::Int32, vec![1], int32_bytes([v]));
        let step = |inst: &mut Box<dyn ModelInstance>, x, s| {
            let out = inst
                .execute(
                    &[t("INPUT", x), t("START", s), t("END", 0), t("READY", 1)],
                    &[],
                )
                .unwrap();
            assert_eq!(out[0].shape, vec![1]);
            ints(&out[0])[0]
        };
        assert_eq!(step(&mut inst, 4, 1), 4);
        assert_eq!(step(&mut inst, 5, 0), 9);
    }
}
