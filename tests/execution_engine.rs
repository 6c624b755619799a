//! The execution engine over real sockets: heavy models run off the
//! shards' threads, one queue per model feeds every instance, queues are
//! bounded, timeouts and abandoned requests free their queued work, and
//! shutdown answers everything already accepted, then exits at once.
//!
//! The heavy model is the built-in identity with Triton's QA parameter
//! `execute_delay_ms`: every execution sleeps that long on its compute
//! worker, so these tests need no CPU to speak of.

mod common;

use std::{
    net::SocketAddr,
    sync::{Arc, Barrier},
    thread,
    time::{Duration, Instant},
};

use common::*;
use serde_json::json;
use shardserve::server::{ServerHandle, ServerOptions};

/// An identity model whose every execution takes `delay_ms`.
fn slow_model(name: &str, delay_ms: u64, max_batch: u32, instances: u32, extra: &str) -> String {
    format!(
        r#"
name: "{name}"
backend: "identity"
max_batch_size: {max_batch}
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] }} ]
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
parameters {{ key: "execute_delay_ms" value: {{ string_value: "{delay_ms}" }} }}
{extra}
"#
    )
}

fn start(repo: &TempRepo, shards: usize, tweak: impl FnOnce(&mut ServerOptions)) -> ServerHandle {
    let mut opts = ServerOptions::for_tests(&repo.root);
    opts.cores = Some(shards);
    tweak(&mut opts);
    start_with(opts)
}

fn body(v: i32, params: serde_json::Value) -> serde_json::Value {
    json!({
        "parameters": params,
        "inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 4], "data": [v, v, v, v]}]
    })
}

fn infer(addr: SocketAddr, model: &str, v: i32) -> HttpReply {
    post_json(
        addr,
        &format!("/v2/models/{model}/infer"),
        &body(v, json!({})),
    )
}

/// Sends `n` requests at once (each on its own connection) and returns
/// the replies in order.
fn concurrent(addr: SocketAddr, model: &str, n: usize) -> Vec<HttpReply> {
    let barrier = Arc::new(Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let barrier = barrier.clone();
            let model = model.to_string();
            thread::spawn(move || {
                barrier.wait();
                infer(addr, &model, i as i32)
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("client thread"))
        .collect()
}

fn stats(addr: SocketAddr, model: &str) -> serde_json::Value {
    let r = get(addr, &format!("/v2/models/{model}/stats"));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()["model_stats"][0].clone()
}

fn count(v: &serde_json::Value) -> u64 {
    v["count"].as_u64().unwrap_or(0)
}

/// Waits until `f` holds (polling), or panics with `what` after 10 s.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn health_probes_are_not_blocked_by_a_running_model() {
    let repo = TempRepo::new("health", &[("slow", slow_model("slow", 300, 1, 1, ""))]);
    // One shard: with inline execution every probe would wait behind the
    // 300 ms executions of that same thread.
    let server = start(&repo, 1, |_| {});
    let addr = server.http_addr();
    let load = thread::spawn(move || concurrent(addr, "slow", 4));
    thread::sleep(Duration::from_millis(100));
    let mut worst = Duration::ZERO;
    for _ in 0..20 {
        let t = Instant::now();
        assert_eq!(get(addr, "/v2/health/live").status, 200);
        worst = worst.max(t.elapsed());
        thread::sleep(Duration::from_millis(20));
    }
    println!("worst /v2/health/live while the model ran: {worst:?}");
    assert!(
        worst < Duration::from_millis(250),
        "a probe waited {worst:?}: the model ran on the network thread"
    );
    for r in load.join().expect("load") {
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    server.shutdown().expect("shutdown");
}

#[test]
fn one_queue_feeds_every_instance_and_batches_while_they_are_busy() {
    let repo = TempRepo::new(
        "queue",
        &[(
            "slow2",
            slow_model(
                "slow2",
                300,
                8,
                2,
                "dynamic_batching { max_queue_delay_microseconds: 0 }",
            ),
        )],
    );
    let server = start(&repo, 2, |_| {});
    let addr = server.http_addr();
    // Two requests at once: two free instances run them side by side.
    let t = Instant::now();
    let replies = concurrent(addr, "slow2", 2);
    let both = t.elapsed();
    assert!(replies.iter().all(|r| r.status == 200));
    assert!(
        both < Duration::from_millis(550),
        "two requests on two free instances took {both:?}: they ran one after the other"
    );
    // Sixteen at once, arriving on both shards: while both instances are
    // busy the one queue accumulates, so later executions are batches.
    let replies = concurrent(addr, "slow2", 16);
    for (i, r) in replies.iter().enumerate() {
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(i32s(&r.json()["outputs"][0]["data"]), vec![i as i64; 4]);
    }
    let s = stats(addr, "slow2");
    assert_eq!(s["inference_count"].as_u64(), Some(18));
    let executions = s["execution_count"].as_u64().unwrap_or(0);
    println!("18 requests ran in {executions} executions");
    assert!(executions <= 8, "{executions} executions for 18 requests");
    server.shutdown().expect("shutdown");
}

#[test]
fn a_full_queue_refuses_with_tritons_message() {
    let repo = TempRepo::new(
        "full",
        &[(
            "bounded",
            slow_model(
                "bounded",
                400,
                1,
                1,
                "dynamic_batching { default_queue_policy { max_queue_size: 2 } }",
            ),
        )],
    );
    let server = start(&repo, 1, |_| {});
    let replies = concurrent(server.http_addr(), "bounded", 8);
    let refused: Vec<_> = replies.iter().filter(|r| r.status == 503).collect();
    let served = replies.iter().filter(|r| r.status == 200).count();
    // One executes, two wait, the rest are refused at once.
    assert!(refused.len() >= 4, "only {} refused", refused.len());
    assert_eq!(served + refused.len(), 8);
    for r in refused {
        assert!(
            r.error().contains("Exceeds maximum queue size"),
            "{}",
            r.error()
        );
    }
    server.shutdown().expect("shutdown");
}

#[test]
fn the_default_scheduler_queue_is_bounded_by_max_queue_size() {
    let repo = TempRepo::new("fifo-bound", &[("fifo", slow_model("fifo", 400, 1, 1, ""))]);
    // No dynamic batcher, so no queue policy: the server-wide bound applies.
    let server = start(&repo, 2, |o| o.max_queue_size = 2);
    let replies = concurrent(server.http_addr(), "fifo", 8);
    let refused: Vec<_> = replies.iter().filter(|r| r.status == 503).collect();
    let served = replies.iter().filter(|r| r.status == 200).count();
    assert!(refused.len() >= 4, "only {} refused", refused.len());
    assert_eq!(served + refused.len(), 8);
    for r in refused {
        assert!(
            r.error().contains("Exceeds maximum queue size"),
            "{}",
            r.error()
        );
    }
    let s = stats(server.http_addr(), "fifo");
    assert_eq!(s["execution_count"].as_u64(), Some(served as u64));
    server.shutdown().expect("shutdown");
}

#[test]
fn the_timeout_parameter_expires_a_queued_request() {
    let repo = TempRepo::new("timeout", &[("busy", slow_model("busy", 400, 1, 1, ""))]);
    let server = start(&repo, 1, |_| {});
    let addr = server.http_addr();
    let first = thread::spawn(move || infer(addr, "busy", 1));
    thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    let r = post_json(
        addr,
        "/v2/models/busy/infer",
        &body(2, json!({"timeout": 50_000})),
    );
    let waited = t.elapsed();
    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
    assert!(
        r.error().contains("Request timeout expired"),
        "{}",
        r.error()
    );
    assert!(
        waited < Duration::from_millis(280),
        "expired after {waited:?}, not when its 50 ms timeout passed"
    );
    assert_eq!(first.join().expect("first").status, 200);
    let s = stats(addr, "busy");
    assert_eq!(
        s["execution_count"].as_u64(),
        Some(1),
        "the expired request ran"
    );
    server.shutdown().expect("shutdown");
}

#[test]
fn the_server_request_timeout_answers_and_drops_queued_work() {
    let repo = TempRepo::new(
        "srvtimeout",
        &[("slowest", slow_model("slowest", 300, 1, 1, ""))],
    );
    let server = start(&repo, 2, |o| {
        o.request_timeout = Some(Duration::from_millis(100))
    });
    let addr = server.http_addr();
    let replies = concurrent(addr, "slowest", 4);
    for r in &replies {
        assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
        assert!(
            r.error().contains("Request timeout expired"),
            "{}",
            r.error()
        );
    }
    // The first request was executing when it timed out; the three queued
    // behind it are dropped without running.
    thread::sleep(Duration::from_millis(500));
    let s = stats(addr, "slowest");
    assert_eq!(s["execution_count"].as_u64(), Some(1), "{s}");
    assert_eq!(count(&s["inference_stats"]["fail"]), 4, "{s}");
    server.shutdown().expect("shutdown");
}

#[test]
fn abandoned_requests_leave_nothing_behind() {
    use std::io::Write;
    let repo = TempRepo::new(
        "abandon",
        &[("slowish", slow_model("slowish", 200, 1, 1, ""))],
    );
    let server = start(&repo, 2, |_| {});
    let addr = server.http_addr();
    let payload = body(7, json!({})).to_string();
    let raw = format!(
        "POST /v2/models/slowish/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{payload}",
        payload.len()
    );
    // 200 requests sent and abandoned while the first ones execute.
    let mut streams = Vec::new();
    for _ in 0..200 {
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        s.write_all(raw.as_bytes()).expect("send");
        streams.push(s);
    }
    thread::sleep(Duration::from_millis(150));
    drop(streams);
    // Everything queued behind the first execution or two is dropped:
    // queue and in-flight gauges go back to zero long before 200 × 200 ms.
    let metrics = server.metrics_addr();
    eventually("the queue and in-flight gauges to drain", || {
        let text = String::from_utf8_lossy(&get(metrics, "/metrics").body).to_string();
        gauge_sum(&text, "shardserve_shard_queue_depth") == 0.0
            && gauge_sum(&text, "shardserve_shard_in_flight_requests") == 0.0
    });
    let s = stats(addr, "slowish");
    let executions = s["execution_count"].as_u64().unwrap_or(0);
    println!("200 abandoned requests: {executions} executions, stats {s}");
    assert!(executions <= 5, "{executions} abandoned requests still ran");
    let text = String::from_utf8_lossy(&get(metrics, "/metrics").body).to_string();
    assert!(
        text.lines()
            .any(|l| l.starts_with("nv_inference_request_failure")
                && l.contains("reason=\"CANCELED\"")
                && l.contains("model=\"slowish\"")
                && !l.trim_end().ends_with(" 0")),
        "no cancelled requests counted:\n{text}"
    );
    // And the server still serves.
    assert_eq!(infer(addr, "slowish", 3).status, 200);
    server.shutdown().expect("shutdown");
}

fn gauge_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn shutdown_answers_queued_requests_then_exits_at_once() {
    let repo = TempRepo::new("shutdown", &[("drain", slow_model("drain", 150, 1, 1, ""))]);
    // Two shards: requests arriving on the non-owning shard are forwarded,
    // and must be answered too.
    let server = start(&repo, 2, |o| o.exit_timeout = Duration::from_secs(30));
    let addr = server.http_addr();
    let clients = thread::spawn(move || concurrent(addr, "drain", 6));
    thread::sleep(Duration::from_millis(120));
    let t = Instant::now();
    server.shutdown().expect("shutdown");
    let took = t.elapsed();
    let replies = clients.join().expect("clients");
    for r in &replies {
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    println!("shutdown with 6 × 150 ms queued took {took:?}");
    assert!(
        took < Duration::from_secs(5),
        "shutdown waited {took:?}: it should end when the last request is answered"
    );
}

/// `nv_inference_pending_request_count` of `model`: requests in its queue,
/// not yet handed to an instance.
fn pending(server: &ServerHandle, model: &str) -> f64 {
    let text = String::from_utf8_lossy(&get(server.metrics_addr(), "/metrics").body).to_string();
    text.lines()
        .filter(|l| {
            l.starts_with("nv_inference_pending_request_count")
                && l.contains(&format!("model=\"{model}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Sends `n` requests on their own threads without waiting for them.
fn fire(addr: SocketAddr, model: &str, n: usize) -> Vec<thread::JoinHandle<HttpReply>> {
    (0..n)
        .map(|i| {
            let model = model.to_string();
            thread::spawn(move || infer(addr, &model, i as i32))
        })
        .collect()
}

/// Requests waiting in the shard's scheduler queues (not those handed
/// ahead to a worker).
fn shard_queued(server: &ServerHandle) -> u64 {
    metric_sum(server.metrics_addr(), "shardserve_shard_queue_depth")
}

/// With `[compute] pipeline_depth = 2`, a busy worker is handed one more
/// request behind the one it runs, never two: of five requests sent to a
/// one-instance model whose executions take seconds, exactly three stay
/// queued on the shard (with a deeper pipeline the count would never reach
/// three). As in Triton, the one handed ahead is still pending until it
/// starts: four are pending.
#[test]
fn a_worker_is_handed_at_most_its_pipeline_depth() {
    let repo = TempRepo::new("depth", &[("deep", slow_model("deep", 2500, 1, 1, ""))]);
    let server = start(&repo, 1, |o| o.tuning.compute.pipeline_depth = Some(2));
    let addr = server.http_addr();
    let load = fire(addr, "deep", 5);
    eventually("three of five requests queued", || {
        shard_queued(&server) == 3
    });
    eventually("four of five requests pending", || {
        pending(&server, "deep") == 4.0
    });
    // The first execution ends; the one handed ahead starts and stops
    // being pending, and the next is handed ahead.
    eventually("three pending once the first ran", || {
        pending(&server, "deep") == 3.0
    });
    eventually("two queued once the first ran", || {
        shard_queued(&server) == 2
    });
    for r in load {
        let r = r.join().expect("client");
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    assert_eq!(stats(addr, "deep")["execution_count"].as_u64(), Some(5));
    server.shutdown().expect("shutdown");
}

/// Request `i` of `concurrent` sent `[i, i, i, i]` to an identity model:
/// each reply must carry its own.
fn assert_each_got_its_own_answer(replies: &[HttpReply]) {
    for (i, r) in replies.iter().enumerate() {
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let v: serde_json::Value = serde_json::from_slice(&r.body).expect("json");
        let i = i as i64;
        assert_eq!(v["outputs"][0]["data"], json!([i, i, i, i]), "request {i}");
    }
}

/// With a pipeline and a reply hold, the worker keeps finished requests
/// while more wait in its ring and the shard sends them when the batch
/// comes back: every request is still answered, with its own output.
#[test]
fn held_replies_reach_every_client_with_their_own_answer() {
    let repo = TempRepo::new("hold", &[("held", slow_model("held", 20, 1, 1, ""))]);
    let server = start(&repo, 2, |o| {
        o.tuning.compute.pipeline_depth = Some(4);
        o.tuning.compute.reply_hold_us = Some(5_000);
    });
    let addr = server.http_addr();
    let replies = concurrent(addr, "held", 12);
    assert_each_got_its_own_answer(&replies);
    assert_eq!(stats(addr, "held")["execution_count"].as_u64(), Some(12));
    server.shutdown().expect("shutdown");
}

/// Inline instances under the default scheduler run a connection's batch
/// in that connection's own task (`enqueue_and_run`), on two shards so
/// half the requests also cross a ring: every request is answered with its
/// own output, and counted once, as when the scheduler task ran them all.
#[test]
fn inline_batches_run_by_their_connections_answer_every_client() {
    let model = slow_model(
        "quick",
        1,
        1,
        2,
        r#"parameters { key: "shardserve_execution" value: { string_value: "inline" } }"#,
    );
    let repo = TempRepo::new("inline_caller", &[("quick", model)]);
    let server = start(&repo, 2, |_| {});
    let addr = server.http_addr();
    let replies = concurrent(addr, "quick", 24);
    assert_each_got_its_own_answer(&replies);
    let s = stats(addr, "quick");
    assert_eq!(s["execution_count"].as_u64(), Some(24));
    assert_eq!(count(&s["inference_stats"]["success"]), 24);
    assert_eq!(pending(&server, "quick"), 0.0);
    server.shutdown().expect("shutdown");
}

/// Depth 1 is the one-at-a-time hand-over: four of five stay queued.
#[test]
fn pipeline_depth_one_hands_one_request_at_a_time() {
    let repo = TempRepo::new("depth1", &[("one", slow_model("one", 2500, 1, 1, ""))]);
    let server = start(&repo, 1, |o| o.tuning.compute.pipeline_depth = Some(1));
    let addr = server.http_addr();
    let load = fire(addr, "one", 5);
    eventually("four of five requests queued", || {
        shard_queued(&server) == 4
    });
    assert_eq!(pending(&server, "one"), 4.0);
    for r in load {
        assert_eq!(r.join().expect("client").status, 200);
    }
    server.shutdown().expect("shutdown");
}

/// Two instances, depth 2, six requests: each instance holds two, so two
/// stay queued (one instance taking all four it may not; one taking none
/// would leave four queued).
#[test]
fn every_instance_gets_work_before_any_is_handed_ahead() {
    let repo = TempRepo::new("spread", &[("two", slow_model("two", 2500, 1, 2, ""))]);
    let server = start(&repo, 1, |o| o.tuning.compute.pipeline_depth = Some(2));
    let addr = server.http_addr();
    let load = fire(addr, "two", 6);
    eventually("two of six requests queued", || shard_queued(&server) == 2);
    eventually("four of six pending (two run)", || {
        pending(&server, "two") == 4.0
    });
    for r in load {
        assert_eq!(r.join().expect("client").status, 200);
    }
    assert_eq!(stats(addr, "two")["execution_count"].as_u64(), Some(6));
    server.shutdown().expect("shutdown");
}

/// Requests that carry a queue timeout are not handed ahead: they wait in
/// the queue and expire there, as in Triton, with the default depth.
#[test]
fn requests_with_a_timeout_stay_queued_and_expire_with_a_pipeline() {
    let repo = TempRepo::new("deadline", &[("late", slow_model("late", 2500, 1, 1, ""))]);
    let server = start(&repo, 1, |o| o.tuning.compute.pipeline_depth = Some(2));
    let addr = server.http_addr();
    let first = thread::spawn(move || infer(addr, "late", 1));
    let metrics = server.metrics_addr();
    eventually("the first request in the server", || {
        let text = String::from_utf8_lossy(&get(metrics, "/metrics").body).to_string();
        gauge_sum(&text, "shardserve_shard_in_flight_requests") >= 1.0
    });
    let r = post_json(
        addr,
        "/v2/models/late/infer",
        &body(2, json!({"timeout": 100_000})),
    );
    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
    assert!(
        r.error().contains("Request timeout expired"),
        "{}",
        r.error()
    );
    assert_eq!(first.join().expect("first").status, 200);
    assert_eq!(stats(addr, "late")["execution_count"].as_u64(), Some(1));
    server.shutdown().expect("shutdown");
}

mod grpc {
    use super::*;
    use shardserve::proto::inference::{model_infer_request::InferInputTensor, ModelInferRequest};

    use common::grpc_client as client;

    fn request(model: &str, v: i32) -> ModelInferRequest {
        ModelInferRequest {
            model_name: model.into(),
            inputs: vec![InferInputTensor {
                name: "INPUT0".into(),
                datatype: "INT32".into(),
                shape: vec![1, 4],
                ..Default::default()
            }],
            raw_input_contents: vec![[v; 4]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect::<Vec<u8>>()
                .into()],
            ..Default::default()
        }
    }

    /// A client deadline resets the stream (RST_STREAM): the queued work of
    /// the cancelled calls is dropped, not executed.
    #[test]
    fn reset_streams_cancel_their_queued_work() {
        let repo = TempRepo::new(
            "grpc-cancel",
            &[("slowg", slow_model("slowg", 200, 1, 1, ""))],
        );
        let server = start(&repo, 2, |_| {});
        let addr = server.grpc_addr();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio");
        rt.block_on(async {
            let c = client(addr).await;
            let calls: Vec<_> = (0..50)
                .map(|i| {
                    let mut c = c.clone();
                    tokio::spawn(async move {
                        let mut req = tonic::Request::new(request("slowg", i));
                        req.set_timeout(Duration::from_millis(100));
                        c.model_infer(req).await
                    })
                })
                .collect();
            for call in calls {
                let r = call.await.expect("task");
                match r {
                    Ok(_) => panic!("a call beat its 100 ms deadline behind 200 ms executions"),
                    Err(s) => assert_eq!(s.code(), tonic::Code::Cancelled, "{s:?}"),
                }
            }
            // Keep the client's connection task running so it sends the
            // RST_STREAM frames (a current-thread runtime only runs inside
            // block_on).
            tokio::time::sleep(Duration::from_millis(300)).await;
        });
        let http = server.http_addr();
        eventually("cancelled calls to leave the queue", || {
            let text =
                String::from_utf8_lossy(&get(server.metrics_addr(), "/metrics").body).to_string();
            gauge_sum(&text, "shardserve_shard_queue_depth") == 0.0
        });
        thread::sleep(Duration::from_millis(300));
        let s = stats(http, "slowg");
        let executions = s["execution_count"].as_u64().unwrap_or(0);
        println!("50 cancelled gRPC calls: {executions} executions");
        assert!(executions <= 3, "{executions} cancelled calls still ran");
        server.shutdown().expect("shutdown");
    }

    /// Shutdown with gRPC calls queued (some forwarded between shards):
    /// every one is answered, and shutdown ends right after.
    #[test]
    fn shutdown_answers_queued_grpc_calls() {
        let repo = TempRepo::new(
            "grpc-drain",
            &[("draing", slow_model("draing", 100, 1, 1, ""))],
        );
        let server = start(&repo, 2, |_| {});
        let addr = server.grpc_addr();
        let calls = thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio");
            rt.block_on(async {
                let mut handles = Vec::new();
                for conn in 0..4 {
                    let c = client(addr).await;
                    for i in 0..2 {
                        let mut c = c.clone();
                        handles.push(tokio::spawn(async move {
                            c.model_infer(request("draing", conn * 10 + i)).await
                        }));
                    }
                }
                let mut out = Vec::new();
                for h in handles {
                    out.push(h.await.expect("task"));
                }
                out
            })
        });
        thread::sleep(Duration::from_millis(150));
        let t = Instant::now();
        server.shutdown().expect("shutdown");
        let took = t.elapsed();
        for r in calls.join().expect("calls") {
            let r = r.expect("a queued call failed during shutdown");
            assert_eq!(r.into_inner().raw_output_contents.len(), 1);
        }
        println!("gRPC shutdown with 8 × 100 ms queued took {took:?}");
        assert!(took < Duration::from_secs(5), "shutdown waited {took:?}");
    }
}

#[test]
fn a_malformed_timeout_parameter_is_a_clear_error() {
    let repo = TempRepo::new("badtimeout", &[("plain", slow_model("plain", 1, 1, 1, ""))]);
    let server = start(&repo, 1, |_| {});
    let r = post_json(
        server.http_addr(),
        "/v2/models/plain/infer",
        &body(1, json!({"timeout": "soon"})),
    );
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    assert!(r.error().contains("'timeout'"), "{}", r.error());
    assert_eq!(infer(server.http_addr(), "plain", 1).status, 200);
    server.shutdown().expect("shutdown");
}

/// Sends `n` requests one after the other, each on its own connection
/// (so the kernel spreads them over the shards), checking every answer.
fn each_on_a_new_connection(addr: SocketAddr, model: &str, n: usize) {
    for i in 0..n {
        let r = infer(addr, model, i as i32);
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(i32s(&r.json()["outputs"][0]["data"]), vec![i as i64; 4]);
    }
}

#[test]
fn inline_instances_spread_over_shards_and_serve_requests_where_they_arrive() {
    // No delay: the identity runs inline, two instances each.
    let repo = TempRepo::new(
        "spread",
        &[
            ("spread", slow_model("spread", 0, 4, 2, "")),
            (
                "owned",
                slow_model(
                    "owned",
                    0,
                    4,
                    2,
                    r#"parameters { key: "shardserve_instance_placement" value: { string_value: "owner" } }"#,
                ),
            ),
            (
                "batched",
                slow_model("batched", 0, 4, 2, "dynamic_batching { }"),
            ),
        ],
    );
    let server = start(&repo, 2, |o| {
        o.model_control_mode = shardserve::server::ModelControlMode::Explicit;
        o.load_models = vec!["spread".into(), "owned".into(), "batched".into()];
    });
    let addr = server.http_addr();
    let metrics = server.metrics_addr();
    let n = 32;

    // One instance on each shard: every request runs where it arrived.
    each_on_a_new_connection(addr, "spread", n);
    assert_eq!(
        forwarded_requests(metrics),
        0,
        "no spread request crossed shards"
    );
    let s = stats(addr, "spread");
    assert_eq!(s["inference_count"].as_u64(), Some(n as u64));
    assert_eq!(s["execution_count"].as_u64(), Some(n as u64));
    assert_eq!(count(&s["inference_stats"]["success"]), n as u64);
    assert_eq!(count(&s["inference_stats"]["queue"]), n as u64);

    // Both instances on the owner (asked for), and the dynamic batcher's
    // one queue: requests received by the other shard cross to the owner.
    // 32 connections all landing on the owner has odds of 2^-32.
    each_on_a_new_connection(addr, "owned", n);
    let owned = forwarded_requests(metrics);
    assert!(
        owned > 0 && owned < n as u64,
        "owner placement forwarded {owned}"
    );
    each_on_a_new_connection(addr, "batched", n);
    let batched = forwarded_requests(metrics) - owned;
    assert!(
        batched > 0 && batched < n as u64,
        "one batching queue forwarded {batched}"
    );

    // Unloaded from every shard, then loaded again, spread as before.
    let r = post_json(addr, "/v2/repository/models/spread/unload", &json!({}));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let r = infer(addr, "spread", 1);
    assert_ne!(r.status, 200, "an unloaded model answered");
    let r = post_json(addr, "/v2/repository/models/spread/load", &json!({}));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let before = forwarded_requests(metrics);
    each_on_a_new_connection(addr, "spread", n);
    assert_eq!(forwarded_requests(metrics), before, "reloaded: still local");

    // A placement this server does not know fails the load, saying why.
    std::fs::write(
        repo.root.join("spread").join("config.pbtxt"),
        slow_model(
            "spread",
            0,
            4,
            2,
            r#"parameters { key: "shardserve_instance_placement" value: { string_value: "everywhere" } }"#,
        ),
    )
    .expect("config");
    let r = post_json(addr, "/v2/repository/models/spread/load", &json!({}));
    assert_eq!(r.status, 500, "a failed load is Triton's INTERNAL");
    let text = String::from_utf8_lossy(&r.body);
    assert!(text.contains("shardserve_instance_placement"), "{text}");
    server.shutdown().expect("shutdown");
}
