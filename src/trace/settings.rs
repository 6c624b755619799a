//! Trace settings as Triton defines them: values from the command line,
//! global updates over those, per-model updates over the global ones; a
//! value sent as `null` (HTTP) or with no values (gRPC) is cleared back
//! to its fallback, and a model left with nothing of its own follows the
//! global settings again.

use crate::types::{clip, InferError, InferResult};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Off,
    Timestamps,
}

/// Only Triton's own trace format is produced; OpenTelemetry export is
/// refused where it is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceMode {
    Triton,
}

impl TraceMode {
    pub fn as_str(self) -> &'static str {
        "triton"
    }
}

/// The values one setting resolves to (the trace file is server-wide).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Values {
    pub level: Level,
    pub rate: u32,
    pub count: i32,
    pub log_frequency: u32,
}

/// Which values a setting holds itself rather than from its fallback.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Specified {
    pub level: bool,
    pub rate: bool,
    pub count: bool,
    pub log_frequency: bool,
}

impl Specified {
    pub fn none(&self) -> bool {
        !(self.level || self.rate || self.count || self.log_frequency)
    }
}

/// The command line's trace settings (`--trace-config`), Triton's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceConfig {
    pub file: String,
    pub values: Values,
}

impl Default for TraceConfig {
    fn default() -> Self {
        Self {
            file: String::new(),
            values: Values {
                level: Level::Off,
                rate: 1000,
                count: -1,
                log_frequency: 0,
            },
        }
    }
}

fn parse_level(s: &str) -> Result<Level, String> {
    match s {
        "OFF" | "off" => Ok(Level::Off),
        "TIMESTAMPS" | "timestamps" => Ok(Level::Timestamps),
        "TENSORS" | "tensors" => Err(TENSORS_REFUSED.into()),
        other => Err(format!(
            "unknown trace level '{}': expected OFF or TIMESTAMPS",
            clip(other)
        )),
    }
}

const TENSORS_REFUSED: &str =
    "trace level TENSORS is not supported by shardserve: only TIMESTAMPS (and OFF) can be traced";

fn mode_refused(mode: &str) -> String {
    format!(
        "trace mode '{}' is not supported by shardserve: only 'triton' (Triton's JSON trace files)",
        clip(mode)
    )
}

impl TraceConfig {
    /// One `--trace-config` value: `[triton,]file=…`, `[triton,]log-frequency=…`,
    /// `level=…`, `rate=…`, `count=…`, `mode=triton`.
    pub fn apply_flag(&mut self, arg: &str) -> Result<(), String> {
        let (mode, setting) = match arg.split_once(',') {
            Some((mode, rest)) if !mode.contains('=') => (Some(mode), rest),
            _ => (None, arg),
        };
        let Some((key, value)) = setting.split_once('=') else {
            return Err(format!(
                "--trace-config '{}': expected [<mode>,]<setting>=<value>",
                clip(arg)
            ));
        };
        let number = |what: &str| {
            format!(
                "--trace-config {key}: '{}' is not a valid {what}",
                clip(value)
            )
        };
        match (mode, key) {
            (Some("triton") | None, "file") => self.file = value.to_string(),
            (Some("triton") | None, "log-frequency") => {
                self.values.log_frequency = value.parse().map_err(|_| number("count"))?
            }
            (None, "level") => self.values.level = parse_level(value)?,
            (None, "rate") => self.values.rate = value.parse().map_err(|_| number("rate"))?,
            (None, "count") => {
                let count: i32 = value.parse().map_err(|_| number("count"))?;
                if count < -1 {
                    return Err(number("count (-1 or more)"));
                }
                self.values.count = count;
            }
            (None, "mode") if value == "triton" => {}
            (None, "mode") => return Err(mode_refused(value)),
            (Some("triton"), _) => {
                return Err(format!(
                    "--trace-config triton,{}: unknown setting (file, log-frequency)",
                    clip(key)
                ))
            }
            (Some(other), _) => return Err(mode_refused(other)),
            (None, _) => {
                return Err(format!(
                    "--trace-config {}: unknown setting (level, rate, count, mode, triton,file, triton,log-frequency)",
                    clip(key)
                ))
            }
        }
        Ok(())
    }
}

/// What an update does to one value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Change<T> {
    #[default]
    Keep,
    Clear,
    Set(T),
}

/// A trace setting request, checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SettingUpdate {
    pub level: Change<Level>,
    pub rate: Change<u32>,
    pub count: Change<i32>,
    pub log_frequency: Change<u32>,
}

fn one<'a>(key: &str, values: &'a [String]) -> InferResult<&'a str> {
    match values {
        [v] => Ok(v),
        _ => Err(InferError::invalid(format!(
            "expect only 1 value for '{key}'"
        ))),
    }
}

fn number<T: std::str::FromStr>(key: &str, value: &str) -> InferResult<T> {
    value
        .trim()
        .parse()
        .map_err(|_| InferError::invalid(format!("Unable to parse '{key}', got: {}", clip(value))))
}

impl SettingUpdate {
    /// Reads a request's settings: `None` clears a value. The trace file
    /// is fixed at start, as in Triton.
    pub fn parse(items: Vec<(String, Option<Vec<String>>)>) -> InferResult<Self> {
        let mut update = Self::default();
        for (key, values) in items {
            match (key.as_str(), values) {
                ("trace_file", _) => {
                    return Err(InferError::unsupported(
                        "trace file location can not be updated through network protocol",
                    ))
                }
                ("trace_level", None) => update.level = Change::Clear,
                ("trace_level", Some(list)) => {
                    let mut level = None;
                    for s in &list {
                        match parse_level(s) {
                            Ok(Level::Off) if list.len() > 1 => {
                                return Err(InferError::invalid(
                                    "Expect only one trace level 'OFF' is specified",
                                ))
                            }
                            Ok(l) => level = Some(l),
                            Err(e) if s.eq_ignore_ascii_case("TENSORS") => {
                                return Err(InferError::unsupported(e))
                            }
                            Err(e) => return Err(InferError::invalid(e)),
                        }
                    }
                    if let Some(l) = level {
                        update.level = Change::Set(l);
                    }
                }
                ("trace_rate", None) => update.rate = Change::Clear,
                ("trace_rate", Some(v)) => update.rate = Change::Set(number(&key, one(&key, &v)?)?),
                ("trace_count", None) => update.count = Change::Clear,
                ("trace_count", Some(v)) => {
                    let count: i32 = number(&key, one(&key, &v)?)?;
                    if count < -1 {
                        return Err(InferError::invalid(format!(
                            "Unable to parse 'trace_count'. Expecting value >= -1, got:{count}"
                        )));
                    }
                    update.count = Change::Set(count);
                }
                ("log_frequency", None) => update.log_frequency = Change::Clear,
                ("log_frequency", Some(v)) => {
                    update.log_frequency = Change::Set(number(&key, one(&key, &v)?)?)
                }
                ("trace_mode", None) => {}
                ("trace_mode", Some(v)) => {
                    let mode = one(&key, &v)?;
                    if mode != "triton" {
                        return Err(InferError::unsupported(mode_refused(mode)));
                    }
                }
                (other, _) => {
                    return Err(InferError::invalid(format!(
                        "unknown trace setting '{}'",
                        clip(other)
                    )))
                }
            }
        }
        Ok(update)
    }
}

fn apply<T: Copy>(change: Change<T>, was_specified: bool, current: T, fallback: T) -> (T, bool) {
    match change {
        Change::Set(v) => (v, true),
        Change::Clear => (fallback, false),
        Change::Keep if was_specified => (current, true),
        Change::Keep => (fallback, false),
    }
}

/// Triton's resolution: each value is the update's, else the setting's
/// own if it had one, else the fallback's.
pub fn resolve(
    fallback: Values,
    current: Option<(Values, Specified)>,
    update: &SettingUpdate,
) -> (Values, Specified) {
    let (cur, spec) = current.unwrap_or((fallback, Specified::default()));
    let (level, level_s) = apply(update.level, spec.level, cur.level, fallback.level);
    let (rate, rate_s) = apply(update.rate, spec.rate, cur.rate, fallback.rate);
    let (count, count_s) = apply(update.count, spec.count, cur.count, fallback.count);
    let (log_frequency, lf_s) = apply(
        update.log_frequency,
        spec.log_frequency,
        cur.log_frequency,
        fallback.log_frequency,
    );
    (
        Values {
            level,
            rate,
            count,
            log_frequency,
        },
        Specified {
            level: level_s,
            rate: rate_s,
            count: count_s,
            log_frequency: lf_s,
        },
    )
}

/// Why a setting that traces cannot sample, in Triton's words.
pub fn invalid_reason(values: &Values, file: &str) -> Option<&'static str> {
    if values.level == Level::Off {
        Some("tracing is disabled")
    } else if values.rate == 0 {
        Some("sample rate must be non-zero")
    } else if file.is_empty() {
        Some("trace file name is not given")
    } else {
        None
    }
}

/// A setting as the protocols report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceView {
    pub values: Values,
    pub file: String,
    pub mode: TraceMode,
}

impl TraceView {
    /// Triton's names and string values, in Triton's order.
    pub fn entries(&self) -> Vec<(&'static str, Vec<String>)> {
        let level = match self.values.level {
            Level::Off => "OFF",
            Level::Timestamps => "TIMESTAMPS",
        };
        vec![
            ("trace_level", vec![level.to_string()]),
            ("trace_rate", vec![self.values.rate.to_string()]),
            ("trace_count", vec![self.values.count.to_string()]),
            ("log_frequency", vec![self.values.log_frequency.to_string()]),
            ("trace_file", vec![self.file.clone()]),
            ("trace_mode", vec![self.mode.as_str().to_string()]),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(list: &[(&str, Option<&[&str]>)]) -> Vec<(String, Option<Vec<String>>)> {
        list.iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    v.map(|v| v.iter().map(|s| s.to_string()).collect()),
                )
            })
            .collect()
    }

    #[test]
    fn flags_parse_as_tritonserver_names_them() {
        let mut c = TraceConfig::default();
        for f in [
            "triton,file=/tmp/t.json",
            "triton,log-frequency=50",
            "rate=100",
            "level=TIMESTAMPS",
            "count=10",
            "mode=triton",
        ] {
            c.apply_flag(f).unwrap();
        }
        assert_eq!(c.file, "/tmp/t.json");
        assert_eq!(
            c.values,
            Values {
                level: Level::Timestamps,
                rate: 100,
                count: 10,
                log_frequency: 50
            }
        );
        assert!(c
            .apply_flag("level=TENSORS")
            .unwrap_err()
            .contains("TENSORS"));
        assert!(c.apply_flag("mode=opentelemetry").is_err());
        assert!(c.apply_flag("opentelemetry,url=x").is_err());
        assert!(c.apply_flag("count=-2").is_err());
        assert!(c.apply_flag("rate").is_err());
        assert!(c.apply_flag("bogus=1").is_err());
    }

    #[test]
    fn updates_parse_with_tritons_errors() {
        let u = SettingUpdate::parse(items(&[
            ("trace_level", Some(&["TIMESTAMPS"])),
            ("trace_rate", Some(&["1"])),
            ("trace_count", None),
            ("trace_mode", Some(&["triton"])),
        ]))
        .unwrap();
        assert_eq!(u.level, Change::Set(Level::Timestamps));
        assert_eq!(u.rate, Change::Set(1));
        assert_eq!(u.count, Change::Clear);
        assert_eq!(u.log_frequency, Change::Keep);
        let err = |l: &[(&str, Option<&[&str]>)]| SettingUpdate::parse(items(l)).unwrap_err();
        assert!(err(&[("trace_file", Some(&["/x"]))])
            .message
            .contains("can not be updated through network protocol"));
        assert!(err(&[("trace_level", Some(&["OFF", "TIMESTAMPS"]))])
            .message
            .contains("only one trace level 'OFF'"));
        assert!(err(&[("trace_level", Some(&["TENSORS"]))])
            .message
            .contains("TENSORS"));
        assert!(err(&[("trace_rate", Some(&["x"]))])
            .message
            .contains("Unable to parse 'trace_rate', got: x"));
        assert!(err(&[("trace_rate", Some(&["1", "2"]))])
            .message
            .contains("expect only 1 value for 'trace_rate'"));
        assert!(err(&[("trace_count", Some(&["-5"]))])
            .message
            .contains("Expecting value >= -1"));
        assert!(err(&[("trace_mode", Some(&["opentelemetry"]))])
            .message
            .contains("opentelemetry"));
        assert!(err(&[("nope", None)])
            .message
            .contains("unknown trace setting"));
    }

    #[test]
    fn model_settings_fall_back_to_global_and_clear_back_to_it() {
        let global = Values {
            level: Level::Timestamps,
            rate: 1000,
            count: -1,
            log_frequency: 0,
        };
        let set_rate = SettingUpdate {
            rate: Change::Set(1),
            ..Default::default()
        };
        let (v, s) = resolve(global, None, &set_rate);
        assert_eq!((v.rate, v.level), (1, Level::Timestamps));
        assert!(s.rate && !s.level);
        // The global level changes: the model follows it, keeps its rate.
        let global2 = Values {
            level: Level::Off,
            ..global
        };
        let (v2, s2) = resolve(global2, Some((v, s)), &SettingUpdate::default());
        assert_eq!((v2.rate, v2.level), (1, Level::Off));
        // Clearing the rate leaves nothing of its own.
        let clear = SettingUpdate {
            rate: Change::Clear,
            ..Default::default()
        };
        let (v3, s3) = resolve(global2, Some((v2, s2)), &clear);
        assert_eq!(v3, global2);
        assert!(s3.none());
    }

    #[test]
    fn invalid_settings_name_their_reason() {
        let mut v = TraceConfig::default().values;
        assert_eq!(invalid_reason(&v, "f"), Some("tracing is disabled"));
        v.level = Level::Timestamps;
        assert_eq!(invalid_reason(&v, ""), Some("trace file name is not given"));
        v.rate = 0;
        assert_eq!(
            invalid_reason(&v, "f"),
            Some("sample rate must be non-zero")
        );
        v.rate = 1;
        assert_eq!(invalid_reason(&v, "f"), None);
    }
}
