//! What a sequence request pays to reach the shard that owns its sequence
//! (the sequence batcher's state lives on one shard): a round trip through
//! `shard::ring` to a consumer thread and back on the reverse ring, with
//! the doorbells and the origin's oneshot, against the same handoff to a
//! task on the origin's own runtime.
//!
//! Both sides run monoio runtimes and sleep when idle, as shards do, so the
//! cross-thread number includes two cross-thread wakes (eventfd) per round
//! trip. One request is in flight at a time: this is the latency a sequence
//! request sees at low load, not the ring's throughput (see `ring.rs`).

use std::{
    future::poll_fn,
    time::{Duration, Instant},
};

use criterion::{criterion_group, criterion_main, Criterion};
use futures::{
    channel::{mpsc, oneshot},
    StreamExt,
};
use monoio::{FusionDriver, RuntimeBuilder};
use shardserve::shard::ring;

/// What crosses the ring: a job carrying its reply channel, the reply
/// coming back to the origin (which completes the oneshot locally, as
/// `scheduler::dispatch` does), or the end of the bench.
enum Msg {
    Job(u64, oneshot::Sender<u64>),
    Reply(oneshot::Sender<u64>, u64),
    Stop,
}

/// The same runtime a shard runs (io_uring where the kernel allows it,
/// epoll otherwise). A macro because the fusion runtime's type names both
/// drivers' timer wrappers.
macro_rules! runtime {
    () => {
        match RuntimeBuilder::<FusionDriver>::new().enable_timer().build() {
            Ok(rt) => rt,
            Err(e) => panic!("cannot build a monoio runtime: {e}"),
        }
    };
}

fn same_thread(c: &mut Criterion) {
    let mut rt = runtime!();
    c.bench_function("sequence_hop/same_thread", |bench| {
        bench.iter_custom(|iters| {
            rt.block_on(async {
                // The owner is this shard: the job goes to a task on the
                // same runtime, which answers through the oneshot.
                let (tx, mut rx) = mpsc::unbounded::<(u64, oneshot::Sender<u64>)>();
                let owner = monoio::spawn(async move {
                    while let Some((x, reply)) = rx.next().await {
                        let _ = reply.send(x + 1);
                    }
                });
                let start = Instant::now();
                for i in 0..iters {
                    let (reply, answer) = oneshot::channel();
                    if tx.unbounded_send((i, reply)).is_err() {
                        break;
                    }
                    let _ = std::hint::black_box(answer.await);
                }
                let elapsed = start.elapsed();
                drop(tx);
                owner.await;
                elapsed
            })
        })
    });
}

fn cross_thread(c: &mut Criterion) {
    let mut links = ring::mesh::<Msg>(2, 1024);
    let mut remote = links.pop().expect("two shards");
    let mut origin = links.pop().expect("two shards");
    // The owner shard: drains its inbox when its doorbell rings and answers
    // each job on the reverse ring.
    let owner = std::thread::spawn(move || {
        runtime!().block_on(async move {
            let mut stop = false;
            while !stop {
                let mut replies = Vec::new();
                poll_fn(|cx| {
                    remote.inbox.poll_drain(cx, |m| match m {
                        Msg::Job(x, reply) => replies.push(Msg::Reply(reply, x + 1)),
                        Msg::Stop => stop = true,
                        Msg::Reply(..) => {}
                    })
                })
                .await;
                for mut r in replies {
                    // A full ring cannot happen with one job in flight; keep
                    // the retry anyway so the bench cannot lose a reply.
                    while let Err(back) = remote.outbox.send(0, r) {
                        r = back;
                        monoio::time::sleep(Duration::from_micros(1)).await;
                    }
                }
            }
        })
    });
    let mut rt = runtime!();
    c.bench_function("sequence_hop/cross_thread_round_trip", |bench| {
        bench.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for i in 0..iters {
                    let (reply, mut answer) = oneshot::channel();
                    let mut job = Msg::Job(i, reply);
                    while let Err(back) = origin.outbox.send(1, job) {
                        job = back;
                        monoio::time::sleep(Duration::from_micros(1)).await;
                    }
                    // The origin's drainer: take the reply off the reverse
                    // ring, complete the oneshot, and the request task wakes.
                    loop {
                        poll_fn(|cx| {
                            origin.inbox.poll_drain(cx, |m| {
                                if let Msg::Reply(tx, v) = m {
                                    let _ = tx.send(v);
                                }
                            })
                        })
                        .await;
                        if let Ok(Some(v)) = answer.try_recv() {
                            std::hint::black_box(v);
                            break;
                        }
                    }
                }
                start.elapsed()
            })
        })
    });
    let mut stop = Msg::Stop;
    while let Err(back) = origin.outbox.send(1, stop) {
        stop = back;
        std::thread::yield_now();
    }
    let _ = owner.join();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    targets = same_thread, cross_thread
}
criterion_main!(benches);
