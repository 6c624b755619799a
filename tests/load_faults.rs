//! Faults stay contained: a Python model whose stub cannot start fails its
//! load within a bound (Triton's Python backend 2.51 would wait for it
//! forever) with the reason in the index, and its stub is reaped; a load
//! that hangs in a backend blocks neither the repository API, nor other
//! loads, nor readiness of the other models, nor SIGTERM — at start-up
//! included. The real binary runs as a child process (signals, exit
//! status, its children in `/proc`).

mod common;

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    thread,
    time::{Duration, Instant},
};

use common::{get, post_json, wait_for, HttpReply};
use serde_json::{json, Value};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn python_backend_installed() -> bool {
    let backend = root().join(".backends/python/libtriton_python.so");
    if backend.exists() {
        return true;
    }
    eprintln!(
        "SKIPPED: Triton's Python backend is not installed ({}); scripts/setup.sh installs it",
        backend.display()
    );
    false
}

/// Compiles `tests/capi_backends/lifecycle.c` as `capi_lifecycle` into
/// `dir` (a model folder: the server looks there first).
fn build_lifecycle_backend(dir: &Path) {
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-I"])
        .arg(root().join("include"))
        .arg(root().join("tests/capi_backends/lifecycle.c"))
        .arg("-o")
        .arg(dir.join("libtriton_capi_lifecycle.so"))
        .arg("-lpthread")
        .status()
        .expect("run cc (scripts/setup.sh installs gcc)");
    assert!(status.success(), "compiling lifecycle.c failed");
}

/// A model served by the lifecycle backend (INPUT0 copied to OUTPUT0);
/// `initialize_sleep_ms` makes its `TRITONBACKEND_ModelInitialize` hang.
fn lifecycle_config(name: &str, initialize_sleep_ms: u64) -> String {
    format!(
        r#"name: "{name}"
backend: "capi_lifecycle"
max_batch_size: 0
input [ {{ name: "INPUT0", data_type: TYPE_INT32, dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_INT32, dims: [ 4 ] }} ]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
parameters {{ key: "initialize_sleep_ms" value: {{ string_value: "{initialize_sleep_ms}" }} }}
"#
    )
}

fn python_config(name: &str) -> String {
    format!(
        r#"name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0", data_type: TYPE_INT32, dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_INT32, dims: [ 4 ] }} ]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
"#
    )
}

const IDENTITY_MODEL_PY: &str = r#"import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                output_tensors=[
                    pb_utils.Tensor(
                        "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
                    )
                ]
            )
            for r in requests
        ]
"#;

/// A model repository in a temporary folder, removed on drop.
struct Repo {
    dir: PathBuf,
}

impl Repo {
    fn new(tag: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("shardserve-faults-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("models")).expect("repo dir");
        Self { dir }
    }

    fn models(&self) -> PathBuf {
        self.dir.join("models")
    }

    /// Adds model `name` with version folder 1.
    fn model(&self, name: &str, config: &str) -> PathBuf {
        let m = self.models().join(name);
        std::fs::create_dir_all(m.join("1")).expect("model dir");
        std::fs::write(m.join("config.pbtxt"), config).expect("config");
        m
    }

    fn lifecycle_model(&self, name: &str, initialize_sleep_ms: u64) {
        let m = self.model(name, &lifecycle_config(name, initialize_sleep_ms));
        build_lifecycle_backend(&m);
    }
}

impl Drop for Repo {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `shardserve` as a child process on ephemeral ports; not waited ready
/// (a hung start-up load keeps it unready). Killed on drop.
struct Server {
    child: Child,
    log: PathBuf,
    http: SocketAddr,
}

impl Server {
    fn start(repo: &Repo, args: &[&str]) -> Self {
        let log = repo.dir.join("server.log");
        let out = std::fs::File::create(&log).expect("log file");
        let err = out.try_clone().expect("log file");
        let mut child = Command::new(env!("CARGO_BIN_EXE_shardserve"))
            .arg("--model-repository")
            .arg(repo.models())
            .args([
                "--host",
                "127.0.0.1",
                "--http-port",
                "0",
                "--grpc-port",
                "0",
            ])
            .args(["--metrics-port", "0", "--cores", "1", "--no-pin"])
            .args(args)
            .env_remove("SHARDSERVE_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .expect("spawn the server");
        let until = Instant::now() + Duration::from_secs(30);
        let http = loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(a) = find_addr(&text, "http") {
                break a;
            }
            if Instant::now() > until || child.try_wait().ok().flatten().is_some() {
                let _ = child.kill();
                let _ = child.wait();
                panic!("server did not start:\n{text}");
            }
            thread::sleep(Duration::from_millis(20));
        };
        Self { child, log, http }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn index(&self) -> Vec<Value> {
        let r = post_json(self.http, "/v2/repository/index", &json!({}));
        assert_eq!(r.status, 200, "index: {}", String::from_utf8_lossy(&r.body));
        r.json().as_array().cloned().unwrap_or_default()
    }

    fn row(&self, model: &str) -> Option<Value> {
        self.index().into_iter().find(|m| m["name"] == model)
    }

    fn load(&self, model: &str) -> HttpReply {
        post_json(
            self.http,
            &format!("/v2/repository/models/{model}/load"),
            &json!({}),
        )
    }

    /// The server's children that are zombies (exited, not reaped).
    fn zombie_children(&self) -> Vec<String> {
        let pid = self.child.id();
        let mut zombies = Vec::new();
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten();
        for task in tasks.flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for c in children.split_whitespace() {
                let stat = std::fs::read_to_string(format!("/proc/{c}/stat")).unwrap_or_default();
                // "pid (comm) S ...": the state follows the last ')'.
                let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
                if state.is_some_and(|s| s.starts_with('Z')) {
                    zombies.push(stat);
                }
            }
        }
        zombies
    }

    fn sigterm(&self) {
        // SAFETY: kill(2) on our own child's pid.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
    }

    fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let until = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() > until {
                return None;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn find_addr(log: &str, what: &str) -> Option<SocketAddr> {
    let line = log.lines().find(|l| l.contains("listening"))?;
    let key = format!("{what}=");
    let start = line.find(&key)? + key.len();
    line[start..].split_whitespace().next()?.parse().ok()
}

fn infer_int4(http: SocketAddr, model: &str) -> HttpReply {
    let body = json!({"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [4], "data": [1, 2, 3, 4]}]});
    post_json(http, &format!("/v2/models/{model}/infer"), &body)
}

/// Sends SIGTERM and expects the exit within `exit_timeout` plus a margin
/// for a loaded machine; returns the status.
fn sigterm_and_exit(server: &mut Server, exit_timeout: Duration) -> ExitStatus {
    let sent = Instant::now();
    server.sigterm();
    let status = server
        .wait_exit(exit_timeout + Duration::from_secs(15))
        .unwrap_or_else(|| panic!("no exit after SIGTERM:\n{}", server.log()));
    let took = sent.elapsed();
    assert!(
        took < exit_timeout + Duration::from_secs(15),
        "exit took {took:?}:\n{}",
        server.log()
    );
    status
}

/// A Python model without `model.py`: the load answers at once with the
/// stub's own words, the index says why, no stub is left behind, and the
/// server still loads and serves another Python model and stops on SIGTERM.
#[test]
fn python_model_without_model_py_fails_its_load_with_the_reason_in_the_index() {
    if !python_backend_installed() {
        return;
    }
    let repo = Repo::new("nopy");
    repo.model("nopy", &python_config("nopy"));
    let good = repo.model("pyok", &python_config("pyok"));
    std::fs::write(good.join("1/model.py"), IDENTITY_MODEL_PY).expect("model.py");
    let mut server = Server::start(&repo, &["--model-control-mode", "explicit"]);
    let asked = Instant::now();
    let r = server.load("nopy");
    let error = r.json()["error"].as_str().unwrap_or_default().to_string();
    assert_eq!(r.status, 500, "{error}");
    assert!(
        error.contains("failed to load 'nopy'")
            && error
                .contains("Failed to preinitialize Python stub: Python model file not found in")
            && error.contains("model.py"),
        "{error}"
    );
    assert!(
        asked.elapsed() < Duration::from_secs(15),
        "{:?}",
        asked.elapsed()
    );
    let row = server.row("nopy").expect("nopy in the index");
    assert_eq!(row["state"], "UNAVAILABLE", "{row}");
    assert!(
        row["reason"]
            .as_str()
            .is_some_and(|r| r.contains("Failed to preinitialize Python stub")),
        "{row}"
    );
    assert_eq!(server.load("pyok").status, 200, "{}", server.log());
    assert_eq!(infer_int4(server.http, "pyok").status, 200);
    assert!(
        server.zombie_children().is_empty(),
        "{:?}",
        server.zombie_children()
    );
    let status = sigterm_and_exit(&mut server, Duration::from_secs(30));
    assert!(status.success(), "exit {status}:\n{}", server.log());
}

/// A stub that exits before its first message (here the model folder's
/// own `triton_python_backend_stub`, which the backend prefers, exits 1):
/// the backend would wait for it forever; the load fails within the
/// bound, the zombie stub is reaped, and the server stops on SIGTERM.
#[test]
fn python_stub_dying_before_its_handshake_fails_the_load_within_the_bound_and_is_reaped() {
    if !python_backend_installed() {
        return;
    }
    let repo = Repo::new("deadstub");
    let m = repo.model("deadstub", &python_config("deadstub"));
    std::fs::write(m.join("1/model.py"), IDENTITY_MODEL_PY).expect("model.py");
    let stub = m.join("triton_python_backend_stub");
    std::fs::write(
        &stub,
        "#!/bin/sh\necho 'test stub: refusing to start' >&2\nexit 1\n",
    )
    .expect("stub");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let mut server = Server::start(&repo, &["--model-control-mode", "explicit"]);
    let asked = Instant::now();
    let r = server.load("deadstub");
    let took = asked.elapsed();
    let error = r.json()["error"].as_str().unwrap_or_default().to_string();
    assert_eq!(r.status, 500, "{error}\n{}", server.log());
    assert!(
        error.contains("failed to load 'deadstub'")
            && error.contains("Failed to preinitialize Python stub")
            && error.contains("exited with status 1"),
        "{error}"
    );
    // The bound: the stub's start plus CHILD_EXIT_GRACE (1 s); generous
    // for a loaded machine, far below "forever".
    assert!(took < Duration::from_secs(15), "the load took {took:?}");
    let row = server.row("deadstub").expect("in the index");
    assert_eq!(row["state"], "UNAVAILABLE", "{row}");
    wait_for(
        "the dead stub to be reaped",
        Duration::from_secs(10),
        || server.zombie_children().is_empty(),
    );
    // The API keeps answering, and a second attempt fails the same way.
    assert_eq!(server.load("deadstub").status, 500);
    wait_for(
        "the second dead stub to be reaped",
        Duration::from_secs(10),
        || server.zombie_children().is_empty(),
    );
    let status = sigterm_and_exit(&mut server, Duration::from_secs(30));
    assert!(status.success(), "exit {status}:\n{}", server.log());
}

/// A load that hangs in `TRITONBACKEND_ModelInitialize`: the index (HTTP)
/// answers at once and shows it LOADING, a second load of it is refused
/// clearly, another model loads and serves meanwhile, and SIGTERM ends
/// the server within the exit timeout, naming the stuck load.
#[test]
fn hung_load_blocks_neither_the_repository_api_nor_other_loads_nor_sigterm() {
    let repo = Repo::new("hung-api");
    repo.lifecycle_model("hang", 600_000);
    repo.lifecycle_model("ok", 0);
    let mut server = Server::start(
        &repo,
        &[
            "--model-control-mode",
            "explicit",
            "--exit-timeout-secs",
            "2",
        ],
    );
    let http = server.http;
    // The hung load's request stays open; its connection ends with the
    // server.
    let hung = thread::spawn(move || {
        let _ = std::panic::catch_unwind(|| {
            post_json(http, "/v2/repository/models/hang/load", &json!({}))
        });
    });
    wait_for(
        "the hung model to show LOADING",
        Duration::from_secs(20),
        || server.row("hang").is_some_and(|r| r["state"] == "LOADING"),
    );
    let again = server.load("hang");
    assert_eq!(
        again.status,
        503,
        "{}",
        String::from_utf8_lossy(&again.body)
    );
    assert!(
        again.error().contains("already in progress"),
        "{}",
        again.error()
    );
    assert_eq!(server.load("ok").status, 200, "{}", server.log());
    let reply = infer_int4(http, "ok");
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(get(http, "/v2/models/ok/ready").status, 200);
    assert_ne!(get(http, "/v2/models/hang/ready").status, 200);
    // Unloading the other model is answered too, while the load hangs.
    let r = post_json(http, "/v2/repository/models/ok/unload", &json!({}));
    assert_eq!(r.status, 200);
    assert_eq!(
        server.row("hang").map(|r| r["state"].clone()),
        Some(json!("LOADING"))
    );
    let status = sigterm_and_exit(&mut server, Duration::from_secs(2));
    let log = server.log();
    assert_eq!(status.code(), Some(1), "exit {status}:\n{log}");
    assert!(
        log.contains("the load of model 'hang'"),
        "not named:\n{log}"
    );
    let _ = hung.join();
}

/// SIGTERM while a start-up load hangs: the other model is ready and
/// serves meanwhile (the server, still loading, is not), and the server
/// exits within the exit timeout with status 1, naming the model.
#[test]
fn sigterm_during_a_hung_start_up_load_exits_within_the_exit_timeout() {
    let repo = Repo::new("hung-start");
    repo.lifecycle_model("hang", 600_000);
    repo.lifecycle_model("ok", 0);
    let mut server = Server::start(&repo, &["--exit-timeout-secs", "2"]);
    let http = server.http;
    wait_for(
        "the other model to be ready",
        Duration::from_secs(30),
        || get(http, "/v2/models/ok/ready").status == 200,
    );
    assert_eq!(infer_int4(http, "ok").status, 200);
    assert_ne!(get(http, "/v2/health/ready").status, 200);
    assert_eq!(
        server.row("hang").map(|r| r["state"].clone()),
        Some(json!("LOADING"))
    );
    let status = sigterm_and_exit(&mut server, Duration::from_secs(2));
    let log = server.log();
    assert_eq!(status.code(), Some(1), "exit {status}:\n{log}");
    assert!(
        log.contains("the load of model 'hang'"),
        "not named:\n{log}"
    );
    assert!(log.contains("shutting down during start-up"), "{log}");
}
