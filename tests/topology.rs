//! Topology and placement on recorded machines: hwloc XML of a 16-core
//! single-H100 node and a dual-socket 4-GPU server (tests/fixtures/hwloc,
//! written by scripts/gen_hwloc_fixtures.py), read through hwloc itself,
//! and the placement each shipped tuning profile gives there.

use std::path::Path;

use shardserve::{
    gpu::{CudaDevice, GpuInventory},
    tuning::{MachineTopology, ShardPlan, TuningProfile},
};

fn fixture(name: &str) -> MachineTopology {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hwloc")
        .join(name);
    let xml = std::fs::read_to_string(&path).expect("fixture");
    MachineTopology::from_xml(&xml).expect("hwloc reads the fixture")
}

fn profile(name: &str) -> TuningProfile {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tuning")
        .join(format!("{name}.toml"));
    TuningProfile::load(path.to_str().expect("utf-8 path")).expect("profile")
}

#[test]
fn single_gpu_node_is_read_from_its_hwloc_xml() {
    let t = fixture("h100-x1-16core.xml");
    assert_eq!(t.degraded, None);
    assert_eq!((t.packages, t.cores), (1, 16));
    assert_eq!(t.cpus, (0..16).collect::<Vec<_>>());
    assert_eq!(t.numa_nodes.len(), 1);
    assert_eq!(t.numa_nodes[0].memory_bytes, 128 << 30);
    let gpus: Vec<_> = t.gpus().collect();
    assert_eq!(gpus.len(), 1);
    assert_eq!(gpus[0].bus_id, "0000:00:05.0");
    assert_eq!((gpus[0].vendor_id, gpus[0].device_id), (0x10de, 0x2330));
    assert_eq!(gpus[0].numa_node, Some(0));
    assert_eq!(gpus[0].local_cpus, (0..16).collect::<Vec<_>>());
}

#[test]
fn dual_socket_node_puts_each_gpu_on_its_socket() {
    let t = fixture("dual-socket-4gpu.xml");
    assert_eq!((t.packages, t.cores, t.cpus.len()), (2, 32, 64));
    assert_eq!(t.numa_nodes.len(), 2);
    let node0: Vec<usize> = (0..16).chain(32..48).collect();
    assert_eq!(t.numa_nodes[0].cpus, node0);
    assert_eq!(t.numa_node_of_cpu(40), Some(0));
    assert_eq!(t.numa_node_of_cpu(17), Some(1));
    let gpus: Vec<_> = t.gpus().map(|g| (g.bus_id.as_str(), g.numa_node)).collect();
    assert_eq!(
        gpus,
        vec![
            ("0000:17:00.0", Some(0)),
            ("0000:31:00.0", Some(0)),
            ("0000:b1:00.0", Some(1)),
            ("0000:ca:00.0", Some(1)),
        ]
    );
    // The NIC beside GPU 0 is on the bus but is not a GPU.
    let nic = t.pci_device("0000:18:00.0").expect("NIC");
    assert!(!nic.is_nvidia_gpu());
    assert_eq!(nic.numa_node, Some(0));
}

#[test]
fn cuda_devices_are_placed_by_bus_id_whatever_their_ordinal() {
    let t = fixture("dual-socket-4gpu.xml");
    // CUDA's default order is "fastest first", not PCI order, and it
    // spells bus ids with an 8-digit upper-case domain.
    let device = |ordinal: i32, bus: &str, cc: (i32, i32)| CudaDevice {
        ordinal,
        name: "NVIDIA H100 PCIe".into(),
        uuid: Some(format!("GPU-{ordinal:08x}-0000-0000-0000-000000000000")),
        bus_id: bus.into(),
        memory_bytes: 80 << 30,
        compute_capability: cc,
    };
    let inventory = GpuInventory::from_cuda(
        &[
            device(0, "00000000:CA:00.0", (9, 0)),
            device(1, "00000000:17:00.0", (9, 0)),
            device(2, "00000000:B1:00.0", (5, 2)),
        ],
        &t,
    );
    assert_eq!(inventory.ids(), vec![0, 1], "below 6.0 is not supported");
    let gpu0 = inventory.get(0).expect("gpu 0");
    assert_eq!(
        (gpu0.bus_id.as_str(), gpu0.numa_node),
        ("0000:ca:00.0", Some(1))
    );
    assert_eq!(inventory.get(1).and_then(|g| g.numa_node), Some(0));
    assert!(inventory.absent.is_none());
    let none = GpuInventory::from_cuda(&[device(0, "00000000:17:00.0", (3, 5))], &t);
    assert!(none.is_empty() && none.absent.is_some());
}

#[test]
fn h100_profile_places_network_compute_and_the_gpu() {
    let t = fixture("h100-x1-16core.xml");
    let gpus = GpuInventory::from_topology_bus_order(&t);
    let plan = ShardPlan::build(&profile("h100-x1"), None, true, &t.cpus).expect("plan");
    assert_eq!(plan.shard_count(), 16);
    assert_eq!(plan.accept, (0..12).collect::<Vec<_>>());
    assert_eq!(plan.compute, vec![12, 13, 14, 15]);
    let workers = plan.worker_cpus(|c| t.numa_node_of_cpu(c));
    assert!(workers.iter().all(|w| w == &vec![12, 13, 14, 15]));
    let gpu = plan.gpu_placement(&gpus.gpus[0], &t);
    assert_eq!(gpu.shards, vec![12, 13, 14, 15]);
    assert_eq!(gpu.worker_cpus, vec![12, 13, 14, 15]);
    let text = plan.describe(&t, &gpus);
    assert!(
        text.contains("GPU 0: KIND_GPU instances scheduled on shards [12, 13, 14, 15], compute workers on CPUs 12-15"),
        "{text}"
    );
}

#[test]
fn dual_socket_profile_keeps_each_gpu_on_its_socket() {
    let t = fixture("dual-socket-4gpu.xml");
    let gpus = GpuInventory::from_topology_bus_order(&t);
    assert_eq!(gpus.ids(), vec![0, 1, 2, 3]);
    let plan = ShardPlan::build(&profile("dual-socket-4gpu"), None, true, &t.cpus).expect("plan");
    assert_eq!(plan.shard_count(), 32);
    assert_eq!(plan.accept.len(), 24);
    for (id, shards, cpus) in [
        (0, vec![12, 13, 14, 15], vec![12, 13, 14, 15]),
        (1, vec![12, 13, 14, 15], vec![12, 13, 14, 15]),
        (2, vec![28, 29, 30, 31], vec![28, 29, 30, 31]),
        (3, vec![28, 29, 30, 31], vec![28, 29, 30, 31]),
    ] {
        let p = plan.gpu_placement(gpus.get(id).expect("gpu"), &t);
        assert_eq!((p.shards, p.worker_cpus), (shards, cpus), "GPU {id}");
    }
    // CPU models owned by a socket-1 shard compute on socket 1 only.
    let workers = plan.worker_cpus(|c| t.numa_node_of_cpu(c));
    assert_eq!(workers[20], vec![28, 29, 30, 31]);
    assert_eq!(workers[3], vec![12, 13, 14, 15]);
}

#[test]
fn gpu_without_a_compute_shard_on_its_socket_still_gets_local_workers() {
    // The 2-core default profile limited to socket 0's first cores: GPUs
    // on socket 1 have no compute shard there.
    let t = fixture("dual-socket-4gpu.xml");
    let gpus = GpuInventory::from_topology_bus_order(&t);
    let plan = ShardPlan::build(&profile("split-2core"), None, true, &t.cpus).expect("plan");
    let far = plan.gpu_placement(gpus.get(2).expect("gpu 2"), &t);
    assert_eq!(far.shards, vec![1], "any compute shard owns the scheduler");
    let node1: Vec<usize> = (16..32).chain(48..64).collect();
    assert_eq!(far.worker_cpus, node1, "workers stay near the GPU");
    let near = plan.gpu_placement(gpus.get(0).expect("gpu 0"), &t);
    assert_eq!((near.shards, near.worker_cpus), (vec![1], vec![1]));
    // Unpinned shards: no CPU restriction at all.
    let unpinned = ShardPlan::build(&profile("split-2core"), None, false, &t.cpus).expect("plan");
    assert!(unpinned
        .gpu_placement(gpus.get(2).expect("gpu"), &t)
        .worker_cpus
        .is_empty());
}

#[test]
fn a_profile_for_a_bigger_machine_is_refused_here_with_a_clear_error() {
    let t = fixture("h100-x1-16core.xml");
    let e = ShardPlan::build(&profile("dual-socket-4gpu"), None, true, &t.cpus).unwrap_err();
    assert!(e.to_string().contains("CPU 16 is not usable"), "{e}");
}

#[test]
fn the_topology_command_describes_a_recorded_machine() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shardserve"))
        .args(["topology", "--xml"])
        .arg(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hwloc/dual-socket-4gpu.xml"),
        )
        .args(["--tuning-profile"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tuning/dual-socket-4gpu.toml"))
        .output()
        .expect("run shardserve topology");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("NUMA node 1: CPUs 16-31,48-63"), "{text}");
    assert!(text.contains("GPU 3: PCI 10de:2331"), "{text}");
    assert!(
        text.contains("GPU 2: KIND_GPU instances scheduled on shards [28, 29, 30, 31], compute workers on CPUs 28-31"),
        "{text}"
    );
}

#[test]
fn tune_derives_a_profile_per_socket_that_plans_on_that_machine() {
    use shardserve::tuning::{derive_profile, Measurements, RoundTrip};
    use std::time::Duration;
    let t = fixture("dual-socket-4gpu.xml");
    let gpus = GpuInventory::from_topology_bus_order(&t);
    let trip = |us: u64| RoundTrip {
        from_cpu: 0,
        to_cpu: 1,
        median: Duration::from_micros(us),
    };
    let fast = Measurements {
        same_node: Some(trip(1)),
        cross_node: Some(trip(2)),
    };
    let text = derive_profile(&t, &gpus, &fast);
    let profile = TuningProfile::parse(&text, Path::new("tuned")).expect("parses");
    let plan = ShardPlan::build(&profile, None, true, &t.cpus).expect("plans");
    assert_eq!(plan.shard_count(), 64);
    // Two GPUs per socket: each node's staging pool gets 2 x 256 MiB.
    assert_eq!(profile.gpu.pinned_pool_bytes, Some(512 << 20), "{text}");
    // A quarter of each node computes: its last 8 CPUs (40-47, 56-63).
    let compute_cpus: Vec<usize> = plan.compute.iter().filter_map(|&s| plan.cpus[s]).collect();
    assert_eq!(
        compute_cpus,
        (40..48).chain(56..64).collect::<Vec<_>>(),
        "{text}"
    );
    assert_eq!(plan.accept.len(), 48);
    let p = plan.gpu_placement(gpus.get(3).expect("gpu 3"), &t);
    assert_eq!(p.worker_cpus, (56..64).collect::<Vec<_>>());
    assert!(
        text.contains("# ring round trip within a NUMA node (CPU 0 <-> 1): 1.00 us"),
        "{text}"
    );

    // A noisy VM (slow hops): every shard accepts and computes.
    let slow = Measurements {
        same_node: Some(trip(50)),
        cross_node: None,
    };
    let text = derive_profile(&t, &gpus, &slow);
    let plan = ShardPlan::build(
        &TuningProfile::parse(&text, Path::new("tuned")).expect("parses"),
        None,
        true,
        &t.cpus,
    )
    .expect("plans");
    assert_eq!((plan.accept.len(), plan.compute.len()), (64, 64), "{text}");
}

#[test]
fn the_topology_command_shows_the_spin_window() {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_shardserve"))
            .args(["topology", "--xml"])
            .arg(
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("tests/fixtures/hwloc/dual-socket-4gpu.xml"),
            )
            .args(args)
            .output()
            .expect("run shardserve topology");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    let default = run(&[]);
    let expected = format!(
        "spin {} us after a request",
        shardserve::tuning::RuntimeSection::DEFAULT_SPIN_US
    );
    assert!(default.contains(&expected), "{default}");
    assert!(default.contains("shards SCHED_BATCH"), "{default}");
    let dir = std::env::temp_dir().join(format!("spin-profile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("spin-off.toml");
    std::fs::write(
        &file,
        "name = \"spin-off\"\n[runtime]\nspin_us = 0\nsched_batch = false\n",
    )
    .expect("write profile");
    let path = file.to_string_lossy().to_string();
    let off = run(&["--tuning-profile", &path]);
    assert!(
        off.contains("spin 0 us after a request before parking (off), shards SCHED_OTHER"),
        "{off}"
    );
    // The flag wins over the profile.
    let flag = run(&["--tuning-profile", &path, "--spin-us", "75"]);
    assert!(flag.contains("spin 75 us after a request"), "{flag}");
    let _ = std::fs::remove_dir_all(&dir);
}
