//! The real binary under two minutes of load at concurrency 64 (`simple`
//! at 48 over HTTP JSON, `mlp_onnx` at 16 over HTTP binary, driven by
//! `shardserve-bench`): its RSS at the end must be within 10% of its level
//! after a 20-second warm-up, with no request failing. A leak of a few
//! bytes per request (about 2.5 million of them here on this 2-core box)
//! shows up well above that bound. Bounded in time: about 2 minutes.

mod common;

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use common::child::ChildServer;

const LOAD: Duration = Duration::from_secs(120);
const WARM_UP: Duration = Duration::from_secs(20);

fn bench(server: &ChildServer, model: &str, concurrency: u32, json: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_shardserve-bench"))
        .args(["-m", model, "-u", &server.http.to_string(), "-i", "http"])
        .args(["--concurrency-range", &concurrency.to_string()])
        .args(["-p", &LOAD.as_millis().to_string(), "--max-trials", "1"])
        .args(["--warmup", "0", "--json", &json.to_string_lossy()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start shardserve-bench")
}

/// (requests/s, errors) of the bench's only measurement window.
fn outcome(json: &Path) -> (f64, u64) {
    let text = std::fs::read_to_string(json).expect("bench JSON report");
    let report: serde_json::Value = serde_json::from_str(&text).expect("bench JSON");
    let step = &report["steps"][0];
    (
        step["throughput"].as_f64().expect("throughput"),
        step["errors"].as_u64().expect("errors"),
    )
}

#[test]
fn two_minute_soak_keeps_rss_within_ten_percent_of_its_warm_level() {
    let server = ChildServer::spawn("soak", None, &[]);
    let dir = std::env::temp_dir().join(format!("shardserve-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (simple_json, mlp_json) = (dir.join("simple.json"), dir.join("mlp.json"));
    let idle = server.rss_bytes();
    let started = Instant::now();
    let mut loads = [
        bench(&server, "simple", 48, &simple_json),
        bench(&server, "mlp_onnx", 16, &mlp_json),
    ];

    let mut warm = None;
    let mut peak = 0;
    let mut last = 0;
    while loads
        .iter_mut()
        .any(|l| l.try_wait().expect("poll bench").is_none())
    {
        std::thread::sleep(Duration::from_secs(2));
        last = server.rss_bytes();
        peak = peak.max(last);
        if warm.is_none() && started.elapsed() >= WARM_UP {
            warm = Some(last);
        }
        assert!(
            started.elapsed() < LOAD + Duration::from_secs(60),
            "the load generators did not stop"
        );
    }
    for load in &mut loads {
        let status = load.wait().expect("bench exit");
        assert!(status.success(), "shardserve-bench failed: {status}");
    }
    let warm = warm.expect("RSS sampled after the warm-up");
    let (simple_rate, simple_errors) = outcome(&simple_json);
    let (mlp_rate, mlp_errors) = outcome(&mlp_json);
    eprintln!(
        "soak {}s: RSS idle {} MiB, after warm-up {} MiB, end {} MiB, peak {} MiB; \
         simple c=48 {simple_rate:.0}/s, mlp_onnx c=16 {mlp_rate:.0}/s",
        LOAD.as_secs(),
        idle >> 20,
        warm >> 20,
        last >> 20,
        peak >> 20,
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        (simple_errors, mlp_errors),
        (0, 0),
        "requests failed during the soak"
    );
    assert!(simple_rate > 0.0 && mlp_rate > 0.0, "no load was served");
    assert!(
        last as f64 <= warm as f64 * 1.10,
        "RSS grew from {} KiB after warm-up to {} KiB at the end (more than 10%)",
        warm >> 10,
        last >> 10
    );
    assert!(
        server.log().lines().all(|l| !l.contains("panicked")),
        "the server panicked:\n{}",
        server.log()
    );
}
