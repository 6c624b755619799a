//! GPUs: which ones this process can use (the CUDA driver, loaded at run
//! time), where they sit (PCI bus id and NUMA node from hwloc), and their
//! metrics (NVML, loaded at run time). Without a driver there are no GPUs
//! and nothing here fails: `KIND_GPU` models are refused at load with
//! Triton's reason, `KIND_AUTO` resolves to CPU, GPU metrics are absent.

#[cfg(feature = "cuda")]
mod cuda;
mod inventory;
pub mod nvml;
pub mod pinned;

pub use inventory::{CudaDevice, Gpu, GpuInventory};

#[cfg(feature = "cuda")]
pub use cuda::IpcMemory;

/// Without the `cuda` feature no IPC memory can be opened; the type
/// exists so callers compile the same in both builds.
#[cfg(not(feature = "cuda"))]
#[derive(Debug)]
pub struct IpcMemory(std::convert::Infallible);

#[cfg(not(feature = "cuda"))]
impl IpcMemory {
    pub fn open(_device: i32, _handle: &[u8; 64]) -> Result<Self, String> {
        Err("built without the `cuda` feature".to_string())
    }
    pub fn available(&self) -> usize {
        match self.0 {}
    }
    pub fn read(&self, _offset: usize, _dst: &mut [u8]) -> Result<(), String> {
        match self.0 {}
    }
    pub fn write(&self, _offset: usize, _src: &[u8]) -> Result<(), String> {
        match self.0 {}
    }
}

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
