//! GPUs: which ones this process can use (the CUDA driver, loaded at run
//! time), where they sit (PCI bus id and NUMA node from hwloc), and their
//! metrics (NVML, loaded at run time). Without a driver there are no GPUs
//! and nothing here fails: `KIND_GPU` models are refused at load with
//! Triton's reason, `KIND_AUTO` resolves to CPU, GPU metrics are absent.

#[cfg(feature = "cuda")]
mod cuda;
mod inventory;
pub mod nvml;

pub use inventory::{CudaDevice, Gpu, GpuInventory};

/// The CUDA devices the driver reports, or why there are none.
pub fn cuda_devices() -> Result<Vec<CudaDevice>, String> {
    #[cfg(feature = "cuda")]
    {
        cuda::devices()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err("built without the `cuda` feature".to_string())
    }
}
