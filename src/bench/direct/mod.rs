//! The direct lane: a worker thread with one request at a time on a
//! plaintext connection drives its socket itself. It writes the
//! pre-encoded request, then reads the non-blocking socket in a loop for
//! the busy-poll window and sleeps in `poll(2)` after it. There is no
//! runtime, no epoll instance, no io_uring and no HTTP client stack in
//! between: `http1` speaks HTTP/1.1, `grpc` unary gRPC over a minimal
//! HTTP/2 connection (HPACK decoding from `fluke-hpack`).
//!
//! Why: at concurrency 1 the generator's own layers are part of every
//! latency it reports. Against the same server on the 2-core VM, a client
//! reading its socket directly measured 17.7 µs p50 where the runtime and
//! hyper path measured 22.2 µs. So the generator should add as little to
//! the kernel's round trip as a client can.
//!
//! Everything else goes through monoio, hyper and h2 as before: TLS,
//! streaming, sequences, open loops, several requests per thread, bodies
//! over [`MAX_BODY`], and `--no-direct`.

mod grpc;
mod http1;
mod lane;

use std::{
    io,
    sync::atomic::Ordering,
    thread::JoinHandle,
    time::{Duration, Instant},
};

use self::lane::{Failure, Lane, Protocol, MAX_BODY};
use super::{
    cli::Load,
    grpc::Completion,
    load::{self, WorkerSpec},
    stats::dur_ns,
    wire::Wire,
};

/// Whether `spec` runs on the direct lane.
pub fn applies(spec: &WorkerSpec) -> bool {
    spec.direct
        && spec.load == Load::Concurrency(1)
        && matches!(spec.prepared.wire, Wire::Http1 | Wire::GrpcUnary)
        && spec.target.tls.is_none()
        && spec.sequence.is_none()
        && spec.prepared.template.is_none()
        && spec.prepared.bodies.iter().all(|b| b.len() <= MAX_BODY)
        && (spec.prepared.wire == Wire::Http1 || grpc::Grpc::fits(&spec.prepared))
}

/// Starts a worker thread on the direct lane; it runs until `stop` is set.
pub fn spawn(spec: WorkerSpec) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("bench-{}", spec.index))
        .spawn(move || {
            load::pin(spec.cpu);
            run(&spec);
        })
}

/// The closed loop of one request at a time, until the step stops.
fn run(spec: &WorkerSpec) {
    match spec.prepared.wire {
        Wire::GrpcUnary => run_with(spec, grpc::Grpc::new(&spec.prepared)),
        _ => run_with(spec, http1::Http1::new(&spec.prepared)),
    }
}

fn run_with(spec: &WorkerSpec, mut protocol: impl Protocol) {
    let mut lane = Lane::new(spec);
    let mut i = 0usize;
    while !spec.stop.load(Ordering::Relaxed) {
        let t0 = Instant::now();
        let result = lane.exchange(&mut protocol, i);
        let elapsed = dur_ns(t0.elapsed());
        let record = |r| spec.recorder.record_request(t0, 0, r, false);
        match result {
            Ok(()) => record(Ok((elapsed, Completion::single()))),
            // Cut off by the step's end: neither a success nor a failure.
            Err(Failure::Abandoned) => break,
            Err(Failure::Connect(e)) => {
                record(Err(e));
                // Do not spin on a refused connection.
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(Failure::Request(e) | Failure::Answer(e)) => record(Err(e)),
        }
        i = i.wrapping_add(1);
    }
}
