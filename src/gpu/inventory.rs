//! The GPUs instances may use, each with its CUDA ordinal (Triton's gpu
//! id in `instance_group { gpus: [...] }`) and where it sits.

use std::{fmt, sync::OnceLock};

use crate::tuning::{normalize_bus_id, MachineTopology};

/// A device as the CUDA driver reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaDevice {
    pub ordinal: i32,
    pub name: String,
    /// `GPU-…` as NVML spells it.
    pub uuid: Option<String>,
    /// As the driver prints it (`00000000:17:00.0`).
    pub bus_id: String,
    pub memory_bytes: u64,
    pub compute_capability: (i32, i32),
}

/// A usable GPU and its place in the machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// CUDA ordinal: the id `gpus: [...]` names.
    pub id: i32,
    pub name: String,
    pub uuid: Option<String>,
    /// `dddd:bb:dd.f`.
    pub bus_id: String,
    pub memory_bytes: u64,
    pub numa_node: Option<usize>,
    /// CPUs near the GPU (hwloc); empty when hwloc does not know it.
    pub local_cpus: Vec<usize>,
}

/// The GPUs this process can use, or why there are none.
#[derive(Debug, Clone, Default)]
pub struct GpuInventory {
    pub gpus: Vec<Gpu>,
    /// Why `gpus` is empty (no driver, no device, built without CUDA).
    pub absent: Option<String>,
}

/// Triton's default `--min-supported-compute-capability`.
pub const MIN_COMPUTE_CAPABILITY: f64 = 6.0;

impl GpuInventory {
    /// This machine's GPUs, discovered once per process.
    pub fn shared() -> &'static Self {
        static GPUS: OnceLock<GpuInventory> = OnceLock::new();
        GPUS.get_or_init(|| Self::detect(MachineTopology::shared()))
    }

    /// Asks the CUDA driver, then places each device with the topology.
    pub fn detect(topology: &MachineTopology) -> Self {
        match super::cuda_devices() {
            Ok(devices) if devices.is_empty() => Self::none("the CUDA driver reports no device"),
            Ok(devices) => Self::from_cuda(&devices, topology),
            Err(reason) => Self::none(&reason),
        }
    }

    pub fn none(reason: &str) -> Self {
        Self {
            gpus: Vec::new(),
            absent: Some(reason.to_string()),
        }
    }

    /// Devices below Triton's minimum compute capability are left out, as
    /// Triton leaves them out of its supported GPUs.
    pub fn from_cuda(devices: &[CudaDevice], topology: &MachineTopology) -> Self {
        let gpus: Vec<Gpu> = devices
            .iter()
            .filter(|d| {
                f64::from(d.compute_capability.0) + f64::from(d.compute_capability.1) / 10.0
                    >= MIN_COMPUTE_CAPABILITY
            })
            .map(|d| {
                let pci = topology.pci_device(&d.bus_id);
                Gpu {
                    id: d.ordinal,
                    name: d.name.clone(),
                    uuid: d.uuid.clone(),
                    bus_id: normalize_bus_id(&d.bus_id).unwrap_or_else(|| d.bus_id.clone()),
                    memory_bytes: d.memory_bytes,
                    numa_node: pci.and_then(|p| p.numa_node),
                    local_cpus: pci.map(|p| p.local_cpus.clone()).unwrap_or_default(),
                }
            })
            .collect();
        let absent = gpus.is_empty().then(|| {
            format!("no CUDA device has compute capability {MIN_COMPUTE_CAPABILITY:.1} or above")
        });
        Self { gpus, absent }
    }

    /// The NVIDIA GPUs of a recorded topology, numbered in PCI bus order
    /// (the CUDA ordinals under `CUDA_DEVICE_ORDER=PCI_BUS_ID`): how
    /// placement is planned for a machine we are not running on.
    pub fn from_topology_bus_order(topology: &MachineTopology) -> Self {
        let mut pci: Vec<_> = topology.gpus().collect();
        pci.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));
        let gpus: Vec<Gpu> = pci
            .iter()
            .enumerate()
            .map(|(i, p)| Gpu {
                id: i as i32,
                name: format!("PCI {:04x}:{:04x}", p.vendor_id, p.device_id),
                uuid: None,
                bus_id: p.bus_id.clone(),
                memory_bytes: 0,
                numa_node: p.numa_node,
                local_cpus: p.local_cpus.clone(),
            })
            .collect();
        Self {
            absent: gpus
                .is_empty()
                .then(|| "no NVIDIA GPU on the PCI bus".to_string()),
            gpus,
        }
    }

    pub fn get(&self, id: i32) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.id == id)
    }

    pub fn ids(&self) -> Vec<i32> {
        self.gpus.iter().map(|g| g.id).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.gpus.is_empty()
    }
}

impl fmt::Display for GpuInventory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(reason) = &self.absent {
            writeln!(f, "GPUs: none ({reason})")?;
        }
        for g in &self.gpus {
            writeln!(
                f,
                "GPU {}: {} {} bus {} NUMA node {} near CPUs {}{}",
                g.id,
                g.name,
                g.uuid.as_deref().unwrap_or(""),
                g.bus_id,
                g.numa_node
                    .map_or_else(|| "?".to_string(), |n| n.to_string()),
                crate::tuning::cpu_list(&g.local_cpus),
                if g.memory_bytes > 0 {
                    format!(", {} MiB", g.memory_bytes >> 20)
                } else {
                    String::new()
                }
            )?;
        }
        Ok(())
    }
}
