//! Host → device (and back) copy bandwidth from pageable memory and from a
//! pinned staging buffer of `gpu::pinned`'s pool, on GPU 0 (or `--device N`),
//! for a few sizes.
//!
//! ```text
//! cargo run --release --example pinned_bandwidth [-- --device 0]
//! ```
//!
//! Without a usable GPU it prints why and exits 0. On an H200 (2026-11-26,
//! `scripts/device_check.sh`): 54 GB/s pinned vs 13-16 GB/s pageable at
//! 16-64 MiB, both directions.

use std::time::Instant;

use cudarc::driver::{result, CudaContext};
use shardserve::gpu::{pinned, GpuInventory};

const SIZES: [usize; 4] = [256 * 1024, 4 << 20, 16 << 20, 64 << 20];
const ROUNDS: usize = 20;

fn main() -> Result<(), String> {
    let device: i32 = std::env::args()
        .skip_while(|a| a != "--device")
        .nth(1)
        .map(|d| d.parse().map_err(|e| format!("--device: {e}")))
        .transpose()?
        .unwrap_or(0);
    if let Some(reason) = shardserve::shm::cuda::unavailable() {
        println!("SKIPPED: no usable GPU ({reason})");
        return Ok(());
    }
    let Some(gpu) = GpuInventory::shared().gpus.iter().find(|g| g.id == device) else {
        println!("SKIPPED: no GPU {device} among this machine's usable GPUs");
        return Ok(());
    };
    let ctx = CudaContext::new(device as usize).map_err(|e| format!("context: {e}"))?;
    let largest = SIZES[SIZES.len() - 1];
    // SAFETY: a plain device allocation in the bound context, freed below.
    let dev = unsafe { result::malloc_sync(largest) }.map_err(|e| format!("cuMemAlloc: {e}"))?;
    let pool = pinned::pool_for_node(gpu.numa_node);
    println!(
        "GPU {device} ({}), NUMA node {:?}; {ROUNDS} copies per figure",
        gpu.name, gpu.numa_node
    );
    println!(
        "{:>10} {:>14} {:>14} {:>14} {:>14}",
        "bytes", "H2D pageable", "H2D pinned", "D2H pageable", "D2H pinned"
    );
    for size in SIZES {
        let mut pageable = vec![1u8; size];
        let Some(mut staged) = pool.take(size) else {
            return Err(format!("the staging pool has no buffer of {size} bytes"));
        };
        staged.fill(1);
        let h2d = |src: &[u8]| -> Result<f64, String> {
            let t = Instant::now();
            for _ in 0..ROUNDS {
                // SAFETY: `dev` holds `largest >= src.len()` bytes.
                unsafe { result::memcpy_htod_sync(dev, src) }.map_err(|e| e.to_string())?;
            }
            Ok((size * ROUNDS) as f64 / t.elapsed().as_secs_f64() / 1e9)
        };
        let d2h = |dst: &mut [u8]| -> Result<f64, String> {
            let t = Instant::now();
            for _ in 0..ROUNDS {
                // SAFETY: as above.
                unsafe { result::memcpy_dtoh_sync(dst, dev) }.map_err(|e| e.to_string())?;
            }
            Ok((size * ROUNDS) as f64 / t.elapsed().as_secs_f64() / 1e9)
        };
        // One warm-up of each, then the timed rounds.
        h2d(&pageable)?;
        h2d(&staged)?;
        let figures = [
            h2d(&pageable)?,
            h2d(&staged)?,
            d2h(&mut pageable)?,
            d2h(&mut staged)?,
        ];
        println!(
            "{size:>10} {:>11.2} GB/s {:>9.2} GB/s {:>9.2} GB/s {:>9.2} GB/s",
            figures[0], figures[1], figures[2], figures[3]
        );
    }
    let stats = pool.stats();
    println!(
        "staging pool: {} buffers ({} pinned), {} bytes; unpinned reason: {:?}; unbound reason: {:?}",
        stats.buffers,
        stats.pinned_buffers,
        stats.total_bytes,
        stats.unpinned_reason,
        stats.unbound_reason
    );
    ctx.bind_to_thread().map_err(|e| e.to_string())?;
    // SAFETY: allocated above, no copy in flight (all synchronous).
    unsafe { result::free_sync(dev) }.map_err(|e| format!("cuMemFree: {e}"))?;
    Ok(())
}
