//! GPU instance groups end to end. On a machine without a GPU (this
//! project's CI): `KIND_GPU` models fail to load with Triton's reasons
//! while the others serve, `KIND_AUTO` resolves to CPU in `/config`, and
//! no GPU metric is exported. On a machine with one, those tests print that
//! they were skipped, and the GPU test (an ONNX model on the GPU answering
//! as on the CPU) runs instead; without a GPU it prints why it skipped.

mod common;

use common::{get, post_json, repo_path, start_with, TempRepo};
use serde_json::json;
use shardserve::{gpu::GpuInventory, server::ServerOptions};

const ONNX_IO: &str = r#"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
"#;

fn onnx_model<'a>(name: &'a str, groups: &str) -> (&'a str, String) {
    (name, format!("name: \"{name}\"\n{ONNX_IO}\n{groups}\n"))
}

fn repo(tag: &str, models: &[(&str, String)]) -> TempRepo {
    let repo = TempRepo::new(tag, models);
    let onnx = repo_path("models/simple_onnx/1/model.onnx");
    for (name, config) in models {
        if config.contains("onnxruntime_onnx") {
            std::fs::copy(&onnx, repo.root.join(name).join("1/model.onnx")).expect("copy model");
        }
    }
    repo
}

fn has_gpu() -> bool {
    !GpuInventory::shared().is_empty()
}

/// Says on the terminal (not through the test harness's captured output,
/// so it shows without --nocapture) that a test did not run, and why.
fn skip(test: &str, why: &str) {
    use std::io::Write;
    let machine = GpuInventory::shared()
        .absent
        .clone()
        .unwrap_or_else(|| "GPUs present".into());
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why} ({machine})");
}

fn index(addr: std::net::SocketAddr) -> Vec<serde_json::Value> {
    let reply = post_json(addr, "/v2/repository/index", &json!({}));
    assert_eq!(reply.status, 200);
    reply.json().as_array().expect("index array").clone()
}

fn reason_of(rows: &[serde_json::Value], model: &str) -> String {
    rows.iter()
        .find(|r| r["name"] == model)
        .and_then(|r| r["reason"].as_str())
        .unwrap_or_else(|| panic!("no reason for {model}: {rows:?}"))
        .to_string()
}

#[test]
fn without_a_gpu_gpu_groups_fail_with_tritons_reason_and_the_rest_serve() {
    if has_gpu() {
        skip(
            "without_a_gpu_gpu_groups_fail_with_tritons_reason_and_the_rest_serve",
            "this machine has a GPU; the no-GPU refusals do not apply",
        );
        return;
    }
    let repo = repo(
        "gpu-refusal",
        &[
            onnx_model(
                "onnx_gpu_all",
                "instance_group [ { count: 2 kind: KIND_GPU } ]",
            ),
            onnx_model(
                "onnx_gpu_1",
                "instance_group [ { name: \"on_one\" kind: KIND_GPU gpus: [ 1 ] } ]",
            ),
            onnx_model(
                "onnx_auto",
                "instance_group [ { count: 2 kind: KIND_AUTO } ]",
            ),
            (
                "simple",
                std::fs::read_to_string(repo_path("models/simple/config.pbtxt"))
                    .expect("simple config"),
            ),
        ],
    );
    let server = start_with(ServerOptions::for_tests(&repo.root));
    let addr = server.http_addr();
    let rows = index(addr);
    assert_eq!(
        reason_of(&rows, "onnx_gpu_all"),
        "failed to load 'onnx_gpu_all' version 1: instance group onnx_gpu_all_0 of model \
         onnx_gpu_all has kind KIND_GPU but no GPUs are available"
    );
    assert!(reason_of(&rows, "onnx_gpu_1").ends_with(
        "instance group on_one of model onnx_gpu_1 specifies invalid or unsupported gpu id 1. \
         GPUs with at least the minimum required CUDA compute compatibility of 6.000000 are: "
    ));
    assert_eq!(get(addr, "/v2/models/onnx_gpu_all/ready").status, 400);

    // The rest serve: the built-in model and the KIND_AUTO ONNX model.
    assert_eq!(get(addr, "/v2/models/simple/ready").status, 200);
    assert_eq!(get(addr, "/v2/models/onnx_auto/ready").status, 200);
    let config = get(addr, "/v2/models/onnx_auto/config").json();
    assert_eq!(
        config["instance_group"],
        json!([{
            "name": "onnx_auto_0", "kind": "KIND_CPU", "count": 2, "gpus": [],
            "secondary_devices": [], "profile": [], "passive": false, "host_policy": ""
        }]),
        "{config}"
    );
    let reply = post_json(
        addr,
        "/v2/models/onnx_auto/infer",
        &json!({"inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": vec![1; 16]},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": vec![2; 16]}
        ]}),
    );
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );

    // No GPU metric families at all (not zeros).
    let metrics = String::from_utf8(get(server.metrics_addr(), "/metrics").body).expect("utf-8");
    assert!(
        metrics.contains("nv_inference_request_success"),
        "{metrics}"
    );
    for family in ["nv_gpu_", "nv_energy_consumption"] {
        assert!(!metrics.contains(family), "{family} exported without a GPU");
    }
    server.shutdown().expect("shutdown");
}

#[test]
fn a_gpu_onnx_instance_answers_as_the_cpu_one() {
    if !has_gpu() {
        skip(
            "a_gpu_onnx_instance_answers_as_the_cpu_one",
            "needs an NVIDIA GPU, its driver and the GPU build of ONNX Runtime",
        );
        return;
    }
    let repo = repo(
        "gpu-onnx",
        &[
            onnx_model(
                "on_gpu",
                "instance_group [ { count: 1 kind: KIND_GPU gpus: [ 0 ] } ]",
            ),
            onnx_model("on_cpu", "instance_group [ { count: 1 kind: KIND_CPU } ]"),
        ],
    );
    let server = start_with(ServerOptions::for_tests(&repo.root));
    let addr = server.http_addr();
    let rows = index(addr);
    assert!(
        rows.iter().all(|r| r["state"] == "READY"),
        "both load on a GPU machine: {rows:?}"
    );
    let request = json!({"inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [2, 16], "data": (0..32).collect::<Vec<i32>>()},
        {"name": "INPUT1", "datatype": "INT32", "shape": [2, 16], "data": vec![7; 32]}
    ]});
    let gpu = post_json(addr, "/v2/models/on_gpu/infer", &request).json();
    let cpu = post_json(addr, "/v2/models/on_cpu/infer", &request).json();
    assert_eq!(gpu["outputs"], cpu["outputs"]);
    let config = get(addr, "/v2/models/on_gpu/config").json();
    assert_eq!(config["instance_group"][0]["kind"], "KIND_GPU");
    assert_eq!(config["instance_group"][0]["gpus"], json!([0]));
    server.shutdown().expect("shutdown");
}
