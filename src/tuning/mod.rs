//! Hardware topology (hwloc) and tuning profiles: where shards run, which
//! accept connections, which host model instances.

mod cgroup;
mod plan;
mod profile;
mod topology;
mod tune;

pub use cgroup::{parse_cpu_list, CgroupCpu};
pub use plan::{GpuPlacement, ShardPlan};
pub use profile::{ComputeSection, IoDriver, RuntimeSection, TuningProfile};
pub use topology::{cpu_list, normalize_bus_id, MachineTopology, NumaNode, PciDevice};
pub use tune::{derive_profile, measure, Measurements, RoundTrip};
