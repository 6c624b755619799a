//! Connection hygiene shared by the HTTP, gRPC and metrics listeners:
//! the accept loop (back-off on descriptor exhaustion, the per-shard
//! connection cap), per-connection timeouts (HTTP/1 header and idle,
//! HTTP/2 handshake and idle), graceful draining at shutdown, and the
//! budget of buffered request-body bytes, and TLS on the gRPC and HTTP
//! listeners (`tls`).
//!
//! Everything here is shard-local (`Rc`, `Cell`) except [`TransportStats`]:
//! one cache-line-aligned block of relaxed atomics per shard, each in its
//! own allocation, written by that shard (body buffers released on another
//! shard decrement it) and summed only when read. A body's reservation
//! holds its shard's block alone, so reading a body writes no reference
//! count or counter that another shard writes.

mod body;
mod coalesce;
mod conn;
mod forward;
mod h2watch;
mod listener;
mod paced;
pub mod tls;

use std::{
    cell::{Cell, RefCell},
    collections::HashMap,
    rc::Rc,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

pub use body::{read_body, reserve_buffered, BodyError, BufferedHold};
pub use coalesce::{Coalesced, DeferredFlush, Flusher};
pub use conn::{drive, ActiveRequest, ConnIo, ConnState, Decision, TrackedBody};
pub use forward::HeaderForward;
pub use h2watch::{H2Rules, H2Watch, KeepAlive};
pub use listener::{accept_loop, ConnSlot};
pub use paced::{PacedBody, Pacer, PAUSE_EVERY_BYTES};
pub use tls::{ServerTls, TlsFiles};

/// Request-body bytes buffered at once when `--max-buffered-request-bytes`
/// is not given: a quarter of physical memory, at most 1 GiB.
pub fn default_buffered_request_bytes() -> usize {
    const CEILING: usize = 1 << 30;
    // SAFETY: sysconf only reads system configuration.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    match (usize::try_from(pages), usize::try_from(page)) {
        (Ok(pages), Ok(page)) if pages > 0 && page > 0 => {
            (pages.saturating_mul(page) / 4).min(CEILING)
        }
        _ => CEILING,
    }
}

/// The connection-level limits every accepting shard applies, resolved
/// once at start-up by the server from its options. The per-request size
/// limits are the front ends' own (`frontend::env::FrontendLimits`).
#[derive(Debug, Clone, Copy)]
pub struct TransportLimits {
    /// Open connections per shard (all listeners together).
    pub max_connections: usize,
    /// Buffered request-body bytes per shard: the process budget split
    /// evenly over the accepting shards, so that no shard writes
    /// another's counter.
    pub buffered_bytes_per_shard: usize,
    pub http_header_timeout: Duration,
    pub http_body_timeout: Duration,
    pub http_body_total_timeout: Duration,
    pub idle_timeout: Duration,
    pub grpc_handshake_timeout: Duration,
    pub grpc_keepalive_time: Option<Duration>,
    pub grpc_keepalive_timeout: Duration,
    pub grpc_keepalive_permit_without_calls: bool,
    pub grpc_max_pings_without_data: u32,
    pub grpc_min_recv_ping_interval: Duration,
    pub grpc_max_ping_strikes: u32,
    /// GOAWAY a gRPC connection this old (`None`: never).
    pub grpc_max_connection_age: Option<Duration>,
    /// How long its streams may run after that GOAWAY (`None`: no bound).
    pub grpc_max_connection_age_grace: Option<Duration>,
}

impl TransportLimits {
    /// The HTTP/2 frame rules of a gRPC connection.
    pub fn h2_rules(&self) -> H2Rules {
        H2Rules {
            keepalive_time: self.grpc_keepalive_time,
            keepalive_timeout: self.grpc_keepalive_timeout,
            permit_without_calls: self.grpc_keepalive_permit_without_calls,
            max_pings_without_data: self.grpc_max_pings_without_data,
            min_recv_ping_interval: self.grpc_min_recv_ping_interval,
            max_ping_strikes: self.grpc_max_ping_strikes,
        }
    }
}

/// One shard's transport counters. Written by that shard only, except
/// `buffered_request_bytes`, which a body buffer dropped on another shard
/// (after crossing a ring with its request) decrements. Each block is its
/// own `Arc` allocation; the 128-byte alignment keeps its reference count
/// (cloned per buffered body) and its counters off other shards' lines.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct ShardTransportStats {
    open_connections: AtomicUsize,
    refused_connections: AtomicU64,
    accept_errors: AtomicU64,
    buffered_request_bytes: AtomicUsize,
    peak_buffered_request_bytes: AtomicUsize,
    rejected_bodies: AtomicU64,
}

impl ShardTransportStats {
    /// Connections open on this shard now.
    pub fn open_connections(&self) -> usize {
        self.open_connections.load(Ordering::Relaxed)
    }
    /// Connections closed at once because the shard was at its cap.
    pub fn refused_connections(&self) -> u64 {
        self.refused_connections.load(Ordering::Relaxed)
    }
    /// Failed `accept` calls (descriptor exhaustion and the like).
    pub fn accept_errors(&self) -> u64 {
        self.accept_errors.load(Ordering::Relaxed)
    }
    /// Request-body bytes reserved by requests this shard received and
    /// that are still alive.
    pub fn buffered_request_bytes(&self) -> usize {
        self.buffered_request_bytes.load(Ordering::Relaxed)
    }
    /// The most `buffered_request_bytes` has been since start.
    pub fn peak_buffered_request_bytes(&self) -> usize {
        self.peak_buffered_request_bytes.load(Ordering::Relaxed)
    }
    /// Request bodies refused with 503 because the budget was spent.
    pub fn rejected_bodies(&self) -> u64 {
        self.rejected_bodies.load(Ordering::Relaxed)
    }
}

/// Transport counters of every shard, shared with the server handle and
/// the metrics exposition.
#[derive(Debug)]
pub struct TransportStats {
    shards: Box<[Arc<ShardTransportStats>]>,
    limits: TransportLimits,
}

impl TransportStats {
    pub fn new(shards: usize, limits: TransportLimits) -> Arc<Self> {
        Arc::new(Self {
            shards: (0..shards)
                .map(|_| Arc::new(ShardTransportStats::default()))
                .collect(),
            limits,
        })
    }
    pub fn limits(&self) -> &TransportLimits {
        &self.limits
    }
    /// One shard's counters (`None` for an id out of range).
    pub fn shard(&self, id: usize) -> Option<&ShardTransportStats> {
        self.shards.get(id).map(|s| &**s)
    }
    pub fn open_connections(&self) -> usize {
        self.shards.iter().map(|s| s.open_connections()).sum()
    }
    pub fn refused_connections(&self) -> u64 {
        self.shards.iter().map(|s| s.refused_connections()).sum()
    }
    pub fn accept_errors(&self) -> u64 {
        self.shards.iter().map(|s| s.accept_errors()).sum()
    }
    /// Request-body bytes buffered now, all shards.
    pub fn buffered_request_bytes(&self) -> usize {
        self.shards.iter().map(|s| s.buffered_request_bytes()).sum()
    }
    /// Sum of the shards' peaks: an upper bound of the process's peak.
    pub fn peak_buffered_request_bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.peak_buffered_request_bytes())
            .sum()
    }
    pub fn rejected_bodies(&self) -> u64 {
        self.shards.iter().map(|s| s.rejected_bodies()).sum()
    }
}

impl TransportStats {
    /// The transport counters in Prometheus text format, one sample per
    /// shard, appended to `/metrics` after the `nv_*` and `shardserve_*`
    /// families of `metrics::prometheus`.
    pub fn render_prometheus(&self) -> String {
        use std::fmt::Write;
        type Read = fn(&ShardTransportStats) -> u64;
        let families: [(&str, &str, &str, Read); 5] = [
            (
                "shardserve_buffered_request_bytes",
                "gauge",
                "HTTP request-body bytes buffered now (reserved against --max-buffered-request-bytes)",
                |s| s.buffered_request_bytes() as u64,
            ),
            (
                "shardserve_buffered_request_bytes_peak",
                "gauge",
                "Most HTTP request-body bytes buffered at once since start",
                |s| s.peak_buffered_request_bytes() as u64,
            ),
            (
                "shardserve_rejected_request_bodies_total",
                "counter",
                "HTTP request bodies refused with 503: body budget spent",
                |s| s.rejected_bodies(),
            ),
            (
                "shardserve_refused_connections_total",
                "counter",
                "Connections closed at accept: the shard was at --max-connections",
                |s| s.refused_connections(),
            ),
            (
                "shardserve_accept_errors_total",
                "counter",
                "Failed accept calls (descriptor or memory exhaustion, aborted connections)",
                |s| s.accept_errors(),
            ),
        ];
        let mut out = String::new();
        for (name, kind, help, read) in families {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (i, shard) in self.shards.iter().enumerate() {
                let _ = writeln!(out, "{name}{{shard=\"{i}\"}} {}", read(shard));
            }
        }
        out
    }
}

/// A shard's transport context: its limits, its connections (for the cap
/// and for draining them at shutdown) and its counters.
pub struct ShardTransport {
    pub shard: usize,
    pub limits: TransportLimits,
    stats: Arc<TransportStats>,
    /// This shard's block of `stats` (`None` for an id out of range).
    counters: Option<Arc<ShardTransportStats>>,
    connections: RefCell<HashMap<u64, Rc<ConnState>>>,
    next_connection: Cell<u64>,
    draining: Cell<bool>,
}

thread_local! {
    static CURRENT: RefCell<Option<Rc<ShardTransport>>> = const { RefCell::new(None) };
}

impl ShardTransport {
    /// Installs this thread's (shard's) transport context.
    pub fn install(shard: usize, stats: Arc<TransportStats>) -> Rc<Self> {
        let transport = Rc::new(Self {
            shard,
            limits: stats.limits,
            counters: stats.shards.get(shard).cloned(),
            stats,
            connections: RefCell::new(HashMap::new()),
            next_connection: Cell::new(0),
            draining: Cell::new(false),
        });
        CURRENT.with(|c| *c.borrow_mut() = Some(transport.clone()));
        transport
    }

    /// This shard's transport context; `None` off shard threads.
    pub fn current() -> Option<Rc<Self>> {
        CURRENT.with(|c| c.borrow().clone())
    }

    pub fn clear_current() {
        CURRENT.with(|c| c.borrow_mut().take());
    }

    fn counters(&self) -> Option<&ShardTransportStats> {
        self.counters.as_deref()
    }

    /// This shard's counter block, for a body reservation to hold.
    fn counters_arc(&self) -> Option<&Arc<ShardTransportStats>> {
        self.counters.as_ref()
    }

    /// Every shard's counters (the metrics exposition sums them).
    pub fn stats(&self) -> &TransportStats {
        &self.stats
    }

    pub fn open_connections(&self) -> usize {
        self.connections.borrow().len()
    }

    pub fn is_draining(&self) -> bool {
        self.draining.get()
    }

    /// Shutdown: every open connection is told to finish what it is doing
    /// and close (HTTP/1 keep-alive off, HTTP/2 GOAWAY). Idempotent.
    pub fn begin_drain(&self) {
        if self.draining.replace(true) {
            return;
        }
        let open: Vec<Rc<ConnState>> = self.connections.borrow().values().cloned().collect();
        if !open.is_empty() {
            tracing::debug!(
                shard = self.shard,
                connections = open.len(),
                "draining connections"
            );
        }
        for conn in open {
            conn.begin_drain();
        }
    }

    /// Waits until every connection of this shard has closed, or until
    /// `deadline`; returns how many are still open.
    pub async fn wait_connections_closed(&self, deadline: std::time::Instant) -> usize {
        while self.open_connections() > 0 && std::time::Instant::now() < deadline {
            monoio::time::sleep(Duration::from_millis(2)).await;
        }
        self.open_connections()
    }

    /// Registers a new connection, or `None` when the shard is at its cap.
    fn register(self: &Rc<Self>) -> Option<ConnSlot> {
        let open = self.connections.borrow().len();
        if open >= self.limits.max_connections {
            if let Some(c) = self.counters() {
                c.refused_connections.fetch_add(1, Ordering::Relaxed);
            }
            return None;
        }
        let id = self.next_connection.get();
        self.next_connection.set(id.wrapping_add(1));
        let state = Rc::new(ConnState::new());
        if self.draining.get() {
            state.begin_drain();
        }
        self.connections.borrow_mut().insert(id, state.clone());
        if let Some(c) = self.counters() {
            c.open_connections.store(open + 1, Ordering::Relaxed);
        }
        Some(ConnSlot::new(self.clone(), id, state))
    }

    fn unregister(&self, id: u64) {
        let open = {
            let mut connections = self.connections.borrow_mut();
            connections.remove(&id);
            connections.len()
        };
        if let Some(c) = self.counters() {
            c.open_connections.store(open, Ordering::Relaxed);
        }
    }

    fn count_accept_error(&self) {
        if let Some(c) = self.counters() {
            c.accept_errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shards_block_owns_its_lines_and_its_count() {
        // The block's `Arc` count (cloned per buffered body) and counters
        // sit on lines of their own.
        assert!(std::mem::align_of::<ShardTransportStats>() >= crate::padded::LINE);
        let second = Duration::from_secs(1);
        let limits = TransportLimits {
            max_connections: 8,
            buffered_bytes_per_shard: 1 << 19,
            http_header_timeout: second,
            http_body_timeout: second,
            http_body_total_timeout: second,
            idle_timeout: second,
            grpc_handshake_timeout: second,
            grpc_keepalive_time: None,
            grpc_keepalive_timeout: second,
            grpc_keepalive_permit_without_calls: false,
            grpc_max_pings_without_data: 2,
            grpc_min_recv_ping_interval: second,
            grpc_max_ping_strikes: 2,
            grpc_max_connection_age: None,
            grpc_max_connection_age_grace: None,
        };
        let stats = TransportStats::new(2, limits);
        let blocks: Vec<usize> = (0..2)
            .filter_map(|i| stats.shard(i))
            .map(|b| b as *const ShardTransportStats as usize)
            .collect();
        assert_eq!(blocks.len(), 2);
        assert!(blocks.iter().all(|p| p % crate::padded::LINE == 0));
    }
}
