//! The model repository extension: index, load (config override, model
//! files), unload, control modes, and reloads under traffic.

mod common;

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread,
    time::Duration,
};

use common::*;
use serde_json::{json, Value};
use shardserve::{
    proto::inference::{
        model_repository_parameter::ParameterChoice, ModelRepositoryParameter,
        RepositoryIndexRequest, RepositoryModelLoadRequest, RepositoryModelUnloadRequest,
    },
    server::{ModelControlMode, ServerHandle, ServerOptions},
};

fn simple_config(name: &str, extra: &str) -> String {
    format!(
        r#"name: "{name}"
backend: "simple"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }}, {{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }}, {{ name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }} ]
{extra}"#
    )
}

fn repo(tag: &str) -> TempRepo {
    TempRepo::new(
        tag,
        &[
            ("a", simple_config("a", "")),
            ("b", simple_config("b", "")),
            ("broken", "name: \"broken\" max_batch_size: [".to_string()),
        ],
    )
}

fn start(repo: &TempRepo, mode: ModelControlMode, load: &[&str]) -> ServerHandle {
    let mut opts = ServerOptions::for_tests(&repo.root);
    opts.cores = Some(2);
    opts.model_control_mode = mode;
    opts.load_models = load.iter().map(|s| s.to_string()).collect();
    start_with(opts)
}

fn index(addr: SocketAddr, body: Value) -> Vec<Value> {
    let r = post_json(addr, "/v2/repository/index", &body);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json().as_array().cloned().unwrap()
}

fn load(addr: SocketAddr, model: &str, body: Value) -> HttpReply {
    post_json(addr, &format!("/v2/repository/models/{model}/load"), &body)
}

fn unload(addr: SocketAddr, model: &str) -> HttpReply {
    post_json(
        addr,
        &format!("/v2/repository/models/{model}/unload"),
        &json!({}),
    )
}

fn infer_simple(addr: SocketAddr, model: &str) -> HttpReply {
    post_json(
        addr,
        &format!("/v2/models/{model}/infer"),
        &simple_json_request(1),
    )
}

#[test]
fn explicit_mode_index_load_unload() {
    let repo = repo("repo-explicit");
    let server = start(&repo, ModelControlMode::Explicit, &["a"]);
    let addr = server.http_addr();
    assert_eq!(
        index(addr, json!({})),
        vec![
            json!({"name": "a", "version": "1", "state": "READY"}),
            json!({"name": "b"}),
            json!({"name": "broken"}),
        ]
    );
    assert_eq!(index(addr, json!({"ready": true})).len(), 1);
    assert_eq!(infer_simple(addr, "b").status, 404);

    let r = load(addr, "b", json!({}));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(infer_simple(addr, "b").status, 200);

    // A broken config: a clear reason, and the others keep serving.
    let r = load(addr, "broken", json!({}));
    assert_eq!(r.status, 500);
    assert!(
        r.error().starts_with("failed to load 'broken'"),
        "{}",
        r.error()
    );
    let rows = index(addr, json!({}));
    let broken = rows.iter().find(|r| r["name"] == "broken").unwrap();
    assert_eq!(broken["state"], "UNAVAILABLE");
    assert!(
        broken["reason"].as_str().unwrap().contains("config.pbtxt"),
        "{broken}"
    );
    assert_eq!(infer_simple(addr, "a").status, 200);

    // Unload: UNAVAILABLE with reason "unloaded"; unknown models unload fine.
    assert_eq!(unload(addr, "a").status, 200);
    let rows = index(addr, json!({}));
    assert_eq!(
        rows.iter().find(|r| r["name"] == "a").unwrap(),
        &json!({"name": "a", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"})
    );
    let r = infer_simple(addr, "a");
    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(unload(addr, "no_such_model").status, 200);
    assert_eq!(load(addr, "no_such_model", json!({})).status, 500);
    // Load again after unload re-reads the repository.
    assert_eq!(load(addr, "a", json!({})).status, 200);
    assert_eq!(infer_simple(addr, "a").status, 200);
    server.shutdown().unwrap();
}

#[test]
fn config_overrides_and_model_files() {
    let repo = repo("repo-override");
    let server = start(&repo, ModelControlMode::Explicit, &["a"]);
    let addr = server.http_addr();
    // The model-control examples send only max_batch_size: I/O is completed.
    let override_ = json!({"max_batch_size": "16"}).to_string();
    let r = load(addr, "a", json!({"parameters": {"config": override_}}));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let config = get(addr, "/v2/models/a/config").json();
    assert_eq!(config["max_batch_size"], 16);
    assert_eq!(config["input"].as_array().unwrap().len(), 2);

    // A bad override fails and leaves the old configuration serving.
    let r = load(
        addr,
        "a",
        json!({"parameters": {"config": "{\"max_batch_size\": \"x\"}"}}),
    );
    assert_eq!(r.status, 500);
    assert!(r.error().starts_with("failed to load 'a'"), "{}", r.error());
    assert_eq!(
        get(addr, "/v2/models/a/config").json()["max_batch_size"],
        16
    );
    assert_eq!(infer_simple(addr, "a").status, 200);

    // Model files in the request: a fresh model folder from them alone.
    let config = json!({"name": "c", "backend": "simple", "max_batch_size": 4}).to_string();
    let r = load(
        addr,
        "c",
        json!({"parameters": {"config": config, "file:1/README": "aGVsbG8="}}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(infer_simple(addr, "c").status, 200);
    for bad in ["file:../escape", "file:/etc/passwd", "file:1/../../x"] {
        let r = load(
            addr,
            "d",
            json!({"parameters": {"config": config, bad: "aGVsbG8="}}),
        );
        assert_eq!(r.status, 500, "{bad}");
        assert!(
            r.error().contains("inside the model folder"),
            "{}",
            r.error()
        );
    }
    let r = load(addr, "d", json!({"parameters": {"file:1/x": "aGVsbG8="}}));
    assert!(
        r.error().contains("without a 'config' parameter"),
        "{}",
        r.error()
    );
    let r = load(
        addr,
        "d",
        json!({"parameters": {"config": config, "file:1/x": "not base64!"}}),
    );
    assert!(r.error().contains("not valid base64"), "{}", r.error());
    let r = post_json(addr, "/v2/repository/models/a/load", &json!([1]));
    assert_eq!(r.status, 400);
    server.shutdown().unwrap();
}

#[test]
fn none_mode_refuses_load_and_unload() {
    let repo = repo("repo-none");
    let server = start(&repo, ModelControlMode::None, &[]);
    let addr = server.http_addr();
    for r in [load(addr, "a", json!({})), unload(addr, "a")] {
        assert_eq!(
            r.error(),
            "explicit model load / unload is not allowed if polling is enabled"
        );
    }
    // Everything was loaded at start; the broken model says why not.
    let rows = index(addr, json!({}));
    assert_eq!(rows.iter().filter(|r| r["state"] == "READY").count(), 2);
    server.shutdown().unwrap();
}

#[test]
fn reloading_under_traffic_fails_no_request() {
    let repo = repo("repo-swap");
    let server = start(&repo, ModelControlMode::Explicit, &["a"]);
    let addr = server.http_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let r = infer_simple(addr, "a");
                    if r.status == 200 {
                        ok.fetch_add(1, Ordering::Relaxed);
                    } else {
                        eprintln!("failed during reload: {}", String::from_utf8_lossy(&r.body));
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for batch in [4, 8, 2, 8, 16, 8] {
        let config = json!({"max_batch_size": batch, "backend": "simple"}).to_string();
        let r = load(addr, "a", json!({"parameters": {"config": config}}));
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        thread::sleep(Duration::from_millis(30));
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    assert!(ok.load(Ordering::Relaxed) > 0);
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "no request fails while versions swap"
    );
    server.shutdown().unwrap();
}

#[test]
fn repository_rpcs_over_grpc() {
    let repo = repo("repo-grpc");
    let server = start(&repo, ModelControlMode::Explicit, &[]);
    let addr = server.grpc_addr();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = grpc_client(addr).await;
        let idx = c
            .repository_index(RepositoryIndexRequest::default())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(idx.models.len(), 3);
        assert!(idx.models.iter().all(|m| m.state.is_empty()));
        let config = json!({"backend": "simple", "max_batch_size": 2}).to_string();
        let params = [(
            "config".to_string(),
            ModelRepositoryParameter {
                parameter_choice: Some(ParameterChoice::StringParam(config)),
            },
        )];
        c.repository_model_load(RepositoryModelLoadRequest {
            model_name: "b".into(),
            parameters: params.into_iter().collect(),
            ..Default::default()
        })
        .await
        .unwrap();
        let idx = c
            .repository_index(RepositoryIndexRequest {
                ready: true,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(idx.models.len(), 1);
        assert_eq!(
            (idx.models[0].name.as_str(), idx.models[0].state.as_str()),
            ("b", "READY")
        );
        let e = c
            .repository_model_load(RepositoryModelLoadRequest {
                model_name: "broken".into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert!(
            e.message().starts_with("failed to load 'broken'"),
            "{}",
            e.message()
        );
        c.repository_model_unload(RepositoryModelUnloadRequest {
            model_name: "b".into(),
            ..Default::default()
        })
        .await
        .unwrap();
        let idx = c
            .repository_index(RepositoryIndexRequest {
                ready: true,
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(idx.into_inner().models.is_empty());
    });
    server.shutdown().unwrap();
}

#[test]
fn poll_mode_follows_the_repository() {
    let repo = repo("repo-poll");
    let mut opts = ServerOptions::for_tests(&repo.root);
    opts.model_control_mode = ModelControlMode::Poll;
    opts.repository_poll = Duration::from_millis(100);
    let server = start_with(opts);
    let addr = server.http_addr();
    assert_eq!(
        load(addr, "a", json!({})).error(),
        "explicit model load / unload is not allowed if polling is enabled"
    );
    let wait_for = |what: &str, pred: &dyn Fn(&[Value]) -> bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let rows = index(addr, json!({}));
            if pred(&rows) {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "{what}: {rows:?}");
            thread::sleep(Duration::from_millis(50));
        }
    };
    // A model folder appears: it is loaded.
    std::fs::create_dir_all(repo.root.join("c/1")).unwrap();
    std::fs::write(repo.root.join("c/config.pbtxt"), simple_config("c", "")).unwrap();
    wait_for("c loaded", &|rows| {
        rows.iter()
            .any(|r| r["name"] == "c" && r["state"] == "READY")
    });
    assert_eq!(infer_simple(addr, "c").status, 200);
    // A config changes: it is reloaded with the new one.
    std::fs::write(
        repo.root.join("c/config.pbtxt"),
        simple_config("c", "").replace("max_batch_size: 8", "max_batch_size: 3"),
    )
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while get(addr, "/v2/models/c/config").json()["max_batch_size"] != 3 {
        assert!(std::time::Instant::now() < deadline, "c was not reloaded");
        thread::sleep(Duration::from_millis(50));
    }
    // The folder goes away: the model is unloaded.
    std::fs::remove_dir_all(repo.root.join("c")).unwrap();
    wait_for("c gone", &|rows| !rows.iter().any(|r| r["name"] == "c"));
    assert_eq!(infer_simple(addr, "c").status, 404);
    server.shutdown().unwrap();
}

#[test]
fn ensembles_load_through_the_api_with_their_composing_models() {
    let mut opts = ServerOptions::for_tests(repo_path("models"));
    opts.model_control_mode = ModelControlMode::Explicit;
    let server = start_with(opts);
    let addr = server.http_addr();
    // As Triton: the composing model not loaded yet is loaded with it.
    let r = load(addr, "simple_ensemble", json!({}));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(get(addr, "/v2/models/simple/ready").status, 200);
    assert_eq!(load(addr, "simple", json!({})).status, 200);
    let r = load(addr, "simple_ensemble", json!({}));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let r = infer_simple(addr, "simple_ensemble");
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    // Unloading a composing model makes the ensemble not ready, saying why;
    // loading it again brings the ensemble back.
    assert_eq!(unload(addr, "simple").status, 200);
    let rows = index(addr, json!({}));
    let row = rows
        .iter()
        .find(|r| r["name"] == "simple_ensemble")
        .unwrap();
    assert_eq!(row["state"], "UNAVAILABLE", "{row}");
    assert_eq!(row["reason"], "composing model 'simple' is not available");
    assert_eq!(get(addr, "/v2/models/simple_ensemble/ready").status, 400);
    let r = infer_simple(addr, "simple_ensemble");
    assert!(
        r.error()
            .contains("composing model 'simple' is not available"),
        "{}",
        r.error()
    );
    assert_eq!(load(addr, "simple", json!({})).status, 200);
    assert_eq!(infer_simple(addr, "simple_ensemble").status, 200);
    assert_eq!(unload(addr, "simple_ensemble").status, 200);
    server.shutdown().unwrap();
}

#[test]
fn unload_dependents_unloads_the_ensembles_of_a_composing_model() {
    let mut opts = ServerOptions::for_tests(repo_path("models"));
    opts.model_control_mode = ModelControlMode::Explicit;
    opts.load_models = vec!["simple".into(), "simple_ensemble".into()];
    let server = start_with(opts);
    let addr = server.http_addr();
    assert_eq!(infer_simple(addr, "simple_ensemble").status, 200);
    let state = |name: &str| {
        let rows = index(addr, json!({}));
        let row = rows.iter().find(|r| r["name"] == name).cloned().unwrap();
        (row["state"].clone(), row["reason"].clone())
    };
    let r = post_json(
        addr,
        "/v2/repository/models/simple/unload",
        &json!({"parameters": {"unload_dependents": "yes"}}),
    );
    assert_eq!(r.status, 400);
    assert!(r.error().contains("unload_dependents"));
    let r = post_json(
        addr,
        "/v2/repository/models/simple/unload",
        &json!({"parameters": {"unload_dependents": true}}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        state("simple_ensemble"),
        (json!("UNAVAILABLE"), json!("unloaded"))
    );
    // The ensemble was unloaded, not left waiting: it stays unloaded when
    // its composing model returns (without the flag it would come back).
    assert_eq!(load(addr, "simple", json!({})).status, 200);
    assert_eq!(state("simple_ensemble").1, json!("unloaded"));
    assert_eq!(get(addr, "/v2/models/simple_ensemble/ready").status, 400);

    // The same over gRPC.
    assert_eq!(load(addr, "simple_ensemble", json!({})).status, 200);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = grpc_client(server.grpc_addr()).await;
        let flag = |v: ParameterChoice| {
            [(
                "unload_dependents".to_string(),
                ModelRepositoryParameter {
                    parameter_choice: Some(v),
                },
            )]
            .into_iter()
            .collect()
        };
        let e = c
            .repository_model_unload(RepositoryModelUnloadRequest {
                model_name: "simple".into(),
                parameters: flag(ParameterChoice::Int64Param(1)),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        c.repository_model_unload(RepositoryModelUnloadRequest {
            model_name: "simple".into(),
            parameters: flag(ParameterChoice::BoolParam(true)),
            ..Default::default()
        })
        .await
        .unwrap();
    });
    assert_eq!(
        state("simple_ensemble"),
        (json!("UNAVAILABLE"), json!("unloaded"))
    );
    assert_eq!(state("simple").1, json!("unloaded"));
    server.shutdown().unwrap();
}
