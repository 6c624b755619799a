//! Start-up and readiness as tritonserver's: `exit_on_error`,
//! `strict_readiness`, parallel start-up loads (`model_load_thread_count`),
//! `model_load_retry_count`, `model_config_name`, explicit-mode ensembles
//! (composing models loaded with them, `unload_dependents`), and the
//! backend fields Triton fills in.

mod common;

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    thread,
    time::Duration,
};

use common::*;
use serde_json::{json, Value};
use shardserve::server::{self, ModelControlMode, ServerOptions};

fn simple_config(name: &str, extra: &str) -> String {
    format!(
        r#"name: "{name}"
backend: "simple"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }}, {{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }}, {{ name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }} ]
{extra}"#
    )
}

fn with_broken(tag: &str) -> TempRepo {
    TempRepo::new(
        tag,
        &[
            ("a", simple_config("a", "")),
            ("broken", "name: \"broken\" max_batch_size: [".to_string()),
        ],
    )
}

fn ready(addr: SocketAddr) -> u16 {
    get(addr, "/v2/health/ready").status
}

fn index(addr: SocketAddr) -> Vec<Value> {
    let r = post_json(addr, "/v2/repository/index", &json!({}));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json().as_array().cloned().unwrap()
}

fn state(addr: SocketAddr, name: &str) -> (Value, Value) {
    let rows = index(addr);
    let row = rows
        .iter()
        .find(|r| r["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("{name} not in the index: {rows:?}"));
    (row["state"].clone(), row["reason"].clone())
}

#[test]
fn exit_on_error_stops_the_start_and_names_the_failed_models() {
    let repo = with_broken("exit-on-error");
    let mut opts = ServerOptions::for_tests(&repo.root);
    opts.exit_on_error = true;
    let e = match server::start(opts) {
        Ok(_) => panic!("a broken model must stop the start under exit_on_error"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        e.contains("failed to load all models") && e.contains("broken") && !e.contains(" a,"),
        "{e}"
    );
    // The default is Triton's: on.
    assert!(ServerOptions::new(vec![]).exit_on_error);
}

#[test]
fn without_exit_on_error_the_rest_serves_and_strict_readiness_says_not_ready() {
    let repo = with_broken("strict-ready");
    let opts = ServerOptions::for_tests(&repo.root);
    assert!(!opts.exit_on_error && opts.strict_readiness);
    let server = start_with(opts);
    let addr = server.http_addr();
    assert_eq!(get(addr, "/v2/health/live").status, 200);
    assert_eq!(get(addr, "/v2/models/a/ready").status, 200);
    // Triton: live, serving `a`, but not ready while a model that should
    // be loaded is not.
    assert_eq!(ready(addr), 400, "Triton answers 400 when not ready");
    server.shutdown().unwrap();

    let mut opts = ServerOptions::for_tests(&repo.root);
    opts.strict_readiness = false;
    let server = start_with(opts);
    assert_eq!(ready(server.http_addr()), 200);
    server.shutdown().unwrap();
}

#[test]
fn an_unloaded_model_keeps_the_server_ready_a_failed_load_does_not() {
    let repo = TempRepo::new(
        "ready-unload",
        &[
            ("a", simple_config("a", "")),
            ("b", simple_config("b", "")),
            ("broken", "name: \"broken\" max_batch_size: [".to_string()),
        ],
    );
    let mut opts = ServerOptions::for_tests(&repo.root);
    opts.model_control_mode = ModelControlMode::Explicit;
    opts.load_models = vec!["a".into(), "b".into()];
    let server = start_with(opts);
    let addr = server.http_addr();
    assert_eq!(ready(addr), 200);
    let r = post_json(addr, "/v2/repository/models/b/unload", &json!({}));
    assert_eq!(r.status, 200);
    assert_eq!(ready(addr), 200, "unloaded on purpose: still ready");
    let r = post_json(addr, "/v2/repository/models/broken/load", &json!({}));
    assert_eq!(r.status, 500);
    assert_eq!(ready(addr), 400, "a failed load makes the server not ready");
    server.shutdown().unwrap();
}

/// Compiles `tests/capi_backends/lifecycle.c` into `dir`.
fn build_lifecycle_backend(dir: &Path) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-I"])
        .arg(root.join("include"))
        .arg(root.join("tests/capi_backends/lifecycle.c"))
        .arg("-o")
        .arg(dir.join("libtriton_capi_lifecycle.so"))
        .arg("-lpthread")
        .status()
        .expect("run cc (scripts/setup.sh installs gcc)");
    assert!(status.success(), "compiling lifecycle.c failed");
}

fn slow_model(name: &str, initialize_sleep_ms: u64) -> String {
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

/// The most load threads (`load-<model>`) seen at once in this process
/// while the server starts with `threads` load threads.
fn most_loads_at_once(tag: &str, threads: usize) -> usize {
    let names: Vec<String> = (0..4).map(|i| format!("slow{i}")).collect();
    let models: Vec<(&str, String)> = names
        .iter()
        .map(|n| (n.as_str(), slow_model(n, 400)))
        .collect();
    let repo = TempRepo::new(tag, &models);
    for n in &names {
        build_lifecycle_backend(&repo.root.join(n));
    }
    let done = Arc::new(AtomicBool::new(false));
    let most = Arc::new(AtomicUsize::new(0));
    let watcher = {
        let (done, most) = (done.clone(), most.clone());
        let names: BTreeSet<String> = names.iter().map(|n| format!("load-{n}")).collect();
        thread::spawn(move || {
            // A load thread that has reported its outcome may still be
            // exiting when the next one starts: count only what held for
            // 50 ms or more (each load takes 400 ms): the least seen in a window.
            let window = Duration::from_millis(100);
            let mut seen: std::collections::VecDeque<(std::time::Instant, usize)> =
                Default::default();
            while !done.load(Ordering::Acquire) {
                let now = std::fs::read_dir("/proc/self/task")
                    .unwrap()
                    .flatten()
                    .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
                    .filter(|c| names.contains(c.trim()))
                    .count();
                let at = std::time::Instant::now();
                seen.push_back((at, now));
                while seen
                    .front()
                    .is_some_and(|(t, _)| at.duration_since(*t) > window)
                {
                    seen.pop_front();
                }
                if seen
                    .front()
                    .is_some_and(|(t, _)| at.duration_since(*t) >= window / 2)
                {
                    let held = seen.iter().map(|(_, c)| *c).min().unwrap_or(0);
                    most.fetch_max(held, Ordering::AcqRel);
                }
                thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let mut opts = ServerOptions::for_tests(&repo.root);
    opts.model_load_thread_count = threads;
    let server = start_with(opts);
    done.store(true, Ordering::Release);
    watcher.join().unwrap();
    for n in &names {
        assert_eq!(
            get(server.http_addr(), &format!("/v2/models/{n}/ready")).status,
            200
        );
    }
    assert_eq!(ready(server.http_addr()), 200);
    server.shutdown().unwrap();
    most.load(Ordering::Acquire)
}

#[test]
fn start_up_loads_run_on_at_most_model_load_thread_count_threads() {
    assert_eq!(most_loads_at_once("threads-1", 1), 1);
    let four = most_loads_at_once("threads-4", 4);
    assert!(four >= 2, "four load threads ran {four} loads at once");
    assert_eq!(ServerOptions::new(vec![]).model_load_thread_count, 4);
}

fn python_backend_installed() -> bool {
    let backend = repo_path(".backends/python/libtriton_python.so");
    if backend.exists() {
        return true;
    }
    eprintln!("SKIPPED: Triton's Python backend is not installed; scripts/setup.sh installs it");
    false
}

/// A Python model whose `initialize` fails until it has run `fail_times`
/// times (counted in a file beside the model).
fn flaky_python_repo(tag: &str, fail_times: usize) -> (TempRepo, PathBuf) {
    let config = r#"name: "flaky"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_INT32, dims: [ 4 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_INT32, dims: [ 4 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"#;
    let repo = TempRepo::new(tag, &[("flaky", config.to_string())]);
    let counter = repo.root.join("attempts");
    let model = format!(
        r#"import triton_python_backend_utils as pb_utils
class TritonPythonModel:
    def initialize(self, args):
        with open({counter:?}, "a") as f:
            f.write("x")
        with open({counter:?}) as f:
            attempts = len(f.read())
        if attempts <= {fail_times}:
            raise pb_utils.TritonModelException("attempt %d fails" % attempts)
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
"#
    );
    std::fs::write(repo.root.join("flaky/1/model.py"), model).unwrap();
    (repo, counter)
}

#[test]
fn a_failed_load_is_retried_model_load_retry_count_times() {
    if !python_backend_installed() {
        return;
    }
    // Fails twice: two retries bring it up.
    let (repo, counter) = flaky_python_repo("retry-2", 2);
    let mut opts = ServerOptions::for_tests(&repo.root);
    opts.model_load_retry_count = 2;
    let server = start_with(opts);
    assert_eq!(
        get(server.http_addr(), "/v2/models/flaky/ready").status,
        200
    );
    assert_eq!(std::fs::read_to_string(&counter).unwrap(), "xxx");
    server.shutdown().unwrap();

    // No retry (the default): one attempt, failed.
    let (repo, counter) = flaky_python_repo("retry-0", 2);
    let server = start_with(ServerOptions::for_tests(&repo.root));
    assert_eq!(
        get(server.http_addr(), "/v2/models/flaky/ready").status,
        400
    );
    assert_eq!(std::fs::read_to_string(&counter).unwrap(), "x");
    server.shutdown().unwrap();
}

#[test]
fn model_config_name_picks_the_custom_configuration_where_present() {
    let repo = TempRepo::new(
        "config-name",
        &[("a", simple_config("a", "")), ("b", simple_config("b", ""))],
    );
    std::fs::create_dir_all(repo.root.join("a/configs")).unwrap();
    std::fs::write(
        repo.root.join("a/configs/h100.pbtxt"),
        simple_config("a", "").replace("max_batch_size: 8", "max_batch_size: 4"),
    )
    .unwrap();
    let mut opts = ServerOptions::for_tests(&repo.root);
    opts.model_config_name = Some("h100".into());
    let server = start_with(opts);
    let addr = server.http_addr();
    assert_eq!(get(addr, "/v2/models/a/config").json()["max_batch_size"], 4);
    // No configs/h100.pbtxt: config.pbtxt.
    assert_eq!(get(addr, "/v2/models/b/config").json()["max_batch_size"], 8);
    server.shutdown().unwrap();
}

#[test]
fn load_model_of_an_ensemble_brings_its_composing_models_and_unload_dependents_takes_them() {
    let mut opts = ServerOptions::for_tests(repo_path("models"));
    opts.model_control_mode = ModelControlMode::Explicit;
    opts.load_models = vec!["simple_ensemble".into()];
    let server = start_with(opts);
    let addr = server.http_addr();
    let infer = |model: &str| {
        post_json(
            addr,
            &format!("/v2/models/{model}/infer"),
            &simple_json_request(1),
        )
        .status
    };
    assert_eq!(infer("simple_ensemble"), 200);
    assert_eq!(infer("simple"), 200);
    assert_eq!(ready(addr), 200);

    // Unloaded with its dependents: the composing model it brought goes too.
    let r = post_json(
        addr,
        "/v2/repository/models/simple_ensemble/unload",
        &json!({"parameters": {"unload_dependents": true}}),
    );
    assert_eq!(r.status, 200);
    assert_eq!(state(addr, "simple").0, "UNAVAILABLE");
    assert_eq!(state(addr, "simple_ensemble").0, "UNAVAILABLE");

    // Loaded through the API: the composing model comes back with it.
    let r = post_json(
        addr,
        "/v2/repository/models/simple_ensemble/load",
        &json!({}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(infer("simple_ensemble"), 200);
    // Unloaded without the flag: the composing model stays.
    let r = post_json(
        addr,
        "/v2/repository/models/simple_ensemble/unload",
        &json!({}),
    );
    assert_eq!(r.status, 200);
    assert_eq!(state(addr, "simple").0, "READY");
    assert_eq!(infer("simple"), 200);

    // A composing model loaded by name is not taken by its ensemble.
    assert_eq!(
        post_json(
            addr,
            "/v2/repository/models/simple_ensemble/load",
            &json!({})
        )
        .status,
        200
    );
    assert_eq!(
        post_json(addr, "/v2/repository/models/simple/load", &json!({})).status,
        200
    );
    let r = post_json(
        addr,
        "/v2/repository/models/simple_ensemble/unload",
        &json!({"parameters": {"unload_dependents": true}}),
    );
    assert_eq!(r.status, 200);
    assert_eq!(state(addr, "simple").0, "READY");
    server.shutdown().unwrap();
}

#[test]
fn cloud_repositories_are_refused_by_name() {
    for path in [
        "s3://bucket/models",
        "gs://bucket/models",
        "as://acct/c/models",
    ] {
        let e = match server::start(ServerOptions::for_tests(path)) {
            Ok(_) => panic!("{path} must be refused"),
            Err(e) => format!("{e:#}"),
        };
        assert!(
            e.contains("cloud storage repositories")
                && e.contains("not supported by shardserve; use a local path"),
            "{e}"
        );
    }
}

#[test]
fn backend_fields_are_filled_as_triton_does() {
    let repo = TempRepo::new(
        "backend-fields",
        &[
            (
                "trt",
                "platform: \"tensorrt_plan\"\nmax_batch_size: 0".to_string(),
            ),
            ("onnx", "max_batch_size: 0".to_string()),
        ],
    );
    std::fs::copy(
        repo_path("models/simple_onnx/1/model.onnx"),
        repo.root.join("onnx/1/model.onnx"),
    )
    .unwrap();
    let server = start_with(ServerOptions::for_tests(&repo.root));
    let addr = server.http_addr();
    // tensorrt_plan is served by the `tensorrt` backend's library.
    let (s, reason) = state(addr, "trt");
    assert_eq!(s, "UNAVAILABLE");
    assert!(
        reason.as_str().unwrap().contains("libtriton_tensorrt.so"),
        "{reason}"
    );
    // A config naming neither: found from the file, both filled.
    let config = get(addr, "/v2/models/onnx/config").json();
    assert_eq!(config["backend"], "onnxruntime", "{config}");
    assert_eq!(config["platform"], "onnxruntime_onnx");
    assert_eq!(config["default_model_filename"], "model.onnx");
    assert_eq!(
        config["optimization"]["input_pinned_memory"],
        json!({"enable": true})
    );
    assert_eq!(
        config["optimization"]["output_pinned_memory"],
        json!({"enable": true})
    );
    server.shutdown().unwrap();
}
