//! The ensemble scheduler through the server: load-time validation with
//! Triton's reasons, independent branches running at the same time,
//! ensemble traffic batched together with direct traffic by a composing
//! model's dynamic batcher, failures naming the step, nested ensembles,
//! and statistics counted for the ensemble and each composing model.

mod common;

use std::{
    sync::{Arc, Barrier},
    time::{Duration, Instant},
};

use common::{get, i32s, post_json, start_with, TempRepo};
use shardserve::server::ServerOptions;

const SIMPLE_IO: &str = r#"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]"#;

const ACC_IO: &str = r#"max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]"#;
const ACC_STEP: &str = r#"{ model_name: "acc" model_version: -1
  input_map { key: "INPUT" value: "INPUT" } output_map { key: "OUTPUT" value: "OUTPUT" } }"#;

/// An identity model that takes `ms` per execution, on its own worker.
fn slow(name: &str, ms: u64) -> String {
    format!(
        r#"name: "{name}" backend: "identity" max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }} ]
parameters {{ key: "execute_delay_ms" value: {{ string_value: "{ms}" }} }}"#
    )
}

/// An ensemble `name` with the given I/O block and steps.
fn ensemble(name: &str, io: &str, steps: &str) -> String {
    format!(
        "name: \"{name}\" platform: \"ensemble\" {io}\nensemble_scheduling {{ step [ {steps} ] }}"
    )
}

/// Both inputs of `simple` into `model`, its outputs into `out0`, `out1`.
fn simple_step(model: &str, in0: &str, in1: &str, out0: &str, out1: &str) -> String {
    format!(
        r#"{{ model_name: "{model}" model_version: -1
  input_map {{ key: "INPUT0" value: "{in0}" }} input_map {{ key: "INPUT1" value: "{in1}" }}
  output_map {{ key: "OUTPUT0" value: "{out0}" }} output_map {{ key: "OUTPUT1" value: "{out1}" }} }}"#
    )
}

fn chain(model: &str) -> String {
    format!(
        "{}, {}",
        simple_step(model, "INPUT0", "INPUT1", "s", "d"),
        simple_step(model, "s", "d", "OUTPUT0", "OUTPUT1")
    )
}

fn repository(tag: &str) -> TempRepo {
    let dyna = format!(
        r#"name: "dyna" backend: "simple" {SIMPLE_IO}
output [ {{ name: "BATCH_SIZE" data_type: TYPE_INT32 dims: [ 1 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 300000 }}"#
    );
    let parallel_io = r#"max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "A" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "B" data_type: TYPE_INT32 dims: [ 16 ] } ]"#;
    let parallel_steps = r#"
{ model_name: "slow_a" model_version: -1 input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "A" } },
{ model_name: "slow_b" model_version: -1 input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "B" } }"#;
    let dyna_io = format!(
        "{SIMPLE_IO}\noutput [ {{ name: \"BATCH_SIZE\" data_type: TYPE_INT32 dims: [ 1 ] }} ]"
    );
    let dyna_step = r#"{ model_name: "dyna" model_version: -1
  input_map { key: "INPUT0" value: "INPUT0" } input_map { key: "INPUT1" value: "INPUT1" }
  output_map [ { key: "OUTPUT0" value: "OUTPUT0" }, { key: "OUTPUT1" value: "OUTPUT1" }, { key: "BATCH_SIZE" value: "BATCH_SIZE" } ] }"#;
    let loose_io = r#"max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] }, { name: "INPUT1" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] }, { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ -1 ] } ]"#;
    let fp32_io = SIMPLE_IO.replacen("TYPE_INT32", "TYPE_FP32", 1);
    let short_io = SIMPLE_IO.replacen("dims: [ 16 ]", "dims: [ 8 ]", 1);
    let wide_io = SIMPLE_IO.replace("max_batch_size: 8", "max_batch_size: 16");
    let extra_out_io =
        format!("{SIMPLE_IO}\noutput [ {{ name: \"OUTX\" data_type: TYPE_INT32 dims: [ 16 ] }} ]");
    let models: Vec<(&str, String)> = vec![
        (
            "simple",
            format!("name: \"simple\" backend: \"simple\" {SIMPLE_IO}"),
        ),
        ("dyna", dyna),
        ("slow_a", slow("slow_a", 500)),
        ("slow_b", slow("slow_b", 500)),
        ("chain", ensemble("chain", SIMPLE_IO, &chain("simple"))),
        ("nested", ensemble("nested", SIMPLE_IO, &chain("chain"))),
        (
            "parallel",
            ensemble("parallel", parallel_io, parallel_steps),
        ),
        ("dyna_ens", ensemble("dyna_ens", &dyna_io, dyna_step)),
        ("loose", ensemble("loose", loose_io, &chain("simple"))),
        (
            "acc",
            std::fs::read_to_string(common::repo_path(
                "models/sequence_accumulator/config.pbtxt",
            ))
            .expect("sequence_accumulator config")
            .replace("name: \"sequence_accumulator\"", "name: \"acc\""),
        ),
        ("acc_ens", ensemble("acc_ens", ACC_IO, ACC_STEP)),
        // Each of these must fail to load, with its reason.
        (
            "bad_model",
            ensemble("bad_model", SIMPLE_IO, &chain("nope")),
        ),
        (
            "bad_version",
            ensemble(
                "bad_version",
                SIMPLE_IO,
                &chain("simple").replace("model_version: -1", "model_version: 7"),
            ),
        ),
        (
            "bad_ghost",
            ensemble(
                "bad_ghost",
                SIMPLE_IO,
                &format!(
                    "{}, {}",
                    simple_step("simple", "INPUT0", "INPUT1", "s", "d"),
                    simple_step("simple", "s", "ghost", "OUTPUT0", "OUTPUT1")
                ),
            ),
        ),
        (
            "bad_cycle",
            ensemble(
                "bad_cycle",
                SIMPLE_IO,
                &format!(
                    "{}, {}, {}",
                    simple_step("simple", "INPUT0", "back", "s", "d"),
                    simple_step("simple", "s", "d", "back", "spare"),
                    simple_step("simple", "INPUT1", "spare", "OUTPUT0", "OUTPUT1")
                ),
            ),
        ),
        (
            "bad_dtype",
            ensemble("bad_dtype", &fp32_io, &chain("simple")),
        ),
        (
            "bad_shape",
            ensemble("bad_shape", &short_io, &chain("simple")),
        ),
        (
            "bad_output",
            ensemble("bad_output", &extra_out_io, &chain("simple")),
        ),
        (
            "bad_batch",
            ensemble("bad_batch", &wide_io, &chain("simple")),
        ),
        (
            "rep",
            std::fs::read_to_string(common::repo_path("models/repeat_int32/config.pbtxt"))
                .expect("repeat_int32 config")
                .replace("name: \"repeat_int32\"", "name: \"rep\""),
        ),
        (
            "bad_decoupled",
            ensemble(
                "bad_decoupled",
                r#"max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }, { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] }, { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]"#,
                // The second step reads one tensor from each response of
                // the first (decoupled) step and one from the request:
                // two data flows meet, which Triton refuses.
                r#"{ model_name: "rep" model_version: -1
  input_map [ { key: "IN" value: "IN" }, { key: "DELAY" value: "DELAY" }, { key: "WAIT" value: "WAIT" } ]
  output_map { key: "OUT" value: "elem" } },
{ model_name: "rep" model_version: -1
  input_map [ { key: "IN" value: "elem" }, { key: "DELAY" value: "DELAY" }, { key: "WAIT" value: "WAIT" } ]
  output_map { key: "OUT" value: "OUT" } }"#,
            ),
        ),
        ("loop_a", ensemble("loop_a", SIMPLE_IO, &chain("loop_b"))),
        ("loop_b", ensemble("loop_b", SIMPLE_IO, &chain("loop_a"))),
    ];
    TempRepo::new(&format!("ensemble-{tag}"), &models)
}

fn start(repo: &TempRepo, shards: usize) -> shardserve::server::ServerHandle {
    let mut opts = ServerOptions::for_tests(repo.root.clone());
    opts.cores = Some(shards);
    start_with(opts)
}

fn rows(rows: usize, base: i32) -> serde_json::Value {
    let a: Vec<i32> = (0..(rows * 16) as i32).map(|i| base + i).collect();
    serde_json::json!({
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [rows, 16], "data": a},
            {"name": "INPUT1", "datatype": "INT32", "shape": [rows, 16], "data": vec![3; rows * 16]},
        ]
    })
}

fn stats(addr: std::net::SocketAddr, model: &str) -> serde_json::Value {
    let r = get(addr, &format!("/v2/models/{model}/stats"));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()["model_stats"][0].clone()
}

/// The reason a model failed to load, from the server's model table.
fn failure(server: &shardserve::server::ServerHandle, model: &str) -> String {
    let entry = server
        .models()
        .models
        .get(model)
        .unwrap_or_else(|| panic!("{model} is in the table"));
    entry.failure.clone().unwrap_or_else(|| {
        entry
            .versions
            .values()
            .map(|v| v.state.reason().to_string())
            .collect::<Vec<_>>()
            .join("; ")
    })
}

#[test]
fn invalid_ensembles_fail_to_load_with_tritons_reasons_and_the_rest_serve() {
    let repo = repository("invalid");
    let server = start(&repo, 2);
    let expect = [
        ("bad_model", "contains models that are not available or ambiguous: nope"),
        ("bad_version", "version 7"),
        ("bad_ghost", "at least one of its depending tensors, 'ghost', is not connected"),
        ("bad_cycle", "cycle"),
        ("bad_dtype", "inconsistent data type: TYPE_FP32 is inferred from model bad_dtype while TYPE_INT32 is inferred from model simple"),
        ("bad_shape", "inconsistent shape: [-1,8] is inferred from model bad_shape while [-1,16] is inferred from model simple"),
        ("bad_output", "ensemble output 'OUTX' for ensemble 'bad_output' is not used"),
        ("bad_batch", "ensemble bad_batch allows maximum batch size 16, but it contains model simple which only allows maximum batch size to be 8"),
        ("bad_decoupled", "in ensemble bad_decoupled, step of model 'rep' receives inputs originated from different decoupled models"),
        ("loop_a", "circular dependency between ensembles"),
        ("loop_b", "circular dependency between ensembles"),
    ];
    for (model, reason) in expect {
        let why = failure(&server, model);
        assert!(why.contains(reason), "{model}: {why}");
        let r = get(server.http_addr(), &format!("/v2/models/{model}/ready"));
        assert_ne!(r.status, 200, "{model} must not be ready");
        let r = post_json(
            server.http_addr(),
            &format!("/v2/models/{model}/infer"),
            &rows(1, 0),
        );
        assert_ne!(r.status, 200);
        assert!(r.error().contains(model), "{}", r.error());
    }
    for model in ["chain", "nested", "parallel", "dyna_ens", "loose", "simple"] {
        let r = get(server.http_addr(), &format!("/v2/models/{model}/ready"));
        assert_eq!(
            r.status,
            200,
            "{model} is ready: {}",
            failure(&server, model)
        );
    }
    server.shutdown().unwrap();
}

#[test]
fn steps_chain_and_nest_and_statistics_count_each_model() {
    let repo = repository("chain");
    let server = start(&repo, 2);
    let addr = server.http_addr();
    let r = post_json(addr, "/v2/models/chain/infer", &rows(2, 10));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let body = r.json();
    assert_eq!(body["model_name"], "chain");
    assert_eq!(body["model_version"], "1");
    assert_eq!(body["outputs"][0]["shape"], serde_json::json!([2, 16]));
    let a: Vec<i64> = (10..42).map(|x| 2 * x).collect();
    assert_eq!(i32s(&body["outputs"][0]["data"]), a);
    assert_eq!(i32s(&body["outputs"][1]["data"]), vec![6; 32]);

    // `nested` runs `chain` twice: four `simple` executions, 4·INPUT0.
    let r = post_json(addr, "/v2/models/nested/infer", &rows(1, 0));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let body = r.json();
    let a: Vec<i64> = (0..16).map(|x| 4 * x).collect();
    assert_eq!(i32s(&body["outputs"][0]["data"]), a);
    assert_eq!(i32s(&body["outputs"][1]["data"]), vec![12; 16]);

    // Output subset, in the order asked.
    let mut req = rows(1, 0);
    req["outputs"] = serde_json::json!([{"name": "OUTPUT1"}]);
    let r = post_json(addr, "/v2/models/chain/infer", &req);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let outputs = r.json()["outputs"].clone();
    assert_eq!(outputs.as_array().unwrap().len(), 1);
    assert_eq!(outputs[0]["name"], "OUTPUT1");

    // `chain` counts its own two requests and the two `nested` sent it.
    assert_eq!(
        stats(addr, "chain")["inference_stats"]["success"]["count"],
        4
    );
    assert_eq!(
        stats(addr, "nested")["inference_stats"]["success"]["count"],
        1
    );
    // 4 chain requests × 2 steps.
    assert_eq!(
        stats(addr, "simple")["inference_stats"]["success"]["count"],
        8
    );
    server.shutdown().unwrap();
}

fn ns(stats: &serde_json::Value, phase: &str) -> u64 {
    stats["inference_stats"][phase]["ns"]
        .as_u64()
        .unwrap_or_else(|| panic!("{phase} in {stats}"))
}

fn count(stats: &serde_json::Value, phase: &str) -> u64 {
    stats["inference_stats"][phase]["count"]
        .as_u64()
        .unwrap_or_else(|| panic!("{phase} in {stats}"))
}

/// The value of a Prometheus sample for `model`, version 1.
fn metric(metrics: std::net::SocketAddr, name: &str, model: &str) -> u64 {
    let page = String::from_utf8(get(metrics, "/metrics").body).expect("utf-8 metrics");
    let prefix = format!("{name}{{model=\"{model}\",version=\"1\"}} ");
    page.lines()
        .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
        .unwrap_or_else(|| panic!("no {prefix} in the metrics"))
}

#[test]
fn ensemble_statistics_aggregate_the_composing_requests_compute_times() {
    let repo = repository("stats");
    let server = start(&repo, 2);
    let addr = server.http_addr();
    for base in 0..3 {
        let r = post_json(addr, "/v2/models/chain/infer", &rows(2, base));
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    let chain = stats(addr, "chain");
    let simple = stats(addr, "simple");
    // Each composing model counts its own requests and executions.
    assert_eq!(count(&simple, "success"), 6);
    assert_eq!(simple["execution_count"], 6);
    // The ensemble counts each request once, as one execution of its
    // batch size, with its own queue time...
    assert_eq!(count(&chain, "success"), 3);
    assert_eq!(count(&chain, "queue"), 3);
    assert_eq!(chain["inference_count"], 6);
    assert_eq!(chain["execution_count"], 3);
    assert_eq!(chain["batch_stats"][0]["batch_size"], 2);
    assert_eq!(chain["batch_stats"][0]["compute_infer"]["count"], 3);
    assert!(chain["last_inference"].as_u64().unwrap() > 0);
    // ...and the compute phases of all its steps' requests, summed: only
    // the ensemble sent `simple` requests, so the totals are equal.
    for phase in ["compute_input", "compute_infer", "compute_output"] {
        assert_eq!(count(&chain, phase), 3, "{phase}");
        assert_eq!(
            ns(&chain, phase),
            ns(&simple, phase),
            "{phase}: {chain} {simple}"
        );
        assert_eq!(
            chain["batch_stats"][0][phase]["ns"].as_u64(),
            Some(ns(&simple, phase)),
            "{phase}"
        );
    }
    assert!(ns(&chain, "compute_infer") > 0);

    // A nested ensemble sums through the inner one: its one request
    // counts every `simple` execution the inner `chain` requests took.
    let (chain_before, simple_before) = (ns(&chain, "compute_infer"), ns(&simple, "compute_infer"));
    let r = post_json(addr, "/v2/models/nested/infer", &rows(1, 0));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let nested = stats(addr, "nested");
    let chain = stats(addr, "chain");
    let simple = stats(addr, "simple");
    assert_eq!(count(&nested, "compute_infer"), 1);
    assert_eq!(
        ns(&nested, "compute_infer"),
        ns(&simple, "compute_infer") - simple_before
    );
    assert_eq!(
        ns(&chain, "compute_infer") - chain_before,
        ns(&nested, "compute_infer")
    );

    // A request refused before it reaches the ensemble (an input missing)
    // counts nowhere, as in Triton, and adds no compute time.
    let mut bad = rows(1, 0);
    bad["inputs"].as_array_mut().unwrap().pop();
    let r = post_json(addr, "/v2/models/chain/infer", &bad);
    assert_ne!(r.status, 200);
    let after = stats(addr, "chain");
    assert_eq!(count(&after, "fail"), 0);
    assert_eq!(
        count(&after, "compute_infer"),
        count(&chain, "compute_infer")
    );

    // The Prometheus counters read the same totals (in microseconds).
    let metrics = server.metrics_addr();
    assert_eq!(metric(metrics, "nv_inference_request_success", "chain"), 5);
    assert_eq!(metric(metrics, "nv_inference_exec_count", "chain"), 5);
    assert_eq!(
        metric(metrics, "nv_inference_compute_infer_duration_us", "chain"),
        ns(&after, "compute_infer") / 1000
    );
    assert_eq!(
        metric(metrics, "nv_inference_queue_duration_us", "chain"),
        ns(&after, "queue") / 1000
    );
    server.shutdown().unwrap();
}

#[test]
fn a_failed_step_fails_the_request_naming_step_and_model() {
    let repo = repository("failed_step");
    let server = start(&repo, 2);
    let addr = server.http_addr();
    // `loose` accepts any length; `simple` needs 16 elements per row.
    let req = serde_json::json!({
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 4], "data": [1, 2, 3, 4]},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 4], "data": [1, 2, 3, 4]},
        ]
    });
    let r = post_json(addr, "/v2/models/loose/infer", &req);
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    let e = r.error();
    assert!(
        e.contains("in ensemble 'loose', step 0 (model 'simple')"),
        "{e}"
    );
    assert_eq!(stats(addr, "loose")["inference_stats"]["fail"]["count"], 1);
    // The server keeps serving.
    let r = post_json(addr, "/v2/models/loose/infer", &rows(1, 0));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    server.shutdown().unwrap();
}

#[test]
fn independent_branches_run_at_the_same_time() {
    let repo = repository("parallel");
    let server = start(&repo, 2);
    let addr = server.http_addr();
    let req = serde_json::json!({
        "inputs": [{"name": "IN", "datatype": "INT32", "shape": [1, 16], "data": vec![7; 16]}]
    });
    let started = Instant::now();
    let r = post_json(addr, "/v2/models/parallel/infer", &req);
    let took = started.elapsed();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let body = r.json();
    assert_eq!(i32s(&body["outputs"][0]["data"]), vec![7; 16]);
    assert_eq!(i32s(&body["outputs"][1]["data"]), vec![7; 16]);
    // Each branch sleeps 500 ms on its own worker: one after the other
    // would take at least 1 s.
    assert!(took >= Duration::from_millis(500), "{took:?}");
    assert!(
        took < Duration::from_millis(950),
        "branches did not overlap: {took:?}"
    );
    server.shutdown().unwrap();
}

#[test]
fn ensemble_requests_join_direct_requests_in_a_composing_models_batches() {
    let repo = repository("batches");
    let server = start(&repo, 2);
    let addr = server.http_addr();
    // 4 requests through the ensemble and 4 direct, together: an execution
    // of more than 4 rows that an ensemble request reports must hold
    // direct requests too (the batcher waits up to 300 ms for 8 rows).
    let clients = 8;
    let barrier = Arc::new(Barrier::new(clients));
    let handles: Vec<_> = (0..clients)
        .map(|c| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let model = if c % 2 == 0 { "dyna_ens" } else { "dyna" };
                barrier.wait();
                let r = post_json(
                    addr,
                    &format!("/v2/models/{model}/infer"),
                    &rows(1, c as i32 * 100),
                );
                assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
                let body = r.json();
                let out0 = i32s(&body["outputs"][0]["data"]);
                let expected: Vec<i64> = (0..16).map(|i| c as i64 * 100 + i + 3).collect();
                assert_eq!(out0, expected, "{model} answered another request's rows");
                let batch = body["outputs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|o| o["name"] == "BATCH_SIZE")
                    .map(|o| i32s(&o["data"])[0])
                    .unwrap();
                (model, batch)
            })
        })
        .collect();
    let results: Vec<(&str, i64)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let largest_ensemble_batch = results
        .iter()
        .filter(|(m, _)| *m == "dyna_ens")
        .map(|(_, b)| *b)
        .max()
        .unwrap();
    assert!(
        largest_ensemble_batch > 4,
        "ensemble requests were not batched with direct ones: {results:?}"
    );
    let dyna = stats(addr, "dyna");
    assert_eq!(dyna["inference_stats"]["success"]["count"], 8);
    assert!(dyna["execution_count"].as_u64().unwrap() < 8, "{dyna}");
    assert_eq!(
        stats(addr, "dyna_ens")["inference_stats"]["success"]["count"],
        4
    );
    server.shutdown().unwrap();
}

#[test]
fn sequence_id_and_flags_reach_a_stateful_composing_model() {
    let repo = repository("sequence");
    let server = start(&repo, 2);
    let addr = server.http_addr();
    let send = |value: i32, parameters: serde_json::Value| {
        let req = serde_json::json!({
            "inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [value]}],
            "parameters": parameters,
        });
        let r = post_json(addr, "/v2/models/acc_ens/infer", &req);
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        i32s(&r.json()["outputs"][0]["data"])[0]
    };
    // The accumulator keeps a running sum per sequence: it only adds up if
    // the ensemble passes the correlation id and START/END on.
    assert_eq!(
        send(
            5,
            serde_json::json!({"sequence_id": 42, "sequence_start": true})
        ),
        5
    );
    assert_eq!(
        send(
            5,
            serde_json::json!({"sequence_id": 43, "sequence_start": true})
        ),
        5
    );
    assert_eq!(send(3, serde_json::json!({"sequence_id": 42})), 8);
    assert_eq!(
        send(
            1,
            serde_json::json!({"sequence_id": 42, "sequence_end": true})
        ),
        9
    );
    assert_eq!(
        send(
            10,
            serde_json::json!({"sequence_id": 43, "sequence_end": true})
        ),
        15
    );
    // Without a correlation id the stateful step refuses, naming itself.
    let req = serde_json::json!({
        "inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [1]}]
    });
    let r = post_json(addr, "/v2/models/acc_ens/infer", &req);
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    assert!(r.error().contains("step 0 (model 'acc')"), "{}", r.error());
    server.shutdown().unwrap();
}
