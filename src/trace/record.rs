//! One sampled request's trace: its identity and the timestamps taken
//! along its path, owned by the request (no lock, no shared write).

use std::{
    fmt,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Instant,
};

use super::tracer::Active;

/// Trace ids, unique in the process (Triton's are unique per server).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Triton's timestamp names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    HttpRecvStart,
    HttpRecvEnd,
    GrpcWaitreadStart,
    GrpcWaitreadEnd,
    RequestStart,
    QueueStart,
    ComputeStart,
    ComputeInputEnd,
    ComputeOutputStart,
    ComputeEnd,
    RequestEnd,
    HttpSendStart,
    HttpSendEnd,
    GrpcSendStart,
    GrpcSendEnd,
}

impl Event {
    pub fn name(self) -> &'static str {
        match self {
            Event::HttpRecvStart => "HTTP_RECV_START",
            Event::HttpRecvEnd => "HTTP_RECV_END",
            Event::GrpcWaitreadStart => "GRPC_WAITREAD_START",
            Event::GrpcWaitreadEnd => "GRPC_WAITREAD_END",
            Event::RequestStart => "REQUEST_START",
            Event::QueueStart => "QUEUE_START",
            Event::ComputeStart => "COMPUTE_START",
            Event::ComputeInputEnd => "COMPUTE_INPUT_END",
            Event::ComputeOutputStart => "COMPUTE_OUTPUT_START",
            Event::ComputeEnd => "COMPUTE_END",
            Event::RequestEnd => "REQUEST_END",
            Event::HttpSendStart => "HTTP_SEND_START",
            Event::HttpSendEnd => "HTTP_SEND_END",
            Event::GrpcSendStart => "GRPC_SEND_START",
            Event::GrpcSendEnd => "GRPC_SEND_END",
        }
    }
}

/// CLOCK_MONOTONIC in nanoseconds, the clock Triton's timestamps use
/// (`steady_clock`).
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Past instants on the monotonic clock (`Instant` is CLOCK_MONOTONIC on
/// Linux but does not expose its value), measured back from one reading
/// of both clocks so their order is kept exactly. `Instant` is read
/// first: the results are late by the time between the two readings,
/// never early.
pub fn instants_ns<const N: usize>(at: [Instant; N]) -> [u64; N] {
    let now = Instant::now();
    let ns = now_ns();
    at.map(|t| ns.saturating_sub(now.saturating_duration_since(t).as_nanos() as u64))
}

/// A sampled request's trace. Dropping it hands it to the writer thread.
pub struct Trace {
    pub(super) id: u64,
    pub(super) parent_id: u64,
    pub(super) model_name: String,
    pub(super) model_version: i64,
    pub(super) request_id: String,
    pub(super) events: Vec<(Event, u64)>,
    pub(super) active: Option<Arc<Active>>,
}

impl Trace {
    /// `active` has already counted this trace as created.
    pub(super) fn new(active: Arc<Active>, model_name: &str, parent_id: u64) -> Box<Self> {
        Box::new(Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            parent_id,
            model_name: model_name.to_string(),
            model_version: -1,
            request_id: String::new(),
            events: Vec::with_capacity(12),
            active: Some(active),
        })
    }
}

impl Drop for Trace {
    fn drop(&mut self) {
        if let Some(active) = self.active.take() {
            active.deliver(super::writer::Finished {
                id: self.id,
                parent_id: self.parent_id,
                model_name: std::mem::take(&mut self.model_name),
                model_version: self.model_version,
                request_id: std::mem::take(&mut self.request_id),
                events: std::mem::take(&mut self.events),
            });
        }
    }
}

/// Where a request or response keeps its trace: empty for every request
/// that was not sampled. A clone is empty: a copy of a request is not the
/// request that was sampled.
#[derive(Default)]
pub struct TraceSlot(Option<Box<Trace>>);

impl Clone for TraceSlot {
    fn clone(&self) -> Self {
        Self(None)
    }
}

impl fmt::Debug for TraceSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            None => f.write_str("untraced"),
            Some(t) => write!(f, "trace {}", t.id),
        }
    }
}

impl TraceSlot {
    pub(super) fn new(trace: Option<Box<Trace>>) -> Self {
        Self(trace)
    }

    pub fn is_traced(&self) -> bool {
        self.0.is_some()
    }

    /// The trace id, 0 when untraced.
    pub fn id(&self) -> u64 {
        self.0.as_ref().map_or(0, |t| t.id)
    }

    #[inline]
    pub fn stamp(&mut self, event: Event) {
        if let Some(t) = &mut self.0 {
            t.events.push((event, now_ns()));
        }
    }

    #[inline]
    pub fn stamp_at(&mut self, event: Event, ns: u64) {
        if let Some(t) = &mut self.0 {
            t.events.push((event, ns));
        }
    }

    /// Records which version served the request and the request's id.
    pub fn identify(&mut self, version: i64, request_id: &str) {
        if let Some(t) = &mut self.0 {
            t.model_version = version;
            if t.request_id.is_empty() {
                request_id.clone_into(&mut t.request_id);
            }
        }
    }

    /// Moves the trace out, leaving this slot empty.
    pub fn take(&mut self) -> TraceSlot {
        Self(self.0.take())
    }

    /// A trace of one step of an ensemble under this trace (Triton's
    /// child traces with `parent_id`); empty when this slot is.
    pub fn child(&self, model_name: &str) -> TraceSlot {
        Self(self.0.as_ref().and_then(|t| {
            t.active.as_ref().map(|a| {
                a.created();
                Trace::new(a.clone(), model_name, t.id)
            })
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untraced_slots_stay_empty() {
        let mut slot = TraceSlot::default();
        slot.stamp(Event::RequestStart);
        slot.identify(1, "x");
        assert!(!slot.is_traced());
        assert!(!slot.child("m").is_traced());
        assert_eq!(slot.id(), 0);
    }

    #[test]
    fn clock_is_monotonic_and_instants_convert() {
        let a = now_ns();
        let at = Instant::now();
        let b = now_ns();
        assert!(b >= a);
        let later = Instant::now();
        let [c, d] = instants_ns([at, later]);
        assert!(c >= a && c <= d && d <= now_ns());
    }
}
