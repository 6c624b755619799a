//! shardserve-bench's `--shared-memory` against the project's server
//! in-process: requests go through registered regions over HTTP and gRPC,
//! in the closed and the open loop, the server counts them, and afterwards
//! nothing stays registered on the server or in /dev/shm; an undersized
//! output region fails with the server's reason; `cuda` without a GPU
//! fails clearly; SIGINT mid-run cleans up too.
//!
//! The server's shm registry is one per process, so these tests take a
//! lock: each one's "nothing registered" check must not see another's
//! regions.

mod common;

use std::{
    net::SocketAddr,
    process::{Command, Stdio},
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use clap::Parser;
use shardserve::{
    bench::{self, cli::Options, measure::StepResult},
    server::ServerHandle,
};

const BIN: &str = env!("CARGO_BIN_EXE_shardserve-bench");

/// A server on a repository of `simple` and `simple_string` only (built-in
/// backends: quick to load and to tear down on a loaded machine).
fn start() -> (ServerHandle, common::TempRepo) {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let config = |m: &str| {
        std::fs::read_to_string(common::repo_path(&format!("models/{m}/config.pbtxt")))
            .expect("example config")
    };
    let repo = common::TempRepo::new(
        &format!("bench-shm-{n}"),
        &[
            ("simple", config("simple")),
            ("simple_string", config("simple_string")),
        ],
    );
    let mut opts = shardserve::server::ServerOptions::for_tests(repo.root.clone());
    opts.cores = Some(1);
    // Shutdown waits for the bench's connections to close; on a loaded CI
    // box the default 5 s test exit timeout was once too short for that.
    opts.exit_timeout = std::time::Duration::from_secs(30);
    (common::start_with(opts), repo)
}

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn success_count(http: SocketAddr, model: &str) -> u64 {
    let stats = common::get(http, &format!("/v2/models/{model}/stats")).json();
    stats["model_stats"]
        .as_array()
        .expect("model_stats")
        .iter()
        .map(|m| {
            m["inference_stats"]["success"]["count"]
                .as_u64()
                .unwrap_or(0)
        })
        .sum()
}

/// This process's shm objects the bench made and left behind.
fn leftovers(pid: u32) -> Vec<String> {
    let prefix = format!("ssbench_{pid}_");
    std::fs::read_dir("/dev/shm")
        .expect("/dev/shm lists")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

/// Nothing registered (system and CUDA) on the server and nothing in
/// /dev/shm of bench process `pid`.
fn assert_clean(http: SocketAddr, pid: u32) {
    for kind in ["system", "cuda"] {
        let status = common::get(http, &format!("/v2/{kind}sharedmemory/status")).json();
        assert_eq!(
            status,
            serde_json::json!([]),
            "{kind} regions left registered"
        );
    }
    assert_eq!(leftovers(pid), Vec::<String>::new(), "shm objects left");
}

/// Runs the bench in this process on `model` with `--shared-memory system`
/// and `extra`; checks every step served requests the server counted, and
/// that the run cleaned up after itself.
fn shm_run(server: &ServerHandle, model: &str, extra: &[&str]) -> Vec<StepResult> {
    let http = server.http_addr();
    let before = success_count(http, model);
    let mut a = vec!["-m", model, "--shared-memory", "system"];
    a.extend_from_slice(extra);
    let opts = Options::try_parse_from(common::bench_args(&a)).expect("arguments parse");
    let results = bench::run(&opts).expect("bench runs").results;
    assert!(!results.is_empty());
    for r in &results {
        assert!(r.requests > 0, "no request completed: {r:?}");
        assert_eq!(r.errors, 0, "{:?}", r.first_error);
        let s = r.server.as_ref().expect("server statistics");
        assert!(s.requests > 0, "{s:?}");
    }
    let measured: u64 = results.iter().map(|r| r.requests).sum();
    assert!(
        success_count(http, model) - before >= measured,
        "the server counted fewer requests than the bench measured"
    );
    assert_clean(http, std::process::id());
    results
}

#[test]
fn system_shared_memory_over_http_and_grpc() {
    let _serial = serial();
    let (server, _repo) = start();
    let http = server.http_addr().to_string();
    let grpc = server.grpc_addr().to_string();
    let r = shm_run(
        &server,
        "simple",
        &["-u", &http, "--concurrency-range", "1,4"],
    );
    assert_eq!(r.len(), 2);
    // simple's outputs have a fixed size: their regions hold a whole batch
    // whatever --output-shared-memory-size says.
    shm_run(
        &server,
        "simple",
        &["-u", &http, "-b", "8", "--output-shared-memory-size", "4"],
    );
    // BYTES outputs get --output-shared-memory-size (default 100 KiB).
    shm_run(
        &server,
        "simple_string",
        &["-u", &http, "--string-data", "7"],
    );
    shm_run(
        &server,
        "simple",
        &["-i", "grpc", "-u", &grpc, "--concurrency-range", "2"],
    );
    shm_run(
        &server,
        "simple",
        &["-i", "grpc", "-u", &grpc, "--streaming", "-b", "2"],
    );
    // Open loop, both protocols as two targets (each registers its own
    // regions), zero inputs.
    let r = shm_run(
        &server,
        "simple",
        &[
            "--target",
            &format!("{http},http"),
            "--target",
            &format!("{grpc},grpc"),
            "--request-rate-range",
            "200",
            "--input-data",
            "zero",
        ],
    );
    assert_eq!(r.len(), 2);
    assert!(r.iter().all(|s| s.mode == "request_rate"));
    // An input-data file of two entries: a region per input per entry.
    let data = std::env::temp_dir().join(format!("ssbench_shm_data_{}.json", std::process::id()));
    let entry = |v: i32| serde_json::json!({"INPUT0": vec![v; 16], "INPUT1": vec![1; 16]});
    std::fs::write(
        &data,
        serde_json::json!({"data": [entry(3), entry(7)]}).to_string(),
    )
    .expect("write data");
    shm_run(
        &server,
        "simple",
        &[
            "-u",
            &http,
            "--input-data",
            data.to_str().expect("utf-8 path"),
        ],
    );
    let _ = std::fs::remove_file(&data);
    server.shutdown().expect("server stops");
}

/// The bench binary against `server`: exit code and stderr.
fn run_bin(extra: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(BIN)
        .args(["-p", "150", "--max-trials", "3", "--warmup", "50"])
        .args(["--no-progress", "-m", "simple"])
        .args(extra)
        .output()
        .expect("the bench binary runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn an_undersized_output_region_fails_with_the_servers_reason() {
    let _serial = serial();
    let (server, _repo) = start();
    let http = server.http_addr();
    for (proto, addr) in [("http", http), ("grpc", server.grpc_addr())] {
        // BYTES outputs: the flag sizes their regions (fixed-size outputs
        // get their exact size, as perf_analyzer gives them).
        let child = Command::new(BIN)
            .args(["-p", "150", "--max-trials", "3", "--warmup", "50"])
            .args(["--no-progress", "-m", "simple_string", "-i", proto])
            .args(["-u", &addr.to_string(), "--shared-memory", "system"])
            .args(["--string-data", "7", "--output-shared-memory-size", "4"])
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("the bench binary starts");
        let pid = child.id();
        let out = child.wait_with_output().expect("the bench ends");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{proto}: {err}");
        // 16 strings "7": 16 × (4-byte length + 1) = 80 bytes at least.
        assert!(
            err.contains("failed; first error:")
                && err.contains("'OUTPUT")
                && err.contains("(4 bytes) should be at least"),
            "{proto}: {err}"
        );
        assert_clean(http, pid);
    }
    server.shutdown().expect("server stops");
}

#[test]
fn cuda_shared_memory_without_a_gpu_fails_clearly() {
    let _serial = serial();
    let (server, _repo) = start();
    let http = server.http_addr();
    let (code, err) = run_bin(&["-u", &http.to_string(), "--shared-memory", "cuda"]);
    let gpu = std::path::Path::new("/dev/nvidia0").exists();
    if gpu {
        // A GPU box: the run must work (the server opens the handles).
        assert_eq!(code, Some(0), "{err}");
    } else {
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("no CUDA device: "), "{err}");
    }
    assert_clean(http, std::process::id());
    // Bad flag values are usage errors.
    let (code, err) = run_bin(&[
        "-u",
        &http.to_string(),
        "--shared-memory",
        "system",
        "--output-shared-memory-size",
        "0",
    ]);
    assert_eq!(code, Some(2), "{err}");
    let (code, err) = run_bin(&["--shared-memory", "tmpfs"]);
    assert_eq!(code, Some(2), "{err}");
    server.shutdown().expect("server stops");
}

#[test]
fn sigint_mid_run_unregisters_and_unlinks() {
    let _serial = serial();
    let (server, _repo) = start();
    let http = server.http_addr();
    for (proto, addr) in [("http", http), ("grpc", server.grpc_addr())] {
        let child = Command::new(BIN)
            .args(["-p", "60000", "--max-trials", "100", "-q", "--no-progress"])
            .args(["-m", "simple", "-i", proto, "-u", &addr.to_string()])
            .args(["--shared-memory", "system", "--concurrency-range", "2"])
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("the bench binary starts");
        let pid = child.id();
        common::wait_for("the bench's regions", Duration::from_secs(30), || {
            let status = common::get(http, "/v2/systemsharedmemory/status").json();
            status.as_array().is_some_and(|a| a.len() == 4)
        });
        assert_eq!(leftovers(pid).len(), 4);
        // SAFETY: signals the child this test started and still owns.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGINT) }, 0);
        let out = child.wait_with_output().expect("the bench ends");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(130), "{proto}: {err}");
        assert!(err.contains("unregistered and removed 4"), "{err}");
        assert_clean(http, pid);
    }
    server.shutdown().expect("server stops");
}
