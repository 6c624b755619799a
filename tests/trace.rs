//! The trace extension against an in-process server: settings (global,
//! per model, cleared back with null / no values) over HTTP and gRPC, and
//! the trace files — Triton's JSON, events in order for HTTP, gRPC and an
//! ensemble's steps, the rate and count, and log-frequency rotation.

mod common;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use common::*;
use serde_json::{json, Value};
use shardserve::{
    proto::inference::{
        model_infer_request::InferInputTensor, trace_setting_request, ModelInferRequest,
        TraceSettingRequest,
    },
    server::{ServerHandle, ServerOptions},
    trace::TraceConfig,
};

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "shardserve-trace-test-{tag}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn traced_server(file: &Path, flags: &[&str], cores: usize) -> ServerHandle {
    let mut trace = TraceConfig::default();
    trace
        .apply_flag(&format!("triton,file={}", file.display()))
        .unwrap();
    for f in flags {
        trace.apply_flag(f).unwrap();
    }
    let mut opts = ServerOptions::for_tests(repo_path("models"));
    opts.cores = Some(cores);
    opts.trace = trace;
    start_with(opts)
}

fn infer_http(server: &ServerHandle, model: &str, id: &str) {
    let mut body = simple_json_request(1);
    body["id"] = json!(id);
    let r = post_json(
        server.http_addr(),
        &format!("/v2/models/{model}/infer"),
        &body,
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
}

fn simple_grpc_request() -> ModelInferRequest {
    let bytes: Vec<u8> = (0..16i32).flat_map(i32::to_le_bytes).collect();
    let input = |name: &str| InferInputTensor {
        name: name.into(),
        datatype: "INT32".into(),
        shape: vec![1, 16],
        ..Default::default()
    };
    ModelInferRequest {
        model_name: "simple".into(),
        id: "grpc-1".into(),
        inputs: vec![input("INPUT0"), input("INPUT1")],
        raw_input_contents: vec![bytes.clone().into(), bytes.into()],
        ..Default::default()
    }
}

/// A trace file's traces by id: (header object, timestamp names, ns).
struct Traced {
    head: Value,
    names: Vec<String>,
    ns: Vec<u64>,
}

fn read_traces(path: &Path) -> BTreeMap<u64, Traced> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let all: Vec<Value> = serde_json::from_str(&text).expect("a trace file is a JSON array");
    let mut traces: BTreeMap<u64, Traced> = BTreeMap::new();
    for obj in all {
        let id = obj["id"].as_u64().expect("every object has an id");
        let t = traces.entry(id).or_insert(Traced {
            head: Value::Null,
            names: Vec::new(),
            ns: Vec::new(),
        });
        if obj.get("model_name").is_some() {
            t.head = obj;
        } else {
            for ts in obj["timestamps"].as_array().expect("timestamps") {
                t.names.push(ts["name"].as_str().unwrap().to_string());
                t.ns.push(ts["ns"].as_u64().unwrap());
            }
        }
    }
    traces
}

const SERVED: [&str; 7] = [
    "REQUEST_START",
    "QUEUE_START",
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
    "REQUEST_END",
];

fn expected(first: [&str; 2], last: [&str; 2]) -> Vec<String> {
    first
        .iter()
        .chain(SERVED.iter())
        .chain(last.iter())
        .map(|s| s.to_string())
        .collect()
}

#[tokio::test]
async fn http_and_grpc_requests_are_traced_in_tritons_format() {
    let dir = scratch("protocols");
    let file = dir.join("trace.json");
    // Two shards: the request may cross to the model's owner and back.
    let server = traced_server(&file, &["level=TIMESTAMPS", "rate=1"], 2);
    infer_http(&server, "simple", "http-1");
    let mut c = grpc_client(server.grpc_addr()).await;
    c.model_infer(simple_grpc_request()).await.unwrap();
    server.shutdown().unwrap();

    let traces = read_traces(&file);
    assert_eq!(traces.len(), 2, "one trace per request");
    let by_request = |rid: &str| {
        traces
            .values()
            .find(|t| t.head["request_id"] == rid)
            .unwrap_or_else(|| panic!("no trace for request {rid}"))
    };
    let http = by_request("http-1");
    assert_eq!(http.head["model_name"], "simple");
    assert_eq!(http.head["model_version"], 1);
    assert!(http.head.get("parent_id").is_none());
    assert_eq!(
        http.names,
        expected(
            ["HTTP_RECV_START", "HTTP_RECV_END"],
            ["HTTP_SEND_START", "HTTP_SEND_END"]
        )
    );
    let grpc = by_request("grpc-1");
    assert_eq!(
        grpc.names,
        expected(
            ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END"],
            ["GRPC_SEND_START", "GRPC_SEND_END"]
        )
    );
    for t in [http, grpc] {
        assert!(
            t.ns.windows(2).all(|w| w[0] <= w[1]),
            "timestamps in order: {:?}",
            t.ns
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ensemble_steps_are_child_traces() {
    let dir = scratch("ensemble");
    let file = dir.join("trace.json");
    let server = traced_server(&file, &["level=TIMESTAMPS", "rate=1"], 1);
    infer_http(&server, "simple_ensemble", "e-1");
    server.shutdown().unwrap();
    let traces = read_traces(&file);
    let parent = traces
        .iter()
        .find(|(_, t)| t.head["model_name"] == "simple_ensemble")
        .map(|(id, _)| *id)
        .expect("the ensemble's trace");
    let children: Vec<&Traced> = traces
        .values()
        .filter(|t| t.head["parent_id"] == parent)
        .collect();
    assert_eq!(children.len(), 2, "one child per step");
    for c in children {
        assert_eq!(c.head["model_name"], "simple");
        assert_eq!(c.names, SERVED.map(String::from).to_vec());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rate_and_count_sample_every_nth_until_used_up() {
    let dir = scratch("count");
    let file = dir.join("trace.json");
    let server = traced_server(&file, &["level=TIMESTAMPS", "rate=2", "count=3"], 1);
    for i in 0..10 {
        infer_http(&server, "simple", &format!("r{i}"));
    }
    let left = get(server.http_addr(), "/v2/trace/setting").json();
    assert_eq!(left["trace_count"], "0");
    server.shutdown().unwrap();
    // Triton writes a count-limited setting's traces to `<file>.0`.
    let traces = read_traces(&dir.join("trace.json.0"));
    let ids: Vec<&str> = traces
        .values()
        .map(|t| t.head["request_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["r1", "r3", "r5"]);
    assert!(!file.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn log_frequency_rotates_to_indexed_files() {
    let dir = scratch("rotate");
    let file = dir.join("trace.json");
    let server = traced_server(
        &file,
        &["level=TIMESTAMPS", "rate=1", "triton,log-frequency=2"],
        1,
    );
    for i in 0..5 {
        infer_http(&server, "simple", &format!("r{i}"));
    }
    server.shutdown().unwrap();
    let counts: Vec<usize> = (0..3)
        .map(|i| read_traces(&dir.join(format!("trace.json.{i}"))).len())
        .collect();
    assert_eq!(counts, [2, 2, 1]);
    assert!(!dir.join("trace.json.3").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tracing_off_writes_nothing() {
    let dir = scratch("off");
    let file = dir.join("trace.json");
    let server = traced_server(&file, &[], 1);
    infer_http(&server, "simple", "r");
    server.shutdown().unwrap();
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn http_settings_follow_tritons_rules() {
    let dir = scratch("settings");
    let file = dir.join("trace.json");
    let server = traced_server(&file, &[], 1);
    let addr = server.http_addr();
    let global = get(addr, "/v2/trace/setting").json();
    assert_eq!(
        global,
        json!({
            "trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1",
            "log_frequency": "0", "trace_file": file.display().to_string(), "trace_mode": "triton"
        })
    );
    // A model setting takes what it is given and the rest from global.
    let m = post_json(
        addr,
        "/v2/models/simple/trace/setting",
        &json!({"trace_level": ["TIMESTAMPS"], "trace_rate": "1"}),
    );
    assert_eq!(m.status, 200, "{}", String::from_utf8_lossy(&m.body));
    let m = m.json();
    assert_eq!(m["trace_level"], json!(["TIMESTAMPS"]));
    assert_eq!(m["trace_rate"], "1");
    // A global change reaches what the model did not set itself.
    let g = post_json(addr, "/v2/trace/setting", &json!({"log_frequency": "7"})).json();
    assert_eq!(g["log_frequency"], "7");
    let m = get(addr, "/v2/models/simple/trace/setting").json();
    assert_eq!(
        (m["log_frequency"].clone(), m["trace_rate"].clone()),
        (json!("7"), json!("1"))
    );
    // Only the model is traced.
    infer_http(&server, "simple", "m");
    infer_http(&server, "simple_ensemble", "x");
    // null clears back to the global value; nothing left means global.
    let m = post_json(
        addr,
        "/v2/models/simple/trace/setting",
        &json!({"trace_level": null, "trace_rate": null}),
    )
    .json();
    assert_eq!(m["trace_level"], json!(["OFF"]));
    assert_eq!(m["trace_rate"], "1000");
    // Triton's refusals.
    let e = post_json(addr, "/v2/trace/setting", &json!({"trace_file": "/tmp/x"}));
    assert!(e
        .error()
        .contains("can not be updated through network protocol"));
    let e = get(addr, "/v2/models/nope/trace/setting");
    assert_eq!(e.status, 400);
    assert!(e.error().contains("Request for unknown model : nope"));
    let e = post_json(
        addr,
        "/v2/trace/setting",
        &json!({"trace_level": ["TENSORS"]}),
    );
    assert!(e.error().contains("TENSORS"));
    let e = post_json(addr, "/v2/trace/setting", &json!({"trace_rate": "fast"}));
    assert_eq!(e.status, 400);
    assert!(e
        .error()
        .contains("Unable to parse 'trace_rate', got: fast"));
    let e = post_json(
        addr,
        "/v2/trace/setting",
        &json!({"trace_mode": "opentelemetry"}),
    );
    assert!(e.error().contains("opentelemetry"));
    server.shutdown().unwrap();
    // The model's setting had log_frequency 7 from the global one: what it
    // held when it was cleared went to an indexed file.
    let traces = read_traces(&dir.join("trace.json.0"));
    assert_eq!(traces.len(), 1);
    assert!(traces.values().all(|t| t.head["model_name"] == "simple"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn grpc_trace_setting_gets_updates_and_clears() {
    let dir = scratch("grpc-settings");
    let file = dir.join("trace.json");
    let server = traced_server(&file, &["rate=5"], 1);
    let mut c = grpc_client(server.grpc_addr()).await;
    let values = |r: &shardserve::proto::inference::TraceSettingResponse, k: &str| {
        r.settings[k].value.clone()
    };
    let get = c
        .trace_setting(TraceSettingRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(values(&get, "trace_rate"), ["5"]);
    assert_eq!(values(&get, "trace_level"), ["OFF"]);
    assert_eq!(values(&get, "trace_mode"), ["triton"]);
    let set = |k: &str, v: &[&str]| {
        (
            k.to_string(),
            trace_setting_request::SettingValue {
                value: v.iter().map(|s| s.to_string()).collect(),
            },
        )
    };
    let r = c
        .trace_setting(TraceSettingRequest {
            model_name: "simple".into(),
            settings: [
                set("trace_count", &["4"]),
                set("trace_level", &["TIMESTAMPS"]),
            ]
            .into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(values(&r, "trace_count"), ["4"]);
    assert_eq!(values(&r, "trace_rate"), ["5"]);
    // No values: cleared back to the global setting.
    let r = c
        .trace_setting(TraceSettingRequest {
            model_name: "simple".into(),
            settings: [set("trace_count", &[]), set("trace_level", &[])].into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(values(&r, "trace_count"), ["-1"]);
    assert_eq!(values(&r, "trace_level"), ["OFF"]);
    let e = c
        .trace_setting(TraceSettingRequest {
            model_name: "nope".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let e = c
        .trace_setting(TraceSettingRequest {
            settings: [set("trace_rate", &["1", "2"])].into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(e.message().contains("expect only 1 value for 'trace_rate'"));
    server.shutdown().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
