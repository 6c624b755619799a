//! Reading an HTTP/1 request body under three bounds:
//!
//! - size: a declared `Content-Length` above `--http-max-input-size` is
//!   refused with 413 before a byte of the body is read; a chunked body is
//!   refused as soon as it grows past the limit;
//! - time: a body that pauses longer than `--http-body-timeout-secs`
//!   between chunks, or takes longer than `--http-body-total-timeout-secs`
//!   in all, gets 408;
//! - memory: the bytes buffered for request bodies count against the
//!   shard's share of `--max-buffered-request-bytes`. A declared length is
//!   reserved whole before reading; a chunked body reserves its buffer's
//!   capacity as it grows. Over budget: 503. The reservation lives in the
//!   returned `Bytes` (its owner), so it is released when the last slice
//!   of the body — tensors decoded from it without a copy included — is
//!   dropped, on whichever shard that happens.
//!
//! Every refusal asks for the connection to be closed: the rest of the
//! body is never read.

use std::{
    sync::{atomic::Ordering, Arc},
    time::Instant,
};

use bytes::Bytes;
use futures::FutureExt;
use http::StatusCode;
use http_body::Body;
use http_body_util::BodyExt;

use super::{ShardTransport, ShardTransportStats};

/// Why a body was not read; the response closes the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyError {
    pub status: StatusCode,
    pub message: String,
}

impl BodyError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }
}

/// Bytes reserved against a shard's body budget; released on drop. Holds
/// only that shard's counter block: the clone per body writes a count in
/// the block's own lines, which no other shard writes unless the body is
/// dropped there (after its request crossed a ring).
#[derive(Debug)]
struct Reservation {
    counters: Option<Arc<ShardTransportStats>>,
    budget: usize,
    bytes: usize,
}

impl Reservation {
    fn new(transport: &ShardTransport) -> Self {
        Self {
            counters: transport.counters_arc().cloned(),
            budget: transport.limits.buffered_bytes_per_shard,
            bytes: 0,
        }
    }

    /// Grows the reservation to `total` bytes if the budget allows.
    /// Only the owning shard grows its counter, so the check cannot race
    /// with another increment; releases elsewhere only lower it.
    fn grow_to(&mut self, total: usize) -> bool {
        let Some(extra) = total.checked_sub(self.bytes).filter(|&e| e > 0) else {
            return true;
        };
        let Some(counters) = &self.counters else {
            return false;
        };
        let current = counters.buffered_request_bytes.load(Ordering::Relaxed);
        if current.saturating_add(extra) > self.budget {
            counters.rejected_bodies.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let now = counters
            .buffered_request_bytes
            .fetch_add(extra, Ordering::Relaxed)
            + extra;
        counters
            .peak_buffered_request_bytes
            .fetch_max(now, Ordering::Relaxed);
        self.bytes = total;
        true
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.bytes > 0 {
            if let Some(counters) = &self.counters {
                counters
                    .buffered_request_bytes
                    .fetch_sub(self.bytes, Ordering::Relaxed);
            }
        }
    }
}

/// A body buffer that holds its reservation: the owner of the `Bytes`.
struct BufferedBody {
    data: Vec<u8>,
    _reservation: Reservation,
}

impl AsRef<[u8]> for BufferedBody {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

fn over_budget(transport: &ShardTransport) -> BodyError {
    BodyError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "the server is buffering too many request bodies (budget {} bytes per shard, \
             --max-buffered-request-bytes); retry later",
            transport.limits.buffered_bytes_per_shard
        ),
    )
}

fn too_large(limit: usize) -> BodyError {
    BodyError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("request body exceeds the server's limit of {limit} bytes (--http-max-input-size)"),
    )
}

/// Room in this shard's body budget for bytes a request holds besides its
/// body (the decoded files of a repository load, a gRPC message's
/// payload): taken before the bytes are allocated where possible, and
/// held by the [`Bytes`] they become.
#[derive(Debug)]
pub struct BufferedHold {
    reservation: Reservation,
}

impl BufferedHold {
    /// `data` as `Bytes` that keep the reservation until the last slice of
    /// them is dropped, on whichever thread.
    pub fn into_bytes(self, data: Vec<u8>) -> Bytes {
        Bytes::from_owner(BufferedBody {
            data,
            _reservation: self.reservation,
        })
    }
}

/// Reserves `bytes` of this shard's share of `--max-buffered-request-bytes`
/// (503 / UNAVAILABLE over it). Must run on a shard.
pub fn reserve_buffered(bytes: usize) -> Result<BufferedHold, BodyError> {
    let transport = ShardTransport::current().ok_or_else(|| {
        BodyError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "request buffer reserved outside a server shard",
        )
    })?;
    let mut reservation = Reservation::new(&transport);
    if !reservation.grow_to(bytes) {
        return Err(over_budget(&transport));
    }
    Ok(BufferedHold { reservation })
}

/// Reads a whole request body under the size, time and memory bounds
/// above. Must run on a shard (it reads the shard's transport context).
pub async fn read_body<B>(body: B, limit: usize) -> Result<Bytes, BodyError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let transport = ShardTransport::current().ok_or_else(|| {
        BodyError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "request body read outside a server shard",
        )
    })?;
    let declared = body.size_hint().exact();
    let declared = match declared.map(usize::try_from) {
        Some(Ok(n)) if n <= limit => Some(n),
        Some(_) => return Err(too_large(limit)),
        None => None,
    };
    if declared == Some(0) || body.is_end_stream() {
        return Ok(Bytes::new());
    }
    let mut reservation = Reservation::new(&transport);
    let initial = declared.unwrap_or(0);
    if !reservation.grow_to(initial) {
        return Err(over_budget(&transport));
    }
    let mut buf: Vec<u8> = Vec::with_capacity(initial);
    // A fast sender keeps frames ready, so the loop would copy (and fault
    // in) a whole large body without letting the shard's other
    // connections run: the paced body hands the shard back every MiB.
    let mut body = super::paced::PacedBody::new(body);
    let limits = transport.limits;
    let total_deadline = Instant::now() + limits.http_body_total_timeout;
    loop {
        // A frame already here (a small body comes in the read that brought
        // its headers) needs no timer: arming and dropping one per request
        // cost a timer-wheel entry, two clock reads, and a 1.4 KB larger
        // future for every HTTP request. A body that trickles in is
        // pending here and meets both deadlines below.
        let ready = body.frame().now_or_never();
        let frame = match ready {
            Some(frame) => Ok(frame),
            None => {
                let stall_deadline =
                    (Instant::now() + limits.http_body_timeout).min(total_deadline);
                Box::pin(monoio::time::timeout_at(
                    stall_deadline.into(),
                    body.frame(),
                ))
                .await
                .map_err(|elapsed| (elapsed, stall_deadline))
            }
        };
        let frame = match frame {
            Err((_elapsed, stall_deadline)) => {
                let (what, secs, flag) = if stall_deadline >= total_deadline {
                    (
                        "in total",
                        limits.http_body_total_timeout.as_secs_f64(),
                        "--http-body-total-timeout-secs",
                    )
                } else {
                    (
                        "between chunks",
                        limits.http_body_timeout.as_secs_f64(),
                        "--http-body-timeout-secs",
                    )
                };
                return Err(BodyError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    format!(
                        "request body not received in time: {} of {} bytes after more than \
                         {secs} s {what} ({flag})",
                        buf.len(),
                        declared
                            .map_or_else(|| "an unknown number of".to_string(), |n| n.to_string()),
                    ),
                ));
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                return Err(BodyError::new(
                    StatusCode::BAD_REQUEST,
                    format!("failed to read the request body: {e}"),
                ))
            }
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        let needed = buf.len() + data.len();
        if needed > limit {
            return Err(too_large(limit));
        }
        if needed > buf.capacity() {
            // Account for the allocation as it will really be.
            let target = needed.max(buf.capacity().saturating_mul(2)).min(limit);
            if !reservation.grow_to(target) {
                return Err(over_budget(&transport));
            }
            buf.reserve_exact(target - buf.len());
        }
        buf.extend_from_slice(&data);
    }
    Ok(Bytes::from_owner(BufferedBody {
        data: buf,
        _reservation: reservation,
    }))
}
