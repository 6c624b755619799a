//! GPU discovery through the CUDA driver API (cudarc with dynamic
//! loading). cudarc panics on its first call when `libcuda.so` is missing,
//! so presence is checked first, and the calls run under `catch_unwind`
//! too: a driver too old for a symbol must not take the server down.
//!
//! Discovery creates no context (a primary context costs hundreds of MiB
//! of device memory): only the device attribute queries, which need
//! `cuInit`. CUDA shared memory and pinned staging buffers retain the
//! device's primary context on first use (`context`).
//!
//! Not exercised on this project's CI machines (no GPU, no driver): there
//! only the "no driver" branch runs.

use std::{
    collections::HashMap,
    ffi::{c_char, CStr},
    ptr::NonNull,
    sync::{Arc, Mutex, OnceLock},
};

use cudarc::driver::{result, sys, CudaContext};

use super::{pinned::Pinner, CudaDevice};

pub fn devices() -> Result<Vec<CudaDevice>, String> {
    // SAFETY: only tries to dlopen the driver library by its usual names.
    if !unsafe { sys::is_culib_present() } {
        return Err("no CUDA driver (libcuda.so.1) found".to_string());
    }
    std::panic::catch_unwind(query)
        .unwrap_or_else(|_| Err("the CUDA driver library could not be used".to_string()))
}

fn query() -> Result<Vec<CudaDevice>, String> {
    result::init().map_err(|e| format!("cuInit: {e}"))?;
    let count = result::device::get_count().map_err(|e| format!("cuDeviceGetCount: {e}"))?;
    let mut devices = Vec::with_capacity(count.max(0) as usize);
    for ordinal in 0..count {
        let dev =
            result::device::get(ordinal).map_err(|e| format!("cuDeviceGet({ordinal}): {e}"))?;
        let name = result::device::get_name(dev).unwrap_or_default();
        // SAFETY: `dev` is a valid device handle returned above.
        let memory_bytes = unsafe { result::device::total_mem(dev) }.unwrap_or(0) as u64;
        let uuid = result::device::get_uuid(dev)
            .ok()
            .map(|u| format_uuid(&u.bytes));
        let mut bus = [0 as c_char; 32];
        // SAFETY: the buffer is 32 bytes and its length is passed; the
        // driver writes a NUL-terminated string into it.
        let rc = unsafe { sys::cuDeviceGetPCIBusId(bus.as_mut_ptr(), bus.len() as i32, dev) };
        let bus_id = if rc == sys::CUresult::CUDA_SUCCESS {
            // SAFETY: NUL-terminated by the driver within the buffer.
            unsafe { CStr::from_ptr(bus.as_ptr()) }
                .to_string_lossy()
                .into_owned()
        } else {
            String::new()
        };
        let (major, minor) = capability(dev);
        devices.push(CudaDevice {
            ordinal,
            name,
            uuid,
            bus_id,
            memory_bytes,
            compute_capability: (major, minor),
        });
    }
    Ok(devices)
}

fn capability(dev: sys::CUdevice) -> (i32, i32) {
    use sys::CUdevice_attribute::*;
    // SAFETY: valid device handle, plain integer attributes.
    unsafe {
        (
            result::device::get_attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
                .unwrap_or(0),
            result::device::get_attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
                .unwrap_or(0),
        )
    }
}

/// NVML's spelling, which Triton's `gpu_uuid` label uses: `GPU-` and the
/// 16 bytes as 8-4-4-4-12 hex digits.
fn format_uuid(bytes: &[c_char; 16]) -> String {
    let hex: Vec<String> = bytes.iter().map(|b| format!("{:02x}", *b as u8)).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex[0..4].concat(),
        hex[4..6].concat(),
        hex[6..8].concat(),
        hex[8..10].concat(),
        hex[10..16].concat()
    )
}

/// The primary context of device `ordinal`, retained once per process
/// and shared by every user here (CUDA shared memory, pinning): ONNX
/// Runtime's CUDA execution provider uses the same primary context, so
/// no extra device memory is spent beyond the first user's.
fn context(ordinal: i32) -> Result<Arc<CudaContext>, String> {
    static CONTEXTS: OnceLock<Mutex<HashMap<i32, Arc<CudaContext>>>> = OnceLock::new();
    let ordinal_usize =
        usize::try_from(ordinal).map_err(|_| format!("invalid CUDA device {ordinal}"))?;
    // SAFETY: only tries to dlopen the driver library.
    if !unsafe { sys::is_culib_present() } {
        return Err("no CUDA driver (libcuda.so.1) found".to_string());
    }
    let mut map = CONTEXTS
        .get_or_init(Default::default)
        .lock()
        .map_err(|_| "the CUDA context table is unusable after a panic".to_string())?;
    if let Some(ctx) = map.get(&ordinal) {
        ctx.bind_to_thread()
            .map_err(|e| format!("binding the context of CUDA device {ordinal}: {e}"))?;
        return Ok(Arc::clone(ctx));
    }
    let ctx = std::panic::catch_unwind(|| CudaContext::new(ordinal_usize))
        .map_err(|_| "the CUDA driver library could not be used".to_string())?
        .map_err(|e| format!("retaining the context of CUDA device {ordinal}: {e}"))?;
    map.insert(ordinal, Arc::clone(&ctx));
    Ok(ctx)
}

/// Pins host memory with `cuMemHostRegister(PORTABLE)`: page-locked for
/// every context, so one pool serves copies to any GPU.
///
/// Never run on this project's machines (no GPU); written from the CUDA
/// driver API documentation.
#[derive(Debug)]
pub struct HostRegister {
    device: i32,
}

impl HostRegister {
    /// Registration needs a current context: `device`'s primary one.
    pub fn new(device: i32) -> Self {
        Self { device }
    }
}

impl Pinner for HostRegister {
    fn pin(&self, ptr: NonNull<u8>, len: usize) -> Result<(), String> {
        context(self.device)?;
        // SAFETY: `[ptr, ptr + len)` is a live mapping the caller owns and
        // keeps until `unpin`.
        let rc = unsafe {
            sys::cuMemHostRegister_v2(ptr.as_ptr().cast(), len, sys::CU_MEMHOSTREGISTER_PORTABLE)
        };
        if rc != sys::CUresult::CUDA_SUCCESS {
            return Err(format!("cuMemHostRegister of {len} bytes: {rc:?}"));
        }
        Ok(())
    }

    fn unpin(&self, ptr: NonNull<u8>, _len: usize) {
        if context(self.device).is_err() {
            return;
        }
        // SAFETY: `ptr` was registered by `pin` and is still mapped.
        let rc = unsafe { sys::cuMemHostUnregister(ptr.as_ptr().cast()) };
        if rc != sys::CUresult::CUDA_SUCCESS {
            tracing::warn!(?rc, "cuMemHostUnregister failed");
        }
    }
}

/// Device memory of another process, opened from its CUDA IPC handle
/// (`cuIpcOpenMemHandle`, as Triton's `cudaIpcOpenMemHandle`); closed when
/// dropped. Copies are synchronous (`cuMemcpyDtoH`/`HtoD` on the null
/// stream), so the bytes are in place when they return.
///
/// Never run on this project's machines (no GPU); written from the CUDA
/// driver API documentation and Triton's `shared_memory_manager.cc`.
#[derive(Debug)]
pub struct IpcMemory {
    ctx: Arc<CudaContext>,
    ptr: sys::CUdeviceptr,
    /// Bytes from `ptr` to the end of the allocation the handle names.
    available: usize,
}

// SAFETY: a device pointer is an integer valid in the (shared, primary)
// context, which every use binds to its thread first.
unsafe impl Send for IpcMemory {}
// SAFETY: as for `Send`; shared uses only read the two integers.
unsafe impl Sync for IpcMemory {}

impl IpcMemory {
    pub fn open(device: i32, handle: &[u8; 64]) -> Result<Self, String> {
        let ctx = context(device)?;
        let mut raw = sys::CUipcMemHandle_st { reserved: [0; 64] };
        for (d, s) in raw.reserved.iter_mut().zip(handle) {
            *d = *s as c_char;
        }
        let opened = std::panic::catch_unwind(|| {
            let mut ptr: sys::CUdeviceptr = 0;
            // SAFETY: valid out-pointer; the handle is 64 opaque bytes that
            // the driver validates.
            let rc = unsafe {
                sys::cuIpcOpenMemHandle_v2(
                    &mut ptr,
                    raw,
                    sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
                )
            };
            if rc != sys::CUresult::CUDA_SUCCESS {
                return Err(format!("cuIpcOpenMemHandle: {rc:?}"));
            }
            let mut base: sys::CUdeviceptr = 0;
            let mut size = 0usize;
            // SAFETY: valid out-pointers, `ptr` was just opened.
            let rc = unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) };
            if rc != sys::CUresult::CUDA_SUCCESS {
                // SAFETY: opened above, not used after.
                unsafe { sys::cuIpcCloseMemHandle(ptr) };
                return Err(format!("cuMemGetAddressRange: {rc:?}"));
            }
            let available = size.saturating_sub((ptr - base) as usize);
            Ok((ptr, available))
        })
        .map_err(|_| "the CUDA driver library could not be used".to_string())??;
        Ok(Self {
            ctx,
            ptr: opened.0,
            available: opened.1,
        })
    }

    /// Bytes usable from the region's start.
    pub fn available(&self) -> usize {
        self.available
    }

    fn checked(&self, offset: usize, len: usize) -> Result<sys::CUdeviceptr, String> {
        offset
            .checked_add(len)
            .filter(|&end| end <= self.available)
            .ok_or_else(|| format!("{len} bytes at {offset} overrun {}", self.available))?;
        Ok(self.ptr + offset as u64)
    }

    /// Copies `dst.len()` bytes from `offset` of the region to `dst`.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), String> {
        let src = self.checked(offset, dst.len())?;
        self.ctx.bind_to_thread().map_err(|e| e.to_string())?;
        // SAFETY: `src..src + len` is inside the opened allocation.
        unsafe { result::memcpy_dtoh_sync(dst, src) }.map_err(|e| format!("cuMemcpyDtoH: {e}"))
    }

    /// Copies `src` to `offset` of the region.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<(), String> {
        let dst = self.checked(offset, src.len())?;
        self.ctx.bind_to_thread().map_err(|e| e.to_string())?;
        // SAFETY: `dst..dst + len` is inside the opened allocation.
        unsafe { result::memcpy_htod_sync(dst, src) }.map_err(|e| format!("cuMemcpyHtoD: {e}"))
    }
}

impl Drop for IpcMemory {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_err() {
            return;
        }
        // SAFETY: opened by `open`, closed once, no copy is in flight
        // (copies are synchronous and hold `&self`).
        let rc = unsafe { sys::cuIpcCloseMemHandle(self.ptr) };
        if rc != sys::CUresult::CUDA_SUCCESS {
            tracing::warn!(?rc, "cuIpcCloseMemHandle failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_spelled_as_nvml_does() {
        let bytes: [c_char; 16] = std::array::from_fn(|i| (i as u8 * 17) as c_char);
        assert_eq!(
            format_uuid(&bytes),
            "GPU-00112233-4455-6677-8899-aabbccddeeff"
        );
    }

    #[test]
    fn no_driver_means_no_gpus_not_a_panic() {
        // On a machine with a driver this lists its GPUs; on one without,
        // it is the reason. Either way it returns.
        match devices() {
            Ok(list) => println!("CUDA devices: {list:?}"),
            Err(reason) => println!("no CUDA devices: {reason}"),
        }
    }
}
