//! The `shardserve` command line: tritonserver 2.51's flags (grouped and
//! checked as it does) and ours, turned into `ServerOptions`, and the run
//! of the binary. Only `src/main.rs` imports this room
//! (tests/architecture.rs); the server never sees a flag.

mod args;
mod cache;
mod disposition;
pub mod values;

use std::time::Duration;

use anyhow::Context;
use clap::{CommandFactory, Parser};

pub use crate::logs::{LogFormat, LogSettings};
pub use args::{Cli, Command, CompressionLevel, ControlMode, RateLimit};
pub use disposition::Note;

use crate::{
    frontend::restricted::{Protocol, Restrictions},
    gpu::GpuInventory,
    server::{self, ModelControlMode, ServerOptions},
    tuning::{MachineTopology, ShardPlan, TuningProfile},
};

/// Parses an argument vector (the program name first), as the binary does.
pub fn parse_from<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    Cli::try_parse_from(args)
}

/// The `--help` text.
pub fn help_text() -> String {
    Cli::command().render_long_help().to_string()
}

impl Cli {
    /// Checks that need several flags; every problem found, one a line.
    pub fn validate(&self) -> anyhow::Result<()> {
        let mut problems: Vec<String> = Vec::new();
        if !self.repository.load_model.is_empty()
            && !matches!(self.repository.model_control_mode, ControlMode::Explicit)
        {
            problems.push(
                "--load-model requires --model-control-mode=explicit as well (as in tritonserver)"
                    .into(),
            );
        }
        if problems.is_empty() {
            Ok(())
        } else {
            anyhow::bail!("{}", problems.join("\n"))
        }
    }

    /// The flags accepted that change nothing here and the deprecated spellings used,
    /// each to be logged once.
    pub fn notes(&self) -> Vec<Note> {
        disposition::notes(self)
    }

    /// The logging flags.
    pub fn log_settings(&self) -> LogSettings {
        LogSettings {
            verbose: self.logging.log_verbose,
            info: self.logging.log_info,
            warning: self.logging.log_warning,
            error: self.logging.log_error,
            format: self.logging.log_format,
            file: self.logging.log_file.clone(),
        }
    }

    /// The trace flags, deprecated forms first so `--trace-config` wins.
    fn trace_config(&self) -> anyhow::Result<crate::trace::TraceConfig> {
        let mut config = crate::trace::TraceConfig::default();
        let d = &self.deprecated;
        let deprecated = d
            .trace_file
            .iter()
            .map(|v| format!("triton,file={v}"))
            .chain(d.trace_level.iter().map(|v| format!("level={v}")))
            .chain(d.trace_rate.iter().map(|v| format!("rate={v}")))
            .chain(d.trace_count.iter().map(|v| format!("count={v}")))
            .chain(
                d.trace_log_frequency
                    .iter()
                    .map(|v| format!("triton,log-frequency={v}")),
            );
        for setting in deprecated.chain(self.tracing.trace_config.iter().cloned()) {
            config.apply_flag(&setting).map_err(anyhow::Error::msg)?;
        }
        Ok(config)
    }

    /// The server's options from the flags and the tuning profile.
    pub fn server_options(&self, profile: TuningProfile) -> anyhow::Result<ServerOptions> {
        let (repo, http, grpc, metrics, ours) = (
            &self.repository,
            &self.http,
            &self.grpc,
            &self.metrics,
            &self.ours,
        );
        // issue 24: Vertex AI: its storage is the repository when none is given.
        let aip_storage: Vec<std::path::PathBuf> = std::env::var("AIP_STORAGE_URI")
            .ok()
            .filter(|u| !u.is_empty() && repo.model_repository.is_empty())
            .map(Into::into)
            .into_iter()
            .collect();
        if repo.model_repository.is_empty() && aip_storage.is_empty() {
            anyhow::bail!("--model-repository is required");
        }
        let vertex = self.vertex_defaults()?;
        let http_restricted_api = Restrictions::parse(Protocol::Http, &http.http_restricted_api)
            .map_err(anyhow::Error::msg)?;
        let grpc_restricted_protocol =
            Restrictions::parse(Protocol::Grpc, &grpc.grpc_restricted_protocol)
                .map_err(anyhow::Error::msg)?;
        let grpc_tls = tls_files(
            "--grpc",
            grpc.grpc_use_ssl,
            grpc.grpc_use_ssl_mutual,
            &grpc.grpc_server_cert,
            &grpc.grpc_server_key,
            &grpc.grpc_root_cert,
        )?;
        let http_tls = tls_files(
            "--http",
            http.http_use_ssl,
            http.http_use_ssl_mutual,
            &http.http_server_cert,
            &http.http_server_key,
            &http.http_root_cert,
        )?;
        let model_control_mode = match repo.model_control_mode {
            ControlMode::None => ModelControlMode::None,
            ControlMode::Explicit => ModelControlMode::Explicit,
            ControlMode::Poll => ModelControlMode::Poll,
        };
        Ok(ServerOptions {
            trace: self.trace_config()?,
            http_restricted_api,
            grpc_restricted_protocol,
            host: ours.host,
            http_port: http.http_port,
            grpc_port: grpc.grpc_port,
            metrics_port: metrics.metrics_port,
            allow_http: http.allow_http.unwrap_or(!vertex.aip_prediction),
            allow_grpc: grpc.allow_grpc.unwrap_or(!vertex.aip_prediction),
            allow_metrics: metrics.allow_metrics,
            cores: ours.cores,
            pin_threads: !ours.no_pin,
            strict_model_config: repo.disable_auto_complete_config
                || self.deprecated.strict_model_config == Some(true),
            model_control_mode,
            load_models: repo.load_model.clone(),
            model_load_allow_uploaded_python: ours.model_load_allow_uploaded_python,
            repository_poll: Duration::from_secs(repo.repository_poll_secs.max(1)),
            exit_timeout: Duration::from_secs(self.server.exit_timeout_secs),
            request_timeout: (ours.request_timeout_ms > 0)
                .then(|| Duration::from_millis(ours.request_timeout_ms)),
            max_queue_size: ours.max_queue_size.max(1),
            grpc_max_message_size: ours.grpc_max_message_size.max(1024),
            http_max_input_size: http.http_max_input_size,
            max_connections: ours.max_connections,
            max_buffered_request_bytes: ours.max_buffered_request_bytes,
            http_header_timeout: Duration::from_secs(ours.http_header_timeout_secs),
            http_body_timeout: Duration::from_secs(ours.http_body_timeout_secs),
            http_body_total_timeout: Duration::from_secs(ours.http_body_total_timeout_secs),
            idle_timeout: Duration::from_secs(ours.idle_timeout_secs),
            grpc_handshake_timeout: Duration::from_secs(ours.grpc_handshake_timeout_secs),
            grpc_keepalive_time: (grpc.grpc_keepalive_time > 0)
                .then(|| Duration::from_millis(grpc.grpc_keepalive_time)),
            grpc_keepalive_timeout: Duration::from_millis(grpc.grpc_keepalive_timeout),
            grpc_compress_responses: !matches!(
                grpc.grpc_infer_response_compression_level,
                CompressionLevel::None
            ),
            ring_capacity: ours
                .ring_capacity
                .or(profile.rings.capacity)
                .unwrap_or(1024),
            intra_op_threads: profile.onnxruntime.intra_op_threads.unwrap_or(1),
            io_driver: ours
                .io_driver
                .or(profile.runtime.driver)
                .unwrap_or_default(),
            spin: ours
                .spin_us
                .map(Duration::from_micros)
                .unwrap_or_else(|| profile.runtime.spin()),
            tuning: profile,
            server_name: self.server.id.clone(),
            // Whole milliseconds, at least the 100 the metrics poller can keep up with.
            metrics_interval: Duration::from_millis((metrics.metrics_interval_ms as u64).max(100)),
            grpc_tls,
            http_tls,
            exit_on_error: repo.exit_on_error,
            strict_readiness: repo.strict_readiness,
            model_load_thread_count: repo.model_load_thread_count,
            model_load_retry_count: repo.model_load_retry_count,
            model_config_name: repo.model_config_name.clone(),
            http_address: http.http_address,
            grpc_address: grpc.grpc_address,
            reuse_http_port: http.reuse_http_port,
            reuse_grpc_port: grpc.reuse_grpc_port,
            http_header_forward_pattern: http.http_header_forward_pattern.clone(),
            grpc_header_forward_pattern: grpc.grpc_header_forward_pattern.clone(),
            grpc_keepalive_permit_without_calls: grpc.grpc_keepalive_permit_without_calls,
            grpc_http2_max_pings_without_data: grpc.grpc_http2_max_pings_without_data,
            grpc_http2_min_recv_ping_interval_without_data: grpc
                .grpc_http2_min_recv_ping_interval_without_data,
            grpc_http2_max_ping_strikes: grpc.grpc_http2_max_ping_strikes,
            grpc_max_connection_age: grpc.grpc_max_connection_age,
            grpc_max_connection_age_grace: grpc.grpc_max_connection_age_grace,
            metrics_address: metrics.metrics_address,
            // As tritonserver: the per-kind switches only count with metrics on.
            allow_gpu_metrics: metrics.allow_gpu_metrics && metrics.allow_metrics,
            allow_cpu_metrics: metrics.allow_cpu_metrics && metrics.allow_metrics,
            metrics_config: metrics.metrics_config.clone(),
            // issue 24: response cache
            response_cache_byte_size: cache::local_cache_bytes(&self.cache, &self.deprecated)?,
            // issue 24: rate limiter
            rate_limit: self.rate_limiter.rate_limit == RateLimit::ExecutionCount,
            rate_limit_resources: self.rate_limiter.rate_limit_resource.clone(),
            // issue 24: several repositories + namespacing
            model_namespacing: repo.model_namespacing.unwrap_or(false),
            // issue 24: SageMaker and Vertex AI
            allow_sagemaker: self.sagemaker.allow_sagemaker.unwrap_or(false),
            sagemaker_port: self.sagemaker.sagemaker_port.unwrap_or(8080),
            sagemaker_safe_port_range: self.sagemaker.sagemaker_safe_port_range,
            allow_vertex_ai: self.vertex.allow_vertex_ai.unwrap_or(vertex.aip_prediction),
            vertex_ai_port: self.vertex.vertex_ai_port.unwrap_or(vertex.port),
            vertex_ai_default_model: self.vertex.vertex_ai_default_model.clone(),
            ..ServerOptions::new(if aip_storage.is_empty() {
                repo.model_repository.clone()
            } else {
                aip_storage
            })
        })
    }

    /// Triton's Vertex AI environment: `AIP_MODE=PREDICTION` turns the
    /// service on and HTTP and gRPC off unless their flags say otherwise;
    /// `AIP_HTTP_PORT` is its port unless `--vertex-ai-port` is given.
    fn vertex_defaults(&self) -> anyhow::Result<VertexDefaults> {
        let aip_prediction = std::env::var("AIP_MODE").is_ok_and(|m| m == "PREDICTION");
        let port = match std::env::var("AIP_HTTP_PORT") {
            Ok(p) if self.vertex.vertex_ai_port.is_none() => p.trim().parse().map_err(|_| {
                anyhow::anyhow!("AIP_HTTP_PORT: '{p}' is not a port number (0-65535)")
            })?,
            _ => 8080,
        };
        Ok(VertexDefaults {
            aip_prediction,
            port,
        })
    }
}

/// What the Vertex AI environment variables change in the defaults.
struct VertexDefaults {
    aip_prediction: bool,
    port: u16,
}

/// One listener's TLS files from its flags (`prefix`: `--grpc`, `--http`),
/// or `None` when TLS is off.
fn tls_files(
    prefix: &str,
    use_ssl: bool,
    mutual: Option<bool>,
    cert: &Option<std::path::PathBuf>,
    key: &Option<std::path::PathBuf>,
    root: &Option<std::path::PathBuf>,
) -> anyhow::Result<Option<crate::frontend::transport::TlsFiles>> {
    if !use_ssl && mutual.is_none() {
        return Ok(None);
    }
    let (Some(cert), Some(key)) = (cert, key) else {
        anyhow::bail!("{prefix}-use-ssl needs {prefix}-server-cert and {prefix}-server-key");
    };
    Ok(Some(crate::frontend::transport::TlsFiles {
        cert: cert.clone(),
        key: key.clone(),
        root: root.clone(),
        mutual: mutual.unwrap_or(false),
    }))
}

/// The binary after parsing and logging set-up: a subcommand, or the server
/// until SIGINT/SIGTERM.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    let profile = match &cli.ours.tuning_profile {
        Some(p) => TuningProfile::load(p)?,
        None => TuningProfile::default(),
    };
    match &cli.command {
        Some(Command::Tune { output, budget_ms }) => {
            return tune(output.as_deref(), *budget_ms);
        }
        Some(Command::Topology { xml }) => {
            return topology(&cli, &profile, xml.as_deref());
        }
        None => {}
    }
    for note in cli.notes() {
        if note.warn {
            tracing::warn!("{}", note.text);
        } else {
            tracing::info!("{}", note.text);
        }
    }
    let mut backend_config =
        std::collections::BTreeMap::<_, std::collections::BTreeMap<_, _>>::new();
    for (name, key, value) in cli.backend.backend_config.iter().cloned() {
        backend_config.entry(name).or_default().insert(key, value);
    }
    let options = cli.server_options(profile)?;
    crate::backend::capi::settings::configure(crate::backend::capi::settings::Settings {
        backend_directory: cli.backend.backend_directory.clone(),
        backend_config,
    });
    crate::gpu::pinned::set_pool_capacity(
        cli.memory
            .pinned_memory_pool_byte_size
            .or(options.tuning.gpu.pinned_pool_bytes)
            .unwrap_or(crate::gpu::pinned::DEFAULT_CAPACITY),
    );
    serve(options)
}

fn tune(output: Option<&std::path::Path>, budget_ms: u64) -> anyhow::Result<()> {
    let topology = MachineTopology::detect();
    let gpus = GpuInventory::detect(&topology);
    let measured =
        crate::tuning::measure(&topology, Duration::from_millis(budget_ms.clamp(10, 5000)));
    let text = crate::tuning::derive_profile(&topology, &gpus, &measured);
    match output {
        Some(path) => {
            std::fs::write(path, &text)
                .with_context(|| format!("cannot write {}", path.display()))?;
            tracing::info!(path = %path.display(), "tuning profile written");
        }
        None => print!("{text}"),
    }
    Ok(())
}

fn topology(
    cli: &Cli,
    profile: &TuningProfile,
    xml: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let (topology, gpus) = match xml {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let topology =
                MachineTopology::from_xml(&text).with_context(|| format!("{}", path.display()))?;
            let gpus = GpuInventory::from_topology_bus_order(&topology);
            (topology, gpus)
        }
        None => {
            let topology = MachineTopology::detect();
            let gpus = GpuInventory::detect(&topology);
            (topology, gpus)
        }
    };
    let plan = ShardPlan::build(profile, cli.ours.cores, !cli.ours.no_pin, &topology.cpus)?;
    print!("{topology}");
    print!("{}", plan.describe(&topology, &gpus));
    let driver = cli
        .ours
        .io_driver
        .or(profile.runtime.driver)
        .unwrap_or_default();
    let spin = cli
        .ours
        .spin_us
        .unwrap_or_else(|| profile.runtime.spin().as_micros() as u64);
    let resolved = driver.resolve(std::time::Duration::from_micros(spin));
    println!(
        "runtime: driver {driver:?}{}, spin {spin} us after a request before parking{}, shards {}",
        if resolved == driver {
            String::new()
        } else {
            format!(" ({resolved:?} with the spin window)")
        },
        if spin == 0 { " (off)" } else { "" },
        if profile.runtime.sched_batch() {
            "SCHED_BATCH (wake-ups do not preempt)"
        } else {
            "SCHED_OTHER"
        }
    );
    if let Some(warning) = plan.cgroup_warning(&topology) {
        println!("warning: {warning}");
    }
    let compute = &profile.compute;
    println!(
        "compute workers: nice {}, spin {} us before parking, pipeline depth {}, reply hold {} us, slice {}",
        compute.nice(),
        compute.spin().as_micros(),
        compute.pipeline_depth(),
        compute.reply_hold().as_micros(),
        match compute.slice().as_micros() {
            0 => "off".to_owned(),
            us => format!("{us} us"),
        }
    );
    Ok(())
}

/// Starts the server and serves until SIGINT/SIGTERM.
fn serve(options: ServerOptions) -> anyhow::Result<()> {
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])?;
    tracing::info!(
        version = crate::frontend::identity::VERSION,
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
