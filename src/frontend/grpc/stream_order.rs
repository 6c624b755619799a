//! The answers in flight on one `ModelStreamInfer` call, yielded as they
//! complete, except that the answers of one sequence keep the order their
//! requests were read in.
//!
//! The sequence batcher runs a sequence's requests one after another, so
//! their answers complete in order; but a set of streams polled together
//! (`SelectAll`) yields ready items in the order it queued them for
//! polling, not in the order they became ready, so two answers of one
//! sequence that both complete before the call is polled again could go
//! out swapped. Here only the first unfinished answer of each sequence is
//! in the polled set; the later ones wait behind it (already dispatched,
//! so queued at their scheduler in order) and enter the set as it ends.
//! Answers of different sequences, and requests outside any sequence,
//! still go out in completion order.

use std::{
    collections::{HashMap, VecDeque},
    hash::Hash,
    pin::Pin,
    task::{Context, Poll},
};

use futures::{
    stream::{self, SelectAll},
    Stream, StreamExt,
};

/// One request's answer: the responses it sends.
pub type Answer<T> = Pin<Box<dyn Stream<Item = T> + Send>>;

enum Event<K, T> {
    Item(T),
    /// The answer of a request of sequence `K` has no more items.
    Ended(K),
}

type Tracked<K, T> = Pin<Box<dyn Stream<Item = Event<K, T>> + Send>>;

pub struct OrderedAnswers<K, T> {
    in_flight: SelectAll<Tracked<K, T>>,
    /// Sequences with an answer in `in_flight`, each with the answers of
    /// its later requests waiting behind it.
    sequences: HashMap<K, VecDeque<Tracked<K, T>>>,
    /// Answers held in `sequences`.
    waiting: usize,
}

impl<K, T> OrderedAnswers<K, T>
where
    K: Hash + Eq + Clone + Send + 'static,
    T: Send + 'static,
{
    pub fn new() -> Self {
        Self {
            in_flight: SelectAll::new(),
            sequences: HashMap::new(),
            waiting: 0,
        }
    }

    /// Answers not yet finished.
    pub fn len(&self) -> usize {
        self.in_flight.len() + self.waiting
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every answer (which cancels what they still had queued).
    pub fn clear(&mut self) {
        self.in_flight = SelectAll::new();
        self.sequences.clear();
        self.waiting = 0;
    }

    /// Adds a dispatched request's answer. `first` is a response its
    /// first poll already produced: it is handed back when it may be sent
    /// at once, and otherwise kept in front of the rest of the answer,
    /// behind the earlier answers of its sequence.
    pub fn push(&mut self, sequence: Option<K>, first: Option<T>, answer: Answer<T>) -> Option<T> {
        let Some(key) = sequence else {
            self.in_flight.push(Box::pin(answer.map(Event::Item)));
            return first;
        };
        if let Some(waiting) = self.sequences.get_mut(&key) {
            let whole = Box::pin(stream::iter(first).chain(answer));
            waiting.push_back(in_sequence(whole, key));
            self.waiting += 1;
            return None;
        }
        self.sequences.insert(key.clone(), VecDeque::new());
        self.in_flight.push(in_sequence(answer, key));
        first
    }

    /// Polls the answers the set has not polled yet (those just pushed),
    /// moving what is ready to `out`. An answer's first poll, made before
    /// `push`, registered the caller's wake-up, not the set's: until the
    /// set polls it, it waits in the set's queue in push order, so answers
    /// completing before then would leave in push order, not completion
    /// order (a sequence's END and the backlogged START it let in, run
    /// back to back, went out START first). Call after each `push`.
    pub fn settle(&mut self, cx: &mut Context<'_>, out: &mut VecDeque<T>) {
        while let Poll::Ready(Some(item)) = self.poll_next(cx) {
            out.push_back(item);
        }
    }

    /// The next response ready to send. `Ready(None)`: nothing is in
    /// flight (the last answers ended with no more items).
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        loop {
            match self.in_flight.poll_next_unpin(cx) {
                Poll::Ready(Some(Event::Item(item))) => return Poll::Ready(Some(item)),
                Poll::Ready(Some(Event::Ended(key))) => self.next_of(&key),
                Poll::Ready(None) => return Poll::Ready(None),
                // Registered the wake-ups of every answer in the set;
                // waiting answers woke the call when they were dispatched
                // and are polled once they enter the set.
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn next_of(&mut self, key: &K) {
        let Some(waiting) = self.sequences.get_mut(key) else {
            return;
        };
        match waiting.pop_front() {
            Some(next) => {
                self.waiting -= 1;
                self.in_flight.push(next);
            }
            None => {
                self.sequences.remove(key);
            }
        }
    }
}

fn in_sequence<K, T>(answer: Answer<T>, key: K) -> Tracked<K, T>
where
    K: Send + 'static,
    T: Send + 'static,
{
    Box::pin(
        answer
            .map(Event::Item)
            .chain(stream::once(std::future::ready(Event::Ended(key)))),
    )
}

#[cfg(test)]
mod tests {
    use std::task::Waker;

    use futures::channel::oneshot;

    use super::*;

    /// An answer that yields `value` when its sender fires.
    fn answer(value: u32) -> (oneshot::Sender<()>, Answer<u32>) {
        let (tx, rx) = oneshot::channel::<()>();
        let stream = stream::once(async move {
            let _ = rx.await;
            value
        });
        (tx, Box::pin(stream))
    }

    fn drain(set: &mut OrderedAnswers<&'static str, u32>) -> Vec<u32> {
        let mut cx = Context::from_waker(Waker::noop());
        let mut out = Vec::new();
        while let Poll::Ready(Some(v)) = set.poll_next(&mut cx) {
            out.push(v);
        }
        out
    }

    #[test]
    fn a_sequence_keeps_read_order_when_later_answers_complete_first() {
        let mut set = OrderedAnswers::new();
        let mut senders = Vec::new();
        for v in [1, 2, 3] {
            let (tx, a) = answer(v);
            assert_eq!(set.push(Some("s"), None, a), None);
            senders.push(tx);
        }
        assert_eq!(drain(&mut set), Vec::<u32>::new());
        // All three complete, last first, before the call is polled.
        for tx in senders.into_iter().rev() {
            tx.send(()).expect("receiver alive");
        }
        assert_eq!(drain(&mut set), vec![1, 2, 3]);
        assert_eq!(set.len(), 0);
    }

    #[test]
    fn answers_settled_after_push_leave_in_completion_order() {
        let mut cx = Context::from_waker(Waker::noop());
        let mut set = OrderedAnswers::new();
        let mut out = VecDeque::new();
        let (first_tx, first) = answer(1);
        let (second_tx, second) = answer(2);
        set.push(Some("a"), None, first);
        set.settle(&mut cx, &mut out);
        set.push(Some("b"), None, second);
        set.settle(&mut cx, &mut out);
        assert!(out.is_empty());
        // Both complete before the set is polled again, the later-pushed
        // one first.
        second_tx.send(()).expect("receiver alive");
        first_tx.send(()).expect("receiver alive");
        assert_eq!(drain(&mut set), vec![2, 1]);
    }

    #[test]
    fn other_sequences_and_plain_requests_are_not_held_back() {
        let mut set = OrderedAnswers::new();
        let (a1, first_a) = answer(1);
        let (_a2, second_a) = answer(2);
        let (b1, first_b) = answer(10);
        let (p, plain) = answer(100);
        set.push(Some("a"), None, first_a);
        set.push(Some("a"), None, second_a);
        set.push(Some("b"), None, first_b);
        set.push(None, None, plain);
        assert_eq!(set.len(), 4);
        b1.send(()).expect("receiver alive");
        p.send(()).expect("receiver alive");
        let mut got = drain(&mut set);
        got.sort_unstable();
        assert_eq!(got, vec![10, 100], "a's answers are still running");
        a1.send(()).expect("receiver alive");
        assert_eq!(drain(&mut set), vec![1]);
        assert_eq!(set.len(), 1);
    }

    #[test]
    fn an_immediate_first_response_waits_behind_its_sequence() {
        let mut set = OrderedAnswers::new();
        let (a1, first) = answer(1);
        set.push(Some("a"), None, first);
        // The second request answered on its first poll (e.g. a response
        // produced inline); it must not overtake the first.
        let rest: Answer<u32> = Box::pin(stream::empty());
        assert_eq!(set.push(Some("a"), Some(2), rest), None);
        // With no earlier answer in flight it may go at once.
        let rest: Answer<u32> = Box::pin(stream::empty());
        assert_eq!(set.push(Some("c"), Some(7), rest), Some(7));
        a1.send(()).expect("receiver alive");
        assert_eq!(drain(&mut set), vec![1, 2]);
    }

    #[test]
    fn clear_drops_waiting_answers() {
        let mut set = OrderedAnswers::new();
        let (_a1, first) = answer(1);
        let (_a2, second) = answer(2);
        set.push(Some("a"), None, first);
        set.push(Some("a"), None, second);
        assert_eq!(set.len(), 2);
        set.clear();
        assert_eq!(set.len(), 0);
        let mut cx = Context::from_waker(Waker::noop());
        assert_eq!(set.poll_next(&mut cx), Poll::Ready(None));
    }
}
