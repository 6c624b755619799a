//! One shard's OS thread: pin, build the monoio runtime (io_uring, or
//! epoll where io_uring is refused), bind the listeners with SO_REUSEPORT,
//! run until shutdown, then give in-flight requests time to finish.

use std::{
    net::SocketAddr,
    sync::{mpsc::Sender, Arc},
    time::{Duration, Instant},
};

use futures::channel::mpsc::UnboundedReceiver;
use monoio::{
    net::{ListenerOpts, TcpListener},
    time::TimeDriver,
    FusionDriver, FusionRuntime, IoUringDriver, LegacyDriver,
};

use super::{Addresses, ServerState};
use crate::{
    frontend::{
        self,
        transport::{ShardTransport, TransportStats},
    },
    scheduler::{SchedulerHost, ShardMsg},
    shard::{
        ring::ShardLinks,
        spin::{self, Gate},
        uring, Shard, ShardControl, ShardId,
    },
    tuning::IoDriver,
};

pub struct ShardBoot {
    pub id: ShardId,
    pub count: usize,
    /// The logical CPU to pin to (from the shard plan).
    pub cpu: Option<usize>,
    /// Whether this shard binds the listeners (tuning profile `accept`).
    pub accept: bool,
    pub links: ShardLinks<ShardMsg>,
    pub control: UnboundedReceiver<ShardControl>,
    pub state: Arc<ServerState>,
    pub addresses: Addresses,
    pub ready: Sender<Result<(), String>>,
    /// Transport counters and limits (connection cap, timeouts, body budget).
    pub transport: Arc<TransportStats>,
}

/// Runs a shard until shutdown; returns the models that were still
/// executing (or had requests queued) at the exit timeout.
pub fn run(boot: ShardBoot) -> Vec<String> {
    if let Some(cpu) = boot.cpu {
        if let Err(e) = crate::compute::thread::set_affinity(&[cpu]) {
            tracing::warn!(
                shard = boot.id,
                cpu,
                error = %e,
                "could not pin shard thread to its core"
            );
        }
    }
    if boot.state.options.tuning.runtime.sched_batch() {
        if let Err(e) = crate::compute::thread::set_sched_batch() {
            tracing::warn!(shard = boot.id, error = %e, "could not make the shard thread SCHED_BATCH");
        }
    }
    let configured = boot.state.options.io_driver;
    let asked = configured.resolve(boot.state.options.spin);
    let mut runtime = match build_runtime(asked) {
        Ok(rt) => rt,
        Err(e) => {
            let _ = boot.ready.send(Err(format!("shard {}: {e}", boot.id)));
            return Vec::new();
        }
    };
    let driver = match (&runtime, asked) {
        (FusionRuntime::Uring(_), _) => "io_uring",
        (FusionRuntime::Legacy(_), IoDriver::Epoll) if configured == IoDriver::Auto => {
            "epoll (auto: the shards spin before parking)"
        }
        (FusionRuntime::Legacy(_), IoDriver::Epoll) => "epoll (as configured)",
        (FusionRuntime::Legacy(_), _) => "epoll (io_uring unavailable here)",
    };
    if boot.id == 0 {
        tracing::info!(driver, "shard runtime driver");
    } else {
        tracing::debug!(shard = boot.id, driver, "shard runtime driver");
    }
    let spin_driver = match runtime {
        FusionRuntime::Uring(_) => spin::Driver::IoUring,
        FusionRuntime::Legacy(_) => spin::Driver::Epoll,
    };
    let stuck = runtime.block_on(shard_main(boot, spin_driver));
    spin::clear();
    ShardTransport::clear_current();
    Shard::clear_current();
    // Dropping the runtime drops its tasks, and with them the schedulers
    // that did not finish by the deadline.
    drop(runtime);
    stuck
}

type ShardRuntime = FusionRuntime<TimeDriver<IoUringDriver>, TimeDriver<LegacyDriver>>;

fn build_runtime(driver: IoDriver) -> Result<ShardRuntime, String> {
    let built = match driver {
        IoDriver::Auto => uring::runtime_builder::<FusionDriver>()
            .enable_timer()
            .build(),
        IoDriver::IoUring => uring::runtime_builder::<IoUringDriver>()
            .enable_timer()
            .build()
            .map(Into::into),
        IoDriver::Epoll => uring::runtime_builder::<LegacyDriver>()
            .enable_timer()
            .build()
            .map(Into::into),
    };
    built.map_err(|e| format!("cannot start its {driver:?} runtime: {e}"))
}

/// Accept queue length asked of the kernel (capped by `net.core.somaxconn`):
/// room for a burst of connections while the shard is busy.
const LISTEN_BACKLOG: i32 = 4096;

fn bind(addr: Option<SocketAddr>) -> std::io::Result<Option<TcpListener>> {
    addr.map(|a| {
        TcpListener::bind_with_config(
            a,
            &ListenerOpts::new().reuse_port(true).backlog(LISTEN_BACKLOG),
        )
    })
    .transpose()
}

async fn shard_main(boot: ShardBoot, spin_driver: spin::Driver) -> Vec<String> {
    let ShardBoot {
        id,
        count,
        links,
        control,
        state,
        addresses,
        ready,
        accept,
        transport,
        ..
    } = boot;
    let addresses = if accept {
        addresses
    } else {
        Addresses {
            http: None,
            grpc: None,
            metrics: None,
            sagemaker: None,
            vertex_ai: None,
        }
    };
    let bound = (|| {
        Ok::<_, std::io::Error>((
            bind(addresses.http)?,
            bind(addresses.grpc)?,
            bind(addresses.metrics)?,
        ))
    })();
    // issue 24: SageMaker and Vertex AI
    let cloud = bind(addresses.sagemaker).and_then(|s| Ok((s, bind(addresses.vertex_ai)?)));
    let bound = bound.and_then(|b| Ok((b, cloud?)));
    let ((http, grpc, metrics), (sagemaker, vertex_ai)) = match bound {
        Ok(l) => l,
        Err(e) => {
            let _ = ready.send(Err(format!("shard {id}: cannot bind a listener: {e}")));
            return Vec::new();
        }
    };
    let shard = Shard::new(
        id,
        count,
        state.gauges.clone(),
        state.options.request_timeout,
        state.options.max_queue_size,
    );
    Shard::install_current(shard.clone());
    frontend::env::install(state.env.clone());
    let transport = ShardTransport::install(id, transport);
    let host = SchedulerHost::install(shard.clone(), links.outbox);
    let doorbell = links.inbox.doorbell_watch();
    monoio::spawn(host.clone().drain_rings(links.inbox));
    let gate = {
        let (shard, host) = (shard.clone(), host.clone());
        // Spin only while nothing of this shard's runs on another thread:
        // a compute worker may share this core, and its completion comes
        // back as a foreign wake, which the runtime takes only when it
        // parks.
        move || {
            if shard.in_flight() > 0 || host.busy() {
                Gate::Hold
            } else if doorbell.take_rung() {
                Gate::Yield
            } else {
                Gate::Spin
            }
        }
    };
    let spin_stats =
        spin::install(state.options.spin, spin_driver, gate).map(|(spinner, stats)| {
            monoio::spawn(spinner);
            stats
        });
    let draining = host.clone();
    monoio::spawn(shard.clone().run_control(control, move || draining.drain()));
    if let Some(l) = http {
        monoio::spawn(frontend::http::serve(l, shard.clone()));
    }
    if let Some(l) = grpc {
        monoio::spawn(frontend::grpc::serve(l, shard.clone()));
    }
    if let Some(l) = metrics {
        monoio::spawn(frontend::http::serve_metrics(l, shard.clone()));
    }
    if let Some(l) = sagemaker {
        monoio::spawn(frontend::http::serve_sagemaker(l, shard.clone()));
    }
    if let Some(l) = vertex_ai {
        monoio::spawn(frontend::http::serve_vertex(l, shard.clone()));
    }
    let _ = ready.send(Ok(()));

    shard.shutdown.wait().await;
    // Connections: HTTP/1 keep-alive off, HTTP/2 GOAWAY.
    transport.begin_drain();
    // Graceful shutdown: the listeners stopped accepting and the schedulers
    // run what is queued without batching delays. First this shard's own
    // requests get their answers; then it keeps serving its rings and
    // schedulers until every shard is done, because a request still in
    // flight on another shard may be queued here.
    let deadline = state.shutdown_deadline();
    let tick = Duration::from_millis(1);
    while shard.in_flight() > 0 && Instant::now() < deadline {
        monoio::time::sleep(tick).await;
    }
    state.shard_drained();
    while !state.all_shards_drained() && Instant::now() < deadline {
        monoio::time::sleep(tick).await;
    }
    let (in_flight, queued) = (shard.in_flight(), host.queued());
    if in_flight > 0 || queued > 0 {
        tracing::warn!(
            shard = id,
            in_flight,
            queued,
            "exit timeout reached with requests in flight"
        );
    }
    // Let the connections send their last responses and close (HTTP/1
    // with `Connection: close`, HTTP/2 after GOAWAY) before the runtime,
    // and every task on it, is dropped.
    let open = transport.wait_connections_closed(deadline).await;
    if open > 0 {
        tracing::debug!(shard = id, open, "connections still open at exit");
    }
    if let Some(stats) = &spin_stats {
        let [hold, yielded, window, ready, backoff] = stats.stops();
        tracing::debug!(
            shard = id,
            rounds = stats.rounds(),
            windows = stats.windows(),
            backoffs = stats.backoffs(),
            yields = stats.yields(),
            stops_hold = hold,
            stops_yield = yielded,
            stops_window = window,
            stops_ready = ready,
            stops_backoff = backoff,
            "spin-before-park totals"
        );
    }
    // Teardown: the schedulers and their instances (finalizers).
    let stuck = host.retire_all(deadline).await;
    for model in &stuck {
        tracing::error!(
            shard = id,
            model = %model,
            "exit timeout reached while model '{model}' was still executing"
        );
    }
    stuck
}
