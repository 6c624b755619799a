//! Latency summaries: a sorted vector of nanosecond samples per window.
//! Windows hold at most a few hundred thousand samples, so an exact sort is
//! cheaper to reason about than an HDR histogram and costs no dependency.

use std::time::Duration;

/// Exact latency summary of a set of samples (nanoseconds).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LatencySummary {
    pub count: u64,
    pub avg_ns: f64,
    pub min_ns: u64,
    pub max_ns: u64,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p95_ns: u64,
    pub p99_ns: u64,
    /// The `--percentile` the user asked for, if any.
    pub custom: Option<(u8, u64)>,
}

/// Nearest-rank percentile of sorted samples (`p` in 0..=100), as
/// perf_analyzer computes it: the sample at index ceil(p/100 * n) - 1.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl LatencySummary {
    /// Summarises `samples`, sorting them in place.
    pub fn from_samples(samples: &mut [u64], custom_percentile: Option<u8>) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        samples.sort_unstable();
        let sum: u128 = samples.iter().map(|&s| u128::from(s)).sum();
        Self {
            count: samples.len() as u64,
            avg_ns: sum as f64 / samples.len() as f64,
            min_ns: samples[0],
            max_ns: samples[samples.len() - 1],
            p50_ns: percentile(samples, 50.0),
            p90_ns: percentile(samples, 90.0),
            p95_ns: percentile(samples, 95.0),
            p99_ns: percentile(samples, 99.0),
            custom: custom_percentile.map(|p| (p, percentile(samples, f64::from(p)))),
        }
    }

    /// The latency the stability check and the ratios use: the requested
    /// percentile, or the average (perf_analyzer's rule).
    pub fn headline_ns(&self) -> f64 {
        match self.custom {
            Some((_, v)) => v as f64,
            None => self.avg_ns,
        }
    }
}

/// Durations in microseconds, as every report prints them.
pub fn us(ns: f64) -> f64 {
    ns / 1_000.0
}

pub fn dur_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// SplitMix64: a tiny deterministic generator for input data and Poisson
/// arrivals, so a `--seed` reproduces a run without pulling in `rand`.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Exponentially distributed with the given mean (Poisson inter-arrival).
    pub fn exp(&mut self, mean: f64) -> f64 {
        // 1 - u is in (0, 1], so ln never sees 0.
        -mean * (1.0 - self.next_f64()).ln()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut v: Vec<u64> = (1..=100).rev().collect();
        let s = LatencySummary::from_samples(&mut v, Some(75));
        assert_eq!(s.count, 100);
        assert_eq!(s.p50_ns, 50);
        assert_eq!(s.p90_ns, 90);
        assert_eq!(s.p95_ns, 95);
        assert_eq!(s.p99_ns, 99);
        assert_eq!(s.custom, Some((75, 75)));
        assert_eq!(s.min_ns, 1);
        assert_eq!(s.max_ns, 100);
        assert!((s.avg_ns - 50.5).abs() < 1e-9);
        assert_eq!(s.headline_ns(), 75.0);
    }

    #[test]
    fn small_and_empty_sets() {
        assert_eq!(
            LatencySummary::from_samples(&mut [], None),
            LatencySummary::default()
        );
        let s = LatencySummary::from_samples(&mut [7], None);
        assert_eq!((s.p50_ns, s.p99_ns, s.avg_ns), (7, 7, 7.0));
        assert_eq!(percentile(&[1, 2], 0.0), 1);
        assert_eq!(percentile(&[1, 2], 100.0), 2);
    }

    #[test]
    fn percentiles_are_ordered_on_random_data() {
        let mut rng = SplitMix64::new(1);
        let mut v: Vec<u64> = (0..10_001).map(|_| rng.next_u64() % 1_000_000).collect();
        let s = LatencySummary::from_samples(&mut v, None);
        assert!(s.min_ns <= s.p50_ns && s.p50_ns <= s.p90_ns && s.p90_ns <= s.p95_ns);
        assert!(s.p95_ns <= s.p99_ns && s.p99_ns <= s.max_ns);
    }

    #[test]
    fn exponential_mean_is_close() {
        let mut rng = SplitMix64::new(42);
        let n = 200_000;
        let mean: f64 = (0..n).map(|_| rng.exp(2.0)).sum::<f64>() / n as f64;
        assert!((mean - 2.0).abs() < 0.05, "{mean}");
    }
}
