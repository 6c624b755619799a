//! Child processes a backend started while loading a model, seen from
//! `/proc`. Triton's Python backend forks its stub on the thread that
//! runs `TRITONBACKEND_ModelInitialize` and waits for the stub's first
//! message without a timeout (2.51), so a stub that exits before sending
//! it leaves the load waiting forever and the stub a zombie. Linux lists
//! a thread's children (zombies included) in
//! `/proc/self/task/<tid>/children`, so the repository thread can tell
//! which load a dead child belongs to, and see that it is dead
//! (`waitid` with `WNOWAIT`) without taking its exit status from the
//! backend, which waits on its own children when it does notice.

use std::fmt;

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exit::Code(c) => write!(f, "exited with status {c}"),
            Exit::Signal(s) => write!(f, "was killed by signal {s}"),
        }
    }
}

/// The calling thread's kernel id (what `/proc/self/task/` names).
pub fn current_tid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// The processes thread `tid` of this process forked and nobody has
/// reaped yet; empty when the thread is gone or the kernel lacks the file.
pub fn of_thread(tid: i32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/children"))
        .map(|text| {
            text.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// How child `pid` ended, if it has; the child stays a zombie (its status
/// is left for whoever waits on it).
pub fn peek_exit(pid: i32) -> Option<Exit> {
    if pid <= 0 {
        return None;
    }
    // SAFETY: siginfo_t is plain data; waitid writes it.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid on one pid of ours with a valid out pointer.
    let rc = unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    // SAFETY: si_pid/si_status are valid to read after a WEXITED waitid.
    let (child, status) = unsafe { (info.si_pid(), info.si_status()) };
    if rc != 0 || child != pid {
        return None;
    }
    Some(if info.si_code == libc::CLD_EXITED {
        Exit::Code(status)
    } else {
        Exit::Signal(status)
    })
}

/// Reaps child `pid` if it has ended; false if it had not (or is not ours).
pub fn reap(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    let mut status = 0;
    // SAFETY: waitpid on one pid of ours with a valid out pointer.
    unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) == pid }
}

/// The command name of process `pid` (kept by zombies too).
pub fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim_end().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_child_of_this_thread_is_seen_without_being_reaped() {
        let child = std::process::Command::new("sh")
            .args(["-c", "exit 3"])
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let tid = current_tid();
        let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let exit = loop {
            if let Some(e) = peek_exit(pid) {
                break e;
            }
            assert!(std::time::Instant::now() < until, "the child never ended");
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        assert_eq!(exit, Exit::Code(3));
        assert!(
            of_thread(tid).contains(&pid),
            "not listed as this thread's child"
        );
        // Still a zombie: peeking again sees it, reaping takes it.
        assert_eq!(peek_exit(pid), Some(Exit::Code(3)));
        assert!(reap(pid));
        assert!(!of_thread(tid).contains(&pid));
        assert_eq!(peek_exit(pid), None);
        std::mem::forget(child);
    }
}
