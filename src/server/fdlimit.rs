//! The open-file limit: raised to its hard maximum at start-up (every
//! connection is a descriptor), and the per-shard connection cap derived
//! from it so that all shards together stay below it with headroom.

use std::io;

/// The process's `RLIMIT_NOFILE` after [`raise_nofile_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdLimit {
    /// The soft limit before we touched it.
    pub previous: u64,
    /// The soft limit now in force.
    pub soft: u64,
    pub hard: u64,
}

/// Descriptors kept free of connections: listeners, io_uring rings and
/// eventfds, model files, shared libraries, logs.
const HEADROOM: u64 = 256;

/// Upper bound of the derived per-shard cap (an explicit
/// `--max-connections` may go higher).
const DERIVED_CAP_MAX: u64 = 1 << 20;

fn get() -> io::Result<libc::rlimit> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` writes one `rlimit` through a valid pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(lim)
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (as nginx's
/// `worker_rlimit_nofile` or systemd services do) and returns the result.
/// An infinite hard limit is clamped to `fs.nr_open`.
pub fn raise_nofile_limit() -> io::Result<FdLimit> {
    let before = get()?;
    let previous = before.rlim_cur;
    let mut target = before.rlim_max;
    if target == libc::RLIM_INFINITY {
        // setrlimit refuses values above fs.nr_open (1 << 20 by default).
        target = std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(1 << 20);
    }
    if target > previous {
        let raised = libc::rlimit {
            rlim_cur: target,
            rlim_max: before.rlim_max,
        };
        // SAFETY: `setrlimit` reads one `rlimit` through a valid pointer.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    let after = get()?;
    Ok(FdLimit {
        previous,
        soft: after.rlim_cur,
        hard: after.rlim_max,
    })
}

/// The default per-shard connection cap: the descriptors left after
/// `HEADROOM` (or a quarter of a small limit), shared by the shards that
/// accept connections; at least 1.
pub fn derived_connection_cap(soft_limit: u64, accepting_shards: usize) -> usize {
    let headroom = HEADROOM.min(soft_limit / 4);
    let shards = accepting_shards.max(1) as u64;
    let per_shard = (soft_limit.saturating_sub(headroom) / shards).clamp(1, DERIVED_CAP_MAX);
    usize::try_from(per_shard).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_leaves_headroom_and_splits_over_shards() {
        assert_eq!(derived_connection_cap(1024, 1), 768);
        assert_eq!(derived_connection_cap(1024, 4), 192);
        assert_eq!(derived_connection_cap(65_536, 2), 32_640);
        // A tiny limit keeps a quarter free instead of all of it.
        assert_eq!(derived_connection_cap(256, 1), 192);
        assert_eq!(derived_connection_cap(0, 1), 1);
        assert_eq!(derived_connection_cap(u64::MAX, 1), 1 << 20);
        assert_eq!(derived_connection_cap(1024, 0), 768);
    }

    #[test]
    fn raising_is_idempotent() {
        let first = raise_nofile_limit().expect("rlimit");
        assert!(first.soft >= first.previous);
        let second = raise_nofile_limit().expect("rlimit");
        assert_eq!(second.soft, first.soft);
        assert_eq!(second.previous, first.soft);
    }
}
