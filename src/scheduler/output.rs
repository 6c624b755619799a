//! Turns what a backend produced into the response a client asked for:
//! requested outputs only, in the requested order, reshaped back to the
//! configured dims, and classified where the classification extension
//! was requested.

use crate::{
    model::ModelVersion,
    scheduler::classification::classify,
    types::{InferError, InferRequest, InferResponse, InferResult, Tensor},
};

pub fn build_response(
    model: &ModelVersion,
    request: &InferRequest,
    mut produced: Vec<Tensor>,
) -> InferResult<InferResponse> {
    let io = &model.io;
    for t in &mut produced {
        if let Some(spec) = io.output(&t.name) {
            t.shape = crate::model::client_output_shape(io, spec, &t.shape);
        }
    }
    let outputs = if request.outputs.is_empty() {
        produced.retain(|t| io.output(&t.name).is_some());
        produced
    } else {
        let mut selected = Vec::with_capacity(request.outputs.len());
        for wanted in &request.outputs {
            let pos = produced
                .iter()
                .position(|t| t.name == wanted.name)
                .ok_or_else(|| {
                    InferError::internal(format!(
                        "model '{}' did not produce requested output '{}'",
                        model.name, wanted.name
                    ))
                })?;
            let tensor = produced.swap_remove(pos);
            let tensor = match wanted.class_count() {
                Some(k) => {
                    let labels = io.output(&tensor.name).and_then(|s| s.labels.as_deref());
                    classify(&tensor, k as usize, labels, io.batching())?
                }
                None => tensor,
            };
            selected.push(tensor);
        }
        selected
    };
    Ok(InferResponse {
        model_name: model.name.clone(),
        model_version: model.version_str.clone(),
        id: request.id.clone(),
        outputs,
        ..Default::default()
    })
}
