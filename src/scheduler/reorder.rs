//! `preserve_ordering` across instances (the dynamic batcher's, and the
//! sequence batcher's `oldest` strategy's): responses leave in the order
//! their requests left the queue, even when a later batch finishes first
//! on another instance. With one priority level (which
//! `preserve_ordering` requires) that is the order the queue accepted
//! them.
//!
//! Instances answer their requests themselves, from compute worker
//! threads, so the scheduler never sees a completion. To order them the
//! scheduler swaps each dispatched job's answer channels for ones whose
//! receiving ends it hands, in dispatch order, to a forwarding task on the
//! owner shard. That task takes one request at a time: it forwards the
//! request's responses (a decoupled model's, as they come) and then its
//! final answer, and only then looks at the next request, whose answer
//! meanwhile waits in its oneshot. Nothing is shared across shards and no
//! lock is taken; models without `preserve_ordering`, or with a single
//! instance (ordered by construction), do not pay for any of it.
//!
//! Bounds: a later decoupled request's responses wait in its own bounded
//! channel, so its backend blocks in `send` once that is full, until the
//! requests before it are done (Triton buffers them without a bound).

use std::cell::RefCell;

use futures::{
    channel::{mpsc, oneshot},
    future::{select, Either},
    SinkExt, StreamExt,
};

use crate::{
    shard::ShardId,
    types::{InferError, InferResponse, InferResult},
};

// This stage imports nothing of the scheduler (its caller hands it the
// pieces of each job and the function that answers), so it adds no file
// to the scheduler's import circle.

/// Completes a request (a job's `reply`).
pub(super) type Responder = oneshot::Sender<InferResult<InferResponse>>;
/// Where a decoupled request's responses go (a job's `responses`).
pub(super) type ResponseTx = mpsc::Sender<InferResponse>;
/// Answers a request on the shard that decoded it (`host::reply`).
pub(super) type Reply = fn(ShardId, Responder, InferResult<InferResponse>);

/// Responses a held decoupled request may have waiting before its
/// backend's `send` blocks (the same bound as the client's own channel).
const HELD_RESPONSES: usize = 16;

/// The reorder stage of one scheduler (owner shard only).
pub(super) struct Reorder {
    tx: mpsc::UnboundedSender<Held>,
    rx: RefCell<Option<mpsc::UnboundedReceiver<Held>>>,
    reply: Reply,
}

/// One dispatched request whose answers are held until every request
/// dispatched before it has been answered.
struct Held {
    answer: oneshot::Receiver<InferResult<InferResponse>>,
    reply: Responder,
    origin: ShardId,
    /// A decoupled request's responses: what the instance sends, and where
    /// the client reads.
    responses: Option<(mpsc::Receiver<InferResponse>, ResponseTx)>,
    send: Reply,
}

impl Reorder {
    pub(super) fn new(reply: Reply) -> Self {
        let (tx, rx) = mpsc::unbounded();
        Self {
            tx,
            rx: RefCell::new(Some(rx)),
            reply,
        }
    }

    /// The forwarding task, to spawn on the owner shard (once).
    pub(super) fn forwarder(&self) -> Option<impl std::future::Future<Output = ()> + 'static> {
        let mut rx = self.rx.borrow_mut().take()?;
        Some(async move {
            while let Some(held) = rx.next().await {
                held.deliver().await;
            }
        })
    }

    /// No more requests: the forwarder ends once it has answered the held
    /// ones.
    pub(super) fn close(&self) {
        self.tx.close_channel();
    }

    /// Takes over the answers of one request (its `reply`, `origin` and a
    /// decoupled request's `responses`) as it goes to an instance on shard
    /// `owner`; call it in dispatch order.
    pub(super) fn hold(
        &self,
        reply: &mut Responder,
        origin: &mut ShardId,
        responses: &mut Option<ResponseTx>,
        owner: ShardId,
    ) {
        let (answer_tx, answer) = oneshot::channel();
        let held = Held {
            answer,
            reply: std::mem::replace(reply, answer_tx),
            origin: std::mem::replace(origin, owner),
            responses: responses.take().map(|client| {
                let (tx, rx) = mpsc::channel(HELD_RESPONSES);
                *responses = Some(tx);
                (rx, client)
            }),
            send: self.reply,
        };
        if let Err(e) = self.tx.unbounded_send(held) {
            // Only after `close`, when the scheduler no longer runs
            // batches: forward on a task of its own rather than lose the
            // request (dropping the handle detaches it).
            drop(monoio::spawn(e.into_inner().deliver()));
        }
    }
}

impl Held {
    /// Forwards this request's responses and final answer.
    async fn deliver(self) {
        let Held {
            answer,
            mut reply,
            origin,
            responses,
            send,
        } = self;
        if let Some((mut from, mut client)) = responses {
            while let Some(response) = from.next().await {
                if client.send(response).await.is_err() {
                    // The client went away: dropping `from` makes the
                    // backend's next `send` fail, which cancels the rest.
                    break;
                }
            }
        }
        let result = {
            let gone = reply.cancellation();
            futures::pin_mut!(gone);
            match select(answer, gone).await {
                Either::Left((answer, _)) => Some(answer.unwrap_or_else(|_| {
                    Err(InferError::unavailable(
                        "the model's scheduler stopped before answering (model unloaded or server shutting down)",
                    ))
                })),
                // The client stopped waiting; dropping `answer` lets the
                // instance see the request as cancelled.
                Either::Right(_) => None,
            }
        };
        if let Some(result) = result {
            send(origin, reply, result);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn direct(_: ShardId, reply: Responder, result: InferResult<InferResponse>) {
        let _ = reply.send(result);
    }

    struct Job {
        reply: Responder,
        origin: ShardId,
        responses: Option<ResponseTx>,
    }

    fn job() -> (Job, oneshot::Receiver<InferResult<InferResponse>>) {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            reply,
            origin: 3,
            responses: None,
        };
        (job, answer)
    }

    fn hold(reorder: &Reorder, job: &mut Job) {
        reorder.hold(&mut job.reply, &mut job.origin, &mut job.responses, 0);
        assert_eq!(job.origin, 0);
    }

    fn answered(id: &str) -> InferResult<InferResponse> {
        Ok(InferResponse {
            id: id.into(),
            ..Default::default()
        })
    }

    #[test]
    fn a_later_answer_waits_for_the_earlier_one() {
        use futures::{executor::LocalPool, task::LocalSpawnExt};
        let reorder = Reorder::new(direct);
        let (mut first, mut first_answer) = job();
        let (mut second, mut second_answer) = job();
        hold(&reorder, &mut first);
        hold(&reorder, &mut second);
        let mut pool = LocalPool::new();
        pool.spawner()
            .spawn_local(reorder.forwarder().expect("first call"))
            .expect("spawn");
        assert!(reorder.forwarder().is_none());
        // The second finishes first: held.
        second.reply.send(answered("second")).expect("send");
        pool.run_until_stalled();
        assert!(matches!(second_answer.try_recv(), Ok(None)));
        first.reply.send(answered("first")).expect("send");
        pool.run_until_stalled();
        let got = |r: Option<InferResult<InferResponse>>| r.expect("answered").expect("ok").id;
        assert_eq!(got(first_answer.try_recv().expect("open")), "first");
        assert_eq!(got(second_answer.try_recv().expect("open")), "second");
        reorder.close();
        pool.run();
    }

    #[test]
    fn decoupled_responses_follow_the_earlier_request() {
        use futures::{executor::LocalPool, task::LocalSpawnExt};
        let reorder = Reorder::new(direct);
        let (mut first, first_answer) = job();
        let (mut second, second_answer) = job();
        let (first_tx, mut first_rx) = mpsc::channel(4);
        let (second_tx, mut second_rx) = mpsc::channel(4);
        first.responses = Some(first_tx);
        second.responses = Some(second_tx);
        hold(&reorder, &mut first);
        hold(&reorder, &mut second);
        let mut pool = LocalPool::new();
        pool.spawner()
            .spawn_local(reorder.forwarder().expect("forwarder"))
            .expect("spawn");
        let mut to_second = second.responses.take().expect("held channel");
        to_second
            .try_send(InferResponse::default())
            .expect("room in the held channel");
        pool.run_until_stalled();
        assert!(second_rx.try_recv().is_err(), "held while the first runs");
        let mut to_first = first.responses.take().expect("held channel");
        to_first.try_send(InferResponse::default()).expect("room");
        pool.run_until_stalled();
        assert!(first_rx.try_recv().is_ok());
        drop(to_first);
        first.reply.send(answered("first")).expect("send");
        drop(to_second);
        second.reply.send(answered("second")).expect("send");
        pool.run_until_stalled();
        assert!(second_rx.try_recv().is_ok());
        drop((first_answer, second_answer));
        reorder.close();
        pool.run();
    }
}
