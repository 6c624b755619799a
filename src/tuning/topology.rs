//! The machine as hwloc sees it: packages, NUMA nodes, cores, logical
//! CPUs, and PCI devices with their NUMA node and the CPUs near them (where
//! GPU instances and their compute workers go). Read from this system, or
//! from a recorded hwloc XML file (`lstopo machine.xml`), which is how the
//! placement of machines we are not running on is tested.

use std::{fmt, sync::OnceLock};

use super::cgroup::CgroupCpu;

use anyhow::Context;
use hwlocality::{
    object::{attributes::ObjectAttributes, types::ObjectType, TopologyObject},
    topology::builder::TypeFilter,
    Topology,
};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NumaNode {
    pub os_index: usize,
    pub cpus: Vec<usize>,
    pub memory_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciDevice {
    /// `dddd:bb:dd.f`, lower-case hex, as `lspci -D` and NVML print it.
    pub bus_id: String,
    pub vendor_id: u16,
    pub device_id: u16,
    pub class_id: u16,
    /// Logical CPUs local to the device (its first non-I/O ancestor's cpuset).
    pub local_cpus: Vec<usize>,
    /// The NUMA node the device hangs off, when exactly one is local to it.
    pub numa_node: Option<usize>,
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
    /// Logical CPUs this process may run on (all of them for a recorded
    /// topology).
    pub cpus: Vec<usize>,
    pub numa_nodes: Vec<NumaNode>,
    pub pci_devices: Vec<PciDevice>,
    /// Set when hwloc could not be used and only the CPU list is known.
    pub degraded: Option<String>,
    /// The process's cgroup CPU limits, which `cpus` already obeys (none
    /// for a recorded topology).
    pub cgroup: Option<CgroupCpu>,
}

fn cpus_of(obj: &TopologyObject) -> Vec<usize> {
    obj.cpuset()
        .map(|s| s.iter_set().map(usize::from).collect())
        .unwrap_or_default()
}

/// `dddd:bb:dd.f` from any spelling the driver APIs use (CUDA prints an
/// 8-digit upper-case domain: `00000000:17:00.0`); `None` if it is not a
/// PCI address.
pub fn normalize_bus_id(text: &str) -> Option<String> {
    let (domain, rest) = text.trim().split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (device, function) = rest.split_once('.')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    let bus = u8::from_str_radix(bus, 16).ok()?;
    let device = u8::from_str_radix(device, 16).ok()?;
    let function = u8::from_str_radix(function, 16).ok()?;
    Some(format!("{domain:04x}:{bus:02x}:{device:02x}.{function}"))
}

/// `0-15,32-47`: a CPU list as the kernel and `taskset` print it.
pub fn cpu_list(cpus: &[usize]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            i += 1;
            end = sorted[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    if parts.is_empty() {
        "none".to_string()
    } else {
        parts.join(",")
    }
}

impl MachineTopology {
    /// The topology of this machine, read once per process (hwloc's PCI
    /// scan takes milliseconds; servers started in one process share it).
    pub fn shared() -> &'static Self {
        static TOPOLOGY: OnceLock<MachineTopology> = OnceLock::new();
        TOPOLOGY.get_or_init(Self::detect)
    }

    /// Reads this machine with hwloc, restricted to the CPUs this process
    /// may run on; falls back to the affinity list alone (and says so)
    /// when hwloc fails.
    ///
    /// The cgroup's CPU quota and cpuset narrow the list further: a quota
    /// of N CPUs keeps N of the allowed CPUs, one per core before any
    /// core's second hyperthread, so shards and compute workers are as many
    /// as the CPU time the process may use.
    pub fn detect() -> Self {
        let allowed = crate::compute::thread::current_affinity().unwrap_or_default();
        let cgroup = CgroupCpu::detect();
        let built = Topology::builder()
            .with_io_type_filter(TypeFilter::KeepImportant)
            .map_err(|e| format!("hwloc filter: {e}"))
            .and_then(|b| b.build().map_err(|e| format!("hwloc: {e}")));
        let mut this = match built {
            Ok(topology) => {
                let mut this = Self::from_hwloc(&topology, &allowed);
                if let Some(cg) = &cgroup {
                    this.cpus = cg.restrict(&one_per_core_first(&topology, &this.cpus));
                }
                this
            }
            Err(reason) => {
                let cpus = match &cgroup {
                    Some(cg) => cg.restrict(&allowed),
                    None => allowed,
                };
                Self::cpus_only(cpus, reason)
            }
        };
        if let Some(cg) = &cgroup {
            tracing::info!("{cg}; using CPUs {}", cpu_list(&this.cpus));
        }
        this.cgroup = cgroup;
        this
    }

    /// A topology recorded as hwloc XML (`lstopo file.xml`, or
    /// `hwloc-gather-topology`): every CPU in it counts as usable.
    pub fn from_xml(xml: &str) -> anyhow::Result<Self> {
        let topology = Topology::builder()
            .from_xml(xml)
            .context("not an hwloc XML topology")?
            .with_io_type_filter(TypeFilter::KeepImportant)
            .context("hwloc I/O filter")?
            .build()
            .context("hwloc could not build the recorded topology")?;
        Ok(Self::from_hwloc(&topology, &[]))
    }

    fn cpus_only(cpus: Vec<usize>, reason: String) -> Self {
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
            cgroup: None,
        }
    }

    /// `allowed` empty: every CPU hwloc reports.
    fn from_hwloc(topology: &Topology, allowed: &[usize]) -> Self {
        let mut cpus: Vec<usize> = topology.cpuset().iter_set().map(usize::from).collect();
        if !allowed.is_empty() {
            cpus.retain(|c| allowed.contains(c));
        }
        let numa_nodes: Vec<NumaNode> = topology
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
                let parent = d.first_non_io_ancestor();
                let numa_node = parent
                    .and_then(|a| a.nodeset())
                    .filter(|set| set.weight() == Some(1))
                    .and_then(|set| set.first_set())
                    .map(usize::from);
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
                    local_cpus: parent.map(cpus_of).unwrap_or_default(),
                    numa_node,
                })
            })
            .collect();
        let packages = topology.objects_with_type(ObjectType::Package).len().max(1);
        let cores = topology.objects_with_type(ObjectType::Core).len();
        Self {
            packages,
            cores,
            cpus,
            numa_nodes,
            pci_devices,
            degraded: None,
            cgroup: None,
        }
    }

    /// NVIDIA GPUs on the PCI bus, in bus order (what hwloc sees, whether
    /// or not a CUDA driver is present).
    pub fn gpus(&self) -> impl Iterator<Item = &PciDevice> {
        self.pci_devices.iter().filter(|d| d.is_nvidia_gpu())
    }

    pub fn pci_device(&self, bus_id: &str) -> Option<&PciDevice> {
        let wanted = normalize_bus_id(bus_id)?;
        self.pci_devices.iter().find(|d| d.bus_id == wanted)
    }

    /// The NUMA node a logical CPU belongs to.
    pub fn numa_node_of_cpu(&self, cpu: usize) -> Option<usize> {
        self.numa_nodes
            .iter()
            .find(|n| n.cpus.contains(&cpu))
            .map(|n| n.os_index)
    }

    /// The CPUs of a NUMA node that this process may use.
    pub fn usable_cpus_of_node(&self, node: usize) -> Vec<usize> {
        self.numa_nodes
            .iter()
            .filter(|n| n.os_index == node)
            .flat_map(|n| n.cpus.iter().copied())
            .filter(|c| self.cpus.contains(c))
            .collect()
    }
}

/// `cpus` reordered: the first CPU of every core, then the second of
/// every core, and so on (cores in hwloc's order), so taking a prefix
/// spreads over physical cores.
fn one_per_core_first(topology: &Topology, cpus: &[usize]) -> Vec<usize> {
    let cores: Vec<Vec<usize>> = topology
        .objects_with_type(ObjectType::Core)
        .map(|core| {
            cpus_of(core)
                .into_iter()
                .filter(|c| cpus.contains(c))
                .collect::<Vec<_>>()
        })
        .filter(|pus| !pus.is_empty())
        .collect();
    let mut out = Vec::with_capacity(cpus.len());
    let deepest = cores.iter().map(Vec::len).max().unwrap_or(0);
    for round in 0..deepest {
        out.extend(cores.iter().filter_map(|pus| pus.get(round).copied()));
    }
    // CPUs hwloc put in no core (should not happen) keep their place last.
    let missing: Vec<usize> = cpus.iter().copied().filter(|c| !out.contains(c)).collect();
    out.extend(missing);
    out
}

// Here rather than in cgroup.rs, which stays free of imports from this
// module (tests/architecture.rs bounds import circles).
impl fmt::Display for CgroupCpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cgroup v{} {}: CPU quota ", self.version, self.path)?;
        match (self.quota, self.cpu_limit()) {
            (Some((quota, period)), Some(limit)) => {
                write!(f, "{quota}/{period} us = {limit} CPU(s)")?
            }
            _ => write!(f, "none")?,
        }
        match &self.cpuset {
            Some(set) => write!(f, "; cpuset {}", cpu_list(set)),
            None => write!(f, "; cpuset not reported"),
        }
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
        if let Some(cg) = &self.cgroup {
            writeln!(f, "{cg}")?;
        }
        writeln!(
            f,
            "packages: {}  cores: {}  usable logical CPUs: {}",
            self.packages,
            self.cores,
            cpu_list(&self.cpus)
        )?;
        for n in &self.numa_nodes {
            writeln!(
                f,
                "NUMA node {}: CPUs {}, {} MiB",
                n.os_index,
                cpu_list(&n.cpus),
                n.memory_bytes >> 20
            )?;
        }
        if self.pci_devices.is_empty() {
            writeln!(f, "PCI devices: none reported")?;
        }
        for d in &self.pci_devices {
            writeln!(
                f,
                "PCI {} vendor {:04x} device {:04x} class {:04x}{} NUMA node {} near CPUs {}",
                d.bus_id,
                d.vendor_id,
                d.device_id,
                d.class_id,
                if d.is_nvidia_gpu() {
                    " (NVIDIA GPU)"
                } else {
                    ""
                },
                d.numa_node
                    .map_or_else(|| "?".to_string(), |n| n.to_string()),
                cpu_list(&d.local_cpus)
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_from_every_api_compare_equal() {
        assert_eq!(
            normalize_bus_id("00000000:17:00.0").as_deref(),
            Some("0000:17:00.0")
        );
        assert_eq!(
            normalize_bus_id("0000:B3:00.0").as_deref(),
            Some("0000:b3:00.0")
        );
        assert_eq!(normalize_bus_id("GPU-0"), None);
        assert_eq!(normalize_bus_id("0000:zz:00.0"), None);
    }

    #[test]
    fn this_machine_reads_without_panicking() {
        let t = MachineTopology::detect();
        assert!(!t.cpus.is_empty(), "{t}");
        for cpu in &t.cpus {
            if t.degraded.is_none() {
                assert!(t.numa_node_of_cpu(*cpu).is_some(), "cpu {cpu}: {t}");
            }
        }
    }

    #[test]
    fn cpu_lists_print_as_ranges() {
        assert_eq!(cpu_list(&[3, 0, 1, 2, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(cpu_list(&[]), "none");
    }

    #[test]
    fn garbage_is_not_a_topology() {
        assert!(MachineTopology::from_xml("<not-hwloc/>").is_err());
    }
}
