//! `shardserve`: the server binary. Flags follow tritonserver's where it has one.

use std::{net::IpAddr, path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use shardserve::{
    frontend::restricted::{Protocol, Restrictions},
    gpu::GpuInventory,
    server::{self, ModelControlMode, ServerOptions},
    tuning::{IoDriver, MachineTopology, ShardPlan, TuningProfile},
};

/// Chosen by measurement over glibc and jemalloc (see Cargo.toml).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ControlMode {
    None,
    Explicit,
    Poll,
}

#[derive(Debug, Parser)]
#[command(
    name = "shardserve",
    version,
    about = "Thread-per-core inference server, drop-in for Triton's KServe v2 protocols"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Model repository path (repeatable).
    #[arg(long = "model-repository", alias = "model-store")]
    model_repository: Vec<PathBuf>,
    /// Tuning profile: a name in tuning/ (e.g. `split-2core`) or a TOML file path.
    #[arg(long, global = true)]
    tuning_profile: Option<String>,
    /// Address to bind every listener to.
    #[arg(long, default_value = "0.0.0.0")]
    host: IpAddr,
    #[arg(long, default_value_t = 8000)]
    http_port: u16,
    #[arg(long, default_value_t = 8001)]
    grpc_port: u16,
    #[arg(long, default_value_t = 8002)]
    metrics_port: u16,
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    allow_http: bool,
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    allow_grpc: bool,
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    allow_metrics: bool,
    /// Number of shards (one pinned thread each) on the first N usable CPUs; default: all.
    #[arg(long, global = true)]
    cores: Option<usize>,
    /// Do not pin shard threads to cores.
    #[arg(long, global = true)]
    no_pin: bool,
    /// Require complete model configurations (no auto-complete from model files).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    strict_model_config: bool,
    #[arg(long, value_enum, default_value = "none")]
    model_control_mode: ControlMode,
    /// Let Python sent with a repository load request run (uploaded `.py`
    /// or bytecode files, uploads for `python` models, an EXECUTION_ENV_PATH
    /// inside the upload). Off: refused. Native code in an upload is always
    /// refused.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    model_load_allow_uploaded_python: bool,
    /// Model to load at start-up in explicit mode (repeatable; `*` loads all).
    #[arg(long)]
    load_model: Vec<String>,
    /// Poll mode: seconds between scans of the repositories for changes.
    #[arg(long, default_value_t = 15)]
    repository_poll_secs: u64,
    /// Seconds, from SIGINT/SIGTERM, for in-flight requests to finish and
    /// the backends' finalizers to run; past it the process exits with
    /// status 1, naming what was still running.
    #[arg(long, default_value_t = 30)]
    exit_timeout_secs: u64,
    /// Longest an inference request may wait for its answer, in
    /// milliseconds (0 = no limit); its queued work is then dropped.
    #[arg(long, default_value_t = 0)]
    request_timeout_ms: u64,
    /// Largest gRPC message received or sent, in bytes (over it:
    /// RESOURCE_EXHAUSTED).
    #[arg(long, default_value_t = 64 * 1024 * 1024)]
    grpc_max_message_size: usize,
    /// Queue bound of models whose config leaves `max_queue_size` at 0
    /// (Triton: unbounded). Overflow is answered "Exceeds maximum queue size".
    #[arg(long, default_value_t = shardserve::scheduler::DEFAULT_MAX_QUEUE_SIZE)]
    max_queue_size: usize,
    /// Where backend libraries are found: `<DIR>/<name>/libtriton_<name>.so`.
    /// Default: the checkout's `.backends/` (the nearest one at or above the
    /// executable's folder), else `./.backends`.
    #[arg(long)]
    backend_directory: Option<PathBuf>,
    /// A backend setting, `<name>,<key>=<value>` (repeatable), handed to the
    /// backend in its config message as `{"cmdline":{"<key>":"<value>"}}`.
    #[arg(long, value_parser = parse_backend_config)]
    backend_config: Vec<(String, String, String)>,
    /// Verbose logging level (0 = info).
    #[arg(long, default_value_t = 0)]
    log_verbose: u8,
    /// Largest HTTP request body, in bytes.
    #[arg(long, default_value_t = 64 * 1024 * 1024)]
    http_max_input_size: usize,
    /// Open connections per accepting shard (HTTP, gRPC and metrics together);
    /// over it new connections are closed at once. Default: the open-file
    /// limit less 256 (or a quarter), divided by the accepting shards.
    #[arg(long)]
    max_connections: Option<usize>,
    /// Request-body bytes the server buffers at once, split evenly over the
    /// accepting shards; over it requests get 503. Default: min(1 GiB, RAM/4).
    #[arg(long)]
    max_buffered_request_bytes: Option<usize>,
    /// HTTP: seconds from a request's first byte to the end of its headers (else 408).
    #[arg(long, default_value_t = 30)]
    http_header_timeout_secs: u64,
    /// HTTP: longest pause, in seconds, between two chunks of a request body (else 408).
    #[arg(long, default_value_t = 60)]
    http_body_timeout_secs: u64,
    /// HTTP: seconds to receive a whole request body (else 408).
    #[arg(long, default_value_t = 300)]
    http_body_total_timeout_secs: u64,
    /// Seconds a connection may stay without a request (HTTP/1 keep-alive) or
    /// without an open stream (HTTP/2, closed with GOAWAY).
    #[arg(long, default_value_t = 120)]
    idle_timeout_secs: u64,
    /// gRPC: seconds for a new connection to send the HTTP/2 preface and SETTINGS.
    #[arg(long, default_value_t = 10)]
    grpc_handshake_timeout_secs: u64,
    /// gRPC: milliseconds without frames after which the server PINGs the
    /// client (as tritonserver; 0 = never).
    #[arg(long, default_value_t = 7_200_000)]
    grpc_keepalive_time: u64,
    /// gRPC: milliseconds to wait for a PING acknowledgement before closing
    /// the connection (as tritonserver).
    #[arg(long, default_value_t = 20_000)]
    grpc_keepalive_timeout: u64,
    /// gRPC: compress inference responses for clients that accept gzip or
    /// deflate (as tritonserver: none, low, medium, high; default none).
    #[arg(long, value_enum, default_value = "none")]
    grpc_infer_response_compression_level: CompressionLevel,
    /// Capacity of each cross-shard ring, in messages (default: the profile's, else 1024).
    #[arg(long)]
    ring_capacity: Option<usize>,
    /// Shard I/O driver: auto (io_uring, epoll where refused), io-uring, epoll
    /// (default: the profile's, else auto).
    #[arg(long)]
    io_driver: Option<IoDriver>,
    /// Milliseconds between two readings of the GPU metrics (as tritonserver).
    #[arg(long, default_value_t = 2000)]
    metrics_interval_ms: u64,
    /// Bytes of page-locked host staging buffers per NUMA node, for copies
    /// to and from GPUs (as tritonserver's flag; 0: none, copies stay
    /// pageable). Default: the tuning profile's `[gpu] pinned_pool_bytes`,
    /// else 268435456 (256 MiB).
    #[arg(long)]
    pinned_memory_pool_byte_size: Option<usize>,
    /// The name server metadata reports (clients written for Triton expect "triton").
    #[arg(long, default_value = shardserve::frontend::identity::DEFAULT_SERVER_NAME)]
    server_name: String,
    /// Trace settings as tritonserver takes them, repeatable:
    /// `triton,file=PATH`, `triton,log-frequency=N`, `level=OFF|TIMESTAMPS`,
    /// `rate=N`, `count=N` (-1: unlimited), `mode=triton`.
    #[arg(long = "trace-config", value_name = "[MODE,]SETTING=VALUE")]
    trace_config: Vec<String>,
    /// Deprecated in tritonserver: `--trace-config triton,file=PATH`.
    #[arg(long, hide = true)]
    trace_file: Option<String>,
    /// Deprecated in tritonserver: `--trace-config level=LEVEL`.
    #[arg(long, hide = true)]
    trace_level: Vec<String>,
    /// Deprecated in tritonserver: `--trace-config rate=N`.
    #[arg(long, hide = true)]
    trace_rate: Option<String>,
    /// Deprecated in tritonserver: `--trace-config count=N`.
    #[arg(long, hide = true)]
    trace_count: Option<String>,
    /// Deprecated in tritonserver: `--trace-config triton,log-frequency=N`.
    #[arg(long, hide = true)]
    trace_log_frequency: Option<String>,
    /// Restrict HTTP endpoint categories to requests carrying the header
    /// `<KEY>: <VALUE>` (else 403), as tritonserver; repeatable, one group
    /// each, a category in one group only. Categories: health, metadata,
    /// inference, shared-memory, model-config, model-repository,
    /// statistics, trace, logging.
    #[arg(long, value_name = "<API>[,<API>...]:<KEY>=<VALUE>")]
    http_restricted_api: Vec<String>,
    /// Restrict gRPC method categories to calls carrying the metadata
    /// `triton-grpc-protocol-<KEY>: <VALUE>` (else UNAVAILABLE), as
    /// tritonserver; repeatable, same categories as --http-restricted-api.
    #[arg(long, value_name = "<PROTOCOL>[,<PROTOCOL>...]:<KEY>=<VALUE>")]
    grpc_restricted_protocol: Vec<String>,
    #[command(flatten)]
    tls: TlsArgs,
}

/// TLS on the gRPC port (tritonserver's flags) and on the HTTP port (ours,
/// named alike). The metrics port stays plaintext, as in tritonserver.
#[derive(Debug, clap::Args)]
struct TlsArgs {
    /// gRPC over TLS (needs --grpc-server-cert and --grpc-server-key).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    grpc_use_ssl: bool,
    /// gRPC over mutual TLS: clients must present a certificate signed by
    /// --grpc-root-cert. As in tritonserver, giving this flag (with any
    /// value) also turns --grpc-use-ssl on.
    #[arg(long, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    grpc_use_ssl_mutual: Option<bool>,
    /// PEM file holding the gRPC server's certificate chain.
    #[arg(long)]
    grpc_server_cert: Option<PathBuf>,
    /// PEM file holding the gRPC server's private key.
    #[arg(long)]
    grpc_server_key: Option<PathBuf>,
    /// PEM file holding the CA certificates that client certificates must
    /// chain to (mutual TLS).
    #[arg(long)]
    grpc_root_cert: Option<PathBuf>,
    /// HTTPS on the HTTP port (not in tritonserver; needs --http-server-cert
    /// and --http-server-key).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    http_use_ssl: bool,
    /// HTTPS with client certificates signed by --http-root-cert required;
    /// giving it (with any value) turns --http-use-ssl on, as the gRPC flag.
    #[arg(long, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    http_use_ssl_mutual: Option<bool>,
    /// PEM file holding the HTTPS server's certificate chain.
    #[arg(long)]
    http_server_cert: Option<PathBuf>,
    /// PEM file holding the HTTPS server's private key.
    #[arg(long)]
    http_server_key: Option<PathBuf>,
    /// PEM file holding the CA certificates for HTTPS client certificates.
    #[arg(long)]
    http_root_cert: Option<PathBuf>,
}

/// One listener's TLS files from its flags (`prefix`: `--grpc`, `--http`),
/// or `None` when TLS is off.
fn tls_files(
    prefix: &str,
    use_ssl: bool,
    mutual: Option<bool>,
    cert: &Option<PathBuf>,
    key: &Option<PathBuf>,
    root: &Option<PathBuf>,
) -> anyhow::Result<Option<shardserve::frontend::transport::TlsFiles>> {
    if !use_ssl && mutual.is_none() {
        return Ok(None);
    }
    let (Some(cert), Some(key)) = (cert, key) else {
        anyhow::bail!("{prefix}-use-ssl needs {prefix}-server-cert and {prefix}-server-key");
    };
    Ok(Some(shardserve::frontend::transport::TlsFiles {
        cert: cert.clone(),
        key: key.clone(),
        root: root.clone(),
        mutual: mutual.unwrap_or(false),
    }))
}

impl TlsArgs {
    fn grpc(&self) -> anyhow::Result<Option<shardserve::frontend::transport::TlsFiles>> {
        tls_files(
            "--grpc",
            self.grpc_use_ssl,
            self.grpc_use_ssl_mutual,
            &self.grpc_server_cert,
            &self.grpc_server_key,
            &self.grpc_root_cert,
        )
    }
    fn http(&self) -> anyhow::Result<Option<shardserve::frontend::transport::TlsFiles>> {
        tls_files(
            "--http",
            self.http_use_ssl,
            self.http_use_ssl_mutual,
            &self.http_server_cert,
            &self.http_server_key,
            &self.http_root_cert,
        )
    }
}

/// The trace flags, deprecated forms first so `--trace-config` wins.
fn trace_config(cli: &Cli) -> anyhow::Result<shardserve::trace::TraceConfig> {
    let mut config = shardserve::trace::TraceConfig::default();
    let deprecated = cli
        .trace_file
        .iter()
        .map(|v| format!("triton,file={v}"))
        .chain(cli.trace_level.iter().map(|v| format!("level={v}")))
        .chain(cli.trace_rate.iter().map(|v| format!("rate={v}")))
        .chain(cli.trace_count.iter().map(|v| format!("count={v}")))
        .chain(
            cli.trace_log_frequency
                .iter()
                .map(|v| format!("triton,log-frequency={v}")),
        );
    for setting in deprecated.chain(cli.trace_config.iter().cloned()) {
        config.apply_flag(&setting).map_err(anyhow::Error::msg)?;
    }
    Ok(config)
}

/// tritonserver's `--grpc-infer-response-compression-level` values. tonic
/// offers no per-level setting: every level but `none` compresses with
/// its default level.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum CompressionLevel {
    None,
    Low,
    Medium,
    High,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the detected hardware topology (cores, NUMA nodes, GPUs) and
    /// the placement that the given options (--cores, --tuning-profile,
    /// --no-pin) would use: shards, compute workers, GPU instances.
    Topology {
        /// Describe a recorded machine (hwloc XML, as `lstopo file.xml`
        /// writes) instead of this one; its GPUs are numbered in PCI order.
        #[arg(long)]
        xml: Option<PathBuf>,
    },
    /// Measure this machine (topology, GPUs, ring round trips within and
    /// across NUMA nodes; about a second) and write a tuning profile for it.
    Tune {
        /// Where to write the profile (default: standard output).
        #[arg(long)]
        output: Option<PathBuf>,
        /// Milliseconds per measurement.
        #[arg(long, default_value_t = 300)]
        budget_ms: u64,
    },
}

/// Installs the log (standard error, Triton's `default` format) at the
/// verbose level asked for.
fn init_logging(verbose: u8) -> anyhow::Result<()> {
    shardserve::logs::init(&shardserve::logs::LogSettings {
        verbose: u32::from(verbose),
        ..shardserve::logs::LogSettings::default()
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = init_logging(cli.log_verbose) {
        eprintln!("error: {e:#}");
        return ExitCode::FAILURE;
    }
    shardserve::backend::capi::keep_exported();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

fn parse_backend_config(arg: &str) -> Result<(String, String, String), String> {
    shardserve::backend::capi::settings::parse_backend_config(arg)
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let profile = match &cli.tuning_profile {
        Some(p) => TuningProfile::load(p)?,
        None => TuningProfile::default(),
    };
    if let Some(Command::Tune { output, budget_ms }) = &cli.command {
        let topology = MachineTopology::detect();
        let gpus = GpuInventory::detect(&topology);
        let measured = shardserve::tuning::measure(
            &topology,
            Duration::from_millis((*budget_ms).clamp(10, 5000)),
        );
        let text = shardserve::tuning::derive_profile(&topology, &gpus, &measured);
        match output {
            Some(path) => {
                std::fs::write(path, &text)
                    .with_context(|| format!("cannot write {}", path.display()))?;
                tracing::info!(path = %path.display(), "tuning profile written");
            }
            None => print!("{text}"),
        }
        return Ok(());
    }
    if let Some(Command::Topology { xml }) = &cli.command {
        let (topology, gpus) = match xml {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                let topology = MachineTopology::from_xml(&text)
                    .with_context(|| format!("{}", path.display()))?;
                let gpus = GpuInventory::from_topology_bus_order(&topology);
                (topology, gpus)
            }
            None => {
                let topology = MachineTopology::detect();
                let gpus = GpuInventory::detect(&topology);
                (topology, gpus)
            }
        };
        let plan = ShardPlan::build(&profile, cli.cores, !cli.no_pin, &topology.cpus)?;
        print!("{topology}");
        print!("{}", plan.describe(&topology, &gpus));
        return Ok(());
    }
    if cli.model_repository.is_empty() {
        anyhow::bail!("--model-repository is required");
    }
    let trace = trace_config(&cli)?;
    let http_restricted_api = Restrictions::parse(Protocol::Http, &cli.http_restricted_api)
        .map_err(anyhow::Error::msg)?;
    let grpc_restricted_protocol =
        Restrictions::parse(Protocol::Grpc, &cli.grpc_restricted_protocol)
            .map_err(anyhow::Error::msg)?;
    let mut backend_config =
        std::collections::BTreeMap::<_, std::collections::BTreeMap<_, _>>::new();
    for (name, key, value) in cli.backend_config {
        backend_config.entry(name).or_default().insert(key, value);
    }
    shardserve::backend::capi::settings::configure(shardserve::backend::capi::settings::Settings {
        backend_directory: cli.backend_directory,
        backend_config,
    });
    let mode = match cli.model_control_mode {
        ControlMode::None => ModelControlMode::None,
        ControlMode::Explicit => ModelControlMode::Explicit,
        ControlMode::Poll => ModelControlMode::Poll,
    };
    let options = ServerOptions {
        trace,
        http_restricted_api,
        grpc_restricted_protocol,
        host: cli.host,
        http_port: cli.http_port,
        grpc_port: cli.grpc_port,
        metrics_port: cli.metrics_port,
        allow_http: cli.allow_http,
        allow_grpc: cli.allow_grpc,
        allow_metrics: cli.allow_metrics,
        cores: cli.cores,
        pin_threads: !cli.no_pin,
        strict_model_config: cli.strict_model_config,
        model_control_mode: mode,
        load_models: cli.load_model,
        model_load_allow_uploaded_python: cli.model_load_allow_uploaded_python,
        repository_poll: Duration::from_secs(cli.repository_poll_secs.max(1)),
        exit_timeout: Duration::from_secs(cli.exit_timeout_secs),
        request_timeout: (cli.request_timeout_ms > 0)
            .then(|| Duration::from_millis(cli.request_timeout_ms)),
        max_queue_size: cli.max_queue_size.max(1),
        grpc_max_message_size: cli.grpc_max_message_size.max(1024),
        http_max_input_size: cli.http_max_input_size,
        max_connections: cli.max_connections,
        max_buffered_request_bytes: cli.max_buffered_request_bytes,
        http_header_timeout: Duration::from_secs(cli.http_header_timeout_secs),
        http_body_timeout: Duration::from_secs(cli.http_body_timeout_secs),
        http_body_total_timeout: Duration::from_secs(cli.http_body_total_timeout_secs),
        idle_timeout: Duration::from_secs(cli.idle_timeout_secs),
        grpc_handshake_timeout: Duration::from_secs(cli.grpc_handshake_timeout_secs),
        grpc_keepalive_time: (cli.grpc_keepalive_time > 0)
            .then(|| Duration::from_millis(cli.grpc_keepalive_time)),
        grpc_keepalive_timeout: Duration::from_millis(cli.grpc_keepalive_timeout),
        grpc_compress_responses: !matches!(
            cli.grpc_infer_response_compression_level,
            CompressionLevel::None
        ),
        ring_capacity: cli.ring_capacity.or(profile.rings.capacity).unwrap_or(1024),
        intra_op_threads: profile.onnxruntime.intra_op_threads.unwrap_or(1),
        io_driver: cli.io_driver.or(profile.runtime.driver).unwrap_or_default(),
        tuning: profile,
        server_name: cli.server_name,
        metrics_interval: Duration::from_millis(cli.metrics_interval_ms.max(100)),
        grpc_tls: cli.tls.grpc()?,
        http_tls: cli.tls.http()?,
        ..ServerOptions::new(cli.model_repository)
    };
    shardserve::gpu::pinned::set_pool_capacity(
        cli.pinned_memory_pool_byte_size
            .or(options.tuning.gpu.pinned_pool_bytes)
            .unwrap_or(shardserve::gpu::pinned::DEFAULT_CAPACITY),
    );
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])?;
    tracing::info!(
        version = shardserve::frontend::identity::VERSION,
        server_name = %options.server_name,
        "starting shardserve"
    );
    for (what, restrictions) in [
        ("HTTP APIs", &options.http_restricted_api),
        ("gRPC protocols", &options.grpc_restricted_protocol),
    ] {
        if !restrictions.is_empty() {
            tracing::info!(restricted = %restrictions.describe(), "restricted {what}");
        }
    }
    // Signals are heard from here on, also while models load at start-up.
    let signalled = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (signal_tx, signal_rx) = std::sync::mpsc::channel();
    {
        let signalled = signalled.clone();
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                if let Some(sig) = signals.forever().next() {
                    tracing::info!(
                        signal = sig,
                        "shutting down: no new connections, finishing in-flight requests"
                    );
                    signalled.store(true, std::sync::atomic::Ordering::Release);
                    let _ = signal_tx.send(sig);
                }
            })
            .context("cannot start the signal thread")?;
    }
    let started = server::start_interruptible(options, &|| {
        signalled.load(std::sync::atomic::Ordering::Acquire)
    });
    let stopped = match started {
        Ok(Some(handle)) => {
            // Only a signal (or the signal thread's end) stops the server.
            let _ = signal_rx.recv();
            handle.shutdown()
        }
        Ok(None) => Ok(()),
        Err(e) => Err(e),
    };
    if let Err(e) = stopped {
        if e.downcast_ref::<server::ExitTimeout>().is_some() {
            tracing::error!("{e:#}");
            // A backend thread is stuck in an execution or a finalizer:
            // exit handlers (a backend library's destructors among them)
            // could wait on it, so leave without running them.
            // SAFETY: _exit only ends the process.
            unsafe { libc::_exit(1) };
        }
        return Err(e);
    }
    tracing::info!("stopped");
    Ok(())
}
