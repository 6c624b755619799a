//! gRPC (`inference.GRPCInferenceService` + `grpc.health.v1`) over real
//! HTTP/2 against an in-process server, with tonic's client.

mod common;

use common::start_server;
use shardserve::proto::{
    health::{
        health_check_response::ServingStatus, health_client::HealthClient, HealthCheckRequest,
    },
    inference::{
        grpc_inference_service_client::GrpcInferenceServiceClient,
        model_infer_request::{InferInputTensor, InferRequestedOutputTensor},
        InferTensorContents, ModelConfigRequest, ModelInferRequest, ModelMetadataRequest,
        ModelReadyRequest, ModelStreamInferResponse, RepositoryIndexRequest, ServerLiveRequest,
        ServerMetadataRequest, ServerReadyRequest,
    },
};
use tonic::{transport::Channel, Code};

use common::grpc_client as client;

fn int32_bytes(v: impl IntoIterator<Item = i32>) -> bytes::Bytes {
    v.into_iter()
        .flat_map(i32::to_le_bytes)
        .collect::<Vec<u8>>()
        .into()
}

fn simple_request(b: i32) -> ModelInferRequest {
    let input = |name: &str| InferInputTensor {
        name: name.into(),
        datatype: "INT32".into(),
        shape: vec![1, 16],
        ..Default::default()
    };
    ModelInferRequest {
        model_name: "simple".into(),
        id: "r1".into(),
        inputs: vec![input("INPUT0"), input("INPUT1")],
        raw_input_contents: vec![int32_bytes(0..16), int32_bytes(std::iter::repeat_n(b, 16))],
        ..Default::default()
    }
}

fn decode_i32(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[tokio::test]
async fn health_metadata_and_config() {
    let server = start_server(1);
    let mut c = client(server.grpc_addr()).await;
    assert!(
        c.server_live(ServerLiveRequest {})
            .await
            .unwrap()
            .into_inner()
            .live
    );
    assert!(
        c.server_ready(ServerReadyRequest {})
            .await
            .unwrap()
            .into_inner()
            .ready
    );
    let meta = c
        .server_metadata(ServerMetadataRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(meta.extensions.iter().any(|e| e == "binary_tensor_data"));
    let ready = |name: &str| ModelReadyRequest {
        name: name.into(),
        version: String::new(),
    };
    assert!(
        c.model_ready(ready("simple"))
            .await
            .unwrap()
            .into_inner()
            .ready
    );
    assert!(
        !c.model_ready(ready("nope"))
            .await
            .unwrap()
            .into_inner()
            .ready,
        "unknown model: ready=false, not an error"
    );
    let m = c
        .model_metadata(ModelMetadataRequest {
            name: "simple".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(m.versions, vec!["1"]);
    assert_eq!(m.inputs[0].shape, vec![-1, 16]);
    let e = c
        .model_metadata(ModelMetadataRequest {
            name: "nope".into(),
            version: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert!(e.message().contains("Request for unknown model"));
    let cfg = c
        .model_config(ModelConfigRequest {
            name: "simple".into(),
            version: "1".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .config
        .unwrap();
    assert_eq!(cfg.max_batch_size, 8);
    let mut h = HealthClient::new(
        Channel::from_shared(format!("http://{}", server.grpc_addr()))
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    let s = h
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(s.status, ServingStatus::Serving as i32);
    server.shutdown().unwrap();
}

#[tokio::test]
async fn infer_raw_and_typed_contents() {
    let server = start_server(2);
    let mut c = client(server.grpc_addr()).await;
    let r = c.model_infer(simple_request(5)).await.unwrap().into_inner();
    assert_eq!(r.model_name, "simple");
    assert_eq!(r.id, "r1");
    assert_eq!(r.raw_output_contents.len(), 2);
    assert_eq!(
        decode_i32(&r.raw_output_contents[0]),
        (5..21).collect::<Vec<_>>()
    );
    assert_eq!(
        decode_i32(&r.raw_output_contents[1]),
        (-5..11).collect::<Vec<_>>()
    );

    let mut typed = simple_request(0);
    typed.raw_input_contents.clear();
    for (i, t) in typed.inputs.iter_mut().enumerate() {
        t.contents = Some(InferTensorContents {
            int_contents: vec![i as i32 + 1; 16],
            ..Default::default()
        });
    }
    typed.outputs = vec![InferRequestedOutputTensor {
        name: "OUTPUT1".into(),
        ..Default::default()
    }];
    let r = c.model_infer(typed).await.unwrap().into_inner();
    assert_eq!(r.outputs.len(), 1);
    assert_eq!(r.outputs[0].name, "OUTPUT1");
    assert_eq!(decode_i32(&r.raw_output_contents[0]), vec![-1; 16]);
    server.shutdown().unwrap();
}

#[tokio::test]
async fn infer_errors_have_grpc_codes_and_server_stays_healthy() {
    let server = start_server(1);
    let mut c = client(server.grpc_addr()).await;
    let mut unknown = simple_request(1);
    unknown.model_name = "nope".into();
    assert_eq!(
        c.model_infer(unknown).await.unwrap_err().code(),
        Code::NotFound
    );

    let mut both = simple_request(1);
    both.inputs[0].contents = Some(InferTensorContents {
        int_contents: vec![0; 16],
        ..Default::default()
    });
    let e = c.model_infer(both).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains(
        "contents field must not be specified when using raw_input_contents for 'INPUT0' for model 'simple'"
    ), "{}", e.message());

    let mut short = simple_request(1);
    short.raw_input_contents[1] = int32_bytes(0..15);
    assert_eq!(
        c.model_infer(short).await.unwrap_err().code(),
        Code::InvalidArgument
    );

    let mut dtype = simple_request(1);
    dtype.inputs[0].datatype = "FP32".into();
    assert_eq!(
        c.model_infer(dtype).await.unwrap_err().code(),
        Code::InvalidArgument
    );

    let mut batch = simple_request(1);
    for t in &mut batch.inputs {
        t.shape = vec![9, 16];
    }
    batch.raw_input_contents = vec![int32_bytes(0..144), int32_bytes(0..144)];
    let e = c.model_infer(batch).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("batch-size"));

    // NONE mode: the repository index answers, loads are refused.
    let index = c
        .repository_index(RepositoryIndexRequest {
            repository_name: String::new(),
            ready: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(index
        .models
        .iter()
        .any(|m| m.name == "simple" && m.state == "READY"));

    let ok = c.model_infer(simple_request(2)).await.unwrap().into_inner();
    assert_eq!(decode_i32(&ok.raw_output_contents[0])[0], 2);
    server.shutdown().unwrap();
}

/// A message that is not a valid `ModelInferRequest` on the wire: field 5
/// (`inputs`, a message) carrying bytes that do not decode as one.
#[derive(Clone, PartialEq, prost::Message)]
struct Garbage {
    #[prost(bytes = "vec", tag = "5")]
    inputs: Vec<u8>,
}

#[tokio::test]
async fn an_undecodable_message_is_an_error_and_the_server_stays_healthy() {
    let server = start_server(1);
    let channel = Channel::from_shared(format!("http://{}", server.grpc_addr()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut raw = tonic::client::Grpc::new(channel.clone());
    raw.ready().await.unwrap();
    let garbage = Garbage {
        inputs: vec![0xff, 0xff, 0xff, 0xff],
    };
    let e = raw
        .unary::<_, shardserve::proto::inference::ModelInferResponse, _>(
            tonic::Request::new(garbage),
            http::uri::PathAndQuery::from_static("/inference.GRPCInferenceService/ModelInfer"),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(e.code(), Code::Internal | Code::InvalidArgument),
        "{e:?}"
    );
    assert!(!e.message().is_empty());

    raw.ready().await.unwrap();
    let e = raw
        .unary::<_, shardserve::proto::inference::ServerLiveResponse, _>(
            tonic::Request::new(ServerLiveRequest {}),
            http::uri::PathAndQuery::from_static("/inference.GRPCInferenceService/NoSuchRpc"),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented);

    let mut c = GrpcInferenceServiceClient::new(channel);
    assert!(
        c.server_live(ServerLiveRequest {})
            .await
            .unwrap()
            .into_inner()
            .live
    );
    assert!(
        c.server_ready(ServerReadyRequest {})
            .await
            .unwrap()
            .into_inner()
            .ready
    );
    let unknown = c
        .model_ready(ModelReadyRequest {
            name: "nope".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        !unknown.ready,
        "ModelReady for an unknown model is ready=false, not an error"
    );
    let ok = c.model_infer(simple_request(3)).await.unwrap().into_inner();
    assert_eq!(decode_i32(&ok.raw_output_contents[0])[0], 3);
    server.shutdown().unwrap();
}

/// Many calls in flight on one HTTP/2 connection, with answers of every
/// size around the write path's thresholds: h2 chains DATA of 256 bytes or
/// more, the connection buffers writes under 8 KiB and writes larger ones
/// through (`transport::Coalesced`). Every answer must be its own request's.
#[tokio::test]
async fn concurrent_calls_on_one_connection_get_their_own_answers() {
    let repo = common::TempRepo::new(
        "grpc-coalesce",
        &[(
            "echo",
            r#"
name: "echo"
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
"#
            .to_string(),
        )],
    );
    let mut opts = shardserve::server::ServerOptions::for_tests(&repo.root);
    opts.cores = Some(1);
    let server = common::start_with(opts);
    let c = client(server.grpc_addr()).await;
    // 4 bytes to 40 KiB of answer, 200 calls at once.
    let sizes = [
        1usize, 16, 63, 64, 65, 250, 1000, 2047, 2048, 2049, 4096, 10_000,
    ];
    let calls = (0..200).map(|i| {
        let mut c = c.clone();
        let n = sizes[i % sizes.len()];
        async move {
            let values: Vec<i32> = (0..n as i32).map(|v| v * 1000 + i as i32).collect();
            let request = ModelInferRequest {
                model_name: "echo".into(),
                id: format!("call-{i}"),
                inputs: vec![InferInputTensor {
                    name: "INPUT0".into(),
                    datatype: "INT32".into(),
                    shape: vec![n as i64],
                    ..Default::default()
                }],
                raw_input_contents: vec![int32_bytes(values.iter().copied())],
                ..Default::default()
            };
            let r = c.model_infer(request).await.expect("answer").into_inner();
            assert_eq!(r.id, format!("call-{i}"));
            assert_eq!(decode_i32(&r.raw_output_contents[0]), values, "call {i}");
        }
    });
    futures::future::join_all(calls).await;
    server.shutdown().unwrap();
}

/// One `ModelInfer` call over HTTP/2 with the body given as frames: the
/// grpc-status and grpc-message, from the head (trailers-only) or the
/// trailers, and the answer's message when there is one.
async fn raw_model_infer(
    addr: std::net::SocketAddr,
    encoding: Option<&str>,
    frames: Vec<Vec<u8>>,
    trailers: Option<http::HeaderMap>,
) -> (String, String, Option<bytes::Bytes>) {
    let (code, msg, data) = raw_grpc_call(addr, "ModelInfer", encoding, frames, trailers).await;
    let message = (data.len() >= 5).then(|| bytes::Bytes::from(data[5..].to_vec()));
    (code, msg, message)
}

/// One call of `method` over HTTP/2 with the body given as frames: the
/// grpc-status and grpc-message, from the head (trailers-only) or the
/// trailers, and the response body's bytes (framed messages).
async fn raw_grpc_call(
    addr: std::net::SocketAddr,
    method: &str,
    encoding: Option<&str>,
    frames: Vec<Vec<u8>>,
    trailers: Option<http::HeaderMap>,
) -> (String, String, Vec<u8>) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    let mut req = http::Request::post(format!(
        "http://{addr}/inference.GRPCInferenceService/{method}"
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers");
    if let Some(e) = encoding {
        req = req.header("grpc-encoding", e);
    }
    let (answer, mut stream) = send.send_request(req.body(()).unwrap(), false).unwrap();
    let last = frames.len();
    for (i, f) in frames.into_iter().enumerate() {
        stream
            .send_data(f.into(), i + 1 == last && trailers.is_none())
            .unwrap();
    }
    match trailers {
        Some(t) => stream.send_trailers(t).unwrap(),
        None if last == 0 => stream.send_data(bytes::Bytes::new(), true).unwrap(),
        None => {}
    }
    let answer = answer.await.unwrap();
    // Triton's gRPC answers carry no `date` (hyper would add one).
    assert!(
        answer.headers().get("date").is_none(),
        "{:?}",
        answer.headers()
    );
    let status_of = |h: &http::HeaderMap| {
        h.get("grpc-status").map(|s| {
            let msg = h
                .get("grpc-message")
                .map(|m| m.to_str().unwrap().to_owned())
                .unwrap_or_default();
            (s.to_str().unwrap().to_owned(), msg)
        })
    };
    if let Some((code, msg)) = status_of(answer.headers()) {
        return (code, msg, Vec::new());
    }
    let mut body = answer.into_body();
    let mut data = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = body.trailers().await.unwrap().unwrap_or_default();
    let (code, msg) = status_of(&trailers).expect("a grpc-status in the trailers");
    (code, msg, data)
}

/// The framed messages of a response body, as `ModelStreamInferResponse`s.
fn stream_answers(data: &[u8]) -> Vec<ModelStreamInferResponse> {
    use prost::Message;
    let mut out = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        assert_eq!(rest[0], 0, "an uncompressed message");
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        out.push(ModelStreamInferResponse::decode(&rest[5..5 + len]).unwrap());
        rest = &rest[5 + len..];
    }
    out
}

/// A one-shard server on the example models with a 64 KiB gRPC message
/// limit, for the raw-framing comparisons below.
fn one_shard_64k_limit() -> shardserve::server::ServerHandle {
    let mut opts = shardserve::server::ServerOptions::for_tests(common::repo_path("models"));
    opts.cores = Some(1);
    opts.grpc_max_message_size = 64 << 10;
    common::start_with(opts)
}

fn grpc_framed(message: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8];
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// Uncompressed `ModelInfer` calls are served without tonic's codec
/// (`grpc::unary_infer`); a call that names `grpc-encoding` still goes
/// through tonic, which takes an uncompressed message (flag 0) all the
/// same. So each body below is sent both ways, and both answers must be
/// the same: the framing faults keep tonic's statuses and wording, the
/// size refusal is RESOURCE_EXHAUSTED either way, and a good call answers
/// the same message however its body was cut into frames.
#[tokio::test]
async fn model_infer_answers_the_same_with_and_without_tonics_codec() {
    use prost::Message;
    let server = one_shard_64k_limit();
    let addr = server.grpc_addr();
    let good = grpc_framed(&simple_request(5).encode_to_vec());
    let mut two = good.clone();
    two.extend(grpc_framed(&simple_request(9).encode_to_vec()));
    let mut oversized = vec![0u8];
    oversized.extend_from_slice(&(1u32 << 20).to_be_bytes());
    let mut bad_flag = good.clone();
    bad_flag[0] = 7;
    let cases: Vec<(&str, Vec<Vec<u8>>)> = vec![
        ("whole", vec![good.clone()]),
        ("byte by byte", good.iter().map(|b| vec![*b]).collect()),
        ("header split", vec![good[..3].to_vec(), good[3..].to_vec()]),
        ("two messages", vec![two]),
        ("no message", vec![]),
        ("cut in the header", vec![good[..4].to_vec()]),
        ("cut in the message", vec![good[..good.len() - 1].to_vec()]),
        ("over the limit", vec![oversized]),
        ("invalid flag", vec![bad_flag]),
        ("not protobuf", vec![grpc_framed(&[0xff; 8])]),
    ];
    for (what, frames) in cases {
        let direct = raw_model_infer(addr, None, frames.clone(), None).await;
        let tonic = raw_model_infer(addr, Some("gzip"), frames, None).await;
        assert_eq!(direct, tonic, "{what}");
        match what {
            "over the limit" => {
                assert_eq!(direct.0, "8", "{what}: {direct:?}");
                assert!(direct.1.contains("max-message-size"), "{direct:?}");
            }
            "whole" | "byte by byte" | "header split" | "two messages" => {
                assert_eq!(direct.0, "0", "{what}: {direct:?}");
                let answer = shardserve::proto::inference::ModelInferResponse::decode(
                    direct.2.clone().unwrap(),
                )
                .unwrap();
                assert_eq!(decode_i32(&answer.raw_output_contents[0])[0], 5, "{what}");
            }
            _ => assert_eq!(direct.0, "13", "{what}: {direct:?}"),
        }
    }
    // A compressed-flag without grpc-encoding is tonic's INTERNAL too.
    let mut flagged = good.clone();
    flagged[0] = 1;
    let (code, msg, _) = raw_model_infer(addr, None, vec![flagged], None).await;
    assert_eq!(code, "13");
    assert!(msg.contains("grpc-encoding"), "{msg}");
    // Request trailers join the metadata; the call is answered as usual.
    let mut trailers = http::HeaderMap::new();
    trailers.insert("x-trailer", http::HeaderValue::from_static("1"));
    let direct = raw_model_infer(addr, None, vec![good.clone()], Some(trailers.clone())).await;
    let tonic = raw_model_infer(addr, Some("gzip"), vec![good], Some(trailers)).await;
    assert_eq!(direct, tonic);
    assert_eq!(direct.0, "0");
    server.shutdown().unwrap();
}

/// Uncompressed `ModelStreamInfer` calls are framed by the stream route
/// itself (`grpc::stream_route`), others by tonic's `Streaming` and
/// `EncodeBody`: each body below is sent both ways. A stream of good
/// messages gets the same bytes back however it was cut into frames; a
/// framing fault ends the call with tonic's status and the same error
/// answer after what was read before it.
#[tokio::test]
async fn model_stream_infer_answers_the_same_with_and_without_tonics_framing() {
    use prost::Message;
    let server = one_shard_64k_limit();
    let addr = server.grpc_addr();
    let good = grpc_framed(&simple_request(5).encode_to_vec());
    let mut three = good.clone();
    three.extend(grpc_framed(&simple_request(7).encode_to_vec()));
    three.extend(grpc_framed(&simple_request(9).encode_to_vec()));
    let mut oversized = good.clone();
    oversized.push(0);
    oversized.extend_from_slice(&(1u32 << 20).to_be_bytes());
    let mut bad_flag = good.clone();
    bad_flag.extend(&good);
    bad_flag[good.len()] = 7;
    let mut flagged = good.clone();
    flagged[0] = 1;
    let whole_cases: Vec<(&str, Vec<Vec<u8>>, usize)> = vec![
        ("whole", vec![good.clone()], 1),
        ("byte by byte", three.iter().map(|b| vec![*b]).collect(), 3),
        (
            "cut anywhere",
            vec![
                three[..7].to_vec(),
                three[7..40].to_vec(),
                three[40..].to_vec(),
            ],
            3,
        ),
        ("three in one frame", vec![three.clone()], 3),
        ("no message", vec![], 0),
    ];
    for (what, frames, n) in whole_cases {
        let direct = raw_grpc_call(addr, "ModelStreamInfer", None, frames.clone(), None).await;
        let tonic = raw_grpc_call(addr, "ModelStreamInfer", Some("gzip"), frames, None).await;
        assert_eq!(direct, tonic, "{what}");
        assert_eq!(direct.0, "0", "{what}: {direct:?}");
        let answers = stream_answers(&direct.2);
        assert_eq!(answers.len(), n, "{what}");
        for a in &answers {
            assert_eq!(a.error_message, "", "{what}");
        }
    }
    let fault_cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("cut in the header", good[..4].to_vec(), "13"),
        ("cut in the message", good[..good.len() - 1].to_vec(), "13"),
        ("over the limit after a message", oversized, "8"),
        ("invalid flag after a message", bad_flag, "13"),
        ("not protobuf", grpc_framed(&[0xff; 8]), "13"),
    ];
    for (what, body, code) in fault_cases {
        let direct = raw_grpc_call(addr, "ModelStreamInfer", None, vec![body.clone()], None).await;
        let tonic = raw_grpc_call(addr, "ModelStreamInfer", Some("gzip"), vec![body], None).await;
        assert_eq!((&direct.0, &direct.1), (&tonic.0, &tonic.1), "{what}");
        assert_eq!(direct.0, code, "{what}: {direct:?}");
        let last = |data: &[u8]| stream_answers(data).pop().expect("an error answer");
        let (d, t) = (last(&direct.2), last(&tonic.2));
        assert_eq!(d.error_message, t.error_message, "{what}");
        assert!(
            d.error_message.contains("could not be read"),
            "{what}: {d:?}"
        );
    }
    // A compressed flag without grpc-encoding is tonic's INTERNAL too (with
    // an encoding, tonic would try to decompress it instead).
    let (code, msg, _) = raw_grpc_call(addr, "ModelStreamInfer", None, vec![flagged], None).await;
    assert_eq!(code, "13");
    assert!(msg.contains("grpc-encoding"), "{msg}");
    // Request trailers end the request stream; what came before is answered.
    let mut trailers = http::HeaderMap::new();
    trailers.insert("x-trailer", http::HeaderValue::from_static("1"));
    let direct = raw_grpc_call(
        addr,
        "ModelStreamInfer",
        None,
        vec![three.clone()],
        Some(trailers.clone()),
    )
    .await;
    let tonic = raw_grpc_call(
        addr,
        "ModelStreamInfer",
        Some("gzip"),
        vec![three],
        Some(trailers),
    )
    .await;
    assert_eq!(direct, tonic);
    assert_eq!(direct.0, "0");
    assert_eq!(stream_answers(&direct.2).len(), 3);
    server.shutdown().unwrap();
}
