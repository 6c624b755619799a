//! OS-level placement of compute threads: CPU affinity and a scheduling
//! priority below the shards' reactors, so that on cores shared with a
//! shard a long inference yields to network I/O as soon as it is woken.

use std::io;

/// Restricts the calling thread to `cpus` (logical CPU ids). An empty
/// list leaves the affinity as it is.
pub fn set_affinity(cpus: &[usize]) -> io::Result<()> {
    if cpus.is_empty() {
        return Ok(());
    }
    // SAFETY: cpu_set_t is a plain bit array; zeroed is the empty set, and
    // CPU_SET only writes inside it for ids below CPU_SETSIZE (checked).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let mut any = false;
        for &cpu in cpus {
            if cpu < libc::CPU_SETSIZE as usize {
                libc::CPU_SET(cpu, &mut set);
                any = true;
            }
        }
        if !any {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("no usable CPU id in {cpus:?}"),
            ));
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The logical CPUs the calling thread may run on (inherited by the threads
/// it starts), from `sched_getaffinity`.
pub fn current_affinity() -> io::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is a plain bit array filled in by the kernel;
    // CPU_ISSET only reads inside it for ids below CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((0..libc::CPU_SETSIZE as usize)
            .filter(|&cpu| libc::CPU_ISSET(cpu, &set))
            .collect())
    }
}

/// Sets the calling thread's nice value (Linux applies it per thread).
/// Positive values lower the priority; raising it back needs privileges.
pub fn set_nice(nice: i32) -> io::Result<()> {
    if nice == 0 {
        return Ok(());
    }
    // SAFETY: gettid has no preconditions; setpriority with PRIO_PROCESS and
    // a thread id changes only that thread on Linux.
    let rc = unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, nice)
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Makes the calling thread `SCHED_BATCH` (its nice value kept): its
/// wake-ups stop preempting the thread running on its CPU. Needs no
/// privilege.
pub fn set_sched_batch() -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid sched_param; pid 0 is the calling thread.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The calling thread's scheduling policy (`libc::SCHED_*`).
pub fn current_policy() -> io::Result<i32> {
    // SAFETY: no arguments beyond the calling thread (pid 0).
    let p = unsafe { libc::sched_getscheduler(0) };
    if p < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(p)
}

/// The calling thread's nice value.
pub fn current_nice() -> io::Result<i32> {
    // SAFETY: see `set_nice`; errno is cleared first because -1 is a valid
    // result of getpriority.
    unsafe {
        *libc::__errno_location() = 0;
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        let v = libc::getpriority(libc::PRIO_PROCESS, tid);
        if v == -1 && *libc::__errno_location() != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_applies_to_the_calling_thread_only() {
        let before = current_nice().expect("getpriority");
        let inner = std::thread::spawn(|| {
            set_nice(5).expect("setpriority");
            current_nice().expect("getpriority")
        })
        .join()
        .expect("thread");
        assert!(inner >= 5, "nice in the thread: {inner}");
        assert_eq!(current_nice().expect("getpriority"), before);
    }

    #[test]
    fn sched_batch_applies_to_the_calling_thread_only() {
        let before = current_policy().expect("sched_getscheduler");
        let inner = std::thread::spawn(|| {
            set_sched_batch().expect("sched_setscheduler");
            current_policy().expect("sched_getscheduler")
        })
        .join()
        .expect("thread");
        assert_eq!(inner, libc::SCHED_BATCH);
        assert_eq!(current_policy().expect("sched_getscheduler"), before);
    }

    #[test]
    fn affinity_reads_back_what_was_set() {
        let all = current_affinity().expect("sched_getaffinity");
        assert!(!all.is_empty());
        let first = all[0];
        let pinned = std::thread::spawn(move || {
            set_affinity(&[first]).expect("sched_setaffinity");
            current_affinity().expect("sched_getaffinity")
        })
        .join()
        .expect("thread");
        assert_eq!(pinned, vec![first]);
    }

    #[test]
    fn affinity_to_an_impossible_cpu_is_an_error() {
        let r = std::thread::spawn(|| set_affinity(&[usize::MAX]))
            .join()
            .expect("thread");
        assert!(r.is_err());
    }
}
