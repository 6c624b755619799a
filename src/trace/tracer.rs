//! The server's tracer: the settings in force, sampling, and the channel
//! to the writer thread.

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering},
        mpsc, Arc, Mutex, RwLock,
    },
    thread::JoinHandle,
};

use super::{
    record::{Trace, TraceSlot},
    settings::{
        invalid_reason, resolve, Level, SettingUpdate, Specified, TraceConfig, TraceMode,
        TraceView, Values,
    },
    writer::{self, Finished, Msg},
};
use crate::types::{InferError, InferResult};

static NEXT_SETTING: AtomicU64 = AtomicU64::new(1);

/// One resolved setting in force, with its sampling counters. Replaced
/// (never changed) by an update, so traces already sampled keep the
/// setting they were sampled under, as in Triton.
pub struct Active {
    pub(super) id: u64,
    pub(super) values: Values,
    sampling: bool,
    /// Requests seen, for the rate.
    seen: AtomicU64,
    /// Traces still to take; -1 = unlimited.
    remaining: AtomicI64,
    created: AtomicU64,
    tx: Option<mpsc::SyncSender<Msg>>,
}

impl Active {
    fn new(values: Values, file: &str, tx: Option<mpsc::SyncSender<Msg>>) -> Arc<Self> {
        let sampling = invalid_reason(&values, file).is_none() && tx.is_some();
        Arc::new(Self {
            id: NEXT_SETTING.fetch_add(1, Ordering::Relaxed),
            values,
            sampling,
            seen: AtomicU64::new(0),
            remaining: AtomicI64::new(i64::from(values.count)),
            created: AtomicU64::new(0),
            tx,
        })
    }

    /// Every `rate`-th request, while the count lasts.
    fn try_sample(&self) -> bool {
        if !self.sampling {
            return false;
        }
        let n = self.seen.fetch_add(1, Ordering::Relaxed) + 1;
        if n % u64::from(self.values.rate.max(1)) != 0 {
            return false;
        }
        // Counted as created before the count goes down, so the writer
        // never sees a used-up count with a trace it does not know of.
        self.created.fetch_add(1, Ordering::AcqRel);
        let taken = self
            .remaining
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| match r {
                -1 => Some(-1),
                r if r > 0 => Some(r - 1),
                _ => None,
            })
            .is_ok();
        if !taken {
            self.created.fetch_sub(1, Ordering::AcqRel);
        }
        taken
    }

    pub(super) fn created(&self) {
        self.created.fetch_add(1, Ordering::AcqRel);
    }

    pub(super) fn created_count(&self) -> u64 {
        self.created.load(Ordering::Acquire)
    }

    pub(super) fn remaining(&self) -> i64 {
        self.remaining.load(Ordering::Acquire)
    }

    /// A count-limited setting: its traces are written together once the
    /// count is used up (Triton's behaviour).
    pub(super) fn limited(&self) -> bool {
        self.values.count >= 0
    }

    /// Never waits: a trace that finds the writer's queue full is
    /// dropped and counted (the writer logs the count).
    pub(super) fn deliver(self: Arc<Self>, finished: Finished) {
        if let Some(tx) = self.tx.clone() {
            if let Err(mpsc::TrySendError::Full(_)) = tx.try_send(Msg::Trace(self, finished)) {
                writer::DROPPED.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The values now: the count is what is left of it.
    fn current(&self) -> Values {
        Values {
            count: self.remaining().clamp(-1, i64::from(i32::MAX)) as i32,
            ..self.values
        }
    }
}

struct Entry {
    specified: Specified,
    active: Arc<Active>,
}

struct State {
    defaults: Values,
    file: String,
    global: Entry,
    models: HashMap<String, Entry>,
}

/// Tracing for one server: settings, sampling and the writer thread.
pub struct Tracer {
    /// Whether any setting samples: the only thing a request reads when
    /// tracing is off.
    enabled: AtomicBool,
    state: RwLock<State>,
    tx: Option<mpsc::SyncSender<Msg>>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer")
            .field("enabled", &self.enabled.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

fn poisoned() -> InferError {
    InferError::internal("the trace settings are unusable after a panic")
}

impl Tracer {
    /// The command line's settings in force; the writer thread started
    /// when a trace file is named (without one nothing can be traced).
    pub fn new(config: &TraceConfig) -> Self {
        let (tx, writer) = if config.file.is_empty() {
            (None, None)
        } else {
            let (tx, rx) = mpsc::sync_channel(writer::QUEUE);
            match writer::spawn(PathBuf::from(&config.file), rx) {
                Ok(handle) => (Some(tx), Some(handle)),
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the trace writer thread: tracing is off");
                    (None, None)
                }
            }
        };
        if config.values.level != Level::Off {
            if let Some(why) = invalid_reason(&config.values, &config.file) {
                tracing::warn!(reason = why, "tracing is configured but cannot sample");
            }
        }
        let global = Entry {
            specified: Specified::default(),
            active: Active::new(config.values, &config.file, tx.clone()),
        };
        let tracer = Self {
            enabled: AtomicBool::new(false),
            state: RwLock::new(State {
                defaults: config.values,
                file: config.file.clone(),
                global,
                models: HashMap::new(),
            }),
            tx,
            writer: Mutex::new(writer),
        };
        if let Ok(state) = tracer.state.read() {
            tracer.refresh_enabled(&state);
        }
        tracer
    }

    /// Whether any request may be sampled now.
    #[inline]
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Samples a request to `model`: a trace when this request is one of
    /// those the model's setting takes, else an empty slot.
    #[inline]
    pub fn sample(&self, model: &str) -> TraceSlot {
        if !self.enabled() {
            return TraceSlot::default();
        }
        self.sample_slow(model)
    }

    #[cold]
    fn sample_slow(&self, model: &str) -> TraceSlot {
        let Ok(state) = self.state.read() else {
            return TraceSlot::default();
        };
        let active = &state.models.get(model).unwrap_or(&state.global).active;
        if !active.try_sample() {
            return TraceSlot::default();
        }
        TraceSlot::new(Some(Trace::new(active.clone(), model, 0)))
    }

    fn refresh_enabled(&self, state: &State) {
        let on = state.global.active.sampling || state.models.values().any(|e| e.active.sampling);
        self.enabled.store(on, Ordering::Relaxed);
    }

    fn view(state: &State, active: &Active) -> TraceView {
        TraceView {
            values: active.current(),
            file: state.file.clone(),
            mode: TraceMode::Triton,
        }
    }

    /// The settings a model's requests follow (the global ones for `None`
    /// or a model with no settings of its own).
    pub fn settings(&self, model: Option<&str>) -> InferResult<TraceView> {
        let state = self.state.read().map_err(|_| poisoned())?;
        let entry = model
            .and_then(|m| state.models.get(m))
            .unwrap_or(&state.global);
        Ok(Self::view(&state, &entry.active))
    }

    /// Never waits (updates run on a shard): with the queue full, what
    /// the setting holds is written at shutdown instead.
    fn retire(&self, active: Arc<Active>) {
        if let Some(tx) = &self.tx {
            let _ = tx.try_send(Msg::Retire(active));
        }
    }

    fn check(values: &Values, file: &str) -> InferResult<()> {
        match invalid_reason(values, file) {
            Some(why) if values.level != Level::Off => Err(InferError::invalid(format!(
                "Attempting to set invalid trace setting :{why}"
            ))),
            _ => Ok(()),
        }
    }

    /// Applies `update` to the global settings (`None`) or a model's, and
    /// returns the settings that model now follows. A global update also
    /// moves every model setting that takes values from it.
    pub fn update(&self, model: Option<&str>, update: &SettingUpdate) -> InferResult<TraceView> {
        let mut state = self.state.write().map_err(|_| poisoned())?;
        let file = state.file.clone();
        match model {
            None => {
                let current = (state.global.active.current(), state.global.specified);
                let (values, specified) = resolve(state.defaults, Some(current), update);
                Self::check(&values, &file)?;
                let old = std::mem::replace(
                    &mut state.global,
                    Entry {
                        specified,
                        active: Active::new(values, &file, self.tx.clone()),
                    },
                );
                self.retire(old.active);
                let global = state.global.active.values;
                let mut retired = Vec::new();
                for entry in state.models.values_mut() {
                    let s = entry.specified;
                    if s.level && s.rate && s.count && s.log_frequency {
                        continue;
                    }
                    let (values, specified) = resolve(
                        global,
                        Some((entry.active.current(), s)),
                        &SettingUpdate::default(),
                    );
                    let old = std::mem::replace(
                        entry,
                        Entry {
                            specified,
                            active: Active::new(values, &file, self.tx.clone()),
                        },
                    );
                    retired.push(old.active);
                }
                for a in retired {
                    self.retire(a);
                }
            }
            Some(name) => {
                let global = state.global.active.values;
                let current = state
                    .models
                    .get(name)
                    .map(|e| (e.active.current(), e.specified));
                let (values, specified) = resolve(global, current, update);
                if specified.none() {
                    if let Some(old) = state.models.remove(name) {
                        self.retire(old.active);
                    }
                } else {
                    Self::check(&values, &file)?;
                    let entry = Entry {
                        specified,
                        active: Active::new(values, &file, self.tx.clone()),
                    };
                    if let Some(old) = state.models.insert(name.to_string(), entry) {
                        self.retire(old.active);
                    }
                }
            }
        }
        self.refresh_enabled(&state);
        let entry = model
            .and_then(|m| state.models.get(m))
            .unwrap_or(&state.global);
        let view = Self::view(&state, &entry.active);
        tracing::info!(model = model.unwrap_or(""), settings = ?view.values, "trace settings changed");
        Ok(view)
    }

    /// Stops sampling, writes what was collected and ends the writer
    /// thread (server shutdown).
    pub fn shutdown(&self) {
        self.enabled.store(false, Ordering::Relaxed);
        if let Some(tx) = &self.tx {
            let _ = tx.send(Msg::Stop);
        }
        let handle = self.writer.lock().ok().and_then(|mut w| w.take());
        if let Some(handle) = handle {
            if handle.join().is_err() {
                tracing::error!("the trace writer thread panicked");
            }
        }
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Change, Event};

    pub(crate) fn scratch_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "shardserve-trace-{tag}-{}-{}",
            std::process::id(),
            super::super::now_ns()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn config(file: &str, rate: u32, count: i32) -> TraceConfig {
        TraceConfig {
            file: file.into(),
            values: Values {
                level: Level::Timestamps,
                rate,
                count,
                log_frequency: 0,
            },
        }
    }

    #[test]
    fn off_samples_nothing_and_needs_a_file_to_turn_on() {
        let t = Tracer::new(&TraceConfig::default());
        assert!(!t.enabled());
        assert!(!t.sample("m").is_traced());
        let on = SettingUpdate {
            level: Change::Set(Level::Timestamps),
            ..Default::default()
        };
        let e = t.update(None, &on).unwrap_err();
        assert!(e.message.contains("trace file name is not given"), "{e:?}");
    }

    #[test]
    fn rate_and_count_pick_every_nth_until_used_up() {
        let dir = scratch_dir("tracer");
        let file = dir.join("t.json");
        let t = Tracer::new(&config(file.to_str().unwrap(), 3, 2));
        let picked: Vec<bool> = (0..12)
            .map(|_| {
                let mut s = t.sample("m");
                s.stamp(Event::RequestStart);
                s.is_traced()
            })
            .collect();
        assert_eq!(
            picked,
            [false, false, true, false, false, true, false, false, false, false, false, false]
        );
        assert_eq!(t.settings(None).unwrap().values.count, 0);
        t.shutdown();
        // A count-limited setting writes its traces to an indexed file.
        let text = std::fs::read_to_string(dir.join("t.json.0")).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v.as_array().unwrap().len(), 4);
    }

    #[test]
    fn model_settings_override_and_clear_back_to_global() {
        let dir = scratch_dir("tracer");
        let file = dir.join("t.json");
        let mut c = config(file.to_str().unwrap(), 1000, -1);
        c.values.level = Level::Off;
        let t = Tracer::new(&c);
        assert!(!t.enabled());
        let on = SettingUpdate {
            level: Change::Set(Level::Timestamps),
            rate: Change::Set(1),
            ..Default::default()
        };
        let v = t.update(Some("a"), &on).unwrap();
        assert_eq!((v.values.level, v.values.rate), (Level::Timestamps, 1));
        assert!(t.enabled());
        assert!(t.sample("a").is_traced());
        assert!(!t.sample("b").is_traced());
        // The global rate changes; the model keeps its own.
        let rate = SettingUpdate {
            rate: Change::Set(7),
            ..Default::default()
        };
        t.update(None, &rate).unwrap();
        assert_eq!(t.settings(Some("a")).unwrap().values.rate, 1);
        assert_eq!(t.settings(Some("b")).unwrap().values.rate, 7);
        let clear = SettingUpdate {
            level: Change::Clear,
            rate: Change::Clear,
            ..Default::default()
        };
        let v = t.update(Some("a"), &clear).unwrap();
        assert_eq!((v.values.level, v.values.rate), (Level::Off, 7));
        assert!(!t.enabled());
    }
}
