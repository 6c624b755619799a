//! The dynamic batcher over real sockets: concurrent clients on several
//! shards get merged into executions on the shard owning the instance.

mod common;

use std::{
    net::SocketAddr,
    path::Path,
    sync::{Arc, Barrier},
};

use common::*;
use serde_json::json;
use shardserve::server::ServerOptions;

fn dyna_request(rows: usize, base: i32) -> serde_json::Value {
    let a: Vec<i32> = (0..rows as i32 * 16).map(|i| base + i).collect();
    json!({
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [rows, 16], "data": a},
            {"name": "INPUT1", "datatype": "INT32", "shape": [rows, 16], "data": vec![1; rows * 16]},
        ]
    })
}

fn stats(addr: SocketAddr, model: &str) -> serde_json::Value {
    let r = get(addr, &format!("/v2/models/{model}/stats"));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()["model_stats"][0].clone()
}

/// A temporary repository holding one model `name` with `config`.
fn repo_with(name: &str, config: &str) -> TempRepo {
    TempRepo::new(name, &[(name, config.to_string())])
}

#[test]
fn concurrent_requests_are_merged_and_answered_individually() {
    let server = start_server(2);
    let addr = server.http_addr();
    // 16 connections: SO_REUSEPORT spreads them over both shards (all on
    // one shard has probability 2^-15), so some requests must cross the
    // ring to the shard that owns the one instance and join its batches.
    let clients = 16;
    let barrier = Arc::new(Barrier::new(clients));
    let handles: Vec<_> = (0..clients)
        .map(|c| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                let base = c as i32 * 1000;
                let r = post_json(
                    addr,
                    "/v2/models/simple_dyna_batch/infer",
                    &dyna_request(1, base),
                );
                assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
                let body = r.json();
                let out0 = i32s(&body["outputs"][0]["data"]);
                assert_eq!(
                    out0,
                    (0..16).map(|i| (base + i + 1) as i64).collect::<Vec<_>>(),
                    "own results"
                );
                let batch = i32s(&body["outputs"][2]["data"]);
                assert_eq!(body["outputs"][2]["shape"], json!([1, 1]));
                batch[0]
            })
        })
        .collect();
    let sizes: Vec<i64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(
        sizes.iter().all(|&s| (1..=8).contains(&s)),
        "no execution exceeds max_batch_size: {sizes:?}"
    );
    assert!(
        sizes.iter().any(|&s| s > 1),
        "concurrent requests within 50 ms get merged: {sizes:?}"
    );
    let s = stats(addr, "simple_dyna_batch");
    assert_eq!(s["inference_count"], clients as u64);
    let executions: u64 = s["execution_count"].as_u64().unwrap();
    assert!(
        executions < clients as u64,
        "fewer executions than requests: {s}"
    );
    let batch_total: u64 = s["batch_stats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["batch_size"].as_u64().unwrap() * b["compute_infer"]["count"].as_u64().unwrap())
        .sum();
    assert_eq!(
        batch_total, clients as u64,
        "batch_stats account for every row"
    );
    assert_eq!(s["inference_stats"]["success"]["count"], clients as u64);
    let forwarded = common::forwarded_requests(server.metrics_addr());
    assert!(
        forwarded > 0 && forwarded < clients as u64,
        "some requests crossed shards to the instance: {forwarded}"
    );
    server.shutdown().unwrap();
}

const BATCHED_SIMPLE: &str = r#"
name: "batched"
backend: "simple"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "BATCH_SIZE" data_type: TYPE_INT32 dims: [ 1 ] }
]
"#;

fn server_for(repo: &Path, shards: usize) -> shardserve::server::ServerHandle {
    let mut opts = ServerOptions::for_tests(repo);
    opts.cores = Some(shards);
    start_with(opts)
}

#[test]
fn preferred_batch_size_is_executed_without_waiting_for_the_delay() {
    let config = format!("{BATCHED_SIMPLE}dynamic_batching {{ preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 30000000 }}");
    let repo = repo_with("batched", &config);
    let server = server_for(&repo.root, 1);
    let addr = server.http_addr();
    // Two requests of 2 rows reach the preferred size 4 and run at once,
    // long before the 30 s delay.
    let started = std::time::Instant::now();
    let handles: Vec<_> = (0..2)
        .map(|i| {
            std::thread::spawn(move || {
                post_json(addr, "/v2/models/batched/infer", &dyna_request(2, i * 100))
            })
        })
        .collect();
    for h in handles {
        let r = h.join().unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(i32s(&r.json()["outputs"][2]["data"]), vec![4, 4]);
    }
    assert!(
        started.elapsed().as_secs() < 20,
        "preferred size must not wait for the delay"
    );
    server.shutdown().unwrap();
}

#[test]
fn queue_delay_is_honoured_for_a_lone_request() {
    let config =
        format!("{BATCHED_SIMPLE}dynamic_batching {{ max_queue_delay_microseconds: 200000 }}");
    let repo = repo_with("batched", &config);
    let server = server_for(&repo.root, 1);
    let addr = server.http_addr();
    let started = std::time::Instant::now();
    let r = post_json(addr, "/v2/models/batched/infer", &dyna_request(1, 0));
    assert_eq!(r.status, 200);
    assert!(
        started.elapsed().as_millis() >= 190,
        "a lone request waits out the queue delay"
    );
    assert_eq!(i32s(&r.json()["outputs"][2]["data"]), vec![1]);
    let s = stats(addr, "batched");
    assert!(
        s["inference_stats"]["queue"]["ns"].as_u64().unwrap() >= 190_000_000,
        "{s}"
    );
    server.shutdown().unwrap();
}

#[test]
fn full_queue_and_timeouts_are_rejected_with_503() {
    let config = format!(
        "{BATCHED_SIMPLE}dynamic_batching {{ max_queue_delay_microseconds: 300000 \
         default_queue_policy {{ max_queue_size: 1 timeout_action: REJECT default_timeout_microseconds: 100000 allow_timeout_override: true }} }}"
    );
    let repo = repo_with("batched", &config);
    let server = server_for(&repo.root, 1);
    let addr = server.http_addr();
    // The first request waits in the queue (delay 300 ms, timeout 100 ms):
    // it expires and is rejected; a second one sent meanwhile finds the
    // queue full.
    let first = std::thread::spawn(move || {
        post_json(addr, "/v2/models/batched/infer", &dyna_request(1, 0))
    });
    std::thread::sleep(std::time::Duration::from_millis(30));
    let second = post_json(addr, "/v2/models/batched/infer", &dyna_request(1, 0));
    assert_eq!(
        second.status,
        503,
        "{}",
        String::from_utf8_lossy(&second.body)
    );
    assert!(
        second.error().contains("Exceeds maximum queue size"),
        "{}",
        second.error()
    );
    let first = first.join().unwrap();
    assert_eq!(
        first.status,
        503,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    assert!(first.error().contains("timeout"), "{}", first.error());
    // A per-request timeout override longer than the delay lets it through.
    let mut long = dyna_request(1, 0);
    long["parameters"] = json!({"timeout": 2_000_000});
    assert_eq!(
        post_json(addr, "/v2/models/batched/infer", &long).status,
        200
    );
    let metrics = String::from_utf8(get(server.metrics_addr(), "/metrics").body).unwrap();
    assert!(
        metrics.contains(
            "nv_inference_request_failure{model=\"batched\",version=\"1\",reason=\"REJECTED\"} 2"
        ),
        "{metrics}"
    );
    server.shutdown().unwrap();
}

#[test]
fn priorities_are_served_in_order() {
    let config = format!(
        "{BATCHED_SIMPLE}dynamic_batching {{ max_queue_delay_microseconds: 200000 priority_levels: 2 default_priority_level: 2 }}"
    );
    let config = config.replace("max_batch_size: 8", "max_batch_size: 2");
    let repo = repo_with("batched", &config);
    let server = server_for(&repo.root, 1);
    let addr = server.http_addr();
    // A one-row low-priority request arrives first and waits for the
    // 200 ms delay (the batch is not full). A two-row high-priority request
    // then fills a batch on its own: it must run at once, ahead of the
    // older low-priority one, which still waits out its delay. In FIFO
    // order the low one would run first (it cannot share a batch with 2 rows).
    let low = std::thread::spawn(move || {
        let r = post_json(addr, "/v2/models/batched/infer", &dyna_request(1, 0));
        (r.status, std::time::Instant::now())
    });
    std::thread::sleep(std::time::Duration::from_millis(20));
    let mut high_req = dyna_request(2, 0);
    high_req["parameters"] = json!({"priority": 1});
    let high = std::thread::spawn(move || {
        let r = post_json(addr, "/v2/models/batched/infer", &high_req);
        (r.status, std::time::Instant::now())
    });
    let (ls, lt) = low.join().unwrap();
    let (hs, ht) = high.join().unwrap();
    assert_eq!((ls, hs), (200, 200));
    assert!(
        ht <= lt,
        "the priority-1 request completes before the priority-2 one"
    );
    let mut bad = dyna_request(1, 0);
    bad["parameters"] = json!({"priority": 5});
    assert_eq!(
        post_json(addr, "/v2/models/batched/infer", &bad).status,
        400
    );
    server.shutdown().unwrap();
}

#[test]
fn metrics_and_statistics_match_the_requests_sent() {
    let server = start_server(2);
    let addr = server.http_addr();
    for i in 0..5 {
        assert_eq!(
            post_json(addr, "/v2/models/simple/infer", &simple_json_request(i)).status,
            200
        );
    }
    let mut bad = simple_json_request(0);
    bad["inputs"][0]["datatype"] = json!("FP32");
    bad["inputs"][0]["data"] = json!(vec![0.5; 16]);
    assert_eq!(post_json(addr, "/v2/models/simple/infer", &bad).status, 400);
    let s = stats(addr, "simple");
    assert_eq!(s["inference_count"], 5);
    assert_eq!(s["execution_count"], 5);
    assert_eq!(s["inference_stats"]["success"]["count"], 5);
    // Refused before reaching the model (wrong datatype): counted nowhere,
    // as in Triton.
    assert_eq!(s["inference_stats"]["fail"]["count"], 0);
    assert!(s["last_inference"].as_u64().unwrap() > 1_600_000_000_000);
    let all = get(addr, "/v2/models/stats").json();
    assert!(all["model_stats"].as_array().unwrap().len() >= 5);
    assert_eq!(get(addr, "/v2/models/nope/stats").status, 404);
    let metrics = String::from_utf8(get(server.metrics_addr(), "/metrics").body).unwrap();
    for line in [
        "nv_inference_request_success{model=\"simple\",version=\"1\"} 5",
        "nv_inference_count{model=\"simple\",version=\"1\"} 5",
        "nv_inference_exec_count{model=\"simple\",version=\"1\"} 5",
        "nv_inference_request_failure{model=\"simple\",version=\"1\",reason=\"OTHER\"} 0",
        "nv_inference_pending_request_count{model=\"simple\",version=\"1\"} 0",
    ] {
        assert!(metrics.contains(line), "missing {line:?} in\n{metrics}");
    }
    for name in [
        "nv_inference_request_duration_us",
        "nv_inference_queue_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_cpu_utilization",
        "nv_cpu_memory_total_bytes",
        "shardserve_shard_connections",
        "shardserve_ring_occupancy",
    ] {
        assert!(metrics.contains(name), "missing {name}");
    }
    server.shutdown().unwrap();
}

// Triton's qa/L0_batcher preferred-size cases, on a model that reports
// the batch it ran in: max_batch_size 8, preferred sizes 2 and 6.
fn triton_qa_server(delay_us: u64) -> (TempRepo, shardserve::server::ServerHandle) {
    let config = format!(
        "{BATCHED_SIMPLE}dynamic_batching {{ preferred_batch_size: [ 2, 6 ] max_queue_delay_microseconds: {delay_us} }}"
    );
    let repo = repo_with("batched", &config);
    let server = server_for(&repo.root, 1);
    (repo, server)
}

/// Sends a request of `rows` on its own thread; yields the batch size the
/// model ran it in and when it completed.
fn send_rows(addr: SocketAddr, rows: usize) -> std::thread::JoinHandle<(i64, std::time::Instant)> {
    std::thread::spawn(move || {
        let r = post_json(addr, "/v2/models/batched/infer", &dyna_request(rows, 0));
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let batch = i32s(&r.json()["outputs"][2]["data"]);
        assert_eq!(batch.len(), rows);
        (batch[0], std::time::Instant::now())
    })
}

/// Waits until the model has `n` requests queued.
fn wait_for_queued(server: &shardserve::server::ServerHandle, n: u64) {
    let metrics = server.metrics_addr();
    let prefix = "nv_inference_pending_request_count{model=\"batched\"";
    wait_for(
        &format!("{n} queued requests"),
        std::time::Duration::from_secs(30),
        || {
            let page = String::from_utf8_lossy(&get(metrics, "/metrics").body).into_owned();
            page.lines()
                .filter(|l| l.starts_with(prefix))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
                .sum::<u64>()
                == n
        },
    );
}

/// Executions per batch size, from the model's statistics.
fn batch_counts(addr: SocketAddr) -> Vec<(u64, u64)> {
    let s = stats(addr, "batched");
    let mut counts: Vec<(u64, u64)> = s["batch_stats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["batch_size"].as_u64().unwrap(),
                b["compute_infer"]["count"].as_u64().unwrap(),
            )
        })
        .collect();
    counts.sort_unstable();
    counts
}

#[test]
fn triton_batches_above_the_largest_preferred_size_run_at_once() {
    // test_static_batch_gt_max_preferred and
    // test_multi_batch_gt_max_preferred: a 3 waits; a 7 (above the
    // largest preferred size, 6) arrives: both run at once, apart, long
    // before the 30 s delay.
    let (_repo, server) = triton_qa_server(30_000_000);
    let addr = server.http_addr();
    let started = std::time::Instant::now();
    let three = send_rows(addr, 3);
    wait_for_queued(&server, 1);
    let seven = send_rows(addr, 7);
    let (b3, _) = three.join().unwrap();
    let (b7, _) = seven.join().unwrap();
    assert_eq!((b3, b7), (3, 7), "run apart (3 + 7 > max_batch_size)");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(15),
        "a batch above the largest preferred size must not wait for the delay: {:?}",
        started.elapsed()
    );
    assert_eq!(batch_counts(addr), vec![(3, 1), (7, 1)]);
    server.shutdown().unwrap();
}

#[test]
fn triton_a_pending_batch_runs_when_the_next_request_would_pass_the_largest_preferred_size() {
    // test_multi_batch_sum_gt_max_preferred: a 3 waits; a 4 arrives
    // (3 + 4 passes 6): the 3 runs at once, the 4 alone waits its delay.
    let delay = std::time::Duration::from_secs(3);
    let (_repo, server) = triton_qa_server(delay.as_micros() as u64);
    let addr = server.http_addr();
    let three = send_rows(addr, 3);
    wait_for_queued(&server, 1);
    let four_sent = std::time::Instant::now();
    let four = send_rows(addr, 4);
    let (b3, t3) = three.join().unwrap();
    let (b4, t4) = four.join().unwrap();
    assert_eq!((b3, b4), (3, 4), "not merged into a 7");
    assert!(t3 < t4, "the 3 runs first");
    assert!(
        t4 - four_sent >= delay - std::time::Duration::from_millis(50),
        "the 4 waits for the delay: {:?}",
        t4 - four_sent
    );
    assert_eq!(batch_counts(addr), vec![(3, 1), (4, 1)]);
    let s = stats(addr, "batched");
    assert_eq!(s["execution_count"], 2);
    assert_eq!(s["inference_count"], 7);
    server.shutdown().unwrap();
}
