//! Triton's trace extension (`triton` trace mode, `TIMESTAMPS` level).
//!
//! A request is sampled once, where a protocol first knows its model
//! (`Tracer::sample`); the sampled request carries its own `Trace` record
//! (a boxed `Vec` of timestamps) through the scheduler and the executor
//! and back with its response, so timestamps are taken without a lock or
//! a shared write. When the record drops — after the protocol stamped the
//! send, or earlier on any error path — it goes over a channel to the
//! server's trace writer thread, the only place that formats JSON and
//! touches files (`writer`). An unsampled request carries `None`: the
//! cost of tracing being off is one relaxed atomic load per request
//! (`Tracer::sample`) and a `None` check at each stamp.
//!
//! Settings follow Triton (`settings`): command-line defaults, global
//! updates over them, per-model updates over the global ones, `null`
//! clearing a value back to its fallback.

mod record;
mod settings;
mod tracer;
mod writer;

pub use record::{instants_ns, now_ns, Event, Trace, TraceSlot};
pub use settings::{Change, Level, SettingUpdate, TraceConfig, TraceMode, TraceView};
pub use tracer::Tracer;

/// When an HTTP/2 request's headers arrived (request extension, set only
/// while tracing is on): gRPC's `GRPC_WAITREAD_START`.
#[derive(Debug, Clone, Copy)]
pub struct HeadersAt(pub u64);
