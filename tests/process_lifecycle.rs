//! The real binary under load: SIGTERM while HTTP and gRPC requests are
//! queued, and a 10× open-loop overload against a slow model. Bounded in
//! time; figures are printed, assertions are on outcomes and generous
//! bounds only.
//!
//! The slow model is the built-in identity with `execute_delay_ms`: it runs
//! on a compute worker like an ONNX model and queues like one, but needs no
//! CPU, so the outcomes do not depend on how busy the machine is.

mod common;

use std::{
    io::{ErrorKind, Read, Write},
    net::{SocketAddr, TcpStream},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use common::{child::ChildServer, *};
use shardserve::proto::inference::{model_infer_request::InferInputTensor, ModelInferRequest};

/// An identity model (no batching, one instance) whose every execution
/// takes `delay_ms`.
fn slow_model(name: &str, delay_ms: u64) -> String {
    format!(
        r#"
name: "{name}"
backend: "identity"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "execute_delay_ms" value: {{ string_value: "{delay_ms}" }} }}
"#
    )
}

fn infer_body(v: i32) -> String {
    format!(
        r#"{{"inputs":[{{"name":"INPUT0","datatype":"INT32","shape":[4],"data":[{v},{v},{v},{v}]}}]}}"#
    )
}

/// An HTTP/1.1 keep-alive POST of `body` to `model`'s infer endpoint.
fn keep_alive_infer(model: &str, body: &str) -> Vec<u8> {
    format!(
        "POST /v2/models/{model}/infer HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Reads one response (head and `Content-Length` body) off `s`.
fn read_response(s: &mut TcpStream) -> (u16, String, Vec<u8>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut chunk).expect("read the response head");
        assert!(n > 0, "connection closed before a response");
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status code");
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("content-length");
    let mut body = buf[head_end..].to_vec();
    while body.len() < len {
        let n = s.read(&mut chunk).expect("read the response body");
        assert!(n > 0, "connection closed inside a body");
        body.extend_from_slice(&chunk[..n]);
    }
    (status, head, body)
}

/// True if the peer closes `s` (EOF or reset) within 10 s.
fn closed_by_peer(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut b = [0u8; 64];
    match s.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => matches!(e.kind(), ErrorKind::ConnectionReset),
    }
}

fn metric_sum(metrics: SocketAddr, name: &str) -> f64 {
    let page = String::from_utf8_lossy(&get(metrics, "/metrics").body).to_string();
    page.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn grpc_request(model: &str, v: i32) -> ModelInferRequest {
    ModelInferRequest {
        model_name: model.into(),
        inputs: vec![InferInputTensor {
            name: "INPUT0".into(),
            datatype: "INT32".into(),
            shape: vec![4],
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

/// SIGTERM with 6 HTTP and 6 gRPC requests queued behind a 100 ms model
/// on two shards (so some crossed the ring to the model's owner): every
/// one is answered with its result, keep-alive connections are told to
/// close (and an idle one is closed), and the process exits 0 as soon as
/// the last answer is out, far inside its 60 s exit timeout.
#[test]
fn sigterm_answers_every_accepted_request_and_exits_zero() {
    const HTTP_CALLS: usize = 6;
    const GRPC_CALLS: usize = 6;
    let repo = TempRepo::new("sigterm", &[("slow", slow_model("slow", 100))]);
    let mut server = ChildServer::spawn_in(
        "sigterm",
        &repo.root,
        2,
        None,
        &["--exit-timeout-secs", "60"],
    );

    // An idle keep-alive connection that has been used once.
    let mut idle = TcpStream::connect(server.http).expect("connect");
    idle.write_all(b"GET /v2/health/live HTTP/1.1\r\nHost: test\r\n\r\n")
        .expect("write");
    assert_eq!(read_response(&mut idle).0, 200);

    let http_calls: Vec<_> = (0..HTTP_CALLS)
        .map(|i| {
            let addr = server.http;
            thread::spawn(move || {
                let mut s = TcpStream::connect(addr).expect("connect");
                s.set_read_timeout(Some(Duration::from_secs(30)))
                    .expect("timeout");
                s.write_all(&keep_alive_infer("slow", &infer_body(i as i32)))
                    .expect("write");
                let (status, head, body) = read_response(&mut s);
                let closed = closed_by_peer(&mut s);
                (i, status, head, body, closed)
            })
        })
        .collect();
    let grpc = server.grpc;
    let grpc_calls = thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio");
        rt.block_on(async {
            let c = grpc_client(grpc).await;
            let calls: Vec<_> = (0..GRPC_CALLS)
                .map(|i| {
                    let mut c = c.clone();
                    tokio::spawn(async move {
                        (i, c.model_infer(grpc_request("slow", 100 + i as i32)).await)
                    })
                })
                .collect();
            let mut out = Vec::new();
            for call in calls {
                out.push(call.await.expect("task"));
            }
            out
        })
    });

    // Every request has reached the server (counted in flight on the shard
    // that received it) before the signal.
    let total = (HTTP_CALLS + GRPC_CALLS) as f64;
    wait_for("all requests in flight", Duration::from_secs(10), || {
        metric_sum(server.metrics, "shardserve_shard_in_flight_requests") >= total
    });
    let t = Instant::now();
    server.signal(libc::SIGTERM);
    let status = server.wait_exit(Duration::from_secs(50));
    let took = t.elapsed();
    let status = status.unwrap_or_else(|| panic!("no exit 50 s after SIGTERM:\n{}", server.log()));

    for h in http_calls {
        let (i, code, head, body, closed) = h.join().expect("HTTP client");
        let text = String::from_utf8_lossy(&body);
        assert_eq!(code, 200, "HTTP request {i}: {text}");
        assert!(
            text.contains(&format!("[{i},{i},{i},{i}]")),
            "HTTP request {i} got another's answer: {text}"
        );
        assert!(
            head.contains("connection: close"),
            "HTTP request {i}: {head}"
        );
        assert!(closed, "HTTP connection {i} left open after its answer");
    }
    for (i, r) in grpc_calls.join().expect("gRPC client") {
        let r = r.unwrap_or_else(|s| panic!("gRPC call {i} failed during shutdown: {s:?}"));
        let raw = &r.into_inner().raw_output_contents;
        let want: Vec<u8> = [100 + i as i32; 4]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert_eq!(raw.first().map(|b| b.to_vec()), Some(want), "gRPC call {i}");
    }
    assert!(
        closed_by_peer(&mut idle),
        "idle keep-alive connection left open"
    );
    println!(
        "SIGTERM with {HTTP_CALLS} HTTP + {GRPC_CALLS} gRPC requests queued behind 100 ms \
         executions: all answered, exit {status} after {took:?}"
    );
    assert!(status.success(), "exit status {status}:\n{}", server.log());
    // Exiting at the 60 s timeout would mean it waited for nothing.
    assert!(
        took < Duration::from_secs(30),
        "exit took {took:?}:\n{}",
        server.log()
    );
}

/// Outcome counts of the overload's requests.
#[derive(Default)]
struct Outcomes {
    sent: AtomicU64,
    ok: AtomicU64,
    refused: AtomicU64,
    other: AtomicU64,
}

/// One request on its own connection: 200, the queue-full 503, or
/// anything else (kept for the failure message).
async fn one_request(
    addr: SocketAddr,
    raw: Arc<Vec<u8>>,
    out: Arc<Outcomes>,
    other: Arc<std::sync::Mutex<Option<String>>>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let result = tokio::time::timeout(Duration::from_secs(20), async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(&raw).await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        Ok::<_, std::io::Error>(buf)
    })
    .await;
    let reply = match result {
        Ok(Ok(buf)) => String::from_utf8_lossy(&buf).to_string(),
        Ok(Err(e)) => format!("I/O error: {e}"),
        Err(_) => "no answer in 20 s".to_string(),
    };
    if reply.starts_with("HTTP/1.1 200") {
        out.ok.fetch_add(1, Ordering::Relaxed);
    } else if reply.starts_with("HTTP/1.1 503") && reply.contains("Exceeds maximum queue size") {
        out.refused.fetch_add(1, Ordering::Relaxed);
    } else {
        out.other.fetch_add(1, Ordering::Relaxed);
        other.lock().expect("lock").get_or_insert(reply);
    }
}

/// 10× overload, open loop, for 3 s: a model that serves 50 requests/s
/// (20 ms executions, one instance, queue bound 32) is sent 500/s. Every
/// request gets either its answer or Triton's "Exceeds maximum queue size"
/// (503) — nothing hangs or resets — health probes keep answering, memory
/// stays within a generous ceiling, and afterwards the model serves
/// normally again.
#[test]
fn open_loop_overload_is_refused_cleanly_and_recovers() {
    const RATE: u64 = 500;
    const SECS: u64 = 3;
    let repo = TempRepo::new("overload", &[("slow", slow_model("slow", 20))]);
    let server =
        ChildServer::spawn_in("overload", &repo.root, 1, None, &["--max-queue-size", "32"]);
    let (http, metrics) = (server.http, server.metrics);
    let rss_before = server.rss_bytes();
    let done = Arc::new(AtomicBool::new(false));

    // Health probes and an RSS sampler alongside the load.
    let probes = {
        let done = done.clone();
        thread::spawn(move || {
            let mut latencies = Vec::new();
            let mut failures = 0;
            while !done.load(Ordering::Relaxed) {
                let t = Instant::now();
                if get(http, "/v2/health/live").status != 200 {
                    failures += 1;
                }
                latencies.push(t.elapsed());
                thread::sleep(Duration::from_millis(20));
            }
            (latencies, failures)
        })
    };
    let pid = server.pid();
    let sampler = {
        let done = done.clone();
        thread::spawn(move || {
            let mut peak = 0u64;
            while !done.load(Ordering::Relaxed) {
                let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
                    .ok()
                    .and_then(|s| {
                        let l = s.lines().find(|l| l.starts_with("VmRSS:"))?.to_string();
                        l.split_whitespace().nth(1)?.parse::<u64>().ok()
                    })
                    .unwrap_or(0)
                    * 1024;
                peak = peak.max(rss);
                thread::sleep(Duration::from_millis(20));
            }
            peak
        })
    };

    let out = Arc::new(Outcomes::default());
    let other = Arc::new(std::sync::Mutex::new(None));
    let raw = {
        let body = infer_body(7);
        Arc::new(
            format!(
                "POST /v2/models/slow/infer HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .into_bytes(),
        )
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio");
    rt.block_on(async {
        // Open loop: sends follow the clock, not the answers.
        let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / RATE));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let mut calls = Vec::new();
        for _ in 0..RATE * SECS {
            tick.tick().await;
            out.sent.fetch_add(1, Ordering::Relaxed);
            calls.push(tokio::spawn(one_request(
                http,
                raw.clone(),
                out.clone(),
                other.clone(),
            )));
        }
        for c in calls {
            c.await.expect("request task");
        }
    });
    done.store(true, Ordering::Relaxed);
    let (mut latencies, probe_failures) = probes.join().expect("probes");
    let peak_rss = sampler.join().expect("sampler");
    latencies.sort();

    let (sent, ok, refused, others) = (
        out.sent.load(Ordering::Relaxed),
        out.ok.load(Ordering::Relaxed),
        out.refused.load(Ordering::Relaxed),
        out.other.load(Ordering::Relaxed),
    );
    println!(
        "overload {RATE}/s for {SECS} s against ~50/s: sent {sent}, answered {ok}, refused \
         (503 queue full) {refused}, other {others}; health probes n={} p50={:?} max={:?} \
         failed {probe_failures}; RSS {} MiB before, peak {} MiB",
        latencies.len(),
        latencies.get(latencies.len() / 2),
        latencies.last(),
        rss_before >> 20,
        peak_rss >> 20,
    );
    assert_eq!(
        others,
        0,
        "answers other than 200 or the queue-full 503, e.g.: {:?}",
        other.lock().expect("lock")
    );
    assert_eq!(ok + refused, sent);
    assert!(refused > 0, "a 10× overload refused nothing");
    assert!(ok > 0, "nothing was served during the overload");
    assert_eq!(probe_failures, 0, "health probes failed under overload");
    assert!(!latencies.is_empty());
    // Queue bound 32 × a 4-element request: anything near this ceiling
    // would be memory growing with the offered load.
    assert!(
        peak_rss < rss_before + (256 << 20),
        "RSS grew from {} to {} MiB under overload",
        rss_before >> 20,
        peak_rss >> 20
    );

    // Recovery: the queue empties and requests are served again.
    wait_for("the queue to drain", Duration::from_secs(10), || {
        metric_sum(metrics, "nv_inference_pending_request_count") == 0.0
    });
    for i in 0..10 {
        let r = request(
            http,
            "POST",
            "/v2/models/slow/infer",
            &[("Content-Type", "application/json")],
            infer_body(i).as_bytes(),
        );
        assert_eq!(
            r.status,
            200,
            "after the overload: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
}
