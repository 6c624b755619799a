//! The cross-shard ring: cost of one push + pop on a shard's own thread,
//! and throughput of a producer thread streaming into a consumer thread
//! (the cross-core handoff, doorbell included).

use std::{hint::black_box, time::Duration};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use shardserve::shard::ring;

fn push_pop_same_thread(c: &mut Criterion) {
    let mut links = ring::mesh::<u64>(2, 1024);
    let (left, right) = links.split_at_mut(1);
    let (a, b) = (&mut left[0], &mut right[0]);
    c.bench_function("ring/push_pop_same_thread", |bench| {
        bench.iter(|| {
            let _ = a.outbox.send(1, black_box(7));
            b.inbox.drain(|m| {
                black_box(m);
            });
        })
    });
}

fn cross_thread_stream(c: &mut Criterion) {
    const BATCH: u64 = 100_000;
    let mut group = c.benchmark_group("ring/cross_thread");
    group.throughput(Throughput::Elements(BATCH));
    for capacity in [64usize, 1024] {
        group.bench_with_input(
            BenchmarkId::from_parameter(capacity),
            &capacity,
            |bench, &capacity| {
                bench.iter(|| {
                    let mut links = ring::mesh::<u64>(2, capacity);
                    let mut consumer = links.pop().expect("two shards");
                    let mut producer = links.pop().expect("two shards");
                    let handle = std::thread::spawn(move || {
                        for i in 0..BATCH {
                            let mut msg = i;
                            while let Err(back) = producer.outbox.send(1, msg) {
                                msg = back;
                                std::hint::spin_loop();
                            }
                        }
                    });
                    let mut received = 0u64;
                    while received < BATCH {
                        received += consumer.inbox.drain(|m| {
                            black_box(m);
                        }) as u64;
                    }
                    let _ = handle.join();
                })
            },
        );
    }
    group.finish();
}

fn many_producers_one_consumer(c: &mut Criterion) {
    // Contention as a shard sees it: three peers stream into one shard,
    // each on its own SPSC ring, sharing only the consumer's doorbell.
    const PER_PRODUCER: u64 = 50_000;
    let mut group = c.benchmark_group("ring/three_producers_one_consumer");
    group.throughput(Throughput::Elements(3 * PER_PRODUCER));
    group.bench_function("capacity_1024", |bench| {
        bench.iter(|| {
            let mut links = ring::mesh::<u64>(4, 1024);
            let mut consumer = links.remove(0);
            let handles: Vec<_> = links
                .into_iter()
                .map(|mut producer| {
                    std::thread::spawn(move || {
                        for i in 0..PER_PRODUCER {
                            let mut msg = i;
                            while let Err(back) = producer.outbox.send(0, msg) {
                                msg = back;
                                std::hint::spin_loop();
                            }
                        }
                    })
                })
                .collect();
            let mut received = 0u64;
            while received < 3 * PER_PRODUCER {
                received += consumer.inbox.drain(|m| {
                    black_box(m);
                }) as u64;
            }
            for h in handles {
                let _ = h.join();
            }
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    targets = push_pop_same_thread, cross_thread_stream, many_producers_one_consumer
}
criterion_main!(benches);
