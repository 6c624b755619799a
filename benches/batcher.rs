//! The dynamic batcher's decision path: queueing a request and choosing
//! the next batch, as done on every arrival and every instance wake-up.

use std::{
    hint::black_box,
    time::{Duration, Instant},
};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use shardserve::{
    proto::inference::ModelDynamicBatching,
    scheduler::dynamic_batcher::{BatchQueue, BatcherPolicy, Decision, Pending},
};

fn policy(preferred: Vec<i32>, delay_us: u64, levels: u64) -> BatcherPolicy {
    BatcherPolicy::from_config(
        32,
        &ModelDynamicBatching {
            preferred_batch_size: preferred,
            max_queue_delay_microseconds: delay_us,
            priority_levels: levels,
            ..Default::default()
        },
    )
}

fn push_and_decide(c: &mut Criterion) {
    let mut group = c.benchmark_group("batcher/push_then_decide");
    for queued in [1usize, 8, 32] {
        group.bench_with_input(
            BenchmarkId::from_parameter(queued),
            &queued,
            |b, &queued| {
                let mut q: BatchQueue<u64> = BatchQueue::new(policy(vec![8, 16], 0, 1));
                let now = Instant::now();
                b.iter(|| {
                    for i in 0..queued as u64 {
                        let _ = q.push(
                            0,
                            Pending {
                                item: i,
                                rows: 1,
                                enqueued: now,
                                deadline: None,
                                cutoff: None,
                            },
                        );
                    }
                    while let Decision::Execute(batch) = q.decide(now, |a, b| (a ^ b) < 1 << 20) {
                        black_box(batch);
                    }
                })
            },
        );
    }
    group.finish();
}

fn decide_while_waiting(c: &mut Criterion) {
    // The common idle-instance case: one request queued, delay not over.
    let mut q: BatchQueue<u64> = BatchQueue::new(policy(vec![], 100, 2));
    let now = Instant::now();
    let _ = q.push(
        1,
        Pending {
            item: 1,
            rows: 1,
            enqueued: now,
            deadline: Some(now + Duration::from_secs(5)),
            cutoff: None,
        },
    );
    c.bench_function("batcher/decide_wait", |b| {
        b.iter(|| {
            black_box(q.expire(now));
            black_box(q.decide(now, |_, _| true));
        })
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    targets = push_and_decide, decide_while_waiting
}
criterion_main!(benches);
