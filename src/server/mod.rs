//! Bootstrap: shards, listeners, the initial model load, and graceful
//! shutdown. `start` is also the in-process API tests and tools use.

mod cloud;
mod fdlimit;
mod options;
mod ports;
mod shard_thread;
pub mod state;

use std::{
    net::SocketAddr,
    sync::Arc,
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{bail, Context};
use futures::channel::mpsc;

pub use fdlimit::{derived_connection_cap, raise_nofile_limit, FdLimit};
pub use options::{ModelControlMode, ServerOptions};
pub use state::ServerState;

use crate::{
    frontend::inprocess::TRITONSERVER_Server,
    frontend::transport::{self, TransportLimits, TransportStats},
    gpu::GpuInventory,
    model::ModelTable,
    repository::{manager::Manager, LoadOptions, Placement},
    shard::{ring, ShardControl, ShardId},
    tuning::{MachineTopology, ShardPlan},
};

/// Addresses the server listens on (ports resolved when 0 was asked).
#[derive(Debug, Clone, Copy)]
pub struct Addresses {
    pub http: Option<SocketAddr>,
    pub grpc: Option<SocketAddr>,
    pub metrics: Option<SocketAddr>,
    // issue 24: SageMaker and Vertex AI
    pub sagemaker: Option<SocketAddr>,
    pub vertex_ai: Option<SocketAddr>,
}

/// A running server. Dropping it without `shutdown` leaves the shard
/// threads running until the process exits.
pub struct ServerHandle {
    addresses: Addresses,
    state: Arc<ServerState>,
    control: Vec<mpsc::UnboundedSender<ShardControl>>,
    threads: Vec<JoinHandle<Vec<String>>>,
    table: Arc<ModelTable>,
    transport: Arc<TransportStats>,
    /// The handle C API backends call back into the server with.
    capi_server: Option<Arc<TRITONSERVER_Server>>,
}

impl ServerHandle {
    /// Panics only if HTTP was disabled in the options (a programming error in a test).
    pub fn http_addr(&self) -> SocketAddr {
        self.addresses
            .http
            .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)))
    }
    pub fn grpc_addr(&self) -> SocketAddr {
        self.addresses
            .grpc
            .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)))
    }
    pub fn metrics_addr(&self) -> SocketAddr {
        self.addresses
            .metrics
            .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)))
    }
    pub fn addresses(&self) -> Addresses {
        self.addresses
    }
    pub fn state(&self) -> &Arc<ServerState> {
        &self.state
    }
    /// Connection and request-body counters of every shard, and the
    /// transport limits in force.
    pub fn transport(&self) -> &Arc<TransportStats> {
        &self.transport
    }
    /// The model table published at start-up.
    pub fn models(&self) -> &ModelTable {
        &self.table
    }

    /// Runs `f` on shard `shard`'s thread (through its control channel)
    /// and returns its result; for tools and benchmarks that must act on a
    /// shard, such as reading its thread's CPU clock. Blocks the caller:
    /// never call it from a shard thread.
    pub fn run_on_shard<R: Send + 'static>(
        &self,
        shard: ShardId,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> anyhow::Result<R> {
        let control = self
            .control
            .get(shard)
            .with_context(|| format!("no shard {shard} (the server has {})", self.control.len()))?;
        let (tx, rx) = std::sync::mpsc::channel();
        control
            .unbounded_send(ShardControl::Run(Box::new(move || {
                let _ = tx.send(f());
            })))
            .map_err(|_| anyhow::anyhow!("shard {shard} has stopped"))?;
        rx.recv()
            .map_err(|_| anyhow::anyhow!("shard {shard} dropped the task without running it"))
    }

    /// Stops accepting, lets in-flight requests finish, then tears down
    /// as Triton does: every model instance is finalized (on its compute
    /// worker, which is joined), then every model, then every backend
    /// (`TRITONBACKEND_Finalize`, then dlclose). All of it within the exit
    /// timeout from the call: what is still running then (an execution,
    /// a finalizer) is named in an [`ExitTimeout`] error and left running.
    pub fn shutdown(self) -> anyhow::Result<()> {
        self.state.begin_shutdown();
        let deadline = self.state.shutdown_deadline();
        if let Some(repository) = self.state.env.repository.get() {
            repository.stop();
        }
        if let Some(s) = &self.capi_server {
            s.publish(Arc::new(ModelTable::default()));
        }
        for c in &self.control {
            let _ = c.unbounded_send(ShardControl::Shutdown);
        }
        let mut unfinished = Vec::new();
        // Shards bound their own drain and teardown by the deadline; the
        // grace covers dropping their runtime after it.
        let shard_grace = deadline + Duration::from_secs(1);
        for (id, t) in self.threads.into_iter().enumerate() {
            wait_finished(&t, shard_grace);
            if !t.is_finished() {
                unfinished.push(format!("shard thread {id}"));
                continue;
            }
            match t.join() {
                Ok(models) => unfinished.extend(
                    models
                        .into_iter()
                        .map(|m| format!("an execution of model '{m}'")),
                ),
                Err(_) => bail!("a shard thread panicked during shutdown"),
            }
        }
        // After the shards: every request's trace has been handed over.
        self.state.env.trace.shutdown();
        // A load still running may yet create instances (and their
        // threads); one stuck in a backend is named like an execution.
        if let Some(repository) = self.state.env.repository.get() {
            unfinished.extend(
                repository
                    .wait_loads(deadline)
                    .into_iter()
                    .map(|m| format!("the load of model '{m}'")),
            );
        }
        // The instances' threads run their finalizers as they stop (the
        // model's with its last instance).
        let workers = crate::compute::join_retired(deadline);
        if !workers.is_empty() {
            unfinished.extend(
                crate::backend::capi::finalizing::running()
                    .into_iter()
                    .chain(workers.into_iter().map(|w| format!("compute worker '{w}'"))),
            );
        }
        if unfinished.is_empty() {
            finalize_backends(deadline, &mut unfinished);
        }
        if unfinished.is_empty() {
            Ok(())
        } else {
            Err(ExitTimeout { unfinished }.into())
        }
    }
}

/// Shutdown ran past the exit timeout: what was still running then. The
/// threads running it are left as they are; the binary exits with status
/// 1 without running exit handlers (one could wait on them).
#[derive(Debug)]
pub struct ExitTimeout {
    pub unfinished: Vec<String>,
}

impl std::fmt::Display for ExitTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit timeout reached with teardown unfinished; still running: {}",
            self.unfinished.join(", ")
        )
    }
}

impl std::error::Error for ExitTimeout {}

fn wait_finished<T>(t: &JoinHandle<T>, deadline: Instant) {
    // `JoinHandle` has no timed join: poll, this is the exit path only.
    while !t.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// `TRITONBACKEND_Finalize` and dlclose of every backend, on a thread of
/// its own so that a hanging one leaves the deadline to this thread.
fn finalize_backends(deadline: Instant, unfinished: &mut Vec<String>) {
    let spawned = std::thread::Builder::new()
        .name("backend-finalize".into())
        .spawn(crate::backend::capi::backend::finalize_all);
    let t = match spawned {
        Ok(t) => t,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the backend finalizer thread: backends not finalized");
            return;
        }
    };
    wait_finished(&t, deadline);
    if !t.is_finished() {
        unfinished.extend(crate::backend::capi::finalizing::running());
        if unfinished.is_empty() {
            unfinished.push("backend finalization".into());
        }
        return;
    }
    match t.join() {
        Ok(kept) if !kept.is_empty() => {
            tracing::warn!(backends = ?kept, "backends still held by a model: not finalized");
        }
        Ok(_) => {}
        Err(_) => tracing::error!("a backend finalizer panicked"),
    }
}

/// Starts the shards, binds the listeners and loads the repository.
/// Returns once the initial load is done; models that failed to load are
/// reported in the log and the model table, and stop the server (an error
/// naming them) under `exit_on_error`.
pub fn start(options: ServerOptions) -> anyhow::Result<ServerHandle> {
    start_interruptible(options, &|| false)?
        .context("the server start was interrupted without an interruption source")
}

/// [`start`], giving up when `interrupted` turns true while models are
/// still loading (SIGTERM during start-up): the server is then shut down
/// as at a signal, within the exit timeout, and `Ok(None)` is returned —
/// or an [`ExitTimeout`] naming what outlived it (a load stuck in a
/// backend among them).
pub fn start_interruptible(
    options: ServerOptions,
    interrupted: &dyn Fn() -> bool,
) -> anyhow::Result<Option<ServerHandle>> {
    // Any executable that runs a server (also test binaries) keeps the
    // backend C API for the backends it may load.
    crate::backend::capi::keep_exported();
    crate::frontend::inprocess::keep_exported();
    for repo in &options.model_repositories {
        if let Some(scheme) = cloud_scheme(repo) {
            bail!(
                "model repository {}: cloud storage repositories ({scheme}...) are not supported by shardserve; use a local path",
                repo.display()
            );
        }
        if !repo.is_dir() {
            bail!(
                "model repository {} is not a readable directory",
                repo.display()
            );
        }
    }
    if options.model_repositories.is_empty() {
        bail!("at least one --model-repository is required");
    }
    // Before anything starts: a bad certificate stops the start.
    let tls = crate::frontend::transport::ServerTls::load(
        options.http_tls.as_ref().filter(|_| options.allow_http),
        options.grpc_tls.as_ref().filter(|_| options.allow_grpc),
    )?;
    let topology = MachineTopology::shared();
    if let Some(reason) = &topology.degraded {
        tracing::warn!(%reason, "hwloc unavailable: placing by the CPU affinity list only");
    }
    let gpus = GpuInventory::shared();
    let metrics_config = crate::metrics::config::MetricsConfig::parse(&options.metrics_config)
        .map_err(|e| anyhow::anyhow!(e))?;
    if options.allow_metrics {
        if options.allow_gpu_metrics {
            match crate::metrics::gpu::start(gpus, options.metrics_interval) {
                Ok(()) => tracing::info!(gpus = gpus.gpus.len(), "GPU metrics collected"),
                Err(reason) => tracing::info!(%reason, "no GPU metrics"),
            }
        }
        crate::metrics::host::start(options.metrics_interval);
        tracing::debug!(?metrics_config, "metrics settings");
    }
    let plan = ShardPlan::build(
        &options.tuning,
        options.cores,
        options.pin_threads,
        &topology.cpus,
    )?;
    let shard_count = plan.shard_count();
    tracing::info!("placement:\n{}", plan.describe(topology, gpus));
    if let Some(warning) = plan.cgroup_warning(topology) {
        tracing::warn!("{warning}");
    }
    cloud::check_ports(&options)?;
    // Held until every shard has bound its listeners (see `ports`).
    let mut reservations = Vec::new();
    let mut reserve = |what,
                       enabled: bool,
                       ip: std::net::IpAddr,
                       port: u16,
                       reuse: bool|
     -> anyhow::Result<Option<SocketAddr>> {
        if !enabled {
            return Ok(None);
        }
        let reserved = ports::reserve(what, SocketAddr::new(ip, port), reuse)?;
        let addr = reserved.addr;
        reservations.push(reserved);
        Ok(Some(addr))
    };
    let addresses = Addresses {
        http: reserve(
            "HTTP",
            options.allow_http,
            options.http_address.unwrap_or(options.host),
            options.http_port,
            options.reuse_http_port,
        )?,
        grpc: reserve(
            "gRPC",
            options.allow_grpc,
            options.grpc_address.unwrap_or(options.host),
            options.grpc_port,
            options.reuse_grpc_port,
        )?,
        // As tritonserver: the metrics listener follows the HTTP address unless given its own.
        metrics: reserve(
            "metrics",
            options.allow_metrics,
            options
                .metrics_address
                .or(options.http_address)
                .unwrap_or(options.host),
            options.metrics_port,
            false,
        )?,
        // issue 24: SageMaker and Vertex AI
        sagemaker: reserve(
            "SageMaker",
            options.allow_sagemaker,
            options.host,
            options.sagemaker_port,
            false,
        )?,
        vertex_ai: reserve(
            "Vertex AI",
            options.allow_vertex_ai,
            options.host,
            options.vertex_ai_port,
            false,
        )?,
    };
    let state = ServerState::new(options.clone(), shard_count);
    state.env.lifecycle.set_strict(options.strict_readiness);
    let _ = state.env.tls.set(tls);
    cloud::install_sagemaker(&options, &state.env)?;
    for (flag, pattern, slot) in [
        (
            "--http-header-forward-pattern",
            &options.http_header_forward_pattern,
            &state.env.http_header_forward,
        ),
        (
            "--grpc-header-forward-pattern",
            &options.grpc_header_forward_pattern,
            &state.env.grpc_header_forward,
        ),
    ] {
        if let Some(pattern) = pattern {
            let forward =
                transport::HeaderForward::compile(flag, pattern).map_err(anyhow::Error::msg)?;
            let _ = slot.set(forward);
        }
    }
    let transport = TransportStats::new(shard_count, transport_limits(&options, plan.accept.len()));

    let links = ring::mesh(shard_count, options.ring_capacity);
    let compute = plan.compute.clone();
    let worker_cpus = plan.worker_cpus(|c| topology.numa_node_of_cpu(c));
    let gpu_placements = gpus
        .gpus
        .iter()
        .map(|g| plan.gpu_placement(g, topology))
        .collect();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let mut control = Vec::with_capacity(shard_count);
    let mut threads = Vec::with_capacity(shard_count);
    for (id, links) in links.into_iter().enumerate() {
        let (tx, rx) = mpsc::unbounded();
        control.push(tx);
        let boot = shard_thread::ShardBoot {
            id,
            count: shard_count,
            cpu: plan.cpus[id],
            accept: plan.accept.contains(&id),
            links,
            control: rx,
            state: state.clone(),
            addresses,
            ready: ready_tx.clone(),
            transport: transport.clone(),
        };
        let thread = std::thread::Builder::new()
            .name(format!("shard-{id}"))
            .spawn(move || shard_thread::run(boot))
            .context("cannot spawn a shard thread")?;
        threads.push(thread);
    }
    drop(ready_tx);
    let mut failure = None;
    for _ in 0..shard_count {
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failure = Some(e),
            Err(_) => failure = Some("a shard thread exited during start-up".to_string()),
        }
    }
    drop(reservations);
    let mut handle = ServerHandle {
        addresses,
        state,
        control,
        threads,
        table: Arc::new(ModelTable::default()),
        transport,
        capi_server: None,
    };
    if let Some(e) = failure {
        let _ = handle.shutdown();
        bail!("server start failed: {e}");
    }
    log_addresses(&addresses, shard_count);

    // What C API backends get from `TRITONBACKEND_ModelServer`: set before
    // the initial load, as backends may ask for it while loading. Kept
    // alive for the process (a backend may hold the pointer), and emptied
    // at shutdown so it keeps no model alive.
    let capi_server = TRITONSERVER_Server::new(
        handle.state.env.clone(),
        crate::frontend::core::infer::ThreadEntry::start(&handle.control),
    );
    crate::backend::capi::settings::set_server(Arc::as_ptr(&capi_server).cast_mut().cast());
    std::mem::forget(capi_server.clone());
    handle.capi_server = Some(capi_server.clone());

    let placement = Placement::new(shard_count, compute)
        .with_workers(worker_cpus, options.tuning.compute.nice())
        .with_worker_handoff(
            options.tuning.compute.spin(),
            options.tuning.compute.pipeline_depth(),
            options.tuning.compute.reply_hold(),
        )
        .with_worker_slice(options.tuning.compute.slice())
        .with_gpus(gpu_placements);
    // Every load, the start-up one included, runs on the repository
    // thread's load threads: a load that hangs leaves the API, the other
    // models and signals served.
    let manager = Manager {
        repositories: options.model_repositories.clone(),
        mode: options.model_control_mode,
        poll_interval: (options.model_control_mode == ModelControlMode::Poll)
            .then_some(options.repository_poll),
        load: load_options(&options),
        placement,
        control: handle.control.clone(),
        table: ModelTable::default(),
        on_publish: {
            let capi_server = capi_server.clone();
            let env = handle.state.env.clone();
            Arc::new(move |table: Arc<ModelTable>| {
                env.lifecycle.set_models_ready(table.strictly_ready());
                capi_server.publish(table)
            })
        },
        load_threads: options.model_load_thread_count,
    };
    let initial = manager.spawn().and_then(|client| {
        let only = match options.model_control_mode {
            ModelControlMode::Explicit if !options.load_models.iter().any(|m| m == "*") => {
                Some(options.load_models.clone())
            }
            _ => None,
        };
        let table = client.load_initial(only);
        let _ = handle.state.env.repository.set(client);
        table
    });
    let initial = match initial {
        Ok(rx) => rx,
        Err(e) => {
            let _ = handle.shutdown();
            return Err(e);
        }
    };
    let table = loop {
        match initial.recv_timeout(Duration::from_millis(20)) {
            Ok(table) => break table,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) if !interrupted() => {}
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let loading = handle
                    .state
                    .env
                    .repository
                    .get()
                    .map(|r| r.loading())
                    .unwrap_or_default();
                tracing::info!(
                    ?loading,
                    "shutting down during start-up: models still loading"
                );
                handle.shutdown()?;
                return Ok(None);
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                let _ = handle.shutdown();
                bail!("the repository thread stopped during the start-up load");
            }
        }
    };
    handle
        .state
        .env
        .lifecycle
        .set_models_ready(table.strictly_ready());
    let mut failed = table.not_ready();
    failed.extend(table.not_polled.iter().cloned());
    if options.exit_on_error && !failed.is_empty() {
        // Triton: the server stops (what loaded is unloaded) and the
        // binary exits 1 with "failed to load all models".
        tracing::error!(models = ?failed, "failed to load all models; stopping (--exit-on-error)");
        handle.table = Arc::new(table);
        if let Err(e) = handle.shutdown() {
            tracing::error!(error = %format!("{e:#}"), "shutdown after the failed start-up load");
        }
        bail!(
            "failed to load all models: {} (--exit-on-error=false serves the others)",
            failed.join(", ")
        );
    }
    if let Err(e) = cloud::install_vertex(&options, &handle.state.env, &table) {
        handle.table = Arc::new(table);
        let _ = handle.shutdown();
        return Err(e);
    }
    handle.table = Arc::new(table);
    handle.state.set_ready(true);
    Ok(Some(handle))
}

/// Raises the open-file limit and resolves the transport limits: the
/// per-shard connection cap (`--max-connections`, else derived from the
/// open-file limit) and the body budget per accepting shard.
fn transport_limits(options: &ServerOptions, accepting: usize) -> TransportLimits {
    let soft = match raise_nofile_limit() {
        Ok(l) => {
            if l.soft > l.previous {
                tracing::info!(
                    from = l.previous,
                    to = l.soft,
                    hard = l.hard,
                    "raised the open-file limit (RLIMIT_NOFILE)"
                );
            } else {
                tracing::info!(
                    soft = l.soft,
                    hard = l.hard,
                    "open-file limit (RLIMIT_NOFILE)"
                );
            }
            l.soft
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read or raise the open-file limit; assuming 1024");
            1024
        }
    };
    let max_connections = options
        .max_connections
        .unwrap_or_else(|| derived_connection_cap(soft, accepting));
    let buffered = options
        .max_buffered_request_bytes
        .unwrap_or_else(transport::default_buffered_request_bytes);
    let limits = TransportLimits {
        max_connections: max_connections.max(1),
        // Split evenly so that no shard writes another's counter.
        buffered_bytes_per_shard: buffered / accepting.max(1),
        http_header_timeout: options.http_header_timeout,
        http_body_timeout: options.http_body_timeout,
        http_body_total_timeout: options.http_body_total_timeout,
        idle_timeout: options.idle_timeout,
        grpc_handshake_timeout: options.grpc_handshake_timeout,
        grpc_keepalive_time: options.grpc_keepalive_time,
        grpc_keepalive_timeout: options.grpc_keepalive_timeout,
        grpc_keepalive_permit_without_calls: options.grpc_keepalive_permit_without_calls,
        grpc_max_pings_without_data: options.grpc_http2_max_pings_without_data,
        grpc_min_recv_ping_interval: options.grpc_http2_min_recv_ping_interval_without_data,
        grpc_max_ping_strikes: options.grpc_http2_max_ping_strikes,
        grpc_max_connection_age: options.grpc_max_connection_age,
        grpc_max_connection_age_grace: options.grpc_max_connection_age_grace,
    };
    let total = (max_connections as u64).saturating_mul(accepting.max(1) as u64);
    if total > soft {
        tracing::warn!(
            max_connections,
            shards = accepting,
            open_file_limit = soft,
            "--max-connections x accepting shards exceeds the open-file limit: \
             accepts will fail (and back off) before the cap is reached"
        );
    }
    if options.http_max_input_size > limits.buffered_bytes_per_shard {
        tracing::warn!(
            http_max_input_size = options.http_max_input_size,
            budget_per_shard = limits.buffered_bytes_per_shard,
            "--http-max-input-size exceeds a shard's share of --max-buffered-request-bytes: \
             bodies that large will always be refused with 503"
        );
    }
    tracing::info!(
        max_connections_per_shard = max_connections,
        buffered_request_bytes_per_shard = limits.buffered_bytes_per_shard,
        "connection limits"
    );
    limits
}

fn load_options(options: &ServerOptions) -> LoadOptions {
    LoadOptions {
        strict: options.strict_model_config,
        intra_op_threads: options.intra_op_threads,
        allow_uploaded_python: options.model_load_allow_uploaded_python,
        retry_count: options.model_load_retry_count,
        config_name: options.model_config_name.clone(),
        latency_summaries: crate::metrics::config::MetricsConfig::parse(&options.metrics_config)
            .is_ok_and(|c| c.summary_latencies),
        response_cache: options.response_cache_byte_size.map(|bytes| {
            let cache = crate::scheduler::ResponseCache::new(bytes);
            tracing::info!(
                bytes,
                segments = cache.segment_count(),
                "response cache 'local' created"
            );
            Arc::new(cache)
        }),
        rate_limiter: options.rate_limit.then(|| {
            crate::scheduler::rate_limiter::RateLimiter::new(options.rate_limit_resources.clone())
        }),
        // issue 24: several repositories + namespacing
        namespacing: options.model_namespacing,
    }
}

/// The cloud scheme a repository path starts with (`s3://`, `gs://`,
/// `as://`), which Triton reads and shardserve does not.
fn cloud_scheme(repo: &std::path::Path) -> Option<&'static str> {
    let text = repo.to_string_lossy();
    ["s3://", "gs://", "as://"]
        .into_iter()
        .find(|scheme| text.starts_with(scheme))
}

fn log_addresses(a: &Addresses, shards: usize) {
    let show = |x: Option<SocketAddr>| x.map_or_else(|| "off".to_string(), |a| a.to_string());
    tracing::info!(
        shards,
        http = %show(a.http),
        grpc = %show(a.grpc),
        metrics = %show(a.metrics),
        sagemaker = %show(a.sagemaker),
        vertex_ai = %show(a.vertex_ai),
        "listening"
    );
}
