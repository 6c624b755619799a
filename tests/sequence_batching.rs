//! The sequence batcher through the real server: control tensors reaching
//! the model for every request, implicit state, sequences whose requests
//! arrive on different shards, the backlog, idle release, and Triton's
//! errors for bad sequence requests.

mod common;

use std::{
    sync::{Arc, Barrier},
    thread,
    time::{Duration, Instant},
};

use common::*;
use serde_json::{json, Value};
use shardserve::server::{ServerHandle, ServerOptions};

fn start(
    root: &std::path::Path,
    shards: usize,
    tweak: impl FnOnce(&mut ServerOptions),
) -> ServerHandle {
    let mut opts = ServerOptions::for_tests(root);
    opts.cores = Some(shards);
    tweak(&mut opts);
    start_with(opts)
}

fn seq_body(input: i32, id: Value, start: bool, end: bool) -> Value {
    json!({
        "parameters": {"sequence_id": id, "sequence_start": start, "sequence_end": end},
        "inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [input]}]
    })
}

fn infer(addr: std::net::SocketAddr, model: &str, body: &Value) -> HttpReply {
    post_json(addr, &format!("/v2/models/{model}/infer"), body)
}

fn output(reply: &HttpReply, name: &str) -> Value {
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let v = reply.json();
    v["outputs"]
        .as_array()
        .and_then(|o| o.iter().find(|t| t["name"] == name))
        .map(|t| t["data"][0].clone())
        .unwrap_or_else(|| panic!("no output {name} in {v}"))
}

/// An identity model that echoes the control tensors the batcher gives
/// it (each control is also an optional input, so the identity backend
/// pairs it with an output), executing for `delay_ms` on a worker.
fn recorder(
    name: &str,
    corrid_type: &str,
    instances: u32,
    delay_ms: u32,
    strategy: &str,
) -> String {
    format!(
        r#"
name: "{name}"
backend: "identity"
max_batch_size: 4
input [
  {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "START" data_type: TYPE_INT32 dims: [ 1 ] optional: true }},
  {{ name: "END" data_type: TYPE_INT32 dims: [ 1 ] optional: true }},
  {{ name: "READY" data_type: TYPE_INT32 dims: [ 1 ] optional: true }},
  {{ name: "CORRID" data_type: {corrid_type} dims: [ 1 ] optional: true }}
]
output [
  {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "OSTART" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "OEND" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "OREADY" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "OCORRID" data_type: {corrid_type} dims: [ 1 ] }}
]
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
parameters {{ key: "execute_delay_ms" value: {{ string_value: "{delay_ms}" }} }}
sequence_batching {{
  max_sequence_idle_microseconds: 300000
  {strategy}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "END" control [ {{ kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid_type} }} ] }}
  ]
}}
"#
    )
}

#[test]
fn every_request_sees_its_own_controls_on_both_strategies_across_shards() {
    let repo = TempRepo::new(
        "seq-controls",
        &[
            (
                "direct_rec",
                recorder("direct_rec", "TYPE_UINT64", 2, 2, "direct { }"),
            ),
            (
                "oldest_rec",
                recorder(
                    "oldest_rec",
                    "TYPE_UINT64",
                    1,
                    2,
                    "oldest { max_candidate_sequences: 4 max_queue_delay_microseconds: 500 }",
                ),
            ),
        ],
    );
    let server = start(&repo.root, 2, |_| {});
    let addr = server.http_addr();
    for model in ["direct_rec", "oldest_rec"] {
        let sequences = 6u64;
        let steps = 5;
        let barrier = Arc::new(Barrier::new(sequences as usize));
        let handles: Vec<_> = (0..sequences)
            .map(|s| {
                let barrier = barrier.clone();
                let model = model.to_string();
                thread::spawn(move || {
                    barrier.wait();
                    let id = 1000 + s;
                    for step in 0..steps {
                        let (start, end) = (step == 0, step == steps - 1);
                        // Every request on a new connection: each lands on
                        // whichever shard the kernel picks.
                        let r = infer(addr, &model, &seq_body(step, json!(id), start, end));
                        assert_eq!(output(&r, "OUTPUT"), json!(step));
                        assert_eq!(
                            output(&r, "OSTART"),
                            json!(i32::from(start)),
                            "{model} seq {id} step {step}"
                        );
                        assert_eq!(
                            output(&r, "OEND"),
                            json!(i32::from(end)),
                            "{model} seq {id} step {step}"
                        );
                        assert_eq!(output(&r, "OREADY"), json!(1));
                        assert_eq!(output(&r, "OCORRID"), json!(id));
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("sequence thread");
        }
        let stats = get(addr, &format!("/v2/models/{model}/stats")).json();
        let s = &stats["model_stats"][0];
        assert_eq!(s["inference_count"], sequences * steps as u64, "{s}");
        assert!(s["execution_count"].as_u64().unwrap() <= sequences * steps as u64);
    }
    let forwarded = forwarded_requests(server.metrics_addr());
    assert!(forwarded > 0, "some requests crossed to the owner shard");
    server.shutdown().unwrap();
}

#[test]
fn string_correlation_ids_end_to_end() {
    let repo = TempRepo::new(
        "seq-string",
        &[(
            "str_rec",
            recorder("str_rec", "TYPE_STRING", 1, 0, "direct { }"),
        )],
    );
    let server = start(&repo.root, 1, |_| {});
    let addr = server.http_addr();
    let r = infer(addr, "str_rec", &seq_body(1, json!("abc"), true, false));
    assert_eq!(output(&r, "OCORRID"), json!("abc"));
    // Integer 7 and string "7" are different sequences.
    infer(addr, "str_rec", &seq_body(1, json!(7), true, false));
    let r = infer(addr, "str_rec", &seq_body(2, json!("7"), false, false));
    assert_eq!(r.status, 400);
    assert!(
        r.error().contains("must specify the START flag"),
        "{}",
        r.error()
    );
    // An integer id reaches a string CORRID as its decimal text.
    let r = infer(addr, "str_rec", &seq_body(3, json!(7), false, true));
    assert_eq!(output(&r, "OCORRID"), json!("7"));
    let r = infer(addr, "str_rec", &seq_body(3, json!("abc"), false, true));
    assert_eq!(output(&r, "OEND"), json!(1));
    server.shutdown().unwrap();
}

#[test]
fn bad_sequence_requests_get_tritons_errors_and_the_server_keeps_serving() {
    let repo = TempRepo::new(
        "seq-errors",
        &[("rec", recorder("rec", "TYPE_UINT64", 1, 0, "direct { }"))],
    );
    let server = start(&repo.root, 1, |_| {});
    let addr = server.http_addr();
    let cases = [
        (seq_body(1, json!(5), false, false), "inference request for sequence 5 to model 'rec' must specify the START flag on the first request of the sequence"),
        (seq_body(1, json!(5), false, true), "inference request for sequence 5 to model 'rec' must specify the START flag on the first request of the sequence"),
        (seq_body(1, json!(0), true, false), "inference request to model 'rec' must specify a non-zero or non-empty correlation ID"),
        (seq_body(1, json!(""), true, false), "inference request to model 'rec' must specify a non-zero or non-empty correlation ID"),
        (
            json!({"inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [1]}]}),
            "inference request to model 'rec' must specify a non-zero or non-empty correlation ID",
        ),
        (seq_body(1, json!("x"), true, false), "sequence batching control 'CORRID' data-type is 'BYTES', but model 'rec' expects 'UINT64'"),
        (
            json!({"parameters": {"sequence_id": 9, "sequence_start": true},
                   "inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [2, 1], "data": [1, 2]}]}),
            "inference request to model 'rec' must specify batch-size 1 due to requirements of sequence batcher",
        ),
        (
            json!({"parameters": {"sequence_id": 9, "sequence_start": "yes"},
                   "inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [1]}]}),
            "inference request to model 'rec': invalid value type for 'sequence_start' parameter, expected a boolean",
        ),
    ];
    for (body, want) in cases {
        let r = infer(addr, "rec", &body);
        assert_eq!(r.status, 400, "{body}");
        assert_eq!(r.error(), want, "{body}");
    }
    let r = infer(addr, "rec", &seq_body(4, json!(5), true, true));
    assert_eq!(output(&r, "OUTPUT"), json!(4));
    server.shutdown().unwrap();
}

#[test]
fn implicit_state_and_per_slot_state_keep_their_sequences_apart() {
    let server = start_server(2);
    let addr = server.http_addr();
    // Interleave four sequences on each accumulator: per-slot model state
    // (direct), implicit state in ONNX Runtime (direct and oldest), and the
    // built-in string-id accumulator in implicit state (oldest).
    // (model, correlation id of sequence s, initial state)
    type Case = (&'static str, fn(u64) -> Value, i32);
    let models: [Case; 4] = [
        ("sequence_accumulator", |s| json!(s), 0),
        ("sequence_accumulator_onnx", |s| json!(s), 0),
        (
            "sequence_accumulator_onnx_init",
            |s| json!(format!("s{s}")),
            0,
        ),
        ("sequence_accumulator_onnx_file", |s| json!(s), 100),
    ];
    for (model, id_of, initial) in models {
        let handles: Vec<_> = (1..=4u64)
            .map(|s| {
                thread::spawn(move || {
                    let mut sum = initial;
                    for step in 0..6i32 {
                        let v = (s as i32) * 10 + step;
                        sum += v;
                        let r = infer(addr, model, &seq_body(v, id_of(s), step == 0, step == 5));
                        assert_eq!(
                            output(&r, "OUTPUT"),
                            json!(sum),
                            "{model} sequence {s} step {step}"
                        );
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("sequence thread");
        }
    }
    // A START on an active sequence starts it afresh.
    infer(
        addr,
        "sequence_accumulator_onnx",
        &seq_body(5, json!(77), true, false),
    );
    infer(
        addr,
        "sequence_accumulator_onnx",
        &seq_body(5, json!(77), false, false),
    );
    let r = infer(
        addr,
        "sequence_accumulator_onnx",
        &seq_body(1, json!(77), true, true),
    );
    assert_eq!(output(&r, "OUTPUT"), json!(1));
    // String ids: the built-in accumulator adds the id at END.
    let model = "simple_string_dyna_sequence";
    let values = [20, -11, -7, -5, -3, -2, 0, -1];
    let mut sum = 0;
    for (i, v) in values.iter().enumerate() {
        sum += v;
        let end = i == values.len() - 1;
        let r = infer(addr, model, &seq_body(*v, json!("1002"), i == 0, end));
        let want = if end { sum + 1002 } else { sum };
        assert_eq!(output(&r, "OUTPUT"), json!(want), "step {i}");
    }
    server.shutdown().unwrap();
}

/// Polls the metrics until `model` has `n` requests queued.
fn wait_for_pending(metrics: std::net::SocketAddr, model: &str, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let prefix = format!("nv_inference_pending_request_count{{model=\"{model}\"");
    loop {
        let page = String::from_utf8(get(metrics, "/metrics").body).unwrap();
        let pending: u64 = page
            .lines()
            .filter(|l| l.starts_with(&prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum();
        if pending == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{model} never had {n} pending: {pending}"
        );
        thread::sleep(Duration::from_millis(5));
    }
}

/// An accumulator with one slot and a short idle time.
fn one_slot_accumulator(name: &str, idle_us: u64) -> String {
    let base =
        std::fs::read_to_string(repo_path("models/sequence_accumulator/config.pbtxt")).unwrap();
    base.replace(
        "name: \"sequence_accumulator\"",
        &format!("name: \"{name}\""),
    )
    .replace("max_batch_size: 8", "max_batch_size: 1")
    .replace(
        "max_sequence_idle_microseconds: 5000000",
        &format!("max_sequence_idle_microseconds: {idle_us}"),
    )
}

#[test]
fn a_backlogged_sequence_runs_when_a_slot_frees_and_idle_sequences_are_released() {
    let repo = TempRepo::new(
        "seq-backlog",
        &[("acc1", one_slot_accumulator("acc1", 400_000))],
    );
    let server = start(&repo.root, 2, |_| {});
    let addr = server.http_addr();
    assert_eq!(
        output(
            &infer(addr, "acc1", &seq_body(1, json!(1), true, false)),
            "OUTPUT"
        ),
        json!(1)
    );
    // Sequence 2 finds the only slot taken: it waits in the backlog.
    let waiting = thread::spawn(move || {
        let t = Instant::now();
        let r = infer(addr, "acc1", &seq_body(10, json!(2), true, false));
        (output(&r, "OUTPUT"), t.elapsed())
    });
    // Once the server holds it, it waits at least 100 ms for the slot.
    wait_for_pending(server.metrics_addr(), "acc1", 1);
    thread::sleep(Duration::from_millis(100));
    assert!(!waiting.is_finished(), "sequence 2 must wait for a slot");
    assert_eq!(
        output(
            &infer(addr, "acc1", &seq_body(2, json!(1), false, true)),
            "OUTPUT"
        ),
        json!(3)
    );
    let (out, waited) = waiting.join().unwrap();
    assert_eq!(
        out,
        json!(10),
        "the slot's state starts afresh for the new sequence"
    );
    assert!(waited >= Duration::from_millis(100), "{waited:?}");
    // Sequence 2 goes idle: after 0.4 s its slot is released and a request
    // without START fails; a third sequence gets the slot.
    thread::sleep(Duration::from_millis(700));
    let r = infer(addr, "acc1", &seq_body(1, json!(2), false, false));
    assert_eq!(r.status, 400);
    assert!(
        r.error().contains("must specify the START flag"),
        "{}",
        r.error()
    );
    assert_eq!(
        output(
            &infer(addr, "acc1", &seq_body(5, json!(3), true, true)),
            "OUTPUT"
        ),
        json!(5)
    );
    // Queue time counts the wait for a slot.
    let stats = get(addr, "/v2/models/acc1/stats").json();
    let queue_ns = stats["model_stats"][0]["inference_stats"]["queue"]["ns"]
        .as_u64()
        .unwrap();
    assert!(
        queue_ns >= 100_000_000,
        "queue time includes the backlog wait: {queue_ns} ns"
    );
    server.shutdown().unwrap();
}

#[test]
fn a_full_backlog_refuses_and_abandoned_sequences_are_forgotten() {
    let repo = TempRepo::new(
        "seq-flood",
        &[("acc1", one_slot_accumulator("acc1", 300_000))],
    );
    let server = start(&repo.root, 1, |o| o.max_queue_size = 8);
    let addr = server.http_addr();
    // Hold the slot, then open sequences that can only wait.
    infer(addr, "acc1", &seq_body(1, json!(1), true, false));
    let waiters: Vec<_> = (0..8u64)
        .map(|i| {
            thread::spawn(move || {
                infer(addr, "acc1", &seq_body(1, json!(100 + i), true, true)).status
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(150));
    let r = infer(addr, "acc1", &seq_body(1, json!(999), true, false));
    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
    assert!(
        r.error().contains("Exceeds maximum queue size"),
        "{}",
        r.error()
    );
    // Sequence 1 goes idle, frees the slot; the backlog drains in order.
    let statuses: Vec<u16> = waiters.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    assert_eq!(
        output(
            &infer(addr, "acc1", &seq_body(4, json!(5), true, true)),
            "OUTPUT"
        ),
        json!(4)
    );
    server.shutdown().unwrap();
}
