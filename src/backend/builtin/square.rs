//! `square` (Triton's test backend, served as `square_int32`): a
//! decoupled model. For `IN = [n]` it sends n responses, each
//! `OUT = [n]`, then the final flag; n <= 0 sends only the final flag.

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc,
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

pub const NAME: &str = "square";

pub struct SquareBackend;

impl Backend for SquareBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn auto_complete(&self, _: &mut ModelConfig, _: &ModelFiles) -> anyhow::Result<()> {
        Ok(())
    }

    fn create_instance(
        &self,
        config: &ModelConfig,
        _: &ModelFiles,
        _: &InstanceSpec,
    ) -> anyhow::Result<Box<dyn ModelInstance>> {
        io::require_decoupled(config, NAME)?;
        Ok(Box::new(SquareInstance {
            model: config.name.clone(),
            sent: responder::counter(&config.name),
        }))
    }
}

struct SquareInstance {
    model: String,
    sent: Arc<AtomicU64>,
}

impl ModelInstance for SquareInstance {
    fn execute(&mut self, _: &[Tensor], _: &[&str]) -> InferResult<Vec<Tensor>> {
        Err(io::stream_only(&self.model))
    }

    fn execute_decoupled(&mut self, inputs: &[Tensor], _: &[&str], sender: ResponseSender) {
        let n = match input(inputs, "IN", &self.model).and_then(words) {
            Ok(w) => match w.first() {
                Some(first) => i32::from_le_bytes(*first),
                None => {
                    return sender.fail(InferError::invalid(format!(
                        "model '{}': input 'IN' must hold one element",
                        self.model
                    )))
                }
            },
            Err(e) => return sender.fail(e),
        };
        let sent = self.sent.clone();
        responder::spawn(&self.model, sender, move |sender| {
            for _ in 0..n.max(0) {
                if sender
                    .send(vec![scalar("OUT", DataType::Int32, n.to_le_bytes())])
                    .is_err()
                {
                    return;
                }
                sent.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
}
