//! `ModelStreamInfer`: every response of every request read from the
//! stream, sent as each is produced. A non-decoupled model gives one
//! response per request; a decoupled one zero or more, then a final flag
//! that is sent (as an empty response with `triton_final_response`) only
//! to a request that asked for `triton_enable_empty_final_response`, as
//! Triton does. Responses of one request keep their order; requests
//! interleave.
//!
//! Requests are decoded exactly as unary `ModelInfer` does (a plain
//! message read straight from its bytes, anything else by prost and the
//! conversion; the router hands the stream over with its messages as
//! bytes, `stream_route`) and dispatched
//! to the front ends' infer path (`frontend::core::infer::infer_stream`)
//! in the order they arrive (a stateful sequence depends on it): each
//! request's future is polled once as soon as it is read, which validates
//! and queues it, before the next message is read.
//! A request whose typed contents are decoded on the offload pool holds
//! back the messages behind it until it has been dispatched.
//!
//! At most [`MAX_IN_FLIGHT`] requests are in flight per stream; at the
//! bound the stream stops reading, so HTTP/2 flow control pushes back on
//! the client instead of the server buffering without limit.
//!
//! A request that fails is answered on the stream with `error_message`
//! (and its model, version and id), and the stream goes on. When the
//! client half-closes, what is in flight is answered and the stream ends
//! OK. When the inbound stream fails (reset, connection lost, a message
//! that cannot be read), the requests in flight are dropped, which
//! cancels their queued work. A reset response stream is dropped by hyper
//! with everything in it, to the same effect: a decoupled model's next
//! `send` fails and it stops working on the request.

use std::{
    cell::RefCell,
    collections::VecDeque,
    future::{poll_fn, Future},
    pin::{pin, Pin},
    task::{Context, Poll, Waker},
};

use bytes::Bytes;
use futures::{Stream, StreamExt};
use prost::Message as _;
use tonic::{Code, Status, Streaming};

use super::{
    request_wire::decode_plain,
    response_wire::ENABLE_EMPTY_FINAL_RESPONSE,
    service::{decode_infer_request, echoed_model_name},
    stream_answer::StreamAnswer,
    stream_order::OrderedAnswers,
};
use crate::{
    frontend::core::infer as core,
    proto::inference::{infer_parameter::ParameterChoice, ModelInferRequest},
    scheduler::Streamed,
    shard,
    types::{clip, clip_to, InferError, InferRequest, InferResponse, ParamValue, MESSAGE_BYTES},
};

/// Requests in flight on one stream (read, not yet answered) before it
/// stops reading.
pub const MAX_IN_FLIGHT: usize = 1024;

/// Messages read in one poll before the stream yields to the shard's
/// other tasks (a client with many buffered messages would otherwise hold
/// the shard for up to [`MAX_IN_FLIGHT`] decodes).
const READ_BUDGET: usize = 64;

/// The stream responses of one request.
type Answer = Pin<Box<dyn Stream<Item = StreamAnswer> + Send>>;
type Decoding = Pin<Box<dyn Future<Output = Result<InferRequest, InferError>> + Send>>;

/// The sequence a request belongs to on this stream, as the client named
/// it (model, version, `sequence_id`) rather than as its scheduler sees
/// it: a request with an id to a model without sequence batching is
/// merely kept in order with its like.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SequenceKey {
    model: String,
    version: String,
    id: SequenceId,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum SequenceId {
    Uint(u64),
    Str(String),
}

impl SequenceKey {
    fn of(request: &InferRequest) -> Option<Self> {
        let id = match request.parameters.get("sequence_id")? {
            ParamValue::Uint(0) | ParamValue::Int(0) => return None,
            ParamValue::Uint(v) => SequenceId::Uint(*v),
            // gRPC carries ids as int64: the same 64 bits, as the
            // sequence batcher reads them.
            ParamValue::Int(v) => SequenceId::Uint(*v as u64),
            ParamValue::String(s) if !s.is_empty() => SequenceId::Str(s.clone()),
            _ => return None,
        };
        Some(Self {
            model: request.model_name.clone(),
            version: request.model_version.clone(),
            id,
        })
    }
}

/// A stream's request messages: split from the body's frames by
/// `stream_route` itself, as bytes through tonic's decoder (where the
/// request is compressed), or decoded by tonic's generated service.
pub enum Inbound {
    Frames(super::stream_route::RequestMessages),
    Wire(Streaming<Bytes>),
    Proto(Streaming<ModelInferRequest>),
}

enum Message {
    Wire(Bytes),
    Proto(ModelInferRequest),
}

impl Inbound {
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Message, Status>>> {
        match self {
            Self::Frames(s) => s.poll_next(cx).map(|m| m.map(|m| m.map(Message::Wire))),
            Self::Wire(s) => s
                .poll_next_unpin(cx)
                .map(|m| m.map(|m| m.map(Message::Wire))),
            Self::Proto(s) => s
                .poll_next_unpin(cx)
                .map(|m| m.map(|m| m.map(Message::Proto))),
        }
    }
}

/// What a request's response needs from the request once it has been
/// consumed: who it was for, and whether it asked for the final flag.
struct Ticket {
    model_name: String,
    model_version: String,
    id: String,
    final_flag: bool,
}

impl Ticket {
    fn of(msg: &ModelInferRequest) -> Self {
        let final_flag = matches!(
            msg.parameters
                .get(ENABLE_EMPTY_FINAL_RESPONSE)
                .and_then(|p| p.parameter_choice.as_ref()),
            Some(ParameterChoice::BoolParam(true))
        );
        Self {
            model_name: echoed_model_name(&msg.model_name),
            model_version: clip(&msg.model_version).into_owned(),
            id: msg.id.clone(),
            final_flag,
        }
    }

    /// [`Ticket::of`] a request read straight from its message.
    fn of_request(request: &InferRequest) -> Self {
        Self {
            model_name: echoed_model_name(&request.model_name),
            model_version: clip(&request.model_version).into_owned(),
            id: request.id.clone(),
            final_flag: matches!(
                request.parameters.get(ENABLE_EMPTY_FINAL_RESPONSE),
                Some(ParamValue::Bool(true))
            ),
        }
    }

    /// What one item of a request's response stream sends to the client,
    /// if anything: a decoupled request's final flag only when the request
    /// asked for it.
    fn respond(&self, item: Result<Streamed, InferError>) -> Option<StreamAnswer> {
        match item {
            Ok(Streamed::Response { response, last }) => Some(self.answer(Ok(response), last)),
            Ok(Streamed::Final(response)) => {
                self.final_flag.then(|| self.answer(Ok(response), true))
            }
            Err(e) => Some(self.answer(Err(e), true)),
        }
    }

    /// `triton_final_response` is set to `last` where the request asked
    /// for it: always true for a non-decoupled model (one response per
    /// request); for a decoupled one, true only on the empty final
    /// response.
    fn answer(&self, result: Result<InferResponse, InferError>, last: bool) -> StreamAnswer {
        let final_flag = self.final_flag.then_some(last);
        match result {
            Ok(response) => StreamAnswer::Response {
                response,
                final_flag,
            },
            Err(e) => StreamAnswer::Failed {
                message: clip_to(&e.message, MESSAGE_BYTES).into_owned(),
                model_name: self.model_name.clone(),
                model_version: self.model_version.clone(),
                id: self.id.clone(),
                final_flag,
            },
        }
    }
}

/// Runs one decoded request through the core path, which resolves its
/// shared-memory regions and counts it in flight on the shard (graceful
/// shutdown waits for it) for as long as its responses flow.
fn run(ticket: Ticket, request: InferRequest) -> Answer {
    Box::pin(
        core::infer_stream(request, core::Protocol::Grpc)
            .filter_map(move |item| std::future::ready(ticket.respond(item))),
    )
}

/// The response stream of one `ModelStreamInfer` call.
pub struct InferStream {
    /// `None` once the client half-closed or the stream failed.
    inbound: Option<Inbound>,
    /// Why the inbound stream failed: the call's status, sent after the
    /// answers already known.
    failure: Option<Status>,
    /// A request being decoded off the shard; nothing behind it is read
    /// until it has been dispatched.
    decoding: Option<(Ticket, Decoding)>,
    in_flight: OrderedAnswers<SequenceKey, StreamAnswer>,
    /// Answers that are already known (failed decoding or validation),
    /// in arrival order.
    ready: VecDeque<StreamAnswer>,
    /// This stream's place among the shard's open streams woken at
    /// shutdown.
    watch: Option<usize>,
    /// `--grpc-header-forward-pattern`: the call's forwarded metadata,
    /// added to each of its requests.
    forwarded: Option<Result<crate::types::Parameters, InferError>>,
}

impl InferStream {
    pub fn new(
        inbound: Inbound,
        forwarded: Option<Result<crate::types::Parameters, InferError>>,
    ) -> Self {
        Self {
            forwarded,
            inbound: Some(inbound),
            failure: None,
            decoding: None,
            in_flight: OrderedAnswers::new(),
            ready: VecDeque::new(),
            watch: None,
        }
    }

    /// Requests read and not yet answered to the client.
    fn pending(&self) -> usize {
        self.in_flight.len() + self.ready.len() + usize::from(self.decoding.is_some())
    }

    /// Reads and dispatches requests while the bound allows and the
    /// inbound stream has messages ready.
    fn pump(&mut self, cx: &mut Context<'_>) {
        let mut budget = READ_BUDGET;
        loop {
            if let Some((_, decoding)) = &mut self.decoding {
                let Poll::Ready(decoded) = decoding.as_mut().poll(cx) else {
                    return;
                };
                if let Some((ticket, _)) = self.decoding.take() {
                    self.dispatch(ticket, decoded, cx);
                }
            }
            if self.pending() >= MAX_IN_FLIGHT {
                return;
            }
            let Some(inbound) = &mut self.inbound else {
                shutdown_watch::deregister(&mut self.watch);
                return;
            };
            if shutdown_watch::register(&mut self.watch, cx.waker()) {
                self.stop_for_shutdown();
                return;
            }
            if budget == 0 {
                // Polled again at once, after the shard's other tasks.
                cx.waker().wake_by_ref();
                return;
            }
            budget -= 1;
            match inbound.poll_next(cx) {
                Poll::Pending => return,
                Poll::Ready(Some(Ok(msg))) => self.accept(msg, cx),
                Poll::Ready(None) => self.inbound = None,
                Poll::Ready(Some(Err(status))) => self.fail(status),
            }
        }
    }

    /// Starts one request: read straight from its bytes if plain, else
    /// decoded by prost and converted now if small, or on the offload pool
    /// (holding back the messages behind it).
    fn accept(&mut self, msg: Message, cx: &mut Context<'_>) {
        let msg = match msg {
            Message::Proto(msg) => msg,
            Message::Wire(bytes) => {
                if let Some(request) = decode_plain(&bytes) {
                    self.dispatch(Ticket::of_request(&request), Ok(request), cx);
                    return;
                }
                match ModelInferRequest::decode(bytes) {
                    Ok(msg) => msg,
                    // tonic's codec's status for a message prost refuses.
                    Err(e) => return self.fail(Status::internal(e.to_string())),
                }
            }
        };
        let ticket = Ticket::of(&msg);
        let mut decoding: Decoding = Box::pin(decode_infer_request(msg));
        match decoding.as_mut().poll(cx) {
            Poll::Ready(decoded) => self.dispatch(ticket, decoded, cx),
            Poll::Pending => self.decoding = Some((ticket, decoding)),
        }
    }

    /// Sends a decoded request to its scheduler now: the first poll of
    /// `core::infer_stream` validates and queues it, so requests reach
    /// their schedulers in stream order.
    fn dispatch(
        &mut self,
        ticket: Ticket,
        decoded: Result<InferRequest, InferError>,
        cx: &mut Context<'_>,
    ) {
        let decoded = match (decoded, &self.forwarded) {
            (Ok(mut request), Some(forwarded)) => {
                super::service::merge_forwarded(&mut request, forwarded.clone()).map(|()| request)
            }
            (decoded, _) => decoded,
        };
        let request = match decoded {
            Ok(request) => request,
            Err(e) => {
                self.ready.push_back(ticket.answer(Err(e), true));
                return;
            }
        };
        let sequence = SequenceKey::of(&request);
        let mut answer = run(ticket, request);
        let first = match answer.as_mut().poll_next(cx) {
            // More may follow (a decoupled model).
            Poll::Ready(Some(response)) => Some(response),
            Poll::Ready(None) => return,
            Poll::Pending => None,
        };
        let now = self.in_flight.push(sequence, first, answer);
        self.ready.extend(now);
        self.in_flight.settle(cx, &mut self.ready);
    }

    /// Graceful shutdown: read nothing more, answer what is in flight (the
    /// shard waits for it), then end the call UNAVAILABLE, so that an idle
    /// stream does not hold its connection until the exit timeout and the
    /// client knows that what it sent after the last answer was not read.
    fn stop_for_shutdown(&mut self) {
        self.inbound = None;
        self.failure = Some(Status::unavailable(
            "the server is shutting down: requests on this stream after the last answer \
             were not read",
        ));
        shutdown_watch::deregister(&mut self.watch);
    }

    /// The inbound stream failed: whatever the cause (the client reset
    /// the stream or lost its connection, or sent a message that cannot
    /// be read: tonic's decoder cannot find the next message after that),
    /// the call is over, as gRPC ends a call whose message it cannot
    /// receive. What is in flight is dropped, which cancels its queued
    /// work; answers already known are still sent, then one error
    /// response and the status, for a client that is still there.
    fn fail(&mut self, status: Status) {
        tracing::debug!(code = ?status.code(), message = status.message(), "grpc: stream inbound failed");
        self.in_flight.clear();
        let status = match status.code() {
            // gRPC's code for a message over the limit (tonic says OUT_OF_RANGE).
            Code::OutOfRange | Code::ResourceExhausted => Status::new(
                Code::ResourceExhausted,
                format!(
                    "{} (the server's --grpc-max-message-size)",
                    status.message()
                ),
            ),
            _ => status,
        };
        let message = format!(
            "the stream's next request could not be read: {}; the stream ends and its \
             requests in flight are cancelled",
            status.message()
        );
        self.ready.push_back(StreamAnswer::Broken(
            clip_to(&message, MESSAGE_BYTES).into_owned(),
        ));
        self.inbound = None;
        self.failure = Some(status);
    }
}

impl Stream for InferStream {
    type Item = Result<StreamAnswer, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        this.pump(cx);
        if let Some(response) = this.ready.pop_front() {
            return Poll::Ready(Some(Ok(response)));
        }
        if !this.in_flight.is_empty() {
            return match this.in_flight.poll_next(cx) {
                Poll::Ready(Some(response)) => Poll::Ready(Some(Ok(response))),
                // Pending registered the wake-ups of every request in it.
                Poll::Pending => Poll::Pending,
                // The last requests ended with nothing more to send (a
                // final flag nobody asked for): look again at once, with
                // nothing in flight.
                Poll::Ready(None) => {
                    cx.waker().wake_by_ref();
                    Poll::Pending
                }
            };
        }
        if this.decoding.is_some() {
            return Poll::Pending;
        }
        if this.inbound.is_some() {
            // `pump` left the inbound's wake-up registered.
            return Poll::Pending;
        }
        // Half-closed: the end, OK; failed: the status, then the end.
        Poll::Ready(this.failure.take().map(Err))
    }
}

impl Drop for InferStream {
    fn drop(&mut self) {
        shutdown_watch::deregister(&mut self.watch);
    }
}

/// Wakes a shard's open streams when its graceful shutdown begins: an idle
/// stream is polled by nothing else. One watcher task per shard, started
/// with its first stream, waits on the shard's shutdown latch (a single
/// waiter, however many streams come and go); streams register their
/// waker while they read, and remove it when they stop or are dropped.
mod shutdown_watch {
    use super::*;

    /// The shard's open streams by key, a key being an index: a stream
    /// registers on every read, so this is a slot lookup rather than a
    /// hashed one (SipHash here was 3 % of a small request's instructions
    /// on a stream).
    #[derive(Default)]
    struct Watch {
        watcher_started: bool,
        shutting_down: bool,
        streams: Vec<Option<Waker>>,
        /// Keys whose stream deregistered, for reuse.
        free: Vec<usize>,
    }

    thread_local! {
        static WATCH: RefCell<Watch> = RefCell::new(Watch::default());
    }

    /// Registers (or refreshes) a stream's waker; true once shutdown has
    /// begun on this shard.
    pub fn register(key: &mut Option<usize>, waker: &Waker) -> bool {
        let start = WATCH
            .try_with(|w| {
                let mut w = w.borrow_mut();
                let w = &mut *w;
                if w.shutting_down {
                    return Ok(true);
                }
                let k = *key.get_or_insert_with(|| {
                    w.free.pop().unwrap_or_else(|| {
                        w.streams.push(None);
                        w.streams.len() - 1
                    })
                });
                if let Some(slot) = w.streams.get_mut(k) {
                    match slot {
                        Some(old) if shard::same_task(old, waker) => {}
                        Some(old) => old.clone_from(waker),
                        None => *slot = Some(waker.clone()),
                    }
                }
                Err(!std::mem::replace(&mut w.watcher_started, true))
            })
            // The thread is exiting: nothing is served any more.
            .unwrap_or(Ok(true));
        match start {
            Ok(shutting_down) => shutting_down,
            Err(start_watcher) => {
                if start_watcher {
                    monoio::spawn(watch_shutdown());
                }
                false
            }
        }
    }

    pub fn deregister(key: &mut Option<usize>) {
        if let Some(k) = key.take() {
            let _ = WATCH.try_with(|w| {
                let mut w = w.borrow_mut();
                // Gone after shutdown took every waker: nothing to free.
                if w.streams.get_mut(k).and_then(Option::take).is_some() {
                    w.free.push(k);
                }
            });
        }
    }

    async fn watch_shutdown() {
        // Polls the latch through the thread-local shard each time: the
        // latch keeps this one task's waker, deduplicated.
        poll_fn(|cx| {
            shard::with_current(|s| pin!(s.shutdown.wait()).poll(cx)).unwrap_or(Poll::Ready(()))
        })
        .await;
        let streams = WATCH
            .try_with(|w| {
                let mut w = w.borrow_mut();
                w.shutting_down = true;
                w.free.clear();
                std::mem::take(&mut w.streams)
            })
            .unwrap_or_default();
        for waker in streams.into_iter().flatten() {
            waker.wake();
        }
    }
}
