//! `repeat` (Triton's test backend, served as `repeat_int32`): a decoupled
//! model. For `IN` of n elements it sends n responses, response i
//! `DELAY[i]` ms after the previous one, carrying `OUT = [IN[i]]` and
//! `IDX = [i]`, then the final flag. The instance takes its next request
//! after `WAIT[0]` ms, whatever is still pending, so requests interleave.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use super::{
    io::{self, input},
    responder::{self, scalar, words},
};
use crate::{
    backend::{Backend, InstanceSpec, ModelFiles, ModelInstance, ResponseSender},
    proto::inference::ModelConfig,
    types::{DataType, InferError, InferResult, Tensor},
};

pub const NAME: &str = "repeat";

pub struct RepeatBackend;

impl Backend for RepeatBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn auto_complete(&self, _: &mut ModelConfig, _: &ModelFiles) -> anyhow::Result<()> {
        // Triton's repeat backend does not auto-complete either: the
        // configuration lists IN, DELAY, WAIT, OUT and IDX.
        Ok(())
    }

    fn create_instance(
        &self,
        config: &ModelConfig,
        _: &ModelFiles,
        _: &InstanceSpec,
    ) -> anyhow::Result<Box<dyn ModelInstance>> {
        io::require_decoupled(config, NAME)?;
        for name in ["IN", "DELAY", "WAIT"] {
            if !config.input.iter().any(|i| i.name == name) {
                anyhow::bail!(
                    "model '{}': the repeat backend needs input '{name}'",
                    config.name
                );
            }
        }
        Ok(Box::new(RepeatInstance {
            model: config.name.clone(),
            sent: responder::counter(&config.name),
        }))
    }
}

struct RepeatInstance {
    model: String,
    sent: Arc<AtomicU64>,
}

/// One request's work, read before anything is sent.
struct Plan {
    values: Vec<[u8; 4]>,
    delays: Vec<Duration>,
    wait: Duration,
}

impl RepeatInstance {
    fn plan(&self, inputs: &[Tensor]) -> InferResult<Plan> {
        let values = input(inputs, "IN", &self.model)?;
        let delays = input(inputs, "DELAY", &self.model)?;
        let wait = input(inputs, "WAIT", &self.model)?;
        if values.shape != delays.shape {
            return Err(InferError::invalid(format!(
                "model '{}': expected IN and DELAY shape to match, got {:?} and {:?}",
                self.model, values.shape, delays.shape
            )));
        }
        let ms = |w: [u8; 4]| Duration::from_millis(u64::from(u32::from_le_bytes(w)));
        Ok(Plan {
            values: words(values)?,
            delays: words(delays)?.into_iter().map(ms).collect(),
            wait: words(wait)?.first().copied().map_or(Duration::ZERO, ms),
        })
    }
}

impl ModelInstance for RepeatInstance {
    fn execute(&mut self, _: &[Tensor], _: &[&str]) -> InferResult<Vec<Tensor>> {
        Err(io::stream_only(&self.model))
    }

    fn execute_decoupled(&mut self, inputs: &[Tensor], _: &[&str], sender: ResponseSender) {
        let plan = match self.plan(inputs) {
            Ok(p) => p,
            Err(e) => return sender.fail(e),
        };
        let wait = plan.wait;
        let sent = self.sent.clone();
        responder::spawn(&self.model, sender, move |sender| {
            for (i, (value, delay)) in plan.values.into_iter().zip(plan.delays).enumerate() {
                std::thread::sleep(delay);
                if sender.is_cancelled() {
                    return;
                }
                let index = u32::try_from(i).unwrap_or(u32::MAX);
                let outputs = vec![
                    scalar("OUT", DataType::Int32, value),
                    scalar("IDX", DataType::Uint32, index.to_le_bytes()),
                ];
                // The client is gone: stop here.
                if sender.send(outputs).is_err() {
                    return;
                }
                sent.fetch_add(1, Ordering::Relaxed);
            }
        });
        // Taking the next request only after WAIT, as Triton's backend.
        std::thread::sleep(wait);
    }
}
