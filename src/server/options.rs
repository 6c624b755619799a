use std::{net::IpAddr, path::PathBuf, time::Duration};

use crate::tuning::{IoDriver, TuningProfile};

pub use crate::repository::manager::ModelControlMode;

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
    /// `--model-load-allow-uploaded-python`: Python files sent with a load
    /// request (and uploads for `python` models) may run; off by default.
    /// Native code in an upload is refused regardless.
    pub model_load_allow_uploaded_python: bool,
    /// `--repository-poll-secs` in poll mode.
    pub repository_poll: Duration,
    pub exit_timeout: Duration,
    /// `--request-timeout-ms`: an inference request not answered by then
    /// gets "Request timeout expired" and its queued work is dropped.
    pub request_timeout: Option<Duration>,
    /// `--max-queue-size`: the queue bound of models whose config leaves
    /// `max_queue_size` at 0.
    pub max_queue_size: usize,
    /// Capacity of each cross-shard ring, in messages.
    pub ring_capacity: usize,
    /// Largest HTTP request body accepted (after decompression too).
    pub http_max_input_size: usize,
    /// Largest gRPC message accepted or sent.
    pub grpc_max_message_size: usize,
    /// Open connections per accepting shard (HTTP, gRPC and metrics
    /// together); `None` = derived from the open-file limit at start.
    pub max_connections: Option<usize>,
    /// Request-body bytes the process may hold buffered at once, split
    /// evenly over the accepting shards; `None` = min(1 GiB, RAM / 4).
    pub max_buffered_request_bytes: Option<usize>,
    /// HTTP/1: longest time from a request's first byte to the end of its headers.
    pub http_header_timeout: Duration,
    /// HTTP/1: longest pause between two chunks of a request body.
    pub http_body_timeout: Duration,
    /// HTTP/1: longest time to receive a whole request body.
    pub http_body_total_timeout: Duration,
    /// A connection with no request (HTTP/1) or no open stream (HTTP/2)
    /// for this long is closed (HTTP/2 with GOAWAY).
    pub idle_timeout: Duration,
    /// HTTP/2: a connection that has not sent its preface and SETTINGS
    /// within this time is closed.
    pub grpc_handshake_timeout: Duration,
    /// HTTP/2 keepalive: PING the client after this long without frames
    /// (`None` = never; Triton's default is 2 hours).
    pub grpc_keepalive_time: Option<Duration>,
    /// HTTP/2 keepalive: close the connection if a PING is not acknowledged in time.
    pub grpc_keepalive_timeout: Duration,
    /// Compress gRPC responses for clients that accept gzip/deflate
    /// (`--grpc-infer-response-compression-level` other than `none`).
    /// Off by default, as in Triton: grpc-core clients accept gzip on
    /// every call, and compressing a 4 MB response costs ~0.3 s of CPU.
    pub grpc_compress_responses: bool,
    pub intra_op_threads: usize,
    /// The shards' I/O driver.
    pub io_driver: IoDriver,
    /// How long a shard keeps polling after a request finished before it
    /// parks (zero: never spins).
    pub spin: Duration,
    /// Placement and defaults; its ring capacity and ONNX Runtime threads
    /// apply where the command line did not set them.
    pub tuning: TuningProfile,
    /// `--metrics-interval-ms`: how often GPU metrics are read.
    pub metrics_interval: Duration,
    /// The server metadata name (`--server-name`; Triton's "triton" by default).
    pub server_name: String,
    /// `--trace-config`: the trace settings in force at start.
    pub trace: crate::trace::TraceConfig,
    /// `--grpc-use-ssl[-mutual]`: TLS on the gRPC port.
    pub grpc_tls: Option<crate::frontend::transport::TlsFiles>,
    /// `--http-use-ssl[-mutual]`: TLS on the HTTP port (not in Triton).
    pub http_tls: Option<crate::frontend::transport::TlsFiles>,
    /// `--http-restricted-api`: HTTP endpoint categories that need a header.
    pub http_restricted_api: crate::frontend::restricted::Restrictions,
    /// `--grpc-restricted-protocol`: gRPC method categories that need metadata.
    pub grpc_restricted_protocol: crate::frontend::restricted::Restrictions,
    /// `--exit-on-error`: a model that fails to load at start-up stops the
    /// server (start returns an error naming it).
    pub exit_on_error: bool,
    /// `--strict-readiness`: ready only when live and every model that
    /// should be loaded is ready; else ready as soon as live.
    pub strict_readiness: bool,
    /// `--model-load-thread-count`: model loads run at once.
    pub model_load_thread_count: usize,
    /// `--model-load-retry-count`: times a failed load is tried again.
    pub model_load_retry_count: u32,
    /// `--model-config-name`: load `<model>/configs/<name>.pbtxt` where it
    /// exists instead of `config.pbtxt`.
    pub model_config_name: Option<String>,
    /// `--http-address`: the HTTP listener's address (`None` = `host`).
    pub http_address: Option<std::net::IpAddr>,
    /// `--grpc-address`: the gRPC listener's address (`None` = `host`).
    pub grpc_address: Option<std::net::IpAddr>,
    /// `--reuse-http-port`: another process may bind the HTTP port too
    /// (SO_REUSEPORT; the kernel spreads connections over both).
    pub reuse_http_port: bool,
    /// `--reuse-grpc-port`: another process may bind the gRPC port too.
    pub reuse_grpc_port: bool,
    /// `--http-header-forward-pattern`: request headers whose names match
    /// this regex become string parameters of the inference request.
    pub http_header_forward_pattern: Option<String>,
    /// `--grpc-header-forward-pattern`: the same for gRPC metadata.
    pub grpc_header_forward_pattern: Option<String>,
    /// `--grpc-keepalive-permit-without-calls`: the server sends keepalive
    /// pings, and accepts the client's at `min_recv_ping_interval`, with
    /// no call open (otherwise a client ping more often than every 2 hours
    /// with no call open is a strike).
    pub grpc_keepalive_permit_without_calls: bool,
    /// `--grpc-http2-max-pings-without-data`: keepalive pings the server
    /// sends before it must send data or headers again (0 = unlimited).
    pub grpc_http2_max_pings_without_data: u32,
    /// `--grpc-http2-min-recv-ping-interval-without-data`: a client ping
    /// sooner than this after the last one, with no data sent between, is
    /// a strike.
    pub grpc_http2_min_recv_ping_interval_without_data: Duration,
    /// `--grpc-http2-max-ping-strikes`: strikes tolerated before GOAWAY
    /// ENHANCE_YOUR_CALM "too_many_pings" (0 = unlimited).
    pub grpc_http2_max_ping_strikes: u32,
    /// `--grpc-max-connection-age`: a connection older than this gets
    /// GOAWAY (`None` = never).
    pub grpc_max_connection_age: Option<Duration>,
    /// `--grpc-max-connection-age-grace`: how long its open streams may
    /// still run after that GOAWAY before it closes (`None` = unbounded).
    pub grpc_max_connection_age_grace: Option<Duration>,
    /// `--metrics-address`: where the metrics port binds (None: `host`).
    pub metrics_address: Option<std::net::IpAddr>,
    /// `--allow-gpu-metrics`: the `nv_gpu_*` families (with GPUs).
    pub allow_gpu_metrics: bool,
    /// `--allow-cpu-metrics`: `nv_cpu_utilization` and `nv_cpu_memory_*`.
    pub allow_cpu_metrics: bool,
    /// `--metrics-config`: raw `<setting>=<value>` settings as given.
    /// `--metrics-config`: the raw `<setting>=<value>` settings, checked at
    /// start by `metrics::config::MetricsConfig::parse`.
    pub metrics_config: Vec<String>,
    // issue 24: response cache
    /// `--cache-config local,size=N` (or `--response-cache-byte-size N`):
    /// the bytes of the built-in local response cache; `None`: no cache.
    pub response_cache_byte_size: Option<u64>,
    // issue 24: rate limiter
    /// `--rate-limit execution_count` (true) or `off` (false, the default:
    /// the models' `rate_limiter` settings are ignored).
    pub rate_limit: bool,
    /// `--rate-limit-resource <name>:<count>[:<device>]`, as given.
    pub rate_limit_resources: Vec<crate::scheduler::rate_limiter::ResourceLimit>,
    // issue 24: several repositories + namespacing
    /// `--model-namespacing`: each model is identified by its repository
    /// (the namespace) and its name, so one name may live in several
    /// repositories; metrics carry a `namespace` label.
    pub model_namespacing: bool,
    // issue 24: SageMaker and Vertex AI
    /// `--allow-sagemaker`: serve the SageMaker routes on `sagemaker_port`.
    pub allow_sagemaker: bool,
    /// `--sagemaker-port`.
    pub sagemaker_port: u16,
    /// `--sagemaker-safe-port-range`: with the SageMaker service on, the
    /// other services' ports on its address must lie in it.
    pub sagemaker_safe_port_range: Option<(u16, u16)>,
    /// `--allow-vertex-ai` (default: `AIP_MODE=PREDICTION`).
    pub allow_vertex_ai: bool,
    /// `--vertex-ai-port` (default: `AIP_HTTP_PORT`, else 8080).
    pub vertex_ai_port: u16,
    /// `--vertex-ai-default-model`.
    pub vertex_ai_default_model: Option<String>,
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
            repository_poll: Duration::from_secs(15),
            load_models: Vec::new(),
            model_load_allow_uploaded_python: false,
            exit_timeout: Duration::from_secs(30),
            request_timeout: None,
            max_queue_size: crate::scheduler::DEFAULT_MAX_QUEUE_SIZE,
            ring_capacity: 1024,
            http_max_input_size: 64 * 1024 * 1024,
            grpc_max_message_size: 64 * 1024 * 1024,
            max_connections: None,
            max_buffered_request_bytes: None,
            http_header_timeout: Duration::from_secs(30),
            http_body_timeout: Duration::from_secs(60),
            http_body_total_timeout: Duration::from_secs(300),
            idle_timeout: Duration::from_secs(120),
            grpc_handshake_timeout: Duration::from_secs(10),
            grpc_keepalive_time: Some(Duration::from_secs(2 * 60 * 60)),
            grpc_keepalive_timeout: Duration::from_secs(20),
            grpc_compress_responses: false,
            intra_op_threads: 1,
            io_driver: IoDriver::Auto,
            spin: TuningProfile::default().runtime.spin(),
            tuning: TuningProfile::default(),
            metrics_interval: Duration::from_millis(2000),
            server_name: crate::frontend::identity::DEFAULT_SERVER_NAME.to_string(),
            trace: crate::trace::TraceConfig::default(),
            grpc_tls: None,
            http_tls: None,
            http_restricted_api: Default::default(),
            grpc_restricted_protocol: Default::default(),
            exit_on_error: true,
            strict_readiness: true,
            model_load_thread_count: 4,
            model_load_retry_count: 0,
            model_config_name: None,
            http_address: None,
            grpc_address: None,
            reuse_http_port: false,
            reuse_grpc_port: false,
            http_header_forward_pattern: None,
            grpc_header_forward_pattern: None,
            grpc_keepalive_permit_without_calls: false,
            grpc_http2_max_pings_without_data: 2,
            grpc_http2_min_recv_ping_interval_without_data: Duration::from_millis(300_000),
            grpc_http2_max_ping_strikes: 2,
            grpc_max_connection_age: None,
            grpc_max_connection_age_grace: None,
            metrics_address: None,
            allow_gpu_metrics: true,
            allow_cpu_metrics: true,
            metrics_config: Vec::new(),
            // issue 24: response cache
            response_cache_byte_size: None,
            // issue 24: rate limiter
            rate_limit: false,
            rate_limit_resources: Vec::new(),
            // issue 24: several repositories + namespacing
            model_namespacing: false,
            // issue 24: SageMaker and Vertex AI
            allow_sagemaker: false,
            sagemaker_port: 8080,
            sagemaker_safe_port_range: None,
            allow_vertex_ai: false,
            vertex_ai_port: 8080,
            vertex_ai_default_model: None,
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
            // Many tests keep broken models beside working ones.
            exit_on_error: false,
            ..Self::new(vec![repository.into()])
        }
    }
}
