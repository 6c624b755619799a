//! The Vertex AI service (`--allow-vertex-ai`, Triton's
//! `vertex_ai_server.cc`): the health route (`AIP_HEALTH_ROUTE`, readiness)
//! and the predict route (`AIP_PREDICT_ROUTE`) on their own port, mapped
//! onto the KServe routes (see `cloud`).
//!
//! A predict request goes to the default model (`--vertex-ai-default-model`,
//! or the repository's only ready model), unless it carries
//! `X-Vertex-Ai-Triton-Redirect: <KServe path>`: then it is a POST answered
//! by that route, as Triton's server narrows it: the read-only server,
//! model, statistics, metrics, shared-memory status and repository index
//! routes and model infer; shared-memory registration and model load or
//! unload are forbidden (403), anything else is a bare 400.

use http::{Method, StatusCode};
use hyper::{body::Incoming, Request};

use super::{
    cloud::{self, bare, error_with},
    metrics, routes,
    server::HttpResponse,
};
use crate::{frontend::env, types::InferError};

const BINARY_MIME: &str = "application/vnd.vertex-ai-triton.binary+json;json-header-size=";
const REDIRECT_HEADER: &str = "x-vertex-ai-triton-redirect";

/// A route given by the environment: Triton matches it as a whole-path
/// regular expression; a plain path (the usual case) is compared as text,
/// so the request path needs no regex engine.
#[derive(Debug, Clone)]
enum RoutePattern {
    Exact(String),
    Pattern(regex::Regex),
}

impl RoutePattern {
    fn new(var: &str, route: &str) -> Result<Self, String> {
        const META: &[char] = &[
            '\\', '.', '+', '*', '?', '(', ')', '|', '[', ']', '{', '}', '^', '$',
        ];
        if !route.contains(META) {
            return Ok(Self::Exact(route.to_string()));
        }
        regex::Regex::new(&format!("^(?:{route})$"))
            .map(Self::Pattern)
            .map_err(|e| format!("{var} '{route}' is not a valid regular expression: {e}"))
    }

    fn matches(&self, path: &str) -> bool {
        match self {
            Self::Exact(p) => p == path,
            Self::Pattern(r) => r.is_match(path),
        }
    }
}

/// The Vertex AI service's settings, fixed once the start-up load is done.
#[derive(Debug, Clone)]
pub struct VertexSettings {
    predict: RoutePattern,
    health: RoutePattern,
    /// The model a predict request without redirection goes to.
    pub model: String,
}

impl VertexSettings {
    /// Triton's rules: both routes must be given; without a default model
    /// the repository must hold exactly one ready model version, else the
    /// default model must be among the ready ones. `ready`: one name per
    /// ready model version (Triton's ready index).
    pub fn new(
        predict_route: Option<&str>,
        health_route: Option<&str>,
        default_model: Option<&str>,
        ready: &[String],
    ) -> Result<Self, String> {
        let predict = match predict_route.filter(|r| !r.is_empty()) {
            Some(r) => RoutePattern::new("AIP_PREDICT_ROUTE", r)?,
            None => return Err("API_PREDICT_ROUTE is not defined for Vertex AI endpoint".into()),
        };
        let health = match health_route.filter(|r| !r.is_empty()) {
            Some(r) => RoutePattern::new("AIP_HEALTH_ROUTE", r)?,
            None => return Err("AIP_HEALTH_ROUTE is not defined for Vertex AI endpoint".into()),
        };
        let model = match default_model.filter(|m| !m.is_empty()) {
            None => match ready {
                [only] => only.clone(),
                _ => {
                    return Err(
                        "Expect the model repository contains only a single model if \
                                default model is not specified"
                            .into(),
                    )
                }
            },
            Some(m) if ready.iter().any(|r| r == m) => m.to_string(),
            Some(m) => return Err(format!("Expect the default model '{m}' is loaded")),
        };
        Ok(Self {
            predict,
            health,
            model,
        })
    }
}

/// What a redirected request becomes.
#[derive(Debug, PartialEq, Eq)]
enum Redirect {
    /// A KServe route, with the method its handler expects; `infer`: the
    /// body is an inference request.
    Route {
        method: Method,
        target: String,
        infer: bool,
    },
    Metrics,
    Forbidden,
    BadRequest,
}

enum Plan {
    Health,
    Predict(String),
    Redirect(Option<String>),
    BadRequest,
}

/// Entry point for every request on the Vertex AI port.
pub async fn handle(req: Request<Incoming>) -> HttpResponse {
    let path = req.uri().path();
    let redirect = req.headers().get(REDIRECT_HEADER);
    let plan = env::with_current(|e| {
        let s = e.vertex.get()?;
        Some(if s.health.matches(path) {
            Plan::Health
        } else if !s.predict.matches(path) {
            Plan::BadRequest
        } else if let Some(r) = redirect {
            Plan::Redirect(r.to_str().ok().map(|r| format!("/{r}")))
        } else {
            Plan::Predict(format!(
                "/v2/models/{}/infer",
                cloud::encode_segment(&s.model)
            ))
        })
    })
    .flatten();
    let Some(plan) = plan else {
        // Before the start-up load is done the service has no settings.
        return routes::error_response(&InferError::unavailable(
            "the Vertex AI service is not started yet",
        ));
    };
    match plan {
        Plan::Health => {
            if req.method() != Method::GET {
                return error_with(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed");
            }
            forward(req, None, "/v2/health/ready", false).await
        }
        Plan::Predict(target) => {
            if req.method() != Method::POST {
                return error_with(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed");
            }
            forward(req, None, &target, true).await
        }
        Plan::Redirect(endpoint) => {
            // The predict route is POST only; the method is then set to
            // the one the redirected route expects.
            if req.method() != Method::POST {
                return bare(StatusCode::METHOD_NOT_ALLOWED);
            }
            let Some(endpoint) = endpoint else {
                return bare(StatusCode::BAD_REQUEST);
            };
            match redirect_target(&endpoint) {
                Redirect::Route {
                    method,
                    target,
                    infer,
                } => forward(req, Some(method), &target, infer).await,
                Redirect::Metrics => match cloud::rewrite(req, Some(Method::GET), "/metrics") {
                    Ok(req) => metrics::handle(req).await,
                    Err(e) => routes::error_response(&e),
                },
                Redirect::Forbidden => {
                    tracing::debug!(endpoint = %crate::types::clip(&endpoint), "Vertex AI redirect blocked");
                    bare(StatusCode::FORBIDDEN)
                }
                Redirect::BadRequest => bare(StatusCode::BAD_REQUEST),
            }
        }
        Plan::BadRequest => bare(StatusCode::BAD_REQUEST),
    }
}

async fn forward(
    req: Request<Incoming>,
    method: Option<Method>,
    target: &str,
    infer: bool,
) -> HttpResponse {
    let (mut parts, body) = req.into_parts();
    if infer {
        if let Err(e) = cloud::binary_content_type(&mut parts.headers, BINARY_MIME) {
            return routes::error_response(&e);
        }
    }
    match cloud::rewrite(Request::from_parts(parts, body), method, target) {
        Ok(req) => routes::handle(req).await,
        Err(e) => routes::error_response(&e),
    }
}

/// Maps a redirect endpoint (`/` + the header's value) as Triton's Vertex
/// AI server does, after its KServe regular expressions.
fn redirect_target(endpoint: &str) -> Redirect {
    let get = |segs: &[&str]| Redirect::Route {
        method: Method::GET,
        target: join(segs),
        infer: false,
    };
    if endpoint == "/metrics" {
        return Redirect::Metrics;
    }
    let segs: Vec<&str> = endpoint[1..].split('/').collect();
    let digits = |v: &str| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit());
    match segs.as_slice() {
        ["v2", "models", "stats"] => get(&segs),
        ["v2", "models", model, rest @ ..] if !model.is_empty() => {
            let kind = match rest {
                ["versions", v, kind @ ..] if digits(v) => kind,
                kind => kind,
            };
            match kind {
                [] | ["ready" | "config" | "stats"] => get(&segs),
                ["infer"] => Redirect::Route {
                    method: Method::POST,
                    target: join(&segs),
                    infer: true,
                },
                _ => Redirect::BadRequest,
            }
        }
        ["v2"] | ["v2", "health", "live" | "ready"] => get(&segs),
        ["v2", "systemsharedmemory" | "cudasharedmemory", rest @ ..] => match rest {
            ["region", r, "status"] if !r.is_empty() => get(&segs),
            ["status"] => get(&segs),
            ["region", r, "register" | "unregister"] if !r.is_empty() => Redirect::Forbidden,
            ["register" | "unregister"] => Redirect::Forbidden,
            _ => Redirect::BadRequest,
        },
        ["v2", "repository", rest @ ..] => {
            // `(?:/<repository>)?/(index|models/<model>/(load|unload))`
            let rest = match rest {
                [repo, tail @ ..]
                    if !repo.is_empty() && (matches!(tail, ["index"]) || tail.len() == 3) =>
                {
                    tail
                }
                tail => tail,
            };
            match rest {
                ["index"] => Redirect::Route {
                    method: Method::POST,
                    target: join(&segs),
                    infer: false,
                },
                ["models", m, "load" | "unload"] if !m.is_empty() => Redirect::Forbidden,
                _ => Redirect::BadRequest,
            }
        }
        _ => Redirect::BadRequest,
    }
}

fn join(segs: &[&str]) -> String {
    let mut out = String::new();
    for s in segs {
        out.push('/');
        out.push_str(&cloud::encode_segment(s));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(method: Method, target: &str, infer: bool) -> Redirect {
        Redirect::Route {
            method,
            target: target.into(),
            infer,
        }
    }

    #[test]
    fn redirects_as_tritons_vertex_server() {
        use Method as M;
        for (endpoint, expect) in [
            ("/metrics", Redirect::Metrics),
            ("/v2", route(M::GET, "/v2", false)),
            ("/v2/health/live", route(M::GET, "/v2/health/live", false)),
            ("/v2/models/stats", route(M::GET, "/v2/models/stats", false)),
            (
                "/v2/models/simple",
                route(M::GET, "/v2/models/simple", false),
            ),
            (
                "/v2/models/simple/versions/1/ready",
                route(M::GET, "/v2/models/simple/versions/1/ready", false),
            ),
            (
                "/v2/models/a b/config",
                route(M::GET, "/v2/models/a%20b/config", false),
            ),
            (
                "/v2/models/simple/infer",
                route(M::POST, "/v2/models/simple/infer", true),
            ),
            ("/v2/models/simple/generate", Redirect::BadRequest),
            ("/v2/models/simple/versions/x/infer", Redirect::BadRequest),
            (
                "/v2/systemsharedmemory/status",
                route(M::GET, "/v2/systemsharedmemory/status", false),
            ),
            (
                "/v2/systemsharedmemory/region/r/register",
                Redirect::Forbidden,
            ),
            ("/v2/cudasharedmemory/unregister", Redirect::Forbidden),
            (
                "/v2/repository/index",
                route(M::POST, "/v2/repository/index", false),
            ),
            (
                "/v2/repository/r/index",
                route(M::POST, "/v2/repository/r/index", false),
            ),
            ("/v2/repository/models/simple/load", Redirect::Forbidden),
            ("/v2/repository/r/models/simple/unload", Redirect::Forbidden),
            (
                "/v2/repository/models/index",
                route(M::POST, "/v2/repository/models/index", false),
            ),
            ("/v2/logging", Redirect::BadRequest),
            ("/v2/trace/setting", Redirect::BadRequest),
            ("/", Redirect::BadRequest),
        ] {
            assert_eq!(redirect_target(endpoint), expect, "{endpoint}");
        }
    }

    #[test]
    fn settings_follow_tritons_start_rules() {
        let one = ["simple".to_string()];
        let s = VertexSettings::new(Some("/predict"), Some("/health"), None, &one).unwrap();
        assert_eq!(s.model, "simple");
        assert!(s.predict.matches("/predict") && !s.predict.matches("/predict/x"));
        let s = VertexSettings::new(Some("/v1/.*:predict"), Some("/h"), None, &one).unwrap();
        assert!(s.predict.matches("/v1/models/m:predict"));
        let two = ["a".to_string(), "b".to_string()];
        let e = VertexSettings::new(Some("/p"), Some("/h"), None, &two).unwrap_err();
        assert!(e.contains("only a single model"), "{e}");
        assert_eq!(
            VertexSettings::new(Some("/p"), Some("/h"), Some("b"), &two)
                .unwrap()
                .model,
            "b"
        );
        let e = VertexSettings::new(Some("/p"), Some("/h"), Some("c"), &two).unwrap_err();
        assert_eq!(e, "Expect the default model 'c' is loaded");
        let e = VertexSettings::new(None, Some("/h"), None, &one).unwrap_err();
        assert!(e.contains("PREDICT_ROUTE is not defined"), "{e}");
        let e = VertexSettings::new(Some("/p"), None, None, &one).unwrap_err();
        assert!(e.contains("AIP_HEALTH_ROUTE is not defined"), "{e}");
    }
}
