//! The dynamic batcher's decision path, free of I/O and time sources so it
//! can be tested and benchmarked alone: priority queues with timeouts,
//! and the choice of the next batch.

use std::{collections::VecDeque, time::Instant};

use super::policy::{BatcherPolicy, OnTimeout};

/// A queued item with what the batcher needs to know about it.
#[derive(Debug)]
pub struct Pending<T> {
    pub item: T,
    pub rows: i64,
    pub enqueued: Instant,
    /// The level's timeout (its own or the request's override): past it,
    /// the level's timeout action applies (reject or delay).
    pub deadline: Option<Instant>,
    /// Past this the item is rejected whatever its level's timeout action
    /// (a decoupled request's server-wide request timeout).
    pub cutoff: Option<Instant>,
}

/// What the instance should do next.
#[derive(Debug)]
pub enum Decision<T> {
    /// Execute these together (in this order).
    Execute(Vec<Pending<T>>),
    /// Nothing ready yet; decide again at this time or on a new arrival.
    WaitUntil(Instant),
    Idle,
}

#[derive(Debug)]
pub struct Level<T> {
    fresh: VecDeque<Pending<T>>,
    /// Timed-out requests of a DELAY level: served after every fresh one.
    delayed: VecDeque<Pending<T>>,
}

impl<T> Default for Level<T> {
    fn default() -> Self {
        Self {
            fresh: VecDeque::new(),
            delayed: VecDeque::new(),
        }
    }
}

impl<T> Level<T> {
    fn len(&self) -> usize {
        self.fresh.len() + self.delayed.len()
    }
    fn iter(&self) -> impl Iterator<Item = &Pending<T>> {
        self.fresh.iter().chain(self.delayed.iter())
    }
    fn pop_front(&mut self) -> Option<Pending<T>> {
        self.fresh.pop_front().or_else(|| self.delayed.pop_front())
    }
}

#[derive(Debug)]
pub struct BatchQueue<T> {
    policy: BatcherPolicy,
    levels: Vec<Level<T>>,
}

/// Why an item could not be queued.
#[derive(Debug)]
pub struct QueueFull<T>(pub T);

impl<T> BatchQueue<T> {
    pub fn new(policy: BatcherPolicy) -> Self {
        let levels = (0..policy.levels.len()).map(|_| Level::default()).collect();
        Self { policy, levels }
    }

    pub fn policy(&self) -> &BatcherPolicy {
        &self.policy
    }

    pub fn len(&self) -> usize {
        self.levels.iter().map(Level::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Queues at `level` (0-based); refused when that level is full.
    pub fn push(&mut self, level: usize, pending: Pending<T>) -> Result<(), QueueFull<T>> {
        let max = self.policy.levels[level].max_queue_size;
        if max > 0 && self.levels[level].len() >= max {
            return Err(QueueFull(pending.item));
        }
        self.levels[level].fresh.push_back(pending);
        Ok(())
    }

    /// Removes items whose deadline passed on REJECT levels (returned, to
    /// be answered with an error) and moves them behind the fresh ones on
    /// DELAY levels.
    pub fn expire(&mut self, now: Instant) -> Vec<T> {
        let mut rejected = Vec::new();
        for (level, policy) in self.levels.iter_mut().zip(&self.policy.levels) {
            for q in [&mut level.fresh, &mut level.delayed] {
                if q.iter().any(|p| p.cutoff.is_some_and(|d| d <= now)) {
                    let (cut, kept): (VecDeque<_>, VecDeque<_>) = q
                        .drain(..)
                        .partition(|p| p.cutoff.is_some_and(|d| d <= now));
                    *q = kept;
                    rejected.extend(cut.into_iter().map(|p| p.item));
                }
            }
            if !level
                .fresh
                .iter()
                .any(|p| p.deadline.is_some_and(|d| d <= now))
            {
                continue;
            }
            let (expired, kept): (VecDeque<_>, VecDeque<_>) = level
                .fresh
                .drain(..)
                .partition(|p| p.deadline.is_some_and(|d| d <= now));
            level.fresh = kept;
            match policy.on_timeout {
                OnTimeout::Reject => rejected.extend(expired.into_iter().map(|p| p.item)),
                OnTimeout::Delay => level.delayed.extend(expired.into_iter().map(|mut p| {
                    p.deadline = None;
                    p
                })),
            }
        }
        rejected
    }

    /// Removes every queued item for which `drop_it` holds (e.g. requests
    /// whose client went away) and returns them.
    pub fn remove_where(&mut self, drop_it: impl Fn(&T) -> bool) -> Vec<T> {
        let mut removed = Vec::new();
        for level in &mut self.levels {
            for q in [&mut level.fresh, &mut level.delayed] {
                if !q.iter().any(|p| drop_it(&p.item)) {
                    continue;
                }
                let (gone, kept): (VecDeque<_>, VecDeque<_>) =
                    q.drain(..).partition(|p| drop_it(&p.item));
                *q = kept;
                removed.extend(gone.into_iter().map(|p| p.item));
            }
        }
        removed
    }

    /// The next deadline among queued items (to wake up for expiry).
    pub fn next_deadline(&self) -> Option<Instant> {
        let deadlines = self
            .levels
            .iter()
            .flat_map(|l| l.fresh.iter())
            .filter_map(|p| p.deadline);
        let cutoffs = self
            .levels
            .iter()
            .flat_map(|l| l.iter())
            .filter_map(|p| p.cutoff);
        deadlines.chain(cutoffs).min()
    }

    /// Chooses the next batch. `compatible(head, other)` says whether
    /// `other` may join a batch started by `head`.
    pub fn decide(&mut self, now: Instant, compatible: impl Fn(&T, &T) -> bool) -> Decision<T> {
        let Some((level_idx, head)) = self
            .levels
            .iter()
            .enumerate()
            .find_map(|(i, l)| l.iter().next().map(|h| (i, h)))
        else {
            return Decision::Idle;
        };
        let max = self.policy.max_batch_size;
        // Candidates: the head's level in order, then lower levels, while
        // compatible and within max_batch_size.
        let mut rows = 0i64;
        let mut counts = Vec::new(); // (level, how many from its front)
        let mut blocked = false;
        'levels: for (li, level) in self.levels.iter().enumerate().skip(level_idx) {
            let mut taken = 0usize;
            for p in level.iter() {
                if rows + p.rows > max || !compatible(&head.item, &p.item) {
                    blocked = true;
                    if taken > 0 {
                        counts.push((li, taken));
                    }
                    break 'levels;
                }
                rows += p.rows;
                taken += 1;
            }
            if taken > 0 {
                counts.push((li, taken));
            }
        }
        let oldest = head.enqueued;
        let delay_over = now >= oldest + self.policy.max_queue_delay;
        let full = rows >= max || blocked;
        let preferred_hit = self.policy.preferred.contains(&rows);
        if !(full || preferred_hit || delay_over) {
            return Decision::WaitUntil(oldest + self.policy.max_queue_delay);
        }
        let mut take_rows = rows;
        if !full && !preferred_hit && !self.policy.preferred.is_empty() {
            // Delay expired: prefer the largest preferred size we can form
            // from a prefix; otherwise send everything.
            if let Some(p) = self.largest_preferred_prefix(&counts, rows) {
                take_rows = p;
            }
        }
        let mut batch = Vec::new();
        let mut acc = 0;
        for (li, n) in counts {
            for _ in 0..n {
                if acc >= take_rows {
                    break;
                }
                if let Some(p) = self.levels[li].pop_front() {
                    acc += p.rows;
                    batch.push(p);
                }
            }
        }
        Decision::Execute(batch)
    }

    fn largest_preferred_prefix(&self, counts: &[(usize, usize)], _rows: i64) -> Option<i64> {
        let mut prefix_sums = Vec::new();
        let mut acc = 0;
        for &(li, n) in counts {
            for p in self.levels[li].iter().take(n) {
                acc += p.rows;
                prefix_sums.push(acc);
            }
        }
        self.policy
            .preferred
            .iter()
            .rev()
            .find(|pref| prefix_sums.contains(pref))
            .copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::dynamic_batcher::policy::QueuePolicy;
    use std::time::Duration;

    fn policy(max: i64, preferred: &[i64], delay_us: u64, levels: usize) -> BatcherPolicy {
        BatcherPolicy {
            max_batch_size: max,
            preferred: preferred.to_vec(),
            max_queue_delay: Duration::from_micros(delay_us),
            preserve_ordering: false,
            levels: (0..levels)
                .map(|_| QueuePolicy {
                    on_timeout: OnTimeout::Reject,
                    default_timeout: None,
                    allow_timeout_override: true,
                    max_queue_size: 0,
                })
                .collect(),
            default_level: levels,
        }
    }

    fn pending(item: u32, rows: i64, at: Instant) -> Pending<u32> {
        Pending {
            item,
            rows,
            enqueued: at,
            deadline: None,
            cutoff: None,
        }
    }

    fn executed(d: Decision<u32>) -> Vec<u32> {
        match d {
            Decision::Execute(b) => b.into_iter().map(|p| p.item).collect(),
            other => panic!("expected a batch, got {other:?}"),
        }
    }

    #[test]
    fn zero_delay_batches_whatever_is_queued() {
        let now = Instant::now();
        let mut q = BatchQueue::new(policy(8, &[], 0, 1));
        for i in 0..3 {
            q.push(0, pending(i, 1, now)).unwrap();
        }
        assert_eq!(executed(q.decide(now, |_, _| true)), vec![0, 1, 2]);
        assert!(matches!(q.decide(now, |_, _| true), Decision::Idle));
    }

    #[test]
    fn waits_for_the_delay_unless_full_or_preferred() {
        let t0 = Instant::now();
        let mut q = BatchQueue::new(policy(4, &[2], 1000, 1));
        q.push(0, pending(1, 1, t0)).unwrap();
        assert!(
            matches!(q.decide(t0, |_, _| true), Decision::WaitUntil(t) if t == t0 + Duration::from_micros(1000))
        );
        q.push(0, pending(2, 1, t0)).unwrap();
        assert_eq!(
            executed(q.decide(t0, |_, _| true)),
            vec![1, 2],
            "preferred size 2 reached"
        );
        q.push(0, pending(3, 1, t0)).unwrap();
        let later = t0 + Duration::from_millis(2);
        assert_eq!(
            executed(q.decide(later, |_, _| true)),
            vec![3],
            "delay over"
        );
    }

    #[test]
    fn never_exceeds_max_batch_size() {
        let now = Instant::now();
        let mut q = BatchQueue::new(policy(8, &[], 0, 1));
        for (i, rows) in [3, 4, 2].into_iter().enumerate() {
            q.push(0, pending(i as u32, rows, now)).unwrap();
        }
        assert_eq!(executed(q.decide(now, |_, _| true)), vec![0, 1]);
        assert_eq!(executed(q.decide(now, |_, _| true)), vec![2]);
    }

    #[test]
    fn incompatible_request_cuts_the_batch() {
        let now = Instant::now();
        let mut q = BatchQueue::new(policy(8, &[], 10_000, 1));
        for i in [1, 2, 10, 3] {
            q.push(0, pending(i, 1, now)).unwrap();
        }
        let same_decade = |a: &u32, b: &u32| a / 10 == b / 10;
        assert_eq!(executed(q.decide(now, same_decade)), vec![1, 2]);
    }

    #[test]
    fn higher_priority_first() {
        let now = Instant::now();
        let mut q = BatchQueue::new(policy(1, &[], 0, 2));
        q.push(1, pending(20, 1, now)).unwrap();
        q.push(0, pending(10, 1, now)).unwrap();
        assert_eq!(executed(q.decide(now, |_, _| true)), vec![10]);
        assert_eq!(executed(q.decide(now, |_, _| true)), vec![20]);
    }

    #[test]
    fn a_cutoff_rejects_even_on_a_delay_level() {
        let now = Instant::now();
        let mut p = policy(8, &[], 1_000_000, 1);
        p.levels[0].on_timeout = OnTimeout::Delay;
        let mut q = BatchQueue::new(p);
        let later = now + Duration::from_millis(10);
        for (item, deadline) in [(1, Some(now)), (2, None)] {
            let pending = Pending {
                item,
                rows: 1,
                enqueued: now,
                deadline,
                cutoff: Some(later),
            };
            q.push(0, pending).unwrap();
        }
        // Item 1's level timeout only delays it; both wait for the cutoff.
        assert!(q.expire(now).is_empty());
        assert_eq!(q.next_deadline(), Some(later));
        let mut cut = q.expire(later);
        cut.sort_unstable();
        assert_eq!(cut, vec![1, 2]);
        assert!(q.is_empty());
        assert_eq!(q.next_deadline(), None);
    }

    #[test]
    fn full_queue_refuses_and_timeouts_reject_or_delay() {
        let now = Instant::now();
        let mut p = policy(8, &[], 0, 2);
        p.levels[0].max_queue_size = 1;
        p.levels[1].on_timeout = OnTimeout::Delay;
        let mut q = BatchQueue::new(p);
        q.push(
            0,
            Pending {
                item: 1,
                rows: 1,
                enqueued: now,
                deadline: Some(now),
                cutoff: None,
            },
        )
        .unwrap();
        assert!(q.push(0, pending(2, 1, now)).is_err());
        q.push(
            1,
            Pending {
                item: 3,
                rows: 1,
                enqueued: now,
                deadline: Some(now),
                cutoff: None,
            },
        )
        .unwrap();
        q.push(1, pending(4, 1, now)).unwrap();
        assert_eq!(q.expire(now), vec![1]);
        assert_eq!(
            executed(q.decide(now, |_, _| true)),
            vec![4, 3],
            "delayed one goes last"
        );
    }
}
