//! Hardware topology (hwloc) and tuning profiles: where shards run, which
//! accept connections, which host model instances.

mod plan;
mod profile;
mod topology;

pub use plan::{numa_node_of_cpu, ShardPlan};
pub use profile::{ComputeSection, IoDriver, TuningProfile};
pub use topology::{MachineTopology, NumaNode, PciDevice};
