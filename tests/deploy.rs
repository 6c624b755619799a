//! Deployment: `--version`, and cgroup-aware sizing: recorded cgroup v1/v2 trees (tests/fixtures/cgroup:
//! `proc/self/cgroup`, `proc/self/mountinfo` and the cgroup files), and, when
//! this process may create cgroups (root, a writable v1 `cpu` or v2
//! hierarchy), a real cgroup with a CPU quota that `shardserve topology`
//! run inside it must obey.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use shardserve::tuning::CgroupCpu;

fn fixture(name: &str) -> CgroupCpu {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/cgroup")
        .join(name);
    CgroupCpu::read(&root).unwrap_or_else(|| panic!("fixture {name} reads"))
}

fn all(n: usize) -> Vec<usize> {
    (0..n).collect()
}

#[test]
fn v2_in_a_cgroup_namespace() {
    let cg = fixture("v2_namespaced");
    assert_eq!(cg.version, 2);
    assert_eq!(cg.path, "/");
    assert_eq!(cg.quota, Some((400_000, 100_000)));
    assert_eq!(cg.cpu_limit(), Some(4));
    assert_eq!(cg.cpuset, Some(vec![2, 3, 4, 5]));
    assert_eq!(cg.restrict(&all(64)), vec![2, 3, 4, 5]);
    assert_eq!(
        cg.to_string(),
        "cgroup v2 /: CPU quota 400000/100000 us = 4 CPU(s); cpuset 2-5"
    );
}

#[test]
fn v2_tightest_quota_on_the_path_counts() {
    let cg = fixture("v2_nested");
    assert_eq!(cg.version, 2);
    assert_eq!(cg.path, "/kubepods.slice/pod1/ctr");
    // The container says max; its pod says 2.5 CPUs: rounded up to 3.
    assert_eq!(cg.quota, Some((250_000, 100_000)));
    assert_eq!(cg.cpu_limit(), Some(3));
    assert_eq!(cg.restrict(&all(64)), vec![0, 1, 2]);
}

#[test]
fn v1_hybrid_prefers_the_v1_cpu_controller() {
    let cg = fixture("v1_hybrid");
    assert_eq!(cg.version, 1);
    assert_eq!(cg.path, "/docker/abc");
    assert_eq!(cg.quota, Some((150_000, 100_000)));
    assert_eq!(cg.cpu_limit(), Some(2));
    assert_eq!(cg.cpuset, Some(vec![0, 1, 4]));
    // Preference order is kept: the caller lists one CPU per core first.
    assert_eq!(cg.restrict(&[4, 0, 1, 2]), vec![0, 4]);
}

#[test]
fn v1_bind_mounted_without_quota_changes_nothing() {
    let cg = fixture("v1_bind_mounted");
    assert_eq!(cg.version, 1);
    assert_eq!(cg.quota, None);
    assert_eq!(cg.cpu_limit(), None);
    assert_eq!(cg.cpuset, None);
    assert_eq!(cg.restrict(&[0, 1, 2]), vec![0, 1, 2]);
}

#[test]
fn no_cgroup_file_system_is_no_limit() {
    assert_eq!(CgroupCpu::read(Path::new("/nonexistent-cgroup-root")), None);
}

/// A fresh cgroup with a CPU quota of `quota_us` per 100 ms, in the v1
/// `cpu` hierarchy or the v2 one; `None` (with the reason printed) where
/// this process may not make one.
struct TestCgroup {
    dir: PathBuf,
}

impl TestCgroup {
    fn create(quota_us: u64) -> Option<Self> {
        // Tests run in parallel threads of one process: a counter keeps
        // their cgroups apart.
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("shardserve-test-{}-{n}-{quota_us}", std::process::id());
        let v1 = Path::new("/sys/fs/cgroup/cpu");
        let (dir, files): (PathBuf, Vec<(&str, String)>) = if v1.join("cpu.cfs_quota_us").is_file()
        {
            (
                v1.join(&name),
                vec![
                    ("cpu.cfs_period_us", "100000".into()),
                    ("cpu.cfs_quota_us", quota_us.to_string()),
                ],
            )
        } else {
            let v2 = Path::new("/sys/fs/cgroup");
            let controllers =
                std::fs::read_to_string(v2.join("cgroup.subtree_control")).unwrap_or_default();
            if !controllers.split_whitespace().any(|c| c == "cpu") {
                eprintln!("skipped: no v1 cpu hierarchy, and cpu is not delegated in v2");
                return None;
            }
            (
                v2.join(&name),
                vec![("cpu.max", format!("{quota_us} 100000"))],
            )
        };
        if let Err(e) = std::fs::create_dir(&dir) {
            eprintln!("skipped: cannot create {}: {e}", dir.display());
            return None;
        }
        let this = Self { dir };
        for (file, value) in files {
            if let Err(e) = std::fs::write(this.dir.join(file), value) {
                eprintln!("skipped: cannot write {file}: {e}");
                return None;
            }
        }
        Some(this)
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // Empty by now (the child exited): a cgroup folder is removed with
        // rmdir, its control files go with it.
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// `shardserve topology ARGS` run inside a fresh cgroup with a 1-CPU quota
/// (this box may have as few as 2 CPUs, so a 2-CPU quota could not be told
/// apart from none): its standard output, or `None` where this process may
/// not make such a cgroup.
fn topology_in_a_1_cpu_cgroup(args: &str) -> Option<String> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 {
        eprintln!("skipped: one CPU, a quota cannot lower it");
        return None;
    }
    let cgroup = TestCgroup::create(50_000)?;
    let exe = env!("CARGO_BIN_EXE_shardserve");
    // The shell moves itself into the cgroup, then becomes the server
    // binary, so the process reading /proc/self/cgroup is in it.
    let script = format!(
        "echo $$ > '{}/cgroup.procs' && exec '{exe}' topology {args}",
        cgroup.dir.display()
    );
    let out = Command::new("sh").args(["-c", &script]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("CPU quota 50000/100000 us = 1 CPU(s)"),
        "{stdout}"
    );
    drop(cgroup);
    Some(stdout)
}

/// Without --cores the shards follow the quota: one.
#[test]
fn a_real_cgroup_quota_limits_the_shards() {
    let Some(stdout) = topology_in_a_1_cpu_cgroup("") else {
        return;
    };
    assert!(stdout.contains("\nshards: 1\n"), "{stdout}");
    assert!(!stdout.contains("warning:"), "{stdout}");
}

/// An explicit --cores above the quota wins (the user asked for it), and
/// `shardserve topology` warns that the shards will share the quota.
#[test]
fn cores_above_a_real_cgroup_quota_win_with_a_warning() {
    let Some(stdout) = topology_in_a_1_cpu_cgroup("--cores 2") else {
        return;
    };
    assert!(stdout.contains("\nshards: 2\n"), "{stdout}");
    assert!(
        stdout.contains("warning: 2 shards exceed the 1 CPU(s) the cgroup allows"),
        "{stdout}"
    );
}

#[test]
fn version_names_the_commit() {
    let out = Command::new(env!("CARGO_BIN_EXE_shardserve"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let rest = text
        .strip_prefix(concat!(
            "shardserve ",
            env!("CARGO_PKG_VERSION"),
            " (commit "
        ))
        .unwrap_or_else(|| panic!("{text:?}"));
    let commit = rest
        .strip_suffix(")\n")
        .unwrap_or_else(|| panic!("{text:?}"));
    assert!(
        commit == "unknown" || (commit.len() >= 7 && commit.chars().all(|c| c.is_ascii_hexdigit())),
        "{text:?}"
    );
}
