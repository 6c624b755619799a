//! The ONNX Runtime backend through the whole server: the example ONNX
//! models over HTTP (JSON and the binary extension), auto-complete of a
//! model without a configuration, and models that fail to load failing
//! alone, with a reason that says why.

mod common;

use std::path::PathBuf;

use common::*;
use serde_json::json;
use shardserve::{
    model::ModelState,
    server::{ServerHandle, ServerOptions},
};

fn simple_onnx_request(rows: &[(Vec<i32>, Vec<i32>)]) -> serde_json::Value {
    let b = rows.len();
    let a: Vec<i32> = rows.iter().flat_map(|(a, _)| a.clone()).collect();
    let c: Vec<i32> = rows.iter().flat_map(|(_, c)| c.clone()).collect();
    json!({
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [b, 16], "data": a},
            {"name": "INPUT1", "datatype": "INT32", "shape": [b, 16], "data": c},
        ]
    })
}

fn output<'a>(reply: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    reply["outputs"]
        .as_array()
        .expect("outputs")
        .iter()
        .find(|o| o["name"] == name)
        .unwrap_or_else(|| panic!("no output {name} in {reply}"))
}

fn infer_ok(
    addr: std::net::SocketAddr,
    model: &str,
    body: &serde_json::Value,
) -> serde_json::Value {
    let r = post_json(addr, &format!("/v2/models/{model}/infer"), body);
    assert_eq!(
        r.status,
        200,
        "{model}: {}",
        String::from_utf8_lossy(&r.body)
    );
    r.json()
}

#[test]
fn simple_onnx_adds_and_subtracts_with_wraparound_over_json() {
    let server = start_server(1);
    let addr = server.http_addr();
    let mut a: Vec<i32> = (0..16).collect();
    a[0] = i32::MAX;
    a[1] = i32::MIN;
    let b = vec![1; 16];
    let reply = infer_ok(
        addr,
        "simple_onnx",
        &simple_onnx_request(&[(a.clone(), b.clone())]),
    );
    let sum = output(&reply, "OUTPUT0");
    let diff = output(&reply, "OUTPUT1");
    assert_eq!(sum["datatype"], "INT32");
    assert_eq!(sum["shape"], json!([1, 16]));
    let want_sum: Vec<i64> = a
        .iter()
        .zip(&b)
        .map(|(x, y)| i64::from(x.wrapping_add(*y)))
        .collect();
    let want_diff: Vec<i64> = a
        .iter()
        .zip(&b)
        .map(|(x, y)| i64::from(x.wrapping_sub(*y)))
        .collect();
    assert_eq!(i32s(&sum["data"]), want_sum);
    assert_eq!(i32s(&diff["data"]), want_diff);
    assert_eq!(want_sum[0], i64::from(i32::MIN), "2147483647 + 1 wraps");
    assert_eq!(want_diff[1], i64::from(i32::MAX), "-2147483648 - 1 wraps");
    server.shutdown().unwrap();
}

#[test]
fn simple_onnx_binary_extension_in_and_out() {
    let server = start_server(1);
    let addr = server.http_addr();
    let header = json!({
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": 64}},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": 64}},
        ],
        "outputs": [
            {"name": "OUTPUT0", "parameters": {"binary_data": true}},
            {"name": "OUTPUT1", "parameters": {"binary_data": true}},
        ]
    })
    .to_string();
    // An odd-length header puts the tensors at unaligned offsets of the
    // body, which the backend must copy rather than view.
    let header = if header.len() % 2 == 0 {
        format!("{header} ")
    } else {
        header
    };
    let mut body = header.clone().into_bytes();
    for i in 0..16i32 {
        body.extend_from_slice(&(i * 3).to_le_bytes());
    }
    for i in 0..16i32 {
        body.extend_from_slice(&(i - 8).to_le_bytes());
    }
    let r = request(
        addr,
        "POST",
        "/v2/models/simple_onnx/infer",
        &[("Inference-Header-Content-Length", &header.len().to_string())],
        &body,
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let json_len: usize = r
        .header("Inference-Header-Content-Length")
        .expect("binary reply")
        .parse()
        .unwrap();
    let reply: serde_json::Value = serde_json::from_slice(&r.body[..json_len]).unwrap();
    assert_eq!(reply["outputs"][0]["parameters"]["binary_data_size"], 64);
    let ints = |range: std::ops::Range<usize>| -> Vec<i32> {
        r.body[range]
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    let (first, second) = if reply["outputs"][0]["name"] == "OUTPUT0" {
        (0, 64)
    } else {
        (64, 0)
    };
    let sum = ints(json_len + first..json_len + first + 64);
    let diff = ints(json_len + second..json_len + second + 64);
    assert_eq!(sum, (0..16).map(|i| i * 3 + i - 8).collect::<Vec<i32>>());
    assert_eq!(diff, (0..16).map(|i| i * 3 - (i - 8)).collect::<Vec<i32>>());
    assert_eq!(r.body.len(), json_len + 128);
    server.shutdown().unwrap();
}

#[test]
fn simple_onnx_batch_of_three_and_requested_output_subset() {
    let server = start_server(1);
    let addr = server.http_addr();
    let rows: Vec<(Vec<i32>, Vec<i32>)> = (0..3)
        .map(|r| ((0..16).map(|i| i + 100 * r).collect(), vec![r; 16]))
        .collect();
    let reply = infer_ok(addr, "simple_onnx", &simple_onnx_request(&rows));
    let sum = output(&reply, "OUTPUT0");
    assert_eq!(sum["shape"], json!([3, 16]));
    let want: Vec<i64> = rows
        .iter()
        .flat_map(|(a, b)| {
            a.iter()
                .zip(b)
                .map(|(x, y)| i64::from(x + y))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(i32s(&sum["data"]), want);

    let mut body = simple_onnx_request(&rows);
    body["outputs"] = json!([{"name": "OUTPUT1"}]);
    let reply = infer_ok(addr, "simple_onnx", &body);
    assert_eq!(reply["outputs"].as_array().unwrap().len(), 1);
    assert_eq!(reply["outputs"][0]["name"], "OUTPUT1");
    assert_eq!(i32s(&reply["outputs"][0]["data"])[16..18], [99, 100]);
    server.shutdown().unwrap();
}

#[test]
fn simple_onnx_metadata_and_config() {
    let server = start_server(1);
    let addr = server.http_addr();
    let meta = get(addr, "/v2/models/simple_onnx").json();
    assert_eq!(meta["name"], "simple_onnx");
    assert_eq!(meta["platform"], "onnxruntime_onnx");
    assert_eq!(meta["versions"], json!(["1"]));
    assert_eq!(
        meta["inputs"][0],
        json!({"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]})
    );
    assert_eq!(meta["inputs"][1]["name"], "INPUT1");
    assert_eq!(
        meta["outputs"][0],
        json!({"name": "OUTPUT0", "datatype": "INT32", "shape": [-1, 16]})
    );
    assert_eq!(meta["outputs"][1]["name"], "OUTPUT1");
    let config = get(addr, "/v2/models/simple_onnx/config").json();
    assert_eq!(config["name"], "simple_onnx");
    assert_eq!(config["platform"], "onnxruntime_onnx");
    assert_eq!(config["max_batch_size"], 8);
    assert_eq!(config["input"][0]["data_type"], "TYPE_INT32");
    assert_eq!(config["input"][0]["dims"], json!([16]));
    assert_eq!(config["output"][1]["name"], "OUTPUT1");
    server.shutdown().unwrap();
}

fn mlp_request(rows: usize) -> serde_json::Value {
    let data: Vec<f32> = (0..rows * 256)
        .map(|i| ((i % 256) as f32 - 128.0) / 64.0)
        .collect();
    json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [rows, 256], "data": data}]})
}

fn floats(v: &serde_json::Value) -> Vec<f64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect()
}

#[test]
fn mlp_onnx_runs_batches_of_one_and_five() {
    let server = start_server(1);
    let addr = server.http_addr();
    let one = infer_ok(addr, "mlp_onnx", &mlp_request(1));
    let out = output(&one, "OUTPUT0");
    assert_eq!(out["datatype"], "FP32");
    assert_eq!(out["shape"], json!([1, 256]));
    let row = floats(&out["data"]);
    assert_eq!(row.len(), 256);
    assert!(row.iter().all(|x| x.is_finite()));
    assert!(
        row.iter().any(|&x| x != 0.0),
        "an all-zero output means the weights did not load"
    );

    let five = infer_ok(addr, "mlp_onnx", &mlp_request(5));
    let out = output(&five, "OUTPUT0");
    assert_eq!(out["shape"], json!([5, 256]));
    let all = floats(&out["data"]);
    assert_eq!(all.len(), 5 * 256);
    // Every row has the same input, so every row matches the batch of one
    // (up to the rounding a different GEMM blocking may bring).
    for (i, (x, y)) in all.iter().zip(row.iter().cycle()).enumerate() {
        assert!(
            (x - y).abs() <= 1e-4 * (1.0 + y.abs()),
            "element {i}: {x} vs {y}"
        );
    }
    assert_eq!(get(addr, "/v2/models/mlp_onnx_dyna/ready").status, 200);
    let dyna = infer_ok(addr, "mlp_onnx_dyna", &mlp_request(2));
    assert_eq!(output(&dyna, "OUTPUT0")["shape"], json!([2, 256]));
    server.shutdown().unwrap();
}

/// A fresh repository under the system temp dir, removed on drop.
struct TempRepo(PathBuf);

impl TempRepo {
    fn new(tag: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("shardserve-onnx-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn model(&self, name: &str, onnx: &[u8], config: Option<&str>) {
        let version = self.0.join(name).join("1");
        std::fs::create_dir_all(&version).unwrap();
        std::fs::write(version.join("model.onnx"), onnx).unwrap();
        if let Some(config) = config {
            std::fs::write(self.0.join(name).join("config.pbtxt"), config).unwrap();
        }
    }

    fn start(&self) -> ServerHandle {
        let mut opts = ServerOptions::for_tests(&self.0);
        opts.cores = Some(1);
        start_with(opts)
    }
}

impl Drop for TempRepo {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn simple_onnx_bytes() -> Vec<u8> {
    std::fs::read(repo_path("models/simple_onnx/1/model.onnx")).unwrap()
}

/// Why `name` is not ready, from the server's model table.
fn failure(server: &ServerHandle, name: &str) -> String {
    let entry = server
        .models()
        .models
        .get(name)
        .unwrap_or_else(|| panic!("{name} is not in the table"));
    if let Some(f) = &entry.failure {
        return f.clone();
    }
    entry
        .versions
        .values()
        .find_map(|v| match &v.state {
            ModelState::Unavailable { reason } => Some(reason.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{name} did not fail"))
}

#[test]
fn a_model_without_config_is_auto_completed_from_the_onnx_file() {
    let repo = TempRepo::new("auto");
    repo.model("auto_simple", &simple_onnx_bytes(), None);
    let server = repo.start();
    let addr = server.http_addr();
    let meta = get(addr, "/v2/models/auto_simple").json();
    assert_eq!(meta["platform"], "onnxruntime_onnx", "{meta}");
    assert_eq!(
        meta["inputs"][0],
        json!({"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]})
    );
    let config = get(addr, "/v2/models/auto_simple/config").json();
    assert_eq!(
        config["max_batch_size"], 4,
        "Triton's default-max-batch-size"
    );
    assert!(config.get("dynamic_batching").is_some(), "{config}");
    let rows = vec![
        ((0..16).collect(), vec![2; 16]),
        ((0..16).collect(), vec![-2; 16]),
    ];
    let reply = infer_ok(addr, "auto_simple", &simple_onnx_request(&rows));
    assert_eq!(i32s(&output(&reply, "OUTPUT1")["data"])[16..18], [2, 3]);
    server.shutdown().unwrap();
}

#[test]
fn broken_onnx_models_fail_alone_with_a_clear_reason() {
    let repo = TempRepo::new("broken");
    repo.model("good", &simple_onnx_bytes(), None);
    repo.model("garbage", b"definitely not an ONNX protobuf", None);
    repo.model(
        "wrong_type",
        &simple_onnx_bytes(),
        Some(
            r#"name: "wrong_type"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]
"#,
        ),
    );
    repo.model(
        "unknown_input",
        &simple_onnx_bytes(),
        Some(
            r#"name: "unknown_input"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "INPUT9" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]
"#,
        ),
    );
    let server = repo.start();
    let addr = server.http_addr();
    let reason = failure(&server, "garbage");
    assert!(
        reason.contains("ONNX Runtime cannot load") && reason.contains("model.onnx"),
        "{reason}"
    );
    let reason = failure(&server, "wrong_type");
    assert!(
        reason.contains("INPUT0") && reason.contains("TYPE_FP32") && reason.contains("TYPE_INT32"),
        "{reason}"
    );
    let reason = failure(&server, "unknown_input");
    assert!(reason.contains("'INPUT9' is not an input"), "{reason}");
    for name in ["garbage", "wrong_type", "unknown_input"] {
        assert_ne!(
            get(addr, &format!("/v2/models/{name}/ready")).status,
            200,
            "{name}"
        );
    }
    assert_eq!(get(addr, "/v2/models/good/ready").status, 200);
    // A client asking the broken model learns why it is not there.
    let reply = post_json(
        addr,
        "/v2/models/unknown_input/infer",
        &simple_onnx_request(&[((0..16).collect(), vec![1; 16])]),
    );
    assert_eq!(reply.status, 503);
    assert!(
        reply.error().contains("Request for unknown model"),
        "{}",
        reply.error()
    );
    assert!(
        reply.error().contains("'INPUT9' is not an input"),
        "{}",
        reply.error()
    );
    let reply = infer_ok(
        addr,
        "good",
        &simple_onnx_request(&[((0..16).collect(), vec![1; 16])]),
    );
    assert_eq!(i32s(&output(&reply, "OUTPUT0")["data"])[..2], [1, 2]);
    server.shutdown().unwrap();
}

#[test]
fn the_library_is_found_without_any_environment_variable() {
    if std::env::var_os("SHARDSERVE_ORT_LIB").is_some()
        || std::env::var_os("ORT_DYLIB_PATH").is_some()
    {
        return; // an explicit override wins; nothing to check about discovery
    }
    let path =
        shardserve::backend::onnxruntime::runtime::find_library().expect("run scripts/setup.sh");
    assert!(
        path.ends_with(".ort/libonnxruntime.so"),
        "{}",
        path.display()
    );
}

/// Runs the ignored test `name` of this binary in a child process with
/// `env` set: the ONNX Runtime library is loaded once per process, so a
/// missing library can only be tried in a process of its own.
fn run_child_test(name: &str, env: (&str, &str)) {
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args([
            "--exact",
            name,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(env.0, env.1)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "child test {name} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // A filter that matches nothing also succeeds: make sure it ran.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("1 passed"),
        "child test {name} did not run:\n{stdout}"
    );
}

#[test]
fn a_missing_library_fails_only_the_onnx_models() {
    run_child_test(
        "missing_library_child",
        ("SHARDSERVE_ORT_LIB", "/nonexistent/libonnxruntime.so"),
    );
}

#[test]
#[ignore = "run by a_missing_library_fails_only_the_onnx_models in its own process"]
fn missing_library_child() {
    let repo = TempRepo::new("nolib");
    repo.model("onnx_simple", &simple_onnx_bytes(), None);
    let builtin = repo.0.join("simple");
    std::fs::create_dir_all(builtin.join("1")).unwrap();
    std::fs::copy(
        repo_path("models/simple/config.pbtxt"),
        builtin.join("config.pbtxt"),
    )
    .unwrap();
    let server = repo.start();
    let addr = server.http_addr();
    let reason = failure(&server, "onnx_simple");
    assert!(
        reason.contains("ONNX Runtime library not found;")
            && reason.contains("set SHARDSERVE_ORT_LIB"),
        "{reason}"
    );
    assert_ne!(get(addr, "/v2/models/onnx_simple/ready").status, 200);
    let r = post_json(addr, "/v2/models/simple/infer", &simple_json_request(1));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    server.shutdown().unwrap();
}
