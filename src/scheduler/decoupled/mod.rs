//! Decoupled models (`model_transaction_policy { decoupled: true }`): a
//! request gets zero, one or many responses, then a final flag, whenever
//! the backend sends them (also after its `execute_decoupled` returned),
//! interleaved with other requests' responses.
//!
//! This module is the entry side: [`infer_stream`], the stream it returns
//! and the front ends' refusals. `execute` is the execution side, on the
//! instance's thread.
//!
//! Path of a decoupled request: `infer_stream` validates and queues it
//! like any request, but its `Job` carries the sending half of a bounded
//! channel (one per request: the non-decoupled path stays lock-free and
//! channel-free). The executor wraps that sender in a `ChannelSink` and
//! hands the backend a `ResponseSender`; each response is built (requested
//! outputs, reshape) where it is produced and pushed into the channel,
//! blocking the producing thread while the channel is full, so a fast
//! model cannot outrun a slow client without bound. The final flag (or an
//! error) goes through the job's ordinary `reply` oneshot after the
//! channel is closed, so the receiver always sees it last.
//!
//! Cancellation: dropping the stream drops the receiver; the backend's
//! next `send` fails (`ReceiverGone`) and `is_cancelled` turns true, so a
//! model mid-way through many responses stops, and queued requests of the
//! stream leave their queue unexecuted.
//!
//! Statistics, as Triton counts decoupled requests: one success (or
//! failure) per request when its final flag arrives, on the receiving
//! shard; one execution per `execute_decoupled` call, its duration being
//! the call's (responses sent later are not part of it).

mod execute;

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use futures::{
    channel::{mpsc, oneshot},
    Stream, StreamExt,
};

pub(super) use execute::{run_decoupled, ChannelSink, ResponseTx};

use super::dispatch::{infer, scheduler_gone, submit, Outcome, Submitted};
use crate::{
    config::is_decoupled,
    model::ModelVersion,
    shard,
    types::{InferError, InferRequest, InferResponse, InferResult},
};

/// Responses a decoupled request may have waiting for its client before
/// the backend's `send` blocks.
const CHANNEL_CAPACITY: usize = 16;

/// Triton's refusal of a decoupled model on unary gRPC `ModelInfer`.
pub const DECOUPLED_ON_MODEL_INFER: &str =
    "ModelInfer RPC doesn't support models with decoupled transaction policy";
/// Triton's refusal of a decoupled model on HTTP `/infer`.
pub const DECOUPLED_ON_HTTP_INFER: &str =
    "HTTP end point doesn't support models with decoupled transaction policy";

/// HTTP `/infer`'s refusal of a decoupled model, in Triton's words (501).
pub fn refuse_decoupled_http(model: &ModelVersion) -> InferResult<()> {
    if is_decoupled(&model.config) {
        return Err(InferError::unsupported(DECOUPLED_ON_HTTP_INFER));
    }
    Ok(())
}

/// One item of a request's response stream.
#[derive(Debug)]
pub enum Streamed {
    /// A response with outputs; `last` when it is also the request's final
    /// one (a non-decoupled model's only response).
    Response { response: InferResponse, last: bool },
    /// A decoupled request's final flag: names and id, no outputs.
    Final(InferResponse),
}

pub type ResponseStream = Pin<Box<dyn Stream<Item = InferResult<Streamed>> + Send>>;

/// Any model's responses to `request` as a stream, ending after the final
/// one (or an error, always the last item). A non-decoupled model gives
/// one `Response { last: true }`. The request is validated and queued on
/// the stream's first poll, so callers keep their order by polling each
/// stream once as they create it. Dropping the stream cancels the request.
/// For a decoupled model the server's request timeout (and the request's
/// own `timeout` parameter) bound only its wait in the queue, as Triton
/// applies request timeouts: once it runs, its stream lasts as long as its
/// model keeps answering.
pub fn infer_stream(request: InferRequest) -> ResponseStream {
    let decoupled = shard::with_current(|s| {
        s.with_table(|table| {
            table
                .resolve(&request.model_name, &request.model_version)
                .is_ok_and(|m| is_decoupled(&m.config))
        })
    })
    .unwrap_or(false);
    if !decoupled {
        return Box::pin(futures::stream::once(async move {
            infer(request).await.map(|response| Streamed::Response {
                response,
                last: true,
            })
        }));
    }
    let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
    Box::pin(DecoupledStream {
        starting: Some(Box::pin(submit(request, Some(tx)))),
        responses: Some(rx),
        last: None,
    })
}

type Starting = Pin<Box<dyn Future<Output = InferResult<Submitted>> + Send>>;

struct DecoupledStream {
    /// Validating and queueing (may wait for room in a full ring).
    starting: Option<Starting>,
    /// Open until the backend sent its last response.
    responses: Option<mpsc::Receiver<InferResponse>>,
    /// The final flag or error, and the request's outcome to record.
    last: Option<(oneshot::Receiver<InferResult<InferResponse>>, Outcome)>,
}

impl Stream for DecoupledStream {
    type Item = InferResult<Streamed>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(starting) = &mut this.starting {
            let Poll::Ready(started) = starting.as_mut().poll(cx) else {
                return Poll::Pending;
            };
            this.starting = None;
            match started {
                Ok(s) => this.last = Some((s.answer, s.outcome)),
                Err(e) => {
                    this.responses = None;
                    return Poll::Ready(Some(Err(e)));
                }
            }
        }
        if let Some(rx) = &mut this.responses {
            match rx.poll_next_unpin(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(response)) => {
                    return Poll::Ready(Some(Ok(Streamed::Response {
                        response,
                        last: false,
                    })))
                }
                // Closed: only the final flag (or error) is left.
                Poll::Ready(None) => this.responses = None,
            }
        }
        let Some((answer, _)) = &mut this.last else {
            return Poll::Ready(None);
        };
        let Poll::Ready(result) = Pin::new(answer).poll(cx) else {
            return Poll::Pending;
        };
        let result = result.unwrap_or_else(|_| Err(scheduler_gone()));
        if let Some((_, mut outcome)) = this.last.take() {
            outcome.record(result.as_ref().map(|_| ()));
        }
        Poll::Ready(Some(result.map(Streamed::Final)))
    }
}
