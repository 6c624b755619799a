//! Input staging for GPU instances: each input tensor's bytes are copied
//! into a page-locked buffer of the instance's NUMA-node pool
//! ([`crate::gpu::pinned`]) and ORT is given a view over that buffer, so
//! the CUDA execution provider's host → device copy reads pinned memory
//! (DMA at full PCIe speed) instead of bouncing pageable request memory
//! through the driver's own small pinned buffer.
//!
//! Why a copy at all: request bytes live wherever the network layer put
//! them (pageable, often a slice of a larger body), and pinning them in
//! place would cost a `cuMemHostRegister` per request, far more than a
//! `memcpy` into a buffer pinned once and reused.
//!
//! What is staged: the fixed-size types ORT receives as views of our bytes
//! (integers, FP32, FP64; see `convert::to_ort`). Not staged:
//! - FP16, BF16 and BOOL: `convert` already copies them into a tensor ORT
//!   allocates (ort has no Rust element type for the first two without its
//!   `half` feature; BOOL bytes are normalised to 0/1), so a staging copy
//!   would be a second, wasted one. They reach the GPU from ORT's own
//!   pageable allocation.
//! - BYTES: ONNX string tensors are arrays of C++ strings that ORT builds
//!   itself; they cannot be a view of anything, and the CUDA provider does
//!   not run string kernels (they stay on the CPU).
//! - Empty tensors: nothing to copy.
//!
//! When the pool has no buffer (its bound reached, the tensor above the
//! largest class, a capacity of 0) the tensor goes to ORT from request
//! memory as it would without staging; the caller counts these.
//!
//! A staged tensor's `data` is a `Bytes` owning its `StagingBuffer`: the
//! buffer lives as long as the staged tensors (and ORT's views borrowing
//! them), i.e. past `Session::run`, and goes back to the pool when they
//! are dropped. The buffer starts on a page boundary, so the view is
//! always aligned: staging also spares unaligned inputs `convert`'s
//! element-by-element copy.
//!
//! The GPU side of this (the CUDA provider's copy from the registered
//! buffer) has never run on a GPU in this project; the unit tests check the
//! host side with fake pinners, and that a CPU session accepts staged views.

use std::borrow::Cow;

use bytes::Bytes;

use crate::{
    gpu::pinned::StagingPool,
    types::{DataType, Tensor},
};

/// What one [`stage_inputs`] call did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StageStats {
    /// Tensors copied into a staging buffer.
    pub staged: usize,
    /// Of those, how many went into a pinned buffer (the rest: the pool's
    /// buffers are pageable, see `PoolStats::unpinned_reason`).
    pub pinned: usize,
    /// Bytes copied into staging buffers.
    pub staged_bytes: usize,
    /// Stageable tensors the pool had no buffer for: given to ORT from
    /// request memory.
    pub fallback: usize,
    /// Tensors never staged (empty, FP16, BF16, BOOL, BYTES).
    pub skipped: usize,
}

/// Whether ORT receives tensors of `dt` as a view of our bytes (the types
/// `convert::to_ort` hands over without a copy of its own).
pub fn is_stageable(dt: DataType) -> bool {
    !matches!(
        dt,
        DataType::Fp16 | DataType::Bf16 | DataType::Bool | DataType::Bytes
    )
}

/// Copies each stageable input into a buffer from `pool`. The result has
/// one entry per input, in order: a staged copy (same name, datatype and
/// shape, `data` in the staging buffer) or the input itself.
///
/// Inputs are staged as they are: a tensor whose size does not match its
/// shape is copied anyway and rejected by `convert::to_ort` as it would be
/// without staging.
pub fn stage_inputs<'a>(
    pool: &StagingPool,
    inputs: &'a [Tensor],
) -> (Vec<Cow<'a, Tensor>>, StageStats) {
    let mut stats = StageStats::default();
    let staged = inputs
        .iter()
        .map(|t| {
            if t.data.is_empty() || !is_stageable(t.datatype) {
                stats.skipped += 1;
                return Cow::Borrowed(t);
            }
            let Some(mut buffer) = pool.take(t.data.len()) else {
                stats.fallback += 1;
                return Cow::Borrowed(t);
            };
            buffer.copy_from_slice(&t.data);
            stats.staged += 1;
            stats.pinned += usize::from(buffer.is_pinned());
            stats.staged_bytes += t.data.len();
            Cow::Owned(Tensor::new(
                t.name.clone(),
                t.datatype,
                t.shape.clone(),
                Bytes::from_owner(buffer),
            ))
        })
        .collect();
    (staged, stats)
}

#[cfg(test)]
mod tests {
    use std::{
        ptr::NonNull,
        sync::{
            atomic::{AtomicUsize, Ordering},
            Arc,
        },
    };

    use super::*;
    use crate::gpu::pinned::{Pinner, MIN_CLASS};

    /// Pins by counting: the host side of a CUDA registration.
    #[derive(Debug, Default)]
    struct CountingPinner {
        pins: AtomicUsize,
    }

    impl Pinner for CountingPinner {
        fn pin(&self, _: NonNull<u8>, _: usize) -> Result<(), String> {
            self.pins.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        fn unpin(&self, _: NonNull<u8>, _: usize) {}
    }

    const MIB: usize = 1024 * 1024;

    fn pool(capacity: usize, max_buffer: usize) -> (StagingPool, Arc<CountingPinner>) {
        let pinner = Arc::new(CountingPinner::default());
        (
            StagingPool::new(None, capacity, max_buffer, pinner.clone()),
            pinner,
        )
    }

    fn tensor(name: &str, dt: DataType, shape: Vec<i64>, len: usize) -> Tensor {
        let data: Vec<u8> = (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ 0x5a)
            .collect();
        Tensor::new(name, dt, shape, Bytes::from(data))
    }

    #[test]
    fn staged_inputs_keep_bytes_names_shapes_and_types() {
        let (pool, pinner) = pool(8 * MIB, MIB);
        let inputs = vec![
            tensor("A", DataType::Fp32, vec![2, 1000], 8000),
            tensor("B", DataType::Int64, vec![3], 24),
            tensor("C", DataType::Uint8, vec![100_000], 100_000),
        ];
        let (staged, stats) = stage_inputs(&pool, &inputs);
        assert_eq!(
            stats,
            StageStats {
                staged: 3,
                pinned: 3,
                staged_bytes: 108_024,
                fallback: 0,
                skipped: 0,
            }
        );
        assert_eq!(pinner.pins.load(Ordering::SeqCst), 3);
        for (s, t) in staged.iter().zip(&inputs) {
            assert!(matches!(s, Cow::Owned(_)), "{} is staged", t.name);
            assert_eq!(s.name, t.name);
            assert_eq!(s.datatype, t.datatype);
            assert_eq!(s.shape, t.shape);
            assert_eq!(s.data, t.data, "{}: identical bytes", t.name);
            assert_ne!(
                s.data.as_ptr(),
                t.data.as_ptr(),
                "a copy, not the request's bytes"
            );
            assert_eq!(
                s.data.as_ptr() as usize % 4096,
                0,
                "page-aligned, so ORT can view it as any element type"
            );
        }
    }

    #[test]
    fn buffers_go_back_to_the_pool_and_are_reused() {
        let (pool, pinner) = pool(8 * MIB, MIB);
        let inputs = vec![
            tensor("A", DataType::Fp32, vec![1000], 4000),
            tensor("B", DataType::Int32, vec![1000], 4000),
        ];
        for _ in 0..5 {
            let (staged, stats) = stage_inputs(&pool, &inputs);
            assert_eq!(stats.staged, 2);
            // While held, both buffers are out of the free list.
            assert_eq!(pool.stats().buffers, 2);
            drop(staged);
        }
        let s = pool.stats();
        assert_eq!((s.created, s.reused, s.buffers), (2, 8, 2));
        assert_eq!(s.total_bytes, 2 * MIN_CLASS);
        assert_eq!(pinner.pins.load(Ordering::SeqCst), 2, "pinned once each");
    }

    #[test]
    fn an_exhausted_pool_falls_back_to_request_memory() {
        // Room for one 64 KiB buffer only.
        let (pool, _) = pool(MIN_CLASS, MIB);
        let inputs = vec![
            tensor("A", DataType::Fp32, vec![10], 40),
            tensor("B", DataType::Fp32, vec![10], 40),
        ];
        let (staged, stats) = stage_inputs(&pool, &inputs);
        assert_eq!((stats.staged, stats.fallback), (1, 1));
        assert!(matches!(staged[0], Cow::Owned(_)));
        assert!(matches!(staged[1], Cow::Borrowed(_)));
        assert_eq!(staged[1].data.as_ptr(), inputs[1].data.as_ptr());
        assert_eq!(staged[1].data, inputs[1].data);
        drop(staged);
        // The buffer came back: the next call stages the first input again.
        let (_, stats) = stage_inputs(&pool, &inputs);
        assert_eq!((stats.staged, stats.fallback), (1, 1));
        assert_eq!(pool.stats().refused, 2);
    }

    #[test]
    fn a_zero_capacity_pool_or_an_oversized_tensor_stages_nothing() {
        let (zero, _) = pool(0, MIB);
        let inputs = vec![tensor("A", DataType::Fp32, vec![4], 16)];
        let (staged, stats) = stage_inputs(&zero, &inputs);
        assert_eq!((stats.staged, stats.fallback), (0, 1));
        assert!(matches!(staged[0], Cow::Borrowed(_)));
        assert_eq!(zero.stats().buffers, 0);

        let (small, _) = pool(8 * MIB, MIN_CLASS);
        let big = vec![tensor("A", DataType::Uint8, vec![70_000], 70_000)];
        let (staged, stats) = stage_inputs(&small, &big);
        assert_eq!((stats.staged, stats.fallback), (0, 1));
        assert_eq!(staged[0].data, big[0].data);
    }

    #[test]
    fn strings_half_floats_bools_and_empty_tensors_are_not_staged() {
        let (pool, _) = pool(8 * MIB, MIB);
        let inputs = vec![
            Tensor::new(
                "S",
                DataType::Bytes,
                vec![1],
                crate::types::encode_bytes_elements([&b"abc"[..]]),
            ),
            tensor("H", DataType::Fp16, vec![4], 8),
            tensor("BF", DataType::Bf16, vec![4], 8),
            tensor("Q", DataType::Bool, vec![4], 4),
            Tensor::new("E", DataType::Fp32, vec![0, 4], Bytes::new()),
            tensor("F", DataType::Fp32, vec![4], 16),
        ];
        let (staged, stats) = stage_inputs(&pool, &inputs);
        assert_eq!((stats.skipped, stats.staged, stats.fallback), (5, 1, 0));
        for (s, t) in staged.iter().zip(&inputs).take(5) {
            assert!(
                matches!(s, Cow::Borrowed(_)),
                "{} is given as it is",
                t.name
            );
        }
        assert!(matches!(staged[5], Cow::Owned(_)));
        assert_eq!(pool.stats().buffers, 1);
    }

    #[test]
    fn staged_tensors_can_leave_the_thread_and_still_return_their_buffer() {
        let (pool, _) = pool(8 * MIB, MIB);
        let inputs = vec![tensor("A", DataType::Fp32, vec![4], 16)];
        let (staged, _) = stage_inputs(&pool, &inputs);
        let owned: Vec<Tensor> = staged.into_iter().map(Cow::into_owned).collect();
        std::thread::spawn(move || assert_eq!(owned[0].data.len(), 16))
            .join()
            .expect("thread");
        let (_, stats) = stage_inputs(&pool, &inputs);
        assert_eq!(stats.staged, 1);
        assert_eq!(pool.stats().reused, 1);
    }
}
