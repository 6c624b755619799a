//! The one infer path of every front end. HTTP (`/infer`, `/generate`),
//! gRPC (`ModelInfer`, `ModelStreamInfer`) and the in-process C API
//! (`TRITONSERVER_ServerInferAsync`, the Python backend's BLS) decode their
//! wire form into an [`InferRequest`], hand it here, and encode what comes
//! back; nothing between those two steps is written in a front end.
//!
//! The path, in order: the trace sample (taken by the front end as the
//! request arrives, [`trace`], so its receive stamps are its own), the
//! shared-memory regions its inputs are read from and its outputs written
//! to (resolved before the scheduler sees it), the scheduler call
//! (`scheduler::infer` / `infer_stream`: validation, the queue, batching,
//! sequences, ensembles, decoupled responses, timeouts), and the post-run
//! check that every region it used is still whole (`shm::finish`).
//!
//! Statistics and failure accounting follow Triton's rule, the same for
//! every front end: a request counts (success, or failure under its reason:
//! REJECTED for a timeout in the queue, CANCELED, BACKEND, OTHER) once its
//! model's scheduler has accepted it; a request refused before that — it
//! does not decode, names an unknown input, has the wrong datatype or
//! shape, breaks the sequence batcher's rules — is answered with its error
//! and counted nowhere, as Triton 2.51 answers a request that fails
//! `TRITONSERVER_ServerInferAsync`'s preparation. The counting itself
//! happens in the scheduler (`scheduler::dispatch`), on the shard that
//! received the request, because the requests an ensemble sends to its
//! steps count there too without passing through a front end.
//!
//! Requests from threads that are not shards (the C API) enter through a
//! [`ThreadEntry`]: one bounded queue per shard, refused with UNAVAILABLE
//! when full, as Triton answers a full queue.

use std::{
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicUsize, Ordering},
        mpsc::{self, Receiver, SyncSender, TrySendError},
        Arc,
    },
    task::Poll,
};

use futures::{channel::mpsc::UnboundedSender, task::AtomicWaker, StreamExt};

use crate::{
    model::{validate_request, ModelTable, ModelVersion},
    scheduler::{self, ResponseStream, Streamed},
    shard::{InFlight, ShardControl},
    shm::{self, RequestRegions},
    trace::TraceSlot,
    types::{InferError, InferRequest, InferResponse, InferResult},
};

/// Samples a request to `model` for tracing as it arrives, before its
/// front end reads or decodes it (an empty slot when tracing is off). The
/// front end stamps its own receive and send events on it and puts it in
/// the decoded request.
#[inline]
pub fn trace(model: &str) -> TraceSlot {
    crate::frontend::env::sample_trace(model)
}

/// Runs one decoded request of a model that answers once (refused with
/// Triton's error for a decoupled model) and returns its response, its
/// outputs already written to the shared-memory regions it named.
pub async fn infer(request: InferRequest, protocol: Protocol) -> InferResult<InferResponse> {
    let log = RequestLog::start(&request, protocol);
    let result =
        match RequestRegions::resolve(&request.inputs, &request.outputs, &request.model_name) {
            Ok(regions) => shm::finish(regions.as_ref(), scheduler::infer(request).await),
            Err(e) => Err(e),
        };
    if let Some(log) = log {
        log.finish(result.as_ref().map(|r| r.model_version.as_str()));
    }
    result
}

/// Runs one decoded request of any model and streams its responses (one
/// for a model that answers once; zero or more, then the final flag, for
/// a decoupled one), each written to the shared-memory regions the request
/// named. The request is validated and queued on the stream's first poll:
/// a front end that must keep the order of its requests (a stream carrying
/// a sequence) polls each stream once as it creates it. The stream counts
/// in flight on the shard while it lasts, so graceful shutdown waits for
/// it; dropping it cancels the request.
pub fn infer_stream(request: InferRequest, protocol: Protocol) -> ResponseStream {
    let mut log = RequestLog::start(&request, protocol);
    let mut regions =
        match RequestRegions::resolve(&request.inputs, &request.outputs, &request.model_name) {
            Ok(regions) => regions,
            Err(e) => {
                if let Some(log) = log {
                    log.finish(Err(&e));
                }
                return Box::pin(futures::stream::once(std::future::ready(Err(e))));
            }
        };
    let in_flight = InFlight::enter();
    Box::pin(scheduler::infer_stream(request).map(move |item| {
        let _in_flight = &in_flight;
        let item = match (&regions, item) {
            (Some(regions), Ok(Streamed::Response { response, last })) => {
                shm::finish(Some(regions), Ok(response))
                    .map(|response| Streamed::Response { response, last })
            }
            (Some(regions), Err(e)) => Err(regions.blame(e)),
            (_, item) => item,
        };
        // The last item: the regions' leases go before it is sent (an
        // unregister deferred meanwhile completes; see `shm::Lease`), not
        // when the stream is dropped.
        if matches!(
            item,
            Err(_) | Ok(Streamed::Final(_)) | Ok(Streamed::Response { last: true, .. })
        ) {
            regions = None;
        }
        if log.is_some() {
            RequestLog::observe(&mut log, &item);
        }
        item
    }))
}

/// The front end a request came in through, as the request log names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Http,
    Grpc,
    /// The in-process C API (`TRITONSERVER_ServerInferAsync`, BLS).
    InProcess,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http => "HTTP",
            Self::Grpc => "GRPC",
            Self::InProcess => "in-process",
        }
    }
}

/// The request log: one debug line per request at `--log-verbose 1` and
/// more, when it ends (model, version, id, protocol, outcome, duration).
/// Nothing is taken or allocated unless the line will be written, so the
/// path costs one relaxed load when verbose logging is off.
struct RequestLog {
    model: String,
    version: String,
    id: String,
    protocol: Protocol,
    start: std::time::Instant,
    responses: u32,
}

impl RequestLog {
    #[inline]
    fn start(request: &InferRequest, protocol: Protocol) -> Option<Self> {
        if !tracing::enabled!(tracing::Level::DEBUG) {
            return None;
        }
        Some(Self {
            model: request.model_name.clone(),
            version: request.model_version.clone(),
            id: request.id.clone(),
            protocol,
            start: std::time::Instant::now(),
            responses: 0,
        })
    }

    /// Counts a streamed item and writes the line after the last one.
    fn observe(slot: &mut Option<Self>, item: &InferResult<Streamed>) {
        let Some(log) = slot.as_mut() else {
            return;
        };
        match item {
            Ok(Streamed::Response { last: false, .. }) => log.responses += 1,
            Ok(Streamed::Response {
                response,
                last: true,
            }) => {
                log.responses += 1;
                if let Some(log) = slot.take() {
                    log.finish(Ok(&response.model_version));
                }
            }
            Ok(Streamed::Final(response)) => {
                if let Some(log) = slot.take() {
                    log.finish(Ok(&response.model_version));
                }
            }
            Err(e) => {
                if let Some(log) = slot.take() {
                    log.finish(Err(e));
                }
            }
        }
    }

    /// Writes the line: `outcome` is the version that ran, or the error.
    fn finish(mut self, outcome: Result<&str, &InferError>) {
        let duration_us = self.start.elapsed().as_micros() as u64;
        let version = match outcome {
            Ok(v) if !v.is_empty() => v,
            _ => self.version.as_str(),
        };
        match outcome {
            Ok(_) => tracing::debug!(
                model = %self.model,
                version = %version,
                id = %self.id,
                protocol = self.protocol.as_str(),
                responses = self.responses.max(1),
                duration_us,
                "inference request succeeded"
            ),
            Err(e) => tracing::debug!(
                model = %self.model,
                version = %version,
                id = %self.id,
                protocol = self.protocol.as_str(),
                duration_us,
                error = %e,
                "inference request failed"
            ),
        }
        // Written: nothing left for `drop` to report.
        self.model.clear();
    }
}

impl Drop for RequestLog {
    /// A request whose caller went away before its end (a closed
    /// connection, a cancelled stream) still gets its line.
    fn drop(&mut self) {
        if self.model.is_empty() {
            return;
        }
        tracing::debug!(
            model = %self.model,
            version = %self.version,
            id = %self.id,
            protocol = self.protocol.as_str(),
            responses = self.responses,
            duration_us = self.start.elapsed().as_micros() as u64,
            "inference request cancelled"
        );
    }
}

/// What a thread that is not a shard does with a request's responses once
/// it runs: given the response stream on the shard, it returns the task
/// that consumes it there.
pub type Consumer = Box<dyn FnOnce(ResponseStream) -> LocalTask + Send>;
pub type LocalTask = Pin<Box<dyn Future<Output = ()>>>;

/// Requests from other threads that may wait for one shard to pick them
/// up; past it, [`ThreadEntry::submit`] refuses with UNAVAILABLE.
pub const THREAD_QUEUE_CAPACITY: usize = 1024;

/// A request submitted from another thread, waiting for its shard.
struct Submission {
    request: InferRequest,
    consume: Consumer,
}

/// One shard's queue of requests from other threads: bounded, with a
/// doorbell that wakes the shard's drainer task.
struct Lane {
    tx: SyncSender<Submission>,
    bell: Arc<AtomicWaker>,
}

/// The way into the infer path from a thread that is not a shard (the C
/// API's `TRITONSERVER_ServerInferAsync`, called from a backend's own
/// threads). A request is checked on the calling thread, so a bad one is
/// that caller's error before anything is queued, then goes to the shard
/// that owns its model's scheduler (no ring crossing) through that shard's
/// bounded queue, where it runs [`infer_stream`] exactly as a network
/// request does.
pub struct ThreadEntry {
    lanes: Box<[Lane]>,
    /// Round-robin over shards for models with no owner shard (ensembles).
    next: AtomicUsize,
}

/// A submission the entry did not take: why, and the consumer back, so
/// that the caller decides what dropping it means (the request stays the
/// caller's).
pub struct Refused {
    pub error: InferError,
    pub consume: Consumer,
}

impl ThreadEntry {
    /// Starts one drainer task per shard, sent over the shards' control
    /// channels (once, at start-up: requests never travel there).
    pub fn start(control: &[UnboundedSender<ShardControl>]) -> Self {
        let lanes = control
            .iter()
            .map(|c| {
                let (tx, rx) = mpsc::sync_channel(THREAD_QUEUE_CAPACITY);
                let bell = Arc::new(AtomicWaker::new());
                let drainer_bell = bell.clone();
                // A shard that has stopped drops the task and its
                // receiver: submissions then fail as "shutting down".
                let _ = c.unbounded_send(ShardControl::Run(Box::new(move || {
                    monoio::spawn(drain(rx, drainer_bell));
                })));
                Lane { tx, bell }
            })
            .collect();
        Self {
            lanes,
            next: AtomicUsize::new(0),
        }
    }

    pub fn shards(&self) -> usize {
        self.lanes.len()
    }

    /// Checks `request` against `table` (the table the shards serve) on
    /// the calling thread and queues it for its shard, where `consume`
    /// gets its responses. Refused, with the consumer back: a request the
    /// model refuses (its error, as every front end words it), a full
    /// queue or a stopped server (UNAVAILABLE).
    pub fn submit(
        &self,
        table: &ModelTable,
        request: InferRequest,
        consume: Consumer,
    ) -> Result<(), Refused> {
        // On a copy: validation applies the config's reshapes, and the
        // shard validates (and reshapes) the original.
        let checked = table
            .resolve(&request.model_name, &request.model_version)
            .and_then(|m| {
                let mut probe = request.clone();
                validate_request(&m.io, &m.name, &mut probe).map(|()| self.shard_for(m))
            });
        match checked {
            Ok(shard) => self.queue(shard, Submission { request, consume }),
            Err(error) => Err(Refused { error, consume }),
        }
    }

    /// Puts a checked request in `shard`'s queue and rings its drainer.
    fn queue(&self, shard: usize, submission: Submission) -> Result<(), Refused> {
        let Some(lane) = self.lanes.get(shard) else {
            return Err(Refused {
                error: stopped(),
                consume: submission.consume,
            });
        };
        match lane.tx.try_send(submission) {
            Ok(()) => {
                lane.bell.wake();
                Ok(())
            }
            Err(TrySendError::Full(s)) => Err(Refused {
                error: InferError::unavailable(format!(
                    "server overloaded: {THREAD_QUEUE_CAPACITY} in-process requests are \
                     already waiting for shard {shard}; retry later"
                )),
                consume: s.consume,
            }),
            Err(TrySendError::Disconnected(s)) => Err(Refused {
                error: stopped(),
                consume: s.consume,
            }),
        }
    }

    /// The shard owning `model`'s scheduler (one of them round-robin for a
    /// version spread over several), else the next shard round-robin (an
    /// ensemble runs on the shard that receives it).
    fn shard_for(&self, model: &ModelVersion) -> usize {
        let owner = match model.schedulers() {
            [one] => one.shard,
            many => many[self.next.fetch_add(1, Ordering::Relaxed) % many.len()].shard,
        };
        match owner {
            s if model.ensemble.is_none() && s < self.lanes.len() => s,
            _ => self.next.fetch_add(1, Ordering::Relaxed) % self.lanes.len().max(1),
        }
    }
}

fn stopped() -> InferError {
    InferError::unavailable("the server is shutting down and takes no new requests")
}

/// A shard's drainer: runs each request submitted from another thread as
/// a task of its own. Ends when every sender is gone (the server dropped).
async fn drain(rx: Receiver<Submission>, bell: Arc<AtomicWaker>) {
    loop {
        let next = std::future::poll_fn(|cx| match rx.try_recv() {
            Ok(s) => Poll::Ready(Some(s)),
            Err(mpsc::TryRecvError::Disconnected) => Poll::Ready(None),
            Err(mpsc::TryRecvError::Empty) => {
                bell.register(cx.waker());
                // Looked at again after registering, so a submission that
                // rang the bell in between is not missed.
                match rx.try_recv() {
                    Ok(s) => Poll::Ready(Some(s)),
                    Err(mpsc::TryRecvError::Disconnected) => Poll::Ready(None),
                    Err(mpsc::TryRecvError::Empty) => Poll::Pending,
                }
            }
        })
        .await;
        let Some(Submission { request, consume }) = next else {
            return;
        };
        monoio::spawn(consume(infer_stream(request, Protocol::InProcess)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ErrorKind;

    fn submission(dropped: &Arc<AtomicUsize>) -> Submission {
        struct CountDrop(Arc<AtomicUsize>);
        impl Drop for CountDrop {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        let guard = CountDrop(dropped.clone());
        Submission {
            request: InferRequest {
                model_name: "m".into(),
                model_version: String::new(),
                id: String::new(),
                inputs: Vec::new(),
                outputs: Vec::new(),
                parameters: Default::default(),
                trace: Default::default(),
            },
            consume: Box::new(move |_| {
                let _guard = guard;
                Box::pin(async {})
            }),
        }
    }

    #[test]
    fn a_full_queue_refuses_with_unavailable_and_gives_the_consumer_back() {
        let (control, shard_side) = futures::channel::mpsc::unbounded();
        // The shard never runs its drainer: nothing leaves the queue.
        let entry = ThreadEntry::start(&[control]);
        let dropped = Arc::new(AtomicUsize::new(0));
        for _ in 0..THREAD_QUEUE_CAPACITY {
            assert!(entry.queue(0, submission(&dropped)).is_ok());
        }
        let refused = entry
            .queue(0, submission(&dropped))
            .expect_err("the queue is full");
        assert_eq!(refused.error.kind, ErrorKind::Unavailable);
        assert!(
            refused.error.message.contains("server overloaded"),
            "{}",
            refused.error.message
        );
        // Given back, not dropped: the caller decides what dropping means.
        assert_eq!(dropped.load(Ordering::Relaxed), 0);
        drop(refused);
        assert_eq!(dropped.load(Ordering::Relaxed), 1);

        // The shard gone (its drainer dropped unrun): refused as stopping,
        // and what was queued is dropped, so its callers hear of it.
        drop(shard_side);
        let refused = entry
            .queue(0, submission(&dropped))
            .expect_err("the shard is gone");
        assert_eq!(refused.error.kind, ErrorKind::Unavailable);
        assert!(
            refused.error.message.contains("shutting down"),
            "{}",
            refused.error.message
        );
        assert_eq!(dropped.load(Ordering::Relaxed), 1 + THREAD_QUEUE_CAPACITY);
        assert!(entry.queue(1, submission(&dropped)).is_err(), "no shard 1");
    }
}
