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

use super::{
    decoupled::ResponseTx, dispatch::scheduler_gone, execute::Batch, job::Responder,
    sequence::Strategy,
};
use crate::{
    model::ModelVersion,
    proto::inference::model_config::SchedulingChoice,
    shard::ShardId,
    types::{InferResponse, InferResult},
};

/// Responses a held decoupled request may have waiting before its
/// backend's `send` blocks (the same bound as the client's own channel).
const HELD_RESPONSES: usize = 16;

/// The reorder stage of one scheduler (owner shard only).
pub(super) struct Reorder {
    tx: mpsc::UnboundedSender<Held>,
    rx: RefCell<Option<mpsc::UnboundedReceiver<Held>>>,
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
}

/// Whether a model asks for its responses in queue order across more
/// than one instance.
pub(super) fn wanted(model: &ModelVersion) -> bool {
    if model.instances.len() < 2 {
        return false;
    }
    if let Some(spec) = &model.sequence {
        return matches!(
            spec.strategy,
            Strategy::Oldest {
                preserve_ordering: true,
                ..
            }
        );
    }
    matches!(
        &model.config.scheduling_choice,
        Some(SchedulingChoice::DynamicBatching(db)) if db.preserve_ordering
    )
}

impl Reorder {
    pub(super) fn new() -> Self {
        let (tx, rx) = mpsc::unbounded();
        Self {
            tx,
            rx: RefCell::new(Some(rx)),
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

    /// Takes over the answers of `batch`'s requests, in order, before the
    /// batch goes to an instance on shard `owner`.
    pub(super) fn hold(&self, batch: &mut Batch, owner: ShardId) {
        for job in &mut batch.jobs {
            let (answer_tx, answer) = oneshot::channel();
            let reply = std::mem::replace(&mut job.reply, answer_tx);
            let origin = std::mem::replace(&mut job.origin, owner);
            let responses = job.responses.take().map(|client| {
                let (tx, rx) = mpsc::channel(HELD_RESPONSES);
                job.responses = Some(tx);
                (rx, client)
            });
            let held = Held {
                answer,
                reply,
                origin,
                responses,
            };
            if let Err(e) = self.tx.unbounded_send(held) {
                // Only after `close`, when the scheduler no longer runs
                // batches: forward on a task of its own rather than lose
                // the request (dropping the handle detaches it).
                drop(monoio::spawn(e.into_inner().deliver()));
            }
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
                Either::Left((answer, _)) => Some(answer.unwrap_or_else(|_| Err(scheduler_gone()))),
                // The client stopped waiting; dropping `answer` lets the
                // instance see the request as cancelled.
                Either::Right(_) => None,
            }
        };
        if let Some(result) = result {
            super::host::reply(origin, reply, result);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use futures::{executor::LocalPool, task::LocalSpawnExt};

    use super::*;
    use crate::{scheduler::Job, types::InferRequest};

    fn job(id: &str) -> (Job, oneshot::Receiver<InferResult<InferResponse>>) {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            request: InferRequest {
                id: id.into(),
                ..Default::default()
            },
            reply,
            origin: 3,
            received: Instant::now(),
            deadline: None,
            sequence: None,
            responses: None,
        };
        (job, answer)
    }

    fn answered(id: &str) -> InferResult<InferResponse> {
        Ok(InferResponse {
            id: id.into(),
            ..Default::default()
        })
    }

    #[test]
    fn a_later_answer_waits_for_the_earlier_one() {
        let reorder = Reorder::new();
        let (first, mut first_answer) = job("first");
        let (second, mut second_answer) = job("second");
        let mut batch = Batch::from(vec![first, second]);
        reorder.hold(&mut batch, 0);
        assert!(batch.jobs.iter().all(|j| j.origin == 0));
        let mut pool = LocalPool::new();
        pool.spawner()
            .spawn_local(reorder.forwarder().expect("first call"))
            .expect("spawn");
        assert!(reorder.forwarder().is_none());
        let mut jobs = batch.jobs.into_iter();
        let (first, second) = (jobs.next().expect("first"), jobs.next().expect("second"));
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
        let reorder = Reorder::new();
        let (mut first, first_answer) = job("first");
        let (mut second, second_answer) = job("second");
        let (first_tx, mut first_rx) = mpsc::channel(4);
        let (second_tx, mut second_rx) = mpsc::channel(4);
        first.responses = Some(first_tx);
        second.responses = Some(second_tx);
        let mut batch = Batch::from(vec![first, second]);
        reorder.hold(&mut batch, 0);
        let mut pool = LocalPool::new();
        pool.spawner()
            .spawn_local(reorder.forwarder().expect("forwarder"))
            .expect("spawn");
        let mut jobs = batch.jobs.into_iter();
        let (mut first, mut second) = (jobs.next().expect("1"), jobs.next().expect("2"));
        let mut to_second = second.responses.take().expect("held channel");
        to_second
            .try_send(InferResponse::default())
            .expect("room in the held channel");
        pool.run_until_stalled();
        assert!(second_rx.try_next().is_err(), "held while the first runs");
        let mut to_first = first.responses.take().expect("held channel");
        to_first.try_send(InferResponse::default()).expect("room");
        pool.run_until_stalled();
        assert!(matches!(first_rx.try_next(), Ok(Some(_))));
        drop(to_first);
        first.reply.send(answered("first")).expect("send");
        drop(to_second);
        second.reply.send(answered("second")).expect("send");
        pool.run_until_stalled();
        assert!(matches!(second_rx.try_next(), Ok(Some(_))));
        drop((first_answer, second_answer));
        reorder.close();
        pool.run();
    }
}
