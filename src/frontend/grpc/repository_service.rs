//! The model repository RPCs (`RepositoryIndex`, `RepositoryModelLoad`,
//! `RepositoryModelUnload`), answered by the repository thread.

use tonic::Status;

use super::status::to_status;
use crate::{
    proto::inference::{
        model_repository_parameter::ParameterChoice, repository_index_response::ModelIndex,
        RepositoryIndexRequest, RepositoryIndexResponse, RepositoryModelLoadRequest,
        RepositoryModelLoadResponse, RepositoryModelUnloadRequest, RepositoryModelUnloadResponse,
    },
    repository::manager::{LoadRequest, RepositoryClient},
    types::{clip, InferError},
};

/// The repository thread's client, cloned out of the borrowed environment
/// (the request awaits the answer, so it cannot hold the borrow).
fn client() -> Result<RepositoryClient, Status> {
    crate::frontend::env::with_current(|e| e.repository.get().cloned())
        .flatten()
        .ok_or_else(|| Status::unavailable("the model repository is not started yet"))
}

pub async fn index(req: RepositoryIndexRequest) -> Result<RepositoryIndexResponse, Status> {
    let rows = client()?.index(req.ready).await.map_err(to_status)?;
    Ok(RepositoryIndexResponse {
        models: rows
            .into_iter()
            .map(|r| ModelIndex {
                name: r.name,
                version: r.version.unwrap_or_default(),
                state: r.state.unwrap_or_default().to_string(),
                reason: r.reason.unwrap_or_default(),
            })
            .collect(),
    })
}

pub async fn load(req: RepositoryModelLoadRequest) -> Result<RepositoryModelLoadResponse, Status> {
    let mut load = LoadRequest::default();
    for (key, value) in req.parameters {
        let choice = value.parameter_choice;
        if key == "config" {
            match choice {
                Some(ParameterChoice::StringParam(s)) => load.config = Some(s),
                _ => {
                    return Err(to_status(InferError::invalid(
                        "parameter 'config' must be a string_param holding the model configuration as JSON",
                    )))
                }
            }
        } else if let Some(path) = key.strip_prefix("file:") {
            match choice {
                Some(ParameterChoice::BytesParam(b)) => {
                    // Held until written, behind other loads: counted in
                    // the shard's body budget as HTTP bodies are.
                    let hold = crate::frontend::transport::reserve_buffered(b.len())
                        .map_err(|e| Status::unavailable(e.message))?;
                    load.files.push((path.to_string(), hold.into_bytes(b)))
                }
                _ => {
                    return Err(to_status(InferError::invalid(format!(
                        "parameter '{}' must be a bytes_param",
                        clip(&key)
                    ))))
                }
            }
        }
    }
    client()?
        .load(req.model_name, load)
        .await
        .map_err(to_status)?;
    Ok(RepositoryModelLoadResponse {})
}

pub async fn unload(
    req: RepositoryModelUnloadRequest,
) -> Result<RepositoryModelUnloadResponse, Status> {
    let unload_dependents = match req.parameters.get("unload_dependents") {
        None => false,
        Some(p) => match p.parameter_choice {
            Some(ParameterChoice::BoolParam(b)) => b,
            _ => {
                return Err(to_status(InferError::invalid(
                    "parameter 'unload_dependents' must be a bool_param",
                )))
            }
        },
    };
    client()?
        .unload(req.model_name, unload_dependents)
        .await
        .map_err(to_status)?;
    Ok(RepositoryModelUnloadResponse {})
}
