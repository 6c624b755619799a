//! Triton's CUDA shared memory extension: clients register device memory
//! of their own process by its CUDA IPC handle (`/v2/cudasharedmemory`,
//! gRPC `CudaSharedMemory*`), then name it in inference requests with the
//! same tensor parameters as system shared memory.
//!
//! - Register opens the handle on the named device (`gpu::IpcMemory`:
//!   `cuIpcOpenMemHandle` in the device's primary context) and checks the
//!   size against the allocation, as Triton does; unregister closes it once
//!   no request holds the region (`Arc`).
//! - Inputs in a CUDA region are copied device → host into the request's
//!   tensor, into a pinned staging buffer of the GPU's NUMA node when the
//!   pool has one (`gpu::pinned`), pageable memory otherwise. Backends then
//!   see ordinary host tensors; handing device pointers to ONNX Runtime
//!   (IoBinding) is not done.
//! - Outputs requested into a CUDA region are copied host → device after
//!   the model ran.
//! - Copies are synchronous on the calling thread (the shard decoding the
//!   request or encoding the response): a few MiB cost a shard well under
//!   a millisecond over PCIe, but the shard serves nothing else meanwhile.
//!
//! Without a usable GPU (no driver, no device, built without `cuda`),
//! register answers Triton's "GPUs not supported" error, status lists
//! nothing and the server serves on; `cuda_shared_memory` is then not in
//! the server's extensions.
//!
//! Never run against a real GPU on this project's machines: the device
//! side (`gpu::IpcMemory`) is written from the CUDA driver API docs.

use std::sync::Arc;

use bytes::Bytes;

use super::registry::{Region, Registry, Usage};
use crate::{
    error_texts,
    gpu::{pinned, GpuInventory, IpcMemory},
    types::{clip, InferError},
};

/// Bytes of a `cudaIpcMemHandle_t`.
pub const IPC_HANDLE_SIZE: usize = 64;

/// A registered CUDA region.
#[derive(Debug)]
pub struct CudaRegion {
    pub name: String,
    pub device_id: i64,
    pub byte_size: u64,
    memory: DeviceMemory,
    /// The GPU's NUMA node: where its staging buffers live.
    numa_node: Option<usize>,
    pub(super) usage: Usage,
}

/// Where a CUDA region's bytes are.
#[derive(Debug)]
enum DeviceMemory {
    Ipc(IpcMemory),
    /// Host bytes standing in for device memory, so that unit tests on
    /// machines without a GPU can register CUDA regions.
    #[cfg(test)]
    Fake(std::sync::Mutex<Vec<u8>>),
}

impl DeviceMemory {
    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), String> {
        match self {
            Self::Ipc(m) => m.read(offset, dst),
            #[cfg(test)]
            Self::Fake(m) => {
                let m = m.lock().map_err(|e| e.to_string())?;
                let src = m
                    .get(offset..offset + dst.len())
                    .ok_or_else(|| "out of range".to_string())?;
                dst.copy_from_slice(src);
                Ok(())
            }
        }
    }

    fn write(&self, offset: usize, src: &[u8]) -> Result<(), String> {
        match self {
            Self::Ipc(m) => m.write(offset, src),
            #[cfg(test)]
            Self::Fake(m) => {
                let mut m = m.lock().map_err(|e| e.to_string())?;
                m.get_mut(offset..offset + src.len())
                    .ok_or_else(|| "out of range".to_string())?
                    .copy_from_slice(src);
                Ok(())
            }
        }
    }
}

impl CudaRegion {
    /// A region over `byte_size` bytes of host memory, for unit tests.
    #[cfg(test)]
    pub(super) fn fake(name: &str, byte_size: usize) -> Self {
        Self {
            name: name.to_string(),
            device_id: 0,
            byte_size: byte_size as u64,
            memory: DeviceMemory::Fake(std::sync::Mutex::new(vec![0; byte_size])),
            numa_node: None,
            usage: Usage::default(),
        }
    }

    /// `len` bytes at `offset` (checked against `byte_size` by the caller),
    /// copied to host memory.
    pub fn read(&self, offset: usize, len: usize) -> Result<Bytes, InferError> {
        let copy_error = |e: String| {
            tracing::error!(region = %self.name, error = %e, "copy from CUDA shared memory failed");
            InferError::internal(format!(
                "failed to copy from CUDA shared memory region '{}': {e}",
                clip(&self.name)
            ))
        };
        if let Some(mut staged) = pinned::pool_for_node(self.numa_node).take(len) {
            self.memory.read(offset, &mut staged).map_err(copy_error)?;
            return Ok(Bytes::from_owner(staged));
        }
        let mut data = vec![0u8; len];
        self.memory.read(offset, &mut data).map_err(copy_error)?;
        Ok(Bytes::from(data))
    }

    /// Copies `data` to `offset` of the region.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), InferError> {
        self.memory.write(offset, data).map_err(|e| {
            tracing::error!(region = %self.name, error = %e, "copy to CUDA shared memory failed");
            InferError::internal(format!(
                "failed to copy to CUDA shared memory region '{}': {e}",
                clip(&self.name)
            ))
        })
    }
}

/// Why this server cannot use CUDA shared memory, or `None` when it can.
pub fn unavailable() -> Option<String> {
    if !cfg!(feature = "cuda") {
        return Some("built without the `cuda` feature".to_string());
    }
    let inventory = GpuInventory::shared();
    inventory.gpus.is_empty().then(|| {
        inventory
            .absent
            .clone()
            .unwrap_or_else(|| "no GPU".to_string())
    })
}

/// Triton's "invalid args" answer for a handle it cannot open.
fn cannot_open() -> InferError {
    InferError::invalid("failed to register shared memory region: invalid args")
}

impl Registry {
    /// Registers `name` → the device memory `raw_handle` names on
    /// `device_id`, of `byte_size` bytes. Errors are Triton's texts, in
    /// Triton's order of checks.
    pub fn register_cuda(
        &self,
        name: &str,
        raw_handle: &[u8],
        device_id: i64,
        byte_size: u64,
    ) -> Result<(), InferError> {
        if let Some(reason) = unavailable() {
            tracing::debug!(name, reason, "CUDA shared memory register refused");
            return Err(error_texts::cuda_shm_register_no_gpu(name));
        }
        if name.is_empty() {
            return Err(error_texts::cuda_shm_register_no_name());
        }
        let handle: &[u8; IPC_HANDLE_SIZE] = raw_handle
            .try_into()
            .map_err(|_| error_texts::cuda_shm_bad_handle())?;
        // Cheap refusal before the driver; `insert` decides, since the
        // handle is opened outside the lock.
        if self.contains(name)? {
            return Err(error_texts::shm_already_registered(name));
        }
        let gpu = i32::try_from(device_id)
            .ok()
            .and_then(|id| GpuInventory::shared().gpus.iter().find(|g| g.id == id));
        let Some(gpu) = gpu else {
            tracing::error!(name, device_id, "CUDA shared memory: no such GPU");
            return Err(cannot_open());
        };
        let memory = IpcMemory::open(gpu.id, handle).map_err(|e| {
            // Triton logs the driver's reason and answers a generic error.
            tracing::error!(name, device_id, error = %e, "failed to open CUDA IPC handle");
            cannot_open()
        })?;
        if usize::try_from(byte_size).map_or(true, |b| b > memory.available()) {
            tracing::error!(
                name,
                byte_size,
                available = memory.available(),
                "CUDA shared memory region larger than its allocation"
            );
            return Err(error_texts::shm_register_invalid_args(name));
        }
        // Refused here, the handle is closed on return.
        self.insert(Region::Cuda(Arc::new(CudaRegion {
            name: name.to_string(),
            device_id,
            byte_size,
            memory: DeviceMemory::Ipc(memory),
            numa_node: gpu.numa_node,
            usage: Usage::default(),
        })))?;
        tracing::debug!(name, device_id, byte_size, "registered CUDA shared memory");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{shm::Kind, types::ErrorKind};

    #[test]
    fn without_a_gpu_register_answers_tritons_no_gpu_error_first() {
        if unavailable().is_none() {
            println!("SKIPPED: this machine has a GPU; the no-GPU answer does not apply");
            return;
        }
        let reg = Registry::default();
        // Even a malformed handle gets the no-GPU answer, as from Triton
        // built without GPU support.
        let e = reg.register_cuda("c", b"short", 0, 64).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert_eq!(
            e.message,
            "failed to register CUDA shared memory region: 'c', GPUs not supported"
        );
        assert!(reg.cuda_status("").unwrap().is_empty());
        let e = reg.cuda_status("c").unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotFound);
        assert_eq!(e.message, "Unable to find cuda shared memory region: 'c'");
        reg.unregister("c", Kind::Cuda).unwrap();
        reg.unregister_all(Kind::Cuda).unwrap();
    }

    #[test]
    fn with_a_gpu_malformed_handles_are_refused_before_the_driver() {
        if let Some(reason) = unavailable() {
            println!("SKIPPED: no usable GPU ({reason})");
            return;
        }
        let reg = Registry::default();
        let e = reg.register_cuda("c", &[0u8; 10], 0, 64).unwrap_err();
        assert_eq!(
            e.message,
            "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t"
        );
        // 64 zero bytes are no handle the driver knows.
        let e = reg.register_cuda("c", &[0u8; 64], 0, 64).unwrap_err();
        assert_eq!(
            e.message,
            "failed to register shared memory region: invalid args"
        );
        assert!(!reg.contains("c").unwrap());
    }

    /// The request path over a CUDA region (host memory standing in for
    /// the device): an input is found by the one lookup and copied out,
    /// an output is copied in and leaves the response without data.
    #[test]
    fn requests_read_and_write_a_cuda_region() {
        use crate::{
            shm::{finish, read_input, RequestRegions, ShmRef, BYTE_SIZE, OFFSET, REGION},
            types::{DataType, InferResponse, ParamValue, RequestedOutput, Tensor},
        };
        let name = "cuda-unit-request-path";
        let region = Arc::new(CudaRegion::fake(name, 64));
        region.write(0, &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        let registry = crate::shm::global();
        registry.insert(Region::Cuda(Arc::clone(&region))).unwrap();

        let input = ShmRef {
            region: name.into(),
            offset: 0,
            byte_size: Some(8),
        };
        let data = read_input(&input, DataType::Uint8, 8, &[8], "X", "m").unwrap();
        assert_eq!(&data[..], &[1, 2, 3, 4, 5, 6, 7, 8]);
        let e = read_input(&input, DataType::Int32, 1, &[1], "X", "m").unwrap_err();
        assert!(
            e.message
                .contains("input byte size mismatch for input 'X' for model 'm'"),
            "{}",
            e.message
        );

        let requested = [RequestedOutput {
            name: "Y".into(),
            parameters: [
                (REGION.to_string(), ParamValue::String(name.into())),
                (OFFSET.to_string(), ParamValue::Int(16)),
                (BYTE_SIZE.to_string(), ParamValue::Int(4)),
            ]
            .into_iter()
            .collect(),
        }];
        let regions = RequestRegions::resolve(&[], &requested, "m")
            .unwrap()
            .expect("an output goes to a region");
        let response = InferResponse {
            outputs: vec![Tensor::new(
                "Y",
                DataType::Uint8,
                vec![4],
                Bytes::from_static(&[9, 9, 9, 9]),
            )],
            ..Default::default()
        };
        let response = finish(Some(&regions), Ok(response)).unwrap();
        assert!(response.outputs[0].data.is_empty());
        assert_eq!(&region.read(16, 4).unwrap()[..], &[9, 9, 9, 9]);

        // Held by the request's regions: unregistering is deferred, as in
        // Triton, and completes once they are dropped.
        registry.unregister(name, Kind::Cuda).unwrap();
        assert!(registry.contains(name).unwrap());
        drop((regions, region));
        assert!(!registry.contains(name).unwrap());
        let e = read_input(&input, DataType::Uint8, 8, &[8], "X", "m").unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotFound);
    }
}
