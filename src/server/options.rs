use std::{net::IpAddr, path::PathBuf, time::Duration};

use crate::tuning::{IoDriver, TuningProfile};

/// How the repository's models are chosen for loading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelControlMode {
    /// Load everything at start-up; no changes afterwards.
    None,
    /// Load only `--load-model` models at start-up.
    Explicit,
}

/// Everything `start` needs; the command line fills it in.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    pub model_repositories: Vec<PathBuf>,
    pub host: IpAddr,
    pub http_port: u16,
    pub grpc_port: u16,
    pub metrics_port: u16,
    pub allow_http: bool,
    pub allow_grpc: bool,
    pub allow_metrics: bool,
    /// Number of shards; `None` = one per CPU this process may use.
    pub cores: Option<usize>,
    /// Pin shard threads to their cores.
    pub pin_threads: bool,
    pub strict_model_config: bool,
    pub model_control_mode: ModelControlMode,
    pub load_models: Vec<String>,
    pub exit_timeout: Duration,
    /// Capacity of each cross-shard ring, in messages.
    pub ring_capacity: usize,
    /// Largest HTTP request body accepted (after decompression too).
    pub http_max_input_size: usize,
    /// Largest gRPC message accepted or sent.
    pub grpc_max_message_size: usize,
    pub intra_op_threads: usize,
    /// The shards' I/O driver.
    pub io_driver: IoDriver,
    /// Placement and defaults; its ring capacity and ONNX Runtime threads
    /// apply where the command line did not set them.
    pub tuning: TuningProfile,
}

impl ServerOptions {
    pub fn new(model_repositories: Vec<PathBuf>) -> Self {
        Self {
            model_repositories,
            host: IpAddr::from([0, 0, 0, 0]),
            http_port: 8000,
            grpc_port: 8001,
            metrics_port: 8002,
            allow_http: true,
            allow_grpc: true,
            allow_metrics: true,
            cores: None,
            pin_threads: true,
            strict_model_config: false,
            model_control_mode: ModelControlMode::None,
            load_models: Vec::new(),
            exit_timeout: Duration::from_secs(30),
            ring_capacity: 1024,
            http_max_input_size: 64 * 1024 * 1024,
            grpc_max_message_size: i32::MAX as usize,
            intra_op_threads: 1,
            io_driver: IoDriver::Auto,
            tuning: TuningProfile::default(),
        }
    }

    /// Loopback, ephemeral ports, one shard, no pinning: for tests and
    /// in-process tools.
    pub fn for_tests(repository: impl Into<PathBuf>) -> Self {
        Self {
            host: IpAddr::from([127, 0, 0, 1]),
            http_port: 0,
            grpc_port: 0,
            metrics_port: 0,
            cores: Some(1),
            pin_threads: false,
            exit_timeout: Duration::from_secs(5),
            ..Self::new(vec![repository.into()])
        }
    }
}
