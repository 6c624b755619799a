//! What the built-in decoupled models share: a thread per request that
//! sends its responses (as Triton's `repeat` and `square` backends do, so
//! the instance takes its next request while responses are pending), and
//! a count of the responses each model sent, for tests that check a
//! cancelled request stops its work.

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc, Mutex,
};

use bytes::Bytes;

use crate::{
    backend::ResponseSender,
    types::{DataType, InferError, InferResult, Tensor},
};

/// Per model name, the counters of its instances. Locked only when an
/// instance is created and when a test reads it, never per response.
static SENT: Mutex<Vec<(String, Arc<AtomicU64>)>> = Mutex::new(Vec::new());

/// A new response counter for an instance of `model`.
pub fn counter(model: &str) -> Arc<AtomicU64> {
    let c = Arc::new(AtomicU64::new(0));
    if let Ok(mut list) = SENT.lock() {
        list.push((model.to_string(), c.clone()));
    }
    c
}

/// Responses the built-in decoupled instances of `model` have sent (data
/// responses, not final flags), over every load of it in this process.
pub fn responses_sent(model: &str) -> u64 {
    SENT.lock()
        .map(|list| {
            list.iter()
                .filter(|(m, _)| m == model)
                .map(|(_, c)| c.load(Ordering::Relaxed))
                .sum()
        })
        .unwrap_or(0)
}

/// Runs `work` with `sender` on a thread of its own. If the thread cannot
/// be started, the request fails with an error response.
pub fn spawn(
    model: &str,
    sender: ResponseSender,
    work: impl FnOnce(&mut ResponseSender) + Send + 'static,
) {
    /// Fails the request if the thread never took the sender.
    struct Handover(Option<ResponseSender>, String);
    impl Drop for Handover {
        fn drop(&mut self) {
            if let Some(sender) = self.0.take() {
                sender.fail(InferError::internal(format!(
                    "model '{}' could not start a thread to send its responses",
                    self.1
                )));
            }
        }
    }
    let mut handover = Handover(Some(sender), model.to_string());
    let started = std::thread::Builder::new()
        .name(format!("{model}-responses"))
        .spawn(move || {
            if let Some(mut sender) = handover.0.take() {
                work(&mut sender);
                sender.finish();
            }
        });
    if let Err(e) = started {
        tracing::warn!(model, error = %e, "decoupled model: response thread not started");
    }
}

/// A one-element tensor.
pub fn scalar(name: &str, datatype: DataType, le_bytes: [u8; 4]) -> Tensor {
    Tensor::new(name, datatype, vec![1], Bytes::copy_from_slice(&le_bytes))
}

/// The 4-byte little-endian elements of `t`.
pub fn words(t: &Tensor) -> InferResult<Vec<[u8; 4]>> {
    if t.data.len() % 4 != 0 {
        return Err(InferError::invalid(format!(
            "input '{}' holds {} bytes, not a whole number of 4-byte elements",
            t.name,
            t.data.len()
        )));
    }
    Ok(t.data
        .chunks_exact(4)
        .map(|c| [c[0], c[1], c[2], c[3]])
        .collect())
}
