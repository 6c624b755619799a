//! Teardown at exit, as Triton's: on SIGTERM, after the requests finish,
//! every model instance is finalized on the compute thread that ran its
//! executions, then each model, then each backend
//! (`TRITONBACKEND_Finalize`, then the library is unloaded); the process
//! then exits 0. A finalizer that hangs past `--exit-timeout-secs` makes
//! the process exit 1, naming it. A model unloaded through the repository
//! API is finalized the same way. The backend is `tests/capi_backends/
//! lifecycle.c`, which appends one line per call to a file.

mod common;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use common::{
    child::{cpu_seconds, ChildServer},
    post_json, wait_for, TempRepo,
};
use serde_json::json;

/// Compiles `tests/capi_backends/lifecycle.c` into
/// `<dir>/capi_lifecycle/libtriton_capi_lifecycle.so`.
fn build_backend(dir: &Path) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out_dir = dir.join("capi_lifecycle");
    std::fs::create_dir_all(&out_dir).expect("backend dir");
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-I"])
        .arg(root.join("include"))
        .arg(root.join("tests/capi_backends/lifecycle.c"))
        .arg("-o")
        .arg(out_dir.join("libtriton_capi_lifecycle.so"))
        .arg("-lpthread")
        .status()
        .expect("run cc (scripts/setup.sh installs gcc)");
    assert!(status.success(), "compiling lifecycle.c failed");
}

fn config(name: &str, instances: u32, log: &Path, extra_parameters: &str) -> String {
    format!(
        r#"name: "{name}"
backend: "capi_lifecycle"
max_batch_size: 0
input [ {{ name: "INPUT0", data_type: TYPE_INT32, dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_INT32, dims: [ 4 ] }} ]
instance_group [ {{ count: {instances}, kind: KIND_CPU }} ]
parameters {{ key: "lifecycle_log" value: {{ string_value: "{}" }} }}
{extra_parameters}
"#,
        log.display()
    )
}

/// A repository of lifecycle models and a backend directory, under one
/// temporary folder (removed on drop).
struct Setup {
    repo: TempRepo,
    backends: PathBuf,
    log: PathBuf,
}

impl Setup {
    fn new(tag: &str, models: &[(&str, u32, &str)]) -> Self {
        let base =
            std::env::temp_dir().join(format!("shardserve-teardown-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).expect("temp dir");
        let backends = base.join("backends");
        build_backend(&backends);
        let log = base.join("lifecycle.log");
        let configs: Vec<(&str, String)> = models
            .iter()
            .map(|(name, n, extra)| (*name, config(name, *n, &log, extra)))
            .collect();
        let repo = TempRepo::new(&format!("teardown-{tag}-repo"), &configs);
        Self {
            repo,
            backends,
            log,
        }
    }

    fn start(&self, tag: &str, args: &[&str]) -> ChildServer {
        let mut all = vec![
            "--backend-directory",
            self.backends.to_str().expect("utf-8"),
        ];
        all.extend_from_slice(args);
        ChildServer::spawn_in(tag, &self.repo.root, 1, None, &all)
    }

    fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        if let Some(base) = self.log.parent() {
            let _ = std::fs::remove_dir_all(base);
        }
    }
}

fn infer(server: &ChildServer, model: &str) {
    let body = json!({
        "inputs": [{ "name": "INPUT0", "datatype": "INT32", "shape": [4], "data": [1, 2, 3, 4] }]
    });
    let reply = post_json(server.http, &format!("/v2/models/{model}/infer"), &body);
    assert_eq!(reply.status, 200, "infer {model}: {}", reply.error());
}

/// The thread ids of `what` lines (`<what> <instance> <tid>`), by instance.
fn threads_of(lines: &[String], what: &str) -> HashMap<String, Vec<String>> {
    let mut by_instance: HashMap<String, Vec<String>> = HashMap::new();
    for l in lines {
        let parts: Vec<&str> = l.split_whitespace().collect();
        if parts.len() == 3 && parts[0] == what {
            by_instance
                .entry(parts[1].to_owned())
                .or_default()
                .push(parts[2].to_owned());
        }
    }
    by_instance
}

fn position(lines: &[String], line: &str) -> usize {
    lines
        .iter()
        .position(|l| l == line)
        .unwrap_or_else(|| panic!("no line {line:?} in:\n{}", lines.join("\n")))
}

/// Every instance executed and was finalized once, on the thread that ran
/// its executions; each model's finalizer after its instances'.
fn assert_instances_finalized(lines: &[String], models: &[(&str, u32)]) {
    let executes = threads_of(lines, "execute");
    let finalizes = threads_of(lines, "instance_finalize");
    for (model, count) in models {
        let model_finalize = position(lines, &format!("model_finalize {model}"));
        for i in 0..*count {
            let instance = format!("{model}_{i}");
            let fin = finalizes
                .get(&instance)
                .unwrap_or_else(|| panic!("{instance} not finalized:\n{}", lines.join("\n")));
            assert_eq!(fin.len(), 1, "{instance} finalized {} times", fin.len());
            let at = position(lines, &format!("instance_finalize {instance} {}", fin[0]));
            assert!(at < model_finalize, "{instance} finalized after its model");
            if let Some(ran) = executes.get(&instance) {
                assert!(
                    ran.iter().all(|t| *t == fin[0]),
                    "{instance} executed on threads {ran:?} but was finalized on {}",
                    fin[0]
                );
            }
        }
    }
}

#[test]
fn sigterm_finalizes_instances_models_then_backend_and_exits_zero() {
    let setup = Setup::new("order", &[("lc_a", 2, ""), ("lc_b", 1, "")]);
    let mut server = setup.start("teardown-order", &["--exit-timeout-secs", "20"]);
    // Enough requests that both of lc_a's instances execute.
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let http = server.http;
            std::thread::spawn(move || {
                let body = json!({
                    "inputs": [{ "name": "INPUT0", "datatype": "INT32", "shape": [4], "data": [1, 2, 3, 4] }]
                });
                for _ in 0..10 {
                    assert_eq!(post_json(http, "/v2/models/lc_a/infer", &body).status, 200);
                }
            })
        })
        .collect();
    for c in clients {
        c.join().expect("client");
    }
    infer(&server, "lc_b");
    assert!(
        !setup.lines().iter().any(|l| l.contains("finalize")),
        "a finalizer ran before shutdown:\n{}",
        setup.lines().join("\n")
    );
    let t0 = Instant::now();
    server.signal(libc::SIGTERM);
    let status = server
        .wait_exit(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("no exit 30 s after SIGTERM:\n{}", server.log()));
    let took = t0.elapsed();
    assert!(status.success(), "exit status {status}:\n{}", server.log());
    let lines = setup.lines();
    assert_instances_finalized(&lines, &[("lc_a", 2), ("lc_b", 1)]);
    let backend = position(&lines, "backend_finalize");
    assert_eq!(
        backend,
        lines.len() - 1,
        "backend_finalize is not the last line:\n{}",
        lines.join("\n")
    );
    assert_eq!(lines.iter().filter(|l| *l == "backend_finalize").count(), 1);
    // Generous: guards against waiting out the 20 s exit timeout.
    assert!(took < Duration::from_secs(10), "exit took {took:?}");
    eprintln!(
        "teardown: exit 0 {took:?} after SIGTERM; lines:\n{}",
        lines.join("\n")
    );
}

#[test]
fn unload_finalizes_the_instances_on_their_workers() {
    let setup = Setup::new("unload", &[("lc_u", 2, ""), ("lc_keep", 1, "")]);
    let mut server = setup.start(
        "teardown-unload",
        &[
            "--model-control-mode",
            "explicit",
            "--load-model",
            "lc_u",
            "--load-model",
            "lc_keep",
        ],
    );
    for _ in 0..6 {
        infer(&server, "lc_u");
    }
    infer(&server, "lc_keep");
    let reply = post_json(server.http, "/v2/repository/models/lc_u/unload", &json!({}));
    assert_eq!(reply.status, 200, "unload: {}", reply.error());
    wait_for("lc_u's finalizers", Duration::from_secs(10), || {
        setup.lines().iter().any(|l| l == "model_finalize lc_u")
    });
    let lines = setup.lines();
    assert_instances_finalized(&lines, &[("lc_u", 2)]);
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("lc_keep") && l.contains("finalize") || l == "backend_finalize"),
        "more than lc_u was finalized:\n{}",
        lines.join("\n")
    );
    server.signal(libc::SIGTERM);
    let status = server
        .wait_exit(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("no exit 30 s after SIGTERM:\n{}", server.log()));
    assert!(status.success(), "exit status {status}:\n{}", server.log());
    let lines = setup.lines();
    assert_instances_finalized(&lines, &[("lc_keep", 1)]);
    assert_eq!(lines.last().map(String::as_str), Some("backend_finalize"));
}

#[test]
fn unloading_during_a_long_execution_waits_for_it_without_spinning() {
    let setup = Setup::new(
        "unload-busy",
        &[(
            "lc_busy",
            1,
            r#"parameters { key: "execute_sleep_ms" value: { string_value: "2500" } }"#,
        )],
    );
    let mut server = setup.start(
        "teardown-unload-busy",
        &[
            "--model-control-mode",
            "explicit",
            "--load-model",
            "lc_busy",
        ],
    );
    let http = server.http;
    let answer = std::thread::spawn(move || {
        let body = json!({
            "inputs": [{ "name": "INPUT0", "datatype": "INT32", "shape": [4], "data": [1, 2, 3, 4] }]
        });
        post_json(http, "/v2/models/lc_busy/infer", &body).status
    });
    wait_for("the execution to start", Duration::from_secs(10), || {
        setup
            .lines()
            .iter()
            .any(|l| l.starts_with("execute lc_busy_0"))
    });
    let unload = std::thread::spawn(move || {
        post_json(http, "/v2/repository/models/lc_busy/unload", &json!({})).status
    });
    // The stopped scheduler now waits for its busy instance: it used to
    // return from every wait at once and spin the shard until the
    // execution ended.
    std::thread::sleep(Duration::from_millis(200));
    let before = cpu_seconds(server.pid());
    std::thread::sleep(Duration::from_secs(1));
    let cpu = cpu_seconds(server.pid()) - before;
    println!("server CPU while an unloaded model's execution runs on: {cpu:.3} s in 1 s");
    assert!(cpu < 0.3, "the shard spins: {cpu:.3} s of CPU in 1 s");
    assert_eq!(
        answer.join().expect("infer thread"),
        200,
        "the execution in flight finishes"
    );
    assert_eq!(unload.join().expect("unload thread"), 200);
    wait_for("lc_busy's finalizers", Duration::from_secs(10), || {
        setup.lines().iter().any(|l| l == "model_finalize lc_busy")
    });
    server.signal(libc::SIGTERM);
    let status = server
        .wait_exit(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("no exit 30 s after SIGTERM:\n{}", server.log()));
    assert!(status.success(), "exit status {status}:\n{}", server.log());
}

#[test]
fn a_finalizer_hanging_past_the_exit_timeout_exits_one_naming_it() {
    let setup = Setup::new(
        "hang",
        &[(
            "lc_hang",
            1,
            r#"parameters { key: "finalize_sleep_ms" value: { string_value: "60000" } }"#,
        )],
    );
    let mut server = setup.start("teardown-hang", &["--exit-timeout-secs", "2"]);
    infer(&server, "lc_hang");
    let t0 = Instant::now();
    server.signal(libc::SIGTERM);
    // Bound: the 2 s exit timeout plus slack, far below the 60 s sleep.
    let status = server
        .wait_exit(Duration::from_secs(20))
        .unwrap_or_else(|| panic!("no exit 20 s after SIGTERM:\n{}", server.log()));
    let took = t0.elapsed();
    let log = server.log();
    assert_eq!(status.code(), Some(1), "exit status {status}:\n{log}");
    assert!(
        log.contains("TRITONBACKEND_ModelInstanceFinalize (instance 'lc_hang_0')"),
        "the hanging finalizer is not named:\n{log}"
    );
    let lines = setup.lines();
    assert!(
        !lines
            .iter()
            .any(|l| l.starts_with("instance_finalize") || l == "backend_finalize"),
        "finalizers completed although one hangs:\n{}",
        lines.join("\n")
    );
    eprintln!("hanging finalizer: exit 1 after {took:?} (exit timeout 2 s)");
}

#[test]
fn an_execution_running_past_the_exit_timeout_exits_one_naming_the_model() {
    let setup = Setup::new(
        "slow",
        &[(
            "lc_slow",
            1,
            r#"parameters { key: "execute_sleep_ms" value: { string_value: "60000" } }"#,
        )],
    );
    let mut server = setup.start("teardown-slow", &["--exit-timeout-secs", "2"]);
    let http = server.http;
    // Its answer never comes: the process exits under it.
    std::thread::spawn(move || {
        let body = json!({
            "inputs": [{ "name": "INPUT0", "datatype": "INT32", "shape": [4], "data": [1, 2, 3, 4] }]
        });
        let _ = std::panic::catch_unwind(|| post_json(http, "/v2/models/lc_slow/infer", &body));
    });
    wait_for("the execution to start", Duration::from_secs(10), || {
        setup
            .lines()
            .iter()
            .any(|l| l.starts_with("execute lc_slow_0"))
    });
    server.signal(libc::SIGTERM);
    let status = server
        .wait_exit(Duration::from_secs(20))
        .unwrap_or_else(|| panic!("no exit 20 s after SIGTERM:\n{}", server.log()));
    let log = server.log();
    assert_eq!(status.code(), Some(1), "exit status {status}:\n{log}");
    assert!(
        log.contains("model 'lc_slow' was still executing"),
        "the model is not named:\n{log}"
    );
}

const FINALIZING_MODEL_PY: &str = r#"import json
import pathlib

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.marker = config["parameters"]["finalize_marker"]["string_value"]

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

    def finalize(self):
        pathlib.Path(self.marker).write_text("finalized\n")
"#;

/// Triton's own Python backend: the model's `finalize()` runs at SIGTERM
/// (it is called from the backend's `TRITONBACKEND_ModelInstanceFinalize`).
#[test]
fn python_model_finalize_runs_at_sigterm() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let backend = root.join(".backends/python/libtriton_python.so");
    if !backend.exists() {
        eprintln!(
            "SKIPPED: Triton's Python backend is not installed ({}); scripts/setup.sh installs it",
            backend.display()
        );
        return;
    }
    let marker_dir =
        std::env::temp_dir().join(format!("shardserve-teardown-py-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&marker_dir);
    std::fs::create_dir_all(&marker_dir).expect("marker dir");
    let marker = marker_dir.join("finalized");
    let config = format!(
        r#"name: "py_final"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0", data_type: TYPE_INT32, dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_INT32, dims: [ 4 ] }} ]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
parameters {{ key: "finalize_marker" value: {{ string_value: "{}" }} }}
"#,
        marker.display()
    );
    let repo = TempRepo::new("teardown-py-repo", &[("py_final", config)]);
    std::fs::write(repo.root.join("py_final/1/model.py"), FINALIZING_MODEL_PY).expect("model.py");
    let mut server = ChildServer::spawn_in(
        "teardown-py",
        &repo.root,
        1,
        None,
        &["--exit-timeout-secs", "30"],
    );
    infer(&server, "py_final");
    assert!(!marker.exists(), "finalize() ran before shutdown");
    server.signal(libc::SIGTERM);
    let status = server
        .wait_exit(Duration::from_secs(45))
        .unwrap_or_else(|| panic!("no exit 45 s after SIGTERM:\n{}", server.log()));
    let log = server.log();
    let finalized = std::fs::read_to_string(&marker);
    let _ = std::fs::remove_dir_all(&marker_dir);
    assert!(status.success(), "exit status {status}:\n{log}");
    assert_eq!(
        finalized.ok().as_deref(),
        Some("finalized\n"),
        "the model's finalize() did not run:\n{log}"
    );
}
