//! The answers in flight on one `ModelStreamInfer` call, yielded in the
//! order they complete, except that the answers of one sequence keep the
//! order their requests were read in.
//!
//! Every answer is in one polled set (`SelectAll`) from the moment it is
//! dispatched, so the set's queue of woken answers is the order in which
//! they completed, whenever the call gets to poll it. The answers of a
//! sequence behind its first unfinished one (its head) are polled too, but
//! what they yield is held until every earlier answer of the sequence has
//! ended, then released ahead of anything completed later. Such a later
//! answer is polled only up to its first response: then the rest of it
//! waits outside the set, unpolled (so a decoupled model's responses stay
//! bounded by its channel, not by this call's memory), and re-enters the
//! set when the answer becomes its sequence's head.
//!
//! An answer's end is seen in the same poll as its last response (the
//! answer is polled once more after each response): otherwise the end of
//! a sequence's head would be queued behind answers that completed after
//! the next request of the sequence, and those would overtake it (a
//! sequence's END and the backlogged START it let in, both complete
//! before the call is polled, went out START first).

use std::{
    collections::{HashMap, VecDeque},
    hash::Hash,
    pin::Pin,
    task::{Context, Poll},
};

use futures::{stream::SelectAll, Stream, StreamExt};

/// One request's answer: the responses it sends.
pub type Answer<T> = Pin<Box<dyn Stream<Item = T> + Send>>;

enum Event<K, T> {
    /// A response of a request outside any sequence.
    Item(T),
    /// What one answer of sequence `key` yielded: a response, its end
    /// (after that response, or with none), or both; or, for an answer
    /// pushed behind others, its first response and the rest of it.
    InSequence {
        key: K,
        answer: u64,
        item: Option<T>,
        ended: bool,
        parked: Option<Parked<T>>,
    },
}

/// The rest of an answer taken out of the polled set after its first
/// response, with a response already read from it.
struct Parked<T> {
    peeked: Option<T>,
    rest: Answer<T>,
}

type Tracked<K, T> = Pin<Box<dyn Stream<Item = Event<K, T>> + Send>>;

/// An answer of a sequence that has not ended or whose responses are
/// still held behind an earlier answer.
struct Unfinished<T> {
    answer: u64,
    held: VecDeque<T>,
    ended: bool,
    parked: Option<Parked<T>>,
}

pub struct OrderedAnswers<K, T> {
    in_flight: SelectAll<Tracked<K, T>>,
    /// Each sequence's unfinished answers in read order; the front one's
    /// responses go out as they come.
    sequences: HashMap<K, VecDeque<Unfinished<T>>>,
    /// Responses of answers that just became their sequence's head.
    released: VecDeque<T>,
    /// Answers that ended with responses still held, or parked.
    held_out: usize,
    next_answer: u64,
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
            released: VecDeque::new(),
            held_out: 0,
            next_answer: 0,
        }
    }

    /// Answers not yet finished (a released response counts as one).
    pub fn len(&self) -> usize {
        self.in_flight.len() + self.held_out + self.released.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every answer (which cancels what they still had queued).
    pub fn clear(&mut self) {
        self.in_flight = SelectAll::new();
        self.sequences.clear();
        self.released.clear();
        self.held_out = 0;
    }

    /// Adds a dispatched request's answer. `first` is a response its
    /// first poll already produced: it is handed back when it may be sent
    /// at once, and otherwise held in front of the rest of the answer,
    /// behind the earlier answers of its sequence.
    pub fn push(&mut self, sequence: Option<K>, first: Option<T>, answer: Answer<T>) -> Option<T> {
        let Some(key) = sequence else {
            self.in_flight.push(Box::pin(answer.map(Event::Item)));
            return first;
        };
        let id = self.next_answer;
        self.next_answer += 1;
        let unfinished = self.sequences.entry(key.clone()).or_default();
        let head = unfinished.is_empty();
        let mut held = VecDeque::new();
        let now = if head {
            first
        } else {
            held.extend(first);
            None
        };
        unfinished.push_back(Unfinished {
            answer: id,
            held,
            ended: false,
            parked: None,
        });
        self.in_flight
            .push(Box::pin(InSequence::new(key, id, answer, None, !head)));
        now
    }

    /// Polls the answers the set has not polled yet (those just pushed),
    /// moving what is ready to `out`. An answer's first poll, made before
    /// `push`, registered the caller's wake-up, not the set's: until the
    /// set polls it, it waits in the set's queue in push order, so answers
    /// completing before then would leave in push order, not completion
    /// order. Call after each `push`.
    pub fn settle(&mut self, cx: &mut Context<'_>, out: &mut VecDeque<T>) {
        while let Poll::Ready(Some(item)) = self.poll_next(cx) {
            out.push_back(item);
        }
    }

    /// The next response ready to send. `Ready(None)`: nothing is in
    /// flight (the last answers ended with no more items).
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        loop {
            if let Some(item) = self.released.pop_front() {
                return Poll::Ready(Some(item));
            }
            match self.in_flight.poll_next_unpin(cx) {
                Poll::Ready(Some(Event::Item(item))) => return Poll::Ready(Some(item)),
                Poll::Ready(Some(Event::InSequence {
                    key,
                    answer,
                    item,
                    ended,
                    parked,
                })) => {
                    if let Some(item) = self.in_sequence(&key, answer, item, ended, parked) {
                        return Poll::Ready(Some(item));
                    }
                }
                // Every answer ended, so every sequence's held responses
                // were released (checked above).
                Poll::Ready(None) => return Poll::Ready(None),
                // Registered the wake-ups of every answer in the set.
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// Takes what an answer of `key` yielded: the response to send now,
    /// if it is the sequence's head's.
    fn in_sequence(
        &mut self,
        key: &K,
        answer: u64,
        item: Option<T>,
        ended: bool,
        parked: Option<Parked<T>>,
    ) -> Option<T> {
        let Some(unfinished) = self.sequences.get_mut(key) else {
            // Not tracked (cannot happen: cleared answers are dropped).
            return item;
        };
        if unfinished.front().is_some_and(|u| u.answer == answer) {
            if let Some(parked) = parked {
                // It became the head before its first response: back in.
                self.resume(key.clone(), answer, parked);
            } else if ended {
                unfinished.pop_front();
                self.promote(key);
            }
            // The head's response goes before those just released.
            return match item {
                Some(item) => Some(item),
                None => self.released.pop_front(),
            };
        }
        if let Some(u) = unfinished.iter_mut().find(|u| u.answer == answer) {
            u.held.extend(item);
            if (ended || parked.is_some()) && !u.ended && u.parked.is_none() {
                self.held_out += 1;
            }
            u.ended |= ended;
            u.parked = parked;
        }
        None
    }

    fn resume(&mut self, key: K, answer: u64, parked: Parked<T>) {
        let Parked { peeked, rest } = parked;
        self.in_flight
            .push(Box::pin(InSequence::new(key, answer, rest, peeked, false)));
    }

    /// The head of `key` ended: the next answers' held responses are
    /// released, up to the first one still running (the new head).
    fn promote(&mut self, key: &K) {
        let Some(unfinished) = self.sequences.get_mut(key) else {
            return;
        };
        while let Some(next) = unfinished.front_mut() {
            self.released.extend(next.held.drain(..));
            if next.ended || next.parked.is_some() {
                self.held_out -= 1;
            }
            if let Some(parked) = next.parked.take() {
                let answer = next.answer;
                self.resume(key.clone(), answer, parked);
                return;
            }
            if !next.ended {
                return;
            }
            unfinished.pop_front();
        }
        self.sequences.remove(key);
    }
}

/// One answer of a sequence, as events that report its end together with
/// its last response.
struct InSequence<K, T> {
    /// `None` once ended (or parked).
    answer: Option<Answer<T>>,
    /// A response read while looking for the end, yielded next.
    peeked: Option<T>,
    key: K,
    id: u64,
    /// Pushed behind others: after its first response, hand the rest over
    /// instead of being polled on.
    park: bool,
}

impl<K, T> InSequence<K, T> {
    fn new(key: K, id: u64, answer: Answer<T>, peeked: Option<T>, park: bool) -> Self {
        Self {
            answer: Some(answer),
            peeked,
            key,
            id,
            park,
        }
    }
}

// Nothing in it is pinned in place (the answer is boxed), whatever K and T.
impl<K, T> Unpin for InSequence<K, T> {}

impl<K: Clone, T> Stream for InSequence<K, T> {
    type Item = Event<K, T>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let Some(answer) = &mut this.answer else {
            return Poll::Ready(None);
        };
        let item = match this.peeked.take() {
            Some(item) => item,
            None => match answer.as_mut().poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(item)) => item,
                Poll::Ready(None) => {
                    this.answer = None;
                    return Poll::Ready(Some(this.event(None, true, None)));
                }
            },
        };
        let ended = match answer.as_mut().poll_next(cx) {
            Poll::Ready(None) => {
                this.answer = None;
                true
            }
            Poll::Ready(Some(next)) => {
                this.peeked = Some(next);
                false
            }
            Poll::Pending => false,
        };
        let parked = if this.park && !ended {
            this.answer.take().map(|rest| Parked {
                peeked: this.peeked.take(),
                rest,
            })
        } else {
            None
        };
        Poll::Ready(Some(this.event(Some(item), ended, parked)))
    }
}

impl<K: Clone, T> InSequence<K, T> {
    fn event(&self, item: Option<T>, ended: bool, parked: Option<Parked<T>>) -> Event<K, T> {
        Event::InSequence {
            key: self.key.clone(),
            answer: self.id,
            item,
            ended,
            parked,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::task::Waker;

    use futures::{channel::oneshot, stream};

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
    fn a_sequence_end_goes_before_a_later_completion_of_another_sequence() {
        let mut cx = Context::from_waker(Waker::noop());
        let mut set = OrderedAnswers::new();
        let mut out = VecDeque::new();
        // Sequence a: a START and its END; sequence b: a START that ran
        // after a's END (it took a's slot).
        let (a1, start_a) = answer(1);
        let (a2, end_a) = answer(2);
        let (b1, start_b) = answer(10);
        for (key, a) in [("a", start_a), ("a", end_a), ("b", start_b)] {
            assert_eq!(set.push(Some(key), None, a), None);
            set.settle(&mut cx, &mut out);
        }
        assert!(out.is_empty());
        // All three complete, in this order, before the call is polled.
        a1.send(()).expect("receiver alive");
        a2.send(()).expect("receiver alive");
        b1.send(()).expect("receiver alive");
        assert_eq!(drain(&mut set), vec![1, 2, 10]);
        assert!(set.is_empty());
    }

    #[test]
    fn held_responses_of_a_later_answer_count_until_released() {
        let mut set = OrderedAnswers::new();
        let (a1, first) = answer(1);
        set.push(Some("a"), None, first);
        // The second answer streams three responses and ends at once.
        let many: Answer<u32> = Box::pin(stream::iter([2, 3, 4]));
        assert_eq!(set.push(Some("a"), None, many), None);
        assert_eq!(drain(&mut set), Vec::<u32>::new());
        assert_eq!(set.len(), 2, "one running, one ended but held");
        a1.send(()).expect("receiver alive");
        assert_eq!(drain(&mut set), vec![1, 2, 3, 4]);
        assert!(set.is_empty());
        let mut cx = Context::from_waker(Waker::noop());
        assert_eq!(set.poll_next(&mut cx), Poll::Ready(None));
    }

    #[test]
    fn a_later_answer_is_read_only_to_its_first_response_until_it_is_the_head() {
        use std::sync::{
            atomic::{AtomicUsize, Ordering},
            Arc,
        };
        let mut set = OrderedAnswers::new();
        let (a1, first) = answer(1);
        set.push(Some("a"), None, first);
        // A decoupled answer behind it with many responses ready.
        let read = Arc::new(AtomicUsize::new(0));
        let counter = read.clone();
        let many: Answer<u32> = Box::pin(stream::iter(100..1100).inspect(move |_| {
            counter.fetch_add(1, Ordering::Relaxed);
        }));
        set.push(Some("a"), None, many);
        assert_eq!(drain(&mut set), Vec::<u32>::new());
        // Its first response and the one read looking for its end.
        assert_eq!(
            read.load(Ordering::Relaxed),
            2,
            "read past its first response"
        );
        assert_eq!(set.len(), 2);
        a1.send(()).expect("receiver alive");
        let got = drain(&mut set);
        assert_eq!(got[0], 1);
        assert_eq!(got[1..], (100..1100).collect::<Vec<_>>()[..]);
        assert!(set.is_empty());
    }

    #[test]
    fn a_parked_answer_that_became_the_head_goes_on() {
        let mut set = OrderedAnswers::new();
        let (a1, first) = answer(1);
        set.push(Some("a"), None, first);
        // Pushed behind a1, which ends before the second one's first
        // response: it parks at that response while already the head.
        let (tx, rx) = oneshot::channel::<()>();
        let later: Answer<u32> = Box::pin(
            stream::once(async move {
                let _ = rx.await;
                2
            })
            .chain(stream::iter([3, 4])),
        );
        set.push(Some("a"), None, later);
        a1.send(()).expect("receiver alive");
        assert_eq!(drain(&mut set), vec![1]);
        tx.send(()).expect("receiver alive");
        assert_eq!(drain(&mut set), vec![2, 3, 4]);
        assert!(set.is_empty());
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
