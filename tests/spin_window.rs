//! The shard spinner (`shard::spin`): it stops after its window with no
//! work, is re-armed by work, never exists with a zero window, holds while
//! its gate says work runs elsewhere, and leaves timers and socket
//! readiness working while it spins. No timing assertions: every wait is a
//! poll loop with a generous bound.

use std::{
    cell::Cell,
    rc::Rc,
    time::{Duration, Instant},
};

use monoio::io::{
    poll_io::{AsyncReadExt, AsyncWriteExt},
    IntoPollIo,
};
use shardserve::{
    compute::thread,
    shard::spin::{self, Driver, Gate},
};

fn epoll_runtime() -> monoio::Runtime<monoio::time::TimeDriver<monoio::LegacyDriver>> {
    monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
        .enable_timer()
        .build()
        .expect("epoll runtime")
}

/// Polls `cond` every millisecond on the runtime, up to 60 s.
async fn eventually(cond: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        monoio::time::sleep(Duration::from_millis(1)).await;
    }
    cond()
}

/// Installs and starts an always-spinning spinner with `window` on this
/// (epoll) runtime, arms it and waits for its first round.
async fn spinning(window: Duration) -> std::sync::Arc<spin::SpinStats> {
    let (spinner, stats) = spin::install(window, Driver::Epoll, || Gate::Spin).expect("a spinner");
    monoio::spawn(spinner);
    spin::note_work();
    assert!(
        eventually(|| stats.rounds() > 0).await,
        "the spinner never ran"
    );
    stats
}

#[test]
fn a_zero_window_never_spins() {
    let mut rt = epoll_runtime();
    rt.block_on(async {
        assert!(spin::install(Duration::ZERO, Driver::Epoll, || Gate::Spin).is_none());
        // And work noted on a thread without a spinner is harmless.
        spin::note_work();
    });
}

#[test]
fn the_spinner_stops_after_its_window_and_work_rearms_it() {
    let mut rt = epoll_runtime();
    rt.block_on(async {
        let stats = spinning(Duration::from_millis(20)).await;
        assert!(
            eventually(|| !stats.spinning()).await,
            "the spinner did not stop after its window"
        );
        // Stopped: its round count stays put while nothing happens.
        let rounds = stats.rounds();
        monoio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(stats.rounds(), rounds, "a stopped spinner spun");
        assert!(!stats.spinning());
        let windows = stats.windows();
        // Noted again while waiting: on a loaded machine the spinner may be
        // in its contention back-off, which ends by itself.
        assert!(
            eventually(|| {
                spin::note_work();
                stats.windows() > windows && stats.rounds() > rounds
            })
            .await,
            "note_work did not re-arm the spinner"
        );
        assert!(eventually(|| !stats.spinning()).await);
        spin::clear();
    });
}

#[test]
fn timers_fire_while_it_spins() {
    let mut rt = epoll_runtime();
    rt.block_on(async {
        // A window far longer than the test: the spinner never stops by
        // itself, and the sleeps below must still end.
        let (spinner, stats) =
            spin::install(Duration::from_secs(3600), Driver::Epoll, || Gate::Spin)
                .expect("a spinner");
        monoio::spawn(spinner);
        spin::note_work();
        for _ in 0..5 {
            monoio::time::sleep(Duration::from_millis(3)).await;
        }
        assert!(stats.rounds() > 0, "the spinner never spun");
        spin::clear();
    });
}

#[test]
fn a_holding_gate_stops_it_until_released() {
    let mut rt = epoll_runtime();
    rt.block_on(async {
        let held = Rc::new(Cell::new(true));
        let gate = {
            let held = held.clone();
            move || if held.get() { Gate::Hold } else { Gate::Spin }
        };
        let (spinner, stats) =
            spin::install(Duration::from_secs(3600), Driver::Epoll, gate).expect("a spinner");
        monoio::spawn(spinner);
        spin::note_work();
        monoio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(stats.rounds(), 0, "spun while held");
        held.set(false);
        assert!(
            eventually(|| {
                spin::note_work();
                stats.rounds() > 0
            })
            .await
        );
        spin::clear();
    });
}

/// Ping-pong over a poll-based socket pair while the spinner has a window
/// far longer than the test, on io_uring (where monoio re-arms its epoll
/// instance only when it parks) and on epoll: every message arrives.
#[test]
fn sockets_stay_readable_while_it_spins() {
    async fn ping_pong(driver: Driver) {
        let (spinner, stats) =
            spin::install(Duration::from_secs(3600), driver, || Gate::Spin).expect("a spinner");
        monoio::spawn(spinner);
        let (a, b) = monoio::net::UnixStream::pair().expect("pair");
        let (mut a, mut b) = (
            a.into_poll_io().expect("poll io"),
            b.into_poll_io().expect("poll io"),
        );
        let echo = monoio::spawn(async move {
            let mut buf = [0u8; 8];
            for _ in 0..200 {
                b.read_exact(&mut buf).await.expect("echo read");
                b.write_all(&buf).await.expect("echo write");
            }
        });
        for i in 0..200u64 {
            // Work done: the window restarts, as a request's end does.
            spin::note_work();
            a.write_all(&i.to_le_bytes()).await.expect("write");
            let mut buf = [0u8; 8];
            a.read_exact(&mut buf).await.expect("read");
            assert_eq!(buf, i.to_le_bytes());
        }
        echo.await;
        // On epoll nothing stops it but its window, a hold or a back-off
        // (whose first sample cannot show contention), so it spun.
        if driver == Driver::Epoll {
            assert!(stats.rounds() > 0, "the spinner never spun");
        }
        spin::clear();
    }
    epoll_runtime().block_on(ping_pong(Driver::Epoll));
    if let Ok(mut rt) = monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
        .enable_timer()
        .build()
    {
        rt.block_on(ping_pong(Driver::IoUring));
    }
}

/// A task woken by another task runs before the spinner's next rounds, not
/// after its window: monoio queues a self-wake at the front of its run
/// queue, and a spinner that woke itself kept every such task waiting
/// (an h2 connection task handed a gRPC answer waited the whole window).
/// Counted in spinner rounds, not time: the window is long enough for
/// thousands of rounds.
#[test]
fn a_task_another_task_wakes_runs_between_rounds() {
    let mut rt = epoll_runtime();
    rt.block_on(async {
        let stats = spinning(Duration::from_secs(30)).await;
        for _ in 0..20 {
            // A parked task, and the rounds done when it gets to run.
            let woken: Rc<Cell<Option<std::task::Waker>>> = Rc::default();
            let ran_at: Rc<Cell<Option<u64>>> = Rc::default();
            let parked = {
                let (woken, ran_at, stats) = (woken.clone(), ran_at.clone(), stats.clone());
                monoio::spawn(async move {
                    let mut first = true;
                    std::future::poll_fn(|cx| {
                        if first {
                            first = false;
                            woken.set(Some(cx.waker().clone()));
                            return std::task::Poll::Pending;
                        }
                        ran_at.set(Some(stats.rounds()));
                        std::task::Poll::Ready(())
                    })
                    .await
                })
            };
            // Let it park, then wake it from here while the spinner spins.
            let waker = loop {
                if let Some(w) = woken.take() {
                    break w;
                }
                monoio::time::sleep(Duration::from_millis(1)).await;
            };
            let woken_at = stats.rounds();
            waker.wake();
            parked.await;
            let ran = ran_at.get().expect("it ran");
            assert!(
                ran - woken_at <= 3,
                "the woken task waited {} spinner rounds",
                ran - woken_at
            );
        }
        spin::clear();
    });
}

/// A `SCHED_BATCH` thread (what shards are by default) woken on the
/// spinner's core gets it within a few rounds. Such a thread does not
/// preempt the running one on its wake-up, so a spinner that never offered
/// its core held it for a whole time slice: a load generator spinning on a
/// server's core held each answer back for its busy-poll window (c=1 p99
/// 1 ms). Counted in spinner rounds, as above.
#[test]
fn a_sched_batch_thread_woken_on_its_core_runs_within_a_few_rounds() {
    // SAFETY: no arguments.
    let cpu = usize::try_from(unsafe { libc::sched_getcpu() }).expect("a CPU");
    thread::set_affinity(&[cpu]).expect("pin to this CPU");
    let mut rt = epoll_runtime();
    rt.block_on(async {
        let stats = spinning(Duration::from_secs(30)).await;
        let (wake_tx, wake_rx) = std::sync::mpsc::channel::<u64>();
        let (ran_tx, ran_rx) = std::sync::mpsc::channel::<(u64, u64)>();
        let peer = {
            let stats = stats.clone();
            std::thread::spawn(move || {
                thread::set_affinity(&[cpu]).expect("pin to the spinner's CPU");
                thread::set_sched_batch().expect("SCHED_BATCH");
                for woken_at in wake_rx {
                    if ran_tx.send((woken_at, stats.rounds())).is_err() {
                        break;
                    }
                }
            })
        };
        let mut waits = Vec::new();
        for _ in 0..20 {
            // Let the peer block in recv, then wake it from this (spinning)
            // thread.
            monoio::time::sleep(Duration::from_millis(5)).await;
            wake_tx.send(stats.rounds()).expect("peer alive");
            let (woken_at, ran_at) = loop {
                if let Ok(r) = ran_rx.try_recv() {
                    break r;
                }
                monoio::time::sleep(Duration::from_millis(1)).await;
            };
            waits.push(ran_at - woken_at);
        }
        drop(wake_tx);
        peer.join().expect("peer");
        spin::clear();
        waits.sort_unstable();
        let median = waits[waits.len() / 2];
        assert!(
            median <= 500,
            "a woken SCHED_BATCH thread waited {median} spinner rounds (median; all: {waits:?})"
        );
    });
}
