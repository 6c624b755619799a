//! The CPU limits of the process's cgroup (v1 or v2): the CFS bandwidth
//! quota (`cpu.max`, `cpu.cfs_quota_us`/`cpu.cfs_period_us`) and the cpuset.
//! A pod limited to 4 CPUs on a 64-core node still sees 64 CPUs in its
//! affinity mask; pinning 64 shards there would have them throttled in
//! turn. As the JVM and Go do, the quota becomes ceil(quota / period) CPUs,
//! at least one; the tightest quota on the path from the process's cgroup
//! up to the mount's root counts, since each level caps its children.
//!
//! Everything is read below a given root (`/` on a live system) so tests
//! use recorded trees: `<root>/proc/self/cgroup`,
//! `<root>/proc/self/mountinfo`, and the cgroup files at
//! `<root>/<mount point>/...`.

use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupCpu {
    /// 1 or 2: the hierarchy the CPU controller was found in.
    pub version: u8,
    /// The process's cgroup, as `/proc/self/cgroup` names it.
    pub path: String,
    /// The tightest quota found: (quota, period) in microseconds.
    pub quota: Option<(u64, u64)>,
    /// The cgroup's effective cpuset, when the cpuset controller is there.
    pub cpuset: Option<Vec<usize>>,
}

impl CgroupCpu {
    /// The live system's cgroup; `None` when no cgroup file system is
    /// mounted (or readable): then only the affinity mask limits the CPUs.
    pub fn detect() -> Option<Self> {
        Self::read(Path::new("/"))
    }

    pub fn read(root: &Path) -> Option<Self> {
        let cgroups = std::fs::read_to_string(root.join("proc/self/cgroup")).ok()?;
        let mountinfo = std::fs::read_to_string(root.join("proc/self/mountinfo")).ok()?;
        let mounts = parse_mountinfo(&mountinfo);
        let memberships = parse_cgroups(&cgroups);

        // Hybrid systems mount a v2 hierarchy without controllers next to
        // the v1 ones: a v1 `cpu` controller, where there is one, is the
        // one that enforces the quota.
        if let Some(cpu_dir) = v1_dir(root, &mounts, &memberships, "cpu") {
            let path = membership(&memberships, Some("cpu"))
                .unwrap_or("/")
                .to_owned();
            let quota = tightest(&cpu_dir.dir, &cpu_dir.top, |dir| {
                let quota = read_trimmed(&dir.join("cpu.cfs_quota_us"))?;
                let period = read_trimmed(&dir.join("cpu.cfs_period_us"))?;
                parse_quota(&quota, &period)
            });
            let cpuset = v1_dir(root, &mounts, &memberships, "cpuset").and_then(|d| {
                read_trimmed(&d.dir.join("cpuset.effective_cpus"))
                    .or_else(|| read_trimmed(&d.dir.join("cpuset.cpus")))
                    .and_then(|text| parse_cpu_list(&text))
            });
            return Some(Self {
                version: 1,
                path,
                quota,
                cpuset,
            });
        }
        let v2 = v2_dir(root, &mounts, &memberships)?;
        let quota = tightest(&v2.dir, &v2.top, |dir| {
            let text = read_trimmed(&dir.join("cpu.max"))?;
            let mut parts = text.split_whitespace();
            let quota = parts.next()?;
            let period = parts.next().unwrap_or("100000");
            parse_quota(quota, period)
        });
        let cpuset = read_trimmed(&v2.dir.join("cpuset.cpus.effective"))
            .and_then(|text| parse_cpu_list(&text));
        Some(Self {
            version: 2,
            path: membership(&memberships, None).unwrap_or("/").to_owned(),
            quota,
            cpuset,
        })
    }

    /// ceil(quota / period), at least 1; `None` without a quota.
    pub fn cpu_limit(&self) -> Option<usize> {
        let (quota, period) = self.quota?;
        let cpus = quota.div_ceil(period.max(1)).max(1);
        Some(usize::try_from(cpus).unwrap_or(usize::MAX))
    }

    /// The CPUs to use among `allowed` (in the preference order given):
    /// those in the cpuset (when it overlaps `allowed` at all), then the
    /// first [`Self::cpu_limit`] of them. Returned sorted.
    pub fn restrict(&self, allowed: &[usize]) -> Vec<usize> {
        let mut cpus: Vec<usize> = allowed.to_vec();
        if let Some(set) = &self.cpuset {
            let inside: Vec<usize> = cpus.iter().copied().filter(|c| set.contains(c)).collect();
            if !inside.is_empty() {
                cpus = inside;
            }
        }
        if let Some(limit) = self.cpu_limit() {
            cpus.truncate(limit);
        }
        cpus.sort_unstable();
        cpus
    }
}

struct Mount {
    /// The folder of the hierarchy that is mounted (field 4 of mountinfo).
    root: String,
    mount_point: String,
    fs_type: String,
    super_options: Vec<String>,
}

fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let fields: Vec<&str> = before.split_whitespace().collect();
            let mut after = after.split_whitespace();
            let fs_type = after.next()?.to_owned();
            let _source = after.next()?;
            let super_options = after
                .next()
                .unwrap_or("")
                .split(',')
                .map(str::to_owned)
                .collect();
            Some(Mount {
                root: unescape(fields.get(3)?),
                mount_point: unescape(fields.get(4)?),
                fs_type,
                super_options,
            })
        })
        .collect()
}

/// mountinfo writes space, tab, newline and backslash as octal escapes.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let digits = bytes.get(i + 1..i + 4);
        if bytes[i] == b'\\' && digits.is_some_and(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)))
        {
            let digits = std::str::from_utf8(digits.unwrap_or_default()).unwrap_or_default();
            if let Ok(value) = u8::from_str_radix(digits, 8) {
                out.push(value);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `(controllers, path)` per line of `/proc/self/cgroup`; v2's line has no
/// controllers.
fn parse_cgroups(text: &str) -> Vec<(Vec<String>, String)> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let _id = parts.next()?;
            let controllers = parts.next()?;
            let path = parts.next()?;
            let controllers = controllers
                .split(',')
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
                .collect();
            Some((controllers, path.to_owned()))
        })
        .collect()
}

/// The path of the v1 hierarchy holding `controller`, or (`None`) of the v2
/// hierarchy.
fn membership<'a>(
    memberships: &'a [(Vec<String>, String)],
    controller: Option<&str>,
) -> Option<&'a str> {
    memberships
        .iter()
        .find(|(controllers, _)| match controller {
            Some(name) => controllers.iter().any(|c| c == name),
            None => controllers.is_empty(),
        })
        .map(|(_, path)| path.as_str())
}

/// The process's folder in a mounted hierarchy, and the mount point (where
/// walking up stops).
struct CgroupDir {
    dir: PathBuf,
    top: PathBuf,
}

fn v1_dir(
    root: &Path,
    mounts: &[Mount],
    memberships: &[(Vec<String>, String)],
    controller: &str,
) -> Option<CgroupDir> {
    let path = membership(memberships, Some(controller))?;
    let mount = mounts
        .iter()
        .find(|m| m.fs_type == "cgroup" && m.super_options.iter().any(|o| o == controller))?;
    Some(locate(root, mount, path))
}

fn v2_dir(
    root: &Path,
    mounts: &[Mount],
    memberships: &[(Vec<String>, String)],
) -> Option<CgroupDir> {
    let path = membership(memberships, None)?;
    let mount = mounts.iter().find(|m| m.fs_type == "cgroup2")?;
    Some(locate(root, mount, path))
}

/// Where `cgroup_path` is under `mount`. With a cgroup namespace (most
/// containers) both are `/`; without one the mount may show a sub-tree
/// (`/docker/<id>`) the path starts with. When the path is outside the
/// mounted sub-tree, the mount point itself is the best guess (as the JVM
/// does).
fn locate(root: &Path, mount: &Mount, cgroup_path: &str) -> CgroupDir {
    let top = root.join(mount.mount_point.trim_start_matches('/'));
    let mount_root = mount.root.trim_end_matches('/');
    let relative = if mount_root.is_empty() {
        Some(cgroup_path)
    } else {
        cgroup_path
            .strip_prefix(mount_root)
            .filter(|rest| rest.is_empty() || rest.starts_with('/'))
    };
    let dir = match relative.map(|r| r.trim_start_matches('/')) {
        Some(rel) if !rel.is_empty() && !rel.split('/').any(|c| c == "..") => top.join(rel),
        _ => top.clone(),
    };
    let dir = if dir.is_dir() { dir } else { top.clone() };
    CgroupDir { dir, top }
}

/// The smallest CPU count among the quotas from `dir` up to `top`.
fn tightest(
    dir: &Path,
    top: &Path,
    read: impl Fn(&Path) -> Option<(u64, u64)>,
) -> Option<(u64, u64)> {
    let mut best: Option<(u64, u64)> = None;
    for level in dir.ancestors() {
        if let Some((quota, period)) = read(level) {
            let tighter = match best {
                // quota/period < q/p without division: quota*p < q*period.
                Some((q, p)) => {
                    u128::from(quota) * u128::from(p) < u128::from(q) * u128::from(period)
                }
                None => true,
            };
            if tighter {
                best = Some((quota, period));
            }
        }
        if level == top || !level.starts_with(top) {
            break;
        }
    }
    best
}

/// "max"/-1: no quota. A zero period would divide by zero: treated as none.
fn parse_quota(quota: &str, period: &str) -> Option<(u64, u64)> {
    let quota: i64 = quota.trim().parse().ok()?;
    let period: u64 = period.trim().parse().ok()?;
    if quota <= 0 || period == 0 {
        return None;
    }
    Some((quota.unsigned_abs(), period))
}

fn read_trimmed(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// The kernel's list format: `0-3,8,10-11`.
pub fn parse_cpu_list(text: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                // A corrupt range must not allocate without bound.
                if b < a || b - a > 1 << 16 {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Some(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotas_round_up_to_at_least_one_cpu() {
        let cg = |quota| CgroupCpu {
            version: 2,
            path: "/".into(),
            quota,
            cpuset: None,
        };
        assert_eq!(cg(Some((150_000, 100_000))).cpu_limit(), Some(2));
        assert_eq!(cg(Some((400_000, 100_000))).cpu_limit(), Some(4));
        assert_eq!(cg(Some((10_000, 100_000))).cpu_limit(), Some(1));
        assert_eq!(cg(None).cpu_limit(), None);
        assert_eq!(parse_quota("max", "100000"), None);
        assert_eq!(parse_quota("-1", "100000"), None);
        assert_eq!(parse_quota("5", "0"), None);
    }

    #[test]
    fn restrict_keeps_the_cpuset_and_the_quota() {
        let cg = CgroupCpu {
            version: 1,
            path: "/x".into(),
            quota: Some((200_000, 100_000)),
            cpuset: Some(vec![4, 5, 6, 7]),
        };
        assert_eq!(cg.restrict(&[0, 1, 2, 3, 4, 5, 6, 7]), vec![4, 5]);
        // A cpuset that does not overlap the affinity (a recorded tree on
        // another machine) leaves the affinity alone.
        assert_eq!(cg.restrict(&[0, 1, 2]), vec![0, 1]);
    }

    #[test]
    fn cpu_lists_parse() {
        assert_eq!(
            parse_cpu_list("0-3,8,10-11\n"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpu_list(""), Some(vec![]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("0-99999999"), None);
        assert_eq!(parse_cpu_list("x"), None);
    }

    #[test]
    fn mountinfo_fields_and_escapes() {
        let m = parse_mountinfo(
            "41 31 0:38 /docker/ab /sys/fs/cgroup/my\\040dir rw - cgroup2 cgroup2 rw,nsdelegate\n",
        );
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].root, "/docker/ab");
        assert_eq!(m[0].mount_point, "/sys/fs/cgroup/my dir");
        assert_eq!(m[0].fs_type, "cgroup2");
    }
}
