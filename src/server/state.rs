use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Instant,
};

use super::ServerOptions;
use crate::{
    frontend::env::{FrontendEnv, FrontendLimits},
    metrics::ShardGauges,
};

/// What only the bootstrap needs: the options, the shards' gauges and the
/// shutdown drain. What the front ends read lives in `env`, which every
/// shard thread gets installed.
#[derive(Debug)]
pub struct ServerState {
    pub options: ServerOptions,
    /// Per-shard gauges, indexed by shard id (handed to each shard).
    pub gauges: Arc<[ShardGauges]>,
    /// The front ends' environment, built from `options`.
    pub env: Arc<FrontendEnv>,
    shards: usize,
    /// Shards whose own requests are all answered (shutdown only).
    drained_shards: AtomicUsize,
    /// Set by `begin_shutdown`.
    shutdown_deadline: std::sync::OnceLock<Instant>,
}

/// The front ends' environment as `options` configure it.
pub fn frontend_env(options: &ServerOptions) -> FrontendEnv {
    let mut env = FrontendEnv::new(crate::trace::Tracer::new(&options.trace));
    env.server_name = options.server_name.clone();
    env.limits = FrontendLimits {
        http_max_input_size: options.http_max_input_size,
        grpc_max_message_size: options.grpc_max_message_size,
        grpc_compress_responses: options.grpc_compress_responses,
    };
    env.http_restricted_api = options.http_restricted_api.clone();
    env.grpc_restricted_protocol = options.grpc_restricted_protocol.clone();
    env.metrics = Arc::new(crate::metrics::prometheus::Exposition {
        cpu: options.allow_cpu_metrics,
        gpu: options.allow_gpu_metrics,
        // `start` has refused a bad setting before building the state.
        config: crate::metrics::config::MetricsConfig::parse(&options.metrics_config)
            .unwrap_or_default(),
    });
    env
}

impl ServerState {
    pub fn new(options: ServerOptions, shards: usize) -> Arc<Self> {
        Arc::new(Self {
            env: Arc::new(frontend_env(&options)),
            options,
            gauges: (0..shards).map(|_| ShardGauges::new(shards)).collect(),
            shards,
            drained_shards: AtomicUsize::new(0),
            shutdown_deadline: std::sync::OnceLock::new(),
        })
    }

    pub fn set_ready(&self, ready: bool) {
        self.env.lifecycle.set_ready(ready);
    }

    /// Starts shutdown; the exit timeout runs from here (the signal).
    pub fn begin_shutdown(&self) {
        let _ = self
            .shutdown_deadline
            .set(Instant::now() + self.options.exit_timeout);
        self.env.lifecycle.begin_shutdown();
    }

    /// When drain and teardown must be over: the exit timeout after
    /// `begin_shutdown` (from now if it was not called).
    pub fn shutdown_deadline(&self) -> Instant {
        *self
            .shutdown_deadline
            .get_or_init(|| Instant::now() + self.options.exit_timeout)
    }

    /// Called once by each shard when its own requests are answered.
    pub fn shard_drained(&self) {
        self.drained_shards.fetch_add(1, Ordering::AcqRel);
    }

    pub fn all_shards_drained(&self) -> bool {
        self.drained_shards.load(Ordering::Acquire) >= self.shards
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_follows_options() {
        let mut options = ServerOptions::for_tests("models");
        options.server_name = "custom".into();
        options.http_max_input_size = 123;
        options.grpc_max_message_size = 456;
        options.grpc_compress_responses = true;
        let state = ServerState::new(options, 1);
        assert_eq!(state.env.server_name, "custom");
        assert_eq!(
            state.env.limits,
            FrontendLimits {
                http_max_input_size: 123,
                grpc_max_message_size: 456,
                grpc_compress_responses: true,
            }
        );
        state.set_ready(true);
        assert!(state.env.lifecycle.ready());
        state.begin_shutdown();
        assert!(!state.env.lifecycle.ready() && state.env.lifecycle.is_shutting_down());
    }
}
