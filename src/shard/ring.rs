//! The ring mesh: one bounded single-producer single-consumer ring per
//! ordered pair of shards, plus one doorbell per shard that wakes its
//! drainer when something lands in any of its incoming rings.
//!
//! Generic over the message so it can be benchmarked and tested alone.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    task::{Context, Poll},
};

use futures::task::AtomicWaker;

pub type ShardId = usize;

/// Wakes a shard's drainer task from any thread. Waking works across
/// threads because monoio is built with its `sync` feature: a foreign wake
/// goes to the owner's remote queue and unparks its driver (eventfd).
/// Padded: the doorbells sit side by side in one array, and a shard
/// re-registering on its own must not slow a peer ringing another.
#[derive(Default)]
#[repr(align(128))]
pub struct Doorbell {
    waker: AtomicWaker,
    /// Set after each ring: a spinning owner, whose runtime takes foreign
    /// wakes only when it parks, checks it to let that park happen.
    rung: AtomicBool,
}

impl Doorbell {
    pub fn ring(&self) {
        self.waker.wake();
        self.rung.store(true, Ordering::Release);
    }
}

/// Tells a shard whether its doorbell rang since it last asked.
pub struct DoorbellWatch {
    me: ShardId,
    doorbells: Arc<[Doorbell]>,
}

impl DoorbellWatch {
    pub fn take_rung(&self) -> bool {
        self.doorbells.get(self.me).is_some_and(|d| {
            d.rung.load(Ordering::Relaxed) && d.rung.swap(false, Ordering::Acquire)
        })
    }
}

/// The sending half a shard owns: a producer towards every other shard.
pub struct Outbox<T> {
    me: ShardId,
    producers: Vec<Option<rtrb::Producer<T>>>,
    doorbells: Arc<[Doorbell]>,
}

impl<T> Outbox<T> {
    pub fn shard(&self) -> ShardId {
        self.me
    }

    /// Pushes `msg` towards shard `to` and rings its doorbell. A full ring
    /// (or a send to oneself, which has no ring) hands the message back:
    /// that is the back-pressure signal.
    pub fn send(&mut self, to: ShardId, msg: T) -> Result<(), T> {
        let Some(Some(producer)) = self.producers.get_mut(to) else {
            return Err(msg);
        };
        match producer.push(msg) {
            Ok(()) => {
                self.doorbells[to].ring();
                Ok(())
            }
            Err(rtrb::PushError::Full(msg)) => Err(msg),
        }
    }

    /// Messages currently queued towards `to` (for occupancy gauges).
    pub fn occupancy(&self, to: ShardId) -> usize {
        self.producers
            .get(to)
            .and_then(Option::as_ref)
            .map_or(0, |p| p.buffer().capacity() - p.slots())
    }
}

/// The receiving half a shard owns: a consumer from every other shard.
pub struct Inbox<T> {
    me: ShardId,
    consumers: Vec<rtrb::Consumer<T>>,
    doorbells: Arc<[Doorbell]>,
}

impl<T> Inbox<T> {
    /// A watch on this shard's doorbell, for its spinner.
    pub fn doorbell_watch(&self) -> DoorbellWatch {
        DoorbellWatch {
            me: self.me,
            doorbells: self.doorbells.clone(),
        }
    }

    /// Takes every message currently queued, calling `f` for each; returns
    /// how many were taken. Bounded per ring so one busy peer cannot starve
    /// the others.
    pub fn drain(&mut self, mut f: impl FnMut(T)) -> usize {
        let mut taken = 0;
        for consumer in &mut self.consumers {
            let ready = consumer.slots();
            for _ in 0..ready {
                match consumer.pop() {
                    Ok(msg) => {
                        f(msg);
                        taken += 1;
                    }
                    Err(_) => break,
                }
            }
        }
        taken
    }

    /// Drains what is there; if nothing, registers for the doorbell and
    /// checks once more (closing the race with a producer that pushed just
    /// before registration).
    pub fn poll_drain(&mut self, cx: &mut Context<'_>, mut f: impl FnMut(T)) -> Poll<usize> {
        let n = self.drain(&mut f);
        if n > 0 {
            return Poll::Ready(n);
        }
        self.doorbells[self.me].waker.register(cx.waker());
        let n = self.drain(&mut f);
        if n > 0 {
            Poll::Ready(n)
        } else {
            Poll::Pending
        }
    }
}

/// Both halves for one shard.
pub struct ShardLinks<T> {
    pub outbox: Outbox<T>,
    pub inbox: Inbox<T>,
}

/// Builds the full mesh for `shards` shards, each ring holding `capacity`
/// messages. Element `i` belongs to shard `i`.
pub fn mesh<T>(shards: usize, capacity: usize) -> Vec<ShardLinks<T>> {
    let doorbells: Arc<[Doorbell]> = (0..shards).map(|_| Doorbell::default()).collect();
    let mut producers: Vec<Vec<Option<rtrb::Producer<T>>>> = (0..shards)
        .map(|_| (0..shards).map(|_| None).collect())
        .collect();
    let mut consumers: Vec<Vec<rtrb::Consumer<T>>> = (0..shards).map(|_| Vec::new()).collect();
    for (from, row) in producers.iter_mut().enumerate() {
        for (to, slot) in row.iter_mut().enumerate() {
            if from == to {
                continue;
            }
            let (p, c) = rtrb::RingBuffer::new(capacity.max(1));
            *slot = Some(p);
            consumers[to].push(c);
        }
    }
    producers
        .into_iter()
        .zip(consumers)
        .enumerate()
        .map(|(me, (producers, consumers))| ShardLinks {
            outbox: Outbox {
                me,
                producers,
                doorbells: doorbells.clone(),
            },
            inbox: Inbox {
                me,
                consumers,
                doorbells: doorbells.clone(),
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doorbells_do_not_share_lines() {
        assert!(std::mem::align_of::<Doorbell>() >= crate::padded::LINE);
    }

    #[test]
    fn messages_arrive_in_order_from_each_peer() {
        let mut links = mesh::<u32>(3, 4);
        let mut l2 = links.pop().unwrap();
        let mut l1 = links.pop().unwrap();
        let mut l0 = links.pop().unwrap();
        l0.outbox.send(2, 1).unwrap();
        l0.outbox.send(2, 2).unwrap();
        l1.outbox.send(2, 10).unwrap();
        let mut got = Vec::new();
        assert_eq!(l2.inbox.drain(|m| got.push(m)), 3);
        assert_eq!(got, vec![1, 2, 10]);
        assert_eq!(l1.inbox.drain(|_| {}), 0);
        assert_eq!(l0.inbox.drain(|_| {}), 0);
    }

    #[test]
    fn full_ring_hands_the_message_back() {
        let mut links = mesh::<u32>(2, 2);
        let l0 = &mut links[0];
        l0.outbox.send(1, 1).unwrap();
        l0.outbox.send(1, 2).unwrap();
        assert_eq!(l0.outbox.occupancy(1), 2);
        assert_eq!(l0.outbox.send(1, 3), Err(3));
        assert_eq!(l0.outbox.send(0, 4), Err(4), "no ring to oneself");
    }

    #[test]
    fn cross_thread_messages_are_all_delivered() {
        let mut links = mesh::<u64>(2, 64);
        let mut l1 = links.pop().unwrap();
        let mut l0 = links.pop().unwrap();
        let producer = std::thread::spawn(move || {
            for i in 0..10_000u64 {
                let mut m = i;
                loop {
                    match l0.outbox.send(1, m) {
                        Ok(()) => break,
                        Err(back) => {
                            m = back;
                            std::thread::yield_now();
                        }
                    }
                }
            }
        });
        let mut expected = 0u64;
        while expected < 10_000 {
            l1.inbox.drain(|m| {
                assert_eq!(m, expected);
                expected += 1;
            });
        }
        producer.join().unwrap();
    }
}
