//! The SageMaker service (`--allow-sagemaker`, Triton's
//! `sagemaker_server.cc`): `GET /ping` and `POST /invocations` on their own
//! port, mapped onto the KServe routes (see `cloud`).
//!
//! `/invocations` goes to `SAGEMAKER_TRITON_DEFAULT_MODEL_NAME` (Triton's
//! placeholder name when unset, so the answer names the missing variable),
//! as `infer`, `generate` or `generate_stream` after
//! `SAGEMAKER_TRITON_INFERENCE_TYPE`; `/ping` answers readiness, or
//! liveness with `SAGEMAKER_TRITON_PING_MODE=live`.
//!
//! The multi-model endpoint routes (`/models...`) are refused: Triton's
//! MME loads a model from any local folder the client names and registers
//! that folder as a new repository, which would let a client load code
//! from anywhere on the host; shardserve loads only from its configured
//! repositories (see `repository` and `--model-load-allow-uploaded-python`).

use http::{header, HeaderValue, Method, StatusCode};
use hyper::{body::Incoming, Request};

use super::{
    cloud::{self, bare, error_with},
    routes,
    server::HttpResponse,
};
use crate::{frontend::env, types::InferError};

const BINARY_MIME: &str = "application/vnd.sagemaker-triton.binary+json;json-header-size=";
const UNSPECIFIED_MODEL: &str = "unspecified_SAGEMAKER_TRITON_DEFAULT_MODEL_NAME";

/// What `/invocations` runs (`SAGEMAKER_TRITON_INFERENCE_TYPE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invocation {
    Infer,
    Generate,
    GenerateStream,
}

impl Invocation {
    fn action(self) -> &'static str {
        match self {
            Self::Infer => "infer",
            Self::Generate => "generate",
            Self::GenerateStream => "generate_stream",
        }
    }
}

/// The SageMaker service's settings, read from its environment variables
/// once at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SagemakerSettings {
    /// `SAGEMAKER_TRITON_PING_MODE=live`: `/ping` answers liveness.
    pub ping_live: bool,
    /// `SAGEMAKER_TRITON_DEFAULT_MODEL_NAME`.
    pub model: String,
    pub invocation: Invocation,
}

impl SagemakerSettings {
    /// From the process environment.
    pub fn from_env() -> Result<Self, String> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// From `var` (a variable's value, None when unset).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let invocation = match var("SAGEMAKER_TRITON_INFERENCE_TYPE").as_deref() {
            None | Some("infer") => Invocation::Infer,
            Some("generate") => Invocation::Generate,
            Some("generate_stream") => Invocation::GenerateStream,
            Some(other) => {
                return Err(format!(
                    "SAGEMAKER_TRITON_INFERENCE_TYPE: invalid inference type '{other}'. \
                     Must be one of: infer, generate, generate_stream."
                ))
            }
        };
        Ok(Self {
            ping_live: var("SAGEMAKER_TRITON_PING_MODE").as_deref() == Some("live"),
            model: var("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME")
                .unwrap_or_else(|| UNSPECIFIED_MODEL.to_string()),
            invocation,
        })
    }
}

enum Plan {
    Forward(&'static str),
    Invoke { target: String, infer: bool },
    MultiModel,
    BadRequest,
}

/// Entry point for every request on the SageMaker port.
pub async fn handle(req: Request<Incoming>) -> HttpResponse {
    let path = req.uri().path();
    let plan = env::with_current(|e| {
        let s = e.sagemaker.get()?;
        Some(match path {
            "/ping" if s.ping_live => Plan::Forward("/v2/health/live"),
            "/ping" => Plan::Forward("/v2/health/ready"),
            "/invocations" => Plan::Invoke {
                target: format!(
                    "/v2/models/{}/{}",
                    cloud::encode_segment(&s.model),
                    s.invocation.action()
                ),
                infer: s.invocation == Invocation::Infer,
            },
            p if is_multi_model_route(p) => Plan::MultiModel,
            _ => Plan::BadRequest,
        })
    })
    .flatten();
    let Some(plan) = plan else {
        return routes::error_response(&InferError::internal(
            "SageMaker request outside a server shard with the SageMaker service",
        ));
    };
    match plan {
        Plan::Forward(target) => {
            if req.method() != Method::GET {
                return error_with(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed");
            }
            forward(req, target).await
        }
        Plan::Invoke { target, infer } => {
            if req.method() != Method::POST {
                return error_with(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed");
            }
            if infer {
                invoke(req, &target).await
            } else {
                forward(req, &target).await
            }
        }
        Plan::MultiModel => error_with(
            StatusCode::NOT_IMPLEMENTED,
            "SageMaker multi-model endpoint routes (/models) are not supported by shardserve: \
             loading a model from a client-given folder cannot be confined to the model \
             repository; serve one model per endpoint (SAGEMAKER_TRITON_DEFAULT_MODEL_NAME)",
        ),
        Plan::BadRequest => bare(StatusCode::BAD_REQUEST),
    }
}

async fn forward(req: Request<Incoming>, target: &str) -> HttpResponse {
    match cloud::rewrite(req, None, target) {
        Ok(req) => routes::handle(req).await,
        Err(e) => routes::error_response(&e),
    }
}

async fn invoke(req: Request<Incoming>, target: &str) -> HttpResponse {
    let (mut parts, body) = req.into_parts();
    if let Err(e) = cloud::binary_content_type(&mut parts.headers, BINARY_MIME) {
        return routes::error_response(&e);
    }
    let mut resp = forward(Request::from_parts(parts, body), target).await;
    if let Some(length) = cloud::take_header_length(&mut resp) {
        let content_type = format!(
            "{BINARY_MIME}{}",
            String::from_utf8_lossy(length.as_bytes())
        );
        if let Ok(v) = HeaderValue::from_str(&content_type) {
            resp.headers_mut().insert(header::CONTENT_TYPE, v);
        }
    }
    resp
}

/// Triton's `/models(?:/)?([^/]+)?(/invoke)?`, matched in full.
fn is_multi_model_route(path: &str) -> bool {
    let Some(rest) = path.strip_prefix("/models") else {
        return false;
    };
    let rest = rest.strip_prefix('/').unwrap_or(rest);
    let name = rest.strip_suffix("/invoke").unwrap_or(rest);
    !name.contains('/')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_from_the_environment() {
        let s = SagemakerSettings::from_vars(|_| None).unwrap();
        assert_eq!(s.model, UNSPECIFIED_MODEL);
        assert!(!s.ping_live);
        assert_eq!(s.invocation, Invocation::Infer);
        let s = SagemakerSettings::from_vars(|k| match k {
            "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME" => Some("simple".into()),
            "SAGEMAKER_TRITON_PING_MODE" => Some("live".into()),
            "SAGEMAKER_TRITON_INFERENCE_TYPE" => Some("generate_stream".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(s.model, "simple");
        assert!(s.ping_live);
        assert_eq!(s.invocation, Invocation::GenerateStream);
        let e = SagemakerSettings::from_vars(|k| {
            (k == "SAGEMAKER_TRITON_INFERENCE_TYPE").then(|| "stream".to_string())
        })
        .unwrap_err();
        assert!(e.contains("invalid inference type 'stream'"), "{e}");
    }

    #[test]
    fn multi_model_routes() {
        for p in ["/models", "/models/", "/models/m", "/models/m/invoke"] {
            assert!(is_multi_model_route(p), "{p}");
        }
        for p in ["/model", "/models/a/b", "/models/m/invoke/x", "/ping"] {
            assert!(!is_multi_model_route(p), "{p}");
        }
    }
}
