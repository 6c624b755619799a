//! Turning a profile, the command line and the topology into a concrete
//! shard plan: which CPU each shard runs on, which accept connections and
//! which host instances.

use std::fmt;

use anyhow::bail;

use super::{MachineTopology, TuningProfile};
use crate::gpu::{Gpu, GpuInventory};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardPlan {
    /// Logical CPU of each shard (index = shard id); `None` = unpinned.
    pub cpus: Vec<Option<usize>>,
    pub accept: Vec<usize>,
    pub compute: Vec<usize>,
}

impl ShardPlan {
    /// `cores` (the `--cores` flag) wins over the profile's `count`;
    /// explicit `cpus` in the profile win over both.
    pub fn build(
        profile: &TuningProfile,
        cores: Option<usize>,
        pin: bool,
        topology_cpus: &[usize],
    ) -> anyhow::Result<Self> {
        let cpus: Vec<usize> = match &profile.shards.cpus {
            Some(list) => {
                if list.is_empty() {
                    bail!("tuning profile: [shards] cpus is empty");
                }
                if let Some(bad) = list
                    .iter()
                    .find(|c| !topology_cpus.is_empty() && !topology_cpus.contains(c))
                {
                    bail!("tuning profile: CPU {bad} is not usable by this process (usable: {topology_cpus:?})");
                }
                list.clone()
            }
            None => {
                let n = cores
                    .or(profile.shards.count)
                    .unwrap_or(topology_cpus.len())
                    .max(1);
                (0..n)
                    .map(|i| {
                        topology_cpus
                            .get(i % topology_cpus.len().max(1))
                            .copied()
                            .unwrap_or(i)
                    })
                    .collect()
            }
        };
        let n = cpus.len();
        let check = |what: &str, list: &Option<Vec<usize>>| -> anyhow::Result<Vec<usize>> {
            match list {
                None => Ok((0..n).collect()),
                Some(l) if l.is_empty() => bail!("tuning profile: [shards] {what} is empty"),
                Some(l) => {
                    if let Some(bad) = l.iter().find(|&&s| s >= n) {
                        bail!("tuning profile: [shards] {what} names shard {bad}, but there are {n} shards");
                    }
                    Ok(l.clone())
                }
            }
        };
        Ok(Self {
            cpus: cpus.into_iter().map(|c| pin.then_some(c)).collect(),
            accept: check("accept", &profile.shards.accept)?,
            compute: check("compute", &profile.shards.compute)?,
        })
    }

    pub fn shard_count(&self) -> usize {
        self.cpus.len()
    }

    /// For each shard, the CPUs the compute workers of the models it owns
    /// may run on: the compute shards' CPUs on the same NUMA node as that
    /// shard (all compute shards' CPUs when the node is unknown). Empty
    /// when shards are not pinned.
    pub fn worker_cpus(&self, node_of: impl Fn(usize) -> Option<usize>) -> Vec<Vec<usize>> {
        let compute_cpus: Vec<usize> = self.compute.iter().filter_map(|&s| self.cpus[s]).collect();
        self.cpus
            .iter()
            .map(|cpu| {
                let Some(cpu) = *cpu else {
                    return Vec::new();
                };
                let node = node_of(cpu);
                let near: Vec<usize> = compute_cpus
                    .iter()
                    .copied()
                    .filter(|&c| node.is_some() && node_of(c) == node)
                    .collect();
                if near.is_empty() {
                    compute_cpus.clone()
                } else {
                    near
                }
            })
            .collect()
    }

    /// Where the instances of a `KIND_GPU` group on `gpu` go: their
    /// scheduler on a compute shard of the GPU's NUMA node, their compute
    /// workers on that node's compute-shard CPUs. With no compute shard on
    /// the node, the workers still go on the node's CPUs (feeding the GPU
    /// from the far socket costs every copy a trip over the interconnect)
    /// and the scheduler on any compute shard.
    pub fn gpu_placement(&self, gpu: &Gpu, topology: &MachineTopology) -> GpuPlacement {
        let local = |cpu: usize| match gpu.numa_node {
            Some(node) => topology.numa_node_of_cpu(cpu) == Some(node),
            None => gpu.local_cpus.contains(&cpu),
        };
        let near: Vec<usize> = self
            .compute
            .iter()
            .copied()
            .filter(|&s| self.cpus[s].is_some_and(local))
            .collect();
        let pinned = self.cpus.iter().any(Option::is_some);
        let worker_cpus = if !pinned {
            Vec::new()
        } else if near.is_empty() {
            match gpu.numa_node {
                Some(node) => topology.usable_cpus_of_node(node),
                None => gpu
                    .local_cpus
                    .iter()
                    .copied()
                    .filter(|c| topology.cpus.contains(c))
                    .collect(),
            }
        } else {
            near.iter().filter_map(|&s| self.cpus[s]).collect()
        };
        GpuPlacement {
            gpu: gpu.id,
            shards: if near.is_empty() {
                self.compute.clone()
            } else {
                near
            },
            worker_cpus,
        }
    }

    /// Set when the plan runs more shards than the cgroup lets the process
    /// use (its CPU quota, or its cpuset when that is smaller): an explicit
    /// `--cores`, shard `count` or `cpus` list wins over the cgroup, since
    /// the user asked for it, but the extra shards only share the quota's
    /// CPU time and get throttled together, which is worth saying.
    pub fn cgroup_warning(&self, topology: &MachineTopology) -> Option<String> {
        let cg = topology.cgroup.as_ref()?;
        let limit = [cg.cpu_limit(), cg.cpuset.as_ref().map(Vec::len)]
            .into_iter()
            .flatten()
            .min()?;
        let shards = self.shard_count();
        (shards > limit).then(|| {
            format!(
                "{shards} shards exceed the {limit} CPU(s) the cgroup allows ({cg}); \
                 they share that CPU time and are throttled together: \
                 drop --cores (or the tuning profile's shard count or cpus) to follow the cgroup"
            )
        })
    }

    /// The plan in words: shards, the compute workers' CPUs per NUMA node,
    /// and where each GPU's instances go.
    pub fn describe(&self, topology: &MachineTopology, gpus: &GpuInventory) -> String {
        let mut out = self.to_string();
        let workers = self.worker_cpus(|c| topology.numa_node_of_cpu(c));
        let mut seen = Vec::new();
        for (shard, cpus) in workers.iter().enumerate() {
            if !self.compute.contains(&shard) || seen.contains(cpus) {
                continue;
            }
            seen.push(cpus.clone());
            let node = self.cpus[shard]
                .and_then(|c| topology.numa_node_of_cpu(c))
                .map_or_else(|| "?".to_string(), |n| n.to_string());
            out.push_str(&format!(
                "compute workers of models owned by shard {shard} (NUMA node {node}): {}\n",
                if cpus.is_empty() {
                    "unpinned".to_string()
                } else {
                    format!("CPUs {}", super::cpu_list(cpus))
                }
            ));
        }
        out.push_str(&gpus.to_string());
        for gpu in &gpus.gpus {
            let p = self.gpu_placement(gpu, topology);
            out.push_str(&format!(
                "GPU {}: KIND_GPU instances scheduled on shards {:?}, compute workers on {}\n",
                gpu.id,
                p.shards,
                if p.worker_cpus.is_empty() {
                    "any CPU (unpinned)".to_string()
                } else {
                    format!("CPUs {}", super::cpu_list(&p.worker_cpus))
                }
            ));
        }
        out
    }
}

/// Where one GPU's instances go (see [`ShardPlan::gpu_placement`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuPlacement {
    pub gpu: i32,
    /// Compute shards that may own the scheduler of a model on this GPU.
    pub shards: Vec<usize>,
    /// CPUs its instances' compute workers may run on (empty: unpinned).
    pub worker_cpus: Vec<usize>,
}

impl fmt::Display for ShardPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "shards: {}", self.cpus.len())?;
        for (i, cpu) in self.cpus.iter().enumerate() {
            writeln!(
                f,
                "  shard {i}: cpu {}{}{}",
                cpu.map_or_else(|| "unpinned".to_string(), |c| c.to_string()),
                if self.accept.contains(&i) {
                    ", accepts connections"
                } else {
                    ""
                },
                if self.compute.contains(&i) {
                    ", hosts instances"
                } else {
                    ""
                },
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_use_every_usable_cpu_for_everything() {
        let p = ShardPlan::build(&TuningProfile::default(), None, true, &[2, 3]).unwrap();
        assert_eq!(p.cpus, vec![Some(2), Some(3)]);
        assert_eq!(p.accept, vec![0, 1]);
        assert_eq!(p.compute, vec![0, 1]);
    }

    #[test]
    fn cores_flag_limits_the_shards() {
        let p = ShardPlan::build(&TuningProfile::default(), Some(1), false, &[0, 1]).unwrap();
        assert_eq!(p.cpus, vec![None]);
    }

    #[test]
    fn profile_splits_accept_and_compute() {
        let mut profile = TuningProfile::default();
        profile.shards.cpus = Some(vec![0, 1]);
        profile.shards.accept = Some(vec![0]);
        profile.shards.compute = Some(vec![1]);
        let p = ShardPlan::build(&profile, None, true, &[0, 1]).unwrap();
        assert_eq!(p.accept, vec![0]);
        assert_eq!(p.compute, vec![1]);
    }

    #[test]
    fn compute_workers_stay_on_their_numa_node() {
        let mut profile = TuningProfile::default();
        profile.shards.cpus = Some(vec![0, 1, 8, 9]);
        profile.shards.compute = Some(vec![1, 2, 3]);
        let p = ShardPlan::build(&profile, None, true, &[0, 1, 8, 9]).unwrap();
        let node = |c: usize| Some(c / 8);
        let w = p.worker_cpus(node);
        assert_eq!(w[0], vec![1], "node 0 computes on cpu 1 only");
        assert_eq!(w[2], vec![8, 9]);
        let unknown = p.worker_cpus(|_| None);
        assert_eq!(unknown[0], vec![1, 8, 9]);
        let unpinned =
            ShardPlan::build(&TuningProfile::default(), Some(2), false, &[0, 1]).unwrap();
        assert!(unpinned.worker_cpus(node).iter().all(Vec::is_empty));
    }

    fn in_cgroup(
        cpus: Vec<usize>,
        quota: Option<(u64, u64)>,
        cpuset: Option<Vec<usize>>,
    ) -> MachineTopology {
        MachineTopology {
            packages: 1,
            cores: cpus.len(),
            numa_nodes: Vec::new(),
            cpus,
            pci_devices: Vec::new(),
            degraded: None,
            cgroup: Some(crate::tuning::CgroupCpu {
                version: 2,
                path: "/pod".into(),
                quota,
                cpuset,
            }),
        }
    }

    #[test]
    fn cores_above_the_cgroup_quota_win_with_a_warning() {
        // A 2-CPU quota on an 8-CPU cpuset: the detected CPUs are 2.
        let topology = in_cgroup(vec![0, 1], Some((200_000, 100_000)), Some((0..8).collect()));
        let profile = TuningProfile::default();
        let follow = ShardPlan::build(&profile, None, true, &topology.cpus).unwrap();
        assert_eq!(follow.shard_count(), 2);
        assert_eq!(follow.cgroup_warning(&topology), None);
        let within = ShardPlan::build(&profile, Some(2), true, &topology.cpus).unwrap();
        assert_eq!(within.cgroup_warning(&topology), None);
        let over = ShardPlan::build(&profile, Some(6), true, &topology.cpus).unwrap();
        assert_eq!(over.shard_count(), 6, "the explicit flag wins");
        let warning = over.cgroup_warning(&topology).unwrap();
        assert!(
            warning.starts_with("6 shards exceed the 2 CPU(s)"),
            "{warning}"
        );
        assert!(warning.contains("200000/100000 us"), "{warning}");
        // A cpuset smaller than the quota is the limit then.
        let narrow = in_cgroup(vec![0], Some((400_000, 100_000)), Some(vec![0]));
        let two = ShardPlan::build(&profile, Some(2), true, &narrow.cpus).unwrap();
        assert!(two
            .cgroup_warning(&narrow)
            .unwrap()
            .starts_with("2 shards exceed the 1 CPU(s)"));
        // No cgroup, or one without limits: nothing to warn about.
        let mut free = in_cgroup(vec![0, 1], None, None);
        assert_eq!(over.cgroup_warning(&free), None);
        free.cgroup = None;
        assert_eq!(over.cgroup_warning(&free), None);
    }

    #[test]
    fn bad_profiles_are_clear_errors() {
        let mut profile = TuningProfile::default();
        profile.shards.compute = Some(vec![5]);
        let e = ShardPlan::build(&profile, Some(2), true, &[0, 1]).unwrap_err();
        assert!(e.to_string().contains("shard 5"));
        profile.shards.compute = None;
        profile.shards.cpus = Some(vec![9]);
        assert!(ShardPlan::build(&profile, None, true, &[0, 1]).is_err());
    }
}
