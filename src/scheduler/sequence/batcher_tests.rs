//! The architecture document's sequence-batcher examples, replayed on the
//! decision logic with a fake clock: which request runs in which slot of
//! which execution, with START/END/READY per row.

use std::time::{Duration, Instant};

use super::*;

/// A request tagged "sequence.step" for readable timelines.
type Item = &'static str;

fn direct(instances: usize, slots: usize) -> SequenceBatcher<Item> {
    let strategy = Strategy::Direct {
        max_queue_delay: Duration::ZERO,
        minimum_slot_utilization: 0.0,
    };
    SequenceBatcher::new(
        strategy,
        instances,
        slots,
        slots,
        Duration::from_secs(5),
        100,
    )
}

fn oldest(candidates: usize, preferred: usize, delay_us: u64) -> SequenceBatcher<Item> {
    let strategy = Strategy::Oldest {
        max_candidates: candidates,
        preferred_batch_sizes: vec![preferred],
        max_queue_delay: Duration::from_micros(delay_us),
        preserve_ordering: false,
    };
    SequenceBatcher::new(
        strategy,
        1,
        candidates,
        preferred,
        Duration::from_secs(5),
        100,
    )
}

fn entry(item: Item, id: u64, start: bool, end: bool, at: Instant) -> Entry<Item> {
    Entry {
        item,
        id: CorrelationId::Uint(id),
        start,
        end,
        enqueued: at,
    }
}

/// One execution as `[(slot, item or "-", START, END, READY)]`.
type Timeline = Vec<(usize, Item, bool, bool, bool)>;

fn run(b: &mut SequenceBatcher<Item>, instance: usize, now: Instant) -> Option<Timeline> {
    match b.next_batch(instance, now, false, |_, _| true) {
        SeqDecision::Execute(rows) => Some(
            rows.into_iter()
                .map(|r| match r.entry {
                    Some(e) => (r.slot, e.item, e.start, e.end, true),
                    None => (r.slot, "-", false, false, false),
                })
                .collect(),
        ),
        SeqDecision::WaitUntil(_) | SeqDecision::Idle => None,
    }
}

#[test]
fn direct_two_instances_two_slots_four_sequences_and_a_backlog() {
    let t0 = Instant::now();
    let mut b = direct(2, 2);
    // Sequences 1..=5 start in order; 5 finds every slot taken.
    for id in 1..=5u64 {
        let name: Item = ["s1.0", "s2.0", "s3.0", "s4.0", "s5.0"][id as usize - 1];
        b.enqueue(entry(name, id, true, false, t0), "m", t0)
            .unwrap();
    }
    assert_eq!(b.sequence_counts(), (4, 1));
    // Slot 0 of each instance first, then slot 1 (Triton's order).
    assert_eq!(
        run(&mut b, 0, t0).unwrap(),
        vec![
            (0, "s1.0", true, false, true),
            (1, "s3.0", true, false, true)
        ]
    );
    assert_eq!(
        run(&mut b, 1, t0).unwrap(),
        vec![
            (0, "s2.0", true, false, true),
            (1, "s4.0", true, false, true)
        ]
    );
    // Only sequence 3 (instance 0, slot 1) has a request: slot 0 is padding.
    b.enqueue(entry("s3.1", 3, false, false, t0), "m", t0)
        .unwrap();
    assert_eq!(
        run(&mut b, 0, t0).unwrap(),
        vec![
            (0, "-", false, false, false),
            (1, "s3.1", false, false, true)
        ]
    );
    // A request of the backlogged sequence 5 waits there, in order.
    b.enqueue(entry("s5.1", 5, false, false, t0), "m", t0)
        .unwrap();
    assert!(run(&mut b, 0, t0).is_none());
    // Sequence 1 ends: its slot goes to sequence 5 at once, with both of
    // its queued requests, in order, in the following executions.
    b.enqueue(entry("s1.1", 1, false, true, t0), "m", t0)
        .unwrap();
    assert_eq!(
        run(&mut b, 0, t0).unwrap(),
        vec![(0, "s1.1", false, true, true)]
    );
    assert_eq!(b.sequence_counts(), (4, 0));
    assert_eq!(
        run(&mut b, 0, t0).unwrap(),
        vec![(0, "s5.0", true, false, true)]
    );
    assert_eq!(
        run(&mut b, 0, t0).unwrap(),
        vec![(0, "s5.1", false, false, true)]
    );
    assert!(run(&mut b, 0, t0).is_none());
    assert!(b.is_empty());
}

#[test]
fn direct_sequence_requests_never_share_an_execution() {
    let t0 = Instant::now();
    let mut b = direct(1, 2);
    b.enqueue(entry("a0", 1, true, false, t0), "m", t0).unwrap();
    b.enqueue(entry("a1", 1, false, false, t0), "m", t0)
        .unwrap();
    b.enqueue(entry("b0", 2, true, true, t0), "m", t0).unwrap();
    assert_eq!(
        run(&mut b, 0, t0).unwrap(),
        vec![(0, "a0", true, false, true), (1, "b0", true, true, true)]
    );
    assert_eq!(
        run(&mut b, 0, t0).unwrap(),
        vec![(0, "a1", false, false, true)]
    );
    // Sequence 2 ended and its slot is free for a new one.
    b.enqueue(entry("c0", 3, true, false, t0), "m", t0).unwrap();
    assert_eq!(
        run(&mut b, 0, t0).unwrap(),
        vec![(0, "-", false, false, false), (1, "c0", true, false, true)]
    );
}

#[test]
fn direct_minimum_slot_utilization_waits_for_the_queue_delay() {
    let t0 = Instant::now();
    let strategy = Strategy::Direct {
        max_queue_delay: Duration::from_millis(10),
        minimum_slot_utilization: 1.0,
    };
    let mut b = SequenceBatcher::new(strategy, 1, 2, 2, Duration::from_secs(5), 100);
    b.enqueue(entry("a0", 1, true, false, t0), "m", t0).unwrap();
    match b.next_batch(0, t0, false, |_, _| true) {
        SeqDecision::WaitUntil(t) => assert_eq!(t, t0 + Duration::from_millis(10)),
        other => panic!("expected a wait, got {other:?}"),
    }
    // Both slots ready: utilization reached, runs before the delay.
    b.enqueue(entry("b0", 2, true, false, t0), "m", t0).unwrap();
    assert_eq!(run(&mut b, 0, t0).unwrap().len(), 2);
    // Alone again: runs once the delay has passed.
    b.enqueue(entry("a1", 1, false, false, t0), "m", t0)
        .unwrap();
    assert!(run(&mut b, 0, t0 + Duration::from_millis(5)).is_none());
    assert_eq!(
        run(&mut b, 0, t0 + Duration::from_millis(10)).unwrap(),
        vec![(0, "a1", false, false, true)]
    );
}

#[test]
fn oldest_four_candidates_batches_of_two() {
    let t0 = Instant::now();
    let ms = |n| t0 + Duration::from_millis(n);
    let mut b = oldest(4, 2, 1000);
    // Four sequences become candidates; a fifth waits in the backlog.
    b.enqueue(entry("a0", 1, true, false, ms(0)), "m", ms(0))
        .unwrap();
    b.enqueue(entry("a1", 1, false, false, ms(0)), "m", ms(0))
        .unwrap();
    b.enqueue(entry("b0", 2, true, false, ms(1)), "m", ms(1))
        .unwrap();
    b.enqueue(entry("c0", 3, true, true, ms(2)), "m", ms(2))
        .unwrap();
    b.enqueue(entry("d0", 4, true, false, ms(3)), "m", ms(3))
        .unwrap();
    b.enqueue(entry("e0", 5, true, true, ms(4)), "m", ms(4))
        .unwrap();
    assert_eq!(b.sequence_counts(), (4, 1));
    // The two oldest sequences' first requests; never a0 and a1 together.
    assert_eq!(
        run(&mut b, 0, ms(4)).unwrap(),
        vec![(0, "a0", true, false, true), (1, "b0", true, false, true)]
    );
    // Slots 0 and 1 are executing: the next candidates are c0 and d0.
    // c0 ends sequence 3, whose slot goes to backlogged e0 at once, but
    // e0 waits for c0 to complete (one request in flight per slot).
    assert_eq!(
        run(&mut b, 0, ms(4)).unwrap(),
        vec![(2, "c0", true, true, true), (3, "d0", true, false, true)]
    );
    assert!(run(&mut b, 0, ms(4)).is_none());
    b.completed(0);
    // a1 (enqueued at 0) and e0 (at 4): both candidates now.
    assert_eq!(
        run(&mut b, 0, ms(5)).unwrap(),
        vec![(0, "a1", false, false, true), (2, "e0", true, true, true)]
    );
    b.completed(0);
    assert!(b.is_empty());
}

#[test]
fn oldest_waits_for_a_preferred_batch_until_the_delay() {
    let t0 = Instant::now();
    let mut b = oldest(4, 2, 1000);
    b.enqueue(entry("a0", 1, true, false, t0), "m", t0).unwrap();
    match b.next_batch(0, t0, false, |_, _| true) {
        SeqDecision::WaitUntil(t) => assert_eq!(t, t0 + Duration::from_millis(1)),
        other => panic!("expected a wait, got {other:?}"),
    }
    assert_eq!(
        run(&mut b, 0, t0 + Duration::from_millis(1)).unwrap(),
        vec![(0, "a0", true, false, true)]
    );
}

#[test]
fn start_is_required_and_end_closes_the_id() {
    let t0 = Instant::now();
    let mut b = direct(1, 1);
    let e = b
        .enqueue(entry("x", 9, false, false, t0), "m", t0)
        .unwrap_err();
    assert_eq!(
        e.error.message,
        "inference request for sequence 9 to model 'm' must specify the START flag on the first request of the sequence"
    );
    // END-only request of an unknown sequence: the same error.
    assert!(b.enqueue(entry("y", 9, false, true, t0), "m", t0).is_err());
    b.enqueue(entry("a", 9, true, true, t0), "m", t0).unwrap();
    assert_eq!(
        run(&mut b, 0, t0).unwrap(),
        vec![(0, "a", true, true, true)]
    );
    assert!(b.enqueue(entry("b", 9, false, false, t0), "m", t0).is_err());
    // After END the same id may START again.
    b.enqueue(entry("c", 9, true, false, t0), "m", t0).unwrap();
    // START on an active sequence restarts it in the same slot.
    b.enqueue(entry("d", 9, true, false, t0), "m", t0).unwrap();
    assert_eq!(
        run(&mut b, 0, t0).unwrap(),
        vec![(0, "c", true, false, true)]
    );
    assert_eq!(
        run(&mut b, 0, t0).unwrap(),
        vec![(0, "d", true, false, true)]
    );
}

#[test]
fn idle_sequences_release_their_slot_to_the_backlog() {
    let t0 = Instant::now();
    let mut b = direct(1, 1);
    b.enqueue(entry("a0", 1, true, false, t0), "m", t0).unwrap();
    b.enqueue(entry("b0", 2, true, false, t0), "m", t0).unwrap();
    assert_eq!(
        run(&mut b, 0, t0).unwrap(),
        vec![(0, "a0", true, false, true)]
    );
    assert!(run(&mut b, 0, t0).is_none());
    assert_eq!(
        b.reap_idle(t0 + Duration::from_secs(4)),
        Some(t0 + Duration::from_secs(5))
    );
    b.reap_idle(t0 + Duration::from_secs(5));
    // Sequence 1 is gone; sequence 2 got the slot.
    assert_eq!(
        run(&mut b, 0, t0).unwrap(),
        vec![(0, "b0", true, false, true)]
    );
    let e = b
        .enqueue(
            entry("a1", 1, false, false, t0),
            "m",
            t0 + Duration::from_secs(5),
        )
        .unwrap_err();
    assert!(
        e.error.message.contains("must specify the START flag"),
        "{}",
        e.error.message
    );
}

#[test]
fn many_abandoned_sequences_are_bounded_and_forgotten() {
    let t0 = Instant::now();
    let strategy = Strategy::Direct {
        max_queue_delay: Duration::ZERO,
        minimum_slot_utilization: 0.0,
    };
    let mut b: SequenceBatcher<u64> =
        SequenceBatcher::new(strategy, 1, 8, 8, Duration::from_secs(1), 1000);
    let mut refused = 0;
    for id in 1..=100_000u64 {
        let e = Entry {
            item: id,
            id: CorrelationId::Uint(id),
            start: true,
            end: false,
            enqueued: t0,
        };
        if b.enqueue(e, "m", t0).is_err() {
            refused += 1;
        }
        // The instance keeps executing whatever has a slot.
        if id % 8 == 0 {
            while let SeqDecision::Execute(_) = b.next_batch(0, t0, false, |_, _| true) {}
        }
    }
    assert!(
        refused > 90_000,
        "the backlog must be bounded, refused {refused}"
    );
    // Abandoned: the backlogged requests are cancelled by their clients.
    let dropped = b.remove_where(|_| true).len();
    assert_eq!(b.len(), 0, "dropped {dropped}");
    b.reap_idle(t0 + Duration::from_secs(2));
    assert_eq!(b.sequence_counts(), (0, 0));
    // Every slot is free again.
    for id in 1..=8u64 {
        let e = Entry {
            item: id,
            id: CorrelationId::Uint(1_000_000 + id),
            start: true,
            end: false,
            enqueued: t0,
        };
        b.enqueue(e, "m", t0 + Duration::from_secs(2)).unwrap();
    }
    assert_eq!(b.sequence_counts(), (8, 0));
}

/// `oldest` with four candidates, max_batch_size 4 and preferred size 2.
fn oldest_max4_preferred2(delay_us: u64) -> SequenceBatcher<Item> {
    let strategy = Strategy::Oldest {
        max_candidates: 4,
        preferred_batch_sizes: vec![2],
        max_queue_delay: Duration::from_micros(delay_us),
        preserve_ordering: false,
    };
    SequenceBatcher::new(strategy, 1, 4, 4, Duration::from_secs(5), 100)
}

#[test]
fn oldest_runs_the_preferred_size_at_once_when_more_are_ready() {
    // Triton's dynamic batcher under `oldest`: three ready sequences with
    // preferred size 2 run 2 now (a third would pass the largest preferred
    // size) instead of waiting for the delay; the third waits.
    let t0 = Instant::now();
    let mut b = oldest_max4_preferred2(1_000_000);
    for (item, id) in [("a0", 1), ("b0", 2), ("c0", 3)] {
        b.enqueue(entry(item, id, true, false, t0), "m", t0)
            .unwrap();
    }
    assert_eq!(
        run(&mut b, 0, t0).unwrap(),
        vec![(0, "a0", true, false, true), (1, "b0", true, false, true)]
    );
    match b.next_batch(0, t0, false, |_, _| true) {
        SeqDecision::WaitUntil(t) => assert_eq!(t, t0 + Duration::from_secs(1)),
        other => panic!("expected a wait, got {other:?}"),
    }
}

#[test]
fn oldest_past_the_delay_runs_every_ready_sequence() {
    let t0 = Instant::now();
    let mut b = oldest_max4_preferred2(1000);
    for (item, id) in [("a0", 1), ("b0", 2), ("c0", 3)] {
        b.enqueue(entry(item, id, true, false, t0), "m", t0)
            .unwrap();
    }
    let late = t0 + Duration::from_millis(1);
    assert_eq!(run(&mut b, 0, late).unwrap().len(), 3);
}

#[test]
fn oldest_stops_at_a_request_of_another_shape() {
    let t0 = Instant::now();
    let ms = |n| t0 + Duration::from_millis(n);
    let mut b = oldest_max4_preferred2(1_000_000);
    for (i, (item, id)) in [("a0", 1), ("X0", 2), ("c0", 3)].into_iter().enumerate() {
        b.enqueue(
            entry(item, id, true, false, ms(i as u64)),
            "m",
            ms(i as u64),
        )
        .unwrap();
    }
    let same_case = |a: &Item, b: &Item| {
        a.chars().next().map(|c| c.is_lowercase()) == b.chars().next().map(|c| c.is_lowercase())
    };
    match b.next_batch(0, ms(3), false, same_case) {
        SeqDecision::Execute(rows) => {
            let items: Vec<_> = rows
                .iter()
                .filter_map(|r| r.entry.as_ref().map(|e| e.item))
                .collect();
            assert_eq!(items, vec!["a0"], "X0 cannot join; the pending one runs");
        }
        other => panic!("expected a batch, got {other:?}"),
    }
}
