//! The machine as hwloc sees it: packages, NUMA nodes, cores, logical
//! CPUs, and PCI devices with the CPUs near them (where GPU instances
//! should be placed).

use std::fmt;

use hwlocality::{
    object::{attributes::ObjectAttributes, types::ObjectType, TopologyObject},
    topology::builder::TypeFilter,
    Topology,
};

#[derive(Debug, Clone)]
pub struct NumaNode {
    pub os_index: usize,
    pub cpus: Vec<usize>,
    pub memory_bytes: u64,
}

#[derive(Debug, Clone)]
pub struct PciDevice {
    pub bus_id: String,
    pub vendor_id: u16,
    pub device_id: u16,
    pub class_id: u16,
    /// Logical CPUs local to the device (its first non-I/O ancestor's cpuset).
    pub local_cpus: Vec<usize>,
}

impl PciDevice {
    /// NVIDIA display/3D controllers: the devices GPU instances go near.
    pub fn is_nvidia_gpu(&self) -> bool {
        self.vendor_id == 0x10de && (self.class_id >> 8) == 0x03
    }
}

#[derive(Debug, Clone)]
pub struct MachineTopology {
    pub packages: usize,
    pub cores: usize,
    /// Logical CPUs this process may run on.
    pub cpus: Vec<usize>,
    pub numa_nodes: Vec<NumaNode>,
    pub pci_devices: Vec<PciDevice>,
    /// Set when hwloc could not be used and only the CPU list is known.
    pub degraded: Option<String>,
}

fn cpus_of(obj: &TopologyObject) -> Vec<usize> {
    obj.cpuset()
        .map(|s| s.iter_set().map(usize::from).collect())
        .unwrap_or_default()
}

impl MachineTopology {
    /// Reads the topology with hwloc; falls back to the CPU affinity list
    /// (and says so) when hwloc fails.
    pub fn detect() -> Self {
        match Self::from_hwloc() {
            Ok(t) => t,
            Err(reason) => {
                let cpus: Vec<usize> = core_affinity::get_core_ids()
                    .unwrap_or_default()
                    .iter()
                    .map(|c| c.id)
                    .collect();
                Self {
                    packages: 1,
                    cores: cpus.len(),
                    numa_nodes: vec![NumaNode {
                        os_index: 0,
                        cpus: cpus.clone(),
                        memory_bytes: 0,
                    }],
                    cpus,
                    pci_devices: Vec::new(),
                    degraded: Some(reason),
                }
            }
        }
    }

    fn from_hwloc() -> Result<Self, String> {
        let topology = Topology::builder()
            .with_io_type_filter(TypeFilter::KeepImportant)
            .map_err(|e| format!("hwloc filter: {e}"))?
            .build()
            .map_err(|e| format!("hwloc: {e}"))?;
        let allowed: Vec<usize> = core_affinity::get_core_ids()
            .unwrap_or_default()
            .iter()
            .map(|c| c.id)
            .collect();
        let mut cpus: Vec<usize> = topology.cpuset().iter_set().map(usize::from).collect();
        if !allowed.is_empty() {
            cpus.retain(|c| allowed.contains(c));
        }
        let numa_nodes = topology
            .objects_with_type(ObjectType::NUMANode)
            .map(|n| NumaNode {
                os_index: n.os_index().unwrap_or(0),
                cpus: cpus_of(n),
                memory_bytes: n.total_memory(),
            })
            .collect();
        let pci_devices = topology
            .pci_devices()
            .filter_map(|d| {
                let Some(ObjectAttributes::PCIDevice(p)) = d.attributes() else {
                    return None;
                };
                Some(PciDevice {
                    bus_id: format!(
                        "{:04x}:{:02x}:{:02x}.{}",
                        p.domain(),
                        p.bus_id(),
                        p.bus_device(),
                        p.function()
                    ),
                    vendor_id: p.vendor_id(),
                    device_id: p.device_id(),
                    class_id: p.class_id(),
                    local_cpus: d.first_non_io_ancestor().map(cpus_of).unwrap_or_default(),
                })
            })
            .collect();
        let packages = topology.objects_with_type(ObjectType::Package).len().max(1);
        let cores = topology.objects_with_type(ObjectType::Core).len();
        Ok(Self {
            packages,
            cores,
            cpus,
            numa_nodes,
            pci_devices,
            degraded: None,
        })
    }

    pub fn gpus(&self) -> impl Iterator<Item = &PciDevice> {
        self.pci_devices.iter().filter(|d| d.is_nvidia_gpu())
    }
}

impl fmt::Display for MachineTopology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(reason) = &self.degraded {
            writeln!(
                f,
                "hwloc unavailable ({reason}); using the CPU affinity list only"
            )?;
        }
        writeln!(
            f,
            "packages: {}  cores: {}  usable logical CPUs: {:?}",
            self.packages, self.cores, self.cpus
        )?;
        for n in &self.numa_nodes {
            writeln!(
                f,
                "NUMA node {}: CPUs {:?}, {} MiB",
                n.os_index,
                n.cpus,
                n.memory_bytes >> 20
            )?;
        }
        if self.pci_devices.is_empty() {
            writeln!(f, "PCI devices: none reported")?;
        }
        for d in &self.pci_devices {
            writeln!(
                f,
                "PCI {} vendor {:04x} device {:04x} class {:04x}{} near CPUs {:?}",
                d.bus_id,
                d.vendor_id,
                d.device_id,
                d.class_id,
                if d.is_nvidia_gpu() {
                    " (NVIDIA GPU)"
                } else {
                    ""
                },
                d.local_cpus
            )?;
        }
        Ok(())
    }
}
