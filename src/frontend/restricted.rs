//! Triton's restricted APIs: `--http-restricted-api` and
//! `--grpc-restricted-protocol`, `<category>[,<category>…]:<key>=<value>`
//! (repeatable, one group per flag). A request to an endpoint of a
//! restricted category must carry the header `<key>` (HTTP) or the
//! metadata `triton-grpc-protocol-<key>` (gRPC) with exactly `<value>`;
//! otherwise HTTP answers 403 `{"error":"This API is restricted, expecting
//! header '<key>'"}` and gRPC UNAVAILABLE `This protocol is restricted,
//! expecting header 'triton-grpc-protocol-<key>'`, as tritonserver 2.51.
//!
//! The flags are parsed once at start-up into an immutable table indexed
//! by category; with no restriction a request pays one branch, with one a
//! header lookup.

use http::{HeaderMap, HeaderName, HeaderValue};

/// Triton's restriction categories, in its order (`restricted_features.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    Health,
    Metadata,
    Inference,
    SharedMemory,
    ModelConfig,
    ModelRepository,
    Statistics,
    Trace,
    Logging,
}

const CATEGORY_COUNT: usize = 9;

impl Category {
    pub const ALL: [Category; CATEGORY_COUNT] = [
        Category::Health,
        Category::Metadata,
        Category::Inference,
        Category::SharedMemory,
        Category::ModelConfig,
        Category::ModelRepository,
        Category::Statistics,
        Category::Trace,
        Category::Logging,
    ];

    /// The name the flags use.
    pub fn name(self) -> &'static str {
        match self {
            Category::Health => "health",
            Category::Metadata => "metadata",
            Category::Inference => "inference",
            Category::SharedMemory => "shared-memory",
            Category::ModelConfig => "model-config",
            Category::ModelRepository => "model-repository",
            Category::Statistics => "statistics",
            Category::Trace => "trace",
            Category::Logging => "logging",
        }
    }

    fn from_name(name: &str) -> Option<Category> {
        Category::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// The protocol a set of restrictions applies to: it decides the flag's
/// name, the header's prefix and the wording of errors and refusals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Http,
    Grpc,
}

/// Prefix of the gRPC metadata key (Triton's `kRestrictedProtocolHeaderTemplate`).
pub const GRPC_HEADER_PREFIX: &str = "triton-grpc-protocol-";

impl Protocol {
    fn flag(self) -> &'static str {
        match self {
            Protocol::Http => "http-restricted-api",
            Protocol::Grpc => "grpc-restricted-protocol",
        }
    }

    /// What Triton calls a category in this protocol's errors.
    fn feature(self) -> &'static str {
        match self {
            Protocol::Http => "api",
            Protocol::Grpc => "protocol",
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Protocol::Http => "",
            Protocol::Grpc => GRPC_HEADER_PREFIX,
        }
    }
}

/// One group's header and value.
#[derive(Debug, Clone)]
pub struct Restriction {
    header: HeaderName,
    value: HeaderValue,
    /// The refusal's text, written once.
    message: String,
}

impl Restriction {
    /// The refusal's text: Triton's, naming the header as configured.
    pub fn message(&self) -> &str {
        &self.message
    }

    fn admits(&self, headers: &HeaderMap) -> bool {
        // The first value, as Triton's header lookups take it.
        headers
            .get(&self.header)
            .is_some_and(|v| same_bytes(v.as_bytes(), self.value.as_bytes()))
    }
}

/// Compares without stopping at the first difference, so that the time a
/// refusal takes tells nothing about how much of the secret was right.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The restrictions of one protocol, by category. Empty by default.
#[derive(Debug, Clone, Default)]
pub struct Restrictions {
    by_category: [Option<Restriction>; CATEGORY_COUNT],
    any: bool,
}

impl Restrictions {
    /// Parses every occurrence of the protocol's flag, with Triton's rules
    /// and error texts: each flag is `<categories>:<key>=<value>` (split at
    /// the first `:` and the first `=` after it; none of the three parts
    /// empty), categories are comma-separated known names, and a category
    /// may belong to one group only.
    pub fn parse(protocol: Protocol, flags: &[String]) -> Result<Self, String> {
        let mut out = Self::default();
        for arg in flags {
            let format_error = || {
                format!(
                    "--{} option format is '<config name>:<setting>=<value>'. Got {arg}",
                    protocol.flag()
                )
            };
            let (names, setting) = arg.split_once(':').ok_or_else(format_error)?;
            let (key, value) = setting.split_once('=').ok_or_else(format_error)?;
            if names.is_empty() || key.is_empty() || value.is_empty() {
                return Err(format_error());
            }
            let shown = format!("{}{key}", protocol.prefix());
            // Triton compares header names as its libraries do: without
            // case in HTTP, and gRPC metadata keys are lower case on the
            // wire. A name or value no request could carry would lock the
            // category for good; refuse it instead.
            let header = HeaderName::from_bytes(shown.as_bytes()).map_err(|_| {
                format!(
                    "--{}: '{shown}' is not a valid header name. Got {arg}",
                    protocol.flag()
                )
            })?;
            let value = HeaderValue::from_bytes(value.as_bytes()).map_err(|_| {
                format!(
                    "--{}: the value for '{shown}' holds characters a header cannot carry. Got {arg}",
                    protocol.flag()
                )
            })?;
            let message = match protocol {
                Protocol::Http => format!("This API is restricted, expecting header '{shown}'"),
                Protocol::Grpc => {
                    format!("This protocol is restricted, expecting header '{shown}'")
                }
            };
            let restriction = Restriction {
                header,
                value,
                message,
            };
            for name in names.split(',') {
                let category = Category::from_name(name)
                    .ok_or_else(|| format!("unknown restricted {} '{name}'", protocol.feature()))?;
                let slot = &mut out.by_category[category as usize];
                if slot.is_some() {
                    return Err(format!(
                        "restricted {} '{name}' can not be specified in multiple config groups",
                        protocol.feature()
                    ));
                }
                *slot = Some(restriction.clone());
                out.any = true;
            }
        }
        Ok(out)
    }

    /// No category is restricted.
    pub fn is_empty(&self) -> bool {
        !self.any
    }

    /// The restriction of `category`, if any.
    pub fn get(&self, category: Category) -> Option<&Restriction> {
        self.by_category[category as usize].as_ref()
    }

    /// The restriction a request to `category` with `headers` fails, if
    /// it fails one.
    pub fn refuses(&self, category: Category, headers: &HeaderMap) -> Option<&Restriction> {
        self.get(category).filter(|r| !r.admits(headers))
    }

    /// A one-line description for the start-up log, without the values.
    pub fn describe(&self) -> String {
        Category::ALL
            .into_iter()
            .filter_map(|c| {
                self.get(c)
                    .map(|r| format!("{}:{}", c.name(), r.header.as_str()))
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The category of an HTTP endpoint, from its decoded path segments
/// (`["v2", "models", …]`), for exactly the endpoints the HTTP routes
/// serve; anything else (answered 404) is in none, as in Triton, whose
/// checks sit in the endpoints' handlers. The method does not matter:
/// Triton checks before it looks at the method.
pub fn http_category(segs: &[&str]) -> Option<Category> {
    use Category::*;
    Some(match segs {
        ["v2"] | ["v2", ""] => Metadata,
        ["v2", "health", "live" | "ready"] => Health,
        ["v2", "logging"] => Logging,
        ["v2", "trace", "setting"] => Trace,
        ["v2", "systemsharedmemory" | "cudasharedmemory", rest @ ..] => match rest {
            ["status" | "register" | "unregister"]
            | ["region", _, "status" | "register" | "unregister"] => SharedMemory,
            _ => return None,
        },
        ["v2", "models", "stats"] => Statistics,
        ["v2", "repository", "index"] | ["v2", "repository", "models", _, "load" | "unload"] => {
            ModelRepository
        }
        ["v2", "models", _, rest @ ..] => {
            let action = match rest {
                ["versions", _, action @ ..] => action,
                action => action,
            };
            match action {
                [] => Metadata,
                ["ready"] => Health,
                ["config"] => ModelConfig,
                ["stats"] => Statistics,
                ["infer" | "generate" | "generate_stream"] => Inference,
                ["trace", "setting"] => Trace,
                _ => return None,
            }
        }
        _ => return None,
    })
}

/// The category of a gRPC method, from its path. Unknown methods are in
/// none (UNIMPLEMENTED follows). `grpc.health.v1.Health/Check` is
/// `health`, as Triton's documentation says; `Watch`, which Triton does
/// not serve (UNIMPLEMENTED with or without the metadata, seen on
/// tritonserver 2.51) and neither do we, is in none, so it answers the same.
pub fn grpc_category(path: &str) -> Option<Category> {
    use Category::*;
    if let Some(method) = path.strip_prefix("/inference.GRPCInferenceService/") {
        return Some(match method {
            "ServerLive" | "ServerReady" | "ModelReady" => Health,
            "ServerMetadata" | "ModelMetadata" => Metadata,
            "ModelInfer" | "ModelStreamInfer" => Inference,
            "ModelConfig" => ModelConfig,
            "ModelStatistics" => Statistics,
            "RepositoryIndex" | "RepositoryModelLoad" | "RepositoryModelUnload" => ModelRepository,
            "SystemSharedMemoryStatus"
            | "SystemSharedMemoryRegister"
            | "SystemSharedMemoryUnregister"
            | "CudaSharedMemoryStatus"
            | "CudaSharedMemoryRegister"
            | "CudaSharedMemoryUnregister" => SharedMemory,
            "TraceSetting" => Trace,
            "LogSettings" => Logging,
            _ => return None,
        });
    }
    match path {
        "/grpc.health.v1.Health/Check" => Some(Health),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(p: Protocol, flags: &[&str]) -> Result<Restrictions, String> {
        Restrictions::parse(p, &flags.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn groups_restrict_their_categories_only() {
        let r = parse(
            Protocol::Http,
            &[
                "model-repository:admin-key=admin-value",
                "inference,metadata:infer-key=infer-value",
            ],
        )
        .unwrap();
        assert!(!r.is_empty());
        assert!(r.get(Category::Statistics).is_none());
        let infer = headers(&[("infer-key", "infer-value")]);
        assert!(r.refuses(Category::Inference, &infer).is_none());
        assert!(r.refuses(Category::Metadata, &infer).is_none());
        let refused = r.refuses(Category::ModelRepository, &infer).unwrap();
        assert_eq!(
            refused.message(),
            "This API is restricted, expecting header 'admin-key'"
        );
        assert!(r
            .refuses(
                Category::ModelRepository,
                &headers(&[("Admin-Key", "admin-value")])
            )
            .is_none());
        // The value is compared exactly.
        assert!(r
            .refuses(
                Category::ModelRepository,
                &headers(&[("admin-key", "Admin-value")])
            )
            .is_some());
        assert!(r
            .refuses(Category::ModelRepository, &HeaderMap::new())
            .is_some());
        assert_eq!(
            r.describe(),
            "metadata:infer-key, inference:infer-key, model-repository:admin-key"
        );
    }

    #[test]
    fn grpc_keys_carry_tritons_prefix() {
        let r = parse(Protocol::Grpc, &["health:k=v=w"]).unwrap();
        let refused = r
            .refuses(Category::Health, &headers(&[("k", "v=w")]))
            .unwrap();
        assert_eq!(
            refused.message(),
            "This protocol is restricted, expecting header 'triton-grpc-protocol-k'"
        );
        assert!(r
            .refuses(
                Category::Health,
                &headers(&[("triton-grpc-protocol-k", "v=w")])
            )
            .is_none());
    }

    #[test]
    fn the_first_of_repeated_headers_counts() {
        let r = parse(Protocol::Http, &["trace:k=v"]).unwrap();
        assert!(r
            .refuses(Category::Trace, &headers(&[("k", "v"), ("k", "x")]))
            .is_none());
        assert!(r
            .refuses(Category::Trace, &headers(&[("k", "x"), ("k", "v")]))
            .is_some());
    }

    #[test]
    fn bad_flags_get_tritons_errors() {
        assert_eq!(
            parse(
                Protocol::Http,
                &["model-repository,health:k1=v1", "metadata,health:k2=v2"]
            )
            .unwrap_err(),
            "restricted api 'health' can not be specified in multiple config groups"
        );
        assert_eq!(
            parse(Protocol::Grpc, &["health,health:k=v"]).unwrap_err(),
            "restricted protocol 'health' can not be specified in multiple config groups"
        );
        assert_eq!(
            parse(Protocol::Http, &["model-reposit,health:k1=v1"]).unwrap_err(),
            "unknown restricted api 'model-reposit'"
        );
        assert_eq!(
            parse(Protocol::Grpc, &["health,,metadata:k=v"]).unwrap_err(),
            "unknown restricted protocol ''"
        );
        for bad in [
            "health",
            "health:k",
            ":k=v",
            "health:=v",
            "health:k=",
            "health=k:v",
        ] {
            assert_eq!(
                parse(Protocol::Http, &[bad]).unwrap_err(),
                format!(
                    "--http-restricted-api option format is '<config name>:<setting>=<value>'. Got {bad}"
                )
            );
        }
        assert!(parse(Protocol::Http, &["health:bad key=v"])
            .unwrap_err()
            .contains("not a valid header name"));
        assert!(parse(Protocol::Grpc, &["health:k=a\nb"])
            .unwrap_err()
            .contains("cannot carry"));
        assert!(parse(Protocol::Http, &[]).unwrap().is_empty());
    }

    #[test]
    fn every_served_http_endpoint_has_tritons_category() {
        use Category::*;
        let cases: &[(&str, Option<Category>)] = &[
            ("v2", Some(Metadata)),
            ("v2/health/live", Some(Health)),
            ("v2/health/ready", Some(Health)),
            ("v2/models/simple/ready", Some(Health)),
            ("v2/models/simple/versions/1/ready", Some(Health)),
            ("v2/models/simple", Some(Metadata)),
            ("v2/models/simple/versions/1", Some(Metadata)),
            ("v2/models/simple/config", Some(ModelConfig)),
            ("v2/models/simple/versions/1/config", Some(ModelConfig)),
            ("v2/models/simple/stats", Some(Statistics)),
            ("v2/models/simple/versions/1/stats", Some(Statistics)),
            ("v2/models/stats", Some(Statistics)),
            ("v2/models/simple/infer", Some(Inference)),
            ("v2/models/simple/versions/1/infer", Some(Inference)),
            ("v2/models/simple/generate", Some(Inference)),
            ("v2/models/simple/generate_stream", Some(Inference)),
            ("v2/models/simple/trace/setting", Some(Trace)),
            ("v2/trace/setting", Some(Trace)),
            ("v2/logging", Some(Logging)),
            ("v2/systemsharedmemory/status", Some(SharedMemory)),
            ("v2/systemsharedmemory/unregister", Some(SharedMemory)),
            (
                "v2/systemsharedmemory/region/r/register",
                Some(SharedMemory),
            ),
            ("v2/cudasharedmemory/region/r/status", Some(SharedMemory)),
            ("v2/cudasharedmemory/status", Some(SharedMemory)),
            ("v2/repository/index", Some(ModelRepository)),
            ("v2/repository/models/simple/load", Some(ModelRepository)),
            ("v2/repository/models/simple/unload", Some(ModelRepository)),
            ("v2/repository/other", None),
            ("v2/models/simple/unknown", None),
            ("v2/systemsharedmemory/region/r", None),
            ("v2/nothing", None),
            ("v1/models", None),
        ];
        for (path, want) in cases {
            let segs: Vec<&str> = path.split('/').collect();
            assert_eq!(http_category(&segs), *want, "{path}");
        }
    }

    #[test]
    fn every_grpc_method_has_tritons_category() {
        use Category::*;
        let svc = "/inference.GRPCInferenceService/";
        let cases: &[(&str, Category)] = &[
            ("ServerLive", Health),
            ("ServerReady", Health),
            ("ModelReady", Health),
            ("ServerMetadata", Metadata),
            ("ModelMetadata", Metadata),
            ("ModelInfer", Inference),
            ("ModelStreamInfer", Inference),
            ("ModelConfig", ModelConfig),
            ("ModelStatistics", Statistics),
            ("RepositoryIndex", ModelRepository),
            ("RepositoryModelLoad", ModelRepository),
            ("RepositoryModelUnload", ModelRepository),
            ("SystemSharedMemoryStatus", SharedMemory),
            ("SystemSharedMemoryRegister", SharedMemory),
            ("SystemSharedMemoryUnregister", SharedMemory),
            ("CudaSharedMemoryStatus", SharedMemory),
            ("CudaSharedMemoryRegister", SharedMemory),
            ("CudaSharedMemoryUnregister", SharedMemory),
            ("TraceSetting", Trace),
            ("LogSettings", Logging),
        ];
        for (method, want) in cases {
            assert_eq!(
                grpc_category(&format!("{svc}{method}")),
                Some(*want),
                "{method}"
            );
        }
        assert_eq!(grpc_category("/grpc.health.v1.Health/Check"), Some(Health));
        assert_eq!(grpc_category("/grpc.health.v1.Health/Watch"), None);
        assert_eq!(grpc_category(&format!("{svc}Nope")), None);
        assert_eq!(grpc_category("/other.Service/Check"), None);
    }
}
