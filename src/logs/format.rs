//! One log record as a line in each format.
//!
//! `default` and `ISO8601` are tritonserver 2.51's shapes (its common
//! `Logger`): `LMMDD hh:mm:ss.ssssss PID FILE:LINE] "MESSAGE"` and
//! `YYYY-MM-DDThh:mm:ssZ L PID FILE:LINE] "MESSAGE"`, the time in UTC, the
//! level one letter (`E`, `W`, `I`; verbose records are `I` as Triton's
//! are), the message JSON-escaped in quotes unless
//! `TRITON_SERVER_ESCAPE_LOG_MESSAGES=0`, as Triton. Our structured fields
//! follow the message as ` key=value`. `json` is ours: one object a line
//! for log pipelines.

use std::{
    fmt::{self, Write as _},
    time::{SystemTime, UNIX_EPOCH},
};

use tracing::{
    field::{Field, Visit},
    Level,
};

use std::str::FromStr;

/// The wall-clock time of a record, split as the formats need it (UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timestamp {
    pub year: i64,
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    pub micros: u32,
}

impl Timestamp {
    pub fn now() -> Self {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Self::from_unix(since.as_secs(), since.subsec_micros())
    }

    /// The civil date of a Unix time (days-from-civil inverted, valid for
    /// any date after 1970).
    pub fn from_unix(secs: u64, micros: u32) -> Self {
        let days = (secs / 86_400) as i64;
        let rem = secs % 86_400;
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        Self {
            year,
            month,
            day,
            hour: (rem / 3600) as u32,
            minute: (rem % 3600 / 60) as u32,
            second: (rem % 60) as u32,
            micros,
        }
    }
}

/// A record's fields, gathered from a `tracing` event.
#[derive(Debug, Default)]
pub struct Fields {
    pub message: String,
    /// Every other field in the order given: its name and value, and
    /// whether the value is text (quoted in JSON) or a bare number/bool.
    pub pairs: Vec<(&'static str, String, Kind)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Text,
    Bare,
}

impl Fields {
    /// Takes out the field `name` (a backend's own `file`/`line`, shown as
    /// the record's location instead of ours).
    pub fn take(&mut self, name: &str) -> Option<String> {
        let i = self.pairs.iter().position(|(k, _, _)| *k == name)?;
        Some(self.pairs.remove(i).1)
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            self.pairs
                .push((field.name(), format!("{value:?}"), Kind::Text));
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            self.pairs
                .push((field.name(), value.to_string(), Kind::Text));
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.pairs
            .push((field.name(), value.to_string(), Kind::Bare));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.pairs
            .push((field.name(), value.to_string(), Kind::Bare));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.pairs
            .push((field.name(), value.to_string(), Kind::Bare));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        let kind = if value.is_finite() {
            Kind::Bare
        } else {
            Kind::Text
        };
        self.pairs.push((field.name(), value.to_string(), kind));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.pairs
            .push((field.name(), value.to_string(), Kind::Text));
    }
}

/// Everything a line is made of.
#[derive(Debug)]
pub struct Record<'a> {
    pub time: Timestamp,
    pub level: Level,
    pub pid: u32,
    pub target: &'a str,
    /// Where the record was made: a file name and line.
    pub file: &'a str,
    pub line: Option<u32>,
    pub fields: &'a Fields,
}

fn letter(level: Level) -> char {
    match level {
        Level::ERROR => 'E',
        Level::WARN => 'W',
        _ => 'I',
    }
}

/// Appends `s` as a JSON string (quotes included).
fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Whether a text value must be quoted to stay one `key=value` token
/// (logfmt's rule).
fn needs_quotes(value: &str) -> bool {
    value.is_empty()
        || value
            .chars()
            .any(|c| c.is_whitespace() || c == '"' || c == '=' || c.is_control())
}

/// A text value as one token of a one-line record: control characters
/// escaped so that a value cannot start a forged line.
fn one_line(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() && c != '\t' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
}

/// Writes `record` as one line (newline included) in `format`.
pub fn write_line(out: &mut String, format: LogFormat, escape: bool, record: &Record<'_>) {
    let t = record.time;
    let location = |out: &mut String| {
        out.push_str(record.file);
        if let Some(line) = record.line {
            let _ = write!(out, ":{line}");
        }
    };
    match format {
        LogFormat::Default | LogFormat::Iso8601 => {
            if format == LogFormat::Default {
                let _ = write!(
                    out,
                    "{}{:02}{:02} {:02}:{:02}:{:02}.{:06} {} ",
                    letter(record.level),
                    t.month,
                    t.day,
                    t.hour,
                    t.minute,
                    t.second,
                    t.micros,
                    record.pid
                );
            } else {
                let _ = write!(
                    out,
                    "{}-{:02}-{:02}T{:02}:{:02}:{:02}Z {} {} ",
                    t.year,
                    t.month,
                    t.day,
                    t.hour,
                    t.minute,
                    t.second,
                    letter(record.level),
                    record.pid
                );
            }
            location(out);
            out.push_str("] ");
            if escape {
                json_string(out, &record.fields.message);
            } else {
                out.push_str(&record.fields.message);
            }
            for (key, value, kind) in &record.fields.pairs {
                let _ = write!(out, " {key}=");
                if !escape {
                    out.push_str(value);
                } else if *kind == Kind::Text && needs_quotes(value) {
                    json_string(out, value);
                } else {
                    one_line(out, value);
                }
            }
        }
        LogFormat::Json => {
            let _ = write!(
                out,
                "{{\"time\":\"{}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z\",\"level\":\"{}\",\"pid\":{},\"target\":",
                t.year, t.month, t.day, t.hour, t.minute, t.second, t.micros, record.level, record.pid
            );
            json_string(out, record.target);
            out.push_str(",\"file\":");
            json_string(out, record.file);
            if let Some(line) = record.line {
                let _ = write!(out, ",\"line\":{line}");
            }
            out.push_str(",\"message\":");
            json_string(out, &record.fields.message);
            out.push_str(",\"fields\":{");
            for (i, (key, value, kind)) in record.fields.pairs.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                json_string(out, key);
                out.push(':');
                match kind {
                    Kind::Bare => out.push_str(value),
                    Kind::Text => json_string(out, value),
                }
            }
            out.push_str("}}");
        }
    }
    out.push('\n');
}

/// A line's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Triton's `LMMDD hh:mm:ss.ssssss PID FILE:LINE] MSG`.
    #[default]
    Default,
    /// Triton's `YYYY-MM-DDThh:mm:ssZ L PID FILE:LINE] MSG`.
    Iso8601,
    /// Ours: one JSON object a line (time, level, pid, target, file, line,
    /// message, fields).
    Json,
}

impl LogFormat {
    pub(super) fn to_u8(self) -> u8 {
        match self {
            Self::Default => 0,
            Self::Iso8601 => 1,
            Self::Json => 2,
        }
    }

    pub(super) fn from_u8(v: u8) -> Self {
        match v {
            1 => Self::Iso8601,
            2 => Self::Json,
            _ => Self::Default,
        }
    }
}

impl FromStr for LogFormat {
    type Err = String;

    /// The names tritonserver accepts (case as Triton: `ISO8601`), and
    /// `json`; anything else gets tritonserver's parser's message.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "default" => Ok(Self::Default),
            "ISO8601" => Ok(Self::Iso8601),
            "json" => Ok(Self::Json),
            _ => Err("invalid argument for --log-format".into()),
        }
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Default => "default",
            Self::Iso8601 => "ISO8601",
            Self::Json => "json",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(fields: &Fields) -> Record<'_> {
        Record {
            // 2026-11-26T00:58:35.019936Z
            time: Timestamp::from_unix(1_795_654_715, 19_936),
            level: Level::INFO,
            pid: 9344,
            target: "shardserve::server",
            file: "server/mod.rs",
            line: Some(42),
            fields,
        }
    }

    fn fields() -> Fields {
        Fields {
            message: "listening \"now\"".into(),
            pairs: vec![
                ("http", "127.0.0.1:8000".into(), Kind::Text),
                ("shards", "2".into(), Kind::Bare),
            ],
        }
    }

    #[test]
    fn civil_dates() {
        let t = Timestamp::from_unix(0, 0);
        assert_eq!((t.year, t.month, t.day, t.hour), (1970, 1, 1, 0));
        // 2024-02-29T23:59:59Z, a leap day.
        let t = Timestamp::from_unix(1_709_251_199, 5);
        assert_eq!(
            (t.year, t.month, t.day, t.hour, t.minute, t.second, t.micros),
            (2024, 2, 29, 23, 59, 59, 5)
        );
        let t = Timestamp::from_unix(1_795_654_715, 0);
        assert_eq!((t.year, t.month, t.day), (2026, 11, 26));
    }

    #[test]
    fn default_is_tritons_shape() {
        let f = fields();
        let mut s = String::new();
        write_line(&mut s, LogFormat::Default, true, &record(&f));
        assert_eq!(
            s,
            "I1126 00:58:35.019936 9344 server/mod.rs:42] \"listening \\\"now\\\"\" http=127.0.0.1:8000 shards=2\n"
        );
    }

    #[test]
    fn iso8601_is_tritons_shape() {
        let f = fields();
        let mut s = String::new();
        write_line(&mut s, LogFormat::Iso8601, false, &record(&f));
        assert_eq!(
            s,
            "2026-11-26T00:58:35Z I 9344 server/mod.rs:42] listening \"now\" http=127.0.0.1:8000 shards=2\n"
        );
    }

    #[test]
    fn json_is_one_object() {
        let mut f = fields();
        f.pairs.push(("err", "a\nb".into(), Kind::Text));
        let mut s = String::new();
        write_line(&mut s, LogFormat::Json, true, &record(&f));
        assert!(s.ends_with('\n') && s.matches('\n').count() == 1);
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["time"], "2026-11-26T00:58:35.019936Z");
        assert_eq!(v["level"], "INFO");
        assert_eq!(v["pid"], 9344);
        assert_eq!(v["line"], 42);
        assert_eq!(v["message"], "listening \"now\"");
        assert_eq!(v["fields"]["http"], "127.0.0.1:8000");
        assert_eq!(v["fields"]["shards"], 2);
        assert_eq!(v["fields"]["err"], "a\nb");
    }

    #[test]
    fn a_field_cannot_forge_a_line() {
        let f = Fields {
            message: "m\nI1126 fake".into(),
            pairs: vec![
                ("v", "x\nE1126 forged".into(), Kind::Text),
                ("w", "two words".into(), Kind::Text),
            ],
        };
        let mut s = String::new();
        write_line(&mut s, LogFormat::Default, true, &record(&f));
        assert_eq!(s.matches('\n').count(), 1, "{s}");
        assert!(
            s.ends_with(
                r#" v="x\nE1126 forged" w="two words"
"#
            ),
            "{s}"
        );
    }
}
