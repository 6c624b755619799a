//! A minimal NVML binding, opened at run time (`libnvidia-ml.so.1`, which
//! the NVIDIA driver installs): the readings behind Triton's GPU metrics.
//! cudarc 0.19 has no NVML module, so the few functions used are looked up
//! here with libloading. Without the library, `Nvml::open` says why and
//! the server exports no GPU metrics.
//!
//! Not exercised on this project's CI machines (no driver): there only
//! the "library not found" branch runs.

use std::ffi::{c_char, c_uint, c_ulonglong, c_void, CStr};

use libloading::Library;

type Return = c_uint;
type Device = *mut c_void;
const SUCCESS: Return = 0;

#[repr(C)]
#[derive(Default)]
struct Utilization {
    gpu: c_uint,
    memory: c_uint,
}

#[repr(C)]
#[derive(Default)]
struct Memory {
    total: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

/// One reading of one GPU. A field is `None` when the device does not
/// support the query (NVML_ERROR_NOT_SUPPORTED on some boards).
#[derive(Debug, Clone, PartialEq)]
pub struct GpuReading {
    /// `GPU-…`: Triton's `gpu_uuid` label.
    pub uuid: String,
    /// Fraction of the last sample period the GPU was busy, in [0, 1].
    pub utilization: Option<f64>,
    pub memory_total_bytes: Option<u64>,
    pub memory_used_bytes: Option<u64>,
    pub power_watts: Option<f64>,
    pub power_limit_watts: Option<f64>,
    /// Energy since the driver loaded, in joules.
    pub energy_joules: Option<f64>,
}

/// The NVML functions used, resolved once.
pub struct Nvml {
    device_count: unsafe extern "C" fn(*mut c_uint) -> Return,
    handle_by_index: unsafe extern "C" fn(c_uint, *mut Device) -> Return,
    uuid: unsafe extern "C" fn(Device, *mut c_char, c_uint) -> Return,
    utilization: unsafe extern "C" fn(Device, *mut Utilization) -> Return,
    memory: unsafe extern "C" fn(Device, *mut Memory) -> Return,
    power: unsafe extern "C" fn(Device, *mut c_uint) -> Return,
    power_limit: unsafe extern "C" fn(Device, *mut c_uint) -> Return,
    energy: unsafe extern "C" fn(Device, *mut c_ulonglong) -> Return,
    shutdown: unsafe extern "C" fn() -> Return,
    // Keeps the function pointers above valid; dropped last.
    _library: Library,
}

// SAFETY: NVML is thread-safe (documented); the struct holds only function
// pointers into a library that stays loaded while it lives.
unsafe impl Send for Nvml {}
// SAFETY: as for `Send`: NVML may be called from several threads at once.
unsafe impl Sync for Nvml {}

impl Nvml {
    /// Loads and initializes NVML.
    pub fn open() -> Result<Self, String> {
        // SAFETY: loading the driver's NVML runs its initializers, which
        // have no preconditions.
        let library = unsafe { Library::new("libnvidia-ml.so.1") }
            .map_err(|e| format!("NVML (libnvidia-ml.so.1) not found: {e}"))?;
        macro_rules! symbol {
            ($name:literal) => {
                // SAFETY: the signature matches NVML's header for this name;
                // the pointer is copied out and `library` outlives it.
                *unsafe { library.get($name) }
                    .map_err(|e| format!("NVML lacks {}: {e}", String::from_utf8_lossy($name)))?
            };
        }
        let init: unsafe extern "C" fn() -> Return = symbol!(b"nvmlInit_v2");
        let device_count = symbol!(b"nvmlDeviceGetCount_v2");
        let handle_by_index = symbol!(b"nvmlDeviceGetHandleByIndex_v2");
        let uuid = symbol!(b"nvmlDeviceGetUUID");
        let utilization = symbol!(b"nvmlDeviceGetUtilizationRates");
        let memory = symbol!(b"nvmlDeviceGetMemoryInfo");
        let power = symbol!(b"nvmlDeviceGetPowerUsage");
        let power_limit = symbol!(b"nvmlDeviceGetPowerManagementLimit");
        let energy = symbol!(b"nvmlDeviceGetTotalEnergyConsumption");
        let shutdown = symbol!(b"nvmlShutdown");
        // SAFETY: no arguments; must precede every other call. `Self` (whose
        // drop shuts NVML down) exists only once it succeeded.
        let rc = unsafe { init() };
        if rc != SUCCESS {
            return Err(format!("nvmlInit_v2 failed (NVML error {rc})"));
        }
        Ok(Self {
            device_count,
            handle_by_index,
            uuid,
            utilization,
            memory,
            power,
            power_limit,
            energy,
            shutdown,
            _library: library,
        })
    }

    /// Reads every GPU NVML sees.
    pub fn read(&self) -> Result<Vec<GpuReading>, String> {
        let mut count: c_uint = 0;
        // SAFETY: `count` is a valid out-pointer.
        let rc = unsafe { (self.device_count)(&mut count) };
        if rc != SUCCESS {
            return Err(format!("nvmlDeviceGetCount_v2 failed (NVML error {rc})"));
        }
        let mut readings = Vec::with_capacity(count as usize);
        for index in 0..count {
            let mut device: Device = std::ptr::null_mut();
            // SAFETY: valid index below the count and a valid out-pointer.
            if unsafe { (self.handle_by_index)(index, &mut device) } != SUCCESS {
                continue;
            }
            let Some(uuid) = self.device_uuid(device) else {
                continue;
            };
            readings.push(self.read_device(device, uuid));
        }
        Ok(readings)
    }

    fn device_uuid(&self, device: Device) -> Option<String> {
        let mut buffer = [0 as c_char; 96];
        // SAFETY: the buffer length is passed; NVML NUL-terminates within it.
        let rc = unsafe { (self.uuid)(device, buffer.as_mut_ptr(), buffer.len() as c_uint) };
        (rc == SUCCESS).then(|| {
            // SAFETY: NUL-terminated by NVML on success.
            unsafe { CStr::from_ptr(buffer.as_ptr()) }
                .to_string_lossy()
                .into_owned()
        })
    }

    fn read_device(&self, device: Device, uuid: String) -> GpuReading {
        // Each call below: `device` came from nvmlDeviceGetHandleByIndex
        // and every out-pointer is a valid local.
        let mut util = Utilization::default();
        // SAFETY: a valid device handle and a local out-pointer (above).
        let utilization = (unsafe { (self.utilization)(device, &mut util) } == SUCCESS)
            .then(|| f64::from(util.gpu.min(100)) / 100.0);
        let mut mem = Memory::default();
        // SAFETY: a valid device handle and a local out-pointer (above).
        let memory_ok = unsafe { (self.memory)(device, &mut mem) } == SUCCESS;
        let mut milliwatts: c_uint = 0;
        // SAFETY: a valid device handle and a local out-pointer (above).
        let power_watts = (unsafe { (self.power)(device, &mut milliwatts) } == SUCCESS)
            .then(|| f64::from(milliwatts) / 1000.0);
        let mut limit: c_uint = 0;
        // SAFETY: a valid device handle and a local out-pointer (above).
        let power_limit_watts = (unsafe { (self.power_limit)(device, &mut limit) } == SUCCESS)
            .then(|| f64::from(limit) / 1000.0);
        let mut millijoules: c_ulonglong = 0;
        // SAFETY: a valid device handle and a local out-pointer (above).
        let energy_joules = (unsafe { (self.energy)(device, &mut millijoules) } == SUCCESS)
            .then(|| millijoules as f64 / 1000.0);
        GpuReading {
            uuid,
            utilization,
            memory_total_bytes: memory_ok.then_some(mem.total),
            memory_used_bytes: memory_ok.then_some(mem.used),
            power_watts,
            power_limit_watts,
            energy_joules,
        }
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        // SAFETY: balanced with the successful nvmlInit_v2 in `open`.
        unsafe {
            (self.shutdown)();
        }
    }
}
