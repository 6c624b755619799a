//! Triton's GPU metrics (`nv_gpu_utilization`, `nv_gpu_memory_total_bytes`,
//! `nv_gpu_memory_used_bytes`, `nv_gpu_power_usage`, `nv_gpu_power_limit`,
//! `nv_energy_consumption`), labelled `gpu_uuid="GPU-…"` as Triton labels
//! them. A `gpu-metrics` thread reads NVML every `--metrics-interval-ms`
//! (off the shards: an NVML call can take milliseconds) and swaps in the
//! latest readings; a scrape only clones an `Arc`. Without a usable GPU
//! (no driver, no NVML) the thread never starts and the families are
//! absent, as on a Triton without GPUs.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, OnceLock},
    time::Duration,
};

use crate::gpu::{nvml::Nvml, GpuInventory};

pub use crate::gpu::nvml::GpuReading;

/// The latest readings; only the collector and scrapes touch the lock.
static LATEST: Mutex<Option<Arc<Vec<GpuReading>>>> = Mutex::new(None);
static STARTED: OnceLock<Result<(), String>> = OnceLock::new();

/// Starts the collector once per process, if this process has GPUs and
/// NVML answers. Returns why not otherwise (logged by the caller).
pub fn start(gpus: &GpuInventory, interval: Duration) -> Result<(), String> {
    STARTED
        .get_or_init(|| {
            if gpus.is_empty() {
                return Err(gpus.absent.clone().unwrap_or_else(|| "no GPUs".to_string()));
            }
            let nvml = Nvml::open()?;
            // Only the GPUs the CUDA driver lets this process use, as
            // Triton reports only its supported GPUs.
            let visible: Vec<String> = gpus.gpus.iter().filter_map(|g| g.uuid.clone()).collect();
            let interval = interval.max(Duration::from_millis(100));
            std::thread::Builder::new()
                .name("gpu-metrics".into())
                .spawn(move || collect(nvml, visible, interval))
                .map_err(|e| format!("cannot start the GPU metrics thread: {e}"))?;
            Ok(())
        })
        .clone()
}

fn collect(nvml: Nvml, visible: Vec<String>, interval: Duration) {
    let mut baseline: HashMap<String, f64> = HashMap::new();
    loop {
        match nvml.read() {
            Ok(readings) => {
                let readings = since_start(&mut baseline, filter(readings, &visible));
                if let Ok(mut latest) = LATEST.lock() {
                    *latest = Some(Arc::new(readings));
                }
            }
            Err(e) => tracing::warn!(error = %e, "GPU metrics: NVML read failed"),
        }
        std::thread::sleep(interval);
    }
}

fn filter(readings: Vec<GpuReading>, visible: &[String]) -> Vec<GpuReading> {
    if visible.is_empty() {
        return readings;
    }
    readings
        .into_iter()
        .filter(|r| visible.contains(&r.uuid))
        .collect()
}

/// Energy since the first reading (Triton: "since the server started").
fn since_start(
    baseline: &mut HashMap<String, f64>,
    mut readings: Vec<GpuReading>,
) -> Vec<GpuReading> {
    for r in &mut readings {
        if let Some(total) = r.energy_joules {
            let start = *baseline.entry(r.uuid.clone()).or_insert(total);
            r.energy_joules = Some((total - start).max(0.0));
        }
    }
    readings
}

/// The latest readings, if the collector runs.
pub fn latest() -> Option<Arc<Vec<GpuReading>>> {
    LATEST.lock().ok().and_then(|l| l.clone())
}

type Pick = fn(&GpuReading) -> Option<f64>;

/// (name, type, help, value) of each family, in Triton's order.
pub const FAMILIES: [(&str, &str, &str, Pick); 6] = [
    (
        "nv_gpu_utilization",
        "gauge",
        "GPU utilization rate [0.0 - 1.0)",
        |r| r.utilization,
    ),
    (
        "nv_gpu_memory_total_bytes",
        "gauge",
        "GPU total memory, in bytes",
        |r| r.memory_total_bytes.map(|b| b as f64),
    ),
    (
        "nv_gpu_memory_used_bytes",
        "gauge",
        "GPU used memory, in bytes",
        |r| r.memory_used_bytes.map(|b| b as f64),
    ),
    (
        "nv_gpu_power_usage",
        "gauge",
        "GPU power usage in watts",
        |r| r.power_watts,
    ),
    (
        "nv_gpu_power_limit",
        "gauge",
        "GPU power management limit in watts",
        |r| r.power_limit_watts,
    ),
    (
        "nv_energy_consumption",
        "counter",
        "GPU energy consumption in joules since the Triton Server started",
        |r| r.energy_joules,
    ),
];

/// The families as Prometheus text; empty without readings.
pub fn render(readings: &[GpuReading]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    if readings.is_empty() {
        return out;
    }
    for (name, kind, help, pick) in FAMILIES {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for r in readings {
            if let Some(v) = pick(r) {
                let _ = writeln!(out, "{name}{{gpu_uuid=\"{}\"}} {v}", r.uuid);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(uuid: &str, energy: f64) -> GpuReading {
        GpuReading {
            uuid: uuid.into(),
            utilization: Some(0.25),
            memory_total_bytes: Some(80 << 30),
            memory_used_bytes: Some(1 << 30),
            power_watts: Some(71.5),
            power_limit_watts: None,
            energy_joules: Some(energy),
        }
    }

    #[test]
    fn families_carry_tritons_names_and_uuid_label() {
        let text = render(&[reading("GPU-abc", 5.0)]);
        assert!(text.contains("# TYPE nv_gpu_utilization gauge"), "{text}");
        assert!(
            text.contains("nv_gpu_utilization{gpu_uuid=\"GPU-abc\"} 0.25"),
            "{text}"
        );
        assert!(text.contains("nv_gpu_memory_total_bytes{gpu_uuid=\"GPU-abc\"} 85899345920"));
        assert!(text.contains("nv_gpu_power_usage{gpu_uuid=\"GPU-abc\"} 71.5"));
        assert!(text.contains("# TYPE nv_energy_consumption counter"));
        assert!(
            !text.contains("nv_gpu_power_limit{"),
            "an unsupported reading is left out, not reported as 0"
        );
        assert_eq!(render(&[]), "");
    }

    #[test]
    fn energy_counts_from_the_first_reading() {
        let mut base = HashMap::new();
        let first = since_start(&mut base, vec![reading("GPU-a", 1000.0)]);
        assert_eq!(first[0].energy_joules, Some(0.0));
        let later = since_start(
            &mut base,
            vec![reading("GPU-a", 1012.5), reading("GPU-b", 7.0)],
        );
        assert_eq!(later[0].energy_joules, Some(12.5));
        assert_eq!(later[1].energy_joules, Some(0.0));
    }

    #[test]
    fn only_the_visible_gpus_are_reported() {
        let all = vec![reading("GPU-a", 0.0), reading("GPU-b", 0.0)];
        let kept = filter(all.clone(), &["GPU-b".to_string()]);
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].uuid, "GPU-b");
        assert_eq!(filter(all, &[]).len(), 2);
    }

    #[test]
    fn no_gpus_no_collector() {
        if !GpuInventory::shared().is_empty() {
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED metrics::gpu::no_gpus_no_collector: this machine has GPUs"
            );
            return;
        }
        let none = GpuInventory::none("no CUDA driver");
        assert!(start(&none, Duration::from_secs(1)).is_err());
        assert!(latest().is_none());
    }
}
