//! The sequence batcher's decision path (no I/O, no clock of its own):
//! which batch slot owns which sequence, the backlog of sequences waiting
//! for a slot, idle release, and which requests form the next execution
//! of an instance under the direct or oldest strategy.
//!
//! Slots are handed out lowest index first across instances (slot 0 of
//! every instance before any slot 1), as Triton does, so sequences spread
//! over instances.

use std::{
    cmp::Reverse,
    collections::{BinaryHeap, HashMap, VecDeque},
    time::{Duration, Instant},
};

use super::{correlation::CorrelationId, spec::Strategy};
use crate::{
    scheduler::dynamic_batcher::BatchScan,
    types::{clip, InferError},
};

/// One queued request of a sequence.
#[derive(Debug)]
pub struct Entry<T> {
    pub item: T,
    pub id: CorrelationId,
    pub start: bool,
    pub end: bool,
    pub enqueued: Instant,
}

/// One row of an execution: a request, or not-ready padding (direct
/// strategy: an empty slot below the highest ready one).
#[derive(Debug)]
pub struct Row<T> {
    pub slot: usize,
    pub entry: Option<Entry<T>>,
}

#[derive(Debug)]
pub enum SeqDecision<T> {
    Execute(Vec<Row<T>>),
    WaitUntil(Instant),
    Idle,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct SlotRef {
    instance: usize,
    index: usize,
}

#[derive(Debug)]
struct Slot<T> {
    owner: Option<CorrelationId>,
    queue: VecDeque<Entry<T>>,
    /// Oldest: a request of this slot is executing.
    busy: bool,
    /// Released for idleness: give the slot up once its queue is empty.
    closing: bool,
}

impl<T> Default for Slot<T> {
    fn default() -> Self {
        Self {
            owner: None,
            queue: VecDeque::new(),
            busy: false,
            closing: false,
        }
    }
}

#[derive(Debug)]
struct Backlog<T> {
    id: CorrelationId,
    queue: VecDeque<Entry<T>>,
}

/// Why a request was refused at enqueue.
#[derive(Debug)]
pub struct Refused<T> {
    pub item: T,
    pub error: InferError,
}

pub struct SequenceBatcher<T> {
    strategy: Strategy,
    max_batch: usize,
    idle: Duration,
    slots: Vec<Vec<Slot<T>>>,
    /// Slots of the batch each instance is executing (oldest).
    in_flight: Vec<Vec<usize>>,
    free: BinaryHeap<Reverse<(usize, usize)>>,
    active: HashMap<CorrelationId, SlotRef>,
    backlog_order: VecDeque<u64>,
    backlogs: HashMap<u64, Backlog<T>>,
    /// Backlogged sequences that have not seen their END yet.
    backlog_open: HashMap<CorrelationId, u64>,
    next_backlog: u64,
    last_seen: HashMap<CorrelationId, Instant>,
    /// Arrival times in order; stale entries (a later arrival of the same
    /// id) are skipped when they come up, so reaping is amortised O(1).
    idle_queue: VecDeque<(Instant, CorrelationId)>,
    queued: usize,
    max_queued: usize,
}

impl<T> SequenceBatcher<T> {
    /// `max_queued` bounds the requests waiting in slots and the backlog.
    pub fn new(
        strategy: Strategy,
        instances: usize,
        slots_per_instance: usize,
        max_batch: usize,
        idle: Duration,
        max_queued: usize,
    ) -> Self {
        let mut free = BinaryHeap::with_capacity(instances * slots_per_instance);
        for instance in 0..instances {
            for index in 0..slots_per_instance {
                free.push(Reverse((index, instance)));
            }
        }
        Self {
            strategy,
            max_batch: max_batch.max(1),
            idle,
            slots: (0..instances)
                .map(|_| (0..slots_per_instance).map(|_| Slot::default()).collect())
                .collect(),
            in_flight: vec![Vec::new(); instances],
            free,
            active: HashMap::new(),
            backlog_order: VecDeque::new(),
            backlogs: HashMap::new(),
            backlog_open: HashMap::new(),
            next_backlog: 0,
            last_seen: HashMap::new(),
            idle_queue: VecDeque::new(),
            queued: 0,
            max_queued,
        }
    }

    /// Requests waiting (in slots or the backlog), not executing.
    pub fn len(&self) -> usize {
        self.queued
    }

    pub fn is_empty(&self) -> bool {
        self.queued == 0
    }

    /// Sequences holding a slot, and sequences in the backlog.
    pub fn sequence_counts(&self) -> (usize, usize) {
        (self.active.len(), self.backlogs.len())
    }

    /// Routes a request to its sequence's slot or backlog, or refuses it
    /// (no START for an unknown sequence, queue full).
    pub fn enqueue(
        &mut self,
        entry: Entry<T>,
        model: &str,
        now: Instant,
    ) -> Result<(), Refused<T>> {
        if self.queued >= self.max_queued {
            let error = InferError::unavailable(format!(
                "Exceeds maximum queue size for model '{}': {} sequence requests are waiting",
                clip(model),
                self.queued
            ));
            return Err(Refused {
                item: entry.item,
                error,
            });
        }
        let id = entry.id.clone();
        if let Some(&r) = self.active.get(&id) {
            if entry.start {
                tracing::warn!(
                    model,
                    sequence = %id,
                    "sequence restarted before its END: the previous sequence ends early"
                );
            }
            self.slots[r.instance][r.index].queue.push_back(entry);
        } else if let Some(&key) = self.backlog_open.get(&id) {
            let end = entry.end;
            if let Some(b) = self.backlogs.get_mut(&key) {
                b.queue.push_back(entry);
            }
            if end {
                self.backlog_open.remove(&id);
            }
        } else if !entry.start {
            let error = InferError::invalid(format!(
                "inference request for sequence {id} to model '{}' must specify the START flag on the first request of the sequence",
                clip(model)
            ));
            return Err(Refused {
                item: entry.item,
                error,
            });
        } else if let Some(Reverse((index, instance))) = self.free.pop() {
            let r = SlotRef { instance, index };
            let slot = &mut self.slots[instance][index];
            slot.owner = Some(id.clone());
            slot.queue.push_back(entry);
            self.active.insert(id.clone(), r);
        } else {
            let key = self.next_backlog;
            self.next_backlog += 1;
            let end = entry.end;
            let mut queue = VecDeque::new();
            queue.push_back(entry);
            self.backlogs.insert(
                key,
                Backlog {
                    id: id.clone(),
                    queue,
                },
            );
            self.backlog_order.push_back(key);
            if !end {
                self.backlog_open.insert(id.clone(), key);
            }
        }
        self.queued += 1;
        self.last_seen.insert(id.clone(), now);
        self.idle_queue.push_back((now, id));
        Ok(())
    }

    /// Gives a slot up: to the rest of its queue (a sequence restarted
    /// behind its END), else to the oldest backlogged sequence, else free.
    fn release(&mut self, r: SlotRef) {
        let slot = &mut self.slots[r.instance][r.index];
        slot.closing = false;
        if let Some(owner) = slot.owner.take() {
            if self.active.get(&owner) == Some(&r) {
                self.active.remove(&owner);
            }
        }
        if let Some(front) = slot.queue.front() {
            let id = front.id.clone();
            slot.owner = Some(id.clone());
            self.active.insert(id, r);
            return;
        }
        while let Some(key) = self.backlog_order.pop_front() {
            let Some(b) = self.backlogs.remove(&key) else {
                continue;
            };
            let open = self.backlog_open.get(&b.id) == Some(&key);
            if open {
                self.backlog_open.remove(&b.id);
            } else if b.queue.is_empty() {
                // Ended and emptied (its requests were cancelled).
                continue;
            }
            let slot = &mut self.slots[r.instance][r.index];
            slot.queue = b.queue;
            slot.owner = Some(b.id.clone());
            // A sequence whose END already arrived is not routable any
            // more: a new START of its id must get a fresh slot.
            if open {
                self.active.insert(b.id, r);
            }
            return;
        }
        self.free.push(Reverse((r.index, r.instance)));
    }

    fn release_if_closing(&mut self, r: SlotRef) {
        let slot = &self.slots[r.instance][r.index];
        if slot.closing && slot.queue.is_empty() && !slot.busy {
            self.release(r);
        }
    }

    /// Releases sequences idle for longer than `max_sequence_idle`: their
    /// slot goes to the backlog once their queued requests ran; a later
    /// request without START fails. Returns when to look again.
    pub fn reap_idle(&mut self, now: Instant) -> Option<Instant> {
        while let Some((at, _)) = self.idle_queue.front() {
            if *at + self.idle > now {
                break;
            }
            let Some((at, id)) = self.idle_queue.pop_front() else {
                break;
            };
            if self.last_seen.get(&id) != Some(&at) {
                continue;
            }
            if let Some(r) = self.active.remove(&id) {
                self.last_seen.remove(&id);
                tracing::debug!(sequence = %id, "releasing an idle sequence");
                self.slots[r.instance][r.index].closing = true;
                self.release_if_closing(r);
            } else if let Some(&key) = self.backlog_open.get(&id) {
                let empty = self.backlogs.get(&key).is_none_or(|b| b.queue.is_empty());
                if empty {
                    // Idle in the backlog with nothing queued: forget it.
                    self.backlog_open.remove(&id);
                    self.backlogs.remove(&key);
                    self.last_seen.remove(&id);
                } else {
                    // Waiting for a slot is not idleness: look again later.
                    self.last_seen.insert(id.clone(), now);
                    self.idle_queue.push_back((now, id));
                }
            } else {
                self.last_seen.remove(&id);
            }
        }
        self.shrink();
        self.idle_queue.front().map(|(at, _)| *at + self.idle)
    }

    /// Returns memory after a burst of abandoned sequences.
    fn shrink(&mut self) {
        fn shrink_map<K: std::hash::Hash + Eq, V>(m: &mut HashMap<K, V>) {
            if m.capacity() > 1024 && m.len() * 4 < m.capacity() {
                m.shrink_to(m.len() * 2);
            }
        }
        shrink_map(&mut self.active);
        shrink_map(&mut self.backlogs);
        shrink_map(&mut self.backlog_open);
        shrink_map(&mut self.last_seen);
        if self.idle_queue.capacity() > 1024
            && self.idle_queue.len() * 4 < self.idle_queue.capacity()
        {
            self.idle_queue.shrink_to(self.idle_queue.len() * 2);
        }
        if self.backlog_order.capacity() > 1024
            && self.backlog_order.len() * 4 < self.backlog_order.capacity()
        {
            self.backlog_order.shrink_to(self.backlog_order.len() * 2);
        }
    }

    /// Removes queued requests `drop` selects (cancelled, timed out) and
    /// returns them.
    pub fn remove_where(&mut self, mut drop: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut removed = Vec::new();
        let mut closing = Vec::new();
        for (instance, slots) in self.slots.iter_mut().enumerate() {
            for (index, slot) in slots.iter_mut().enumerate() {
                if slot.queue.iter().any(|e| drop(&e.item)) {
                    let (gone, kept): (VecDeque<_>, VecDeque<_>) =
                        slot.queue.drain(..).partition(|e| drop(&e.item));
                    slot.queue = kept;
                    removed.extend(gone.into_iter().map(|e| e.item));
                    if slot.closing {
                        closing.push(SlotRef { instance, index });
                    }
                }
            }
        }
        for b in self.backlogs.values_mut() {
            if b.queue.iter().any(|e| drop(&e.item)) {
                let (gone, kept): (VecDeque<_>, VecDeque<_>) =
                    b.queue.drain(..).partition(|e| drop(&e.item));
                b.queue = kept;
                removed.extend(gone.into_iter().map(|e| e.item));
            }
        }
        // A closed backlog left empty is forgotten; an open one waits for
        // more of its requests (or its idle release).
        let open: std::collections::HashSet<u64> = self.backlog_open.values().copied().collect();
        self.backlogs
            .retain(|key, b| !b.queue.is_empty() || open.contains(key));
        for r in closing {
            self.release_if_closing(r);
        }
        self.queued -= removed.len();
        removed
    }

    /// Forms the next execution of `instance`, which is free. `flush`:
    /// shutting down, do not wait for a queue delay.
    pub fn next_batch(
        &mut self,
        instance: usize,
        now: Instant,
        flush: bool,
        compatible: impl Fn(&T, &T) -> bool,
    ) -> SeqDecision<T> {
        match self.strategy.clone() {
            Strategy::Direct {
                max_queue_delay,
                minimum_slot_utilization,
            } => self.next_direct(
                instance,
                now,
                flush,
                max_queue_delay,
                minimum_slot_utilization,
                compatible,
            ),
            Strategy::Oldest {
                preferred_batch_sizes,
                max_queue_delay,
                ..
            } => self.next_oldest(
                instance,
                now,
                flush,
                &preferred_batch_sizes,
                max_queue_delay,
                compatible,
            ),
        }
    }

    fn next_direct(
        &mut self,
        instance: usize,
        now: Instant,
        flush: bool,
        delay: Duration,
        utilization: f32,
        compatible: impl Fn(&T, &T) -> bool,
    ) -> SeqDecision<T> {
        let slots = &self.slots[instance];
        let mut highest = None;
        let mut ready = 0usize;
        let mut earliest: Option<Instant> = None;
        for (index, slot) in slots.iter().enumerate() {
            if let Some(front) = slot.queue.front() {
                highest = Some(index);
                ready += 1;
                earliest = Some(earliest.map_or(front.enqueued, |e| e.min(front.enqueued)));
            }
        }
        let (Some(highest), Some(earliest)) = (highest, earliest) else {
            return SeqDecision::Idle;
        };
        if !flush && !delay.is_zero() && utilization > 0.0 {
            let waited = now.saturating_duration_since(earliest);
            if waited < delay && (ready as f32 / self.max_batch as f32) < utilization {
                return SeqDecision::WaitUntil(earliest + delay);
            }
        }
        // The first ready request sets the shape every row must share; a
        // request that differs waits for a later execution (its row is
        // padding in this one), as in Triton without ragged batching.
        let take: Vec<bool> = {
            let slots = &self.slots[instance];
            let rep = slots.iter().position(|s| !s.queue.is_empty()).unwrap_or(0);
            (0..=highest)
                .map(|i| {
                    slots[i]
                        .queue
                        .front()
                        .is_some_and(|e| i == rep || compatible(&slots[rep].queue[0].item, &e.item))
                })
                .collect()
        };
        let mut rows = Vec::with_capacity(highest + 1);
        let mut ended = Vec::new();
        for (index, take) in take.into_iter().enumerate() {
            let entry = if take {
                self.slots[instance][index].queue.pop_front()
            } else {
                None
            };
            if entry.as_ref().is_some_and(|e| e.end) {
                ended.push(index);
            }
            rows.push(Row { slot: index, entry });
        }
        let taken = rows.iter().filter(|r| r.entry.is_some()).count();
        self.queued -= taken;
        for index in ended {
            self.release(SlotRef { instance, index });
        }
        for index in 0..=highest {
            self.release_if_closing(SlotRef { instance, index });
        }
        SeqDecision::Execute(rows)
    }

    fn next_oldest(
        &mut self,
        instance: usize,
        now: Instant,
        flush: bool,
        preferred: &[usize],
        delay: Duration,
        compatible: impl Fn(&T, &T) -> bool,
    ) -> SeqDecision<T> {
        let slots = &self.slots[instance];
        let mut candidates: Vec<(Instant, usize)> = slots
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.busy)
            .filter_map(|(i, s)| s.queue.front().map(|e| (e.enqueued, i)))
            .collect();
        if candidates.is_empty() {
            return SeqDecision::Idle;
        }
        candidates.sort_unstable();
        let oldest_time = candidates[0].0;
        // In arrival order, as Triton's dynamic batcher that runs this
        // strategy: requests join while they match the oldest one's shapes
        // and fit, and its preferred-size rules pick how many run now.
        let first = &slots[candidates[0].1].queue[0].item;
        let mut scan = BatchScan::new(
            self.max_batch as i64,
            preferred.last().map(|&p| p as i64),
            |rows| usize::try_from(rows).is_ok_and(|r| preferred.binary_search(&r).is_ok()),
        );
        let mut fit = Vec::with_capacity(candidates.len());
        for (n, &(_, index)) in candidates.iter().enumerate() {
            if !scan.offer(1, n == 0 || compatible(first, &slots[index].queue[0].item)) {
                break;
            }
            fit.push(index);
        }
        let size = if flush {
            fit.len()
        } else {
            match scan.take(now, oldest_time, delay) {
                Ok(size) => size,
                Err(until) => return SeqDecision::WaitUntil(until),
            }
        };
        let mut rows = Vec::with_capacity(size);
        let mut ended = Vec::new();
        for &index in fit.iter().take(size) {
            let slot = &mut self.slots[instance][index];
            let entry = slot.queue.pop_front();
            slot.busy = true;
            if entry.as_ref().is_some_and(|e| e.end) {
                ended.push(index);
            }
            self.in_flight[instance].push(index);
            rows.push(Row { slot: index, entry });
        }
        self.queued -= rows.len();
        for index in ended {
            // Released now (a backlogged sequence takes it), but its next
            // request waits until this one completes: the slot is busy.
            self.release(SlotRef { instance, index });
        }
        SeqDecision::Execute(rows)
    }

    /// `instance` finished its execution: its slots take new requests.
    pub fn completed(&mut self, instance: usize) {
        let done = std::mem::take(&mut self.in_flight[instance]);
        for index in done {
            self.slots[instance][index].busy = false;
            self.release_if_closing(SlotRef { instance, index });
        }
    }

    /// Every queued request (slots and backlog).
    pub fn items(&self) -> impl Iterator<Item = &T> {
        self.slots
            .iter()
            .flatten()
            .flat_map(|s| s.queue.iter())
            .chain(self.backlogs.values().flat_map(|b| b.queue.iter()))
            .map(|e| &e.item)
    }
}

#[cfg(test)]
#[path = "batcher_tests.rs"]
mod tests;
