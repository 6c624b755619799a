//! KServe v2 HTTP/REST over real sockets against an in-process server:
//! every endpoint, and every bad input answered with Triton's status and
//! a clear `{"error": ...}`, the server healthy afterwards.

mod common;

use common::*;
use serde_json::json;

fn assert_healthy(addr: std::net::SocketAddr) {
    assert_eq!(
        get(addr, "/v2/health/ready").status,
        200,
        "server should still be ready"
    );
    let r = post_json(addr, "/v2/models/simple/infer", &simple_json_request(1));
    assert_eq!(
        r.status,
        200,
        "server should still infer: {}",
        String::from_utf8_lossy(&r.body)
    );
}

#[test]
fn server_metadata_and_health() {
    let server = start_server(1);
    let addr = server.http_addr();
    let meta = get(addr, "/v2").json();
    assert_eq!(meta["name"], "triton");
    let exts: Vec<&str> = meta["extensions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert!(exts.contains(&"binary_tensor_data"));
    assert!(exts.contains(&"model_configuration"));
    // Triton 2.51 lists both; the sequence batcher and the queue policies
    // (`priority`, `timeout`) implement them here.
    assert!(exts.contains(&"sequence"));
    assert!(exts.contains(&"schedule_policy"));
    assert_eq!(get(addr, "/v2/health/live").status, 200);
    assert_eq!(get(addr, "/v2/health/ready").status, 200);
    server.shutdown().unwrap();
}

#[test]
fn model_metadata_ready_and_config() {
    let server = start_server(1);
    let addr = server.http_addr();
    let meta = get(addr, "/v2/models/simple").json();
    assert_eq!(meta["name"], "simple");
    assert_eq!(meta["versions"], json!(["1"]));
    assert_eq!(
        meta["inputs"][0],
        json!({"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]})
    );
    assert_eq!(meta["outputs"][1]["name"], "OUTPUT1");
    assert_eq!(
        get(addr, "/v2/models/simple/versions/1").json()["name"],
        "simple"
    );
    assert_eq!(get(addr, "/v2/models/simple/ready").status, 200);
    assert_eq!(get(addr, "/v2/models/simple/versions/1/ready").status, 200);
    assert_eq!(get(addr, "/v2/models/nope/ready").status, 400);
    let config = get(addr, "/v2/models/simple/config").json();
    assert_eq!(config["name"], "simple");
    assert_eq!(config["max_batch_size"], 8);
    assert_eq!(config["input"][0]["data_type"], "TYPE_INT32");
    assert_eq!(config["input"][0]["dims"], json!([16]));
    // Triton's defaults are written into the served configuration.
    assert_eq!(
        config["version_policy"],
        json!({"latest": {"num_versions": 1}})
    );
    assert_eq!(config["instance_group"][0]["name"], "simple_0");
    assert_eq!(config["instance_group"][0]["kind"], "KIND_CPU");
    assert_eq!(config["instance_group"][0]["count"], 1);
    let m = get(addr, "/v2/models/simple_string").json();
    assert_eq!(m["inputs"][0]["datatype"], "BYTES");
    server.shutdown().unwrap();
}

#[test]
fn unknown_model_and_version_are_404_with_tritons_phrase() {
    let server = start_server(1);
    let addr = server.http_addr();
    let r = get(addr, "/v2/models/nope");
    assert_eq!(r.status, 404);
    assert!(
        r.error().contains("Request for unknown model"),
        "{}",
        r.error()
    );
    let r = post_json(addr, "/v2/models/nope/infer", &simple_json_request(1));
    assert_eq!(r.status, 404);
    assert!(r.error().contains("Request for unknown model: 'nope'"));
    let r = post_json(
        addr,
        "/v2/models/simple/versions/7/infer",
        &simple_json_request(1),
    );
    assert_eq!(r.status, 404);
    assert!(r.error().contains("version 7"));
    assert_eq!(get(addr, "/v2/no/such/path").status, 404);
    assert_healthy(addr);
    server.shutdown().unwrap();
}

#[test]
fn infer_json_simple() {
    let server = start_server(1);
    let addr = server.http_addr();
    let r = post_json(
        addr,
        "/v2/models/simple/infer",
        &json!({
            "id": "req-1",
            "inputs": [
                {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": [[2147483647, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]]},
                {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": vec![1; 16]},
            ]
        }),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let body = r.json();
    assert_eq!(body["model_name"], "simple");
    assert_eq!(body["model_version"], "1");
    assert_eq!(body["id"], "req-1");
    let out0 = &body["outputs"][0];
    assert_eq!(out0["name"], "OUTPUT0");
    assert_eq!(out0["shape"], json!([1, 16]));
    let sum = i32s(&out0["data"]);
    assert_eq!(sum[0], i32::MIN as i64, "INT32 wraps");
    assert_eq!(sum[1..], (2..17).collect::<Vec<i64>>()[..]);
    let diff = i32s(&body["outputs"][1]["data"]);
    assert_eq!(diff[1], 0);
    server.shutdown().unwrap();
}

#[test]
fn infer_requested_output_subset() {
    let server = start_server(1);
    let addr = server.http_addr();
    let mut req = simple_json_request(3);
    req["outputs"] = json!([{"name": "OUTPUT1"}]);
    let body = post_json(addr, "/v2/models/simple/infer", &req).json();
    let outs = body["outputs"].as_array().unwrap();
    assert_eq!(outs.len(), 1);
    assert_eq!(outs[0]["name"], "OUTPUT1");
    assert_eq!(i32s(&outs[0]["data"])[0], -3);
    server.shutdown().unwrap();
}

fn binary_simple_body(output_binary: bool) -> (Vec<u8>, usize) {
    let header = json!({
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": 64}},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": 64}},
        ],
        "outputs": [
            {"name": "OUTPUT0", "parameters": {"binary_data": output_binary}},
            {"name": "OUTPUT1", "parameters": {"binary_data": output_binary}},
        ]
    })
    .to_string();
    let mut body = header.clone().into_bytes();
    for i in 0..16i32 {
        body.extend_from_slice(&i.to_le_bytes());
    }
    for _ in 0..16 {
        body.extend_from_slice(&10i32.to_le_bytes());
    }
    (body, header.len())
}

#[test]
fn infer_binary_extension_in_and_out() {
    let server = start_server(1);
    let addr = server.http_addr();
    let (body, hlen) = binary_simple_body(true);
    let r = request(
        addr,
        "POST",
        "/v2/models/simple/infer",
        &[("Inference-Header-Content-Length", &hlen.to_string())],
        &body,
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let json_len: usize = r
        .header("Inference-Header-Content-Length")
        .expect("binary reply header")
        .parse()
        .unwrap();
    let header: serde_json::Value = serde_json::from_slice(&r.body[..json_len]).unwrap();
    assert_eq!(header["outputs"][0]["parameters"]["binary_data_size"], 64);
    let out0: Vec<i32> = r.body[json_len..json_len + 64]
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(out0, (10..26).collect::<Vec<i32>>());
    assert_eq!(r.body.len(), json_len + 128);

    let (body, hlen) = binary_simple_body(false);
    let r = request(
        addr,
        "POST",
        "/v2/models/simple/infer",
        &[("Inference-Header-Content-Length", &hlen.to_string())],
        &body,
    );
    assert_eq!(r.status, 200);
    assert_eq!(i32s(&r.json()["outputs"][1]["data"])[0], -10);
    server.shutdown().unwrap();
}

#[test]
fn bytes_models_over_json() {
    let server = start_server(1);
    let addr = server.http_addr();
    let a: Vec<String> = (0..16).map(|i| i.to_string()).collect();
    let b: Vec<String> = (0..16).map(|_| "5".to_string()).collect();
    let r = post_json(
        addr,
        "/v2/models/simple_string/infer",
        &json!({
            "inputs": [
                {"name": "INPUT0", "datatype": "BYTES", "shape": [1, 16], "data": a},
                {"name": "INPUT1", "datatype": "BYTES", "shape": [1, 16], "data": b},
            ]
        }),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["outputs"][0]["data"][3], "8");
    assert_eq!(r.json()["outputs"][1]["data"][0], "-5");

    let r = post_json(
        addr,
        "/v2/models/simple_identity/infer",
        &json!({
            "inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [2, 2], "data": [["a", ""], ["héllo", "x y"]]}]
        }),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let out = &r.json()["outputs"][0];
    assert_eq!(out["shape"], json!([2, 2]));
    assert_eq!(out["data"], json!(["a", "", "héllo", "x y"]));

    let r = post_json(
        addr,
        "/v2/models/simple_string/infer",
        &json!({
            "inputs": [
                {"name": "INPUT0", "datatype": "BYTES", "shape": [1, 16], "data": vec!["x"; 16]},
                {"name": "INPUT1", "datatype": "BYTES", "shape": [1, 16], "data": vec!["1"; 16]},
            ]
        }),
    );
    assert!(
        r.status == 500 || r.status == 400,
        "non-integer text fails the request: {}",
        r.status
    );
    assert_healthy(addr);
    server.shutdown().unwrap();
}

fn expect_400(addr: std::net::SocketAddr, body: serde_json::Value, needle: &str) {
    let r = post_json(addr, "/v2/models/simple/infer", &body);
    assert_eq!(
        r.status,
        400,
        "expected 400 for {body}: got {} {}",
        r.status,
        String::from_utf8_lossy(&r.body)
    );
    let e = r.error();
    assert!(e.contains(needle), "error {e:?} should mention {needle:?}");
}

#[test]
fn validation_errors_are_400_and_server_stays_healthy() {
    let server = start_server(1);
    let addr = server.http_addr();
    let good = simple_json_request(1);

    let mut wrong_dtype = good.clone();
    wrong_dtype["inputs"][0]["datatype"] = json!("FP32");
    wrong_dtype["inputs"][0]["data"] = json!(vec![1.5; 16]);
    expect_400(addr, wrong_dtype, "FP32");

    let mut wrong_shape = good.clone();
    wrong_shape["inputs"][0]["shape"] = json!([1, 15]);
    wrong_shape["inputs"][0]["data"] = json!(vec![1; 15]);
    expect_400(addr, wrong_shape, "INPUT0");

    let mut missing = good.clone();
    missing["inputs"].as_array_mut().unwrap().pop();
    expect_400(addr, missing, "INPUT1");

    let mut extra = good.clone();
    extra["inputs"].as_array_mut().unwrap().push(
        json!({"name": "INPUT9", "datatype": "INT32", "shape": [1, 16], "data": vec![0; 16]}),
    );
    expect_400(addr, extra, "INPUT9");

    let mut batch = good.clone();
    for i in 0..2 {
        batch["inputs"][i]["shape"] = json!([9, 16]);
        batch["inputs"][i]["data"] = json!(vec![0; 9 * 16]);
    }
    expect_400(addr, batch, "batch-size must be <= 8");

    let mut count = good.clone();
    count["inputs"][1]["data"] = json!(vec![1; 15]);
    expect_400(addr, count, "INPUT1");

    let mut huge = good.clone();
    huge["inputs"][0]["shape"] = json!([1, 1u64 << 40]);
    expect_400(addr, huge, "INPUT0");

    let mut unknown_output = good.clone();
    unknown_output["outputs"] = json!([{"name": "NOPE"}]);
    expect_400(addr, unknown_output, "NOPE");

    let r = request(
        addr,
        "POST",
        "/v2/models/simple/infer",
        &[],
        b"{\"inputs\": [",
    );
    assert_eq!(r.status, 400);
    assert!(!r.error().is_empty());
    assert_healthy(addr);
    server.shutdown().unwrap();
}

#[test]
fn binary_framing_errors_are_400() {
    let server = start_server(1);
    let addr = server.http_addr();
    let (body, hlen) = binary_simple_body(false);
    let post = |body: &[u8], h: &str| {
        request(
            addr,
            "POST",
            "/v2/models/simple/infer",
            &[("Inference-Header-Content-Length", h)],
            body,
        )
    };
    let r = post(&body[..body.len() - 10], &hlen.to_string());
    assert_eq!(r.status, 400, "truncated binary body");
    let mut trailing = body.clone();
    trailing.extend_from_slice(&[0; 8]);
    assert_eq!(
        post(&trailing, &hlen.to_string()).status,
        400,
        "trailing bytes"
    );
    assert_eq!(post(&body, "not-a-number").status, 400, "bad header length");
    assert_eq!(
        post(&body, &(body.len() + 100).to_string()).status,
        400,
        "header length past the body"
    );
    assert_eq!(
        post(&body, "5").status,
        400,
        "header length cutting the JSON"
    );
    assert_healthy(addr);
    server.shutdown().unwrap();
}

#[test]
fn oversized_body_is_rejected() {
    let mut opts = shardserve::server::ServerOptions::for_tests(repo_path("models"));
    opts.http_max_input_size = 4096;
    let server = start_with(opts);
    let addr = server.http_addr();
    let body = vec![b' '; 10_000];
    let r = request(addr, "POST", "/v2/models/simple/infer", &[], &body);
    // 413 from the declared Content-Length, before the body is read.
    assert_eq!(r.status, 413);
    assert!(r.error().contains("limit"), "{}", r.error());
    assert_healthy(addr);
    server.shutdown().unwrap();
}

#[test]
fn gzip_request_and_response() {
    use std::io::Write;
    let server = start_server(1);
    let addr = server.http_addr();
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(simple_json_request(2).to_string().as_bytes())
        .unwrap();
    let gz = enc.finish().unwrap();
    let r = request(
        addr,
        "POST",
        "/v2/models/simple/infer",
        &[("Content-Encoding", "gzip"), ("Accept-Encoding", "gzip")],
        &gz,
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("Content-Encoding"), Some("gzip"));
    let mut plain = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&r.body[..]), &mut plain).unwrap();
    let body: serde_json::Value = serde_json::from_slice(&plain).unwrap();
    assert_eq!(i32s(&body["outputs"][0]["data"])[0], 2);
    server.shutdown().unwrap();
}

#[test]
fn requests_on_every_shard_reach_the_instance_across_rings() {
    // Two shards, one instance of `simple`: connections the kernel gives to
    // the shard without the instance go through the SPSC ring and back.
    let server = start_server(2);
    let addr = server.http_addr();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                for i in 0..25 {
                    let b = t * 100 + i;
                    let r = post_json(addr, "/v2/models/simple/infer", &simple_json_request(b));
                    assert_eq!(r.status, 200);
                    assert_eq!(i32s(&r.json()["outputs"][0]["data"])[0], b as i64);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    server.shutdown().unwrap();
}

#[test]
fn a_port_in_use_is_a_start_up_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut opts = shardserve::server::ServerOptions::for_tests(repo_path("models"));
    opts.http_port = taken.local_addr().unwrap().port();
    let err = match shardserve::server::start(opts) {
        Ok(_) => panic!("start must fail on a used port"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("port"), "{err}");
}

#[test]
fn every_io_driver_serves_across_shards() {
    use shardserve::{server::ServerOptions, tuning::IoDriver};
    for driver in [IoDriver::Epoll, IoDriver::Auto] {
        let mut opts = ServerOptions::for_tests(repo_path("models"));
        opts.cores = Some(2);
        opts.io_driver = driver;
        let server = start_with(opts);
        let addr = server.http_addr();
        // Several connections so the kernel spreads them over both shards.
        for b in 0..6 {
            let r = post_json(addr, "/v2/models/simple/infer", &simple_json_request(b));
            assert_eq!(
                r.status,
                200,
                "{driver:?}: {}",
                String::from_utf8_lossy(&r.body)
            );
            assert_eq!(
                r.json()["outputs"][0]["data"][1],
                json!(1 + b),
                "{driver:?}"
            );
        }
        server.shutdown().unwrap();
    }
}

/// An identity model (built-in backend) with `n` inputs of `dtype` and `dims`.
fn identity_config(name: &str, n: usize, dtype: &str, dims: &str) -> String {
    let io = |kind: &str| {
        (0..n)
            .map(|i| format!("{{ name: \"{kind}{i}\" data_type: {dtype} dims: [ {dims} ] }}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "name: \"{name}\"\nbackend: \"identity\"\nmax_batch_size: 8\n\
         input [ {} ]\noutput [ {} ]\n",
        io("INPUT"),
        io("OUTPUT")
    )
}

/// Triton's "raw binary request" (`Inference-Header-Content-Length: 0`):
/// the whole body is the one input's data, datatype and shape from the
/// configuration, every output answered in binary; refused, with Triton's
/// texts, where the input cannot be deduced.
#[test]
fn raw_binary_request_is_the_models_one_input() {
    let repo = TempRepo::new(
        "raw-binary",
        &[
            (
                "raw_fp32",
                identity_config("raw_fp32", 1, "TYPE_FP32", "-1"),
            ),
            (
                "raw_bytes",
                identity_config("raw_bytes", 1, "TYPE_STRING", "1"),
            ),
            (
                "raw_bytes_var",
                identity_config("raw_bytes_var", 1, "TYPE_STRING", "-1"),
            ),
            (
                "raw_fp16_2d",
                identity_config("raw_fp16_2d", 1, "TYPE_FP16", "-1, -1"),
            ),
            ("raw_two", identity_config("raw_two", 2, "TYPE_FP32", "-1")),
        ],
    );
    let mut opts = shardserve::server::ServerOptions::for_tests(repo.root.clone());
    opts.cores = Some(1);
    let server = start_with(opts);
    let addr = server.http_addr();
    let post = |model: &str, body: &[u8]| {
        request(
            addr,
            "POST",
            &format!("/v2/models/{model}/infer"),
            &[("Inference-Header-Content-Length", "0")],
            body,
        )
    };
    let split = |r: &HttpReply| {
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let n: usize = r
            .header("inference-header-content-length")
            .expect("binary answer")
            .parse()
            .unwrap();
        let header: serde_json::Value = serde_json::from_slice(&r.body[..n]).unwrap();
        (header, r.body[n..].to_vec())
    };

    for count in [8usize, 32] {
        let data: Vec<u8> = (0..count).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let (header, out) = split(&post("raw_fp32", &data));
        assert_eq!(out, data);
        assert_eq!(header["outputs"][0]["name"], "OUTPUT0");
        assert_eq!(header["outputs"][0]["shape"], json!([1, count]));
    }
    // BYTES: the body is the one element; the answer carries its length prefix.
    let (_, out) = split(&post("raw_bytes", b"427"));
    assert_eq!(out, b"\x03\x00\x00\x00427");

    let refused = |model: &str, body: &[u8], text: &str| {
        let r = post(model, body);
        assert_eq!(
            r.status,
            400,
            "{model}: {}",
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(r.error(), text, "{model}");
    };
    refused(
        "raw_two",
        &[0; 32],
        "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in \
         'raw_two' model configuration",
    );
    refused(
        "raw_bytes_var",
        b"427",
        "For BYTE datatype raw input 'INPUT0', the model must have input shape [1]",
    );
    refused(
        "raw_fp16_2d",
        &[0; 8],
        "The shape of the raw input 'INPUT0' can not be deduced because there are more than \
         one variable-sized dimension",
    );
    refused(
        "raw_fp32",
        &[0; 10],
        "input byte size mismatch for input 'INPUT0' for model 'raw_fp32'. Expected 8, got 10",
    );
    let r = post("nope", &[0; 4]);
    assert_eq!(r.status, 404);
    assert_eq!(r.error(), "Request for unknown model: 'nope' is not found");
    assert_eq!(get(addr, "/v2/health/ready").status, 200);
    server.shutdown().unwrap();
}
