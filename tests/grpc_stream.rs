//! gRPC `ModelStreamInfer` (bidirectional streaming) for non-decoupled
//! models, over real HTTP/2 against an in-process server with tonic's
//! client: one response per request with its id, errors on the stream
//! without closing it, the `triton_final_response` flag, half-close, and
//! clients that go away mid-flight.

mod common;

use std::{
    collections::HashMap,
    path::PathBuf,
    thread,
    time::{Duration, Instant},
};

use common::{get, start_server, start_with};
use futures::{channel::mpsc, stream, StreamExt};
use shardserve::{
    proto::inference::{
        grpc_inference_service_client::GrpcInferenceServiceClient,
        infer_parameter::ParameterChoice, model_infer_request::InferInputTensor, InferParameter,
        InferTensorContents, ModelInferRequest, ModelStreamInferResponse,
    },
    server::{ServerHandle, ServerOptions},
};
use tonic::{transport::Channel, Code};

use common::grpc_client as client;

fn int32_bytes(v: impl IntoIterator<Item = i32>) -> bytes::Bytes {
    v.into_iter()
        .flat_map(i32::to_le_bytes)
        .collect::<Vec<u8>>()
        .into()
}

fn decode_i32(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// `simple` with INPUT0 = 0..16 and INPUT1 = all `b`.
fn simple_request(id: &str, b: i32) -> ModelInferRequest {
    let input = |name: &str| InferInputTensor {
        name: name.into(),
        datatype: "INT32".into(),
        shape: vec![1, 16],
        ..Default::default()
    };
    ModelInferRequest {
        model_name: "simple".into(),
        id: id.into(),
        inputs: vec![input("INPUT0"), input("INPUT1")],
        raw_input_contents: vec![int32_bytes(0..16), int32_bytes(std::iter::repeat_n(b, 16))],
        ..Default::default()
    }
}

fn with_final_flag(mut r: ModelInferRequest) -> ModelInferRequest {
    r.parameters.insert(
        "triton_enable_empty_final_response".into(),
        InferParameter {
            parameter_choice: Some(ParameterChoice::BoolParam(true)),
        },
    );
    r
}

/// Checks a successful `simple` answer for INPUT1 = `b`.
fn assert_simple_sum(r: &ModelStreamInferResponse, b: i32) {
    assert!(r.error_message.is_empty(), "{}", r.error_message);
    let resp = r.infer_response.as_ref().expect("infer_response");
    assert_eq!(resp.model_name, "simple");
    let sum: Vec<i32> = (0..16).map(|x| x + b).collect();
    let diff: Vec<i32> = (0..16).map(|x| x - b).collect();
    assert_eq!(
        decode_i32(&resp.raw_output_contents[0]),
        sum,
        "id {}",
        resp.id
    );
    assert_eq!(
        decode_i32(&resp.raw_output_contents[1]),
        diff,
        "id {}",
        resp.id
    );
}

fn response_id(r: &ModelStreamInferResponse) -> &str {
    r.infer_response.as_ref().map_or("", |x| x.id.as_str())
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

/// Sends `requests` on one stream (then half-closes) and reads the
/// responses until the stream ends; returns them and the stream's end.
async fn stream_all(
    c: &mut GrpcInferenceServiceClient<Channel>,
    requests: Vec<ModelInferRequest>,
) -> (Vec<ModelStreamInferResponse>, Result<(), tonic::Status>) {
    let mut responses = c
        .model_stream_infer(stream::iter(requests))
        .await
        .expect("stream opens")
        .into_inner();
    let mut out = Vec::new();
    loop {
        match responses.message().await {
            Ok(Some(r)) => out.push(r),
            Ok(None) => return (out, Ok(())),
            Err(s) => return (out, Err(s)),
        }
    }
}

#[tokio::test]
async fn many_requests_on_one_stream_are_answered_with_their_ids() {
    // Two shards: requests on one connection go to `simple`'s owner
    // shard, locally or over the ring.
    let server = start_server(2);
    let mut c = client(server.grpc_addr()).await;
    // More than the per-stream bound of requests in flight.
    let n = 3000;
    let requests = (0..n)
        .map(|i| simple_request(&format!("r{i}"), i))
        .collect();
    let (responses, end) = stream_all(&mut c, requests).await;
    end.expect("half-close ends the stream OK");
    assert_eq!(responses.len(), n as usize);
    let mut seen = HashMap::new();
    for r in &responses {
        let id = response_id(r).to_string();
        let b: i32 = id.trim_start_matches('r').parse().expect("an id we sent");
        assert_simple_sum(r, b);
        assert_eq!(final_flag(r), None, "no triton_final_response unless asked");
        assert!(seen.insert(id, ()).is_none(), "one response per request");
    }
    server.shutdown().expect("shutdown");
}

#[tokio::test]
async fn failed_requests_are_answered_on_the_stream_and_it_goes_on() {
    let server = start_server(1);
    let mut c = client(server.grpc_addr()).await;

    let mut unknown = simple_request("unknown-model", 1);
    unknown.model_name = "nope".into();
    unknown.model_version = "3".into();
    let mut bad_shape = simple_request("bad-shape", 1);
    bad_shape.inputs[1].shape = vec![1, 15];
    bad_shape.raw_input_contents[1] = int32_bytes(0..15);
    let mut bad_contents = simple_request("bad-contents", 1);
    bad_contents.inputs[0].contents = Some(InferTensorContents {
        int_contents: vec![0; 16],
        ..Default::default()
    });
    let mut long_name = simple_request("long-name", 1);
    long_name.model_name = "m".repeat(1 << 20);

    let requests = vec![
        simple_request("ok-0", 0),
        unknown,
        simple_request("ok-1", 1),
        bad_shape,
        simple_request("ok-2", 2),
        bad_contents,
        long_name,
        simple_request("ok-3", 3),
    ];
    let (responses, end) = stream_all(&mut c, requests).await;
    end.expect("errors do not end the stream");
    assert_eq!(responses.len(), 8);
    let by_id: HashMap<&str, &ModelStreamInferResponse> =
        responses.iter().map(|r| (response_id(r), r)).collect();
    for b in 0..4 {
        assert_simple_sum(by_id[format!("ok-{b}").as_str()], b);
    }

    let r = by_id["unknown-model"];
    assert!(
        r.error_message.contains("Request for unknown model"),
        "{}",
        r.error_message
    );
    let echoed = r.infer_response.as_ref().expect("failed requests echo who");
    assert_eq!(
        (echoed.model_name.as_str(), echoed.model_version.as_str()),
        ("nope", "3")
    );
    assert!(echoed.outputs.is_empty() && echoed.raw_output_contents.is_empty());

    let r = by_id["bad-shape"];
    assert!(r.error_message.contains("INPUT1"), "{}", r.error_message);
    assert_eq!(
        r.infer_response.as_ref().expect("echo").model_name,
        "simple"
    );

    let r = by_id["bad-contents"];
    assert!(
        r.error_message.contains(
            "contents field must not be specified when using raw_input_contents \
             for 'INPUT0' for model 'simple'"
        ),
        "{}",
        r.error_message
    );

    let r = by_id["long-name"];
    assert!(r.error_message.contains("Request for unknown model"));
    let echoed = &r.infer_response.as_ref().expect("echo").model_name;
    assert!(echoed.len() < 1024, "a 1 MB name came back whole");
    assert!(r.error_message.len() < 8192);
    server.shutdown().expect("shutdown");
}

#[tokio::test]
async fn empty_final_response_flag_marks_every_response_final() {
    let server = start_server(1);
    let mut c = client(server.grpc_addr()).await;
    let mut unknown = with_final_flag(simple_request("flag-error", 1));
    unknown.model_name = "nope".into();
    let mut flag_false = simple_request("flag-false", 2);
    flag_false.parameters.insert(
        "triton_enable_empty_final_response".into(),
        InferParameter {
            parameter_choice: Some(ParameterChoice::BoolParam(false)),
        },
    );
    let requests = vec![
        with_final_flag(simple_request("flag", 1)),
        simple_request("plain", 1),
        unknown,
        flag_false,
    ];
    let (responses, end) = stream_all(&mut c, requests).await;
    end.expect("stream ends OK");
    assert_eq!(responses.len(), 4);
    let by_id: HashMap<&str, &ModelStreamInferResponse> =
        responses.iter().map(|r| (response_id(r), r)).collect();
    assert_simple_sum(by_id["flag"], 1);
    assert_eq!(final_flag(by_id["flag"]), Some(true));
    assert_eq!(final_flag(by_id["plain"]), None);
    assert!(!by_id["flag-error"].error_message.is_empty());
    assert_eq!(
        final_flag(by_id["flag-error"]),
        Some(true),
        "an error is the request's final response too"
    );
    assert_eq!(final_flag(by_id["flag-false"]), None);
    server.shutdown().expect("shutdown");
}

#[tokio::test]
async fn responses_arrive_while_the_stream_stays_open() {
    let server = start_server(1);
    let mut c = client(server.grpc_addr()).await;
    let (tx, rx) = mpsc::unbounded();
    let mut responses = c
        .model_stream_infer(rx)
        .await
        .expect("stream opens")
        .into_inner();
    // One at a time: each answer comes back before the next request is
    // sent and before the client half-closes.
    for i in 0..20 {
        tx.unbounded_send(simple_request(&format!("step-{i}"), i))
            .expect("send");
        let r = tokio::time::timeout(Duration::from_secs(10), responses.message())
            .await
            .expect("an answer without half-close")
            .expect("stream ok")
            .expect("a response");
        assert_eq!(response_id(&r), format!("step-{i}"));
        assert_simple_sum(&r, i);
    }
    drop(tx);
    assert!(responses.message().await.expect("ends OK").is_none());
    server.shutdown().expect("shutdown");
}

fn param(choice: ParameterChoice) -> InferParameter {
    InferParameter {
        parameter_choice: Some(choice),
    }
}

/// One step of a `sequence_accumulator` sequence.
fn sequence_step(seq: i64, step: i32, last: bool, value: i32) -> ModelInferRequest {
    let mut r = ModelInferRequest {
        model_name: "sequence_accumulator".into(),
        id: format!("{seq}-{step}"),
        inputs: vec![InferInputTensor {
            name: "INPUT".into(),
            datatype: "INT32".into(),
            shape: vec![1, 1],
            ..Default::default()
        }],
        raw_input_contents: vec![int32_bytes([value])],
        ..Default::default()
    };
    r.parameters.insert(
        "sequence_id".into(),
        param(ParameterChoice::Int64Param(seq)),
    );
    r.parameters.insert(
        "sequence_start".into(),
        param(ParameterChoice::BoolParam(step == 0)),
    );
    r.parameters.insert(
        "sequence_end".into(),
        param(ParameterChoice::BoolParam(last)),
    );
    r
}

/// Stateful sequences depend on the stream's order: interleaved
/// sequences sent back to back on one stream (all in flight at once)
/// reach the sequence batcher in stream order, so every running sum is
/// right.
#[tokio::test]
async fn requests_reach_the_scheduler_in_stream_order() {
    // Two shards: the model's owner may be the other one (the ring).
    let server = start_server(2);
    let mut c = client(server.grpc_addr()).await;
    let (seqs, steps) = (3i64, 40i32);
    let value = |seq: i64, step: i32| (seq as i32) * 100 + step;
    let mut requests = Vec::new();
    for step in 0..steps {
        for seq in 1..=seqs {
            requests.push(sequence_step(
                seq,
                step,
                step == steps - 1,
                value(seq, step),
            ));
        }
    }
    let (responses, end) = stream_all(&mut c, requests).await;
    end.expect("stream ends OK");
    assert_eq!(responses.len(), (seqs as usize) * (steps as usize));
    for r in &responses {
        assert!(r.error_message.is_empty(), "{}", r.error_message);
        let id = response_id(r);
        let (seq, step) = id.split_once('-').expect("our id");
        let (seq, step): (i64, i32) = (seq.parse().expect("seq"), step.parse().expect("step"));
        let expected: i32 = (0..=step).map(|s| value(seq, s)).sum();
        let resp = r.infer_response.as_ref().expect("response");
        assert_eq!(
            decode_i32(&resp.raw_output_contents[0]),
            vec![expected],
            "running sum of sequence {seq} at step {step}"
        );
    }
    server.shutdown().expect("shutdown");
}

/// Typed contents large enough to be decoded on the offload pool: the
/// request is answered like any other, and the small ones around it too.
#[tokio::test]
async fn large_typed_contents_are_decoded_off_the_shard_in_turn() {
    let server = start_server(1);
    let mut c = client(server.grpc_addr()).await;
    let element = vec![b'z'; 300 << 10];
    let big = ModelInferRequest {
        model_name: "simple_identity".into(),
        id: "big".into(),
        inputs: vec![InferInputTensor {
            name: "INPUT0".into(),
            datatype: "BYTES".into(),
            shape: vec![1, 1],
            contents: Some(InferTensorContents {
                bytes_contents: vec![element.clone()],
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    };
    let requests = vec![
        simple_request("small-0", 0),
        big,
        simple_request("small-1", 1),
    ];
    let (responses, end) = stream_all(&mut c, requests).await;
    end.expect("stream ends OK");
    let by_id: HashMap<&str, &ModelStreamInferResponse> =
        responses.iter().map(|r| (response_id(r), r)).collect();
    assert_eq!(by_id.len(), 3);
    assert_simple_sum(by_id["small-0"], 0);
    assert_simple_sum(by_id["small-1"], 1);
    let big = by_id["big"];
    assert!(big.error_message.is_empty(), "{}", big.error_message);
    let out = &big
        .infer_response
        .as_ref()
        .expect("response")
        .raw_output_contents[0];
    let mut expected = (element.len() as u32).to_le_bytes().to_vec();
    expected.extend_from_slice(&element);
    assert!(
        out[..] == expected[..],
        "the identity of 300 KiB of typed BYTES"
    );
    server.shutdown().expect("shutdown");
}

/// A model repository in a temporary directory, removed on drop.
struct TempRepo {
    root: PathBuf,
}

impl TempRepo {
    /// One identity model, `slow`, whose every execution takes `delay_ms`
    /// (Triton's QA parameter `execute_delay_ms`), one request at a time.
    fn slow(tag: &str, delay_ms: u64) -> Self {
        let root =
            std::env::temp_dir().join(format!("shardserve-stream-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("slow").join("1")).expect("model dir");
        let config = format!(
            r#"
name: "slow"
backend: "identity"
max_batch_size: 1
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "execute_delay_ms" value: {{ string_value: "{delay_ms}" }} }}
"#
        );
        std::fs::write(root.join("slow").join("config.pbtxt"), config).expect("config");
        Self { root }
    }

    fn start(&self, shards: usize) -> ServerHandle {
        let mut opts = ServerOptions::for_tests(&self.root);
        opts.cores = Some(shards);
        start_with(opts)
    }
}

impl Drop for TempRepo {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn slow_request(id: &str, v: i32) -> ModelInferRequest {
    ModelInferRequest {
        model_name: "slow".into(),
        id: id.into(),
        inputs: vec![InferInputTensor {
            name: "INPUT0".into(),
            datatype: "INT32".into(),
            shape: vec![1, 4],
            ..Default::default()
        }],
        raw_input_contents: vec![int32_bytes([v; 4])],
        ..Default::default()
    }
}

fn metrics(server: &ServerHandle) -> String {
    String::from_utf8_lossy(&get(server.metrics_addr(), "/metrics").body).to_string()
}

fn gauge_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn executions(server: &ServerHandle, model: &str) -> u64 {
    let r = get(server.http_addr(), &format!("/v2/models/{model}/stats"));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()["model_stats"][0]["execution_count"]
        .as_u64()
        .unwrap_or(0)
}

/// Waits until `f` holds (polling), or panics with `what` after 10 s.
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn counted_cancelled(text: &str, model: &str) -> bool {
    text.lines().any(|l| {
        l.starts_with("nv_inference_request_failure")
            && l.contains("reason=\"CANCELED\"")
            && l.contains(&format!("model=\"{model}\""))
            && !l.trim_end().ends_with(" 0")
    })
}

#[tokio::test]
async fn half_close_answers_everything_in_flight_then_ends_ok() {
    let repo = TempRepo::slow("halfclose", 50);
    let server = repo.start(1);
    let mut c = client(server.grpc_addr()).await;
    // The client half-closes right after the last message, long before
    // 6 × 50 ms of executions are done.
    let requests = (0..6).map(|i| slow_request(&format!("s{i}"), i)).collect();
    let t = Instant::now();
    let (responses, end) = stream_all(&mut c, requests).await;
    end.expect("stream ends OK after the last answer");
    assert!(
        t.elapsed() >= Duration::from_millis(250),
        "{:?}",
        t.elapsed()
    );
    let mut ids: Vec<&str> = responses.iter().map(response_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["s0", "s1", "s2", "s3", "s4", "s5"]);
    for r in &responses {
        assert!(r.error_message.is_empty(), "{}", r.error_message);
    }
    server.shutdown().expect("shutdown");
}

/// A client that drops its call (both halves): tonic's client resets the
/// stream (RST_STREAM CANCEL) and what it had queued is cancelled, not
/// executed; the server goes on serving streams.
#[tokio::test]
async fn a_client_that_drops_the_stream_cancels_its_queued_work() {
    let repo = TempRepo::slow("reset", 200);
    let server = repo.start(2);
    let mut c = client(server.grpc_addr()).await;
    let (tx, rx) = mpsc::unbounded();
    let responses = c
        .model_stream_infer(rx)
        .await
        .expect("stream opens")
        .into_inner();
    for i in 0..30 {
        tx.unbounded_send(slow_request(&format!("d{i}"), i))
            .expect("send");
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(responses);
    drop(tx);
    eventually(
        "the dropped stream's queued work to leave the queue",
        || gauge_sum(&metrics(&server), "shardserve_shard_queue_depth") == 0.0,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let n = executions(&server, "slow");
    assert!(n <= 3, "{n} of 30 requests of a dropped stream still ran");
    assert!(
        counted_cancelled(&metrics(&server), "slow"),
        "cancelled requests are counted"
    );

    // The same connection serves a new stream.
    let (responses, end) = stream_all(&mut c, vec![slow_request("after", 1)]).await;
    end.expect("ok");
    assert_eq!(response_id(&responses[0]), "after");
    assert!(responses[0].error_message.is_empty());
    server.shutdown().expect("shutdown");
}

/// A client whose connection goes away mid-stream (its process dies):
/// the stream's queued work is cancelled.
#[test]
fn a_lost_connection_cancels_the_streams_queued_work() {
    let repo = TempRepo::slow("lost", 200);
    let server = repo.start(1);
    let addr = server.grpc_addr();
    // The client's runtime, connection included, is dropped mid-flight.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio");
    rt.block_on(async {
        let mut c = client(addr).await;
        let requests: Vec<_> = (0..30).map(|i| slow_request(&format!("l{i}"), i)).collect();
        // Never half-closed: the stream stays open until the connection
        // goes.
        let inbound = stream::iter(requests).chain(stream::pending());
        let mut responses = c
            .model_stream_infer(inbound)
            .await
            .expect("stream opens")
            .into_inner();
        let first = responses.message().await.expect("ok").expect("a response");
        assert!(first.error_message.is_empty(), "{}", first.error_message);
    });
    drop(rt);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio");
    rt.block_on(async {
        eventually("the lost stream's queued work to leave the queue", || {
            gauge_sum(&metrics(&server), "shardserve_shard_queue_depth") == 0.0
                && gauge_sum(&metrics(&server), "shardserve_shard_in_flight_requests") == 0.0
        })
        .await;
    });
    thread::sleep(Duration::from_millis(300));
    let n = executions(&server, "slow");
    assert!(n <= 3, "{n} of 30 requests of a lost stream still ran");
    assert!(counted_cancelled(&metrics(&server), "slow"));
    server.shutdown().expect("shutdown");
}

/// A message over `--grpc-max-message-size` cannot be received (nor can
/// anything after it on the stream): the client gets an error response
/// and a status naming the limit, and the server goes on serving.
#[tokio::test]
async fn an_oversized_message_ends_the_stream_with_a_clear_status() {
    let mut opts = ServerOptions::for_tests(common::repo_path("models"));
    opts.grpc_max_message_size = 64 << 10;
    let server = start_with(opts);
    let mut c = client(server.grpc_addr()).await;
    let mut big = simple_request("big", 1);
    big.id = "x".repeat(100 << 10);
    let (responses, end) = stream_all(&mut c, vec![big, simple_request("after", 1)]).await;
    let status = end.expect_err("the stream fails");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("--grpc-max-message-size"),
        "{}",
        status.message()
    );
    let last = responses
        .last()
        .expect("an error response before the status");
    assert!(
        last.error_message.contains("too large"),
        "{}",
        last.error_message
    );

    let (responses, end) = stream_all(&mut c, vec![simple_request("next", 4)]).await;
    end.expect("a new stream works");
    assert_simple_sum(&responses[0], 4);
    server.shutdown().expect("shutdown");
}

/// A message that is not a `ModelInferRequest` on the wire: field 5
/// (`inputs`, a message) carrying bytes that do not decode as one.
#[derive(Clone, PartialEq, prost::Message)]
struct Garbage {
    #[prost(bytes = "vec", tag = "5")]
    inputs: Vec<u8>,
}

#[tokio::test]
async fn an_unreadable_message_is_answered_and_the_server_stays_healthy() {
    let server = start_server(1);
    let channel = Channel::from_shared(format!("http://{}", server.grpc_addr()))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut raw = tonic::client::Grpc::new(channel.clone());
    raw.ready().await.expect("ready");
    let garbage = Garbage {
        inputs: vec![0xff, 0xff, 0xff, 0xff],
    };
    let mut responses = raw
        .streaming::<_, Garbage, ModelStreamInferResponse, _>(
            tonic::Request::new(stream::iter(vec![garbage])),
            http::uri::PathAndQuery::from_static(
                "/inference.GRPCInferenceService/ModelStreamInfer",
            ),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .expect("stream opens")
        .into_inner();
    let r = responses
        .message()
        .await
        .expect("an error response first")
        .expect("a response");
    assert!(
        r.error_message.contains("could not be read"),
        "{}",
        r.error_message
    );
    let status = responses.message().await.expect_err("then the status");
    assert_eq!(status.code(), Code::Internal, "{status:?}");

    let mut c = GrpcInferenceServiceClient::new(channel);
    let (responses, end) = stream_all(&mut c, vec![simple_request("next", 5)]).await;
    end.expect("a new stream works");
    assert_simple_sum(&responses[0], 5);
    server.shutdown().expect("shutdown");
}

/// A stream stops reading at 1024 requests in flight: the rest wait in
/// the client's and the transport's buffers (HTTP/2 flow control), not in
/// the server's memory or its queues.
#[test]
fn a_stream_holds_at_most_1024_requests_in_flight() {
    let repo = TempRepo::slow("bound", 2000);
    let server = repo.start(1);
    let addr = server.grpc_addr();
    let in_flight = || gauge_sum(&metrics(&server), "shardserve_shard_in_flight_requests");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio");
    rt.block_on(async {
        let mut c = client(addr).await;
        let requests: Vec<_> = (0..1500)
            .map(|i| slow_request(&format!("b{i}"), i))
            .collect();
        let inbound = stream::iter(requests).chain(stream::pending());
        // Never read nor closed until the runtime, and the connection
        // with it, goes.
        let _responses = c
            .model_stream_infer(inbound)
            .await
            .expect("stream opens")
            .into_inner();
        eventually("the stream to fill its bound", || in_flight() >= 1024.0).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(in_flight(), 1024.0, "requests in flight on one stream");
    });
    drop(rt);
    let deadline = Instant::now() + Duration::from_secs(10);
    while in_flight() > 0.0 || gauge_sum(&metrics(&server), "shardserve_shard_queue_depth") > 0.0 {
        assert!(
            Instant::now() < deadline,
            "the lost stream's requests were not cancelled"
        );
        thread::sleep(Duration::from_millis(20));
    }
    server.shutdown().expect("shutdown");
}

/// Graceful shutdown with a stream open: what it has in flight is
/// answered, then the stream ends UNAVAILABLE instead of holding its
/// connection (and the shutdown) until the exit timeout.
#[test]
fn shutdown_answers_a_streams_requests_then_ends_it() {
    let repo = TempRepo::slow("shutdown", 300);
    let mut opts = ServerOptions::for_tests(&repo.root);
    opts.cores = Some(2);
    opts.exit_timeout = Duration::from_secs(30);
    let server = start_with(opts);
    let addr = server.grpc_addr();
    let (sent_tx, sent_rx) = std::sync::mpsc::channel();
    let client_thread = thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio");
        rt.block_on(async {
            let mut c = client(addr).await;
            let (tx, rx) = mpsc::unbounded();
            let mut responses = c
                .model_stream_infer(rx)
                .await
                .expect("stream opens")
                .into_inner();
            tx.unbounded_send(slow_request("in-flight", 1))
                .expect("send");
            sent_tx.send(()).expect("signal");
            let mut out = Vec::new();
            let end = loop {
                match responses.message().await {
                    Ok(Some(r)) => out.push(r),
                    Ok(None) => break Ok(()),
                    Err(s) => break Err(s),
                }
            };
            // The request side is still open: the server ended the call.
            drop(tx);
            (out, end)
        })
    });
    sent_rx.recv().expect("request sent");
    thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    server.shutdown().expect("shutdown");
    let took = t.elapsed();
    let (responses, end) = client_thread.join().expect("client");
    assert_eq!(responses.len(), 1);
    assert_eq!(response_id(&responses[0]), "in-flight");
    assert!(
        responses[0].error_message.is_empty(),
        "{}",
        responses[0].error_message
    );
    let status = end.expect_err("the stream ends UNAVAILABLE");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("shutting down"), "{status:?}");
    assert!(
        took < Duration::from_secs(5),
        "shutdown took {took:?}: an open stream held it"
    );
}
