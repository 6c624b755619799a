//! Backends written in C against `include/shardserve/tritonbackend.h`
//! (`tests/capi_backends/*.c`, compiled here with the system `cc`), loaded
//! by the real `shardserve` binary (a child process: the C API is exported
//! from the executable's dynamic symbol table) and used over HTTP and
//! gRPC: identity with batching, a decoupled repeat answering from its own
//! thread, a stateful accumulator on the state API, and a backend failing
//! in each lifecycle function without taking anything else down.

mod common;

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use common::{get, i32s, post_json, request, simple_json_request};
use futures::StreamExt;
use serde_json::json;
use shardserve::proto::inference::{
    infer_parameter::ParameterChoice, model_infer_request::InferInputTensor, ModelInferRequest,
    ModelStreamInferResponse,
};

/// Compiles `tests/capi_backends/<source>.c` into
/// `<dir>/<name>/libtriton_<name>.so`.
fn build_backend(dir: &Path, source: &str, name: &str) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out_dir = dir.join(name);
    std::fs::create_dir_all(&out_dir).expect("backend dir");
    let out = out_dir.join(format!("libtriton_{name}.so"));
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-I"])
        .arg(root.join("include"))
        .arg(root.join("tests/capi_backends").join(format!("{source}.c")))
        .arg("-o")
        .arg(&out)
        .arg("-lpthread")
        .status()
        .expect("run cc (scripts/setup.sh installs gcc)");
    assert!(status.success(), "compiling {source}.c failed");
}

/// A `shardserve` child process on ephemeral loopback ports serving
/// `models` (name, config.pbtxt) with the C backends in its backend
/// directory; killed and its files removed on drop.
struct Server {
    child: Child,
    dir: PathBuf,
    http: SocketAddr,
    grpc: SocketAddr,
}

impl Server {
    fn start(tag: &str, models: &[(&str, String)], args: &[&str]) -> Self {
        let dir =
            std::env::temp_dir().join(format!("shardserve-capi-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let backends = dir.join("backends");
        for (source, name) in [
            ("identity", "capi_identity"),
            ("repeat", "capi_repeat"),
            ("accumulator", "capi_accumulator"),
            ("failing", "capi_failing"),
            ("failing", "capi_failing_init"),
        ] {
            build_backend(&backends, source, name);
        }
        let repo = dir.join("models");
        for (name, config) in models {
            std::fs::create_dir_all(repo.join(name).join("1")).expect("model dir");
            std::fs::write(repo.join(name).join("config.pbtxt"), config).expect("config");
        }
        let log = dir.join("server.log");
        let out = std::fs::File::create(&log).expect("log file");
        let err = out.try_clone().expect("log file");
        let mut child = Command::new(env!("CARGO_BIN_EXE_shardserve"))
            .arg("--model-repository")
            .arg(&repo)
            .arg("--backend-directory")
            .arg(&backends)
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
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .expect("spawn the server");
        let until = Instant::now() + Duration::from_secs(30);
        let (http, grpc) = loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(a) = find_addr(&text, "http").zip(find_addr(&text, "grpc")) {
                if text.contains("loaded") || text.contains("failed") {
                    break a;
                }
            }
            if Instant::now() > until || child.try_wait().ok().flatten().is_some() {
                let _ = child.kill();
                let _ = child.wait();
                panic!("server did not start:\n{text}");
            }
            thread::sleep(Duration::from_millis(20));
        };
        let server = Self {
            child,
            dir,
            http,
            grpc,
        };
        // Models load after the listeners open: wait for the repository
        // to have settled (every model READY or UNAVAILABLE).
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let index = post_json(server.http, "/v2/repository/index", &json!({})).json();
            let settled = index.as_array().is_some_and(|models| {
                models.len() == server_models(&server.dir)
                    && models
                        .iter()
                        .all(|m| m["state"] == "READY" || m["state"] == "UNAVAILABLE")
            });
            if settled {
                break;
            }
            assert!(Instant::now() < until, "models did not load: {index}");
            thread::sleep(Duration::from_millis(50));
        }
        server
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_none()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }
}

fn server_models(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("models")).map_or(0, |d| d.count())
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The address after `<what>=` on the "listening" log line.
fn find_addr(log: &str, what: &str) -> Option<SocketAddr> {
    let line = log.lines().find(|l| l.contains("listening"))?;
    let key = format!("{what}=");
    let start = line.find(&key)? + key.len();
    line[start..].split_whitespace().next()?.parse().ok()
}

/// `simple`-shaped model served by `backend`.
fn simple_config(name: &str, backend: &str, extra: &str) -> String {
    format!(
        r#"name: "{name}"
backend: "{backend}"
max_batch_size: 8
input [
  {{ name: "INPUT0", data_type: TYPE_INT32, dims: [ 16 ] }},
  {{ name: "INPUT1", data_type: TYPE_INT32, dims: [ 16 ] }}
]
output [
  {{ name: "OUTPUT0", data_type: TYPE_INT32, dims: [ 16 ] }},
  {{ name: "OUTPUT1", data_type: TYPE_INT32, dims: [ 16 ] }}
]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
{extra}
"#
    )
}

fn output<'a>(reply: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    reply["outputs"]
        .as_array()
        .and_then(|o| o.iter().find(|t| t["name"] == name))
        .unwrap_or_else(|| panic!("no output {name} in {reply}"))
}

#[test]
fn identity_backend_serves_http_and_grpc_and_batches_requests() {
    let models = [(
        "cid",
        simple_config(
            "cid",
            "capi_identity",
            "dynamic_batching { max_queue_delay_microseconds: 300000, preferred_batch_size: [ 4 ] }",
        ),
    )];
    let mut server = Server::start("identity", &models, &[]);

    let reply = post_json(server.http, "/v2/models/cid/infer", &simple_json_request(7));
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let body = reply.json();
    assert_eq!(
        i32s(&output(&body, "OUTPUT0")["data"]),
        (0..16).collect::<Vec<i64>>()
    );
    assert_eq!(i32s(&output(&body, "OUTPUT1")["data"]), vec![7; 16]);
    assert_eq!(output(&body, "OUTPUT0")["shape"], json!([1, 16]));
    // The backend's response parameter reaches the client.
    assert!(
        body["parameters"]["execution_requests"].as_i64().is_some(),
        "{body}"
    );

    // Request parameters reach the backend (not the protocol's own).
    let mut with_params = simple_json_request(1);
    with_params["parameters"] =
        json!({"tag": "x", "n": 5, "flag": true, "binary_data_output": false});
    let body = post_json(server.http, "/v2/models/cid/infer", &with_params).json();
    let p = &body["parameters"];
    assert_eq!(
        (&p["echo_tag"], &p["echo_n"], &p["echo_flag"]),
        (&json!("x"), &json!(5), &json!(true)),
        "{body}"
    );
    assert!(p.get("echo_binary_data_output").is_none(), "{body}");

    // One requested output only.
    let mut only = simple_json_request(3);
    only["outputs"] = json!([{"name": "OUTPUT1"}]);
    let body = post_json(server.http, "/v2/models/cid/infer", &only).json();
    assert_eq!(body["outputs"].as_array().map(Vec::len), Some(1), "{body}");
    assert_eq!(i32s(&output(&body, "OUTPUT1")["data"]), vec![3; 16]);

    // Four concurrent requests: the dynamic batcher hands them to one
    // execution as separate requests; each gets its own data back.
    let http = server.http;
    let replies: Vec<serde_json::Value> = (0..4)
        .map(|i| {
            thread::spawn(move || {
                post_json(http, "/v2/models/cid/infer", &simple_json_request(100 + i)).json()
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().expect("client thread"))
        .collect();
    let mut most = 0;
    for (i, body) in replies.iter().enumerate() {
        assert_eq!(
            i32s(&output(body, "OUTPUT1")["data"]),
            vec![100 + i as i64; 16]
        );
        most = most.max(
            body["parameters"]["execution_requests"]
                .as_i64()
                .unwrap_or(0),
        );
    }
    assert!(
        most > 1,
        "no execution had more than one request: {replies:?}"
    );

    // gRPC unary.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut c = common::grpc_client(server.grpc).await;
        let data: Vec<u8> = (0..16i32).flat_map(|v| (v * 2).to_le_bytes()).collect();
        let tensor = |name: &str| InferInputTensor {
            name: name.into(),
            datatype: "INT32".into(),
            shape: vec![1, 16],
            ..Default::default()
        };
        let r = c
            .model_infer(ModelInferRequest {
                model_name: "cid".into(),
                id: "g1".into(),
                inputs: vec![tensor("INPUT0"), tensor("INPUT1")],
                raw_input_contents: vec![data.clone().into(), data.clone().into()],
                ..Default::default()
            })
            .await
            .expect("ModelInfer")
            .into_inner();
        assert_eq!(r.id, "g1");
        assert_eq!(r.raw_output_contents.len(), 2);
        assert_eq!(&r.raw_output_contents[0][..], &data[..]);
    });
    assert!(server.alive());
}

/// Ragged batching for a C API backend: as in Triton, the server only lets
/// requests of different shapes into one execution; the backend gets each
/// request with its own shapes (and builds any batch input itself from the
/// configuration, which it reads through `TRITONBACKEND_ModelConfig`).
#[test]
fn ragged_requests_reach_a_c_backend_in_one_execution_with_their_own_shapes() {
    let config = r#"name: "cragged"
backend: "capi_identity"
max_batch_size: 8
input [
  { name: "INPUT0", data_type: TYPE_INT32, dims: [ -1 ], allow_ragged_batch: true }
]
output [ { name: "OUTPUT0", data_type: TYPE_INT32, dims: [ -1 ] } ]
batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT, target_name: "INDEX",
                data_type: TYPE_INT32, source_input: "INPUT0" } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
dynamic_batching { max_queue_delay_microseconds: 30000000, preferred_batch_size: [ 4 ] }
"#;
    let models = [("cragged", config.to_string())];
    let mut server = Server::start("ragged", &models, &[]);
    let http = server.http;
    // Four lengths: the 30 s delay and preferred size 4 make them one
    // execution whatever the scheduling of the client threads.
    let replies: Vec<(i64, serde_json::Value)> = [2i64, 5, 1, 3]
        .into_iter()
        .map(|n| {
            thread::spawn(move || {
                let data: Vec<i64> = (0..n).map(|v| v + 10 * n).collect();
                let body = json!({"inputs": [
                    {"name": "INPUT0", "datatype": "INT32", "shape": [1, n], "data": data}
                ]});
                (n, post_json(http, "/v2/models/cragged/infer", &body).json())
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().expect("client thread"))
        .collect();
    for (n, body) in &replies {
        let out = output(body, "OUTPUT0");
        assert_eq!(out["shape"], json!([1, n]), "{body}");
        assert_eq!(
            i32s(&out["data"]),
            (0..*n).map(|v| v + 10 * n).collect::<Vec<_>>()
        );
        assert_eq!(
            body["parameters"]["execution_requests"].as_i64(),
            Some(4),
            "{body}"
        );
    }
    assert!(server.alive());
}

#[test]
fn decoupled_repeat_backend_streams_responses_in_order_from_its_thread() {
    let config = r#"name: "crepeat"
backend: "capi_repeat"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN", data_type: TYPE_INT32, dims: [ -1 ] } ]
output [
  { name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] },
  { name: "IDX", data_type: TYPE_UINT32, dims: [ 1 ] }
]
instance_group [ { count: 1, kind: KIND_CPU } ]
"#;
    let mut server = Server::start("repeat", &[("crepeat", config.to_string())], &[]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let responses: Vec<ModelStreamInferResponse> = rt.block_on(async {
        let mut c = common::grpc_client(server.grpc).await;
        let request = |id: &str, values: &[i32]| {
            let mut r = ModelInferRequest {
                model_name: "crepeat".into(),
                id: id.into(),
                inputs: vec![InferInputTensor {
                    name: "IN".into(),
                    datatype: "INT32".into(),
                    shape: vec![values.len() as i64],
                    ..Default::default()
                }],
                raw_input_contents: vec![values
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect::<Vec<u8>>()
                    .into()],
                ..Default::default()
            };
            r.parameters.insert(
                "triton_enable_empty_final_response".into(),
                shardserve::proto::inference::InferParameter {
                    parameter_choice: Some(ParameterChoice::BoolParam(true)),
                },
            );
            r
        };
        let outbound =
            futures::stream::iter(vec![request("a", &[5, 6, 7, 8]), request("b", &[42])]);
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
    });
    let of = |id: &str| -> Vec<&ModelStreamInferResponse> {
        responses
            .iter()
            .filter(|r| r.infer_response.as_ref().is_some_and(|i| i.id == id))
            .collect()
    };
    for (id, values) in [("a", vec![5, 6, 7, 8]), ("b", vec![42])] {
        let rs = of(id);
        assert_eq!(rs.len(), values.len() + 1, "{responses:?}");
        for (i, r) in rs[..values.len()].iter().enumerate() {
            assert!(r.error_message.is_empty(), "{}", r.error_message);
            let resp = r.infer_response.as_ref().expect("response");
            let pos = |n: &str| {
                resp.outputs
                    .iter()
                    .position(|o| o.name == n)
                    .expect("output")
            };
            let raw = |p: usize| -> [u8; 4] {
                resp.raw_output_contents[p][..4]
                    .try_into()
                    .expect("4 bytes")
            };
            assert_eq!(i32::from_le_bytes(raw(pos("OUT"))), values[i]);
            assert_eq!(u32::from_le_bytes(raw(pos("IDX"))), i as u32);
        }
        let last = rs[values.len()].infer_response.as_ref().expect("final");
        assert!(last.outputs.is_empty());
        assert!(matches!(
            last.parameters
                .get("triton_final_response")
                .and_then(|p| p.parameter_choice.clone()),
            Some(ParameterChoice::BoolParam(true))
        ));
    }
    // HTTP /infer refuses decoupled models, as Triton does.
    let body = json!({"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [1]}]});
    assert_ne!(
        post_json(server.http, "/v2/models/crepeat/infer", &body).status,
        200
    );
    assert!(server.alive());
}

#[test]
fn accumulator_keeps_implicit_state_per_sequence() {
    let config = r#"name: "cacc"
backend: "capi_accumulator"
max_batch_size: 8
input [ { name: "INPUT", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "OUTPUT", data_type: TYPE_INT32, dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  direct { }
  state [ { input_name: "INPUT_STATE", output_name: "OUTPUT_STATE", data_type: TYPE_INT32, dims: [ 1 ] } ]
}
instance_group [ { count: 1, kind: KIND_CPU } ]
"#;
    let mut server = Server::start("accumulator", &[("cacc", config.to_string())], &[]);
    let step = |id: u64, value: i32, start: bool, end: bool| -> serde_json::Value {
        let body = json!({
            "parameters": {"sequence_id": id, "sequence_start": start, "sequence_end": end},
            "inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [value]}]
        });
        let reply = post_json(server.http, "/v2/models/cacc/infer", &body);
        assert_eq!(
            reply.status,
            200,
            "{}",
            String::from_utf8_lossy(&reply.body)
        );
        reply.json()
    };
    let sum = |r: &serde_json::Value| i32s(&output(r, "OUTPUT")["data"])[0];
    // Two sequences interleaved: each keeps its own running sum.
    let a1 = step(11, 1, true, false);
    assert_eq!(sum(&a1), 1);
    assert_eq!(a1["parameters"]["correlation_id"], 11);
    assert_eq!(a1["parameters"]["flags"], 1, "START");
    assert_eq!(sum(&step(12, 10, true, false)), 10);
    assert_eq!(sum(&step(11, 2, false, false)), 3);
    assert_eq!(sum(&step(12, 20, false, false)), 30);
    let a3 = step(11, 3, false, true);
    assert_eq!(sum(&a3), 6);
    assert_eq!(a3["parameters"]["flags"], 2, "END");
    assert_eq!(sum(&step(12, 5, false, true)), 35);
    // A new sequence on the same id starts from zero again.
    assert_eq!(sum(&step(11, 4, true, true)), 4);
    assert!(server.alive());
}

#[test]
fn lifecycle_and_request_failures_stay_contained() {
    let fail = |name: &str, backend: &str, where_: &str| {
        simple_config(
            name,
            backend,
            &format!(r#"parameters {{ key: "fail_in" value: {{ string_value: "{where_}" }} }}"#),
        )
    };
    let models = [
        ("good", simple_config("good", "capi_identity", "")),
        (
            "fail_backend_init",
            fail("fail_backend_init", "capi_failing_init", "none"),
        ),
        (
            "fail_model_init",
            fail("fail_model_init", "capi_failing", "model_initialize"),
        ),
        (
            "fail_instance_init",
            fail("fail_instance_init", "capi_failing", "instance_initialize"),
        ),
        (
            "fail_execute",
            fail("fail_execute", "capi_failing", "execute"),
        ),
        (
            "fail_request",
            fail("fail_request", "capi_failing", "request"),
        ),
        (
            "no_such_backend",
            simple_config("no_such_backend", "capi_absent", ""),
        ),
    ];
    let mut server = Server::start(
        "failing",
        &models,
        // Broken on purpose: serve the others (tritonserver's default exits).
        &[
            "--exit-on-error=false",
            "--backend-config",
            "capi_failing_init,fail_in=initialize",
        ],
    );
    let index = post_json(server.http, "/v2/repository/index", &json!({})).json();
    let entry = |name: &str| -> serde_json::Value {
        index
            .as_array()
            .and_then(|m| m.iter().find(|e| e["name"] == name))
            .cloned()
            .unwrap_or_else(|| panic!("{name} not in {index}"))
    };
    for (name, message) in [
        (
            "fail_backend_init",
            "TRITONBACKEND_Initialize fails as told",
        ),
        ("fail_model_init", "ModelInitialize fails as told"),
        (
            "fail_instance_init",
            "ModelInstanceInitialize fails as told",
        ),
        ("no_such_backend", "libtriton_capi_absent.so"),
    ] {
        let e = entry(name);
        assert_eq!(e["state"], "UNAVAILABLE", "{e}");
        let reason = e["reason"].as_str().unwrap_or_default();
        assert!(reason.contains(message), "{name}: {reason}");
        assert_ne!(
            get(server.http, &format!("/v2/models/{name}/ready")).status,
            200
        );
    }
    for name in ["good", "fail_execute", "fail_request"] {
        assert_eq!(entry(name)["state"], "READY", "{index}");
    }

    // An error from execute fails that execution's requests only.
    let reply = post_json(
        server.http,
        "/v2/models/fail_execute/infer",
        &simple_json_request(1),
    );
    assert_eq!(reply.status, 500);
    assert!(
        reply.error().contains("execute fails as told"),
        "{}",
        reply.error()
    );

    // An error response fails that request; the next one is served.
    let mut negative = simple_json_request(1);
    negative["inputs"][0]["data"] = json!(vec![-1; 16]);
    let reply = post_json(server.http, "/v2/models/fail_request/infer", &negative);
    assert_eq!(reply.status, 400, "{}", reply.error());
    assert!(
        reply.error().contains("negative input refused"),
        "{}",
        reply.error()
    );
    let reply = post_json(
        server.http,
        "/v2/models/fail_request/infer",
        &simple_json_request(1),
    );
    assert_eq!(reply.status, 200, "{}", reply.error());

    // Everything else keeps serving and the server is still up.
    let reply = post_json(
        server.http,
        "/v2/models/good/infer",
        &simple_json_request(9),
    );
    assert_eq!(reply.status, 200, "{}", reply.error());
    let reply = request(server.http, "GET", "/v2/health/live", &[], b"");
    assert_eq!(reply.status, 200);
    assert!(server.alive(), "{}", server.log());
}

#[test]
fn in_process_server_loads_a_backend_from_the_model_version_folder() {
    // The library sits in the version folder (searched first), and the
    // server runs inside this test executable, which exports the C API
    // too (build.rs).
    let repo = common::TempRepo::new(
        "capi-inprocess",
        &[("vid", simple_config("vid", "capi_version_local", ""))],
    );
    let version_dir = repo.root.join("vid").join("1");
    build_backend(&version_dir, "identity", "capi_version_local");
    let built = version_dir.join("capi_version_local/libtriton_capi_version_local.so");
    std::fs::rename(&built, version_dir.join("libtriton_capi_version_local.so")).expect("move");
    let mut opts = shardserve::server::ServerOptions::for_tests(repo.root.clone());
    opts.cores = Some(1);
    let server = common::start_with(opts);
    let reply = post_json(
        server.http_addr(),
        "/v2/models/vid/infer",
        &simple_json_request(4),
    );
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(i32s(&output(&reply.json(), "OUTPUT1")["data"]), vec![4; 16]);
    server.shutdown().expect("shutdown");
}
