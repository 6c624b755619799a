//! Triton's restricted APIs (`--http-restricted-api`,
//! `--grpc-restricted-protocol`) over real HTTP/1.1 and gRPC, the flags'
//! errors through the binary, and RESOURCE_EXHAUSTED for gRPC messages
//! over `--grpc-max-message-size`.

mod common;

use std::{
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use common::{request, simple_json_request, start_with, HttpReply};
use shardserve::{
    frontend::restricted::{Category, Protocol, Restrictions},
    proto::{
        health::{health_client::HealthClient, HealthCheckRequest},
        inference::{
            grpc_inference_service_client::GrpcInferenceServiceClient,
            model_infer_request::InferInputTensor, CudaSharedMemoryStatusRequest,
            LogSettingsRequest, ModelConfigRequest, ModelInferRequest, ModelMetadataRequest,
            ModelReadyRequest, ModelStatisticsRequest, RepositoryIndexRequest, ServerLiveRequest,
            ServerMetadataRequest, ServerReadyRequest, SystemSharedMemoryStatusRequest,
            TraceSettingRequest,
        },
    },
    server::ServerOptions,
};
use tonic::{codec::CompressionEncoding, transport::Channel, Code, Status};

fn restrictions(protocol: Protocol, flags: &[&str]) -> Restrictions {
    let flags: Vec<String> = flags.iter().map(|s| s.to_string()).collect();
    Restrictions::parse(protocol, &flags).expect("valid flags")
}

/// One group per category, each with its own key and value, so a test
/// also shows that another category's header does not open this one.
fn every_category_flags() -> Vec<String> {
    Category::ALL
        .iter()
        .map(|c| format!("{}:key-{}=value-{}", c.name(), c.name(), c.name()))
        .collect()
}

fn options() -> ServerOptions {
    ServerOptions::for_tests(common::repo_path("models"))
}

// ---------------------------------------------------------------- HTTP

/// A representative request per category: method, path, body.
fn http_requests(category: Category) -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let infer = simple_json_request(1).to_string().into_bytes();
    match category {
        Category::Health => vec![
            ("GET", "/v2/health/live", vec![]),
            ("GET", "/v2/health/ready", vec![]),
            ("GET", "/v2/models/simple/ready", vec![]),
        ],
        Category::Metadata => vec![
            ("GET", "/v2", vec![]),
            ("GET", "/v2/models/simple", vec![]),
            ("GET", "/v2/models/simple/versions/1", vec![]),
        ],
        Category::Inference => vec![
            ("POST", "/v2/models/simple/infer", infer.clone()),
            ("POST", "/v2/models/simple/versions/1/infer", infer),
        ],
        Category::SharedMemory => vec![
            ("GET", "/v2/systemsharedmemory/status", vec![]),
            ("GET", "/v2/cudasharedmemory/status", vec![]),
        ],
        Category::ModelConfig => vec![("GET", "/v2/models/simple/config", vec![])],
        Category::ModelRepository => vec![("POST", "/v2/repository/index", b"{}".to_vec())],
        Category::Statistics => vec![
            ("GET", "/v2/models/simple/stats", vec![]),
            ("GET", "/v2/models/stats", vec![]),
        ],
        Category::Trace => vec![
            ("GET", "/v2/trace/setting", vec![]),
            ("GET", "/v2/models/simple/trace/setting", vec![]),
        ],
        Category::Logging => vec![("GET", "/v2/logging", vec![])],
    }
}

fn send(
    addr: std::net::SocketAddr,
    (method, path, body): &(&str, &str, Vec<u8>),
    headers: &[(&str, &str)],
) -> HttpReply {
    request(addr, method, path, headers, body)
}

fn assert_refused(reply: &HttpReply, key: &str, what: &str) {
    assert_eq!(
        reply.status,
        403,
        "{what}: {}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(
        reply.error(),
        format!("This API is restricted, expecting header '{key}'"),
        "{what}"
    );
}

#[test]
fn http_every_category_needs_its_header_and_value() {
    let mut opts = options();
    opts.http_restricted_api =
        Restrictions::parse(Protocol::Http, &every_category_flags()).expect("valid flags");
    let server = start_with(opts);
    let addr = server.http_addr();
    for category in Category::ALL {
        let key = format!("key-{}", category.name());
        let value = format!("value-{}", category.name());
        // Another category's header opens nothing here.
        let other = if category == Category::Health {
            Category::Logging
        } else {
            Category::Health
        };
        let other_key = format!("key-{}", other.name());
        let other_value = format!("value-{}", other.name());
        for req in http_requests(category) {
            let what = format!("{} {} ({})", req.0, req.1, category.name());
            assert_refused(&send(addr, &req, &[]), &key, &format!("{what}, no header"));
            assert_refused(
                &send(addr, &req, &[(&key, "wrong")]),
                &key,
                &format!("{what}, wrong value"),
            );
            assert_refused(
                &send(addr, &req, &[(&key, &value.to_uppercase())]),
                &key,
                &format!("{what}, value in another case"),
            );
            assert_refused(
                &send(addr, &req, &[(&other_key, &other_value)]),
                &key,
                &format!("{what}, another category's header"),
            );
            let ok = send(addr, &req, &[(&key, &value)]);
            assert_eq!(
                ok.status,
                200,
                "{what}, right header: {}",
                String::from_utf8_lossy(&ok.body)
            );
            // Header names are not case-sensitive in HTTP.
            let upper = key.to_uppercase();
            assert_eq!(send(addr, &req, &[(&upper, &value)]).status, 200, "{what}");
        }
    }
    // Triton checks before the method: a wrong method is refused first...
    assert_refused(
        &request(addr, "POST", "/v2/health/live", &[], b""),
        "key-health",
        "POST /v2/health/live",
    );
    // ...and unknown endpoints, in no category, stay 404.
    assert_eq!(request(addr, "GET", "/v2/nothing", &[], b"").status, 404);
    server.shutdown().expect("shutdown");
}

#[test]
fn http_unrestricted_categories_stay_open() {
    let mut opts = options();
    opts.http_restricted_api = restrictions(
        Protocol::Http,
        &[
            "model-repository:admin-key=admin-value",
            "inference,metadata:infer-key=infer-value",
        ],
    );
    let server = start_with(opts);
    let addr = server.http_addr();
    for category in [
        Category::Health,
        Category::SharedMemory,
        Category::ModelConfig,
        Category::Statistics,
        Category::Trace,
        Category::Logging,
    ] {
        for req in http_requests(category) {
            assert_eq!(send(addr, &req, &[]).status, 200, "{} {}", req.0, req.1);
        }
    }
    let infer = &http_requests(Category::Inference)[0];
    assert_refused(&send(addr, infer, &[]), "infer-key", "infer");
    assert_refused(
        &send(addr, infer, &[("admin-key", "admin-value")]),
        "infer-key",
        "infer with the admin key",
    );
    let ok = send(addr, infer, &[("infer-key", "infer-value")]);
    assert_eq!(ok.status, 200);
    assert_eq!(
        common::i32s(&ok.json()["outputs"][0]["data"]),
        (1..17).collect::<Vec<i64>>()
    );
    assert_refused(
        &send(addr, &http_requests(Category::ModelRepository)[0], &[]),
        "admin-key",
        "repository index",
    );
    server.shutdown().expect("shutdown");
}

/// A refused request's body is left unread; the client still gets the 403
/// and the server goes on serving on new connections.
#[test]
fn http_refused_request_with_a_large_body_gets_its_answer() {
    let mut opts = options();
    opts.http_restricted_api = restrictions(Protocol::Http, &["inference:k=v"]);
    let server = start_with(opts);
    let body = vec![b' '; 4 << 20];
    let reply = request(
        server.http_addr(),
        "POST",
        "/v2/models/simple/infer",
        &[],
        &body,
    );
    assert_refused(&reply, "k", "large infer");
    let ok = request(
        server.http_addr(),
        "POST",
        "/v2/models/simple/infer",
        &[("k", "v")],
        simple_json_request(2).to_string().as_bytes(),
    );
    assert_eq!(ok.status, 200);
    server.shutdown().expect("shutdown");
}

// ---------------------------------------------------------------- gRPC

fn simple_request() -> ModelInferRequest {
    let input = |name: &str| InferInputTensor {
        name: name.into(),
        datatype: "INT32".into(),
        shape: vec![1, 16],
        ..Default::default()
    };
    let ints = |v: i32| -> bytes::Bytes {
        std::iter::repeat_n(v, 16)
            .flat_map(i32::to_le_bytes)
            .collect::<Vec<u8>>()
            .into()
    };
    ModelInferRequest {
        model_name: "simple".into(),
        inputs: vec![input("INPUT0"), input("INPUT1")],
        raw_input_contents: vec![ints(1), ints(2)],
        ..Default::default()
    }
}

fn with_meta<T>(msg: T, meta: Option<(&str, &str)>) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    if let Some((k, v)) = meta {
        req.metadata_mut().insert(
            tonic::metadata::MetadataKey::from_bytes(k.as_bytes()).expect("key"),
            v.parse().expect("value"),
        );
    }
    req
}

/// Calls every RPC of `category` with `meta`: each call's outcome.
async fn grpc_calls(
    channel: &Channel,
    category: Category,
    meta: Option<(&str, &str)>,
) -> Vec<Result<(), Status>> {
    let mut c = GrpcInferenceServiceClient::new(channel.clone());
    let model = || ModelReadyRequest {
        name: "simple".into(),
        version: String::new(),
    };
    let mut out = Vec::new();
    match category {
        Category::Health => {
            out.push(
                c.server_live(with_meta(ServerLiveRequest {}, meta))
                    .await
                    .map(drop),
            );
            out.push(
                c.server_ready(with_meta(ServerReadyRequest {}, meta))
                    .await
                    .map(drop),
            );
            out.push(c.model_ready(with_meta(model(), meta)).await.map(|r| {
                assert!(r.into_inner().ready);
            }));
            let mut health = HealthClient::new(channel.clone());
            out.push(
                health
                    .check(with_meta(HealthCheckRequest::default(), meta))
                    .await
                    .map(drop),
            );
        }
        Category::Metadata => {
            out.push(
                c.server_metadata(with_meta(ServerMetadataRequest {}, meta))
                    .await
                    .map(drop),
            );
            let req = ModelMetadataRequest {
                name: "simple".into(),
                version: String::new(),
            };
            out.push(c.model_metadata(with_meta(req, meta)).await.map(drop));
        }
        Category::Inference => {
            out.push(
                c.model_infer(with_meta(simple_request(), meta))
                    .await
                    .map(|r| {
                        assert_eq!(r.into_inner().raw_output_contents.len(), 2);
                    }),
            );
            let stream = futures::stream::iter(vec![simple_request()]);
            let streamed = async {
                let mut responses = c
                    .model_stream_infer(with_meta(stream, meta))
                    .await?
                    .into_inner();
                let first = responses.message().await?.expect("a response");
                assert!(first.error_message.is_empty(), "{}", first.error_message);
                Ok(())
            };
            out.push(streamed.await);
        }
        Category::SharedMemory => {
            let req = SystemSharedMemoryStatusRequest::default();
            out.push(
                c.system_shared_memory_status(with_meta(req, meta))
                    .await
                    .map(drop),
            );
            let req = CudaSharedMemoryStatusRequest::default();
            out.push(
                c.cuda_shared_memory_status(with_meta(req, meta))
                    .await
                    .map(drop),
            );
        }
        Category::ModelConfig => {
            let req = ModelConfigRequest {
                name: "simple".into(),
                version: String::new(),
            };
            out.push(c.model_config(with_meta(req, meta)).await.map(drop));
        }
        Category::ModelRepository => {
            let req = RepositoryIndexRequest::default();
            out.push(c.repository_index(with_meta(req, meta)).await.map(drop));
        }
        Category::Statistics => {
            let req = ModelStatisticsRequest {
                name: "simple".into(),
                version: String::new(),
            };
            out.push(c.model_statistics(with_meta(req, meta)).await.map(drop));
        }
        Category::Trace => {
            let req = TraceSettingRequest::default();
            out.push(c.trace_setting(with_meta(req, meta)).await.map(drop));
        }
        Category::Logging => {
            let req = LogSettingsRequest::default();
            out.push(c.log_settings(with_meta(req, meta)).await.map(drop));
        }
    }
    out
}

fn assert_all_ok(results: Vec<Result<(), Status>>, what: &str) {
    for (i, r) in results.into_iter().enumerate() {
        r.unwrap_or_else(|s| panic!("{what}, call {i}: {s:?}"));
    }
}

fn assert_unavailable(results: Vec<Result<(), Status>>, header: &str, what: &str) {
    assert!(!results.is_empty());
    for (i, r) in results.into_iter().enumerate() {
        let status = r.expect_err(what);
        assert_eq!(
            status.code(),
            Code::Unavailable,
            "{what}, call {i}: {status:?}"
        );
        assert_eq!(
            status.message(),
            format!("This protocol is restricted, expecting header '{header}'"),
            "{what}, call {i}"
        );
    }
}

async fn channel(addr: std::net::SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect")
}

#[tokio::test]
async fn grpc_every_category_needs_its_metadata_and_value() {
    let mut opts = options();
    opts.grpc_restricted_protocol =
        Restrictions::parse(Protocol::Grpc, &every_category_flags()).expect("valid flags");
    let server = start_with(opts);
    let ch = channel(server.grpc_addr()).await;
    for category in Category::ALL {
        let name = category.name();
        let header = format!("triton-grpc-protocol-key-{name}");
        let value = format!("value-{name}");
        let what = |case: &str| format!("{name}: {case}");
        assert_unavailable(
            grpc_calls(&ch, category, None).await,
            &header,
            &what("no metadata"),
        );
        assert_unavailable(
            grpc_calls(&ch, category, Some((&header, "wrong"))).await,
            &header,
            &what("wrong value"),
        );
        // Triton's key is the prefixed one: the bare key is not enough.
        assert_unavailable(
            grpc_calls(&ch, category, Some((&format!("key-{name}"), &value))).await,
            &header,
            &what("key without the prefix"),
        );
        assert_all_ok(
            grpc_calls(&ch, category, Some((&header, &value))).await,
            &what("right metadata"),
        );
    }
    // Triton does not serve Watch: UNIMPLEMENTED, restricted or not.
    let watch = HealthClient::new(ch.clone())
        .watch(HealthCheckRequest::default())
        .await;
    assert_eq!(watch.expect_err("no Watch").code(), Code::Unimplemented);
    // HTTP is not restricted by the gRPC flag.
    assert_eq!(
        common::get(server.http_addr(), "/v2/health/live").status,
        200
    );
    server.shutdown().expect("shutdown");
}

#[tokio::test]
async fn grpc_unrestricted_categories_stay_open() {
    let mut opts = options();
    opts.grpc_restricted_protocol = restrictions(
        Protocol::Grpc,
        &["shared-memory,model-config,model-repository,statistics,trace:admin-key=admin-value"],
    );
    let server = start_with(opts);
    let ch = channel(server.grpc_addr()).await;
    for category in [
        Category::Health,
        Category::Metadata,
        Category::Inference,
        Category::Logging,
    ] {
        assert_all_ok(grpc_calls(&ch, category, None).await, category.name());
    }
    assert_unavailable(
        grpc_calls(&ch, Category::ModelConfig, None).await,
        "triton-grpc-protocol-admin-key",
        "model config",
    );
    assert_all_ok(
        grpc_calls(
            &ch,
            Category::ModelConfig,
            Some(("triton-grpc-protocol-admin-key", "admin-value")),
        )
        .await,
        "admin",
    );
    server.shutdown().expect("shutdown");
}

// ------------------------------------------------------ flags, binary

/// Runs the binary with `args`, expecting it to refuse to start: the exit
/// status and output.
fn refused_start(args: &[&str]) -> (std::process::ExitStatus, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_shardserve"))
        .args([
            "--model-repository",
            &common::repo_path("models").to_string_lossy(),
        ])
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
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let until = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the server started with {args:?}");
        }
        thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output().expect("output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (status, text)
}

#[test]
fn bad_flags_refuse_to_start_with_tritons_messages() {
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "--http-restricted-api=model-repository,health:k1=v1",
                "--http-restricted-api=metadata,health:k2=v2",
            ],
            "restricted api 'health' can not be specified in multiple config groups",
        ),
        (
            &["--grpc-restricted-protocol=trace,trace:k=v"],
            "restricted protocol 'trace' can not be specified in multiple config groups",
        ),
        (
            &["--http-restricted-api=model-reposit,health:k1=v1"],
            "unknown restricted api 'model-reposit'",
        ),
        (
            &["--grpc-restricted-protocol", "inference,everything:k=v"],
            "unknown restricted protocol 'everything'",
        ),
        (
            &["--http-restricted-api=health=k"],
            "--http-restricted-api option format is '<config name>:<setting>=<value>'. Got health=k",
        ),
        (
            &["--grpc-restricted-protocol=health:k="],
            "--grpc-restricted-protocol option format is '<config name>:<setting>=<value>'. Got health:k=",
        ),
        (
            &["--http-restricted-api=health:bad key=v"],
            "'bad key' is not a valid header name",
        ),
    ];
    for (args, expected) in cases {
        let (status, text) = refused_start(args);
        assert!(!status.success(), "{args:?}: {text}");
        assert!(
            text.contains(expected),
            "{args:?}: expected {expected:?} in:\n{text}"
        );
    }
}

#[test]
fn help_lists_the_flags_and_categories() {
    let out = Command::new(env!("CARGO_BIN_EXE_shardserve"))
        .arg("--help")
        .output()
        .expect("run --help");
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "--http-restricted-api",
        "--grpc-restricted-protocol",
        "triton-grpc-protocol-<KEY>",
        "model-repository",
    ] {
        assert!(
            text.contains(needle),
            "{needle} missing from --help:\n{text}"
        );
    }
}

// ------------------------------------------- gRPC message size limit

const LIMIT: usize = 64 << 10;

fn limited() -> ServerOptions {
    let mut opts = options();
    opts.grpc_max_message_size = LIMIT;
    opts
}

fn oversized_request(payload: Vec<u8>) -> ModelInferRequest {
    let mut req = simple_request();
    req.parameters.insert(
        "padding".into(),
        shardserve::proto::inference::InferParameter {
            parameter_choice: Some(
                shardserve::proto::inference::infer_parameter::ParameterChoice::StringParam(
                    String::from_utf8(payload).expect("ascii"),
                ),
            ),
        },
    );
    req
}

/// Bytes that gzip cannot shrink below the limit (a fixed-seed LCG: the
/// test stays deterministic), as printable ASCII for a string parameter.
fn incompressible(n: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            b'!' + ((x >> 33) % 94) as u8
        })
        .collect()
}

fn assert_resource_exhausted(status: &Status, what: &str) {
    assert_eq!(status.code(), Code::ResourceExhausted, "{what}: {status:?}");
    assert!(
        status.message().contains("--grpc-max-message-size")
            || status.message().contains("size limit"),
        "{what}: {}",
        status.message()
    );
}

#[tokio::test]
async fn an_oversized_unary_message_gets_resource_exhausted() {
    let server = start_with(limited());
    let mut c = GrpcInferenceServiceClient::new(channel(server.grpc_addr()).await);
    let status = c
        .model_infer(oversized_request(vec![b'x'; 2 * LIMIT]))
        .await
        .expect_err("over the limit");
    assert_resource_exhausted(&status, "uncompressed");

    // Compressed: over the limit as sent, and within it as sent but not
    // once decompressed.
    let mut gz = GrpcInferenceServiceClient::new(channel(server.grpc_addr()).await)
        .send_compressed(CompressionEncoding::Gzip);
    let status = gz
        .model_infer(oversized_request(incompressible(2 * LIMIT)))
        .await
        .expect_err("compressed, over the limit");
    assert_resource_exhausted(&status, "compressed, large");
    let status = gz
        .model_infer(oversized_request(vec![b'x'; 4 * LIMIT]))
        .await
        .expect_err("compressed, large once decompressed");
    assert_resource_exhausted(&status, "compressed, small");

    // The server goes on serving, and a request within the limit passes.
    let ok = c
        .model_infer(oversized_request(vec![b'x'; LIMIT / 2]))
        .await
        .expect("within the limit");
    assert_eq!(ok.into_inner().raw_output_contents.len(), 2);
    server.shutdown().expect("shutdown");
}

#[tokio::test]
async fn an_oversized_answer_gets_resource_exhausted() {
    // `simple`'s config is a few hundred bytes: over a limit this small.
    let mut opts = options();
    opts.grpc_max_message_size = 64;
    let server = start_with(opts);
    let mut c = GrpcInferenceServiceClient::new(channel(server.grpc_addr()).await);
    let status = c
        .model_config(ModelConfigRequest {
            name: "simple".into(),
            version: String::new(),
        })
        .await
        .expect_err("the answer is over the limit");
    assert_resource_exhausted(&status, "answer");
    c.server_live(ServerLiveRequest {})
        .await
        .expect("small answers pass");
    server.shutdown().expect("shutdown");
}
