//! `--metrics-config <setting>=<value>`: Triton 2.51's metrics settings
//! (core `MetricReporterConfig::ParseConfig`), all global (2.51 refuses a
//! `<name>,<setting>=<value>` form). Triton ignores a setting it does not
//! know and logs a bad quantile; here both stop the start, so a typo in a
//! manifest is seen at once rather than as a silently missing metric.

/// A summary quantile and its allowed rank error (prometheus' pair).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quantile {
    pub quantile: f64,
    pub error: f64,
}

/// Triton's default `summary_quantiles`.
pub const DEFAULT_QUANTILES: [Quantile; 5] = [
    Quantile {
        quantile: 0.5,
        error: 0.05,
    },
    Quantile {
        quantile: 0.9,
        error: 0.01,
    },
    Quantile {
        quantile: 0.95,
        error: 0.001,
    },
    Quantile {
        quantile: 0.99,
        error: 0.001,
    },
    Quantile {
        quantile: 0.999,
        error: 0.001,
    },
];

/// The settings that shape the per-model latency metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsConfig {
    /// `counter_latencies` (default true): the `nv_inference_*_duration_us`
    /// counters.
    pub counter_latencies: bool,
    /// `summary_latencies` (default false): the `nv_inference_*_summary_us`
    /// summaries.
    pub summary_latencies: bool,
    /// `summary_quantiles`: the summaries' quantiles.
    pub summary_quantiles: Vec<Quantile>,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            counter_latencies: true,
            summary_latencies: false,
            summary_quantiles: DEFAULT_QUANTILES.to_vec(),
        }
    }
}

const KNOWN: &str = "counter_latencies, summary_latencies, summary_quantiles";

impl MetricsConfig {
    /// Parses the raw `--metrics-config` values in order (a later setting
    /// overrides an earlier one, as in Triton).
    pub fn parse(settings: &[String]) -> Result<MetricsConfig, String> {
        let mut config = MetricsConfig::default();
        for arg in settings {
            let (setting, value) = split(arg)?;
            match setting {
                "counter_latencies" => config.counter_latencies = boolean(setting, value)?,
                "summary_latencies" => config.summary_latencies = boolean(setting, value)?,
                "summary_quantiles" => config.summary_quantiles = quantiles(value)?,
                other => {
                    return Err(format!(
                        "--metrics-config: unknown setting '{other}' in '{arg}' (Triton 2.51 has {KNOWN})"
                    ))
                }
            }
        }
        Ok(config)
    }
}

/// `<setting>=<value>`, with Triton's message for a bad shape.
fn split(arg: &str) -> Result<(&str, &str), String> {
    let bad = || format!("--metrics-config option format is <setting>=<value>. Got {arg}");
    let (setting, value) = arg.split_once('=').ok_or_else(bad)?;
    if setting.contains(',') {
        return Err(format!(
            "--metrics-config option format is <setting>=<value>. Got {arg} (per-model settings \
             '<name>,<setting>=<value>' are not supported, as in Triton 2.51)"
        ));
    }
    if setting.is_empty() || value.is_empty() {
        return Err(bad());
    }
    Ok((setting, value))
}

fn boolean(setting: &str, value: &str) -> Result<bool, String> {
    match value.to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!(
            "--metrics-config {setting}={value}: the value must be true or false"
        )),
    }
}

/// `<quantile>:<error>,...`, each number within [0, 1].
fn quantiles(value: &str) -> Result<Vec<Quantile>, String> {
    let mut out = Vec::new();
    for pair in value.split(',').map(str::trim) {
        let bad = |why: &str| {
            format!("--metrics-config summary_quantiles={value}: invalid pair '{pair}': {why}")
        };
        let (q, e) = pair
            .split_once(':')
            .ok_or_else(|| bad("no ':' delimiter found, expected <quantile>:<error>"))?;
        let number = |text: &str| {
            text.trim()
                .parse::<f64>()
                .ok()
                .filter(|x| (0.0..=1.0).contains(x))
                .ok_or_else(|| bad(&format!("'{}' is not a number in [0, 1]", text.trim())))
        };
        out.push(Quantile {
            quantile: number(q)?,
            error: number(e)?,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<MetricsConfig, String> {
        MetricsConfig::parse(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn defaults_are_tritons() {
        let c = parse(&[]).unwrap();
        assert!(c.counter_latencies);
        assert!(!c.summary_latencies);
        assert_eq!(c.summary_quantiles.len(), 5);
        assert_eq!(c.summary_quantiles[4].quantile, 0.999);
    }

    #[test]
    fn every_setting_is_read_and_later_ones_win() {
        let c = parse(&[
            "summary_latencies=true",
            "counter_latencies=false",
            "summary_quantiles=0.5:0.05, 0.99:0.001",
            "counter_latencies=true",
        ])
        .unwrap();
        assert!(c.counter_latencies && c.summary_latencies);
        assert_eq!(
            c.summary_quantiles,
            vec![
                Quantile {
                    quantile: 0.5,
                    error: 0.05
                },
                Quantile {
                    quantile: 0.99,
                    error: 0.001
                }
            ]
        );
    }

    #[test]
    fn bad_settings_name_the_flag_and_the_setting() {
        for (arg, needle) in [
            ("summary_latencies", "format is <setting>=<value>"),
            ("=true", "format is <setting>=<value>"),
            ("summary_latencies=", "format is <setting>=<value>"),
            ("simple,summary_latencies=true", "per-model"),
            (
                "histogram_latencies=true",
                "unknown setting 'histogram_latencies'",
            ),
            ("summary_latencies=yes", "summary_latencies=yes"),
            ("summary_quantiles=0.5", "no ':' delimiter"),
            ("summary_quantiles=0.5:x", "'x' is not a number"),
            (
                "summary_quantiles=1.5:0.01",
                "'1.5' is not a number in [0, 1]",
            ),
        ] {
            let e = parse(&[arg]).unwrap_err();
            assert!(e.starts_with("--metrics-config"), "{arg}: {e}");
            assert!(e.contains(needle), "{arg}: {e}");
        }
    }
}
