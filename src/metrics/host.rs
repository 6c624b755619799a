//! Triton's per-interval host metrics: CPU utilization (from /proc/stat
//! deltas), RAM (from /proc/meminfo) and the pinned memory pool. A
//! `host-metrics` thread reads them every half `--metrics-interval-ms`, as
//! Triton's polling thread does, so `nv_cpu_utilization` is the load over
//! the last interval whoever scrapes and however often; a scrape only
//! copies the latest reading.

use std::{
    sync::{Mutex, OnceLock},
    time::Duration,
};

/// One poll's readings.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HostReading {
    /// [0, 1] since the previous poll; `None` without /proc/stat.
    pub cpu_utilization: Option<f64>,
    /// (MemTotal, MemTotal - MemAvailable) in bytes; `None` without
    /// /proc/meminfo.
    pub memory: Option<(u64, u64)>,
    /// The pinned pool's (total, used) bytes.
    pub pinned: (u64, u64),
}

static LATEST: Mutex<Option<HostReading>> = Mutex::new(None);
static STARTED: OnceLock<()> = OnceLock::new();

/// Starts the poller once per process (the readings are the machine's,
/// whichever server asks); the first server's interval is kept.
pub fn start(interval: Duration) {
    STARTED.get_or_init(|| {
        let period = (interval / 2).max(Duration::from_millis(50));
        let mut last = cpu_times();
        poll(&mut last);
        if let Err(e) = std::thread::Builder::new()
            .name("host-metrics".into())
            .spawn(move || loop {
                std::thread::sleep(period);
                poll(&mut last);
            })
        {
            tracing::warn!(error = %e, "cannot start the host metrics thread: CPU and pinned memory metrics are read at each scrape");
        }
    });
}

fn poll(last: &mut Option<(u64, u64)>) {
    let now = cpu_times();
    let reading = HostReading {
        cpu_utilization: now.map(|n| utilization(last.unwrap_or((0, 0)), n)),
        memory: meminfo(),
        pinned: crate::gpu::pinned::pool_usage(),
    };
    if now.is_some() {
        *last = now;
    }
    if let Ok(mut l) = LATEST.lock() {
        *l = Some(reading);
    }
}

/// The latest poll, or a reading taken now where no poller runs (CPU
/// utilization then since boot).
pub fn latest() -> HostReading {
    if let Some(r) = LATEST.lock().ok().and_then(|l| *l) {
        return r;
    }
    HostReading {
        cpu_utilization: cpu_times().map(|n| utilization((0, 0), n)),
        memory: meminfo(),
        pinned: crate::gpu::pinned::pool_usage(),
    }
}

/// (MemTotal, MemTotal - MemAvailable) in bytes, Triton's "used".
pub fn meminfo() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    };
    let (total, available) = (field("MemTotal:")?, field("MemAvailable:")?);
    Some((total, total.saturating_sub(available)))
}

/// (busy, total) jiffies of the aggregate `cpu` line; idle and iowait
/// count as not busy, as in Triton.
fn cpu_times() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal; guest time is
    // already inside user and nice.
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    Some((total.saturating_sub(idle), total))
}

fn utilization((b0, t0): (u64, u64), (b1, t1): (u64, u64)) -> f64 {
    let dt = t1.saturating_sub(t0);
    if dt == 0 {
        return 0.0;
    }
    (b1.saturating_sub(b0) as f64 / dt as f64).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utilization_is_the_busy_share_of_the_interval() {
        assert_eq!(utilization((100, 400), (150, 500)), 0.5);
        assert_eq!(utilization((100, 400), (100, 400)), 0.0);
        assert_eq!(utilization((0, 0), (10, 10)), 1.0);
    }

    #[test]
    fn proc_is_read_on_linux() {
        let r = latest();
        let (total, used) = r.memory.expect("/proc/meminfo");
        assert!(total > 0 && used <= total);
        assert!((0.0..=1.0).contains(&r.cpu_utilization.expect("/proc/stat")));
    }
}
