//! Metrics that backends define through the C API (Triton's custom
//! metrics: `TRITONSERVER_MetricFamily*`, what the Python backend's
//! `pb_utils.MetricFamily` uses), rendered on the metrics endpoint after
//! ours. Families live as long as their creator keeps them; a dropped one
//! disappears from the output.

use std::{
    fmt::Write,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, Weak,
    },
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

#[derive(Debug)]
pub struct Family {
    pub name: String,
    pub help: String,
    pub kind: Kind,
    metrics: Mutex<Vec<Weak<Metric>>>,
}

#[derive(Debug, Default)]
struct Histogram {
    /// Upper bounds, ascending.
    bounds: Vec<f64>,
    /// Observations per bucket (not cumulative), plus one for +Inf.
    counts: Vec<u64>,
    sum: f64,
}

#[derive(Debug)]
pub struct Metric {
    pub kind: Kind,
    /// Rendered `k="v",...`.
    labels: String,
    /// An f64's bits (counter and gauge).
    value: AtomicU64,
    histogram: Option<Mutex<Histogram>>,
}

static FAMILIES: Mutex<Vec<Weak<Family>>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// A family by name: a new one, or the live family of that name when its
/// kind is the same (as Triton, whose Prometheus registry merges them: the
/// Python backend creates each family twice, and every instance of a model
/// creates the same ones). Another kind under a name in use is an error.
pub fn new_family(name: &str, help: &str, kind: Kind) -> Result<Arc<Family>, String> {
    if !valid_name(name) {
        return Err(format!("'{name}' is not a valid metric name"));
    }
    let mut families = lock(&FAMILIES);
    families.retain(|f| f.strong_count() > 0);
    if let Some(existing) = families
        .iter()
        .filter_map(Weak::upgrade)
        .find(|f| f.name == name)
    {
        if existing.kind == kind {
            return Ok(existing);
        }
        return Err(format!(
            "a metric family named '{name}' already exists as a {}",
            existing.kind.as_str()
        ));
    }
    let family = Arc::new(Family {
        name: name.to_string(),
        help: help.to_string(),
        kind,
        metrics: Mutex::new(Vec::new()),
    });
    families.push(Arc::downgrade(&family));
    Ok(family)
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Family {
    /// A new metric of this family with `labels`; a histogram needs its
    /// bucket bounds (ascending), other kinds none.
    pub fn new_metric(
        &self,
        labels: &[(String, String)],
        buckets: Option<Vec<f64>>,
    ) -> Result<Arc<Metric>, String> {
        for (k, _) in labels {
            if !valid_name(k) || k.contains(':') {
                return Err(format!("'{k}' is not a valid label name"));
            }
        }
        let histogram = match (self.kind, buckets) {
            (Kind::Histogram, Some(bounds)) => {
                if bounds.windows(2).any(|w| w[0] >= w[1]) || bounds.iter().any(|b| b.is_nan()) {
                    return Err("histogram buckets must be ascending numbers".into());
                }
                let counts = vec![0; bounds.len() + 1];
                Some(Mutex::new(Histogram {
                    bounds,
                    counts,
                    sum: 0.0,
                }))
            }
            (Kind::Histogram, None) => {
                return Err(
                    "a histogram metric needs buckets (TRITONSERVER_MetricArgsSetHistogram)".into(),
                )
            }
            (_, Some(_)) => return Err("only histogram metrics take buckets".into()),
            (_, None) => None,
        };
        let mut sorted = labels.to_vec();
        sorted.sort();
        let labels = sorted
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
            .collect::<Vec<_>>()
            .join(",");
        let mut metrics = lock(&self.metrics);
        metrics.retain(|m| m.strong_count() > 0);
        // The same labels are the same metric (as in Prometheus families).
        if let Some(existing) = metrics
            .iter()
            .filter_map(Weak::upgrade)
            .find(|m| m.labels == labels)
        {
            return Ok(existing);
        }
        let metric = Arc::new(Metric {
            kind: self.kind,
            labels,
            value: AtomicU64::new(0f64.to_bits()),
            histogram,
        });
        metrics.push(Arc::downgrade(&metric));
        Ok(metric)
    }
}

impl Metric {
    pub fn value(&self) -> Result<f64, String> {
        match self.kind {
            Kind::Histogram => Err("a histogram has no single value".into()),
            _ => Ok(f64::from_bits(self.value.load(Ordering::Acquire))),
        }
    }

    pub fn increment(&self, by: f64) -> Result<(), String> {
        match self.kind {
            Kind::Counter if by < 0.0 => Err("a counter cannot be decremented".into()),
            Kind::Histogram => Err("a histogram takes observations, not increments".into()),
            _ => {
                let _ = self
                    .value
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |bits| {
                        Some((f64::from_bits(bits) + by).to_bits())
                    });
                Ok(())
            }
        }
    }

    pub fn set(&self, value: f64) -> Result<(), String> {
        match self.kind {
            Kind::Gauge => {
                self.value.store(value.to_bits(), Ordering::Release);
                Ok(())
            }
            _ => Err("only a gauge can be set".into()),
        }
    }

    pub fn observe(&self, value: f64) -> Result<(), String> {
        let Some(h) = &self.histogram else {
            return Err("only a histogram takes observations".into());
        };
        let mut h = lock(h);
        let i = h
            .bounds
            .iter()
            .position(|b| value <= *b)
            .unwrap_or(h.bounds.len());
        h.counts[i] += 1;
        h.sum += value;
        Ok(())
    }

    fn render(&self, name: &str, out: &mut String) {
        let sample = |out: &mut String, name: &str, labels: &str, v: &dyn std::fmt::Display| {
            let _ = if labels.is_empty() {
                writeln!(out, "{name} {v}")
            } else {
                writeln!(out, "{name}{{{labels}}} {v}")
            };
        };
        match &self.histogram {
            None => sample(
                out,
                name,
                &self.labels,
                &f64::from_bits(self.value.load(Ordering::Acquire)),
            ),
            Some(h) => {
                let h = lock(h);
                let with = |le: &str| {
                    if self.labels.is_empty() {
                        format!("le=\"{le}\"")
                    } else {
                        format!("{},le=\"{le}\"", self.labels)
                    }
                };
                let mut cumulative = 0;
                for (i, bound) in h.bounds.iter().enumerate() {
                    cumulative += h.counts[i];
                    sample(
                        out,
                        &format!("{name}_bucket"),
                        &with(&bound.to_string()),
                        &cumulative,
                    );
                }
                cumulative += h.counts[h.bounds.len()];
                sample(out, &format!("{name}_bucket"), &with("+Inf"), &cumulative);
                sample(out, &format!("{name}_sum"), &self.labels, &h.sum);
                sample(out, &format!("{name}_count"), &self.labels, &cumulative);
            }
        }
    }
}

/// Appends every live custom family to the metrics text.
pub fn render(out: &mut String) {
    let families: Vec<Arc<Family>> = lock(&FAMILIES).iter().filter_map(Weak::upgrade).collect();
    for f in families {
        let _ = writeln!(
            out,
            "# HELP {} {}\n# TYPE {} {}",
            f.name,
            f.help.replace('\n', " "),
            f.name,
            f.kind.as_str()
        );
        let metrics: Vec<Arc<Metric>> = lock(&f.metrics).iter().filter_map(Weak::upgrade).collect();
        for m in metrics {
            m.render(&f.name, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_render_their_live_metrics() {
        let f = new_family("custom_test_requests", "Requests seen", Kind::Counter).expect("family");
        assert!(new_family("custom_test_requests", "again", Kind::Gauge).is_err());
        let same =
            new_family("custom_test_requests", "Requests seen", Kind::Counter).expect("merged");
        assert!(Arc::ptr_eq(&f, &same));
        assert!(new_family("1bad", "x", Kind::Gauge).is_err());
        let m = f
            .new_metric(&[("model".into(), "a\"b".into())], None)
            .expect("metric");
        m.increment(2.0).expect("inc");
        let again = f
            .new_metric(&[("model".into(), "a\"b".into())], None)
            .expect("same metric");
        assert!(Arc::ptr_eq(&m, &again));
        drop(again);
        assert!(m.increment(-1.0).is_err());
        assert!(m.set(1.0).is_err());
        assert_eq!(m.value(), Ok(2.0));
        let h = new_family("custom_test_latency", "Latency", Kind::Histogram).expect("family");
        assert!(h.new_metric(&[], None).is_err());
        let hm = h.new_metric(&[], Some(vec![1.0, 5.0])).expect("histogram");
        hm.observe(0.5).expect("observe");
        hm.observe(7.0).expect("observe");
        let mut out = String::new();
        render(&mut out);
        assert!(out.contains("# TYPE custom_test_requests counter"));
        assert!(out.contains("custom_test_requests{model=\"a\\\"b\"} 2"));
        assert!(out.contains("custom_test_latency_bucket{le=\"1\"} 1"));
        assert!(out.contains("custom_test_latency_bucket{le=\"+Inf\"} 2"));
        assert!(out.contains("custom_test_latency_sum 7.5"));
        drop(m);
        let mut out = String::new();
        render(&mut out);
        assert!(!out.contains("custom_test_requests{"));
    }
}
