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

/// Extensions advertised by `GET /v2` and ServerMetadata, in Triton
/// 2.51's order (core `server.cc`), each one implemented here:
/// `sequence` is the sequence batcher's correlation controls,
/// `schedule_policy` the `priority` and `timeout` request parameters the
/// dynamic batcher's queue policies honour. `cuda_shared_memory` is in
/// the list but only advertised where it works (see [`extensions`]).
pub const EXTENSIONS: &[&str] = &[
    "classification",
    "sequence",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    CUDA_SHARED_MEMORY,
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
];

const CUDA_SHARED_MEMORY: &str = "cuda_shared_memory";

/// The extensions `GET /v2` and ServerMetadata list: `EXTENSIONS`, less
/// `cuda_shared_memory` when this process cannot use a GPU (clients such
/// as perf_analyzer pick the CUDA path from this list, so it is not
/// advertised when every register would fail).
pub fn extensions() -> &'static [&'static str] {
    static LIST: OnceLock<Vec<&'static str>> = OnceLock::new();
    LIST.get_or_init(|| {
        let cuda = crate::shm::cuda::unavailable().is_none();
        EXTENSIONS
            .iter()
            .copied()
            .filter(|e| cuda || *e != CUDA_SHARED_MEMORY)
            .collect()
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
        // Triton 2.51's list (core server.cc), less CUDA where it cannot work.
        let triton = [
            "classification",
            "sequence",
            "model_repository",
            "model_repository(unload_dependents)",
            "schedule_policy",
            "model_configuration",
            "system_shared_memory",
            "cuda_shared_memory",
            "binary_tensor_data",
            "parameters",
            "statistics",
            "trace",
            "logging",
        ];
        assert_eq!(EXTENSIONS, triton);
        let served: Vec<_> = triton
            .iter()
            .copied()
            .filter(|e| *e != "cuda_shared_memory" || crate::shm::cuda::unavailable().is_none())
            .collect();
        assert_eq!(extensions(), served);
        assert!(VERSION.starts_with("shardserve-"));
        assert!(SERVER_HEADER.starts_with("shardserve/"));
        assert!(server_header().to_str().is_ok());
    }
}
