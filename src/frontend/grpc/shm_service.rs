//! The shared memory RPCs of `GRPCInferenceService`, system and CUDA,
//! through `crate::shm`'s one registry (CUDA answered as Triton built
//! without GPU support answers it when no GPU is usable).

use tonic::Status;

use super::status::to_status;
use crate::{
    proto::inference::{
        cuda_shared_memory_status_response, system_shared_memory_status_response,
        CudaSharedMemoryRegisterRequest, CudaSharedMemoryRegisterResponse,
        CudaSharedMemoryStatusRequest, CudaSharedMemoryStatusResponse,
        CudaSharedMemoryUnregisterRequest, CudaSharedMemoryUnregisterResponse,
        SystemSharedMemoryRegisterRequest, SystemSharedMemoryRegisterResponse,
        SystemSharedMemoryStatusRequest, SystemSharedMemoryStatusResponse,
        SystemSharedMemoryUnregisterRequest, SystemSharedMemoryUnregisterResponse,
    },
    shm,
};

pub(super) fn system_status(
    req: SystemSharedMemoryStatusRequest,
) -> Result<SystemSharedMemoryStatusResponse, Status> {
    let regions = shm::global().system_status(&req.name).map_err(to_status)?;
    Ok(SystemSharedMemoryStatusResponse {
        regions: regions
            .iter()
            .map(|r| {
                (
                    r.name.clone(),
                    system_shared_memory_status_response::RegionStatus {
                        name: r.name.clone(),
                        key: r.key.clone(),
                        offset: r.offset,
                        byte_size: r.byte_size,
                    },
                )
            })
            .collect(),
    })
}

pub(super) fn system_register(
    req: SystemSharedMemoryRegisterRequest,
) -> Result<SystemSharedMemoryRegisterResponse, Status> {
    shm::global()
        .register_system(&req.name, &req.key, req.offset, req.byte_size)
        .map_err(to_status)?;
    Ok(SystemSharedMemoryRegisterResponse {})
}

pub(super) fn system_unregister(
    req: SystemSharedMemoryUnregisterRequest,
) -> Result<SystemSharedMemoryUnregisterResponse, Status> {
    let registry = shm::global();
    if req.name.is_empty() {
        registry.unregister_all(shm::Kind::System)
    } else {
        registry.unregister(&req.name, shm::Kind::System)
    }
    .map_err(to_status)?;
    Ok(SystemSharedMemoryUnregisterResponse {})
}

pub(super) fn cuda_status(
    req: CudaSharedMemoryStatusRequest,
) -> Result<CudaSharedMemoryStatusResponse, Status> {
    let regions = shm::global().cuda_status(&req.name).map_err(to_status)?;
    Ok(CudaSharedMemoryStatusResponse {
        regions: regions
            .iter()
            .map(|r| {
                (
                    r.name.clone(),
                    cuda_shared_memory_status_response::RegionStatus {
                        name: r.name.clone(),
                        device_id: r.device_id as u64,
                        byte_size: r.byte_size,
                    },
                )
            })
            .collect(),
    })
}

pub(super) fn cuda_register(
    req: CudaSharedMemoryRegisterRequest,
) -> Result<CudaSharedMemoryRegisterResponse, Status> {
    // Triton's gRPC handler reads 64 bytes from `raw_handle` whatever its
    // length; here a handle of another length gets the HTTP check's error.
    shm::global()
        .register_cuda(&req.name, &req.raw_handle, req.device_id, req.byte_size)
        .map_err(to_status)?;
    Ok(CudaSharedMemoryRegisterResponse {})
}

pub(super) fn cuda_unregister(
    req: CudaSharedMemoryUnregisterRequest,
) -> Result<CudaSharedMemoryUnregisterResponse, Status> {
    let registry = shm::global();
    if req.name.is_empty() {
        registry.unregister_all(shm::Kind::Cuda)
    } else {
        registry.unregister(&req.name, shm::Kind::Cuda)
    }
    .map_err(to_status)?;
    Ok(CudaSharedMemoryUnregisterResponse {})
}
