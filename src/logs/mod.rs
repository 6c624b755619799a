//! The server's log, as tritonserver 2.51 writes it.
//!
//! Lines go to standard error, or to `--log-file` (opened for appending),
//! in Triton's `default` or `ISO8601` shape or in `json` (ours, one object
//! a line); see [`format`]. Levels are Triton's four switches: error,
//! warning and info each on or off, and a verbose level (0 off; 1 our
//! debug records; 2 our trace records; 3 and more every crate's trace
//! records — hyper, h2, rustls — too). Backends' own log calls count at
//! their level (verbose as debug).
//!
//! `SHARDSERVE_LOG`, when set, is a `tracing` EnvFilter directive (e.g.
//! `info,shardserve::scheduler=trace`) used instead of the filter the
//! verbose level derives, for finer choices than Triton's levels; the
//! error/warning/info switches still apply on top of it. A later change
//! of `log_verbose_level` through the logging API replaces it with the
//! derived filter.
//!
//! Every setting but the file can change at run time (the logging
//! extension, `frontend::logging`): the switches are atomics the output
//! layer reads, the filter is swapped through `tracing-subscriber`'s
//! reload layer, and the callsite interest cache is rebuilt so that a
//! disabled record costs one relaxed load again, not a filter call.

pub mod format;
mod output;

pub use self::format::LogFormat;

use std::{
    cell::RefCell,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, AtomicU8, Ordering},
        Mutex, OnceLock,
    },
};

use anyhow::Context as _;
use tracing::{subscriber::Interest, Event, Metadata};
use tracing_subscriber::{
    layer::{Context, SubscriberExt},
    reload,
    util::SubscriberInitExt,
    EnvFilter, Layer,
};

use self::{
    format::{Fields, Record, Timestamp},
    output::Sink,
};

/// The environment variable holding our own filter directive.
pub const FILTER_ENV: &str = "SHARDSERVE_LOG";
/// Triton's switch for quoting messages (`0` writes them raw).
const ESCAPE_ENV: &str = "TRITON_SERVER_ESCAPE_LOG_MESSAGES";

/// The log settings: tritonserver's `--log-*` flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    /// `--log-verbose`: 0 off, 1 and more verbose.
    pub verbose: u32,
    /// `--log-info`, `--log-warning`, `--log-error`.
    pub info: bool,
    pub warning: bool,
    pub error: bool,
    /// `--log-format`.
    pub format: LogFormat,
    /// `--log-file`: append to this file instead of standard error.
    pub file: Option<PathBuf>,
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            verbose: 0,
            info: true,
            warning: true,
            error: true,
            format: LogFormat::Default,
            file: None,
        }
    }
}

impl LogSettings {
    /// The `tracing` filter these settings mean: the least severe of the
    /// error/warning/info levels that is on for every crate, and our own
    /// (and backends') debug or trace records at verbose 1 or 2; verbose 3
    /// and more is everything.
    pub fn filter_directive(&self) -> String {
        let base = if self.info {
            "info"
        } else if self.warning {
            "warn"
        } else if self.error {
            "error"
        } else {
            "off"
        };
        match self.verbose {
            0 => base.to_string(),
            1 => format!("{base},shardserve=debug,backend=debug"),
            2 => format!("{base},shardserve=trace,backend=trace"),
            _ => "trace".to_string(),
        }
    }
}

/// Changes to the settings at run time (the logging API); `None` keeps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogChanges {
    pub info: Option<bool>,
    pub warning: Option<bool>,
    pub error: Option<bool>,
    pub verbose: Option<u32>,
    pub format: Option<LogFormat>,
}

/// What the output layer reads on every record: plain atomics.
struct Switches {
    info: AtomicBool,
    warning: AtomicBool,
    error: AtomicBool,
    format: AtomicU8,
    escape: AtomicBool,
}

static SWITCHES: Switches = Switches {
    info: AtomicBool::new(true),
    warning: AtomicBool::new(true),
    error: AtomicBool::new(true),
    format: AtomicU8::new(0),
    escape: AtomicBool::new(true),
};

/// The settings as last set; `None` until `init` or a change.
static SETTINGS: Mutex<Option<LogSettings>> = Mutex::new(None);
/// Where lines go; `None` (before `init`) is standard error.
static SINK: Mutex<Option<Sink>> = Mutex::new(None);
/// Whether `SHARDSERVE_LOG` is the filter in force.
static FROM_ENV: AtomicBool = AtomicBool::new(false);

type Reload = Box<dyn Fn(EnvFilter) -> Result<(), String> + Send + Sync>;
static RELOAD: OnceLock<Reload> = OnceLock::new();

fn store_switches(s: &LogSettings) {
    SWITCHES.info.store(s.info, Ordering::Relaxed);
    SWITCHES.warning.store(s.warning, Ordering::Relaxed);
    SWITCHES.error.store(s.error, Ordering::Relaxed);
    SWITCHES.format.store(s.format.to_u8(), Ordering::Relaxed);
}

/// Installs the process's logger with `settings`: called once, by the
/// binary, before anything logs. Fails when the log file cannot be opened
/// (tritonserver falls back to standard error without a word; a log
/// pipeline reading the file would see nothing), when `SHARDSERVE_LOG` is
/// not a valid directive, or when a logger is already installed.
pub fn init(settings: &LogSettings) -> anyhow::Result<()> {
    let sink = Sink::open(settings.file.as_deref())?;
    let from_env = std::env::var(FILTER_ENV)
        .ok()
        .filter(|v| !v.trim().is_empty());
    let filter = match &from_env {
        Some(directive) => EnvFilter::try_new(directive)
            .with_context(|| format!("{FILTER_ENV}='{directive}' is not a valid filter"))?,
        None => EnvFilter::try_new(settings.filter_directive())
            .context("the log levels make no valid filter")?,
    };
    let (filter, handle) = reload::Layer::new(filter);
    // Installed first: a second call must leave the first one's state.
    tracing_subscriber::registry()
        .with(filter)
        .with(Output)
        .try_init()
        .context("a logger is already installed in this process")?;
    let escape = std::env::var(ESCAPE_ENV).map_or(true, |v| v != "0");
    SWITCHES.escape.store(escape, Ordering::Relaxed);
    store_switches(settings);
    FROM_ENV.store(from_env.is_some(), Ordering::Relaxed);
    *lock(&SINK) = Some(sink);
    *lock(&SETTINGS) = Some(settings.clone());
    tracing::callsite::rebuild_interest_cache();
    let _ = RELOAD.set(Box::new(move |f| {
        handle.reload(f).map_err(|e| e.to_string())
    }));
    Ok(())
}

/// A poisoned lock only means a thread panicked while logging; the data
/// (settings, a file handle) is still whole.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The settings in force (the defaults where `init` never ran: a server
/// started in-process keeps and reports its settings all the same).
pub fn settings() -> LogSettings {
    lock(&SETTINGS).clone().unwrap_or_default()
}

/// Applies `changes` at once and returns the new settings.
pub fn update(changes: &LogChanges) -> anyhow::Result<LogSettings> {
    let mut guard = lock(&SETTINGS);
    let mut next = guard.clone().unwrap_or_default();
    if let Some(v) = changes.info {
        next.info = v;
    }
    if let Some(v) = changes.warning {
        next.warning = v;
    }
    if let Some(v) = changes.error {
        next.error = v;
    }
    if let Some(v) = changes.verbose {
        next.verbose = v;
    }
    if let Some(v) = changes.format {
        next.format = v;
    }
    // SHARDSERVE_LOG keeps deciding which records pass until the verbose
    // level is set again; the three switches work either way.
    let refilter = !FROM_ENV.load(Ordering::Relaxed) || changes.verbose.is_some();
    if refilter {
        if let Some(reload) = RELOAD.get() {
            let filter = EnvFilter::try_new(next.filter_directive())
                .context("the log levels make no valid filter")?;
            reload(filter).map_err(|e| anyhow::anyhow!("cannot swap the log filter: {e}"))?;
            FROM_ENV.store(false, Ordering::Relaxed);
        }
    }
    store_switches(&next);
    // The switches are part of every callsite's cached interest.
    tracing::callsite::rebuild_interest_cache();
    *guard = Some(next.clone());
    Ok(next)
}

/// The log file in force, if any.
pub fn file() -> Option<PathBuf> {
    lock(&SINK)
        .as_ref()
        .and_then(Sink::path)
        .map(Path::to_path_buf)
}

/// The layer that writes every record the filter lets through, unless its
/// level is switched off.
struct Output;

fn level_on(meta: &Metadata<'_>) -> bool {
    let switch = match *meta.level() {
        tracing::Level::ERROR => &SWITCHES.error,
        tracing::Level::WARN => &SWITCHES.warning,
        tracing::Level::INFO => &SWITCHES.info,
        // Debug and trace records are the verbose levels: the filter
        // decides those.
        _ => return true,
    };
    switch.load(Ordering::Relaxed)
}

/// Where a record was made, as Triton's `file:line`: our files relative to
/// `src/` (`server/mod.rs`), another crate's file after its own `src/`.
fn short_file<'a>(meta: &Metadata<'a>) -> &'a str {
    let Some(file) = meta.file() else {
        return meta.target();
    };
    if let Some(rest) = file.strip_prefix("src/") {
        return rest;
    }
    match file.rfind("/src/") {
        Some(i) => &file[i + 5..],
        None => file.rsplit('/').next().unwrap_or(file),
    }
}

thread_local! {
    static LINE: RefCell<String> = const { RefCell::new(String::new()) };
}

impl<S: tracing::Subscriber> Layer<S> for Output {
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        if level_on(meta) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, meta: &Metadata<'_>, _: Context<'_, S>) -> bool {
        level_on(meta)
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let meta = event.metadata();
        let mut fields = Fields::default();
        event.record(&mut fields);
        // A backend's record (TRITONSERVER_LogMessage) carries its own
        // file and line: show those, as Triton does.
        let backend_at = if meta.target() == "backend" {
            let file = fields.take("file");
            let line = fields.take("line").and_then(|l| l.parse().ok());
            file.map(|f| (f, line))
        } else {
            None
        };
        let (file, line) = match &backend_at {
            Some((f, l)) => (f.rsplit('/').next().unwrap_or(f), *l),
            None => (short_file(meta), meta.line()),
        };
        let record = Record {
            time: Timestamp::now(),
            level: *meta.level(),
            pid: std::process::id(),
            target: meta.target(),
            file,
            line,
            fields: &fields,
        };
        let format = LogFormat::from_u8(SWITCHES.format.load(Ordering::Relaxed));
        let escape = SWITCHES.escape.load(Ordering::Relaxed);
        let write = |buf: &mut String| {
            buf.clear();
            format::write_line(buf, format, escape, &record);
            let mut sink = lock(&SINK);
            // A log that cannot be written has nowhere to report it.
            let _ = match sink.as_mut() {
                Some(s) => s.write_line(buf),
                None => Sink::Stderr.write_line(buf),
            };
        };
        let reused = LINE.with(|cell| match cell.try_borrow_mut() {
            Ok(mut buf) => {
                write(&mut buf);
                true
            }
            Err(_) => false,
        });
        if !reused {
            write(&mut String::new());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_names_are_tritons() {
        assert_eq!("default".parse(), Ok(LogFormat::Default));
        assert_eq!("ISO8601".parse(), Ok(LogFormat::Iso8601));
        assert_eq!("json".parse(), Ok(LogFormat::Json));
        assert_eq!(
            "iso8601".parse::<LogFormat>(),
            Err("invalid argument for --log-format".to_string())
        );
        for f in [LogFormat::Default, LogFormat::Iso8601, LogFormat::Json] {
            assert_eq!(f.to_string().parse(), Ok(f));
            assert_eq!(LogFormat::from_u8(f.to_u8()), f);
        }
    }

    #[test]
    fn filter_follows_the_levels() {
        let mut s = LogSettings::default();
        assert_eq!(s.filter_directive(), "info");
        s.verbose = 1;
        assert_eq!(s.filter_directive(), "info,shardserve=debug,backend=debug");
        s.verbose = 2;
        s.info = false;
        assert_eq!(s.filter_directive(), "warn,shardserve=trace,backend=trace");
        s.verbose = 3;
        assert_eq!(s.filter_directive(), "trace");
        s.verbose = 0;
        s.warning = false;
        assert_eq!(s.filter_directive(), "error");
        s.error = false;
        assert_eq!(s.filter_directive(), "off");
        for v in 0..4 {
            s.verbose = v;
            assert!(EnvFilter::try_new(s.filter_directive()).is_ok());
        }
    }
}
