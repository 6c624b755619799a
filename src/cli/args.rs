//! The command line: tritonserver 2.51's flags under its group headings,
//! then ours under "shardserve". What each flag does here (served, no
//! effect, refused) is in `docs/flags.md` and `super::disposition`.

use std::{net::IpAddr, path::PathBuf, time::Duration};

use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};

use super::values;
use crate::tuning::IoDriver;

/// `--version`: the crate version and the commit it was built from
/// ("unknown" when built from a tarball without `.git`; see build.rs).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("SHARDSERVE_COMMIT"),
    ")"
);

#[derive(Debug, Parser)]
#[command(
    name = "shardserve",
    version = VERSION,
    // As tritonserver's getopt: a flag given twice takes its last value.
    args_override_self = true,
    about = "Thread-per-core inference server, drop-in for Triton's KServe v2 protocols",
    long_about = "Thread-per-core inference server, drop-in for Triton Inference Server 2.51: \
                  the same protocols, model repositories and flags. Booleans take \
                  true|false|on|off|1|0, as `--flag=value` or `--flag value`. \
                  docs/flags.md says what each tritonserver flag does here."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub server: ServerArgs,
    #[command(flatten)]
    pub logging: LoggingArgs,
    #[command(flatten)]
    pub repository: RepositoryArgs,
    #[command(flatten)]
    pub http: HttpArgs,
    #[command(flatten)]
    pub grpc: GrpcArgs,
    #[command(flatten)]
    pub sagemaker: SagemakerArgs,
    #[command(flatten)]
    pub vertex: VertexArgs,
    #[command(flatten)]
    pub metrics: MetricsArgs,
    #[command(flatten)]
    pub tracing: TracingArgs,
    #[command(flatten)]
    pub backend: BackendArgs,
    #[command(flatten)]
    pub repoagent: RepoAgentArgs,
    #[command(flatten)]
    pub cache: CacheArgs,
    #[command(flatten)]
    pub rate_limiter: RateLimiterArgs,
    #[command(flatten)]
    pub memory: MemoryArgs,
    #[command(flatten)]
    pub deprecated: DeprecatedArgs,
    #[command(flatten)]
    pub ours: ShardserveArgs,
}

#[derive(Debug, Args)]
#[command(next_help_heading = "Server")]
pub struct ServerArgs {
    /// Name of this server, reported as the server metadata's name.
    #[arg(long = "id", visible_alias = "server-name", value_name = "STRING",
          default_value = crate::frontend::identity::DEFAULT_SERVER_NAME, value_parser = values::non_empty)]
    pub id: String,
    /// Seconds, from SIGINT/SIGTERM, for in-flight requests to finish and the backends'
    /// finalizers to run; past it the process exits with status 1, naming what still ran.
    #[arg(long, value_name = "INTEGER", default_value_t = 30)]
    pub exit_timeout_secs: u64,
}

#[derive(Debug, Args)]
#[command(next_help_heading = "Logging")]
pub struct LoggingArgs {
    /// Verbose logging level: 0 off, 1 and up more detail (true/false as 1/0).
    #[arg(long, value_name = "INTEGER", default_value = "0", value_parser = values::verbose_level)]
    pub log_verbose: u32,
    /// Log info-level messages.
    #[arg(long, value_name = "BOOLEAN", default_value = "true", value_parser = values::boolean,
          action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub log_info: bool,
    /// Log warning-level messages.
    #[arg(long, value_name = "BOOLEAN", default_value = "true", value_parser = values::boolean,
          action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub log_warning: bool,
    /// Log error-level messages.
    #[arg(long, value_name = "BOOLEAN", default_value = "true", value_parser = values::boolean,
          action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub log_error: bool,
    /// Line format: "default" (LMMDD hh:mm:ss.ssssss), "ISO8601" (YYYY-MM-DDThh:mm:ssZ L),
    /// or "json" (one object a line; not in tritonserver).
    #[arg(long, value_name = "STRING", default_value = "default")]
    pub log_format: crate::logs::LogFormat,
    /// Write the log to this file instead of the console.
    #[arg(long, value_name = "STRING")]
    pub log_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ControlMode {
    None,
    Explicit,
    Poll,
}

#[derive(Debug, Args)]
#[command(next_help_heading = "Model Repository")]
pub struct RepositoryArgs {
    /// A model repository directory (repeatable); a model name found in two is unavailable.
    #[arg(
        long = "model-repository",
        visible_alias = "model-store",
        value_name = "STRING"
    )]
    pub model_repository: Vec<PathBuf>,
    /// Exit at start-up if a model fails to load (false: serve the rest).
    #[arg(long, value_name = "BOOLEAN", default_value = "true", value_parser = values::boolean,
          action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub exit_on_error: bool,
    /// Use model configurations as written: no completion from the model files.
    #[arg(long)]
    pub disable_auto_complete_config: bool,
    /// true: ready only when every model is ready; false: ready once the server answers.
    #[arg(long, value_name = "BOOLEAN", default_value = "true", value_parser = values::boolean,
          action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub strict_readiness: bool,
    /// none: load every model at start, no changes after; poll: follow the repositories;
    /// explicit: load and unload through the repository API (and --load-model).
    #[arg(
        long,
        value_name = "STRING",
        value_enum,
        ignore_case = true,
        default_value = "none"
    )]
    pub model_control_mode: ControlMode,
    /// Poll mode: seconds between scans of the repositories.
    #[arg(long, value_name = "INTEGER", default_value_t = 15)]
    pub repository_poll_secs: u64,
    /// Explicit mode: a model to load at start-up (repeatable; `*` loads all).
    #[arg(long, value_name = "STRING")]
    pub load_model: Vec<String>,
    /// Read `configs/<name>.pbtxt` in a model's folder, where present, instead of config.pbtxt.
    #[arg(long, value_name = "STRING", value_parser = values::non_empty)]
    pub model_config_name: Option<String>,
    /// Models loaded at once.
    #[arg(long, value_name = "INTEGER", default_value = "4", value_parser = values::positive)]
    pub model_load_thread_count: usize,
    /// Further attempts at loading a model that failed.
    #[arg(long, value_name = "INTEGER", default_value_t = 0)]
    pub model_load_retry_count: u32,
    /// Models of one name in several repositories kept apart, each in its repository's namespace.
    #[arg(long, value_name = "BOOLEAN", value_parser = values::boolean,
          num_args = 0..=1, default_missing_value = "true")]
    pub model_namespacing: Option<bool>,
    /// Direct copies between GPUs (no effect here).
    #[arg(long, value_name = "BOOLEAN", value_parser = values::boolean,
          num_args = 0..=1, default_missing_value = "true")]
    pub enable_peer_access: Option<bool>,
}

#[derive(Debug, Args)]
#[command(next_help_heading = "HTTP")]
pub struct HttpArgs {
    /// Serve HTTP/REST (default: true, false when AIP_MODE=PREDICTION).
    #[arg(long, value_name = "BOOLEAN", value_parser = values::boolean,
          action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub allow_http: Option<bool>,
    /// Address of the HTTP listener (default: --host).
    #[arg(long, value_name = "STRING")]
    pub http_address: Option<IpAddr>,
    /// Port of the HTTP listener (0: any free port).
    #[arg(long, value_name = "INTEGER", default_value_t = 8000)]
    pub http_port: u16,
    /// Share the HTTP port with other processes that set this too (SO_REUSEPORT).
    #[arg(long, value_name = "BOOLEAN", default_value = "false", value_parser = values::boolean,
          action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub reuse_http_port: bool,
    /// Regular expression: request headers it matches become inference request parameters.
    #[arg(long, value_name = "STRING")]
    pub http_header_forward_pattern: Option<String>,
    /// Threads serving HTTP (no effect here: the shards serve it).
    #[arg(long, value_name = "INTEGER", value_parser = values::positive)]
    pub http_thread_count: Option<usize>,
    /// Endpoint categories that need the header `<KEY>: <VALUE>` (else 403); repeatable.
    /// Categories: health, metadata, inference, shared-memory, model-config,
    /// model-repository, statistics, trace, logging.
    #[arg(long, value_name = "<API>[,<API>...]:<KEY>=<VALUE>")]
    pub http_restricted_api: Vec<String>,
    /// HTTPS on the HTTP port (not in tritonserver; needs --http-server-cert and --http-server-key).
    #[arg(long, value_name = "BOOLEAN", default_value = "false", value_parser = values::boolean,
          action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub http_use_ssl: bool,
    /// HTTPS requiring client certificates signed by --http-root-cert; giving it turns
    /// --http-use-ssl on (not in tritonserver).
    #[arg(long, value_name = "BOOLEAN", value_parser = values::boolean,
          num_args = 0..=1, default_missing_value = "true")]
    pub http_use_ssl_mutual: Option<bool>,
    /// PEM file with the HTTPS certificate chain (not in tritonserver).
    #[arg(long, value_name = "STRING")]
    pub http_server_cert: Option<PathBuf>,
    /// PEM file with the HTTPS private key (not in tritonserver).
    #[arg(long, value_name = "STRING")]
    pub http_server_key: Option<PathBuf>,
    /// PEM file with the CAs for HTTPS client certificates (not in tritonserver).
    #[arg(long, value_name = "STRING")]
    pub http_root_cert: Option<PathBuf>,
    /// Largest HTTP request body, in bytes.
    #[arg(long, value_name = "INTEGER", default_value = "67108864", value_parser = values::positive)]
    pub http_max_input_size: usize,
}

/// tritonserver's `--grpc-infer-response-compression-level` values. tonic
/// offers no per-level setting: every level but `none` compresses with its
/// default level.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum CompressionLevel {
    None,
    Low,
    Medium,
    High,
}

#[derive(Debug, Args)]
#[command(next_help_heading = "GRPC")]
pub struct GrpcArgs {
    /// Serve gRPC (default: true, false when AIP_MODE=PREDICTION).
    #[arg(long, value_name = "BOOLEAN", value_parser = values::boolean,
          action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub allow_grpc: Option<bool>,
    /// Address of the gRPC listener (default: --host).
    #[arg(long, value_name = "STRING")]
    pub grpc_address: Option<IpAddr>,
    /// Port of the gRPC listener (0: any free port).
    #[arg(long, value_name = "INTEGER", default_value_t = 8001)]
    pub grpc_port: u16,
    /// Share the gRPC port with other processes that set this too (SO_REUSEPORT).
    #[arg(long, value_name = "BOOLEAN", default_value = "false", value_parser = values::boolean,
          action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub reuse_grpc_port: bool,
    /// Regular expression: call metadata it matches becomes inference request parameters.
    #[arg(long, value_name = "STRING")]
    pub grpc_header_forward_pattern: Option<String>,
    /// Pooled request/response objects (no effect here: not pooled).
    #[arg(long, value_name = "INTEGER", value_parser = values::positive)]
    pub grpc_infer_allocation_pool_size: Option<usize>,
    /// gRPC over TLS (needs --grpc-server-cert and --grpc-server-key).
    #[arg(long, value_name = "BOOLEAN", default_value = "false", value_parser = values::boolean,
          action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub grpc_use_ssl: bool,
    /// gRPC over mutual TLS, clients' certificates signed by --grpc-root-cert; giving it
    /// (any value) turns --grpc-use-ssl on.
    #[arg(long, value_name = "BOOLEAN", value_parser = values::boolean,
          num_args = 0..=1, default_missing_value = "true")]
    pub grpc_use_ssl_mutual: Option<bool>,
    /// PEM file with the gRPC server's certificate chain.
    #[arg(long, value_name = "STRING")]
    pub grpc_server_cert: Option<PathBuf>,
    /// PEM file with the gRPC server's private key.
    #[arg(long, value_name = "STRING")]
    pub grpc_server_key: Option<PathBuf>,
    /// PEM file with the CAs client certificates must chain to (mutual TLS).
    #[arg(long, value_name = "STRING")]
    pub grpc_root_cert: Option<PathBuf>,
    /// Compress inference responses for clients that accept it: none, low, medium, high.
    #[arg(
        long,
        value_name = "STRING",
        value_enum,
        ignore_case = true,
        default_value = "none"
    )]
    pub grpc_infer_response_compression_level: CompressionLevel,
    /// Milliseconds without frames before the server PINGs the client (0: never).
    #[arg(long, value_name = "INTEGER", default_value_t = 7_200_000)]
    pub grpc_keepalive_time: u64,
    /// Milliseconds to wait for a PING acknowledgement before closing the connection.
    #[arg(long, value_name = "INTEGER", default_value_t = 20_000)]
    pub grpc_keepalive_timeout: u64,
    /// Keepalive PINGs also on connections with no call in flight.
    #[arg(long, value_name = "BOOLEAN", default_value = "false", value_parser = values::boolean,
          action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub grpc_keepalive_permit_without_calls: bool,
    /// PINGs sent while no data or header frame goes out (0: no limit).
    #[arg(long, value_name = "INTEGER", default_value_t = 2)]
    pub grpc_http2_max_pings_without_data: u32,
    /// Milliseconds a client must leave between PINGs while no data flows; closer is a strike.
    #[arg(long, value_name = "INTEGER", default_value = "300000", value_parser = values::millis)]
    pub grpc_http2_min_recv_ping_interval_without_data: Duration,
    /// Strikes tolerated before GOAWAY (0: any number).
    #[arg(long, value_name = "INTEGER", default_value_t = 2)]
    pub grpc_http2_max_ping_strikes: u32,
    /// Milliseconds a connection may live (default: no limit).
    #[arg(long, value_name = "INTEGER", value_parser = values::millis)]
    pub grpc_max_connection_age: Option<Duration>,
    /// Milliseconds granted to a connection's calls once it reached its age (default: no limit).
    #[arg(long, value_name = "INTEGER", value_parser = values::millis)]
    pub grpc_max_connection_age_grace: Option<Duration>,
    /// Method categories that need the metadata `triton-grpc-protocol-<KEY>: <VALUE>`
    /// (else UNAVAILABLE); repeatable, categories as --http-restricted-api.
    #[arg(long, value_name = "<PROTOCOL>[,<PROTOCOL>...]:<KEY>=<VALUE>")]
    pub grpc_restricted_protocol: Vec<String>,
}

#[derive(Debug, Args)]
#[command(next_help_heading = "Sagemaker")]
pub struct SagemakerArgs {
    /// Serve the SageMaker routes (/ping, /invocations).
    #[arg(long, value_name = "BOOLEAN", value_parser = values::boolean,
          num_args = 0..=1, default_missing_value = "true")]
    pub allow_sagemaker: Option<bool>,
    /// Port of the SageMaker service (default 8080).
    #[arg(long, value_name = "INTEGER")]
    pub sagemaker_port: Option<u16>,
    /// With SageMaker on: the ports the other services may use, `<low>-<high>`.
    #[arg(long, value_name = "<INTEGER>-<INTEGER>", value_parser = values::port_range)]
    pub sagemaker_safe_port_range: Option<(u16, u16)>,
    /// Threads of the SageMaker service (no effect: the shards serve it).
    #[arg(long, value_name = "INTEGER", value_parser = values::positive)]
    pub sagemaker_thread_count: Option<usize>,
}

#[derive(Debug, Args)]
#[command(next_help_heading = "Vertex")]
pub struct VertexArgs {
    /// Serve the Vertex AI routes (default: true when AIP_MODE=PREDICTION).
    #[arg(long, value_name = "BOOLEAN", value_parser = values::boolean,
          num_args = 0..=1, default_missing_value = "true")]
    pub allow_vertex_ai: Option<bool>,
    /// Port of the Vertex AI service (default: AIP_HTTP_PORT, else 8080).
    #[arg(long, value_name = "INTEGER")]
    pub vertex_ai_port: Option<u16>,
    /// Threads of the Vertex AI service (no effect: the shards serve it).
    #[arg(long, value_name = "INTEGER", value_parser = values::positive)]
    pub vertex_ai_thread_count: Option<usize>,
    /// Model that Vertex AI predict requests go to (default: the only model).
    #[arg(long, value_name = "STRING")]
    pub vertex_ai_default_model: Option<String>,
}

#[derive(Debug, Args)]
#[command(next_help_heading = "Metrics")]
pub struct MetricsArgs {
    /// Serve Prometheus metrics.
    #[arg(long, value_name = "BOOLEAN", default_value = "true", value_parser = values::boolean,
          action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub allow_metrics: bool,
    /// Report GPU metrics (with --allow-metrics).
    #[arg(long, value_name = "BOOLEAN", default_value = "true", value_parser = values::boolean,
          action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub allow_gpu_metrics: bool,
    /// Report CPU and memory metrics (with --allow-metrics).
    #[arg(long, value_name = "BOOLEAN", default_value = "true", value_parser = values::boolean,
          action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub allow_cpu_metrics: bool,
    /// Address of the metrics listener (default: --http-address, else --host).
    #[arg(long, value_name = "STRING")]
    pub metrics_address: Option<IpAddr>,
    /// Port of the metrics listener (0: any free port).
    #[arg(long, value_name = "INTEGER", default_value_t = 8002)]
    pub metrics_port: u16,
    /// Milliseconds between two readings of the GPU and CPU metrics.
    #[arg(long, value_name = "FLOAT", default_value = "2000", value_parser = values::interval_ms)]
    pub metrics_interval_ms: f64,
    /// A metrics setting, `<setting>=<value>` (repeatable): summary_latencies,
    /// summary_quantiles, counter_latencies, histogram_latencies.
    #[arg(long, value_name = "<SETTING>=<VALUE>", value_parser = values::metrics_setting)]
    pub metrics_config: Vec<String>,
}

#[derive(Debug, Args)]
#[command(next_help_heading = "Tracing")]
pub struct TracingArgs {
    /// A trace setting (repeatable): `triton,file=PATH`, `triton,log-frequency=N`,
    /// `level=OFF|TIMESTAMPS`, `rate=N`, `count=N` (-1: unlimited), `mode=triton`.
    #[arg(long = "trace-config", value_name = "[MODE,]SETTING=VALUE")]
    pub trace_config: Vec<String>,
}

#[derive(Debug, Args)]
#[command(next_help_heading = "Backend")]
pub struct BackendArgs {
    /// Where backend libraries are found: `<DIR>/<name>/libtriton_<name>.so`. Default: the
    /// checkout's `.backends/` (the nearest at or above the executable's folder), else `./.backends`.
    #[arg(long, value_name = "STRING")]
    pub backend_directory: Option<PathBuf>,
    /// A backend setting, `<name>,<key>=<value>` (repeatable), given to the backend as
    /// `{"cmdline":{"<key>":"<value>"}}`.
    #[arg(long, value_name = "<NAME>,<SETTING>=<VALUE>",
          value_parser = crate::backend::capi::settings::parse_backend_config)]
    pub backend_config: Vec<(String, String, String)>,
}

#[derive(Debug, Args)]
#[command(next_help_heading = "Repository Agent")]
pub struct RepoAgentArgs {
    /// Where repository agent libraries are found (no effect here: no repository agents).
    #[arg(long, value_name = "STRING")]
    pub repoagent_directory: Option<PathBuf>,
}

#[derive(Debug, Args)]
#[command(next_help_heading = "Response Cache")]
pub struct CacheArgs {
    /// A response cache setting, `<cache>,<setting>=<value>`: `local,size=<bytes>` (the
    /// built-in cache; no other cache exists here).
    #[arg(long, value_name = "<CACHE>,<SETTING>=<VALUE>", value_parser = values::named_setting)]
    pub cache_config: Vec<(String, String, String)>,
    /// Where response cache libraries are found (accepted; only the built-in `local` cache
    /// exists here).
    #[arg(long, value_name = "STRING")]
    pub cache_directory: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RateLimit {
    Off,
    #[value(name = "execution_count")]
    ExecutionCount,
}

#[derive(Debug, Args)]
#[command(next_help_heading = "Rate Limiter")]
pub struct RateLimiterArgs {
    /// Rate limiting of model instances: off (instance groups' rate_limiter ignored), or
    /// execution_count (an instance executes only when its resources are free).
    #[arg(
        long,
        value_name = "STRING",
        value_enum,
        ignore_case = true,
        default_value = "off"
    )]
    pub rate_limit: RateLimit,
    /// A rate limiter resource, `<name>:<count>[:<device>]` (no device: on every device).
    #[arg(long, value_name = "<NAME>:<COUNT>[:<DEVICE>]", value_parser = crate::scheduler::rate_limiter::ResourceLimit::parse)]
    pub rate_limit_resource: Vec<crate::scheduler::rate_limiter::ResourceLimit>,
}

#[derive(Debug, Args)]
#[command(next_help_heading = "Memory/Device Management")]
pub struct MemoryArgs {
    /// Bytes of page-locked host staging buffers per NUMA node for copies to and from GPUs
    /// (0: none). Default: the tuning profile's `[gpu] pinned_pool_bytes`, else 256 MiB.
    #[arg(long, value_name = "INTEGER")]
    pub pinned_memory_pool_byte_size: Option<usize>,
    /// A GPU's CUDA memory pool, `<device>:<bytes>` (repeatable; no effect here).
    #[arg(long, value_name = "<INTEGER>:<INTEGER>", value_parser = values::device_bytes)]
    pub cuda_memory_pool_byte_size: Vec<(u32, u64)>,
    /// A GPU's virtual address space reserve, `<device>:<bytes>` (repeatable; no effect here).
    #[arg(long, value_name = "<INTEGER>:<INTEGER>", value_parser = values::device_bytes)]
    pub cuda_virtual_address_size: Vec<(u32, u64)>,
    /// Lowest CUDA compute capability used (no effect here).
    #[arg(long, value_name = "FLOAT", value_parser = values::non_negative_float)]
    pub min_supported_compute_capability: Option<f64>,
    /// Threads gathering request inputs (no effect here: the shards do it).
    #[arg(long, value_name = "INTEGER", value_parser = values::positive)]
    pub buffer_manager_thread_count: Option<usize>,
    /// A host policy setting, `<policy>,<setting>=<value>` (repeatable; no effect here).
    #[arg(long, value_name = "<STRING>,<STRING>=<STRING>", value_parser = values::named_setting)]
    pub host_policy: Vec<(String, String, String)>,
    /// Share of a GPU's memory that loading models may fill, `<device>:<fraction>`
    /// (repeatable; no effect here).
    #[arg(long, value_name = "<DEVICE_ID>:<FRACTION>", value_parser = values::device_fraction)]
    pub model_load_gpu_limit: Vec<(u32, f64)>,
}

#[derive(Debug, Args)]
#[command(next_help_heading = "DEPRECATED")]
pub struct DeprecatedArgs {
    /// Use --disable-auto-complete-config: true takes model configurations as written.
    #[arg(long, value_name = "BOOLEAN", value_parser = values::boolean,
          num_args = 0..=1, default_missing_value = "true")]
    pub strict_model_config: Option<bool>,
    /// Use --cache-config: bytes of the local response cache (= `--cache-config local,size=N`).
    #[arg(long, value_name = "INTEGER")]
    pub response_cache_byte_size: Option<u64>,
    /// Use `--trace-config triton,file=PATH`.
    #[arg(long, value_name = "STRING")]
    pub trace_file: Option<String>,
    /// Use `--trace-config level=LEVEL` (repeatable).
    #[arg(long, value_name = "STRING")]
    pub trace_level: Vec<String>,
    /// Use `--trace-config rate=N`.
    #[arg(long, value_name = "INTEGER")]
    pub trace_rate: Option<String>,
    /// Use `--trace-config count=N`.
    #[arg(long, value_name = "INTEGER")]
    pub trace_count: Option<String>,
    /// Use `--trace-config triton,log-frequency=N`.
    #[arg(long, value_name = "INTEGER")]
    pub trace_log_frequency: Option<String>,
}

#[derive(Debug, Args)]
#[command(next_help_heading = "shardserve")]
pub struct ShardserveArgs {
    /// Address of every listener whose own address flag is not given.
    #[arg(long, default_value = "0.0.0.0")]
    pub host: IpAddr,
    /// Tuning profile: a name in tuning/ (e.g. `split-2core`) or a TOML file path.
    #[arg(long, global = true)]
    pub tuning_profile: Option<String>,
    /// Number of shards (one pinned thread each) on the first N usable CPUs; default: all.
    #[arg(long, global = true)]
    pub cores: Option<usize>,
    /// Do not pin shard threads to cores.
    #[arg(long, global = true)]
    pub no_pin: bool,
    /// Let Python sent with a repository load request run (uploaded `.py` or bytecode files,
    /// uploads for `python` models, an EXECUTION_ENV_PATH inside the upload). Off: refused.
    /// Native code in an upload is always refused.
    #[arg(long, value_name = "BOOLEAN", default_value = "false", value_parser = values::boolean,
          action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub model_load_allow_uploaded_python: bool,
    /// Longest an inference request may wait for its answer, in milliseconds (0: no limit);
    /// its queued work is then dropped.
    #[arg(long, default_value_t = 0)]
    pub request_timeout_ms: u64,
    /// Queue bound of models whose config leaves `max_queue_size` at 0 (Triton: unbounded).
    /// Overflow is answered "Exceeds maximum queue size".
    #[arg(long, default_value_t = crate::scheduler::DEFAULT_MAX_QUEUE_SIZE)]
    pub max_queue_size: usize,
    /// Open connections per accepting shard (HTTP, gRPC and metrics together); over it new
    /// connections are closed at once. Default: the open-file limit less 256 (or a quarter),
    /// divided by the accepting shards.
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// Request-body bytes the server buffers at once, split evenly over the accepting shards;
    /// over it requests get 503. Default: min(1 GiB, RAM/4).
    #[arg(long)]
    pub max_buffered_request_bytes: Option<usize>,
    /// HTTP: seconds from a request's first byte to the end of its headers (else 408).
    #[arg(long, default_value_t = 30)]
    pub http_header_timeout_secs: u64,
    /// HTTP: longest pause, in seconds, between two chunks of a request body (else 408).
    #[arg(long, default_value_t = 60)]
    pub http_body_timeout_secs: u64,
    /// HTTP: seconds to receive a whole request body (else 408).
    #[arg(long, default_value_t = 300)]
    pub http_body_total_timeout_secs: u64,
    /// Seconds a connection may stay without a request (HTTP/1 keep-alive) or without an
    /// open stream (HTTP/2, closed with GOAWAY).
    #[arg(long, default_value_t = 120)]
    pub idle_timeout_secs: u64,
    /// gRPC: seconds for a new connection to send the HTTP/2 preface and SETTINGS.
    #[arg(long, default_value_t = 10)]
    pub grpc_handshake_timeout_secs: u64,
    /// Largest gRPC message received or sent, in bytes (over it: RESOURCE_EXHAUSTED).
    #[arg(long, default_value_t = 64 * 1024 * 1024)]
    pub grpc_max_message_size: usize,
    /// Capacity of each cross-shard ring, in messages (default: the profile's, else 1024).
    #[arg(long)]
    pub ring_capacity: Option<usize>,
    /// Shard I/O driver: auto (io_uring, epoll where refused), io-uring, epoll (default: the
    /// profile's, else auto).
    #[arg(long)]
    pub io_driver: Option<IoDriver>,
    /// Microseconds each shard keeps polling after a request finished before it sleeps; 0 =
    /// sleep at once (default: the profile's `[runtime] spin_us`, else 0).
    #[arg(long, global = true)]
    pub spin_us: Option<u64>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the detected hardware topology (cores, NUMA nodes, GPUs) and the placement that
    /// the given options (--cores, --tuning-profile, --no-pin) would use: shards, compute
    /// workers, GPU instances.
    Topology {
        /// Describe a recorded machine (hwloc XML, as `lstopo file.xml` writes) instead of
        /// this one; its GPUs are numbered in PCI order.
        #[arg(long)]
        xml: Option<PathBuf>,
    },
    /// Measure this machine (topology, GPUs, ring round trips within and across NUMA nodes;
    /// about a second) and write a tuning profile for it.
    Tune {
        /// Where to write the profile (default: standard output).
        #[arg(long)]
        output: Option<PathBuf>,
        /// Milliseconds per measurement.
        #[arg(long, default_value_t = 300)]
        budget_ms: u64,
    },
}
