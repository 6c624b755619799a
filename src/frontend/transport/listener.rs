//! The accept loop every listener (HTTP, gRPC, metrics) runs on a shard.
//!
//! - Descriptor or memory exhaustion (`EMFILE`, `ENFILE`, `ENOBUFS`,
//!   `ENOMEM`) makes `accept` fail at once and for as long as the condition
//!   lasts; retrying immediately spins a core and floods the log. As nginx
//!   does, the loop sleeps instead (10 ms doubling to 500 ms, reset by the
//!   next success) and logs at most one line per second, with a count of
//!   the failures it did not log.
//! - Errors that belong to one pending connection (`ECONNABORTED`, the
//!   network errors accept(2) passes on) are skipped at once; an unknown
//!   error backs off like exhaustion, so no error can make the loop spin.
//! - At the per-shard cap (`--max-connections`) a new connection is
//!   accepted and closed at once rather than left in the backlog: with
//!   SO_REUSEPORT the kernel has already bound it to this shard's queue,
//!   where it would wait for a slot that may take minutes to free; closing
//!   it tells the client immediately so it can retry (and a load balancer
//!   can pick another server), and keeps the queue from filling with stale
//!   connections that the client has long given up on.

use std::{
    io,
    rc::Rc,
    time::{Duration, Instant},
};

use monoio::net::{TcpListener, TcpStream};

use super::{ConnState, ShardTransport};
use crate::shard::Shard;

/// A connection's place in its shard's registry: counts towards the cap
/// until dropped.
pub struct ConnSlot {
    transport: Rc<ShardTransport>,
    id: u64,
    state: Rc<ConnState>,
}

impl ConnSlot {
    pub(super) fn new(transport: Rc<ShardTransport>, id: u64, state: Rc<ConnState>) -> Self {
        Self {
            transport,
            id,
            state,
        }
    }
    /// The connection's shared state (activity, timers, drain flag).
    pub fn state(&self) -> &Rc<ConnState> {
        &self.state
    }
    pub fn limits(&self) -> &super::TransportLimits {
        &self.transport.limits
    }
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.transport.unregister(self.id);
    }
}

const BACKOFF_MIN: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_millis(500);
const LOG_INTERVAL: Duration = Duration::from_secs(1);

/// Exponential back-off between failed accepts.
#[derive(Debug)]
struct Backoff {
    next: Duration,
}

impl Backoff {
    fn new() -> Self {
        Self { next: BACKOFF_MIN }
    }
    fn reset(&mut self) {
        self.next = BACKOFF_MIN;
    }
    fn step(&mut self) -> Duration {
        let now = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        now
    }
}

/// At most one log line per interval; counts what it swallowed.
#[derive(Debug)]
struct RateLimitedLog {
    interval: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl RateLimitedLog {
    fn new(interval: Duration) -> Self {
        Self {
            interval,
            last: None,
            suppressed: 0,
        }
    }
    /// `Some(suppressed since the last line)` when a line may be logged now.
    fn admit(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(t) if now.duration_since(t) < self.interval => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AcceptFailure {
    /// Out of descriptors or kernel memory: lasts until something closes.
    Exhausted,
    /// One pending connection failed; the next may be fine.
    ThisConnection,
    /// Anything else: treated like exhaustion, never retried in a spin.
    Other,
}

fn classify(e: &io::Error) -> AcceptFailure {
    match e.raw_os_error() {
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM) => {
            AcceptFailure::Exhausted
        }
        // accept(2): "Linux accept() passes already-pending network errors
        // on the new socket as an error code from accept()" — retry.
        Some(
            libc::ECONNABORTED
            | libc::EPROTO
            | libc::EPERM
            | libc::EINTR
            | libc::EAGAIN
            | libc::ENETDOWN
            | libc::ENOPROTOOPT
            | libc::EHOSTDOWN
            | libc::ENONET
            | libc::EHOSTUNREACH
            | libc::EOPNOTSUPP
            | libc::ENETUNREACH
            | libc::ECONNRESET
            | libc::ETIMEDOUT,
        ) => AcceptFailure::ThisConnection,
        _ => AcceptFailure::Other,
    }
}

/// Accepts connections on `listener` until the shard shuts down, handing
/// each to `serve` with its registry slot (which the connection task must
/// hold for as long as it lives). Then starts draining the shard's
/// connections.
pub async fn accept_loop<F>(listener: TcpListener, shard: Rc<Shard>, what: &'static str, serve: F)
where
    F: Fn(TcpStream, ConnSlot),
{
    let Some(transport) = ShardTransport::current() else {
        tracing::error!(
            shard = shard.id,
            "{what}: no transport context on this thread; listener not served"
        );
        return;
    };
    let mut backoff = Backoff::new();
    let mut failure_log = RateLimitedLog::new(LOG_INTERVAL);
    let mut refusal_log = RateLimitedLog::new(LOG_INTERVAL);
    loop {
        let accepted = monoio::select! {
            r = listener.accept() => r,
            _ = shard.shutdown.wait() => break,
        };
        match accepted {
            Ok((stream, _peer)) => {
                backoff.reset();
                match transport.register() {
                    Some(slot) => serve(stream, slot),
                    None => {
                        if let Some(suppressed) = refusal_log.admit(Instant::now()) {
                            tracing::warn!(
                                shard = shard.id,
                                max_connections = transport.limits.max_connections,
                                suppressed,
                                "{what}: connection cap reached on this shard \
                                 (--max-connections); closing new connections at once"
                            );
                        }
                        drop(stream);
                    }
                }
            }
            Err(e) => {
                transport.count_accept_error();
                let kind = classify(&e);
                if kind == AcceptFailure::ThisConnection {
                    tracing::debug!(shard = shard.id, error = %e, "{what}: accept failed for one connection");
                    continue;
                }
                let pause = backoff.step();
                if let Some(suppressed) = failure_log.admit(Instant::now()) {
                    tracing::warn!(
                        shard = shard.id,
                        error = %e,
                        suppressed,
                        backoff_ms = pause.as_millis() as u64,
                        open_connections = transport.open_connections(),
                        "{what}: accept failed{}; pausing accepts",
                        if kind == AcceptFailure::Exhausted {
                            " (out of descriptors or memory: raise the open-file limit or lower --max-connections)"
                        } else {
                            ""
                        }
                    );
                }
                monoio::select! {
                    _ = monoio::time::sleep(pause) => {},
                    _ = shard.shutdown.wait() => break,
                }
            }
        }
    }
    transport.begin_drain();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_ceiling_and_resets() {
        let mut b = Backoff::new();
        let steps: Vec<u64> = (0..8).map(|_| b.step().as_millis() as u64).collect();
        assert_eq!(steps, [10, 20, 40, 80, 160, 320, 500, 500]);
        b.reset();
        assert_eq!(b.step(), BACKOFF_MIN);
    }

    #[test]
    fn log_admits_one_line_per_interval_and_counts_the_rest() {
        let mut log = RateLimitedLog::new(Duration::from_secs(1));
        let t0 = Instant::now();
        assert_eq!(log.admit(t0), Some(0));
        for i in 1..=5 {
            assert_eq!(log.admit(t0 + Duration::from_millis(100 * i)), None);
        }
        assert_eq!(log.admit(t0 + Duration::from_millis(1001)), Some(5));
        assert_eq!(log.admit(t0 + Duration::from_millis(1002)), None);
    }

    #[test]
    fn exhaustion_is_told_apart_from_one_bad_connection() {
        let err = |code| io::Error::from_raw_os_error(code);
        assert_eq!(classify(&err(libc::EMFILE)), AcceptFailure::Exhausted);
        assert_eq!(classify(&err(libc::ENFILE)), AcceptFailure::Exhausted);
        assert_eq!(classify(&err(libc::ENOBUFS)), AcceptFailure::Exhausted);
        assert_eq!(classify(&err(libc::ENOMEM)), AcceptFailure::Exhausted);
        assert_eq!(
            classify(&err(libc::ECONNABORTED)),
            AcceptFailure::ThisConnection
        );
        assert_eq!(classify(&err(libc::EBADF)), AcceptFailure::Other);
        assert_eq!(
            classify(&io::Error::other("not an OS error")),
            AcceptFailure::Other
        );
    }
}
