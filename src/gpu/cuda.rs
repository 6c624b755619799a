//! GPU discovery through the CUDA driver API (cudarc with dynamic
//! loading). cudarc panics on its first call when `libcuda.so` is missing,
//! so presence is checked first, and the calls run under `catch_unwind`
//! too: a driver too old for a symbol must not take the server down.
//!
//! No context is created (a primary context costs hundreds of MiB of
//! device memory): only the device attribute queries, which need `cuInit`.
//!
//! Not exercised on this project's CI machines (no GPU, no driver): there
//! only the "no driver" branch runs.

use std::ffi::{c_char, CStr};

use cudarc::driver::{result, sys};

use super::CudaDevice;

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
