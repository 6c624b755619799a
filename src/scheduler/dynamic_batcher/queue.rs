//! The dynamic batcher's decision path, free of I/O and time sources so it
//! can be tested and benchmarked alone: priority queues with timeouts,
//! and the choice of the next batch.

use std::{
    collections::VecDeque,
    time::{Duration, Instant},
};

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
    /// Nothing runs until this many requests were queued at once
    /// (Triton's `TRITONSERVER_DELAY_SCHEDULER` test hook); 0 = off.
    hold_until_queued: usize,
}

/// Why an item could not be queued.
#[derive(Debug)]
pub struct QueueFull<T>(pub T);

impl<T> BatchQueue<T> {
    pub fn new(policy: BatcherPolicy) -> Self {
        let levels = (0..policy.levels.len()).map(|_| Level::default()).collect();
        Self {
            policy,
            levels,
            hold_until_queued: 0,
        }
    }

    /// Holds every batch until `count` requests are queued together, once
    /// (what Triton does under `TRITONSERVER_DELAY_SCHEDULER`, so that a
    /// test can line requests up before the batcher looks at them).
    pub fn hold_until_queued(&mut self, count: usize) {
        self.hold_until_queued = count;
    }

    /// Ends a hold early (unloading or shutting down: run what is queued).
    pub fn release_hold(&mut self) {
        self.hold_until_queued = 0;
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

    /// Chooses the next batch as Triton's dynamic batcher does
    /// (`GetDynamicBatch`, see [`BatchScan`]): the queue is scanned in
    /// priority order. `compatible(head, other)` says whether `other` may
    /// join a batch started by `head`.
    pub fn decide(&mut self, now: Instant, compatible: impl Fn(&T, &T) -> bool) -> Decision<T> {
        if self.hold_until_queued > 0 {
            if self.len() < self.hold_until_queued {
                return Decision::Idle;
            }
            self.hold_until_queued = 0;
        }
        let Some(level_idx) = self.levels.iter().position(|l| l.len() > 0) else {
            return Decision::Idle;
        };
        let preferred = &self.policy.preferred;
        let mut scan = BatchScan::new(
            self.policy.max_batch_size,
            preferred.last().copied(),
            |rows| preferred.binary_search(&rows).is_ok(),
        );
        let mut oldest: Option<Instant> = None;
        let mut head: Option<&T> = None;
        for p in self.levels[level_idx..].iter().flat_map(Level::iter) {
            let fits = match head {
                None => {
                    head = Some(&p.item);
                    scan.offer(p.rows, true)
                }
                Some(head) => scan.offer(p.rows, compatible(head, &p.item)),
            };
            if !fits {
                break;
            }
            oldest = Some(oldest.map_or(p.enqueued, |o| o.min(p.enqueued)));
        }
        let Some(oldest) = oldest else {
            return Decision::Idle;
        };
        let take = match scan.take(now, oldest, self.policy.max_queue_delay) {
            Ok(take) => take,
            Err(until) => return Decision::WaitUntil(until),
        };
        let mut batch = Vec::with_capacity(take);
        for level in &mut self.levels[level_idx..] {
            while batch.len() < take {
                match level.pop_front() {
                    Some(p) => batch.push(p),
                    None => break,
                }
            }
        }
        Decision::Execute(batch)
    }
}

/// Triton's choice of a batch among queued requests (`GetDynamicBatch`,
/// shared by the dynamic batcher and the sequence batcher's `oldest`
/// strategy). Requests are offered in queue order while they fit in
/// `max_batch_size` and match the first one's shapes. The scan remembers
/// the last prefix that lands on a preferred size, or else the prefix
/// before the request that would pass the largest preferred size (waiting
/// cannot make a better batch). Before the queue delay is over that prefix
/// runs at once; otherwise everything scanned runs when the delay is over
/// (or zero), when it reached the largest preferred size, or when the next
/// request could not join. Else the batch waits for the delay.
pub struct BatchScan<F> {
    max: i64,
    max_preferred: i64,
    /// Whether the configuration lists preferred sizes.
    listed: bool,
    is_preferred: F,
    rows: i64,
    count: usize,
    best: Option<usize>,
    send_now: bool,
}

impl<F: Fn(i64) -> bool> BatchScan<F> {
    /// `largest_preferred`: None when the configuration lists none (Triton
    /// then prefers `max_batch_size`).
    pub fn new(max_batch_size: i64, largest_preferred: Option<i64>, is_preferred: F) -> Self {
        Self {
            max: max_batch_size,
            max_preferred: largest_preferred.unwrap_or(max_batch_size),
            listed: largest_preferred.is_some(),
            is_preferred,
            rows: 0,
            count: 0,
            best: None,
            send_now: false,
        }
    }

    /// Offers the next request (`rows` of it, `compatible` with the first);
    /// false when it cannot join, which ends the scan.
    pub fn offer(&mut self, rows: i64, compatible: bool) -> bool {
        let size = rows.max(1);
        if self.count > 0 {
            if self.rows + size > self.max_preferred && self.best.is_none() {
                self.best = Some(self.count);
            }
            if self.rows + size > self.max || !compatible {
                self.send_now = true;
                return false;
            }
        }
        self.rows += size;
        self.count += 1;
        let preferred = if self.listed {
            (self.is_preferred)(self.rows)
        } else {
            self.rows == self.max
        };
        if preferred {
            self.best = Some(self.count);
        }
        true
    }

    /// How many of the offered requests to run now, or until when to wait.
    /// `oldest`: the earliest arrival among them.
    pub fn take(&self, now: Instant, oldest: Instant, delay: Duration) -> Result<usize, Instant> {
        let delay_over = !delay.is_zero() && now >= oldest + delay;
        match self.best {
            Some(best) if !delay_over => Ok(best),
            _ if self.send_now
                || self.rows >= self.max_preferred
                || delay_over
                || delay.is_zero() =>
            {
                Ok(self.count)
            }
            _ => Err(oldest + delay),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::dynamic_batcher::policy::QueuePolicy;

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

    // Triton's qa/L0_batcher cases: max_batch_size 8, preferred [2, 6],
    // a 10 s queue delay.
    fn triton_qa_queue() -> BatchQueue<u32> {
        BatchQueue::new(policy(8, &[2, 6], 10_000_000, 1))
    }

    fn waits(d: Decision<u32>) -> bool {
        matches!(d, Decision::WaitUntil(_))
    }

    #[test]
    fn a_request_above_the_largest_preferred_size_runs_at_once() {
        // test_static_batch_gt_max_preferred
        let t0 = Instant::now();
        let mut q = triton_qa_queue();
        q.push(0, pending(7, 7, t0)).unwrap();
        assert_eq!(executed(q.decide(t0, |_, _| true)), vec![7]);
    }

    #[test]
    fn sizes_below_or_between_preferred_sizes_wait_for_the_delay() {
        // test_static_batch_lt_any_preferred / _not_preferred
        let t0 = Instant::now();
        for rows in [1, 3] {
            let mut q = triton_qa_queue();
            q.push(0, pending(1, rows, t0)).unwrap();
            assert!(waits(q.decide(t0, |_, _| true)), "{rows} rows");
            let later = t0 + Duration::from_secs(10);
            assert_eq!(executed(q.decide(later, |_, _| true)), vec![1]);
        }
    }

    #[test]
    fn a_pending_batch_runs_when_the_next_request_would_pass_the_largest_preferred_size() {
        // test_multi_batch_sum_gt_max_preferred: 3 waits, 4 arrives
        // (3 + 4 > 6): the 3 runs at once, the 4 alone waits.
        let t0 = Instant::now();
        let mut q = triton_qa_queue();
        q.push(0, pending(3, 3, t0)).unwrap();
        assert!(waits(q.decide(t0, |_, _| true)));
        let t1 = t0 + Duration::from_secs(1);
        q.push(0, pending(4, 4, t1)).unwrap();
        assert_eq!(executed(q.decide(t1, |_, _| true)), vec![3]);
        match q.decide(t1, |_, _| true) {
            Decision::WaitUntil(t) => assert_eq!(t, t1 + Duration::from_secs(10)),
            other => panic!("the 4 waits for its own delay, got {other:?}"),
        }
    }

    #[test]
    fn a_pending_batch_and_a_request_above_the_largest_preferred_size_both_run_at_once() {
        // test_multi_batch_gt_max_preferred: 3 then 7.
        let t0 = Instant::now();
        let mut q = triton_qa_queue();
        q.push(0, pending(3, 3, t0)).unwrap();
        assert!(waits(q.decide(t0, |_, _| true)));
        q.push(0, pending(7, 7, t0)).unwrap();
        assert_eq!(executed(q.decide(t0, |_, _| true)), vec![3]);
        assert_eq!(executed(q.decide(t0, |_, _| true)), vec![7]);
    }

    #[test]
    fn the_largest_preferred_size_reached_is_used() {
        // test_multi_batch_use_biggest_preferred: six requests of 1.
        let t0 = Instant::now();
        let mut q = triton_qa_queue();
        for i in 0..6 {
            q.push(0, pending(i, 1, t0)).unwrap();
        }
        assert_eq!(executed(q.decide(t0, |_, _| true)), vec![0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn the_best_preferred_prefix_runs_and_the_rest_waits() {
        // test_multi_batch_use_best_preferred: 1, 1, 1 -> 2 now, 1 later.
        let t0 = Instant::now();
        let mut q = triton_qa_queue();
        for i in 0..3 {
            q.push(0, pending(i, 1, t0)).unwrap();
        }
        assert_eq!(executed(q.decide(t0, |_, _| true)), vec![0, 1]);
        assert!(waits(q.decide(t0, |_, _| true)));
    }

    #[test]
    fn past_the_delay_everything_up_to_max_batch_size_runs() {
        // test_multi_batch_delayed_use_max_batch: 3 and 4 queued past the
        // delay, then 1: one batch of 8, not the preferred prefix.
        let t0 = Instant::now();
        let mut q = triton_qa_queue();
        q.push(0, pending(3, 3, t0)).unwrap();
        q.push(0, pending(4, 4, t0)).unwrap();
        let late = t0 + Duration::from_secs(11);
        q.push(0, pending(1, 1, late)).unwrap();
        assert_eq!(executed(q.decide(late, |_, _| true)), vec![3, 4, 1]);
        // Past the delay, 1 + 1 + 1 runs whole rather than as 2 + 1.
        for i in 0..3 {
            q.push(0, pending(i, 1, t0)).unwrap();
        }
        assert_eq!(executed(q.decide(late, |_, _| true)), vec![0, 1, 2]);
    }

    #[test]
    fn a_different_shape_sends_the_pending_batch() {
        // test_multi_batch_(not_)preferred_different_shape: 1 and 3 of one
        // shape, then 1 and 5 of another (items >= 10).
        let t0 = Instant::now();
        let same_shape = |a: &u32, b: &u32| (*a >= 10) == (*b >= 10);
        let mut q = triton_qa_queue();
        q.push(0, pending(1, 1, t0)).unwrap();
        q.push(0, pending(3, 3, t0)).unwrap();
        assert!(waits(q.decide(t0, same_shape)), "4 is not preferred");
        q.push(0, pending(11, 1, t0)).unwrap();
        assert_eq!(executed(q.decide(t0, same_shape)), vec![1, 3]);
        assert!(waits(q.decide(t0, same_shape)), "a lone 1 waits");
        q.push(0, pending(15, 5, t0)).unwrap();
        assert_eq!(executed(q.decide(t0, same_shape)), vec![11, 15]);
    }

    #[test]
    fn an_empty_preferred_list_means_max_batch_size() {
        let t0 = Instant::now();
        let mut q = BatchQueue::new(policy(4, &[], 10_000_000, 1));
        for (i, rows) in [(0, 3), (1, 2)] {
            q.push(0, pending(i, rows, t0)).unwrap();
        }
        assert_eq!(executed(q.decide(t0, |_, _| true)), vec![0], "3 + 2 > 4");
        assert!(waits(q.decide(t0, |_, _| true)));
        q.push(0, pending(2, 2, t0)).unwrap();
        assert_eq!(executed(q.decide(t0, |_, _| true)), vec![1, 2], "4 is full");
    }

    #[test]
    fn a_held_queue_forms_no_batch_until_enough_are_queued() {
        // test_multi_batch_delayed_sum_gt_max_preferred under
        // TRITONSERVER_DELAY_SCHEDULER=2: 3, then 4 a second later.
        let t0 = Instant::now();
        let mut q = triton_qa_queue();
        q.hold_until_queued(2);
        q.push(0, pending(3, 3, t0)).unwrap();
        assert!(matches!(q.decide(t0, |_, _| true), Decision::Idle));
        let t1 = t0 + Duration::from_secs(1);
        q.push(0, pending(4, 4, t1)).unwrap();
        assert_eq!(executed(q.decide(t1, |_, _| true)), vec![3]);
        assert!(waits(q.decide(t1, |_, _| true)), "the hold is over");
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn a_released_hold_runs_what_is_queued() {
        let t0 = Instant::now();
        let mut q = triton_qa_queue();
        q.hold_until_queued(5);
        q.push(0, pending(2, 2, t0)).unwrap();
        assert!(matches!(q.decide(t0, |_, _| true), Decision::Idle));
        q.release_hold();
        assert_eq!(executed(q.decide(t0, |_, _| true)), vec![2]);
    }

    #[test]
    fn priority_levels_join_one_batch_in_order() {
        let t0 = Instant::now();
        let mut q = BatchQueue::new(policy(8, &[2, 6], 10_000_000, 2));
        q.push(1, pending(20, 1, t0)).unwrap();
        q.push(0, pending(10, 1, t0)).unwrap();
        assert_eq!(executed(q.decide(t0, |_, _| true)), vec![10, 20]);
    }
}
