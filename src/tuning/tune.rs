//! `shardserve tune`: measures the machine it runs on and writes a tuning
//! profile for it. What it measures (bounded: a few hundred milliseconds):
//! the round trip of a message over an SPSC ring between two pinned threads,
//! within a NUMA node and across two nodes — the cost every request pays
//! when it is accepted on one shard and computed on another. What it
//! derives (rules, written into the profile's comments):
//!
//! - per NUMA node with 4 or more usable CPUs, the last quarter of them
//!   (at least one per GPU on that node, always leaving one to accept) host
//!   model instances and the rest accept connections; a node with fewer
//!   CPUs has every shard do both (a split would leave too few reactors);
//! - when the measured in-node round trip exceeds 20 µs (a noisy or
//!   over-subscribed VM), no split at all: the hop would cost more than it
//!   saves on light models;
//! - rings of 4096 slots above 8 shards (more senders per owner), else 1024;
//! - one ONNX Runtime intra-op thread per instance.

use std::{
    fmt::Write,
    time::{Duration, Instant},
};

use super::{cpu_list, MachineTopology};
use crate::gpu::GpuInventory;

/// Over this in-node round trip the profile does not split shards.
const SPLIT_LIMIT: Duration = Duration::from_micros(20);

/// One measured ring round trip.
#[derive(Debug, Clone, PartialEq)]
pub struct RoundTrip {
    pub from_cpu: usize,
    pub to_cpu: usize,
    pub median: Duration,
}

/// What `tune` measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Measurements {
    pub same_node: Option<RoundTrip>,
    pub cross_node: Option<RoundTrip>,
}

/// Measures ring round trips, each for about `budget`.
pub fn measure(topology: &MachineTopology, budget: Duration) -> Measurements {
    let nodes: Vec<Vec<usize>> = topology
        .numa_nodes
        .iter()
        .map(|n| topology.usable_cpus_of_node(n.os_index))
        .filter(|c| !c.is_empty())
        .collect();
    let same_node = nodes
        .iter()
        .find(|cpus| cpus.len() >= 2)
        .and_then(|cpus| round_trip(cpus[0], cpus[1], budget));
    let cross_node = match nodes.as_slice() {
        [a, b, ..] => round_trip(a[0], b[0], budget),
        _ => None,
    };
    Measurements {
        same_node,
        cross_node,
    }
}

/// Ping-pong of a counter over two `rtrb` rings between threads pinned to
/// `a` and `b`, for about `budget`; the median of batches of 1000 trips.
/// `None` if a thread cannot be pinned.
fn round_trip(a: usize, b: usize, budget: Duration) -> Option<RoundTrip> {
    use crate::compute::thread::set_affinity;
    let (mut ping_tx, mut ping_rx) = rtrb::RingBuffer::<u64>::new(1);
    let (mut pong_tx, mut pong_rx) = rtrb::RingBuffer::<u64>::new(1);
    let echo = std::thread::spawn(move || {
        if set_affinity(&[b]).is_err() {
            return false;
        }
        loop {
            match ping_rx.pop() {
                Ok(u64::MAX) => return true,
                Ok(v) => {
                    while pong_tx.push(v).is_err() {
                        std::hint::spin_loop();
                    }
                }
                Err(_) if ping_rx.is_abandoned() => return true,
                Err(_) => std::hint::spin_loop(),
            }
        }
    });
    // The pinging side runs on its own thread too, so the caller's
    // affinity is left alone.
    let ping = std::thread::spawn(move || {
        if set_affinity(&[a]).is_err() {
            let _ = ping_tx.push(u64::MAX);
            return None;
        }
        let mut batches = Vec::new();
        let start = Instant::now();
        // Bounded by time, and each wait by four budgets (a starved echo
        // thread must not hang `tune`).
        'outer: while start.elapsed() < budget && batches.len() < 10_000 {
            let t = Instant::now();
            for i in 0..1000u64 {
                while ping_tx.push(i).is_err() {
                    std::hint::spin_loop();
                }
                while pong_rx.pop().is_err() {
                    if start.elapsed() > budget * 4 {
                        break 'outer;
                    }
                    std::hint::spin_loop();
                }
            }
            batches.push(t.elapsed() / 1000);
        }
        let _ = ping_tx.push(u64::MAX);
        Some(batches)
    });
    let batches = ping.join().ok().flatten();
    let echoed = echo.join().unwrap_or(false);
    let mut batches = match batches {
        Some(b) if echoed && !b.is_empty() => b,
        _ => return None,
    };
    batches.sort();
    Some(RoundTrip {
        from_cpu: a,
        to_cpu: b,
        median: batches[batches.len() / 2],
    })
}

/// The profile (TOML text with its reasons as comments) for a topology.
pub fn derive_profile(
    topology: &MachineTopology,
    gpus: &GpuInventory,
    measured: &Measurements,
) -> String {
    let split = measured
        .same_node
        .as_ref()
        .is_none_or(|r| r.median <= SPLIT_LIMIT);
    let mut cpus = Vec::new();
    let mut accept = Vec::new();
    let mut compute = Vec::new();
    let mut notes = Vec::new();
    for node in &topology.numa_nodes {
        let node_cpus = topology.usable_cpus_of_node(node.os_index);
        if node_cpus.is_empty() {
            continue;
        }
        let node_gpus = gpus
            .gpus
            .iter()
            .filter(|g| g.numa_node == Some(node.os_index))
            .count();
        let n = node_cpus.len();
        let computing = if split && n >= 4 {
            (n / 4).max(node_gpus).min(n - 1)
        } else {
            n
        };
        let first_compute = n - computing;
        for (i, cpu) in node_cpus.iter().enumerate() {
            let shard = cpus.len();
            cpus.push(*cpu);
            if computing == n || i < first_compute {
                accept.push(shard);
            }
            if i >= first_compute {
                compute.push(shard);
            }
        }
        notes.push(format!(
            "# NUMA node {}: CPUs {}, {} GPU(s): {}",
            node.os_index,
            cpu_list(&node_cpus),
            node_gpus,
            if computing == n {
                "every shard accepts and computes".to_string()
            } else {
                format!(
                    "CPUs {} accept, CPUs {} compute",
                    cpu_list(&node_cpus[..first_compute]),
                    cpu_list(&node_cpus[first_compute..])
                )
            }
        ));
    }
    let rings = if cpus.len() > 8 { 4096 } else { 1024 };
    let mut out = String::new();
    let _ = writeln!(out, "# Written by `shardserve tune` for this machine.");
    let _ = writeln!(
        out,
        "# {} package(s), {} cores, usable CPUs {}",
        topology.packages,
        topology.cores,
        cpu_list(&topology.cpus)
    );
    for g in &gpus.gpus {
        let _ = writeln!(
            out,
            "# GPU {} {} at {} on NUMA node {}",
            g.id,
            g.name,
            g.bus_id,
            g.numa_node
                .map_or_else(|| "?".to_string(), |n| n.to_string())
        );
    }
    if let Some(reason) = &gpus.absent {
        let _ = writeln!(out, "# GPUs: none ({reason})");
    }
    for (what, trip) in [
        ("within a NUMA node", &measured.same_node),
        ("across NUMA nodes", &measured.cross_node),
    ] {
        match trip {
            Some(t) => {
                let _ = writeln!(
                    out,
                    "# ring round trip {what} (CPU {} <-> {}): {:.2} us (median)",
                    t.from_cpu,
                    t.to_cpu,
                    t.median.as_secs_f64() * 1e6
                );
            }
            None => {
                let _ = writeln!(out, "# ring round trip {what}: not measured");
            }
        }
    }
    if !split {
        let _ = writeln!(
            out,
            "# The in-node round trip is over {} us: no network/compute split.",
            SPLIT_LIMIT.as_micros()
        );
    }
    for note in notes {
        let _ = writeln!(out, "{note}");
    }
    let list = |v: &[usize]| {
        v.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(out, "name = \"tuned\"");
    let _ = writeln!(
        out,
        "description = \"measured by shardserve tune: {} shards, {} accept, {} compute\"",
        cpus.len(),
        accept.len(),
        compute.len()
    );
    let _ = writeln!(out, "\n[shards]");
    let _ = writeln!(out, "cpus = [{}]", list(&cpus));
    let _ = writeln!(out, "accept = [{}]", list(&accept));
    let _ = writeln!(out, "compute = [{}]", list(&compute));
    let _ = writeln!(out, "\n[rings]\ncapacity = {rings}");
    let _ = writeln!(out, "\n[onnxruntime]\nintra_op_threads = 1");
    let most_gpus_on_a_node = topology
        .numa_nodes
        .iter()
        .map(|n| {
            gpus.gpus
                .iter()
                .filter(|g| g.numa_node == Some(n.os_index))
                .count()
        })
        .max()
        .unwrap_or(0)
        .max(usize::from(!gpus.gpus.is_empty()));
    if most_gpus_on_a_node > 0 {
        // Triton's default pool (256 MiB) per GPU that the node's pool
        // serves: each GPU's instances stage their inputs through it.
        let _ = writeln!(
            out,
            "\n# Pinned staging pool per NUMA node: 256 MiB per GPU on the node \
             with the most ({most_gpus_on_a_node}); made on first use."
        );
        let _ = writeln!(
            out,
            "[gpu]\npinned_pool_bytes = {}",
            most_gpus_on_a_node * crate::gpu::pinned::DEFAULT_CAPACITY
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_machine_measures_within_its_budget() {
        let t = MachineTopology::detect();
        let m = measure(&t, Duration::from_millis(50));
        if t.cpus.len() >= 2 && t.degraded.is_none() {
            let trip = m.same_node.as_ref().expect("two CPUs on one node");
            assert!(trip.median > Duration::ZERO);
        }
        let text = derive_profile(&t, &GpuInventory::none("test"), &m);
        let profile = super::super::TuningProfile::parse(&text, std::path::Path::new("tuned"))
            .expect("the written profile parses");
        assert_eq!(
            profile.gpu.pinned_pool_bytes, None,
            "no GPU, no pool size:\n{text}"
        );
        super::super::ShardPlan::build(&profile, None, true, &t.cpus)
            .expect("and plans on the machine it was written for");
    }
}
