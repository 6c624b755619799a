//! Sleeping to a deadline with microsecond precision on a shard.
//!
//! monoio's timer wheel ticks in whole milliseconds and rounds deadlines up,
//! so a dynamic batcher's `max_queue_delay_microseconds: 100` would become
//! one to two milliseconds. Batcher delays are latency the user chose to
//! the microsecond, so the last stretch is waited by yielding: the shard
//! keeps running its other tasks and polling I/O in between, and only a
//! shard with a request waiting on such a deadline spends that time awake.
//!
//! Known trade-off: while a task yields, monoio never parks, and on the
//! io_uring driver only a park re-arms the readiness poller and drains
//! cross-thread wake-ups. Requests arriving from other shards (or a second
//! readiness burst on this shard's connections) during that last
//! millisecond are therefore seen right after the deadline, in the next
//! batch, instead of joining the current one. The epoll driver polls
//! everything on every round.

use std::time::{Duration, Instant};

use super::yield_now;

/// The part of a wait left to the coarse timer is shortened by this much,
/// which covers the wheel's rounding.
const TIMER_SLACK: Duration = Duration::from_millis(1);

/// Returns at `deadline` (or just after), never more than a scheduling
/// round late.
pub async fn sleep_until(deadline: Instant) {
    let now = Instant::now();
    if let Some(coarse) = deadline
        .checked_duration_since(now)
        .and_then(|left| left.checked_sub(TIMER_SLACK))
        .filter(|d| !d.is_zero())
    {
        monoio::time::sleep(coarse).await;
    }
    while Instant::now() < deadline {
        yield_now().await;
    }
}

/// Returns at `deadline` or up to a couple of milliseconds later, on the
/// timer wheel alone: for housekeeping (idle sequences) that must not keep
/// the shard yielding through the last millisecond.
pub async fn sleep_until_coarse(deadline: Instant) {
    if let Some(left) = deadline.checked_duration_since(Instant::now()) {
        monoio::time::sleep(left).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<F: std::future::Future>(f: F) -> F::Output {
        monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
            .enable_timer()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    #[test]
    fn never_returns_before_the_deadline() {
        run(async {
            for micros in [0u64, 50, 400, 1_500, 3_200] {
                let deadline = Instant::now() + Duration::from_micros(micros);
                sleep_until(deadline).await;
                assert!(Instant::now() >= deadline, "woke early for {micros} us");
            }
        });
    }

    #[test]
    fn a_past_deadline_returns_at_once() {
        run(async {
            let past = Instant::now();
            sleep_until(past).await;
        });
    }
}
