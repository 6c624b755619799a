//! How every monoio runtime of the process sets up its io_uring.
//!
//! A completion (a socket's readiness behind poll-based I/O, the eventfd
//! read that carries a compute worker's or another shard's wake, a timer)
//! is posted to a ring by task work that runs in the ring's own thread. By
//! default the kernel kicks that thread with an inter-processor interrupt
//! when it is running (`TWA_SIGNAL`), so that the completion shows up at
//! once. But a shard that is running reaps its completions at its next
//! submit or park anyway, and a spinning one (`shard::spin`) enters the
//! kernel every round: the interrupt (a VM exit on virtual machines) only
//! costs. `IORING_SETUP_COOP_TASKRUN` (Linux 5.19) drops the kick; the
//! task work runs at the thread's next entry into the kernel, and a thread
//! asleep in its ring is woken as before. Measured on the 2-core VM
//! (server on CPU 0 with one shard, generator on CPU 1, 5 alternated
//! rounds): `mlp_onnx` at concurrency 64, whose completions come from its
//! compute worker on the same core, 12,384 -> 12,945 infer/s (+4.5 %) with
//! reschedule interrupts on the server's CPU down from 0.18 to 0.04 per
//! inference; `mlp_onnx_dyna` +1 %; `simple` at concurrency 1 unchanged.

use std::sync::OnceLock;

use monoio::RuntimeBuilder;

/// Entries of each ring (monoio's default).
const ENTRIES: u32 = 1024;

/// Whether this kernel accepts `IORING_SETUP_COOP_TASKRUN` (tried once on
/// a small ring; an older kernel refuses the flag with `EINVAL`, and a
/// runtime asked for it would then fall back to epoll altogether).
fn coop_taskrun() -> bool {
    static SUPPORTED: OnceLock<bool> = OnceLock::new();
    *SUPPORTED.get_or_init(|| {
        let ok = io_uring::IoUring::<io_uring::squeue::Entry>::builder()
            .setup_coop_taskrun()
            .build(8)
            .is_ok();
        if !ok {
            tracing::debug!("io_uring: no COOP_TASKRUN on this kernel; completions of a running thread are signalled");
        }
        ok
    })
}

/// A runtime builder for driver `D` with this process's ring set-up.
pub fn runtime_builder<D>() -> RuntimeBuilder<D> {
    let mut ring = io_uring::IoUring::builder();
    if coop_taskrun() {
        ring.setup_coop_taskrun();
    }
    RuntimeBuilder::<D>::new()
        .with_entries(ENTRIES)
        .uring_builder(ring)
}

#[cfg(test)]
mod tests {
    use monoio::{FusionDriver, FusionRuntime};

    /// A flag the kernel refused would make monoio's fusion builder fall
    /// back to epoll without a word: where a plain ring can be made, ours
    /// must be io_uring too.
    #[test]
    fn the_set_up_keeps_io_uring_where_the_kernel_has_it() {
        let plain = io_uring::IoUring::<io_uring::squeue::Entry>::new(8).is_ok();
        let rt = super::runtime_builder::<FusionDriver>()
            .enable_timer()
            .build()
            .expect("a runtime");
        assert_eq!(matches!(rt, FusionRuntime::Uring(_)), plain);
    }

    #[test]
    fn a_runtime_built_with_it_runs_tasks() {
        let mut rt = super::runtime_builder::<FusionDriver>()
            .enable_timer()
            .build()
            .expect("a runtime");
        let got = rt.block_on(async {
            let (tx, rx) = futures::channel::oneshot::channel();
            monoio::spawn(async move {
                monoio::time::sleep(std::time::Duration::from_millis(1)).await;
                let _ = tx.send(7);
            });
            rx.await
        });
        assert_eq!(got, Ok(7));
    }
}
