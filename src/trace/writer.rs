//! The trace writer thread: the only place traces become JSON and touch
//! files. Output is Triton's: a JSON array of objects, per trace one with
//! `id`, `model_name`, `model_version` (and `request_id`, `parent_id`
//! when set), then one with its `timestamps`.
//!
//! Where Triton keeps an unlimited setting's traces in memory until
//! shutdown (`log_frequency` 0), the main file here is written as traces
//! arrive and kept a complete JSON array after every write (the closing
//! `]` is overwritten by the next write). With `log_frequency` N, every N
//! traces go to `<file>.<index>`; a count-limited setting's traces go to
//! `<file>.<index>` once the count is used up — both as Triton does.

use std::{
    collections::HashMap,
    fs::{File, OpenOptions},
    io::{self, Seek, SeekFrom, Write},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        mpsc, Arc,
    },
    thread::JoinHandle,
};

use super::{record::Event, tracer::Active};

/// A trace whose request is done.
pub(super) struct Finished {
    pub id: u64,
    pub parent_id: u64,
    pub model_name: String,
    pub model_version: i64,
    pub request_id: String,
    pub events: Vec<(Event, u64)>,
}

/// Messages the writer's queue holds: traces beyond it are dropped, so a
/// writer that falls behind never grows memory without bound.
pub(super) const QUEUE: usize = 64 * 1024;

/// Traces dropped because the queue was full.
pub(super) static DROPPED: AtomicU64 = AtomicU64::new(0);

pub(super) enum Msg {
    Trace(Arc<Active>, Finished),
    /// A setting was replaced: write what it still holds.
    Retire(Arc<Active>),
    Stop,
}

pub(super) fn spawn(file: PathBuf, rx: mpsc::Receiver<Msg>) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("trace-writer".into())
        .spawn(move || Writer::new(file).run(rx))
}

/// Triton's JSON for one trace (without the enclosing array).
pub(super) fn to_json(t: &Finished) -> String {
    let mut head = serde_json::json!({
        "id": t.id,
        "model_name": t.model_name,
        "model_version": t.model_version,
    });
    if !t.request_id.is_empty() {
        head["request_id"] = t.request_id.clone().into();
    }
    if t.parent_id != 0 {
        head["parent_id"] = t.parent_id.into();
    }
    let stamps: Vec<serde_json::Value> = t
        .events
        .iter()
        .map(|(e, ns)| serde_json::json!({"name": e.name(), "ns": ns}))
        .collect();
    let body = serde_json::json!({"id": t.id, "timestamps": stamps});
    format!("{head},{body}")
}

/// Traces held for an indexed file.
struct Pending {
    active: Arc<Active>,
    json: String,
    held: u32,
    collected: u64,
}

struct Writer {
    path: PathBuf,
    main: Option<File>,
    /// Traces for the main file, written after each burst of messages.
    main_batch: String,
    next_index: u32,
    pending: HashMap<u64, Pending>,
}

fn append(buf: &mut String, json: &str) {
    if !buf.is_empty() {
        buf.push(',');
    }
    buf.push_str(json);
}

impl Writer {
    fn new(path: PathBuf) -> Self {
        Self {
            path,
            main: None,
            main_batch: String::new(),
            next_index: 0,
            pending: HashMap::new(),
        }
    }

    fn run(mut self, rx: mpsc::Receiver<Msg>) {
        let mut dropped = 0;
        'outer: while let Ok(msg) = rx.recv() {
            let mut next = Some(msg);
            while let Some(msg) = next.take() {
                if !self.handle(msg) {
                    break 'outer;
                }
                next = rx.try_recv().ok();
            }
            self.flush_main();
            let now = DROPPED.load(Ordering::Relaxed);
            if now != dropped {
                tracing::warn!(
                    dropped = now - dropped,
                    "traces dropped: the trace writer fell behind (lower trace_rate)"
                );
                dropped = now;
            }
        }
        let all: Vec<Pending> = self.pending.drain().map(|(_, p)| p).collect();
        for p in all {
            self.write_remaining(p);
        }
        self.flush_main();
    }

    /// False on `Stop`.
    fn handle(&mut self, msg: Msg) -> bool {
        match msg {
            Msg::Stop => return false,
            Msg::Retire(active) => {
                if let Some(p) = self.pending.remove(&active.id) {
                    self.write_remaining(p);
                }
            }
            Msg::Trace(active, finished) => self.collect(active, &to_json(&finished)),
        }
        true
    }

    fn collect(&mut self, active: Arc<Active>, json: &str) {
        let lf = active.values.log_frequency;
        if lf == 0 && !active.limited() {
            append(&mut self.main_batch, json);
            return;
        }
        let p = self.pending.entry(active.id).or_insert_with(|| Pending {
            active: active.clone(),
            json: String::new(),
            held: 0,
            collected: 0,
        });
        append(&mut p.json, json);
        p.held += 1;
        p.collected += 1;
        let full = if lf > 0 {
            p.held >= lf
        } else {
            active.remaining() == 0 && p.collected >= active.created_count()
        };
        if full {
            let json = std::mem::take(&mut p.json);
            p.held = 0;
            self.write_indexed(&json);
        }
    }

    /// What a setting still holds when it is replaced or the server
    /// stops: to an indexed file with a log frequency, else to the main
    /// file (Triton's rule).
    fn write_remaining(&mut self, p: Pending) {
        if p.held == 0 {
            return;
        }
        if p.active.values.log_frequency > 0 {
            self.write_indexed(&p.json);
        } else {
            append(&mut self.main_batch, &p.json);
        }
    }

    fn write_indexed(&mut self, json: &str) {
        let path = indexed(&self.path, self.next_index);
        self.next_index += 1;
        let result = File::create(&path).and_then(|mut f| {
            f.write_all(b"[")?;
            f.write_all(json.as_bytes())?;
            f.write_all(b"]")
        });
        if let Err(e) = result {
            tracing::error!(file = %path.display(), error = %e, "cannot write a trace file");
        }
    }

    fn flush_main(&mut self) {
        if self.main_batch.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.main_batch);
        let result = match &mut self.main {
            Some(f) => f
                .seek(SeekFrom::End(-1))
                .and_then(|_| f.write_all(format!(",{batch}]").as_bytes())),
            None => OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&self.path)
                .and_then(|mut f| {
                    f.write_all(format!("[{batch}]").as_bytes())?;
                    self.main = Some(f);
                    Ok(())
                }),
        };
        if let Err(e) = result {
            tracing::error!(file = %self.path.display(), error = %e, "cannot write the trace file");
        }
    }
}

fn indexed(path: &Path, index: u32) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".{index}"));
    PathBuf::from(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_tritons_layout() {
        let t = Finished {
            id: 3,
            parent_id: 1,
            model_name: "m\"x".into(),
            model_version: 2,
            request_id: "r".into(),
            events: vec![(Event::RequestStart, 10), (Event::RequestEnd, 20)],
        };
        let v: serde_json::Value = serde_json::from_str(&format!("[{}]", to_json(&t))).unwrap();
        assert_eq!(v[0]["id"], 3);
        assert_eq!(v[0]["model_name"], "m\"x");
        assert_eq!(v[0]["model_version"], 2);
        assert_eq!(v[0]["request_id"], "r");
        assert_eq!(v[0]["parent_id"], 1);
        assert_eq!(v[1]["timestamps"][0]["name"], "REQUEST_START");
        assert_eq!(v[1]["timestamps"][1]["ns"], 20);
        let top = Finished {
            parent_id: 0,
            request_id: String::new(),
            ..t
        };
        let v: serde_json::Value = serde_json::from_str(&format!("[{}]", to_json(&top))).unwrap();
        assert!(v[0].get("parent_id").is_none() && v[0].get("request_id").is_none());
    }

    #[test]
    fn indexed_names_append_the_index() {
        assert_eq!(
            indexed(Path::new("/tmp/t.json"), 4),
            PathBuf::from("/tmp/t.json.4")
        );
    }
}
