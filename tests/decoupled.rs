//! Decoupled models (`repeat_int32`, `square_int32`) through the server:
//! responses in order per request over gRPC `ModelStreamInfer`, requests
//! interleaved on one stream, the empty final response, errors that do
//! not close the stream, cancellation that stops a long request's work,
//! Triton's refusal on unary `ModelInfer` and HTTP `/infer`, and the
//! generate extension (`/generate`, `/generate_stream` as SSE).

mod common;

use std::time::{Duration, Instant};

use common::{post_json, start_server, start_with, TempRepo};
use futures::{channel::mpsc, SinkExt, StreamExt};
use shardserve::{
    backend::builtin::responses_sent,
    proto::inference::{
        grpc_inference_service_client::GrpcInferenceServiceClient,
        infer_parameter::ParameterChoice, model_infer_request::InferInputTensor,
        model_infer_request::InferRequestedOutputTensor, InferParameter, ModelInferRequest,
        ModelStreamInferResponse,
    },
    server::ServerOptions,
};
use tonic::{transport::Channel, Code};

use common::grpc_client as client;

fn le32<T: Copy>(v: &[T], f: impl Fn(T) -> [u8; 4]) -> bytes::Bytes {
    v.iter().flat_map(|x| f(*x)).collect::<Vec<u8>>().into()
}

fn tensor(name: &str, datatype: &str, n: usize) -> InferInputTensor {
    InferInputTensor {
        name: name.into(),
        datatype: datatype.into(),
        shape: vec![n as i64],
        ..Default::default()
    }
}

/// `repeat_int32` with IN = `values`, DELAY = `delays` ms, WAIT = `wait` ms.
fn repeat(
    id: &str,
    values: &[i32],
    delays: &[u32],
    wait: u32,
    final_flag: bool,
) -> ModelInferRequest {
    let mut r = ModelInferRequest {
        model_name: "repeat_int32".into(),
        id: id.into(),
        inputs: vec![
            tensor("IN", "INT32", values.len()),
            tensor("DELAY", "UINT32", delays.len()),
            tensor("WAIT", "UINT32", 1),
        ],
        raw_input_contents: vec![
            le32(values, i32::to_le_bytes),
            le32(delays, u32::to_le_bytes),
            le32(&[wait], u32::to_le_bytes),
        ],
        ..Default::default()
    };
    if final_flag {
        r.parameters.insert(
            "triton_enable_empty_final_response".into(),
            InferParameter {
                parameter_choice: Some(ParameterChoice::BoolParam(true)),
            },
        );
    }
    r
}

fn final_flag(r: &ModelStreamInferResponse) -> Option<bool> {
    let p = r
        .infer_response
        .as_ref()?
        .parameters
        .get("triton_final_response")?;
    match p.parameter_choice {
        Some(ParameterChoice::BoolParam(b)) => Some(b),
        _ => None,
    }
}

fn id(r: &ModelStreamInferResponse) -> &str {
    r.infer_response.as_ref().map_or("", |i| i.id.as_str())
}

/// (OUT, IDX) of a `repeat_int32` data response.
fn out_idx(r: &ModelStreamInferResponse) -> (i32, u32) {
    assert!(r.error_message.is_empty(), "{}", r.error_message);
    let resp = r.infer_response.as_ref().expect("response");
    let names: Vec<&str> = resp.outputs.iter().map(|o| o.name.as_str()).collect();
    let pos = |n: &str| names.iter().position(|x| *x == n).expect("output present");
    let raw = |i: usize| -> [u8; 4] {
        resp.raw_output_contents[i][..4]
            .try_into()
            .expect("4 bytes")
    };
    (
        i32::from_le_bytes(raw(pos("OUT"))),
        u32::from_le_bytes(raw(pos("IDX"))),
    )
}

/// Sends `requests` on one stream, half-closes, and collects every
/// response until the server ends the stream.
async fn stream_all(
    c: &mut GrpcInferenceServiceClient<Channel>,
    requests: Vec<ModelInferRequest>,
) -> Vec<ModelStreamInferResponse> {
    let outbound = futures::stream::iter(requests);
    let mut inbound = c
        .model_stream_infer(outbound)
        .await
        .expect("stream")
        .into_inner();
    let mut out = Vec::new();
    while let Some(r) = inbound.next().await {
        out.push(r.expect("stream stays OK"));
    }
    out
}

#[tokio::test]
async fn responses_arrive_in_order_then_the_empty_final_response() {
    let server = start_server(2);
    let mut c = client(server.grpc_addr()).await;
    let values = [10, 20, 30, 40];
    let rs = stream_all(&mut c, vec![repeat("a", &values, &[1, 1, 1, 1], 0, true)]).await;
    assert_eq!(rs.len(), values.len() + 1, "{rs:?}");
    for (i, r) in rs[..values.len()].iter().enumerate() {
        assert_eq!(out_idx(r), (values[i], i as u32));
        assert_eq!(id(r), "a");
        assert_eq!(final_flag(r), Some(false));
    }
    let last = &rs[values.len()];
    assert_eq!(final_flag(last), Some(true));
    assert_eq!(id(last), "a");
    assert!(last
        .infer_response
        .as_ref()
        .expect("resp")
        .outputs
        .is_empty());

    // Without the flag: the data responses only, no flag parameter.
    let rs = stream_all(&mut c, vec![repeat("b", &values, &[0; 4], 0, false)]).await;
    assert_eq!(rs.len(), values.len());
    assert!(rs.iter().all(|r| final_flag(r).is_none()));

    // Zero elements: only the final flag (nothing without the flag).
    let rs = stream_all(&mut c, vec![repeat("z", &[], &[], 0, true)]).await;
    assert_eq!(rs.len(), 1);
    assert_eq!(final_flag(&rs[0]), Some(true));
    assert!(stream_all(&mut c, vec![repeat("z", &[], &[], 0, false)])
        .await
        .is_empty());

    // Statistics: one success per request, one execution per request.
    let stats = common::get(server.http_addr(), "/v2/models/repeat_int32/stats").json();
    let s = &stats["model_stats"][0];
    assert_eq!(s["inference_stats"]["success"]["count"], 4, "{s}");
    assert_eq!(s["execution_count"], 4, "{s}");
    server.shutdown().expect("shutdown");
}

#[tokio::test]
async fn requests_on_one_stream_interleave_and_keep_their_own_order() {
    let server = start_server(2);
    let mut c = client(server.grpc_addr()).await;
    // WAIT 0: the model takes the second request while the first still
    // sends, so their responses interleave.
    let a: Vec<i32> = (0..6).collect();
    let b: Vec<i32> = (100..106).collect();
    let rs = stream_all(
        &mut c,
        vec![
            repeat("a", &a, &[30; 6], 0, true),
            repeat("b", &b, &[30; 6], 0, true),
        ],
    )
    .await;
    assert_eq!(rs.len(), 14);
    let order: Vec<&str> = rs.iter().map(id).collect();
    let first_b = order.iter().position(|i| *i == "b").expect("b answered");
    let last_a = order.iter().rposition(|i| *i == "a").expect("a answered");
    assert!(first_b < last_a, "interleaved: {order:?}");
    for (name, values) in [("a", &a), ("b", &b)] {
        let data: Vec<(i32, u32)> = rs
            .iter()
            .filter(|r| id(r) == name && final_flag(r) == Some(false))
            .map(out_idx)
            .collect();
        let expected: Vec<(i32, u32)> = values
            .iter()
            .enumerate()
            .map(|(i, v)| (*v, i as u32))
            .collect();
        assert_eq!(data, expected, "{name} in order");
        let last = rs.iter().rposition(|r| id(r) == name).expect("some");
        assert_eq!(
            final_flag(&rs[last]),
            Some(true),
            "{name}'s final comes last"
        );
    }
    server.shutdown().expect("shutdown");
}

#[tokio::test]
async fn errors_stay_on_the_stream_and_outputs_can_be_chosen() {
    let server = start_server(1);
    let mut c = client(server.grpc_addr()).await;
    let mut only_out = repeat("o", &[7, 8], &[0, 0], 0, false);
    only_out.outputs = vec![InferRequestedOutputTensor {
        name: "OUT".into(),
        ..Default::default()
    }];
    let mut square = ModelInferRequest {
        model_name: "square_int32".into(),
        id: "sq".into(),
        inputs: vec![tensor("IN", "INT32", 1)],
        raw_input_contents: vec![le32(&[3], i32::to_le_bytes)],
        ..Default::default()
    };
    square.parameters = repeat("", &[], &[], 0, true).parameters;
    let rs = stream_all(
        &mut c,
        vec![
            // DELAY's shape differs from IN's: an error response.
            repeat("bad", &[1, 2], &[0], 0, false),
            only_out,
            square,
        ],
    )
    .await;
    let bad: Vec<_> = rs.iter().filter(|r| id(r) == "bad").collect();
    assert_eq!(bad.len(), 1);
    assert!(
        bad[0].error_message.contains("DELAY"),
        "{}",
        bad[0].error_message
    );
    let outs: Vec<_> = rs.iter().filter(|r| id(r) == "o").collect();
    assert_eq!(outs.len(), 2);
    for r in outs {
        let names: Vec<&str> = r
            .infer_response
            .as_ref()
            .expect("r")
            .outputs
            .iter()
            .map(|o| o.name.as_str())
            .collect();
        assert_eq!(names, ["OUT"]);
    }
    let sq: Vec<_> = rs.iter().filter(|r| id(r) == "sq").collect();
    assert_eq!(sq.len(), 4, "three responses and the final one");
    for r in &sq[..3] {
        let resp = r.infer_response.as_ref().expect("r");
        assert_eq!(&resp.raw_output_contents[0][..], &3i32.to_le_bytes());
    }
    assert_eq!(final_flag(sq[3]), Some(true));
    server.shutdown().expect("shutdown");
}

#[tokio::test]
async fn cancelling_the_stream_stops_a_long_request() {
    // A model of its own: the response counter is per model name, and the
    // other tests send on `repeat_int32` at the same time.
    let config = std::fs::read_to_string(common::repo_path("models/repeat_int32/config.pbtxt"))
        .expect("config")
        .replace("name: \"repeat_int32\"", "name: \"repeat_cancel\"");
    let repo = TempRepo::new("decoupled-cancel", &[("repeat_cancel", config)]);
    let mut opts = ServerOptions::for_tests(repo.root.clone());
    opts.cores = Some(2);
    let server = start_with(opts);
    let mut c = client(server.grpc_addr()).await;
    // 1000 responses, 5 ms apart: 5 s if nobody stops it.
    let n = 1000;
    let values: Vec<i32> = (0..n).collect();
    let (mut tx, rx) = mpsc::channel(4);
    let mut long = repeat("long", &values, &vec![5; n as usize], 0, false);
    long.model_name = "repeat_cancel".into();
    tx.send(long).await.expect("queued");
    let mut inbound = c.model_stream_infer(rx).await.expect("stream").into_inner();
    let before = responses_sent("repeat_cancel");
    for _ in 0..20 {
        let r = inbound.next().await.expect("a response").expect("ok");
        assert_eq!(id(&r), "long");
    }
    // The client goes away: the stream is reset.
    drop(inbound);
    drop(tx);
    drop(c);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let settled = responses_sent("repeat_cancel");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let later = responses_sent("repeat_cancel");
    assert!(
        later - before < 200,
        "work went on: {} responses",
        later - before
    );
    assert_eq!(
        later, settled,
        "the model still sends after the client left"
    );
    server.shutdown().expect("shutdown");
}

#[tokio::test]
async fn unary_infer_refuses_decoupled_models_with_tritons_errors() {
    let server = start_server(1);
    let mut c = client(server.grpc_addr()).await;
    let e = c
        .model_infer(repeat("u", &[1], &[0], 0, false))
        .await
        .expect_err("refused");
    assert_eq!(e.code(), Code::Unimplemented);
    assert_eq!(
        e.message(),
        "ModelInfer RPC doesn't support models with decoupled transaction policy"
    );
    let body = serde_json::json!({"inputs": [
        {"name": "IN", "datatype": "INT32", "shape": [1], "data": [1]},
        {"name": "DELAY", "datatype": "UINT32", "shape": [1], "data": [0]},
        {"name": "WAIT", "datatype": "UINT32", "shape": [1], "data": [0]}
    ]});
    let reply = post_json(server.http_addr(), "/v2/models/repeat_int32/infer", &body);
    assert_eq!(reply.status, 501);
    assert_eq!(
        reply.error(),
        "HTTP end point doesn't support models with decoupled transaction policy"
    );
    // The server keeps serving.
    let reply = post_json(
        server.http_addr(),
        "/v2/models/simple/infer",
        &common::simple_json_request(1),
    );
    assert_eq!(reply.status, 200);
    server.shutdown().expect("shutdown");
}

#[tokio::test]
async fn generate_and_generate_stream() {
    let server = start_server(2);
    let addr = server.http_addr();
    // One response: /generate answers it as one JSON object.
    let one = serde_json::json!({"IN": [5], "DELAY": [0], "WAIT": 0});
    let reply = post_json(addr, "/v2/models/repeat_int32/generate", &one);
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let v = reply.json();
    assert_eq!(v["OUT"], 5);
    assert_eq!(v["IDX"], 0);
    assert_eq!(v["model_name"], "repeat_int32");

    // Three responses: /generate refuses, /generate_stream sends 3 events.
    let three = serde_json::json!({"IN": [1, 2, 3], "DELAY": [0, 20, 20], "WAIT": 0});
    let reply = post_json(addr, "/v2/models/repeat_int32/generate", &three);
    assert!(
        reply.error().contains("exactly 1 response"),
        "{}",
        reply.error()
    );
    let started = Instant::now();
    let reply = post_json(addr, "/v2/models/repeat_int32/generate_stream", &three);
    assert!(started.elapsed() >= Duration::from_millis(40));
    assert_eq!(reply.status, 200);
    assert!(reply
        .header("content-type")
        .is_some_and(|c| c.starts_with("text/event-stream")));
    let text = String::from_utf8_lossy(&reply.body).to_string();
    let events: Vec<serde_json::Value> = text
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| serde_json::from_str(e.strip_prefix("data: ").expect("data event")).expect("JSON"))
        .collect();
    assert_eq!(events.len(), 3, "{text}");
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["OUT"], i as i64 + 1);
        assert_eq!(e["IDX"], i as i64);
    }

    // A non-decoupled model works too.
    let simple =
        serde_json::json!({"INPUT0": (0..16).collect::<Vec<i32>>(), "INPUT1": vec![1; 16]});
    let reply = post_json(addr, "/v2/models/simple/generate", &simple);
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(reply.json()["OUTPUT0"][15], 16);
    // A bad request gets a clear error and the status from the first event.
    let reply = post_json(
        addr,
        "/v2/models/repeat_int32/generate_stream",
        &serde_json::json!({"IN": [1], "DELAY": [0, 1], "WAIT": 0}),
    );
    assert_eq!(reply.status, 400);
    assert!(String::from_utf8_lossy(&reply.body).starts_with("data: {\"error\""));
    server.shutdown().expect("shutdown");
}

/// Reads from `conn` until `done` holds for what was read so far.
fn read_until(conn: &mut std::net::TcpStream, buf: &mut Vec<u8>, done: impl Fn(&[u8]) -> bool) {
    use std::io::Read;
    let mut chunk = [0u8; 4096];
    while !done(buf) {
        let n = conn.read(&mut chunk).expect("read");
        assert!(
            n > 0,
            "connection closed early: {}",
            String::from_utf8_lossy(buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn events(raw: &[u8]) -> usize {
    raw.windows(6).filter(|w| w == b"data: ").count()
}

/// `repeat_int32` sending `n` events 150 ms apart, as a generate_stream
/// request on a keep-alive connection.
fn slow_generate_stream(addr: std::net::SocketAddr, n: usize) -> std::net::TcpStream {
    use std::io::Write;
    let body = serde_json::json!({
        "IN": (0..n as i32).collect::<Vec<_>>(),
        "DELAY": vec![150; n],
        "WAIT": 0,
    })
    .to_string();
    let mut conn = std::net::TcpStream::connect(addr).expect("connect");
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    write!(
        conn,
        "POST /v2/models/repeat_int32/generate_stream HTTP/1.1\r\nHost: x\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    conn
}

/// The idle timeout counts from the end of the stream, not from its
/// headers: a stream longer than it is neither cut nor followed by a
/// close, and the connection serves the next request.
#[test]
fn a_generate_stream_longer_than_the_idle_timeout_keeps_its_connection() {
    use std::io::Write;
    let mut opts = ServerOptions::for_tests(common::repo_path("models"));
    opts.cores = Some(2);
    opts.idle_timeout = Duration::from_millis(200);
    let server = start_with(opts);
    let mut conn = slow_generate_stream(server.http_addr(), 6);
    let mut buf = Vec::new();
    read_until(&mut conn, &mut buf, |b| b.ends_with(b"0\r\n\r\n"));
    assert_eq!(events(&buf), 6, "{}", String::from_utf8_lossy(&buf));
    let head = String::from_utf8_lossy(&buf).to_ascii_lowercase();
    assert!(!head.contains("connection: close"), "{head}");
    conn.write_all(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("second request on the connection");
    let mut next = Vec::new();
    read_until(&mut conn, &mut next, |b| {
        b.windows(4).any(|w| w == b"\r\n\r\n")
    });
    assert!(
        next.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&next)
    );
    server.shutdown().expect("shutdown");
}

/// Graceful shutdown waits for an SSE stream in progress, as for any
/// request in flight: every event arrives, then the connection closes.
#[test]
fn graceful_shutdown_waits_for_a_generate_stream() {
    let mut opts = ServerOptions::for_tests(common::repo_path("models"));
    opts.cores = Some(2);
    opts.exit_timeout = Duration::from_secs(30);
    let server = start_with(opts);
    let mut conn = slow_generate_stream(server.http_addr(), 8);
    let mut buf = Vec::new();
    read_until(&mut conn, &mut buf, |b| events(b) >= 1);
    let reader = std::thread::spawn(move || {
        read_until(&mut conn, &mut buf, |b| b.ends_with(b"0\r\n\r\n"));
        buf
    });
    server.shutdown().expect("shutdown");
    let buf = reader.join().expect("reader");
    assert_eq!(events(&buf), 8, "{}", String::from_utf8_lossy(&buf));
    for i in 0..8 {
        let idx = format!("\"IDX\":{i}");
        assert!(
            String::from_utf8_lossy(&buf).contains(&idx),
            "event {i} missing"
        );
    }
}

/// Graceful shutdown with a decoupled request running on a gRPC stream:
/// its remaining responses and final flag arrive before the stream ends.
#[tokio::test]
async fn graceful_shutdown_waits_for_a_running_decoupled_request() {
    let mut opts = ServerOptions::for_tests(common::repo_path("models"));
    opts.cores = Some(2);
    opts.exit_timeout = Duration::from_secs(30);
    let server = start_with(opts);
    let mut c = client(server.grpc_addr()).await;
    let (mut tx, rx) = mpsc::channel(4);
    let mut inbound = c.model_stream_infer(rx).await.expect("stream").into_inner();
    tx.send(repeat("long", &[0, 1, 2, 3, 4, 5], &[150; 6], 0, true))
        .await
        .expect("send");
    let first = inbound
        .message()
        .await
        .expect("ok")
        .expect("first response");
    assert_eq!(out_idx(&first), (0, 0));
    let shutdown = std::thread::spawn(move || server.shutdown());
    let mut rest = Vec::new();
    while let Ok(Some(r)) = inbound.message().await {
        rest.push(r);
    }
    shutdown.join().expect("join").expect("shutdown");
    drop(tx);
    let data: Vec<(i32, u32)> = rest
        .iter()
        .filter(|r| final_flag(r) != Some(true))
        .map(out_idx)
        .collect();
    assert_eq!(data, (1..6).map(|i| (i, i as u32)).collect::<Vec<_>>());
    let last = rest.last().expect("final response");
    assert_eq!(final_flag(last), Some(true));
    assert_eq!(id(last), "long");
}

/// `--request-timeout-ms` and the request's `timeout` parameter bound a
/// decoupled request's wait in the queue (as Triton applies request
/// timeouts), never its responses once it runs.
#[tokio::test]
async fn request_timeouts_bound_a_decoupled_requests_queue_time_only() {
    // Server timeout 300 ms: `long` answers for 450 ms and holds the only
    // instance for 900 ms (WAIT); `queued` waits behind it and expires.
    let mut opts = ServerOptions::for_tests(common::repo_path("models"));
    opts.cores = Some(2);
    opts.request_timeout = Some(Duration::from_millis(300));
    let server = start_with(opts);
    let mut c = client(server.grpc_addr()).await;
    let out = stream_all(
        &mut c,
        vec![
            repeat("long", &[7, 8, 9], &[150, 150, 150], 900, true),
            repeat("queued", &[1], &[0], 0, true),
        ],
    )
    .await;
    let long: Vec<_> = out.iter().filter(|r| id(r) == "long").collect();
    assert_eq!(long.len(), 4, "{out:?}");
    assert_eq!(
        long[..3].iter().map(|r| out_idx(r)).collect::<Vec<_>>(),
        vec![(7, 0), (8, 1), (9, 2)]
    );
    assert_eq!(final_flag(long[3]), Some(true));
    let queued: Vec<_> = out
        .iter()
        .filter(|r| r.error_message.contains("Request timeout expired"))
        .collect();
    assert_eq!(queued.len(), 1, "{out:?}");
    server.shutdown().expect("shutdown");

    // No server timeout: the request's own `timeout` (µs) applies.
    let server = start_server(2);
    let mut c = client(server.grpc_addr()).await;
    let with_timeout = |id: &str, us: i64| {
        let mut r = repeat(id, &[1], &[0], 0, true);
        r.parameters.insert(
            "timeout".into(),
            InferParameter {
                parameter_choice: Some(ParameterChoice::Int64Param(us)),
            },
        );
        r
    };
    let out = stream_all(
        &mut c,
        vec![
            repeat("busy", &[5], &[0], 600, true),
            with_timeout("short", 100_000),
            with_timeout("ample", 30_000_000),
        ],
    )
    .await;
    let errors: Vec<&str> = out
        .iter()
        .filter(|r| !r.error_message.is_empty())
        .map(|r| r.error_message.as_str())
        .collect();
    assert_eq!(errors.len(), 1, "{out:?}");
    assert!(errors[0].contains("Request timeout expired"), "{errors:?}");
    let finals: Vec<&str> = out
        .iter()
        .filter(|r| r.error_message.is_empty() && final_flag(r) == Some(true))
        .map(id)
        .collect();
    assert_eq!(finals, vec!["busy", "ample"], "{out:?}");
    server.shutdown().expect("shutdown");
}

/// A decoupled model behind the dynamic batcher: `--request-timeout-ms`
/// bounds a request's wait in the batcher's queue too (the batcher used to
/// drop the job's deadline, so a request behind a busy instance waited for
/// as long as the instance was busy).
#[tokio::test]
async fn the_request_timeout_bounds_a_decoupled_requests_wait_in_the_dynamic_batcher() {
    let config = std::fs::read_to_string(common::repo_path("models/repeat_int32/config.pbtxt"))
        .expect("config")
        .replace("name: \"repeat_int32\"", "name: \"repeat_batched\"")
        .replace(
            "max_batch_size: 0",
            "max_batch_size: 1\ndynamic_batching { }",
        );
    let repo = TempRepo::new("decoupled-batched-timeout", &[("repeat_batched", config)]);
    let mut opts = ServerOptions::for_tests(repo.root.clone());
    opts.cores = Some(2);
    opts.request_timeout = Some(Duration::from_millis(300));
    let server = start_with(opts);
    let mut c = client(server.grpc_addr()).await;
    let batched = |mut r: ModelInferRequest| {
        r.model_name = "repeat_batched".into();
        for input in &mut r.inputs {
            input.shape.insert(0, 1);
        }
        r
    };
    let out = stream_all(
        &mut c,
        vec![
            // Holds the only instance for 1.5 s (WAIT); its one response and
            // final flag come at once, from the responder thread.
            batched(repeat("busy", &[5], &[0], 1500, true)),
            batched(repeat("queued", &[1], &[0], 0, true)),
        ],
    )
    .await;
    let errors: Vec<(&str, &str)> = out
        .iter()
        .filter(|r| !r.error_message.is_empty())
        .map(|r| (id(r), r.error_message.as_str()))
        .collect();
    assert_eq!(errors.len(), 1, "{out:?}");
    assert!(
        errors[0]
            .1
            .contains("Request timeout expired for model 'repeat_batched'"),
        "{errors:?}"
    );
    let finals: Vec<&str> = out
        .iter()
        .filter(|r| r.error_message.is_empty() && final_flag(r) == Some(true))
        .map(id)
        .collect();
    assert_eq!(finals, vec!["busy"], "{out:?}");
    server.shutdown().expect("shutdown");
}
