//! --profile-export-file: perf_analyzer's per-request export. One
//! experiment per step (and per target with several), each listing the
//! requests that completed in the step's measured windows, so its length is
//! the step's reported `requests`; timestamps in ns since the Unix epoch.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use super::{measure::StepResult, stats::dur_ns};

/// Pairs the monotonic clock the workers read with the wall clock, once,
/// so exported times are comparable with the server's logs and traces
/// while still coming from a clock that cannot step backwards.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    instant: Instant,
    unix_ns: u64,
}

impl Clock {
    pub fn now() -> Self {
        let unix_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(dur_ns)
            .unwrap_or(0);
        Self {
            instant: Instant::now(),
            unix_ns,
        }
    }

    /// `t` in ns since the Unix epoch.
    pub fn ns(&self, t: Instant) -> u64 {
        match t.checked_duration_since(self.instant) {
            Some(after) => self.unix_ns.saturating_add(dur_ns(after)),
            None => self
                .unix_ns
                .saturating_sub(dur_ns(self.instant.duration_since(t))),
        }
    }
}

/// The export's JSON. `with_target` adds each experiment's target label
/// (perf_analyzer measures one server; --compare measures several).
pub fn export(clock: &Clock, results: &[StepResult], with_target: bool) -> Value {
    let experiments: Vec<Value> = results
        .iter()
        .map(|r| {
            let profile = r.profile.clone().unwrap_or_default();
            let requests: Vec<Value> = profile
                .requests
                .iter()
                .map(|q| {
                    let sent = clock.ns(q.sent);
                    let last = sent.saturating_add(q.latency_ns);
                    // A stream's first response, then its final one; a
                    // unary request has the one.
                    let responses = match q.first_response {
                        Some(first) => vec![sent.saturating_add(dur_ns(first)).min(last), last],
                        None => vec![last],
                    };
                    json!({
                        "timestamp": sent,
                        "sequence_id": q.sequence_id,
                        "response_timestamps": responses,
                    })
                })
                .collect();
            let boundaries: Vec<u64> = profile
                .window_boundaries
                .iter()
                .map(|t| clock.ns(*t))
                .collect();
            // Concurrency is a whole number; perf_analyzer writes it so.
            let value = if r.load.fract() == 0.0 && r.load >= 0.0 && r.load < u64::MAX as f64 {
                json!(r.load as u64)
            } else {
                json!(r.load)
            };
            let mut e = json!({
                "experiment": {"mode": r.mode, "value": value},
                "requests": requests,
                "window_boundaries": boundaries,
            });
            if with_target {
                e["target"] = json!(r.target);
            }
            e
        })
        .collect();
    json!({
        "experiments": experiments,
        "version": env!("CARGO_PKG_VERSION"),
        "service_kind": "triton",
        "endpoint": "",
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn clock_converts_both_sides_of_its_anchor() {
        let c = Clock::now();
        let later = c.instant + Duration::from_nanos(1500);
        assert_eq!(c.ns(later), c.unix_ns + 1500);
        if let Some(earlier) = c.instant.checked_sub(Duration::from_nanos(700)) {
            assert_eq!(c.ns(earlier), c.unix_ns - 700);
        }
    }
}
