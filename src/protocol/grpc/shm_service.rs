//! The shared memory RPCs of `GRPCInferenceService`: system shared
//! memory through `crate::shm`'s registry; CUDA shared memory answered as
//! Triton built without GPU support answers it.

use tonic::Status;

use super::status::to_status;
use crate::{
    error_texts,
    proto::inference::{
        cuda_shared_memory_status_response, system_shared_memory_status_response,
        CudaSharedMemoryRegisterRequest, CudaSharedMemoryRegisterResponse,
        CudaSharedMemoryStatusRequest, CudaSharedMemoryStatusResponse,
        SystemSharedMemoryRegisterRequest, SystemSharedMemoryRegisterResponse,
        SystemSharedMemoryStatusRequest, SystemSharedMemoryStatusResponse,
        SystemSharedMemoryUnregisterRequest, SystemSharedMemoryUnregisterResponse,
    },
    shm,
};

pub(super) fn system_status(
    req: SystemSharedMemoryStatusRequest,
) -> Result<SystemSharedMemoryStatusResponse, Status> {
    let regions = shm::global().status(&req.name).map_err(to_status)?;
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
        .register(&req.name, &req.key, req.offset, req.byte_size)
        .map_err(to_status)?;
    Ok(SystemSharedMemoryRegisterResponse {})
}

pub(super) fn system_unregister(
    req: SystemSharedMemoryUnregisterRequest,
) -> Result<SystemSharedMemoryUnregisterResponse, Status> {
    let registry = shm::global();
    if req.name.is_empty() {
        registry.unregister_all()
    } else {
        registry.unregister(&req.name)
    }
    .map_err(to_status)?;
    Ok(SystemSharedMemoryUnregisterResponse {})
}

pub(super) fn cuda_status(
    req: CudaSharedMemoryStatusRequest,
) -> Result<CudaSharedMemoryStatusResponse, Status> {
    if !req.name.is_empty() {
        return Err(to_status(error_texts::cuda_shm_unknown_region(&req.name)));
    }
    Ok(CudaSharedMemoryStatusResponse {
        regions: std::collections::HashMap::<
            String,
            cuda_shared_memory_status_response::RegionStatus,
        >::new(),
    })
}

pub(super) fn cuda_register(
    req: CudaSharedMemoryRegisterRequest,
) -> Result<CudaSharedMemoryRegisterResponse, Status> {
    Err(to_status(error_texts::cuda_shm_register_no_gpu(&req.name)))
}
