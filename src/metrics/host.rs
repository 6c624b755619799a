//! Host-level gauges: memory from /proc/meminfo, CPU utilization from
//! /proc/stat deltas between scrapes.

use std::sync::Mutex;

/// (MemTotal, MemAvailable) in bytes.
pub fn meminfo() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    };
    Some((field("MemTotal:")?, field("MemAvailable:")?))
}

/// (busy, total) jiffies of the aggregate `cpu` line.
fn cpu_times() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    Some((total.saturating_sub(idle), total))
}

// Only the scrape path touches this, never a request.
static LAST: Mutex<Option<(u64, u64)>> = Mutex::new(None);

/// Utilization in [0, 1] since the previous scrape (since boot on the first).
pub fn cpu_utilization() -> Option<f64> {
    let (busy, total) = cpu_times()?;
    let mut last = LAST.lock().ok()?;
    let (b0, t0) = last.replace((busy, total)).unwrap_or((0, 0));
    let dt = total.saturating_sub(t0);
    if dt == 0 {
        return Some(0.0);
    }
    Some((busy.saturating_sub(b0) as f64 / dt as f64).clamp(0.0, 1.0))
}
