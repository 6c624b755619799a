//! How a decoupled model answers: zero, one or many responses per request,
//! then a final flag, at any time — also after `execute_decoupled`
//! returned, from any thread the backend likes.
//!
//! The backend only sees [`ResponseSender`]; where the responses go (a
//! bounded channel to the shard that received the request) is the
//! scheduler's business, behind [`ResponseSink`]. Non-decoupled backends
//! never see any of this.

use crate::types::{InferError, InferResult, Parameters, Tensor};

/// The client is gone (stream closed, request cancelled) or the request
/// already failed: stop producing responses for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiverGone;

/// Where a decoupled request's responses go; implemented by the scheduler.
pub trait ResponseSink: Send + 'static {
    /// Delivers one response built from `outputs`; blocks while the
    /// request's channel is full (back-pressure), so it must only be
    /// called off the shards (compute workers, the backend's threads).
    fn send(&mut self, outputs: Vec<Tensor>) -> Result<(), ReceiverGone> {
        self.send_with(outputs, Parameters::new())
    }
    /// [`send`](Self::send) with response parameters.
    fn send_with(
        &mut self,
        outputs: Vec<Tensor>,
        parameters: Parameters,
    ) -> Result<(), ReceiverGone>;
    /// Whether the client stopped waiting for this request.
    fn is_cancelled(&self) -> bool;
    /// Ends the request: the final flag (`Ok`) or an error response.
    fn complete(&mut self, outcome: InferResult<()>);
}

/// Handed to a decoupled instance once per request. `Send + 'static`, so
/// the backend can move it to another thread and answer later. Dropping
/// it without [`finish`](Self::finish) or [`fail`](Self::fail) ends the
/// request with the final flag, so a request is never left hanging.
pub struct ResponseSender {
    sink: Option<Box<dyn ResponseSink>>,
}

impl ResponseSender {
    pub fn new(sink: Box<dyn ResponseSink>) -> Self {
        Self { sink: Some(sink) }
    }

    /// Sends one (non-final) response. `Err(ReceiverGone)` means nobody
    /// listens any more: the backend should stop working on the request.
    pub fn send(&mut self, outputs: Vec<Tensor>) -> Result<(), ReceiverGone> {
        match &mut self.sink {
            Some(sink) => sink.send(outputs),
            None => Err(ReceiverGone),
        }
    }

    /// [`send`](Self::send) with response parameters.
    pub fn send_with(
        &mut self,
        outputs: Vec<Tensor>,
        parameters: Parameters,
    ) -> Result<(), ReceiverGone> {
        match &mut self.sink {
            Some(sink) => sink.send_with(outputs, parameters),
            None => Err(ReceiverGone),
        }
    }

    pub fn is_cancelled(&self) -> bool {
        self.sink.as_ref().is_none_or(|s| s.is_cancelled())
    }

    /// The final flag: the request is complete (no outputs with it).
    pub fn finish(mut self) {
        if let Some(mut sink) = self.sink.take() {
            sink.complete(Ok(()));
        }
    }

    /// Ends the request with an error response.
    pub fn fail(mut self, error: InferError) {
        if let Some(mut sink) = self.sink.take() {
            sink.complete(Err(error));
        }
    }
}

impl Drop for ResponseSender {
    fn drop(&mut self) {
        if let Some(mut sink) = self.sink.take() {
            sink.complete(Ok(()));
        }
    }
}
