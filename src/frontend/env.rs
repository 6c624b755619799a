//! The front ends' environment: what HTTP, gRPC, the metrics port and the
//! in-process API read about the server they serve for — its identity,
//! its request limits, the restricted-API settings, the tracer, the
//! repository client, TLS and the lifecycle (live, ready, shutting down).
//!
//! `server/` builds one [`FrontendEnv`] from its options at start and
//! installs it on every shard thread ([`install`]); the in-process API
//! holds it directly, since backends call it from their own threads. The
//! front ends never see the server's options or its bootstrap state, so
//! nothing under `frontend/` depends on `server/`.

use std::{
    cell::RefCell,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, OnceLock,
    },
};

use super::{
    identity::DEFAULT_SERVER_NAME,
    restricted::Restrictions,
    transport::{HeaderForward, ServerTls},
};
use crate::{repository::manager::RepositoryClient, trace::Tracer};

/// The per-request limits the front ends enforce themselves (the
/// connection-level ones live in `transport::TransportLimits`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrontendLimits {
    /// `--http-max-input-size`: largest HTTP request body (after
    /// decompression too).
    pub http_max_input_size: usize,
    /// `--grpc-max-message-size`: largest gRPC message received or sent.
    pub grpc_max_message_size: usize,
    /// Compress gRPC responses for clients that accept it.
    pub grpc_compress_responses: bool,
}

impl Default for FrontendLimits {
    fn default() -> Self {
        Self {
            http_max_input_size: 64 << 20,
            grpc_max_message_size: 64 << 20,
            grpc_compress_responses: false,
        }
    }
}

/// Live, ready and shutting down: set by the server's control plane,
/// read with plain atomic loads on the request path.
#[derive(Debug, Default)]
pub struct Lifecycle {
    ready: AtomicBool,
    shutting_down: AtomicBool,
    /// `--strict-readiness`: readiness also needs `models_ready`.
    strict: AtomicBool,
    /// Every model the repository should serve is ready (Triton's rule,
    /// see `ModelTable::strictly_ready`); kept by the repository thread.
    models_ready: AtomicBool,
}

impl Lifecycle {
    /// The process answers, so it is live (as Triton's).
    pub fn live(&self) -> bool {
        true
    }

    /// Ready: the initial load finished, shutdown has not begun and, with
    /// strict readiness, every model that should be loaded is ready.
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
            && !self.shutting_down.load(Ordering::Acquire)
            && (!self.strict.load(Ordering::Acquire) || self.models_ready.load(Ordering::Acquire))
    }

    pub fn set_strict(&self, strict: bool) {
        self.strict.store(strict, Ordering::Release);
    }

    pub fn set_models_ready(&self, ready: bool) {
        self.models_ready.store(ready, Ordering::Release);
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::Release);
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }
}

/// Everything the front ends know about the server; one per server,
/// shared by every shard (borrowed on the request path, never cloned).
#[derive(Debug)]
pub struct FrontendEnv {
    /// The server metadata name (`--server-name`).
    pub server_name: String,
    pub limits: FrontendLimits,
    /// `--http-restricted-api`.
    pub http_restricted_api: Restrictions,
    /// `--grpc-restricted-protocol`.
    pub grpc_restricted_protocol: Restrictions,
    /// The trace extension's settings, sampling and writer thread.
    pub trace: Tracer,
    /// The repository thread's client, once it is started.
    pub repository: OnceLock<RepositoryClient>,
    /// The listeners' TLS, loaded at start before any shard accepts.
    pub tls: OnceLock<ServerTls>,
    /// `--http-header-forward-pattern`, compiled at start (empty: off).
    pub http_header_forward: OnceLock<HeaderForward>,
    /// `--grpc-header-forward-pattern`, compiled at start (empty: off).
    pub grpc_header_forward: OnceLock<HeaderForward>,
    pub lifecycle: Lifecycle,
    /// What the metrics port shows (`--allow-cpu-metrics`,
    /// `--allow-gpu-metrics`, `--metrics-config`).
    pub metrics: Arc<crate::metrics::prometheus::Exposition>,
    // issue 24: SageMaker and Vertex AI
    /// The SageMaker service's settings, set at start when it is on.
    pub sagemaker: OnceLock<super::http::sagemaker::SagemakerSettings>,
    /// The Vertex AI service's settings, set when it is on once the
    /// start-up load is done (its default model must be loaded).
    pub vertex: OnceLock<super::http::vertex::VertexSettings>,
}

impl FrontendEnv {
    /// An environment with Triton's defaults (name "triton", 64 MiB
    /// limits, no restrictions, tracing off, no repository yet); the
    /// server overrides what its options set.
    pub fn new(trace: Tracer) -> Self {
        Self {
            server_name: DEFAULT_SERVER_NAME.to_string(),
            limits: FrontendLimits::default(),
            http_restricted_api: Restrictions::default(),
            grpc_restricted_protocol: Restrictions::default(),
            trace,
            repository: OnceLock::new(),
            tls: OnceLock::new(),
            http_header_forward: OnceLock::new(),
            grpc_header_forward: OnceLock::new(),
            lifecycle: Lifecycle::default(),
            metrics: Arc::default(),
            sagemaker: OnceLock::new(),
            vertex: OnceLock::new(),
        }
    }

    /// The defaults, tracing off: for tests and tools that run a front end
    /// without a server.
    pub fn for_tests() -> Arc<Self> {
        Arc::new(Self::new(
            Tracer::new(&crate::trace::TraceConfig::default()),
        ))
    }

    /// The extensions this server advertises (see `identity::extensions`).
    pub fn extensions(&self) -> &'static [&'static str] {
        super::identity::extensions()
    }
}

thread_local! {
    static ENV: RefCell<Option<Arc<FrontendEnv>>> = const { RefCell::new(None) };
}

/// Installs the environment of the server this (shard) thread serves.
pub fn install(env: Arc<FrontendEnv>) {
    ENV.with(|e| *e.borrow_mut() = Some(env));
}

/// The environment installed on this thread, if any.
pub fn current() -> Option<Arc<FrontendEnv>> {
    ENV.with(|e| e.borrow().clone())
}

/// Runs `f` on this thread's environment without touching the `Arc`'s
/// count, which every shard shares (the request path).
pub fn with_current<R>(f: impl FnOnce(&FrontendEnv) -> R) -> Option<R> {
    ENV.with(|e| e.borrow().as_deref().map(f))
}

/// Samples a request to `model` for tracing (an empty slot off a shard
/// or when tracing is off).
#[inline]
pub fn sample_trace(model: &str) -> crate::trace::TraceSlot {
    with_current(|e| e.trace.sample(model)).unwrap_or_default()
}

/// The configured server name (the default where no server is installed).
pub fn server_name() -> String {
    with_current(|e| e.server_name.clone()).unwrap_or_else(|| DEFAULT_SERVER_NAME.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifecycle_ready_until_shutdown() {
        let env = FrontendEnv::for_tests();
        assert!(env.lifecycle.live());
        assert!(!env.lifecycle.ready());
        env.lifecycle.set_ready(true);
        assert!(env.lifecycle.ready());
        env.lifecycle.begin_shutdown();
        assert!(!env.lifecycle.ready());
        assert!(env.lifecycle.is_shutting_down());
    }

    #[test]
    fn installed_per_thread() {
        std::thread::spawn(|| {
            assert!(current().is_none());
            assert_eq!(server_name(), DEFAULT_SERVER_NAME);
            let mut env = FrontendEnv::new(Tracer::new(&Default::default()));
            env.server_name = "custom".into();
            install(Arc::new(env));
            assert_eq!(server_name(), "custom");
            assert_eq!(with_current(|e| e.limits), Some(FrontendLimits::default()));
        })
        .join()
        .unwrap();
    }
}
