//! Bounds on what a client or a configuration can make the server do: a
//! configuration with absurd values fails its own model only; large JSON
//! bodies decode (off the shard) to the same tensors; a zip bomb stops at
//! the input limit; huge declared shapes and huge names are answered at
//! once with short messages.

mod common;

use std::{io::Write, path::PathBuf};

use common::{post_json, request, start_with};
use serde_json::json;
use shardserve::{
    model::ModelState,
    proto::inference::{
        grpc_inference_service_client::GrpcInferenceServiceClient, ModelInferRequest,
        ModelMetadataRequest,
    },
    server::{ServerHandle, ServerOptions},
};

/// A fresh repository under the system temp dir, removed on drop.
struct TempRepo(PathBuf);

impl TempRepo {
    fn new(tag: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("shardserve-bounds-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    /// An `identity` model (INT32 `[-1]` in and out) with `extra` config.
    fn identity(&self, name: &str, max_batch_size: i64, extra: &str) {
        let dir = self.0.join(name);
        std::fs::create_dir_all(dir.join("1")).unwrap();
        std::fs::write(
            dir.join("config.pbtxt"),
            format!(
                "name: \"{name}\"\nbackend: \"identity\"\nmax_batch_size: {max_batch_size}\n\
                 input [ {{ name: \"INPUT0\" data_type: TYPE_INT32 dims: [ -1 ] }} ]\n\
                 output [ {{ name: \"OUTPUT0\" data_type: TYPE_INT32 dims: [ -1 ] }} ]\n{extra}\n"
            ),
        )
        .unwrap();
    }

    fn start(&self, max_input: usize) -> ServerHandle {
        let mut opts = ServerOptions::for_tests(&self.0);
        opts.cores = Some(1);
        opts.http_max_input_size = max_input;
        start_with(opts)
    }
}

impl Drop for TempRepo {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Why `name` is not ready.
fn failure(server: &ServerHandle, name: &str) -> String {
    let entry = &server.models().models[name];
    entry.failure.clone().unwrap_or_else(|| {
        entry
            .versions
            .values()
            .find_map(|v| match &v.state {
                ModelState::Unavailable { reason } => Some(reason.clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{name} did not fail"))
    })
}

fn ready(server: &ServerHandle, name: &str) -> bool {
    server.models().models[name]
        .versions
        .values()
        .any(|v| v.state == ModelState::Ready)
}

/// A repository with one good model and three absurd configurations, and
/// a server on it with a 4 MiB input limit. The server is shut down (and
/// the repository removed) when `test` returns.
fn with_server(tag: &str, test: impl FnOnce(&ServerHandle)) {
    let repo = TempRepo::new(tag);
    repo.identity("good", 8, "");
    repo.identity("huge_batch", 2_000_000_000, "");
    repo.identity(
        "many_levels",
        8,
        "dynamic_batching { priority_levels: 4294967296 default_priority_level: 1 }",
    );
    repo.identity("many_instances", 8, "instance_group [ { count: 100000 } ]");
    let server = repo.start(4 << 20);
    test(&server);
    server.shutdown().unwrap();
}

#[test]
fn absurd_configs_fail_only_their_model() {
    with_server("absurd_configs_fail_only", |server| {
        assert!(ready(server, "good"));
        let why = failure(server, "huge_batch");
        assert!(
            why.contains("max_batch_size 2000000000 is above this server's limit"),
            "{why}"
        );
        let why = failure(server, "many_levels");
        assert!(why.contains("priority_levels 4294967296"), "{why}");
        let why = failure(server, "many_instances");
        assert!(why.contains("asks for 100000 instances"), "{why}");
    });
}

#[test]
fn a_large_json_body_decodes_to_the_same_tensor() {
    with_server("a_large_json_body_decode", |server| {
        // ~700 KB of JSON: above the offload threshold.
        let data: Vec<i32> = (0..100_000).map(|i| i * 7 - 350_000).collect();
        let reply = post_json(
            server.http_addr(),
            "/v2/models/good/infer",
            &json!({"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, data.len()], "data": data}]}),
        );
        assert_eq!(
            reply.status,
            200,
            "{}",
            String::from_utf8_lossy(&reply.body[..reply.body.len().min(500)])
        );
        let out = &reply.json()["outputs"][0];
        let got: Vec<i64> = out["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap())
            .collect();
        assert_eq!(got.len(), data.len());
        assert!(got.iter().zip(&data).all(|(a, b)| *a == i64::from(*b)));
    });
}

#[test]
fn a_huge_declared_shape_is_refused_at_once() {
    with_server("a_huge_declared_shape_is", |server| {
        let reply = post_json(
            server.http_addr(),
            "/v2/models/good/infer",
            &json!({"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 1u64 << 40], "data": [1, 2]}]}),
        );
        assert_eq!(reply.status, 400);
        assert!(
            reply
                .error()
                .contains("Shape does not match true shape of 'data' field"),
            "{}",
            reply.error()
        );
        let reply = post_json(
            server.http_addr(),
            "/v2/models/good/infer",
            &json!({"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1u64 << 40, 2], "data": [1, 2]}]}),
        );
        assert_eq!(reply.status, 400);
        assert!(
            reply.error().contains("batch-size must be <= 8"),
            "{}",
            reply.error()
        );
    });
}

#[test]
fn a_zip_bomb_stops_at_the_input_limit() {
    with_server("a_zip_bomb_stops_at_the_", |server| {
        // 64 MiB of spaces inflates past the 4 MiB limit from ~64 KiB.
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        let chunk = vec![b' '; 1 << 20];
        for _ in 0..64 {
            gz.write_all(&chunk).unwrap();
        }
        let bomb = gz.finish().unwrap();
        assert!(bomb.len() < 1 << 20);
        let reply = request(
            server.http_addr(),
            "POST",
            "/v2/models/good/infer",
            &[
                ("Content-Type", "application/json"),
                ("Content-Encoding", "gzip"),
            ],
            &bomb,
        );
        assert!(
            reply.status == 400 || reply.status == 413,
            "{}",
            reply.status
        );
        assert!(
            reply
                .error()
                .contains("decompressed request body exceeds the server's limit of 4194304 bytes"),
            "{}",
            reply.error()
        );
    });
}

#[test]
fn huge_names_are_not_echoed_over_grpc() {
    with_server("huge_names_are_not_echoe", |server| {
        let addr = server.grpc_addr();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect()
                .await
                .unwrap();
            let mut client = GrpcInferenceServiceClient::new(channel)
                .max_encoding_message_size(64 << 20)
                .max_decoding_message_size(64 << 20);
            let long = "m".repeat(10 << 20);
            let status = client
                .model_infer(ModelInferRequest {
                    model_name: long.clone(),
                    ..Default::default()
                })
                .await
                .unwrap_err();
            assert_eq!(status.code(), tonic::Code::NotFound);
            assert!(status.message().len() < 1024, "{}", status.message().len());
            assert!(status.message().contains("Request for unknown model"));
            let status = client
                .model_metadata(ModelMetadataRequest {
                    name: long,
                    version: String::new(),
                })
                .await
                .unwrap_err();
            assert_eq!(status.code(), tonic::Code::NotFound);
            assert!(status.message().len() < 1024);
        });
    });
}

#[test]
fn huge_names_are_not_echoed_over_http() {
    with_server("huge_names_are_not_echoe", |server| {
        let long = "n".repeat(1 << 20);
        let body =
            json!({"inputs": [{"name": long, "datatype": long, "shape": [1, 1], "data": [1]}]});
        let reply = post_json(server.http_addr(), "/v2/models/good/infer", &body);
        assert_eq!(reply.status, 400);
        assert!(reply.error().len() < 1024, "{}", reply.error().len());
    });
}

/// A 60 MB JSON body on one connection (decoded on the offload pool, its
/// answer encoded there too) while another connection of the same, only
/// shard keeps probing `/v2/health/live`: the probes are not held up by
/// the body. Latencies are printed; the bound asserted is generous (CI
/// machines are shared), two orders below the seconds this used to take.
/// Health probes on their own connection every 2 ms while `work` runs;
/// returns `work`'s result and the probes' latencies, sorted.
fn probing_health<R>(
    addr: std::net::SocketAddr,
    work: impl FnOnce() -> R,
) -> (R, Vec<std::time::Duration>) {
    use std::{
        io::Read,
        net::TcpStream,
        sync::{
            atomic::{AtomicBool, Ordering},
            Arc,
        },
        time::{Duration, Instant},
    };
    let done = Arc::new(AtomicBool::new(false));
    let prober = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_nodelay(true).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut lat = Vec::new();
            let mut buf = [0u8; 1024];
            while !done.load(Ordering::Relaxed) {
                let t = Instant::now();
                s.write_all(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
                    .unwrap();
                // An empty 200 fits in one read.
                let got = s.read(&mut buf).unwrap();
                assert!(buf[..got].starts_with(b"HTTP/1.1 200"));
                lat.push(t.elapsed());
                std::thread::sleep(Duration::from_millis(2));
            }
            lat
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    let out = work();
    std::thread::sleep(Duration::from_millis(50));
    done.store(true, Ordering::Relaxed);
    let mut lat = prober.join().unwrap();
    lat.sort();
    (out, lat)
}

/// Prints the probes' figures and checks none waited anywhere near the
/// large request's time (a few ms expected; the bound only catches a
/// shard held for the whole body).
fn check_probes(what: &str, took: std::time::Duration, lat: &[std::time::Duration]) {
    let p = |q: f64| lat[((lat.len() - 1) as f64 * q).round() as usize];
    println!(
        "{what} answered in {took:?}; {} probes meanwhile: p50 {:?} p99 {:?} max {:?}",
        lat.len(),
        p(0.5),
        p(0.99),
        lat[lat.len() - 1]
    );
    assert!(lat.len() >= 10, "only {} probes", lat.len());
    assert!(
        lat[lat.len() - 1] < std::time::Duration::from_millis(300),
        "a probe waited {:?}",
        lat[lat.len() - 1]
    );
}

#[test]
fn a_60_mb_json_body_does_not_hold_up_health_probes() {
    let repo = TempRepo::new("sixty_mb_json");
    repo.identity("big", 0, "");
    let server = repo.start(128 << 20);
    let addr = server.http_addr();

    // 7.5 M ints of 7 digits and a comma: 60 MB of `data`.
    let n = 7_500_000usize;
    let mut body = Vec::with_capacity(n * 8 + 200);
    body.extend_from_slice(
        format!(r#"{{"inputs":[{{"name":"INPUT0","datatype":"INT32","shape":[{n}],"data":["#)
            .as_bytes(),
    );
    for i in 0..n {
        if i > 0 {
            body.push(b',');
        }
        write!(body, "{}", 1_000_000 + (i % 8_999_999)).unwrap();
    }
    body.extend_from_slice(
        br#"]}],"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":true}}]}"#,
    );
    println!("JSON body: {} MB", body.len() / 1_000_000);

    let ((reply, took), lat) = probing_health(addr, || {
        let t = std::time::Instant::now();
        let reply = request(
            addr,
            "POST",
            "/v2/models/big/infer",
            &[("Content-Type", "application/json")],
            &body,
        );
        (reply, t.elapsed())
    });
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body[..reply.body.len().min(300)])
    );
    // The answer: a JSON header, then the 30 MB binary OUTPUT0.
    assert!(reply.body.len() > 4 * n);
    let tail = &reply.body[reply.body.len() - 4 * n..];
    assert_eq!(&tail[..4], &1_000_000i32.to_le_bytes());
    assert_eq!(
        &tail[4 * (n - 1)..],
        &(1_000_000 + (n - 1) as i32).to_le_bytes()
    );
    check_probes("60 MB JSON infer", took, &lat);
    drop(repo);
    server.shutdown().unwrap();
}

/// A 60 MB tensor each way over gRPC: the answer's raw output is sent
/// from the model's buffer after the message (`raw_tail`) and both
/// directions pause the shard every MiB, so probes keep being answered;
/// tonic's decoder must read the appended field as the same message.
#[test]
fn a_60_mb_grpc_tensor_round_trips_without_holding_up_health_probes() {
    use shardserve::proto::inference::model_infer_request::InferInputTensor;

    let repo = TempRepo::new("sixty_mb_grpc");
    repo.identity("big", 0, "");
    let mut opts = ServerOptions::for_tests(&repo.0);
    opts.cores = Some(1);
    opts.grpc_max_message_size = 128 << 20;
    let server = start_with(opts);
    let (http, grpc) = (server.http_addr(), server.grpc_addr());

    let n = 15_000_000usize;
    let raw: Vec<u8> = (0..n as i32).flat_map(|v| v.to_le_bytes()).collect();
    let request = ModelInferRequest {
        model_name: "big".into(),
        inputs: vec![InferInputTensor {
            name: "INPUT0".into(),
            datatype: "INT32".into(),
            shape: vec![n as i64],
            ..Default::default()
        }],
        raw_input_contents: vec![raw.clone().into()],
        ..Default::default()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ((reply, took), lat) = probing_health(http, || {
        rt.block_on(async move {
            let channel = tonic::transport::Channel::from_shared(format!("http://{grpc}"))
                .unwrap()
                .connect()
                .await
                .unwrap();
            let mut client = GrpcInferenceServiceClient::new(channel)
                .max_encoding_message_size(128 << 20)
                .max_decoding_message_size(128 << 20);
            let t = std::time::Instant::now();
            let reply = client.model_infer(request).await.map(|r| r.into_inner());
            (reply, t.elapsed())
        })
    });
    let reply = reply.expect("the 60 MB infer succeeds");
    assert_eq!(reply.model_name, "big");
    assert_eq!(reply.outputs.len(), 1);
    assert_eq!(reply.outputs[0].name, "OUTPUT0");
    assert_eq!(reply.outputs[0].shape, vec![n as i64]);
    assert_eq!(reply.raw_output_contents.len(), 1);
    assert!(reply.raw_output_contents[0][..] == raw[..]);
    check_probes("60 MB gRPC infer", took, &lat);
    drop(repo);
    server.shutdown().unwrap();
}
