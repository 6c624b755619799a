//! What the server says it is. Clients and Triton's own examples compare
//! the server metadata name with "triton", so that is the default name
//! (`--server-name` overrides it); the version field, the HTTP `Server`
//! header and the start-up log line say shardserve and its version, so
//! nobody mistakes it for a Triton build.

use std::sync::OnceLock;

use http::HeaderValue;

/// The server metadata name when `--server-name` is not given.
pub const DEFAULT_SERVER_NAME: &str = "triton";

/// The server metadata version field.
pub const VERSION: &str = concat!("shardserve-", env!("CARGO_PKG_VERSION"));

/// The HTTP `Server` header value (product/version, RFC 9110).
pub const SERVER_HEADER: &str = concat!("shardserve/", env!("CARGO_PKG_VERSION"));

/// Extensions advertised by `GET /v2` and ServerMetadata: only those that work.
pub const EXTENSIONS: &[&str] = &[
    "classification",
    "model_configuration",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "system_shared_memory",
    "model_repository",
    "model_repository(unload_dependents)",
    "logging",
    "trace",
];

/// The extensions `GET /v2` and ServerMetadata list: `EXTENSIONS`, and
/// `cuda_shared_memory` when this process can use a GPU (clients such as
/// perf_analyzer pick the CUDA path from this list, so it is not
/// advertised when every register would fail).
pub fn extensions() -> &'static [&'static str] {
    static LIST: OnceLock<Vec<&'static str>> = OnceLock::new();
    LIST.get_or_init(|| {
        let mut list = EXTENSIONS.to_vec();
        if crate::shm::cuda::unavailable().is_none() {
            list.push("cuda_shared_memory");
        }
        list
    })
}

pub fn server_header() -> HeaderValue {
    HeaderValue::from_static(SERVER_HEADER)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_strings() {
        assert_eq!(DEFAULT_SERVER_NAME, "triton");
        assert!(extensions().starts_with(EXTENSIONS));
        assert!(VERSION.starts_with("shardserve-"));
        assert!(SERVER_HEADER.starts_with("shardserve/"));
        assert!(server_header().to_str().is_ok());
    }
}
