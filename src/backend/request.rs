//! What an instance that takes a batch's requests one by one (the C API:
//! Triton backends batch inputs themselves) gets for each request: the
//! request, where its responses go, its sequence flags and where its
//! implicit-state updates go. Built-in backends never see this; they get
//! merged tensors through `ModelInstance::execute`.

use std::sync::{Arc, Mutex};

use super::ResponseSender;
use crate::types::{InferRequest, Tensor};

/// One request of an execution.
pub struct BackendRequest {
    /// For a sequence model its inputs include the control tensors and the
    /// implicit-state inputs of its slot (batch dimension 1 when batched).
    pub request: InferRequest,
    /// One response then the final flag for an ordinary model; any number
    /// for a decoupled one.
    pub sender: ResponseSender,
    pub sequence: Option<SequenceInfo>,
    /// `Some` for a model with implicit state.
    pub states: Option<StateUpdates>,
}

/// A sequence request's correlation id and flags.
#[derive(Debug, Clone, Default)]
pub struct SequenceInfo {
    /// The numeric id (0 for a string id).
    pub id: u64,
    /// The string id, when the sequence uses one.
    pub id_str: Option<String>,
    pub start: bool,
    pub end: bool,
}

/// The implicit-state outputs a request produced, kept for its sequence's
/// next request once the execution returns. Updates made after that are
/// ignored.
#[derive(Debug, Clone, Default)]
pub struct StateUpdates(Arc<Mutex<Vec<Tensor>>>);

impl StateUpdates {
    /// Records `state` (named after the state's output), replacing an
    /// earlier update of the same state.
    pub fn update(&self, state: Tensor) {
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        kept.retain(|t| t.name != state.name);
        kept.push(state);
    }

    pub fn take(&self) -> Vec<Tensor> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}
